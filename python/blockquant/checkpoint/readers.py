"""Which reader a checkpoint file needs, told by its first bytes rather than its name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Checkpoint, CheckpointError, os_reason
from .burnpack_file import BurnpackCheckpoint
from .numpy_files import NpyCheckpoint, NpzCheckpoint
from .pytorch import refuse_pickle
from .safetensors import SafetensorsCheckpoint


def open_checkpoint(path: Any) -> Checkpoint:
    """Open a ``.safetensors``, ``.npz``, ``.npy``, burn ``.bpk`` or GGUF file (recognized by
    its first bytes)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(6)
        refuse_pickle(p, magic)  # a PyTorch checkpoint: refused, never unpickled
        if magic.startswith(b"PK"):
            return NpzCheckpoint(p)
        if magic == b"\x93NUMPY":
            return NpyCheckpoint(p)
        if magic.startswith(b"NRUB"):  # burn-pack's magic 0x4255524E, little-endian
            return BurnpackCheckpoint(p)
        if magic.startswith(b"GGUF"):  # llama.cpp's; gguf-py (an optional extra) reads it
            from .gguf_file import GGUFCheckpoint

            return GGUFCheckpoint(p)
        return SafetensorsCheckpoint(p)
    except OSError as e:
        raise CheckpointError(p, None, os_reason(e)) from None
