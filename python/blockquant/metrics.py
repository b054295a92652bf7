"""Quantization error, measured one way everywhere (``blockquant report``, ``blockquant demo``,
the tests): SQNR in dB and the largest absolute error.

The sums are float64 and taken a chunk at a time, so measuring a large tensor needs only a
chunk of temporaries, and they add up across tensors: the SQNR of a whole checkpoint is that of
its summed signal and noise, not an average of per-tensor decibels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ErrorStats", "bits_per_weight", "sqnr_db"]

CHUNK = 1 << 20  # elements per float64 temporary


@dataclass(frozen=True)
class ErrorStats:
    """How far a reconstruction ``y`` is from ``x``: sum x², sum (x - y)², max |x - y| and the
    number of values. ``a + b`` is the statistics of both together."""

    signal: float = 0.0
    noise: float = 0.0
    max_abs_err: float = 0.0
    numel: int = 0

    @classmethod
    def between(cls, x: np.ndarray, y: np.ndarray, chunk: int = CHUNK) -> ErrorStats:
        """The statistics of ``y`` as a reconstruction of ``x`` (same number of values; any
        float dtypes, bfloat16 too)."""
        xf, yf = np.asarray(x).reshape(-1), np.asarray(y).reshape(-1)
        if xf.size != yf.size:
            raise ValueError(f"cannot compare {xf.size} values with {yf.size}")
        signal = noise = err = 0.0
        for i in range(0, xf.size, chunk):
            a = xf[i: i + chunk].astype(np.float64)
            d = a - yf[i: i + chunk].astype(np.float64)
            signal += float(np.dot(a, a))
            noise += float(np.dot(d, d))
            err = max(err, float(np.max(np.abs(d))))
        return cls(signal, noise, err, int(xf.size))

    def __add__(self, other: ErrorStats) -> ErrorStats:
        if not isinstance(other, ErrorStats):
            return NotImplemented
        return ErrorStats(self.signal + other.signal, self.noise + other.noise,
                          max(self.max_abs_err, other.max_abs_err), self.numel + other.numel)

    @property
    def sqnr_db(self) -> float:
        """Signal to quantization-noise ratio, 10·log10(signal / noise): inf when exact (no
        noise), -inf when there is noise but no signal (an all-zero x)."""
        if self.noise == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)


def sqnr_db(x: np.ndarray, y: np.ndarray) -> float:
    """SQNR in dB of ``y`` as a reconstruction of ``x`` (inf when exact)."""
    return ErrorStats.between(x, y).sqnr_db


def bits_per_weight(nbytes: int, numel: int) -> float:
    """Stored bits per value: 8 × bytes (values, scales and any per-tensor scale) / values;
    inf for no values. What ``report`` shows next to the SQNR, so schemes compare at equal size."""
    return math.inf if numel == 0 else 8.0 * nbytes / numel
