"""blockquant.metrics, the one definition of SQNR and error statistics, pinned by values worked
out by hand."""

import math

import ml_dtypes
import numpy as np
import pytest

from blockquant.metrics import ErrorStats, sqnr_db


def test_sums_and_sqnr_by_hand():
    x = np.array([3.0, -4.0, 0.0, 1.0], np.float32)
    y = np.array([3.0, -3.0, 0.5, 1.0], np.float32)
    s = ErrorStats.between(x, y)
    # signal 9 + 16 + 0 + 1 = 26; noise 0 + 1 + 0.25 + 0 = 1.25
    assert (s.signal, s.noise, s.max_abs_err, s.numel) == (26.0, 1.25, 1.0, 4)
    assert s.sqnr_db == pytest.approx(10 * math.log10(26 / 1.25), rel=1e-15)
    assert sqnr_db(x, y) == s.sqnr_db
    assert sqnr_db(np.array([1.0, 1.0]), np.array([1.0, 0.0])) == pytest.approx(3.0103, abs=1e-4)


def test_exact_is_inf_and_noise_on_zero_is_minus_inf():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert sqnr_db(x, x.copy()) == math.inf
    assert sqnr_db(np.zeros(3), np.array([0.0, 1.0, 0.0])) == -math.inf
    assert sqnr_db(np.zeros(0), np.zeros(0)) == math.inf  # nothing to get wrong
    assert ErrorStats().sqnr_db == math.inf and ErrorStats.between(np.zeros(0), np.zeros(0)).numel == 0


def test_chunks_do_not_change_the_result(rng):
    x = rng.normal(0, 1, 10_001).astype(np.float32)
    y = x + rng.normal(0, 1e-3, x.size).astype(np.float32)
    whole = ErrorStats.between(x, y, chunk=1 << 20)
    pieces = ErrorStats.between(x, y, chunk=7)
    assert pieces.max_abs_err == whole.max_abs_err and pieces.numel == whole.numel
    assert pieces.signal == pytest.approx(whole.signal, rel=1e-12)
    assert pieces.noise == pytest.approx(whole.noise, rel=1e-12)


def test_stats_add_across_tensors_as_one():
    a = ErrorStats.between(np.array([2.0]), np.array([1.0]))  # signal 4, noise 1
    b = ErrorStats.between(np.array([1.0, 1.0]), np.array([1.0, 4.0]))  # signal 2, noise 9
    both = a + b
    assert (both.signal, both.noise, both.max_abs_err, both.numel) == (6.0, 10.0, 3.0, 3)
    assert both == ErrorStats.between(np.array([2.0, 1.0, 1.0]), np.array([1.0, 1.0, 4.0]))
    assert sum([a, b], ErrorStats()) == both
    # the total is not the mean of the per-tensor decibels
    assert both.sqnr_db == pytest.approx(10 * math.log10(6 / 10))
    assert both.sqnr_db != pytest.approx((a.sqnr_db + b.sqnr_db) / 2)


def test_any_float_dtype_and_shape():
    x = np.array([[1.5, -2.0]], ml_dtypes.bfloat16)
    y = np.array([1.0, -2.0], np.float16)  # compared value by value, in C order
    s = ErrorStats.between(x, y)
    assert (s.signal, s.noise, s.max_abs_err) == (6.25, 0.25, 0.5)
    with pytest.raises(ValueError, match="3 values with 2"):
        ErrorStats.between(np.zeros(3), np.zeros(2))
