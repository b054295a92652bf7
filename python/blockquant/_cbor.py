"""The subset of CBOR (RFC 8949) that burn-pack's metadata uses, strictly: definite lengths,
shortest heads, text-keyed maps, no tags. Decoding refuses anything else, bounds the nesting
depth and never allocates more than the data holds (see :mod:`blockquant.burnpack`)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from .errors import LayoutError

#: Deepest CBOR nesting accepted. burn's deepest item is 8 levels (metadata, tensors,
#: descriptor, dtype, scheme, block, size, storage); burn-pack itself allows 128.
MAX_CBOR_DEPTH = 32


class _CborError(Exception):
    """A CBOR defect, turned into a LayoutError by the caller (it knows the file)."""


def encode_cbor(obj: Any) -> bytes:
    """CBOR for ints, str, bytes, lists/tuples, dicts (keys in their order), None, bool and
    float (as binary64), definite lengths and shortest heads, as ciborium writes them."""
    out = bytearray()
    _encode(obj, out, 0)
    return bytes(out)


def _head(major: int, n: int, out: bytearray) -> None:
    if n < 24:
        out.append(major << 5 | n)
    elif n < 1 << 8:
        out += bytes((major << 5 | 24, n))
    elif n < 1 << 16:
        out += bytes((major << 5 | 25,)) + n.to_bytes(2, "big")
    elif n < 1 << 32:
        out += bytes((major << 5 | 26,)) + n.to_bytes(4, "big")
    elif n < 1 << 64:
        out += bytes((major << 5 | 27,)) + n.to_bytes(8, "big")
    else:
        raise ValueError(f"{n} does not fit a CBOR head")


def _encode(obj: Any, out: bytearray, depth: int) -> None:
    if depth >= MAX_CBOR_DEPTH:
        raise ValueError(f"CBOR nesting deeper than {MAX_CBOR_DEPTH}")
    if obj is None:
        out.append(0xF6)
    elif obj is True or obj is False:
        out.append(0xF5 if obj else 0xF4)
    elif isinstance(obj, (int, np.integer)):
        n = int(obj)
        _head(0, n, out) if n >= 0 else _head(1, -1 - n, out)
    elif isinstance(obj, float):
        out += b"\xfb" + struct.pack(">d", obj)
    elif isinstance(obj, str):
        raw = obj.encode("utf-8")
        _head(3, len(raw), out)
        out += raw
    elif isinstance(obj, (bytes, bytearray)):
        _head(2, len(obj), out)
        out += obj
    elif isinstance(obj, (list, tuple)):
        _head(4, len(obj), out)
        for item in obj:
            _encode(item, out, depth + 1)
    elif isinstance(obj, dict):
        _head(5, len(obj), out)
        for key, value in obj.items():
            _encode(key, out, depth + 1)
            _encode(value, out, depth + 1)
    else:
        raise TypeError(f"no CBOR encoding for {type(obj).__name__}")


def decode_cbor(data: bytes) -> Any:
    """The one CBOR item ``data`` holds, strictly: definite lengths only, no tags, no undefined
    or simple values, map keys text or int and unique, at most :data:`MAX_CBOR_DEPTH` levels,
    no length past the end of ``data``, nothing after the item. Raises :class:`LayoutError`."""
    try:
        obj, pos = _Decoder(bytes(data)).item(0, 0)
        if pos != len(data):
            raise _CborError(f"{len(data) - pos} bytes after the CBOR item")
        return obj
    except _CborError as e:
        raise LayoutError(f"corrupt CBOR: {e}") from None


class _Decoder:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def _take(self, pos: int, n: int) -> int:
        if n > len(self.data) - pos:
            raise _CborError(f"{n} bytes declared at offset {pos}, {len(self.data) - pos} left")
        return pos + n

    def _arg(self, info: int, pos: int) -> tuple[int, int]:
        if info < 24:
            return info, pos
        if info in (24, 25, 26, 27):
            size = 1 << (info - 24)
            end = self._take(pos, size)
            return int.from_bytes(self.data[pos:end], "big"), end
        if info == 31:
            raise _CborError(f"indefinite length at offset {pos - 1}")
        raise _CborError(f"reserved additional info {info} at offset {pos - 1}")

    def item(self, pos: int, depth: int) -> tuple[Any, int]:
        if depth >= MAX_CBOR_DEPTH:
            raise _CborError(f"nesting deeper than {MAX_CBOR_DEPTH}")
        start = pos
        pos = self._take(pos, 1)
        major, info = self.data[start] >> 5, self.data[start] & 0x1F
        if major == 7:
            return self._simple(info, pos, start)
        n, pos = self._arg(info, pos)
        if major == 0:
            return n, pos
        if major == 1:
            return -1 - n, pos
        if major in (2, 3):
            end = self._take(pos, n)
            raw = self.data[pos:end]
            if major == 2:
                return raw, end
            try:
                return raw.decode("utf-8"), end
            except UnicodeDecodeError:
                raise _CborError(f"text at offset {start} is not UTF-8") from None
        if major == 4:
            self._take(pos, n)  # every item takes at least a byte: no huge list from a length
            items = []
            for _ in range(n):
                value, pos = self.item(pos, depth + 1)
                items.append(value)
            return items, pos
        if major == 5:
            if n > (len(self.data) - pos) // 2:
                raise _CborError(f"a map of {n} entries at offset {start} overruns the data")
            entries: dict[Any, Any] = {}
            for _ in range(n):
                key_at = pos
                key, pos = self.item(pos, depth + 1)
                if not isinstance(key, (str, int)) or isinstance(key, bool):
                    raise _CborError(f"map key at offset {key_at} is not text or an integer")
                if key in entries:
                    raise _CborError(f"duplicate map key {key!r} at offset {key_at}")
                entries[key], pos = self.item(pos, depth + 1)
            return entries, pos
        raise _CborError(f"tag at offset {start}: tags are not used by burn-pack")

    def _simple(self, info: int, pos: int, start: int) -> tuple[Any, int]:
        if info == 20:
            return False, pos
        if info == 21:
            return True, pos
        if info == 22:
            return None, pos
        if info in (25, 26, 27):
            fmt, size = {25: (">e", 2), 26: (">f", 4), 27: (">d", 8)}[info]
            end = self._take(pos, size)
            return struct.unpack(fmt, self.data[pos:end])[0], end
        if info == 31:
            raise _CborError(f"break at offset {start} outside an indefinite item")
        raise _CborError(f"simple value {info} at offset {start} is not used by burn-pack")
