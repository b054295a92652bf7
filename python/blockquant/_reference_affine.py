"""Affine values in the reference (format.md "Affine values (offsets)"): each block's scale and
offset (a zero point or a bias) from its range, or searched (``mse``), the codes, and the values
back. Plain numpy on float32, in the core's order of operations, so that every bit agrees."""

from __future__ import annotations

import numpy as np

from . import _reference_common as common
from .scheme import QuantScheme, ScaleDtype

#: The shrink factors of each end of the range the ``mse`` search tries: 1, 15/16, ..., 8/16.
SHRINK = [np.float32(k / 16) for k in range(16, 7, -1)]

_BF16_MAX_BITS = 0x7F7F0000


def round_bias(v: np.ndarray, dtype: ScaleDtype) -> np.ndarray:
    """``v`` to nearest (ties to even) in the bias dtype, saturating at its largest finite
    value; -0 becomes +0."""
    v = np.asarray(v, dtype=np.float32)
    if dtype is ScaleDtype.F16:
        with np.errstate(over="ignore"):
            r = v.astype(np.float16).astype(np.float32)
        r = np.where(np.isinf(r), np.copysign(np.float32(65504.0), v), r)
    elif dtype is ScaleDtype.BF16:
        bits = v.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        r = bits.astype(np.uint32).view(np.float32)
        sat = np.float32(np.array([_BF16_MAX_BITS], np.uint32).view(np.float32)[0])
        r = np.where(np.isinf(r), np.copysign(sat, v), r)
    else:
        r = v
    return (r + np.float32(0)).astype(np.float32)


def bias_representable(v: np.ndarray, dtype: ScaleDtype) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype is ScaleDtype.F16:
            back = v.astype(np.float16).astype(np.float32)
        elif dtype is ScaleDtype.BF16:
            back = ((v.view(np.uint32) >> 16) << 16).view(np.float32)
        else:
            back = v
        return np.isfinite(v) & (back == v)


def _span(hi: np.ndarray, lo: np.ndarray, qmax: np.float32) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        d = hi - lo
        return np.where(np.isfinite(d), d / qmax, hi / qmax - lo / qmax).astype(np.float32)


def _qmax(scheme: QuantScheme, bits: int | None) -> np.float32:
    """The largest code: the value's, or that of ``bits``-bit codes (narrow codes of a U8
    scheme, as MLX's 3-, 5- and 6-bit modes take)."""
    return np.float32(common.value_qmax(scheme.value) if bits is None else (1 << bits) - 1)


def params(lo, hi, scheme: QuantScheme, scale_rounding: str, bits: int | None = None):
    """(scale, offset) of blocks spanning [lo, hi] (float32 arrays)."""
    qmax = _qmax(scheme, bits)
    dtype = scheme.scale_dtype
    lo, hi = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
    assert scheme.offset is not None
    if scheme.offset.kind == "zero":
        lo = np.where(lo < 0, lo, np.float32(0)).astype(np.float32)
        hi = np.where(hi > 0, hi, np.float32(0)).astype(np.float32)
        s = common._round_scale_saturating(_span(hi, lo, qmax), dtype, scale_rounding)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            z = np.clip(np.rint(-lo / s), 0, qmax).astype(np.float32) + np.float32(0)
        z = np.where(s == 0, np.float32(0), z).astype(np.float32)
        return s, z
    b = round_bias(lo, scheme.offset.dtype)
    raw = _span(hi, b, qmax)
    fallback = _span(hi, lo, qmax)
    fallback = np.where(fallback > 0, fallback, np.float32(0))
    raw = np.where(raw < 0, fallback, raw).astype(np.float32)
    return common._round_scale_saturating(raw, dtype, scale_rounding), b


def _round(v: np.ndarray, rounding: str) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        if rounding == "half_even":
            return np.rint(v)
        t = np.trunc(v)
        frac = v - t
        return (t + (frac >= 0.5) - (frac <= -0.5)).astype(np.float32)


def codes(x, s, off, scheme: QuantScheme, rounding: str, bits: int | None = None) -> np.ndarray:
    """Each value's code as float32 (s and off per element): zero point
    clamp(round(x / s) + z, 0, qmax), bias clamp(round((x - b) / s), 0, qmax); 0 where s = 0."""
    qmax = _qmax(scheme, bits)
    assert scheme.offset is not None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if scheme.offset.kind == "zero":
            v = _round((x / s).astype(np.float32), rounding) + off
        else:
            v = _round(((x - off) / s).astype(np.float32), rounding)
        v = np.clip(np.nan_to_num(v, nan=0.0, posinf=qmax, neginf=0.0), 0, qmax)
    return np.where(s == 0, np.float32(0), v).astype(np.float32)


def values(q, s, off, scheme: QuantScheme) -> np.ndarray:
    """x̂: zero point f32(q - z) * s, bias f32(q) * s + b (two roundings)."""
    assert scheme.offset is not None
    with np.errstate(over="ignore", invalid="ignore"):
        if scheme.offset.kind == "zero":
            return ((q - off).astype(np.float32) * s).astype(np.float32)
        return ((q * s).astype(np.float32) + off).astype(np.float32)


def block_params(x1: np.ndarray, scheme: QuantScheme, calibration: str, rounding: str,
                 scale_rounding: str, bits: int | None = None):
    """(scales, offsets) as flat float32 arrays over the grid (row-major)."""
    rows, _ = common._block_rows(x1, scheme)
    present, _ = common._block_rows(np.ones(x1.shape, dtype=np.int8), scheme)
    present = present != 0
    if rows.shape[1] == 0:
        lo = hi = np.zeros(rows.shape[0], np.float32)
    else:
        lo = np.where(present, rows, np.float32(np.inf)).min(axis=1).astype(np.float32)
        hi = np.where(present, rows, np.float32(-np.inf)).max(axis=1).astype(np.float32)
    best_s, best_o = params(lo, hi, scheme, scale_rounding, bits)
    if calibration != "mse" or rows.shape[1] == 0:
        return best_s, best_o

    # the k-th value of a block (row-major within it) goes to lane k mod 4
    lane = (np.cumsum(present, axis=1) - 1) % 4

    def error(s, o):
        q = codes(rows, s[:, None], o[:, None], scheme, rounding, bits)
        d = values(q, s[:, None], o[:, None], scheme).astype(np.float64) - rows.astype(np.float64)
        e = np.where(present, d * d, 0.0)
        sums = [np.add.accumulate(np.where(lane == k, e, 0.0), axis=1)[:, -1] for k in range(4)]
        return (sums[0] + sums[1]) + (sums[2] + sums[3])  # each lane in order

    shrink = np.array(SHRINK, dtype=np.float32)
    best_err = error(best_s, best_o)
    bi = np.zeros(len(lo), dtype=np.int64)
    bj = np.zeros(len(lo), dtype=np.int64)

    def try_one(i, j):  # i, j: per block (arrays) or one for all
        nonlocal best_s, best_o, best_err, bi, bj
        i = np.broadcast_to(i, lo.shape)
        j = np.broadcast_to(j, lo.shape)
        s, o = params((lo * shrink[i]).astype(np.float32), (hi * shrink[j]).astype(np.float32),
                      scheme, scale_rounding, bits)
        err = error(s, o)
        better = err < best_err
        best_s = np.where(better, s, best_s).astype(np.float32)
        best_o = np.where(better, o, best_o).astype(np.float32)
        best_err = np.where(better, err, best_err)
        bi, bj = np.where(better, i, bi), np.where(better, j, bj)

    for k in range(1, len(SHRINK)):  # the diagonal
        try_one(k, k)
    j0 = bj.copy()
    for i in range(len(SHRINK)):  # every a with the best b so far
        try_one(i, j0)
    i0 = bi.copy()
    for j in range(len(SHRINK)):  # every b with the best a so far
        try_one(i0, j)
    return best_s, best_o
