"""calibration="mse" (format.md "Searched scales: `mse`"): the core equals blockquant.reference bit for bit, the search
does what its definition says, and bad weights are refused."""

from __future__ import annotations

import numpy as np
import pytest

import blockquant as bq
import blockquant.reference as ref
from blockquant._reference_search import DIVISORS
from blockquant.scheme import QuantScheme, QuantStore, QuantValue, ScaleDtype

RNG = np.random.default_rng(14)


def _same(a, b) -> None:
    assert np.array_equal(np.asarray(a.scales).view(np.uint32), np.asarray(b.scales).view(np.uint32))
    assert a.global_scale == b.global_scale
    assert np.array_equal(a.values, b.values)


def _data(shape, rng=RNG) -> np.ndarray:
    # Rows of very different magnitudes, an all-zero row, heavy-tailed values.
    x = rng.standard_t(3, size=shape).astype(np.float32)
    if x.ndim >= 2 and x.shape[0] >= 3:
        x[0] *= np.float32(1e-3)
        x[1] = 0
        x[2] *= np.float32(300)
    return x


def _one_level(value, dtype, block, store=QuantStore.Native):
    return QuantScheme(value, store).per_block(block, dtype)


VALUES = [v for v in QuantValue if not v.is_unsigned]
DTYPES = list(ScaleDtype)


@pytest.mark.parametrize("value", VALUES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_core_equals_reference_one_level(value, dtype):
    modes = ["up", "nearest"] + (["mx"] if dtype is ScaleDtype.UE8M0 else [])
    for block, shape in [([32], (6, 70)), ([7], (5, 23)), ([3, 5], (7, 11)), ([2, 1, 4], (3, 5, 9))]:
        x = _data(shape)
        s = _one_level(value, dtype, block)
        for mode in modes:
            _same(bq.quantize(x, s, calibration="mse", scale_rounding=mode),
                  ref.quantize(x, s, calibration="mse", scale_rounding=mode))


# Per-tensor 2-bit schemes are among them: bit-exact all the same, whatever the advice.
@pytest.mark.filterwarnings("ignore:calibration 'mse' cannot help:RuntimeWarning")
@pytest.mark.parametrize("value", VALUES, ids=str)
def test_core_equals_reference_per_tensor_and_packed(value):
    x = _data((9, 40))
    for store in [QuantStore.Native, QuantStore.packed_u32(0), QuantStore.packed_u32(1)]:
        s = QuantScheme(value, store).per_tensor(ScaleDtype.F32)
        _same(bq.quantize(x, s, calibration="mse"), ref.quantize(x, s, calibration="mse"))
        sb = QuantScheme(value, store).per_block([16], ScaleDtype.F16)
        w = RNG.random((40,)).astype(np.float32)
        _same(bq.quantize(x, sb, calibration="mse", weights=w),
              ref.quantize(x, sb, calibration="mse", weights=w))


@pytest.mark.parametrize("dtype", [ScaleDtype.UE4M3, ScaleDtype.F16], ids=str)
@pytest.mark.parametrize("value", [QuantValue.E2M1, QuantValue.Q4F, QuantValue.Q8S], ids=str)
def test_core_equals_reference_two_level(value, dtype):
    s = QuantScheme(value, QuantStore.Native).per_block([16], dtype).per_tensor(ScaleDtype.F32)
    x = _data((8, 50))
    for kw in [{}, {"global_scale": 0.01}, {"global_scale": 0.0},
               {"weights": RNG.random((8, 1)).astype(np.float32)}]:
        for mode in ["up", "nearest"]:
            _same(bq.quantize(x, s, calibration="mse", scale_rounding=mode, **kw),
                  ref.quantize(x, s, calibration="mse", scale_rounding=mode, **kw))


@pytest.mark.parametrize("value", VALUES, ids=str)
def test_core_equals_reference_in_groups_of_eight_blocks(value):
    # Whole blocks of 16 or 32 along rows: the core searches eight blocks at a time and encodes
    # them in the same pass (a short last group of eight; weights; each store; two-level).
    x = _data((11, 96))
    w = RNG.random((11, 96)).astype(np.float32)
    dtypes = [(ScaleDtype.F16, "up"), (ScaleDtype.F16, "nearest"), (ScaleDtype.UE4M3, "nearest"),
              (ScaleDtype.UE8M0, "mx"), (ScaleDtype.BF16, "up")]
    stores = [QuantStore.Native, QuantStore.packed_u32(0), QuantStore.packed_native(0)]
    for i, (block, (dtype, mode)) in enumerate([(b, d) for b in (16, 32) for d in dtypes]):
        s = QuantScheme(value, stores[i % 3]).per_block([block], dtype)
        try:
            s.layout(x.shape)
        except bq.QuantError:  # a store this value does not have
            s = QuantScheme(value, QuantStore.Native).per_block([block], dtype)
        kws = [{}, {"weights": w}]
        schemes = [s]
        if dtype in (ScaleDtype.F16, ScaleDtype.UE4M3):  # the two-level block dtypes
            schemes.append(s.per_tensor(ScaleDtype.F32))
        for s in schemes:
            for kw in kws:
                _same(bq.quantize(x, s, calibration="mse", scale_rounding=mode, **kw),
                      ref.quantize(x, s, calibration="mse", scale_rounding=mode, **kw))
    x16 = x.astype(np.float16)
    s = QuantScheme(value, QuantStore.Native).per_block([32], ScaleDtype.F16)
    _same(bq.quantize(x16, s, calibration="mse"), ref.quantize(x16, s, calibration="mse"))


# Per-tensor 2-bit schemes are among them: bit-exact all the same, whatever the advice.
@pytest.mark.filterwarnings("ignore:calibration 'mse' cannot help:RuntimeWarning")
def test_large_blocks_are_summed_in_chunks_as_the_reference_does():
    # A per-tensor block and a block longer than one chunk (65536), with weights; float16 input.
    x = RNG.standard_normal((3, 70001)).astype(np.float16)
    w = RNG.random((3, 70001)).astype(np.float32) * 4
    for s in [QuantScheme(QuantValue.Q4S, QuantStore.Native),
              _one_level(QuantValue.E2M1, ScaleDtype.BF16, [70001])]:
        _same(bq.quantize(x, s, calibration="mse", weights=w),
              ref.quantize(x, s, calibration="mse", weights=w))
    with_threads = []
    for n in (1, 2):
        bq.set_num_threads(n)
        try:
            with_threads.append(bq.quantize(x, QuantScheme(QuantValue.Q2S), calibration="mse"))
        finally:
            bq.set_num_threads(0)
    _same(*with_threads)


def test_candidates_whose_reciprocal_overflows_lose():
    # Q8S, half range 127: at amplitude 127 * 2^-128 minmax's scale is 2^-128, whose f32
    # reciprocal overflows (error +inf), while the candidates at 62/64 and 63/64 of the range
    # (larger scales) stay finite, so one of them wins; a block of subnormals far below has
    # every candidate +inf and keeps minmax's. Lanes (blocks of 32) and the block walk (8).
    tiny = np.float32(2.0**-128)
    for block in (32, 8):
        x = RNG.uniform(-1, 1, (4, 64)).astype(np.float32) * (np.float32(127) * tiny)
        x[:, ::block] = np.float32(127) * tiny
        x[1] *= np.float32(1e-6)
        s = _one_level(QuantValue.Q8S, ScaleDtype.F32, [block])
        qt = bq.quantize(x, s, calibration="mse")
        _same(qt, ref.quantize(x, s, calibration="mse"))
        mm = bq.quantize(x, s).scales.ravel()
        got = qt.scales.ravel()
        first = slice(0, 64 // block)
        assert np.all(got[first] > mm[first]) and np.all(np.isfinite(1 / got[first]))
        assert np.array_equal(got[64 // block : 128 // block], mm[64 // block : 128 // block])


def test_ties_keep_the_first_candidate():
    # An all-zero block and a block of one value: every candidate's error ties or minmax is exact.
    s = _one_level(QuantValue.Q8S, ScaleDtype.F32, [4])
    x = np.array([0, 0, 0, 0, 127, 127, 127, 127], np.float32)
    qt = bq.quantize(x, s, calibration="mse")
    assert qt.scales.tolist() == [0.0, 1.0]  # minmax's own scales
    _same(qt, ref.quantize(x, s, calibration="mse"))


def _error(x, e, value):
    # The search's own measure (docs/format.md): u = x · (1/e), the f32 reciprocal.
    if e == 0:
        return np.inf
    u = (x * (np.float32(1) / np.float32(e))).astype(np.float32)
    q = np.clip(np.sign(u) * np.floor(np.abs(u) + np.float32(0.5)), value.qmin, value.qmax)
    return float(e) ** 2 * float(((u - q) ** 2).sum())


def test_the_chosen_scale_is_the_best_candidate_and_never_worse_than_minmax():
    value = QuantValue.Q4F
    s = _one_level(value, ScaleDtype.F32, [32])
    x = _data((40, 32))
    qt = bq.quantize(x, s, calibration="mse")
    mm = bq.quantize(x, s)
    half = np.float32((value.qmax - value.qmin) / 2)
    for row, chosen, minmax in zip(x, qt.scales.ravel(), mm.scales.ravel()):
        alpha = np.abs(row).max()
        cands = [alpha / (half * np.float32(c)) for c in DIVISORS[4]]
        errs = [_error(row, c, value) for c in cands]
        assert chosen == cands[int(np.argmin(errs))]
        assert _error(row, chosen, value) <= _error(row, minmax, value)
    # ...and so the whole tensor's squared error is no larger.
    assert ((x - qt.dequantize()) ** 2).sum() <= ((x - mm.dequantize()) ** 2).sum()


def test_weights_steer_the_search():
    s = _one_level(QuantValue.Q2S, ScaleDtype.F32, [8])
    x = np.array([[8, 1, 1, 1, 1, 1, 1, 1]], np.float32)
    only_big = np.array([[1, 0, 0, 0, 0, 0, 0, 0]], np.float32)
    only_small = 1 - only_big
    big = bq.quantize(x, s, calibration="mse", weights=only_big).scales.item()
    small = bq.quantize(x, s, calibration="mse", weights=only_small).scales.item()
    assert big == 8.0  # minmax keeps 8 exact
    assert small < big  # the small values get a scale of their own


def test_mse_reaches_the_mx_neighbour_powers_of_two():
    x = _data((16, 64))
    qt = bq.quantize(x, "mxfp4", calibration="mse")
    mm = bq.quantize(x, "mxfp4")
    ratio = qt.scales / mm.scales
    assert set(np.unique(ratio)) <= {0.5, 1.0, 2.0}
    _same(qt, ref.quantize(x, "mxfp4", calibration="mse"))


@pytest.mark.parametrize("impl", [bq, ref], ids=["core", "reference"])
def test_bad_weights(impl):
    x = np.ones((2, 8), np.float32)
    s = _one_level(QuantValue.Q4S, ScaleDtype.F16, [8])
    with pytest.raises(bq.QuantError, match="weights must be finite and >= 0, got -1.0 at flat index 1"):
        impl.quantize(x, s, calibration="mse", weights=[1, -1, 1, 1, 1, 1, 1, 1])
    with pytest.raises(bq.QuantError, match="finite"):
        impl.quantize(x, s, calibration="mse", weights=np.full(8, np.nan))
    with pytest.raises(bq.QuantError, match="do not broadcast"):
        impl.quantize(x, s, calibration="mse", weights=np.ones(3))
    with pytest.raises(bq.QuantError, match="calibration='mse'"):
        impl.quantize(x, s, weights=np.ones(8))
    with pytest.raises(bq.QuantError, match="calibration='mse'"):
        impl.quantize(x, s, calibration="mse", weights=np.ones(8), scales=np.ones((2, 1)))
    with pytest.raises(TypeError):
        impl.quantize(x, s, calibration="mse", weights=np.array(["a"] * 8))


@pytest.mark.parametrize("impl", [bq, ref], ids=["core", "reference"])
def test_non_finite_input_is_reported_as_for_minmax(impl):
    x = np.ones((2, 8), np.float32)
    x[1, 3] = np.inf
    with pytest.raises(bq.NonFiniteError, match="flat index 11"):
        impl.quantize(x, "int4_block32", calibration="mse")


@pytest.mark.parametrize("preset", ["int4_block16", "nf4_block16", "bq4_block16"])
def test_two_level_presets_take_every_input_dtype_and_refuse_non_finite(preset):
    # The core derives g from one reduction over the input and measures each block's amplitude
    # as its search reads it: groups of eight blocks and a short last group, f64 and f16 input
    # (converted piece by piece), and a NaN or infinity anywhere (g itself then non-finite).
    s = bq.presets.PRESETS[preset]()
    x = _data((5, 16 * 10)).astype(np.float64) * 3
    for dtype in [np.float64, np.float32, np.float16]:
        xx = x.astype(dtype)
        _same(bq.quantize(xx, s), ref.quantize(xx, s))
    for (row, col), bad in [((0, 0), np.nan), ((1, 130), np.inf), ((4, 159), -np.inf),
                            ((3, 150), np.nan)]:
        xx = x.astype(np.float32)
        xx[row, col] = bad
        for impl in (bq, ref):
            with pytest.raises(bq.NonFiniteError, match=f"flat index {row * 160 + col}\\b"):
                impl.quantize(xx, s)


def test_empty_and_zero_d_inputs():
    for x in [np.zeros((0, 5), np.float32), np.float32(3.0), np.zeros((4,), np.float32)]:
        for s in ["int4_block32", "nvfp4", "int8", "mxfp4"]:
            _same(bq.quantize(x, s, calibration="mse"), ref.quantize(x, s, calibration="mse"))


def test_report_shows_bits_per_weight():
    from blockquant.metrics import bits_per_weight

    assert bits_per_weight(18, 32) == 4.5
    assert bits_per_weight(0, 0) == float("inf")


def test_weights_with_out_arrays():
    x = _data((4, 64))
    w = RNG.random((1, 64)).astype(np.float32)
    layout = bq.presets.int4_block32().layout(x.shape)
    out = (np.empty(layout.storage_shape, layout.storage_dtype), np.empty(layout.scale_grid, np.float32))
    qt = bq.quantize(x, "int4_block32", calibration="mse", weights=w, out=out)
    _same(qt, ref.quantize(x, "int4_block32", calibration="mse", weights=w))
