#!/usr/bin/env bash
# One full GPU check: build, every test (C++ and Python), compute-sanitizer
# on the CUDA tests, and the benchmarks, with logs under $OUT (or ./gpu-out).
# Made for the lent H200 (no network): builds with the preinstalled
# scikit-build-core/nanobind, sm_90 only to save compile time.
#
#   bash scripts/gpu_check.sh [build] [tests] [sanitize] [bench]   (default: all)
#
# The benchmarks write bench/results/-style JSON under $OUT, each carrying the
# commit of the tree: from git when the tree is a checkout, else from
# HISPARSE_COMMIT (a working tree copied without .git: set it to the commit the
# copy was made from), else "unknown".
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if [ -z "${HISPARSE_COMMIT:-}" ] && git rev-parse HEAD > /dev/null 2>&1; then
  HISPARSE_COMMIT=$(git rev-parse HEAD)
  git diff --quiet HEAD -- . ':(exclude)bench/results' || HISPARSE_COMMIT="$HISPARSE_COMMIT-dirty"
fi
export HISPARSE_COMMIT=${HISPARSE_COMMIT:-unknown}
echo "commit: $HISPARSE_COMMIT"
STEPS=${*:-build tests sanitize bench}
JOBS=$(nproc)
status=0
step() { echo "=== $1 ($(date +%T))"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1

if has build; then
  step "build wheel (sm_90)"
  export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
  python3 -m pip install --no-build-isolation --no-deps -q \
      -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 -C build-dir=/tmp/hs-wheel . > "$OUT/build.log" 2>&1 \
    || { echo "wheel build FAILED"; tail -50 "$OUT/build.log"; exit 1; }
  step "build C++ tests"
  cmake -S . -B /tmp/hs-cmake -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DHISPARSE_CUDA=ON >> "$OUT/build.log" 2>&1 \
    && cmake --build /tmp/hs-cmake -j "$JOBS" >> "$OUT/build.log" 2>&1 \
    || { echo "C++ build FAILED"; tail -50 "$OUT/build.log"; exit 1; }
  python3 -m hisparse info | tee "$OUT/info.txt"
fi

if has tests; then
  step "ctest"
  (cd /tmp/hs-cmake && ctest -j 8 --output-on-failure > "$OUT/ctest.log" 2>&1) || { status=1; echo "ctest FAILED"; }
  tail -3 "$OUT/ctest.log"
  step "pytest"
  python3 -m pytest tests/python -q --maxfail=25 -p no:cacheprovider --junitxml="$OUT/pytest.xml" > "$OUT/pytest.log" 2>&1 \
    || { status=1; echo "pytest FAILED"; }
  tail -15 "$OUT/pytest.log"
fi

if has sanitize; then
  # Without torch's caching allocator every tensor is its own allocation, so
  # memcheck sees an access one byte past a tensor.
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1 HISPARSE_SANITIZER_RUN=1
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool"
    compute-sanitizer --tool $tool --error-exitcode 99 --target-processes all \
        python3 -m pytest -q -x -p no:cacheprovider -m "sanitize" tests/python > "$OUT/sanitize_$tool.log" 2>&1 \
      || { status=1; echo "$tool FAILED"; }
    grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitize_$tool.log" | tail -3
  done
fi

if has bench; then
  step "benchmarks"
  # The commands of docs/performance.md, each result under its bench/results/ name.
  bench_run() {
    local name=$1 script=$2
    shift 2
    timeout 300 python3 "$script" "$@" --out "$OUT/${name}_h200.json" > "$OUT/$name.log" 2>&1 \
      || { status=1; echo "$name FAILED"; }
    tail -25 "$OUT/$name.log"
  }
  bench_run resolver_grid bench/bench_resolver.py
  bench_run gather_schedules bench/bench_gather.py --row-bytes 656,1152 --counts "" --pool-gib 8 --iters 5
  bench_run decode_step bench/bench_decode_step.py
fi
step "done (status $status)"
exit $status
