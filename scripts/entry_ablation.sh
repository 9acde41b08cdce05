#!/usr/bin/env bash
# Ablation of the collectives' entry (docs/performance.md): HEAD, without the entry's abort read,
# host-alternated parity (no device epoch); ArNorm at NCCL TP 2 and local TP 8.
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
bench head
for v in no_abort host_parity; do
  patch -p1 < scripts/ablation/$v.patch > /dev/null && ninja -C build-device tpdecode_cli > /dev/null 2>&1 && bench $v
  patch -R -p1 < scripts/ablation/$v.patch > /dev/null
done
ninja -C build-device tpdecode_cli > /dev/null 2>&1 && bench head-again
