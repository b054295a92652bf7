"""FP8 / FP4 codes through the Rust core, against ml_dtypes; packing against ONNX's int4 layout."""

import numpy as np
import pytest

import blockquant as bq
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype

ml_dtypes = pytest.importorskip("ml_dtypes")

FORMATS = {
    QuantValue.E4M3: (ml_dtypes.float8_e4m3fn, 448.0, 256),
    QuantValue.E5M2: (ml_dtypes.float8_e5m2, 57344.0, 256),
    QuantValue.E2M1: (ml_dtypes.float4_e2m1fn, 6.0, 16),
}


def codes_via_rust(x, value):
    """Codes of x exactly: Native store, one per-tensor F32 scale of 1."""
    s = QuantScheme(value, QuantStore.Native).per_tensor(ScaleDtype.F32)
    return bq.quantize(x, s, scales=[1.0]).values


def codes_via_ml_dtypes(x, value):
    dt, mx, _ = FORMATS[value]
    # ml_dtypes overflows to NaN/inf; format.md saturates, which equals clipping first.
    return np.clip(x, -mx, mx).astype(dt).view(np.uint8) & (0xFF if value != QuantValue.E2M1 else 0x0F)


def all_finite_values(value):
    dt, _, n = FORMATS[value]
    v = np.arange(n, dtype=np.uint8).view(dt).astype(np.float32)
    return np.unique(v[np.isfinite(v)])


@pytest.mark.parametrize("value", list(FORMATS))
def test_midpoints_and_their_neighbours(value):
    v = all_finite_values(value).astype(np.float64)
    mids = ((v[1:] + v[:-1]) / 2).astype(np.float32)
    assert np.all(mids.astype(np.float64) == (v[1:] + v[:-1]) / 2)  # midpoints are exact in f32
    x = np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), v.astype(np.float32)])
    np.testing.assert_array_equal(codes_via_rust(x, value), codes_via_ml_dtypes(x, value))


@pytest.mark.parametrize("value", list(FORMATS))
def test_saturation_zeros_and_subnormals(value):
    _, mx, _ = FORMATS[value]
    f32 = np.float32
    x = np.array(
        [mx, -mx, mx * 1.0001, -mx * 1.5, 1e30, -3e38, np.finfo(f32).max, 0.0, -0.0,
         1e-45, -1e-45, 1e-39, 2.0**-10, 2.0**-9, 3 * 2.0**-10, 2.0**-17, 2.0**-16, 0.25, 0.75],
        f32,
    )
    got = codes_via_rust(x, value)
    np.testing.assert_array_equal(got, codes_via_ml_dtypes(x, value))
    sign = 0x80 if value != QuantValue.E2M1 else 0x8
    assert got[8] == sign  # -0 keeps its sign
    top = {QuantValue.E4M3: 0x7E, QuantValue.E5M2: 0x7B, QuantValue.E2M1: 0x7}[value]
    assert got[2] == top and got[4] == top and got[3] == top | sign  # never inf or NaN


@pytest.mark.parametrize("value", list(FORMATS))
def test_a_million_random_values(value):
    rng = np.random.default_rng(11)
    n = 1_000_000
    mag = np.float32(2.0) ** rng.uniform(-30, 20, n).astype(np.float32)
    x = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    np.testing.assert_array_equal(codes_via_rust(x, value), codes_via_ml_dtypes(x, value))


@pytest.mark.parametrize("value", list(FORMATS))
def test_decoder_matches_ml_dtypes_on_every_code(value):
    """Every finite code decodes as ml_dtypes decodes it; a NaN or infinity code is corrupt data
    that from_bytes refuses (format.md "The byte layout": quantize never produces one)."""
    dt, _, n = FORMATS[value]
    codes = np.arange(n, dtype=np.uint8)
    finite = np.isfinite(codes.view(dt).astype(np.float32))
    s = QuantScheme(value, QuantStore.Native).per_tensor(ScaleDtype.F32)
    good = codes[finite]
    data = good.tobytes() + np.float32(1.0).tobytes()
    got = bq.QTensor.from_bytes(data, s, (good.size,)).dequantize()
    want = good.view(dt).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    for code in codes[~finite]:
        with pytest.raises(bq.LayoutError, match="not a code"):
            bq.QTensor.from_bytes(bytes([code]) + np.float32(1.0).tobytes(), s, (1,))


@pytest.mark.parametrize("value", list(FORMATS))
def test_typed_views(value):
    dt, _, _ = FORMATS[value]
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    qt = bq.quantize(x, QuantScheme(value, QuantStore.Native).per_block([32], ScaleDtype.UE8M0))
    view = qt.values_view()
    assert view.dtype == dt
    np.testing.assert_array_equal(
        view.astype(np.float32) * np.repeat(qt.scales, 32, axis=1), qt.dequantize()
    )


@pytest.mark.parametrize("value", [QuantValue.Q4S, QuantValue.Q4F])
def test_int4_packs_as_onnx(value):
    """ONNX int4: two values per byte, the first in the low nibble (two's complement). burn's
    PackedNative keeps 4-bit ints one a byte (masked), so ONNX's stream is PackedU32(0)'s
    little-endian words when rows fill whole words."""
    rng = np.random.default_rng(4)
    q = rng.integers(int(value.qmin), int(value.qmax) + 1, (3, 16)).astype(np.float32)
    s = QuantScheme(value, QuantStore.packed_u32(0)).per_tensor(ScaleDtype.F32)
    packed = bq.quantize(q, s, scales=[1.0]).values.astype("<u4").view(np.uint8).reshape(3, 8)
    lo = q[:, 0::2].astype(np.int8).view(np.uint8) & 0x0F
    hi = q[:, 1::2].astype(np.int8).view(np.uint8) & 0x0F
    np.testing.assert_array_equal(packed, lo | (hi << 4))
    one_a_byte = bq.quantize(q, s.with_store(QuantStore.packed_native(0)), scales=[1.0]).values
    np.testing.assert_array_equal(one_a_byte, q.astype(np.int8).view(np.uint8) & 0x0F)


def test_packed_u32_layout_along_an_outer_axis():
    """PackedU32(1) on (3, 2): burn stores the (2, 3) transpose packed along its rows, so the 3
    values of each column share one word, first in the low bits."""
    x = np.array([[1, -1], [2, -2], [3, 0]], np.float32)
    s = QuantScheme(QuantValue.Q8S, QuantStore.packed_u32(1)).per_tensor(ScaleDtype.F32)
    words = bq.quantize(x, s, scales=[1.0]).values
    assert words.shape == (2, 1) and words.dtype == np.uint32
    assert words.tolist() == [[0x00030201], [0x0000FEFF]]


def test_each_line_is_padded_on_its_own():
    s = QuantScheme(QuantValue.Q4S, QuantStore.packed_u32(0)).per_tensor(ScaleDtype.F32)
    qt = bq.quantize(np.ones((3, 3), np.float32), s)
    assert qt.values.shape == (3, 1)  # 3 words, not 2
    assert qt.values.tolist() == [[0x777]] * 3


def test_typed_views_without_ml_dtypes_name_the_extra(monkeypatch):
    import sys

    qt = bq.quantize(np.ones(32, np.float32), bq.presets.mxfp8())
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # makes `import ml_dtypes` fail
    with pytest.raises(ImportError, match=r"blockquant\[ml\]"):
        qt.values_view()
    with pytest.raises(ImportError, match=r"blockquant\[ml\]"):
        qt.scales_view()
