"""hisparse.HostPool.shared and hisparse.IpcEvent with real processes
(shared_pool_worker.py runs each rank): over gloo, rank 0 writes bytes and
mirrors rows, the others read the bytes and gather the rows after waiting on
the imported event, byte for byte, with the pool's pages resident once; a
mismatched rank fails every rank at once; SIGKILL before, during and after
attach leaves /dev/shm as it was and the others get an error within the
timeout (or keep a working pool); a second pool from one id is refused; the
seed's use_shared_hisparse_host_pool conditions; argument errors. On a CUDA
machine: two processes on GPU 0 register one pool, one mirrors and records,
the other waits and gathers, also inside CUDA graphs.

Every pool here is at most 32 MiB, so the tests run where /dev/shm is
small (Docker's default is 64 MiB)."""

from __future__ import annotations

import glob
import os
import signal
import time
from types import SimpleNamespace

import pytest
import shared_pool_worker as worker

import hisparse

from conftest import requires_cuda

torch = pytest.importorskip("torch")


def leftover_objects(*creators: int) -> list:
    """The pool objects in /dev/shm of ids made by these processes (a pool's
    name holds the pid of the process that made its id)."""
    return sorted(path for pid in creators for path in glob.glob(f"/dev/shm/hisparse-pool-{pid}-*"))


def run(scenario: str, ranks: int, params: dict, timeout: float = 180) -> list:
    return [worker.outcome(process, timeout) for process in worker.launch(scenario, ranks, params)]


def mapped_pool(pid: int, least_bytes: int) -> bool:
    """True once process `pid` maps a hisparse pool object of at least `least_bytes`."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                if "hisparse-pool-" in line:
                    start, end = (int(x, 16) for x in line.split()[0].split("-"))
                    if end - start >= least_bytes:
                        return True
    except OSError:
        pass
    return False


# ---------------------------------------------------------------------- over gloo


def test_gloo_rank0_writes_the_others_read_one_host_copy():
    size, ranks = 32 << 20, 3
    results = run("gloo_share", ranks, {"size": size, "rows": 257})
    next_share, total_pss = 0, 0
    for rank, result in enumerate(results):
        assert result.get("ok") and result["returncode"] == 0, f"rank {rank}: {result}"
        info = result["info"]
        assert info["shared"] is True and info["rank"] == rank and info["ranks"] == ranks
        assert info["is_writer"] is (rank == 0) and info["writer_rank"] == 0
        assert info["size_bytes"] == size and result["released"] is True
        assert info["ready_seconds"] >= info["populate_seconds"] >= 0
        assert info["share_offset"] == next_share, "the ranks' shares must tile the pool in rank order"
        next_share += info["share_bytes"]
        assert result["wrong"] == 0, f"rank {rank} read bytes rank 0 did not write"
        if rank:
            assert result["gathered_wrong"] == 0, f"rank {rank} gathered rows that differ from rank 0's"
            assert result["event"] == {"imported": True, "exporter_is_writer": True}
        usage = result["usage"]
        assert usage["rss"] >= size, f"rank {rank} maps the whole pool"
        assert usage["private"] <= 1 << 20, f"rank {rank} holds pool pages of its own: {usage}"
        assert result["anon_growth"] < size // 2, f"rank {rank}'s private memory grew by {result['anon_growth']} B"
        total_pss += usage["pss"]
    assert next_share == size
    # One copy: every page is resident once, shared by the three mappings.
    assert size - (1 << 20) <= total_pss <= size + (1 << 20), f"the pool is resident {total_pss / size:.2f} times"
    assert not leftover_objects(results[0]["pid"])


def test_gloo_mismatched_size_fails_every_rank():
    results = run("gloo_mismatch", 2, {"size": 4 << 20})
    refused, failed = results[1], results[0]
    assert refused["type"] == "ValueError" and refused["message"].startswith("size_bytes: rank 1 was given"), refused
    assert failed["type"] == "ValueError", failed
    assert "shared host pool: rank 1 failed: size_bytes: rank 1 was given 4198400 bytes" in failed["message"]
    assert failed["seconds"] < 30, "the refusal must reach rank 0 without a timeout"
    assert not leftover_objects(failed["pid"])


# ---------------------------------------------------------------------- SIGKILL at each stage


def test_kill_before_attach_fails_the_others_at_the_timeout():
    timeout = 2.0
    params = {
        "pool_id": hisparse.shared_pool_id().hex(),
        "size": 8 << 20,
        "timeout": timeout,
        "die": "before",
        "victim": 1,
    }
    results = run("by_id", 3, params)
    assert results[1]["returncode"] == -signal.SIGKILL
    for rank in (0, 2):
        result = results[rank]
        assert result["type"] == "RuntimeError", result
        assert "without progress for rank(s) 1 to attach" in result["message"], result["message"]
        assert timeout <= result["seconds"] < timeout + 30
    assert not leftover_objects(os.getpid())


def test_kill_during_attach_fails_the_others_at_once(tmp_path):
    size = 8 << 20
    gate = tmp_path / "rank2-may-start"
    params = {"pool_id": hisparse.shared_pool_id().hex(), "size": size, "timeout": 60, "gates": {"2": str(gate)}}
    processes = worker.launch("by_id", 3, params)
    victim = processes[1]
    start = time.monotonic()
    while not mapped_pool(victim.pid, size) and time.monotonic() - start < 60:
        time.sleep(0.01)
    assert mapped_pool(victim.pid, size), "rank 1 never mapped the pool"
    time.sleep(0.3)  # it holds its slot now and waits for rank 2, which has not started
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    gate.touch()
    results = [worker.outcome(process, 120) for process in processes]
    assert results[1]["returncode"] == -signal.SIGKILL
    for rank in (0, 2):
        result = results[rank]
        assert result["type"] == "RuntimeError", result
        assert f"rank 1 (pid {victim.pid}) died during setup" in result["message"], result["message"]
    assert time.monotonic() - killed_at < 30, "a death after attach must be seen long before the 60 s timeout"
    # Whichever of ranks 0 and 2 notices the death first records it; the other learns why from the pool (which
    # one notices first is a race on a loaded machine).
    seen = {rank: "(seen by rank" in results[rank]["message"] for rank in (0, 2)}
    assert sum(seen.values()) == 1, results
    observer = 0 if seen[2] else 2
    witness = 2 if observer == 0 else 0
    assert f"(seen by rank {observer})" in results[witness]["message"], results[witness]["message"]
    assert not leftover_objects(os.getpid())


def test_kill_after_attach_leaves_the_others_a_working_pool():
    pool_id = hisparse.shared_pool_id()
    params = {"pool_id": pool_id.hex(), "size": 8 << 20, "timeout": 60, "die": "after", "victim": 1, "linger": 1.0}
    results = run("by_id", 2, params)
    assert results[1]["returncode"] == -signal.SIGKILL
    survivor = results[0]
    assert survivor.get("ok") and survivor["usable"], survivor
    assert survivor["again"].startswith("id: this process already took rank 0 of the shared pool of this id")
    assert not leftover_objects(os.getpid())


# ---------------------------------------------------------------------- one process


def test_one_rank_shared_pool_is_a_host_pool():
    pool_id = hisparse.shared_pool_id()
    assert isinstance(pool_id, bytes) and len(pool_id) == hisparse._C.SHARED_POOL_ID_BYTES
    assert hisparse.shared_pool_id() != pool_id
    pool = hisparse.HostPool.shared(3 * 4096 + 10, pool_id=pool_id, rank=0, ranks=1, register="never")
    assert isinstance(pool, hisparse.HostPool)
    assert pool.is_shared and pool.is_writer and not pool.registered
    assert "shared rank 0 of 1" in repr(pool)
    view = pool.view(torch.int32, (8,))
    assert torch.count_nonzero(view) == 0
    view.fill_(5)
    assert pool.view("int32", (8,), numpy=True).tolist() == [5] * 8
    info = pool.info()
    assert info["ranks"] == 1 and info["share_bytes"] == info["mapped_bytes"] == 4 * 4096
    with pytest.raises(RuntimeError, match=r"1 tensor view\(s\)"):
        pool.release()
    with pytest.raises(ValueError, match="id: this process already took rank 0"):
        hisparse.HostPool.shared(3 * 4096 + 10, pool_id=pool_id, rank=0, ranks=1, register="never")
    del view
    pool.release()
    assert pool.released and pool.info()["shared"]
    assert not leftover_objects(os.getpid())
    private = hisparse.HostPool(4096, register="never")
    assert not private.is_shared and private.is_writer and private.info()["ranks"] == 1
    private.release()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(size_bytes=0), ValueError, "size_bytes"),
        (dict(size_bytes="4096"), TypeError, "size_bytes"),
        (dict(register="sometimes"), ValueError, "register"),
        (dict(timeout=0), ValueError, "timeout"),
        (dict(timeout="60"), ValueError, "timeout"),
        (dict(populate_threads=0), ValueError, "populate_threads"),
        (dict(writer_rank="0"), TypeError, "writer_rank"),
        (dict(rank=0, ranks=1), ValueError, "rank, ranks: give them with pool_id"),
        (dict(pool_id=b"x" * 128), ValueError, "rank, ranks: pool_id needs"),
        (dict(pool_id="ab", rank=0, ranks=1), TypeError, "pool_id"),
        (dict(pool_id=b"x" * 5, rank=0, ranks=1), ValueError, "pool_id: expected 128 bytes, got 5"),
        (dict(pool_id=bytes(128), rank=0, ranks=1), ValueError, "id: these 128 bytes are not a shared pool id"),
        (dict(pool_id=b"x" * 128, rank=0, ranks=1, group=object()), ValueError, "group: give either"),
        (dict(pool_id="valid", rank=2, ranks=2), ValueError, r"rank: expected 0 <= rank < nranks \(2\), got 2"),
        (dict(pool_id="valid", rank=0, ranks=2, writer_rank=3), ValueError, "writer_rank"),
    ],
)
def test_shared_argument_errors_name_the_argument(kwargs, error, match):
    kwargs = {"size_bytes": 1 << 20, "register": "never", **kwargs}
    if kwargs.get("pool_id") == "valid":
        kwargs["pool_id"] = hisparse.shared_pool_id()
    size = kwargs.pop("size_bytes")
    with pytest.raises(error, match=match):
        hisparse.HostPool.shared(size, **kwargs)


def test_shared_over_a_group_needs_torch_distributed():
    if torch.distributed.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
        hisparse.HostPool.shared(1 << 20)


def test_use_shared_host_pool_follows_the_seed():
    tp2 = dict(tensor_parallel_size=2)
    assert hisparse.use_shared_host_pool(**tp2, device="cpu")
    assert not hisparse.use_shared_host_pool(tensor_parallel_size=1, device="cpu")
    assert not hisparse.use_shared_host_pool(device="cpu"), "no tensor parallelism, nothing to share"
    for name, value in [
        ("pipeline_parallel_size", 2),
        ("prefill_context_parallel_size", 2),
        ("decode_context_parallel_size", 2),
        ("world_size", 4),
        ("distributed_executor_backend", "ray"),
        ("nnodes_within_dp", 2),
    ]:
        assert not hisparse.use_shared_host_pool(**tp2, **{name: value}, device="cpu"), name
    # vLLM's ParallelConfig attribute names; keywords override them.
    config = SimpleNamespace(
        tensor_parallel_size=8,
        pipeline_parallel_size=1,
        prefill_context_parallel_size=1,
        decode_context_parallel_size=1,
        world_size=8,
        distributed_executor_backend="mp",
        nnodes_within_dp=1,
    )
    assert hisparse.use_shared_host_pool(config, device="cpu")
    assert not hisparse.use_shared_host_pool(config, world_size=16, device="cpu")
    config.distributed_executor_backend = "uni"
    assert not hisparse.use_shared_host_pool(config, device="cpu")
    cuda = hisparse._C.build_info()["cuda_compiled"] and hisparse._C.cuda_device_count() > 0
    assert hisparse.use_shared_host_pool(**tp2, device="cuda") is bool(cuda)
    assert hisparse._C.supports_shared_host_pool(hisparse._C.DEVICE_CPU)
    with pytest.raises(ValueError, match="device"):
        hisparse.use_shared_host_pool(**tp2, device="tpu")


# ---------------------------------------------------------------------- interprocess events


def test_ipc_event_crosses_processes():
    event = hisparse.IpcEvent("cpu")
    assert not event.imported and event.exporter_pid == os.getpid() and event.device == "cpu"
    event.record()  # CPU work is complete when record is called: exact no-ops
    event.wait()
    event.synchronize()
    handle = event.export()
    assert isinstance(handle, bytes) and len(handle) == hisparse._C.IPC_EVENT_HANDLE_BYTES
    (result,) = run("import_event", 1, {"handle": handle.hex()})
    assert result.get("ok"), result
    assert result["imported"] is True and result["exporter_pid"] == os.getpid() and result["device"] == "cpu"
    assert "an imported event cannot be exported again" in result["again"]


def test_ipc_event_refusals():
    event = hisparse.IpcEvent("cpu")
    with pytest.raises(ValueError, match="handle: this event was exported by this process"):
        hisparse.IpcEvent.from_bytes(event.export())
    with pytest.raises(ValueError, match="handle: expected 128 bytes, got 5"):
        hisparse.IpcEvent.from_bytes(b"12345")
    with pytest.raises(ValueError, match="handle: these 128 bytes are not an interprocess event handle"):
        hisparse.IpcEvent.from_bytes(bytes(128))
    with pytest.raises(TypeError, match="handle"):
        hisparse.IpcEvent.from_bytes(event.export().hex())
    with pytest.raises(ValueError, match="device"):
        hisparse.IpcEvent("tpu")
    with pytest.raises(TypeError, match="stream"):
        event.record(stream="now")
    if not (hisparse._C.build_info()["cuda_compiled"] and hisparse._C.cuda_device_count() > 0):
        with pytest.raises(RuntimeError):
            hisparse.IpcEvent("cuda")


# ---------------------------------------------------------------------- CUDA: two processes on GPU 0


@requires_cuda
@pytest.mark.sanitize
def test_cuda_two_processes_mirror_record_wait_gather():
    writer, reader = run("cuda_mirror_wait_gather", 2, {"size": 16 << 20, "rows": 4099}, timeout=600)
    assert writer.get("ok") and writer["returncode"] == 0, writer
    assert reader.get("ok") and reader["returncode"] == 0, reader
    assert writer["registered"] and reader["registered"], "both processes register the shared region"
    assert writer["is_writer"] and not reader["is_writer"]
    assert reader["wrong"] == 0, "the reader gathered bytes the writer had not mirrored yet"
    assert not leftover_objects(writer["pid"])


@requires_cuda
@pytest.mark.sanitize
def test_cuda_ipc_event_record_and_wait_inside_cuda_graphs():
    writer, reader = run("cuda_graph_record_wait", 2, {"size": 16 << 20, "rows": 1000}, timeout=600)
    assert writer.get("ok") and writer["returncode"] == 0, writer
    assert reader.get("ok") and reader["returncode"] == 0, reader
    assert reader["wrong"] == [0, 0], "a replayed wait must order the replayed gather after the writer's replay"
    assert not leftover_objects(writer["pid"])
