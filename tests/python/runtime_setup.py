"""An index group of runtimes for the runtime tests: one leader and followers,
per-layer host caches (pinned on CUDA), and one device slab in which every
layer's hot view lies, interleaved block by block like an engine's shared KV
slab. Block ids: 0 unused, then each state row's hot blocks, then each state
row's resident blocks."""

from __future__ import annotations

import torch

import hisparse


def host_memory(tensor, device):
    """`tensor` in host memory a kernel of `device` can read (pinned on CUDA)."""
    return tensor.pin_memory() if device.type == "cuda" else tensor.clone()


def random_bytes(shape, gen):
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)


class GroupSetup:
    def __init__(self, device, *, num_layers=2, top_k=8, hot_size=32, max_union_rows=None, row_bytes=64,
                 block_size=8, hot_block_size=4, max_num_reqs=4, max_swap_rows=None, host_rows=256,
                 resident_blocks_per_req=0, eager_host_mirror=False, residency_hint=None, seed=0):
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        self.config = hisparse.Config(
            top_k=top_k, device_buffer_size=hot_size, max_union_rows=max_union_rows or top_k, row_bytes=row_bytes,
            block_size=block_size, hot_block_size=hot_block_size, eager_host_mirror=eager_host_mirror,
        )
        self.num_layers = num_layers
        self.max_num_reqs = max_num_reqs
        self.row_bytes = row_bytes
        self.hot_block_size = hot_block_size
        self.hot_blocks_per_req = -(-hot_size // hot_block_size)
        self.resident_blocks_per_req = resident_blocks_per_req
        self.num_blocks = 1 + max_num_reqs * (self.hot_blocks_per_req + resident_blocks_per_req)
        self.block_bytes = hot_block_size * row_bytes
        self.block_stride = num_layers * self.block_bytes
        leader = hisparse.Runtime(self.config, max_num_reqs=max_num_reqs, device=device, max_swap_rows=max_swap_rows,
                                  residency_hint=residency_hint)
        self.runtimes = [leader] + [
            hisparse.Runtime(self.config, max_num_reqs=max_num_reqs, leader=leader) for _ in range(num_layers - 1)
        ]
        self.hosts = [host_memory(random_bytes((host_rows, row_bytes), self.gen), device) for _ in range(num_layers)]
        self.slab = torch.zeros(self.num_blocks * self.block_stride, dtype=torch.uint8, device=device)
        self.hot_table = torch.zeros((max_num_reqs, self.hot_blocks_per_req), dtype=torch.int32, device=device)
        self.request_state_indices = torch.full((max_num_reqs,), -1, dtype=torch.int32, device=device)
        for runtime in self.runtimes:
            runtime.request_state_indices = self.request_state_indices
        self.bind()

    @property
    def leader(self):
        return self.runtimes[0]

    def bind(self):
        for i, runtime in enumerate(self.runtimes):
            runtime.bind_source_cache(self.hosts[i])
            runtime.bind_hot_cache(self.slab, byte_offset=i * self.block_bytes, block_stride=self.block_stride,
                                   num_blocks=self.num_blocks, block_size=self.hot_block_size,
                                   block_table=self.hot_table)

    def hot_blocks(self, state_row):
        first = 1 + state_row * self.hot_blocks_per_req
        return torch.arange(first, first + self.hot_blocks_per_req, dtype=torch.int32)

    def resident_block(self, state_row, index=0):
        return 1 + self.max_num_reqs * self.hot_blocks_per_req + state_row * self.resident_blocks_per_req + index

    def set_batch(self, state_rows):
        """Batch row b serves state row state_rows[b] (-1 = padding): state and hot table."""
        rows = torch.full((self.max_num_reqs,), -1, dtype=torch.int32)
        table = torch.zeros((self.max_num_reqs, self.hot_blocks_per_req), dtype=torch.int32)
        for b, s in enumerate(state_rows):
            rows[b] = s
            if s >= 0:
                table[b] = self.hot_blocks(s)
        self.request_state_indices.copy_(rows)
        self.hot_table.copy_(table)

    def layer_rows(self, layer, slab=None):
        """Layer `layer`'s view of the slab as rows: attention index a is row a."""
        slab = self.slab if slab is None else slab
        return slab.view(-1, self.row_bytes)[layer * self.hot_block_size:]

    def begin_forward(self):
        for runtime in self.runtimes:
            runtime.begin_forward()

    def swap_all(self, topk, req_ids, *, prefetch, **kwargs):
        """One step of every layer in order; returns the leader's attention indices."""
        attention = self.leader.swap_in(topk, req_ids, prefetch=prefetch, **kwargs)
        for follower in self.runtimes[1:]:
            follower.swap_in(num_tokens=topk.shape[0])
        return attention

    def visible_rows_match(self, first_row, num_rows):
        """True when every attention-visible entry of the rows shows, in every
        layer, the host row it stands for (synchronises)."""
        rows = slice(first_row, first_row + num_rows)
        attention = self.leader.attention_indices[rows].long()
        resolved = self.leader.resolved_slots[rows].long()
        visible = attention >= 0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for layer in range(self.num_layers):
            got = self.layer_rows(layer)[attention[visible]].cpu()
            want = self.hosts[layer][resolved[visible].cpu()]
            if not torch.equal(got, want):
                return False
        return True


def capture_cuda_graph(capture, warm_up):
    """Runs `warm_up()` on a side stream (as torch.cuda.graph expects), then
    captures `capture()` in a CUDA graph. Returns the graph and what the
    captured call returned (its output tensors, refreshed by each replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm_up()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = capture()
    torch.cuda.synchronize()
    return graph, outputs


def capture_graphed_step(step, graphed, static):
    """Captures `step(graphed, static)` in a CUDA graph after a warm-up step,
    after which the graphed group is put back into its initial state (hot
    state reset, slab zeroed) so that it starts like an eager one."""

    def warm_up():
        step(graphed, static)
        graphed.leader.reset_hot_state()
        graphed.slab.zero_()

    return capture_cuda_graph(lambda: step(graphed, static), warm_up)
