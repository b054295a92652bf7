"""Blocks spanning rows (block [128, 128], [2, 3, 8], [16, 1], ...) quantized by the tile kernel
(one pass over memory) against blockquant.reference, bit for bit: ragged edge blocks, 3-D blocks,
every value type, native and packed stores, every scale dtype, non-finite input, out= arrays,
one and two threads, and a tensor large enough for the non-temporal stores."""

import numpy as np
import pytest

import blockquant as bq
import blockquant.reference as ref
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype

# (shape, block): ragged on every axis, 3-D blocks, a last block dim of 1, a block wider than
# its axis, several tiles to a grid row (block [128, 128] on 130 x 700).
GRIDS = [
    ((37, 45), [8, 8]),
    ((130, 700), [128, 128]),
    ((5, 7, 30), [2, 3, 8]),
    ((4, 6, 16), [2, 3, 8]),
    ((33, 10), [16, 1]),
    ((7, 9), [4, 32]),
    ((3, 4, 50), [2, 1, 7]),
    # Blocks one or two vectors wide (four vectors a step across blocks), many tiles in
    # turn (the pipelined path), a ragged last block and grid row.
    ((120, 1036), [8, 16]),
    ((67, 523), [4, 8]),
]

STORES = [QuantStore.Native, QuantStore.packed_u32(0), QuantStore.packed_native(0)]


def data(shape, seed):
    """Gaussian at mixed magnitudes, zeros, an all-zero block (the zero rule), ties, subnormals."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 2, shape)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 5)] = 0.0
    flat[:3] = [2.5, -0.5, 1e-41]
    x = x.astype(np.float32)
    x[(0,) * (x.ndim - 2) + (slice(0, 2), slice(0, 8))] = 0.0
    return x


def assert_same(rq, qt):
    np.testing.assert_array_equal(qt.values, rq.values)
    assert qt.values.dtype == rq.values.dtype
    np.testing.assert_array_equal(qt.scales.view(np.uint32), rq.scales.astype(np.float32).view(np.uint32))
    assert qt.to_bytes() == rq.to_bytes()


SCALE_DTYPES = [ScaleDtype.F32, ScaleDtype.F16, ScaleDtype.BF16, ScaleDtype.UE8M0, ScaleDtype.UE4M3]


@pytest.mark.parametrize("shape, block", GRIDS, ids=lambda p: str(p).replace(" ", ""))
@pytest.mark.parametrize("store", STORES, ids=str)
def test_every_value_and_scale_dtype_equal_reference(shape, block, store, threads):
    x = data(shape, seed=len(shape) * 100 + shape[-1])
    for i, value in enumerate([v for v in QuantValue if not v.is_unsigned]):  # every value, the scale dtypes in turn
        dtype = SCALE_DTYPES[(i + len(shape)) % len(SCALE_DTYPES)]
        scheme = QuantScheme(value, store).per_block(block, dtype)
        for rounding, scale_rounding in [("half_away", "up"), ("half_even", "nearest")]:
            kw = dict(rounding=rounding, scale_rounding=scale_rounding)
            try:
                rq = ref.quantize(x, scheme, **kw)
            except bq.SchemeError:
                with pytest.raises(bq.SchemeError):
                    bq.quantize(x, scheme, **kw)
                continue
            assert_same(rq, bq.quantize(x, scheme, **kw))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_converted_input_equals_reference(dtype, threads):
    x = data((19, 70), seed=3).clip(-6e4, 6e4).astype(dtype)
    scheme = QuantScheme(QuantValue.Q4S, QuantStore.packed_u32(0)).per_block([4, 8], ScaleDtype.F16)
    assert_same(ref.quantize(x, scheme), bq.quantize(x, scheme))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [(0, 0), (36, 44), (20, 5), (8, 40)])
def test_non_finite_input_is_refused_naming_the_first(bad, where, threads):
    x = data((37, 45), seed=5)
    x[where] = bad
    x[36, 0] = np.nan  # a later one (or the same row's first)
    first = min(np.ravel_multi_index(where, x.shape), 36 * 45)
    for store in STORES:
        scheme = QuantScheme(QuantValue.Q8S if store == QuantStore.Native else QuantValue.E2M1, store)
        scheme = scheme.per_block([8, 8], ScaleDtype.F16)
        with pytest.raises(bq.NonFiniteError, match=f"index {first}$"):
            bq.quantize(x, scheme)
        with pytest.raises(bq.NonFiniteError):
            ref.quantize(x, scheme)


def test_out_arrays_get_the_same_bits(threads):
    x = data((130, 700), seed=6)
    for store in STORES:
        value = QuantValue.Q4S if store != QuantStore.Native else QuantValue.Q8S
        scheme = QuantScheme(value, store).per_block([128, 128], ScaleDtype.BF16)
        want = bq.quantize(x, scheme)
        out = (np.full_like(want.values, 0x5A), np.full_like(want.scales, np.nan))
        got = bq.quantize(x, scheme, out=out)
        assert got.values.base is out[0] or np.shares_memory(got.values, out[0])
        np.testing.assert_array_equal(out[0], want.values)
        np.testing.assert_array_equal(out[1].view(np.uint32), want.scales.view(np.uint32))
        assert_same(ref.quantize(x, scheme), got)


def test_issue_13_case_equals_reference(threads):
    """bench.py's "block[128,128] Q8S F32" at its size: 16 Mi values, large enough that the codes
    go to memory with non-temporal stores."""
    x = np.random.default_rng(7).standard_normal((4096, 4096)).astype(np.float32)
    scheme = QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([128, 128], ScaleDtype.F32)
    rq = ref.quantize(x, scheme)
    assert_same(rq, bq.quantize(x, scheme))
    out = (np.empty_like(rq.values), np.empty_like(rq.scales))
    assert_same(rq, bq.quantize(x, scheme, out=out))


@pytest.mark.parametrize("scheme", [
    QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([1025, 1], ScaleDtype.F32),
    QuantScheme(QuantValue.Q4S, QuantStore.packed_u32(0)).per_block([1025, 1], ScaleDtype.F16),
    QuantScheme(QuantValue.E4M3, QuantStore.Native).per_block([1025, 1], ScaleDtype.BF16),
    QuantScheme(QuantValue.E2M1, QuantStore.packed_native(0)).per_block([1025, 1], ScaleDtype.UE8M0),
], ids=str)
def test_column_blocks_of_many_rows_equal_reference(scheme, threads):
    """Column blocks (block [rows, 1]) whose grid row is too large for one tile: two passes over
    whole rows (the column maxima, then the encode) instead of tiles of a few columns; rows of
    1030 values (ragged against the vectors), a partial last grid row, a NaN refused."""
    x = data((2100, 1030), seed=8)
    rq = ref.quantize(x, scheme)
    assert_same(rq, bq.quantize(x, scheme))
    x[1500, 7] = np.nan
    with pytest.raises(bq.NonFiniteError):
        bq.quantize(x, scheme)


def test_large_column_blocks_equal_reference(threads):
    """Column blocks over 16 Mi values: the codes go to memory with non-temporal stores, rows of
    4100 bytes starting at every alignment."""
    x = np.random.default_rng(9).standard_normal((4100, 4100)).astype(np.float32)
    scheme = QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([1025, 1], ScaleDtype.F32)
    rq = ref.quantize(x, scheme)
    assert_same(rq, bq.quantize(x, scheme))


def test_large_blocks_of_8_equal_small_calls(threads):
    """Blocks of 8 over 16 Mi values: eight code bytes a block to memory with non-temporal
    stores, against the same rows quantized 64 at a time (small outputs, cached stores; those
    equal the reference in test_matrix)."""
    x = np.random.default_rng(10).standard_normal((4096, 4096)).astype(np.float32)
    x[7, 16:24] = 0.0  # the zero rule in a group
    scheme = QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([8], ScaleDtype.F16)
    big = bq.quantize(x, scheme)
    for r in range(0, 4096, 64):
        part = bq.quantize(x[r:r + 64], scheme)
        np.testing.assert_array_equal(big.values[r:r + 64], part.values)
        np.testing.assert_array_equal(big.scales[r:r + 64], part.scales)


@pytest.mark.parametrize("shape, block", [((4104, 4090), 48), ((1_400_000, 12), 8),
                                          ((4104, 4090), 12), ((1100, 4096), 4),
                                          ((1_400_000, 3), 32)])
def test_large_partial_rows_equal_small_calls(threads, shape, block):
    """Tensors large enough for non-temporal stores whose rows end in a partial block (or hold
    one block and a part), or of short blocks back to back (blocks of 4, rows of 3 under blocks
    of 32): each row's runs streamed, or stored through the cache where a row mixes them,
    against the same rows quantized in small calls (cached stores throughout), and dequantized
    against numpy's product of the codes and their blocks' scales, into an aligned `out` and
    one 4 bytes off a 16-byte boundary."""
    rng = np.random.default_rng(sum(shape) + block)
    x = rng.standard_normal(shape).astype(np.float32)
    x[3, :block] = 0.0  # the zero rule
    scheme = QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([block], ScaleDtype.F16)
    big = bq.quantize(x, scheme)
    step = -(-shape[0] // 16)
    for r in range(0, shape[0], step):
        part = bq.quantize(x[r:r + step], scheme)
        np.testing.assert_array_equal(big.values[r:r + step], part.values)
        np.testing.assert_array_equal(big.scales[r:r + step], part.scales)
    scale_per_value = np.repeat(big.scales.astype(np.float32), block, axis=1)[:, :shape[1]]
    expected = big.values.astype(np.float32) * scale_per_value
    np.testing.assert_array_equal(big.dequantize().view(np.uint32), expected.view(np.uint32))
    out = np.full(shape, np.nan, np.float32)
    big.dequantize(out=out)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))
    off = np.full(out.size + 1, np.nan, np.float32)[1:].reshape(shape)
    big.dequantize(out=off)
    np.testing.assert_array_equal(off.view(np.uint32), expected.view(np.uint32))
