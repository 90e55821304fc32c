"""The test oracle of prefill staging: the semantics of docs/staging.md in
plain torch (sort, scatter, gather), independent of the C++ core. The tests
compare hisparse's plans and staged caches with it bit for bit.

Every output shape follows from input shapes and ints alone, as in the
library. Block ids and resident pages are assumed to fit int32 rows (the
library's rule for larger ones is tested against explicit expectations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch

MIN_STAGED_PREFILL_ROWS = 1024


def _int_arg(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def _index_tensor(name: str, value: Any, ndim: Optional[int] = None) -> Any:
    """``value`` as a torch tensor of an integer dtype (and ``ndim`` dimensions)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer dtype (int32 or int64), got {value.dtype}")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(value.shape)}")
    return value


def _same_device(name: str, value: Any, reference_name: str, reference: Any) -> None:
    if value.device != reference.device:
        raise ValueError(
            f"{name}: expected a tensor on {reference.device} (the device of {reference_name}), got {value.device}"
        )


@dataclass
class StagingPlan:
    """Where every staged row comes from; built by :func:`build_staging_plan`.

    ``block_table``: int32 ``[B, C]``, the request block table renumbered
    into the staged cache (0 = null block and unreferenced entries).
    ``row_ids``: int32 ``[1, N]`` with ``N = (capacity + 1) * block_size``,
    the host slot staged into row ``j`` (-1: unused row). ``dst_rows``:
    int32 ``[1, N]``, ``0..N-1``. ``miss_mask``: int32 ``[1, N]``, 1 where
    row ``j`` is loaded from the host cache. ``gpu_row_ids`` (after
    :meth:`ensure_gpu_sources`): int32 ``[1, N]``, the flat resident-cache
    row that already holds row ``j`` (-1: none); those rows have
    ``miss_mask == 0``. ``gpu_source_key``: which resident table
    ``gpu_row_ids`` was computed for.
    """

    block_table: Any
    row_ids: Any
    dst_rows: Any
    miss_mask: Any
    block_size: int
    gpu_row_ids: Any = None
    gpu_source_key: Optional[Tuple[int, int]] = None

    @property
    def num_blocks(self) -> int:
        """Blocks of the staged cache (``capacity + 1``)."""
        return self.row_ids.shape[1] // self.block_size

    def ensure_gpu_sources(self, resident_state_rows: Any, state_indices: Any, resident_block_size: int) -> None:
        """Serve staged rows that have a GPU-resident copy from the resident cache.

        ``resident_state_rows``: int ``[S, R]``, a resident group's persistent
        table by state row (page ``p`` of state row ``s`` is resident block
        ``resident_state_rows[s, p]``, > 0 when resident). ``state_indices``:
        int ``[>= B]``, the state row of each batch row of the plan. Each
        staged host block takes the resident pages of the first (row-major)
        block-table entry that references it. Rows found resident get
        ``gpu_row_ids = page * resident_block_size + offset`` and leave the
        miss mask; :func:`gather_prefill_cache` copies them device to device.

        Computed once per plan and resident table: a second call with the same
        table (same storage) and page size returns at once. Returns without
        resident sources when ``block_size`` is not a multiple of
        ``resident_block_size`` (or it is <= 0), when the plan has no batch
        rows, or when ``state_indices`` has fewer than B entries.
        """
        _index_tensor("resident_state_rows", resident_state_rows, 2)
        _index_tensor("state_indices", state_indices, 1)
        if isinstance(resident_block_size, bool) or not isinstance(resident_block_size, int):
            raise TypeError(f"resident_block_size: expected an int, got {type(resident_block_size).__name__}")
        device = self.row_ids.device
        _same_device("resident_state_rows", resident_state_rows, "the plan", self.row_ids)
        _same_device("state_indices", state_indices, "the plan", self.row_ids)

        key = (resident_state_rows.data_ptr(), resident_block_size)
        if self.gpu_source_key == key:
            return
        block_size = self.block_size
        num_rows, num_cols = self.block_table.shape
        if (
            resident_block_size <= 0
            or block_size % resident_block_size != 0
            or num_rows == 0
            or state_indices.shape[0] < num_rows
        ):
            # Nothing can be served from this table. Sources computed for an
            # earlier table address another resident cache: drop them, so the
            # plan falls back to loading every row from the host.
            if self.gpu_row_ids is not None:
                self.gpu_row_ids = None
                self.miss_mask = (self.row_ids >= 0).to(torch.int32)
                self.gpu_source_key = None
            return

        num_blocks = self.num_blocks
        staged = self.row_ids.view(num_blocks, block_size)
        valid_rows = staged >= 0
        host_block = staged[:, 0].to(torch.int64) // block_size  # -1 for unused blocks
        pages_per_block = block_size // resident_block_size

        # Resident page ids of every staged block: [num_blocks, pages_per_block].
        if num_cols == 0 or resident_state_rows.numel() == 0:
            pages = torch.zeros((num_blocks, pages_per_block), dtype=torch.int64, device=device)
        else:
            # First (row-major) block-table entry of each staged block.
            entries = num_rows * num_cols
            first = torch.full((num_blocks,), entries, dtype=torch.int64, device=device)
            first.scatter_reduce_(
                0,
                self.block_table.reshape(-1).to(torch.int64),
                torch.arange(entries, dtype=torch.int64, device=device),
                reduce="amin",
                include_self=True,
            )
            referenced = first < entries
            row = torch.clamp(first // num_cols, max=num_rows - 1)
            col = first % num_cols
            # A state row outside the table (padding -1 or corrupt) has no
            # resident pages: its blocks load from the host.
            num_states, res_cols = resident_state_rows.shape
            state = state_indices[:num_rows].to(torch.int64)[row]
            known_state = (state >= 0) & (state < num_states)
            page_col = col[:, None] * pages_per_block + torch.arange(pages_per_block, device=device)
            in_table = page_col < res_cols
            flat = state.clamp(0, num_states - 1)[:, None] * res_cols + page_col.clamp(max=res_cols - 1)
            pages = resident_state_rows.reshape(-1).to(torch.int64)[flat]
            usable = in_table & (referenced & known_state)[:, None]
            pages = torch.where(usable, pages, torch.zeros_like(pages))

        offsets = torch.arange(block_size, device=device)
        row_page = pages[:, offsets // resident_block_size]  # [num_blocks, block_size]
        gpu_rows = row_page * resident_block_size + (offsets % resident_block_size)
        # Block 0 is the null block in the host and in the resident id space.
        hit = (row_page > 0) & (host_block > 0)[:, None] & valid_rows
        minus_one = torch.full_like(gpu_rows, -1)
        self.gpu_row_ids = torch.where(hit, gpu_rows, minus_one).to(torch.int32).view(1, -1)
        self.miss_mask = (valid_rows & ~hit).to(torch.int32).view(1, -1)
        self.gpu_source_key = key


def staging_remap(block_table: Any, block_size: int) -> Tuple[Any, Any]:
    """Renumber the block ids of ``block_table`` densely, without a
    data-dependent output allocation.

    The distinct ids of ``{0} U max(block_table, 0)`` in ascending order get
    compact ids 0, 1, 2, ... (the null block keeps 0; negative ids count as
    0). Returns ``(new_table, row_ids)``: ``new_table`` int32 of
    ``block_table``'s shape holds the compact ids; ``row_ids`` int32
    ``[1, (numel + 1) * block_size]`` holds, for compact id ``k`` and offset
    ``o``, the host slot ``id_k * block_size + o``, or -1 past the last
    distinct id. Shapes depend only on ``block_table.shape``.
    """
    _index_tensor("block_table", block_table)
    _int_arg("block_size", block_size, 1)
    device = block_table.device
    ids = torch.cat(
        (
            torch.zeros(1, dtype=torch.int32, device=device),
            block_table.reshape(-1).clamp(min=0).to(torch.int32),
        )
    )
    sorted_ids, order = torch.sort(ids)
    starts_run = torch.ones_like(sorted_ids, dtype=torch.bool)
    starts_run[1:] = sorted_ids[1:] != sorted_ids[:-1]
    rank = torch.cumsum(starts_run, 0, dtype=torch.int32) - 1  # compact id, in sorted order
    compact = torch.empty_like(rank).scatter_(0, order, rank)
    # Every position of a run writes the same id; slots past the last run keep -1.
    unique = torch.full_like(sorted_ids, -1).scatter_(0, rank.to(torch.int64), sorted_ids)
    offsets = torch.arange(block_size, dtype=torch.int32, device=device)
    used = (unique >= 0)[:, None]
    rows = unique[:, None] * block_size + offsets
    row_ids = torch.where(used, rows, torch.full_like(rows, -1)).view(1, -1)
    return compact[1:].view(block_table.shape), row_ids


def build_staging_plan(block_table: Any, seq_lens: Any, block_size: int, staging_block_capacity: int) -> StagingPlan:
    """The staging plan of a prefill batch, built on ``block_table``'s device.

    ``block_table``: int ``[B, C]`` host block ids per request.
    ``seq_lens``: int ``[>= B]``; request ``b`` reads its first
    ``ceil(seq_lens[b] / block_size)`` blocks. The batch's blocks are packed
    request after request into ``staging_block_capacity`` slots; entries past
    the capacity or past column C are not staged (their renumbered entry is
    0). The staged blocks are then renumbered with :func:`staging_remap`, so
    the staged cache has ``staging_block_capacity + 1`` blocks. Asynchronous
    and layer-independent: build once per batch, gather per layer.
    """
    _index_tensor("block_table", block_table, 2)
    _index_tensor("seq_lens", seq_lens, 1)
    _int_arg("block_size", block_size, 1)
    _int_arg("staging_block_capacity", staging_block_capacity, 0)
    _same_device("seq_lens", seq_lens, "block_table", block_table)
    num_rows, num_cols = block_table.shape
    if seq_lens.shape[0] < num_rows:
        raise ValueError(
            f"seq_lens: expected at least one length per block_table row ({num_rows}), "
            f"got shape {tuple(seq_lens.shape)}"
        )
    device = block_table.device
    entries = num_rows * num_cols

    if entries == 0:
        valid = torch.zeros(staging_block_capacity, dtype=torch.bool, device=device)
        flat = torch.zeros(staging_block_capacity, dtype=torch.int64, device=device)
        referenced = torch.zeros(staging_block_capacity, dtype=torch.int32, device=device)
    else:
        lengths = seq_lens[:num_rows].to(torch.int64)
        used = torch.clamp((lengths + block_size - 1) // block_size, min=0)
        ends = torch.cumsum(used, 0)
        slot = torch.arange(staging_block_capacity, dtype=torch.int64, device=device)
        # Packed slot k belongs to the first request whose blocks end after k.
        row = torch.searchsorted(ends, slot, right=True)
        valid = row < num_rows
        row = row.clamp(max=num_rows - 1)
        col = slot - (ends - used)[row]
        valid &= col < num_cols
        flat = row * num_cols + col.clamp(max=num_cols - 1)
        picked = block_table.reshape(-1)[flat]
        referenced = torch.where(valid, picked, torch.zeros_like(picked))

    compact, row_ids = staging_remap(referenced, block_size)
    # Scatter the compact ids back to the entries they came from; invalid
    # slots write into one scratch element past the table.
    target = torch.where(valid, flat, torch.full_like(flat, entries))
    values = torch.where(valid, compact, torch.zeros_like(compact))
    table = torch.zeros(entries + 1, dtype=torch.int32, device=device)
    table.scatter_(0, target, values)
    num_staged = row_ids.shape[1]
    return StagingPlan(
        block_table=table[:entries].view(num_rows, num_cols),
        row_ids=row_ids,
        dst_rows=torch.arange(num_staged, dtype=torch.int32, device=device).view(1, -1),
        miss_mask=(row_ids >= 0).to(torch.int32),
        block_size=block_size,
    )


def gather_resident_rows(source: Any, destination: Any, row_ids: Any) -> None:
    """``destination[j] = source row row_ids[j]`` for every j, bytes unchanged.

    ``source``: a resident cache ``[num_blocks, block_size, W]`` (any
    strides); flat row ``r`` is ``source[r // block_size, r % block_size]``.
    ``destination``: ``[N, W']`` rows of the same byte size (a different dtype
    is reinterpreted, not converted). ``row_ids``: int ``[N]``. An id outside
    the cache (negative, e.g. -1 for "not resident", or past the end) copies
    row 0; callers overwrite or ignore those rows.
    """
    if not isinstance(source, torch.Tensor):
        raise TypeError(f"source: expected a torch.Tensor, got {type(source).__name__}")
    if not isinstance(destination, torch.Tensor):
        raise TypeError(f"destination: expected a torch.Tensor, got {type(destination).__name__}")
    _index_tensor("row_ids", row_ids, 1)
    if source.dim() != 3:
        raise ValueError(
            f"source: expected a paged cache [num_blocks, block_size, row width], got shape {tuple(source.shape)}"
        )
    if destination.dim() != 2:
        raise ValueError(f"destination: expected rows [N, row width], got shape {tuple(destination.shape)}")
    _same_device("destination", destination, "source", source)
    _same_device("row_ids", row_ids, "source", source)
    source_bytes = source.shape[2] * source.element_size()
    destination_bytes = destination.shape[1] * destination.element_size()
    if source_bytes != destination_bytes:
        raise ValueError(
            f"destination: expected rows of {source_bytes} bytes (the rows of source, shape {tuple(source.shape)} "
            f"of {source.dtype}), got {destination_bytes} bytes "
            f"(shape {tuple(destination.shape)} of {destination.dtype})"
        )
    if row_ids.shape[0] != destination.shape[0]:
        raise ValueError(
            f"row_ids: expected one id per destination row ({destination.shape[0]}), got shape {tuple(row_ids.shape)}"
        )
    num_blocks, block_size = source.shape[0], source.shape[1]
    if num_blocks * block_size == 0:
        raise ValueError(f"source: expected at least one row, got shape {tuple(source.shape)}")
    rows = row_ids.to(torch.int64)
    rows = torch.where((rows >= 0) & (rows < num_blocks * block_size), rows, torch.zeros_like(rows))
    payload = source[rows // block_size, rows % block_size]
    if payload.dtype != destination.dtype:
        payload = payload.contiguous().view(destination.dtype)
    destination.copy_(payload)


def gather_prefill_cache(
    plan: StagingPlan,
    host_cache: Any,
    resident_cache: Any = None,
    *,
    min_rows: int = MIN_STAGED_PREFILL_ROWS,
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
    miss mask is loaded from the host cache (the gather_plan rule).
    Unused rows (``row_ids < 0``) hold unspecified bytes. Runs on torch's
    current stream; no host sync.
    """
    if not isinstance(plan, StagingPlan):
        raise TypeError(f"plan: expected a hisparse.StagingPlan, got {type(plan).__name__}")
    if not isinstance(host_cache, torch.Tensor):
        raise TypeError(f"host_cache: expected a torch.Tensor, got {type(host_cache).__name__}")
    _int_arg("min_rows", min_rows, 0)
    block_size = plan.block_size
    if host_cache.dim() < 2:
        raise ValueError(f"host_cache: expected rows [..., row width], got shape {tuple(host_cache.shape)}")
    if host_cache.dim() >= 3 and host_cache.shape[1] != block_size:
        raise ValueError(
            f"HiSparse staging block size {block_size} does not match the KV cache block size {host_cache.shape[1]}."
        )
    if plan.row_ids.dim() != 2 or plan.row_ids.shape[0] != 1 or plan.row_ids.shape[1] % block_size != 0:
        raise ValueError(
            f"plan.row_ids: expected shape [1, num_blocks x block_size {block_size}], got {tuple(plan.row_ids.shape)}"
        )
    if plan.gpu_row_ids is not None:
        if resident_cache is None:
            raise ValueError(
                "resident_cache: the plan serves rows from a resident cache (ensure_gpu_sources found resident "
                "pages); expected that cache, got None"
            )
        if not isinstance(resident_cache, torch.Tensor):
            raise TypeError(f"resident_cache: expected a torch.Tensor, got {type(resident_cache).__name__}")
        resident_block_size = plan.gpu_source_key[1] if plan.gpu_source_key is not None else None
        if resident_cache.dim() != 3 or (
            resident_block_size is not None and resident_cache.shape[1] != resident_block_size
        ):
            raise ValueError(
                f"resident_cache: expected a paged cache [num_blocks, {resident_block_size}, row width] (the resident "
                f"block size given to ensure_gpu_sources), got shape {tuple(resident_cache.shape)}"
            )

    width = host_cache.shape[-1]
    num_blocks = plan.row_ids.shape[1] // block_size
    min_blocks = -(-min_rows // block_size)
    staged = torch.empty(
        (max(num_blocks, min_blocks), block_size, width), dtype=host_cache.dtype, device=plan.block_table.device
    )[:num_blocks]
    if plan.gpu_row_ids is not None:
        gather_resident_rows(resident_cache, staged.view(-1, width), plan.gpu_row_ids[0])
    # gather_plan: host rows where the miss mask says so (ids past the cache are skipped).
    host_rows = host_cache.reshape(-1, width)
    rows = plan.row_ids[0].to(torch.int64)
    load = (plan.miss_mask[0] != 0) & (rows >= 0) & (rows < host_rows.shape[0])
    flat = staged.view(-1, width)
    flat[plan.dst_rows[0].to(torch.int64)[load]] = host_rows[rows[load]].to(flat.device)
    return staged
