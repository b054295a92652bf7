"""What needs the whole tensor before any chunk is quantized: a per-tensor scale, or a
two-level scheme's per-tensor scale g (format.md "Two-level schemes"). One pass of dask tasks
reduces each chunk to a few numbers; the core then computes the scale from them exactly as it
would from the whole array, on a one-element proxy holding the tensor's amplitude.

Why a proxy gives the same bits: f32 division by a constant is monotonic, so the largest raw
scale max_i fl(a_i / h) is fl(max_i a_i / h), and a one-element block's amplitude is that
element (minmax: max |x|; absmean: the mean of one value is itself). The per-tensor absmean
amplitude is the exact sum of |x| over the tensor, correctly rounded to f64, divided by the
count in f64, rounded to f32 (format.md "Calibration"): each chunk returns its exact sum as an
integer, and the integers add up exactly in any order.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..errors import NonFiniteError, QuantError
from ..qtensor import _quantize
from ..scheme import BlockScale, QuantScheme, QuantStore, QuantValue, ScaleDtype

#: Elements summed at once: float64 partial sums of 24-bit mantissas stay exact below 2^29
#: terms; a smaller piece bounds the temporary arrays' memory.
_PIECE = 1 << 22
#: Scheme of a cheap full pass that reports a non-finite value as the core words it.
_PROBE = QuantScheme(QuantValue.Q8S, QuantStore.Native, tensor=ScaleDtype.F32)


class Stats(NamedTuple):
    """One chunk, reduced: its first non-finite value (global flat index, the core's message),
    else its max |x|, the exact sum of |x| times 2^149, its element count, and the largest
    block amplitude of a two-level absmean scheme."""

    bad_index: Optional[int]
    message: str
    maxabs: float
    abs_sum: int
    count: int
    alpha_max: float


def global_index(local: int, block_shape: Sequence[int], origin: Sequence[int],
                 shape: Sequence[int]) -> int:
    """The whole tensor's row-major flat index of a chunk's flat index ``local``."""
    at = np.unravel_index(local, tuple(block_shape)) if len(block_shape) else ()
    return int(np.ravel_multi_index(tuple(int(i) + o for i, o in zip(at, origin)), tuple(shape))
               ) if len(shape) else 0


def in_whole_tensor(e: QuantError, block_shape: Sequence[int], origin: Sequence[int],
                    shape: Sequence[int]) -> QuantError:
    """A chunk's error renamed for the whole tensor: its "flat index N" counted from the
    tensor's start, as the numpy API would count it."""
    text = str(e)
    m = re.search(r"flat index (\d+)", text)
    if m is None:
        return e
    where = global_index(int(m.group(1)), block_shape, origin, shape)
    out = type(e)(text[:m.start(1)] + str(where) + text[m.end(1):])
    return out


def exact_abs_sum(x32: np.ndarray) -> int:
    """sum |x| over a finite float32 array, exactly, as an integer count of 2^-149 (the least
    float32 subnormal): per exponent, the mantissas add up in float64 without rounding."""
    total = 0
    flat = x32.reshape(-1)
    for at in range(0, flat.size, _PIECE):
        bits = flat[at: at + _PIECE].view(np.uint32) & np.uint32(0x7FFFFFFF)
        exp = bits >> np.uint32(23)
        mant = (bits & np.uint32(0x7FFFFF)) | np.where(exp > 0, np.uint32(1 << 23), np.uint32(0))
        sums = np.bincount(exp, weights=mant.astype(np.float64), minlength=256)
        for e in np.flatnonzero(sums):
            # value = mant * 2^(max(e, 1) - 150) = mant * 2^(max(e, 1) - 1) * 2^-149
            total += int(sums[e]) << (max(int(e), 1) - 1)
    return total


def chunk_stats(block: Any, origin: Tuple[int, ...], shape: Tuple[int, ...], need: str,
                alpha_block: Optional[Tuple[int, ...]] = None) -> Stats:
    """Reduce one chunk (``need``: "max", "sum" or "alpha")."""
    a = np.asarray(block)
    with np.errstate(over="ignore", invalid="ignore"):
        x32 = a.astype(np.float32)  # as the core converts: nearest even, overflow to inf
    finite = np.isfinite(x32)
    if not finite.all():
        try:
            _quantize(a, _PROBE)
        except NonFiniteError as e:
            renamed = in_whole_tensor(e, a.shape, origin, shape)
            local = int(np.flatnonzero(~finite.reshape(-1))[0])
            return Stats(global_index(local, a.shape, origin, shape), str(renamed), 0.0, 0, 0,
                         0.0)
        raise AssertionError("the core took a non-finite value")  # pragma: no cover
    maxabs = float(np.abs(x32).max()) if x32.size else 0.0
    total = exact_abs_sum(x32) if need == "sum" else 0
    alpha = 0.0
    if need == "alpha" and x32.size:
        assert alpha_block is not None
        # Q2S's half range is 1: its raw scale is the block's amplitude itself, and F32 scales
        # store it as it is.
        probe = QuantScheme(QuantValue.Q2S, QuantStore.Native,
                            block=BlockScale(alpha_block, ScaleDtype.F32))
        alpha = float(_quantize(a, probe, calibration="absmean", rounding="half_away",
                                scale_rounding="up").scales.max())
    return Stats(None, "", maxabs, total, int(x32.size), alpha)


def reduce_chunks(x: Any, need: str, alpha_block: Optional[Tuple[int, ...]] = None) -> Stats:
    """Every chunk of the dask array ``x`` reduced (one pass, on whatever scheduler dask uses
    now), and the reductions combined; a non-finite value raises the core's
    :class:`NonFiniteError`, naming the first in the tensor."""
    import dask

    from ._grid import origins

    starts = origins(x.chunks)
    blocks = x.to_delayed()
    tasks = []
    for index in np.ndindex(*x.numblocks):
        origin = tuple(starts[ax][i] for ax, i in enumerate(index))
        tasks.append(dask.delayed(chunk_stats, pure=True)(
            blocks[index], origin, tuple(x.shape), need, alpha_block))
    stats: Sequence[Stats] = dask.compute(*tasks)
    bad = [s for s in stats if s.bad_index is not None]
    if bad:
        raise NonFiniteError(min(bad, key=lambda s: s.bad_index).message)  # type: ignore[arg-type]
    return Stats(None, "", max(s.maxabs for s in stats), sum(s.abs_sum for s in stats),
                 sum(s.count for s in stats), max(s.alpha_max for s in stats))


def absmean_amplitude(stats: Stats) -> float:
    """The per-tensor absmean amplitude: the exact sum rounded to f64 (int / int is correctly
    rounded), divided by the count in f64, rounded to f32."""
    if stats.count == 0:
        return 0.0
    mean = (stats.abs_sum / (1 << 149)) / float(stats.count)
    return float(np.float32(mean))


def proxy(scheme: QuantScheme, alpha: float, rank: int, rounding: str, scale_rounding: str) -> Any:
    """The scheme on one element of amplitude ``alpha``, in a tensor of the same rank: its
    stored scale is the whole tensor's per-tensor scale, its g the whole tensor's g."""
    one = np.full((1,) * max(rank, 1), alpha, dtype=np.float32)
    return _quantize(one, scheme, calibration="minmax", rounding=rounding,
                     scale_rounding=scale_rounding)
