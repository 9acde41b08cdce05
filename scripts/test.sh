#!/usr/bin/env bash
# Builds tpdecode and runs its tests. On a fresh Debian/Ubuntu machine it first
# installs what is missing (CMake, ninja, GoogleTest, CLI11, fmt, nlohmann-json);
# the CUDA toolkit (nvcc, with NCCL) is expected under /usr/local/cuda or on PATH.
# GPU tests skip cleanly where there is no GPU. Then the Python package: `pip install .`
# into a fresh venv and its tests (PyPI needed for tvm-ffi, scikit-build-core, pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_packages
configure_and_build "${BUILD:-build}"
(cd "${BUILD:-build}" && ctest --output-on-failure -j"$(nproc)" --timeout 1500)
python_tests "${BUILD:-build}/python-venv"
