"""The same decode step done the way a user without hisparse would write it.

Resolution: :func:`hisparse.baseline.resolve_residency_torch` (batched torch
operations, one host sync). Gather: the swap list compacted with a boolean
mask, the host rows picked with advanced indexing on the CPU (a CUDA kernel
cannot index host memory in plain PyTorch), copied to the device and
scattered into the hot slab with ``index_copy_``. Every layer of an index
group gathers the leader's swap list, as hisparse's followers do.

The baseline keeps its own copy of every group's hot-region state and its
own scratch slab, so it can run in lockstep with hisparse on the same trace
and the outputs of the two can be compared entry by entry.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

from hisparse.baseline import resolve_residency_torch

__all__ = ["BaselineStep"]

_COMPARED = ("attention", "hot_rows", "resolved", "miss_mask", "swap_counts", "valid_counts")


class BaselineStep:
    """Plain PyTorch resolve + gather over a :class:`DataPlane`'s tables and host caches."""

    def __init__(self, plane: Any) -> None:
        import torch  # noqa: PLC0415

        self.torch = torch
        self.plane = plane
        device, rows, k = plane.device, plane.token_rows, plane.top_k
        i32 = dict(dtype=torch.int32, device=device)
        self.out = {name: torch.empty((rows, k), **i32)
                    for name in ("attention", "hot_rows", "resolved", "miss_mask", "swap_host", "swap_device")}
        self.valid_counts = torch.empty(rows, **i32)
        self.swap_counts = torch.empty(rows, **i32)
        self.stats = torch.zeros((plane.index_groups, 5), dtype=torch.int64, device=device)
        self.state: List[Any] = []
        self.slab = torch.zeros_like(plane.slabs[0])
        self.columns = torch.arange(k, device=device)

    def load_state(self, snapshot: List[Any]) -> None:
        self.state = [(dgi.clone(), lru.clone()) for dgi, lru in snapshot]
        self.stats.zero_()

    def resolve(self, step: int, group: int) -> None:
        p = self.plane
        dgi, lru = self.state[group]
        resolve_residency_torch(
            p.group_topk(step, group), p.req_id, p.state_rows, dgi, lru, p.hot_table,
            hot_block_size=p.hot_block_size, attention_block_stride=p.leaders[group].attention_block_stride,
            host_rows=p.host_rows, max_union_rows=p.max_union_rows, out_attention=self.out["attention"],
            out_hot_rows=self.out["hot_rows"], out_resolved=self.out["resolved"], out_miss_mask=self.out["miss_mask"],
            out_valid_counts=self.valid_counts, out_swap_host_rows=self.out["swap_host"],
            out_swap_device_rows=self.out["swap_device"], out_swap_counts=self.swap_counts,
            source_block_table=p.source_table, block_size=p.block_size, stats=self.stats[group],
        )

    def gather(self, group: int) -> None:
        p = self.plane
        used = self.columns[None, :] < self.swap_counts[:, None]
        source = self.out["swap_host"][used].long()
        target = self.out["swap_device"][used].long()
        size = p.group_layers[group]
        stride = size * p.hot_block_size
        rows = self.slab.view(-1, p.row_bytes)
        first = sum(p.group_layers[:group])
        for i in range(size):
            host = p.host_caches[first + i]
            if p.device.type == "cuda":
                picked = host[source.cpu()].to(p.device)
            else:
                picked = host[source]
            slot = target // p.hot_block_size * stride + target % p.hot_block_size + i * p.hot_block_size
            rows.index_copy_(0, slot, picked)

    def _sync(self) -> None:
        if self.plane.device.type == "cuda":
            self.torch.cuda.synchronize(self.plane.device)

    def timed_step(self, step: int, compare: bool) -> Dict[str, Any]:
        """Resolve + gather every group for ``step``; seconds of each part.

        With ``compare``, hisparse has just run the same step from the same
        state: the outputs of each group's resolution are compared with the
        leader's (outside the timed parts).
        """
        p = self.plane
        resolve_s = gather_s = 0.0
        mismatches = {name: 0 for name in _COMPARED}
        for group, leader in enumerate(p.leaders):
            self._sync()
            start = time.perf_counter()
            self.resolve(step, group)
            self._sync()
            resolve_s += time.perf_counter() - start
            if compare:
                rows = slice(0, p.token_rows)
                theirs = {
                    "attention": leader.attention_indices[rows], "hot_rows": leader.hot_rows[rows],
                    "resolved": leader.resolved_slots[rows], "miss_mask": leader.miss_mask[rows],
                    "swap_counts": leader.swap_counts[rows], "valid_counts": leader.valid_counts[rows],
                }
                ours = dict(self.out, swap_counts=self.swap_counts, valid_counts=self.valid_counts)
                for name in _COMPARED:
                    if not self.torch.equal(theirs[name], ours[name]):
                        mismatches[name] += 1
            start = time.perf_counter()
            self.gather(group)
            self._sync()
            gather_s += time.perf_counter() - start
        return {"resolve_s": resolve_s, "gather_s": gather_s, "mismatches": mismatches}

    def state_matches(self) -> bool:
        """The baseline's hot-region state equals hisparse's in every group."""
        torch = self.torch
        return all(
            torch.equal(dgi, leader.device_global_indices) and torch.equal(lru, leader.lru_slots)
            for (dgi, lru), leader in zip(self.state, self.plane.leaders)
        )

    def counters(self) -> Any:
        return self.stats
