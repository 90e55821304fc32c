"""One rank of a shared-host-pool scenario, run as its own process.

    python shared_pool_worker.py SCENARIO RANK RANKS PARAMS_JSON

prints one JSON line with what the rank saw. test_shared_host_pool.py starts
the ranks; ``python shared_pool_worker.py run SCENARIO RANKS [PARAMS_JSON]``
starts them itself and prints every rank's line (exit status 0 when every
rank passed), which is how the CUDA scenarios run under compute-sanitizer:

    compute-sanitizer --tool memcheck --target-processes all \\
        python tests/python/shared_pool_worker.py run cuda_mirror_wait_gather 2
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

import hisparse
from hisparse import ops
from hisparse.bench.host_memory import mapping_usage, rss_anon

ROW_BYTES = 656  # DeepSeek-V3.2 FP8 MLA


# ---------------------------------------------------------------------- probes


def pattern(start: int, stop: int) -> np.ndarray:
    """The bytes rank 0 writes at offsets [start, stop)."""
    offsets = np.arange(start, stop, dtype=np.uint64)
    return ((offsets * np.uint64(2654435761)) >> np.uint64(13)).astype(np.uint8)


def rows_and_slots(count: int, host_rows: int, seed: int) -> tuple:
    """The rows the writer mirrors and the distinct host slots they go to (same on every rank)."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, size=(count, ROW_BYTES), dtype=np.uint8)
    slots = rng.choice(host_rows, size=count, replace=False).astype(np.int32)
    return rows, slots


def init_gloo(rank: int, ranks: int, params: dict) -> Any:
    from datetime import timedelta  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{params['port']}",
        rank=rank,
        world_size=ranks,
        timeout=timedelta(seconds=120),
    )
    return dist


# ---------------------------------------------------------------------- scenarios


def gloo_share(rank: int, ranks: int, params: dict) -> dict:
    """HostPool.shared over gloo: rank 0 writes bytes, then mirrors rows and
    records an event; the others read the bytes and, after waiting on the
    imported event, gather the rows into their own hot cache."""
    import torch  # noqa: PLC0415

    dist = init_gloo(rank, ranks, params)
    size = params["size"]
    raw = size // 2
    anon_before = rss_anon()
    pool = hisparse.HostPool.shared(size, register="never", populate_threads=1, timeout=60)
    info = pool.info()
    view = pool.view("uint8", (raw,), numpy=True)
    step = 1 << 18
    if rank == 0:
        for start in range(0, raw, step):
            view[start : start + step] = pattern(start, min(start + step, raw))
    dist.barrier()
    wrong = sum(
        int(np.count_nonzero(view[start : start + step] != pattern(start, min(start + step, raw))))
        for start in range(0, raw, step)
    )

    host_rows = (size - raw) // ROW_BYTES
    host = pool.view(torch.uint8, (host_rows, ROW_BYTES), offset=raw)
    rows, slots = rows_and_slots(params["rows"], host_rows, seed=17)
    message: list = [None]
    if rank == 0:
        event = hisparse.IpcEvent("cpu")
        ops.mirror_rows(torch.from_numpy(rows), host, torch.from_numpy(slots))
        event.record()
        message = [(event.export(), os.getpid())]
    dist.broadcast_object_list(message, src=0)
    gathered_wrong = -1
    event_info: dict = {}
    if rank != 0:
        handle, writer_pid = message[0]
        event = hisparse.IpcEvent.from_bytes(handle)
        event.wait()
        count = len(slots)
        hot = torch.zeros((count, ROW_BYTES), dtype=torch.uint8)
        ops.gather_compact(
            host,
            hot,
            torch.from_numpy(slots).reshape(1, count),
            torch.arange(count, dtype=torch.int32).reshape(1, count),
            torch.tensor([count], dtype=torch.int32),
            hot_block_size=count,
        )
        gathered_wrong = int(np.count_nonzero(hot.numpy() != rows))
        event_info = {"imported": event.imported, "exporter_is_writer": event.exporter_pid == writer_pid}
    # Every rank reads a byte of every page, as registration would map them
    # all: then each page is mapped by every rank and counts once in all.
    whole = pool.view("uint8", numpy=True)
    int(whole[::4096].sum())
    del whole
    dist.barrier()
    usage = mapping_usage(pool.data_ptr)
    anon_growth = rss_anon() - anon_before
    dist.barrier()  # nobody unmaps before everybody measured
    del view, host
    pool.release()
    dist.barrier()
    dist.destroy_process_group()
    return {
        "ok": True,
        "wrong": wrong,
        "gathered_wrong": gathered_wrong,
        "event": event_info,
        "usage": usage,
        "anon_growth": anon_growth,
        "info": {
            key: info[key]
            for key in (
                "shared",
                "rank",
                "ranks",
                "writer_rank",
                "is_writer",
                "share_offset",
                "share_bytes",
                "size_bytes",
                "populate_seconds",
                "ready_seconds",
            )
        },
        "released": pool.released,
    }


def gloo_mismatch(rank: int, ranks: int, params: dict) -> dict:
    """HostPool.shared over gloo where the last rank asks for another size."""
    init_gloo(rank, ranks, params)
    size = params["size"] + (4096 if rank == ranks - 1 else 0)
    start = time.monotonic()
    try:
        hisparse.HostPool.shared(size, register="never", timeout=60)
        return {"ok": True}
    except Exception as error:  # noqa: BLE001 - reported to the test
        return {"ok": False, "type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}


def by_id(rank: int, ranks: int, params: dict) -> dict:
    """HostPool.shared from an id given on the command line (no torch). The
    victim rank dies where params["die"] says: "before" (it never calls
    create) or "after" (once create returned); a rank with a file in
    params["gates"] calls create once that file exists."""
    pool_id = bytes.fromhex(params["pool_id"])
    if params.get("die") == "before" and rank == params["victim"]:
        os.kill(os.getpid(), signal.SIGKILL)
    gate = params.get("gates", {}).get(str(rank))
    while gate is not None and not os.path.exists(gate):
        time.sleep(0.01)
    start = time.monotonic()
    try:
        pool = hisparse.HostPool.shared(
            params["size"], pool_id=pool_id, rank=rank, ranks=ranks, register="never", timeout=params["timeout"]
        )
    except Exception as error:  # noqa: BLE001 - reported to the test
        return {"ok": False, "type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}
    if params.get("die") == "after" and rank == params["victim"]:
        print(json.dumps({"created": True}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(params.get("linger", 0))  # the victim dies meanwhile: the pool must still work
    view = pool.view("uint8", numpy=True)
    view[rank] = rank + 1
    usable = int(view[rank]) == rank + 1
    try:
        hisparse.HostPool.shared(params["size"], pool_id=pool_id, rank=rank, ranks=ranks, register="never")
        again = "accepted"
    except ValueError as error:
        again = str(error)
    del view
    pool.release()
    return {"ok": True, "usable": usable, "again": again, "seconds": time.monotonic() - start}


def import_event(rank: int, ranks: int, params: dict) -> dict:
    """Import an event another process exported; try to export it again."""
    event = hisparse.IpcEvent.from_bytes(bytes.fromhex(params["handle"]))
    event.wait()
    event.record()
    event.synchronize()
    try:
        event.export()
        again = "accepted"
    except RuntimeError as error:
        again = str(error)
    return {
        "ok": True,
        "imported": event.imported,
        "exporter_pid": event.exporter_pid,
        "device": event.device,
        "again": again,
    }


def cuda_pool(rank: int, ranks: int, params: dict) -> tuple:
    """(dist, pool, host rows [N, ROW_BYTES] over the pool): a shared pool that both ranks register with GPU 0."""
    import torch  # noqa: PLC0415

    dist = init_gloo(rank, ranks, params)
    torch.cuda.set_device(0)
    size = params.get("size", 16 << 20)
    pool = hisparse.HostPool.shared(size, register="always", device=0, timeout=120)
    return dist, pool, pool.view(torch.uint8, (size // ROW_BYTES, ROW_BYTES))


def cuda_mirror_wait_gather(rank: int, ranks: int, params: dict) -> dict:
    """Two processes on GPU 0 register one shared pool. Rank 0 mirrors rows
    into it on its stream behind a long kernel and records an event; rank 1
    waits on the imported event on its own stream, gathers the rows into its
    hot cache and checks them byte for byte. Rank 1 gets the event before
    rank 0's GPU work is done: only the wait orders the gather after it."""
    import torch  # noqa: PLC0415

    dist, pool, host = cuda_pool(rank, ranks, params)
    rows, slots = rows_and_slots(params.get("rows", 4099), host.shape[0], seed=23)
    count = len(slots)
    stream = torch.cuda.Stream()
    message: list = [None]
    with torch.cuda.stream(stream):
        if rank == 0:
            event = hisparse.IpcEvent("cuda:0")
            source = torch.from_numpy(rows).cuda()
            mapping = torch.from_numpy(slots).cuda()
            torch.cuda._sleep(params.get("sleep_cycles", 500_000_000))  # keeps the mirror pending
            ops.mirror_rows(source, host, mapping)
            event.record()
            message = [event.export()]
        dist.broadcast_object_list(message, src=0)
        wrong = -1
        if rank == 1:
            event = hisparse.IpcEvent.from_bytes(message[0], device=0)
            hot = torch.zeros((count, ROW_BYTES), dtype=torch.uint8, device="cuda")
            swap_host = torch.from_numpy(slots).reshape(1, count).cuda()
            swap_device = torch.arange(count, dtype=torch.int32, device="cuda").reshape(1, count)
            counts = torch.tensor([count], dtype=torch.int32, device="cuda")
            event.wait()
            ops.gather_compact(host, hot, swap_host, swap_device, counts, hot_block_size=count)
            stream.synchronize()
            wrong = int(np.count_nonzero(hot.cpu().numpy() != rows))
    torch.cuda.synchronize()
    dist.barrier()  # rank 0's event outlives rank 1's use of it
    info = pool.info()
    del host
    pool.release()
    dist.destroy_process_group()
    return {"ok": True, "wrong": wrong, "registered": info["registered"], "is_writer": info["is_writer"]}


def cuda_graph_record_wait(rank: int, ranks: int, params: dict) -> dict:
    """As cuda_mirror_wait_gather, with rank 0's mirror and record and rank
    1's wait and gather captured into CUDA graphs and replayed for two
    rounds of rows."""
    import torch  # noqa: PLC0415

    dist, pool, host = cuda_pool(rank, ranks, params)
    host_rows = host.shape[0]
    count = params.get("rows", 1000)
    _, slots = rows_and_slots(count, host_rows, seed=29)
    stream = torch.cuda.Stream()
    wrong = []
    with torch.cuda.stream(stream):
        mapping = torch.from_numpy(slots).cuda()
        message: list = [None]
        if rank == 0:
            event = hisparse.IpcEvent("cuda:0")
            source = torch.zeros((count, ROW_BYTES), dtype=torch.uint8, device="cuda")
            message = [event.export()]
        dist.broadcast_object_list(message, src=0)
        if rank == 1:
            event = hisparse.IpcEvent.from_bytes(message[0], device=0)
            hot = torch.zeros((count, ROW_BYTES), dtype=torch.uint8, device="cuda")
            swap_device = torch.arange(count, dtype=torch.int32, device="cuda").reshape(1, count)
            counts = torch.tensor([count], dtype=torch.int32, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            if rank == 0:
                ops.mirror_rows(source, host, mapping)
                event.record()
            else:
                event.wait()
                ops.gather_compact(host, hot, mapping.reshape(1, count), swap_device, counts, hot_block_size=count)
        for round_ in range(2):
            rows, _ = rows_and_slots(count, host_rows, seed=100 + round_)
            if rank == 0:
                source.copy_(torch.from_numpy(rows))
                torch.cuda._sleep(params.get("sleep_cycles", 300_000_000))
                graph.replay()
            dist.barrier()  # rank 0 launched its replay (and so its record) before rank 1 replays its wait
            if rank == 1:
                graph.replay()
                stream.synchronize()
                wrong.append(int(np.count_nonzero(hot.cpu().numpy() != rows)))
            torch.cuda.synchronize()
            dist.barrier()
    del host
    pool.release()
    dist.destroy_process_group()
    return {"ok": True, "wrong": wrong}


SCENARIOS: dict = {
    "gloo_share": gloo_share,
    "gloo_mismatch": gloo_mismatch,
    "by_id": by_id,
    "import_event": import_event,
    "cuda_mirror_wait_gather": cuda_mirror_wait_gather,
    "cuda_graph_record_wait": cuda_graph_record_wait,
}


# ---------------------------------------------------------------------- launching


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(scenario: str, ranks: int, params: dict) -> list:
    """Starts every rank of `scenario`; a fresh port when the params have none."""
    params = {"port": free_port(), **params}
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    return [
        subprocess.Popen(
            [sys.executable, __file__, scenario, str(rank), str(ranks), json.dumps(params)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(ranks)
    ]


def outcome(process: subprocess.Popen, timeout: float) -> dict:
    """The rank's last JSON line, with its exit status (killed on timeout)."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return {"ok": False, "hung": True, "pid": process.pid, "stderr": err[-2000:]}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False}
    result["pid"] = process.pid
    result["returncode"] = process.returncode
    result["stderr"] = err[-2000:]
    return result


def main(argv: list) -> int:
    if argv[0] == "run":
        scenario, ranks = argv[1], int(argv[2])
        params = json.loads(argv[3]) if len(argv) > 3 else {}
        results = [outcome(process, 600) for process in launch(scenario, ranks, params)]
        for rank, result in enumerate(results):
            print(json.dumps({"rank": rank, **result}))
        return 0 if all(result.get("ok") and result.get("returncode") == 0 for result in results) else 1
    scenario, rank, ranks, params = argv[0], int(argv[1]), int(argv[2]), json.loads(argv[3])
    run: Callable = SCENARIOS[scenario]
    print(json.dumps(run(rank, ranks, params)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
