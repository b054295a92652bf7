"""Affine schemes (format.md "Affine values (offsets)"): unsigned values with a zero point or a
bias per scale. The core against the reference bit for bit, hand-worked examples, the errors."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blockquant as bq
from blockquant import reference as ref
from blockquant.scheme import Offset, QuantScheme, QuantStore, QuantValue, ScaleDtype

UNSIGNED = [QuantValue.U8, QuantValue.U4, QuantValue.U2]
OFFSETS = [Offset.zero(), Offset.bias(ScaleDtype.F32), Offset.bias(ScaleDtype.F16),
           Offset.bias(ScaleDtype.BF16)]
STORES = [QuantStore.Native, QuantStore.packed_u32(0), QuantStore.packed_native(0),
          QuantStore.packed_u32(1), QuantStore.packed_native(1)]


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    store = draw(st.sampled_from(STORES))
    if store.dim >= max(rank, 1):
        store = QuantStore.packed_u32(0)
    scheme = QuantScheme(draw(st.sampled_from(UNSIGNED)), store,
                         offset=draw(st.sampled_from(OFFSETS)))
    if draw(st.booleans()):
        nb = draw(st.integers(1, rank))
        block = draw(st.lists(st.integers(1, 5), min_size=nb, max_size=nb))
        if block[0] == 1 and nb > 1:
            block[0] = 2
        scheme = scheme.per_block(block, draw(st.sampled_from(
            [ScaleDtype.F32, ScaleDtype.F16, ScaleDtype.BF16])))
    elif draw(st.booleans()):
        scheme = scheme.per_tensor(draw(st.sampled_from([ScaleDtype.F32, ScaleDtype.BF16])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["normal", "positive", "zeros", "wide"]))
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "positive":
        x = np.abs(x) + np.float32(3)
    elif kind == "zeros":
        x = np.where(rng.random(shape) < 0.7, np.float32(0), x).astype(np.float32)
    elif kind == "wide":
        x = (x * np.float32(1e4)).astype(np.float32)
    opts = dict(
        calibration=draw(st.sampled_from(["minmax", "mse"])),
        rounding=draw(st.sampled_from(["half_away", "half_even"])),
        scale_rounding=draw(st.sampled_from(["up", "nearest"])),
    )
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    return x.astype(dtype), scheme, opts


@settings(max_examples=300, deadline=None)
@given(cases())
def test_core_equals_reference(case):
    x, scheme, opts = case
    qt = bq.quantize(x, scheme, **opts)
    rq = ref.quantize(x, scheme, **opts)
    assert qt.values.dtype == rq.values.dtype and qt.values.shape == rq.values.shape
    np.testing.assert_array_equal(qt.values, rq.values)
    np.testing.assert_array_equal(qt.scales.view(np.uint32), rq.scales.view(np.uint32))
    assert qt.offsets is not None and rq.offsets is not None
    np.testing.assert_array_equal(qt.offsets.astype(np.float32).view(np.uint32),
                                  rq.offsets.astype(np.float32).view(np.uint32))
    assert qt.offsets.dtype == (np.uint8 if scheme.offset.kind == "zero" else np.float32)
    data = qt.to_bytes()
    assert data == rq.to_bytes()
    assert len(data) == scheme.layout(x.shape).nbytes == qt.nbytes
    np.testing.assert_array_equal(qt.dequantize().view(np.uint32),
                                  rq.dequantize().view(np.uint32))
    np.testing.assert_array_equal(qt.dequantize(np.float64), rq.dequantize(np.float64))
    back = bq.QTensor.from_bytes(data, scheme, x.shape)
    assert back.to_bytes() == data
    rb = ref.from_bytes(data, scheme, x.shape)
    np.testing.assert_array_equal(rb.offsets, rq.offsets)
    parts = bq.QTensor.from_parts(qt.values, qt.scales, scheme, x.shape, offsets=qt.offsets)
    assert parts.to_bytes() == data
    assert pickle.loads(pickle.dumps(qt)).to_bytes() == data


def test_zero_point_by_hand():
    # lo = -1.5, hi = 6: s = 7.5 / 15 = 0.5, z = 1.5 / 0.5 = 3, q = round(x / 0.5) + 3.
    x = np.array([-1.5, 0.25, 1.5, 6.0], np.float32)
    qt = bq.quantize(x, "u4/native/block4:f32/zero:u8")
    assert qt.values.tolist() == [0, 4, 6, 15]  # 0.25 / 0.5 = 0.5 rounds away: 1 + 3
    assert qt.scales.tolist() == [0.5] and qt.offsets.tolist() == [3]
    assert qt.dequantize().tolist() == [-1.5, 0.5, 1.5, 6.0]
    even = bq.quantize(x, "u4/native/block4:f32/zero:u8", rounding="half_even")
    assert even.values.tolist() == [0, 3, 6, 15]
    # Eight codes in one word: the second block [0, 1, 2, 3] has s = 0.2, z = 0, codes 0 5 10 15.
    x8 = np.array([-1.5, 0.25, 1.5, 6.0, 0.0, 1.0, 2.0, 3.0], np.float32)
    data = bq.quantize(x8, "u4/packed_u32_0/block4:f32/zero:u8").to_bytes()
    assert data == bytes([0x40, 0xF6, 0x50, 0xFA]) + np.array(
        [0.5, np.float32(3) / np.float32(15)], "<f4").tobytes() + bytes([3, 0])


def test_bias_by_hand():
    # b = 1, s = (4 - 1) / 3 = 1, q = round(x - 1); bf16 bias, f32 scale.
    qt = bq.quantize(np.array([1.0, 2.0, 2.5, 4.0], np.float32), "u2/native/block4:f32/bias:bf16")
    assert qt.values.tolist() == [0, 1, 2, 3]
    assert qt.offsets.tolist() == [1.0] and qt.scales.tolist() == [1.0]
    assert qt.dequantize().tolist() == [1.0, 2.0, 3.0, 4.0]
    # A constant block whose bias rounds above it (1 + 3/512 -> 1 + 1/128 in bfloat16): the
    # scale is then (hi - lo) / qmax = 0, every code 0, and x̂ = b.
    qt = bq.quantize(np.full(3, 1 + 3 / 512, np.float32), "u2/native/tensor/bias:bf16")
    assert qt.scales.tolist() == [0.0] and qt.offsets.tolist() == [1 + 1 / 128]
    assert qt.dequantize().tolist() == [1 + 1 / 128] * 3


def test_text_repr_and_layout():
    for t in ["u4/packed_u32_0/block128:bf16/zero:u8", "u4/packed_u32_0/block64:bf16/bias:bf16",
              "u8/native/tensor:f32/zero:u8"]:
        s = QuantScheme.parse(t)
        assert str(s) == t and QuantScheme.parse(str(s)) == s
        assert pickle.loads(pickle.dumps(s)) == s
    s = QuantScheme.parse("u4/packed_u32_0/block64:bf16/bias:bf16")
    assert s.offset == Offset.bias(ScaleDtype.BF16)
    assert "offset=Bias(BF16)" in repr(s)
    lay = s.layout((4, 128))
    assert (lay.storage_nbytes, lay.scales_nbytes, lay.offsets_nbytes, lay.nbytes) == (
        256, 16, 16, 288)
    assert QuantValue.U4.qmin == 0 and QuantValue.U4.qmax == 15 and not QuantValue.U4.is_float
    assert QuantValue.U4.is_unsigned and not QuantValue.Q4S.is_unsigned


@pytest.mark.parametrize("text, says", [
    ("u4/native/tensor", "need an offset"),
    ("q4s/native/tensor/zero:u8", "unsigned values"),
    ("u4/native/block16:ue8m0/zero:u8", "F32, F16 or BF16"),
    ("u4/native/block16:f16+tensor:f32/zero:u8", "one scale level"),
    ("u4/native/tensor/bias:ue4m3", "a bias is"),
])
def test_bad_schemes(text, says):
    with pytest.raises(bq.SchemeError, match=says):
        QuantScheme.parse(text)


def test_errors():
    x = np.arange(8, dtype=np.float32)
    s = "u4/native/block4:f32/zero:u8"
    with pytest.raises(bq.ScaleError, match="explicit scales"):
        bq.quantize(x, s, scales=[1.0, 1.0])
    with pytest.raises(bq.SchemeError, match="absmean"):
        bq.quantize(x, s, calibration="absmean")
    with pytest.raises(bq.SchemeError):
        bq.quantize(x, s, scale_rounding="mx")
    with pytest.raises(bq.NonFiniteError):
        bq.quantize(np.array([0, np.nan, 1, 2], np.float32), s)
    qt = bq.quantize(x, s)
    data = bytearray(qt.to_bytes())
    data[-1] = 16
    with pytest.raises(bq.LayoutError):
        bq.QTensor.from_bytes(bytes(data), s, x.shape)
    with pytest.raises(bq.LayoutError):
        bq.QTensor.from_bytes(qt.to_bytes()[:-1], s, x.shape)
    with pytest.raises(bq.ScaleError):
        bq.QTensor.from_parts(qt.values, qt.scales, s, x.shape)
    with pytest.raises(bq.ScaleError):
        bq.QTensor.from_parts(qt.values, qt.scales, s, x.shape, offsets=[16, 0])
    with pytest.raises(bq.ScaleError):
        bq.QTensor.from_parts(qt.values, qt.scales, s, x.shape, offsets=[1.5, 0])
    with pytest.raises(bq.ScaleError):
        bq.QTensor.from_parts(qt.values, qt.scales, "u4/native/block4:f32/bias:bf16", x.shape,
                              offsets=[1.001, 0])
    sym = bq.quantize(x, "q4s/native/block4:f32")
    with pytest.raises(bq.ScaleError):
        bq.QTensor.from_parts(sym.values, sym.scales, "q4s/native/block4:f32", x.shape,
                              offsets=qt.offsets)
    bad_bias = bytearray(bq.quantize(x, "u4/native/block4:f32/bias:f16").to_bytes())
    bad_bias[-2:] = b"\x00\x7c"  # +inf in float16
    with pytest.raises(bq.LayoutError):
        bq.QTensor.from_bytes(bytes(bad_bias), "u4/native/block4:f32/bias:f16", x.shape)


def test_empty_and_zero_d():
    for shape in [(), (0,), (3, 0)]:
        x = np.zeros(shape, np.float32)
        for t in ["u4/packed_u32_0/tensor/zero:u8", "u8/native/block2:bf16/bias:f16"]:
            if shape == () and "block2" in t:
                continue
            qt = bq.quantize(x, t)
            rq = ref.quantize(x, t)
            assert qt.to_bytes() == rq.to_bytes()
            assert qt.dequantize().shape == shape


def _sqnr(x, xh):
    return 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((x - xh).astype(np.float64) ** 2))


@pytest.mark.parametrize("offset", ["zero:u8", "bias:bf16"])
def test_mse_beats_minmax(offset):
    x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
    s = f"u4/packed_u32_0/block128:bf16/{offset}"
    a = _sqnr(x, bq.quantize(x, s).dequantize())
    b = _sqnr(x, bq.quantize(x, s, calibration="mse").dequantize())
    assert b > a + 0.3, (a, b)


def test_burnpack_refuses_affine():
    from blockquant.burnpack import scheme_to_burn

    with pytest.raises(bq.SchemeError, match="no affine"):
        scheme_to_burn(QuantScheme.parse("u4/packed_u32_0/block128:bf16/zero:u8"))


def test_affine_presets_go_through_safetensors_and_are_refused_where_consumers_have_none(tmp_path):
    """blockquant's safetensors layout holds the offsets (NAME.offsets); burn's Burnpack, ONNX
    and GGUF outputs refuse affine schemes in one line."""
    from blockquant.checkpoint import CheckpointError
    from blockquant.checkpoint.safetensors import SafetensorsWriter

    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 256)).astype(np.float32)
    src = tmp_path / "w.safetensors"
    with SafetensorsWriter(src, [("w", "F32", w.shape, w.nbytes)]) as f:
        f.write("w", w)
        f.commit()
    for preset, part_dtype in (("int4_asym_block128", "U8"), ("int4_affine_block64", "U16")):
        out = tmp_path / f"{preset}.safetensors"
        bq.quantize_file(src, out, preset)
        qt = bq.load(out)["w"]
        want = bq.quantize(w, preset)
        assert qt.to_bytes() == want.to_bytes()
        assert np.array_equal(qt.offsets, want.offsets)
        from blockquant.checkpoint.safetensors import SafetensorsCheckpoint
        with SafetensorsCheckpoint(out) as ck:
            assert ck.info("w.offsets").dtype == part_dtype
            assert ck.info("w.offsets").shape == want.scheme.layout(w.shape).scale_grid
        with pytest.raises(bq.SchemeError, match="no affine values"):
            bq.save_burnpack(tmp_path / "w.bpk", {"w": want})
        with pytest.raises(CheckpointError, match="GGUF"):
            bq.quantize_file(src, tmp_path / "w.gguf", preset)
