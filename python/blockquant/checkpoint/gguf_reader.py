"""Opening a GGUF file (llama.cpp's) without trusting it: its magic, and every length, count and
offset of its header checked against the file's size before gguf-py's reader parses it (the
reader maps the file and trusts what it reads), so that a truncated or crafted file is one
``CheckpointError`` rather than a crash or gigabytes of memory. Read by the GGUF checkpoint
(:mod:`.gguf_file`) and by the importance-matrix reader (:mod:`.imatrix`), whose current format
is a GGUF file too."""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

from .base import CheckpointError, os_reason

MAGIC = b"GGUF"
#: The GGUF value type of an array (gguf_type).
_ARRAY = 9


def is_gguf(path: Any) -> bool:
    """Whether ``path`` is a file starting with GGUF's magic (a regular file: opening a named
    pipe would wait for a writer; the reader that follows refuses it)."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except (OSError, TypeError, ValueError):
        return False


def is_gguf_path(path: Any) -> bool:
    """Whether ``path`` is named as a GGUF file."""
    return str(path).lower().endswith(".gguf")


def _gguf_py(path: Any) -> Any:
    try:
        import gguf
    except ImportError:
        raise CheckpointError(path, None, "GGUF files need gguf-py: pip install "
                              "'blockquant[gguf]' (or pip install gguf)") from None
    return gguf


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


#: Bytes of each fixed-size GGUF value type (gguf_type), by its number; 8 is a string (a u64
#: length, then the bytes), 9 an array (a u32 item type, a u64 count, the items).
_VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING = 8
#: The least bytes a key/value pair (an empty key, a type, a one-byte value) and a tensor's
#: description (an empty name, one dimension, a type, an offset) take.
_MIN_KV, _MIN_TENSOR = 13, 28


#: The most metadata array items a GGUF file may hold in all. gguf-py's reader makes a numpy
#: object of each (about 700 bytes and 15 µs): a small crafted file of honest counts would still
#: take gigabytes. The largest real tokenizers (a 262k vocabulary with its scores and types, or
#: 150k tokens and their merges) hold under a million.
MAX_ARRAY_ITEMS = 2 << 20


class _Lengths:
    """A walk over a GGUF file's header that checks every count and length it holds against
    the bytes left in the file, and the metadata arrays' items against MAX_ARRAY_ITEMS, before
    gguf-py's reader trusts them: a count patched to 2^40 would otherwise have it allocate and
    loop until memory runs out. Nothing is kept."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size
        self.items = 0
        self.alignment = 32  # GGUF's default, unless general.alignment says otherwise
        #: (name, dims, ggml type number, offset) of each tensor, as the header gives them.
        self.tensors: list[tuple[str, tuple[int, ...], int, int]] = []

    def count(self, n: int, what: str) -> None:
        self.items += n
        if self.items > MAX_ARRAY_ITEMS:
            raise ValueError(f"{what}: its metadata arrays hold over {MAX_ARRAY_ITEMS} items "
                             "in all, more than any model's tokenizer")

    def need(self, n: int, what: str) -> None:
        left = self.size - self.f.tell()
        if n > left:
            raise ValueError(f"{what} needs {n} bytes, the file has {left} left")

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        return self.f.read(n)

    def u32(self, what: str) -> int:
        (v,) = struct.unpack("<I", self.take(4, what))
        return int(v)

    def u64(self, what: str) -> int:
        (v,) = struct.unpack("<Q", self.take(8, what))
        return int(v)

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.f.seek(n, os.SEEK_CUR)

    def string(self, what: str) -> None:
        self.skip(self.u64(what), what)

    def value(self, vtype: int, what: str, depth: int = 0) -> None:
        if vtype in _VALUE_SIZES:
            self.skip(_VALUE_SIZES[vtype], what)
        elif vtype == _STRING:
            self.string(what)
        elif vtype == _ARRAY:
            if depth > 8:
                raise ValueError(f"{what}: arrays nested more than 8 deep")
            itype, count = self.u32(what), self.u64(what)
            if itype in _VALUE_SIZES:
                self.skip(count * _VALUE_SIZES[itype], f"{what}: an array of {count}")
                self.count(count, what)
                return
            # Strings and arrays take at least 8 bytes each (a length or a type and a count).
            self.need(count * 8, f"{what}: an array of {count}")
            self.count(count, what)
            for _ in range(count):
                self.value(itype, what, depth + 1)
        else:
            raise ValueError(f"{what}: unknown value type {vtype}")

    def header(self) -> None:
        self.take(4, "the magic")
        version = self.u32("the version")
        if version not in (2, 3):
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (2, 3):
                raise _BigEndian
            raise ValueError(f"GGUF version {version}: blockquant reads versions 2 and 3")
        n_tensors, n_kv = self.u64("the tensor count"), self.u64("the key/value count")
        self.need(n_kv * _MIN_KV + n_tensors * _MIN_TENSOR,
                  f"{n_kv} key/value pairs and {n_tensors} tensors")
        for i in range(n_kv):
            key = self.take(self.u64(f"key {i}"), f"key {i}")
            vtype = self.u32(f"key {i}'s type")
            if key == b"general.alignment" and vtype == 4:  # uint32, as ggml reads it
                self.alignment = self.u32("general.alignment")
                if self.alignment == 0 or self.alignment & (self.alignment - 1):
                    raise ValueError(f"general.alignment {self.alignment} is not a power of two")
                continue
            self.value(vtype, f"key {i}'s value")
        for i in range(n_tensors):
            name = self.take(self.u64(f"tensor {i}'s name"), f"tensor {i}'s name")
            n_dims = self.u32(f"tensor {i}'s dimension count")
            self.need(8 * n_dims + 12, f"tensor {i}'s {n_dims} dimensions")
            dims = struct.unpack(f"<{n_dims}Q", self.f.read(8 * n_dims))
            gtype, offset = struct.unpack("<IQ", self.f.read(12))
            self.tensors.append((name.decode("utf-8", "replace"), dims, gtype, offset))
        self.placement()

    def placement(self) -> None:
        """Every tensor's bytes inside the data section, at an offset on the file's alignment,
        and apart from every other tensor's, as llama.cpp's loader requires: gguf-py adds an
        offset to the data section's start in 64 bits (2^64 - 1 wraps to the header) and lets
        tensors overlap (64 tensors at one offset, each padded to a 1 MiB alignment when
        written out again, made a 65 MiB file of a 1 MiB one)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        start = -(-self.f.tell() // self.alignment) * self.alignment
        data = max(self.size - start, 0)
        spans = []
        for name, dims, gtype, offset in self.tensors:
            try:
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(gtype)]
            except (ValueError, KeyError):
                continue  # an unknown type: gguf-py's reader names it
            numel = 1
            for d in dims:
                numel *= d
            nbytes = numel // block * size
            if offset > data or nbytes > data - offset:
                raise _Placement(name, f"its {nbytes} bytes at offset {offset} lie outside the "
                                 f"data section ({data} bytes)")
            if offset % self.alignment:
                raise _Placement(name, f"its offset {offset} is not a multiple of the file's "
                                 f"alignment ({self.alignment})")
            spans.append((offset, offset + nbytes, name))
        spans.sort()
        for (_, end, before), (at, _, name) in zip(spans, spans[1:]):
            if at < end:
                raise _Placement(name, f"at offset {at}, it overlaps tensor {before!r} (whose "
                                 f"bytes end at {end})")


_BIG_ENDIAN = "is a big-endian GGUF file, which blockquant does not read"


class _BigEndian(Exception):
    """A big-endian GGUF file, refused before its counts are read the wrong way round."""


class _Placement(Exception):
    """A tensor whose bytes are not where a GGUF file may keep them."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def _check_lengths(path: Any) -> None:
    with open(path, "rb") as f:
        _Lengths(f, os.fstat(f.fileno()).st_size).header()


def open_reader(path: Any) -> Any:
    """gguf-py's reader of ``path``; a file it cannot parse is one ``CheckpointError``."""
    gguf = _gguf_py(path)
    try:
        _check_lengths(path)
    except OSError as e:
        raise CheckpointError(path, None, os_reason(e)) from None
    except _BigEndian:
        raise CheckpointError(path, None, _BIG_ENDIAN) from None
    except _Placement as e:
        raise CheckpointError(path, e.name, f"not a valid GGUF file: {e}") from None
    except (ValueError, struct.error) as e:
        raise CheckpointError(path, None, f"not a valid GGUF file ({e})") from None
    try:
        reader = gguf.GGUFReader(path)
    except OSError as e:
        raise CheckpointError(path, None, os_reason(e)) from None
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt file makes gguf-py raise anything
        raise CheckpointError(path, None, f"not a valid GGUF file ({_one_line(e)})") from None
    if reader.byte_order != "I":
        raise CheckpointError(path, None, _BIG_ENDIAN)
    return reader
