#!/usr/bin/env bash
# Builds tpdecode and runs its tests. On a fresh Debian/Ubuntu machine it first
# installs what is missing (CMake, ninja, GoogleTest, CLI11, fmt, nlohmann-json,
# python3-venv);
# the CUDA toolkit (nvcc, with NCCL) is expected under /usr/local/cuda or on PATH.
# GPU tests skip cleanly where there is no GPU. Then it installs the library into a
# temporary prefix, builds and runs the example that uses the installed package,
# compiles each installed header on its own, and tests the Python package:
# `pip install '.[test]'` into a fresh venv and its tests (PyPI needed for tvm-ffi,
# scikit-build-core, pytest, numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_packages python3-venv
BUILD=${BUILD:-build}
configure_and_build "$BUILD"
(cd "$BUILD" && ctest --output-on-failure -j"$(nproc)" --timeout 1500)

prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$BUILD" --prefix "$prefix/install" > /dev/null
cmake -S examples/cpp -B "$prefix/example" -G Ninja -DCMAKE_PREFIX_PATH="$prefix/install" \
  -DCMAKE_CUDA_COMPILER="$(find_nvcc)" > /dev/null
cmake --build "$prefix/example" > /dev/null
"$prefix/example/tpdecode_example"
echo "installed package: find_package(tpdecode) and the example build and run"
cmake -S tests/installed_headers -B "$prefix/headers" -G Ninja -DCMAKE_PREFIX_PATH="$prefix/install" \
  -DCMAKE_CUDA_COMPILER="$(find_nvcc)" > /dev/null
cmake --build "$prefix/headers" > /dev/null
echo "installed headers: each compiles on its own"

python_tests "$BUILD/python-venv"
