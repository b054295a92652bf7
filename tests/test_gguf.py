"""blockquant.gguf against gguf-py (PyPI ``gguf``), the oracle: ``quantize`` must return exactly
``gguf.quants.quantize``'s array (dtype, shape, bytes) and ``dequantize`` exactly
``gguf.quants.dequantize``'s, bit for bit, NaN payloads included.

The data sets aim at the places where block formats disagree: exact ties of every rounding step,
zeros of both signs, subnormals (where 1/d overflows), values near float32's and float16's
limits, and MXFP4 blocks whose amax sits where a float32 log2 rounds up to the next power of two.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blockquant as bq
from blockquant import gguf as bg

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import quants as gq  # noqa: E402

# The types this gguf-py has (MXFP4 came in a later release than the others).
BLOCK_TYPES = [t for t in ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "TQ1_0", "TQ2_0"]
               if t in GT.__members__]
FLOAT_TYPES = ["F32", "F16", "BF16"]
ALL_TYPES = BLOCK_TYPES + FLOAT_TYPES
F32_MAX = np.finfo(np.float32).max


def bs(name: str) -> int:
    return bg.TYPES[name].block_size


def oracle_quantize(x: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's "invalid value encountered in cast"
        return gq.quantize(x, GT[name])


def oracle_dequantize(b: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gq.dequantize(b, GT[name])


def assert_identical(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.dtype == want.dtype, what
    assert got.shape == want.shape, what
    g, w = np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8)
    if not np.array_equal(g, w):
        rows = np.flatnonzero((g != w).reshape(-1, g.shape[-1]).any(axis=-1))
        raise AssertionError(f"{what}: {len(rows)} rows differ, first {rows[:5]}")


def ggml_zero_scales(x: np.ndarray, q: np.ndarray, name: str) -> np.ndarray:
    """gguf-py's blocks with ggml's scale for all-zero Q4_0/Q5_0 blocks: ggml starts the signed
    maximum at +0.0f, so d = -0 (0x8000) whatever the zeros' signs, where gguf-py's argmax takes
    a first -0 and stores +0. ggml is the arbiter of its format's bytes; elsewhere they agree."""
    if name not in ("Q4_0", "Q5_0"):
        return q
    blocks = q.copy().reshape(-1, bg.TYPES[name].type_size)
    zero = ~np.asarray(x, np.float32).reshape(len(blocks), -1).any(axis=-1)
    blocks[zero, :2] = np.frombuffer(np.float16(-0.0).tobytes(), np.uint8)
    return blocks.reshape(q.shape)


def check(x: np.ndarray, name: str) -> None:
    """Quantize like gguf-py (ggml where they differ), and dequantize those blocks like gguf-py."""
    want = ggml_zero_scales(x, oracle_quantize(x, name), name)
    got = bg.quantize(x, name)
    assert_identical(got, want, f"quantize {name} {x.shape}")
    assert_identical(bg.dequantize(got, name), oracle_dequantize(want, name), f"dequantize {name}")


def blocks_of(rows: list[np.ndarray], name: str) -> np.ndarray:
    """Rows of values, each cut or tiled to whole blocks of ``name``, as one 2-D float32 array."""
    n = max(bs(name), 256)
    return np.stack([np.resize(np.asarray(r, np.float32), n) for r in rows])


# --- data ---------------------------------------------------------------------------------------

RNG = np.random.default_rng(20260111)


def random_rows(n: int, width: int) -> np.ndarray:
    """Gaussian, uniform and heavy-tailed rows over 80 orders of magnitude."""
    scale = 10.0 ** RNG.uniform(-40, 38, size=(n, 1))
    kind = RNG.integers(0, 3, size=(n, 1))
    g = RNG.standard_normal((n, width))
    u = RNG.uniform(-1, 1, (n, width))
    t = RNG.standard_t(2, (n, width))
    with np.errstate(over="ignore"):
        x = (np.where(kind == 0, g, np.where(kind == 1, u, t)) * scale).astype(np.float32)
    return np.where(np.isfinite(x), x, np.float32(1e38) * np.sign(x)).astype(np.float32)


def tie_rows(name: str) -> list[np.ndarray]:
    """Blocks whose scale comes out a power of two s and whose other values sit exactly on the
    rounding boundaries of ``name`` (half-steps of its code grid), in every position."""
    n = bs(name)
    rows = []
    for e in (-20, -3, 0, 5, 40):
        s = 2.0**e
        if name == "Q8_0":
            # amax = 127 s: d = s, x/d = k + 1/2.
            fixed, ties = [127.0], np.arange(-253, 254, 2) / 2
        elif name in ("Q4_0", "Q5_0"):
            # max = -8 s (-16 s): d = s, x/d + 8.5 an integer.
            top = 8.0 if name == "Q4_0" else 16.0
            fixed, ties = [-top], np.arange(-2 * top + 1, 2 * top, 2) / 2
        elif name in ("Q4_1", "Q5_1"):
            # min = -3 s, max - min = 15 s (31 s): d = s, (x - min)/d + 0.5 an integer.
            steps = 15.0 if name == "Q4_1" else 31.0
            fixed, ties = [-3.0, steps - 3.0], np.arange(1, 2 * steps, 2) / 2 - 3.0
        elif name == "MXFP4":
            # amax = 6 s: the OCP scale is s; |x|/s at each midpoint between E2M1 values.
            mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
            fixed, ties = [6.0], np.concatenate([mids, -mids])
        else:  # TQ1_0, TQ2_0: amax = s, x/s = ±1/2.
            fixed, ties = [1.0], np.array([0.5, -0.5])
        for sign in (1.0, -1.0):
            r = np.concatenate([fixed, RNG.choice(ties, n - len(fixed))]) * s * sign
            rows.append(r.astype(np.float32))
            rows.append(RNG.permutation(r).astype(np.float32))
    return rows


def zero_rows() -> list[np.ndarray]:
    z, nz = np.float32(0.0), np.float32(-0.0)
    rows = [np.full(32, z), np.full(32, nz)]
    for _ in range(60):
        signs = RNG.random(32) < 0.5
        r = np.where(signs, nz, z).astype(np.float32)
        rows.append(r)
        # A zero minimum or maximum among positive (or negative) values.
        pos = np.where(RNG.random(32) < 0.5, r, RNG.uniform(0.1, 1, 32).astype(np.float32))
        rows.append(pos)
        rows.append(-pos)
    one = np.zeros(32, np.float32)
    one[7] = 3.0
    rows += [one, -one]
    return rows


def subnormal_rows() -> list[np.ndarray]:
    """Subnormals and the smallest normals, where d underflows or 1/d overflows."""
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    rows = []
    for mag in [tiny, tiny * 3, tiny * 64, tiny * 1000, np.float32(1e-40), np.float32(1e-39)]:
        rows.append((RNG.uniform(-1, 1, 256) * mag).astype(np.float32))
        rows.append(np.where(RNG.random(256) < 0.3, 0, mag).astype(np.float32))
    for e in range(-130, -110, 2):
        rows.append((RNG.uniform(-1, 1, 256) * np.float32(2.0**e)).astype(np.float32))
    r = np.zeros(256, np.float32)
    r[3] = tiny
    rows += [r, -r]
    return rows


def huge_rows() -> list[np.ndarray]:
    """Near float32's maximum (ranges that overflow), and float16's (scales that overflow)."""
    rows = [np.full(256, F32_MAX), np.full(256, -F32_MAX)]
    for mag in [F32_MAX, np.float32(3e38), np.float32(1e38), np.float32(1e30), np.float32(65504.0),
                np.float32(65520.0 * 127), np.float32(8e6)]:
        rows.append((RNG.uniform(-1, 1, 256) * mag).astype(np.float32))
        rows.append(np.where(RNG.random(256) < 0.5, -mag, mag).astype(np.float32))
    r = np.zeros(256, np.float32)
    r[0], r[1] = F32_MAX, -F32_MAX  # max - min = inf
    rows.append(r)
    return rows


def log2_round_up_amaxes() -> np.ndarray:
    """Every float32 below a power of two whose float32 log2 rounds up to it (the top 2^12 floats
    of each binade hold them all), as numpy computes it."""
    tops = []
    for k in range(-149, 128):
        hi = np.float32(2.0 ** (k + 1)).view(np.uint32) if k < 127 else np.uint32(0x7F800000)
        lo = np.float32(2.0**k).view(np.uint32)
        start = max(int(lo), int(hi) - 4096)
        tops.append(np.arange(start, int(hi), dtype=np.uint32))
    a = np.concatenate(tops).view(np.float32)
    exact = np.floor(np.log2(a.astype(np.float64)))
    with np.errstate(divide="ignore"):
        return a[np.floor(np.log2(a)) > exact]


# --- quantize / dequantize against gguf-py ---------------------------------------------------------


@pytest.mark.parametrize("name", ALL_TYPES)
def test_random_data(name):
    check(random_rows(64, 1024), name)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_exact_ties(name):
    check(blocks_of(tie_rows(name), name), name)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_zeros_of_both_signs(name):
    check(blocks_of(zero_rows(), name), name)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_subnormals_and_tiny_normals(name):
    check(blocks_of(subnormal_rows(), name), name)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_huge_values(name):
    check(blocks_of(huge_rows(), name), name)


@pytest.mark.skipif("MXFP4" not in BLOCK_TYPES, reason="this gguf-py has no MXFP4")
def test_mxfp4_scale_where_log2_rounds_up():
    amax = log2_round_up_amaxes()
    assert 5000 < len(amax) < 10000  # 7456 with numpy's float32 log2
    x = RNG.uniform(-1, 1, (len(amax), 32)).astype(np.float32) * amax[:, None]
    x[np.arange(len(amax)), RNG.integers(0, 32, len(amax))] = amax * RNG.choice([-1, 1], len(amax))
    check(x, "MXFP4")
    # ... and the same amaxes in every other type.
    for name in BLOCK_TYPES:
        check(np.resize(x, (len(amax) // 8, 256)), name)


@pytest.mark.parametrize("name", ALL_TYPES)
@pytest.mark.parametrize(
    "shape", [(1,), (3,), (2, 2), (1, 5), (3, 2, 2), (2, 1, 3, 1)], ids=lambda s: "x".join(map(str, s))
)
def test_every_shape(name, shape):
    # The last axis counts blocks.
    full = (*shape[:-1], shape[-1] * bs(name))
    check(RNG.standard_normal(full).astype(np.float32), name)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_dequantize_any_bytes(name):
    """Random bytes (NaN and infinite scales among them) decode as gguf-py decodes them: every
    bit of every non-NaN value, and NaN where gguf-py gives NaN. Which NaN payload numpy's
    arithmetic propagates depends on its version's SIMD loops (operand order; numpy 2.2 and 2.4
    differ on Q4_1/Q5_1's d·q + m), so payloads are not part of the contract."""
    t = bg.TYPES[name]
    raw = RNG.integers(0, 256, (300, 4 * t.type_size), dtype=np.uint8)
    if name == "F32":
        raw = raw.view(np.float32)  # gguf-py views F32 bytes; F16 it casts
    if name == "F16":
        raw = raw.view(np.float16)
    want = oracle_dequantize(raw, name)
    got = bg.dequantize(raw, name)
    assert got.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    assert nan.any() or name in ("TQ1_0", "TQ2_0", "MXFP4", "BF16"), "no NaN scale was drawn"
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("dtype", ["float16", "float64", "bfloat16"])
@pytest.mark.parametrize("name", ["Q8_0", "Q4_1", "MXFP4", "TQ2_0", "F16", "BF16", "F32"])
def test_other_input_dtypes(name, dtype):
    """gguf-py casts its input to float32 (float64 straight to float16 for F16)."""
    if dtype == "bfloat16":
        dt = pytest.importorskip("ml_dtypes").bfloat16
    else:
        dt = np.dtype(dtype)
    x = (random_rows(8, 256) * 1e-30).clip(-6e4, 6e4)
    # float64 values between float16 neighbours, to catch a double rounding through float32.
    x = x.astype(np.float64) * (1 + 2.0**-12) if dtype == "float64" else x
    x = x.astype(dt)
    assert_identical(bg.quantize(x, name), oracle_quantize(x, name), f"{name} from {dtype}")


def test_threads_do_not_change_bytes():
    x = random_rows(256, 4096)
    try:
        for name in BLOCK_TYPES:
            bq.set_num_threads(1)
            one = bg.quantize(x, name)
            d1 = bg.dequantize(one, name)
            bq.set_num_threads(2)
            assert np.array_equal(bg.quantize(x, name), one)
            assert np.array_equal(bg.dequantize(one, name).view(np.uint32), d1.view(np.uint32))
    finally:
        bq.set_num_threads(0)


# --- the API around the kernels ------------------------------------------------------------------


def test_types_and_names():
    assert set(ALL_TYPES) <= set(bg.TYPES)
    for name, t in bg.TYPES.items():
        if name not in ALL_TYPES:
            continue
        assert t.id == int(GT[name])
        assert (t.block_size, t.type_size) == gguf.GGML_QUANT_SIZES[GT[name]]
        assert bg.ggml_type(name.lower()) is t
        assert bg.ggml_type(GT[name]) is t
        assert bg.ggml_type(int(GT[name])) is t
    assert bg.byte_shape((3, 64), "q4_0") == (3, 36)
    assert bg.value_shape((3, 36), "Q4_0") == (3, 64)
    with pytest.raises(bq.SchemeError, match="IQ2_XXS"):
        bg.ggml_type("IQ2_XXS")
    with pytest.raises(bq.SchemeError):
        bg.ggml_type(GT.IQ3_S)
    with pytest.raises(TypeError):
        bg.ggml_type(True)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_rows_that_are_not_whole_blocks(name):
    n = bs(name) + 16
    with pytest.raises(bq.LayoutError, match=f"{n} values"):
        bg.quantize(np.ones((2, n), np.float32), name)
    with pytest.raises(gq.QuantError):  # gguf-py refuses it too
        oracle_quantize(np.ones((2, n), np.float32), name)
    with pytest.raises(bq.LayoutError, match="bytes"):
        bg.dequantize(np.zeros((2, bg.TYPES[name].type_size + 1), np.uint8), name)
    with pytest.raises(bq.LayoutError, match="0-d"):
        bg.quantize(np.float32(1.0), name)
    with pytest.raises(bq.LayoutError, match="0-d"):
        bg.dequantize(np.uint8(1), name)


@pytest.mark.parametrize("name", ALL_TYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input(name, bad):
    x = np.ones((3, 256), np.float32)
    x[2, 100] = bad
    with pytest.raises(bq.NonFiniteError, match="index 612"):
        bg.quantize(x, name)


def test_float64_beyond_float32_is_non_finite():
    with pytest.raises(bq.NonFiniteError):
        bg.quantize(np.full(32, 1e300), "Q8_0")
    with pytest.raises(bq.NonFiniteError):
        bg.quantize(np.full(32, 1e300), "F16")


def test_input_must_be_floats():
    with pytest.raises(TypeError):
        bg.quantize(np.ones(32, np.int32), "Q8_0")
    with pytest.raises(TypeError):
        bg.dequantize(np.array([None] * 34), "Q8_0")


def test_empty_arrays():
    for name in ALL_TYPES:
        q = bg.quantize(np.zeros((0, bs(name)), np.float32), name)
        assert q.shape[0] == 0
        assert bg.dequantize(q, name).shape == (0, bs(name))


def test_non_contiguous_arrays_are_read_in_order():
    x = random_rows(8, 512)[:, ::2]
    assert_identical(bg.quantize(x, "Q4_0"), oracle_quantize(np.ascontiguousarray(x), "Q4_0"))
    q = bg.quantize(random_rows(8, 512), "Q8_0")
    every_other_row = np.repeat(q, 2, axis=0)[::2]
    assert not every_other_row.flags.c_contiguous
    assert_identical(bg.dequantize(every_other_row, "Q8_0"), oracle_dequantize(q, "Q8_0"))


def test_dequantize_into_out():
    x = random_rows(4, 256)
    q = bg.quantize(x, "Q5_1")
    out = np.full(x.shape, np.nan, np.float32)
    assert bg.dequantize(q, "Q5_1", out=out) is out
    np.testing.assert_array_equal(out, oracle_dequantize(q, "Q5_1"))
    with pytest.raises(TypeError, match="float32"):
        bg.dequantize(q, "Q5_1", out=np.zeros(x.shape, np.float64))
    with pytest.raises(bq.LayoutError, match="shape"):
        bg.dequantize(q, "Q5_1", out=np.zeros((4, 255), np.float32))
    # One rule with bq.quantize's out=: the wrong type or dtype is a TypeError, an array of
    # the right dtype that cannot be written (layout, read-only, in use) a ValueError.
    with pytest.raises(ValueError, match="contiguous"):
        bg.dequantize(q, "Q5_1", out=np.zeros((4, 512), np.float32)[:, ::2])
    ro = np.zeros(x.shape, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        bg.dequantize(q, "Q5_1", out=ro)
    with pytest.raises(TypeError, match="numpy array"):
        bg.dequantize(q, "Q5_1", out=[0.0] * 1024)


@pytest.mark.parametrize("name", ["Q4_0", "F16", "F32", "BF16"])
def test_quantize_into_out(name):
    x = random_rows(4, 256)
    want = oracle_quantize(x, name)
    out = np.full(want.shape, 7, want.dtype)
    assert bg.quantize(x, name, out=out) is out
    assert_identical(out, want, name)
    with pytest.raises(TypeError):
        bg.quantize(x, name, out=np.zeros(want.shape, np.int16))
    with pytest.raises(bq.LayoutError, match="shape"):
        bg.quantize(x, name, out=np.zeros((4, want.shape[1] + 2), want.dtype))
    with pytest.raises(ValueError, match="contiguous"):  # the right dtype: a ValueError
        bg.quantize(x, name, out=np.zeros((4, 2 * want.shape[1]), want.dtype)[:, ::2])


def test_quantize_out_overlapping_its_input_is_refused():
    buf = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="shares memory with this call's input"):
        bg.quantize(buf, "F32", out=buf)


def test_quantize_bits_refuses_an_unknown_kind_or_dtype_with_typed_errors():
    bits = np.zeros(32, np.uint16)
    with pytest.raises(bq.QuantError, match="kind is 'f16' or 'bf16', got 'f32'"):
        bg.quantize_bits(bits, "f32", "Q8_0")
    with pytest.raises(TypeError, match="uint16"):
        bg.quantize_bits(bits.astype(np.int16), "f16", "Q8_0")
    assert bg.quantize_bits(bits, "bf16", "Q8_0").tobytes() == bg.quantize(
        np.zeros(32, np.float32), "Q8_0").tobytes()
