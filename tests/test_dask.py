"""blockquant.dask against the numpy API and blockquant.reference: a dask array quantized chunk
by chunk gives the bits ``blockquant.quantize`` gives the whole array, for every scheme, option,
input dtype and chunking hypothesis draws (aligned or not, regular or not); each chunk's bytes
are the numpy API's bytes of that chunk under the whole tensor's scale; bad input is refused
with the numpy API's error types."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import blockquant as bq
import blockquant.reference as ref

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
ml_dtypes = pytest.importorskip("ml_dtypes")
bqd = pytest.importorskip("blockquant.dask")

pytestmark = [
    pytest.mark.filterwarnings("ignore:calibration 'mse' cannot help:RuntimeWarning"),
    # tests on misaligned chunks check the warning themselves; elsewhere it is expected
    pytest.mark.filterwarnings("ignore::blockquant.dask.ChunkAlignmentWarning"),
]

SCHEMES = [
    "q8s/native/tensor:f32", "q8f/packed_u32_0/tensor", "q4s/packed_u32_0/tensor:f16",
    "e4m3/native/tensor:ue8m0", "q2s/packed_u32_0/tensor:f32", "e2m1/packed_native0/tensor:bf16",
    "q4s/packed_u32_0/block32:f16", "q8s/native/block16:bf16", "e4m3/native/block32:ue8m0",
    "e2m1/packed_native0/block32:ue8m0", "e2m1/packed_native0/block16:ue4m3+tensor:f32",
    "q4f/packed_u32_0/block16:ue4m3+tensor:f32", "q8s/native/block4x8:f16+tensor:f32",
    "q4s/packed_u32_1/block16x8:f16", "e2m1/packed_native1/block4x16:ue4m3+tensor:f32",
    "q2f/packed_u32_1/block3:f32", "q8s/packed_native1/block5x3:f16", "q4f/native/block7:f32",
    "q4f/packed_u32_0/block16:ue4m3+tensor:f32/lookup:nf4", "q2s/native/block8:f16/lookup:[1.5,-0.25,0.25,-3.0]",
    "u4/packed_u32_0/block16:bf16/zero:u8", "u8/native/block8x4:f32/bias:f16",
    "u4/packed_u32_0/tensor:f32/zero:u8", "q8s/native/block65536:f32",
]
INPUTS = ["float32", "float16", "float64", "bfloat16"]
CALIBRATIONS = ["minmax", "absmean", "mse"]


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


@pytest.fixture(autouse=True)
def _synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


# -- strategies ----------------------------------------------------------------------------------
@st.composite
def chunked_arrays(draw, max_rank: int = 3, max_dim: int = 48):
    """(x, chunks): a float array of 1 to ``max_rank`` axes and a chunking of it (chunk sizes
    drawn per axis, so irregular chunkings too)."""
    rank = draw(st.integers(1, max_rank))
    shape = tuple(draw(st.lists(st.integers(1, max_dim), min_size=rank, max_size=rank)))
    chunks = []
    for d in shape:
        sizes, left = [], d
        while left:
            c = draw(st.integers(1, left))
            sizes.append(c)
            left -= c
        chunks.append(tuple(sizes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    style = draw(st.sampled_from(["normal", "zeros", "subnormal", "huge", "ties", "spiky"]))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    if style == "zeros":
        flat[rng.random(flat.size) < 0.6] = 0.0
    elif style == "subnormal":
        flat *= np.float32(1e-41)
    elif style == "huge":
        flat[::5] = np.float32(3e38) * np.sign(flat[::5])
    elif style == "ties":
        flat[:] = np.round(flat * 4) / 4
    elif style == "spiky":
        flat[rng.integers(0, flat.size)] = np.float32(2.0 ** draw(st.integers(-60, 60)))
    dtype = _np_dtype(draw(st.sampled_from(INPUTS)))
    with np.errstate(over="ignore"):  # 3e38 is inf in float16: refused alike
        return x.astype(dtype), tuple(chunks)


@st.composite
def options(draw):
    return dict(calibration=draw(st.sampled_from([None, *CALIBRATIONS])),
                rounding=draw(st.sampled_from([None, "half_away", "half_even"])),
                scale_rounding=draw(st.sampled_from([None, "up", "nearest", "mx"])))


# -- helpers -------------------------------------------------------------------------------------
def _step(scheme: bq.QuantScheme, rank: int, axis: int) -> int:
    """What every chunk but the last must be a multiple of, from format.md alone: the block's
    size along the axis, and along the packed axis the values per word (32 / bits for a uint32
    store, two E2M1 values a byte under PackedNative, one a byte otherwise)."""
    b = 1
    if scheme.block is not None:
        full = (1,) * (rank - len(scheme.block.size)) + tuple(scheme.block.size)
        b = full[axis]
    p = 1
    if scheme.store.is_packed and axis == rank - 1 - scheme.store.dim:
        if scheme.store.kind == "packed_u32":
            p = 32 // scheme.value.bits
        elif scheme.value is bq.QuantValue.E2M1:
            p = 2
    return math.lcm(b, p)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def _same_tensor(got: bq.QTensor, want: bq.QTensor) -> None:
    assert got.to_bytes() == want.to_bytes()
    assert np.array_equal(got.values, want.values)
    assert np.array_equal(_bits(got.scales), _bits(want.scales))
    assert got.global_scale == want.global_scale
    if want.offsets is None:
        assert got.offsets is None
    else:
        assert np.array_equal(_bits(got.offsets), _bits(want.offsets))


def _run_both(x: np.ndarray, chunks, scheme, **kw):
    """(numpy API's result or error, dask's result or error, that computed, dask's
    warnings). dask's errors come when it is called or when it is computed (a chunk's data)."""
    try:
        want = bq.quantize(x, scheme, **kw)
    except (bq.QuantError, TypeError) as e:
        want = e
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        computed = None
        try:
            got = bqd.quantize(da.from_array(x, chunks=chunks), scheme, **kw)
            computed = got.compute()
        except (bq.QuantError, TypeError) as e:
            got = e
    return want, got, computed, [w for w in caught if issubclass(w.category, bqd.ChunkAlignmentWarning)]


def _one_search(scheme: bq.QuantScheme, calibration) -> bool:
    cal = calibration if calibration is not None else scheme.options.calibration
    return scheme.block is None and (scheme.offset is not None or cal == "mse")


def _chunk_slices(chunks):
    starts = [np.cumsum((0,) + c[:-1]) for c in chunks]
    for index in np.ndindex(*[len(c) for c in chunks]):
        yield index, tuple(slice(int(starts[a][i]), int(starts[a][i]) + chunks[a][i])
                           for a, i in enumerate(index))


# -- the property --------------------------------------------------------------------------------
@given(chunked_arrays(), st.sampled_from(SCHEMES), options())
def test_dask_quantize_equals_numpy_quantize_whatever_the_chunking(case, text, kw):
    x, chunks = case
    scheme = bq.presets.resolve(text)
    want, got, computed, warned = _run_both(x, chunks, scheme, **kw)
    nchunks = math.prod(len(c) for c in chunks)
    if _one_search(scheme, kw["calibration"]) and isinstance(got, bq.QuantError) \
            and "one search over the whole tensor" in str(got):
        assert nchunks > 1  # refused only when the chunks, aligned, are more than one
        return
    if isinstance(want, Exception):  # a scheme that does not fit, an option it refuses
        assert type(got) is type(want), (want, got)
        return
    steps = [_step(scheme, x.ndim, a) for a in range(x.ndim)]
    misaligned = any(c % s for cs, s in zip(chunks, steps) for c in cs[:-1])
    assert not isinstance(got, Exception), got
    if _one_search(scheme, kw["calibration"]):
        assert got.numblocks == (1,) * x.ndim
    assert bool(warned) == misaligned
    for cs, s in zip(got.chunks, steps):  # aligned now: only a last chunk ends inside a block
        assert all(c % s == 0 for c in cs[:-1])
    _same_tensor(computed, want)
    for dtype in ("float32", "float16"):
        assert np.array_equal(_bits(got.dequantize(dtype).compute()), _bits(want.dequantize(dtype)))


@given(chunked_arrays(max_rank=2, max_dim=40), st.sampled_from(SCHEMES), options())
def test_each_chunks_bytes_are_the_numpy_api_on_that_chunk(case, text, kw):
    """A chunk's bytes: the numpy API on the chunk alone, under the whole tensor's per-tensor
    scale (scales=) or g (global_scale=), which the numpy API on the whole array chose."""
    x, chunks = case
    scheme = bq.presets.resolve(text)
    want, got, _, _ = _run_both(x, chunks, scheme, **kw)
    if isinstance(want, Exception) or isinstance(got, Exception):
        return  # the property above says when and how
    blobs = got.to_bytes_blocks().compute()
    assert blobs.shape == got.numblocks
    for index, where in _chunk_slices(got.chunks):
        extra = {}
        if scheme.is_two_level:
            extra["global_scale"] = want.global_scale
        elif scheme.block is None and not _one_search(scheme, kw["calibration"]):
            extra["scales"] = want.scales
        one = bq.quantize(x[where], scheme, **kw, **extra)
        assert blobs[index] == one.to_bytes()
        back = bq.QTensor.from_bytes(blobs[index], scheme, x[where].shape)
        assert np.array_equal(_bits(back.dequantize()), _bits(want.dequantize()[where]))


@pytest.mark.parametrize("text", ["nvfp4", "mxfp4", "int4_block32", "bitnet", "int8",
                                  "int4_block16", "nf4_block16", "int4_asym_block128",
                                  "e2m1/packed_native1/block4x16:ue4m3+tensor:f32"])
def test_dask_quantize_equals_the_reference(text, rng):
    x = (rng.standard_normal((40, 160)) * rng.lognormal(0, 2, (40, 1))).astype(np.float32)
    want = ref.quantize(x, text)
    got = bqd.quantize(da.from_array(x, chunks=(8, 32)), text).compute()
    assert got.to_bytes() == ref.to_bytes(want)
    assert np.array_equal(_bits(got.dequantize()), _bits(ref.dequantize(want)))


# -- the whole tensor's scales -------------------------------------------------------------------
@pytest.mark.parametrize("text", ["nvfp4", "int4_block16", "q8s/native/block4:f16+tensor:f32",
                                  "int8", "bitnet", "q4s/packed_u32_0/tensor:ue8m0",
                                  "q8s/native/tensor:bf16"])
@pytest.mark.parametrize("case", ["zeros", "one_zero_chunk", "subnormal", "max_last",
                                  "near_f32_max", "tiny_and_huge"])
def test_per_tensor_scales_from_every_chunk(text, case):
    x = np.random.default_rng(7).standard_normal((24, 64)).astype(np.float32)
    if case == "zeros":  # g = 1, per-tensor scales by the zero rule
        x[:] = 0
    elif case == "one_zero_chunk":
        x[:8] = 0
    elif case == "subnormal":  # g underflows to 0 in the numpy API
        x *= np.float32(1e-44)
    elif case == "max_last":
        x[-1, -1] = 1e6
    elif case == "near_f32_max":
        x[5, 5] = np.float32(3.3e38)
    elif case == "tiny_and_huge":
        x[:12] *= np.float32(1e-30)
    want = bq.quantize(x, text)
    got = bqd.quantize(da.from_array(x, chunks=(8, 16)), text)
    assert got.global_scale == want.global_scale
    _same_tensor(got.compute(), want)


def test_absmean_sums_exactly_across_chunks():
    # 2^60 and many ones: a float64 sum in chunk order loses the ones; the exact sum does not.
    x = np.ones((64, 64), np.float32)
    x[0, 0] = 2.0**60
    x[63, 63] = 2.0**-140  # and a subnormal
    want = bq.quantize(x, "bitnet")
    got = bqd.quantize(da.from_array(x, chunks=(3, 7)), "bq4_block16", calibration="absmean")
    assert got.compute().to_bytes() == bq.quantize(x, "bq4_block16",
                                                   calibration="absmean").to_bytes()
    got = bqd.quantize(da.from_array(x, chunks=(16, 16)), "bitnet")
    assert got.scales.compute()[0] == want.scales[0]
    assert got.compute().to_bytes() == want.to_bytes()


def test_a_block_scheme_reads_nothing_until_computed():
    seen = []

    def make(block_info=None):
        seen.append(block_info[None]["chunk-location"])
        return np.ones(block_info[None]["chunk-shape"], np.float32)

    x = da.map_blocks(make, dtype=np.float32, chunks=((16,) * 4, (32,) * 4))
    q = bqd.quantize(x, "int4_block32")
    assert seen == []
    q.compute()
    assert len(seen) == 16
    seen.clear()
    q2 = bqd.quantize(x, "nvfp4")  # two-level: one pass for g now, then one to quantize
    assert len(seen) == 16
    q2.compute()
    assert len(seen) == 32


# -- given scales, g and weights -----------------------------------------------------------------
def test_given_scales_global_scale_and_weights_pass_through(rng):
    x = rng.standard_normal((32, 64)).astype(np.float32)
    dx = da.from_array(x, chunks=(8, 32))
    grid = bq.quantize(x, "q4s/packed_u32_0/block16:f16").scales
    for scales in (grid, da.from_array(grid, chunks=(3, 2))):
        got = bqd.quantize(dx, "q4s/packed_u32_0/block16:f16", scales=scales).compute()
        assert got.to_bytes() == bq.quantize(x, "q4s/packed_u32_0/block16:f16",
                                             scales=grid).to_bytes()
    got = bqd.quantize(dx, "nvfp4", global_scale=0.01).compute()
    assert got.to_bytes() == bq.quantize(x, "nvfp4", global_scale=0.01).to_bytes()
    got = bqd.quantize(dx, "int8", scales=0.05).compute()
    assert got.to_bytes() == bq.quantize(x, "int8", scales=0.05).to_bytes()
    w = rng.random((1, 64)).astype(np.float32)
    for weights in (w, da.from_array(w, chunks=(1, 16))):
        got = bqd.quantize(dx, "int4_block16", weights=weights).compute()
        assert got.to_bytes() == bq.quantize(x, "int4_block16", weights=w).to_bytes()


# -- bad input -----------------------------------------------------------------------------------
def test_misaligned_chunks_are_rechunked_with_a_warning_or_refused():
    x = da.zeros((64, 100), dtype=np.float32, chunks=(10, 10))
    with pytest.warns(bqd.ChunkAlignmentWarning, match=r"rechunked axes \[1\] to \[32\]"):
        q = bqd.quantize(x, "int4_block32")
    assert q.chunks[1] == (32, 32, 32, 4)
    with pytest.raises(bqd.ChunkAlignmentError, match="multiple of"):
        bqd.quantize(x, "int4_block32", rechunk=False)
    assert issubclass(bqd.ChunkAlignmentError, bq.LayoutError)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bqd.quantize(x.rechunk((10, 64)), "int4_block32", rechunk=False)  # aligned: silent
    unknown = da.from_array(np.ones(8, np.float32), chunks=4)
    unknown = unknown[unknown > 0]
    with pytest.raises(bqd.ChunkAlignmentError, match="unknown chunk sizes"):
        bqd.quantize(unknown, "int8")


def test_bad_inputs_raise_the_numpy_apis_error_types():
    x = da.ones((8, 32), dtype=np.float32, chunks=4)
    with pytest.raises(TypeError, match="dask array"):
        bqd.quantize(np.ones((8, 32), np.float32), "int8")
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64"):
        bqd.quantize(x.astype(np.int32), "int8")
    with pytest.raises(bq.SchemeError):
        bqd.quantize(da.ones(32, dtype=np.float32), "q8s/native/block4x4:f16")
    with pytest.raises(bq.SchemeError):
        bqd.quantize(x, "int8", scale_rounding="mx")
    with pytest.raises(bq.QuantError):
        bqd.quantize(x, "int8", calibration="nope")
    with pytest.raises(bq.ScaleError):
        bqd.quantize(x, "int4_block32", scales=np.ones((8, 2), np.float32))
    with pytest.raises(bq.MissingGlobalScaleError):
        bqd.quantize(x, "nvfp4", scales=np.ones((8, 2), np.float32))
    with pytest.raises(bq.UnexpectedGlobalScaleError):
        bqd.quantize(x, "int8", global_scale=1.0)
    with pytest.raises(bq.QuantError, match="weights= needs calibration='mse'"):
        bqd.quantize(x, "int4_block32", weights=np.ones((8, 32)))
    with pytest.raises(bq.QuantError, match="one search over the whole tensor"):
        bqd.quantize(x, "int8", calibration="mse")
    one = da.from_array(np.ones((8, 32), np.float32), chunks=-1)
    assert bqd.quantize(one, "int8", calibration="mse").compute().to_bytes() == \
        bq.quantize(np.ones((8, 32), np.float32), "int8", calibration="mse").to_bytes()
    with pytest.raises(TypeError, match="DaskQTensor"):
        bqd.dequantize(bq.quantize(np.ones(4, np.float32), "int8"))


@pytest.mark.parametrize("text", ["int4_block32", "nvfp4", "int8", "bitnet"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e39])
def test_a_non_finite_value_is_named_by_its_index_in_the_whole_tensor(text, bad):
    x = np.random.default_rng(3).standard_normal((24, 64))
    x[17, 45] = bad
    with pytest.raises(bq.NonFiniteError) as want:
        bq.quantize(x, text)
    with pytest.raises(bq.NonFiniteError) as got:
        bqd.quantize(da.from_array(x, chunks=(8, 32)), text).compute()
    assert str(got.value) == str(want.value)


# -- edges -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(), (0,), (0, 32), (5, 0)])
@pytest.mark.parametrize("text", ["int8", "nvfp4", "int4_block32"])
def test_empty_and_0d_arrays(shape, text):
    x = np.full(shape, 1.5, np.float32)
    try:
        want = bq.quantize(x, text)
    except bq.QuantError as e:
        with pytest.raises(type(e)):
            bqd.quantize(da.from_array(x), text)
        return
    got = bqd.quantize(da.from_array(x), text)
    _same_tensor(got.compute(), want)
    assert np.array_equal(got.dequantize().compute(), want.dequantize())


def test_threads_and_rechunked_tensors_give_the_same_bits(rng):
    x = rng.standard_normal((96, 256)).astype(np.float32)
    want = bq.quantize(x, "nvfp4")
    with dask.config.set(scheduler="threads"):
        q = bqd.quantize(da.from_array(x, chunks=(32, 64)), "nvfp4")
        _same_tensor(q.compute(), want)
        for chunks in ((96, 256), (10, 16), ((50, 46), (160, 96))):
            _same_tensor(q.rechunk(chunks).compute(), want)
    with pytest.raises(bqd.ChunkAlignmentError):
        q.rechunk((32, 8))
    for dtype in ("float64", "bfloat16"):
        assert np.array_equal(_bits(q.dequantize(dtype).compute()), _bits(want.dequantize(dtype)))
