#!/usr/bin/env bash
# A/B of a benchmark between two source trees on one machine, in one run:
# builds each tree into its own install directory, then runs the benchmark
# of each tree in alternating order for several rounds (so drift in clocks
# or in the link hits both sides alike) and prints, per point and timing,
# the median of each side and new / old.
#
#   bash scripts/ab_bench.sh OLD_TREE NEW_TREE [ROUNDS] [-- BENCH_ARGS...]
#
# Environment: BENCH (bench/bench_resolver.py), OUT (./ab-out),
# CUDA_ARCHS (90). Each tree's own copy of BENCH runs against its own build,
# so a benchmark may differ between the trees as their APIs do. Results:
# $OUT/ab_{old,new}_rN.json and $OUT/ab_summary.json.
set -euo pipefail
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
shift 2
rounds=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  rounds=$1
  shift
fi
[ "${1:-}" = "--" ] && shift
bench=${BENCH:-bench/bench_resolver.py}
out=${OUT:-$PWD/ab-out}
archs=${CUDA_ARCHS:-90}
mkdir -p "$out"

for side in old new; do
  tree=${!side}
  echo "=== build $side ($tree)"
  python3 -m pip install --no-build-isolation --no-deps -q --target "/tmp/ab-site-$side" --upgrade \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$archs" -C build-dir="/tmp/ab-build-$side" "$tree" \
    >"$out/build_$side.log" 2>&1 || { tail -40 "$out/build_$side.log"; exit 1; }
done

for round in $(seq 1 "$rounds"); do
  order="old new"
  [ $((round % 2)) = 0 ] && order="new old"
  for side in $order; do
    tree=${!side}
    echo "=== round $round: $side"
    (cd "$tree" && PYTHONPATH="/tmp/ab-site-$side" python3 "$bench" --out "$out/ab_${side}_r$round.json" "$@") \
      >"$out/run_${side}_r$round.log" 2>&1 || { tail -40 "$out/run_${side}_r$round.log"; exit 1; }
  done
done

python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(side):
    return [json.load(open(f"{out}/ab_{side}_r{r}.json")) for r in range(1, rounds + 1)]
old, new = load("old"), load("new")
key_fields = ("batch", "miss_rate", "token_rows", "hot_size", "top_k")
def key(point):
    return tuple((k, point[k]) for k in key_fields if k in point)
summary = []
print(f"{'point':40s} {'timing':32s} {'old us':>9s} {'new us':>9s} {'new/old':>8s}")
for index, point in enumerate(old[0]["points"]):
    for name in point:
        if not name.endswith("_us") or "torch" in name or "ideal" in name:
            continue
        a = statistics.median(run["points"][index][name] for run in old)
        try:
            b = statistics.median(run["points"][index][name] for run in new)
        except KeyError:
            continue
        summary.append({"point": dict(key(point)), "timing": name, "old_us": a, "new_us": b, "ratio": b / a})
        label = " ".join(f"{k}={v}" for k, v in key(point))
        print(f"{label:40s} {name:32s} {a:9.2f} {b:9.2f} {b / a:8.3f}")
json.dump({"rounds": rounds, "summary": summary}, open(f"{out}/ab_summary.json", "w"), indent=2)
EOF
