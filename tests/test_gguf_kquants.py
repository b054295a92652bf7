"""blockquant.gguf's K-quants (Q2_K..Q6_K), IQ4_NL, IQ4_XS and NVFP4 against gguf-py.

gguf-py dequantizes these types but has no quantizer for them, so the oracle is its
``dequantize``: on random bytes and on blockquant's own output it must return exactly
blockquant's floats. The quantizers are blockquant's own searches, checked against a numpy model
of each format built from gguf-py's decoding alone: the values a sub-block can take are
``d_eff * g - m_eff`` over its codes g, with d_eff and m_eff read back through gguf-py from the
block with its codes replaced; every value must have been given its nearest one, and on Gaussian
data the SQNR must stay near what the searches reach.
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

TYPES = [t for t in ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "NVFP4"]
         if t in GT.__members__]
RNG = np.random.default_rng(20261130)
F32_MAX = np.finfo(np.float32).max
IQ4 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
               np.float32)
FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)

# --- a numpy model of each format: where its codes are, which code values mean what -----------


def code_bytes(name: str, q: int) -> list[tuple[int, int, int]]:
    """The byte ranges (start, stop) holding a block's codes, and the byte value filling them so
    that every code of the block is ``q`` (q = 0 or 1: the decoded value is then -m_eff or
    d_eff - m_eff; for the codebook types, the code whose value is 1)."""
    if name == "Q2_K":
        return [(16, 80, 0x55 * q)]
    if name == "Q3_K":  # high bit set: q = low 2 bits
        return [(0, 32, 0xFF), (32, 96, 0x55 * q)]
    if name == "Q4_K":
        return [(16, 144, 0x11 * q)]
    if name == "Q5_K":  # fifth bits clear
        return [(16, 48, 0), (48, 176, 0x11 * q)]
    if name == "Q6_K":  # u = 32 + q: high crumbs 2, low nibbles q
        return [(0, 128, 0x11 * q), (128, 192, 0xAA)]
    if name == "IQ4_NL":  # code 8 is the value 1
        return [(2, 18, 0x88)]
    if name == "IQ4_XS":
        return [(8, 136, 0x88)]
    if name == "NVFP4":  # code 1 is the value 1 (doubled E2M1)
        return [(4, 36, 0x11)]
    raise AssertionError(name)


#: (values per sub-block, the codes' values, the byte range of a minimum's scale to zero).
FORMATS = {
    "Q2_K": (16, np.arange(4, dtype=np.float32), slice(82, 84)),
    "Q3_K": (16, np.arange(-4, 4, dtype=np.float32), None),
    "Q4_K": (32, np.arange(16, dtype=np.float32), slice(2, 4)),
    "Q5_K": (32, np.arange(32, dtype=np.float32), slice(2, 4)),
    "Q6_K": (16, np.arange(-32, 32, dtype=np.float32), None),
    "IQ4_NL": (32, IQ4, None),
    "IQ4_XS": (32, IQ4, None),
    "NVFP4": (16, FP4, None),
}


def with_codes(blocks: np.ndarray, name: str, q: int) -> np.ndarray:
    b = blocks.copy()
    for start, stop, value in code_bytes(name, q):
        b[:, start:stop] = value
    return b


def oracle_dequantize(b: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(gq.dequantize(b, GT[name]), np.float32)


def sub_scales(blocks: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Each sub-block's (d_eff, m_eff), read through gguf-py: the values of the block with every
    code 1 and its minimum's scale zeroed (d_eff exactly), and with every code 0 (-m_eff)."""
    sub, _, dmin = FORMATS[name]
    b = blocks.reshape(-1, bg.TYPES[name].type_size)
    one = with_codes(b, name, 1)
    if dmin is not None:
        one[:, dmin] = 0
    d = oracle_dequantize(one, name).reshape(-1, sub)[:, 0]
    if dmin is None:
        return d, np.zeros_like(d)
    m = -oracle_dequantize(with_codes(b, name, 0), name).reshape(-1, sub)[:, 0]
    return d, m


def assert_nearest(x: np.ndarray, blocks: np.ndarray, name: str) -> None:
    """Every value got the code nearest it at its sub-block's decoded scales."""
    sub, grid, _ = FORMATS[name]
    d, m = sub_scales(blocks, name)
    with np.errstate(over="ignore", invalid="ignore"):
        values = d[:, None] * grid[None, :] - m[:, None]  # the decoder's f32 arithmetic
    xs = x.reshape(-1, sub).astype(np.float64)
    got = bg.dequantize(blocks, name).reshape(-1, sub).astype(np.float64)
    best = np.abs(xs[:, :, None] - values.astype(np.float64)[:, None, :]).min(axis=-1)
    err = np.abs(xs - got)
    step = np.abs(d.astype(np.float64))[:, None] * (24 if name.startswith("IQ4") else 1)
    bad = err > best + 1e-6 * step + 1e-300
    assert not bad.any(), f"{name}: {bad.sum()} values not at their nearest code"


def check(x: np.ndarray, name: str) -> np.ndarray:
    """Quantize; gguf-py decodes the bytes as blockquant does; the codes are nearest."""
    b = bg.quantize(x, name)
    assert b.dtype == np.uint8 and b.shape == bg.byte_shape(x.shape, name)
    ours = bg.dequantize(b, name)
    np.testing.assert_array_equal(ours.view(np.uint32), oracle_dequantize(b, name).view(np.uint32))
    assert np.isfinite(ours).all()
    assert_nearest(x, b, name)
    return ours


def sqnr(x: np.ndarray, y: np.ndarray) -> float:
    x64 = x.astype(np.float64)
    return float(10 * np.log10(np.sum(x64**2) / np.sum((x64 - y) ** 2)))


def rows_of(rows: list[np.ndarray], name: str) -> np.ndarray:
    n = max(bg.TYPES[name].block_size, 256)
    return np.stack([np.resize(np.asarray(r, np.float32), n) for r in rows])


# --- dequantize: gguf-py's floats ------------------------------------------------------------------


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_any_bytes(name):
    t = bg.TYPES[name]
    raw = RNG.integers(0, 256, (300, 2 * t.type_size), dtype=np.uint8)
    want = oracle_dequantize(raw, name)
    got = bg.dequantize(raw, name)
    assert got.shape == want.shape == (300, 2 * t.block_size)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# --- quantize: valid bytes, nearest codes, good scales ---------------------------------------------


# SQNR (dB) on Gaussian rows, about 0.7 dB under what the searches reach (measured: Q2_K 11.6,
# Q3_K 16.9, Q4_K 23.0, Q5_K 29.3, Q6_K 35.5, IQ4_NL 22.6, IQ4_XS 22.6, NVFP4 21.8); the
# format's plain max-to-end choice is about 1-2 dB under them.
GAUSSIAN_FLOOR = {"Q2_K": 10.9, "Q3_K": 16.2, "Q4_K": 22.3, "Q5_K": 28.6, "Q6_K": 35.0,
                  "IQ4_NL": 21.9, "IQ4_XS": 21.9, "NVFP4": 21.1}


@pytest.mark.parametrize("name", TYPES)
def test_random_data(name):
    x = (RNG.standard_normal((64, 1024)) * 10.0 ** RNG.uniform(-3, 3, (64, 1))).astype(np.float32)
    y = check(x, name)
    assert sqnr(x, y) > GAUSSIAN_FLOOR[name]
    # Heavy tails and uniform rows too.
    check(RNG.standard_t(2, (16, 1024)).astype(np.float32), name)
    check(RNG.uniform(-1, 1, (16, 1024)).astype(np.float32), name)


@pytest.mark.parametrize("name", TYPES)
def test_ties_and_constant_rows(name):
    """Values on every half-step of a power-of-two grid, constant rows, one value per row."""
    rows = []
    for e in (-20, 0, 7):
        s = np.float32(2.0**e)
        rows.append((RNG.integers(-64, 64, 256) / 2 * s).astype(np.float32))
        rows.append(np.full(256, s))
        rows.append(np.full(256, -s))
        one = np.zeros(256, np.float32)
        one[RNG.integers(256)] = -3 * s
        rows.append(one)
    check(rows_of(rows, name), name)


@pytest.mark.parametrize("name", TYPES)
def test_zeros_of_both_signs(name):
    z = np.where(RNG.random((8, 256)) < 0.5, np.float32(-0.0), np.float32(0.0))
    y = check(z.astype(np.float32), name)
    assert (y == 0).all()
    # Zero sub-blocks next to non-zero ones.
    x = RNG.standard_normal((8, 256)).astype(np.float32)
    x[:, :64] = 0
    y = check(x, name)
    assert (y[:, :64] == 0).all()


@pytest.mark.parametrize("name", TYPES)
def test_subnormals_and_tiny_values(name):
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    rows = [(RNG.uniform(-1, 1, 256) * mag).astype(np.float32)
            for mag in (tiny, tiny * 1000, np.float32(1e-39), np.float32(1e-30), np.float32(1e-8))]
    check(rows_of(rows, name), name)


@pytest.mark.parametrize("name", TYPES)
def test_huge_values(name):
    """Scales beyond float16 are stored as its largest value: finite output, nearest codes."""
    rows = [np.full(256, F32_MAX), np.full(256, -F32_MAX)]
    for mag in (F32_MAX, np.float32(1e30), np.float32(65504.0 * 127), np.float32(1e6)):
        rows.append((RNG.uniform(-1, 1, 256) * mag).astype(np.float32))
    r = np.zeros(256, np.float32)
    r[0], r[1] = F32_MAX, -F32_MAX
    rows.append(r)
    check(rows_of(rows, name), name)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("shape", [(1,), (3,), (2, 1, 2)], ids=lambda s: "x".join(map(str, s)))
def test_shapes(name, shape):
    full = (*shape[:-1], shape[-1] * bg.TYPES[name].block_size)
    x = RNG.standard_normal(full).astype(np.float32)
    check(x, name)
    # Each row is independent: a row quantizes the same alone.
    flat = x.reshape(-1, full[-1])
    np.testing.assert_array_equal(bg.quantize(flat[-1:], name).reshape(-1),
                                  bg.quantize(x, name).reshape(flat.shape[0], -1)[-1])


@pytest.mark.parametrize("name", TYPES)
def test_other_input_dtypes(name):
    x = RNG.standard_normal((4, 256)).astype(np.float16)
    assert np.array_equal(bg.quantize(x, name), bg.quantize(x.astype(np.float32), name))
    x64 = RNG.standard_normal((4, 256))
    assert np.array_equal(bg.quantize(x64, name), bg.quantize(x64.astype(np.float32), name))


def test_threads_do_not_change_bytes():
    x = RNG.standard_normal((128, 2048)).astype(np.float32)
    try:
        for name in TYPES:
            bq.set_num_threads(1)
            one = bg.quantize(x, name)
            bq.set_num_threads(2)
            assert np.array_equal(bg.quantize(x, name), one), name
    finally:
        bq.set_num_threads(0)


# --- the API ----------------------------------------------------------------------------------------


def test_types_and_sizes():
    for name in TYPES:
        t = bg.TYPES[name]
        assert t.id == int(GT[name])
        assert (t.block_size, t.type_size) == gguf.GGML_QUANT_SIZES[GT[name]]
        assert bg.ggml_type(name.lower()) is t


@pytest.mark.parametrize("name", TYPES)
def test_bad_input(name):
    bsz = bg.TYPES[name].block_size
    with pytest.raises(bq.LayoutError, match=f"{bsz + 16} values"):
        bg.quantize(np.ones((2, bsz + 16), np.float32), name)
    with pytest.raises(bq.LayoutError, match="bytes"):
        bg.dequantize(np.zeros((2, bg.TYPES[name].type_size + 1), np.uint8), name)
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones((3, 256), np.float32)
        x[2, 100] = bad
        with pytest.raises(bq.NonFiniteError, match="index 612"):
            bg.quantize(x, name)
    out = np.full(bg.byte_shape((2, 256), name), 7, np.uint8)
    with pytest.raises(bq.NonFiniteError):
        bg.quantize(np.full((2, 256), np.nan, np.float32), name, out=out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bg.quantize(np.zeros((0, 256), np.float32), name).shape[0] == 0
