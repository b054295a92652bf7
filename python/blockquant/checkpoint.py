"""Quantizing whole checkpoints: reading ``.safetensors`` / ``.npz`` / ``.npy`` files one tensor
at a time, and writing quantized ``.safetensors`` files that read back without guessing.

No dependency beyond numpy: safetensors files are read and written here (the format is an 8-byte
little-endian header length, a JSON header, then the raw little-endian tensor bytes), so memory
stays bounded by the largest tensor and bfloat16 needs no extra package.

The quantized file (format 1). For each quantized tensor ``NAME``:

- ``NAME.values``: the value storage as it is (SPEC §8): I8, U8 or U32, in the storage shape;
- ``NAME.scales``: the stored scales (block scales, or the one per-tensor scale) in the grid's
  shape, encoded in their own dtype so the file is as small as the format: F32 and F16 as
  themselves, BF16 as its U16 bits, UE8M0 and UE4M3 as their U8 codes (burn's bytes, SPEC §9);
- ``NAME.global_scale`` (two-level schemes only): the per-tensor scale g, F32, shape ``()``.

The header's ``__metadata__`` keeps the input's own metadata and adds one key, ``blockquant``: a
JSON object ``{"format": 1, "tensors": {NAME: {"scheme", "shape", "dtype", "values", "scales",
"global_scale"?, "calibration", "rounding", "scale_rounding"}}}`` with the scheme in its text
form (``QuantScheme.parse``), the original shape and dtype (float16, bfloat16, float32, float64).
Every other tensor (not floating point, or left out by include/exclude) is copied unchanged
under its own name. A name used twice in the output (say an input that already has both ``w``
and ``w.values``) is an error, never an overwrite.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import struct
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from . import _core
from .errors import QuantError
from .qtensor import QTensor, quantize
from .scheme import QuantScheme, ScaleDtype

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "SafetensorsWriter",
    "TensorInfo",
    "dequantize_file",
    "inspect_file",
    "open_checkpoint",
    "quantize_file",
    "report_file",
]

FORMAT_VERSION = 1
META_KEY = "blockquant"
MAX_HEADER = 100_000_000  # as the safetensors library
_CHUNK = 64 << 20

#: safetensors dtype -> (bits per element, numpy dtype or None when numpy has none)
_ST_DTYPES: dict[str, tuple[int, np.dtype | None]] = {
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
_NAME_TO_ST = {v: k for k, v in FLOAT_DTYPES.items()}
_NP_TO_ST = {
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
_STORAGE_TO_ST = {"int8": "I8", "uint8": "U8", "uint32": "U32"}
#: How each scale dtype's codes are stored in the file.
_SCALE_TO_ST = {
    ScaleDtype.F32: "F32",
    ScaleDtype.F16: "F16",
    ScaleDtype.BF16: "U16",
    ScaleDtype.UE8M0: "U8",
    ScaleDtype.UE4M3: "U8",
}


class CheckpointError(QuantError):
    """A checkpoint that cannot be read, written or quantized; the message names the file and,
    where there is one, the tensor: ``FILE: TENSOR: what is wrong``."""

    def __init__(self, path: Any, tensor: str | None, message: str) -> None:
        self.path = str(path)
        self.tensor = tensor
        self.reason = " ".join(str(message).split())  # one line
        where = self.path if tensor is None else f"{self.path}: {tensor}"
        super().__init__(f"{where}: {self.reason}")


def _os_reason(e: OSError) -> str:
    return e.strerror or str(e)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _st_nbytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    """Bytes of a tensor, or None for a dtype whose size this module does not know."""
    if dtype not in _ST_DTYPES:
        return None
    return (_numel(shape) * _ST_DTYPES[dtype][0] + 7) // 8


# -- reading ----------------------------------------------------------------------------------
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
    def numel(self) -> int:
        return _numel(self.shape)

    @property
    def dtype_name(self) -> str:
        """numpy's name for the dtype where it has one (bfloat16 too), else safetensors'."""
        if self.np_dtype is not None:
            return str(self.np_dtype.newbyteorder("="))
        if self.dtype in FLOAT_DTYPES:
            return FLOAT_DTYPES[self.dtype]
        np_dtype = _ST_DTYPES.get(self.dtype or "", (0, None))[1]
        return str(np_dtype.newbyteorder("=")) if np_dtype is not None else str(self.dtype)


class Checkpoint:
    """An open checkpoint: ``tensors`` (in file order), ``metadata``, and reads of one tensor at
    a time. Use :func:`open_checkpoint`; close it (or use ``with``)."""

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


class SafetensorsCheckpoint(Checkpoint):
    format = "safetensors"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._f = open(path, "rb")  # noqa: SIM115 - open while the checkpoint is
        try:
            self._parse_header()
        except BaseException:
            self._f.close()
            raise

    def _parse_header(self) -> None:
        size = os.fstat(self._f.fileno()).st_size
        head = self._f.read(8)
        if len(head) < 8:
            raise self.error(None, f"not a safetensors file: {size} bytes, too short for a header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > MAX_HEADER:
            raise self.error(
                None,
                f"not a safetensors file, or truncated: its header claims {n} bytes, "
                f"the file has {size - 8} after the length",
            )
        raw = self._f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise self.error(None, f"malformed safetensors header: {e}") from None
        if not isinstance(header, dict):
            raise self.error(None, "malformed safetensors header: not a JSON object")
        self._data_start = 8 + n
        data_len = size - self._data_start
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise self.error(None, "malformed safetensors header: __metadata__ is not str -> str")
        self.metadata = dict(meta)
        self._offsets: dict[str, tuple[int, int]] = {}
        entries = []
        for name, e in header.items():
            try:
                dtype, shape, (a, b) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
                ok = (
                    isinstance(dtype, str)
                    and all(type(d) is int and d >= 0 for d in shape)
                    and type(a) is int
                    and type(b) is int
                )
            except (TypeError, KeyError, ValueError):
                ok = False
            if not ok:
                raise self.error(name, f"malformed safetensors header entry {json.dumps(e)}")
            if not 0 <= a <= b <= data_len:
                raise self.error(
                    name,
                    f"data offsets [{a}, {b}] reach past the {data_len} data bytes "
                    "(truncated file?)",
                )
            expected = _st_nbytes(dtype, shape)
            whole_bytes = _ST_DTYPES.get(dtype, (1, None))[0] % 8 == 0
            if expected is not None and whole_bytes and expected != b - a:
                raise self.error(
                    name, f"{dtype} {list(shape)} takes {expected} bytes, its offsets span {b - a}"
                )
            self._offsets[name] = (a, b)
            entries.append((a, TensorInfo(name, dtype, shape, b - a)))
        # File order: the order of the data, which is the order a reader streams fastest.
        entries.sort(key=lambda t: t[0])
        self.tensors = [t for _, t in entries]
        self._index()

    def close(self) -> None:
        self._f.close()

    def _read_bytes(self, name: str) -> bytes:
        a, b = self._offsets[name]
        self._f.seek(self._data_start + a)
        data = self._f.read(b - a)
        if len(data) != b - a:
            raise self.error(name, "file ends inside the tensor's data (truncated?)")
        return data

    def read(self, name: str) -> np.ndarray:
        t = self.info(name)
        data = self._read_bytes(name)
        if t.dtype == "BF16":
            bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(t.shape)
        np_dtype = _ST_DTYPES.get(t.dtype, (0, None))[1]
        if np_dtype is None:
            raise self.error(name, f"dtype {t.dtype} has no numpy equivalent")
        arr = np.frombuffer(data, dtype=np_dtype).reshape(t.shape)
        return arr.astype(np_dtype.newbyteorder("="), copy=False)

    def copy_to(self, name: str, out: BinaryIO) -> None:
        a, b = self._offsets[name]
        self._f.seek(self._data_start + a)
        left = b - a
        while left:
            chunk = self._f.read(min(left, _CHUNK))
            if not chunk:
                raise self.error(name, "file ends inside the tensor's data (truncated?)")
            out.write(chunk)
            left -= len(chunk)


def _npy_info(name: str, fp: BinaryIO) -> tuple[np.dtype, tuple[int, ...], bool]:
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
    else:
        raise ValueError(f".npy format version {version} is not supported")
    return np.dtype(dtype), tuple(int(d) for d in shape), bool(fortran)


def _np_info(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> TensorInfo:
    st = _NP_TO_ST.get(dtype.newbyteorder("=")) if dtype.kind != "V" else None
    return TensorInfo(name, st, shape, _numel(shape) * dtype.itemsize, np_dtype=dtype)


def _to_le_bytes(arr: np.ndarray) -> np.ndarray:
    """A flat uint8 view of ``arr`` in C order, little-endian (a copy only when needed)."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not _LITTLE):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr.reshape(-1).view(np.uint8)


_LITTLE = np.little_endian


class NpzCheckpoint(Checkpoint):
    format = "npz"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        try:
            self._zip = zipfile.ZipFile(path)
        except zipfile.BadZipFile as e:
            raise self.error(None, f"not a valid .npz file: {e}") from None
        try:
            self._members: dict[str, str] = {}
            for member in self._zip.namelist():
                if not member.endswith(".npy"):
                    raise self.error(member, "not a .npy array inside the .npz")
                name = member[: -len(".npy")]
                try:
                    with self._zip.open(member) as fp:
                        dtype, shape, _ = _npy_info(name, fp)
                except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
                    raise self.error(name, f"malformed array: {e}") from None
                self._members[name] = member
                self.tensors.append(_np_info(name, dtype, shape))
            self._index()
        except BaseException:
            self._zip.close()
            raise

    def close(self) -> None:
        self._zip.close()

    def read(self, name: str) -> np.ndarray:
        try:
            with self._zip.open(self._members[name]) as fp:
                arr = np.lib.format.read_array(fp, allow_pickle=False)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
            raise self.error(name, f"cannot read the array: {e}") from None
        return arr.astype(arr.dtype.newbyteorder("="), copy=False)

    def copy_to(self, name: str, out: BinaryIO) -> None:
        out.write(_to_le_bytes(self.read(name)))


class NpyCheckpoint(Checkpoint):
    format = "npy"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._name = path.stem or "tensor"
        with open(path, "rb") as fp:
            try:
                dtype, shape, _ = _npy_info(self._name, fp)
            except (ValueError, EOFError) as e:
                raise self.error(None, f"malformed .npy file: {e}") from None
        self.tensors = [_np_info(self._name, dtype, shape)]
        self._index()

    def read(self, name: str) -> np.ndarray:
        try:
            arr = np.load(self.path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise self.error(name, f"cannot read the array: {e}") from None
        return arr.astype(arr.dtype.newbyteorder("="), copy=False)

    def copy_to(self, name: str, out: BinaryIO) -> None:
        out.write(_to_le_bytes(self.read(name)))


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
        raise CheckpointError(p, None, _os_reason(e)) from None


# -- writing ----------------------------------------------------------------------------------
@dataclass
class _Out:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int = 0
    written: bool = False


class SafetensorsWriter:
    """Writes a safetensors file one tensor at a time, in any order.

    The header is computed up front from names, dtypes and shapes; the data goes into a
    temporary file next to ``path`` (tensors sorted by alignment, so each starts on a multiple
    of its element size) and :meth:`commit` renames it into place once every tensor is written.
    Until then ``path`` is untouched; :meth:`abort` (or leaving a ``with`` block on an
    exception) removes the temporary file. Without ``force`` an existing ``path`` is never
    replaced.
    """

    def __init__(
        self,
        path: Any,
        tensors: list[tuple[str, str, tuple[int, ...], int]],
        metadata: dict[str, str] | None = None,
        *,
        force: bool = False,
    ) -> None:
        self.path = Path(path)
        self.force = force
        self._check_target()
        outs = [_Out(n, d, tuple(s), b) for n, d, s, b in tensors]
        self._outs = {o.name: o for o in outs}
        if len(self._outs) != len(outs) or "__metadata__" in self._outs:
            raise CheckpointError(self.path, None, "duplicate tensor names")

        def align(o: _Out) -> int:
            bits = _ST_DTYPES.get(o.dtype, (8, None))[0]
            return bits // 8 if bits % 8 == 0 else 1

        order = sorted(range(len(outs)), key=lambda i: (-align(outs[i]), i))
        offset = 0
        header: dict[str, Any] = {}
        if metadata:
            header["__metadata__"] = dict(metadata)
        for i in order:
            o = outs[i]
            o.offset = offset
            header[o.name] = {
                "dtype": o.dtype,
                "shape": list(o.shape),
                "data_offsets": [offset, offset + o.nbytes],
            }
            offset += o.nbytes
        raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # data starts 8-aligned, as the safetensors library does
        self._data_start = 8 + len(raw)
        self._total = self._data_start + offset
        self._tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            self._f: BinaryIO | None = os.fdopen(fd, "wb")
            self._f.write(struct.pack("<Q", len(raw)))
            self._f.write(raw)
        except OSError as e:
            self.abort()
            raise CheckpointError(self.path, None, f"cannot write: {_os_reason(e)}") from None

    def _check_target(self) -> None:
        if self.path.is_dir():
            raise CheckpointError(self.path, None, "is a directory")
        if not self.path.parent.is_dir():
            raise CheckpointError(self.path, None, f"no such directory {str(self.path.parent)!r}")
        if self.path.exists() and not self.force:
            raise CheckpointError(self.path, None, "already exists (--force replaces it)")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None or self._f is not None:
            self.abort()

    def _seek(self, name: str) -> BinaryIO:
        o = self._outs[name]
        if o.written:
            raise ValueError(f"tensor {name!r} written twice")
        assert self._f is not None
        self._f.seek(self._data_start + o.offset)
        return self._f

    def _done(self, name: str) -> None:
        o = self._outs[name]
        assert self._f is not None
        if self._f.tell() != self._data_start + o.offset + o.nbytes:
            raise ValueError(f"tensor {name!r}: wrote a wrong number of bytes")
        o.written = True

    def write(self, name: str, data: Any) -> None:
        """Write a tensor: a numpy array (converted to little-endian) or raw bytes."""
        buf = _to_le_bytes(data) if isinstance(data, np.ndarray) else memoryview(data).cast("B")
        if len(buf) != self._outs[name].nbytes:
            raise ValueError(
                f"tensor {name!r} takes {self._outs[name].nbytes} bytes, got {len(buf)}"
            )
        self._io(lambda: self._seek(name).write(buf))
        self._done(name)

    def write_from(self, name: str, source: Checkpoint, source_name: str) -> None:
        """Copy a tensor's bytes from an open checkpoint, in chunks."""
        self._io(lambda: source.copy_to(source_name, self._seek(name)))
        self._done(name)

    def _io(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except OSError as e:
            raise CheckpointError(self.path, None, f"cannot write: {_os_reason(e)}") from None

    def commit(self) -> None:
        missing = [o.name for o in self._outs.values() if not o.written]
        if missing:
            raise ValueError(f"tensors never written: {missing[:5]}")
        f, self._f = self._f, None
        assert f is not None
        try:
            f.truncate(self._total)
            f.flush()
            os.fsync(f.fileno())
            f.close()
            if self.force:
                os.replace(self._tmp, self.path)
            else:
                try:
                    os.link(self._tmp, self.path)  # fails if path exists: never clobbers
                    os.unlink(self._tmp)
                except FileExistsError:
                    raise CheckpointError(
                        self.path, None, "already exists (--force replaces it)"
                    ) from None
                except OSError:  # a filesystem without hard links
                    if self.path.exists():
                        raise CheckpointError(
                            self.path, None, "already exists (--force replaces it)"
                        ) from None
                    os.replace(self._tmp, self.path)
        except OSError as e:
            self.abort()
            raise CheckpointError(self.path, None, f"cannot write: {_os_reason(e)}") from None
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        f, self._f = getattr(self, "_f", None), None
        if f is not None:
            f.close()
        try:
            os.unlink(self._tmp)
        except (OSError, AttributeError):
            pass


# -- quantized tensors in a file ----------------------------------------------------------------
@dataclass
class _Entry:
    """A quantized tensor's metadata entry."""

    name: str
    scheme: QuantScheme
    shape: tuple[int, ...]
    dtype: str  # float16 / bfloat16 / float32 / float64
    parts: dict[str, str]  # "values"/"scales"/"global_scale" -> tensor name
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"scheme": str(self.scheme), "shape": list(self.shape)}
        d["dtype"] = self.dtype
        d.update(self.parts)
        d.update(self.extra)
        return d


def _part_layout(
    name: str, scheme: QuantScheme, shape: tuple[int, ...]
) -> list[tuple[str, str, tuple[int, ...], int]]:
    """The output tensors holding ``name`` quantized with ``scheme``: (name, dtype, shape, bytes).
    Raises SchemeError when the tensor cannot take the scheme."""
    storage_shape, storage_dtype, grid, total = _core.layout_info(scheme._spec(), shape)
    storage_shape, grid = tuple(storage_shape), tuple(grid)
    vals = (f"{name}.values", _STORAGE_TO_ST[storage_dtype], storage_shape,
            _numel(storage_shape) * np.dtype(storage_dtype).itemsize)
    scales = (f"{name}.scales", _SCALE_TO_ST[scheme.scale_dtype], grid,
              _numel(grid) * scheme.scale_dtype.nbytes)
    parts = [vals, scales]
    if scheme.is_two_level:
        parts.append((f"{name}.global_scale", "F32", (), 4))
    assert sum(p[3] for p in parts) == total, (name, scheme, shape)
    return parts


def _read_entries(ckpt: Checkpoint) -> dict[str, _Entry]:
    """The quantized tensors a blockquant file declares (empty for any other file)."""
    raw = ckpt.metadata.get(META_KEY)
    if raw is None:
        return {}
    try:
        meta = json.loads(raw)
        version = meta["format"]
        tensors = meta["tensors"]
        if not isinstance(tensors, dict):
            raise TypeError("'tensors' is not an object")
    except (ValueError, KeyError, TypeError) as e:
        raise ckpt.error(None, f"malformed blockquant metadata: {e}") from None
    if version != FORMAT_VERSION:
        raise ckpt.error(
            None, f"blockquant format {version!r}: this version reads format {FORMAT_VERSION}"
        )
    out: dict[str, _Entry] = {}
    owner: dict[str, str] = {}
    for name, d in tensors.items():
        try:
            scheme = QuantScheme.parse(d["scheme"])
            shape = tuple(d["shape"])
            if not all(type(s) is int and s >= 0 for s in shape):
                raise ValueError(f"bad shape {d['shape']!r}")
            dtype = d["dtype"]
            if dtype not in _NAME_TO_ST:
                raise ValueError(f"bad dtype {dtype!r}")
            keys = ("values", "scales", "global_scale") if scheme.is_two_level else (
                "values", "scales")
            parts = {k: d[k] for k in keys}
        except (QuantError, ValueError, KeyError, TypeError) as e:
            raise ckpt.error(name, f"malformed blockquant metadata: {e}") from None
        for key, part in parts.items():
            if part not in ckpt:
                raise ckpt.error(name, f"its {key} tensor {part!r} is missing")
            if part in owner:
                raise ckpt.error(name, f"its {key} tensor {part!r} belongs to {owner[part]!r} too")
            owner[part] = name
        extra = {k: v for k, v in d.items() if k not in ("scheme", "shape", "dtype", *keys)}
        out[name] = _Entry(name, scheme, shape, dtype, parts, extra)
    return out


def _load_qtensor(ckpt: Checkpoint, e: _Entry) -> QTensor:
    """Rebuild a quantized tensor from its parts; everything is checked (QTensor.from_parts)."""
    try:
        expected = _part_layout(e.name, e.scheme, e.shape)
    except QuantError as err:
        raise ckpt.error(e.name, str(err)) from None
    blob = bytearray()
    for (_key, part), (_, dtype, shape, _) in zip(e.parts.items(), expected):
        t = ckpt.info(part)
        if t.dtype != dtype or t.shape != shape:
            raise ckpt.error(
                e.name,
                f"{part} is {t.dtype} {list(t.shape)}, {e.scheme} on {list(e.shape)} stores "
                f"{dtype} {list(shape)}",
            )
        blob += ckpt.read(part).astype(_ST_DTYPES[dtype][1], copy=False).tobytes()
    try:
        # from_bytes decodes the scale codes (burn's layout is exactly the parts in a row);
        # from_parts then checks every value code and scale.
        qt = QTensor.from_bytes(bytes(blob), e.scheme, e.shape)
        return QTensor.from_parts(qt.values, qt.scales, e.scheme, e.shape, qt.global_scale)
    except QuantError as err:
        raise ckpt.error(e.name, str(err)) from None


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return r


def _float_out(x: np.ndarray, dtype: str) -> np.ndarray:
    """A float32 array as the safetensors-ready array of ``dtype`` (a metadata dtype name)."""
    if dtype == "bfloat16":
        return _bf16_bits(x)
    return x.astype(dtype, copy=False)


# -- the commands, as functions -----------------------------------------------------------------
Progress = Callable[[str, int], None]  # (tensor name, input bytes done with it)


def _no_progress(name: str, nbytes: int) -> None:
    pass


def _compile(pattern: str | None, what: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise CheckpointError(what, None, f"bad regular expression {pattern!r}: {e}") from None


def _selected(
    t: TensorInfo, include: re.Pattern[str] | None, exclude: re.Pattern[str] | None
) -> bool:
    if not t.is_float:
        return False
    if include is not None and not include.search(t.name):
        return False
    return not (exclude is not None and exclude.search(t.name))


def _check_not_quantized(ckpt: Checkpoint) -> None:
    if META_KEY in ckpt.metadata:
        raise ckpt.error(
            None, "already holds blockquant-quantized tensors (dequantize it first)"
        )


def _copy_layout(ckpt: Checkpoint, t: TensorInfo) -> tuple[str, str, tuple[int, ...], int]:
    if t.dtype is None:
        raise ckpt.error(t.name, f"dtype {t.dtype_name} cannot be stored in a safetensors file")
    return (t.name, t.dtype, t.shape, t.nbytes)


def _check_names(
    ckpt: Checkpoint, layout: list[tuple[str, str, tuple[int, ...], int]], owners: list[str]
) -> None:
    seen: dict[str, str] = {}
    for (name, *_), owner in zip(layout, owners):
        if name in seen or name == "__metadata__":
            other = seen.get(name, "the header")
            raise ckpt.error(
                owner,
                f"output name {name!r} is taken twice (by {other!r} and {owner!r}): rename or "
                "--exclude one of them",
            )
        seen[name] = owner


@dataclass
class QuantizeSummary:
    quantized: list[str]
    copied: list[str]
    bytes_in: int
    bytes_out: int
    seconds: float


def quantize_file(
    src: Any,
    dst: Any,
    scheme: QuantScheme,
    *,
    include: str | None = None,
    exclude: str | None = None,
    calibration: str = "minmax",
    rounding: str = "half_away",
    scale_rounding: str = "up",
    force: bool = False,
    progress: Progress = _no_progress,
) -> QuantizeSummary:
    """Quantize every floating-point tensor of ``src`` whose name matches ``include`` and not
    ``exclude`` (``re.search``) and write the result to ``dst`` (see the module doc). One tensor
    is in memory at a time. Raises :class:`CheckpointError` (nothing written) on any problem."""
    t0 = time.perf_counter()
    inc, exc = _compile(include, "--include"), _compile(exclude, "--exclude")
    with open_checkpoint(src) as ckpt:
        _check_not_quantized(ckpt)
        plan: list[tuple[TensorInfo, list[Any] | None]] = []  # (tensor, its parts or None)
        layout: list[tuple[str, str, tuple[int, ...], int]] = []
        owners: list[str] = []
        entries: dict[str, Any] = {}
        for t in ckpt.tensors:
            if _selected(t, inc, exc):
                try:
                    parts = _part_layout(t.name, scheme, t.shape)
                except QuantError as e:
                    raise ckpt.error(t.name, f"{e} (leave it out with --exclude)") from None
                layout += parts
                owners += [t.name] * len(parts)
                entries[t.name] = _Entry(
                    t.name, scheme, t.shape, FLOAT_DTYPES[t.dtype or ""],
                    {k: p[0] for k, p in zip(("values", "scales", "global_scale"), parts)},
                    {"calibration": calibration, "rounding": rounding,
                     "scale_rounding": scale_rounding},
                ).to_json()
                plan.append((t, parts))
            else:
                layout.append(_copy_layout(ckpt, t))
                owners.append(t.name)
                plan.append((t, None))
        _check_names(ckpt, layout, owners)
        metadata = dict(ckpt.metadata)
        metadata[META_KEY] = json.dumps(
            {"format": FORMAT_VERSION, "tensors": entries}, separators=(",", ":")
        )
        with SafetensorsWriter(dst, layout, metadata, force=force) as w:
            for t, parts in plan:
                if parts is not None:
                    x = ckpt.read(t.name)
                    try:
                        qt = quantize(x, scheme, calibration=calibration, rounding=rounding,
                                      scale_rounding=scale_rounding)
                    except QuantError as e:
                        raise ckpt.error(t.name, str(e)) from None
                    del x
                    blob = memoryview(qt.to_bytes())
                    at = 0
                    for part_name, _, _, nbytes in parts:
                        w.write(part_name, blob[at: at + nbytes])
                        at += nbytes
                    del qt, blob
                else:
                    w.write_from(t.name, ckpt, t.name)
                progress(t.name, t.nbytes)
            w.commit()
        bytes_out = os.path.getsize(dst)
    return QuantizeSummary(
        [t.name for t, parts in plan if parts is not None],
        [t.name for t, parts in plan if parts is None],
        sum(t.nbytes for t, _ in plan),
        bytes_out,
        time.perf_counter() - t0,
    )



def dequantize_file(
    src: Any,
    dst: Any,
    *,
    dtype: str | None = None,
    force: bool = False,
    progress: Progress = _no_progress,
) -> tuple[int, int]:
    """Turn a quantized file back into float tensors (each in its original dtype, or ``dtype``:
    float16, bfloat16, float32, float64), copying the other tensors and the metadata (less the
    ``blockquant`` key). Returns (tensors dequantized, tensors copied)."""
    if dtype is not None and dtype not in _NAME_TO_ST:
        raise CheckpointError("--dtype", None, f"expected one of {', '.join(_NAME_TO_ST)}")
    with open_checkpoint(src) as ckpt:
        entries = _read_entries(ckpt)
        if not entries:
            raise ckpt.error(None, "holds no blockquant-quantized tensor (nothing to dequantize)")
        part_of = {p: e.name for e in entries.values() for p in e.parts.values()}
        layout: list[tuple[str, str, tuple[int, ...], int]] = []
        plan: list[tuple[str, str]] = []  # ("deq" | "copy", name), in file order
        for t in ckpt.tensors:
            if t.name not in part_of:
                layout.append(_copy_layout(ckpt, t))
                plan.append(("copy", t.name))
            elif t.name == entries[part_of[t.name]].parts["values"]:
                e = entries[part_of[t.name]]
                st = _NAME_TO_ST[dtype or e.dtype]
                layout.append((e.name, st, e.shape, _st_nbytes(st, e.shape) or 0))
                plan.append(("deq", e.name))
        _check_names(ckpt, layout, [name for _, name in plan])
        metadata = {k: v for k, v in ckpt.metadata.items() if k != META_KEY}
        with SafetensorsWriter(dst, layout, metadata, force=force) as w:
            for kind, name in plan:
                if kind == "deq":
                    e = entries[name]
                    x = _load_qtensor(ckpt, e).dequantize()
                    w.write(name, _float_out(x, dtype or e.dtype))
                    progress(name, sum(ckpt.info(p).nbytes for p in e.parts.values()))
                else:
                    w.write_from(name, ckpt, name)
                    progress(name, ckpt.info(name).nbytes)
            w.commit()
    n_deq = sum(1 for k, _ in plan if k == "deq")
    return n_deq, len(plan) - n_deq


def inspect_file(src: Any) -> dict[str, Any]:
    """What a checkpoint holds: per tensor (a quantized one as one row) its scheme (None when
    not quantized), shape, dtype, bytes in the file and bits per value."""
    with open_checkpoint(src) as ckpt:
        entries = _read_entries(ckpt)
        part_of = {p: e.name for e in entries.values() for p in e.parts.values()}
        rows = []
        for t in ckpt.tensors:
            if t.name in part_of:
                e = entries[part_of[t.name]]
                if t.name != e.parts["values"]:
                    continue
                nbytes = sum(ckpt.info(p).nbytes for p in e.parts.values())
                rows.append({"name": e.name, "scheme": str(e.scheme), "shape": list(e.shape),
                                 "dtype": e.dtype, "bytes": nbytes, "numel": _numel(e.shape)})
            else:
                rows.append({"name": t.name, "scheme": None, "shape": list(t.shape),
                                 "dtype": t.dtype_name, "bytes": t.nbytes, "numel": t.numel})
        rows.sort(key=lambda r: natural_key(r["name"]))
        for r in rows:
            r["bits_per_value"] = 8.0 * r["bytes"] / r["numel"] if r["numel"] else None
        return {
            "file": str(src),
            "format": ckpt.format,
            "file_bytes": os.path.getsize(src),
            "metadata": {k: v for k, v in ckpt.metadata.items() if k != META_KEY},
            "tensors": rows,
        }


def natural_key(name: str) -> list[Any]:
    """Sort key that puts layer.2 before layer.10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _error_stats(x: np.ndarray, y: np.ndarray, chunk: int = 1 << 20) -> tuple[float, float, float]:
    """(sum x², sum (x - y)², max |x - y|) in float64, a chunk at a time (bounded memory)."""
    xf, yf = x.reshape(-1), y.reshape(-1)
    signal = noise = err = 0.0
    for i in range(0, xf.size, chunk):
        a = xf[i: i + chunk].astype(np.float64)
        d = a - yf[i: i + chunk]
        signal += float(np.dot(a, a))
        noise += float(np.dot(d, d))
        err = max(err, float(np.max(np.abs(d))))
    return signal, noise, err


def report_file(
    src: Any,
    scheme: QuantScheme,
    *,
    include: str | None = None,
    exclude: str | None = None,
    calibration: str = "minmax",
    rounding: str = "half_away",
    scale_rounding: str = "up",
    progress: Progress = _no_progress,
) -> dict[str, Any]:
    """Quantize each selected tensor in memory (nothing written) and measure it: SQNR (dB), max
    abs error, bytes before (in its own dtype) and after (values + scales, burn's layout), and
    quantize time. ``overall`` sums over the quantized tensors; ``file`` over every tensor."""
    inc, exc = _compile(include, "--include"), _compile(exclude, "--exclude")
    with open_checkpoint(src) as ckpt:
        _check_not_quantized(ckpt)
        chosen = [t for t in ckpt.tensors if _selected(t, inc, exc)]
        chosen_names = {t.name for t in chosen}
        for t in chosen:  # every error before any work
            try:
                _core.layout_info(scheme._spec(), t.shape)
            except QuantError as e:
                raise ckpt.error(t.name, f"{e} (leave it out with --exclude)") from None
        rows = []
        signal = noise = 0.0
        max_err = 0.0
        for t in ckpt.tensors:
            if t.name not in chosen_names:
                progress(t.name, t.nbytes)
                continue
            x = ckpt.read(t.name)
            t0 = time.perf_counter()
            try:
                qt = quantize(x, scheme, calibration=calibration, rounding=rounding,
                              scale_rounding=scale_rounding)
            except QuantError as e:
                raise ckpt.error(t.name, str(e)) from None
            seconds = time.perf_counter() - t0
            s, n, err = _error_stats(x, qt.dequantize())
            del x
            signal, noise, max_err = signal + s, noise + n, max(max_err, err)
            rows.append({"name": t.name, "shape": list(t.shape), "dtype": t.dtype_name,
                             "sqnr_db": _sqnr(s, n), "max_abs_err": err, "bytes_before": t.nbytes,
                             "bytes_after": qt.nbytes, "seconds": seconds})
            progress(t.name, t.nbytes)
        rows.sort(key=lambda r: natural_key(r["name"]))
        before = sum(r["bytes_before"] for r in rows)
        after = sum(r["bytes_after"] for r in rows)
        total = sum(t.nbytes for t in ckpt.tensors)
        rest = total - before
        return {
            "file": str(src),
            "scheme": str(scheme),
            "calibration": calibration,
            "rounding": rounding,
            "scale_rounding": scale_rounding,
            "tensors": rows,
            "overall": {
                "tensors": len(rows), "numel": sum(_numel(tuple(r["shape"])) for r in rows),
                "sqnr_db": _sqnr(signal, noise), "max_abs_err": max_err, "bytes_before": before,
                "bytes_after": after, "seconds": sum(r["seconds"] for r in rows),
            },
            "file_total": {
                "tensors": len(ckpt.tensors), "unquantized": len(ckpt.tensors) - len(rows),
                "bytes_before": total, "bytes_after": after + rest,
            },
        }

