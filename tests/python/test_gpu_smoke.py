"""On a GPU: a HostPool registered with the device, and a CUDA kernel reading
it zero-copy (hisparse.ops.copy_bytes). Skipped without a CUDA device."""

from __future__ import annotations

import mmap

import pytest

import hisparse
from hisparse import ops

from conftest import requires_cuda

torch = pytest.importorskip("torch")

PAGE = mmap.PAGESIZE

pytestmark = requires_cuda


def random_bytes(n: int, seed: int) -> "torch.Tensor":
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator)


def test_registered_pool_records_its_segment():
    with hisparse.HostPool(1 << 20, register="always") as pool:
        info = pool.info()
        assert info["registered"] and pool.registered
        assert info["device"] == torch.cuda.current_device()
        assert info["num_segments"] == 1
        assert pool.segments() == [(pool.data_ptr, info["mapped_bytes"])]
        assert info["register_seconds"] > 0
    assert pool.released and not pool.info()["registered"]


def test_copy_from_registered_pool_into_device_memory():
    size = 4 << 20
    source = random_bytes(size, seed=1)
    with hisparse.HostPool(size, register="always") as pool:
        view = pool.view(torch.uint8, (size,))
        view.copy_(source)
        destination = torch.zeros(size, dtype=torch.uint8, device="cuda")
        ops.copy_bytes(destination, view)
        torch.cuda.synchronize()
        assert torch.equal(destination.cpu(), source)

        # A sub-range at an odd offset, into a tensor of another dtype.
        part = pool.view(torch.uint8, (4096,), offset=12345)
        words = torch.zeros(1024, dtype=torch.int32, device="cuda")
        ops.copy_bytes(words, part)
        torch.cuda.synchronize()
        assert words.cpu().view(torch.uint8).tolist() == source[12345 : 12345 + 4096].tolist()
        del view, part


def test_copy_on_a_side_stream():
    size = 1 << 16
    source = random_bytes(size, seed=2)
    with hisparse.HostPool(size, register="always") as pool:
        view = pool.view(torch.uint8, (size,))
        view.copy_(source)
        destination = torch.zeros(size, dtype=torch.uint8, device="cuda")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ops.copy_bytes(destination, view)
        stream.synchronize()
        assert torch.equal(destination.cpu(), source)
        del view


def test_device_to_device_copy():
    source = random_bytes(1 << 16, seed=3).cuda()
    destination = torch.empty_like(source)
    ops.copy_bytes(destination, source)
    torch.cuda.synchronize()
    assert torch.equal(destination, source)


def test_copy_from_unregistered_host_memory_raises():
    source = torch.arange(4096, dtype=torch.uint8)  # pageable, not registered
    destination = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="src"):
        ops.copy_bytes(destination, source)
    # The error left CUDA usable.
    ops.copy_bytes(destination, source.pin_memory())
    torch.cuda.synchronize()
    assert torch.equal(destination.cpu(), source)


def test_small_segments_register_separately_and_copy_across_boundaries():
    segment = 4 * PAGE
    size = 10 * PAGE + 100
    source = random_bytes(size, seed=4)
    pool = hisparse.HostPool(size, register="always", max_segment_bytes=segment)
    info = pool.info()
    assert info["num_segments"] == 3
    segments = pool.segments()
    assert segments == [
        (pool.data_ptr, segment),
        (pool.data_ptr + segment, segment),
        (pool.data_ptr + 2 * segment, 3 * PAGE),
    ]
    view = pool.view(torch.uint8, (size,))
    view.copy_(source)
    destination = torch.zeros(size, dtype=torch.uint8, device="cuda")
    ops.copy_bytes(destination, view)
    torch.cuda.synchronize()
    assert torch.equal(destination.cpu(), source)
    del view
    pool.release()
    assert pool.released and pool.segments() == []


def test_config_device_check():
    config = hisparse.Config(row_bytes=656)
    config.check_device(torch.device("cuda", 0))
    config.check_device(0)
    # Every valid shape runs (a resolver workspace where shared memory is short).
    hisparse.Config(top_k=32767, device_buffer_size=32767, row_bytes=656).check_device(0)
