"""The machinery of the bad-input suite (test_bad_input.py).

An *entry* is one public entry point: how to build valid arguments for it
(``fixture``), how to call it (``call``), what a valid call leaves behind
(``observe``: outputs and state, as NumPy arrays and plain values) and, per
argument, which kinds of bad value it must refuse (``args``). From the
entries this module derives the cases: one per argument and kind of bad
value, plus one per aliased pair of arguments. A case

1. builds valid arguments and replaces one of them by a bad value (or makes
   two of them share memory); a value only the entry's objects can make (the
   library's own memory, a row its state holds) is an `Of`, made when the
   case runs;
2. expects the call to raise one of the allowed exception types, with a
   message that names the argument;
3. checks that the rejected call changed none of the tensors it was given;
4. makes one valid call on the same objects and the same call on a twin that
   never saw a bad one: both must leave the same outputs and state (and
   ``check``, where an entry has one, compares the result with a reference).

Cases run in worker processes (bad_input_worker.py), so a crash is reported
as the case that crashed instead of ending the suite.
"""

from __future__ import annotations

import ctypes
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

# ---------------------------------------------------------------------- values

INT_RANGE_VALUES = {
    "neg": -1,
    "zero": 0,
    "2**31": 2**31,
    "2**62": 2**62,
    "2**63": 2**63,
    "-2**63-1": -(2**63) - 1,
    "2**64": 2**64,
}
# Values of the wrong type for an int, and what each must raise.
INT_TYPE_VALUES = {"float": 4.0, "str": "4", "list": [4], "bool": True, "bytes": b"4"}


@dataclass
class Of:
    """A bad value made when the case runs from the entry's objects (memory the library owns or has bound, a row a
    state holds) or, `with_arguments`, from them and the call's valid arguments (a view into one of them): what no
    value fixed in advance can be."""

    make: Callable[..., Any]
    with_arguments: bool = False

    def value(self, subject: Any, kw: Dict[str, Any]) -> Any:
        return self.make(subject, kw) if self.with_arguments else self.make(subject)


class FakeCudaTensor:
    """A DLPack producer that claims CUDA memory it does not have.

    Only for machines without a CUDA device: hisparse must refuse it (no CUDA
    backend, no device, or another device than the call's) before any
    kernel could touch the address.
    """

    class _DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class _DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class _DLTensor(ctypes.Structure):
        pass

    _DLTensor._fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]

    class _DLManagedTensor(ctypes.Structure):
        pass

    _DLManagedTensor._fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]

    _CODES = {torch.int8: (0, 8), torch.int16: (0, 16), torch.int32: (0, 32), torch.int64: (0, 64),
              torch.uint8: (1, 8), torch.float16: (2, 16), torch.float32: (2, 32), torch.float64: (2, 64),
              torch.bool: (6, 8)}

    def __init__(self, like: torch.Tensor) -> None:
        self.shape = tuple(like.shape)
        self.dtype = like.dtype
        self._keep: List[Any] = []

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (2, 0)

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        managed = self._DLManagedTensor()
        code, bits = self._CODES[self.dtype]
        managed.dl_tensor.data = 0x10000  # never dereferenced: refused first
        managed.dl_tensor.device = self._DLDevice(2, 0)
        managed.dl_tensor.ndim = ndim
        managed.dl_tensor.dtype = self._DLDataType(code, bits, 1)
        managed.dl_tensor.shape = shape
        managed.dl_tensor.strides = None
        self._keep += [shape, managed]
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(managed), b"dltensor", None)


# ---------------------------------------------------------------------- tensor mutations
def _other_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.dtype != torch.float32 else torch.int32


def _noncontig(t: torch.Tensor) -> torch.Tensor:
    """The same values with no unit stride in the last dimension."""
    wide = torch.zeros(t.shape + (2,), dtype=t.dtype)
    wide[..., 0] = t
    return wide[..., 0]


def _huge_stride(t: torch.Tensor) -> np.ndarray:
    """A NumPy view whose strides claim far more memory than there is (never touched)."""
    base = t.contiguous().numpy()
    shape = (2,) + base.shape[1:] if base.ndim > 0 else (2,)
    strides = (2**60,) + base.strides[1:] if base.ndim > 0 else (2**60,)
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides, writeable=True)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values at an address one byte past 16-byte alignment."""
    nbytes = t.numel() * t.element_size()
    raw = torch.zeros(nbytes + 64, dtype=torch.uint8)
    start = (-raw.data_ptr()) % 16 + 1
    view = raw[start:start + nbytes]
    if t.dtype != torch.uint8:
        return torch.from_numpy(view.numpy().view(t.numpy().dtype)).view(t.shape)
    view.copy_(t.contiguous().view(-1).view(torch.uint8))
    return view.view(t.shape)


def _readonly(t: torch.Tensor) -> np.ndarray:
    array = t.numpy().copy()
    array.flags.writeable = False
    return array


class ReleasedPools:
    """Views of host pools that were released while the views lived."""

    def __init__(self) -> None:
        self.pools: List[Any] = []

    def view_of(self, t: torch.Tensor) -> torch.Tensor:
        import hisparse

        nbytes = max(t.numel() * t.element_size(), 1)
        pool = hisparse.HostPool(max(nbytes, 4096), register="never", check_memory=False)
        view = pool.view(t.dtype, tuple(t.shape))
        view.copy_(t)
        pool.release(force=True)
        self.pools.append(pool)
        return view


RELEASED = ReleasedPools()


def tensor_mutation(label: str, value: Any) -> Any:
    """The bad value `label` makes of the valid tensor `value`."""
    if label == "none":
        return None
    if label == "str":
        return "tensor"
    if label == "int":
        return 4
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if label == "dtype" or label == "redtype":
        return torch.zeros(t.shape, dtype=_other_dtype(t))
    if label == "dtype_int64":
        return t.to(torch.int64)
    if label == "dtype_int16":
        return t.to(torch.int16)
    if label == "rank_up":
        return t.unsqueeze(0)
    if label == "rank_down":
        return t.reshape(-1) if t.dim() > 1 else t[0]
    if label == "short":
        return t[: t.shape[0] - 1]
    if label == "noncontig":
        return _noncontig(t)
    if label == "huge_stride":
        return _huge_stride(t)
    if label == "misaligned":
        return _misaligned(t)
    if label == "width":
        return torch.zeros(t.shape[:-1] + (t.shape[-1] - 1,), dtype=t.dtype)
    if label == "readonly":
        return _readonly(t)
    if label == "released":
        return RELEASED.view_of(t)
    if label == "meta":
        return torch.empty(t.shape, dtype=t.dtype, device="meta")
    if label == "sparse":
        return t.to_sparse() if t.dim() > 0 else t.reshape(1).to_sparse()
    if label == "fake_cuda":
        return FakeCudaTensor(t)
    if label == "list":
        return t.tolist()
    raise KeyError(label)


# Labels that make something that is no readable tensor at all: TypeError
# (meta and other devices may also be a ValueError: a device problem).
TENSOR_TYPE_LABELS = ("list", "none", "str", "int", "sparse")
TENSOR_ERRORS = {
    "dtype": (TypeError,),
    "dtype_int64": (TypeError,),
    "dtype_int16": (TypeError,),
    "readonly": (TypeError,),
    "meta": (TypeError, ValueError),
    "fake_cuda": (TypeError, ValueError, RuntimeError),
    "redtype": (TypeError, ValueError),
    "released": (RuntimeError,),
}


# ---------------------------------------------------------------------- argument specs
@dataclass
class Arg:
    """One argument of an entry and the bad values it must refuse."""

    name: str
    kind: str  # "tensor", "int", "bool", "stream", "choice", "float", "object", "tensors"
    bad: Tuple[str, ...] = ()
    optional: bool = False  # None is a valid value
    role: str = "in"  # tensors: "in" (read) or "out" (written)
    message_name: Optional[str] = None  # the name the error says (default: name)
    extra: Dict[str, Tuple[Any, Tuple[type, ...]]] = field(default_factory=dict)  # label -> (value, errors)
    like: Any = None  # tensors: what bad values are made from where the valid value is None

    def said(self) -> str:
        return self.message_name or self.name


def T(name: str, bad: str = "", *, role: str = "in", optional: bool = False, typed: bool = True, like: Any = None,
      message_name: Optional[str] = None, **extra: Tuple[Any, Tuple[type, ...]]) -> Arg:
    """A tensor argument: the labels in `bad` plus, when `typed`, the values no tensor has.

    An optional tensor whose valid value is None makes its bad values from
    `like`; without it, it only takes the values that need no template.
    """
    labels = tuple(bad.split())
    if typed:
        labels += tuple(x for x in TENSOR_TYPE_LABELS if not (x == "none" and optional)) + ("meta", "fake_cuda")
    if role == "out" and "readonly" not in labels:
        labels += ("readonly",)
    return Arg(name, "tensor", labels, optional, role, message_name=message_name, extra=dict(extra), like=like)


def D(name: str = "device", *, optional: bool = True, index_ok: bool = True) -> Arg:
    """A device: a torch.device, 'cpu', 'cuda[:N]' or a CUDA index; never a float, list, bogus name, bad index."""
    extra = {"float": (4.0, (TypeError,)), "list": ([0], (TypeError,)), "bogus": ("tpu", (ValueError,)),
             "cuda:huge": ("cuda:99999999999", (ValueError,)), "cuda:abc": ("cuda:abc", (ValueError,)),
             "negative": (-1, (ValueError,)), "2**31": (2**31, (ValueError,))}
    if not index_ok:
        del extra["negative"], extra["2**31"]
    return Arg(name, "device", () if optional else ("none",), optional, extra=extra)


def I(name: str, bad: str = "", *, optional: bool = False, message_name: Optional[str] = None,  # noqa: E743
      **extra: Tuple[Any, Tuple[type, ...]]) -> Arg:
    """An int argument: out-of-range `bad` values, plus every value of the wrong type."""
    labels = tuple(bad.split()) + tuple(INT_TYPE_VALUES) + (() if optional else ("none",))
    return Arg(name, "int", labels, optional, message_name=message_name, extra=dict(extra))


def B(name: str, *, optional: bool = False) -> Arg:
    labels = ("str", "int", "float", "list") + (() if optional else ("none",))
    return Arg(name, "bool", labels, optional)


def R(name: str, bad: Sequence[str]) -> Arg:
    """A name out of a fixed set: refuses another type (TypeError) and names not in the set (ValueError)."""
    extra = {f"name={value!r}": (value, (ValueError,)) for value in bad}
    return Arg(name, "object", ("int", "list", "none"), False, extra=extra)


def S(name: str = "stream") -> Arg:
    """A stream: None, an int handle or a torch stream; never a negative or huge int, a str or a float."""
    return Arg(name, "stream", ("neg", "2**64", "str", "float", "bool", "list"), True)


def C(name: str, bad: Sequence[Any]) -> Arg:
    """A choice (a name or an int) refusing the values in `bad` and every wrong type."""
    extra = {f"choice={value!r}": (value, (ValueError,)) for value in bad}
    return Arg(name, "choice", ("float", "list", "none"), False, extra=extra)


def O(name: str, *, optional: bool = False, **extra: Tuple[Any, Tuple[type, ...]]) -> Arg:  # noqa: E743
    """An object argument (a Config, a Runtime, ...): refuses an int, a str and a list."""
    labels = ("int", "str", "list") + (() if optional else ("none",))
    return Arg(name, "object", labels, optional, extra=dict(extra))


def L(name: str, bad: str = "") -> Arg:
    """A sequence of tensors."""
    return Arg(name, "tensors", ("int", "str", "none", "tensor") + tuple(bad.split()), False)


def scalar_value(kind: str, label: str) -> Tuple[Any, Tuple[type, ...]]:
    """The bad value `label` of an argument of `kind`, and the exceptions it may raise."""
    if label == "none":
        return None, (TypeError,)
    if label in INT_RANGE_VALUES:
        return INT_RANGE_VALUES[label], (ValueError,)
    if kind == "bool" and label == "int":
        return 1, (TypeError,)
    if label == "int":
        return 4, (TypeError,)
    if label == "tensor":
        return torch.zeros(4, dtype=torch.int32), (TypeError,)
    return INT_TYPE_VALUES[label], (TypeError,)


# ---------------------------------------------------------------------- entries and cases
@dataclass
class Entry:
    """One public entry point; see the module docstring."""

    name: str
    setup: Callable[[], Any]
    fixture: Callable[[Any, int], Dict[str, Any]]
    call: Callable[[Any, Dict[str, Any]], Any]
    observe: Callable[[Any, Dict[str, Any], Any], List[Any]]
    args: List[Arg]
    alias: List[Tuple[str, str]] = field(default_factory=list)
    check: Optional[Callable[[Any, Dict[str, Any], Any], None]] = None
    # False where no valid call can run here (a CUDA query without a device,
    # an interprocess handle that only another process can open).
    valid_call: bool = True


@dataclass
class Case:
    entry: Entry
    label: str
    arg: Optional[Arg] = None
    value: Any = None  # the bad value itself, or (mutate) the label of a tensor mutation
    errors: Tuple[type, ...] = ()
    alias: Optional[Tuple[str, str]] = None
    mutate: bool = False

    @property
    def id(self) -> str:
        return f"{self.entry.name}|{self.label}"


def cases_of(entry: Entry, *, cuda_present: bool) -> List[Case]:
    out: List[Case] = []
    for arg in entry.args:
        for label in arg.bad:
            if label == "fake_cuda" and cuda_present:
                continue  # a real device would be handed a made-up address
            errors = TENSOR_ERRORS.get(label, (TypeError,) if label in TENSOR_TYPE_LABELS else (ValueError,))
            if arg.kind == "tensor":
                out.append(Case(entry, f"{arg.name}={label}", arg, label, errors, mutate=True))
            elif arg.kind == "tensors" and label not in ("int", "str", "none", "tensor"):
                out.append(Case(entry, f"{arg.name}={label}", arg, label, errors, mutate=True))
            else:
                value, errors = scalar_value("int" if arg.kind == "tensors" else arg.kind, label)
                out.append(Case(entry, f"{arg.name}={label}", arg, value, errors))
        for label, (value, errors) in arg.extra.items():
            out.append(Case(entry, f"{arg.name}:{label}", arg, value, errors))
    for pair in entry.alias:
        out.append(Case(entry, f"alias:{pair[0]}~{pair[1]}", None, None, (ValueError,), pair))
    return out


def make_bad_arguments(case: Case, kw: Dict[str, Any], subject: Any = None) -> Dict[str, Any]:
    """The case's bad version of valid arguments `kw` (a copy); `subject`: the entry's objects, for values `Of` them."""
    kw = dict(kw)
    if case.alias is not None:
        a, b = case.alias
        first = kw[a][0] if isinstance(kw[a], list) else kw[a]
        second = kw[b][0] if isinstance(kw[b], list) else kw[b]
        first, second = overlapping(first, second)
        kw[a] = [first] + list(kw[a][1:]) if isinstance(kw[a], list) else first
        kw[b] = [second] + list(kw[b][1:]) if isinstance(kw[b], list) else second
        return kw
    arg = case.arg
    if case.mutate and arg.kind == "tensor":
        valid = kw.get(arg.name)
        if valid is None:
            valid = arg.like
        if valid is None and case.value not in ("none", "str", "int"):
            raise ValueError(f"{arg.name}: the case needs a `like` template (the valid value is None)")
        kw[arg.name] = tensor_mutation(case.value, valid)
    elif case.mutate and arg.kind == "tensors":
        items = list(kw[arg.name])
        items[-1] = tensor_mutation(case.value, items[-1])
        kw[arg.name] = items
    else:
        kw[arg.name] = case.value.value(subject, kw) if isinstance(case.value, Of) else case.value
    return kw


def overlapping(a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Tensors of the shapes and dtypes of `a` and `b` (and their values) whose memory starts at one address."""
    nbytes = max(a.numel() * a.element_size(), b.numel() * b.element_size())
    raw = torch.zeros(nbytes + 64, dtype=torch.uint8)
    start = (-raw.data_ptr()) % 64
    buffer = raw[start:start + nbytes].numpy()

    def view(like: torch.Tensor) -> torch.Tensor:
        size = like.numel() * like.element_size()
        out = torch.from_numpy(buffer[:size].view(like.numpy().dtype)).view(like.shape)
        out.copy_(like)
        return out

    return view(a), view(b)


def snapshot(kw: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """Copies of the readable tensors among `kw` (and inside its sequences)."""
    out: Dict[str, np.ndarray] = {}

    def take(key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.layout == torch.strided:
            out[key] = value.detach().clone().numpy()
        elif isinstance(value, np.ndarray) and value.flags.c_contiguous:
            # (not a view whose strides claim memory that is not there)
            out[key] = np.array(value, copy=True)

    for name, value in kw.items():
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                take(f"{name}[{i}]", item)
        else:
            take(name, value)
    return out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and \
            a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def as_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone().numpy()
    if isinstance(value, (list, tuple)):
        return [as_numpy(v) for v in value]
    return value


def names_the_argument(message: str, arg_names: Sequence[str]) -> bool:
    return any(name in message for name in arg_names)


def run_case(case: Case, subject: Any, twin: Any, seed: int) -> Optional[str]:
    """Runs one case; returns None when it passes, else what went wrong."""
    entry = case.entry
    try:
        kw = make_bad_arguments(case, entry.fixture(subject, seed), subject)
    except Exception as error:  # noqa: BLE001 - a broken case is a failure, said as such
        return f"could not build the case: {type(error).__name__}: {error}"
    before = snapshot(kw)
    try:
        entry.call(subject, kw)
    except case.errors as error:
        message = str(error)
        wanted = [case.arg.said()] if case.arg is not None else list(case.alias)
        if case.alias is not None and not all(name in message for name in wanted):
            return f"the message does not name both {wanted}: {message!r}"
        if not names_the_argument(message, wanted):
            return f"the message does not name {wanted}: {type(error).__name__}: {message!r}"
        if "incompatible function arguments" in message:
            return f"nanobind's signature dump: {message!r}"
    except Exception as error:  # noqa: BLE001
        return f"raised {type(error).__name__} (expected {[e.__name__ for e in case.errors]}): {error}"
    else:
        return "accepted"
    after = snapshot(kw)
    for key, value in before.items():
        if key in after and not same(value, after[key]):
            return f"the rejected call changed {key}"
    if not entry.valid_call:
        return None
    # The same valid call on the objects that saw the bad one and on the twin.
    try:
        kw = entry.fixture(subject, seed + 1)
        result = entry.call(subject, kw)
        kw_twin = entry.fixture(twin, seed + 1)
        result_twin = entry.call(twin, kw_twin)
        mine = entry.observe(subject, kw, result)
        theirs = entry.observe(twin, kw_twin, result_twin)
        if entry.check is not None:
            entry.check(subject, kw, result)
    except Exception as error:  # noqa: BLE001
        return f"the valid call after the rejection failed: {type(error).__name__}: {error}"
    if not same(mine, theirs):
        return "the valid call after the rejection disagrees with the twin that saw no bad call"
    return None


def cuda_present() -> bool:
    import hisparse

    return bool(torch.cuda.is_available() and hisparse._C.build_info()["cuda_compiled"]
                and hisparse._C.cuda_device_count() > 0)


def module_attr(path: str) -> Any:
    module, _, attr = path.rpartition(".")
    return getattr(sys.modules[module], attr)
