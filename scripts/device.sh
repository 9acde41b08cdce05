#!/usr/bin/env bash
# On the GPU machine: configure, build (ninja, all cores), run the GPU tests, the
# sanitizers and the benchmarks; logs and JSON go under $OUT.
#   bash scripts/device.sh [steps...]   steps: build test sanitize bench-gemm bench-comm drafter info all
#                                       two-shot (only when named: its tests, sanitizers and benchmarks)
#   TESTS='regex'  limits which gtest cases run (ctest -R); default: all
set -uo pipefail
# Everything is written under $LOG and packed into $OUT/logs.tgz at exit (the
# device tool returns at most 8 files).
OUT=${OUT:-$PWD/device-out}
LOG=$(mktemp -d)
mkdir -p "$OUT"
trap 'tar czf "$OUT/logs.tgz" -C "$LOG" . 2>/dev/null' EXIT
steps=${*:-all}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }

# Never NVLink multicast (DESIGN.md section 6).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

PY=$(command -v python3)
VENV_BIN=$(dirname "$PY")
export PATH="$VENV_BIN:/usr/local/cuda/bin:$PATH"
NCCL_ROOT=$($PY -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
if [[ -z "$NCCL_ROOT" ]]; then
  NCCL_ROOT=$($PY -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "nccl"))' 2>/dev/null || true)
fi
export NCCL_ROOT
export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
BUILD=${BUILD:-build-device}

if has build || [[ ! -x $BUILD/tools/tpdecode ]]; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$LOG/gpu.txt" 2>&1
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$NCCL_ROOT" \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc > "$LOG/configure.log" 2>&1 || { tail -30 "$LOG/configure.log"; exit 1; }
  ninja -C "$BUILD" -j"$(nproc)" > "$LOG/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$LOG/build.log" | head -60; exit 1; }
  echo "build ok"
fi
CLI=$BUILD/tools/tpdecode

if has info; then
  $CLI info | tee "$LOG/info.txt"
  $CLI info --json > "$LOG/info.json"
fi

if has test; then
  (cd "$BUILD" && ctest --output-on-failure ${TESTS:+-R "$TESTS"} -j1 --timeout 900) > "$LOG/ctest.log" 2>&1
  echo "ctest rc=$?"; grep -E "tests passed|tests failed|\*\*\*Failed|Not Run|Timeout" "$LOG/ctest.log" | tail -25
fi

if has sanitize; then
  # memcheck over the GPU tests (reduced repetition counts via TPDECODE_QUICK), racecheck on the collectives.
  # API errors are not reported: NCCL probes kernel images and cuMemCreate by design.
  export TPDECODE_QUICK=1
  timeout "${SANITIZE_TIMEOUT:-400}" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$BUILD/tests/gpu_tests" ${SANITIZE_FILTER:+--gtest_filter="$SANITIZE_FILTER"} > "$LOG/memcheck.log" 2>&1
  echo "memcheck rc=$?"; tail -3 "$LOG/memcheck.log"
  timeout "${SANITIZE_TIMEOUT:-400}" compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/gpu_tests" --gtest_filter="${RACE_FILTER:-*AllReduce*Bitwise*:*ArNorm*Bitwise*:*Gather*Bytes*}" > "$LOG/racecheck.log" 2>&1
  echo "racecheck rc=$?"; tail -3 "$LOG/racecheck.log"
  unset TPDECODE_QUICK
fi

if has bench-gemm && $CLI bench gemm --help > /dev/null 2>&1; then
  $CLI bench gemm --json "$LOG/bench_gemm.json" ${GEMM_ARGS:-} 2>&1 | tee "$LOG/bench_gemm.txt" | tail -80
fi
if has bench-comm && $CLI bench comm --help > /dev/null 2>&1; then
  $CLI bench comm --team local --json "$LOG/bench_comm.json" ${COMM_ARGS:-} 2>&1 | tee "$LOG/bench_comm.txt" | tail -60
fi
if has drafter && $CLI drafter --help > /dev/null 2>&1; then
  $CLI drafter --json "$LOG/drafter.json" ${DRAFTER_ARGS:-} 2>&1 | tee "$LOG/drafter.txt" | tail -60
fi

if [[ " $steps " == *" two-shot "* ]]; then
  # The two-shot all-reduce: its GPU and CPU tests, memcheck and racecheck on them
  # (reduced counts), bench comm at local TP 8 and, with 2 GPUs, on the NCCL team of 2.
  (cd "$BUILD" && ctest --output-on-failure -R 'TwoShot' -j1 --timeout 900) > "$LOG/two_shot_ctest.log" 2>&1
  echo "two-shot ctest rc=$?"; grep -E "tests passed|tests failed|\*\*\*Failed|Not Run|Timeout" "$LOG/two_shot_ctest.log" | tail -25
  TPDECODE_QUICK=1 timeout "${SANITIZE_TIMEOUT:-400}" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    "$BUILD/tests/gpu_tests" --gtest_filter='TwoShot.*:Failure.TwoShot*' > "$LOG/two_shot_memcheck.log" 2>&1
  echo "two-shot memcheck rc=$?"; tail -3 "$LOG/two_shot_memcheck.log"
  TPDECODE_QUICK=1 timeout "${SANITIZE_TIMEOUT:-400}" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$BUILD/tests/gpu_tests" --gtest_filter='TwoShot.AllReduceAndArNorm*:TwoShot.Graph*' > "$LOG/two_shot_racecheck.log" 2>&1
  echo "two-shot racecheck rc=$?"; tail -3 "$LOG/two_shot_racecheck.log"
  $CLI bench comm --team local --tp 8 --op all_reduce ar_norm --rows 1 2 4 8 16 32 64 \
    --json "$LOG/bench_two_shot_local_tp8.json" 2>&1 | tee "$LOG/bench_two_shot_local_tp8.txt" | tail -25
  if [[ $(nvidia-smi -L 2>/dev/null | wc -l) -ge 2 ]]; then
    $CLI bench comm --team nccl --tp 2 --op all_reduce ar_norm --rows 1 2 4 8 16 32 64 \
      --json "$LOG/bench_two_shot_nccl_tp2.json" 2>&1 | tee "$LOG/bench_two_shot_nccl_tp2.txt" | tail -25
  fi
fi
