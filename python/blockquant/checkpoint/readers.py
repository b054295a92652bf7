"""Which reader a checkpoint file needs, told by its first bytes rather than its name
(:mod:`.formats` recognises the formats; this opens one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Checkpoint, CheckpointError, os_reason
from .burnpack_file import BurnpackCheckpoint
from .ct_read import CompressedTensorsCheckpoint, ct_config
from .formats import BURNPACK, GGUF, NPY, NPZ, SAFETENSORS, from_content, read_head
from .gguf_file import GGUFCheckpoint
from .mlx_read import MlxCheckpoint, mlx_config
from .numpy_files import NpyCheckpoint, NpzCheckpoint
from .pytorch import refuse_pickle
from .safetensors import SafetensorsCheckpoint

#: The reader of each checkpoint format, by its name.
READERS: dict[str, type[Checkpoint]] = {
    SAFETENSORS.name: SafetensorsCheckpoint,
    NPZ.name: NpzCheckpoint,
    NPY.name: NpyCheckpoint,
    BURNPACK.name: BurnpackCheckpoint,
    GGUF.name: GGUFCheckpoint,  # gguf-py (an optional extra) parses it, imported when opened
}


def open_checkpoint(path: Any) -> Checkpoint:
    """Open a ``.safetensors``, ``.npz``, ``.npy``, burn ``.bpk`` or GGUF file (recognized by
    its first bytes); a safetensors file beside a compressed-tensors or MLX ``config.json``
    reads as that format (:mod:`.ct_read`, :mod:`.mlx_read`)."""
    p = Path(path)
    magic, size = read_head(p)
    found = from_content(magic, size)
    if found is None or found.name not in READERS:
        refuse_pickle(p, magic)  # a PyTorch checkpoint: refused, never unpickled
        found = SAFETENSORS  # whose reader says what is wrong with the header
    try:
        if found is SAFETENSORS:
            # A shard of a compressed-tensors folder: its config.json says how to read it.
            qconfig = ct_config(p.parent)
            if qconfig is not None:
                return CompressedTensorsCheckpoint(p, qconfig)
            mconfig = mlx_config(p.parent)  # a shard of an MLX folder (mlx-lm's)
            if mconfig is not None:
                return MlxCheckpoint(p, mconfig)
        return READERS[found.name](p)
    except OSError as e:
        raise CheckpointError(p, None, os_reason(e)) from None
