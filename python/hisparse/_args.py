"""Argument checks and conversions of every Python entry point of hisparse.

Python converts what only Python can (int vs bool, dtype objects, devices,
torch streams and events, torch tensors to DLPack) and checks that each
value has the type the C library takes; every range, shape, dtype and device
rule is the C library's, which names the argument in its own error. Each
function here raises TypeError or ValueError naming the argument.

CUDA tensors are exported with ``stream=-1`` so the export itself never
synchronises streams (a plain ``__dlpack__()`` makes the default stream wait
on the current one, which breaks CUDA-graph capture); kernels are ordered on
the stream hisparse is given instead.
"""

from __future__ import annotations

import numbers
import re
import sys
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from . import _C
from ._tensors import torch_or_none

__all__ = [
    "check_tensor",
    "shown",
    "choice",
    "device",
    "dtype_code",
    "dtype_itemsize",
    "dtype_name",
    "flag",
    "handle",
    "require_bool",
    "sequence",
    "require_int",
    "optional_int",
    "stream",
    "tensor",
    "tensor_problem",
    "optional_tensor",
    "renamed",
    "int_sequence",
    "name_of",
    "tensor_list",
]

_INT_RANGE = {32: (-(2**31), 2**31), 64: (-(2**63), 2**63)}
# Names torch and NumPy give the dtypes _C.DTYPES calls otherwise.
_DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "float8_e4m3": "float8_e4m3fn"}


# ---------------------------------------------------------------- scalars
def shown(value: Any) -> str:
    """A refused value as a message shows it: the repr of a plain scalar, string or dtype, else only its type.

    Arbitrary objects are never printed: the repr of an array reads its
    memory, which for a view with impossible strides is not there.
    """
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    kind = type(value)
    if kind.__name__ in ("dtype", "device") or (kind.__module__ == "numpy" and kind.__name__.startswith("dtype")):
        return repr(value)
    return f"a {kind.__name__}"


def require_int(name: str, value: Any, minimum: Optional[int] = None, *, bits: Optional[int] = None) -> int:
    """``value`` as an int (bool refused), at least ``minimum``, within ``bits``-bit signed range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    if bits is not None:
        low, high = _INT_RANGE[bits]
        if not low <= value < high:
            raise ValueError(f"{name}: expected a value that fits in {bits} bits, got {value}")
    return value


def optional_int(name: str, value: Any, default: int, minimum: Optional[int] = None, *, bits: int = 64) -> int:
    """``default`` for None, else :func:`require_int`."""
    return default if value is None else require_int(name, value, minimum, bits=bits)


def require_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value


def flag(name: str, value: Any) -> int:
    """A bool (or int) flag for the C library, which refuses anything but 0 or 1 naming ``name``."""
    if not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    value = int(value)
    if not -(2**31) <= value < 2**31:  # past int32 the library never sees it
        raise ValueError(f"{name}: expected 0 or 1, got {value}")
    return value


def int_sequence(name: str, values: Any, *, bits: int = 32) -> List[int]:
    """A sequence of ints (list, tuple, range, 1-D array) as a list, element i named ``name[i]``.

    Strings, mappings and sets are refused: none of them is an ordered list of ints.
    """
    if isinstance(values, (str, bytes, bytearray, Mapping, AbstractSet)) or not (
            hasattr(values, "__len__") and hasattr(values, "__getitem__")):
        raise TypeError(f"{name}: expected a sequence of ints, got {shown(values)}")
    return [require_int(f"{name}[{i}]", value, bits=bits) for i, value in enumerate(values)]


def name_of(name: str, value: Any, names: Iterable[str]) -> str:
    """``value`` if it is one of ``names`` (a str), else TypeError or ValueError naming ``name``."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {sorted(names)}, got {shown(value)}")
    if value not in names:
        raise ValueError(f"{name}: expected one of {sorted(names)}, got {shown(value)}")
    return value


def choice(name: str, value: Any, choices: Sequence[str]) -> int:
    """The index of ``value`` in ``choices`` (a name), or ``value`` itself (an int)."""
    if isinstance(value, str):
        if value not in choices:
            raise ValueError(f"{name}: expected one of {list(choices)}, got {shown(value)}")
        return list(choices).index(value)
    return require_int(name, value, bits=32)


# ---------------------------------------------------------------- dtypes
def dtype_name(dtype: Any) -> str:
    """The library's name of a torch dtype, NumPy dtype or dtype name ('int32', 'bfloat16', ...)."""
    if dtype is None or isinstance(dtype, bool):
        raise TypeError(f"dtype: expected a torch dtype, NumPy dtype or dtype name, got {shown(dtype)}")
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif type(dtype).__module__.startswith("torch"):
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            import numpy  # noqa: PLC0415

            name = numpy.dtype(dtype).name
        except (ImportError, TypeError) as error:
            raise TypeError(f"dtype: expected a torch dtype, NumPy dtype or dtype name, got {shown(dtype)}") from error
    return _DTYPE_ALIASES.get(name, name)


def dtype_code(name: str, dtype: Any) -> int:
    """The hs_dtype_t code of ``dtype``."""
    key = dtype_name(dtype)
    if key not in _C.DTYPES:
        raise TypeError(f"{name}: expected one of {sorted(_C.DTYPES)}, got {shown(dtype)}")
    return _C.DTYPES[key][0]


def dtype_itemsize(dtype: Any, name: str = "dtype") -> int:
    """Bytes per element of ``dtype``: its own ``itemsize`` (torch and NumPy dtypes), else hs_dtype_size."""
    itemsize = getattr(dtype, "itemsize", None)
    if isinstance(itemsize, int):
        return itemsize
    key = dtype_name(dtype)
    if key not in _C.DTYPES:
        raise TypeError(f"{name}: expected one of {sorted(_C.DTYPES)}, got {shown(dtype)}")
    return _C.DTYPES[key][1]


# ---------------------------------------------------------------- devices, streams and handles
def device(value: Any, name: str = "device") -> Tuple[int, int]:
    """(hs_device_type_t, device index; -1 = the current CUDA device) of a torch.device, str or CUDA index."""
    if value is None:
        return _C.DEVICE_CPU, 0
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a torch.device, 'cpu', 'cuda[:N]' or an int, got {shown(value)}")
    if isinstance(value, numbers.Integral):
        value = int(value)
        if not 0 <= value < 2**31:
            raise ValueError(f"{name}: expected a CUDA device index from 0 to 2**31 - 1, got {value}")
        return _C.DEVICE_CUDA, value
    if not isinstance(value, str) and type(value).__name__ != "device":
        raise TypeError(f"{name}: expected a torch.device, 'cpu', 'cuda[:N]' or an int, got {type(value).__name__}")
    text = str(value)
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return _C.DEVICE_CPU, 0
    if kind == "cuda" and (not index or (index.isdigit() and int(index) < 2**31)):
        return _C.DEVICE_CUDA, int(index) if index else -1
    raise ValueError(f"{name}: expected 'cpu', 'cuda' or 'cuda:N', got {text!r}")


def handle(name: str, value: Any, attribute: str) -> int:
    """An integer CUDA handle from None (0), an int, or a torch object's ``attribute``."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected None, an int handle or a torch object, got a bool")
    if isinstance(value, int):
        if not 0 <= value < 2**64:
            raise ValueError(f"{name}: expected a handle from 0 to 2**64 - 1, got {value}")
        return value
    result = getattr(value, attribute, None)
    if result is None:
        raise TypeError(f"{name}: expected None, an int handle or a torch.cuda object, got {type(value).__name__}")
    return int(result)


def stream(value: Any, *tensors: Any) -> int:
    """The integer stream handle of a call.

    ``value`` may be None (torch's current stream of the first CUDA tensor's
    device, or 0 for host tensors), an int handle, or a torch.cuda.Stream.
    """
    if value is not None:
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < 2**64:
                raise ValueError(f"stream: expected a stream handle from 0 to 2**64 - 1, got {value}")
            return value
        result = getattr(value, "cuda_stream", None)
        if result is None:
            raise TypeError(f"stream: expected None, an int handle or a torch.cuda.Stream, got {type(value).__name__}")
        return int(result)
    for item in tensors:
        if _is_torch_tensor(item) and item.device.type == "cuda":
            torch = torch_or_none()
            return int(torch.cuda.current_stream(item.device).cuda_stream)
    return 0


# ---------------------------------------------------------------- tensors
def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def tensor_problem(value: Any) -> str:
    """What ``value`` is, in the words of a refusal ("a list", "a tensor on the meta device (it has no data)").

    The C library's bindings use it too, so that a value refused there is
    described as it is here.
    """
    if _is_torch_tensor(value):
        torch = sys.modules["torch"]
        if value.is_meta:
            return "a tensor on the meta device (it has no data)"
        if value.layout != torch.strided:
            layout = str(value.layout).removeprefix("torch.")
            return f"a {layout} tensor (only dense, strided tensors have data to read)"
        if value.device.type not in ("cpu", "cuda"):
            return f"a tensor on {value.device} (hisparse reads CPU and CUDA memory)"
        try:
            value.__dlpack__(stream=-1) if value.device.type == "cuda" else value.__dlpack__()
        except Exception as error:  # noqa: BLE001 - its reason is the answer
            return f"a torch.Tensor that DLPack cannot export ({error})"
        return f"a torch.Tensor of dtype {value.dtype}"
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return f"a NumPy array of dtype {value.dtype}"
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def check_tensor(name: str, value: Any, *, sliceable: bool = False) -> Any:
    """``value`` itself if it is a tensor hisparse can read (torch or another DLPack array), else a named error.

    ``sliceable``: the caller indexes it, so only a torch tensor or a NumPy
    array will do.
    """
    if _is_torch_tensor(value):
        kind = value.device.type
        if kind != "cpu" and kind != "cuda":
            raise ValueError(f"{name}: expected a CPU or CUDA tensor, got {tensor_problem(value)}")
        if value.layout is not sys.modules["torch"].strided:
            raise TypeError(f"{name}: expected a dense tensor, got {tensor_problem(value)}")
        return value
    if value is None or not hasattr(value, "__dlpack__"):
        raise TypeError(f"{name}: expected a tensor (torch or NumPy), got {tensor_problem(value)}")
    if sliceable and type(value).__module__ != "numpy":
        raise TypeError(f"{name}: expected a torch.Tensor or NumPy array, got {tensor_problem(value)}")
    return value


def tensor(name: str, value: Any) -> Any:
    """What _C receives for a tensor argument: a torch tensor or another DLPack array."""
    value = check_tensor(name, value)
    if _is_torch_tensor(value) and value.device.type == "cuda":
        try:
            return value.__dlpack__(stream=-1)
        except Exception as error:  # sparse or autograd-tracked CUDA tensors have no export
            raise TypeError(f"{name}: expected a tensor DLPack can export, got {tensor_problem(value)}") from error
    return value


def optional_tensor(name: str, value: Any) -> Any:
    return None if value is None else tensor(name, value)


def index_rows(name: str, value: Any) -> Tuple[int, int]:
    """(T, k) of an index tensor [T, k] (torch or NumPy) with rows the library can read (unit stride, rows
    apart), checked before an output of its shape is allocated: a broadcast view would ask for a huge one."""
    value = check_tensor(name, value, sliceable=True)
    shape = tuple(value.shape)
    if len(shape) != 2:
        raise ValueError(f"{name}: expected 2 dimensions [T, k], got shape {shape}")
    rows, columns = shape
    if rows * columns > 0:
        strides = value.stride() if _is_torch_tensor(value) else tuple(s // value.itemsize for s in value.strides)
        if columns > 1 and strides[1] != 1:
            raise ValueError(f"{name}: expected stride 1 in dimension 1, got {strides[1]}")
        if rows > 1 and strides[0] < columns:
            raise ValueError(f"{name}: expected a row stride of at least {columns} elements, got {strides[0]}")
    return rows, columns


def sequence(name: str, values: Iterable[Any]) -> List[Any]:
    """A sequence of tensors as a list (a single tensor, a string, a mapping or a set is refused)."""
    if (isinstance(values, (str, bytes, bytearray, Mapping, AbstractSet)) or hasattr(values, "__dlpack__")
            or not hasattr(values, "__iter__")):
        raise TypeError(f"{name}: expected a sequence of tensors, got {type(values).__name__}")
    return list(values)


def tensor_list(name: str, values: Iterable[Any]) -> List[Any]:
    """Each tensor of a sequence, element i named ``name[i]``."""
    return [tensor(f"{name}[{i}]", value) for i, value in enumerate(sequence(name, values))]


# ---------------------------------------------------------------- errors
def renamed(error: Exception, names: dict) -> Exception:
    """``error`` with the C library's names of arguments replaced by the caller's (``names``: C name -> Python name).

    A wrapper whose arguments are named otherwise than the C ABI's (for
    example ``attention_indices_out`` for ``out_attention``) re-raises the
    library's error through this, so that the message names what its caller
    passed. Errors that mention none of the names come back unchanged.
    """
    text = str(error)
    pattern = re.compile(r"\b(" + "|".join(re.escape(name) for name in names) + r")\b")
    new_text = pattern.sub(lambda match: names[match.group(1)], text)
    if new_text == text:
        return error
    return type(error)(new_text)
