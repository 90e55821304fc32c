#!/usr/bin/env bash
# Sets up and runs every hisparse test from a fresh clone, reusing what the
# README's setup command built:
#   1. GoogleTest (installed with apt-get when missing and running as root);
#   2. the build backend (scikit-build-core, nanobind) and
#      `pip install --no-build-isolation .[test,transformers]` (transformers
#      from PyPI, for the integration's tests) with the GoogleTest suite
#      switched on: the package's own persistent build tree
#      (build/<wheel tag>) is rebuilt incrementally, so after the setup
#      command only the tests compile (the CUDA backend is built when nvcc is
#      found); torch is not installed here: without it the torch tests skip;
#   3. ctest in that tree (GoogleTest, and examples/cpp built against an
#      installed copy of the C++ package);
#   4. pytest tests/python against the installed package.
# Exits non-zero when any step or test fails.
#
# Environment: PYTHON (python3), JOBS (nproc), HISPARSE_CUDA (ON when nvcc is
# found, else AUTO).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
python=${PYTHON:-python3}
jobs=${JOBS:-$(nproc)}
cuda=${HISPARSE_CUDA:-}
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
# With nvcc on PATH the CUDA backend must compile: ON turns a failed CUDA
# configuration into an error instead of AUTO's quiet CPU-only build.
if command -v nvcc >/dev/null 2>&1; then
  cuda=${cuda:-ON}
  echo "nvcc found: HISPARSE_CUDA=$cuda (ON: the CUDA backend must compile; GPU tests skip without a device)"
else
  cuda=${cuda:-AUTO}
  echo "no nvcc on PATH: the CUDA backend is built only where CMake finds one (HISPARSE_CUDA=$cuda)"
fi

step "pip install .[test,transformers] (incremental in the package's build tree)"
"$python" -m pip install "scikit-build-core>=0.10" "nanobind>=2.0"
"$python" -m pip install --no-build-isolation -C cmake.define.HISPARSE_BUILD_TESTS=ON \
  -C cmake.define.HISPARSE_CUDA="$cuda" ".[test,transformers]"
if "$python" -c "import torch" >/dev/null 2>&1; then
  echo "torch $("$python" -c 'import torch; print(torch.__version__)') found"
else
  echo "NOTE: torch is not installed; the torch-based Python tests will be skipped" \
    "(see the README for the torch command of this machine)."
fi
# The tree pip just built: the newest build/<wheel tag> holding the tests.
build_dir=$(ls -1dt "$root"/build/*/ 2>/dev/null | while read -r dir; do
  [ -f "$dir/tests/cpp/CTestTestfile.cmake" ] && echo "${dir%/}" && break
done)
[ -n "$build_dir" ] || die "no build tree with the GoogleTest suite under $root/build"
echo "build tree: $build_dir"

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
