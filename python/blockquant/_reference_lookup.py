"""Lookup mode in pure numpy: the definition ``blockquant.reference`` uses for a scheme with a
codebook (a stored field k decodes to ``codebook[k] * scale``).

- s_raw = alpha / h, with h = max_k |c_k| (the role (qmax - qmin) / 2 plays for integers);
- a scaled value x_s goes to the entry nearest to it, compared exactly; a tie (x_s exactly
  halfway between two entries) goes to the entry of larger magnitude, and between -a and +a
  (x_s = +-0) to +a. With a zero scale x_s is +0.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Tuple

import numpy as np


def codebook_array(codebook: Tuple[float, ...]) -> np.ndarray:
    return np.array(codebook, dtype=np.float32)


def half_range(codebook: Tuple[float, ...]) -> np.float32:
    """h = max_k |c_k| (float32, exact)."""
    return np.float32(np.abs(codebook_array(codebook)).max())


def mx_emax(codebook: Tuple[float, ...]) -> int:
    """The MX rule's emax for a codebook: floor(log2 h), as for an integer value's qmax."""
    return math.floor(math.log2(float(half_range(codebook))))


def nearest_index(x_s: np.ndarray, codebook: Tuple[float, ...]) -> np.ndarray:
    """The field (uint8) of each float32 ``x_s``: the index of its nearest entry.

    Entries sorted ascending, x_s goes above the pair (lo, hi) when it is past their midpoint
    m = (lo + hi) / 2 (an exact rational here), or on it when the tie goes up (|hi| >= |lo|:
    the larger magnitude, or +a over -a). Counting the pairs passed gives the sorted rank."""
    c = codebook_array(codebook)
    order = np.argsort(c, kind="stable")
    s = c[order]
    x = np.asarray(x_s, dtype=np.float32).astype(np.float64)  # exact copies of the f32 values
    rank = np.zeros(x.shape, dtype=np.int64)
    for lo, hi in zip(s[:-1].tolist(), s[1:].tolist()):
        m = (Fraction(lo) + Fraction(hi)) / 2
        tie_up = abs(hi) >= abs(lo)
        # Compare each x with m exactly: below = the largest float64 <= m, and m itself when
        # it is a float64 (an f32 x is a float64, so x > m  <=>  x > below unless x == m).
        below = float(m)
        if Fraction(below) > m:
            below = math.nextafter(below, -math.inf)
        exact = Fraction(below) == m
        past = x > below
        if exact:
            past = (x > below) | ((x == below) & tie_up)
        rank += past
    return order[rank].astype(np.uint8)


def decode(fields: np.ndarray, codebook: Tuple[float, ...]) -> np.ndarray:
    """float32 entry of each field (fields are valid indices)."""
    return codebook_array(codebook)[np.asarray(fields, dtype=np.int64)]
