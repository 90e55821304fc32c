"""bench/resolver_phase_counts.py names the resolver kernel's phases and instantiations as the kernel does."""
from bench_scripts import ROOT, load_bench_script


def load():
    return load_bench_script("resolver_phase_counts")


def test_every_phase_of_the_kernel_body_is_found():
    phases = load().kernel_phases(ROOT / "cpp" / "cuda" / "resolve_residency.cu")
    source = (ROOT / "cpp" / "cuda" / "resolve_residency.cu").read_text().splitlines()
    named = {phases[line] for line in phases}
    # The phases of docs/residency.md's table, each on the line that calls it.
    assert {"A", "B", "C1", "C2", "D", "E", "F", "G", "H"} <= named
    for line, phase in phases.items():
        if phase == "B":
            assert "count_slot_occurrences" in source[line - 1] or "build_union" in source[line - 1]
    # Lines between phases are named by what they call, never by a phase letter.
    assert any(phase == "after_slot_scan" for phase in phases.values())
    assert "A" not in {phases[line] for line in phases if "allow_dependent_launch" in source[line - 1]}


def test_instantiations_match_between_ncu_and_mangled_names():
    instantiation_of = load().instantiation_of
    prefix = "_ZN8hisparse4cuda53_GLOBAL__N__e71da88d_20_resolve_residency_cu_cb1658af24resolve_residency_kernel"
    ncu = "hisparse::cuda::HandoffGather<hisparse::cuda::FusedGather>, hisparse::cuda::SharedPlacement, (int)1"
    mangled = prefix + ("INS0_13HandoffGatherINS0_11FusedGatherEEENS0_15SharedPlacementELi1EEE"
                        "vNS_22ResolveResidencyParamsE")
    expected = (("HandoffGather", "FusedGather", "SharedPlacement"), ("1",))
    assert instantiation_of(ncu) == instantiation_of(mangled) == expected
    paired = "hisparse::cuda::FusedGather, hisparse::cuda::SharedPlacement, (int)2"
    assert instantiation_of(paired) != instantiation_of(mangled)
    assert instantiation_of(paired)[1] == ("2",)
    # The early-read flags and the hint upkeep tell apart kernels of the same policies.
    noting = ("hisparse::cuda::HandoffGather<hisparse::cuda::FusedGather, (bool)1, (bool)1>, "
              "hisparse::cuda::SharedPlacement, (int)1, (hisparse::cuda::<unnamed>::HintUpkeep)0")
    noting_mangled = prefix + ("INS0_13HandoffGatherINS0_11FusedGatherELb1ELb1EEENS0_15SharedPlacementELi1E"
                               "LNS1_10HintUpkeepE0EEEvNS_22ResolveResidencyParamsENS0_17ResolverConstantsE")
    early_hinted = prefix + ("INS0_13HandoffGatherINS0_11FusedGatherELb1ELb0EEENS0_15SharedPlacementELi1E"
                             "LNS1_10HintUpkeepE1EEEvNS_22ResolveResidencyParamsENS0_17ResolverConstantsE")
    assert instantiation_of(noting) == instantiation_of(noting_mangled)
    assert instantiation_of(noting)[1] == ("1", "1", "1", "0")
    assert instantiation_of(early_hinted)[1] == ("1", "0", "1", "1")


def test_listing_charges_instructions_to_the_kernel_line_and_the_innermost_line():
    kernel = "_ZN8hisparse4cuda24resolve_residency_kernelINS0_8NoGatherENS0_15SharedPlacementELi1EEEv"
    listing = "\n".join([
        f".text.{kernel}:",
        '        //## File "/src/cpp/cuda/resolve_residency.cu", line 700',
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;",
        "        /*0010*/                   S2R R0, SR_TID.X ;",
        '        //## File "/src/cpp/cuda/union_table.cuh", line 65 inlined at '
        '"/src/cpp/cuda/resolve_residency.cu", line 301',
        '        //## File "/src/cpp/cuda/resolve_residency.cu", line 301 inlined at '
        '"/src/cpp/cuda/resolve_residency.cu", line 710',
        '        //## File "/src/cpp/cuda/resolve_residency.cu", line 710',
        "        /*0020*/                   ATOMS.CAS R2, [R3], R4, R5 ;",
        ".text.other:",
        '        //## File "/src/cpp/cuda/other.cu", line 5',
        "        /*0000*/                   EXIT ;",
    ])
    functions = load().parse_listing(listing)
    assert functions[kernel] == {0x0: (700, "resolve_residency.cu:700"), 0x10: (None, None),
                                 0x20: (710, "union_table.cuh:65")}
    # Another function's lines are not the kernel's.
    assert functions["other"] == {0x0: (None, "other.cu:5")}


def test_source_text_reads_the_cuda_tree_and_leaves_other_files_empty():
    module = load()
    source = (ROOT / "cpp" / "cuda" / "union_table.cuh").read_text().splitlines()
    assert module.source_text("union_table.cuh:1") == source[0].strip()
    assert module.source_text("device_atomic_functions.hpp:202") == ""
    assert module.source_text(f"union_table.cuh:{len(source) + 5}") == ""
