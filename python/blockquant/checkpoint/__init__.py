"""Quantizing whole checkpoints: reading ``.safetensors`` / ``.npz`` / ``.npy`` files one tensor
at a time, and writing quantized ``.safetensors`` files that read back without guessing.

- :mod:`.base`: the error, :class:`TensorInfo`, the :class:`Checkpoint` reader interface;
- :mod:`.safetensors`: the streaming safetensors reader and writer;
- :mod:`.numpy_files`: the ``.npz`` and ``.npy`` readers;
- :mod:`.formats`: the formats, recognised by name and by content, and the output decision;
- :mod:`.readers`: :func:`open_checkpoint`, which picks the reader;
- :mod:`.outputs`: checks on an output path, and the atomic output file;
- :mod:`.format`: the blockquant file format (part names, metadata, ``FORMAT_VERSION``);
- :mod:`.options`: :class:`FileOptions`, the options the commands share;
- :mod:`.rules`: which tensor gets which scheme (rank, ``--rule``, ``--strict``);
- :mod:`.pytorch`: PyTorch checkpoints recognized and refused, never unpickled;
- :mod:`.commands`: quantize_file, dequantize_file, inspect_file, report_file (one file);
- :mod:`.folders`: model folders (shards, index, other files), output paths, plans;
- :mod:`.jobs`: several files at once, in worker processes.
"""

from __future__ import annotations

from .base import Checkpoint, CheckpointError, TensorInfo
from .commands import (
    Progress,
    QuantizeSummary,
    dequantize_file,
    inspect_file,
    quantize_file,
    report_file,
)
from .format import FORMAT_VERSION
from .options import FileOptions
from .readers import open_checkpoint
from .safetensors import HeaderEntry, SafetensorsWriter

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "FileOptions",
    "HeaderEntry",
    "Progress",
    "QuantizeSummary",
    "SafetensorsWriter",
    "TensorInfo",
    "dequantize_file",
    "inspect_file",
    "open_checkpoint",
    "quantize_file",
    "report_file",
]
