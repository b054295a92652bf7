"""The file formats blockquant knows, and how each is recognised: by its name (the extension)
and by its first bytes. The one place that says which format a path is, and which format a
quantize run writes (:func:`output_format`); the front door (:mod:`.registry`) pairs each format
with its reader, planner and writer.

compressed-tensors and MLX are folders of safetensors files told apart by their
``config.json``: an entry here, the reader told by that config (:mod:`.ct_read`, :mod:`.mlx_read`), no new
extension.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import CheckpointError, os_reason
from .safetensors import MAX_HEADER


@dataclass(frozen=True)
class Format:
    """A file format: its name (``blockquant inspect`` says it, ``--format`` takes it), the
    extensions that name it, the magic its files start with (None: none, or no fixed one), and
    whether a quantize run writes it."""

    name: str
    suffixes: tuple[str, ...]
    magic: bytes | None = None
    writes: bool = False
    fold_case: bool = True  # ".BPK" names no burn-pack file: burn's own loader wants ".bpk"

    def named_by(self, path: Any) -> bool:
        """Whether ``path``'s name asks for this format (by its extension)."""
        text = str(path)
        return (text.lower() if self.fold_case else text).endswith(self.suffixes)


SAFETENSORS = Format("safetensors", (".safetensors",), writes=True)
BURNPACK = Format("burnpack", (".bpk",), b"NRUB", writes=True, fold_case=False)  # 0x4255524E LE
GGUF = Format("gguf", (".gguf",), b"GGUF", writes=True)  # llama.cpp's; read by gguf-py
ONNX = Format("onnx", (".onnx",), writes=True)  # a protobuf: no magic, told by its name
NPZ = Format("npz", (".npz",), b"PK")
NPY = Format("npy", (".npy",), b"\x93NUMPY")
FOLDER = Format("folder", (), writes=True)  # a Hugging Face model folder: shards and an index
#: vLLM's and transformers' quantized folders: safetensors shards whose config.json says how
COMPRESSED_TENSORS = Format("compressed-tensors", (), writes=True)
# MLX's (mlx-lm): a folder like compressed-tensors', its config.json's "quantization" telling
# the reader (:mod:`.mlx_read`) and the layout (:mod:`.mlx_folder`).
MLX = Format("mlx", (), writes=True)

#: Every format, in the order content detection tries them (safetensors first, see below).
FORMATS = (SAFETENSORS, NPZ, NPY, BURNPACK, GGUF, ONNX, FOLDER, COMPRESSED_TENSORS, MLX)
#: The formats ``--format`` / ``output_format=`` may ask for.
CHOOSABLE = ("safetensors", "burnpack", "compressed-tensors", "mlx")


def by_name(name: str) -> Format:
    for f in FORMATS:
        if f.name == name:
            return f
    raise KeyError(name)


def from_extension(path: Any) -> Format | None:
    """The format ``path``'s name asks for, or None."""
    return next((f for f in FORMATS if f.suffixes and f.named_by(path)), None)


def from_content(head: bytes, size: int) -> Format | None:
    """The format of a file of ``size`` bytes starting with ``head`` (9 bytes or more), or None.

    Safetensors first, by its own structure: it has no magic, and its first bytes (the header's
    length) can be anything, a pickle's 0x80 0x02 or a zip's "PK" included (a 640- or
    19,280-byte header). None of the others passes this test: their first eight bytes read as a
    length past the header limit or the file, or byte 8 is not "{"."""
    if looks_like_safetensors(head, size):
        return SAFETENSORS
    return next((f for f in FORMATS if f.magic is not None and head.startswith(f.magic)), None)


def looks_like_safetensors(head: bytes, size: int) -> bool:
    """A header length the safetensors library accepts (at most ``MAX_HEADER``, within the
    file), then the JSON object it must start with."""
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= min(MAX_HEADER, size - 8) and head[8:9] == b"{"


def read_head(path: Path, n: int = 9) -> tuple[bytes, int]:
    """The first ``n`` bytes of the regular file ``path`` and its size. Opened without blocking
    and checked before a byte is read: a named pipe would wait for a writer forever, and a
    device (/dev/zero) has no size to check a header against. Raises CheckpointError."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(path, None, "is not a regular file (a pipe, a device or a "
                                      "socket); blockquant reads checkpoint files")
            return f.read(n), st.st_size
    except OSError as e:
        raise CheckpointError(path, None, os_reason(e)) from None


def detect(path: Any) -> Format:
    """The format of an existing ``path``: a folder; a file by its first bytes, else by its
    extension (ONNX). Anything else is a CheckpointError naming the file."""
    p = Path(path)
    if p.is_dir():
        return FOLDER
    head, size = read_head(p)
    found = from_content(head, size) or from_extension(p)
    if found is None:
        raise CheckpointError(p, None, "is not a file format blockquant reads (safetensors, "
                              "burn .bpk, GGUF, ONNX, .npz, .npy, or a model folder)")
    return found


#: Extensions of formats blockquant does not write, and what they name: an OUT named so is
#: refused rather than written as safetensors under a name that says otherwise.
FOREIGN_SUFFIXES = {
    ".npz": "numpy's archive", ".npy": "numpy's array", ".pt": "a PyTorch pickle",
    ".pth": "a PyTorch pickle", ".bin": "a PyTorch pickle (pytorch_model.bin)",
    ".ckpt": "a PyTorch Lightning checkpoint", ".pkl": "a pickle", ".pickle": "a pickle",
    ".h5": "an HDF5 (Keras) file", ".keras": "a Keras file", ".msgpack": "a Flax checkpoint",
    ".tflite": "a TensorFlow Lite model", ".json": "a JSON file", ".zip": "a zip archive",
    ".onnx": "an ONNX model", ".gguf": "a GGUF file", ".bpk": "a burn-pack file",
}  # fmt: skip

QUANTIZE_WRITES = (".safetensors, .bpk (burn), .gguf (from a GGUF input), .onnx (from an ONNX "
                   "model) or a folder (OUT ending in /)")


def check_output_name(dst: Any, writes: str, allowed: tuple[str, ...] = ()) -> None:
    """A CheckpointError when ``dst``'s extension names a format other than the one written
    (``writes`` lists what the command writes); a name with no such extension, or naming a
    folder, is left alone."""
    if names_folder(dst):
        return
    suffix = Path(str(dst)).suffix.lower()
    if suffix in FOREIGN_SUFFIXES and suffix not in allowed:
        raise CheckpointError(dst, None, f"{suffix} names {FOREIGN_SUFFIXES[suffix]}, which "
                              f"this command does not write; it writes {writes}")


def refuse_model_output(dst: Any, fmt: Format) -> None:
    """A GGUF or ONNX output asked of a function that writes checkpoints of tensors: those
    runs have planners of their own, behind the front door."""
    raise CheckpointError(dst, None, f"{fmt.name} output is written by blockquant.quantize_file "
                          "and the blockquant command (checkpoint.registry plans it), not here")


def names_folder(dst: Any) -> bool:
    """A trailing slash means a folder, as for cp; so does an existing folder."""
    return str(dst).endswith(("/", os.sep)) or Path(dst).is_dir()


def output_format(src: Any, dst: Any, requested: str | None = None) -> Format:
    """The format a quantize run from ``src`` to ``dst`` writes, decided here only:

    - an ONNX model (IN or OUT named .onnx) is quantized into an ONNX model;
    - OUT named .gguf is GGUF (requantized from a GGUF IN, as llama-quantize);
    - ``requested`` (``--format``: safetensors, burnpack or compressed-tensors) otherwise, else burnpack for an OUT
      named .bpk that is not a folder, else safetensors;
    - an IN folder, or an OUT that names a folder, gives a folder of files of that format
      (:func:`into_folder` says so; the files' format is the one returned).

    An unknown ``requested`` is a CheckpointError naming OUT."""
    if ONNX.named_by(src) or ONNX.named_by(dst):
        return ONNX
    if GGUF.named_by(dst):
        return GGUF
    if requested is not None and requested not in CHOOSABLE:
        raise CheckpointError(dst, None, f"unknown output format {requested!r}")
    if requested in (COMPRESSED_TENSORS.name, MLX.name):  # folders; their planners check IN
        return by_name(requested)
    if not Path(src).is_dir():  # a folder's planner says what a folder is written as
        check_output_name(dst, QUANTIZE_WRITES, allowed=(".bpk",))
    if requested is not None:
        return by_name(requested)
    if BURNPACK.named_by(dst) and not names_folder(dst):
        return BURNPACK
    return SAFETENSORS
