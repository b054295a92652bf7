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


# -- quantize(out=(values, scales)) ---------------------------------------------------------------
QSCHEMES = SCHEMES + ["q2s/packed_u32_0/block16:bf16", "e2m1/packed_native1/block16:ue4m3",
                      "q8s/native/block4x8:f32", "e4m3/native/tensor:f32", "q4f/packed_u32_1/tensor:f16",
                      # two-level integers with minmax scales: their kernel's own route to out=
                      "q4f/packed_u32_0/block16:ue4m3+tensor:f32", "q8s/native/block16:f16+tensor:f32",
                      # searched scales
                      "int4_block16", "nf4_block16"]


def _garbage(shape, dtype, seed):
    """An array of the given dtype full of arbitrary bit patterns (the core must overwrite every
    byte, not OR into zeros)."""
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dtype.itemsize, np.uint8)
    return raw.view(dtype).reshape(shape).copy()


def _assert_dequantizes_into_garbage(qt, want_bits):
    """qt.dequantize(out=...) into float32 arrays of garbage at a 16-byte boundary and 4 bytes
    past one (the non-temporal stores' two cases) gives exactly `want_bits`."""
    n = int(np.prod(qt.shape))
    for offset in (0, 1):
        buf = _garbage((n + 8,), np.float32, offset)
        start = (-buf.ctypes.data // 4) % 4 + offset  # 16-byte aligned, then `offset` f32 on
        out = buf[start:start + n].reshape(qt.shape)
        assert qt.dequantize(out=out) is out
        np.testing.assert_array_equal(out.view(np.uint32), want_bits)


@pytest.mark.parametrize("scheme", ["nvfp4", "int4_block16", "nf4_block16",
                                    "q4s/packed_u32_1/block8:ue4m3+tensor:f32"])
@pytest.mark.parametrize("global_scale", [0.3712, 1e36])
def test_two_level_dequantize_into_large_out_matches_the_reference(scheme, global_scale):
    """4-bit two-level schemes over 16 MiB of float32 output (the non-temporal stores; the core
    multiplies g into each block's scale as it reaches the block, not into an array first):
    random codes, every UE4M3 scale including 0 and the largest, a g that takes b × g past
    float32's largest for some blocks (capped there), into arrays of garbage at a 16-byte
    boundary and 4 bytes past one: bit for bit the reference."""
    from blockquant import reference as ref

    rng = np.random.default_rng(17)
    shape = (1024, 4112)  # rows of 257 blocks of 16
    sch = bq.presets.resolve(scheme)
    layout = sch.layout(shape)
    bits = np.iinfo(layout.storage_dtype).bits
    values = rng.integers(0, 2**bits, layout.storage_shape, dtype=np.uint64).astype(
        layout.storage_dtype)
    if sch.value.name == "Q4S":  # int4 symmetric: the nibble 8 (-8) is not a code
        nib = values.astype(np.uint64)
        for k in range(bits // 4):
            field = (nib >> np.uint64(4 * k)) & np.uint64(0xF)
            nib = np.where(field == 8, nib ^ np.uint64(1 << (4 * k)), nib)
        values = nib.astype(layout.storage_dtype)
    ue4m3 = np.arange(0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scales = ue4m3[rng.integers(0, ue4m3.size, layout.scale_grid)]
    qt = bq.QTensor.from_parts(values, scales, scheme=sch, shape=shape, global_scale=global_scale)
    want = ref.dequantize(ref.from_bytes(qt.to_bytes(), sch, shape)).view(np.uint32)
    if global_scale > 1:
        assert (want == np.float32(np.finfo(np.float32).max).view(np.uint32)).any()
    _assert_dequantizes_into_garbage(qt, want)
    np.testing.assert_array_equal(qt.dequantize().view(np.uint32), want)


@pytest.mark.parametrize("scheme, shape", [
    ("q8s/native/block128x128:f32", (2100, 2048)),  # the last grid row of partial blocks
    ("q8s/native/block2x3x32:bf16", (3, 1400, 1024)),  # rows ragged on both outer axes
    ("e2m1/packed_u32_0/block128x128:f32", (2048, 2176)),
    ("e2m1/packed_native0/block16x16:bf16", (2050, 2048)),
    # Blocks narrower than a vector: a scale a value; rows of 2050 start 8 bytes off 16.
    ("q8s/native/block1025x1:f32", (2050, 2050)),
    ("e2m1/packed_native0/block1025x1:bf16", (2050, 2050)),
    ("q8s/native/block3x5:f32", (2050, 2050)),
    # Short blocks along rows of 2051 that end in a partial block, each row at another place
    # against 16 bytes: row by row, eight blocks at a time.
    ("q8s/native/block5:f32", (2050, 2051)),
    ("q8s/native/block12:bf16", (2050, 2051)),
    ("q8s/native/block3:f32", (2050, 2051)),
])
def test_blocks_spanning_rows_dequantize_into_large_out_matches_the_reference(scheme, shape):
    """Blocks over several rows that tile each row (each row reads its own run of the scale
    grid), and blocks narrower than a vector (their scales spread a value at a time), over
    16 MiB of float32 output (the non-temporal stores), random codes and scales of
    many magnitudes, into arrays of garbage at a 16-byte boundary and 4 bytes past one: bit for
    bit the reference."""
    from blockquant import reference as ref

    rng = np.random.default_rng(19)
    sch = bq.presets.resolve(scheme)
    layout = sch.layout(shape)
    dt = np.dtype(layout.storage_dtype)
    if sch.value.name == "Q8S":  # int8 symmetric: -128 is not a code
        values = rng.integers(-127, 128, layout.storage_shape).astype(dt)
    else:  # E2M1: every nibble is a code
        raw_shape = (*layout.storage_shape[:-1], layout.storage_shape[-1] * dt.itemsize)
        values = rng.integers(0, 256, raw_shape, dtype=np.uint8).view(dt)
    scales = np.exp2(rng.integers(-20, 20, layout.scale_grid)) * rng.uniform(1, 2, layout.scale_grid)
    scales = scales.astype(ml_dtypes.bfloat16).astype(np.float32)  # values of F32 and BF16 alike
    qt = bq.QTensor.from_parts(values, scales, scheme=sch, shape=shape)
    want = ref.dequantize(ref.from_bytes(qt.to_bytes(), sch, shape)).view(np.uint32)
    _assert_dequantizes_into_garbage(qt, want)
    np.testing.assert_array_equal(qt.dequantize().view(np.uint32), want)


@pytest.mark.parametrize("scheme", QSCHEMES)
@pytest.mark.parametrize("shape", [(16, 64), (5, 48), (3, 7, 32), ()])
def test_quantize_out_gets_the_same_bits_as_fresh_arrays(scheme, shape):
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    try:
        want = bq.quantize(x, scheme)
    except (bq.errors.LayoutError, bq.errors.SchemeError):
        with pytest.raises((bq.errors.LayoutError, bq.errors.SchemeError)):  # refused alike
            bq.quantize(x, scheme, out=(np.zeros(1, np.uint8), np.zeros(1, np.float32)))
        return
    layout = bq.presets.resolve(scheme).layout(x.shape)
    for seed in range(2):  # reused: every byte written again
        values = _garbage(layout.storage_shape, layout.storage_dtype, seed)
        scales = _garbage(layout.scale_grid, np.float32, seed + 10)
        got = bq.quantize(x, scheme, out=(values, scales))
        assert np.shares_memory(got.values, values) and np.shares_memory(got.scales, scales)
        assert values.flags.writeable and scales.flags.writeable  # the caller's arrays
        assert not got.values.flags.writeable and not got.scales.flags.writeable
        np.testing.assert_array_equal(values, want.values)
        np.testing.assert_array_equal(scales.view(np.uint32), want.scales.view(np.uint32))
        assert got.global_scale == want.global_scale
        assert got.to_bytes() == want.to_bytes()


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_quantize_out_for_empty_tensors(shape):
    x = np.zeros(shape, np.float32)
    layout = bq.presets.int8().layout(shape)
    values = np.zeros(layout.storage_shape, layout.storage_dtype)
    scales = np.full(layout.scale_grid, 3, np.float32)
    got = bq.quantize(x, "int8", out=(values, scales))
    np.testing.assert_array_equal(got.dequantize(), x)


def test_bad_quantize_out_is_refused_and_left_alone():
    x = np.random.default_rng(6).standard_normal((8, 64)).astype(np.float32)
    layout = bq.presets.int4_block32().layout(x.shape)  # uint32 words, (8, 2) f16 scales
    v_ok = lambda: np.full(layout.storage_shape, 5, layout.storage_dtype)  # noqa: E731
    s_ok = lambda: np.full(layout.scale_grid, 5, np.float32)  # noqa: E731
    ro = v_ok()
    ro.flags.writeable = False
    shared = np.zeros(layout.storage_nbytes + 4 * layout.n_scales, np.uint8)
    cases = [
        (v_ok(), TypeError),  # not a tuple
        ((v_ok(),), TypeError),  # one array
        ((v_ok().astype(np.int32), s_ok()), TypeError),  # values dtype
        ((v_ok(), s_ok().astype(np.float64)), TypeError),  # scales dtype
        ((v_ok(), s_ok().astype(">f4")), TypeError),  # byte order
        ((v_ok().reshape(-1), s_ok()), ValueError),  # values shape
        ((v_ok(), s_ok().T.copy()), ValueError),  # scales shape
        ((np.zeros((8, 8), layout.storage_dtype)[:, ::2], s_ok()), ValueError),  # strided
        ((ro, s_ok()), ValueError),  # read-only
        ((v_ok(), [[0.0, 0.0]] * 8), TypeError),  # not an array
        ((shared[: layout.storage_nbytes].view(layout.storage_dtype).reshape(layout.storage_shape),
          shared[: 4 * layout.n_scales].view(np.float32).reshape(layout.scale_grid)), ValueError),
    ]
    for out, exc in cases:
        arrays = out if isinstance(out, tuple) else (out,)
        before = [np.array(a, copy=True) for a in arrays]
        with pytest.raises(exc):
            bq.quantize(x, "int4_block32", out=out)
        for a, b in zip(arrays, before):
            np.testing.assert_array_equal(np.asarray(a), b)
    # The input itself as an output.
    before = x.copy()
    inside = x.view(np.uint32).reshape(-1)[:64].reshape(layout.storage_shape)
    with pytest.raises(ValueError, match="shares memory"):
        bq.quantize(x, "int4_block32", out=(inside, s_ok()))
    np.testing.assert_array_equal(x.view(np.uint32), before.view(np.uint32))


@pytest.mark.parametrize("scheme", ["int8_block32", "nvfp4", "mxfp4"])
def test_given_scales_may_be_an_out_array(scheme):
    """quantize(x, scales=s, out=(v, s)) requantizes in place (the given scales are read into a
    copy first), and so does an out values array over the given scales' memory: the bytes of a
    call with scales of its own."""
    x = np.random.default_rng(6).standard_normal((64, 256)).astype(np.float32)
    q = bq.quantize(x, scheme)
    s = q.scales.copy()
    s[3, 2] *= np.float32(1.001)  # off the grid: rounded
    kw = {} if q.global_scale is None else {"global_scale": q.global_scale}
    want = bq.quantize(x, scheme, scales=s.copy(), **kw)
    v = np.empty_like(q.values)
    got = bq.quantize(x, scheme, scales=s, out=(v, s), **kw)
    assert got.to_bytes() == want.to_bytes()
    np.testing.assert_array_equal(s, want.scales)
    buf = np.zeros(max(v.nbytes, s.nbytes), np.uint8)
    vv = buf[: v.nbytes].view(v.dtype).reshape(v.shape)
    ss = buf[: s.nbytes].view(np.float32).reshape(s.shape)
    ss[...] = want.scales
    got = bq.quantize(x, scheme, scales=ss, out=(vv, np.empty_like(s)), **kw)
    assert got.to_bytes() == want.to_bytes()


@pytest.mark.parametrize("scheme, shape", [("mxfp8", (2049, 2056)),
                                           ("e4m3/native/tensor:f32", (2049, 2049))])
def test_e4m3_dequantize_into_large_out_matches_the_reference(scheme, shape):
    """Every finite E4M3 code (±0, subnormals, the largest) in random order, over 16 MiB of
    float32 output (the core's non-temporal stores), rows not a multiple of 16 or 32, into
    arrays of garbage at a 16-byte boundary and 4 bytes past one: bit for bit the reference."""
    from blockquant import reference as ref

    rng = np.random.default_rng(13)
    sch = bq.presets.resolve(scheme)
    layout = sch.layout(shape)
    finite = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    values = finite[rng.integers(0, finite.size, layout.storage_shape)]
    scales = bq.quantize(rng.standard_normal(shape).astype(np.float32), sch).scales
    qt = bq.QTensor.from_parts(values, scales, scheme=sch, shape=shape)
    want = ref.dequantize(ref.from_bytes(qt.to_bytes(), sch, shape)).view(np.uint32)
    _assert_dequantizes_into_garbage(qt, want)


def test_an_out_another_threads_call_is_using_says_so():
    # Two threads quantizing into the same arrays: the second finds them borrowed by the first
    # (its GIL-free kernel is writing them) and says another call is using them.
    import threading

    x = np.random.default_rng(0).standard_normal((4096, 4096), dtype=np.float32)
    layout = bq.presets.resolve("int8_block32").layout(x.shape)
    out = (np.empty(layout.storage_shape, layout.storage_dtype), np.empty(layout.scale_grid, np.float32))
    errors: list[BaseException] = []

    def busy() -> None:
        for _ in range(20):
            try:
                bq.quantize(x, "int8_block32", out=out)
            except ValueError as e:  # the other call held them first
                errors.append(e)

    for _ in range(5):
        t = threading.Thread(target=busy)
        t.start()
        while t.is_alive():
            try:
                bq.quantize(x[:64], "int8_block32", out=(out[0][:64], out[1][:64]))
            except ValueError as e:
                errors.append(e)
        t.join()
        if errors:
            break
    assert errors, "the two calls never met"
    for e in errors:
        assert "in use: another call (from another thread)" in str(e), e
