"""Prefill staging: stage the host KV blocks a prefill batch reads into one
compact device buffer, shared by every layer.

A prefill's attention reads whole blocks of each request's history. The plan
renumbers the distinct host blocks that the batch references to 0, 1, 2, ...
(0 stays the null block), so a layer gathers them once into a staged cache
``[capacity + 1, block_size, row]`` and attends through the renumbered block
table. One plan serves every layer; only the bytes differ per layer.

The plan (:class:`StagingPlan`, from ``hisparse._C``) and every kernel are
the C++ core's (``hisparse/staging.h``); this module only allocates what the
core writes, with the array library of the inputs (torch tensors give torch
tensors, NumPy arrays on the CPU give NumPy arrays), and passes torch's
current stream. No call syncs with the host or allocates memory whose size
depends on tensor contents, so plans can be built inside a captured CUDA
graph. The exact semantics are in docs/staging.md.
"""

from __future__ import annotations

import sys
from typing import Any

from . import _C, _args

__all__ = [
    "MIN_STAGED_PREFILL_ROWS",
    "StagingPlan",
    "build_staging_plan",
    "gather_prefill_cache",
    "gather_resident_rows",
    "staging_remap",
]

StagingPlan = _C.StagingPlan

#: The staged buffer is allocated with room for at least this many rows (the
#: returned view is still exactly ``capacity + 1`` blocks): small prefills of
#: different sizes then draw same-sized buffers from the caching allocator,
#: and kernels that read whole tiles past the last staged row stay inside the
#: allocation (HS_MIN_STAGED_PREFILL_ROWS).
MIN_STAGED_PREFILL_ROWS: int = _C.MIN_STAGED_PREFILL_ROWS

_DLPACK_CUDA = 2
_CPU, _CUDA = 1, 2  # hs_device_type_t


def _array_module(value: Any, name: str) -> Any:
    """torch or numpy, whichever ``value`` is an array of (a named TypeError otherwise)."""
    _args.check_tensor(name, value, sliceable=True)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return torch
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return numpy
    raise TypeError(f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(value).__name__}")


def _same_module(name: str, value: Any, module: Any) -> None:
    if _array_module(value, name) is not module:
        raise TypeError(
            f"{name}: expected a {module.__name__} array like the plan's tensors, got {type(value).__name__}"
        )


def _device(value: Any) -> tuple[int, int]:
    """(hs_device_type_t, device index) of an array."""
    kind, index = value.__dlpack_device__()
    return (_CUDA, int(index)) if int(kind) == _DLPACK_CUDA else (_CPU, 0)


def _empty(module: Any, like: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised array of ``module`` on ``like``'s device, 64-byte aligned."""
    if module.__name__ == "torch":
        dtype = getattr(module, dtype) if isinstance(dtype, str) else dtype
        return module.empty(shape, dtype=dtype, device=like.device)
    dtype = module.dtype(dtype)
    count = 1
    for n in shape:
        count *= n
    raw = module.empty(count * dtype.itemsize + 64, dtype=module.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + count * dtype.itemsize].view(dtype).reshape(shape)


def build_staging_plan(
    block_table: Any, seq_lens: Any, block_size: int, staging_block_capacity: int, *, stream: Any = None
) -> StagingPlan:
    """The staging plan of a prefill batch, built on ``block_table``'s device.

    ``block_table``: int ``[B, C]`` host block ids per request.
    ``seq_lens``: int ``[>= B]``; request ``b`` reads its first
    ``ceil(seq_lens[b] / block_size)`` blocks. The batch's blocks are packed
    request after request into ``staging_block_capacity`` slots; entries past
    the capacity or past column C are not staged (their renumbered entry is
    0). The staged blocks are then renumbered as :func:`staging_remap` does,
    so the staged cache has ``staging_block_capacity + 1`` blocks.
    Asynchronous and layer-independent: build once per batch, gather per layer.
    """
    module = _array_module(block_table, "block_table")
    shape = tuple(block_table.shape)
    if len(shape) != 2:
        raise ValueError(f"block_table: expected 2 dimensions [B, C], got shape {shape}")
    device_type, device_index = _device(block_table)
    storage = None  # NumPy: the plan's own memory
    if module.__name__ == "torch":
        nbytes = StagingPlan.storage_bytes(
            device_type, device_index, shape[0], shape[1], block_size, staging_block_capacity
        )
        storage = _empty(module, block_table, (nbytes,), "uint8")
    plan = StagingPlan(device_type, device_index, shape[0], shape[1], block_size, staging_block_capacity, storage)
    plan.build(block_table, seq_lens, _args.stream(stream, block_table, seq_lens))
    return plan


def staging_remap(block_table: Any, block_size: int, *, stream: Any = None) -> tuple[Any, Any]:
    """Renumber the block ids of ``block_table`` densely, without a
    data-dependent output allocation.

    The distinct ids of ``{0} U max(block_table, 0)`` in ascending order get
    compact ids 0, 1, 2, ... (the null block keeps 0; negative ids, and ids
    whose rows do not fit in int32, count as 0). Returns
    ``(new_table, row_ids)``: ``new_table`` int32 of ``block_table``'s shape
    holds the compact ids; ``row_ids`` int32 ``[1, (numel + 1) * block_size]``
    holds, for compact id ``k`` and offset ``o``, the host slot
    ``id_k * block_size + o``, or -1 past the last distinct id. Shapes depend
    only on ``block_table.shape``.
    """
    module = _array_module(block_table, "block_table")
    shape = tuple(block_table.shape)
    numel = 1
    for n in shape:
        numel *= n
    device_type, device_index = _device(block_table)
    nbytes = _C.staging_remap_workspace_bytes(device_type, device_index, numel, block_size)
    new_table = _empty(module, block_table, shape, "int32")
    row_ids = _empty(module, block_table, (1, (numel + 1) * block_size), "int32")
    workspace = _empty(module, block_table, (nbytes,), "uint8")
    _C.staging_remap(
        _args.tensor("block_table", block_table),
        block_size,
        _args.tensor("out_block_table", new_table),
        _args.tensor("out_row_ids", row_ids),
        _args.tensor("workspace", workspace),
        _args.stream(stream, block_table),
    )
    return new_table, row_ids


def gather_resident_rows(source: Any, destination: Any, row_ids: Any, *, stream: Any = None) -> None:
    """``destination[j] = source row row_ids[j]`` for every j, bytes unchanged.

    ``source``: a resident cache ``[num_blocks, block_size, W]`` (strides of
    16-byte multiples); flat row ``r`` is ``source[r // block_size, r %
    block_size]``. ``destination``: ``[N, W']`` rows of the same byte size (a
    different dtype is reinterpreted, not converted). ``row_ids``: int
    ``[N]``. An id outside the cache (negative, e.g. -1 for "not resident",
    or past the end) copies row 0; callers overwrite or ignore those rows.
    """
    _C.gather_resident_rows(
        _args.tensor("source", source),
        _args.tensor("destination", destination),
        _args.tensor("row_ids", row_ids),
        _args.stream(stream, destination, source),
    )


def gather_prefill_cache(
    plan: StagingPlan,
    host_cache: Any,
    resident_cache: Any = None,
    *,
    min_rows: int = MIN_STAGED_PREFILL_ROWS,
    stream: Any = None,
) -> Any:
    """Stage one layer's rows for ``plan``; returns ``[num_blocks, block_size, W]``.

    ``host_cache``: the layer's host cache (rows of width W, host slot g =
    row g; pinned or registered when the plan is on CUDA), of the staged
    dtype; when it has 3 or more dimensions its dimension 1 must be the plan's
    block size. ``resident_cache``: the resident group's paged GPU cache,
    required when the plan has resident sources (:meth:`StagingPlan.ensure_gpu_sources`),
    whose block size must be the resident page size given there.

    The buffer is allocated on the plan's device with room for at least
    ``min_rows`` rows (see :data:`MIN_STAGED_PREFILL_ROWS`). Rows with a
    resident copy are copied device to device first, then every row of the
    miss mask is loaded from the host cache (``hs_gather_prefill_cache``).
    Rows loaded from neither (``row_ids < 0``, or past the host cache) hold
    unspecified bytes. Runs on torch's current stream; no host sync.
    """
    if not isinstance(plan, StagingPlan):
        raise TypeError(f"plan: expected a hisparse.StagingPlan, got {type(plan).__name__}")
    module = _array_module(plan.row_ids, "plan")
    _same_module("host_cache", host_cache, module)
    if resident_cache is not None:
        _same_module("resident_cache", resident_cache, module)
    _args.require_int("min_rows", min_rows, 0, bits=32)
    block_size, num_blocks = plan.block_size, plan.num_blocks
    width = host_cache.shape[-1] if len(host_cache.shape) > 0 else 1
    min_blocks = -(-min_rows // block_size)
    staged = _empty(module, plan.row_ids, (max(num_blocks, min_blocks), block_size, width), host_cache.dtype)
    staged = staged[:num_blocks]
    _C.gather_prefill_cache(
        plan,
        _args.tensor("host_cache", host_cache),
        _args.optional_tensor("resident_cache", resident_cache),
        _args.tensor("staged", staged),
        _args.stream(stream, staged),
    )
    return staged
