#!/usr/bin/env bash
# One full GPU check: build, every test (C++ and Python), compute-sanitizer
# on the CUDA tests, and the benchmarks. Made for a lent H200 (no network):
# builds with the preinstalled scikit-build-core/nanobind, sm_90 only, once
# (the wheel's build tree also holds the GoogleTest suite). Logs go under
# $LOGS (/tmp/hs-logs) and, as one archive plus the results JSON, under $OUT
# (./gpu-out): a machine that returns only a few files gets everything.
#
#   bash scripts/gpu_check.sh [build] [tests] [sanitize] [bench]   (default: all)
#
# PYTEST_FILES picks the Python tests (default tests/python), PYTEST_TIMEOUT
# bounds them (seconds; pytest is interrupted, so its summary is kept).
# PYTEST_MARKS, when set, is pytest's -m expression: "cuda" runs only the
# CUDA cases (about 40% of the suite on a GPU machine; the CPU cases are
# the CI's), for a call too short for the whole suite.
# PYTEST_SHARDS (default 6) and SANITIZE_SHARDS (default 3 per tool) split
# the pytest run and each compute-sanitizer run into processes that share
# the GPU side by side (HISPARSE_TEST_SHARD, tests/python/conftest.py): the
# whole suite and both sanitizers then fit a few minutes.
#
# Wheels under .whl/ (for example transformers >= 5.24 for the integration
# tests) are installed into /tmp/hs-site first and put on PYTHONPATH.
#
# The benchmarks write bench/results/-style JSON, each carrying the commit of
# the tree: from git when the tree is a checkout, else from HISPARSE_COMMIT
# (a working tree copied without .git: set it to the commit the copy was made
# from), else "unknown".
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
LOGS=${LOGS:-/tmp/hs-logs}
BUILD=${BUILD:-/tmp/hs-wheel}
mkdir -p "$OUT" "$LOGS"
if [ -z "${HISPARSE_COMMIT:-}" ] && git rev-parse HEAD > /dev/null 2>&1; then
  HISPARSE_COMMIT=$(git rev-parse HEAD)
  git diff --quiet HEAD -- . ':(exclude)bench/results' || HISPARSE_COMMIT="$HISPARSE_COMMIT-dirty"
fi
export HISPARSE_COMMIT=${HISPARSE_COMMIT:-unknown} PYTHONUNBUFFERED=1
# NVLink multicast stays off (it can take a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "commit: $HISPARSE_COMMIT"
STEPS=${*:-build tests sanitize bench}
JOBS=$(nproc)
status=0
step() { echo "=== $1 ($(date +%T))"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
archive() { tar czf "$OUT/logs.tgz" -C "$LOGS" . 2> /dev/null; }
trap archive EXIT

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$LOGS/gpu.txt" 2>&1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/hs-site .whl/*.whl \
    > "$LOGS/wheels.log" 2>&1 || { echo "wheel install FAILED"; tail -20 "$LOGS/wheels.log"; exit 1; }
  export PYTHONPATH=/tmp/hs-site${PYTHONPATH:+:$PYTHONPATH}
fi

# A machine kept warm between calls keeps its build: a second call on the
# same clean commit skips the build step (an unknown or dirty tree always
# rebuilds: its name does not say what it holds).
reusable() { [[ "$HISPARSE_COMMIT" != unknown && "$HISPARSE_COMMIT" != *-dirty ]]; }
if has build && reusable && [ -f "$BUILD/.built-$HISPARSE_COMMIT" ] && python3 -c "import hisparse" 2> /dev/null; then
  echo "build: reusing $BUILD ($HISPARSE_COMMIT)"
elif has build; then
  step "build (sm_90): the wheel, with the GoogleTest suite in its build tree"
  export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
  python3 -m pip install --no-build-isolation --no-deps -q -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 \
    -C cmake.define.HISPARSE_BUILD_TESTS=ON -C cmake.define.HISPARSE_CUDA=ON -C build-dir="$BUILD" . \
    > "$LOGS/build.log" 2>&1 || { echo "build FAILED"; tail -50 "$LOGS/build.log"; exit 1; }
  touch "$BUILD/.built-$HISPARSE_COMMIT"
  python3 -m hisparse info | tee "$LOGS/info.txt"
fi

# Runs "$@" as `count` shards side by side (HISPARSE_TEST_SHARD=i/count;
# @SHARD@ in an argument becomes i), logging shard i to
# $LOGS/<name>_<i>.log; prints each shard's summary and a failed shard's
# last lines, and fails when any shard fails.
sharded() {
  local name=$1 count=$2 failed=0 i
  shift 2
  local pids=()
  for ((i = 0; i < count; i++)); do
    HISPARSE_TEST_SHARD=$i/$count "${@//@SHARD@/$i}" > "$LOGS/${name}_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    local log="$LOGS/${name}_$i.log"
    if wait "${pids[$i]}"; then
      echo "$name $i/$count: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|[0-9]+ (passed|failed)" "$log" \
        | tail -2 | tr '\n' ' ')"
    else
      failed=1
      echo "$name $i/$count FAILED:"
      tail -15 "$log"
    fi
  done
  return $failed
}

run_tests() {
  local failed=0
  step "ctest"
  (cd "$BUILD" && ctest -j 8 --output-on-failure > "$LOGS/ctest.log" 2>&1) || { failed=1; echo "ctest FAILED"; }
  tail -3 "$LOGS/ctest.log"
  step "pytest (${PYTEST_SHARDS:-6} shards${PYTEST_MARKS:+, -m $PYTEST_MARKS})"
  local marks=()
  [ -n "${PYTEST_MARKS:-}" ] && marks=(-m "$PYTEST_MARKS")
  sharded pytest "${PYTEST_SHARDS:-6}" timeout -s INT "${PYTEST_TIMEOUT:-540}" python3 -m pytest ${PYTEST_FILES:-tests/python} \
    "${marks[@]}" -q --maxfail=25 -p no:cacheprovider -rfs --durations=20 --junitxml="$LOGS/pytest_@SHARD@.xml" || failed=1
  return $failed
}

run_sanitizers() {
  # Without torch's caching allocator every tensor is its own allocation, so
  # memcheck sees an access one byte past a tensor.
  local failed=0 tool pids=()
  step "compute-sanitizer memcheck and racecheck (${SANITIZE_SHARDS:-3} shards each)"
  for tool in memcheck racecheck; do
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 HISPARSE_SANITIZER_RUN=1 sharded "sanitize_$tool" "${SANITIZE_SHARDS:-3}" \
      compute-sanitizer --tool $tool --error-exitcode 99 --target-processes all \
      python3 -m pytest -q -x -p no:cacheprovider -m "sanitize" tests/python &
    pids+=($!)
  done
  for tool in "${pids[@]}"; do wait "$tool" || failed=1; done
  return $failed
}

# The tests and the sanitizers run side by side: neither is timed.
if has sanitize; then
  run_sanitizers &
  sanitizers=$!
fi
if has tests; then run_tests || status=1; fi
if has sanitize; then wait "$sanitizers" || status=1; fi

if has bench; then
  step "benchmarks"
  # The commands of docs/performance.md, each result under its bench/results/ name.
  bench_run() {
    local name=$1 script=$2
    shift 2
    timeout 300 python3 "$script" "$@" --out "$OUT/${name}.json" > "$LOGS/$name.log" 2>&1 \
      || { status=1; echo "$name FAILED"; }
    tail -25 "$LOGS/$name.log"
  }
  bench_run resolver_grid_h200 bench/bench_resolver.py --peer bench/peers/sglang_010c002_h200.json
  bench_run resolver_speculative_shapes_h200 bench/bench_resolver.py --sections speculative --baseline-steps 0 \
    --replays 5 --steps 16 --spec-batches 1,64,256
  bench_run resolver_uneven_misses_h200 bench/bench_resolver.py --sections uneven --paths resolve,resolve_auto_gather \
    --replays 5 --baseline-steps 0
  bench_run gather_schedules_h200 bench/bench_gather.py --row-bytes 656,1152 --counts "" --pool-gib 8 --iters 5
  bench_run decode_step_h200 bench/bench_decode_step.py
  bench_run shared_pool_h200 bench/bench_shared_pool.py
  bench_run shared_pool_tp_1xh200 bench/bench_shared_pool_tp.py --ranks 2 --same-device --pool-gib 8
fi
step "done (status $status)"
exit $status
