"""blockquant.reference's scales (format.md "Storing a scale: rounding to its dtype" and the scale
bytes), and the option checks the reference shares: the numpy arithmetic, step for step.
``blockquant.reference`` re-exports the public names."""

from __future__ import annotations

import numpy as np

from ._reference_common import (
    E4M3,
    _decode_minifloat,
    _encode_minifloat,
    _round_scale_saturating,
    _ue8m0_decode,
    _ue8m0_round,
    scale_nbytes,
)
from .errors import LayoutError, QuantError, ScaleError, SchemeError
from .options import as_bytes
from .scheme import ScaleDtype

CALIBRATIONS = ("minmax", "absmean", "mse")
ROUNDINGS = ("half_away", "half_even")
SCALE_ROUNDINGS = ("up", "nearest", "mx")


def _check_option(name: str, value, allowed) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} is a string, one of {allowed}, got {value!r}")
    if value not in allowed:
        raise QuantError(f"{name} must be one of {allowed}, got {value!r}")


# =================================================================================================
# 2. Scales: rounding (format.md "Storing a scale: rounding to its dtype") and bytes
# =================================================================================================


def _as_f32(arr, what: str) -> np.ndarray:
    """A real numeric array as float32 (round to nearest even), or TypeError."""
    a = np.asarray(arr)
    if a.dtype.name == "bfloat16":
        return a.astype(np.float32)
    if a.dtype.kind not in "fiu" or a.dtype.kind == "b":
        raise TypeError(f"{what} must be real numbers, got dtype {a.dtype}")
    with np.errstate(over="ignore"):  # float64 beyond f32 range becomes inf, caught by callers
        return a.astype(np.float32)


def round_scale(arr, dtype: ScaleDtype, mode: str = "up") -> np.ndarray:
    """Round scales (>= 0, finite) to ``dtype`` and return them as float32 (format.md "Storing a scale: rounding to its dtype").

    ``up``: the smallest value of the dtype >= s, saturating at the dtype's max.
    ``nearest``: round to nearest, ties to even, saturating at the dtype's max.
    The input is first converted to float32. -0 becomes +0. F32 is the identity.
    """
    if not isinstance(dtype, ScaleDtype):
        raise TypeError(f"dtype is a ScaleDtype, got {dtype!r}")
    _check_option("mode", mode, SCALE_ROUNDINGS)
    s = _as_f32(arr, "scales")
    _check_scale_values(s)
    _check_mx(dtype, mode)
    return _round_scale_saturating(s, dtype, mode)


def _check_mx(dtype: ScaleDtype, mode: str) -> None:
    if mode == "mx" and dtype is not ScaleDtype.UE8M0:
        raise SchemeError(f"scale_rounding='mx' is the OCP MX rule for UE8M0 scales, not {dtype}")


def _check_scale_values(s: np.ndarray) -> None:
    flat = s.ravel()
    bad = np.flatnonzero(~np.isfinite(flat) | (flat < 0))
    if bad.size:
        i = int(bad[0])
        raise ScaleError(f"scales must be finite and >= 0, got {float(flat[i])!r} at index {i}")


def _scale_codes(s: np.ndarray, dtype: ScaleDtype) -> np.ndarray:
    """The exact code of each scale (sign and NaN kept, so decoded bytes re-encode to the same
    bytes); ScaleError naming the first scale the dtype cannot hold exactly."""
    s = np.ascontiguousarray(s, dtype=np.float32).ravel()
    nan = np.isnan(s)
    if dtype is ScaleDtype.F32:
        return s.view(np.uint32)
    if dtype is ScaleDtype.BF16:
        bits = s.view(np.uint32)
        codes, back = bits >> 16, (bits >> 16) << 16
    elif dtype is ScaleDtype.F16:
        # IEEE half: numpy's float16 converts representable values (and NaN payloads) exactly.
        with np.errstate(over="ignore"):
            half = s.astype(np.float16)
        codes, back = half.view(np.uint16), half.astype(np.float32).view(np.uint32)
    elif dtype is ScaleDtype.UE4M3:
        codes = np.where(nan, 0x7F, _encode_minifloat(s, E4M3))
        codes = codes | np.where(nan & np.signbit(s), 0x80, 0)
        back = _decode_minifloat(codes, E4M3).view(np.uint32)
    else:  # UE8M0
        codes = np.where(nan, 255, _ue8m0_round(np.abs(s), "nearest"))
        back = _ue8m0_decode(codes).view(np.uint32)
    wrong = ~nan & (back != s.view(np.uint32))
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        raise ScaleError(
            f"scale {float(s[i])!r} at index {i} is not exactly representable in {dtype}"
        )
    return codes


_SCALE_BYTE_DTYPES = {
    ScaleDtype.F32: "<u4",
    ScaleDtype.F16: "<u2",
    ScaleDtype.BF16: "<u2",
    ScaleDtype.UE8M0: "u1",
    ScaleDtype.UE4M3: "u1",
}


def encode_scales(arr_f32, dtype: ScaleDtype) -> bytes:
    """Little-endian bytes of scales that ``dtype`` holds exactly (F32 4 bytes, F16/BF16 2 bytes,
    UE8M0 one byte = e, UE4M3 one byte = the E4M3 code). Not a rounding: see round_scale."""
    s = _as_f32(arr_f32, "scales")
    return _scale_codes(s, dtype).astype(_SCALE_BYTE_DTYPES[dtype]).tobytes()


def decode_scales(data, dtype: ScaleDtype, n: int) -> np.ndarray:
    """``n`` scales from their bytes, as float32 (flat). Any bit pattern decodes (NaN, negative)."""
    data = as_bytes(data)
    expected = n * scale_nbytes(dtype)
    if len(data) != expected:
        raise LayoutError(f"expected {expected} bytes for {n} {dtype} scales, got {len(data)}")
    codes = np.frombuffer(data, dtype=_SCALE_BYTE_DTYPES[dtype]).astype(np.uint32)
    if dtype is ScaleDtype.F32:
        return codes.view(np.float32).copy()
    if dtype is ScaleDtype.BF16:
        return (codes << 16).view(np.float32)
    if dtype is ScaleDtype.F16:
        return codes.astype(np.uint16).view(np.float16).astype(np.float32)
    if dtype is ScaleDtype.UE4M3:
        return _decode_minifloat(codes, E4M3)
    return _ue8m0_decode(codes)
