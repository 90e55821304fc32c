"""scripts/compare_kernels.py: kernels matched by name and compared byte for byte, on
hand-built ELF files and, end to end, with a stand-in nvcc that writes them."""

from __future__ import annotations

import os
import shutil
import struct
import sys
from pathlib import Path

import pytest
from bench_scripts import load_bench_script

ck = load_bench_script("compare_kernels", folder="scripts")


def make_elf(sections: dict[str, bytes], nobits: dict[str, int] | None = None) -> bytes:
    """A minimal ELF64 little-endian file: a null section, the given ones, .shstrtab last."""
    nobits = nobits or {}
    names = [""] + list(sections) + list(nobits) + [".shstrtab"]
    strtab = b""
    name_offsets = []
    for name in names:
        name_offsets.append(len(strtab))
        strtab += name.encode() + b"\0"
    body = b""
    placed = []  # (kind, offset, size)
    header_bytes = 64
    for name in names[1:]:
        if name in nobits:
            placed.append((8, 0, nobits[name]))
            continue
        data = strtab if name == ".shstrtab" else sections[name]
        placed.append((1 if name != ".shstrtab" else 3, header_bytes + len(body), len(data)))
        body += data
    shoff = header_bytes + len(body)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(names), len(names) - 1)
    table = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    for name_offset, (kind, offset, size) in zip(name_offsets[1:], placed):
        table += struct.pack("<IIQQQQIIQQ", name_offset, kind, 0, 0, offset, size, 0, 0, 1, 0)
    return header + body + table


def instructions(*words: bytes) -> bytes:
    assert all(len(w) == 16 for w in words)
    return b"".join(words)


A = bytes(range(16))
B = bytes(range(16, 32))
A_OFFSET_MOVED = A[:5] + bytes([A[5] + 2]) + A[6:]  # an instruction's constant-bank offset, bytes 4-7
A_OPCODE_CHANGED = bytes([A[0] ^ 1]) + A[1:]


def test_sections_are_read_by_name_with_nobits_as_zeros():
    elf = make_elf({".text.k": A, ".nv.info": b"xy"}, nobits={".nv.shared.k": 5})
    sections = ck.elf_sections(elf)
    assert sections[".text.k"] == A
    assert sections[".nv.info"] == b"xy"
    assert sections[".nv.shared.k"] == b"\0" * 5


def test_a_file_that_is_not_elf64_is_refused():
    with pytest.raises(ValueError, match="64-bit little-endian ELF"):
        ck.elf_sections(b"\x7fELF\x01\x01" + b"\0" * 64)


def test_kernels_drop_the_anonymous_namespace_hash_and_apply_renames():
    elf = make_elf({
        ".text._ZN8hisparse4cuda53_GLOBAL__N__b0ec6868_20_file_cu_cb1658af6kernelILb1EEEvv": A,
        ".nv.constant0.x": B,
    })
    assert ck.kernels(elf, []) == {"_ZN8hisparse4cuda53_GLOBAL__N__20_file_cu_cb1658af6kernelILb1EEEvv": A}
    renamed = ck.kernels(elf, [(r"kernelILb(.)EEE", r"kernelILb\1ELb1EEE")])
    assert list(renamed) == ["_ZN8hisparse4cuda53_GLOBAL__N__20_file_cu_cb1658af6kernelILb1ELb1EEEvv"]


def test_moved_constant_offsets_are_told_apart_from_other_changes():
    old = instructions(A, B)
    assert ck.only_offsets_moved(old, instructions(A_OFFSET_MOVED, B))
    assert ck.differing_instructions(old, instructions(A_OFFSET_MOVED, B)) == 1
    assert not ck.only_offsets_moved(old, instructions(A_OPCODE_CHANGED, B))
    assert not ck.only_offsets_moved(old, instructions(A, B, B))
    assert ck.differing_instructions(old, instructions(A, B, B)) == 1


FAKE_NVCC = """
import sys
import zlib
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_compare_kernels import make_elf
args = sys.argv[1:]
source = Path(args[args.index("-x") + 2]).read_text()
out = Path(args[args.index("-o") + 1])
if "syntax error" in source:
    sys.exit("error: syntax error")
# Each line "name: hex" of the source is one kernel with that machine code, in an
# anonymous namespace whose hash differs from file to file, as nvcc's does.
tag = format(zlib.crc32(out.name.encode()), "x")
kernels = {{}}
for line in source.splitlines():
    name, code = line.split(": ")
    kernels[".text._ZN8hisparse4cuda53_GLOBAL__N__" + tag + "_" + name] = bytes.fromhex(code)
out.write_bytes(make_elf(kernels))
"""


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    script = tmp_path / "nvcc.py"
    script.write_text(FAKE_NVCC.format(tests=str(Path(__file__).parent)))
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("NVCC", str(wrapper))


def write_tree(root: Path, sources: dict[str, str]) -> Path:
    for name, text in sources.items():
        path = root / "cpp" / "cuda" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_identical_trees_pass_and_every_shared_source_is_compared(fake_nvcc, tmp_path, capsys):
    sources = {"a.cu": f"k: {A.hex()}\n", "b.cu": f"m: {B.hex()}\n"}
    old = write_tree(tmp_path / "old", sources)
    new = write_tree(tmp_path / "new", {**sources, "only_new.cu": f"c: {A.hex()}\n"})
    assert ck.main([str(old), str(new), "--jobs", "2"]) == 0
    assert "2 kernels identical, 0 changed, over 2 sources" in capsys.readouterr().out


def test_a_changed_kernel_fails_and_says_how_it_changed(fake_nvcc, tmp_path, capsys):
    old = write_tree(tmp_path / "old", {"a.cu": f"k: {A.hex()}\nm: {B.hex()}\ngone: {A.hex()}\n"})
    changed = f"k: {A_OFFSET_MOVED.hex()}\nm: {B.hex()}{B.hex()}\nadded: {B.hex()}\n"
    new = write_tree(tmp_path / "new", {"a.cu": changed})
    assert ck.main([str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "constant-bank offsets moved; 16 -> 16 bytes): _ZN8hisparse4cuda53_GLOBAL__N__k" in out
    assert "instructions differing: 1; 16 -> 32 bytes): _ZN8hisparse4cuda53_GLOBAL__N__m" in out
    assert "only in old: _ZN8hisparse4cuda53_GLOBAL__N__gone" in out
    assert "only in new: _ZN8hisparse4cuda53_GLOBAL__N__added" in out
    assert "0 kernels identical, 2 changed" in out


def test_a_compile_error_is_reported_with_status_2(fake_nvcc, tmp_path, capsys):
    old = write_tree(tmp_path / "old", {"a.cu": f"k: {A.hex()}\n"})
    new = write_tree(tmp_path / "new", {"a.cu": "syntax error\n"})
    assert ck.main([str(old), str(new)]) == 2
    assert "nvcc failed on" in capsys.readouterr().err


def test_a_rename_rule_without_its_arrow_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        ck.main([str(tmp_path), str(tmp_path), "--rename-new", "no-arrow"])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("NVCC", "nvcc")) is None, reason="needs nvcc")
def test_real_cubins_of_a_small_kernel(tmp_path, capsys):
    kernel = """
#include <cstdint>
namespace {{
template <int kScale>
__global__ void scale(int32_t* out, const int32_t* in, int n) {{
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * kScale {extra};
}}
}}
void launch(int32_t* out, const int32_t* in, int n) {{
  scale<2><<<1, 32>>>(out, in, n);
  scale<3><<<1, 32>>>(out, in, n);
}}
"""
    old = write_tree(tmp_path / "old", {"k.cu": kernel.format(extra="")})
    same = write_tree(tmp_path / "same", {"k.cu": "// a comment moves no instruction\n" + kernel.format(extra="")})
    new = write_tree(tmp_path / "new", {"k.cu": kernel.format(extra="+ 1")})
    assert ck.main([str(old), str(same)]) == 0
    assert "2 kernels identical, 0 changed, over 1 sources" in capsys.readouterr().out
    assert ck.main([str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "0 kernels identical, 2 changed" in out and "scaleILi2EEEvPiPKii" in out
