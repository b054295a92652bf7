"""Which reader a checkpoint file needs, told by its first bytes rather than its name."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from .base import Checkpoint, CheckpointError, os_reason
from .burnpack_file import BurnpackCheckpoint
from .numpy_files import NpyCheckpoint, NpzCheckpoint
from .pytorch import refuse_pickle
from .safetensors import MAX_HEADER, SafetensorsCheckpoint


def open_checkpoint(path: Any) -> Checkpoint:
    """Open a ``.safetensors``, ``.npz``, ``.npy``, burn ``.bpk`` or GGUF file (recognized by
    its first bytes)."""
    p = Path(path)
    try:
        # Opened without blocking and checked before a byte is read: a named pipe would wait for
        # a writer forever, and a device (/dev/zero) has no size to check a header against.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(p, None, "is not a regular file (a pipe, a device or a "
                                      "socket); blockquant reads checkpoint files")
            magic = f.read(9)
            size = st.st_size
        # Safetensors first, by its own structure: it has no magic, and its first bytes (the
        # header's length) can be anything, a pickle's 0x80 0x02 or a zip's "PK" included (a
        # 640- or 19,280-byte header). None of the formats below passes this test: their first
        # eight bytes read as a length past the header limit or the file, or byte 8 is not "{".
        if _looks_like_safetensors(magic, size):
            return SafetensorsCheckpoint(p)
        refuse_pickle(p, magic)  # a PyTorch checkpoint: refused, never unpickled
        if magic.startswith(b"PK"):
            return NpzCheckpoint(p)
        if magic.startswith(b"\x93NUMPY"):
            return NpyCheckpoint(p)
        if magic.startswith(b"NRUB"):  # burn-pack's magic 0x4255524E, little-endian
            return BurnpackCheckpoint(p)
        if magic.startswith(b"GGUF"):  # llama.cpp's; gguf-py (an optional extra) reads it
            from .gguf_file import GGUFCheckpoint

            return GGUFCheckpoint(p)
        return SafetensorsCheckpoint(p)
    except OSError as e:
        raise CheckpointError(p, None, os_reason(e)) from None


def _looks_like_safetensors(magic: bytes, size: int) -> bool:
    """A header length the safetensors library accepts (at most ``MAX_HEADER``, within the
    file), then the JSON object it must start with."""
    if len(magic) < 9:
        return False
    n = int.from_bytes(magic[:8], "little")
    return 2 <= n <= min(MAX_HEADER, size - 8) and magic[8:9] == b"{"
