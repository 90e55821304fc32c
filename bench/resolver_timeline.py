"""Per-block timelines of resolver launches: when each block passes each phase.

    python3 bench/resolver_timeline.py BATCH MISS_RATE [--schedule auto] [--launches 4]
        [--residency-hint auto|on|off] [--sweep-regions N] [--tree DIR] [--build-dir DIR]
        [--out FILE] [-- BENCH_OPTIONS]

Builds a stamped copy of a source tree (default: this checkout) into a
temporary directory: thread 0 of every block of resolve_residency_kernel
writes %globaltimer after each line of the kernel body whose trailing
comment names a phase (`// D  | B5, B6`, as resolver_phase_counts.py reads
them), inside phase A at each turn's start, past the prior grid's wait and
past B1, after each step of the single-row phases (resolver_single_row.cuh:
the union, the walk, the assignment, the publication, the outputs, the
finish), and the early-read helpers (resolver_early_reads.cuh) after the
steps of their prediction (partition found, state row index in, memory
carved, loads issued, table cleared, held rows marked, top-k rows noted),
their claim, the publication, the destinations of their buffered rows
noted, the reads, the flat copy of those rows, the copy of the entries not
noted and the whole block's finish; each helper
also records how many rows it predicted, set against when its reads are
in, and how many list entries it noted before they were. A block that
resolves two batch rows in turn (past the SM count) also stamps when it
has written its staged rows and when it has copied both lists. The stamps go
to the `stats` tensor past its five counters (entry 5 + slot * 48 +
point), so the stamped build needs no other interface; a block's slot is
the batch row it is working on (its index, except for blocks that resolve
in turns: each turn stamps into its own row's slot), and the summary
reports first and second turns apart. It then runs bench_resolver.py's
scenario for BATCH requests at MISS_RATE (the grid's pool, trace and state;
BENCH_OPTIONS are its shape options), --launches steady steps launched
eagerly one at a time, and prints per point the time after the launch's
first stamp (microseconds; median and range over the owner blocks and over
the helper blocks, over all launches). With --sweep-regions N, the host
footprint of a model's N layers: before each stamped launch the last
step's rows are gathered from each of N - 1 other host caches of the
scenario's size, as the other layers' steps would read theirs. A copy of
the tree, not the tree, is stamped: the timed kernels are those of the tree
plus one store per phase and block, and 16 bytes of shared memory per
block where thread 0 keeps its slot (so shapes within 16 bytes of the
device's limit do not launch stamped). CUDA only; the build takes a minute or
two (--build-dir keeps it for the next point).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import resolver_phase_counts as phase_counts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KERNEL = Path("cpp/cuda/resolve_residency.cu")
EARLY_READS = Path("cpp/cuda/resolver_early_reads.cuh")
SINGLE_ROW = Path("cpp/cuda/resolver_single_row.cuh")
DEFERRED = Path("cpp/cuda/resolver_deferred_gather.cuh")
CONTEXT = Path("cpp/cuda/resolver_context.cuh")
POINTS_PER_BLOCK = 48
STAT_COUNTERS = 5
# Dynamic shared memory the stamped launch adds past the kernel's own, where
# thread 0 keeps the batch row its stamps go to: in shared memory, a stamp
# reads its slot without a global load, which would wait behind the block's
# host reads in flight and hold thread 0's warp back.
ROW_SLOT_BYTES = 16
LAUNCH_BYTES = "  const uint32_t shared_bytes = constants.miss_stage.total_bytes;"

# The stamp, defined in resolver_context.cuh, which the kernel, the
# single-row phases and the early reads all include.
STAMP_FUNCTIONS = f"""
// resolver_timeline.py: the batch row each block works on, its stamps'
// slot, kept by thread 0 (the only thread that stamps) in the last
// {ROW_SLOT_BYTES} bytes of the launch's dynamic shared memory, which the
// stamped launcher adds. Set at the kernel's entry and at each turn's start
// (after the barrier that ends the last turn).
__device__ __forceinline__ int32_t* timeline_row_slot() {{
  extern __shared__ __align__(16) unsigned char timeline_shared[];
  uint32_t bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return reinterpret_cast<int32_t*>(timeline_shared + bytes - {ROW_SLOT_BYTES});
}}
__device__ __forceinline__ void timeline_set_row(int32_t row) {{
  if (threadIdx.x == 0) *timeline_row_slot() = row;
}}
// A point's value, into stats past its counters (the slot of the block's row).
__device__ __forceinline__ void timeline_store(const ResolveResidencyParams& p, int point, int64_t value) {{
  if (p.stats == nullptr) return;
  p.stats[{STAT_COUNTERS} + static_cast<int64_t>(*timeline_row_slot()) * {POINTS_PER_BLOCK} + point] = value;
}}
// %globaltimer of a point, by the calling thread.
__device__ __forceinline__ void timeline_stamp_now(const ResolveResidencyParams& p, int point) {{
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  timeline_store(p, point, static_cast<int64_t>(now));
}}
__device__ __forceinline__ void timeline_stamp(const ResolveResidencyParams& p, int point) {{
  if (threadIdx.x == 0) timeline_stamp_now(p, point);
}}
// The time once `value` is in (thread 0): the timer read waits for its load.
__device__ __forceinline__ void timeline_stamp_after(const ResolveResidencyParams& p, int point, int value) {{
  if (threadIdx.x != 0) return;
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) : "r"(value));
  timeline_store(p, point, static_cast<int64_t>(now));
}}
// A count instead of a time (plus one, so that zero stays "not recorded").
__device__ __forceinline__ void timeline_value(const ResolveResidencyParams& p, int point, int64_t value) {{
  if (threadIdx.x == 0) timeline_store(p, point, value + 1);
}}
"""

# Helper points: (name, a line of resolver_early_reads.cuh after which to
# stamp, how): "thread 0" stamps when thread 0 gets there; "one lane" where
# only one lane runs the line; "after EXPR" when thread 0 also has the int
# EXPR (a stamp after a load otherwise times the load's issue, not its
# arrival); "block" after a barrier, when every thread of the block got
# there. Lines that are not found are left out with a warning: the helpers'
# path may change without the kernel's.
HELPER_POINTS = [
    ("helper: partition found", r"^\s*if \(part >= parts\) return;", "thread 0"),
    ("helper: state row index in", r"^\s*const uint64_t start = handoff::global_time_ns\(\);", "thread 0"),
    ("helper: memory carved", r"^\s*const HelperMemory m\(smem, ", "thread 0"),
    ("helper: loads issued", r"^\s*const bool row_of_b = ", "thread 0"),
    ("helper: table empty", r"^\s*__syncthreads\(\);\s*// the table is empty", "thread 0"),
    ("helper: own held rows marked", r"^\s*for \(int x = 0; x < kHeldLoads; \+\+x\) mark_held", "thread 0"),
    ("helper: all held rows marked", r"^\s*__syncthreads\(\);\s*// every held row is marked", "thread 0"),
    ("helper: own keys noted", r"^\s*for \(int x = 0; x < kTopkLoads; \+\+x\) note_predicted", "thread 0"),
    ("helper: predicted", r"^\s*predict_misses<kNote>\(p, c, m, b, s, part, parts\);", "thread 0"),
    ("helper: claimed (coordinator)", r"^\s*m\.words\[HelperMemory::kClaimed\] = claimed;", "one lane"),
    ("helper: list seen (coordinator)", r"^\s*m\.words\[HelperMemory::kCount\] = valid \? count : -1;", "one lane"),
    ("helper: destinations noted (coordinator)", r"^\s*note_destinations\(p, c, m, m\.words\[HelperMemory::kFirstRow\]",
     "one lane"),
    ("helper: reads in and list seen", r"^\s*__syncthreads\(\);\s*// the buffer's rows, the claim", "thread 0"),
    ("helper: copied", r"^\s*if \(m\.words\[HelperMemory::kNoted\] > 0\) copy_buffered_rows\(c, m\);",
     "thread 0"),
    ("helper: entries not noted copied", r"^\s*copy_partition_entries<true>\(p, c, m,", "thread 0"),
    ("helper: block finished", r"^\s*if \(threadIdx\.x == 0\) finish_parts\(record, 1u << part,", "block"),
]

# The single-row phases (one token row per request; they return from the
# kernel body before its general phases, so the kernel's stamps stop at
# phase A for such requests): (name, the line after which, how), stamped as
# HELPER_POINTS are.
SINGLE_ROW_POINTS = [
    ("single row: B2 union", r"^\s*build_row_union\(p, c, ws, request, entries\);", "thread 0"),
    ("single row: B3-B4 walk", r"^\s*const RowWalk walk = walk_positions<kUpkeep>\(p, c, ws, request, entries\);",
     "thread 0"),
    ("single row: B5 assigned", r"^\s*const int32_t assigned_total = assign_row_members<kUpkeep>\(", "thread 0"),
    ("single row: list published", r"^\s*gather\.note_assigned_total\(c, p, request, assigned_total\);",
     "thread 0"),
    ("single row: B6 outputs", r"^\s*write_row_outputs\(p, c, ws, request, entries, walk, assigned_total\);",
     "thread 0"),
    ("single row: G finished", r"^\s*gather\.finish_single_row\(c, ws\);", "thread 0"),
    ("single row: H done", r"^\s*gather\.help_as_owner\(p, c, ws\);", "thread 0"),
]

# Inside phase A (find_request in the kernel's file), stamped as
# HELPER_POINTS are: when thread 0 is past the prior grid's wait, and when
# the block is past B1 (the request's token rows found, its LRU row in).
# With the kernel body's "A: turn start" (after the barrier that ends the
# last turn) they split a turn's phase A into its waits. None of them waits
# for a load, so the stamped kernel issues its loads as the plain one does.
PHASE_A_POINTS = [
    ("A: prior grid waited", r"^\s*wait_for_prior_grid\(\);$", "thread 0"),
    ("A: B1", r"^\s*__syncthreads\(\);\s*// B1$", "thread 0"),
]

# A block resolving two batch rows in turn (DeferredGather): after both
# resolves, when warp 0 has waited for the staged rows and written its
# share of them, in the second row's slot. The kernel's last line, the copy
# of both lists, is stamped as "end copy_lists".
DEFERRED_POINTS = [
    ("turns: staged rows written", r"^\s*write_staged_rows_of_turns\(c, ws, destinations\);", "thread 0"),
]

# Counts a helper records (name, the line after which, its expression): its
# predicted rows, to set against when its reads are in.
VALUE_POINTS = [
    ("helper: predicted rows", r"^\s*predict_misses<kNote>\(p, c, m, b, s, part, parts\);",
     "m.words[HelperMemory::kPredicted]"),
    ("helper: entries noted before the rows were in", r"^\s*const int32_t from = m\.words\[HelperMemory::kLate\] > 0",
     "m.words[HelperMemory::kNoted]"),
]


@dataclass
class Stamped:
    sources: dict  # relative path -> stamped text
    points: list  # point index -> name
    owner_points: int  # points 0 .. owner_points - 1 are the kernel body's, the single-row phases' and the turns'
    values: tuple = ()  # points that hold a count (VALUE_POINTS), not a time


def kernel_phase_lines(text: str) -> list[tuple[int, str]]:
    """(line index, point name) for the lines of resolve_residency_kernel's
    body whose trailing comment names a phase (resolver_phase_counts.py's
    reading): the phase and the function the line calls (`D assign_misses`)."""
    lines = text.splitlines()
    found = []
    for index in phase_counts.kernel_body(lines):
        label = phase_counts.phase_label(lines[index])
        if label is None:
            continue
        calls = [name for name in re.findall(r"([A-Za-z_]\w*)\s*(?:<[^()]*>)?\s*\(", lines[index].partition("//")[0])
                 if name not in ("if", "for", "while", "return", "min", "max")]
        found.append((index, f"{label} {calls[0] if calls else ''}".strip()))
    return found


def helper_stamp(how: str, point: int) -> str:
    """The statement that stamps point `point` as HELPER_POINTS' (or SINGLE_ROW_POINTS') `how` says."""
    if how == "thread 0":
        return f"timeline_stamp(p, {point});"
    if how == "one lane":
        return f"timeline_stamp_now(p, {point});"
    if how == "block":
        return f"__syncthreads(); timeline_stamp(p, {point});"
    if how.startswith("after "):
        return f"timeline_stamp_after(p, {point}, {how[len('after '):]});"
    raise ValueError(f"helper point: unknown stamp kind {how!r}")


def stamp_sources(tree: Path) -> Stamped:
    """The stamped texts of `tree`'s kernel, single-row phases and early
    reads, and of the header that defines the stamps."""
    kernel = (tree / KERNEL).read_text()
    lines = kernel.splitlines()
    phase_lines = kernel_phase_lines(kernel)
    if len(phase_lines) < 8:
        raise SystemExit(f"{tree / KERNEL}: found {len(phase_lines)} phase lines in resolve_residency_kernel, "
                         "expected the phases A-H (`// X  | ...` comments)")
    body = phase_counts.kernel_body(lines)
    start = body.start
    entry = next(i for i in range(start, phase_lines[0][0]) if "extern __shared__" in lines[i])
    points = ["entry"]
    inserts = {entry: ["  timeline_set_row(static_cast<int32_t>(blockIdx.x) * Gather::kRequestsPerBlock);",
                       "  timeline_stamp(p, 0);"]}
    # A turn names its row after the barrier that ends the last turn: before
    # it, thread 0 may still be stamping the last turn's final points.
    turn_barriers = [i for i in body if re.match(r"\s*if \(turn > 0\) __syncthreads\(\);", lines[i])]
    ends = [i for i in body if re.match(r"\s*gather\.copy_lists\(", lines[i])]
    if len(turn_barriers) != 1 or len(ends) != 1:
        raise SystemExit(f"{tree / KERNEL}: expected one barrier that starts each later turn (`if (turn > 0) "
                         f"__syncthreads();`) and one `gather.copy_lists(` in resolve_residency_kernel, found "
                         f"{len(turn_barriers)} and {len(ends)}")
    launches = [i for i, line in enumerate(lines) if line == LAUNCH_BYTES]
    if len(launches) != 1:
        raise SystemExit(f"{tree / KERNEL}: expected one line `{LAUNCH_BYTES.strip()}` (the launch's dynamic "
                         f"shared memory, which the stamped build extends), found {len(launches)}")
    lines[launches[0]] = LAUNCH_BYTES[:-1] + f" + {ROW_SLOT_BYTES};  // resolver_timeline.py: the row slot"
    for index, name in phase_lines:
        indent = re.match(r"\s*", lines[index]).group(0)
        code = lines[index].split("//")[0].rstrip()
        if not code.endswith((";", "{")):
            raise SystemExit(f"{tree / KERNEL}:{index + 1}: a phase line must end its statement (';' or '{{') "
                             "for a stamp to follow it")
        if code.endswith("{"):
            indent += "  "
        inserts.setdefault(index, []).append(f"{indent}timeline_stamp(p, {len(points)});")
        points.append(name)
    indent = re.match(r"\s*", lines[turn_barriers[0]]).group(0)
    inserts.setdefault(turn_barriers[0], []).extend(
        [f"{indent}timeline_set_row(b);", f"{indent}timeline_stamp(p, {len(points)});"])
    points.append("A: turn start")
    find_request = next((i for i, line in enumerate(lines)
                         if re.match(r"__device__ __forceinline__ bool find_request\(", line)), None)
    if find_request is None:
        raise SystemExit(f"{tree / KERNEL}: find_request not found (phase A's points)")
    find_end = next(i for i in range(find_request, len(lines)) if lines[i] == "}")
    for name, pattern, how in PHASE_A_POINTS:
        matches = [i for i in range(find_request, find_end) if re.search(pattern, lines[i])]
        if len(matches) != 1:
            print(f"resolver_timeline: point '{name}' left out ({len(matches)} matching lines)", file=sys.stderr)
            continue
        indent = re.match(r"\s*", lines[matches[0]]).group(0)
        inserts.setdefault(matches[0], []).append(indent + helper_stamp(how, len(points)))
        points.append(name)
    indent = re.match(r"\s*", lines[ends[0]]).group(0)
    inserts.setdefault(ends[0], []).append(f"{indent}timeline_stamp(p, {len(points)});")
    points.append("end copy_lists")
    stamped_kernel = []
    for index, line in enumerate(lines):
        stamped_kernel.append(line)
        stamped_kernel.extend(inserts.get(index, []))

    context = (tree / CONTEXT).read_text()
    anchor = "namespace cuda {"
    if anchor not in context:
        raise SystemExit(f"{tree / CONTEXT}: '{anchor}' not found")
    context = context.replace(anchor, anchor + "\n" + STAMP_FUNCTIONS, 1)
    files = {relative: (tree / relative).read_text().splitlines() for relative in (SINGLE_ROW, DEFERRED, EARLY_READS)}

    def place(relative, name, pattern, statement):
        """Inserts statement(point) after the one line of `relative` matching
        `pattern`; a point whose line is not found once is left out with a
        warning."""
        lines_of = files[relative]
        matches = [i for i, line in enumerate(lines_of) if re.search(pattern, line)]
        if len(matches) != 1:
            print(f"resolver_timeline: point '{name}' left out ({len(matches)} matching lines)", file=sys.stderr)
            return False
        if len(points) >= POINTS_PER_BLOCK:
            raise SystemExit(f"more than {POINTS_PER_BLOCK} points")
        indent = re.match(r"\s*", lines_of[matches[0]]).group(0)
        lines_of.insert(matches[0] + 1, indent + statement(len(points)))
        points.append(name)
        return True

    for name, pattern, how in SINGLE_ROW_POINTS:
        place(SINGLE_ROW, name, pattern, lambda point: helper_stamp(how, point))
    for name, pattern, how in DEFERRED_POINTS:
        place(DEFERRED, name, pattern, lambda point: helper_stamp(how, point))
    owner_points = len(points)
    for name, pattern, how in HELPER_POINTS:
        place(EARLY_READS, name, pattern, lambda point: helper_stamp(how, point))
    values = []
    for name, pattern, expression in VALUE_POINTS:
        if place(EARLY_READS, name, pattern, lambda point: f"timeline_value(p, {point}, {expression});"):
            values.append(len(points) - 1)
    sources = {str(KERNEL): "\n".join(stamped_kernel) + "\n", str(CONTEXT): context}
    sources.update({str(relative): "\n".join(text) + "\n" for relative, text in files.items()})
    return Stamped(sources, points, owner_points, tuple(values))


def build(tree: Path, work: Path, stamped: Stamped) -> Path:
    """Copies `tree`'s sources to work/src, writes the stamped files and
    installs the package into work/site; returns the site directory."""
    source = work / "src"
    ignore = shutil.ignore_patterns(".git", "build*", "_skbuild", "*.egg-info", "__pycache__", ".dev")
    shutil.copytree(tree, source, ignore=ignore)
    for relative, text in stamped.sources.items():
        (source / relative).write_text(text)
    site = work / "site"
    command = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q", "--target",
               str(site), "-C", "cmake.define.CMAKE_CUDA_ARCHITECTURES=" + os.environ.get("CUDA_ARCHS", "90"),
               "-C", f"build-dir={work / 'build'}", str(source)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"building the stamped copy failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return site


def stamped_site(tree: Path, work: Path, stamped: Stamped) -> Path:
    """The site directory of a stamped build of `tree` in `work`: the one
    already there when it was built from the same stamped sources (its
    stamped files match), else a new build (`work` must then be empty or
    absent)."""
    site, source = work / "site", work / "src"
    if site.is_dir() and all((source / relative).is_file() and (source / relative).read_text() == text
                             for relative, text in stamped.sources.items()):
        return site
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"{work}: holds no stamped build of these sources; give an empty or new directory")
    work.mkdir(parents=True, exist_ok=True)
    return build(tree, work, stamped)


def summarise(launches: list[list[list[int]]], batch: int, stamped: Stamped) -> dict:
    """Per point, over the owner slots (batch rows) and the helper blocks
    (past the batch's extra row): median, min and max microseconds after
    each launch's first stamp, and how many slots passed it. A launch whose
    blocks resolved in turns (a batch row stamped without an entry of its
    own: the entry is stamped in the block's first row) also has its first
    and second turns (even and odd batch rows) reported apart."""
    timed = [point for point in range(len(stamped.points)) if point not in stamped.values]

    def times_of(stamps):
        return [block[point] for block in stamps for point in timed if point < len(block) and block[point] > 0]

    if not all(times_of(stamps) for stamps in launches):
        raise SystemExit("a launch left no stamps: is the build the stamped copy, and did the resolve get stats?")
    firsts = [min(times_of(stamps)) for stamps in launches]
    roles = {"owners": lambda block: block < batch, "helpers": lambda block: block > batch}
    turns = any(stamps[b][0] == 0 and any(stamps[b][1:stamped.owner_points])
                for stamps in launches for b in range(min(batch, len(stamps))))
    if turns:
        roles["first turns"] = lambda block: block < batch and block % 2 == 0
        roles["second turns"] = lambda block: block < batch and block % 2 == 1
    report = {"turns": turns}
    for role, member in roles.items():
        per_point = []
        for point, name in enumerate(stamped.points):
            found = []
            for stamps, first in zip(launches, firsts):
                found += [block[point] - 1 if point in stamped.values else (block[point] - first) / 1e3
                          for b, block in enumerate(stamps) if member(b) and block[point] > 0]
            if not found:
                continue
            unit = "" if point in stamped.values else "_us"
            per_point.append({"point": name, "blocks": len(found), "median" + unit: statistics.median(found),
                              "min" + unit: min(found), "max" + unit: max(found)})
        report[role] = per_point
    report["last_stamp_us"] = statistics.median(
        (max(times_of(stamps)) - first) / 1e3 for stamps, first in zip(launches, firsts))
    relation = rows_against_reads(launches, firsts, batch, stamped)
    if relation is not None:
        report["helper_rows_against_reads"] = relation
    return report


def rows_against_reads(launches, firsts, batch: int, stamped: Stamped):
    """How the helpers' predicted rows go with when their reads are in
    (both recorded): the Pearson correlation over every helper of every
    launch, and the median time of the helpers with more rows than the
    median against the others'. None without both points."""
    names = stamped.points
    if "helper: predicted rows" not in names or "helper: reads in and list seen" not in names:
        return None
    rows_at, reads_at = names.index("helper: predicted rows"), names.index("helper: reads in and list seen")
    pairs = [(block[rows_at] - 1, (block[reads_at] - first) / 1e3) for stamps, first in zip(launches, firsts)
             for b, block in enumerate(stamps) if b > batch and block[rows_at] > 0 and block[reads_at] > 0]
    if len(pairs) < 2:
        return None
    rows = [r for r, _ in pairs]
    middle = statistics.median(rows)
    more = [t for r, t in pairs if r > middle]
    rest = [t for r, t in pairs if r <= middle]
    spread = statistics.pstdev(rows) * statistics.pstdev([t for _, t in pairs])
    mean_rows, mean_time = statistics.fmean(rows), statistics.fmean(t for _, t in pairs)
    covariance = statistics.fmean((r - mean_rows) * (t - mean_time) for r, t in pairs)
    return {"helpers": len(pairs), "correlation": covariance / spread if spread > 0 else 0.0,
            "median_rows": middle,
            "reads_in_us_more_rows": statistics.median(more) if more else None,
            "reads_in_us_other_rows": statistics.median(rest) if rest else None}


def measure(args, bench_options) -> dict:
    """Runs in the stamped build's interpreter (PYTHONPATH=site)."""
    sys.path.insert(0, str(Path(args.tree) / "bench"))
    import bench_resolver as br
    import torch

    import hisparse

    hint = ["--residency-hint", args.residency_hint] if args.residency_hint else []
    options = br.parse_args([*bench_options, *hint])
    pool, host, hot = br.make_caches(options, args.batch, "cuda")  # pool backs host
    scenario = br.Scenario(options, args.batch, args.miss_rate, host, hot)
    sweep_pool, regions = None, []
    if args.sweep_regions > 1:
        sweep_pool = hisparse.HostPool((args.sweep_regions - 1) * host.numel(), register="always")
        regions = [sweep_pool.view("uint8", tuple(host.shape), offset=r * host.numel())
                   for r in range(args.sweep_regions - 1)]
    blocks = torch.cuda.get_device_properties(0).multi_processor_count + args.batch + 1
    stats = torch.zeros(STAT_COUNTERS + blocks * POINTS_PER_BLOCK, dtype=torch.int64, device="cuda")
    launches = []
    for step in range(2 + args.launches):
        if step >= 2:
            sweep(regions, scenario, options.block_size)
        # Nothing runs when the launch starts: its entry stamps (before its
        # grid dependency wait) cannot race with the zeroing.
        stats.zero_()
        torch.cuda.synchronize()
        scenario.resolve(step, schedule=None if step < 2 else args.schedule, stats=stats)
        torch.cuda.synchronize()
        if step >= 2:
            launches.append(stats[STAT_COUNTERS:].view(blocks, POINTS_PER_BLOCK).cpu().tolist())
    del regions, sweep_pool, pool
    return {"launches": launches, "swap_rows_last_launch": int(scenario.swap_counts.sum())}


def sweep(regions, scenario, block_size: int) -> None:
    """What the other layers of a model do between two launches of one
    layer's resolver, as far as host memory goes: each region, a host cache
    of the scenario's size, has the last step's swap list gathered from it
    (the same rows, into the scenario's hot cache, whose bytes the resolver
    never reads). The host pages the launch then reads were last read
    len(regions) layers ago."""
    import hisparse

    swap_lists = (scenario.out["swap_host"], scenario.out["swap_device"], scenario.swap_counts)
    for region in regions:
        hisparse.ops.gather_compact(region, scenario.hot_cache, *swap_lists, hot_block_size=block_size)


def parse(argv):
    point, bench_options = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batch", type=int)
    parser.add_argument("miss_rate", type=float)
    parser.add_argument("--schedule", default="auto", help='bench_resolver.py\'s schedule ("auto", "fused", '
                        '"auto-tail"; "none": the resolve alone)')
    parser.add_argument("--launches", type=int, default=4, help="steady launches to stamp")
    parser.add_argument("--sweep-regions", type=int, default=1,
                        help="host caches of the scenario's size that a model's layers would read: before each "
                             "stamped launch the other N - 1 have the last step's rows gathered from them "
                             "(1: none)")
    parser.add_argument("--residency-hint", choices=("auto", "on", "off"),
                        help="bench_resolver.py's --residency-hint (default: that tree's default)")
    parser.add_argument("--tree", default=str(ROOT), help="the source tree to stamp (default: this checkout)")
    parser.add_argument("--out", default=None, help="write the stamps and the summary as JSON here")
    parser.add_argument("--build-dir", default=None, help="build the stamped copy here and keep it, or reuse the "
                        "one an earlier run built here from the same stamped sources")
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(point)
    if args.sweep_regions < 1:
        parser.error(f"--sweep-regions: expected at least 1, got {args.sweep_regions}")
    if args.launches < 1:
        parser.error(f"--launches: expected at least 1, got {args.launches}")
    args.schedule = None if args.schedule == "none" else args.schedule
    return args, bench_options


def main(argv):
    args, bench_options = parse(argv)
    tree = Path(args.tree).resolve()
    stamped = stamp_sources(tree)
    if args.measure_only:
        print(json.dumps(measure(args, bench_options)))
        return
    with tempfile.TemporaryDirectory(prefix="hs-timeline-") as temporary:
        site = stamped_site(tree, Path(args.build_dir) if args.build_dir else Path(temporary), stamped)
        env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        cut = argv.index("--") if "--" in argv else len(argv)
        run = subprocess.run([sys.executable, __file__, *argv[:cut], "--measure-only", *argv[cut:]], env=env,
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"the stamped run failed:\n{run.stderr[-3000:]}")
        result = json.loads(run.stdout.strip().splitlines()[-1])
    report = summarise(result["launches"], args.batch, stamped)
    print(f"batch {args.batch}, miss rate {args.miss_rate}, schedule {args.schedule or 'resolve alone'}, "
          f"hint {args.residency_hint or 'default'}, {args.sweep_regions} host region(s): "
          f"{result['swap_rows_last_launch']} swap rows in the last launch; last stamp "
          f"{report['last_stamp_us']:.1f} us after the first")
    roles = ("owners", "first turns", "second turns", "helpers") if report["turns"] else ("owners", "helpers")
    for role in roles:
        for row in report[role]:
            if "median_us" in row:
                print(f"  {role:12s} {row['point']:34s} {row['median_us']:8.2f} us  "
                      f"({row['min_us']:.2f} - {row['max_us']:.2f}, {row['blocks']} blocks)")
            else:
                print(f"  {role:12s} {row['point']:34s} {row['median']:8.1f}     "
                      f"({row['min']} - {row['max']}, {row['blocks']} blocks)")
    relation = report.get("helper_rows_against_reads")
    if relation is not None:
        more, other = relation["reads_in_us_more_rows"], relation["reads_in_us_other_rows"]
        print(f"  helpers' predicted rows against their reads: correlation {relation['correlation']:.2f}; "
              f"reads in at {more if more is None else round(more, 2)} us (median) with more than "
              f"{relation['median_rows']:g} rows, {other if other is None else round(other, 2)} us with the others")
    if args.out:
        Path(args.out).write_text(json.dumps({"command": "python3 bench/resolver_timeline.py " + " ".join(argv),
                                              "points": stamped.points, "summary": report, **result}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
