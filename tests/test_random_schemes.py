"""The core against blockquant.reference on schemes drawn at random: every value type, store,
block layout (1-D, 2-D, column, narrow, per tensor), scale dtype, one and two levels,
codebooks, calibration and rounding, with given scales or a given per-tensor scale, inputs of
every float dtype, on shapes whose rows do and do not hold whole groups of blocks (so both the
fast kernels and the general path run). Either both refuse a draw with the same error type, or
both give the same bits: values, scales, bytes and every dequantized dtype. A broad guard: the
cases known to be hard have tests of their own (test_lookup, test_matrix, the Rust tests)."""

from __future__ import annotations

import random

import ml_dtypes
import numpy as np
import pytest

import blockquant as bq
import blockquant.reference as ref

# Drawn schemes include per-tensor 2-bit ones under mse: bit-exact all the same, whatever the
# advice.
pytestmark = pytest.mark.filterwarnings("ignore:calibration 'mse' cannot help:RuntimeWarning")

VALUES = ["q8s", "q8f", "q4s", "q4f", "q2s", "q2f", "e4m3", "e5m2", "e2m1"]
STORES = ["native", "packed_u32_0", "packed_native0", "packed_u32_1", "packed_native1"]
BLOCKS = ["block16", "block32", "block64", "block128", "block48", "block8", "block4x4",
          "block2x32", "block16x16", "block128x1", "block4x1", "block2x3"]
DTYPES = ["f32", "f16", "bf16", "ue8m0", "ue4m3"]
BOOKS = ["nf4", "iq4nl", "bq4"]
SHAPES = [(8, 256), (16, 128), (3, 4096), (32, 96), (5, 77)]
INPUTS = [np.float32, np.float32, np.float16, np.float64, ml_dtypes.bfloat16]


def _data(rng: np.random.Generator, shape, kind: int) -> np.ndarray:
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    if kind == 1:
        flat[: flat.size // 3] = 0.0  # zero blocks: the zero rule
    elif kind == 2:
        flat *= np.float32(1e-41)  # subnormal
    elif kind == 3:
        flat[::7] = np.float32(3e38) * np.sign(flat[::7])  # near f32's largest
    elif kind == 4:
        flat[:] = np.round(flat * 4) / 4  # ties
    flat[:64] = 0.0
    return x


def _draw(r: random.Random):
    value = r.choice(VALUES)
    book = r.choice(BOOKS) if value in ("q4s", "q4f") and r.random() < 0.4 else None
    level = r.choice(BLOCKS + ["tensor"])
    dtype = r.choice(DTYPES)
    two = level != "tensor" and r.random() < 0.3
    text = f"{value}/{r.choice(STORES)}/{level}:{dtype}" + ("+tensor:f32" if two else "")
    text += f"/lookup:{book}" if book else ""
    kw = dict(calibration=r.choice(["minmax", "absmean", "mse"]),
              rounding=r.choice(["half_away", "half_even"]),
              scale_rounding=r.choice(["up", "nearest", "mx"]))
    return text, r.choice(SHAPES), kw


def _same(got, want) -> None:
    assert got.values.dtype == want.values.dtype
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.scales.view(np.uint32),
                                  np.asarray(want.scales, np.float32).view(np.uint32))
    assert got.global_scale == want.global_scale
    assert got.to_bytes() == want.to_bytes()
    w32 = np.asarray(want.dequantize(), np.float32)
    np.testing.assert_array_equal(got.dequantize().view(np.uint32), w32.view(np.uint32))
    for dt in [np.float16, ml_dtypes.bfloat16, np.float64]:
        out = np.empty(got.shape, dt)
        got.dequantize(dt, out=out)
        np.testing.assert_array_equal(out.view(np.uint8),
                                      np.ascontiguousarray(w32.astype(dt)).view(np.uint8))


def _outcome(quantize, *args, **kw):
    try:
        return quantize(*args, **kw), None
    except (TypeError, ValueError) as e:  # blockquant's errors are ValueErrors
        return None, type(e)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("seed", range(8))
def test_random_schemes_equal_reference(seed):
    r = random.Random(seed)
    rng = np.random.default_rng(seed)
    compared = 0
    for _ in range(60):
        text, shape, kw = _draw(r)
        x = _data(rng, shape, r.randrange(5)).astype(r.choice(INPUTS))
        # Half the draws take given scales (some off the dtype's grid, some zero) or, for a
        # two-level scheme, a given per-tensor scale.
        base, _ = _outcome(ref.quantize, x, text, **kw)
        if base is not None and r.random() < 0.5:
            if r.random() < 0.5:
                given = np.asarray(base.scales, np.float32).copy()
                given.reshape(-1)[::5] *= np.float32(1.37)
                given.reshape(-1)[1::11] = 0.0
                kw["scales"] = given
            if base.global_scale is not None:
                kw["global_scale"] = base.global_scale * r.choice([1.0, 0.3, 4.0, 0.0])
        want, want_err = _outcome(ref.quantize, x, text, **kw)
        got, got_err = _outcome(bq.quantize, x, text, **kw)
        ctx = f"{text} {shape} {x.dtype} {kw}"
        assert got_err == want_err, ctx
        if want is not None:
            try:
                _same(got, want)
            except AssertionError as e:
                raise AssertionError(ctx) from e
            compared += 1
    # Most draws are schemes the core takes (the rest: an MX rule on a non-UE8M0 dtype, a
    # two-level BF16 or UE8M0 level, a block the shape cannot take, ...).
    assert compared >= 20, compared
