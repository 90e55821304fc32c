"""One point of bench_resolver.py's grid, launched eagerly for a profiler.

    ncu --section SourceCounters --import-source yes -k regex:resolve_residency_kernel \\
        --launch-skip 2 --launch-count 1 -o point \\
        python3 bench/profile_resolver_point.py BATCH MISS_RATE [SCHEDULE] [-- BENCH_OPTIONS]

Builds the grid's scenario (bench_resolver.Scenario: the same pool, trace and
state as the timed grid) and runs six resolves one after another: step 0
from a cold state, step 1 to warm it, steps 2 to 5 the steady state that the
grid times. Skip the first two launches to profile a steady one. SCHEDULE is
a fused-gather schedule as bench_resolver.py names them ("auto", "fused",
"auto-tail"); without it the resolve runs alone. BENCH_OPTIONS are
bench_resolver.py's shape options (--top-k, --hot-size, --row-bytes,
--context, --block-size) for a point off the grid.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_resolver as br  # noqa: E402
import torch  # noqa: E402


def main(argv):
    point, bench_options = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    if len(point) not in (2, 3):
        raise SystemExit(__doc__)
    batch, miss_rate = int(point[0]), float(point[1])
    schedule = point[2] if len(point) == 3 else None
    args = br.parse_args(["--steps", "4", *bench_options])
    pool, host, hot = br.make_caches(args, batch, "cuda")  # pool backs host
    scenario = br.Scenario(args, batch, miss_rate, host, hot)
    for step in range(6):
        # Steps 0 and 1 fill the hot buffer the same way for every schedule.
        scenario.resolve(step, schedule=None if step < 2 else schedule)
    torch.cuda.synchronize()
    print(f"batch {batch}, miss rate {miss_rate}, schedule {schedule or 'resolve alone'}: "
          f"{int(scenario.swap_counts.sum())} swap rows in the last step")


if __name__ == "__main__":
    main(sys.argv[1:])
