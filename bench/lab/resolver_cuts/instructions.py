"""Where the resolver's instructions go: Nsight Compute's per-instruction
counts (the SASS source page as CSV, see profile_steps.py) attributed to the
source lines of an `nvdisasm -g -c` listing of the same build.

The listing can be made on a machine without a GPU: compile the kernel with
the library's flags, e.g.

    nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo --expt-relaxed-constexpr \\
        -Icpp/include -Icpp/src -Icpp/cuda -cubin cpp/cuda/resolve_residency.cu -o rr.cubin
    nvdisasm -g -c rr.cubin > rr.sass

(nvdisasm comes with the CUDA toolkit or the nvidia-cuda-nvdisasm wheel).
The script checks that both list the same opcodes in the same order.

    python instructions.py --csv prof_sass.csv --sass rr.sass regions
    python instructions.py --csv prof_sass.csv --sass rr.sass lines --top 40
    python instructions.py --csv prof_sass.csv --sass rr.sass lines --region 1

Counts are warp instructions executed per warp of the block (the CSV holds
sums over all blocks of the launch; --blocks is their number, batch + 1).
Regions are the stretches between consecutive BAR.SYNC instructions in
address order (B1, B2a, ... in the kernel's comments). Lines of other files
(CUDA headers: shuffles, atomics) are shown as file:line."""
import argparse
import bisect
import collections
import csv
import re


def read_ncu(path, kernel):
    """Rows (opcode text, executed, stall samples, stall reasons) of result `kernel`."""
    results, header, current = [], None, None
    for row in csv.reader(open(path)):
        if row and row[0] == "Kernel Name":
            current = []
            results.append(current)
        elif row and row[0] == "Address":
            header = {name: i for i, name in enumerate(row)}
        elif current is not None and row and row[0].startswith("0x"):
            current.append(row)
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for row in results[kernel]:
        stalls = {h[6:]: int(row[header[h]]) for h in reasons if row[header[h]].isdigit()}
        out.append((row[header["Source"]].strip(), int(row[header["Instructions Executed"]]),
                    int(row[header["Warp Stall Sampling (All Samples)"]]), stalls))
    return out


def read_sass(path):
    """(file, line, instruction text) per instruction of an nvdisasm -g -c listing."""
    where, out = (None, 0), []
    for text in open(path):
        found = re.search(r'File "([^"]+)", line (\d+)', text)
        if text.strip().startswith("//## File") and found:
            where = (found.group(1).rsplit("/", 1)[-1], int(found.group(2)))
            continue
        found = re.match(r"\s+/\*[0-9a-f]+\*/\s+(.*?);", text)
        if found:
            out.append((where[0], where[1], found.group(1).strip()))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", required=True)
    parser.add_argument("--sass", required=True)
    parser.add_argument("--kernel", type=int, default=1, help="result index in the CSV (profile_steps.py: 1 alone, 3 fused)")
    parser.add_argument("--blocks", type=int, default=101)
    parser.add_argument("--source", default="cpp/cuda/resolve_residency.cu",
                        help="the kernel's source as compiled (for the line texts)")
    parser.add_argument("--file", default="resolve_residency.cu", help="the kernel's file name in the listing")
    parser.add_argument("what", choices=("regions", "lines"))
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--region", type=int, default=None)
    args = parser.parse_args()

    counts, sass = read_ncu(args.csv, args.kernel), read_sass(args.sass)
    if len(counts) != len(sass) or any(c[0].split()[0] != s[2].split()[0] for c, s in zip(counts, sass)):
        raise SystemExit("the listing is not the profiled build (instruction counts or opcodes differ)")
    warps = args.blocks * 32
    barriers = [i for i, (_, _, text) in enumerate(sass) if text.startswith("BAR.SYNC")]
    region_of = [bisect.bisect_left(barriers, i) for i in range(len(sass))]
    source = open(args.source).read().split("\n")
    kernel_file = args.file

    if args.what == "regions":
        total = sum(c[1] for c in counts)
        samples = sum(c[2] for c in counts) or 1
        print(f"{total / args.blocks:.0f} warp instructions per block, {total / warps:.0f} per warp")
        for region in range(len(barriers) + 1):
            members = [c for c, r in zip(counts, region_of) if r == region]
            executed = sum(c[1] for c in members)
            if not executed:
                continue
            reasons = collections.Counter()
            for c in members:
                reasons.update(c[3])
            top = ", ".join(f"{k} {v}" for k, v in reasons.most_common(3))
            print(f"region {region:2d}: {executed / warps:6.1f} per warp, "
                  f"{100 * sum(c[2] for c in members) / samples:5.1f}% of stall samples ({top})")
        return

    per_line, stalled = collections.Counter(), collections.Counter()
    for c, (file, line, _), region in zip(counts, sass, region_of):
        if args.region is None or region == args.region:
            per_line[(file, line)] += c[1]
            stalled[(file, line)] += c[2]
    for (file, line), executed in per_line.most_common(args.top):
        text = source[line - 1].strip() if file == kernel_file and 0 < line <= len(source) else ""
        print(f"{file if file != kernel_file else '':>22}:{line:<5d} {executed / warps:6.1f} per warp, "
              f"{stalled[(file, line)]:4d} samples  {text[:80]}")


if __name__ == "__main__":
    main()
