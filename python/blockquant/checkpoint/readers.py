"""Which reader a checkpoint file needs, told by its first bytes rather than its name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Checkpoint, CheckpointError, os_reason
from .numpy_files import NpyCheckpoint, NpzCheckpoint
from .safetensors import SafetensorsCheckpoint


def open_checkpoint(path: Any) -> Checkpoint:
    """Open a ``.safetensors``, ``.npz`` or ``.npy`` file (recognized by its first bytes)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(6)
        if magic.startswith(b"PK"):
            return NpzCheckpoint(p)
        if magic == b"\x93NUMPY":
            return NpyCheckpoint(p)
        return SafetensorsCheckpoint(p)
    except OSError as e:
        raise CheckpointError(p, None, os_reason(e)) from None
