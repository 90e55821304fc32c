"""The benchmarked data plane: what an engine builds to serve an L-layer model.

One :class:`hisparse.HostPool` holds every layer's host cache (layer-major:
layer ``l`` owns ``[host_rows, row_bytes]``; request ``b`` owns host blocks
``1 + b * blocks_per_request + i``, block 0 being the null block). Layers
form index groups of ``group_size``: the first layer of a group is the
:class:`hisparse.Runtime` leader that resolves the group's top-k, the others
follow. Each group has one device slab in which its layers' hot views lie
interleaved block by block, like an engine's shared KV slab; every request
has ``ceil(H / hot_block_size)`` hot blocks.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import hisparse
from hisparse import ops

from .presets import RESIDENCY_HINT_CHOICES

__all__ = ["DataPlane", "runtime_config"]


def runtime_config(settings: Any, top_k: int, rows_per_request: int, hot_size: int) -> Any:
    """The :class:`hisparse.Config` of a run's runtimes: ``settings``' rows
    and blocks, ``top_k`` and ``rows_per_request`` as the trace has them,
    ``hot_size`` hot slots (a union never larger than the buffer)."""
    return hisparse.Config(
        top_k=top_k, device_buffer_size=hot_size, max_union_rows=min(top_k * rows_per_request, hot_size),
        row_bytes=settings.row_bytes, block_size=settings.block_size, hot_block_size=settings.hot_block_size,
        num_speculative_tokens=rows_per_request - 1,
    )


class DataPlane:
    """Runtimes, host pool, hot slabs and tables for one benchmark run."""

    def __init__(self, settings: Any, trace: Any, device: Any, *, fill_layers: Optional[List[int]] = None,
                 host_regions: Optional[int] = None, copy_stream: Any = None) -> None:
        """``host_regions``: the pool holds that many layer caches and layer
        ``l`` reads cache ``l % host_regions`` (None: one per layer), so that
        a run can tell what the host footprint costs apart from the layer
        count; ``copy_stream``: one copy stream for every group leader (None:
        each leader creates its own)."""
        import torch  # noqa: PLC0415

        self.torch = torch
        self.settings = settings
        self.trace = trace
        self.device = device
        s = settings
        k, q, batch = trace.top_k, trace.rows_per_request, trace.batch
        self.top_k, self.batch, self.token_rows = k, batch, trace.token_rows
        self.block_size, self.hot_block_size, self.row_bytes = s.block_size, s.hot_block_size, s.row_bytes
        self.config = runtime_config(s, k, q, s.hot_size)
        self.max_union_rows = self.config.max_union_rows
        if device.type == "cuda":
            self.config.check_device(device)

        # Host side: every layer's cache in one pool.
        self.blocks_per_request = -(-trace.context // s.block_size)
        self.host_rows = (1 + batch * self.blocks_per_request) * s.block_size
        self.layer_bytes = self.host_rows * s.row_bytes
        regions = s.layers if host_regions is None else host_regions
        if not 1 <= regions <= s.layers:
            raise ValueError(f"host_regions: expected 1 to {s.layers} (the layers), got {regions}")
        self.host_regions = regions
        self.pool = hisparse.HostPool(
            regions * self.layer_bytes,
            register="always" if device.type == "cuda" else "never",
            device=(device.index if device.index is not None else torch.cuda.current_device())
            if device.type == "cuda" else None,
        )
        flat = self.pool.view("uint8")
        region_caches = [
            flat[region * self.layer_bytes:(region + 1) * self.layer_bytes].view(self.host_rows, s.row_bytes)
            for region in range(regions)
        ]
        self.host_caches = [region_caches[layer % regions] for layer in range(s.layers)]
        generator = torch.Generator().manual_seed(s.seed + 1)
        for layer in fill_layers or []:
            # Distinct bytes where the data check looks; elsewhere the pool's zeroed pages.
            self.host_caches[layer].random_(0, 256, generator=generator)
        self._flat = flat

        # Tables.
        self.hot_blocks = -(-s.hot_size // s.hot_block_size)
        self.num_hot_blocks = 1 + batch * self.hot_blocks
        i32 = dict(dtype=torch.int32, device=device)
        self.hot_table = (1 + torch.arange(batch * self.hot_blocks, **i32)).view(batch, self.hot_blocks).contiguous()
        base = 1 + torch.arange(batch, **i32)[:, None] * self.blocks_per_request
        self.source_table = (base + torch.arange(self.blocks_per_request, **i32)).contiguous()
        self.req_id = trace.req_id_per_token(device)
        self.state_rows = torch.arange(batch, **i32)
        self.topk = trace.topk.to(device).contiguous()

        # Runtimes and slabs, group by group.
        self.group_layers = s.group_layers()
        self.runtimes: List[hisparse.Runtime] = []
        self.leaders: List[hisparse.Runtime] = []
        self.slabs: List[Any] = []
        self.layer_group: List[int] = []
        self.block_bytes = s.hot_block_size * s.row_bytes
        hint = RESIDENCY_HINT_CHOICES[s.residency_hint]
        layer = 0
        for group, size in enumerate(self.group_layers):
            slab = torch.zeros(self.num_hot_blocks * size * self.block_bytes, dtype=torch.uint8, device=device)
            self.slabs.append(slab)
            leader = None
            for i in range(size):
                runtime = hisparse.Runtime(self.config, max_num_reqs=batch, device=device,
                                           max_swap_rows=self.token_rows, leader=leader,
                                           residency_hint=hint if leader is None else None,
                                           copy_stream=copy_stream if leader is None else None)
                runtime.request_state_indices = self.state_rows
                runtime.bind_source_cache(self.host_caches[layer])
                runtime.bind_hot_cache(slab, byte_offset=i * self.block_bytes, block_stride=size * self.block_bytes,
                                       num_blocks=self.num_hot_blocks, block_size=s.hot_block_size,
                                       block_table=self.hot_table)
                if leader is None:
                    leader = runtime
                    self.leaders.append(runtime)
                self.runtimes.append(runtime)
                self.layer_group.append(group)
                layer += 1
        self._scratch = {
            name: torch.empty((self.token_rows, k), **i32)
            for name in ("attention", "hot_rows", "resolved", "miss_mask", "swap_host", "swap_device")
        }
        # The next layer's host pages are warmed beside each layer's compute.
        self.warm_pages = s.warm_host_pages == "on"
        self._warm_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._scratch_counts = torch.empty(self.token_rows, **i32)
        self._scratch_swap_counts = torch.empty(self.token_rows, **i32)
        self._snapshot: Optional[List[Any]] = None
        self._recorded: Optional[dict] = None

    # ------------------------------------------------------------------ facts
    @property
    def index_groups(self) -> int:
        return len(self.leaders)

    def group_topk(self, step: int, group: int) -> Any:
        return self.topk[step, group % self.topk.shape[1]]

    def layer_rows(self, layer: int) -> Any:
        """Layer ``layer``'s rows of its group slab: attention index a is row a."""
        group = self.layer_group[layer]
        first = sum(self.group_layers[:group])
        return self.slabs[group].view(-1, self.row_bytes)[(layer - first) * self.hot_block_size:]

    # ------------------------------------------------------------------ a decode step
    def step(self, step: int, *, swap: bool = True, prefetch: bool = False, fused: bool = False,
             followers: bool = True, compute: Optional[Callable[[], None]] = None) -> None:
        """One decode step over every layer, as an engine's forward runs it.

        ``swap``: run the data plane (leaders resolve and gather, followers
        gather); ``followers``: False leaves followers idle (isolates the
        leaders' share); ``prefetch``: the leader stages its followers on the
        group's copy stream; ``fused``: each leader copies its own rows inside
        its resolve launch (``fused_gather``) instead of a separate gather;
        ``compute``: the stand-in attention per layer; with a data plane and
        ``warm_host_pages`` on, each layer's compute has the next layer's host
        pages warmed beside it (:meth:`warm_next_layer`).
        """
        for runtime in self.runtimes:
            runtime.begin_forward()
        for layer, runtime in enumerate(self.runtimes):
            if swap:
                if runtime.is_group_leader:
                    runtime.swap_in(self.group_topk(step, self.layer_group[layer]), self.req_id,
                                    block_table=self.source_table, block_size=self.block_size, prefetch=prefetch,
                                    fused_gather=fused)
                elif followers:
                    runtime.swap_in(num_tokens=self.token_rows)
            if compute is not None:
                if swap and self.warm_pages:
                    self.warm_next_layer(layer, compute)
                else:
                    compute()

    def warm_next_layer(self, layer: int, compute: Callable[[], None]) -> None:
        """``compute()`` on the current stream, and beside it, on a second one,
        one word of every 64 KiB page of the host blocks layer ``layer + 1``
        (the first, after the last) reads: its swap then finds the GPU's
        translations of those pages warm. The current stream waits for both."""
        host_cache = self.host_caches[(layer + 1) % len(self.runtimes)]
        side = self._warm_stream
        if side is None:  # the CPU backend: no second stream, one after the other
            ops.warm_host_pages(host_cache, self.source_table, block_size=self.block_size)
            compute()
            return
        current = self.torch.cuda.current_stream(self.device)
        side.wait_stream(current)
        with self.torch.cuda.stream(side):
            ops.warm_host_pages(host_cache, self.source_table, block_size=self.block_size)
        compute()
        current.wait_stream(side)

    def resolve_only(self, step: int) -> None:
        """Residency resolution alone, per index group, on the groups' own state."""
        s = self._scratch
        for group, leader in enumerate(self.leaders):
            ops.resolve_residency(
                self.group_topk(step, group), self.req_id, self.state_rows, leader.device_global_indices,
                leader.lru_slots, self.hot_table, hot_block_size=self.hot_block_size,
                attention_block_stride=leader.attention_block_stride, host_rows=self.host_rows,
                max_union_rows=self.max_union_rows, out_attention=s["attention"], out_hot_rows=s["hot_rows"],
                out_resolved=s["resolved"], out_miss_mask=s["miss_mask"], out_valid_counts=self._scratch_counts,
                out_swap_host_rows=s["swap_host"], out_swap_device_rows=s["swap_device"],
                out_swap_counts=self._scratch_swap_counts, source_block_table=self.source_table,
                block_size=self.block_size,
            )

    def start_recording(self, steps: int) -> None:
        """Preallocate room for ``steps`` steps of every group's swap lists."""
        torch = self.torch
        shape = (steps, self.index_groups, self.token_rows)
        i32 = dict(dtype=torch.int32, device=self.device)
        self._recorded = {
            "host": torch.empty(shape + (self.top_k,), **i32),
            "device": torch.empty(shape + (self.top_k,), **i32),
            "counts": torch.empty(shape, **i32),
        }

    @property
    def recorded_steps(self) -> int:
        return int(self._recorded["counts"].shape[0]) if self._recorded else 0

    def record(self, index: int) -> None:
        """Keep the swap lists the leaders just produced (stream-ordered copies)."""
        rows = slice(0, self.token_rows)
        for group, leader in enumerate(self.leaders):
            self._recorded["host"][index, group].copy_(leader.swap_host_rows[rows])
            self._recorded["device"][index, group].copy_(leader.swap_device_rows[rows])
            self._recorded["counts"][index, group].copy_(leader.swap_counts[rows])

    def gather_recorded(self, index: int) -> None:
        """Every layer's gather_compact of recorded step ``index``: the gathers alone."""
        r = self._recorded
        first = 0
        for group, size in enumerate(self.group_layers):
            for layer in range(first, first + size):
                ops.gather_compact(self.host_caches[layer], self.layer_rows(layer), r["host"][index, group],
                                   r["device"][index, group], r["counts"][index, group],
                                   hot_block_size=self.hot_block_size, hot_block_stride=size * self.hot_block_size)
            first += size

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Cold hot buffers and zero counters in every group."""
        for leader in self.leaders:
            leader.reset_hot_state()

    def snapshot(self) -> None:
        self._snapshot = [(leader.device_global_indices.clone(), leader.lru_slots.clone()) for leader in self.leaders]

    def snapshot_state(self) -> List[Any]:
        if self._snapshot is None:
            raise RuntimeError("no snapshot taken")
        return self._snapshot

    def restore(self) -> None:
        """Hot-region state as at the last snapshot (stream-ordered copies, capturable)."""
        for leader, (dgi, lru) in zip(self.leaders, self.snapshot_state()):
            leader.device_global_indices.copy_(dgi)
            leader.lru_slots.copy_(lru)
            leader.rebuild_residency_hint()

    def counters(self) -> Any:
        """int64 [groups, 5] on the device: lookups, hits, misses, resident, invalid."""
        return self.torch.stack([leader.counters for leader in self.leaders])

    def request_misses(self) -> Any:
        """int32 [groups, batch]: rows each request's swap list loaded in the last step."""
        q = self.trace.rows_per_request
        return self.torch.stack(
            [leader.swap_counts[: self.token_rows].view(self.batch, q).sum(1) for leader in self.leaders]
        )

    def data_matches(self, group: int) -> bool:
        """Every attention-visible entry of ``group``'s last step shows its host row in every layer."""
        torch = self.torch
        leader = self.leaders[group]
        attention = leader.attention_indices[: self.token_rows].long()
        resolved = leader.resolved_slots[: self.token_rows].long()
        visible = attention >= 0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        first = sum(self.group_layers[:group])
        for layer in range(first, first + self.group_layers[group]):
            got = self.layer_rows(layer)[attention[visible]].cpu()
            want = self.host_caches[layer][resolved[visible].cpu()]
            if not torch.equal(got, want):
                return False
        return True

    def close(self) -> None:
        """Release device memory and the pinned pool (deterministically, before exit)."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        for runtime in self.runtimes:
            runtime.unbind_cache()
        self.runtimes.clear()
        self.leaders.clear()
        self.slabs.clear()
        self.host_caches = []
        self._flat = None
        self._snapshot = None
        self._recorded = None
        self.pool.release(force=True)
