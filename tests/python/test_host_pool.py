"""hisparse.HostPool from Python: zero-copy views through torch and NumPy,
bounds, lifetime (views keep the pool alive, release refused while they
live, force, idempotence, use after release, garbage collection, context
manager), setup figures and the RAM refusal."""

from __future__ import annotations

import gc
import mmap

import numpy as np
import pytest

import hisparse

torch = pytest.importorskip("torch")

PAGE = mmap.PAGESIZE


def mapped(address: int, size: int) -> bool:
    """True when any byte of [address, address + size) is mapped in this process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start < address + size and address < end:
                return True
    return False


def no_cuda_device() -> bool:
    return not (hisparse._C.build_info()["cuda_compiled"] and hisparse._C.cuda_device_count() > 0)


@pytest.fixture
def pool():
    p = hisparse.HostPool(1 << 20, register="never")
    yield p
    p.release(force=True)


# ---------------------------------------------------------------------- views


def test_torch_round_trip_with_dtype_shape_offset(pool):
    values = torch.arange(128, dtype=torch.int32).reshape(16, 8)
    view = pool.view(torch.int32, (16, 8), offset=4096)
    assert isinstance(view, torch.Tensor)
    assert view.dtype == torch.int32 and view.shape == (16, 8) and view.device.type == "cpu"
    assert view.data_ptr() == pool.data_ptr + 4096
    assert torch.count_nonzero(view) == 0, "a new pool is zero-filled"
    view.copy_(values)

    again = pool.view("int32", (128,), offset=4096, numpy=True)
    assert isinstance(again, np.ndarray)
    np.testing.assert_array_equal(again, np.arange(128, dtype=np.int32))
    raw = pool.view(np.uint8, (512,), offset=4096, numpy=True)
    assert raw.tobytes() == np.arange(128, dtype=np.int32).tobytes()
    untouched = pool.view(torch.uint8, (4096,))
    assert torch.count_nonzero(untouched) == 0


def test_numpy_writes_are_seen_by_torch(pool):
    rows = pool.view(np.float32, (4, 164), offset=656, numpy=True)
    rows[2] = np.linspace(0, 1, 164, dtype=np.float32)
    seen = pool.view(torch.float32, (164,), offset=656 + 2 * 164 * 4)
    assert seen.numpy().tobytes() == rows[2].tobytes()
    seen[0] = 42.0
    assert rows[2, 0] == 42.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int64, torch.uint8])
def test_torch_only_dtypes(pool, dtype):
    view = pool.view(dtype, (3, 5), offset=64)
    assert view.dtype == dtype and view.shape == (3, 5)
    view.view(torch.uint8).fill_(0x3C)
    assert pool.view(np.uint8, (view.element_size() * 15,), offset=64, numpy=True).tolist() == [0x3C] * (
        view.element_size() * 15
    )


def test_default_shape_covers_whole_elements():
    with hisparse.HostPool(4099, register="never") as p:
        assert p.view().shape == (4099,)
        assert p.view("int32").shape == (1024,)
        assert p.view("int32", offset=8).shape == (1022,)
        assert p.view("int64", numpy=True).shape == (512,)


def test_bounds_are_checked(pool):
    size = pool.nbytes
    pool.view("uint8", (size,))  # exactly the pool is fine
    pool.view("uint8", (0,), offset=size)
    with pytest.raises(ValueError, match="exceeds the pool"):
        pool.view("uint8", (size + 1,))
    with pytest.raises(ValueError, match="exceeds the pool"):
        pool.view("int32", (4,), offset=size - 12)
    with pytest.raises(ValueError, match="exceeds the pool"):
        pool.view("uint8", offset=size + 1)
    with pytest.raises(ValueError, match="offset"):
        pool.view("int32", (4,), offset=2)
    with pytest.raises(ValueError, match="offset"):
        pool.view("uint8", (4,), offset=-1)
    with pytest.raises(ValueError, match="shape"):
        pool.view("uint8", (2, -1))
    with pytest.raises(TypeError, match="offset"):
        pool.view("uint8", (4,), offset=1.0)
    with pytest.raises(TypeError, match="shape"):
        pool.view("uint8", (2.0, 2))
    with pytest.raises(TypeError, match="shape"):
        pool.view("uint8", "4")
    with pytest.raises(TypeError, match="dtype"):
        pool.view("no-such-dtype", (4,))
    with pytest.raises(TypeError, match="dtype"):
        pool.view(torch.bfloat16, (4,), numpy=True)
    assert pool._pool.live_views == 0, "failed views must not count as live"


# ---------------------------------------------------------------------- lifetime


def test_views_keep_the_pool_alive():
    p = hisparse.HostPool(3 * PAGE + 5, register="never")
    address, size = p.data_ptr, p.info()["mapped_bytes"]
    view = p.view(torch.int32, (16,))
    view.fill_(11)
    del p
    gc.collect()
    assert mapped(address, size), "the pool was unmapped under a live view"
    assert view.tolist() == [11] * 16
    del view
    gc.collect()
    assert not mapped(address, size), "dropping the last view of an unreferenced pool must release it"


def test_release_refused_while_views_live(pool):
    view = pool.view(torch.uint8, (16,))
    numpy_view = pool.view("uint8", (16,), numpy=True)
    with pytest.raises(RuntimeError, match=r"2 tensor view\(s\)"):
        pool.release()
    assert not pool.released
    assert pool._pool.live_views == 2
    del view
    with pytest.raises(RuntimeError, match=r"1 tensor view\(s\)"):
        pool.release()
    del numpy_view
    pool.release()
    assert pool.released


def test_force_release_with_live_views():
    # A forced release releases the pool for hisparse at once and unmaps it
    # with its last view: the view never shows unmapped memory.
    p = hisparse.HostPool(1 << 16, register="never")
    address = p.data_ptr
    view = p.view(torch.uint8, (16,))
    view.fill_(5)
    p.release(force=True)
    assert p.released
    assert mapped(address, 1 << 16), "a live view's memory was unmapped"
    assert view.tolist() == [5] * 16
    with pytest.raises(RuntimeError, match="released"):
        p.view("uint8", (4,))
    with pytest.raises(RuntimeError, match="src: .*released"):
        hisparse.ops.copy_bytes(torch.zeros(16, dtype=torch.uint8), view)
    p.release()  # already released: nothing to do
    del view
    gc.collect()
    assert p._pool.live_views == 0
    assert not mapped(address, 1 << 16), "the last view of a released pool unmaps it"


def test_release_is_idempotent_and_use_after_release_raises():
    p = hisparse.HostPool(1 << 16, register="never")
    p.release()
    p.release()
    p.release(force=True)
    assert p.released
    with pytest.raises(RuntimeError, match="released"):
        _ = p.data_ptr
    with pytest.raises(RuntimeError, match="released"):
        p.view("uint8", (4,))
    info = p.info()
    assert info["released"] and info["size_bytes"] == 1 << 16
    assert "released" in repr(p)


def test_context_manager_releases():
    with hisparse.HostPool(1 << 16, register="never") as p:
        address = p.data_ptr
        assert not p.released
        assert mapped(address, 1 << 16)
    assert p.released
    assert not mapped(address, 1 << 16)


def test_context_manager_releases_on_error():
    with pytest.raises(KeyError):
        with hisparse.HostPool(1 << 16, register="never") as p:
            raise KeyError("boom")
    assert p.released


def test_garbage_collection_releases_the_pool():
    p = hisparse.HostPool(5 * PAGE + 123, register="never")
    address, size = p.data_ptr, p.info()["mapped_bytes"]
    assert mapped(address, size)
    del p
    gc.collect()
    assert not mapped(address, size)


# ---------------------------------------------------------------------- figures and errors


def test_info_figures():
    size = 64 * PAGE + 100
    with hisparse.HostPool(size, populate_threads=2, register="never") as p:
        info = p.info()
        assert info["size_bytes"] == size == p.nbytes
        assert info["mapped_bytes"] == 65 * PAGE
        assert p.data_ptr % PAGE == 0
        assert info["released"] is False and info["registered"] is False and p.registered is False
        assert info["device"] == -1 and info["num_segments"] == 0 and p.segments() == []
        assert info["populate_threads"] == 1, "a pool under 64 MiB populates on one thread"
        assert info["populate_seconds"] >= 0 and info["register_seconds"] == 0
        assert "unregistered" in repr(p)
    with hisparse.HostPool(128 << 20, populate_threads=2, register="never") as p:
        assert p.info()["populate_threads"] == 2


def test_ram_refusal_message():
    available = hisparse.layout.available_host_memory()
    too_big = available + (64 << 30)
    with pytest.raises(ValueError) as error:
        hisparse.HostPool(too_big)
    message = str(error.value)
    assert f"~{too_big / 2**30:.0f} GiB" in message
    assert "GiB of RAM is available" in message and "size_bytes" in message and "host_pool_gib" not in message


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(size_bytes=0), ValueError, "size_bytes"),
        (dict(size_bytes=-5), ValueError, "size_bytes"),
        (dict(size_bytes="4096"), TypeError, "size_bytes"),
        (dict(size_bytes=4096.0), TypeError, "size_bytes"),
        (dict(size_bytes=4096, register="sometimes"), ValueError, "register"),
        (dict(size_bytes=4096, populate_threads=0), ValueError, "populate_threads"),
        (dict(size_bytes=4096, populate_threads="2"), TypeError, "populate_threads"),
        (dict(size_bytes=4096, device=-1), ValueError, "device"),
        (dict(size_bytes=4096, max_segment_bytes=1000), ValueError, "max_segment_bytes"),
        (dict(size_bytes=4096, max_segment_bytes=-PAGE), ValueError, "max_segment_bytes"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs, error, name):
    size = kwargs.pop("size_bytes")
    with pytest.raises(error, match=name):
        hisparse.HostPool(size, **kwargs)


@pytest.mark.skipif(not no_cuda_device(), reason="a CUDA device is present")
def test_register_always_without_a_device_fails_cleanly():
    with pytest.raises(RuntimeError, match="registration"):
        hisparse.HostPool(1 << 16, register="always")
    p = hisparse.HostPool(1 << 16, register="auto")  # auto quietly skips registration
    assert not p.registered
    p.release()


def test_pools_alive_at_interpreter_exit_are_released_cleanly():
    # A pool (with a live view) still referenced at exit is released by the
    # atexit hook; the interpreter must exit normally, not crash in teardown.
    import subprocess
    import sys

    code = """
import atexit
pools = []
# Registered before hisparse's own hook, so it runs after it.
atexit.register(lambda: print("released at exit:", [p.released for p in pools]))
import hisparse
pools.append(hisparse.HostPool(1 << 20))
pools.append(hisparse.HostPool(1 << 16, register="never"))
view = pools[0].view("uint8", (16,), numpy=True)
view[:] = 1
print("exiting")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["exiting", "released", "at", "exit:", "[True,", "True]"]
    assert result.stderr == ""


@pytest.mark.slow
def test_torch_views_alive_at_interpreter_exit_report_no_leak():
    # torch may keep a tensor until after nanobind checks for leaked
    # instances at teardown. The view's owner holds the pool's C++ state,
    # not the Python object, so that check finds nothing of ours alive.
    import subprocess
    import sys

    code = """
import hisparse, torch
pool = hisparse.HostPool(1 << 20, register="never")
view = pool.view(torch.int32, (16,))
view.fill_(3)
print(int(view.sum()))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["48"]
    assert result.stderr == ""
