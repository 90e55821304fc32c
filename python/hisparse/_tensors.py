"""torch, when the process has it: hisparse imports without torch (NumPy
arrays run the CPU backend) and uses torch only where a caller brings it."""

from __future__ import annotations

import sys

__all__ = ["torch_or_none"]


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
