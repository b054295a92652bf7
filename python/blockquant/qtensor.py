"""The quantize/dequantize API and :class:`QTensor` (format.md "Quantizing a value" to "Presets").

This module only checks and converts arguments; every number is computed by the Rust core
(through :mod:`blockquant._native`, the one gateway to it), which releases the GIL while it
works. Wherever a scheme is taken, a preset name or a scheme text is accepted too.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Optional, Tuple, Union

import numpy as np

from . import _native
from .errors import LayoutError, QuantError, ScaleError, UnexpectedGlobalScaleError
from .options import (
    Calibration,
    Rounding,
    ScaleRounding,
    as_bytes,
    importance_weights,
    weights_refusal,
)
from .presets import described, resolve
from .scheme import QuantScheme, QuantValue, ScaleDtype, _layout, _shape

__all__ = ["QTensor", "quantize", "dequantize", "round_scale"]

_INPUT_KINDS = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
# The same by (native) dtype: numpy's ``dtype.name`` is computed in Python on every access, a
# few microseconds of a small call; other byte orders and bfloat16 (ml_dtypes) go by name.
_NAME_OF_DTYPE = {np.dtype(n): n for n in _INPUT_KINDS if n != "bfloat16"}


def _dtype_name(dt: np.dtype) -> str:
    """``dt.name``, without numpy's cost for the native float types."""
    name = _NAME_OF_DTYPE.get(dt)
    # Non-native byte order, bfloat16, anything else: by numpy's name.
    return name if name is not None else dt.name


def _kind(dt: np.dtype) -> Optional[str]:
    """The core's name for arrays of dtype ``dt`` (native or not), None if it reads no such."""
    return _INPUT_KINDS.get(_dtype_name(dt))


def _float_array(x: Any, what: str = "x") -> np.ndarray:
    """``x`` as an array of a float type blockquant reads; anything else is a ``TypeError``."""
    try:
        arr = np.asarray(x)
    except ValueError as e:  # ragged nested sequences
        raise TypeError(f"{what} must be an array of floats: {e}") from None
    # ml_dtypes' bfloat16 is kind 'V' with a name: accept it by name, and no other 'V' type.
    if _kind(arr.dtype) is None:
        raise TypeError(
            f"{what} must be a float16, bfloat16, float32 or float64 array, got dtype {arr.dtype}"
        )
    return arr


def _as_input(x: Any) -> Tuple[np.ndarray, str]:
    """``x`` in the form the core reads without converting it up front: C-contiguous and
    native-order in its own dtype (copied only if it is not), half-precision types as uint16
    bit patterns. The core converts to f32 a piece at a time."""
    arr = _float_array(x)
    if not (arr.flags.c_contiguous and arr.flags.aligned and arr.dtype.isnative):
        # A copy (np.array copies; np.asarray would keep an unaligned C-order array as it is:
        # a view at an odd offset into a file's bytes, which the core cannot read as floats).
        arr = np.array(arr, dtype=arr.dtype.newbyteorder("="), order="C")
    kind = _kind(arr.dtype)
    assert kind is not None  # _float_array checked it
    if kind in ("f16", "bf16"):
        arr = arr.view(np.uint16)
    return arr, kind


def _check_scheme(scheme: Any) -> QuantScheme:
    return resolve(scheme)


def _numpy_int(v: int) -> bool:
    """Whether numpy takes the int ``v`` as a number (int64 or uint64): past that it makes an
    object array, which the reference refuses as not a real number (``TypeError``)."""
    return -(2**63) <= v < 2**64


#: The least float64 that rounds to +inf in float32: f32's largest value plus half its ulp,
#: 2^128 - 2^103 (a tie, and the largest value's last bit is odd, so it rounds up).
_F32_OVERFLOW = 2.0**128 - 2.0**103


def _explicit_scales(scales: Any) -> np.ndarray:
    # One Python float or int, alone or as a one-element list or tuple (a per-tensor scale, the
    # common case): the same checks on a float, without numpy's cost per call, which is most of
    # a small call's. Anything else (bools, huge ints, arrays) takes the general path below.
    one = scales[0] if type(scales) in (list, tuple) and len(scales) == 1 else scales
    # (An int past numpy's int64/uint64 is an object array there, refused: so it is here.)
    if type(one) is float or (type(one) is int and _numpy_int(one)):
        v = float(one)
        if not (math.isfinite(v) and v >= 0):
            raise ScaleError(f"scales must be finite and >= 0, got {v} at index 0")
        if v >= _F32_OVERFLOW:
            raise ScaleError("scales must fit in float32")
        return np.array([v] if one is not scales else v, dtype=np.float32)
    # A float32 array (a quantize's scales, a file's): one pass over the bit patterns says
    # every value is finite and >= 0 (a pattern up to float32's largest), and the array is
    # used as it is (C-contiguous), without the general path's float64 copy and its page
    # faults. The core reads it into scales of its own before it writes anything.
    # (A plain ndarray: a subclass's max() may differ; np.ma's of an all-masked array is
    # `masked`. Subclasses take the general path, which reads their data as np.asarray does.)
    if type(scales) is np.ndarray and scales.dtype == np.float32 and scales.flags.aligned:
        if scales.size == 0 or int(scales.view(np.uint32).max()) <= 0x7F7FFFFF:
            return np.asarray(scales, order="C")  # (not ascontiguousarray: 0-d stays 0-d)
    try:
        raw = np.asarray(scales)
    except (TypeError, ValueError):
        raise TypeError(f"scales must be an array of numbers, got {type(scales).__name__}") from None
    # Real numbers only, as the reference: no bools, complex (numpy would drop the imaginary
    # part), strings (numpy would parse them) or objects.
    if raw.dtype.kind not in "fiu" and raw.dtype.name != "bfloat16":
        raise TypeError(f"scales must be an array of real numbers, got dtype {raw.dtype}")
    arr = raw.astype(np.float64)
    # Array methods, not np.all/np.any: their Python wrappers cost microseconds a call.
    ok = np.isfinite(arr) & (arr >= 0)
    if not ok.all():
        bad = int(np.flatnonzero(~ok.ravel())[0])
        raise ScaleError(f"scales must be finite and >= 0, got {arr.ravel()[bad]} at index {bad}")
    # A finite float64 scale from halfway past f32's largest value on would become inf.
    if (arr >= _F32_OVERFLOW).any():
        raise ScaleError("scales must fit in float32")
    return arr.astype(np.float32, order="C")


def _scales_in_grid(scales: Any, grid: Any, scheme: QuantScheme, shape: Tuple[int, ...]) -> np.ndarray:
    """Caller-given scales, checked, as float32 in the grid's shape (a per-tensor scheme's one
    scale in any shape holding one value: 2.0, [2.0], [[2.0]]; a block scheme's in the grid's
    shape only, even when that is (1,))."""
    arr = _explicit_scales(scales)
    grid = tuple(grid)
    if arr.shape == grid:
        return arr
    if arr.size == 1 and scheme.block is None:
        return arr.reshape(1)
    raise ScaleError(
        f"scales for {scheme!r} on shape {shape} have the grid shape {grid}, got {arr.shape}"
    )


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class QTensor:
    """A quantized tensor: value storage, its scales, and the scheme and shape they belong to.

    Immutable: ``values`` and ``scales`` are read-only arrays.
    """

    __slots__ = ("_values", "_scales", "_global", "_shape", "_scheme", "_offsets")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "QTensor is made by blockquant.quantize, QTensor.from_bytes or QTensor.from_parts"
        )

    @classmethod
    def _new(
        cls,
        values: np.ndarray,
        scales: np.ndarray,
        global_scale: Optional[float],
        scheme: QuantScheme,
        shape: Tuple[int, ...],
        offsets: Optional[np.ndarray] = None,
    ) -> "QTensor":
        self = object.__new__(cls)
        self._values = _readonly(values)
        self._scales = _readonly(scales)
        self._global = None if global_scale is None else float(global_scale)
        self._scheme = scheme
        self._shape = tuple(shape)
        self._offsets = None if offsets is None else _readonly(offsets)
        return self

    def __reduce__(self) -> Tuple[Any, ...]:
        # pickle, copy and deepcopy rebuild through from_parts: checked, and read-only again
        # (the default copied the arrays writeable).
        if self._offsets is not None:
            return (QTensor.from_parts, (self._values, self._scales, self._scheme, self._shape,
                                         self._global, self._offsets))
        return (QTensor.from_parts, (self._values, self._scales, self._scheme, self._shape,
                                     self._global))

    def __setstate__(self, state: Any) -> None:
        # A pickle in the default form (made before __reduce__ existed): its slots, rebuilt
        # through from_parts all the same.
        slots = state[1] if isinstance(state, tuple) and len(state) == 2 else state
        if not isinstance(slots, dict) or set(slots) | {"_offsets"} != set(QTensor.__slots__):
            raise TypeError("not the state of a QTensor")
        qt = QTensor.from_parts(slots["_values"], slots["_scales"], slots["_scheme"],
                                slots["_shape"], slots["_global"], slots.get("_offsets"))
        for name in QTensor.__slots__:
            object.__setattr__(self, name, getattr(qt, name))

    # -- the parts -------------------------------------------------------------------------
    @property
    def values(self) -> np.ndarray:
        """The value storage (format.md "Stores and packing"): int8, uint8 or uint32."""
        return self._values

    @property
    def scales(self) -> np.ndarray:
        """The stored scales as float32, in the grid's shape (two-level: block scales b_i)."""
        return self._scales

    @property
    def offsets(self) -> Optional[np.ndarray]:
        """An affine scheme's offsets in the grid's shape, like ``scales``: zero points as
        uint8, biases as float32; None for any other scheme."""
        return self._offsets

    @property
    def global_scale(self) -> Optional[float]:
        """A two-level scheme's per-tensor scale g, else None."""
        return self._global

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def scheme(self) -> QuantScheme:
        return self._scheme

    @property
    def nbytes(self) -> int:
        """Length of :meth:`to_bytes`: storage + scales + (two-level) 4."""
        return self._scheme.layout(self._shape).nbytes

    @property
    def bits_per_value(self) -> float:
        """Stored bits per element, scales included (inf for an empty tensor)."""
        n = int(np.prod(self._shape, dtype=np.int64))
        return float("inf") if n == 0 else 8.0 * self.nbytes / n

    # -- conversions -----------------------------------------------------------------------
    def dequantize(self, dtype: Any = None, *, out: Optional[np.ndarray] = None) -> np.ndarray:
        """x̂ = decode(q) × scale as float32, or converted from that f32 result (round to nearest
        even) to float16, bfloat16 or float64 — written directly, with no float32 temporary.

        ``out``: a caller's array to write into instead of a new one (reused buffers skip the
        page faults of fresh memory): C-contiguous, writeable, of the tensor's shape and of
        ``dtype`` (which defaults to ``out``'s), sharing no memory with the tensor. Returns it.
        """
        if dtype is None:
            dtype = np.float32 if out is None else getattr(out, "dtype", np.float32)
        name = _output_dtype_name(dtype)
        target = None
        if out is not None:
            target = _check_out(out, name, self)
        if self._offsets is not None:
            res = _native.affine_dequantize(
                self._values, self._scales, _offsets_f32(self._offsets), self._scheme._handle,
                self._shape, name,
            )
            if target is not None:
                np.copyto(target, res.reshape(target.shape))
        else:
            res = _native.dequantize(
                self._values, self._scales, self._global, self._scheme._handle, self._shape,
                name, target,
            )
        if out is not None:
            return out
        if name == "float16":
            res = res.view(np.float16)
        elif name == "bfloat16":
            res = res.view(_import_ml_dtypes().bfloat16)
        # The numpy crate makes 0-d arrays as shape (1,): give back the caller's shape.
        res = res.reshape(self._shape)
        if (isinstance(dtype, np.dtype) or (isinstance(dtype, str) and dtype[:1] in "<>")) \
                and not np.dtype(dtype).isnative:
            res = res.astype(np.dtype(dtype))  # '>f4' asked: big-endian given, as the reference
        return res

    def to_bytes(self) -> bytes:
        """burn's layout (format.md "The byte layout"): values, then scales, then the f32 per-tensor scale
        (an affine scheme: values, scales, then offsets)."""
        if self._offsets is not None:
            return _native.affine_to_bytes(
                self._values, self._scales, _offsets_f32(self._offsets), self._scheme._handle,
                self._shape,
            )
        return _native.to_bytes(
            self._values, self._scales, self._global, self._scheme._handle, self._shape
        )

    @classmethod
    def from_bytes(cls, data: Any, scheme: Union[QuantScheme, str], shape: Any) -> "QTensor":
        """Rebuild from :meth:`to_bytes` output; the length must match exactly."""
        scheme = _check_scheme(scheme)
        shape = _shape(shape)
        if scheme.offset is not None:
            values, scales, offs = _native.affine_from_bytes(as_bytes(data), scheme._handle, shape)
            return cls._new(values, scales, None, scheme, shape, _offsets_natural(offs, scheme))
        values, scales, g = _native.from_bytes(as_bytes(data), scheme._handle, shape)
        return cls._new(values, scales, g, scheme, shape)

    @classmethod
    def from_parts(
        cls,
        values: Any,
        scales: Any,
        scheme: Union[QuantScheme, str],
        shape: Any,
        global_scale: Optional[float] = None,
        offsets: Any = None,
    ) -> "QTensor":
        """Assemble a tensor from storage and stored scales, checking both.

        ``offsets``: an affine scheme's offsets in the grid's shape (zero points: integers from
        0 to qmax; biases: exactly representable in their dtype), required for an affine
        scheme and refused for any other (``ScaleError``).

        ``values`` must have the storage dtype and shape with valid codes (else ``LayoutError``);
        ``scales`` the grid shape with values exactly representable in the scale dtype (else
        ``ScaleError``, naming the first bad index).
        """
        scheme = _check_scheme(scheme)
        shape = _shape(shape)
        if not isinstance(values, np.ndarray):
            raise TypeError(f"values must be a numpy array, got {type(values).__name__}")
        layout = scheme.layout(shape)
        if values.dtype.newbyteorder("=") != layout.storage_dtype:
            raise LayoutError(
                f"values for {scheme!r} are stored as {layout.storage_dtype}, got {values.dtype}"
            )
        if tuple(values.shape) != layout.storage_shape:
            raise LayoutError(
                f"values for {scheme!r} with shape {shape} have storage shape "
                f"{layout.storage_shape}, got {tuple(values.shape)}"
            )
        scales_f = _scales_in_grid(scales, layout.scale_grid, scheme, shape)
        values = np.array(values, dtype=values.dtype.newbyteorder("="), order="C", copy=True)
        g = None if global_scale is None else _global_scale(global_scale)
        if scheme.offset is None and offsets is not None:
            raise ScaleError(f"{scheme!r} takes no offsets (only an affine scheme does)")
        if scheme.offset is not None:
            if offsets is None:
                raise ScaleError(f"{scheme!r} requires offsets (one per scale)")
            if g is not None:
                raise UnexpectedGlobalScaleError(f"{scheme!r} does not take a per-tensor scale")
            offs = _given_offsets(offsets, layout.scale_grid, scheme, shape)
            _native.check_affine_parts(values, scales_f, offs, scheme._handle, shape)
            return cls._new(values, scales_f.copy(), None, scheme, shape,
                            _offsets_natural(offs, scheme))
        _native.check_parts(values, scales_f, g, scheme._handle, shape)
        return cls._new(values, scales_f.copy(), g, scheme, shape)

    def values_view(self) -> np.ndarray:
        """Native float values as an ml_dtypes array (float8_e4m3fn, float8_e5m2,
        float4_e2m1fn); Native int values as they are (int8)."""
        if not self._scheme.store.kind == "native":
            raise LayoutError(
                f"values_view needs the Native store (one value per element), got {self._scheme!r}"
            )
        if not self._scheme.value.is_float:
            return self._values
        return self._values.view(_ml_dtype(self._scheme.value))

    def scales_view(self) -> np.ndarray:
        """The stored scales in their own dtype (float32/float16 from numpy; bfloat16,
        float8_e8m0fnu and float8_e4m3fn from ml_dtypes)."""
        dtype = self._scheme.scale_dtype
        if dtype is ScaleDtype.F32:
            return self._scales
        if dtype is ScaleDtype.F16:
            return self._scales.astype(np.float16)
        ml = _import_ml_dtypes()
        target = {
            ScaleDtype.BF16: ml.bfloat16,
            ScaleDtype.UE8M0: ml.float8_e8m0fnu,
            ScaleDtype.UE4M3: ml.float8_e4m3fn,
        }[dtype]
        return self._scales.astype(target)

    def __repr__(self) -> str:
        g = "" if self._global is None else f", global_scale={self._global!r}"
        offs = "" if self._offsets is None else \
            f", offsets={self._offsets.dtype}{tuple(self._offsets.shape)}"
        return (
            f"QTensor(shape={self._shape}, scheme={self._scheme!r}, "
            f"values={self._values.dtype}{tuple(self._values.shape)}, "
            f"scales=float32{tuple(self._scales.shape)}{g}{offs})"
        )


def _offsets_f32(offsets: np.ndarray) -> np.ndarray:
    """Offsets as the core takes them: float32 in the grid's shape, C order."""
    return np.ascontiguousarray(offsets, dtype=np.float32)


def _offsets_natural(offs: np.ndarray, scheme: QuantScheme) -> np.ndarray:
    """The core's float32 offsets as ``QTensor.offsets`` holds them: zero points as uint8."""
    assert scheme.offset is not None
    return offs.astype(np.uint8) if scheme.offset.kind == "zero" else offs


def _given_offsets(offsets: Any, grid: Any, scheme: QuantScheme, shape: Tuple[int, ...]) -> np.ndarray:
    """A caller's offsets as float32 in the grid's shape; the core checks their values."""
    try:
        raw = np.asarray(offsets)
    except (TypeError, ValueError):
        raise TypeError(f"offsets must be an array of numbers, got {type(offsets).__name__}") from None
    if raw.dtype.kind not in "fiu" and raw.dtype.name != "bfloat16":
        raise TypeError(f"offsets must be an array of real numbers, got dtype {raw.dtype}")
    a64 = raw.astype(np.float64)
    if not np.isfinite(a64).all():
        bad = int(np.flatnonzero(~np.isfinite(a64).ravel())[0])
        raise ScaleError(f"offsets must be finite, got {a64.ravel()[bad]} at index {bad}")
    with np.errstate(over="ignore"):
        a32 = a64.astype(np.float32)
    if not (a32.astype(np.float64) == a64).all():
        bad = int(np.flatnonzero((a32.astype(np.float64) != a64).ravel())[0])
        raise ScaleError(f"offset {a64.ravel()[bad]} at index {bad} is not a float32 value")
    grid = tuple(grid)
    if a32.shape != grid:
        if a32.size == 1 and scheme.block is None:
            a32 = a32.reshape(1)
        else:
            raise ScaleError(f"offsets for {scheme!r} on shape {shape} have the grid shape "
                             f"{grid}, got {a32.shape}")
    return np.ascontiguousarray(a32)


def _import_ml_dtypes() -> Any:
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(
            "typed views need ml_dtypes: pip install 'blockquant[ml]' (or pip install ml-dtypes)"
        ) from None
    return ml_dtypes


def _ml_dtype(value: QuantValue) -> Any:
    ml = _import_ml_dtypes()
    return {
        QuantValue.E4M3: ml.float8_e4m3fn,
        QuantValue.E5M2: ml.float8_e5m2,
        QuantValue.E2M1: ml.float4_e2m1fn,
    }[value]


def _output_dtype_name(dtype: Any) -> str:
    # numpy knows the name "bfloat16" only once ml_dtypes is imported; the name must work first.
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dequantize returns a float dtype, got {dtype!r}") from None
    name = _dtype_name(dt)
    if name not in _INPUT_KINDS:
        raise TypeError(f"dequantize returns float16, bfloat16, float32 or float64, got {dt}")
    return name


def _global_scale(g: Any) -> float:
    """The caller's per-tensor scale g as the float32 value it becomes: refused as the
    reference refuses it (``TypeError`` for what is not one real number, ``ScaleError`` for a
    value that is not finite, negative or past float32)."""
    if isinstance(g, (bool, np.bool_)):  # bool is an int: not a scale
        raise TypeError(f"global_scale must be a real number, got {g!r}")
    # (float() of an int past 1e308 would raise OverflowError.)
    if isinstance(g, int) and not _numpy_int(g):
        raise TypeError(f"global_scale must be a real number within 64 bits, got an int of "
                        f"{g.bit_length()} bits")
    if not isinstance(g, (int, float, np.integer, np.floating)):
        try:
            a = np.asarray(g)
            if a.dtype.kind not in "fiu" and a.dtype.name != "bfloat16":
                raise TypeError
        except (TypeError, ValueError):
            raise TypeError(f"global_scale must be a number, got {type(g).__name__}") from None
        if a.ndim != 0:  # [2.0] is a list of scales, not the scale
            raise TypeError(f"global_scale is one real number, got shape {a.shape}")
        g = a.astype(np.float64)[()]
    g64 = float(g)
    with np.errstate(over="ignore"):
        g32 = np.float32(g64)
    if not np.isfinite(g64) or g64 < 0 or not np.isfinite(g32):
        raise ScaleError(f"the per-tensor scale must be finite and >= 0, got {g64}")
    return float(g32)


def quantize(
    x: Any,
    scheme: Union[QuantScheme, str],
    *,
    calibration: Optional[Calibration] = None,
    rounding: Optional[Rounding] = None,
    scale_rounding: Optional[ScaleRounding] = None,
    scales: Any = None,
    global_scale: Optional[float] = None,
    out: Optional[Tuple[np.ndarray, np.ndarray]] = None,
    weights: Any = None,
) -> QTensor:
    """Quantize ``x`` with ``scheme`` (format.md "Calibration" to "Quantizing a value"): a :class:`QuantScheme`, a preset name
    (``"nvfp4"``) or a scheme text (``"q4s/packed_u32_0/block32:f16"``).

    ``calibration``: "minmax" (max |x| per block), "absmean" (mean |x|, BitNet b1.58) or "mse"
    (per block, the stored scale of least squared error among candidates near minmax's: max |x|
    landing at 62/64 to 66/64 of half the value range for 8-bit values, 27/32 to 37/32 for
    4-bit, 1 to 3 times for 2-bit; UE8M0 scales: minmax's, half and twice it). Where that range
    cannot hold the best scale (one scale for a whole tensor of 2-bit values) a
    ``RuntimeWarning`` names a better calibration.
    ``weights``: per-element importance (finite, >= 0, broadcastable to ``x``, like llama.cpp's
    imatrix): "mse" then minimizes the weighted error. Only with "mse".
    ``rounding`` of int values: "half_away" (burn, ggml) or "half_even" (numpy, ONNX, PyTorch).
    ``scale_rounding``: "up" (values never clip), "nearest" (a plain cast) or "mx" (the OCP MX
    rule, UE8M0 scales only).
    An option left as None is the scheme's own (a preset's), else the default (minmax,
    half_away, up).
    ``scales``: explicit scales in the grid's shape (two-level: block scales b_i); skips
    calibration. ``global_scale``: a two-level scheme's per-tensor scale g.
    ``out``: ``(values, scales)``, caller's arrays to write into instead of new ones (reused
    buffers skip the page faults of fresh memory), as ``scheme.layout(x.shape)`` describes them:
    ``storage_dtype`` in ``storage_shape`` and float32 in ``scale_grid``, C-contiguous, writeable,
    sharing no memory with ``x`` or each other (the given ``scales`` may be one of them: they
    are copied first). A bad ``out`` is refused before
    anything is written; if quantizing itself fails (non-finite input, say), the arrays may be
    partly written. The returned QTensor holds read-only views of them: writing into the same
    arrays again changes it.
    """
    scheme = resolve(scheme)
    advice = mse_advice(scheme, calibration)
    if advice is not None:
        warnings.warn(advice, RuntimeWarning, stacklevel=2)
    return _quantize(x, scheme, calibration=calibration, rounding=rounding,
                     scale_rounding=scale_rounding, scales=scales, global_scale=global_scale,
                     out=out, weights=weights)


def mse_advice(scheme: QuantScheme, calibration: Optional[str] = None) -> Optional[str]:
    """Why calibration ``mse`` (``calibration``, else the scheme's own) cannot help
    ``scheme``, with a better one; None when it can, or the calibration is another."""
    if (calibration if calibration is not None else scheme.options.calibration) != "mse":
        return None
    if scheme.offset is not None:  # affine mse searches the range itself
        return None
    # The search tries only scales that put a block's max |x| at 1 to 3 times the largest
    # 2-bit value (format.md "Searched scales: `mse`"). Per block, max |x| is within a few
    # times the mean |x| and that range holds the best scale; over a whole tensor it is many
    # times larger, while a ternary scale is best near mean |x| (BitNet b1.58's absmean): the
    # search stays at its smallest candidate (bitnet on MiniLM's FFN weights: 0.16 dB with
    # mse, 4.59 with absmean). Wider values (4, 8 bits) want a scale near max |x|, in range.
    if scheme.value.bits != 2 or scheme.block is not None:
        return None
    return (f"calibration 'mse' cannot help {described(scheme)}: it tries scales from "
            "max|x|/h down to max|x|/(3h) only (h: half the value range), and one scale for a "
            "whole tensor of 2-bit values is best far lower; calibration 'absmean' does better")


def _quantize(
    x: Any,
    scheme: QuantScheme,
    *,
    calibration: Optional[Calibration] = None,
    rounding: Optional[Rounding] = None,
    scale_rounding: Optional[ScaleRounding] = None,
    scales: Any = None,
    global_scale: Optional[float] = None,
    out: Optional[Tuple[np.ndarray, np.ndarray]] = None,
    weights: Any = None,
) -> QTensor:
    """:func:`quantize` of a resolved scheme, without its advice (a file run gives it once,
    when planned, not per tensor)."""
    # The checks in blockquant.reference's order, so that a call with several faults fails on
    # the one the reference names: option names, the input's dtype, the options against the
    # scheme, the scheme against the shape, whether g belongs, g's value, the weights, the
    # scales; the data last, in the core.
    cal, rnd, srnd = scheme.options.resolve(calibration, rounding, scale_rounding)
    if type(cal) is str and type(rnd) is str and type(srnd) is str:
        _options_checked(cal, rnd, srnd)
    else:
        _native.check_options(cal, rnd, srnd)  # TypeError
    xs, kind = _as_input(x)
    if xs.size == 0:
        # numpy holds an empty float16 array of shape (0, 2**61), but not the float32 or uint32
        # arrays of the same shape that quantize and dequantize make: refused as from_bytes
        # refuses that shape.
        _shape(xs.shape)
    _call_checked(
        scheme._handle, xs.shape, cal, rnd, srnd, scales is not None, global_scale is not None
    )
    g = None if global_scale is None else _global_scale(global_scale)
    w = None
    if weights is not None:
        w = importance_weights(weights, xs.shape)
        refusal = weights_refusal(cal, scales is not None)
        if refusal is not None:
            raise QuantError(refusal)
    given = None
    if scales is not None:
        # An array's shape is a tuple of ints >= 0: the cached layout without the checks of
        # `QuantScheme.layout` (a few microseconds of a small call).
        grid = _layout(scheme, xs.shape).scale_grid
        given = _scales_in_grid(scales, grid, scheme, xs.shape)
    if scheme.offset is not None:
        if out is not None:
            raise QuantError(f"out= is not taken with an affine scheme yet, got {scheme!r}")
        if w is not None:
            raise QuantError(f"weights= are not taken by an affine scheme's search, got {scheme!r}")
        values, stored, offs = _native.affine_quantize(xs, kind, scheme._handle, cal, rnd, srnd)
        return QTensor._new(values, stored, None, scheme, xs.shape,
                            _offsets_natural(offs, scheme))
    out_v = out_s = None
    if out is not None:
        out_v, out_s = _check_quantize_out(out, scheme, xs)
        if given is not None and (np.shares_memory(given, out_v) or np.shares_memory(given, out_s)):
            given = given.copy()  # the caller's scales array is written as it is read: ours
    values, stored, g_out = _native.quantize(
        xs, kind, scheme._handle, cal, rnd, srnd, given, g, out_v, out_s, w
    )
    if out is not None:
        # Views, so the caller's arrays keep their own writeable flag.
        values, stored = values.view(), stored.view()
    return QTensor._new(values, stored, g_out, scheme, xs.shape)


def affine_codes(x: Any, scheme: Any, bits: int, *, calibration: Optional[str] = None,
                 rounding: Optional[str] = None, scale_rounding: Optional[str] = None,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The codes of ``bits`` bits (1 to 8) a U8 affine ``scheme`` gives ``x``, every code in
    [0, 2^bits − 1] (the range, search and rounding those of a ``bits``-bit value): ``(codes
    uint8 in x's shape, scales, offsets)``, the last two float32 in the scale grid's shape. For
    writers of formats whose code widths blockquant's values lack (MLX's 3, 5 and 6 bits);
    ``blockquant.reference.affine_codes`` is its arithmetic."""
    scheme = resolve(scheme)
    cal, rnd, srnd = scheme.options.resolve(calibration, rounding, scale_rounding)
    xs, kind = _as_input(x)
    _call_checked(scheme._handle, xs.shape, cal, rnd, srnd, False, False)
    if type(bits) is not int:
        raise TypeError(f"bits is an int, got {bits!r}")
    values, stored, offs = _native.affine_quantize(xs, kind, scheme._handle, cal, rnd, srnd,
                                                   bits)
    return values.reshape(xs.shape), stored, _offsets_natural(offs, scheme)


# The argument checks that read no value (names, options against the scheme, the shape) give
# the same answer for the same arguments: remembered once passed, as `_layout` is (the two
# native calls were about 0.5 µs of a 7 µs small call). Errors are not cached: raised again.
@functools.lru_cache(maxsize=64)
def _options_checked(cal: str, rnd: str, srnd: str) -> None:
    _native.check_options(cal, rnd, srnd)


# (Keyed by the scheme's compiled handle, hashed by identity: a QuantScheme's own hash walks
# its fields, 0.2 µs.)
@functools.lru_cache(maxsize=512)
def _call_checked(handle: Any, dims: Tuple[int, ...], cal: str, rnd: str, srnd: str,
                  has_scales: bool, has_global: bool) -> None:
    _native.check_call(handle, dims, cal, rnd, srnd, has_scales, has_global)


def _check_quantize_out(out: Any, scheme: QuantScheme, xs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """quantize's ``out=(values, scales)``, checked before anything is written."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"out must be a tuple (values, scales), got {type(out).__name__}")
    values, scales = out
    layout = _layout(scheme, xs.shape)
    for arr, what, dtype, shape in (
        (values, "values", layout.storage_dtype, layout.storage_shape),
        (scales, "scales", np.dtype(np.float32), layout.scale_grid),
    ):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"out {what} must be a numpy array, got {type(arr).__name__}")
        if arr.dtype != dtype or not arr.dtype.isnative:
            raise TypeError(f"out {what} must be a native-order {dtype} array, got {arr.dtype}")
        if arr.shape != tuple(shape):
            raise ValueError(f"out {what} must have the shape {tuple(shape)}, got {arr.shape}")
        if not (arr.flags.c_contiguous and arr.flags.aligned and arr.flags.writeable):
            raise ValueError(f"out {what} must be a writeable, aligned, C-contiguous array")
        if np.shares_memory(arr, xs):
            raise ValueError(f"out {what} shares memory with an input")
    if np.shares_memory(values, scales):
        raise ValueError("out values and scales share memory")
    return values, scales


def dequantize(qt: QTensor, dtype: Any = None, *, out: Optional[np.ndarray] = None) -> np.ndarray:
    """``qt.dequantize(dtype, out=out)``."""
    if not isinstance(qt, QTensor):
        raise TypeError(f"dequantize takes a QTensor, got {type(qt).__name__}")
    return qt.dequantize(dtype, out=out)


def _check_out(out: Any, name: str, qt: QTensor) -> np.ndarray:
    """The caller's output array as the core writes it (half types as their uint16 bits), after
    every check: a bad one is a TypeError or ValueError, and nothing is written."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if _dtype_name(out.dtype) != name or not out.dtype.isnative:
        raise TypeError(f"out must be a native-order {name} array, got {out.dtype}")
    if out.shape != qt.shape:
        raise ValueError(f"out must have the tensor's shape {qt.shape}, got {out.shape}")
    if not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable):
        raise ValueError("out must be a writeable, aligned, C-contiguous array")
    if np.shares_memory(out, qt.values) or np.shares_memory(out, qt.scales):
        raise ValueError("out shares memory with the tensor it would be written from")
    return out.view(np.uint16) if name in ("float16", "bfloat16") else out


def round_scale(arr: Any, dtype: ScaleDtype, mode: ScaleRounding = "up") -> np.ndarray:
    """Round scales to what ``dtype`` stores (format.md "Storing a scale: rounding to its dtype"); returns their float32 values."""
    if not isinstance(dtype, ScaleDtype):
        raise TypeError(f"dtype must be a blockquant.ScaleDtype, got {dtype!r}")
    a = np.asarray(arr)
    if a.dtype.kind not in "fiu" and a.dtype.name != "bfloat16":
        raise TypeError(f"scales must be a real array, got dtype {a.dtype}")
    a64 = a.astype(np.float64)
    bad = ~np.isfinite(a64) | (a64 < 0)
    if bad.any():
        i = int(np.flatnonzero(bad.ravel())[0])
        raise ScaleError(f"scales must be finite and >= 0, got {a64.ravel()[i]} at index {i}")
    # float64 → float32 first (RNE), exactly as the core receives every scale; a scale past
    # f32's range is an error, as for quantize(scales=...) and the reference.
    with np.errstate(over="ignore"):
        a32 = a64.astype(np.float32)
    if np.isinf(a32).any():
        i = int(np.flatnonzero(np.isinf(a32).ravel())[0])
        raise ScaleError(f"scales must fit in float32, got {a64.ravel()[i]} at index {i}")
    out = _native.round_scale(np.ascontiguousarray(a32), dtype.value, mode)
    return out.reshape(a.shape)
