#!/usr/bin/env bash
# Ablation of the collectives' entry and row body (docs/performance.md): ArNorm at
# NCCL TP 2 and local TP 8 as built, then with each variant's patches from
# scripts/ablation/ applied in order (the CLI rebuilt, the patches reverted after).
#   no_abort             the entry's abort read compiled out (its cost)
#   host_parity          a host-alternated parity: no device epoch, no ticket (their cost;
#                        only safe for callers that alternate parities themselves)
#   row_slots            the row's mailbox addresses computed before griddepcontrol.wait
#   +inputs_after_push   the epilogue's input loads after the pushes
#   +poll_all_first      every slot's poll issued before any is tested
#   +entry_no_barrier    every thread reads the epoch; the ticket after the row sum's barrier
#   +cluster_sums_async  the CTA sums sent with st.async + an mbarrier (no cluster barrier's
#                        MEMBAR.ALL.GPU waiting for the NVLink push)
# Timing only: a variant worth landing must pass the bitwise GPU tests first.
set -uo pipefail
bash scripts/device.sh build > /dev/null 2>&1 || { echo build failed; exit 1; }
CLI=build-device/tools/tpdecode
export NCCL_NVLS_ENABLE=0
PY=$(command -v python3)
export PATH="$(dirname "$PY"):/usr/local/cuda/bin:$PATH"
NCCL_ROOT=$($PY -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
bench() {
  echo "### $1"
  $CLI bench comm --team nccl --tp 2 --op ar_norm --rows 1 --rows 2 --rows 4 --rows 8 2>&1 | grep -E "^ar_norm"
  $CLI bench comm --team local --tp 8 --op ar_norm --rows 1 --rows 2 --rows 4 2>&1 | grep -E "^ar_norm"
}
variants=(
  "no_abort:no_abort"
  "host_parity:host_parity"
  "row_slots:row_slots_before_wait"
  "row_slots+inputs_after_push:row_slots_before_wait inputs_after_push"
  "row_slots+inputs_after_push+poll_all_first:row_slots_before_wait inputs_after_push poll_all_slots_first"
  "row_slots+inputs_after_push+entry_no_barrier:row_slots_before_wait inputs_after_push entry_no_barrier"
  "row_slots+inputs_after_push+cluster_sums_async:row_slots_before_wait inputs_after_push cluster_sums_async"
  "row_slots+inputs_after_push+entry_no_barrier+cluster_sums_async:row_slots_before_wait inputs_after_push entry_no_barrier cluster_sums_async_on_entry_no_barrier"
)
bench as-built
for v in "${variants[@]}"; do
  name=${v%%:*}
  read -ra patches <<< "${v#*:}"
  applied=()
  for p in "${patches[@]}"; do
    patch -p1 < "scripts/ablation/$p.patch" > /dev/null || { echo "$p does not apply"; break; }
    applied=("$p" "${applied[@]}")
  done
  if [[ ${#applied[@]} -eq ${#patches[@]} ]] && ninja -C build-device tpdecode_cli > /dev/null 2>&1; then
    bench "$name"
  else
    echo "### $name: not built"
  fi
  for p in "${applied[@]}"; do patch -R -p1 < "scripts/ablation/$p.patch" > /dev/null; done
done
ninja -C build-device tpdecode_cli > /dev/null 2>&1 && bench as-built-again
