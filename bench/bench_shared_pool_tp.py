"""Tensor-parallel ranks of one host on one shared host pool: one host copy, rows written by one rank, read by all.

One process per rank (rank r on GPU r; ``--same-device`` puts every rank on
GPU 0, which checks the program on a machine with one GPU; NCCL refuses two
ranks on one GPU, so that run is gloo only). torch.distributed carries the
engine's collectives (NCCL on CUDA) and, over a gloo group, the
shared pool's id, the IPC event's handle and the barriers that order the
ranks' host-side calls. The ranks create one ``hisparse.HostPool.shared`` of
``--pool-gib``, each populating its share and registering the whole region
with its own GPU. Then, per round:

1. rank 0 (the writer) mirrors ``--rows`` rows from its GPU into random host
   slots of the pool (``ops.mirror_rows``) behind a long kernel, and records
   an IPC event on its stream;
2. a barrier orders the host calls, every reader waits on the imported event
   on its own stream (no host sync) and gathers those rows into its own hot
   cache (``ops.gather_compact``), and checks every byte against the rows the
   writer wrote (both sides draw them from the round's seed).

Measured in the same run: host memory used with N ranks (growth of
/proc/meminfo's Shmem plus every rank's private RssAnon growth, over the pool
size: 1.0 is one copy), the pool's ready time in GB/s of pool size (first
rank's start to last rank's return), and each rank's gather bandwidth of
``--gather-rows`` random 656-byte rows against its own pinned memcpy, first
one rank at a time, then all ranks at once (the host's memory and PCIe are
shared: the ratio of the two is what N ranks cost each other).

    python bench/bench_shared_pool_tp.py --ranks 2 --pool-gib 32 --out bench/results/shared_pool_tp_2xh200.json
    python bench/bench_shared_pool_tp.py --ranks 2 --same-device --pool-gib 4   # one GPU, two processes
    python bench/bench_shared_pool_tp.py --device cpu --ranks 2 --pool-gib 0.0625   # CPU backend, gloo only

The JSON carries the command, the commit (hisparse.bench.provenance), the
environment and every rank's figures; the run fails (exit 1) when any byte
read differs from what the writer wrote.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from datetime import timedelta
from typing import Any, Dict, List

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import hisparse
from hisparse import ops
from hisparse.bench.host_memory import meminfo, rss_anon
from hisparse.bench.provenance import provenance

ROW_BYTES = 656


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2, help="processes (tensor-parallel ranks)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--same-device", action="store_true", help="every rank on GPU 0 (one-GPU check)")
    parser.add_argument("--pool-gib", type=float, default=32.0, help="shared pool size")
    parser.add_argument("--rows", type=int, default=4096, help="rows the writer mirrors per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gather-rows", type=int, default=6528, help="random rows of the bandwidth measurement")
    parser.add_argument("--iters", type=int, default=20, help="timed gathers per measurement (median)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    for name in ("ranks", "rows", "rounds", "gather_rows", "iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    if not args.pool_gib > 0:
        parser.error(f"--pool-gib: expected a positive size, got {args.pool_gib}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device (use --device cpu for the CPU backend)")
        if not args.same_device and torch.cuda.device_count() < args.ranks:
            parser.error(
                f"--ranks {args.ranks}: one GPU per rank, but {torch.cuda.device_count()} are visible "
                "(--same-device puts every rank on GPU 0)"
            )
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def round_rows(round_: int, host_rows: int, count: int) -> tuple:
    """The rows the writer writes in ``round_`` and their distinct host slots (drawn alike on every rank)."""
    rng = np.random.default_rng(1000 + round_)
    rows = rng.integers(0, 256, size=(count, ROW_BYTES), dtype=np.uint8)
    slots = rng.choice(host_rows, size=count, replace=False).astype(np.int32)
    return rows, slots


class Rank:
    def __init__(self, rank: int, args: argparse.Namespace, port: int) -> None:
        self.rank, self.args = rank, args
        self.cuda = args.device == "cuda"
        if self.cuda:
            self.gpu = 0 if args.same_device else rank
            torch.cuda.set_device(self.gpu)
            self.device = torch.device("cuda", self.gpu)
        else:
            self.gpu, self.device = -1, torch.device("cpu")
        # NCCL refuses two ranks on one GPU, so --same-device runs the engine's group over gloo as well.
        nccl = self.cuda and not args.same_device
        dist.init_process_group(
            "nccl" if nccl else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=args.ranks,
            timeout=timedelta(seconds=300),
            **({"device_id": self.device} if nccl else {}),
        )
        # Host-side ordering and small objects travel over gloo, as an engine's CPU group would.
        self.host_group = dist.new_group(backend="gloo") if nccl else dist.group.WORLD

    def barrier(self) -> None:
        dist.barrier(group=self.host_group)

    def gather_all(self, value: Any) -> List[Any]:
        out: List[Any] = [None] * self.args.ranks
        dist.all_gather_object(out, value, group=self.host_group)
        return out

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ pool
    def create_pool(self) -> Dict[str, Any]:
        size = int(self.args.pool_gib * 2**30) // ROW_BYTES * ROW_BYTES
        shmem_before, anon_before = meminfo("Shmem"), rss_anon()
        self.barrier()
        start = time.time()
        register = "always" if self.cuda else "never"
        self.pool = hisparse.HostPool.shared(
            size, group=self.host_group, register=register, device=self.gpu if self.cuda else None
        )
        ready = time.time()
        self.host = self.pool.view(torch.uint8, (size // ROW_BYTES, ROW_BYTES))
        self.barrier()
        figures = {
            "start": start,
            "ready": ready,
            "anon_growth": rss_anon() - anon_before,
            "shmem_growth": meminfo("Shmem") - shmem_before,
            "info": self.pool.info(),
        }
        everyone = self.gather_all(figures)
        ranks_ready = max(f["ready"] for f in everyone) - min(f["start"] for f in everyone)
        # Shmem counts the region once for the whole host; every rank sees the same growth.
        used = everyone[0]["shmem_growth"] + sum(max(f["anon_growth"], 0) for f in everyone)
        return {
            "pool_bytes": size,
            "ready_seconds": ranks_ready,
            "ready_gbps": size / ranks_ready / 1e9,
            "host_memory_bytes": used,
            "host_memory_over_pool": used / size,
            "per_rank": [
                {k: f["info"].get(k) for k in ("rank", "populate_seconds", "register_seconds", "ready_seconds")}
                for f in everyone
            ],
        }

    # ------------------------------------------------------------------ rounds
    def write_and_read(self) -> Dict[str, Any]:
        host_rows = self.host.shape[0]
        count = self.args.rows
        hot = torch.zeros((count, ROW_BYTES), dtype=torch.uint8, device=self.device)
        swap_device = torch.arange(count, dtype=torch.int32, device=self.device).reshape(1, count)
        counts = torch.tensor([count], dtype=torch.int32, device=self.device)
        stream = torch.cuda.Stream(self.device) if self.cuda else None
        event = hisparse.IpcEvent(self.device) if self.rank == 0 else None
        handles = [event.export() if event is not None else None]
        dist.broadcast_object_list(handles, src=0, group=self.host_group)
        if self.rank != 0:
            event = hisparse.IpcEvent.from_bytes(handles[0], device=self.device)
        wrong = []
        for round_ in range(self.args.rounds):
            rows, slots = round_rows(round_, host_rows, count)
            mapping = torch.from_numpy(slots).to(self.device)
            if self.rank == 0:
                source = torch.from_numpy(rows).to(self.device)
                with torch.cuda.stream(stream) if self.cuda else _nothing():
                    if self.cuda:
                        torch.cuda._sleep(200_000_000)  # the mirror is still pending when the readers wait
                    ops.mirror_rows(source, self.host, mapping)
                    event.record()
            self.barrier()  # the writer's record is enqueued before any reader's wait
            if self.rank != 0:
                with torch.cuda.stream(stream) if self.cuda else _nothing():
                    event.wait()
                    ops.gather_compact(self.host, hot, mapping.reshape(1, count), swap_device, counts,
                                       hot_block_size=count)
                if stream is not None:
                    stream.synchronize()
                wrong.append(int(np.count_nonzero(hot.cpu().numpy() != rows)))
            self.synchronize()
            self.barrier()  # the writer rewrites the pool only after every reader's gather
        return {"rounds": self.args.rounds, "rows_per_round": count, "wrong_bytes": self.gather_all(wrong)}

    # ------------------------------------------------------------------ bandwidth
    def bandwidth(self) -> Dict[str, Any]:
        if not self.cuda:
            return {}
        count = self.args.gather_rows
        rng = np.random.default_rng(7 + self.rank)
        slots = torch.from_numpy(rng.choice(self.host.shape[0], size=count, replace=False).astype(np.int32))
        swap_host = slots.to(self.device).reshape(1, count)
        swap_device = torch.arange(count, dtype=torch.int32, device=self.device).reshape(1, count)
        counts = torch.tensor([count], dtype=torch.int32, device=self.device)
        hot = torch.empty((count, ROW_BYTES), dtype=torch.uint8, device=self.device)
        contiguous = self.host.reshape(-1)[: 256 << 20]
        target = torch.empty(contiguous.shape, dtype=torch.uint8, device=self.device)

        def timed(fn, nbytes: int) -> float:
            fn()
            self.synchronize()
            times = []
            for _ in range(self.args.iters):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop) * 1e-3)
            return nbytes / sorted(times)[len(times) // 2] / 1e9

        def gather():
            ops.gather_compact(self.host, hot, swap_host, swap_device, counts, hot_block_size=count)

        def memcpy():
            target.copy_(contiguous, non_blocking=True)

        memcpy_gbps = alone = None
        for turn in range(self.args.ranks):  # one rank at a time
            self.barrier()
            if turn == self.rank:
                memcpy_gbps = timed(memcpy, contiguous.numel())
                alone = timed(gather, count * ROW_BYTES)
        self.barrier()  # then all at once
        together = timed(gather, count * ROW_BYTES)
        self.barrier()
        return {
            "gpu": self.gpu,
            "rows": count,
            "memcpy_gbps": memcpy_gbps,
            "gather_alone_gbps": alone,
            "gather_together_gbps": together,
            "alone_over_memcpy": alone / memcpy_gbps,
            "together_over_memcpy": together / memcpy_gbps,
            "together_over_alone": together / alone,
        }

    def close(self) -> None:
        self.synchronize()
        del self.host
        self.pool.release()
        dist.destroy_process_group()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def rank_main(rank: int, args: argparse.Namespace, port: int, results: Any) -> None:
    r = Rank(rank, args, port)
    pool = r.create_pool()
    rounds = r.write_and_read()
    bandwidth = r.gather_all(r.bandwidth())
    r.close()
    if rank == 0:
        results.put({"pool": pool, "rounds": rounds, "bandwidth": bandwidth})


def main(argv=None) -> int:
    args = parse_args(argv)
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(rank_main, args=(args, free_port(), results), nprocs=args.ranks, start_method="spawn")
    result = results.get()
    wrong = sum(sum(per_rank) for per_rank in result["rounds"]["wrong_bytes"])
    pool = result["pool"]
    placement = "the CPU backend" if args.device == "cpu" else "GPU 0" if args.same_device else "one GPU each"
    print(f"{args.ranks} ranks on {placement}, "
          f"pool {pool['pool_bytes'] / 2**30:.2f} GiB: ready in {pool['ready_seconds']:.2f} s "
          f"({pool['ready_gbps']:.1f} GB/s), host memory {pool['host_memory_over_pool']:.3f} x the pool")
    print(f"rounds: {args.rounds} x {args.rows} rows written by rank 0, read by the others: {wrong} wrong bytes")
    for b in result["bandwidth"]:
        if b:
            print(f"  GPU {b['gpu']}: memcpy {b['memcpy_gbps']:.1f} GB/s, gather {b['gather_alone_gbps']:.1f} alone "
                  f"({b['alone_over_memcpy']:.2f}), {b['gather_together_gbps']:.1f} with every rank "
                  f"({b['together_over_memcpy']:.2f}; {b['together_over_alone']:.2f} of alone)")
    if args.out:
        environment = {
            "hisparse": hisparse.__version__,
            "torch": torch.__version__,
            "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available() else [],
            "mem_total_bytes": meminfo("MemTotal"),
        }
        out = {"benchmark": "shared pool, tensor-parallel ranks", **provenance(__file__), "config": vars(args),
               "environment": environment, **result}
        with open(args.out, "w") as handle:
            json.dump(out, handle, indent=2)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
