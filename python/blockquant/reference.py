"""The pure-numpy definition of blockquant (docs/format.md; its sections cited by name), bit for bit.

This module is the executable form of the contract: the Rust core must produce exactly what these
functions produce. It is written to be read, not to be fast. Everything is vectorized over the
whole array; the only Python loop over blocks is the rare exact-summation fallback of ``absmean``.

The vocabulary it shares with the mse search (:mod:`blockquant._reference_search`) is in
:mod:`blockquant._reference_common`: the oracle's own facts of each value type and scale dtype
(written out there, never read from the core it checks), the minifloat and UE8M0 codecs (integer
operations on the float32 bit pattern, no float casts that could hide rounding), scale rounding
and block geometry. Reading order here:

1. Minifloat values: encoding and decoding E4M3 / E5M2 / E2M1 codes.
2. Scales: rounding a scale to its dtype (format.md "Storing a scale: rounding to its dtype"), encoding and decoding scale bytes.
3. Geometry: the storage shape and packing (format.md "Blocks and the scale grid", "Stores and packing").
4. Calibration: the amplitude alpha of each block and the raw scale (format.md "Calibration").
5. Quantizing, packing, dequantizing, bytes (format.md "Two-level schemes" to "The byte layout").

Conventions: a 0-d tensor is treated as shape ``(1,)`` for blocks, packing and the scale grid,
while ``RefQTensor.shape`` keeps ``()``. All arithmetic on values and scales is float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _reference_affine as _affine
from . import _reference_lookup as _lookup
from ._reference_common import (
    FLOAT_VALUE_FORMATS,
    Minifloat,
    _block_dims,
    _block_rows,
    _check_shape,
    _decode_minifloat,
    _effective_scales,
    _encode_minifloat,
    _f32_fields,
    _int_codes,
    _mx_codes,
    _rank1,
    _round_scale_saturating,
    _scheme_half_range,
    _scheme_mx_emax,
    _ue8m0_decode,
    scale_grid_shape,
    scale_max,
    scale_nbytes,
    value_bits,
    value_is_float,
    value_qmax,
    value_qmin,
)
from ._reference_scales import (
    CALIBRATIONS,
    ROUNDINGS,
    SCALE_ROUNDINGS,
    _as_f32,
    _check_mx,
    _check_option,
    decode_scales,
    encode_scales,
    round_scale,
)
from ._reference_search import mse_scales
from .errors import (
    LayoutError,
    MissingGlobalScaleError,
    NonFiniteError,
    QuantError,
    ScaleError,
    SchemeError,
    UnexpectedGlobalScaleError,
)
from .options import as_bytes, importance_weights, weights_refusal
from .presets import resolve
from .scheme import QuantMode, QuantScheme, QuantValue, ScaleDtype

__all__ = [
    "RefQTensor",
    "decode_float",
    "decode_scales",
    "dequantize",
    "encode_float",
    "encode_scales",
    "from_bytes",
    "quantize",
    "round_scale",
    "scale_grid_shape",
    "storage_dtype",
    "storage_shape",
    "to_bytes",
]




# =================================================================================================
# 1. Minifloat values
# =================================================================================================


def _float_format(value: QuantValue) -> Minifloat:
    if not isinstance(value, QuantValue):
        raise TypeError(f"value is a QuantValue, got {value!r}")
    if not value_is_float(value):
        raise SchemeError(f"{value} is not a float value (E4M3, E5M2 or E2M1)")
    return FLOAT_VALUE_FORMATS[value]


def encode_float(x_f32, value: QuantValue) -> np.ndarray:
    """Codes (uint8) of ``x_f32`` in the float value format: round to nearest, ties to even,
    saturating to +-max (infinities too); -0 stays -0. NaN has no code in E2M1 and is never
    quantized, so NaN raises NonFiniteError for every format."""
    fmt = _float_format(value)
    x = np.asarray(x_f32, dtype=np.float32)
    _check_not_nan(x)
    return _encode_minifloat(x, fmt).astype(np.uint8)


def decode_float(codes_uint8, value: QuantValue) -> np.ndarray:
    """float32 value of each code (only the low ``bits`` bits of each code are read)."""
    fmt = _float_format(value)
    return _decode_minifloat(np.asarray(codes_uint8), fmt)


def _check_not_nan(x: np.ndarray) -> None:
    bad = np.flatnonzero(np.isnan(x.ravel()))
    if bad.size:
        i = int(bad[0])
        raise NonFiniteError(f"non-finite value nan at flat index {i}")


# =================================================================================================
# 3. Geometry: blocks, scale grid, storage
# =================================================================================================


def _packing(scheme: QuantScheme, rank: int):
    """(axis, values per word, word dtype) of a packed store, or None for Native.

    burn's layout (format.md "Stores and packing" to "The byte layout"): ``PackedU32`` holds 32/bits values a word; ``PackedNative``
    packs only E2M1 (two a byte) and holds every other value one a byte, its code masked to
    its bits. Packing along an outer axis stores the tensor with that axis swapped with the
    last one (see :func:`_swap_packed_axis`)."""
    store = scheme.store
    if not store.is_packed:
        return None
    if store.dim >= rank:
        raise SchemeError(
            f"packing dim {store.dim} counts from the innermost axis and must be < the tensor's "
            f"rank {rank}, under {scheme!r}"
        )
    if store.kind == "packed_u32":
        per, word_dtype = 32 // value_bits(scheme.value), np.uint32
    else:
        per, word_dtype = (2 if scheme.value is QuantValue.E2M1 else 1), np.uint8
    return rank - 1 - store.dim, per, np.dtype(word_dtype)


def _swap_packed_axis(a: np.ndarray, ax: int) -> np.ndarray:
    """burn stores a tensor packed along axis ``ax`` with ``ax`` swapped with the last axis
    (swapped, not moved: the middle axes keep their places), and packs along the last."""
    return np.swapaxes(a, ax, -1) if a.ndim else a


def storage_dtype(scheme: QuantScheme) -> np.dtype:
    """int8 (Native int values), uint8 (Native float values or codebook indices, PackedNative),
    uint32 (PackedU32)."""
    if scheme.store.kind == "packed_u32":
        return np.dtype(np.uint32)
    if (scheme.store.kind == "packed_native" or value_is_float(scheme.value) or scheme.codebook
            or scheme.offset is not None):
        return np.dtype(np.uint8)
    return np.dtype(np.int8)


def storage_shape(shape, scheme: QuantScheme) -> tuple[int, ...]:
    """Shape of the value storage: the tensor's (0-d as (1,)); packed, with the packed axis
    swapped to the last place and shrunk to ceil(n / values per word)."""
    shape1 = _rank1(_check_shape(shape))
    packing = _packing(scheme, len(shape1))
    if packing is None:
        return shape1
    ax, per, _ = packing
    swapped = list(shape1)
    swapped[ax], swapped[-1] = swapped[-1], swapped[ax]
    return tuple(swapped[:-1]) + (-(-shape1[ax] // per),)


def _scales_per_element(grid: np.ndarray, shape1, scheme: QuantScheme) -> np.ndarray:
    """Each element's scale: the scale of the block it falls in (broadcast for per-tensor)."""
    if scheme.block is None:
        return np.broadcast_to(grid.reshape(()), shape1)
    if math.prod(shape1) == 0:  # no element, however long the other axes (their index arrays)
        return np.zeros(shape1, np.float32)
    block = _block_dims(shape1, scheme)
    index = np.ix_(*[np.arange(n) // b for n, b in zip(shape1, block)])
    return grid[index]


# =================================================================================================
# 4. Calibration (format.md "Calibration")
# =================================================================================================


def _ulp(v: np.ndarray) -> np.ndarray:
    """Spacing of float32 values at |v| > 0, as float64: 2**(E-150) normal, 2**-149 subnormal."""
    _, e_field, _ = _f32_fields(v)
    return np.ldexp(1.0, (np.maximum(e_field, 1) - 150).astype(np.int32))


def _exact_abs_sums(a: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per row of |x| (float32), the exact sum of the row correctly rounded to float64.

    numpy's float64 sum is exact when no partial sum can round: every partial sum is a multiple
    of u (the ulp of the row's smallest nonzero value) and at most count * max, so if that bound
    is <= 2**53 * u all partial sums are representable. Other rows use math.fsum (rare)."""
    sums = a.astype(np.float64).sum(axis=1)
    if a.shape[1] == 0:
        return sums
    amax = a.max(axis=1)
    smallest = np.where(a > 0, a, np.float32(np.inf)).min(axis=1)
    smallest = np.where(amax > 0, smallest, np.float32(1))  # all-zero rows: sum 0, exact
    exact = counts * amax.astype(np.float64) <= np.ldexp(_ulp(smallest), 53)
    for i in np.flatnonzero(~exact):
        sums[i] = math.fsum(a[i].tolist())
    return sums


def _amplitudes(rows: np.ndarray, counts: np.ndarray, calibration: str) -> np.ndarray:
    """alpha of each block (float32): max |x| (minmax) or f32(exact sum |x| / count) (absmean)."""
    a = np.abs(rows)
    if a.shape[1] == 0:  # an empty tensor, per-tensor: nothing to measure
        return np.zeros(rows.shape[0], dtype=np.float32)
    if calibration == "minmax":
        return a.max(axis=1)
    sums = _exact_abs_sums(a, counts)
    mean = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
    return mean.astype(np.float32)


def _raw_scales(x1: np.ndarray, scheme: QuantScheme, calibration: str) -> np.ndarray:
    """s_raw = alpha / ((qmax - qmin) / 2) per block, as float32 in the grid's shape.
    (One f32 division: equal to format.md's (a + a) / (qmax - qmin) and never overflowing.)"""
    rows, counts = _block_rows(x1, scheme)
    alpha = _amplitudes(rows, counts, calibration)
    s_raw = alpha / _scheme_half_range(scheme)
    return s_raw.reshape(scale_grid_shape(x1.shape, scheme))


# =================================================================================================
# 5. Quantizing, packing, dequantizing, bytes
# =================================================================================================


@dataclass(frozen=True, eq=False)
class RefQTensor:
    """A quantized tensor: the value storage (format.md "Stores and packing"), the stored scales as float32 in the grid's
    shape (two-level: the block scales b_i), the per-tensor scale g of a two-level scheme, the
    original shape and the scheme."""

    values: np.ndarray
    scales: np.ndarray
    global_scale: float | None
    shape: tuple[int, ...]
    scheme: QuantScheme
    #: An affine scheme's offsets in the grid's shape (zero points as float32 integers).
    offsets: np.ndarray | None = None

    def to_bytes(self) -> bytes:
        return to_bytes(self)

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        return dequantize(self, dtype)

    @property
    def nbytes(self) -> int:
        return _expected_nbytes(self.scheme, self.shape)


def _check_scheme(scheme) -> None:
    if not isinstance(scheme, QuantScheme):
        raise TypeError(f"scheme is a QuantScheme, got {scheme!r}")
    # A Lookup scheme always has its codebook: building one without raises SchemeError.
    assert (scheme.mode is QuantMode.Lookup) == (scheme.codebook is not None)


def _check_lookup_rounding(scheme: QuantScheme, rounding: str) -> None:
    """A codebook has its own tie rule: half-even asked of it is refused, not ignored."""
    if scheme.codebook is not None and rounding == "half_even":
        raise SchemeError(
            "rounding='half_even' does not apply to a Lookup scheme (a tie goes to the entry of "
            f"larger magnitude), got {scheme!r}"
        )


def _check_fit(shape: tuple[int, ...], scheme: QuantScheme) -> None:
    """Scheme/tensor mismatches: a block with more dims than the tensor, a packing dim >= rank."""
    scale_grid_shape(shape, scheme)
    storage_shape(shape, scheme)


def _input_as_f32(x) -> tuple[np.ndarray, np.ndarray]:
    """(the input as an array, the input as float32 rounded to nearest even); TypeError for
    anything but float16, bfloat16, float32 or float64 (ints, bools, complex, objects...)."""
    try:
        a = np.asarray(x)
    except ValueError as e:  # a ragged nested list: not an array at all
        raise TypeError(f"quantize takes an array of floats: {e}") from None
    if a.dtype.name != "bfloat16" and (a.dtype.kind != "f" or a.dtype.itemsize not in (2, 4, 8)):
        raise TypeError(
            f"quantize takes float16, bfloat16, float32 or float64, got dtype {a.dtype}"
        )
    if a.size == 0:  # an empty half-precision shape whose float32 form numpy cannot hold
        _check_shape(a.shape)
    if a.dtype.name == "bfloat16":
        return a, a.astype(np.float32)
    with np.errstate(over="ignore"):  # float64 beyond f32 range: inf, reported below
        return a, a.astype(np.float32)


def _check_finite(original: np.ndarray, x32: np.ndarray) -> None:
    bad = np.flatnonzero(~np.isfinite(x32.ravel()))
    if bad.size == 0:
        return
    i = int(bad[0])
    given = float(original.ravel()[i])
    if math.isfinite(given):  # a float64 too large for float32
        raise NonFiniteError(
            f"non-finite value {float(x32.ravel()[i])!r} at flat index {i} "
            f"({given!r} overflows float32)"
        )
    raise NonFiniteError(f"non-finite value {given!r} at flat index {i}")


def _global_from_arg(global_scale) -> np.float32:
    """An explicit per-tensor scale as float32: a finite real >= 0, else TypeError/ScaleError."""
    a = np.asarray(global_scale)
    if a.ndim != 0:
        raise TypeError(f"global_scale is one real number, got shape {a.shape}")
    g = _as_f32(a, "global_scale")
    if not np.isfinite(g) or g < 0:
        raise ScaleError(f"global_scale must be finite and >= 0, got {global_scale!r}")
    return np.float32(g)  # kept as given, -0 included: it is stored unrounded


def _explicit_scales(scales, shape1, scheme: QuantScheme, mode: str) -> np.ndarray:
    """The caller's scales checked for shape and values, rounded to their dtype (float32 grid)."""
    s = _as_f32(scales, "scales")
    grid = scale_grid_shape(shape1, scheme)
    if scheme.block is None:
        if s.size != 1:  # any shape holding one value: 2.0, [2.0], [[2.0]]
            raise ScaleError(f"a per-tensor scheme takes one scale, got scales of shape {s.shape}")
        s = s.reshape(1)
    elif s.shape != grid:
        raise ScaleError(
            f"expected scales of the grid's shape {grid} ({math.prod(grid)} scales), "
            f"got shape {s.shape}"
        )
    return round_scale(s, scheme.scale_dtype, mode)


def _compute_scales(x1, scheme, calibration, scale_rounding, given_g=None, rounding="half_away",
                    w1=None):
    """Stored scales and g from the data (format.md "Calibration" to "Two-level schemes"). A two-level scheme may be given g alone:
    then only the block scales come from the data."""
    if calibration == "mse":  # searched (format.md "Searched scales: `mse`"): defined in its own module
        return mse_scales(x1, scheme, rounding, scale_rounding, given_g, w1)
    if scale_rounding == "mx":  # the OCP MX scale, from alpha itself (UE8M0: one level)
        rows, counts = _block_rows(x1, scheme)
        alpha = _amplitudes(rows, counts, calibration)
        codes = _mx_codes(alpha, _scheme_mx_emax(scheme)).reshape(scale_grid_shape(x1.shape, scheme))
        return _ue8m0_decode(codes).reshape(codes.shape), None
    s_raw = _raw_scales(x1, scheme, calibration)
    if not scheme.is_two_level:
        return round_scale(s_raw, scheme.scale_dtype, scale_rounding), None
    if given_g is not None:
        g = np.float32(given_g)
    else:
        # g maps the largest raw scale onto the block dtype's max; all blocks zero: g = 1.
        top = s_raw.max() if s_raw.size else np.float32(0)
        g = np.float32(top) / np.float32(scale_max(scheme.block.dtype))
        if top == 0:
            g = np.float32(1)
    if g == 0:
        # Given as 0, or underflowed (a tensor of f32 subnormals): e = b * g is 0 whatever b is;
        # b = 0 says so and avoids dividing by zero.
        return np.zeros_like(s_raw), float(g)
    with np.errstate(over="ignore"):  # s_raw / tiny g may overflow: inf saturates at the max
        ratio = s_raw / g
    return _round_scale_saturating(ratio, scheme.block.dtype, scale_rounding), float(g)


def _pack(fields: np.ndarray, ax: int, per: int, bits: int, word_dtype) -> np.ndarray:
    """Pack unsigned ``bits``-bit fields along axis ``ax``, ``per`` to a word, the first value in
    the least significant bits; each line is zero-padded on its own to whole words."""
    f = np.moveaxis(fields.astype(np.uint64), ax, -1)
    n = f.shape[-1]
    words = -(-n // per)
    f = np.pad(f, [(0, 0)] * (f.ndim - 1) + [(0, words * per - n)])
    f = f.reshape(f.shape[:-1] + (words, per))
    shifts = np.arange(per, dtype=np.uint64) * np.uint64(bits)
    packed = np.bitwise_or.reduce(f << shifts, axis=-1)
    return np.ascontiguousarray(np.moveaxis(packed.astype(word_dtype), -1, ax))


def _unpack(words: np.ndarray, ax: int, per: int, bits: int, n: int) -> np.ndarray:
    """The inverse of _pack: unsigned fields (int64), ``n`` long along ``ax``."""
    w = np.moveaxis(words.astype(np.uint64), ax, -1)
    shifts = np.arange(per, dtype=np.uint64) * np.uint64(bits)
    fields = (w[..., None] >> shifts) & np.uint64((1 << bits) - 1)
    fields = fields.reshape(w.shape[:-1] + (w.shape[-1] * per,))[..., :n]
    return np.moveaxis(fields.astype(np.int64), -1, ax)


def _store(codes: np.ndarray, scheme: QuantScheme) -> np.ndarray:
    """Storage array (format.md "Stores and packing") of the codes (int8 for int values, uint8 for float values)."""
    packing = _packing(scheme, codes.ndim)
    if packing is None:
        return np.ascontiguousarray(codes)
    ax, per, word_dtype = packing
    bits = value_bits(scheme.value)
    fields = codes.astype(np.int64) & ((1 << bits) - 1)  # the code truncated to its bits
    return _pack(_swap_packed_axis(fields, ax), -1 % fields.ndim, per, bits, word_dtype)


def _decoded_values(values: np.ndarray, scheme: QuantScheme, shape1) -> np.ndarray:
    """float32 value of each stored code (before scaling), in the shape ``shape1``."""
    bits = value_bits(scheme.value)
    packing = _packing(scheme, len(shape1))
    if packing is None:
        fields = values.astype(np.int64)
        if scheme.codebook is not None:
            return _lookup.decode(fields, scheme.codebook)
        if not value_is_float(scheme.value):
            # Native ints are read as the int8 they are, even outside [qmin, qmax] (bytes may
            # hold anything: format.md "The byte layout"'s example stores -128 under Q8S).
            return fields.astype(np.float32)
    else:
        ax, per, _ = packing
        fields = _swap_packed_axis(_unpack(values, -1 % values.ndim, per, bits, shape1[ax]), ax)
    mask = (1 << bits) - 1
    if scheme.offset is not None:  # unsigned codes
        return fields.astype(np.float32)
    if scheme.codebook is not None:  # every index is an entry
        return _lookup.decode(fields, scheme.codebook)
    if value_is_float(scheme.value):  # only the low ``bits`` bits are the code (E2M1: low nibble)
        return _decode_minifloat(fields & mask, FLOAT_VALUE_FORMATS[scheme.value])
    sign = 1 << (bits - 1)
    return ((fields ^ sign) - sign).astype(np.float32)  # sign-extend a packed field from ``bits``


def quantize(
    x,
    scheme: QuantScheme | str,
    *,
    calibration: str | None = None,
    rounding: str | None = None,
    scale_rounding: str | None = None,
    scales=None,
    global_scale=None,
    weights=None,
) -> RefQTensor:
    """Quantize ``x`` under ``scheme`` (format.md "Calibration" to "Stores and packing"): a scheme, a preset name or a scheme text;
    an option left as None is the scheme's own (a preset's, format.md "Rules for edge cases"), else the default.
    ``weights`` (calibration "mse" only): per-element importance, broadcast to ``x``."""
    # Validation order: argument types, mode, scheme/tensor fit, scales, non-finite input (the
    # core checks the caller's scales before it reads the data).
    scheme = resolve(scheme)
    calibration, rounding, scale_rounding = scheme.options.resolve(
        calibration, rounding, scale_rounding  # type: ignore[arg-type]
    )
    _check_option("calibration", calibration, CALIBRATIONS)
    _check_option("rounding", rounding, ROUNDINGS)
    _check_option("scale_rounding", scale_rounding, SCALE_ROUNDINGS)
    original, x32 = _input_as_f32(x)
    _check_scheme(scheme)
    _check_mx(scheme.scale_dtype, scale_rounding)
    _check_lookup_rounding(scheme, rounding)
    shape = tuple(original.shape)
    shape1 = _rank1(shape)
    _check_fit(shape, scheme)
    x1 = x32.reshape(shape1)

    if global_scale is not None and not scheme.is_two_level:
        raise UnexpectedGlobalScaleError(
            f"a per-tensor scale should come with a two-level scheme, got {scheme!r}"
        )
    if scales is not None and scheme.is_two_level and global_scale is None:
        raise MissingGlobalScaleError(f"{scheme!r} requires a per-tensor scale")
    given_g = None if global_scale is None else float(_global_from_arg(global_scale))
    w1 = None
    if weights is not None:
        w1 = importance_weights(weights, shape).reshape(shape1)
        refusal = weights_refusal(calibration, scales is not None)
        if refusal is not None:
            raise QuantError(refusal)
    if scheme.offset is not None:
        return _quantize_affine(original, x32, x1, shape, scheme, calibration, rounding,
                                scale_rounding, scales, w1)
    if scales is not None:
        stored, g = _explicit_scales(scales, shape1, scheme, scale_rounding), given_g
    _check_finite(original, x32)
    if scales is None:
        stored, g = _compute_scales(
            x1, scheme, calibration, scale_rounding, given_g, rounding, w1
        )

    # Values against the stored (effective) scale: x / e as an f32 division; e = 0 gives code 0
    # (a codebook: x_s = +0, the field of the entry nearest to 0).
    e = _scales_per_element(_effective_scales(stored, g), shape1, scheme)
    x_s = np.zeros(shape1, dtype=np.float32)
    with np.errstate(over="ignore"):  # x / tiny e can overflow to inf: it clamps or saturates
        np.divide(x1, e, out=x_s, where=e != 0)
    if scheme.codebook is not None:
        codes = _lookup.nearest_index(x_s, scheme.codebook)
    elif value_is_float(scheme.value):
        codes = _encode_minifloat(x_s, FLOAT_VALUE_FORMATS[scheme.value]).astype(np.uint8)
    else:
        codes = _int_codes(x_s, scheme.value, rounding)
    return RefQTensor(_store(codes, scheme), stored, g, shape, scheme)


def _quantize_affine(original, x32, x1, shape, scheme, calibration, rounding, scale_rounding,
                     scales, w1) -> RefQTensor:
    """quantize's affine case (format.md "Affine values (offsets)")."""
    if calibration not in ("minmax", "mse"):
        raise SchemeError(f"calibration {calibration!r} does not apply to an affine scheme")
    if scales is not None:
        raise ScaleError(f"explicit scales= are not taken by an affine scheme, got {scheme!r}")
    if w1 is not None:
        raise QuantError(f"weights= are not taken by an affine scheme's search, got {scheme!r}")
    _check_finite(original, x32)
    grid = scale_grid_shape(shape, scheme)
    s, o = _affine.block_params(x1, scheme, calibration, rounding, scale_rounding)
    s, o = s.reshape(grid), o.reshape(grid)
    se = _scales_per_element(s, x1.shape, scheme)
    oe = _scales_per_element(o, x1.shape, scheme)
    q = _affine.codes(x1, se, oe, scheme, rounding).astype(np.uint8)
    return RefQTensor(_store(q, scheme), s, None, shape, scheme, o)


def affine_codes(x, scheme, bits: int, *, calibration=None, rounding=None, scale_rounding=None):
    """The codes of ``bits`` bits (1 to 8) a U8 affine scheme gives ``x`` with every code cut
    to [0, 2^bits − 1] (range, search and rounding those of a ``bits``-bit value):
    ``(codes uint8 in x's shape, scales, offsets)``, the last two in the scale grid's shape.
    The arithmetic of MLX's 3-, 5- and 6-bit affine modes, which no blockquant value has."""
    scheme = resolve(scheme)
    if scheme.value is not QuantValue.U8 or scheme.offset is None or not 1 <= bits <= 8:
        raise SchemeError(f"narrow codes take a U8 affine scheme and 1 to 8 bits, got "
                          f"{scheme!r} and {bits}")
    calibration, rounding, scale_rounding = scheme.options.resolve(
        calibration, rounding, scale_rounding  # type: ignore[arg-type]
    )
    original, x32 = _input_as_f32(x)
    shape = tuple(original.shape)
    _check_fit(shape, scheme)
    x1 = x32.reshape(_rank1(shape))
    _check_finite(original, x32)
    grid = scale_grid_shape(shape, scheme)
    s, o = _affine.block_params(x1, scheme, calibration, rounding, scale_rounding, bits)
    s, o = s.reshape(grid), o.reshape(grid)
    se = _scales_per_element(s, x1.shape, scheme)
    oe = _scales_per_element(o, x1.shape, scheme)
    q = _affine.codes(x1, se, oe, scheme, rounding, bits).astype(np.uint8)
    return q.reshape(shape), s, o


def dequantize(qt: RefQTensor, dtype=np.float32) -> np.ndarray:
    """x_hat = f32(decode(q)) * e, one f32 multiply; then cast to ``dtype`` if asked (format.md "Dequantizing")."""
    if not isinstance(qt, RefQTensor):
        raise TypeError(f"dequantize takes a RefQTensor, got {type(qt).__name__}")
    out = np.dtype(dtype)
    if out.name != "bfloat16" and (out.kind != "f" or out.itemsize not in (2, 4, 8)):
        raise TypeError(f"dequantize returns float16, bfloat16, float32 or float64, got {out}")
    scheme = qt.scheme
    shape1 = _rank1(qt.shape)
    q = _decoded_values(qt.values, scheme, shape1)
    e = _scales_per_element(_effective_scales(qt.scales, qt.global_scale), shape1, scheme)
    if qt.offsets is not None:
        off = _scales_per_element(qt.offsets, shape1, scheme)
        x_hat = _affine.values(q, e, off, scheme).reshape(qt.shape)
        return x_hat if out == np.float32 else x_hat.astype(out)
    with np.errstate(over="ignore", invalid="ignore"):  # only reachable from odd bytes
        x_hat = (q * e).astype(np.float32).reshape(qt.shape)
    return x_hat if out == np.float32 else x_hat.astype(out)


def to_bytes(qt: RefQTensor) -> bytes:
    """Value storage (little-endian), then the scales in their dtype, then g as f32 (format.md "The byte layout")."""
    scheme = qt.scheme
    values = qt.values.astype(storage_dtype(scheme).newbyteorder("<")).tobytes()
    scales = encode_scales(_scales_in_byte_order(qt.scales, scheme).ravel(), scheme.scale_dtype)
    tail = np.float32(qt.global_scale).astype("<f4").tobytes() if scheme.is_two_level else b""
    if qt.offsets is not None:
        tail += _offset_bytes(_scales_in_byte_order(qt.offsets, scheme).ravel(), scheme)
    return values + scales + tail


def _offset_bytes(offs: np.ndarray, scheme: QuantScheme) -> bytes:
    """Zero points one byte each; biases little-endian in their dtype."""
    assert scheme.offset is not None
    if scheme.offset.kind == "zero":
        return offs.astype(np.uint8).tobytes()
    dtype = scheme.offset.dtype
    if dtype is ScaleDtype.F32:
        return offs.astype("<f4").tobytes()
    if dtype is ScaleDtype.F16:
        return offs.astype("<f2").tobytes()
    return (offs.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def _offset_nbytes(scheme: QuantScheme) -> int:
    if scheme.offset is None:
        return 0
    return 1 if scheme.offset.kind == "zero" else scale_nbytes(scheme.offset.dtype)


def _swaps_scales(scheme: QuantScheme, rank: int) -> int | None:
    """The axis whose block scales burn stores swapped with the last (the values' order), for
    a block scheme packed along an outer axis; else None."""
    if scheme.block is None:
        return None
    packing = _packing(scheme, rank)
    if packing is None or packing[0] == rank - 1:
        return None
    return packing[0]


def _scales_in_byte_order(grid: np.ndarray, scheme: QuantScheme) -> np.ndarray:
    ax = _swaps_scales(scheme, grid.ndim)
    return grid if ax is None else np.swapaxes(grid, ax, -1)


def _expected_nbytes(scheme: QuantScheme, shape) -> int:
    storage = math.prod(storage_shape(shape, scheme)) * storage_dtype(scheme).itemsize
    n_scales = math.prod(scale_grid_shape(shape, scheme))
    return (storage + n_scales * scale_nbytes(scheme.scale_dtype) + (4 if scheme.is_two_level else 0)
            + n_scales * _offset_nbytes(scheme))


def from_bytes(data, scheme: QuantScheme | str, shape) -> RefQTensor:
    """Rebuild a quantized tensor from to_bytes' layout. The length must match exactly; scales
    (and g) are kept exactly as decoded, -0 included, but a negative, NaN or infinite one is a
    LayoutError; so is a stored code quantize can never produce, or non-zero padding (format.md "The byte layout":
    from_bytes accepts exactly what from_parts accepts). Scales are checked first (format.md "Rules for edge cases")."""
    data = as_bytes(data)
    scheme = resolve(scheme)
    _check_scheme(scheme)
    shape = _check_shape(shape)
    _check_fit(shape, scheme)
    expected = _expected_nbytes(scheme, shape)
    if len(data) != expected:
        raise LayoutError(
            f"expected {expected} bytes for {scheme!r} and shape {shape}, got {len(data)}"
        )
    vshape = storage_shape(shape, scheme)
    vdtype = storage_dtype(scheme)
    n_values = math.prod(vshape) * vdtype.itemsize
    grid = scale_grid_shape(shape, scheme)
    n_scales = math.prod(grid)
    scale_end = n_values + n_scales * scale_nbytes(scheme.scale_dtype)
    values = np.frombuffer(data[:n_values], dtype=vdtype.newbyteorder("<"))
    values = values.astype(vdtype).reshape(vshape)
    scales = decode_scales(data[n_values:scale_end], scheme.scale_dtype, n_scales)
    ax = _swaps_scales(scheme, len(grid))
    if ax is None:
        scales = scales.reshape(grid)
    else:  # stored in the values' swapped order
        swapped = list(grid)
        swapped[ax], swapped[-1] = swapped[-1], swapped[ax]
        scales = np.ascontiguousarray(np.swapaxes(scales.reshape(swapped), ax, -1))
    _check_decoded_scales(scales, f"a {scheme.scale_dtype} scale")
    g = None
    if scheme.is_two_level:
        g32 = np.frombuffer(data[scale_end:], dtype="<f4").astype(np.float32)
        _check_decoded_scales(g32, "the per-tensor scale")
        g = float(g32[0])
    _check_codes(values, scheme, _rank1(shape))
    offsets = None
    if scheme.offset is not None:
        offsets = _read_offsets(data[scale_end:], scheme, grid)
    return RefQTensor(values, scales, g, shape, scheme, offsets)


def _read_offsets(data: bytes, scheme: QuantScheme, grid) -> np.ndarray:
    """The offsets after the scales, in the grid's order; a zero point above qmax or a bias
    that is not finite is a LayoutError."""
    assert scheme.offset is not None
    if scheme.offset.kind == "zero":
        offs = np.frombuffer(data, np.uint8).astype(np.float32)
        if (offs > value_qmax(scheme.value)).any():
            raise LayoutError(f"corrupt offsets: a zero point above {value_qmax(scheme.value)}")
    else:
        offs = decode_scales(data, scheme.offset.dtype, len(data) // _offset_nbytes(scheme))
        if not np.isfinite(offs).all():
            raise LayoutError("corrupt offsets: a bias that is not finite")
    ax = _swaps_scales(scheme, len(grid))
    if ax is None:
        return offs.reshape(grid)
    swapped = list(grid)
    swapped[ax], swapped[-1] = swapped[-1], swapped[ax]
    return np.ascontiguousarray(np.swapaxes(offs.reshape(swapped), ax, -1))


def _code_is_valid(fields: np.ndarray, value: QuantValue) -> np.ndarray:
    """Whether each unsigned ``bits``-bit field is a code quantize can produce."""
    bits = value_bits(value)
    if value.is_unsigned:
        return fields <= value_qmax(value)
    if value_is_float(value):
        # A finite, in-range code has a magnitude at most the largest finite one's.
        fmt = FLOAT_VALUE_FORMATS[value]
        return (fields >> bits == 0) & ((fields & (fmt.sign_bit - 1)) <= fmt.max_mag)
    sign = 1 << (bits - 1)
    v = (fields ^ sign) - sign
    return (v >= value_qmin(value)) & (v <= value_qmax(value))


def _check_codes(values: np.ndarray, scheme: QuantScheme, shape1) -> None:
    """Every stored field holds a valid code, and padding fields are zero (format.md "The byte layout")."""
    packing = _packing(scheme, len(shape1))
    if packing is None:
        if scheme.codebook is not None:  # an index, its bits above the width zero
            ok = values.astype(np.int64) >> value_bits(scheme.value) == 0
        elif value_is_float(scheme.value):
            ok = _code_is_valid(values.astype(np.int64), scheme.value)
        else:  # Native ints are the sign-extended int8 value itself
            v = values.astype(np.int64)
            ok = (v >= value_qmin(scheme.value)) & (v <= value_qmax(scheme.value))
        bad = np.flatnonzero(~ok.ravel())
        if bad.size:
            i = int(bad[0])
            raise LayoutError(
                f"stored value {i} is {int(values.ravel()[i])}, not a code of {scheme.value}"
            )
        return
    ax, per, _ = packing
    n = shape1[ax]
    last = values.ndim - 1
    along = _unpack(values, last, per, value_bits(scheme.value), values.shape[last] * per)
    used, padding = along[..., :n], along[..., n:]
    bad_code = ~_code_is_valid(used, scheme.value)
    if scheme.codebook is None and bad_code.any():
        raise LayoutError(f"a stored field is not a code of {scheme.value}")
    word_bits = values.dtype.itemsize * 8
    above = per * value_bits(scheme.value)  # bits above the last field (sub-byte ints one a byte)
    if (padding != 0).any() or (above < word_bits and (values.astype(np.uint64) >> above).any()):
        raise LayoutError("a stored word has non-zero padding bits")


def _check_decoded_scales(s: np.ndarray, what: str) -> None:
    """Stored scales are finite and >= 0 (-0 passes: it compares equal to 0)."""
    flat = s.ravel()
    bad = np.flatnonzero(~np.isfinite(flat) | (flat < 0))
    if bad.size:
        i = int(bad[0])
        raise LayoutError(
            f"corrupt scales: {what} must be finite and >= 0, got {float(flat[i])!r} at index {i}"
        )
