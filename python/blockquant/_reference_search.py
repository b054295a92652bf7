"""The pure-numpy definition of calibration ``mse`` (format.md "Searched scales: `mse`"), part of :mod:`blockquant.reference`.

Per block, the stored scale of least squared error among fixed candidates around minmax's:

- candidate k of a block of amplitude alpha = max |x| is the raw scale alpha / (half_range * c_k)
  (``DIVISORS``; c_0 = 1 is minmax itself), mapped to block units (two-level: / g) and rounded to
  the scale dtype with the call's ``scale_rounding`` (a Lookup scheme: half_range is the
  codebook's max |c_k|, and q(u) its entry nearest to u). UE8M0 instead takes the code minmax would
  store and its neighbours (code - 1, code + 1), dropping any outside 0..254;
- a candidate of effective scale e has error e² * S (float64), S = sum(w * (u - q(u))²),
  u = x * r with r = 1 / e the float32 reciprocal (a multiply, not quantize's division: the
  search's own definition, within an ulp of it), and q(u) the value u quantizes to; the terms
  and the sums within a chunk are float32. A scale whose reciprocal overflows (e = 0, which
  would zero the block, or e <= 2^-128) has error +inf;
- S runs over the block's elements in row-major in-block order (partial blocks: the elements
  that exist, no gaps), cut into chunks of ``CHUNK``; within a chunk, element i adds into lane
  i % 8 in order, lanes combine as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) in float32, and the chunk
  sums add in float64 in chunk order;
- the first candidate of least error wins.

``np.add.accumulate`` is a strictly sequential sum, which is what makes the lanes reproducible.
"""

from __future__ import annotations

import numpy as np

from . import _reference_common as common
from . import _reference_lookup as _lookup
from .scheme import QuantScheme, ScaleDtype

CHUNK = 1 << 16

#: Divisors c_k of each value width, in search order (minmax's own scale first).
DIVISORS = {
    8: [1.0, 62 / 64, 63 / 64, 65 / 64, 66 / 64],
    4: [1.0] + [k / 32 for k in range(27, 38) if k != 32],
    2: [1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0],
}


def _compact_rows(x1: np.ndarray, scheme: QuantScheme) -> np.ndarray:
    """One row per block (grid order), its elements in row-major in-block order with the ones
    a partial block lacks moved to the end (as zeros)."""
    rows, counts = common._block_rows(x1, scheme)
    if rows.shape[1] == 0 or np.all(counts == rows.shape[1]):
        return rows
    present, _ = common._block_rows(np.ones(x1.shape, dtype=np.int8), scheme)
    order = np.argsort(present == 0, axis=1, kind="stable")
    return np.take_along_axis(rows, order, axis=1)


def _candidates(alpha, scheme: QuantScheme, scale_rounding: str, g):
    """(stored candidates, usable) of shape (blocks, K), in search order."""
    value, dtype = scheme.value, scheme.scale_dtype
    half = common._scheme_half_range(scheme)  # a codebook's: max |c_k|
    if dtype is ScaleDtype.UE8M0:
        if scale_rounding == "mx":
            base = common._mx_codes(alpha, common._scheme_mx_emax(scheme))
        else:
            base = common._ue8m0_round(alpha / half, scale_rounding)
        codes = np.stack([base, base - 1, base + 1], axis=1)
        usable = (codes >= 0) & (codes <= 254)
        return common._ue8m0_decode(np.clip(codes, 0, 254)), usable
    cands = []
    for c in DIVISORS[common.value_bits(value)]:
        raw = (alpha / np.float32(half * np.float32(c))).astype(np.float32)
        if g is not None:
            if g == 0:
                raw = np.zeros_like(raw)
            else:
                with np.errstate(over="ignore"):
                    raw = (raw / np.float32(g)).astype(np.float32)
        cands.append(common._round_scale_saturating(raw, dtype, scale_rounding))
    stored = np.stack(cands, axis=1)
    return stored, np.ones(stored.shape, dtype=bool)


def _decoded(x_s: np.ndarray, scheme: QuantScheme, rounding: str) -> np.ndarray:
    """The value (float32) each scaled input quantizes to."""
    if scheme.codebook is not None:  # the nearest entry; `rounding` does not apply
        return _lookup.decode(_lookup.nearest_index(x_s, scheme.codebook), scheme.codebook)
    if common.value_is_float(scheme.value):
        fmt = common.FLOAT_VALUE_FORMATS[scheme.value]
        return common._decode_minifloat(common._encode_minifloat(x_s, fmt), fmt)
    return common._int_codes(x_s, scheme.value, rounding).astype(np.float32)


def _errors(rows, wrows, e, scheme, rounding, present=None) -> np.ndarray:
    """Each block's error (float64) under effective scales ``e`` (one per block): e² · S,
    S = sum(w * (u - q(u))²), u = x * (1 / e); +inf where 1 / e overflows. ``present`` (a mask
    like ``rows``) marks the elements a partial block has: the padding adds nothing (for a
    codebook without 0, a padded 0 would otherwise count)."""
    with np.errstate(divide="ignore", over="ignore"):
        r = (np.float32(1) / e).astype(np.float32)
    live = np.isfinite(r)
    col = r[:, None]
    u = np.zeros(rows.shape, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        np.multiply(rows, col, out=u, where=live[:, None])
        t = u - _decoded(u, scheme, rounding)
        term = t * t
        if wrows is not None:
            term = wrows * term
        if present is not None:
            term = np.where(present, term, np.float32(0))
    n, width = term.shape
    if width <= CHUNK:
        chunks, length = 1, -(-width // 8) * 8
    else:
        chunks, length = -(-width // CHUNK), CHUNK
    term = np.pad(term, [(0, 0), (0, chunks * length - width)])
    with np.errstate(over="ignore"):
        lanes = np.add.accumulate(term.reshape(n, chunks, length // 8, 8), axis=2)[:, :, -1, :]
        lane = [lanes[..., i] for i in range(8)]
        per_chunk = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + (
            (lane[4] + lane[5]) + (lane[6] + lane[7])
        )
    total = np.add.accumulate(per_chunk.astype(np.float64), axis=1)[:, -1]
    e64 = e.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(live, (e64 * e64) * total, np.inf)


def mse_scales(x1, scheme: QuantScheme, rounding: str, scale_rounding: str, given_g, w1):
    """Stored scales (grid shape) and g of calibration ``mse``; ``w1`` the weights in x1's
    shape, or None."""
    grid = common.scale_grid_shape(x1.shape, scheme)
    rows = _compact_rows(x1, scheme)
    wrows = None if w1 is None else _compact_rows(w1, scheme)
    _, counts = common._block_rows(x1, scheme)
    present = np.arange(rows.shape[1])[None, :] < np.asarray(counts).reshape(-1, 1)
    alpha = (
        np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(rows.shape[0], np.float32)
    ).astype(np.float32)
    g = None
    if scheme.is_two_level:
        if given_g is not None:
            g = np.float32(given_g)
        else:
            top = (alpha / common._scheme_half_range(scheme)).max() if alpha.size else np.float32(0)
            top_scale = np.float32(common.scale_max(scheme.block.dtype))
            g = np.float32(1) if top == 0 else np.float32(top) / top_scale
    stored, usable = _candidates(alpha, scheme, scale_rounding, g)
    eff = common._effective_scales(stored, None if g is None else float(g))
    if rows.shape[0] == 0 or rows.shape[1] == 0:  # nothing to measure: minmax's scale
        return stored[:, 0].reshape(grid), None if g is None else float(g)
    errs = np.stack(
        [_errors(rows, wrows, eff[:, k], scheme, rounding, present)
         for k in range(stored.shape[1])],
        axis=1,
    )
    errs = np.where(usable, errs, np.inf)
    best = np.argmin(errs, axis=1)  # the first of equal minima
    chosen = stored[np.arange(stored.shape[0]), best]
    return chosen.reshape(grid), None if g is None else float(g)
