#!/usr/bin/env python3
"""Whether two trees compile to the same kernels, without a GPU.

    python3 scripts/compare_kernels.py OLD NEW [FILE.cu ...] [--rename-new PATTERN=>REPLACEMENT]

OLD and NEW are directories or git revisions (``.`` is the working tree).
Each CUDA source (default: every ``cpp/cuda/*.cu`` both trees have) is
compiled to an sm_90 cubin with the flags ``CMakeLists.txt`` gives the
library's CUDA objects, and each kernel's machine code (its ``.text.``
section) is compared byte for byte. A refactor that claims to leave the
kernels alone can prove it here; a change meant to touch only some
instantiations shows which ones it touched. Kernels are matched by mangled
name, with the anonymous namespace's per-file hash taken out;
``--rename-new`` rewrites NEW's names first (a regular expression), for
example to match a template argument added with its old value as default.

Kernels whose code differs only in constant-bank offsets (a kernel
parameter struct that grew) are reported as such: same instructions,
parameters moved. Exit status: 0 when every kernel both trees have is
byte-identical, 1 otherwise, 2 on a compile error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# CMakeLists.txt: hisparse_objects' definitions and CUDA options, Release.
NVCC_FLAGS = [
    "-DHISPARSE_BUILDING",
    "-DHISPARSE_WITH_CUDA=1",
    "-O3",
    "-DNDEBUG",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-lineinfo",
    "-arch=sm_90",
    "-cubin",
]
SASS_INSTRUCTION_BYTES = 16


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Name -> contents of every section of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    sections = {}
    for name_index, kind, _flags, _addr, offset, size, *_ in headers:
        end = data.index(b"\0", names_offset + name_index)
        name = data[names_offset + name_index : end].decode()
        sections[name] = b"\0" * size if kind == 8 else data[offset : offset + size]  # 8: SHT_NOBITS
    return sections


def kernels(cubin: bytes, renames: list[tuple[str, str]]) -> dict[str, bytes]:
    """Kernel name (anonymous-namespace hash removed, renames applied) -> machine code."""
    out = {}
    for name, code in elf_sections(cubin).items():
        if not name.startswith(".text."):
            continue
        name = re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__", name[len(".text.") :])
        for pattern, replacement in renames:
            name = re.sub(pattern, replacement, name)
        out[name] = code
    return out


def differing_instructions(old: bytes, new: bytes) -> int:
    n = SASS_INSTRUCTION_BYTES
    return sum(old[i : i + n] != new[i : i + n] for i in range(0, max(len(old), len(new)), n))


def only_offsets_moved(old: bytes, new: bytes) -> bool:
    """Same length, and every differing instruction differs only in bytes 4-7, where
    an sm_90 instruction that reads the constant bank holds the offset."""
    if len(old) != len(new):
        return False
    n = SASS_INSTRUCTION_BYTES
    for i in range(0, len(old), n):
        a, b = old[i : i + n], new[i : i + n]
        if a != b and (a[:4] != b[:4] or a[8:] != b[8:]):
            return False
    return True


def materialize(tree: str, scratch: Path) -> Path:
    """A directory holding the tree: itself, or a git revision exported into scratch."""
    path = Path(tree)
    if path.is_dir():
        return path.resolve()
    target = scratch / re.sub(r"[^A-Za-z0-9_.-]", "_", tree)
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", tree], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def compile_cubin(tree: Path, source: str, out: Path) -> bytes:
    command = [
        os.environ.get("NVCC", "nvcc"),
        *NVCC_FLAGS,
        f"-I{tree / 'cpp' / 'include'}",
        f"-I{tree / 'cpp'}",
        "-x",
        "cu",
        str(tree / source),
        "-o",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {tree / source}:\n{done.stderr[-4000:]}")
    return out.read_bytes()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="directory or git revision")
    parser.add_argument("new", help="directory or git revision ('.': the working tree)")
    parser.add_argument("sources", nargs="*", help="CUDA sources relative to the tree (default: cpp/cuda/*.cu)")
    parser.add_argument("--rename-new", action="append", default=[], metavar="PATTERN=>REPLACEMENT")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--verbose", action="store_true", help="list the identical kernels too")
    args = parser.parse_args(argv)
    renames = []
    for rule in args.rename_new:
        if "=>" not in rule:
            parser.error(f"--rename-new: expected PATTERN=>REPLACEMENT, got {rule!r}")
        renames.append(tuple(rule.split("=>", 1)))

    with tempfile.TemporaryDirectory(prefix="hisparse-kernels-") as scratch_dir:
        scratch = Path(scratch_dir)
        old, new = materialize(args.old, scratch / "old"), materialize(args.new, scratch / "new")
        sources = args.sources or sorted(
            str(p.relative_to(new)) for p in (new / "cpp" / "cuda").glob("*.cu") if (old / p.relative_to(new)).exists()
        )
        jobs = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for i, source in enumerate(sources):
                for side, tree in (("old", old), ("new", new)):
                    jobs[side, source] = pool.submit(compile_cubin, tree, source, scratch / f"{side}-{i}.cubin")
            try:
                cubins = {key: job.result() for key, job in jobs.items()}
            except RuntimeError as error:
                print(error, file=sys.stderr)
                return 2

    identical = changed = 0
    for source in sources:
        before, after = kernels(cubins["old", source], []), kernels(cubins["new", source], renames)
        for name in sorted(set(before) | set(after)):
            if name not in after:
                print(f"{source}: only in old: {name}")
            elif name not in before:
                print(f"{source}: only in new: {name}")
            elif before[name] == after[name]:
                identical += 1
                if args.verbose:
                    print(f"{source}: identical: {name}")
            else:
                changed += 1
                what = (
                    "same instructions, constant-bank offsets moved"
                    if only_offsets_moved(before[name], after[name])
                    else f"instructions differing: {differing_instructions(before[name], after[name])}"
                )
                print(f"{source}: changed ({what}; {len(before[name])} -> {len(after[name])} bytes): {name}")
    print(f"{identical} kernels identical, {changed} changed, over {len(sources)} sources")
    return 0 if changed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
