"""The Rust core against blockquant.reference, bit for bit, over the whole scheme matrix.

9 values × 3 stores (every packing dim) × {per-tensor, block [32], block [4, 8], two-level [16]}
× every allowed scale dtype × shapes {(), (0,), (7,), (3, 5), (2, 3, 33)}, on data with ties,
zero blocks, huge and tiny magnitudes and subnormals. Values, scales, global scale, the whole
``to_bytes()`` output and the dequantized floats must be identical.
"""

import itertools

import numpy as np
import pytest

import blockquant as bq
import blockquant.reference as ref
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype

SHAPES = [(), (0,), (7,), (3, 5), (2, 3, 33)]

LEVELS = (
    [("tensor", None)]
    + [("tensor", d) for d in ScaleDtype]
    + [("block32", d) for d in ScaleDtype]
    + [("block4x8", d) for d in ScaleDtype]
    + [("two16", d) for d in (ScaleDtype.F16, ScaleDtype.UE4M3)]
)


def make_scheme(value, store, level):
    kind, dtype = level
    s = QuantScheme(value, store)
    if kind == "tensor":
        return s if dtype is None else s.per_tensor(dtype)
    if kind == "block32":
        return s.per_block([32], dtype)
    if kind == "block4x8":
        return s.per_block([4, 8], dtype)
    return s.per_block([16], dtype).per_tensor(ScaleDtype.F32)


def stores(rank):
    r = max(rank, 1)
    return (
        [QuantStore.Native]
        + [QuantStore.packed_u32(d) for d in range(r)]
        + [QuantStore.packed_native(d) for d in range(r)]
    )


def data(shape, seed, magnitude=1.0):
    """Gaussian × log-uniform magnitudes, plus exact zeros, a zero run, ±subnormals and ties."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 1, shape)
    flat = x.reshape(-1)
    if flat.size >= 7:
        flat[rng.integers(0, flat.size, 3)] = 0.0
        flat[1] = -0.0
        flat[2] = 1e-41  # float32 subnormal
        flat[3] = -3e-39
        flat[4] = 2.5  # ties after scaling happen for "nice" values
        flat[5] = -0.5
        if flat.size >= 40:
            flat[8:40] = 0.0  # an all-zero block (the zero rule)
    return (x * magnitude).astype(np.float32)


def assert_same(rq, bq_qt):
    assert bq_qt.values.dtype == rq.values.dtype
    assert bq_qt.values.shape == rq.values.shape
    np.testing.assert_array_equal(bq_qt.values, rq.values)
    assert bq_qt.scales.shape == rq.scales.shape
    np.testing.assert_array_equal(bq_qt.scales.view(np.uint32), rq.scales.astype(np.float32).view(np.uint32))
    assert bq_qt.global_scale == rq.global_scale
    assert bq_qt.to_bytes() == rq.to_bytes()
    np.testing.assert_array_equal(
        bq_qt.dequantize().view(np.uint32), rq.dequantize().astype(np.float32).view(np.uint32)
    )


CASES = [
    (v, shape, level, store)
    for v in QuantValue if not v.is_unsigned
    for shape in SHAPES
    for level in LEVELS
    for store in stores(len(shape))
]


@pytest.mark.parametrize("value, shape, level, store", CASES, ids=lambda p: str(p).replace(" ", ""))
def test_rust_equals_reference(value, shape, level, store):
    scheme = make_scheme(value, store, level)
    x = data(shape, seed=hash((value.value, shape, level)) % 2**32)
    try:
        rq = ref.quantize(x, scheme)
    except bq.SchemeError:
        with pytest.raises(bq.SchemeError):
            bq.quantize(x, scheme)
        return
    qt = bq.quantize(x, scheme)
    assert_same(rq, qt)
    # Bytes round-trip exactly through both implementations.
    b = qt.to_bytes()
    assert len(b) == qt.nbytes
    again = bq.QTensor.from_bytes(b, scheme, shape)
    assert again.to_bytes() == b
    assert ref.from_bytes(b, scheme, shape).to_bytes() == b


OPTION_SCHEMES = [
    bq.presets.int8(),
    bq.presets.int8_block32(),
    bq.presets.int4_block32(),
    bq.presets.mxfp8(),
    bq.presets.mxfp4(),
    bq.presets.nvfp4(),
    bq.presets.bitnet(),
    QuantScheme(QuantValue.Q2F, QuantStore.packed_u32(1)).per_block([2, 3, 4], ScaleDtype.BF16),
    QuantScheme(QuantValue.E5M2, QuantStore.packed_native(2)).per_block([3, 1, 5], ScaleDtype.UE4M3),
    QuantScheme(QuantValue.Q4F, QuantStore.Native).per_block([2, 2, 2, 2, 2], ScaleDtype.F32),
]


@pytest.mark.parametrize("scheme", OPTION_SCHEMES, ids=repr)
@pytest.mark.parametrize(
    "calibration, rounding, scale_rounding",
    list(itertools.product(["minmax", "absmean"], ["half_away", "half_even"], ["up", "nearest"])),
)
@pytest.mark.parametrize("magnitude", [1.0, 1e30, 1e-30])
def test_options_equal_reference(scheme, calibration, rounding, scale_rounding, magnitude):
    shape = (3, 4, 5, 6, 37) if scheme.block and len(scheme.block.size) == 5 else (6, 5, 70)
    x = data(shape, seed=7, magnitude=magnitude)
    kw = dict(calibration=calibration, rounding=rounding, scale_rounding=scale_rounding)
    assert_same(ref.quantize(x, scheme, **kw), bq.quantize(x, scheme, **kw))


WHOLE_BLOCK_SCHEMES = [
    QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([64], ScaleDtype.BF16),
    QuantScheme(QuantValue.Q4S, QuantStore.packed_u32(0)).per_block([128], ScaleDtype.F16),
    QuantScheme(QuantValue.Q8F, QuantStore.Native).per_block([48], ScaleDtype.F32),
    QuantScheme(QuantValue.E4M3, QuantStore.Native).per_block([128], ScaleDtype.BF16),
    QuantScheme(QuantValue.Q2S, QuantStore.packed_u32(0)).per_block([32], ScaleDtype.BF16),
    QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([32], ScaleDtype.UE4M3),
    QuantScheme(QuantValue.E2M1, QuantStore.packed_native(0)).per_block([16], ScaleDtype.UE4M3),
    # Blocks of 8, a vector each; UE8M0 scales rounded up or to nearest (not the MX rule).
    QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([8], ScaleDtype.F16),
    QuantScheme(QuantValue.Q4F, QuantStore.packed_u32(0)).per_block([8], ScaleDtype.BF16),
    QuantScheme(QuantValue.E5M2, QuantStore.Native).per_block([8], ScaleDtype.UE8M0),
    QuantScheme(QuantValue.E4M3, QuantStore.Native).per_block([32], ScaleDtype.UE8M0),
    QuantScheme(QuantValue.Q4S, QuantStore.packed_u32(0)).per_block([64], ScaleDtype.UE8M0),
    # Blocks of three vectors, eight code bytes a step.
    QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([24], ScaleDtype.F16),
]

PARTIAL_ROW_SCHEMES = [
    QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([48], ScaleDtype.F16),
    QuantScheme(QuantValue.Q8F, QuantStore.Native).per_block([24], ScaleDtype.BF16),
    QuantScheme(QuantValue.Q4S, QuantStore.packed_u32(0)).per_block([40], ScaleDtype.F32),
    QuantScheme(QuantValue.E4M3, QuantStore.Native).per_block([8], ScaleDtype.UE8M0),
    QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([32], ScaleDtype.UE4M3),
]


@pytest.mark.parametrize("scheme", WHOLE_BLOCK_SCHEMES, ids=repr)
@pytest.mark.parametrize("rounding, scale_rounding",
                         list(itertools.product(["half_away", "half_even"], ["up", "nearest"])))
@pytest.mark.parametrize("magnitude", [1.0, 1e30, 1e-30])
def test_whole_blocks_of_any_multiple_of_8_equal_reference(scheme, rounding, scale_rounding,
                                                            magnitude):
    """Rows of whole blocks of 8 to 128 values, eight blocks at a time in the core's one-pass
    kernels (their scales rounded to F16, BF16, UE4M3 and UE8M0 in vector lanes), against the
    reference."""
    x = data((24, 1536), seed=11, magnitude=magnitude)
    kw = dict(rounding=rounding, scale_rounding=scale_rounding)
    assert_same(ref.quantize(x, scheme, **kw), bq.quantize(x, scheme, **kw))
    given = ref.quantize(x, scheme, **kw).scales
    assert_same(ref.quantize(x, scheme, scales=given, rounding=rounding),
                bq.quantize(x, scheme, scales=given, rounding=rounding))


@pytest.mark.parametrize("scheme", PARTIAL_ROW_SCHEMES, ids=repr)
@pytest.mark.parametrize("shape", [(13, 1000), (3, 20), (2, 40_000), (1, 16_400)])
@pytest.mark.parametrize("rounding", ["half_away", "half_even"])
def test_rows_ending_in_a_partial_block_equal_reference(scheme, shape, rounding):
    """Blocks of a multiple of 8 along rows they do not divide: each row's whole blocks eight
    at a time, its short last block alone (rows of one piece of the core's work, rows longer
    than a piece and cut into several, rows shorter than a block), with zero blocks and a zero
    row (the zero rule) among them, against the reference."""
    x = data(shape, seed=sum(shape), magnitude=1.0)
    x[-1, : min(96, shape[1])] = 0.0
    x[0] = 0.0 if shape[0] > 2 else x[0]
    kw = dict(rounding=rounding)
    assert_same(ref.quantize(x, scheme, **kw), bq.quantize(x, scheme, **kw))


@pytest.mark.parametrize("shape", [(30_000, 3), (5, 1400, 12), (90, 20), (33, 60), (14_000, 5)])
@pytest.mark.parametrize("block, store", [
    ([32], QuantStore.Native), ([8], QuantStore.packed_u32(0)), ([4], QuantStore.Native),
    ([5], QuantStore.packed_native(0)), ([2, 2], QuantStore.Native), ([7, 1], QuantStore.Native),
    ([16], QuantStore.packed_u32(0)),
])
def test_short_rows_dequantize_equal_reference(shape, block, store, threads):
    """Rows shorter than 64 values (a conv kernel's rows of 3, rows of 12 or 60) dequantized
    64 values at a time across rows, each value's scale spread from its block's: blocks wider
    than the rows, cut by them, narrower than a vector, spanning rows, column blocks; packed
    rows unpacked many at a time. Against the reference, on one and two threads (tasks that
    start mid-row)."""
    block = block[-len(shape):] if len(block) > len(shape) else block
    scheme = QuantScheme(QuantValue.Q4S, store).per_block(block, ScaleDtype.F16)
    x = data(shape, seed=sum(shape) + len(block))
    rq, qt = ref.quantize(x, scheme), bq.quantize(x, scheme)
    assert_same(rq, qt)
    out = np.full(shape, np.nan, np.float32)
    qt.dequantize(out=out)
    np.testing.assert_array_equal(out.view(np.uint32),
                                  rq.dequantize().astype(np.float32).view(np.uint32))


NARROW_SCHEMES = ["q8s/native/block4:f16", "q8f/native/block12:bf16", "q4s/packed_u32_0/block5:f16",
                  "e2m1/packed_native0/block20:ue8m0", "e4m3/native/block3:f32",
                  "q2s/packed_native0/block7:ue4m3", "q8s/native/block1:f16",
                  "e5m2/native/block63:f16", "int8_block32", "int4_block32", "mxfp4", "mxfp8",
                  "nvfp4", "e2m1/packed_native0/block4:ue4m3+tensor:f32",
                  "q8s/native/block12:f16+tensor:f32"]


@pytest.mark.parametrize("scheme", NARROW_SCHEMES)
@pytest.mark.parametrize("shape", [(2000, 3), (40, 1000), (9, 4099), (300, 12), (7, 3, 61), (5000, 1)])
@pytest.mark.parametrize("rounding", ["half_away", "half_even"])
def test_narrow_blocks_quantize_equal_reference(scheme, shape, rounding, threads):
    """Blocks under 64 values that are not whole vectors, back to back, eight at a time: short
    blocks along rows (with and without a partial last one), and rows shorter than a block (a
    conv kernel's rows of 3 under blocks of 32: each row one block), packed many short lines at
    a time; two-level schemes too. Zero blocks among them (the zero rule: their group goes block by block), values a
    scale's half-integer multiple (the checked reciprocal's flagged quotients). Against the
    reference, one and two threads."""
    x = data(shape, seed=sum(shape))
    flat = x.reshape(-1)
    flat[flat.size // 3: flat.size // 3 + 70] = 0.0
    flat[-5:] = 0.0
    rng = np.random.default_rng(len(flat))
    # A block's largest |x| is 127 (or 7, 1) scale steps; halves of a step elsewhere: ties.
    at = rng.integers(0, flat.size, flat.size // 20)
    flat[at] = (rng.integers(-254, 255, at.size) / 2).astype(np.float32) * np.float32(0.0625)
    kw = dict(rounding=rounding)
    s = bq.presets.resolve(scheme)
    assert_same(ref.quantize(x, s, **kw), bq.quantize(x, s, **kw))


@pytest.mark.parametrize("shape", [(30_000, 3), (5, 1400, 12), (14_000, 5), (2, 3, 70)])
@pytest.mark.parametrize("scheme", ["bitnet", "nvfp4", "int4_block32", "q4s/packed_u32_0/tensor:f32",
                                    "e4m3/native/tensor:f32", "q2s/packed_native0/block8:bf16"])
def test_short_rows_quantize_equal_reference(shape, scheme, threads):
    """Rows shorter than a packed word's run or a block (a conv kernel's rows of 3): a
    per-tensor scale as one run across rows, packed rows encoded many at a time and each packed
    into its own words, a grid row a tensor row. Against the reference, one and two threads."""
    x = data(shape, seed=sum(shape))
    s = bq.presets.resolve(scheme)
    assert_same(ref.quantize(x, s), bq.quantize(x, s))


@pytest.mark.parametrize("value", [v for v in QuantValue if not v.is_unsigned])
@pytest.mark.parametrize("rounding", ["half_away", "half_even"])
def test_ties_with_explicit_scales(value, rounding):
    """Every half-integer (and every float-format midpoint region) against scale 1 and 0.5."""
    x = (np.arange(-300, 300, dtype=np.float32) / 4).reshape(20, 30)
    for scale in (1.0, 0.5, 0.0):
        s = QuantScheme(value, QuantStore.Native).per_tensor(ScaleDtype.F32)
        kw = dict(rounding=rounding, scales=[scale])
        assert_same(ref.quantize(x, s, **kw), bq.quantize(x, s, **kw))
        s2 = s.per_block([16], ScaleDtype.F16).per_tensor(ScaleDtype.F32)
        grid = np.full((20, 2), 2.0, np.float32)
        kw2 = dict(rounding=rounding, scales=grid, global_scale=scale)
        assert_same(ref.quantize(x, s2, **kw2), bq.quantize(x, s2, **kw2))


@pytest.mark.parametrize("scheme", ["int8_block32", "int4_block32", "mxfp4", "mxfp8", "nvfp4",
                                    "int4_block16", "q8f/native/block16:bf16",
                                    "e5m2/native/block32:f32"])
@pytest.mark.parametrize("rounding", ["half_away", "half_even"])
def test_given_block_scales_equal_reference(scheme, rounding):
    """Given scales on whole blocks of 16 and 32 (quantized eight blocks at a time; E2M1 packed
    in registers): scales from the data, others off the dtype's grid (rounded), zeros (the
    zero rule) and −0 (stored as +0), scales small enough that values clamp or saturate, a
    row's tail of blocks short of a group, rows cut into pieces; a non-finite value is an
    error."""
    sch = bq.presets.resolve(scheme)
    rng = np.random.default_rng(19)
    # Rows of 19 blocks (two groups of eight and a tail), and rows longer than the kernels'
    # pieces (cut inside a row).
    for shape in [(6, 19 * sch.block.size[-1]), (2, 40000)]:
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        qt = bq.quantize(x, sch, calibration="minmax")
        given = qt.scales.copy()
        flat = given.reshape(-1)
        flat[rng.integers(0, flat.size, 3)] = 0.0
        flat[rng.integers(0, flat.size, 3)] = -0.0
        flat[: flat.size // 4] *= np.float32(1.37)  # mostly off the grid
        flat[-flat.size // 4:] *= np.float32(0.05)  # values far past the range
        kw = dict(rounding=rounding, scales=given, calibration="minmax")
        if qt.global_scale is not None:
            kw["global_scale"] = qt.global_scale
        got, want = bq.quantize(x, sch, **kw), ref.quantize(x, sch, **kw)
        assert_same(want, got)
        assert not np.signbit(got.scales).any()
        x[1, -5] = np.nan
        with pytest.raises(bq.NonFiniteError):
            bq.quantize(x, sch, **kw)


@pytest.mark.parametrize("scheme", ["nvfp4", "e2m1/packed_u32_0/block32:f16+tensor:f32",
                                    "q4s/packed_u32_0/block16:ue4m3+tensor:f32",
                                    "e4m3/native/block32:f16+tensor:f32"])
@pytest.mark.parametrize("scale_rounding", ["up", "nearest"])
def test_given_global_scale_with_calibrated_blocks_equals_reference(scheme, scale_rounding):
    """A two-level scheme's per-tensor scale g given, its block scales calibrated (the
    two-level kernels, g taken instead of derived): the derived g, ones below and above it
    (block scales saturate, or values clamp and blocks take subnormal scales), 0 (every block to
    the code of 0), a subnormal g and f32's largest; rows of whole groups of eight blocks, rows
    with a tail, rows cut into pieces. A bad g is an error that writes nothing; a non-finite
    value is an error."""
    sch = bq.presets.resolve(scheme)
    rng = np.random.default_rng(23)
    for shape in [(6, 19 * sch.block.size[-1]), (4, 8 * sch.block.size[-1]), (2, 40000)]:
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        x[1, : 3 * sch.block.size[-1]] = 0.0
        derived = bq.quantize(x, sch, calibration="minmax").global_scale
        for g in [derived, derived * 0.013, derived * 0.6, derived * 7.5, 0.0, 1e-40, 3.4e38]:
            kw = dict(global_scale=g, calibration="minmax", scale_rounding=scale_rounding)
            got, want = bq.quantize(x, sch, **kw), ref.quantize(x, sch, **kw)
            assert_same(want, got)
            assert got.global_scale == np.float32(g)
        template = bq.quantize(x, sch)
        out = (np.full_like(template.values, 0x5A), np.full_like(template.scales, 7.0))
        for bad in [-1.0, np.inf, np.nan]:
            with pytest.raises(bq.ScaleError):
                bq.quantize(x, sch, global_scale=bad, out=out)
        assert (out[0] == 0x5A).all() and (out[1] == 7.0).all()
        x[1, -5] = np.nan
        with pytest.raises(bq.NonFiniteError):
            bq.quantize(x, sch, global_scale=derived, out=out)


@pytest.mark.parametrize("dtype", list(ScaleDtype))
@pytest.mark.parametrize("mode", ["up", "nearest"])
def test_round_scale_equals_reference(dtype, mode):
    rng = np.random.default_rng(3)
    s = np.concatenate(
        [
            np.float32(2.0) ** rng.uniform(-150, 128, 20000).astype(np.float32),
            np.array([0.0, 1e-45, 2.0**-127, 2.0**-126, 65504, 65520, 448, 464, 3.4e38], np.float32),
        ]
    ).astype(np.float32)
    s = s[np.isfinite(s)]
    got = bq.round_scale(s, dtype, mode)
    want = ref.round_scale(s, dtype, mode)
    np.testing.assert_array_equal(got.view(np.uint32), np.asarray(want, np.float32).view(np.uint32))


def test_absmean_exact_sum_fallback():
    """A block whose magnitudes span more than 2^29: a naive f64 sum is not exact there."""
    x = np.full((4, 64), 1e-8, np.float32)
    x[:, 0] = 3e30
    x[2] = np.linspace(-1, 1, 64)
    for scheme in (bq.presets.bitnet(), bq.presets.int8_block32()):
        assert_same(ref.quantize(x, scheme, calibration="absmean"), bq.quantize(x, scheme, calibration="absmean"))


@pytest.mark.parametrize("value", [QuantValue.Q8S, QuantValue.Q4F, QuantValue.Q2S])
def test_dequantize_error_is_within_half_a_step(value):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 96)).astype(np.float32)
    s = QuantScheme(value, QuantStore.packed_u32(0)).per_block([32], ScaleDtype.F32)
    qt = bq.quantize(x, s)
    e = np.repeat(qt.scales, 32, axis=1)
    # Q*F: the block max lands on qmax + 0.5 and clips by half a step; f32 rounding of the
    # scale and of x / e (each ≤ 2^-24 relative, × the 15 half-steps of Q4F) push it a hair past.
    err = np.abs(x.astype(np.float64) - qt.dequantize())
    assert np.all(err <= e.astype(np.float64) / 2 * (1 + 32 * 2.0**-24))


@pytest.mark.parametrize("value", [QuantValue.E4M3, QuantValue.E5M2, QuantValue.E2M1])
def test_float_dequantize_error_is_within_half_an_ulp(value):
    mbits = {QuantValue.E4M3: 3, QuantValue.E5M2: 2, QuantValue.E2M1: 1}[value]
    emin = {QuantValue.E4M3: -6, QuantValue.E5M2: -14, QuantValue.E2M1: 0}[value]
    rng = np.random.default_rng(6)
    x = rng.standard_normal((8, 96)).astype(np.float32)
    s = QuantScheme(value, QuantStore.packed_native(0)).per_block([32], ScaleDtype.F32)
    qt = bq.quantize(x, s)
    e = np.repeat(qt.scales, 32, axis=1).astype(np.float64)
    v = np.abs(x / e)
    exp = np.maximum(np.floor(np.log2(np.maximum(v, 1e-300))), emin)
    half_ulp = 2.0 ** (exp - mbits - 1)
    assert np.all(np.abs(x - qt.dequantize()) <= half_ulp * e * (1 + 1e-6))


@pytest.mark.parametrize("scheme", OPTION_SCHEMES, ids=repr)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
@pytest.mark.parametrize("calibration", ["minmax", "absmean"])
def test_other_input_dtypes_are_read_in_place(scheme, dtype, calibration):
    """f16 / bf16 / f64 input is converted by the core a piece at a time: same bits as quantizing
    the float32 cast (and as the reference), on every kernel path (one-pass, two-pass, multi-dim
    blocks, two-level)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    shape = (3, 4, 5, 6, 37) if scheme.block and len(scheme.block.size) == 5 else (6, 5, 70)
    x = data(shape, seed=9).astype(dt)
    got = bq.quantize(x, scheme, calibration=calibration)
    assert_same(ref.quantize(x, scheme, calibration=calibration), got)
    assert got.to_bytes() == bq.quantize(x.astype(np.float32), scheme, calibration=calibration).to_bytes()


def test_large_non_f32_input_spans_many_pieces():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(10)
    x = rng.standard_normal(300_001).astype(np.float32)
    x[123_457] = np.inf
    for dt in (np.float16, ml_dtypes.bfloat16, np.float64):
        for scheme in (bq.presets.int8(), bq.presets.mxfp4(), bq.presets.nvfp4()):
            with pytest.raises(bq.NonFiniteError, match="flat index 123457$"):
                bq.quantize(x.astype(dt), scheme)
    x[123_457] = 0.5
    for dt in (np.float16, ml_dtypes.bfloat16, np.float64):
        for scheme in (bq.presets.int8(), bq.presets.mxfp4(), bq.presets.nvfp4()):
            xd = x.astype(dt)
            assert bq.quantize(xd, scheme).to_bytes() == bq.quantize(xd.astype(np.float32), scheme).to_bytes()


def _near_half_multiples(rng, scales: np.ndarray, qmax: int) -> np.ndarray:
    """For each scale s, a value within 3 ulps of (k + 1/2)·s, k + 1/2 inside ±qmax."""
    k = rng.integers(-qmax, qmax, scales.shape) + 0.5
    x = (k * scales.astype(np.float64)).astype(np.float32)
    nudge = rng.integers(-3, 4, scales.shape).astype(np.int32)
    return (x.view(np.int32) + nudge).view(np.float32)


def _product_misses(x: np.ndarray, e: np.ndarray) -> int:
    """How many values x·f32(1/e) rounds to another integer than x/e: the data must hold
    some, or a kernel multiplying by the reciprocal would pass unnoticed."""
    q_div = x / e
    q_mul = x * (np.float32(1) / e)
    away = lambda q: np.trunc(q + np.copysign(np.float32(0.5), q))  # noqa: E731
    return int(np.count_nonzero(away(q_div) != away(q_mul)))


@pytest.mark.parametrize("value", [QuantValue.Q8S, QuantValue.Q8F, QuantValue.Q4S, QuantValue.Q2F])
@pytest.mark.parametrize("rounding", ["half_away", "half_even"])
def test_near_ties_with_scales_whose_reciprocal_rounds(value, rounding):
    """The kernels divide integer codes by a scale as a multiply by its rounded reciprocal,
    checked near each rounding boundary: values a few ulps from the half-integer multiples of
    scales that are not powers of two (given per tensor, given per block, and computed per
    block from each block's largest value) quantize as the reference's division."""
    rng = np.random.default_rng(21)
    qmax = {QuantValue.Q8S: 127, QuantValue.Q8F: 127, QuantValue.Q4S: 7, QuantValue.Q2F: 1}[value]
    misses = 0
    # Per tensor, one scale given: a long run.
    for scale in (7.0, 4.5 / 127, 0.0123, 3.1e-20):
        s = QuantScheme(value, QuantStore.Native)
        e = np.float32(scale)
        x = _near_half_multiples(rng, np.full((8, 300), e, np.float32), qmax)
        misses += _product_misses(x, np.full(x.shape, e))
        kw = dict(rounding=rounding, scales=[scale])
        assert_same(ref.quantize(x, s, **kw), bq.quantize(x, s, **kw))
    # Per block of 32, f32 scales given (random, not powers of two).
    s = QuantScheme(value, QuantStore.Native).per_block([32], ScaleDtype.F32)
    grid = (np.exp2(rng.uniform(-30, 30, (16, 8))) * 1.37).astype(np.float32)
    e = np.repeat(grid, 32, axis=1)
    x = _near_half_multiples(rng, e, qmax)
    misses += _product_misses(x, e)
    kw = dict(rounding=rounding, scales=grid)
    assert_same(ref.quantize(x, s, **kw), bq.quantize(x, s, **kw))
    # Per block of 32 and 16, f16 scales from the data: each block's first value its largest.
    for block in (32, 16):
        s = QuantScheme(value, QuantStore.Native).per_block([block], ScaleDtype.F16)
        grid = (16, 512 // block)
        tops = (np.exp2(rng.integers(-10, 10, grid)) * rng.uniform(1, 1.9, grid)).astype(np.float32)
        x = np.zeros((16, 512), np.float32)
        x[:, ::block] = tops
        e = np.repeat(bq.quantize(x, s, rounding=rounding).scales.astype(np.float32), block, axis=1)
        near = _near_half_multiples(rng, e, qmax)
        keep = (np.abs(near) < np.repeat(tops, block, axis=1)) & (np.arange(512) % block != 0)
        x = np.where(keep, near, x)
        misses += _product_misses(x, e)
        got = bq.quantize(x, s, rounding=rounding)
        np.testing.assert_array_equal(got.scales.astype(np.float32), e[:, ::block])
        assert_same(ref.quantize(x, s, rounding=rounding), got)
    assert misses > 50


BYTE_VALUES = [QuantValue.Q8S, QuantValue.Q8F, QuantValue.E4M3, QuantValue.E5M2]


@pytest.mark.parametrize("value", BYTE_VALUES, ids=str)
@pytest.mark.parametrize("shape", [(8, 12, 64), (4, 6, 40), (3, 8, 5), (16, 4096)])
@pytest.mark.parametrize("level", [("tensor", ScaleDtype.F32), ("block32", ScaleDtype.F16),
                                   ("block4x8", ScaleDtype.BF16), ("two16", ScaleDtype.F16)],
                         ids=str)
@pytest.mark.parametrize("calibration", ["minmax", "mse"])
def test_8_bit_values_in_u32_words_equal_reference(value, shape, level, calibration, threads):
    """8-bit values packed four to a u32 word on lines of whole words (burn's default store
    for Q8S): the core writes and reads the words' bytes as the one-code-a-byte store does.
    Every packing dim (the lines along the last axis, or an outer axis swapped to the last
    place; lines of 5 leave a padded word, taken the word-by-word way), quantize and
    dequantize, fresh and into out= arrays, against the reference; the words' bytes of a
    last-axis packing are the Native store's bytes."""
    x = data(shape, seed=len(shape) * 100 + shape[-1])
    kw = dict(calibration=calibration)
    for dim in range(len(shape)):
        scheme = make_scheme(value, QuantStore.packed_u32(dim), level)
        rq, qt = ref.quantize(x, scheme, **kw), bq.quantize(x, scheme, **kw)
        assert_same(rq, qt)
        out = (np.full_like(qt.values, 0xA5A5A5A5), np.full_like(qt.scales, np.nan))
        into = bq.quantize(x, scheme, out=out, **kw)
        assert np.shares_memory(into.values, out[0]) and into.to_bytes() == rq.to_bytes()
        back = np.full(shape, np.nan, np.float32)
        qt.dequantize(out=back)
        np.testing.assert_array_equal(back.view(np.uint32),
                                      rq.dequantize().astype(np.float32).view(np.uint32))
        if dim == 0 and shape[-1] % 4 == 0:
            native = make_scheme(value, QuantStore.Native, level)
            np.testing.assert_array_equal(qt.values.view(np.uint8).reshape(-1),
                                          bq.quantize(x, native, **kw).values.view(np.uint8).reshape(-1))
