#!/usr/bin/env bash
# A/B of a benchmark between source trees on one machine, in one run: builds
# each tree into its own install directory (all at once, the cores shared),
# then runs the benchmark of each tree for several rounds in an order that
# rotates from round to round (so drift in clocks or in the link hits every
# side alike; two trees alternate), and prints, per point and timing, the
# median of each side and each later tree's time over the first's. Several
# candidate trees against one base cost one build step.
#
#   bash scripts/ab_bench.sh OLD_TREE NEW_TREE [MORE_TREES...] [ROUNDS] [-- BENCH_ARGS...]
#
# An argument of digits alone is ROUNDS (a tree so named is given as ./NAME).
# Sides are named old, new, new2, new3, ... in the order given. Environment:
# BENCH (bench/bench_resolver.py), OUT (./ab-out), CUDA_ARCHS (90). Each
# tree's own copy of BENCH runs against its own build, so a benchmark may
# differ between the trees as their APIs do. Results: $OUT/ab_<side>_rN.json
# and $OUT/ab_summary.json.
set -euo pipefail
trees=()
rounds=3
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  if [[ "$1" =~ ^[0-9]+$ ]]; then
    rounds=$1
  else
    [ -d "$1" ] || { echo "ab_bench.sh: tree '$1' is not a directory" >&2; exit 2; }
    trees+=("$(cd "$1" && pwd)")
  fi
  shift
done
[ "${1:-}" = "--" ] && shift
if [ ${#trees[@]} -lt 2 ]; then
  echo "ab_bench.sh: expected at least two trees (OLD_TREE NEW_TREE [MORE_TREES...] [ROUNDS] [-- BENCH_ARGS])" >&2
  exit 2
fi
bench=${BENCH:-bench/bench_resolver.py}
out=${OUT:-$PWD/ab-out}
archs=${CUDA_ARCHS:-90}
mkdir -p "$out"
sides=(old new)
for ((i = 2; i < ${#trees[@]}; ++i)); do sides+=("new$i"); done

jobs=$(nproc)
export CMAKE_BUILD_PARALLEL_LEVEL=$(((jobs + ${#trees[@]} - 1) / ${#trees[@]}))
pids=()
for i in "${!trees[@]}"; do
  side=${sides[$i]}
  echo "=== build $side (${trees[$i]})"
  python3 -m pip install --no-build-isolation --no-deps -q --target "/tmp/ab-site-$side" --upgrade \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$archs" -C build-dir="/tmp/ab-build-$side" "${trees[$i]}" \
    >"$out/build_$side.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || {
    kill "${pids[@]}" 2>/dev/null || true
    tail -40 "$out/build_${sides[$i]}.log"
    exit 1
  }
done

count=${#trees[@]}
for round in $(seq 1 "$rounds"); do
  # Round r starts at tree r - 1: each tree runs first once every `count` rounds.
  order=()
  for ((i = 0; i < count; ++i)); do order+=($(((i + round - 1) % count))); done
  for i in "${order[@]}"; do
    side=${sides[$i]}
    echo "=== round $round: $side"
    (cd "${trees[$i]}" && PYTHONPATH="/tmp/ab-site-$side" python3 "$bench" --out "$out/ab_${side}_r$round.json" "$@") \
      >"$out/run_${side}_r$round.log" 2>&1 || { tail -40 "$out/run_${side}_r$round.log"; exit 1; }
  done
done

python3 - "$out" "$rounds" "${sides[@]}" <<'EOF'
import json, statistics, sys
out, rounds, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(side):
    return [json.load(open(f"{out}/ab_{side}_r{r}.json")) for r in range(1, rounds + 1)]
runs = {side: load(side) for side in sides}
old = runs["old"]
key_fields = ("batch", "miss_rate", "token_rows", "hot_size", "top_k")
def key(point):
    return tuple((k, point[k]) for k in key_fields if k in point)
summary = []
header = "".join(f" {side + ' us':>9s} {side + '/old':>9s}" for side in sides[1:])
print(f"{'point':40s} {'timing':32s} {'old us':>9s}{header}")
for index, point in enumerate(old[0]["points"]):
    for name in point:
        if not name.endswith("_us") or "torch" in name or "ideal" in name:
            continue
        a = statistics.median(run["points"][index][name] for run in old)
        cells = ""
        for side in sides[1:]:
            try:
                b = statistics.median(run["points"][index][name] for run in runs[side])
            except KeyError:
                cells += f" {'-':>9s} {'-':>9s}"
                continue
            summary.append({"point": dict(key(point)), "timing": name, "side": side, "old_us": a, "new_us": b,
                            "ratio": b / a})
            cells += f" {b:9.2f} {b / a:9.3f}"
        label = " ".join(f"{k}={v}" for k, v in key(point))
        print(f"{label:40s} {name:32s} {a:9.2f}{cells}")
json.dump({"rounds": rounds, "sides": sides, "summary": summary}, open(f"{out}/ab_summary.json", "w"), indent=2)
EOF
