"""hisparse.IpcEvent: an event another process can wait on.

The writer of a shared host pool mirrors rows on its stream and records the
event; a reader imports the event once (``IpcEvent.from_bytes``) and, every
step, makes its stream wait on it before its gathers. Nothing synchronises
with the host. A wait orders the stream after the work of the most recent
record that happened (in host time) before the wait; the processes order
their record and wait calls themselves (a barrier, a message, a step count).

CUDA: an interprocess event (``cudaEventInterprocess``); record and wait are
capturable into CUDA graphs (they become event nodes that act on every
replay), the rest is not stream work. The exporter keeps its event alive
while readers use it, and a handle cannot be imported in its own process.
CPU backend: every call completes before it returns, so record, wait and
synchronize are exact no-ops; handles still carry their backend and process
and are checked as on CUDA. See docs/host_pool.md.
"""

from __future__ import annotations

from typing import Any

from . import _C, _args
from ._tensors import torch_or_none

__all__ = ["IpcEvent"]


def _default_device() -> Any:
    cuda = _C.build_info()["cuda_compiled"] and _C.cuda_device_count() > 0
    return "cuda" if cuda else "cpu"


class IpcEvent:
    """An interprocess event on ``device`` (None: the current CUDA device
    when the CUDA backend has one, else the CPU backend; also "cpu",
    "cuda[:N]", an int or a torch.device)."""

    def __init__(self, device: Any = None) -> None:
        device_type, index = _args.device(_default_device() if device is None else device)
        try:
            self._event = _C.IpcEvent(device_type, index)
        except (TypeError, ValueError, RuntimeError) as error:
            raise _args.renamed(error, {"device_type": "device", "device_index": "device"}) from None

    @classmethod
    def from_bytes(cls, handle: bytes, device: Any = None) -> "IpcEvent":
        """Open an event another process exported, on this process's ``device``
        (CUDA events: None = the current device; CPU events ignore it)."""
        if not isinstance(handle, (bytes, bytearray)):
            raise TypeError(f"handle: expected bytes from IpcEvent.export(), got {type(handle).__name__}")
        index = -1
        if device is not None:
            _, index = _args.device(device)
        event = cls.__new__(cls)
        event._event = _C.IpcEvent.open(bytes(handle), index)
        return event

    def export(self) -> bytes:
        """The ``IPC_EVENT_HANDLE_BYTES`` bytes another process imports."""
        return self._event.export_handle()

    def record(self, stream: Any = None) -> None:
        """Capture the work submitted to ``stream`` (None: torch's current stream of the event's device)."""
        self._event.record(self._stream(stream))

    def wait(self, stream: Any = None) -> None:
        """Make ``stream`` (None: torch's current stream) wait for the most recent record's work."""
        self._event.wait(self._stream(stream))

    def synchronize(self) -> None:
        """Block until the most recent record's work is done."""
        self._event.synchronize()

    @property
    def device(self) -> str:
        info = self._event.info()
        return f"cuda:{info['device_index']}" if info["device_type"] == _C.DEVICE_CUDA else "cpu"

    @property
    def imported(self) -> bool:
        return bool(self._event.info()["imported"])

    @property
    def exporter_pid(self) -> int:
        return int(self._event.info()["exporter_pid"])

    def _stream(self, stream: Any) -> int:
        if stream is not None:
            return _args.stream(stream)
        info = self._event.info()
        if info["device_type"] != _C.DEVICE_CUDA:
            return 0
        torch = torch_or_none()
        if torch is None:
            return 0  # the legacy default stream
        return int(torch.cuda.current_stream(torch.device("cuda", info["device_index"])).cuda_stream)

    def __repr__(self) -> str:
        kind = "imported" if self.imported else "exported"
        return f"IpcEvent({self.device}, {kind}, pid {self.exporter_pid})"
