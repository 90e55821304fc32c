"""The test oracle of prefill staging: the semantics of docs/staging.md in
plain torch (sort, scatter, gather), independent of the C++ core. The tests
compare hisparse's plans and staged caches with it bit for bit.

Every output shape follows from input shapes and ints alone, as in the
library. Block ids and resident pages are assumed to fit int32 rows (the
library's rule for larger ones is tested against explicit expectations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MIN_STAGED_PREFILL_ROWS = 1024


def _int_arg(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def _index_tensor(name: str, value: Any, ndim: int | None = None) -> Any:
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
    """Where every staged row comes from; built by :func:`build_staging_plan`."""

    block_table: Any
    row_ids: Any
    dst_rows: Any
    miss_mask: Any
    block_size: int
    gpu_row_ids: Any = None
    gpu_source_key: tuple[int, int] | None = None

    @property
    def num_blocks(self) -> int:
        """Blocks of the staged cache (``capacity + 1``)."""
        return self.row_ids.shape[1] // self.block_size

    def ensure_gpu_sources(self, resident_state_rows: Any, state_indices: Any, resident_block_size: int) -> None:
        """Serve staged rows that have a GPU-resident copy from the resident cache."""
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


def staging_remap(block_table: Any, block_size: int) -> tuple[Any, Any]:
    """Renumber the block ids of ``block_table`` densely into outputs of fixed shapes."""
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
    """The staging plan of a prefill batch, built on ``block_table``'s device."""
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
    """``destination[j] = source row row_ids[j]`` for every j, bytes unchanged."""
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
    """Stage one layer's rows for ``plan``; returns ``[num_blocks, block_size, W]``."""
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
