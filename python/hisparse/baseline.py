"""A plain PyTorch implementation of residency resolution.

This is the baseline a user would write without hisparse: batched tensor
operations (sort, unique-by-first-occurrence, searchsorted, scatter), one
host sync for the longest request. The benchmarks time it beside the hisparse
kernel on the same inputs, and the tests check that both agree.

It follows docs/residency.md for well-formed state: each ``lru_slots`` row is
a permutation of ``0..H-1`` and hot blocks are non-negative (what hisparse
itself maintains). The corruption rules for damaged state (duplicate or
out-of-range LRU entries, negative hot blocks) are not modelled.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["resolve_residency_torch"]

_INT32_MAX = 2**31 - 1


def _lookup(table: Any, index: Any) -> Any:
    """table[b, index[b, e]] with indices past the table clamped to its last column (the callers mask those
    entries), and 0 for a table of no columns."""
    if table.shape[1] == 0:
        return index.new_zeros(index.shape)
    return table.gather(1, index.clamp(max=table.shape[1] - 1))


def resolve_residency_torch(
    topk_indices: Any,
    req_id_per_token: Any,
    request_state_indices: Any,
    device_global_indices: Any,
    lru_slots: Any,
    hot_block_table: Any,
    *,
    hot_block_size: int,
    attention_block_stride: int,
    host_rows: int,
    max_union_rows: int,
    out_attention: Any,
    out_hot_rows: Any,
    out_resolved: Any,
    out_miss_mask: Any,
    out_valid_counts: Any,
    out_swap_host_rows: Any,
    out_swap_device_rows: Any,
    out_swap_counts: Any,
    source_block_table: Optional[Any] = None,
    block_size: int = 0,
    resident_block_table: Optional[Any] = None,
    resident_block_size: int = 0,
    num_valid_rows: Optional[Any] = None,
    stats: Optional[Any] = None,
) -> None:
    """Same arguments and outputs as hisparse.ops.resolve_residency (no stream)."""
    import torch  # noqa: PLC0415

    device = topk_indices.device
    num_tokens, top_k = topk_indices.shape
    num_batch = request_state_indices.shape[0]
    num_states, hot_size = device_global_indices.shape
    long = torch.int64
    big = torch.iinfo(long).max

    # Token rows of each batch row and which requests are active.
    rows = torch.arange(num_tokens, device=device)
    limit = num_tokens if num_valid_rows is None else num_valid_rows.reshape(()).to(long).clamp(0, num_tokens)
    req = req_id_per_token[:num_tokens].to(long)
    row_ok = (rows < limit) & (req >= 0) & (req < num_batch)
    bucket = torch.where(row_ok, req, num_batch)
    counts = torch.bincount(bucket, minlength=num_batch + 1)[:num_batch]
    first = torch.full((num_batch + 1,), num_tokens, dtype=long, device=device)
    first = first.scatter_reduce(0, bucket, rows, "amin")[:num_batch]
    last = torch.full((num_batch + 1,), -1, dtype=long, device=device)
    last = last.scatter_reduce(0, bucket, rows, "amax")[:num_batch]
    state = request_state_indices.to(long)
    order = torch.sort(state, stable=True)
    earlier_owner = torch.zeros(num_batch, dtype=torch.bool, device=device)
    earlier_owner[order.indices[1:]] = order.values[1:] == order.values[:-1]
    present = counts > 0
    padding = present & (state < 0)
    active = present & (state >= 0) & (state < num_states) & ~earlier_owner & (last - first + 1 == counts)
    rejected = present & ~padding & ~active

    # Every token row starts inactive; active requests overwrite theirs.
    out_attention[:num_tokens].fill_(-1)
    out_hot_rows[:num_tokens].fill_(-1)
    out_resolved[:num_tokens].fill_(-1)
    out_miss_mask[:num_tokens].zero_()
    out_valid_counts[:num_tokens].zero_()
    out_swap_counts[:num_tokens].zero_()
    deltas = torch.zeros(5, dtype=long, device=device)
    deltas[0] += (counts * rejected).sum() * top_k
    deltas[4] += (counts * rejected).sum() * top_k

    max_rows = int(torch.where(active, counts, 0).max()) if num_batch else 0  # the one host sync
    if max_rows == 0:
        if stats is not None:
            stats[:5] += deltas
        return
    batch = torch.nonzero(active).flatten()
    nb = batch.numel()
    states = state[batch]
    entries = max_rows * top_k
    row_offset = torch.arange(max_rows, device=device)
    token_rows = first[batch, None] + row_offset  # [nb, max_rows]
    row_exists = row_offset < counts[batch, None]
    token_rows_safe = torch.where(row_exists, token_rows, 0)

    # Step 1: classify entries.
    positions = topk_indices[token_rows_safe].to(long)  # [nb, max_rows, K]
    positions = torch.where(row_exists[..., None], positions, -1).reshape(nb, entries)
    valid = positions >= 0
    safe_positions = positions.clamp(min=0)
    if source_block_table is not None:
        width = source_block_table.shape[1]
        block = safe_positions // block_size
        valid &= block < width
        host_block = _lookup(source_block_table[batch].to(long), block)
        valid &= host_block > 0
        slots = host_block * block_size + safe_positions % block_size
    else:
        slots = safe_positions
    valid &= slots < host_rows

    def attention_index(row):
        return row // hot_block_size * attention_block_stride + row % hot_block_size

    resident = torch.zeros_like(valid)
    resident_rows = torch.zeros_like(slots)
    if resident_block_table is not None:
        width = resident_block_table.shape[1]
        page = safe_positions // resident_block_size
        block = _lookup(resident_block_table[batch].to(long), page)
        resident = valid & (page < width) & (block > 0)
        resident_rows = block * resident_block_size + safe_positions % resident_block_size
        overflowing = resident & (attention_index(resident_rows) > _INT32_MAX)
        valid &= ~overflowing
        resident &= ~overflowing
    hot = valid & ~resident

    # Step 2: the union in first-occurrence order, then the overflow cut.
    key = torch.where(hot, slots, big)
    sorted_key, perm = torch.sort(key, dim=1, stable=True)
    starts = torch.ones_like(sorted_key, dtype=torch.bool)
    starts[:, 1:] = sorted_key[:, 1:] != sorted_key[:, :-1]
    group_sorted = torch.cumsum(starts, 1) - 1
    group = torch.empty_like(group_sorted).scatter_(1, perm, group_sorted)
    group_first = torch.zeros_like(group_sorted).scatter_(1, torch.where(starts, group_sorted, entries - 1),
                                                          torch.where(starts, perm, 0))
    first_entry = group_first.gather(1, group)
    is_first = hot & (first_entry == torch.arange(entries, device=device))
    rank_at = torch.cumsum(is_first, 1) - 1
    rank = rank_at.gather(1, first_entry)
    hot &= rank < max_union_rows
    members = is_first & (rank < max_union_rows)
    num_members = members.sum(1)
    member_key = torch.full((nb, max_union_rows + 1), big, dtype=long, device=device)
    member_key.scatter_(1, torch.where(members, rank, max_union_rows), torch.where(members, slots, big))
    member_key = member_key[:, :max_union_rows]

    # Step 4: hit positions; a member held twice is served by the later position.
    lru_rows = lru_slots[states].to(long)
    dgi_rows = device_global_indices[states].to(long)
    held = dgi_rows.gather(1, lru_rows)
    sorted_members, member_order = torch.sort(member_key, dim=1)
    where_held = torch.searchsorted(sorted_members, held.clamp(min=0)).clamp(max=max_union_rows - 1)
    hit = (held >= 0) & (sorted_members.gather(1, where_held) == held)
    held_rank = member_order.gather(1, where_held)
    position = torch.arange(hot_size, device=device).expand(nb, hot_size)
    hit_position = torch.full((nb, max_union_rows + 1), -1, dtype=long, device=device)
    hit_position.scatter_reduce_(1, torch.where(hit, held_rank, max_union_rows), torch.where(hit, position, -1), "amax")
    hit_position = hit_position[:, :max_union_rows]
    member_hit = hit_position >= 0

    # Step 5: misses take evictable positions oldest first.
    evictable = ~hit
    evict_rank = torch.cumsum(evictable, 1) - 1
    num_evictable = evictable.sum(1)
    evict_list = torch.zeros((nb, hot_size + 1), dtype=long, device=device)
    evict_list.scatter_(1, torch.where(evictable, evict_rank, hot_size), position)
    member_index = torch.arange(max_union_rows, device=device)
    missed = (member_index < num_members[:, None]) & ~member_hit
    miss_rank = torch.cumsum(missed, 1) - 1
    assigned = missed & (miss_rank < num_evictable[:, None])
    miss_position = evict_list.gather(1, miss_rank.clamp(0, hot_size - 1))
    miss_slot = lru_rows.gather(1, miss_position)
    hit_slot = lru_rows.gather(1, hit_position.clamp(min=0))
    member_slot = torch.where(member_hit, hit_slot, torch.where(assigned, miss_slot, -1))
    # Unassigned members scatter into a spare column that is dropped.
    spare = torch.zeros((nb, 1), dtype=long, device=device)
    dgi_rows = torch.cat((dgi_rows, spare), 1)
    dgi_rows.scatter_(1, torch.where(assigned, miss_slot, hot_size), torch.where(assigned, member_key, 0))
    dgi_rows = dgi_rows[:, :hot_size]

    # Step 6: new LRU order E[n:], E[:n], hits.
    n = torch.minimum(missed.sum(1), num_evictable)[:, None]
    hit_rank = torch.cumsum(hit, 1) - 1
    destination = torch.where(
        evictable,
        torch.where(evict_rank >= n, evict_rank - n, num_evictable[:, None] - n + evict_rank),
        num_evictable[:, None] + hit_rank,
    )
    new_lru = torch.empty_like(lru_rows).scatter_(1, destination, lru_rows)
    lru_slots[states] = new_lru.to(lru_slots.dtype)
    device_global_indices[states] = dgi_rows.to(device_global_indices.dtype)

    # Step 7: per-entry outputs.
    entry_slot = member_slot.gather(1, rank.clamp(0, max_union_rows - 1))
    served = hot & (entry_slot >= 0)
    safe_slot = entry_slot.clamp(min=0)
    hot_table = hot_block_table[batch].to(long)
    hot_rows = hot_table.gather(1, safe_slot // hot_block_size) * hot_block_size + safe_slot % hot_block_size
    physical = torch.where(served, hot_rows, torch.where(resident, resident_rows, -1))
    visible = served | resident
    attention = torch.where(visible, attention_index(physical.clamp(min=0)), -1)
    newly = (~member_hit) & assigned
    miss_mask = served & is_first & newly.gather(1, rank.clamp(0, max_union_rows - 1))
    resolved = torch.where(visible, slots, -1)

    out_rows = token_rows_safe[row_exists]  # token row of each existing (request, row)
    def scatter_rows(out, values):
        out[out_rows] = values.reshape(nb, max_rows, top_k)[row_exists].to(out.dtype)

    scatter_rows(out_attention, attention)
    scatter_rows(out_hot_rows, physical)
    scatter_rows(out_resolved, resolved)
    scatter_rows(out_miss_mask, miss_mask)
    valid_counts = visible.reshape(nb, max_rows, top_k).sum(2)
    out_valid_counts[out_rows] = valid_counts[row_exists].to(out_valid_counts.dtype)

    # Step 7: the swap list.
    swap_index = torch.cumsum(assigned, 1) - 1
    swap_rows = first[batch, None] + swap_index // top_k
    swap_cols = swap_index % top_k
    swap_slot = member_slot.clamp(min=0)
    swap_physical = hot_table.gather(1, swap_slot // hot_block_size) * hot_block_size + swap_slot % hot_block_size
    out_swap_host_rows[swap_rows[assigned], swap_cols[assigned]] = member_key[assigned].to(out_swap_host_rows.dtype)
    out_swap_device_rows[swap_rows[assigned], swap_cols[assigned]] = swap_physical[assigned].to(
        out_swap_device_rows.dtype
    )
    num_assigned = assigned.sum(1)
    swap_counts = (num_assigned[:, None] - row_offset * top_k).clamp(0, top_k)
    out_swap_counts[out_rows] = swap_counts[row_exists].to(out_swap_counts.dtype)

    if stats is not None:
        deltas[0] += counts[batch].sum() * top_k
        deltas[1] += member_hit.sum()
        deltas[2] += num_assigned.sum()
        deltas[3] += resident.sum()
        deltas[4] += counts[batch].sum() * top_k - visible.sum()
        stats[:5] += deltas
