"""How tensors and streams cross into hisparse._C.

torch is optional: NumPy arrays run the CPU backend, torch tensors run the
backend of their device. CUDA tensors are exported with ``stream=-1`` so the
export itself never synchronises streams (a plain ``__dlpack__()`` makes the
default stream wait on the current one, which breaks CUDA-graph capture);
kernels are ordered on the stream hisparse is given instead.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

__all__ = ["torch_or_none", "export", "export_optional", "stream_handle"]


def torch_or_none():
    """The torch module if the caller's process has it importable, else None."""
    module = sys.modules.get("torch")
    if module is not None:
        return module
    try:
        import torch  # noqa: PLC0415

        return torch
    except ImportError:
        return None


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def export(value: Any, name: str) -> Any:
    """What _C receives for an array argument."""
    if _is_torch_tensor(value):
        if value.device.type == "cuda":
            return value.__dlpack__(stream=-1)
        return value
    if value is None:
        raise TypeError(f"{name}: expected a tensor, got None")
    return value


def export_optional(value: Any, name: str) -> Any:
    return None if value is None else export(value, name)


def stream_handle(stream: Any, *tensors: Any) -> int:
    """The integer stream handle for a call.

    ``stream`` may be None (torch's current stream of the tensors' CUDA
    device, or 0 for host tensors), an int handle, or a torch.cuda.Stream.
    """
    if stream is not None:
        if isinstance(stream, int):
            return stream
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:
            raise TypeError(f"stream: expected None, an int handle or a torch.cuda.Stream, got {type(stream).__name__}")
        return int(handle)
    for tensor in tensors:
        if _is_torch_tensor(tensor) and tensor.device.type == "cuda":
            import torch  # noqa: PLC0415

            return int(torch.cuda.current_stream(tensor.device).cuda_stream)
    return 0


def optional_int(value: Optional[int]) -> int:
    return -1 if value is None else int(value)
