"""llama.cpp's tensor types (ggml's block formats), bit for bit with gguf-py.

    >>> import numpy as np
    >>> from blockquant import gguf
    >>> x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    >>> blocks = gguf.quantize(x, "Q8_0")
    >>> blocks.dtype, blocks.shape
    (dtype('uint8'), (2, 34))
    >>> gguf.dequantize(blocks, "Q8_0").shape
    (2, 32)

:func:`quantize` returns what ``gguf.quants.quantize(x, GGMLQuantizationType.<type>)`` returns,
byte for byte and in the same shape and dtype: uint8 with the last axis in bytes (a float32 or
float16 array for F32 and F16, as gguf-py). :func:`dequantize` returns what
``gguf.quants.dequantize`` returns, bit for bit, as float32, optionally into an array you give.
The types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, TQ1_0, TQ2_0, and F32, F16, BF16. These are
ggml's rules, not blockquant's schemes (Q8_0 divides by the unrounded amax/127 and stores the
scale as f16 afterwards, Q4_0 maps the largest-magnitude value to -8, MXFP4 takes its scale
from a float32 log2); the kernels are in ``rust/blockquant-core/src/ggml/``.

The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: super-blocks of 256), IQ4_NL (blocks of 32),
IQ4_XS (256) and NVFP4 (64) are written in ggml's byte layouts, and :func:`dequantize` reads
them bit for bit as ``gguf.quants.dequantize`` does; gguf-py has no quantizer for them, and
blockquant's are its own searches (candidate scales per sub-block refitted by least squares,
sub-scales chosen by the error as decoded), deterministic and independent of the thread count,
with at least ggml's reference quantizers' SQNR on real weights (``benches/quality_gguf.py``).
A scale beyond float16's range is stored as its largest finite value (the block clips) rather
than as infinity. Their kernels are in ``rust/blockquant-core/src/ggml/``.

Unlike gguf-py, a NaN or infinity in the input is a :class:`~blockquant.NonFiniteError` (for the
float types too), a row that is not a whole number of blocks a :class:`~blockquant.LayoutError`,
and the input must be a float array (float16, bfloat16, float32, float64), converted to float32
as gguf-py does (float64 straight to float16 for F16).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import _native
from .errors import LayoutError, QuantError, SchemeError
from .qtensor import _as_input

__all__ = [
    "GGMLType",
    "TYPES",
    "ggml_type",
    "quantize",
    "quantize_bits",
    "dequantize",
    "byte_shape",
    "value_shape",
]


@dataclass(frozen=True)
class GGMLType:
    """One ggml tensor type: its name, the number GGUF files store, and its block geometry."""

    name: str
    id: int
    block_size: int
    type_size: int
    #: Whether importance weights (``quantize(weights=)``, llama.cpp's imatrix) steer its
    #: quantizer: the searched types and Q4_0/Q4_1/Q5_0/Q5_1. The others take none, as in ggml.
    takes_weights: bool = False

    @property
    def is_float(self) -> bool:
        """F32, F16 and BF16: one value a block, no scale."""
        return self.block_size == 1


#: Every type, by ggml's name.
TYPES: dict[str, GGMLType] = {
    t.name: GGMLType(t.name, t.id, t.block_size, t.type_size, t.takes_weights)
    for t in _native.ggml_types()
}
_BY_ID = {t.id: t for t in TYPES.values()}


def ggml_type(qtype: Any) -> GGMLType:
    """The type named by ``qtype``: a name in any case (``"q4_0"``), a ggml type number, gguf-py's
    ``GGMLQuantizationType`` member, or a :class:`GGMLType`. Others are a ``SchemeError``."""
    if isinstance(qtype, GGMLType):
        return qtype
    if isinstance(qtype, enum.Enum):
        qtype = qtype.name
    if isinstance(qtype, str):
        t = TYPES.get(qtype.upper())
    elif isinstance(qtype, (int, np.integer)) and not isinstance(qtype, (bool, np.bool_)):
        t = _BY_ID.get(int(qtype))
    else:
        raise TypeError(f"a ggml type is a name or a number, got {type(qtype).__name__}")
    if t is None:
        raise SchemeError(
            f"unsupported ggml type {qtype!r}: blockquant.gguf handles {', '.join(TYPES)}"
        )
    return t


def byte_shape(shape: tuple[int, ...], qtype: Any) -> tuple[int, ...]:
    """The shape of ``qtype``'s blocks for values of ``shape`` (last axis in bytes)."""
    t = ggml_type(qtype)
    if len(shape) == 0:
        raise LayoutError("a 0-d array has no rows to divide into blocks")
    if shape[-1] % t.block_size:
        raise LayoutError(
            f"a row of {shape[-1]} values is not a whole number of {t.name} blocks of "
            f"{t.block_size}"
        )
    return (*shape[:-1], shape[-1] // t.block_size * t.type_size)


def value_shape(shape: tuple[int, ...], qtype: Any) -> tuple[int, ...]:
    """The shape of the values in blocks of ``shape`` (last axis in bytes)."""
    t = ggml_type(qtype)
    if len(shape) == 0:
        raise LayoutError("a 0-d array has no rows to divide into blocks")
    if shape[-1] % t.type_size:
        raise LayoutError(
            f"a row of {shape[-1]} bytes is not a whole number of {t.name} blocks of "
            f"{t.type_size} bytes"
        )
    return (*shape[:-1], shape[-1] // t.type_size * t.block_size)


def quantize(x: Any, qtype: Any, *, weights: Any = None,
             out: Optional[np.ndarray] = None) -> np.ndarray:
    """``x`` (a float array, at least 1-D, rows a whole number of blocks) as ``qtype``: uint8
    blocks of shape ``(..., row_bytes)``; F32 and F16 give float32 and float16 arrays of ``x``'s
    shape, as gguf-py does. With ``out`` (that dtype and shape, C-contiguous, writeable), the
    blocks are written there and ``out`` is returned.

    ``weights``: per-column importance, as llama-quantize's ``--imatrix`` gives it (finite,
    >= 0): shape ``(row_len,)`` for the whole tensor, or ``(k, row_len)`` for k even groups of
    rows (a 3-D expert tensor's one row per expert; ``x``'s own shape gives each row its own).
    Each block then gets the least error weighted by them; a block keeps the unweighted bytes
    where these leave no more weighted error. The types without a search
    (``GGMLType.takes_weights`` false: Q8_0, MXFP4, TQ1_0, TQ2_0, the float types) ignore
    them, as ggml does. Q4_0/Q4_1/Q5_0/Q5_1 are gguf-py's bytes only without weights."""
    xs, kind = _as_input(x)
    t = ggml_type(qtype)
    if weights is None:
        return _quantize(xs, kind, t, out)
    return _quantize(xs, kind, t, out, _importance_rows(weights, xs.shape))


def quantize_bits(bits: np.ndarray, kind: str, qtype: Any, *, weights: Any = None) -> np.ndarray:
    """:func:`quantize` of float16 (``kind="f16"``) or bfloat16 (``"bf16"``) values given as
    their uint16 bit patterns, as GGUF files hold them (bfloat16 needs no ml_dtypes this way)."""
    if kind not in ("f16", "bf16"):
        raise QuantError(f"kind is 'f16' or 'bf16', got {kind!r}")
    arr = np.asarray(bits)
    if arr.dtype != np.uint16:
        raise TypeError(f"bits must be a uint16 array, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr)
    return _quantize(arr, kind, ggml_type(qtype), None,
                     None if weights is None else _importance_rows(weights, arr.shape))


def _importance_rows(weights: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``weights`` as C-contiguous float32 rows of ``shape``'s row length (the core checks that
    they split the rows evenly and are finite and >= 0)."""
    if len(shape) == 0:
        raise LayoutError("a 0-d array has no rows to divide into blocks")
    w = np.asarray(weights)
    if w.dtype.kind not in "fiu":
        raise TypeError(f"weights must be a real float array, got dtype {w.dtype}")
    if w.ndim == 0 or w.shape[-1] != shape[-1]:
        raise LayoutError(f"weights must be rows of {shape[-1]} values (the row length of x's "
                          f"shape {shape}), got shape {w.shape}")
    with np.errstate(over="ignore"):  # a weight too large for float32 is the core's error
        return np.ascontiguousarray(w.reshape(-1, shape[-1]), np.float32)


def _quantize(xs: np.ndarray, kind: str, t: GGMLType, out: Optional[np.ndarray],
              weights: Optional[np.ndarray] = None) -> np.ndarray:
    if xs.ndim == 0:
        raise LayoutError("a 0-d array has no rows to divide into blocks")
    view = _FLOAT_VIEWS.get(t.name)
    raw_out = None
    if out is not None:
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
        if view is not None:
            # The core writes bytes: a float32/float16 out is handed over as its bytes.
            if out.dtype != view:
                raise TypeError(f"out must be a {view} array for {t.name}, got {out.dtype}")
            if out.shape != xs.shape:
                raise LayoutError(f"out must have shape {xs.shape} for {t.name}, got {out.shape}")
            if not (out.flags.c_contiguous and out.flags.aligned):
                raise ValueError("out must be an aligned, C-contiguous array")
            raw_out = out.view(np.uint8)
        else:
            raw_out = out
    blocks = _native.ggml_quantize(xs, kind, t.name, raw_out, weights)
    if out is not None:
        return out
    return blocks.view(view) if view is not None else blocks


#: The types gguf-py returns as float arrays rather than bytes.
_FLOAT_VIEWS = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16)}


def dequantize(data: Any, qtype: Any, *, out: Optional[np.ndarray] = None) -> np.ndarray:
    """float32 values of ``qtype``'s blocks. ``data`` is read as its bytes, as gguf-py reads it
    (uint8 blocks of shape ``(..., row_bytes)``, or F16/F32 arrays as they are); the result has
    shape ``(..., row_len)``. With ``out`` (float32, C-contiguous, writeable, that shape), the
    values are written there and ``out`` is returned."""
    t = ggml_type(qtype)
    arr = np.asarray(data)
    if arr.dtype.hasobject:
        raise TypeError(f"data must be an array of bytes or numbers, got dtype {arr.dtype}")
    if arr.ndim == 0:
        raise LayoutError("a 0-d array has no rows to divide into blocks")
    raw = np.ascontiguousarray(arr).view(np.uint8)
    if out is not None and not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    return _native.ggml_dequantize(raw, t.name, out)
