"""Timing that works on both backends.

CUDA: work is captured once into a CUDA graph and replayed; CUDA events
around each replay give device time without Python launch overhead, and a
``restore`` callback runs before every replay, outside the timed window.
CPU: the backend runs kernels synchronously on the calling thread, so
``time.perf_counter`` around the call is the time. Either way the figure is
the median over repetitions, after one untimed warm-up.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from .provenance import command_line

__all__ = ["Timer", "memcpy_bandwidth", "sleep_cycles_per_us", "environment", "synchronize"]


def synchronize(device: Any) -> None:
    if device.type == "cuda":
        import torch  # noqa: PLC0415

        torch.cuda.synchronize(device)


class Timer:
    """Median seconds of a piece of device work, by the device's best clock."""

    def __init__(self, device: Any, *, use_graphs: bool = True, stream: Any = None) -> None:
        """``stream``: the CUDA stream graphs are captured on (None: a new one)."""
        import torch  # noqa: PLC0415

        self.torch = torch
        self.device = device
        self.use_graphs = use_graphs and device.type == "cuda"
        self._stream = (stream or torch.cuda.Stream(device)) if device.type == "cuda" else None

    def time(
        self, work: Callable[[], None], *, repeats: int, restore: Optional[Callable[[], None]] = None
    ) -> Dict[str, Any]:
        """Seconds of ``work``: median, min, max and all samples (warm-up excluded)."""
        if self.device.type == "cuda":
            samples = self._time_cuda(work, repeats, restore)
        else:
            samples = self._time_host(work, repeats, restore)
        return {
            "median_s": statistics.median(samples),
            "min_s": min(samples),
            "max_s": max(samples),
            "samples_s": samples,
            "clock": "cuda-graph+events" if self.use_graphs else ("cuda-events" if self._stream else "perf_counter"),
        }

    def _time_host(self, work: Callable[[], None], repeats: int, restore: Optional[Callable[[], None]]) -> List[float]:
        samples = []
        for index in range(repeats + 1):
            if restore is not None:
                restore()
            start = time.perf_counter()
            work()
            elapsed = time.perf_counter() - start
            if index:
                samples.append(elapsed)
        return samples

    def _time_cuda(self, work: Callable[[], None], repeats: int, restore: Optional[Callable[[], None]]) -> List[float]:
        torch = self.torch
        graph = None
        if self.use_graphs:
            # Warm-up outside capture (lazy initialisation), then capture.
            if restore is not None:
                restore()
            work()
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self._stream):
                work()
            torch.cuda.synchronize(self.device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        samples = []
        for index in range(repeats + 1):
            if restore is not None:
                restore()
            start.record()
            if graph is not None:
                graph.replay()
            else:
                work()
            end.record()
            end.synchronize()
            if index:
                samples.append(start.elapsed_time(end) * 1e-3)
        del graph
        return samples


def memcpy_bandwidth(host_bytes: Any, device: Any, *, nbytes: int, repeats: int = 10) -> Dict[str, Any]:
    """The link's ceiling: one contiguous copy of ``nbytes`` from ``host_bytes``.

    CUDA: pinned (registered) host memory to the device, the figure every
    gather is compared with. CPU: host memory to host memory, the ceiling of
    the CPU backend's gather (which copies with the CPU).
    """
    import torch  # noqa: PLC0415

    nbytes = min(nbytes, host_bytes.numel())
    source = host_bytes[:nbytes]
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    timer = Timer(device, use_graphs=False)
    if device.type == "cuda":
        timing = timer.time(lambda: target.copy_(source, non_blocking=True), repeats=repeats)
        kind = "pinned host-to-device cudaMemcpy (contiguous)"
    else:
        timing = timer.time(lambda: target.copy_(source), repeats=repeats)
        kind = "host-to-host memcpy (contiguous; the CPU backend has no copy engine)"
    return {"kind": kind, "bytes": nbytes, "seconds": timing["median_s"], "gbps": nbytes / timing["median_s"] / 1e9}


def sleep_cycles_per_us(device: Any) -> float:
    """Clock cycles per microsecond of ``torch.cuda._sleep`` (the stand-in attention)."""
    import torch  # noqa: PLC0415

    cycles = 2_000_000
    timer = Timer(device, use_graphs=False)
    torch.cuda._sleep(cycles)
    timing = timer.time(lambda: torch.cuda._sleep(cycles), repeats=5)
    return cycles / (timing["median_s"] * 1e6)


def environment(device: Any) -> Dict[str, Any]:
    """Where the figures come from: device, versions, build and command line."""
    import os  # noqa: PLC0415

    import torch  # noqa: PLC0415

    import hisparse  # noqa: PLC0415

    build = hisparse._C.build_info()
    env: Dict[str, Any] = {
        "device": str(device),
        "backend": "cuda" if device.type == "cuda" else "cpu (reference kernels)",
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "hisparse": hisparse.__version__,
        "hisparse_build": {k: build[k] for k in sorted(build) if isinstance(build[k], (str, int, float, bool))},
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "available_host_memory_bytes": hisparse._C.available_host_memory(),
        "command": command_line(),
        "argv": list(sys.argv),
        "started_unix": time.time(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu_memory_bytes"] = props.total_memory
        env["gpu_multiprocessors"] = props.multi_processor_count
    return env
