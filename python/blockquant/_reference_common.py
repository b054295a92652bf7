"""The vocabulary of :mod:`blockquant.reference`, shared with its mse search
(:mod:`blockquant._reference_search`): the oracle's own facts of each value type and scale
dtype, the minifloat and UE8M0 codecs, scale rounding, and block geometry.

Both oracle modules import this one and it imports neither, so the arrows run one way. The
facts are written out here rather than read from :class:`blockquant.QuantValue`, whose
properties come from the Rust core: the oracle is what the core is checked against, so it takes
nothing from it (``tests/test_scheme_model.py`` checks the two agree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _reference_lookup as _lookup
from .errors import LayoutError, SchemeError
from .scheme import QuantScheme, QuantValue, ScaleDtype

F32_MAX = np.float32(np.finfo(np.float32).max)


# ===============================================================================================
# The oracle's facts (format.md "The scheme")
# ===============================================================================================

#: Each value type: (bits, qmin, qmax, is a float format).
VALUE_FACTS = {
    QuantValue.Q8F: (8, -128.0, 127.0, False),
    QuantValue.Q8S: (8, -127.0, 127.0, False),
    QuantValue.Q4F: (4, -8.0, 7.0, False),
    QuantValue.Q4S: (4, -7.0, 7.0, False),
    QuantValue.Q2F: (2, -2.0, 1.0, False),
    QuantValue.Q2S: (2, -1.0, 1.0, False),
    QuantValue.E4M3: (8, -448.0, 448.0, True),
    QuantValue.E5M2: (8, -57344.0, 57344.0, True),
    QuantValue.E2M1: (4, -6.0, 6.0, True),
    QuantValue.U8: (8, 0.0, 255.0, False),
    QuantValue.U4: (4, 0.0, 15.0, False),
    QuantValue.U2: (2, 0.0, 3.0, False),
}

#: Each scale dtype: (bytes, largest finite value, smallest value > 0, holds 0).
SCALE_FACTS = {
    ScaleDtype.F32: (4, float(F32_MAX), 2.0**-149, True),
    ScaleDtype.F16: (2, 65504.0, 2.0**-24, True),
    ScaleDtype.BF16: (2, (2 - 2.0**-7) * 2.0**127, 2.0**-133, True),
    ScaleDtype.UE8M0: (1, 2.0**127, 2.0**-127, False),
    ScaleDtype.UE4M3: (1, 448.0, 2.0**-9, True),
}


def value_bits(value: QuantValue) -> int:
    return VALUE_FACTS[value][0]


def value_qmin(value: QuantValue) -> float:
    return VALUE_FACTS[value][1]


def value_qmax(value: QuantValue) -> float:
    return VALUE_FACTS[value][2]


def value_is_float(value: QuantValue) -> bool:
    return VALUE_FACTS[value][3]


def scale_nbytes(dtype: ScaleDtype) -> int:
    return SCALE_FACTS[dtype][0]


def scale_max(dtype: ScaleDtype) -> float:
    return SCALE_FACTS[dtype][1]


# ===============================================================================================
# Minifloat codecs (values E4M3 / E5M2 / E2M1, scales F16 / BF16 / UE4M3) and UE8M0
# ===============================================================================================


@dataclass(frozen=True)
class Minifloat:
    """A small binary float format: sign bit, ``ebits`` exponent bits, ``mbits`` mantissa bits.

    ``max_mag`` is the magnitude code (code without the sign) of the largest finite value: rounding
    saturates there. ``specials`` says what the all-ones exponent means when decoding:
    ``"ieee"`` (mantissa 0 is infinity, else NaN), ``"fn"`` (only S.1111.111 is NaN: OCP E4M3FN)
    or ``"none"`` (every code is a finite number: E2M1).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    max_mag: int
    specials: str

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)


E4M3 = Minifloat("E4M3", 4, 3, 7, 0x7E, "fn")
E5M2 = Minifloat("E5M2", 5, 2, 15, 0x7B, "ieee")
E2M1 = Minifloat("E2M1", 2, 1, 1, 0x7, "none")
F16 = Minifloat("F16", 5, 10, 15, 0x7BFF, "ieee")
BF16 = Minifloat("BF16", 8, 7, 127, 0x7F7F, "ieee")

FLOAT_VALUE_FORMATS = {QuantValue.E4M3: E4M3, QuantValue.E5M2: E5M2, QuantValue.E2M1: E2M1}


def _f32_fields(x: np.ndarray):
    """Split float32 values into (sign, biased exponent, mantissa), as int64 arrays."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    return bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF


def _round_magnitude(x: np.ndarray, fmt: Minifloat, mode: str) -> np.ndarray:
    """Magnitude code (int64) of |x| in ``fmt``, rounded to nearest-even or up, saturating at
    ``fmt.max_mag``. Works on the f32 bit pattern: x = sig * 2**lsb_exp exactly, and the format's
    quantum (the spacing of its values around |x|) is a power of two 2**q_exp; the code is
    round(sig / 2**(q_exp - lsb_exp)) offset by the binade. Infinity saturates like any large value.
    """
    _, e_field, mant = _f32_fields(x)
    # f32 subnormals have exponent field 0 but the scale of field 1, and no implicit leading 1.
    e1 = np.maximum(e_field, 1)
    sig = mant | np.where(e_field > 0, 1 << 23, 0)
    lsb_exp = e1 - 150  # |x| = sig * 2**lsb_exp
    # The binade of |x|, floored at the format's smallest normal binade (below it the format is
    # subnormal and its quantum stops shrinking). Every format here has 1 - bias >= -126, so f32
    # subnormal inputs always land in that floor.
    binade = np.maximum(e1 - 127, 1 - fmt.bias)
    q_exp = binade - fmt.mbits
    # shift >= 23 - mbits > 0. Past 25 every sig (< 2**24) is below half a quantum, so clamping
    # keeps the result and keeps the shift inside the integer width.
    shift = np.minimum(q_exp - lsb_exp, 25)
    q = sig >> shift
    rem = sig - (q << shift)
    if mode == "nearest":
        half = np.int64(1) << (shift - 1)
        q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    elif mode == "up":
        q = q + (rem > 0)
    else:  # pragma: no cover - internal callers pass a checked mode
        raise AssertionError(mode)
    # |x| ~ q * 2**q_exp. In a normal binade (biased exponent E = binade + bias >= 1) q is in
    # [2**mbits, 2**(mbits+1)) and the code is E << mbits | (q - 2**mbits) = ((E-1) << mbits) + q.
    # In the subnormal floor E - 1 = 0 and q < 2**mbits is the code itself: the same formula.
    # A rounding carry to q = 2**(mbits+1) lands on the first code of the next binade.
    mag = ((binade + fmt.bias - 1) << fmt.mbits) + q
    return np.minimum(mag, fmt.max_mag)


def _encode_minifloat(x: np.ndarray, fmt: Minifloat, mode: str = "nearest") -> np.ndarray:
    """Sign + magnitude code (int64) of finite or infinite float32 ``x``. The sign bit is kept
    even when the magnitude rounds to 0, so -0 stays -0 and -tiny becomes -0 (as a cast does)."""
    sign, _, _ = _f32_fields(x)
    return np.where(sign == 1, fmt.sign_bit, 0) | _round_magnitude(x, fmt, mode)


def _decode_minifloat(codes: np.ndarray, fmt: Minifloat) -> np.ndarray:
    """float32 value of each code of ``fmt`` (NaN and infinity codes included)."""
    codes = np.asarray(codes).astype(np.int64) & (2 * fmt.sign_bit - 1)
    negative = (codes & fmt.sign_bit) != 0
    mag = codes & (fmt.sign_bit - 1)
    e_field = mag >> fmt.mbits
    mant = mag & ((1 << fmt.mbits) - 1)
    # Normal: (2**mbits + mant) * 2**(e - bias - mbits); subnormal (e = 0): mant * 2**(1 - bias - mbits).
    sig = np.where(e_field > 0, mant + (1 << fmt.mbits), mant)
    exp = np.maximum(e_field, 1) - fmt.bias - fmt.mbits
    # ldexp in float64 is exact, and every value of these formats is a float32.
    value = np.ldexp(sig.astype(np.float64), exp.astype(np.int32)).astype(np.float32)
    top = (1 << fmt.ebits) - 1
    if fmt.specials == "ieee":
        value = np.where((e_field == top) & (mant == 0), np.float32(np.inf), value)
        value = np.where((e_field == top) & (mant != 0), np.float32(np.nan), value)
    elif fmt.specials == "fn":
        value = np.where(mag == fmt.sign_bit - 1, np.float32(np.nan), value)
    return np.where(negative, -value, value).astype(np.float32)


def _ue8m0_round(s: np.ndarray, mode: str) -> np.ndarray:
    """UE8M0 code (int64) of float32 scales s >= 0: ``up`` is 2**ceil(log2 s); ``nearest``
    rounds to nearest with ties up, as ml_dtypes' float8_e8m0fnu cast (format.md "Storing a scale: rounding to its dtype"), both within
    [2**-127, 2**127] (no zero: 0 and everything below 2**-127 give the smallest value). Read
    off the f32 bit pattern."""
    _, e_field, mant = _f32_fields(s)
    subnormal = e_field == 0  # includes 0; 2**-127 is itself an f32 subnormal (mantissa 0x400000)
    if mode == "up":
        # Normal: 2**(E-127) * (1 + m) rounds up to 2**(E-127+1) unless m == 0.
        code = np.where(subnormal, mant > 0x400000, e_field + (mant != 0))
    else:
        # Normal: the midpoint of [2**k, 2**(k+1)] is mantissa 0x400000, and a tie goes up.
        # Subnormal: the midpoint of [2**-127, 2**-126] is 1.5 * 2**-127, mantissa 0x600000.
        code = np.where(subnormal, mant >= 0x600000, e_field + (mant >= 0x400000))
    return np.clip(code.astype(np.int64), 0, 254)


def _ue8m0_decode(codes: np.ndarray) -> np.ndarray:
    codes = np.asarray(codes).astype(np.int64)
    value = np.ldexp(1.0, (np.minimum(codes, 254) - 127).astype(np.int32)).astype(np.float32)
    return np.where(codes == 255, np.float32(np.nan), value).astype(np.float32)


# ===============================================================================================
# Scale rounding (format.md "Storing a scale: rounding to its dtype") and the MX rule
# ===============================================================================================


# The rounding format of each scale dtype (UE8M0 has its own functions, F32 is the identity).
SCALE_FORMATS = {ScaleDtype.F16: F16, ScaleDtype.BF16: BF16, ScaleDtype.UE4M3: E4M3}


def _mx_emax(value: QuantValue) -> int:
    """The exponent of the value format's largest normal; floor(log2 qmax) for ints."""
    emax = {QuantValue.E2M1: 2, QuantValue.E4M3: 8, QuantValue.E5M2: 15}.get(value)
    return int(math.floor(math.log2(value_qmax(value)))) if emax is None else emax


def _mx_codes(alpha: np.ndarray, emax: int) -> np.ndarray:
    """UE8M0 codes of the OCP MX scale 2**(floor(log2 alpha) - emax) (format.md "Storing a scale: rounding to its dtype"), clamped to
    UE8M0's range; alpha = 0 gives the smallest value. frexp is exact for every f32."""
    _, e = np.frexp(alpha.astype(np.float32))  # alpha = m * 2**e, m in [0.5, 1)
    code = np.where(alpha > 0, e.astype(np.int64) - 1 - emax + 127, 0)
    return np.clip(code, 0, 254)


def _round_scale_saturating(s: np.ndarray, dtype: ScaleDtype, mode: str) -> np.ndarray:
    """round_scale without the checks, for s >= 0 that may be +inf (a ratio s_raw / g that
    overflowed): +inf saturates at the dtype's max like any value above it (F32: at f32 max)."""
    s = np.asarray(s + np.float32(0), dtype=np.float32)  # -0 + 0 = +0: never a negative zero
    if dtype is ScaleDtype.F32:
        return np.minimum(s, F32_MAX)
    if dtype is ScaleDtype.UE8M0 and mode == "mx":  # a given scale: down to a power of two
        return _ue8m0_decode(_mx_codes(s, 0)).reshape(s.shape)
    if dtype is ScaleDtype.UE8M0:
        return _ue8m0_decode(_ue8m0_round(s, mode)).reshape(s.shape)
    fmt = SCALE_FORMATS[dtype]
    return _decode_minifloat(_round_magnitude(s, fmt, mode), fmt).reshape(s.shape)


def _effective_scales(stored: np.ndarray, g: float | None) -> np.ndarray:
    """e = stored scale (one level) or b_i * g (two-level, one f32 multiply). The product
    saturates at f32 max: b rounded up near the dtype's max times g can round past f32 max."""
    if g is None:
        return stored
    with np.errstate(over="ignore"):
        return np.minimum(stored * np.float32(g), F32_MAX)


# ===============================================================================================
# Geometry: blocks and the scale grid (format.md "Blocks and the scale grid")
# ===============================================================================================


def _check_shape(shape) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"a shape is a sequence of ints, got {shape!r}") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"a shape is a sequence of ints, got an element {d!r}")
    dims = tuple(int(d) for d in dims)
    if any(d < 0 for d in dims):
        raise LayoutError(f"a shape has dims >= 0, got {dims}")
    # numpy cannot make an array whose non-zero dims multiply past its index range (times the
    # 4-byte elements of uint32 storage and float32 output), even when another dim is 0.
    if 4 * math.prod(max(d, 1) for d in dims) > np.iinfo(np.intp).max:
        raise LayoutError(f"shape {dims} has more elements than fit in memory")
    return dims


def _rank1(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape blocks and packing see: a 0-d tensor is one element of shape (1,)."""
    return shape if len(shape) > 0 else (1,)


def _block_dims(shape1: tuple[int, ...], scheme: QuantScheme) -> tuple[int, ...]:
    """The block size padded with leading 1s to the tensor's rank, each dim at most its axis's
    length (at least 1). A block longer than its axis holds the same elements as one the axis's
    length: the same grid, counts and scales, without padding to a length (2**64 - 1, say) no
    memory holds."""
    block = scheme.block.size
    if len(block) > len(shape1):
        raise SchemeError(
            f"a block of {len(block)} dims {list(block)} does not fit a tensor of rank "
            f"{len(shape1)} (shape {shape1}) under {scheme!r}"
        )
    full = (1,) * (len(shape1) - len(block)) + block
    return tuple(min(b, max(n, 1)) for n, b in zip(shape1, full))


def scale_grid_shape(shape, scheme: QuantScheme) -> tuple[int, ...]:
    """Shape of the scale grid: (1,) per-tensor, else ceil(dim / block) on each axis."""
    shape1 = _rank1(_check_shape(shape))
    if scheme.block is None:
        return (1,)
    return tuple(-(-n // b) for n, b in zip(shape1, _block_dims(shape1, scheme)))


def _block_rows(x1: np.ndarray, scheme: QuantScheme):
    """The tensor cut into its blocks: (rows, counts) with one zero-padded row per block, in the
    grid's row-major order, and the number of real elements of each (edge blocks are partial)."""
    if scheme.block is None:
        return x1.reshape(1, -1), np.array([x1.size], dtype=np.int64)
    block = _block_dims(x1.shape, scheme)
    grid = tuple(-(-n // b) for n, b in zip(x1.shape, block))
    if x1.size == 0:  # no blocks (a grid dim is 0), however long the others: none to list
        return np.zeros((0, math.prod(block)), x1.dtype), np.zeros(0, np.int64)
    padded = np.pad(x1, [(0, g * b - n) for n, b, g in zip(x1.shape, block, grid)])
    # (g0, b0, g1, b1, ...) -> (g0, g1, ..., b0, b1, ...) -> (blocks, elements per block)
    tiled = padded.reshape([d for gb in zip(grid, block) for d in gb])
    rank = len(block)
    tiled = tiled.transpose(list(range(0, 2 * rank, 2)) + list(range(1, 2 * rank, 2)))
    rows = tiled.reshape(math.prod(grid), math.prod(block))
    counts = np.ones((), dtype=np.int64)
    for n, b, g in zip(x1.shape, block, grid):
        counts = np.multiply.outer(counts, np.minimum(b, n - np.arange(g, dtype=np.int64) * b))
    return rows, counts.reshape(-1)


# ===============================================================================================
# Values: the divisor of alpha, integer codes (format.md "Calibration", "Two-level schemes")
# ===============================================================================================


def _half_range(value: QuantValue) -> np.float32:
    """(qmax - qmin) / 2, exact in float32 (127.5, 127, 7.5, 7, 1.5, 1, 448, 57344, 6)."""
    return np.float32((value_qmax(value) - value_qmin(value)) / 2)


def _scheme_half_range(scheme: QuantScheme) -> np.float32:
    """The divisor of alpha: the value's half range, or a codebook's largest magnitude."""
    if scheme.codebook is not None:
        return _lookup.half_range(scheme.codebook)
    return _half_range(scheme.value)


def _scheme_mx_emax(scheme: QuantScheme) -> int:
    if scheme.codebook is not None:
        return _lookup.mx_emax(scheme.codebook)
    return _mx_emax(scheme.value)


def _int_codes(x_s: np.ndarray, value: QuantValue, rounding: str) -> np.ndarray:
    """int8 codes: clamp to [qmin, qmax] (integers, so clamping first is the same as after),
    then round half away from zero or half to even."""
    v = np.clip(x_s, np.float32(value_qmin(value)), np.float32(value_qmax(value)))
    if rounding == "half_even":
        q = np.rint(v)
    else:
        t = np.trunc(v)
        q = np.where(np.abs(v - t) >= np.float32(0.5), t + np.sign(v), t)  # v - t is exact
    return q.astype(np.int8)
