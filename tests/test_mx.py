"""OCP MX scales (format.md "Storing a scale: rounding to its dtype", ``scale_rounding="mx"``): 2**(floor(log2 amax) - emax), clamped to
UE8M0's range, against an independent computation here (math.frexp per block), the presets
that use it, and ggml's MXFP4 (gguf-py), which follows the same rule."""

import math

import numpy as np
import pytest

import blockquant as bq
import blockquant.reference as ref

V, S, D = bq.QuantValue, bq.QuantStore, bq.ScaleDtype
EMAX = {V.E2M1: 2, V.E4M3: 8, V.E5M2: 15, V.Q8F: 6, V.Q8S: 6, V.Q4F: 2, V.Q4S: 2,
        V.Q2F: 0, V.Q2S: 0}


def ocp_scales(x: np.ndarray, block: int, emax: int) -> np.ndarray:
    """Per block along the last axis: 2**(floor(log2 amax) - emax), within [2**-127, 2**127]."""
    rows = x.reshape(-1, x.shape[-1])
    out = []
    for r in rows:
        for c in range(0, len(r), block):
            amax = float(np.max(np.abs(r[c:c + block])))
            if amax == 0.0:
                out.append(2.0**-127)
                continue
            _, e = math.frexp(amax)  # amax = m * 2**e, 0.5 <= m < 1: floor(log2 amax) = e - 1
            out.append(2.0 ** min(max(e - 1 - emax, -127), 127))
    return np.array(out, np.float64)


def sample(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(3.0)
    x[0, :32] = 0  # an all-zero block
    x[1, :32] *= np.float32(1e-39)  # subnormal amax
    x[2, :32] = np.float32(2.0) ** 20  # an exact power of two
    x[3, :32] = np.linspace(-1, 1, 32, dtype=np.float32) * np.float32(3e38)  # near f32's max
    return x


@pytest.mark.parametrize("value", [v for v in V if not v.is_unsigned], ids=str)
def test_mx_scales_are_the_ocp_rule(value):
    x = sample(np.random.default_rng(9), (6, 96))
    s = bq.QuantScheme(value, S.Native).per_block([32], D.UE8M0)
    qt = bq.quantize(x, s, scale_rounding="mx")
    np.testing.assert_array_equal(qt.scales.astype(np.float64).ravel(),
                                  ocp_scales(x, 32, EMAX[value]))
    r = ref.quantize(x, s, scale_rounding="mx")
    assert qt.to_bytes() == r.to_bytes()


def test_the_mx_presets_use_it_unless_told_otherwise():
    x = sample(np.random.default_rng(2), (6, 64))
    for preset, emax in ((bq.presets.mxfp4(), 2), (bq.presets.mxfp8(), 8)):
        assert preset.options.scale_rounding == "mx"
        np.testing.assert_array_equal(bq.quantize(x, preset).scales.astype(np.float64).ravel(),
                                      ocp_scales(x, 32, emax))
        up = bq.quantize(x, preset, scale_rounding="up")
        assert not np.array_equal(up.scales, bq.quantize(x, preset).scales)


def test_mx_is_for_ue8m0_scales_only():
    x = np.ones((2, 32), np.float32)
    for scheme in ("int8", "int8_block32", "nvfp4"):
        with pytest.raises(bq.SchemeError, match="UE8M0"):
            bq.quantize(x, scheme, scale_rounding="mx")
        with pytest.raises(bq.SchemeError, match="UE8M0"):
            ref.quantize(x, scheme, scale_rounding="mx")
    with pytest.raises(bq.SchemeError, match="UE8M0"):
        bq.round_scale([1.0], D.F16, "mx")


def test_a_given_scale_under_mx_rounds_down_to_a_power_of_two():
    given = np.array([3.0, 1.0, 0.7, 0.0, 1e-45, 3e38], np.float32)
    want = [2.0, 1.0, 0.5, 2.0**-127, 2.0**-127, 2.0**127]
    np.testing.assert_array_equal(bq.round_scale(given, D.UE8M0, "mx"), want)
    np.testing.assert_array_equal(ref.round_scale(given, D.UE8M0, "mx"), want)


def test_mxfp4_equals_ggml_except_at_ties_and_negative_zero():
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(17)
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = -0.0
    blocks = gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4)
    b = blocks.reshape(-1, 17)
    qt = bq.quantize(x, bq.presets.mxfp4())
    # Scales: ggml's byte is the UE8M0 code (its dequantizer halves it to pair with doubled
    # E2M1 values), blockquant's the UE8M0 value.
    codes = np.log2(qt.scales.astype(np.float64)).astype(np.int64).ravel() + 127
    assert np.array_equal(b[:, 0].astype(np.int64)[2:], codes[2:])  # blocks 0, 1: all zero
    # Codes: E2M1 nibbles, ggml's element i and i + 16 sharing a byte.
    ggml = np.concatenate([b[:, 1:] & 0xF, b[:, 1:] >> 4], axis=1).reshape(x.shape)
    lo, hi = qt.values & 0xF, qt.values >> 4
    ours = np.stack([lo, hi], axis=-1).reshape(x.shape)
    differ = ggml != ours
    # ggml rounds a tie toward the smaller magnitude and writes -0 as +0; blockquant rounds
    # ties to even and keeps -0: on random data the only differences are the -0s.
    scale = np.repeat(qt.scales, 32, axis=1)
    y = x / scale
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    mids = (grid[1:] + grid[:-1]) / 2
    ties = np.isin(np.abs(y), mids)
    negzero = (ours == 0x8)
    assert not ties.any()
    assert np.array_equal(differ, negzero)
    # ... which are exactly the negative inputs that round to zero (the -0.0 block among them)
    assert np.array_equal(negzero, np.signbit(x) & (np.abs(y) <= 0.25))
    assert negzero[1, :32].all()
    np.testing.assert_array_equal(
        gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.MXFP4), qt.dequantize())
