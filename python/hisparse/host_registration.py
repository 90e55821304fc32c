"""hisparse.pin_tensor / unpin_tensor: caller-owned host memory made readable by
the kernels of a CUDA device, zero-copy (the seed backend's pin_tensor and
unpin_tensor; hisparse/host_registration.h).

A host cache that hisparse did not allocate (a torch CPU tensor, a NumPy
array, a mapping of the caller's own) must be registered before a runtime on
CUDA can bind it; ``pin_tensor`` registers its bytes, in segments of at most
64 GiB, and ``unpin_tensor`` unregisters exactly that registration. On the
CPU backend nothing needs registering: the range is only recorded, so the
same code runs on both.
"""

from __future__ import annotations

import sys
from typing import Any, Tuple

from . import _C, _args

__all__ = ["is_pinned", "pin_tensor", "unpin_tensor"]


# The C library's name of the range -> the argument that gives it.
_NAMES = {"data": "tensor"}


def _host_range(name: str, tensor: Any) -> Tuple[int, int]:
    """(address, bytes) of a contiguous host tensor (torch or NumPy)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        if tensor.device.type != "cpu":
            raise ValueError(f"{name}: expected host memory, got a tensor on {tensor.device}")
        if tensor.layout != torch.strided:
            raise TypeError(f"{name}: expected a dense tensor, got {_args.tensor_problem(tensor)}")
        if not tensor.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
        return int(tensor.data_ptr()), int(tensor.numel() * tensor.element_size())
    if type(tensor).__module__ == "numpy" and hasattr(tensor, "__array_interface__"):
        if not tensor.flags["C_CONTIGUOUS"]:
            raise ValueError(f"{name}: expected a contiguous array")
        return int(tensor.__array_interface__["data"][0]), int(tensor.nbytes)
    raise TypeError(f"{name}: expected a torch tensor or a NumPy array, got {_args.tensor_problem(tensor)}")


def _register(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except (TypeError, ValueError, RuntimeError) as error:
        raise _args.renamed(error, _NAMES) from None


def pin_tensor(tensor: Any, device: Any = None) -> None:
    """Register ``tensor``'s bytes with ``device`` ("cuda[:N]", an index; None: the current CUDA
    device when the CUDA backend has one, else the CPU backend). Keep the tensor alive, and call
    :func:`unpin_tensor` before it is freed. A range overlapping one registered here is refused."""
    if device is None:
        cuda = _C.build_info()["cuda_compiled"] and _C.cuda_device_count() > 0
        device = "cuda" if cuda else "cpu"
    device_type, device_index = _args.device(device)
    address, nbytes = _host_range("tensor", tensor)
    if nbytes == 0:
        raise ValueError("tensor: expected a non-empty tensor")
    _register(_C.host_register, address, nbytes, device_type, device_index)


def unpin_tensor(tensor: Any) -> None:
    """Unregister the registration :func:`pin_tensor` made of ``tensor``."""
    address, _ = _host_range("tensor", tensor)
    _register(_C.host_unregister, address)


def is_pinned(tensor: Any) -> bool:
    """Whether ``tensor``'s bytes lie inside one range :func:`pin_tensor` registered."""
    address, nbytes = _host_range("tensor", tensor)
    return _register(_C.host_is_registered, address, nbytes)
