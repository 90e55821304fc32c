"""Shared fixtures and markers: the devices a test runs on.

Every kernel test runs on the CPU backend; on a machine with a CUDA device
the same test also runs on CUDA, where results are compared bit for bit with
the CPU reference.

Markers (registered in pyproject.toml):
- ``cuda``: needs a CUDA device and the CUDA backend; skipped here, centrally,
  where there is none. ``requires_cuda`` is this marker, and the CUDA case of
  the ``device`` fixture carries it, so ``-m cuda`` selects every CUDA case.
- ``slow``: takes more than about a second on a 2-core CPU machine (a fresh
  interpreter, a soak); ``-m "not slow"`` is the quick loop.
- ``sanitize``: the small CUDA cases scripts/gpu_check.sh runs under
  compute-sanitizer (``sanitize_subset``).
"""

import functools
import os

import pytest

torch = pytest.importorskip("torch")

CUDA_SKIP_REASON = "needs a CUDA device and the CUDA backend"


@functools.cache
def cuda_available() -> bool:
    if not torch.cuda.is_available():
        return False
    import hisparse

    return hisparse._C.build_info()["cuda_compiled"] and hisparse._C.cuda_device_count() > 0


DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)] if cuda_available() else [])
requires_cuda = pytest.mark.cuda


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Skip every `cuda`-marked test when this machine cannot run it, and,
    with HISPARSE_TEST_SHARD=i/N, keep shard i of N of what -m and -k
    selected (every N-th test from the i-th; scripts/gpu_check.sh runs the
    shards side by side)."""
    keep_shard(config, items, os.environ.get("HISPARSE_TEST_SHARD", ""))
    if cuda_available():
        return
    skip = pytest.mark.skip(reason=CUDA_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def keep_shard(config, items, shard: str) -> None:
    """Deselects all but shard i of N ("i/N", 0 <= i < N) of `items`, in
    collection order; an empty `shard` keeps them all."""
    if not shard:
        return
    index, _, count = shard.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise pytest.UsageError(f"HISPARSE_TEST_SHARD: expected i/N with 0 <= i < N, got {shard!r}")
    index, count = int(index), int(count)
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % count != index])
    items[:] = [item for k, item in enumerate(items) if k % count == index]


def sanitize_subset(values, picked):
    """Parametrize values, with the `picked` ones also marked for the
    compute-sanitizer runs of scripts/gpu_check.sh (memcheck and racecheck are
    10-100x slower, so they see a few small cases of each kernel)."""
    def param(value):
        # A tuple holds the values of several argument names.
        args = value if isinstance(value, tuple) else (value,)
        return pytest.param(*args, marks=pytest.mark.sanitize)

    return [param(v) if v in picked else v for v in values]


def resolver_workspace(device, num_state_rows: int, hot_size: int, max_union_rows: int):
    """The workspace a resolve of this shape needs on `device` (None on the
    CPU and where the CUDA resolver's arrays fit shared memory), filled with
    garbage: its contents must not matter."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    from hisparse import ops

    size = ops.resolver_workspace_bytes(num_state_rows, hot_size, max_union_rows, device)
    return torch.randint(0, 256, (size,), dtype=torch.uint8, device=device) if size else None


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)
