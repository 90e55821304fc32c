#!/usr/bin/env bash
# Sets up and runs every hisparse test from a fresh clone:
#   1. GoogleTest (installed with apt-get when missing and running as root);
#   2. `pip install .[test]` (the package, with the CUDA backend when nvcc is
#      found); torch is not installed here: without it the torch tests skip;
#   3. the CMake test tree (tests ON, CUDA AUTO) built and run by ctest, which
#      includes building examples/cpp against an installed copy;
#   4. pytest tests/python against the installed package.
# Exits non-zero when any step or test fails.
#
# Environment: PYTHON (python3), JOBS (nproc), HISPARSE_CUDA (AUTO),
# HISPARSE_TEST_BUILD_DIR (build/tests).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
python=${PYTHON:-python3}
jobs=${JOBS:-$(nproc)}
cuda=${HISPARSE_CUDA:-AUTO}
build_dir=${HISPARSE_TEST_BUILD_DIR:-$root/build/tests}
export CMAKE_BUILD_PARALLEL_LEVEL=$jobs

step() { printf '\n==> %s\n' "$*"; }
die() {
  printf 'run_tests.sh: %s\n' "$*" >&2
  exit 1
}

have_gtest() {
  [ -f /usr/src/googletest/CMakeLists.txt ] && return 0
  local dir
  for dir in /usr/lib/*/cmake/GTest /usr/lib/cmake/GTest /usr/lib64/cmake/GTest /usr/local/lib/cmake/GTest \
    /usr/local/lib64/cmake/GTest /usr/share/cmake/GTest "${GTest_DIR:-/nonexistent}"; do
    [ -f "$dir/GTestConfig.cmake" ] && return 0
  done
  return 1
}

# CMake >= 3.24 is required; an older or missing one is replaced by PyPI's.
cmake_ok() {
  command -v cmake >/dev/null 2>&1 || return 1
  local version
  version=$(cmake --version | head -n1 | sed -E 's/[^0-9]*([0-9]+\.[0-9]+).*/\1/')
  [ "$(printf '%s\n' 3.24 "$version" | sort -V | head -n1)" = 3.24 ]
}

step "GoogleTest"
if ! have_gtest; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends libgtest-dev
  else
    die "GoogleTest is missing. Install it (Debian/Ubuntu: sudo apt-get install libgtest-dev) or point \
GTest_DIR at a GoogleTest CMake package, then rerun."
  fi
fi
have_gtest || die "GoogleTest is still missing after installing libgtest-dev"
echo "found"

step "CMake and build tools"
if ! cmake_ok; then
  "$python" -m pip install "cmake>=3.24"
  hash -r
  cmake_ok || die "CMake >= 3.24 is required (found: $(command -v cmake || echo none))"
fi
cmake --version | head -n1
generator=()
if command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "nvcc found: the CUDA backend is compiled (HISPARSE_CUDA=$cuda); GPU tests skip without a device"
else
  echo "no nvcc: CPU backend only"
fi

step "pip install .[test]"
"$python" -m pip install ".[test]"
if "$python" -c "import torch" >/dev/null 2>&1; then
  echo "torch $("$python" -c 'import torch; print(torch.__version__)') found"
else
  echo "NOTE: torch is not installed; the torch-based Python tests will be skipped" \
    "(pip install torch to run them)."
fi

step "CMake test tree in $build_dir"
# The checkout's build/ may hold a tree configured elsewhere (another path or
# generator); start clean in that case rather than fail on a stale cache.
if [ -f "$build_dir/CMakeCache.txt" ] &&
  ! grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$root\$" "$build_dir/CMakeCache.txt"; then
  rm -rf "$build_dir"
fi
cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DHISPARSE_BUILD_TESTS=ON -DHISPARSE_CUDA="$cuda"
cmake --build "$build_dir" --parallel "$jobs"

failed=()
step "ctest"
if ! ctest --test-dir "$build_dir" --output-on-failure --parallel "$jobs"; then
  failed+=(ctest)
fi

step "pytest tests/python"
if ! "$python" -m pytest "$root/tests/python" -q -rs; then
  failed+=(pytest)
fi

if [ ${#failed[@]} -gt 0 ]; then
  die "FAILED: ${failed[*]}"
fi
step "all tests passed"
