"""Property tests (hypothesis): the Rust core against ``blockquant.reference`` on random input.

Each example draws a valid scheme (all 9 values; Native, PackedU32(d), PackedNative(d) with
d < rank; the default per-tensor F32, per-tensor of any dtype, per-block 1-5-D of any dtype,
two-level F16/UE4M3 blocks under an F32 per-tensor scale), a shape of rank 0-5 with small dims
(0 and 1 included), an input dtype (float16/32/64, bfloat16, big-endian), a memory layout (C,
Fortran, transposed, strided, reversed, read-only), data (Gaussian at any scale, 1e±38,
subnormals, exact ties k+0.5 times a power of two, all-zero, constants, special values) and the
options (calibration, rounding, scale_rounding, explicit scales and/or per-tensor scale).

The profile lives in conftest.py: 300 examples per test by default, or
``BLOCKQUANT_HYPOTHESIS_EXAMPLES``. ``pytest --hypothesis-show-statistics`` prints how many ran
and the spread of the events below.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, example, given, note
from hypothesis import strategies as st

import blockquant as bq
import blockquant.reference as ref
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype

# Drawn schemes include per-tensor 2-bit ones under mse: bit-exact all the same, whatever the
# advice.
pytestmark = pytest.mark.filterwarnings("ignore:calibration 'mse' cannot help:RuntimeWarning")

ml_dtypes = pytest.importorskip("ml_dtypes")

F32_MAX = float(np.finfo(np.float32).max)
U = 2.0**-24  # unit roundoff of f32
SPECIALS = [
    0.0, -0.0, 1e38, -1e38, F32_MAX, -F32_MAX, 1e-38, -1e-38, 2.0**-149, -(2.0**-149),
    2.0**-126, 3e-39, 0.5, -0.5, 2.5, -1.5, 6.0, 7.0, 127.5, -128.5, 448.0, 464.0, 65504.0,
    65520.0, 57344.0, 61440.0, 1.0, -1.0,
]
INPUT_DTYPES = ["float32", "float16", "float64", "bfloat16", ">f4", ">f8", ">f2"]
MAX_DIM = {0: 1, 1: 300, 2: 40, 3: 12, 4: 7, 5: 4}  # at most 2401 elements
MAX_DIM_SMALL = {0: 1, 1: 64, 2: 16, 3: 6, 4: 4, 5: 3}  # at most 256 elements


def _dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


# -- strategies ----------------------------------------------------------------------------------


@st.composite
def shapes(draw, max_dim=MAX_DIM) -> tuple[int, ...]:
    # Rank 5 (small dims) is there for the 5-D blocks.
    rank = draw(st.integers(0, 5))
    small = st.integers(0, max_dim[rank])
    dims = draw(st.lists(st.one_of(st.sampled_from([0, 1, 2, 3]), small),
                         min_size=rank, max_size=rank))
    return tuple(dims)


@st.composite
def schemes(draw, rank: int) -> QuantScheme:
    r = max(rank, 1)  # a 0-d tensor is (1,)
    value = draw(st.sampled_from([v for v in QuantValue if not v.is_unsigned]))
    kind = draw(st.sampled_from(["native", "packed_u32", "packed_native"]))
    store = QuantStore.Native if kind == "native" else QuantStore(kind, draw(st.integers(0, r - 1)))
    s = QuantScheme(value, store)
    level = draw(st.sampled_from(["default", "tensor", "block", "two-level"]))
    block_sizes = st.one_of(st.integers(1, 9), st.sampled_from([16, 32, 64]))
    if level == "tensor":
        s = s.per_tensor(draw(st.sampled_from(list(ScaleDtype))))
    elif level in ("block", "two-level"):
        # Up to one dim more than the tensor has: both implementations must then refuse it
        # (SchemeError), unless the extra dim is a leading 1, which is dropped.
        nb = draw(st.integers(1, min(5, r + 1)))
        size = draw(st.lists(block_sizes, min_size=nb, max_size=nb))
        if level == "block":
            s = s.per_block(size, draw(st.sampled_from(list(ScaleDtype))))
        else:
            dtype = draw(st.sampled_from([ScaleDtype.F16, ScaleDtype.UE4M3]))
            s = s.per_block(size, dtype).per_tensor(ScaleDtype.F32)
    event(f"level={level}")
    event(f"value={value.value}")
    return s


@st.composite
def float32_data(draw, shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    style = draw(st.sampled_from(
        ["normal", "wide", "ties", "huge", "tiny", "zeros", "constant", "sparse"]))
    event(f"data={style}")
    k = draw(st.integers(-30, 30))
    with np.errstate(over="ignore", under="ignore"):
        if style == "normal":
            x = rng.standard_normal(n) * 2.0**k
        elif style == "wide":  # every magnitude from f32 subnormals to 1e38 in one tensor
            x = rng.standard_normal(n) * 10.0 ** rng.uniform(-45, 38.5, n)
        elif style == "ties":  # k + 0.5 times a power of two: exact ties under power-of-2 scales
            x = (rng.integers(-300, 300, n) + 0.5) * 2.0 ** rng.integers(k - 3, k + 3, n)
        elif style == "huge":
            x = rng.choice([-1, 1], n) * rng.uniform(0.5, 1.0, n) * F32_MAX
        elif style == "tiny":  # f32 subnormals and the smallest normals
            x = rng.integers(-(2**24), 2**24, n) * 2.0**-149
        elif style == "zeros":
            x = np.where(rng.random(n) < 0.5, -0.0, 0.0)
        elif style == "constant":
            x = np.full(n, draw(st.sampled_from(SPECIALS)))
        else:  # mostly zeros, a few values
            x = np.where(rng.random(n) < 0.9, 0.0, rng.standard_normal(n) * 2.0**k)
        x = np.clip(x, -F32_MAX, F32_MAX).astype(np.float32)
    if n:
        for i, v in draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(SPECIALS)),
                                  max_size=6)):
            x[i] = v
    return x.reshape(shape)


@st.composite
def arrays(draw, shape: tuple[int, ...], dtypes=INPUT_DTYPES) -> tuple[np.ndarray, np.ndarray]:
    """(x, the float32 C-order array the core should see): x in the drawn dtype and layout."""
    x32 = draw(float32_data(shape))
    name = draw(st.sampled_from(dtypes))
    event(f"dtype={name}")
    dt = _dtype(name)
    with np.errstate(over="ignore"):
        x = x32.astype(dt)
        if name in ("float64", ">f8") and draw(st.booleans()):
            # Bits below f32's precision: the conversion's round-to-nearest-even matters.
            noise = np.random.default_rng(x32.size).uniform(-(2.0**-25), 2.0**-25, shape)
            x = (x * (1 + noise)).astype(dt)
    layout = draw(st.sampled_from(["c", "fortran", "transpose", "strided", "reversed", "readonly"]))
    rank = len(shape)
    if rank == 0:
        layout = "c"
    event(f"layout={layout}")
    if layout == "fortran":
        view = np.asfortranarray(x)
    elif layout == "transpose":
        perm = draw(st.permutations(range(rank)))
        view = np.ascontiguousarray(x.transpose(perm)).transpose(np.argsort(perm))
    elif layout == "strided":
        step = draw(st.integers(2, 3))
        big = np.zeros(tuple(d * step for d in shape), dt)
        big[tuple(slice(None, None, step) for _ in shape)] = x
        view = big[tuple(slice(None, None, step) for _ in shape)]
    elif layout == "reversed":
        flip = tuple(slice(None, None, -1) for _ in shape)
        view = np.ascontiguousarray(x[flip])[flip]
    elif layout == "readonly":
        view = x.copy()
        view.flags.writeable = False
    else:
        view = x
    assert view.shape == x.shape and view.tobytes() == x.tobytes()
    with np.errstate(over="ignore"):
        return view, np.ascontiguousarray(view, dtype=np.float32).reshape(shape)


@st.composite
def options(draw, scheme: QuantScheme, shape: tuple[int, ...]) -> dict:
    kw = {
        "calibration": draw(st.sampled_from(["minmax", "absmean", "mse"])),
        "rounding": draw(st.sampled_from(["half_away", "half_even"])),
        "scale_rounding": draw(st.sampled_from(["up", "nearest"])),
    }
    explicit = draw(st.sampled_from(["no", "no", "scales", "global"]))
    if explicit == "global" and not scheme.is_two_level:
        explicit = "no"
    try:
        grid = ref.scale_grid_shape(shape, scheme)
    except bq.SchemeError:
        explicit = "no"
    event(f"explicit={explicit}")
    scale = st.one_of(
        st.integers(-30, 30).map(lambda k: 2.0**k),
        st.floats(0, 1e6, width=32),
        st.sampled_from([0.0, 2.0**-127, 448.0, 65504.0, 2.0**127]),
    )
    if explicit == "scales":
        n = math.prod(grid)
        kw["scales"] = np.array(draw(st.lists(scale, min_size=n, max_size=n)),
                                np.float32).reshape(grid)
    if explicit in ("scales", "global") and scheme.is_two_level:
        kw["global_scale"] = draw(scale)
    return kw


@st.composite
def cases(draw, dtypes=INPUT_DTYPES):
    shape = draw(shapes())
    scheme = draw(schemes(len(shape)))
    x, x32 = draw(arrays(shape, dtypes))
    kw = draw(options(scheme, shape))
    note(f"scheme={scheme!r} shape={shape} dtype={x.dtype} strides={x.strides} options={kw}")
    return scheme, x, x32, kw


# -- helpers -------------------------------------------------------------------------------------


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_same(want: ref.RefQTensor, got: bq.QTensor) -> None:
    assert got.shape == want.shape
    assert got.values.dtype == want.values.dtype and got.values.shape == want.values.shape
    np.testing.assert_array_equal(got.values, want.values)
    assert got.scales.shape == want.scales.shape
    np.testing.assert_array_equal(bits(got.scales), bits(want.scales))
    if want.global_scale is None:
        assert got.global_scale is None
    else:  # bit for bit, -0.0 included
        assert np.float32(got.global_scale).view(np.uint32) == np.float32(
            want.global_scale).view(np.uint32)
    assert got.to_bytes() == want.to_bytes()
    np.testing.assert_array_equal(bits(got.dequantize()), bits(want.dequantize()))


def quantize_both(scheme, x, kw):
    """(reference result, blockquant result), or (None, None) after checking both raised the
    same error class (and, for a non-finite input, named the same index)."""
    try:
        want = ref.quantize(x, scheme, **kw)
    except (bq.QuantError, TypeError) as e:
        event(f"error={type(e).__name__}")
        with pytest.raises(type(e)) as info:
            bq.quantize(x, scheme, **kw)
        assert type(info.value) is type(e), f"reference: {e!r}, blockquant: {info.value!r}"
        if isinstance(e, bq.NonFiniteError):
            index = str(e).split("flat index ")[1].split()[0]
            assert f"flat index {index}" in str(info.value)
        return None, None
    return want, bq.quantize(x, scheme, **kw)


# -- properties ----------------------------------------------------------------------------------


def _example(scheme: QuantScheme, x: np.ndarray, **kw) -> tuple:
    return (scheme, x, np.ascontiguousarray(x, dtype=np.float32), kw)


# Found by these properties, kept as explicit examples (they always run, first).
EXAMPLES = [
    # Packing along an outer axis when every inner dim is 1 (inner == 1 like a last-axis
    # packing): the one-pass kernel split the storage as if packed along the last axis and
    # panicked ("mid > len").
    _example(QuantScheme(QuantValue.Q8F, QuantStore.packed_u32(1)).per_block([1], ScaleDtype.F32),
             np.ones((2, 1), np.float32)),
    _example(QuantScheme(QuantValue.Q4S, QuantStore.packed_native(2)).per_block([3], ScaleDtype.F16),
             np.linspace(-1, 1, 7, dtype=np.float32).reshape(7, 1, 1)),
]


def with_examples(test):
    for ex in EXAMPLES:
        test = example(ex)(test)
    return test


@with_examples
@given(cases())
def test_rust_equals_reference(case):
    """Values, scales, per-tensor scale, to_bytes() and dequantized bits are identical; where
    the reference raises, blockquant raises the same class. Inputs are never modified."""
    scheme, x, _, kw = case
    before = x.tobytes()
    want, got = quantize_both(scheme, x, kw)
    assert x.tobytes() == before
    if want is None:
        return
    assert_same(want, got)


@with_examples
@given(cases())
def test_bytes_and_parts_round_trip(case):
    """from_bytes(to_bytes()) is the identity (in both implementations, on each other's bytes),
    and quantize's own output always passes from_parts' checks (valid codes, zero padding,
    representable scales)."""
    scheme, x, _, kw = case
    want, got = quantize_both(scheme, x, kw)
    if got is None:
        return
    data = got.to_bytes()
    assert len(data) == got.nbytes == want.nbytes
    back = bq.QTensor.from_bytes(data, scheme, got.shape)
    assert_same(want, back)
    assert_same(ref.from_bytes(data, scheme, got.shape), back)
    parts = bq.QTensor.from_parts(got.values, got.scales, scheme, got.shape,
                                  global_scale=got.global_scale)
    assert parts.to_bytes() == data
    np.testing.assert_array_equal(bits(parts.dequantize()), bits(got.dequantize()))


# format.md "Quantizing a value": E4M3 bias 7, E5M2 bias 15, E2M1 bias 1 → smallest normal exponent 1 - bias.
FLOAT_FORMAT = {QuantValue.E4M3: (3, -6), QuantValue.E5M2: (2, -14), QuantValue.E2M1: (1, 0)}


@given(cases(dtypes=["float32", "float64", "float16", "bfloat16"]))
def test_dequantize_error_is_within_the_schemes_bound(case):
    """|x - dequantize(quantize(x))| stays within the scheme's bound, per element.

    Checked where the bound is well defined: calibrated minmax scales rounded ``up`` (explicit
    scales, ``nearest`` and ``absmean`` may clip on purpose), on the elements of blocks whose raw
    scale s_raw = max|x| / ((qmax - qmin) / 2) and effective scale e are normal f32 numbers
    (subnormal scales lose relative precision; UE8M0's stand-in for 0 is 2^-127) and where e
    did not saturate at the dtype's largest value (e >= s_raw up to f32 rounding: F16, BF16,
    UE4M3 and UE8M0 scales saturate for huge inputs). Two-level: g normal too. There:

    - int values: |x - x̂| <= e/2 + 8u·hr·e + u·|x̂| (u = 2^-24, hr = (qmax - qmin)/2). Half a
      step, plus the f32 roundings of s_raw, b × g, x / e (which can push a value past the .5
      boundary or Q*F's block max half a step past qmax) and q × e.
    - float values: |x - x̂| <= e · (half an ulp of the format at |x/e|, the subnormal step
      below its smallest normal) + 4u·max·e (saturation after f32 rounding) + 2u·(|x| + |x̂|).
    """
    scheme, x, x32, kw = case
    kw = {"rounding": kw["rounding"], "calibration": "minmax", "scale_rounding": "up"}
    want, got = quantize_both(scheme, x, kw)
    if got is None:
        return
    shape1 = x32.shape if x32.ndim else (1,)
    x1 = x32.reshape(shape1).astype(np.float64)
    xh = got.dequantize().reshape(shape1).astype(np.float64)
    s_raw = ref._scales_per_element(ref._raw_scales(x32.reshape(shape1), scheme, "minmax"),
                                    shape1, scheme).astype(np.float64)
    e = ref._scales_per_element(ref._effective_scales(got.scales, got.global_scale),
                                shape1, scheme).astype(np.float64)
    tiny = 2.0**-126
    ok = (e >= tiny) & (s_raw >= tiny) & (e >= s_raw * (1 - 4 * U))
    if got.global_scale is not None:
        ok &= got.global_scale >= tiny
    event(f"bound checked on {'all' if ok.all() else 'some' if ok.any() else 'no'} elements")
    if not ok.any():
        return
    err = np.abs(x1 - xh)
    hr = (scheme.value.qmax - scheme.value.qmin) / 2
    if scheme.value.is_float:
        mbits, emin = FLOAT_FORMAT[scheme.value]
        v = np.abs(x1) / np.where(ok, e, 1.0) * (1 + 4 * U)
        exp = np.maximum(np.floor(np.log2(np.maximum(v, 2.0**-300))), emin)
        half_ulp = 2.0 ** (exp - mbits - 1)
        bound = e * (half_ulp + 4 * U * scheme.value.qmax) + 2 * U * (np.abs(x1) + np.abs(xh))
    else:
        bound = e * (0.5 + 8 * U * hr) + U * np.abs(xh)
    bad = ok & ~(err <= bound)
    assert not bad.any(), (
        f"first at {np.argwhere(bad)[0]}: x={x1[bad][0]!r} x̂={xh[bad][0]!r} e={e[bad][0]!r} "
        f"err={err[bad][0]!r} bound={bound[bad][0]!r}"
    )


@st.composite
def byte_cases(draw):
    shape = draw(shapes(MAX_DIM_SMALL))
    scheme = draw(schemes(len(shape)))
    try:
        n = ref.quantize(np.zeros(shape, np.float32), scheme).nbytes
    except bq.SchemeError:
        n = draw(st.integers(0, 64))
    delta = draw(st.sampled_from([0, 0, 0, -1, 1]))
    data = draw(st.binary(min_size=max(n + delta, 0), max_size=max(n + delta, 0)))
    event(f"length {'exact' if delta == 0 else 'off by one'}")
    return scheme, shape, data


# Found by the fuzz target (tests/fuzz/crashes/crash-41f076a0...): a stored scale of -0 (a
# valid code: it decodes to -0.0 >= 0) came back from to_bytes() as +0.
_NEG_ZERO = {ScaleDtype.F32: b"\0\0\0\x80", ScaleDtype.F16: b"\0\x80",
             ScaleDtype.BF16: b"\0\x80", ScaleDtype.UE4M3: b"\x80"}
BYTE_EXAMPLES = [
    (QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([8], dtype), (8,), bytes(8) + code)
    for dtype, code in _NEG_ZERO.items()
] + [
    (QuantScheme(QuantValue.Q8F, QuantStore.Native).per_tensor(ScaleDtype.UE4M3), (), b"\0\x80"),
    (bq.presets.nvfp4(), (16,), bytes(8) + b"\x80" + b"\0\0\0\x80"),
]


def with_byte_examples(test):
    for ex in BYTE_EXAMPLES:
        test = example(ex)(test)
    return test


@with_byte_examples
@given(byte_cases())
def test_from_bytes_on_arbitrary_bytes_agrees_with_the_reference(case):
    """Any bytes: both implementations reject them with the same class (a wrong length, a
    corrupt scale, a scheme that does not fit) or both accept them with identical parts, the
    same bytes back, and the same dequantized floats (NaN where a code is NaN)."""
    scheme, shape, data = case
    try:
        want = ref.from_bytes(data, scheme, shape)
    except bq.QuantError as e:
        event(f"error={type(e).__name__}")
        with pytest.raises(type(e)) as info:
            bq.QTensor.from_bytes(data, scheme, shape)
        assert type(info.value) is type(e)
        return
    got = bq.QTensor.from_bytes(data, scheme, shape)
    assert got.to_bytes() == data
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(bits(got.scales), bits(want.scales))
    assert got.global_scale == want.global_scale  # from_bytes rejects a NaN one
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(got.dequantize(), want.dequantize())
