"""Warp instructions of one resolver launch per phase, from an ncu profile.

    ncu --section SourceCounters --import-source yes -k regex:resolve_residency_kernel \\
        --launch-skip 2 --launch-count 1 -o point python3 bench/profile_resolver_point.py 1 0.001
    ncu -i point.ncu-rep --page source --csv --print-source sass > point.csv
    cuobjdump -xelf all <the built _C or libhisparse shared object>   # resolve_residency.sm_90.cubin
    python3 bench/resolver_phase_counts.py point.csv resolve_residency.sm_90.cubin --requests 1 [--lines 10]

Build with line info (-C cmake.define.CMAKE_CUDA_FLAGS=-lineinfo) so that
the cubin maps each SASS instruction to the source lines it was inlined
from. Each instruction is charged to the line of resolve_residency_kernel
that it is inlined into, and each line to the phase its trailing comment
names (`// B  | B2a ...` in this checkout's cpp/cuda/resolve_residency.cu,
which must be the profiled build's); a line without one is named by the
function it calls (the gather's hooks between phases, the workspace's
set-up). nvdisasm comes with the CUDA toolkit (or the nvidia-cuda-nvdisasm
wheel); --nvdisasm names another. --lines N adds, per phase, the N source
lines (innermost in their inlining chain: a helper's line, not the phase's
call) that executed the most.
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import re
import subprocess
from pathlib import Path

KERNEL_SOURCE = Path(__file__).resolve().parent.parent / "cpp" / "cuda" / "resolve_residency.cu"


def kernel_body(lines: list[str]) -> range:
    """The line indices of resolve_residency_kernel's definition, from its
    name to its closing brace."""
    start = next(i for i, line in enumerate(lines) if re.match(r"\s+resolve_residency_kernel\(", line))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    return range(start, end + 1)


def phase_label(line: str) -> str | None:
    """The phase a kernel-body line's trailing comment names (`// B  | B2
    ...` -> "B", `// E` -> "E"), or None."""
    label = re.match(r"\s*([A-H][0-9]?)\s*(?:\||$)", line.partition("//")[2])
    return label.group(1) if label else None


def kernel_phases(source: Path) -> dict[int, str]:
    """Line number -> phase for the body of resolve_residency_kernel: a line
    whose trailing comment starts with a phase letter (`// B  | B2 ...`,
    `// E`) is that phase; any other line is named by the last function it
    calls (the gather's hooks between phases, the workspace's set-up)."""
    lines = source.read_text().splitlines()
    phases = {}
    for index in kernel_body(lines):
        code = lines[index].partition("//")[0]
        label = phase_label(lines[index])
        calls = [name for name in re.findall(r"(\w+)\s*\(", code) if name not in ("if", "for", "while", "return")]
        phases[index + 1] = label if label else (calls[-1] if calls else "setup")
    return phases


# Where an instruction comes from: the kernel line it is inlined into and its
# innermost "file:line"; either may be None.
Location = tuple[int | None, str | None]


def sass_lines(cubin: Path, nvdisasm: str) -> dict[str, dict[int, Location]]:
    """Per function: instruction offset -> where it comes from (parse_listing)."""
    try:
        text = subprocess.run([nvdisasm, "-c", "-gi", str(cubin)], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise SystemExit(f"--nvdisasm: {nvdisasm} was not found (the CUDA toolkit's, or the "
                         "nvidia-cuda-nvdisasm wheel's)") from None
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"{cubin}: nvdisasm could not read it: {error.stderr.strip()[:200]}") from None
    return parse_listing(text)


def parse_listing(text: str) -> dict[str, dict[int, Location]]:
    """nvdisasm -c -gi output -> per function, per instruction offset: the
    line of resolve_residency.cu's kernel body it is inlined into, and the
    innermost source line it was compiled from (the first marker of its
    inlining chain). An instruction without markers belongs to the line
    before it: (None, None)."""
    functions: dict[str, dict[int, Location]] = {}
    current = None
    pending: list[tuple[str, int, str]] = []
    for line in text.splitlines():
        match = re.match(r"^\.text\.(\S+):", line)
        if match:
            current, pending = match.group(1), []
            functions[current] = {}
            continue
        match = re.match(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?', line)
        if match:
            pending.append((Path(match.group(1)).name, int(match.group(2)), match.group(3) or ""))
            continue
        match = re.match(r"\s*/\*([0-9a-f]{4,})\*/", line)
        if match and current is not None:
            outer = [number for name, number, inlined in pending if not inlined and name == KERNEL_SOURCE.name]
            inner = f"{pending[0][0]}:{pending[0][1]}" if pending else None
            functions[current][int(match.group(1), 16)] = (outer[-1] if pending and outer else None, inner)
            pending = []
    return functions


def source_text(location: str) -> str:
    """The source of a "file:line" of the CUDA tree, or "" for other files."""
    name, _, number = location.rpartition(":")
    path = KERNEL_SOURCE.parent / name
    if not path.is_file():
        return ""
    lines = path.read_text().splitlines()
    return lines[int(number) - 1].strip() if 0 < int(number) <= len(lines) else ""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sass_csv", type=Path, help="ncu --page source --csv --print-source sass")
    parser.add_argument("cubin", type=Path, help="resolve_residency's cubin of the profiled build")
    parser.add_argument("--requests", type=int, default=1, help="divide the counts by this many requests")
    parser.add_argument("--nvdisasm", default="nvdisasm")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--lines", type=int, default=0, metavar="N",
                        help="also the N source lines of each phase that executed the most (innermost lines "
                             "of the inlining chain)")
    args = parser.parse_args(argv)

    rows = list(csv.reader(args.sass_csv.open()))
    if len(rows) < 3 or len(rows[0]) < 2 or "Instructions Executed" not in rows[1]:
        raise SystemExit(f"{args.sass_csv}: expected ncu's source page as CSV "
                         "(--page source --csv --print-source sass)")
    kernel_name = rows[0][1]
    header, data = rows[1], rows[2:]
    executed = header.index("Instructions Executed")
    policy = re.search(r"resolve_residency_kernel<(.*)>\(", kernel_name)
    if policy is None:
        raise SystemExit(f"{args.sass_csv}: not a resolve_residency_kernel profile ({kernel_name[:120]})")
    functions = sass_lines(args.cubin, args.nvdisasm)
    matches = [name for name in functions if instantiation_of(name) == instantiation_of(policy.group(1))]
    if len(matches) != 1:
        raise SystemExit(f"{args.cubin}: expected one function for {policy.group(1)}, found {len(matches)}")
    offsets = functions[matches[0]]
    if not any(line is not None for line in offsets.values()):
        raise SystemExit(f"{args.cubin}: no line info for {KERNEL_SOURCE.name} (build with -lineinfo)")
    phases = kernel_phases(KERNEL_SOURCE)

    counts: collections.Counter[str] = collections.Counter()
    by_line: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    base = int(data[0][0], 16)
    line, inner = None, None
    for row in data:
        mapped, mapped_inner = offsets.get(int(row[0], 16) - base, (None, None))
        line = mapped if mapped is not None else line
        inner = mapped_inner if mapped_inner is not None else inner
        phase = phases.get(line, "setup")
        counts[phase] += int(row[executed] or 0)
        by_line[phase][inner or "?"] += int(row[executed] or 0)
    total = sum(counts.values())
    per_request = {phase: round(count / args.requests) for phase, count in counts.most_common()}
    top_lines = {phase: [{"line": where, "per_request": round(count / args.requests), "source": source_text(where)}
                         for where, count in by_line[phase].most_common(args.lines)]
                 for phase in per_request} if args.lines > 0 else {}
    if args.json:
        result = {"kernel": kernel_name, "warp_instructions": total, "requests": args.requests,
                  "by_phase_per_request": per_request}
        if top_lines:
            result["top_lines_per_request"] = top_lines
        print(json.dumps(result, indent=1))
        return
    print(f"{kernel_name}\n{total} warp instructions, {round(total / args.requests)} per request")
    for phase, count in per_request.items():
        print(f"  {phase:6s} {count:9d}  {100 * count * args.requests / total:5.1f}%")
        for entry in top_lines.get(phase, []):
            print(f"         {entry['per_request']:9d}  {entry['line']:28s} {entry['source'][:80]}")


def instantiation_of(name: str) -> tuple:
    """The policies and value arguments (the handoff's early-read flags, the
    hint upkeep) of a resolve_residency_kernel, in order,
    from ncu's spelling of its template arguments ("(bool)1", "(int)2",
    "(...HintUpkeep)0") or from its mangled name ("Lb1E", "Li2E",
    "LNS1_10HintUpkeepE0E")."""
    policy_names = r"(NoGather|AutoGather|HandoffGather|FusedGather|SharedPlacement|SplitPlacement)"
    policies = tuple(re.findall(policy_names, name))
    value_argument = r"\((?:bool|int|[\w:<> ]*HintUpkeep)\)(\d+)|L(?:b|i|NS\d*_\d+HintUpkeepE)(\d+)E"
    values = tuple(match.group(1) or match.group(2) for match in re.finditer(value_argument, name))
    return policies, values


if __name__ == "__main__":
    main()
