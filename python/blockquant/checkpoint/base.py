"""What every checkpoint reader shares: the error, the description of one tensor, the reader
interface, and the dtype vocabulary.

Dtypes are spelled as safetensors spells them (``F32``, ``BF16``, ``U8``, ...) whatever the
file: it is the format every command writes, so a tensor read from a ``.npz`` is described in
the terms it will be written in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from .._text import printable
from ..errors import QuantError

if TYPE_CHECKING:
    from typing_extensions import Self

#: safetensors dtype -> (bits per element, numpy dtype or None when numpy has none)
ST_DTYPES: dict[str, tuple[int, np.dtype | None]] = {
    "BOOL": (8, np.dtype(np.bool_)),
    "U8": (8, np.dtype("u1")),
    "I8": (8, np.dtype("i1")),
    "U16": (16, np.dtype("<u2")),
    "I16": (16, np.dtype("<i2")),
    "U32": (32, np.dtype("<u4")),
    "I32": (32, np.dtype("<i4")),
    "U64": (64, np.dtype("<u8")),
    "I64": (64, np.dtype("<i8")),
    "F16": (16, np.dtype("<f2")),
    "F32": (32, np.dtype("<f4")),
    "F64": (64, np.dtype("<f8")),
    "C64": (64, np.dtype("<c8")),
    "BF16": (16, None),
    "F8_E4M3": (8, None),
    "F8_E5M2": (8, None),
    "F8_E8M0": (8, None),
    "F4": (4, None),
    "F6_E2M3": (6, None),
    "F6_E3M2": (6, None),
}
#: The dtypes quantize reads as numbers, and their names in the metadata.
FLOAT_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
#: A metadata dtype name -> its safetensors name.
NAME_TO_ST = {v: k for k, v in FLOAT_DTYPES.items()}
#: A native-order numpy dtype -> its safetensors name.
NP_TO_ST = {
    np.dtype(np.bool_): "BOOL",
    np.dtype("u1"): "U8",
    np.dtype("i1"): "I8",
    np.dtype("u2"): "U16",
    np.dtype("i2"): "I16",
    np.dtype("u4"): "U32",
    np.dtype("i4"): "I32",
    np.dtype("u8"): "U64",
    np.dtype("i8"): "I64",
    np.dtype("f2"): "F16",
    np.dtype("f4"): "F32",
    np.dtype("f8"): "F64",
    np.dtype("c8"): "C64",
}


class CheckpointError(QuantError):
    """A checkpoint that cannot be read, written or quantized; the message names the file and,
    where there is one, the tensor: ``FILE: TENSOR: what is wrong``."""

    def __init__(self, path: Any, tensor: str | None, message: str) -> None:
        self.path = str(path)
        self.tensor = tensor
        # One line, printable: a crafted name cannot break the line or send terminal escapes.
        self.reason = printable(" ".join(str(message).split()))
        where = printable(self.path if tensor is None else f"{self.path}: {tensor}")
        super().__init__(f"{where}: {self.reason}")

    def __reduce__(self) -> Any:  # pickled across the processes of --jobs
        return (_rebuild_error, (type(self), self.path, self.tensor, self.reason, str(self)))


def _rebuild_error(cls: type, path: str, tensor: str | None, reason: str,
                   text: str) -> CheckpointError:
    e = cls.__new__(cls)
    Exception.__init__(e, text)
    e.path, e.tensor, e.reason = path, tensor, reason
    return e


def os_reason(e: OSError) -> str:
    return e.strerror or str(e)


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def st_nbytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    """Bytes of a tensor, or None for a dtype whose size this package does not know."""
    if dtype not in ST_DTYPES:
        return None
    return (numel(shape) * ST_DTYPES[dtype][0] + 7) // 8


def to_le_bytes(arr: np.ndarray) -> np.ndarray:
    """A flat uint8 view of ``arr`` in C order, little-endian (a copy only when needed)."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr.reshape(-1).view(np.uint8)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint, as its header describes it (nothing read yet)."""

    name: str
    dtype: str | None  # safetensors name ("F32", ...); None when safetensors has none
    shape: tuple[int, ...]
    nbytes: int
    np_dtype: np.dtype | None = None  # .npz/.npy: the array's own dtype

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    @property
    def dequantized_on_read(self) -> bool:
        """Whether reading gives float32 values decoded from another tool's quantized type (a
        GGUF Q4_0 tensor, say): such a tensor is written as float32 when it is not quantized,
        and quantizing it again takes ``allow_requantize``."""
        return False

    @property
    def read_dtype(self) -> str | None:
        """The safetensors dtype of what :meth:`Checkpoint.read` gives."""
        return "F32" if self.dequantized_on_read else self.dtype

    @property
    def read_nbytes(self) -> int:
        """Bytes of what :meth:`Checkpoint.read` gives."""
        return self.numel * 4 if self.dequantized_on_read else self.nbytes

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def dtype_name(self) -> str:
        """numpy's name for the dtype where it has one (bfloat16 too), else safetensors'."""
        if self.np_dtype is not None:
            return str(self.np_dtype.newbyteorder("="))
        if self.dtype in FLOAT_DTYPES:
            return FLOAT_DTYPES[self.dtype]
        np_dtype = ST_DTYPES.get(self.dtype or "", (0, None))[1]
        return str(np_dtype.newbyteorder("=")) if np_dtype is not None else str(self.dtype)


class Checkpoint:
    """An open checkpoint: ``tensors`` (in file order), ``metadata``, and reads of one tensor at
    a time. Use :func:`~blockquant.checkpoint.open_checkpoint`; close it (or use ``with``)."""

    format = "?"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.metadata: dict[str, str] = {}
        self.tensors: list[TensorInfo] = []
        self._by_name: dict[str, TensorInfo] = {}

    def _index(self) -> None:
        self._by_name = {t.name: t for t in self.tensors}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    def info(self, name: str) -> TensorInfo:
        return self._by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def error(self, tensor: str | None, message: str) -> CheckpointError:
        return CheckpointError(self.path, tensor, message)

    def read(self, name: str) -> np.ndarray:
        """The tensor as a native-order numpy array. BF16 comes back as float32 (exactly: a
        bfloat16 is the top half of a float32); a dtype numpy lacks is an error."""
        raise NotImplementedError

    def copy_to(self, name: str, out: BinaryIO) -> None:
        """Write the tensor's little-endian bytes, as safetensors holds them, to ``out``."""
        raise NotImplementedError
