#!/usr/bin/env bash
# On the GPU machine: configure, build (ninja, all cores), run the GPU tests, the
# sanitizers and the benchmarks; logs and JSON go under $OUT (packed into
# $OUT/logs.tgz: the device tool returns at most 8 files).
#   bash scripts/device.sh [steps...]
#   steps: build test nccl-nop2p sanitize sanitize-gemm race-gemm race-patterns flag-latency cluster-residency tune bench-gemm
#          bench-chain bench-comm bench-comm-nccl drafter peers info all; two-shot, oproj, oproj-sanitize, oproj-bench,
#          adopt, crossover, adopt-python, install-decode and python, stress-delays, lab-loads, before,
#          before-drafter, before-chain, variants-chain, program, row-form, early-copies and python-tests (only when named)
#   ROW_FORMS='flags|flags'   the row-form probe's compiled forms (scripts/row_form_probe.cu)
#   VARIANTS='flags|flags'   variants-chain's compiled forms (CUDA flags of a measurement)
#   OLD_VARIANTS='flags|flags'   before-chain's compiled forms of the old tree, beside its plain build
#   TESTS='regex'   which tests `test` runs (ctest -R); default: all
#   GEMM_ARGS, CHAIN_ARGS, TUNE_ARGS, COMM_ARGS, NCCL_COMM_ARGS, OPROJ_ARGS, DRAFTER_ARGS: extra arguments of those steps
#   OPROJ_DRAFTER=1   oproj-bench also runs the drafter with producer-consumer forced, and without
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
LOG=$(mktemp -d)
mkdir -p "$OUT"
trap 'tar czf "$OUT/logs.tgz" -C "$LOG" . 2>/dev/null' EXIT
steps=${*:-all}
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
# Runs a step's command with a wall-clock limit, its output in $LOG/<name>.txt and
# the last lines on the console.
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$LOG/$name.txt" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - start)) s"
  tail -${TAIL:-25} "$LOG/$name.txt"
}

# Why a longer barrier deadline: under compute-sanitizer NCCL's communicator
# creation alone can exceed the default 30 s (only the sanitizer steps read it long).
SANITIZER_ENV="TPDECODE_BARRIER_TIMEOUT_MS=180000"
# Never NVLink multicast (DESIGN.md section 6).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

PY=$(command -v python3)
export PATH="$(dirname "$PY"):/usr/local/cuda/bin:$PATH"
NCCL_ROOT=$($PY -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null ||
            $PY -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "nccl"))' 2>/dev/null)
export NCCL_ROOT
export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
BUILD=${BUILD:-build-device}
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)

if has build || [[ ! -x $BUILD/tools/tpdecode && $steps != python && $steps != python-tests && $steps != adopt-python && $steps != install-decode &&
                   $steps != race-gemm && $steps != race-patterns && $steps != flag-latency ]]; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$LOG/gpu.txt" 2>&1
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$NCCL_ROOT" \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc > "$LOG/configure.log" 2>&1 || { tail -30 "$LOG/configure.log"; exit 1; }
  start=$SECONDS
  ninja -C "$BUILD" -j"$(nproc)" > "$LOG/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$LOG/build.log" | head -60; exit 1; }
  echo "build ok in $((SECONDS - start)) s ($GPUS GPU(s))"
fi
CLI=$BUILD/tools/tpdecode
# build_tree SOURCE DIR CUDA_FLAGS TARGET: a build of SOURCE in DIR with extra CUDA flags
# (a measurement's or a sanitizer's), of one target; its logs in $LOG.
build_tree() {
  local name=${2##*/}
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$NCCL_ROOT" \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_FLAGS="$3" > "$LOG/configure-$name.log" 2>&1 &&
    ninja -C "$2" -j"$(nproc)" "$4" > "$LOG/build-$name.log" 2>&1 ||
    { echo "the build of $1 in $2 failed"; tail -30 "$LOG/build-$name.log"; exit 1; }
}
# build_variant NAME CUDA_FLAGS TARGET: this tree again in $BUILD-NAME.
build_variant() { build_tree . "$BUILD-$1" "$2" "$3"; }
# bench_chains NAME CLI...: bench chain from each CLI, interleaved, twice (CHAIN_ARGS);
# the steps NAME-<round>-<index of the CLI>.
bench_chains() {
  local name=$1 round i
  shift
  local clis=("$@")
  for round in 1 2; do
    for i in "${!clis[@]}"; do
      # shellcheck disable=SC2086 # the arguments split
      step "$name-$round-$i" 150 "${clis[$i]}" bench chain ${CHAIN_ARGS:---tp 8 --tp 4 --m 1 --m 8 --layers 5}
    done
  done
}

has info && step info 60 $CLI info
if has test; then
  (cd "$BUILD" && timeout "${TEST_TIMEOUT:-420}" ctest --output-on-failure ${TESTS:+-R "$TESTS"} -j1 --timeout 300) > "$LOG/ctest.log" 2>&1
  echo "== ctest rc=$?"
  grep -E "tests passed|tests failed|\*\*\*Failed|Not Run|Timeout|\(Failed\)" "$LOG/ctest.log" | tail -25
fi
if has nccl-nop2p && [[ $GPUS -ge 2 ]]; then
  # A team whose ranks do not share memory: every call through NCCL.
  NCCL_P2P_DISABLE=1 step nccl-nop2p 120 "$BUILD/tests/gpu_tests" --gtest_filter='NcclTeam.*'
fi
if has sanitize; then
  # memcheck over the GPU tests (reduced repetition counts), racecheck on the collectives.
  # API errors are not reported: NCCL probes kernel images and cuMemCreate by design.
  export TPDECODE_QUICK=1
  step memcheck "${SANITIZE_TIMEOUT:-300}" env $SANITIZER_ENV compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    "$BUILD/tests/gpu_tests" --gtest_filter="${SANITIZE_FILTER:-*}"
  step racecheck "${SANITIZE_TIMEOUT:-300}" env $SANITIZER_ENV compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/gpu_tests" \
    --gtest_filter="${RACE_FILTER:-Collectives.AllReduceAndArNorm*:Collectives.Gather*}"
  unset TPDECODE_QUICK
fi
if has sanitize-gemm; then
  # DecodeGemm's tests under memcheck (reduced counts via TPDECODE_QUICK).
  TPDECODE_QUICK=1 step gemm-memcheck "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/tests/gpu_tests" --gtest_filter="${GEMM_SANITIZE_FILTER:-DecodeGemm.*:DraftLogits.*}"
fi
if [[ " $steps " == *" early-copies "* ]]; then
  # The program's checked copies where they find words empty: a build that copies an
  # earlier op's x from the op's first stage (TPDECODE_TEST_EARLY_COPIES), at every
  # row count (TPDECODE_RELAXED_COUNT_ROWS), its tests.
  build_variant early "-DTPDECODE_TEST_EARLY_COPIES -DTPDECODE_RELAXED_COUNT_ROWS=64" gpu_tests
  TPDECODE_QUICK=1 step early-copies 240 "$BUILD-early/tests/gpu_tests" \
    --gtest_filter='GemmProgram*:TeamProgram.*:TeamMlpBlock.*:MlpBlockProgram.*:DrafterProgramPath.*'
fi
# The racecheck build (race-gemm, program).
build_race() { build_variant race "-DTPDECODE_MBAR_TIMEOUT_NS=900000000000ull -DTPDECODE_RACECHECK_ARRIVALS" gpu_tests; }
if has race-gemm; then
  # The engines' and the program's kernels under racecheck, on the small shapes
  # (TPDECODE_SMALL: racecheck runs them about a thousand times slower), one test per
  # step. Why a build of its own: so slowly that a correct mbarrier wait passes the
  # default 10 s deadline (src/core/device.cuh); and the program's handoff arrivals
  # by every thread (src/program/program_finisher.cuh: kArrivalsPerWarp). A team's
  # waits get a deadline as long (TPDECODE_TIMEOUT_MS) for team tests.
  build_race
  for t in ${GEMM_RACE_TESTS:-WgmmaEngine.EveryLaunchShapeAgreesWithTheReference DecodeGemm.EdgeShapesEverySplit GemmProgram.IndependentOps}; do
    TPDECODE_QUICK=1 TPDECODE_SMALL=1 step "race-$t" "${RACE_TIMEOUT:-200}" env $SANITIZER_ENV TPDECODE_TIMEOUT_MS=900000 \
      compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD-race/tests/gpu_tests" --gtest_filter="$t"
  done
fi
if has flag-latency; then
  # A flag's time between two SMs while the GPU streams (scripts/flag_latency.cu).
  nvcc -std=c++20 -arch=sm_90a -I src -I include -o "$LOG/flag_latency" scripts/flag_latency.cu &&
    step flag-latency 120 "$LOG/flag_latency"
fi
if has cluster-residency; then
  # How many clusters of the program's CTAs the GPU holds at once (scripts/cluster_residency.cu,
  # linked with the library for its residency count).
  nvcc -std=c++20 -arch=sm_90a -I src -I include -o "$LOG/cluster_residency" scripts/cluster_residency.cu \
    "$BUILD/src/libtpdecode.a" &&
    step cluster-residency 60 "$LOG/cluster_residency"
fi
if [[ " $steps " == *" row-form "* ]]; then
  # The row form's one-hop boundary (scripts/row_form_probe.cu, linked with the library
  # for its graph timing and with the benchmarks' streaming read), in each compiled
  # form of ROW_FORMS ('|'-separated flags).
  IFS='|' read -ra forms <<< "${ROW_FORMS:--DPF=3|-DBACKOFF=256|-DWARP_POLL|-DWARP_POLL -DBACKOFF=256|-DNOMATH|-DNOMATH -DWARP_POLL}"
  for i in "${!forms[@]}"; do
    # shellcheck disable=SC2086 # a form's flags split
    nvcc -std=c++20 -O3 -arch=sm_90a -I src -I include -I tools ${forms[$i]} -o "$LOG/row_form_$i" \
      scripts/row_form_probe.cu tools/read_ceiling.cu "$BUILD/src/libtpdecode.a" & done
  wait
  for i in "${!forms[@]}"; do step "row-form-$i" 120 "$LOG/row_form_$i"; rm -f "$LOG/row_form_$i"; done
fi
if has race-patterns; then
  # Racecheck's calibration (scripts/racecheck_patterns.cu): which correct
  # synchronisation forms it reports, per kernel.
  nvcc -std=c++20 -arch=sm_90a -I src -I include -o "$LOG/racecheck_patterns" scripts/racecheck_patterns.cu &&
    step race-patterns 120 compute-sanitizer --tool racecheck "$LOG/racecheck_patterns"
  grep -E "^(named|mbarrier|cluster)|Race reported|Potential invalid" "$LOG/race-patterns.txt" |
    sed -E 's/\+0x[0-9a-f]+//' | sort | uniq -c
fi
# Pre-tunes the drafter's per-rank linears at every TP and M bucket; the cache lands in logs.tgz.
has tune && step tune 300 $CLI tune --tp 8 --tp 4 --tp 2 --tp 1 --fresh --cache "$LOG/tune_cache.json" \
  --json "$LOG/tune.json" ${TUNE_ARGS:-}
has bench-gemm && step bench-gemm 300 $CLI bench gemm --json "$LOG/bench_gemm.json" ${GEMM_ARGS:-}
has bench-chain && step bench-chain 300 $CLI bench chain --json "$LOG/bench_chain.json" ${CHAIN_ARGS:-}
has bench-comm && step bench-comm 300 $CLI bench comm --team local --json "$LOG/bench_comm.json" ${COMM_ARGS:-}
if has bench-comm-nccl && [[ $GPUS -ge 2 ]]; then
  step bench-comm-nccl 300 $CLI bench comm --team nccl --tp 2 --json "$LOG/bench_comm_nccl.json" ${NCCL_COMM_ARGS:-}
  # What a fence.acq_rel.sys before the pushes would cost (CommConfig::system_fence).
  step bench-comm-nccl-fence 300 $CLI bench comm --team nccl --tp 2 --op all_reduce --op ar_norm --rows 1 --rows 2 \
    --rows 4 --rows 8 --system-fence --json "$LOG/bench_comm_nccl_fence.json"
fi
has drafter && step drafter 420 $CLI drafter --json "$LOG/drafter.json" ${DRAFTER_ARGS:-}
# Lab instruments (engine design, not the library's benchmarks): only when named.
[[ " $steps " == *" lab-loads "* ]] && step lab-loads 300 $CLI lab loads --json "$LOG/lab_loads.json"
if has peers && [[ -d .tools ]]; then
  # The peers' figures in the same call (../shared/tools, carried as .tools).
  [[ $GPUS -ge 2 ]] && OUT=$LOG step peer-comm 300 torchrun --nproc-per-node 2 .tools/peer_comm.py
  step cublas-chain 300 python3 .tools/cublas_chain.py
fi

# The GEMM program in one call (named explicitly): its GPU tests at full counts,
# memcheck and racecheck (the racecheck build) on them, the chain at every TP and M
# the tables use, and the persistent-chain limit beside it (../shared/tools carried
# as .tools).
if [[ " $steps " == *" program "* ]]; then
  (cd "$BUILD" && timeout 300 ctest --output-on-failure -R 'GemmProgram|ProgramProtocol' -j1 --timeout 200) \
    > "$LOG/program_ctest.log" 2>&1
  echo "== program ctest rc=$?"; grep -E "tests passed|tests failed|\(Failed\)" "$LOG/program_ctest.log" | tail -5
  export TPDECODE_QUICK=1
  step program-memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/gpu_tests" \
    --gtest_filter='GemmProgram.*'
  build_race
  step program-racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD-race/tests/gpu_tests" \
    --gtest_filter='GemmProgram.IndependentOps:GemmProgram.WindowsOfAnEarlierOut'
  unset TPDECODE_QUICK
  step program-chain 300 $CLI bench chain --tp 8 --tp 4 --tp 2 --tp 1 --m 1 --m 8 --m 16 --m 28 --m 64 \
    --layers 5 --json "$LOG/program_chain.json"
  # Where the boundaries' time goes (per CTA; a separate run: the timeline costs ~1 %).
  step program-timeline 120 $CLI bench chain --tp 8 --tp 4 --m 1 --m 8 --layers 5 --timeline \
    --json "$LOG/program_timeline.json"
  if [[ -f .tools/persistent_chain.cu ]]; then
    nvcc -O3 -std=c++17 -arch=sm_90a -o "$LOG/persistent_chain" .tools/persistent_chain.cu &&
      step persistent-chain 120 "$LOG/persistent_chain"
    rm -f "$LOG/persistent_chain"
  fi
fi

# The stress test with random delays inside the all-reduce kernel (named explicitly):
# a second build with TPDECODE_TEST_DELAYS, its GPU tests only.
if [[ " $steps " == *" stress-delays "* ]]; then
  cmake -S . -B build-delays -G Ninja -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$NCCL_ROOT" -DTPDECODE_TEST_DELAYS=ON \
    -DTPDECODE_BUILD_TOOLS=OFF -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc > "$LOG/configure-delays.log" 2>&1 &&
    ninja -C build-delays -j"$(nproc)" gpu_tests > "$LOG/build-delays.log" 2>&1 || { echo "delays build failed"; tail -20 "$LOG/build-delays.log"; }
  step stress-delays 300 build-delays/tests/gpu_tests --gtest_filter='Stress.*'
fi

# The same benchmarks at an earlier commit, for a same-run before/after table
# (named explicitly; the tree is carried in .old/, e.g. `git archive 8266a8e`):
# `before` the collectives (OLD_COMM_ARGS, OLD_NCCL_COMM_ARGS), `before-drafter` too;
# `before-chain` bench chain from both builds interleaved, twice (CHAIN_ARGS; steps
# chain-*-0 the old one).
build_old() { [[ -x build-old/tools/tpdecode ]] || build_tree .old build-old "" tpdecode_cli; }
OLD=build-old/tools/tpdecode
if [[ " $steps " == *" before "* && -d .old ]]; then
  build_old
  step before-bench-comm 300 $OLD bench comm --team local ${OLD_COMM_ARGS:-}
  [[ $GPUS -ge 2 ]] && step before-bench-comm-nccl 300 $OLD bench comm --team nccl --tp 2 ${OLD_NCCL_COMM_ARGS:-}
  [[ " $steps " == *" before-drafter "* ]] && step before-drafter 420 $OLD drafter ${DRAFTER_ARGS:-}
fi
# `variants-chain` adds one build per compiled form of VARIANTS ('|'-separated CUDA
# flags: a measurement's), and `before-chain` one of the old tree per OLD_VARIANTS. Named
# together, the old builds, this one and the variants run interleaved in one set, twice
# (CHAIN_ARGS; steps chain-<round>-<index>, the legend printed).
if [[ ( " $steps " == *" before-chain "* && -d .old ) || " $steps " == *" variants-chain "* ]]; then
  clis=() legend=()
  if [[ " $steps " == *" before-chain "* && -d .old ]]; then
    build_old
    clis+=("$OLD") legend+=("the old tree")
    IFS='|' read -ra old_variants <<< "${OLD_VARIANTS:-}"
    for i in "${!old_variants[@]}"; do
      build_tree .old "build-old-v$i" "${old_variants[$i]}" tpdecode_cli
      clis+=("build-old-v$i/tools/tpdecode") legend+=("the old tree, ${old_variants[$i]}")
    done
  fi
  clis+=("$CLI") legend+=("this tree")
  if [[ " $steps " == *" variants-chain "* ]]; then
    IFS='|' read -ra variants <<< "${VARIANTS:?variants-chain needs VARIANTS}"
    for i in "${!variants[@]}"; do
      build_variant "v$i" "${variants[$i]}" tpdecode_cli
      clis+=("$BUILD-v$i/tools/tpdecode") legend+=("this tree, ${variants[$i]}")
    done
  fi
  for i in "${!clis[@]}"; do echo "== chain-*-$i: ${legend[$i]}"; done
  bench_chains chain "${clis[@]}"
fi

# The Python package (named explicitly; not part of "all"): the tvm-ffi wheel carried
# in .whl/ (this machine has no package index), `pip install .` without build
# isolation (scikit-build-core is in the venv), the tests on one GPU (a local team of
# 2), under torchrun on 2 GPUs (an NCCL team), and the examples.
# install_package LIMIT: the wheel and `pip install .` (python and adopt-python).
install_package() {
  SITE=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/apache_tvm_ffi-*.whl || exit 1
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
  step pip "$1" python3 -m pip install -v --no-build-isolation --no-deps .
}
# The package and its tests alone (named explicitly; one GPU: a local team of 2).
if [[ " $steps " == *" python-tests "* ]]; then
  install_package 330
  step pytest-1gpu 240 python3 -m pytest -q -rs tests/python
fi
if [[ " $steps " == *" python "* ]]; then
  install_package 400
  step py-info 60 python3 -c "import tpdecode, json; print(json.dumps(tpdecode.info(), indent=1))"
  step pytest-1gpu 240 python3 -m pytest -q -rs tests/python
  [[ $GPUS -ge 2 ]] && step pytest-2gpu 240 torchrun --nproc-per-node 2 -m pytest -q -rs tests/python/gpu
  step install-decode 180 python3 examples/install_decode.py
  step bench-mlp-block 150 python3 examples/bench_mlp_block.py --rows 1 4 8 16 24 32 40 48 64 \
    --json "$LOG/bench_mlp_block.json"
  if [[ $GPUS -ge 2 ]]; then
    step llama-tp-layer 180 torchrun --nproc-per-node 2 examples/llama_tp_layer.py
    step bench-ops-2gpu 120 torchrun --nproc-per-node 2 examples/bench_ops.py
  else
    step bench-ops-local 120 python3 examples/bench_ops.py
  fi
fi

# Batch-invariant mode, ar_norm's FP8 epilogues, the width-aware crossover table and
# the Python communicator (named explicitly; the limits keep `adopt crossover` with the
# build, and `adopt-python`, under 8 minutes a call):
#  adopt         their GPU tests in full and the suites the norm kernels' changes touch
#                (reduced counts), memcheck on the new tests (reduced counts), bench comm's
#                FP8 and batch-invariant costs (local TP 8 and 2)
#  crossover     the sweep the crossover table is fitted to (local TP 2/4/8, widths
#                2048-16384): --fit prints the entries to paste into src/comm/crossover.hpp,
#                its JSON goes to tests/data/bench_comm/
#  adopt-python  the package (as `python`), its tests, the communicator's host cost (a
#                local team of 2, and of 1: one launch, as a rank of an NCCL team) and
#                where an eager linear's host time goes (examples/bench_linear.py)
#  install-decode  the package and examples/install_decode.py (eager and graph mode)
if [[ " $steps " == *" adopt "* ]]; then
  step adopt-tests 120 "$BUILD/tests/gpu_tests" --gtest_filter='Fp8Epilogue.*:BatchInvariant.*'
  TPDECODE_QUICK=1 step adopt-regressions 90 "$BUILD/tests/gpu_tests" \
    --gtest_filter='Collectives.*:TwoShot.*:Oproj.ArNorm*'
  TPDECODE_QUICK=1 step adopt-memcheck 120 compute-sanitizer --tool memcheck --report-api-errors no \
    --error-exitcode 9 "$BUILD/tests/gpu_tests" --gtest_filter='Fp8Epilogue.*:BatchInvariant.*'
  TAIL=80 step bench-fp8-invariant 75 $CLI bench comm --team local --tp 8 --tp 2 --hidden 7168 --hidden 4096 \
    --op all_reduce --op ar_norm --op ar_norm_fp8-static --op ar_norm_fp8-group --op ar_norm_fp8-group-ue8m0 \
    --compare-invariant --json "$LOG/bench_fp8_invariant.json"
fi
if [[ " $steps " == *" crossover "* ]]; then
  TAIL=80 step bench-crossover 120 $CLI bench comm --team local --tp 2 --tp 4 --tp 8 --hidden 2048 --hidden 4096 \
    --hidden 5120 --hidden 7168 --hidden 8192 --hidden 12288 --hidden 16384 --op all_reduce --op ar_norm \
    --rows 1 --rows 2 --rows 4 --rows 6 --rows 8 --rows 12 --rows 16 --rows 20 --rows 24 --rows 28 --rows 32 \
    --rows 40 --rows 48 --rows 64 --replays 50 --calls 10 --fit --json "$LOG/bench_crossover.json"
fi
if [[ " $steps " == *" adopt-python "* ]]; then
  install_package 300
  step pytest-adopt 150 python3 -m pytest -q -rs tests/python
  step bench-communicator 60 python3 examples/bench_communicator.py
  step bench-communicator-1 60 python3 examples/bench_communicator.py --ranks 1
  TAIL=14 step bench-linear 90 python3 examples/bench_linear.py
fi
# install_decode.py alone (a call of its own: with the package's build kept from an
# earlier call, `pip install .` only relinks), eager and graph mode at batch 1-8.
if [[ " $steps " == *" install-decode "* ]]; then
  install_package 300
  TAIL=20 step install-decode-graph 200 python3 examples/install_decode.py --rounds 2
fi

if [[ " $steps " == *" two-shot "* ]]; then
  # The two-shot all-reduce: its GPU and CPU tests, memcheck and racecheck on them
  # (reduced counts), bench comm at local TP 8 and, with 2 GPUs, on the NCCL team of 2.
  (cd "$BUILD" && ctest --output-on-failure -R 'TwoShot' -j1 --timeout 300) > "$LOG/two_shot_ctest.log" 2>&1
  echo "== two-shot ctest rc=$?"; grep -E "tests passed|tests failed|\*\*\*Failed|Not Run|Timeout" "$LOG/two_shot_ctest.log" | tail -25
  export TPDECODE_QUICK=1
  step two-shot-memcheck "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool memcheck --report-api-errors no \
    --error-exitcode 9 "$BUILD/tests/gpu_tests" --gtest_filter='TwoShot.*:Failure.TwoShot*'
  step two-shot-racecheck "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$BUILD/tests/gpu_tests" --gtest_filter='TwoShot.AllReduceAndArNorm*:TwoShot.Graph*'
  unset TPDECODE_QUICK
  step bench-two-shot-local-tp8 300 $CLI bench comm --team local --tp 8 --op all_reduce --op ar_norm \
    --json "$LOG/bench_two_shot_local_tp8.json"
  [[ $GPUS -ge 2 ]] && step bench-two-shot-nccl-tp2 300 $CLI bench comm --team nccl --tp 2 --op all_reduce \
    --op ar_norm --json "$LOG/bench_two_shot_nccl_tp2.json"
fi
# PreparedOproj (the fused o-projection), in three steps that each fit one device call:
#  oproj           its tests (CPU and GPU) and the suites its refactors touch
#                  (ArNorm's row body and row sums, the warp split-K engine; reduced counts);
#  oproj-sanitize  memcheck and racecheck on its GPU tests (reduced counts);
#  oproj-bench     bench oproj at local TP 8 and, with 2 GPUs, NCCL TP 2 (the two-shot
#                  kind in runs of its own: a failure there keeps the others' figures);
#                  OPROJ_DRAFTER=1 adds the drafter with producer-consumer forced and without.
if [[ " $steps " == *" oproj "* ]]; then
  (cd "$BUILD" && timeout 300 ctest --output-on-failure -R 'Oproj' -j1 --timeout 240) > "$LOG/oproj-tests.log" 2>&1
  echo "== oproj-tests rc=$?"
  grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|\(Failed\)" "$LOG/oproj-tests.log" | tail -25
  TPDECODE_QUICK=1 step oproj-regressions 240 "$BUILD/tests/gpu_tests" \
    --gtest_filter='Collectives.*:TwoShot.*:Failure.*:DecodeGemm.*:DrafterStepGpu*'
fi
if [[ " $steps " == *" oproj-sanitize "* ]]; then
  export TPDECODE_QUICK=1
  step oproj-memcheck "${SANITIZE_TIMEOUT:-300}" env $SANITIZER_ENV compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    "$BUILD/tests/gpu_tests" --gtest_filter='Oproj.ArNorm*:Oproj.AttnRes*'
  step oproj-racecheck "${SANITIZE_TIMEOUT:-240}" env $SANITIZER_ENV compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/gpu_tests" \
    --gtest_filter='Oproj.ArNorm*'
  unset TPDECODE_QUICK
fi
if [[ " $steps " == *" oproj-bench "* ]]; then
  step bench-oproj 180 $CLI bench oproj --team local --tp 8 --kind producer-consumer --kind fused \
    --json "$LOG/bench_oproj.json" ${OPROJ_ARGS:-}
  step bench-oproj-two-shot 120 $CLI bench oproj --team local --tp 8 --kind two-shot --epilogue ar_norm \
    --json "$LOG/bench_oproj_two_shot.json" ${OPROJ_ARGS:-}
  if [[ $GPUS -ge 2 ]]; then
    step bench-oproj-nccl 180 $CLI bench oproj --team nccl --tp 2 --kind producer-consumer --kind fused \
      --json "$LOG/bench_oproj_nccl.json" ${OPROJ_ARGS:-}
    step bench-oproj-nccl-two-shot 120 $CLI bench oproj --team nccl --tp 2 --kind two-shot --epilogue ar_norm \
      --json "$LOG/bench_oproj_nccl_two_shot.json" ${OPROJ_ARGS:-}
  fi
  if [[ -n ${OPROJ_DRAFTER:-} ]]; then
    step drafter-oproj 300 $CLI drafter --rows 1 --rows 7 --rows 28 --oproj producer-consumer --json "$LOG/drafter_oproj.json"
    step drafter-unfused 300 $CLI drafter --rows 1 --rows 7 --rows 28 --oproj unfused --json "$LOG/drafter_unfused.json"
  fi
fi
exit 0
