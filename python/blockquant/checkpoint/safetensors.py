"""The safetensors format, read and written one tensor at a time.

A safetensors file is an 8-byte little-endian header length, a JSON header (per tensor: dtype,
shape, data offsets; plus an optional ``__metadata__`` of str -> str), then the raw
little-endian tensor bytes. Both directions are written here with numpy alone, so memory stays
bounded by the largest tensor and bfloat16 needs no extra package.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

import numpy as np

from .base import (
    ST_DTYPES,
    Checkpoint,
    CheckpointError,
    TensorInfo,
    numel,
    to_le_bytes,
)
from .outputs import OutputFile

if TYPE_CHECKING:
    from typing_extensions import Self

MAX_HEADER = 100_000_000  # as the safetensors library
MAX_DIM = (1 << 63) - 1  # a dimension must fit an i64 (the core and numpy take no larger)
_CHUNK = 64 << 20  # bytes copied at a time from one file to another


class HeaderEntry(NamedTuple):
    """One tensor of a file about to be written: what its header entry says."""

    name: str
    dtype: str  # safetensors name
    shape: tuple[int, ...]
    nbytes: int


# -- reading ----------------------------------------------------------------------------------
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
        except RecursionError:  # a crafted header nested thousands deep
            raise self.error(None, "malformed safetensors header: nested too deeply") from None
        if not isinstance(header, dict):
            raise self.error(None, "malformed safetensors header: not a JSON object")
        self._data_start = 8 + n
        data_len = size - self._data_start
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise self.error(None, "malformed safetensors header: __metadata__ is not str -> str")
        for text in (*header, *meta, *meta.values()):
            _check_text(self, text)
        self.metadata = dict(meta)
        self._offsets: dict[str, tuple[int, int]] = {}
        entries = []
        for name, e in header.items():
            try:
                dtype, shape, (a, b) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
                ok = (
                    isinstance(dtype, str)
                    and all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)
                    and type(a) is int
                    and type(b) is int
                )
            except (TypeError, KeyError, ValueError):
                ok = False
            if not ok:
                entry = json.dumps(e)
                entry = entry if len(entry) <= 200 else entry[:200] + "..."
                why = ""
                if isinstance(e, dict) and isinstance(e.get("shape"), list) and any(
                        type(d) is int and not 0 <= d <= MAX_DIM for d in e["shape"]):
                    why = " (dimensions are from 0 to 2^63 - 1)"
                raise self.error(name, f"malformed safetensors header entry {entry}{why}")
            if dtype not in ST_DTYPES:  # as the safetensors library: a closed list
                raise self.error(name, f"unknown dtype {dtype!r} (safetensors has "
                                 f"{', '.join(ST_DTYPES)})")
            if a < 0 or b < 0:
                raise self.error(name, f"data offsets [{a}, {b}] are negative")
            if a > b:
                raise self.error(name, f"data offsets [{a}, {b}] run backwards (begin after end)")
            if b > data_len:
                raise self.error(
                    name,
                    f"data offsets [{a}, {b}] reach past the {data_len} data bytes "
                    "(truncated file?)",
                )
            # numpy (and so the safetensors library's loader) refuses an array whose nonzero
            # dimensions' bytes pass 2^63 - 1, even an empty one: [0, 2^62] of F32 would be
            # copied into an output nothing else loads.
            span = ST_DTYPES[dtype][0]
            for d in shape:
                span *= max(d, 1)
            if span > 8 * MAX_DIM:
                raise self.error(name, f"{dtype} {list(shape)}: its dimensions span past 2^63 "
                                 "bytes, more than numpy (or the safetensors library) takes, "
                                 "even with a dimension of 0")
            # As the safetensors library: the bits of a sub-byte dtype (F4, F6_*) fill whole
            # bytes, and every tensor spans exactly its bytes.
            bits = numel(shape) * ST_DTYPES[dtype][0]
            if bits % 8:
                raise self.error(name, f"{dtype} {list(shape)} takes {bits} bits, not whole bytes")
            if bits // 8 != b - a:
                raise self.error(
                    name, f"{dtype} {list(shape)} takes {bits // 8} bytes, its offsets span {b - a}"
                )
            self._offsets[name] = (a, b)
            entries.append((a, b, TensorInfo(name, dtype, shape, b - a)))
        # File order: the order of the data, which is the order a reader streams fastest.
        entries.sort(key=lambda t: (t[0], t[1]))
        # The tensors tile the data, no gap, overlap or trailing bytes, as the safetensors
        # library requires (it refuses such files: bytes no tensor owns can hide another file).
        end = 0
        for a, b, t in entries:
            if a != end:
                what = "overlaps the tensor before it" if a < end else f"leaves bytes {end}..{a} unused"
                raise self.error(t.name, f"data offsets [{a}, {b}]: {what}")
            end = b
        if end != data_len:
            raise self.error(None, f"the tensors end at byte {end} of {data_len} data bytes "
                             "(bytes after them belong to no tensor)")
        self.tensors = [t for _, _, t in entries]
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
            bits = np.frombuffer(data, dtype="<u2").astype(np.uint32)
            del data
            bits <<= 16  # in place: the tensor's f32 is the one array it takes
            return bits.view(np.float32).reshape(t.shape)
        np_dtype = ST_DTYPES.get(t.dtype or "", (0, None))[1]
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


def _check_text(ckpt: Checkpoint, text: str) -> None:
    """A name or metadata string must be valid Unicode: JSON can spell a lone surrogate
    (``"\\ud800"``), which no UTF-8 writer, terminal or the safetensors library accepts."""
    if not _encodes(text):
        raise ckpt.error(None, f"malformed safetensors header: {text!r} holds a lone "
                         "surrogate (not valid Unicode)")


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- writing ----------------------------------------------------------------------------------
def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    t = u >> 16  # one temporary, updated in place: a tensor's worth of memory, not four
    t &= np.uint32(1)
    t += u
    t += np.uint32(0x7FFF)
    t >>= 16
    r = t.astype(np.uint16)
    del t
    nan = np.isnan(x)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return r


def float_array(x: np.ndarray, dtype: str) -> np.ndarray:
    """A float32 array as the array to write for ``dtype`` (a metadata dtype name: float16,
    bfloat16, float32, float64); bfloat16 as its U16 bits, which numpy can hold."""
    if dtype == "bfloat16":
        return bf16_bits(x)
    return x.astype(dtype, copy=False)


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

    Hand-written rather than the ``safetensors`` library's ``save_file``: that takes the whole
    dict of tensors at once, so a checkpoint would have to fit in memory twice over, and it
    cannot stream one tensor at a time into a temporary file renamed into place at the end.
    """

    def __init__(
        self,
        path: Any,
        tensors: list[HeaderEntry] | list[tuple[str, str, tuple[int, ...], int]],
        metadata: dict[str, str] | None = None,
        *,
        force: bool = False,
    ) -> None:
        self.path = Path(path)
        self.force = force
        # The target is checked (a folder, no such folder, exists without force) before the
        # header is worked out: OutputFile checks again, and makes the temporary file.
        OutputFile.check(self.path, force)
        outs = [_Out(n, d, tuple(s), b) for n, d, s, b in tensors]
        self._outs = {o.name: o for o in outs}
        if len(self._outs) != len(outs) or "__metadata__" in self._outs:
            raise CheckpointError(self.path, None, "duplicate tensor names")

        def align(o: _Out) -> int:
            bits = ST_DTYPES.get(o.dtype, (8, None))[0]
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
        try:
            raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a name from a file name that is not UTF-8
            texts = [o.name for o in outs] + [t for kv in (metadata or {}).items() for t in kv]
            bad = next((t for t in texts if not _encodes(t)), "?")
            raise CheckpointError(self.path, None, f"{bad!r} is not valid Unicode (a lone "
                                  "surrogate, as from a file name that is not UTF-8)") from None
        raw += b" " * (-len(raw) % 8)  # data starts 8-aligned, as the safetensors library does
        self._data_start = 8 + len(raw)
        self._total = self._data_start + offset
        self._out = OutputFile(self.path, self.force)
        try:
            self._out.write(struct.pack("<Q", len(raw)))
            self._out.write(raw)
        except BaseException:
            self.abort()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None or self._out.open:
            self.abort()

    def _seek(self, name: str, f: BinaryIO) -> BinaryIO:
        o = self._outs[name]
        if o.written:
            raise ValueError(f"tensor {name!r} written twice")
        f.seek(self._data_start + o.offset)
        return f

    def _done(self, name: str) -> None:
        o = self._outs[name]
        if self._out.tell() != self._data_start + o.offset + o.nbytes:
            raise ValueError(f"tensor {name!r}: wrote a wrong number of bytes")
        o.written = True

    def write(self, name: str, data: Any) -> None:
        """Write a tensor: a numpy array (converted to little-endian) or raw bytes."""
        buf = to_le_bytes(data) if isinstance(data, np.ndarray) else memoryview(data).cast("B")
        if len(buf) != self._outs[name].nbytes:
            raise ValueError(
                f"tensor {name!r} takes {self._outs[name].nbytes} bytes, got {len(buf)}"
            )
        self._out.io(lambda f: self._seek(name, f).write(buf))
        self._done(name)

    def write_from(self, name: str, source: Checkpoint, source_name: str) -> None:
        """Copy a tensor's bytes from an open checkpoint, in chunks."""
        self._out.io(lambda f: source.copy_to(source_name, self._seek(name, f)))
        self._done(name)

    def commit(self) -> None:
        missing = [o.name for o in self._outs.values() if not o.written]
        if missing:
            raise ValueError(f"tensors never written: {missing[:5]}")
        self._out.commit(self._total)

    def abort(self) -> None:
        out = getattr(self, "_out", None)  # none yet when the header could not be made
        if out is not None:
            out.abort()
