# Shared by scripts/test.sh and scripts/run.sh.

PACKAGES=(cmake ninja-build g++ libgtest-dev libcli11-dev libfmt-dev nlohmann-json3-dev)

# Installs the Debian packages that are missing, PACKAGES and any named (needs
# apt-get; skipped where every package is present, e.g. the GPU machine, which has no
# package registry).
ensure_packages() {
  local missing=()
  for p in "${PACKAGES[@]}" "$@"; do
    dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p")
  done
  if [[ ${#missing[@]} -gt 0 ]] && command -v apt-get > /dev/null; then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" > /dev/null
  fi
}

find_nvcc() {
  if command -v nvcc > /dev/null; then command -v nvcc; elif [[ -x /usr/local/cuda/bin/nvcc ]]; then echo /usr/local/cuda/bin/nvcc; else
    echo "nvcc not found: install the CUDA toolkit (13.x) under /usr/local/cuda" >&2; return 1; fi
}

# configure_and_build BUILD_DIR [TARGET...]
configure_and_build() {
  local dir=$1; shift
  local nvcc; nvcc=$(find_nvcc)
  local generator=(); command -v ninja > /dev/null && generator=(-G Ninja)
  if [[ ! -f "$dir/CMakeCache.txt" ]]; then
    cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" ${NCCL_ROOT:+-DNCCL_ROOT="$NCCL_ROOT"}
  fi
  cmake --build "$dir" --parallel "$(nproc)" ${1:+--target "$@"}
}

# python_tests VENV: README's commands in a fresh venv, `pip install '.[test]'` and
# torch and transformers ($TPDECODE_TEST_TORCH, pinned; empty: neither), then
# `python -m pytest tests/python` (the CPU tests must run: pytest's "no tests
# collected", exit 5, is a failure; the GPU tests skip without a GPU). Why torch
# without a GPU: the communicator's verdicts, the linear routing, the custom ops'
# fake implementations and install() run on the CPU (about 2 minutes, 5 GB).
python_tests() {
  local venv=$1
  rm -rf "$venv"
  python3 -m venv "$venv"
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$venv/bin/pip" install -q ".[test]"
  local torch=${TPDECODE_TEST_TORCH-torch==2.15.0 transformers==5.24.0}
  # shellcheck disable=SC2086 # the list splits into packages
  [[ -z $torch ]] || "$venv/bin/pip" install -q $torch
  local rc=0
  "$venv/bin/python" -m pytest -q tests/python || rc=$?
  if [[ $rc -eq 5 ]]; then echo "pytest collected no Python tests" >&2; fi
  return $rc
}
