"""One rank of a KV cache over a shared host pool, run as its own process.

    python kv_shared_worker.py SCENARIO RANK RANKS PARAMS_JSON

prints one JSON line with what the rank saw; ``run(scenario, ranks, params)``
starts the ranks (test_kv_cache.py does) and returns their results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable

import shared_pool_worker
import torch

import hisparse

I32 = torch.int32
LAYER_GROUPS = [0, 0, 1]
MAX_REQUESTS, MAX_SEQ_LEN, ROW_WIDTH = 2, 48, 16


def cache_arguments() -> tuple:
    config = hisparse.Config(top_k=6, device_buffer_size=8, row_width=ROW_WIDTH, dtype=torch.float32, block_size=8,
                             hot_block_size=4)
    sizes = dict(num_layers=len(LAYER_GROUPS), layer_groups=LAYER_GROUPS, max_requests=MAX_REQUESTS,
                 max_seq_len=MAX_SEQ_LEN)
    return config, sizes


def writer_rows(layer: int, req: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The rows the writer stores (a function of layer, request and position, the same on every rank)."""
    base = (layer * 1000 + req * 100 + positions).to(torch.float32).unsqueeze(-1)
    return base + torch.arange(ROW_WIDTH, dtype=torch.float32) / 64


def kv_shared(rank: int, ranks: int, params: dict) -> dict:
    """Both ranks build a KV cache over one shared pool with the writer's
    interprocess event. Every forward, both write their rows; the reader's
    are different bytes, which must never reach the pool. After a barrier
    (which orders the writer's host stores before the reader's gathers),
    both resolve the same top-k and read: every row is the writer's."""
    dist = shared_pool_worker.init_gloo(rank, ranks, params)
    config, sizes = cache_arguments()
    pool = hisparse.HostPool.shared(hisparse.KVCache.host_bytes(config, **sizes), populate_threads=1, timeout=60)
    message: list = [None]
    if rank == 0:
        event = hisparse.IpcEvent("cpu")
        message = [event.export()]
    dist.broadcast_object_list(message, src=0)
    if rank != 0:
        event = hisparse.IpcEvent.from_bytes(message[0])
    cache = hisparse.KVCache(config, **sizes, host_pool=pool, host_event=event)
    writer = cache.is_writer
    result: dict = {"is_writer": writer, "host_wrong": 0, "read_wrong": 0}

    def rows_of(layer, req, positions):
        rows = writer_rows(layer, req, positions)
        return rows if writer else -rows - 1

    for _ in range(MAX_REQUESTS):
        cache.admit()
    lengths = [10, 17]
    req = torch.cat([torch.full((n,), r, dtype=I32) for r, n in enumerate(lengths)])
    positions = torch.cat([torch.arange(n, dtype=I32) for n in lengths])
    cache.begin_forward(torch.tensor(lengths, dtype=I32))
    for layer in range(len(LAYER_GROUPS)):
        cache.write(layer, rows_of(layer, req, positions), req, positions)
    gen = torch.Generator().manual_seed(11)
    req = torch.arange(MAX_REQUESTS, dtype=I32)
    for _ in range(params["steps"]):
        lengths = [n + 1 for n in lengths]
        positions = torch.tensor([n - 1 for n in lengths], dtype=I32)
        topk = torch.stack([torch.randint(0, n, (6,), generator=gen, dtype=I32) for n in lengths])
        cache.begin_forward(torch.tensor(lengths, dtype=I32))
        for layer in range(len(LAYER_GROUPS)):
            cache.write(layer, rows_of(layer, req, positions), req, positions)
        dist.barrier()
        for layer in range(len(LAYER_GROUPS)):
            if cache.leader_of(layer) == layer:
                attention = cache.swap_in(layer, topk, req)
            else:
                attention = cache.swap_in(layer, num_tokens=MAX_REQUESTS)
            rows = cache.read(layer, attention)
            want = writer_rows(layer, req.unsqueeze(1).expand_as(topk), topk)
            result["read_wrong"] += int((rows != want).any(dim=-1).sum())
            del attention, rows
        dist.barrier()
    # The pool holds the writer's rows only.
    host = cache.host_cache
    for layer in range(len(LAYER_GROUPS)):
        for r, n in enumerate(lengths):
            slots = cache.table("source_block_table")[r].long()
            p = torch.arange(n)
            host_slots = slots[p // config.block_size] * config.block_size + p % config.block_size
            want = writer_rows(layer, torch.full((n,), r), p)
            result["host_wrong"] += int((host[host_slots, layer] != want).any(dim=-1).sum())
    result["misses"] = cache.stats()["total"]["misses"]
    if not cache.is_writer:
        runtime = hisparse.Runtime(config, max_num_reqs=1)
        runtime.bind_source_cache(host[:, 0])
        try:
            runtime.mirror_rows(torch.zeros((1, ROW_WIDTH)), torch.zeros(1, dtype=I32))
            result["mirror_refused"] = False
        except RuntimeError as error:
            result["mirror_refused"] = "reads the shared host pool" in str(error)
        runtime.unbind_cache()
    dist.barrier()
    del cache
    pool.release(force=True)
    result["ok"] = True
    return result


SCENARIOS: dict = {"kv_shared": kv_shared}


def run(scenario: str, ranks: int, params: dict, timeout: float = 180) -> list:
    params = {"port": shared_pool_worker.free_port(), **params}
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    processes = [
        subprocess.Popen([sys.executable, __file__, scenario, str(rank), str(ranks), json.dumps(params)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(ranks)
    ]
    return [shared_pool_worker.outcome(process, timeout) for process in processes]


def main(argv: list) -> int:
    scenario, rank, ranks, params = argv[0], int(argv[1]), int(argv[2]), json.loads(argv[3])
    run_rank: Callable[..., Any] = SCENARIOS[scenario]
    print(json.dumps(run_rank(rank, ranks, params)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
