"""hisparse.torch_ops: the decode-path ops as torch custom ops. torch.library.opcheck
passes on each (schema with its mutated arguments, fake implementation,
autograd registration, AOT dispatch); a decode step of a KV cache (write, swap
in, read, a sparse attention over the rows) compiles with fullgraph=True (no
graph break) and gives the eager step's results; reads refuse bad indices
before allocating their rows; importing hisparse does not import torch_ops."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hisparse

from conftest import requires_cuda

torch = pytest.importorskip("torch")
torch_ops = pytest.importorskip("hisparse.torch_ops")

I32 = torch.int32
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def make_cache(device, max_swap_rows=None):
    config = hisparse.Config(top_k=8, device_buffer_size=16, row_width=16, dtype=torch.float32, block_size=8,
                             hot_block_size=4)
    cache = hisparse.KVCache(config, num_layers=2, layer_groups=[0, 0], max_requests=2, max_seq_len=64,
                             device=device, max_swap_rows=max_swap_rows)
    for _ in range(2):
        cache.admit()
    return cache


def prefill(cache, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d = cache.device
    req = torch.cat([torch.full((n,), r, dtype=I32) for r, n in enumerate(lengths)]).to(d)
    positions = torch.cat([torch.arange(n, dtype=I32) for n in lengths]).to(d)
    cache.begin_forward(torch.tensor(lengths, dtype=I32, device=d))
    for layer in range(cache.num_layers):
        cache.write(layer, torch.randn((len(req), 16), generator=gen).to(d), req, positions)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_passes_on_every_op(device):
    cache = make_cache(device, max_swap_rows=64)
    prefill(cache, [20, 12])
    d = cache.device
    handle = torch_ops.cache_id(cache)
    assert torch_ops.cache_id(cache) == handle
    lengths = torch.tensor([21, 13], dtype=I32, device=d)
    req = torch.tensor([0, 1], dtype=I32, device=d)
    positions = torch.tensor([20, 12], dtype=I32, device=d)
    rows = torch.randn((2, 16), device=d)
    topk = torch.tensor([[20, 3, 5, -1, 7], [12, 0, 1, 2, 11]], dtype=I32, device=d)
    state = cache.table("seq_lens")
    group = torch_ops.kv_step_args(cache, 0)
    hs = torch.ops.hisparse
    torch.library.opcheck(hs.kv_begin_forward.default, (handle, lengths, state))
    torch.library.opcheck(hs.kv_write.default, (handle, 0, rows, req, positions, group["slab"]))
    torch.library.opcheck(hs.kv_swap_in.default,
                          (handle, 0, topk, req, 0, 5, True, group["slab"], group["device_global_indices"]))
    attention = hs.kv_swap_in(handle, 0, topk, req, 0, 5, True, group["slab"], group["device_global_indices"])
    torch.library.opcheck(hs.kv_read.default, (handle, 0, attention, group["slab"]))
    torch.library.opcheck(hs.read_rows.default, (cache.layer_view(0), attention))
    hot = torch.zeros((3, 4, 16), device=d)
    dgi = torch.full((2, 8), -1, dtype=I32, device=d)
    dgi[0, 1] = 20
    # opcheck runs the op on copies of its arguments, and a copy of pinned
    # memory is not pinned: on CUDA the host store is checked by the direct call.
    host = torch.zeros((64, 16)) if d.type == "cpu" else torch.zeros((64, 16)).pin_memory()
    write_args = (rows, req, positions, torch.tensor([0, 1], dtype=I32, device=d), host, None, 0, None, None, hot,
                  torch.tensor([[1, 2], [0, 0]], dtype=I32, device=d), dgi)
    torch.library.opcheck(hs.write_rows.default, write_args if d.type == "cpu" else (*write_args[:4], None,
                                                                                   *write_args[5:]))
    hs.write_rows(*write_args)
    if d.type == "cuda":
        torch.cuda.synchronize()
    # Slot 20: the host row, and the hot copy in slot 1 (block 1, row 1).
    assert torch.equal(host[20], rows[0].cpu()) and torch.equal(hot[1, 1].cpu(), rows[0].cpu())


def sparse_attention(query, rows, valid):
    scores = torch.einsum("td,tkd->tk", query, rows) / 4.0
    scores = scores.masked_fill(~valid, float("-inf"))
    return torch.einsum("tk,tkd->td", torch.softmax(scores, dim=-1), rows)


def decode_step(handle, lengths, req, positions, new_rows, topk, query, state, slab, dgi):
    """One decode step of a 2-layer group through the custom ops."""
    hs = torch.ops.hisparse
    hs.kv_begin_forward(handle, lengths, state)
    outputs = []
    for layer in range(2):
        hs.kv_write(handle, layer, new_rows[layer], req, positions, slab)
        if layer == 0:
            attention = hs.kv_swap_in(handle, 0, topk, req, 0, topk.shape[1], True, slab, dgi)
        else:
            attention = hs.kv_swap_in(handle, 1, None, None, topk.shape[0], topk.shape[1], True, slab, dgi)
        rows = hs.kv_read(handle, layer, attention, slab)
        outputs.append(sparse_attention(query, rows, attention >= 0))
    return torch.stack(outputs)


@pytest.mark.parametrize(("device", "backend"), [
    ("cpu", "aot_eager"),
    pytest.param("cpu", "inductor", marks=pytest.mark.slow),
    pytest.param("cuda", "inductor", marks=requires_cuda),
])
def test_a_compiled_decode_step_has_no_graph_break_and_matches_eager(device, backend):
    """fullgraph=True fails on any graph break; the states of the two caches
    (hits, misses) agree, so a copy of the state a tracer hands an op is not
    copied back over the op's changes."""
    torch._dynamo.reset()
    eager_cache, compiled_cache = make_cache(device), make_cache(device)
    for cache in (eager_cache, compiled_cache):
        prefill(cache, [20, 12])
    d = eager_cache.device
    compiled = torch.compile(decode_step, fullgraph=True, backend=backend)
    gen = torch.Generator().manual_seed(3)
    lengths = [20, 12]
    req = torch.tensor([0, 1], dtype=I32, device=d)
    for _ in range(5):
        lengths = [n + 1 for n in lengths]
        lengths_t = torch.tensor(lengths, dtype=I32, device=d)
        positions = torch.tensor([n - 1 for n in lengths], dtype=I32, device=d)
        new_rows = torch.randn((2, 2, 16), generator=gen).to(d)
        topk = torch.stack([torch.randint(0, n, (6,), generator=gen, dtype=I32) for n in lengths]).to(d)
        topk[:, 0] = positions  # the newest row: written by the follower after its leader resolved
        query = torch.randn((2, 16), generator=gen).to(d)
        results = []
        for cache, step in ((eager_cache, decode_step), (compiled_cache, compiled)):
            args = torch_ops.kv_step_args(cache, 0)
            results.append(step(torch_ops.cache_id(cache), lengths_t, req, positions, new_rows, topk, query,
                                cache.table("seq_lens"), args["slab"], args["device_global_indices"]))
        torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-6)
    assert eager_cache.stats()["total"] == compiled_cache.stats()["total"]


def test_importing_hisparse_does_not_import_torch_ops():
    code = "import sys, hisparse; print('hisparse.torch_ops' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_reads_refuse_bad_indices_before_allocating_their_rows():
    cache = make_cache("cpu")
    broadcast = torch.zeros(1, dtype=I32).expand(1 << 20, 1 << 16)  # 2**36 rows of 64 bytes, were it allocated
    with pytest.raises(ValueError, match="indices: expected stride 1 in dimension 1, got 0"):
        torch.ops.hisparse.read_rows(torch.zeros(5, 4, 16), broadcast)
    with pytest.raises(ValueError, match="indices: expected stride 1 in dimension 1, got 0"):
        cache.read(0, broadcast)
    with pytest.raises(ValueError, match=r"indices: expected 2 dimensions \[T, k\], got shape \(4,\)"):
        cache.read(0, torch.zeros(4, dtype=I32))
    with pytest.raises(ValueError, match=r"cache: expected a paged view .* got shape \(\)"):
        torch.ops.hisparse.read_rows(torch.tensor(1.0), torch.zeros(1, 1, dtype=I32))
