"""What the zarr codecs share, with neither zarr nor numcodecs imported: the codec's
configuration (a scheme and the options it quantizes with), a chunk to burn's bytes and back
to floats, the chunk shapes that keep blocks whole, and the small header the numcodecs codec
puts before the bytes (zarr v2 hands a codec no chunk shape when it decodes).

docs/dask.md "The zarr codec" specifies the JSON and the bytes for other implementations.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Sequence, Tuple

import numpy as np

from .dask._grid import ChunkAlignmentError, Geometry
from .errors import LayoutError, QuantError, SchemeError
from .presets import resolve
from .qtensor import QTensor, _options_checked, _quantize
from .scheme import QuantScheme

#: The codec's name in zarr v3 metadata and its numcodecs id.
NAME = "blockquant"
#: The configuration's version: a reader refuses any other.
VERSION = 1
#: The array data types the codec stores (and returns, dequantized).
DTYPES = {"float16": "e", "float32": "f", "float64": "d"}
_OPTIONS = ("calibration", "rounding", "scale_rounding")


@dataclass(frozen=True)
class CodecConfig:
    """A scheme (stored as its text) and the options chunks are quantized with (resolved:
    the preset's where it has them, else the defaults), as the JSON holds them."""

    scheme: str
    calibration: str
    rounding: str
    scale_rounding: str

    @classmethod
    def make(cls, scheme: Any, calibration: Any = None, rounding: Any = None,
             scale_rounding: Any = None) -> "CodecConfig":
        s = resolve(scheme)  # a preset name, a scheme text or a QuantScheme
        cal, rnd, srnd = s.options.resolve(calibration, rounding, scale_rounding)
        if not all(isinstance(o, str) for o in (cal, rnd, srnd)):
            raise QuantError(f"the {NAME} codec's options are names, got {(cal, rnd, srnd)}")
        _options_checked(cal, rnd, srnd)  # every name known (QuantError otherwise)
        s.check_options(rnd, srnd)  # SchemeError: mx on a non-UE8M0 scale, ...
        return cls(str(s), cal, rnd, srnd)

    @classmethod
    def from_json(cls, config: Any) -> "CodecConfig":
        """The configuration object of the JSON (zarr v3's ``configuration``, numcodecs'
        config without its ``id``): ``version`` 1, ``scheme`` a scheme text, the options."""
        if not isinstance(config, dict):
            raise LayoutError(f"a {NAME} codec's configuration is an object, got {config!r}")
        if config.get("version") != VERSION:
            raise LayoutError(f"a {NAME} codec configuration of version "
                              f"{config.get('version')!r}: this blockquant reads {VERSION}")
        unknown = set(config) - {"version", "scheme", *_OPTIONS}
        if unknown:
            raise LayoutError(f"unknown keys in a {NAME} codec's configuration: "
                              f"{sorted(unknown)}")
        text = config.get("scheme")
        if not isinstance(text, str):
            raise SchemeError(f"a {NAME} codec's scheme is a scheme text, got {text!r}")
        QuantScheme.parse(text)  # the canonical text only: SchemeError otherwise
        return cls.make(text, *(config.get(k) for k in _OPTIONS))

    def to_json(self) -> dict:
        return {"version": VERSION, "scheme": self.scheme, "calibration": self.calibration,
                "rounding": self.rounding, "scale_rounding": self.scale_rounding}

    @property
    def quant_scheme(self) -> QuantScheme:
        return QuantScheme.parse(self.scheme)

    # -- chunks ----------------------------------------------------------------------------------
    def check_dtype(self, dtype: Any) -> str:
        name = np.dtype(dtype).name
        if name not in DTYPES:
            raise TypeError(f"the {NAME} codec stores float16, float32 or float64 arrays, "
                            f"got {name}")
        return name

    def check_chunks(self, shape: Sequence[int], chunk: Sequence[int]) -> None:
        """Chunks of the array ``shape`` fall on block and word boundaries: each chunk size a
        multiple of the scheme's step along its axis, or the whole axis (one chunk).
        :class:`ChunkAlignmentError` otherwise; a scheme that cannot take the rank is a
        :class:`SchemeError`."""
        scheme = self.quant_scheme
        if len(chunk) == 0:
            return
        geo = Geometry.of(scheme, tuple(int(c) for c in chunk))
        bad = [ax for ax, (c, d) in enumerate(zip(chunk, shape))
               if c < d and c % geo.step(ax)]
        if bad:
            steps = [geo.step(ax) for ax in bad]
            raise ChunkAlignmentError(
                f"chunks {tuple(chunk)} of a {tuple(shape)} array cut blocks or packed words "
                f"of {self.scheme}: along axes {bad} a chunk is a multiple of {steps} (or the "
                "whole axis)")

    def encode(self, chunk: np.ndarray) -> bytes:
        """burn's bytes of the chunk quantized as a tensor of its own."""
        return _quantize(np.asarray(chunk), self.quant_scheme, calibration=self.calibration,
                         rounding=self.rounding,
                         scale_rounding=self.scale_rounding).to_bytes()

    def decode(self, data: Any, shape: Tuple[int, ...], dtype: str) -> np.ndarray:
        """The floats of burn's bytes of a chunk of ``shape``, in ``dtype``."""
        return QTensor.from_bytes(data, self.quant_scheme, shape).dequantize(dtype)

    def nbytes(self, shape: Sequence[int]) -> int:
        return int(self.quant_scheme.layout(tuple(shape)).nbytes)


# -- the numcodecs codec's header ------------------------------------------------------------------
#: "BQNC", the header's version, the dtype's code (numpy's e, f or d), the order (C or F, as
#: the chunk came), the rank; then the rank's sizes as little-endian uint64.
MAGIC = b"BQNC"
_HEAD = struct.Struct("<4sBccB")
_CODES = {v.encode(): k for k, v in DTYPES.items()}


def with_header(config: CodecConfig, chunk: np.ndarray) -> bytes:
    name = config.check_dtype(chunk.dtype)
    order = b"F" if chunk.flags.f_contiguous and not chunk.flags.c_contiguous else b"C"
    if chunk.ndim > 255:
        raise LayoutError(f"a chunk of {chunk.ndim} dimensions")
    head = _HEAD.pack(MAGIC, VERSION, DTYPES[name].encode(), order, chunk.ndim)
    dims = struct.pack(f"<{chunk.ndim}Q", *chunk.shape)
    return head + dims + config.encode(chunk)


def without_header(config: CodecConfig, data: Any) -> np.ndarray:
    """The floats of a chunk the numcodecs codec wrote; bytes of anything else are a
    :class:`LayoutError` saying so."""
    try:
        buf = memoryview(data).cast("B")
    except TypeError:
        raise TypeError(f"the {NAME} codec decodes bytes, got {type(data).__name__}") from None
    if len(buf) < _HEAD.size or bytes(buf[:4]) != MAGIC:
        raise LayoutError(f"not a chunk the {NAME} codec wrote (no {MAGIC!r} header): another "
                          "codec's bytes?")
    magic, version, code, order, rank = _HEAD.unpack(bytes(buf[:_HEAD.size]))
    if version != VERSION or code not in _CODES or order not in (b"C", b"F"):
        raise LayoutError(f"a {NAME} chunk header of version {version}, dtype {code!r}, order "
                          f"{order!r}: this blockquant reads version {VERSION}")
    end = _HEAD.size + 8 * rank
    if len(buf) < end:
        raise LayoutError(f"a {NAME} chunk cut short in its header ({len(buf)} bytes)")
    shape = struct.unpack(f"<{rank}Q", bytes(buf[_HEAD.size:end]))
    try:
        out = config.decode(buf[end:], shape, _CODES[code])
    except QuantError as e:
        raise LayoutError(f"a {NAME} chunk of shape {shape}: {e}") from None
    return np.asfortranarray(out) if order == b"F" else out
