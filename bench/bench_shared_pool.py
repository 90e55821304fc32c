"""Shared host pool: time to a ready pool and host memory, with 1, 2 and 4 ranks.

For each rank count N (--ranks), N processes on this host create one shared
pool of --pool-gib (hisparse.HostPool.shared from one id, each rank
populating its share and registering the whole region with --device, per
--register). The ranks start together (they wait on a gate file, so process
start-up is not timed); "ready" is from the first rank's start to the last
rank's return, and ready GB/s is the pool size over that time (DESIGN.md's
target: >= 10 GB/s). One private HostPool of the same size in one process is
timed beside them for reference.

Host memory with N ranks, while every rank holds its pool: the growth of
/proc/meminfo's Shmem (the pool's pages, counted once however many map
them) plus the growth of every rank's private anonymous memory (RssAnon),
over the pool size (target 1x; N private pools would be N x). Each rank's
Rss and Pss of its mapping are recorded too (Pss sums to the resident pages
once). Other processes that allocate shared memory meanwhile disturb the
Shmem figure: run on an otherwise idle host.

    python bench/bench_shared_pool.py --out bench/results/shared_pool_h200.json

(on an H200 host: a 32 GiB pool, or less when /dev/shm or RAM cannot hold
it; about a minute). On a machine without a GPU, a small smoke run:

    python bench/bench_shared_pool.py --pool-gib 0.25 --register never --out shared_pool_cpu.json

JSON: the command, the commit (hisparse.bench.provenance), the environment and every rank's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import hisparse
from hisparse.bench.host_memory import mapping_usage, meminfo, rss_anon
from hisparse.bench.provenance import provenance


def wait_for(path: str, timeout: float = 600) -> None:
    start = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.001)


# ---------------------------------------------------------------------- one rank


def rank_main(args: argparse.Namespace) -> None:
    """One rank: create at the start gate, report, hold the pool until the release gate."""
    anon_before = rss_anon()
    device = None if args.device < 0 else args.device
    wait_for(args.start_gate)
    start = time.time()
    if args.private:
        pool = hisparse.HostPool(args.bytes, register=args.register, device=device)
    else:
        pool = hisparse.HostPool.shared(
            args.bytes,
            pool_id=bytes.fromhex(args.pool_id),
            rank=args.rank,
            ranks=args.ranks,
            register=args.register,
            device=device,
            timeout=600,
        )
    end = time.time()
    info = pool.info()
    report = {
        "rank": args.rank,
        "start": start,
        "end": end,
        "create_seconds": end - start,
        "anon_growth": rss_anon() - anon_before,
        "mapping": mapping_usage(pool.data_ptr),
        **{
            key: info[key]
            for key in (
                "populate_seconds",
                "register_seconds",
                "wait_seconds",
                "ready_seconds",
                "populate_threads",
                "huge_pages",
                "registered",
                "num_segments",
                "share_offset",
                "share_bytes",
            )
        },
    }
    print(json.dumps(report), flush=True)
    wait_for(args.release_gate)
    release_start = time.monotonic()
    pool.release()
    print(json.dumps({"release_seconds": time.monotonic() - release_start}), flush=True)


# ---------------------------------------------------------------------- the driver


def run_case(ranks: int, size: int, args: argparse.Namespace, private: bool = False) -> dict:
    pool_id = hisparse.shared_pool_id().hex()
    with tempfile.TemporaryDirectory(prefix="hisparse-bench-") as gates:
        start_gate, release_gate = os.path.join(gates, "start"), os.path.join(gates, "release")
        shmem_before = meminfo("Shmem")
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--bytes",
            str(size),
            "--register",
            args.register,
            "--device",
            str(args.device),
            "--pool-id",
            pool_id,
            "--ranks",
            str(ranks),
            "--start-gate",
            start_gate,
            "--release-gate",
            release_gate,
        ]
        if private:
            command.append("--private")
        processes = [
            subprocess.Popen(command + ["--rank", str(rank)], stdout=subprocess.PIPE, text=True)
            for rank in range(ranks)
        ]
        time.sleep(1.0)  # every rank imported hisparse and waits at the gate
        open(start_gate, "w").close()
        reports = [json.loads(process.stdout.readline()) for process in processes]
        shmem_held = meminfo("Shmem")
        open(release_gate, "w").close()
        for process, report in zip(processes, reports):
            report.update(json.loads(process.stdout.readline()))
            process.wait(timeout=600)
            if process.returncode != 0:
                raise RuntimeError(f"a rank exited with status {process.returncode}")
    ready = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    anon = sum(max(0, r["anon_growth"]) for r in reports)
    used = shmem_held - shmem_before + anon
    return {
        "ranks": ranks,
        "pool": "private" if private else "shared",
        "ready_seconds": ready,
        "ready_gbps": size / ready / 1e9,
        "populate_seconds_max": max(r["populate_seconds"] for r in reports),
        "register_seconds_max": max(r["register_seconds"] for r in reports),
        "host_memory": {
            "shmem_growth": shmem_held - shmem_before,
            "private_growth": anon,
            "used_bytes": used,
            "used_over_pool": used / size,
            "pss_sum": sum(r["mapping"]["pss"] for r in reports),
        },
        "per_rank": reports,
    }


def shm_free() -> int:
    stats = os.statvfs("/dev/shm")
    return stats.f_bavail * stats.f_frsize


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pool-gib",
        type=float,
        default=None,
        help="pool size (default: 32, or less to fit in half of /dev/shm's free space and RAM)",
    )
    parser.add_argument("--ranks", default="1,2,4", help="rank counts, comma-separated")
    parser.add_argument("--register", default="auto", choices=("auto", "always", "never"))
    parser.add_argument("--device", type=int, default=0, help="CUDA device every rank registers with (-1: current)")
    parser.add_argument("--no-private", action="store_true", help="skip the private pool for reference")
    parser.add_argument("--out", help="write the results as JSON here")
    # One rank of a case (the driver starts these).
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--pool-id", help=argparse.SUPPRESS)
    parser.add_argument("--start-gate", help=argparse.SUPPRESS)
    parser.add_argument("--release-gate", help=argparse.SUPPRESS)
    parser.add_argument("--private", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        args.ranks = int(args.ranks)
        rank_main(args)
        return 0

    rank_counts = [int(r) for r in args.ranks.split(",") if r]
    limit = min(shm_free(), meminfo("MemAvailable")) // 2
    size = int(args.pool_gib * 2**30) if args.pool_gib is not None else min(32 << 30, limit)
    size = size // 4096 * 4096
    if size > limit:
        print(f"note: {size / 2**30:.2f} GiB is more than half of what /dev/shm and RAM have free", file=sys.stderr)
    if args.device >= 0 and args.register != "never" and hisparse._C.cuda_device_count() == 0:
        args.device = -1
    cases = [] if args.no_private else [run_case(1, size, args, private=True)]
    cases += [run_case(n, size, args) for n in rank_counts]

    print(f"pool {size / 2**30:.2f} GiB, register={args.register}")
    print(
        f"{'pool':>8} {'ranks':>5} {'ready s':>8} {'GB/s':>7} {'populate s':>10} {'register s':>10} {'memory/pool':>11}"
    )
    for case in cases:
        print(
            f"{case['pool']:>8} {case['ranks']:>5} {case['ready_seconds']:>8.3f} {case['ready_gbps']:>7.2f} "
            f"{case['populate_seconds_max']:>10.3f} {case['register_seconds_max']:>10.3f} "
            f"{case['host_memory']['used_over_pool']:>11.3f}"
        )
    if args.out:
        devices = []
        if hisparse._C.build_info()["cuda_compiled"]:
            devices = [hisparse._C.cuda_device_properties(i)["name"] for i in range(hisparse._C.cuda_device_count())]
        result = {
            **provenance(__file__),
            "environment": {
                "hisparse": hisparse.__version__,
                "build": hisparse._C.build_info(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "mem_total_bytes": meminfo("MemTotal"),
                "dev_shm_free_bytes": shm_free(),
                "devices": devices,
            },
            "pool_bytes": size,
            "register": args.register,
            "target_ready_gbps": 10.0,
            "cases": cases,
        }
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
