"""dequantize(out=...): a caller's array, checked for dtype, shape, contiguity, writeability and
overlap, written with exactly the bits of a fresh dequantize."""

import ml_dtypes
import numpy as np
import pytest

import blockquant as bq

SCHEMES = ["int8", "int8_block32", "int4_block32", "nvfp4", "mxfp4", "mxfp8", "bitnet",
           "q4s/packed_u32_1/block8x4:f16"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_out_gets_the_same_bits_as_a_fresh_array(scheme, dtype):
    x = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    qt = bq.quantize(x, scheme)
    want = qt.dequantize(dtype)
    out = np.full(x.shape, 7, dtype)
    got = qt.dequantize(out=out)
    assert got is out and out.dtype == want.dtype
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))
    out[:] = 0  # reused: every element written again
    assert bq.dequantize(qt, dtype, out=out) is out
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (1,)])
def test_out_for_0d_and_empty_tensors(shape):
    x = np.ones(shape, np.float32) * 0.5
    qt = bq.quantize(x, "int8")
    out = np.full(shape, 9.0, np.float32)
    assert qt.dequantize(out=out) is out
    np.testing.assert_array_equal(out, qt.dequantize())


def test_bad_out_arrays_are_refused_and_left_alone():
    x = np.random.default_rng(4).standard_normal((8, 32)).astype(np.float32)
    qt = bq.quantize(x, "nvfp4")
    cases = [
        (np.zeros((8, 32), np.float64), {"dtype": np.float32}, TypeError),  # dtype mismatch
        (np.zeros((8, 32), np.int32), {}, TypeError),  # not a float output dtype
        (np.zeros((32, 8), np.float32), {}, ValueError),  # shape
        (np.zeros((8, 64), np.float32)[:, ::2], {}, ValueError),  # not contiguous
        (np.zeros((8, 32), ">f4"), {}, TypeError),  # byte order
        ([[0.0] * 32] * 8, {}, TypeError),  # not an array
    ]
    for out, kw, exc in cases:
        before = np.array(out, copy=True)
        with pytest.raises(exc):
            qt.dequantize(out=out, **kw)
        np.testing.assert_array_equal(np.asarray(out), before)
    ro = np.zeros((8, 32), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        qt.dequantize(out=ro)
    assert not ro.any()
