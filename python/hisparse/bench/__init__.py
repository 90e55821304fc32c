"""``hisparse bench`` and ``hisparse plan``: the trace-driven benchmark and capacity planner.

Run ``hisparse bench`` (or ``python -m hisparse bench``) for the default
small run, ``--preset dsv32-fp8`` (``dsv32-bf16``, ``glm5-shared-index``) for
a model-sized one, ``hisparse plan`` to size the hot buffer and the host pool.
The modules: :mod:`.presets` (settings), :mod:`.trace` (generators, trace
files, locality statistics), :mod:`.plane` (the runtimes, host pool and
slabs), :mod:`.measure` (timing on CUDA and CPU), :mod:`.baseline_step`
(the plain PyTorch step), :mod:`.runner` (the benchmark's phases),
:mod:`.planner` (hit-rate curve, recommendation, host sizing),
:mod:`.report` and :mod:`.plots` (table, JSON, PNG), :mod:`.progress`,
:mod:`.commands` (the command-line drivers).

Importing this package needs neither torch nor CUDA.
"""

from .presets import DEFAULT_PRESET, PRESETS, Settings, make_settings

__all__ = ["DEFAULT_PRESET", "PRESETS", "Settings", "make_settings"]
