"""Bad input gives a typed error at once, and nothing is written (format.md "Errors").

One table, ``CASES``: every failure a caller can cause, through every public entry point
(``quantize``, ``QTensor.from_bytes``, ``QTensor.from_parts``, ``dequantize``, ``round_scale``
and the scheme builders). For each row the test checks:

- the exception's class is exactly the one in the row (not merely a subclass: a
  ``MissingGlobalScaleError`` where a plain ``ScaleError`` is due is a bug), and its message
  matches the row's pattern when there is one;
- where ``blockquant.reference`` has the same entry point, the reference raises the same class
  for the same input (the two implementations agree on failures, not only on results);
- every array a case hands in (inputs, values, scales) is unchanged afterwards, bit for bit and
  in its writeable flag: a failing call writes nothing. ``quantize`` only ever returns fresh
  arrays; ``from_parts`` is the entry point that receives arrays to keep.

Then: random bytes fed to ``from_bytes`` (never a crash, same verdict as the reference), the
error classes' hierarchy, and panics surfacing as ``InternalError`` through every entry point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pytest

import blockquant as bq
import blockquant.reference as ref
from blockquant import QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype

ml_dtypes = pytest.importorskip("ml_dtypes")

V, S, D = QuantValue, QuantStore, ScaleDtype

# -- schemes -------------------------------------------------------------------------------------

INT8 = bq.presets.int8()  # per-tensor F32: grid (1,)
INT8B = bq.presets.int8_block32()  # block [32] F16: grid (3, 2) on X
NVFP4 = bq.presets.nvfp4()  # two-level, PackedNative(0): grid (3, 3) on X
MXFP8 = bq.presets.mxfp8()  # block [32] UE8M0 (no zero)
SPEC9 = QuantScheme(V.Q8F, S.Native).per_block([4], D.UE4M3).per_tensor(D.F32)
SPEC9_BYTES = bytes.fromhex("00 19 33 4c 66 7f 80 ff 30 20 00 00 40 40")
LOOKUP = QuantScheme(V.Q4F, S.Native).per_tensor(D.F32).with_codebook(bq.codebooks.NF4)
Q2N = QuantScheme(V.Q2F, S.Native).per_tensor(D.F32)
LOOKUP_PN = LOOKUP.with_store(S.packed_native(0))  # Q4 one a byte: a high nibble is padding
Q2U32 = QuantScheme(V.Q2S, S.packed_u32(0)).per_tensor(D.F32)
Q4PN = QuantScheme(V.Q4S, S.packed_native(0)).per_tensor(D.F32)  # (3,): a padding nibble
E4M3N = QuantScheme(V.E4M3, S.Native).per_tensor(D.F32)
E5M2N = QuantScheme(V.E5M2, S.Native).per_tensor(D.F32)
E2M1N = QuantScheme(V.E2M1, S.Native).per_tensor(D.F32)
BLOCK_2X4 = QuantScheme().per_block([2, 4], D.F32)

# -- inputs: every array a case hands in is registered, and checked unchanged after the case ----

WATCHED: list[np.ndarray] = []


def watch(a: np.ndarray) -> np.ndarray:
    WATCHED.append(a)
    return a


_rng = np.random.default_rng(20240605)
X = watch(_rng.standard_normal((3, 40)).astype(np.float32))
X64 = watch(np.ones(64, np.float32))
X32 = watch(np.ones(32, np.float32))
X8 = watch(np.ones(8, np.float32))
X_RO = np.ones((2, 3), np.float32)
X_RO.flags.writeable = False
watch(X_RO)

FIRST, MIDDLE, LAST = 0, 57, X.size - 1


def with_bad(where: int, bad: float, dtype: Any = np.float32, base: np.ndarray = X) -> np.ndarray:
    x = base.astype(dtype)
    x.flat[where] = bad
    return watch(x)


def _parts(scheme: QuantScheme, x: np.ndarray = X):
    qt = bq.quantize(x, scheme)
    return qt, watch(qt.values.copy()), watch(qt.scales.copy())


QT_INT8B, V_INT8B, S_INT8B = _parts(INT8B)
QT_NVFP4, V_NVFP4, S_NVFP4 = _parts(NVFP4)
QT_Q2, V_Q2, S_Q2 = _parts(Q2U32)
QT_Q4, V_Q4, S_Q4 = _parts(Q4PN, X[0, :3].copy())
QT_E4M3, V_E4M3, S_E4M3 = _parts(E4M3N)
_, V_MXFP8, S_MXFP8 = _parts(MXFP8)
ONE = watch(np.ones(1, np.float32))


def replaced(a: np.ndarray, index: Any, code: int) -> np.ndarray:
    """A copy of storage ``a`` with one word set to ``code`` (the low bits of the storage dtype:
    -128 and 0x80 are the same int8)."""
    b = a.copy()
    b.view(f"u{a.dtype.itemsize}")[index] = code % (1 << (8 * a.dtype.itemsize))
    return watch(b)


def filled(shape: tuple[int, ...], code: int, dtype: Any) -> np.ndarray:
    return watch(np.full(shape, code, dtype=dtype))


def scales_with(a: np.ndarray, index: Any, value: float) -> np.ndarray:
    b = a.copy()
    b[index] = value
    return watch(b)


# -- the table -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[], Any]
    exc: type
    match: Optional[str] = None
    # The same input through blockquant.reference (None where it has no such entry point).
    ref: Optional[Callable[[], Any]] = None


def _scheme(s: Any) -> Callable[[], QuantScheme]:
    """A scheme, or a zero-argument builder of one (building may itself be the error)."""
    return s if callable(s) else (lambda: s)


def quant(id: str, x: Any, scheme: Any, exc: type, match: Optional[str] = None, **kw: Any) -> Case:
    sch = _scheme(scheme)
    return Case(
        "quantize-" + id,
        lambda: bq.quantize(x, sch(), **kw),
        exc,
        match,
        lambda: ref.quantize(x, sch(), **kw),
    )


def from_bytes(id: str, data: Any, scheme: Any, shape: Any, exc: type, match: Optional[str] = None):
    sch = _scheme(scheme)
    return Case(
        "from_bytes-" + id,
        lambda: bq.QTensor.from_bytes(data, sch(), shape),
        exc,
        match,
        lambda: ref.from_bytes(data, sch(), shape),
    )


def from_parts(
    id: str,
    values: Any,
    scales: Any,
    scheme: Any,
    shape: Any,
    exc: type,
    match: Optional[str] = None,
    g: Any = None,
) -> Case:
    sch = _scheme(scheme)
    return Case(
        "from_parts-" + id,
        lambda: bq.QTensor.from_parts(values, scales, sch(), shape, global_scale=g),
        exc,
        match,
    )


def other(id: str, call: Callable[[], Any], exc: type, match: Optional[str] = None, ref=None):
    return Case(id, call, exc, match, ref)


def _re(scheme: QuantScheme) -> str:
    return re.escape(repr(scheme))


NF = bq.NonFiniteError


def _non_finite_cases() -> list[Case]:
    """NaN and ±inf at the first, a middle and the last index, through every scale path."""
    cases = []
    paths = [
        ("block", INT8B, {}),
        ("tensor", INT8, {}),
        ("two-level", NVFP4, {}),
        ("explicit", INT8B, {"scales": np.ones((3, 2))}),
    ]
    for bad, name in [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")]:
        for where, wname in [(FIRST, "first"), (MIDDLE, "middle"), (LAST, "last")]:
            x = with_bad(where, bad)
            for pname, scheme, kw in paths:
                cases.append(
                    quant(
                        f"{name}-{wname}-{pname}",
                        x,
                        scheme,
                        NF,
                        rf"^non-finite value {name} at flat index {where}$",
                        **kw,
                    )
                )
    # The first offending index wins, whatever comes after it.
    two = with_bad(100, np.inf, base=with_bad(MIDDLE, np.nan))
    cases.append(quant("first-of-two", two, INT8B, NF, r"value nan at flat index 57$"))
    # Other input dtypes: the index is the element's, the value the float32 it became.
    cases += [
        # A finite float64 too large for f32 is named as given, as the reference names it.
        quant("f64-overflows-f32", with_bad(MIDDLE, 1e39, np.float64), INT8B, NF,
              r"^non-finite value inf at flat index 57 \(1e\+39 overflows float32\)$"),
        quant("f64-overflows-f32-negative", with_bad(LAST, -3.5e38, np.float64), INT8, NF,
              rf"^non-finite value -inf at flat index {LAST} \(-3\.5e\+38 overflows float32\)$"),
        quant("f64-overflows-f32-mse", with_bad(FIRST, 1.2345678901234567e300, np.float64),
              NVFP4, NF, r"^non-finite value inf at flat index 0 "
              r"\(1\.2345678901234567e\+300 overflows float32\)$", calibration="mse"),
        quant("f64-nan", with_bad(MIDDLE, np.nan, np.float64), INT8B, NF,
              r"^non-finite value nan at flat index 57$"),
        quant("f16-inf", with_bad(LAST, np.inf, np.float16), INT8B, NF, f"index {LAST}$"),
        quant("bf16-nan", with_bad(FIRST, np.nan, ml_dtypes.bfloat16), NVFP4, NF, "index 0$"),
        quant("big-endian-nan", with_bad(MIDDLE, np.nan, ">f8"), INT8, NF, "index 57$"),
        quant("0-d-nan", watch(np.array(np.nan, np.float32)), INT8, NF, "index 0$"),
        # A strided view: the index is in the view's own C order. base[1, 5] is view[5, 1].
        quant("transposed-view", with_bad(1 * 40 + 5, np.nan).T, INT8B.per_block([4], D.F16),
              NF, "index 16$"),
    ]
    return cases


CASES: list[Case] = _non_finite_cases() + [
    # -- non-float inputs: TypeError ------------------------------------------------------------
    *[
        quant(f"dtype-{np.dtype(dt).name}", watch(np.ones(4, dtype=dt)), INT8B, TypeError)
        for dt in [np.int8, np.int32, np.int64, np.uint8, np.bool_, np.complex64,
                   np.complex128, object, np.longdouble, ml_dtypes.float8_e4m3fn, "U3"]
    ],
    quant("list-of-ints", [1, 2, 3], INT8B, TypeError),
    quant("string", "1.0", INT8B, TypeError),
    quant("none", None, INT8B, TypeError),
    quant("ragged-list", [[1.0], [1.0, 2.0]], INT8B, TypeError),
    # -- arguments of the wrong type or value ----------------------------------------------------
    # A preset name or scheme text is a scheme; an unknown one is a SchemeError.
    quant("scheme-an-unknown-name", X, lambda: "int9", bq.SchemeError, "unknown scheme"),
    quant("scheme-a-bad-text", X, lambda: "q9s/native/tensor", bq.SchemeError, "unknown value"),
    quant("scheme-an-int", X, lambda: 8, TypeError),
    quant("scheme-a-preset-function", X, lambda: bq.presets.int8, TypeError),
    quant("rounding-unknown", X, INT8B, bq.QuantError, "rounding", rounding="banker"),
    quant("rounding-not-a-string", X, INT8B, TypeError, rounding=1),
    quant("calibration-unknown", X, INT8B, bq.QuantError, "calibration", calibration="least_squares"),
    quant("scale-rounding-unknown", X, INT8B, bq.QuantError, scale_rounding="down"),
    # -- scheme rules (SchemeError when built) ---------------------------------------------------
    quant("block-size-0", X, lambda: QuantScheme().per_block([0], D.F32), bq.SchemeError,
          "positive"),
    quant("block-size-negative", X, lambda: QuantScheme().per_block([4, -1], D.F32),
          bq.SchemeError, "positive"),
    quant("block-no-dims", X, lambda: QuantScheme().per_block([], D.F32), bq.SchemeError,
          "1 to 5 dimensions"),
    quant("block-6-dims", X, lambda: QuantScheme().per_block([2] * 6, D.F32), bq.SchemeError,
          "1 to 5 dimensions"),
    quant("block-float-size", X, lambda: QuantScheme().per_block([2.0], D.F32), TypeError),
    quant("block-dtype-a-string", X, lambda: QuantScheme().per_block([2], "F16"), TypeError),
    quant("packing-dim-negative", X, lambda: QuantScheme().with_store(S.packed_u32(-1)),
          bq.SchemeError),
    quant("packing-dim-not-int", X, lambda: QuantScheme().with_store(S.packed_u32(1.0)),
          TypeError),
    quant("native-with-a-dim", X, lambda: QuantScheme().with_store(S("native", 1)),
          bq.SchemeError),
    *[
        quant(f"two-level-global-{g}", X32,
              lambda g=g: QuantScheme().per_block([16], D.F16).per_tensor(g), bq.SchemeError,
              "stores its per-tensor scale as f32")
        for g in (D.F16, D.BF16, D.UE8M0, D.UE4M3)
    ],
    *[
        quant(f"two-level-block-{b}", X32,
              lambda b=b: QuantScheme().per_block([16], b).per_tensor(D.F32), bq.SchemeError,
              "F16 or UE4M3")
        for b in (D.F32, D.BF16, D.UE8M0)
    ],
    # -- scheme/tensor mismatch (SchemeError at quantize time) ------------------------------------
    quant("block-deeper-than-tensor", X8, BLOCK_2X4, bq.SchemeError, "more than the tensor"),
    quant("block-5-dims-on-4-d", watch(np.ones((2, 2, 2, 2), np.float32)),
          QuantScheme().per_block([2, 1, 1, 1, 2], D.F32), bq.SchemeError),
    quant("block-2-dims-on-0-d", watch(np.array(1.0, np.float32)), BLOCK_2X4, bq.SchemeError),
    quant("packing-dim-equals-rank", X8, QuantScheme().with_store(S.packed_u32(1)),
          bq.SchemeError, "packing dim 1"),
    quant("packing-dim-past-rank", X, QuantScheme().with_store(S.packed_native(5)),
          bq.SchemeError, "packing dim 5"),
    quant("packing-dim-1-on-0-d", watch(np.array(1.0, np.float32)),
          QuantScheme().with_store(S.packed_native(1)), bq.SchemeError),
    # -- explicit scales -------------------------------------------------------------------------
    quant("scales-count", X64, INT8B, bq.ScaleError, "grid shape", scales=np.ones(3)),
    quant("scales-shape", X64, INT8B, bq.ScaleError, "grid shape", scales=np.ones((2, 1))),
    quant("scales-shape-2-d", X, INT8B, bq.ScaleError, "grid shape", scales=np.ones((2, 3))),
    quant("scales-empty", X64, INT8B, bq.ScaleError, scales=[]),
    quant("scales-two-for-per-tensor", X64, INT8, bq.ScaleError, scales=[1.0, 2.0]),
    quant("scales-negative", X64, INT8B, bq.ScaleError, "finite and >= 0", scales=[1.0, -1.0]),
    quant("scales-nan", X64, INT8B, bq.ScaleError, "finite and >= 0", scales=[1.0, np.nan]),
    quant("scales-inf", X64, INT8B, bq.ScaleError, "finite and >= 0", scales=[np.inf, 1.0]),
    quant("scales--inf", X64, INT8, bq.ScaleError, scales=-np.inf),
    quant("scales-past-f32", X64, INT8B, bq.ScaleError, scales=[1e39, 1.0]),
    quant("scales-complex", X64, INT8B, TypeError, scales=np.ones(2, np.complex64)),
    quant("scales-bool", X64, INT8B, TypeError, scales=[True, True]),
    quant("scales-strings", X64, INT8B, TypeError, scales=["1", "2"]),
    quant("scales-object", X64, INT8B, TypeError, scales=object()),
    # -- per-tensor scale presence ----------------------------------------------------------------
    quant("global-on-one-level-block", X32, INT8B, bq.UnexpectedGlobalScaleError,
          rf"^a per-tensor scale should come with a two-level scheme, got {_re(INT8B)}$",
          global_scale=2.0),
    quant("global-on-one-level-tensor", X32, INT8, bq.UnexpectedGlobalScaleError,
          global_scale=2.0),
    quant("global-on-one-level-with-scales", X64, INT8B, bq.UnexpectedGlobalScaleError,
          scales=[1.0, 1.0], global_scale=2.0),
    quant("two-level-scales-without-global", X32, NVFP4, bq.MissingGlobalScaleError,
          rf"^{_re(NVFP4)} requires a per-tensor scale$", scales=np.ones(2)),
    quant("global-negative", X32, NVFP4, bq.ScaleError, global_scale=-1.0),
    quant("global-nan", X32, NVFP4, bq.ScaleError, global_scale=np.nan),
    quant("global-inf", X32, NVFP4, bq.ScaleError, global_scale=np.inf),
    quant("global-past-f32", X32, NVFP4, bq.ScaleError, global_scale=1e39),
    quant("global-a-string", X32, NVFP4, TypeError, global_scale="2"),
    quant("global-bool", X32, NVFP4, TypeError, global_scale=True),
    quant("global-complex", X32, NVFP4, TypeError, global_scale=2j),
    quant("global-two-values", X32, NVFP4, TypeError, global_scale=np.array([1.0, 2.0])),
    # One real number, as the reference takes it: not a list or array of one, not an int past
    # 64 bits (an object to numpy; past 1e308, float() raised OverflowError).
    quant("global-a-list-of-one", X32, NVFP4, TypeError, "one real number", global_scale=[2.0]),
    quant("global-an-array-of-one", X32, NVFP4, TypeError, global_scale=np.array([[2.0]])),
    quant("global-int-past-64-bits", X32, NVFP4, TypeError, global_scale=2**200),
    quant("global-int-past-float64", X32, NVFP4, TypeError, global_scale=10**400),
    # Several faults in one call: the one the reference checks first names the error (option
    # names, the input's dtype, the options against the scheme, the shape, whether g belongs,
    # g's value, the weights, the scales).
    quant("order-option-name-before-dtype", np.ones(64, np.int32), INT8B, bq.QuantError,
          calibration="bogus"),
    quant("order-option-name-before-scales", X64, INT8B, bq.QuantError, calibration="bogus",
          scales=np.ones(3)),
    quant("order-mx-before-scales", X64, INT8B, bq.SchemeError, scale_rounding="mx",
          scales=np.ones(3)),
    quant("order-lookup-rounding-before-scales", X64, "q4s/native/block32:f16/lookup:nf4",
          bq.SchemeError, rounding="half_even", scales=np.ones(3)),
    quant("order-unexpected-global-before-its-value", X64, INT8B, bq.UnexpectedGlobalScaleError,
          global_scale=-1.0),
    quant("order-unexpected-global-before-its-type", X64, INT8B, bq.UnexpectedGlobalScaleError,
          global_scale="x"),
    quant("order-missing-global-before-scale-values", X64, NVFP4, bq.MissingGlobalScaleError,
          scales=np.full(4, np.nan)),
    quant("order-weights-before-scales", X64, INT8B, bq.QuantError, weights=np.ones(64),
          scales=np.ones(3)),
    # A block scheme takes scales in its grid's shape, even a grid of one: (1,), not a scalar
    # (per-tensor schemes take one value in any shape).
    quant("scales-a-scalar-for-a-grid-of-one", X32, INT8B, bq.ScaleError, scales=0.01),
    quant("scales-a-numpy-scalar-for-a-grid-of-one", X32, INT8B, bq.ScaleError,
          scales=np.float32(0.01)),
    quant("scales-1x1-for-a-grid-of-one", X32, INT8B, bq.ScaleError, scales=[[0.01]]),
    quant("scales-all-masked", X32, INT8B, bq.ScaleError,
          scales=np.ma.array([np.nan], mask=[True], dtype=np.float32)),
    # A name with a lone surrogate is no option's name (not a UnicodeEncodeError).
    quant("calibration-a-lone-surrogate", X32, INT8, bq.QuantError, calibration="\ud800"),
    quant("rounding-a-lone-surrogate", X32, INT8, bq.QuantError, rounding="\udfff"),
    quant("scale-rounding-a-lone-surrogate", X32, INT8, bq.QuantError, scale_rounding="\ud800x"),
    # An empty half-precision shape whose float32 form numpy cannot hold: from_bytes' answer.
    quant("empty-float16-past-memory", np.empty((0, 2**61), np.float16), INT8, bq.LayoutError),
    quant("empty-bfloat16-past-memory", np.empty((0, 2**61), ml_dtypes.bfloat16), INT8B,
          bq.LayoutError),
    # -- Lookup mode: the codebook's rules, and what does not apply to it ------------------------
    quant("lookup-without-codebook", X8, lambda: QuantScheme().with_mode(QuantMode.Lookup),
          bq.SchemeError, "^Lookup mode needs a codebook"),
    quant("lookup-half-even", X8, LOOKUP, bq.SchemeError,
          "^rounding='half_even' does not apply to a Lookup scheme", rounding="half_even"),
    quant("lookup-8-bit", X8, lambda: QuantScheme().with_codebook(range(256)), bq.SchemeError,
          r"8-bit value \(Q8F\) is not implemented"),
    quant("lookup-float-value", X8, lambda: LOOKUP.with_value(V.E2M1), bq.SchemeError,
          "no float semantics"),
    quant("lookup-short", X8, lambda: LOOKUP.with_codebook([1, 2, 3]), bq.SchemeError,
          "^a Q4F codebook has 2\\^4 = 16 entries, got 3$"),
    quant("lookup-q2-long", X8, lambda: LOOKUP.with_value(V.Q2S), bq.SchemeError,
          "^a Q2S codebook has 2\\^2 = 4 entries, got 16$"),
    quant("lookup-nan", X8, lambda: Q2N.with_codebook([0, 1, 2, np.nan]),
          bq.SchemeError, "^codebook entries must be finite, entry 3 is nan$"),
    quant("lookup-overflow", X8, lambda: Q2N.with_codebook([0, 1, 2, 1e39]),
          bq.SchemeError, "^codebook entries must be finite, entry 3 is inf$"),
    quant("lookup-duplicate", X8, lambda: Q2N.with_codebook([0, 1, -0.0, 3]),
          bq.SchemeError, "^codebook entries must be distinct, entries 0 and 2"),
    quant("lookup-duplicate-after-f32", X8,
          lambda: Q2N.with_codebook([0, 1, 1 + 1e-12, 3]),
          bq.SchemeError, "distinct"),
    quant("lookup-codebook-a-string", X8, lambda: LOOKUP.with_codebook("0123"), TypeError),
    quant("lookup-codebook-2d", X8, lambda: LOOKUP.with_codebook(np.ones((4, 4))), TypeError),
    from_bytes("lookup-native-high-bits", bytes([0x10] + [0] * 7) + bytes(4), LOOKUP, (8,),
               bq.LayoutError),
    from_bytes("lookup-packed-native-high-nibble", bytes([0] * 7 + [0xF3]) + bytes(4), LOOKUP_PN,
               (8,), bq.LayoutError),
    from_parts("lookup-native-high-bits", filled((8,), 0x10, np.uint8), ONE, LOOKUP, (8,),
               bq.LayoutError),
    from_parts("lookup-int8-storage", filled((8,), 1, np.int8), ONE, LOOKUP, (8,),
               bq.LayoutError),
    # -- from_bytes: lengths, corrupt scales, argument types -------------------------------------
    from_bytes("one-short", SPEC9_BYTES[:-1], SPEC9, (8,), bq.LayoutError,
               r"expected 14 bytes .* got 13$"),
    from_bytes("one-long", SPEC9_BYTES + b"\0", SPEC9, (8,), bq.LayoutError,
               r"expected 14 bytes .* got 15$"),
    from_bytes("empty", b"", SPEC9, (8,), bq.LayoutError, r"expected 14 bytes .* got 0$"),
    from_bytes("random-length", bytes(_rng.integers(0, 256, 1000, dtype=np.uint8)), NVFP4,
               X.shape, bq.LayoutError, "got 1000$"),
    from_bytes("nan-ue4m3-scale", SPEC9_BYTES[:8] + b"\x7f" + SPEC9_BYTES[9:], SPEC9, (8,),
               bq.LayoutError, "corrupt scales"),
    from_bytes("nan-ue8m0-scale", bytes(32) + b"\xff", MXFP8, (32,), bq.LayoutError),
    from_bytes("negative-f16-scale", bytes(8) + b"\x00\xbc", QuantScheme(V.Q8S, S.Native)
               .per_block([8], D.F16), (8,), bq.LayoutError),
    from_bytes("negative-f32-scale", bytes(4) + np.float32(-1).tobytes(), QuantScheme(),
               (4,), bq.LayoutError),
    from_bytes("inf-global", SPEC9_BYTES[:10] + np.float32(np.inf).tobytes(), SPEC9, (8,),
               bq.LayoutError),
    from_bytes("nan-global", SPEC9_BYTES[:10] + np.float32(np.nan).tobytes(), SPEC9, (8,),
               bq.LayoutError),
    from_bytes("negative-global", SPEC9_BYTES[:10] + np.float32(-3).tobytes(), SPEC9, (8,),
               bq.LayoutError),
    from_bytes("data-a-string", "abc", INT8, (1,), TypeError),
    from_bytes("data-none", None, INT8, (1,), TypeError),
    from_bytes("scheme-an-unknown-name", SPEC9_BYTES, "int9", (8,), bq.SchemeError),
    from_bytes("scheme-an-int", SPEC9_BYTES, 8, (8,), TypeError),
    from_bytes("block-deeper-than-shape", bytes(8 + 4), BLOCK_2X4, (8,), bq.SchemeError),
    from_bytes("packing-dim-past-rank", bytes(8), QuantScheme().with_store(S.packed_u32(1)),
               (4,), bq.SchemeError),
    # -- shapes: negative, not ints, element counts that overflow ---------------------------------
    from_bytes("shape-negative", b"", INT8B, (-1,), bq.LayoutError),
    from_bytes("shape-float", b"", INT8B, (2.5,), TypeError),
    from_bytes("shape-string", b"", INT8B, "ab", TypeError),
    from_bytes("shape-an-int", b"", INT8B, 5, TypeError),
    from_bytes("shape-none", b"", INT8B, None, TypeError),
    from_bytes("shape-overflows-2-d", b"", INT8B, (2**40, 2**40), bq.LayoutError),
    from_bytes("shape-overflows-usize", b"", INT8B, (2**64,), bq.LayoutError),
    from_bytes("shape-overflows-isize", b"", INT8B, (2**62,), bq.LayoutError),
    # A zero dim makes the element count 0, but numpy still cannot hold such an array.
    from_bytes("shape-overflows-beside-0", bytes(4), QuantScheme().with_store(S.packed_u32(1)),
               (2**33 + 1, 0, 2**33 + 1), bq.LayoutError),
    from_bytes("shape-overflows-before-0", bytes(4), INT8, (2**62, 2**62, 0), bq.LayoutError),
    from_parts("shape-overflows", V_INT8B, S_INT8B, INT8B, (2**40, 2**40), bq.LayoutError),
    # -- from_parts: values --------------------------------------------------------------------
    from_parts("values-uint8-for-int8", V_INT8B.view(np.uint8), S_INT8B, INT8B, X.shape,
               bq.LayoutError, "stored as int8, got uint8"),
    from_parts("values-int16", watch(V_INT8B.astype(np.int16)), S_INT8B, INT8B, X.shape,
               bq.LayoutError, "stored as int8"),
    from_parts("values-float32", watch(V_INT8B.astype(np.float32)), S_INT8B, INT8B, X.shape,
               bq.LayoutError),
    from_parts("values-uint32-for-uint8", watch(V_NVFP4.astype(np.uint32)), S_NVFP4, NVFP4,
               X.shape, bq.LayoutError, "stored as uint8", g=1.0),
    from_parts("values-int64-for-uint32", watch(V_Q2.astype(np.int64)), S_Q2, Q2U32, X.shape,
               bq.LayoutError, "stored as uint32"),
    from_parts("values-1-d", V_INT8B.reshape(-1), S_INT8B, INT8B, X.shape, bq.LayoutError,
               "storage shape"),
    from_parts("values-short", V_INT8B[:, :-1], S_INT8B, INT8B, X.shape, bq.LayoutError,
               "storage shape"),
    from_parts("values-extra-dim", V_INT8B[None], S_INT8B, INT8B, X.shape, bq.LayoutError),
    from_parts("values-unpacked-for-packed", watch(np.zeros(X.shape, np.uint32)), S_Q2, Q2U32,
               X.shape, bq.LayoutError, "storage shape"),
    from_parts("values-a-list", V_INT8B.tolist(), S_INT8B, INT8B, X.shape, TypeError),
    from_parts("q8s-minus-128", replaced(V_INT8B, (1, 3), -128), S_INT8B, INT8B, X.shape,
               bq.LayoutError, "not a code of Q8S"),
    from_parts("q4s-minus-8", replaced(V_Q4, 0, 0x78), S_Q4, Q4PN, (3,), bq.LayoutError,
               "not a code of Q4S"),
    from_parts("q4-padding-bits", replaced(V_Q4, 1, int(V_Q4[1]) | 0xF0), S_Q4, Q4PN, (3,),
               bq.LayoutError, "padding"),
    from_parts("q2s-minus-2", replaced(V_Q2, (2, 1), 0xAAAAAAAA), S_Q2, Q2U32, X.shape,
               bq.LayoutError, "not a code of Q2S"),
    from_parts("e4m3-nan-code", replaced(V_E4M3, (0, 0), 0x7F), S_E4M3, E4M3N, X.shape,
               bq.LayoutError, "not a code of E4M3"),
    from_parts("e4m3-negative-nan-code", replaced(V_E4M3, (2, 39), 0xFF), S_E4M3, E4M3N,
               X.shape, bq.LayoutError),
    from_parts("e5m2-inf-code", filled(X.shape, 0x7C, np.uint8), ONE, E5M2N, X.shape,
               bq.LayoutError, "not a code of E5M2"),
    from_parts("e5m2-nan-code", filled(X.shape, 0xFD, np.uint8), ONE, E5M2N, X.shape,
               bq.LayoutError),
    from_parts("e2m1-native-high-nibble", filled(X.shape, 0x17, np.uint8), ONE, E2M1N, X.shape,
               bq.LayoutError, "not a code of E2M1"),
    # -- from_parts: scales ----------------------------------------------------------------------
    from_parts("scales-1-d", V_INT8B, S_INT8B.reshape(-1), INT8B, X.shape, bq.ScaleError,
               "grid shape"),
    from_parts("scales-count", V_INT8B, S_INT8B[:, :1], INT8B, X.shape, bq.ScaleError,
               "grid shape"),
    from_parts("scales-two-for-per-tensor", V_Q2, watch(np.ones(2, np.float32)), Q2U32,
               X.shape, bq.ScaleError),
    from_parts("scales-negative", V_INT8B, scales_with(S_INT8B, (0, 0), -0.5), INT8B, X.shape,
               bq.ScaleError, "finite and >= 0"),
    from_parts("scales-nan", V_INT8B, scales_with(S_INT8B, (2, 1), np.nan), INT8B, X.shape,
               bq.ScaleError, "index 5$"),
    from_parts("scales-inf", V_INT8B, scales_with(S_INT8B, (1, 0), np.inf), INT8B, X.shape,
               bq.ScaleError, "index 2$"),
    from_parts("scales-not-f16", V_INT8B, scales_with(S_INT8B, (2, 1), 0.1), INT8B, X.shape,
               bq.ScaleError, "index 5"),
    from_parts("scales-not-ue8m0", V_MXFP8, scales_with(S_MXFP8, (1, 1), 3.0), MXFP8, X.shape,
               bq.ScaleError, "index 3"),
    from_parts("scales-zero-ue8m0", V_MXFP8, scales_with(S_MXFP8, (0, 0), 0.0), MXFP8, X.shape,
               bq.ScaleError, "index 0"),
    from_parts("scales-past-ue4m3", V_NVFP4, scales_with(S_NVFP4, (0, 2), 480.0), NVFP4,
               X.shape, bq.ScaleError, "index 2", g=1.0),
    from_parts("scales-strings", V_INT8B, S_INT8B.astype(str), INT8B, X.shape, TypeError),
    from_parts("scales-complex", V_INT8B, S_INT8B.astype(np.complex64), INT8B, X.shape,
               TypeError),
    # -- from_parts: per-tensor scale ----------------------------------------------------------
    from_parts("global-on-one-level", V_INT8B, S_INT8B, INT8B, X.shape,
               bq.UnexpectedGlobalScaleError, rf"^{_re(INT8B)} does not take a per-tensor scale$",
               g=1.0),
    from_parts("no-global-on-two-level", V_NVFP4, S_NVFP4, NVFP4, X.shape,
               bq.MissingGlobalScaleError, rf"^{_re(NVFP4)} requires a per-tensor scale$"),
    from_parts("global-negative", V_NVFP4, S_NVFP4, NVFP4, X.shape, bq.ScaleError, g=-1.0),
    from_parts("global-nan", V_NVFP4, S_NVFP4, NVFP4, X.shape, bq.ScaleError, g=np.nan),
    from_parts("global-a-string", V_NVFP4, S_NVFP4, NVFP4, X.shape, TypeError, g="1"),
    # -- dequantize, round_scale, QTensor ----------------------------------------------------------
    other("dequantize-to-int32", lambda: QT_INT8B.dequantize(np.int32), TypeError,
          ref=lambda: ref.quantize(X, INT8B).dequantize(np.int32)),
    other("dequantize-not-a-qtensor", lambda: bq.dequantize(X), TypeError,
          ref=lambda: ref.dequantize(X)),
    other("qtensor-constructor", lambda: bq.QTensor(), TypeError),
    other("round_scale-negative", lambda: bq.round_scale([1.0, -1.0], D.F16), bq.ScaleError,
          "index 1", ref=lambda: ref.round_scale([1.0, -1.0], D.F16)),
    other("round_scale-nan", lambda: bq.round_scale([np.nan], D.UE8M0), bq.ScaleError,
          ref=lambda: ref.round_scale([np.nan], D.UE8M0)),
    other("round_scale-dtype-a-string", lambda: bq.round_scale([1.0], "F16"), TypeError,
          ref=lambda: ref.round_scale([1.0], "F16")),
    other("round_scale-mode-unknown", lambda: bq.round_scale([1.0], D.F16, mode="down"),
          bq.QuantError, ref=lambda: ref.round_scale([1.0], D.F16, mode="down")),
    other("round_scale-bool", lambda: bq.round_scale([True], D.F16), TypeError,
          ref=lambda: ref.round_scale([True], D.F16)),
    other("round_scale-mode-a-lone-surrogate", lambda: bq.round_scale([1.0], D.F16, mode="\ud800"),
          bq.QuantError, ref=lambda: ref.round_scale([1.0], D.F16, mode="\ud800")),
    # from_bytes takes any buffer but one of Python objects (its bytes are pointers) or one
    # numpy cannot export (bfloat16).
    from_bytes("an-array-of-objects", np.array([object(), object()], dtype=object), INT8, (4,),
               TypeError, "Python objects"),
    from_bytes("a-bfloat16-array", np.zeros(18, ml_dtypes.bfloat16), INT8, (32,), TypeError),
    from_bytes("a-string", "abcd" + "\0" * 4, INT8, (4,), TypeError),
    from_parts("global-int-past-float64", V_NVFP4, S_NVFP4, NVFP4, X.shape, TypeError, g=10**400),
]


def test_the_table_is_whole():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    for c in CASES:
        # format.md "Errors": a QuantError subclass, or TypeError for an argument of the wrong type.
        assert issubclass(c.exc, (bq.QuantError, TypeError))
    assert len(CASES) >= 150


def _snapshot() -> list[tuple[bytes, str, tuple, bool]]:
    return [(a.tobytes(), a.dtype.str, a.shape, a.flags.writeable) for a in WATCHED]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_raises_a_typed_error_and_writes_nothing(case: Case):
    before = _snapshot()
    with pytest.raises(Exception) as info:
        case.call()
    err = info.value
    assert type(err) is case.exc, f"{type(err).__name__}: {err}"
    if case.match is not None:
        assert re.search(case.match, str(err)), str(err)
    if case.ref is not None:
        with pytest.raises(Exception) as ref_info:
            case.ref()
        assert type(ref_info.value) is case.exc, f"reference: {ref_info.value!r}"
    after = _snapshot()
    for i, (b, a) in enumerate(zip(before, after)):
        assert b == a, f"case {case.id} changed watched array {i}"


def test_successful_calls_write_nothing_either():
    before = _snapshot()
    qt = bq.quantize(X, INT8B)
    again = bq.QTensor.from_parts(V_INT8B, S_INT8B, INT8B, X.shape)
    assert again.to_bytes() == qt.to_bytes()
    bq.QTensor.from_parts(V_NVFP4, S_NVFP4, NVFP4, X.shape, global_scale=QT_NVFP4.global_scale)
    bq.quantize(X_RO, NVFP4).dequantize()
    assert _snapshot() == before
    # from_parts keeps copies: the caller's arrays stay the caller's.
    assert not np.shares_memory(again.values, V_INT8B)
    assert not np.shares_memory(again.scales, S_INT8B)


# -- from_bytes on random bytes ------------------------------------------------------------------


@pytest.mark.parametrize(
    "scheme",
    [NVFP4, INT8B, MXFP8, bq.presets.bitnet(), SPEC9, E4M3N, Q4PN, LOOKUP, LOOKUP_PN,
     QuantScheme(V.Q2S).per_tensor(D.F32).with_codebook([3, -1, 0.5, 2])],
    ids=repr
)
def test_random_bytes_never_crash_and_agree_with_the_reference(scheme):
    """Bytes of the right length: either both implementations reject them (LayoutError: a NaN,
    infinite or negative scale, a code quantize cannot produce, non-zero padding) or both accept
    them, with the same parts and the same bytes back."""
    rng = np.random.default_rng(7)
    for shape in [(7,), (3, 33), (2, 0), ()]:
        try:
            n = ref.quantize(np.zeros(shape, np.float32), scheme).nbytes
        except bq.SchemeError:
            continue
        for _ in range(20):
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            try:
                want = ref.from_bytes(data, scheme, shape)
            except bq.LayoutError:
                with pytest.raises(bq.LayoutError):
                    bq.QTensor.from_bytes(data, scheme, shape)
                continue
            qt = bq.QTensor.from_bytes(data, scheme, shape)
            assert qt.to_bytes() == data
            np.testing.assert_array_equal(qt.values, want.values)
            np.testing.assert_array_equal(qt.scales.view(np.uint32), want.scales.view(np.uint32))
            assert qt.global_scale == want.global_scale
            # Odd codes (E4M3 NaN, E5M2 inf) dequantize to NaN/inf: compare as floats.
            np.testing.assert_array_equal(qt.dequantize(), want.dequantize())


# -- the exception classes -------------------------------------------------------------------


def test_error_hierarchy():
    for cls in (bq.SchemeError, bq.ScaleError, bq.LayoutError, bq.NonFiniteError,
                bq.UnsupportedSchemeError):
        assert issubclass(cls, bq.QuantError)
    assert issubclass(bq.QuantError, ValueError)
    assert issubclass(bq.MissingGlobalScaleError, bq.ScaleError)
    assert issubclass(bq.UnexpectedGlobalScaleError, bq.ScaleError)
    assert issubclass(bq.UnsupportedSchemeError, NotImplementedError)
    assert issubclass(bq.InternalError, RuntimeError)
    assert not issubclass(bq.InternalError, ValueError)


# -- panics never escape (format.md "Errors") --------------------------------------------------------------


def test_a_panic_in_the_pool_is_an_internal_error():
    with pytest.raises(bq.InternalError, match="deliberate panic") as info:
        bq._core._panic_for_tests()
    assert type(info.value) is bq.InternalError
    assert "PanicException" not in type(info.value).__mro__.__repr__()
    # The pool still works afterwards, and again.
    for _ in range(2):
        x = np.linspace(-1, 1, 100, dtype=np.float32)
        assert np.abs(bq.quantize(x, INT8B).dequantize() - x).max() < 0.01
        with pytest.raises(bq.InternalError):
            bq._core._panic_for_tests()


BINDING = Path(__file__).resolve().parents[1] / "rust" / "blockquant-py" / "src"


@pytest.mark.skipif(not BINDING.exists(), reason="needs the source tree")
def test_every_binding_entry_point_catches_panics():
    """Every #[pyfunction] runs its body inside `guarded(...)`, which turns a panic into
    InternalError; and every one of them is registered in the module (and nothing else is)."""
    src = "\n".join(p.read_text() for p in sorted(BINDING.glob("*.rs")))  # lib.rs, its modules
    fns = re.findall(r"#\[pyfunction\](?:\s*#\[[^\]]*\])*\s*fn\s+(\w+)[^{]*\{\s*(\S+)", src)
    names = {name for name, _ in fns}
    assert names >= {"quantize", "dequantize", "to_bytes", "from_bytes", "check_parts"}
    unguarded = [name for name, first in fns if not first.startswith("guarded(")]
    assert not unguarded, f"entry points without a panic guard: {unguarded}"
    public = {n for n in dir(bq._core) if not n.startswith("__")}
    assert public == names | {"Scheme", "Layout", "ValueInfo", "ScaleInfo", "GgmlType"}  # pyclasses


def test_the_core_rejects_shapes_numpy_cannot_hold():
    """Found by this suite: the core accepted shapes whose non-zero dims overflow when another
    dim is 0, and numpy then refused the storage array (an InternalError). The binding checks
    shapes itself, behind the Python layer's own check."""
    for scheme, shape in [
        (QuantScheme().with_store(S.packed_u32(1)), [2**33 + 1, 0, 2**33 + 1]),
        (INT8, [0, 2**62, 2**62]),
        (INT8B, [2**64 - 1]),
    ]:
        with pytest.raises(bq.LayoutError):
            bq._core.from_bytes(bytes(4), scheme._handle, shape)
        with pytest.raises(bq.LayoutError):
            scheme._handle.layout(shape)


def test_given_scales_past_float32_are_refused_from_the_rounding_midpoint_on():
    """A finite float64 scale is refused exactly when float32 would round it to inf (numpy's
    cast is the oracle): f32's largest value and the float64 just below the midpoint past it
    round to that largest value and are taken; the midpoint (a tie, to even: inf) and beyond
    are a ScaleError, and nothing is quantized."""
    f32max = float(np.finfo(np.float32).max)
    mid = f32max + 2.0**103
    x = np.ones((1, 32), np.float32)
    with np.errstate(over="ignore"):
        cast = np.array([f32max, np.nextafter(mid, 0), mid, 1e300]).astype(np.float32)
    assert np.isfinite(cast[:2]).all() and np.isinf(cast[2:]).all()
    for v in (f32max, np.nextafter(mid, 0)):
        qt = bq.quantize(x, "int8", scales=[v])
        assert qt.scales[0] == np.float32(f32max)
        assert qt.scales.dtype == np.float32
    for v in (mid, np.nextafter(mid, np.inf), 1e300):
        with pytest.raises(bq.ScaleError, match="fit in float32"):
            bq.quantize(x, "int8", scales=[v])


@pytest.mark.parametrize("v", [0.03, 0.0, -0.0, 3, 0, 1e-45, 1e-300, -1.0, -3, float("nan"),
                               float("inf"), -float("inf"), 1e300, 3.4028234663852886e38,
                               3.4028235677973366e38, 2**127, 2**128, 10**40, 10**400, True])
@pytest.mark.parametrize("form", ["scalar", "list", "tuple"])
def test_a_python_number_as_scales_checks_as_the_same_value_in_an_array(v, form):
    """A per-tensor scale given as a Python number (alone, or in a one-element list or tuple)
    takes a fast path in the binding's Python layer: it gives the same scales, or the same error
    type and message, as the same number in a numpy array (the general path). Bools and ints
    past uint64 (object arrays in numpy) are refused as before."""
    given = {"scalar": v, "list": [v], "tuple": (v,)}[form]

    def outcome(scales):
        try:
            qt = bq.quantize(np.ones((1, 32), np.float32), "int8", scales=scales)
        except Exception as e:  # noqa: BLE001 - the outcome compared is the error itself
            return type(e), str(e)
        return qt.scales.dtype, qt.scales.tobytes(), qt.values.tobytes()

    try:
        as_array = np.array(given)
    except OverflowError:  # 10**400 fits no numpy number: an object array
        as_array = np.array(given, dtype=object)
    assert outcome(given) == outcome(as_array)
    if isinstance(v, bool) or (isinstance(v, int) and v >= 2**64):
        assert outcome(given)[0] is TypeError


def test_from_bytes_takes_any_buffer_of_plain_data_as_the_reference_does():
    """bytes, bytearray, memoryview (strided too), a uint8 or float32 array, array.array and
    mmap: each read as its bytes in C order, the same tensor in the core and the reference."""
    import array
    import mmap

    qt = bq.quantize(X, INT8B)
    blob = qt.to_bytes()
    padded = np.frombuffer(blob, np.uint8).repeat(2)  # every byte twice: a strided view
    with mmap.mmap(-1, len(blob)) as m:
        m.write(blob)
        for data in [blob, bytearray(blob), memoryview(blob), memoryview(padded)[::2],
                     np.frombuffer(blob, np.uint8), array.array("B", blob), m]:
            got = bq.QTensor.from_bytes(data, INT8B, X.shape)
            want = ref.from_bytes(data, INT8B, X.shape)
            assert got.to_bytes() == blob and ref.to_bytes(want) == blob, type(data)
    # 12 int8 codes and a float32 scale are 16 bytes: four float32 numbers' worth.
    small = bq.quantize(np.linspace(-1, 1, 12, dtype=np.float32), INT8).to_bytes()
    f32 = np.frombuffer(small, np.float32)
    assert bq.QTensor.from_bytes(f32, INT8, (12,)).to_bytes() == small
    assert ref.to_bytes(ref.from_bytes(f32, INT8, (12,))) == small


@pytest.mark.parametrize("block, shape", [
    ([2**64 - 1], (3, 4)),
    ([2**63], (3, 4)),
    ([2**62, 2**62], (3, 4)),
    ([2**32 + 1, 3], (3, 4)),
    ([32], (0, 2**40)),
    ([4, 2**40], (2**40, 0)),
])
def test_blocks_longer_than_their_axes_and_huge_empty_shapes_agree_with_the_reference(block, shape):
    """A block longer than its axis covers the axis: the reference pads no tensor to it (nor
    lists an empty grid's index arrays), and gives the core's scales and bytes."""
    scheme = QuantScheme().per_block(block, D.F16)
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    got, want = bq.quantize(x, scheme), ref.quantize(x, scheme)
    assert got.scales.shape == want.scales.shape
    assert got.to_bytes() == ref.to_bytes(want)
    assert np.array_equal(got.dequantize(), ref.dequantize(want))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, "bfloat16"])
def test_unaligned_input_is_read_as_any_other(dtype):
    """An array at an odd offset into a buffer (gguf-py's view of a file whose tensor offset is
    not aligned) quantizes as its aligned copy does: format.md "Presets" takes any array numpy makes."""
    dt = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(dt)
    buf = np.zeros(x.nbytes + 1, np.uint8)
    view = np.ndarray(x.shape, dt, buffer=buf.data, offset=1)
    view[...] = x
    assert not view.flags.aligned and view.flags.c_contiguous
    for scheme in (INT8B, NVFP4, INT8):
        assert bq.quantize(view, scheme).to_bytes() == bq.quantize(x, scheme).to_bytes()
    if dt != np.float64 and dt.name != "bfloat16":
        assert np.array_equal(bq.gguf.quantize(view, "Q8_0"), bq.gguf.quantize(x, "Q8_0"))


def test_unaligned_out_arrays_are_refused_and_untouched():
    """out= arrays must be aligned (the core writes them as typed slices): refused before
    anything is written, with a message that says so."""
    qt = bq.quantize(X, INT8B)
    raw = np.zeros(qt.scales.nbytes + 1, np.uint8)
    scales = np.ndarray(qt.scales.shape, np.float32, buffer=raw.data, offset=1)
    values = np.zeros_like(qt.values)
    with pytest.raises(ValueError, match="aligned"):
        bq.quantize(X, INT8B, out=(values, scales))
    assert not raw.any() and not values.any()
    raw = np.zeros(X.nbytes + 1, np.uint8)
    out = np.ndarray(X.shape, np.float32, buffer=raw.data, offset=1)
    with pytest.raises(ValueError, match="aligned"):
        qt.dequantize(out=out)
    assert not raw.any()


@pytest.mark.parametrize("scheme", [NVFP4, INT8B, MXFP8, INT8])
def test_copies_and_pickles_stay_read_only_and_checked(scheme):
    """pickle, copy and deepcopy rebuild a QTensor through from_parts: the same bytes and g,
    read-only arrays as quantize gives (they came back writeable), and crafted parts refused."""
    import copy
    import pickle

    qt = bq.quantize(X, scheme)
    for q2 in (pickle.loads(pickle.dumps(qt)), copy.deepcopy(qt), copy.copy(qt)):
        assert q2.to_bytes() == qt.to_bytes() and q2.global_scale == qt.global_scale
        assert not q2.values.flags.writeable and not q2.scales.flags.writeable
    bad = pickle.dumps(qt).replace(qt.scales.tobytes(), np.full(qt.scales.shape, -1.0,
                                                                np.float32).tobytes())
    with pytest.raises(bq.ScaleError):
        pickle.loads(bad)


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">f2", np.dtype(">f4"), "<f4"])
def test_dequantize_to_a_byte_order_gives_that_order(dtype):
    """'>f4' asked, big-endian given, as the reference gives it (same values)."""
    qt = bq.quantize(X, INT8B)
    got = qt.dequantize(dtype)
    want = ref.dequantize(ref.quantize(X, INT8B), dtype)
    assert got.dtype == want.dtype == np.dtype(dtype)
    assert np.array_equal(got, want)


def test_a_pickle_in_the_default_form_is_rebuilt_and_checked():
    """A QTensor pickled before __reduce__ existed carries its slots as state: __setstate__
    rebuilds it through from_parts (read-only arrays), and refuses bad parts."""
    qt = bq.quantize(X, NVFP4)
    slots = {name: getattr(qt, name) for name in bq.QTensor.__slots__}
    slots["_values"], slots["_scales"] = qt.values.copy(), qt.scales.copy()
    back = bq.QTensor.__new__(bq.QTensor)
    back.__setstate__((None, slots))
    assert back.to_bytes() == qt.to_bytes() and not back.values.flags.writeable
    slots["_scales"] = np.full(qt.scales.shape, -5.0, np.float32)
    with pytest.raises(bq.ScaleError):
        bq.QTensor.__new__(bq.QTensor).__setstate__((None, slots))
    with pytest.raises(TypeError):
        bq.QTensor.__new__(bq.QTensor).__setstate__({"_values": 1})


def test_a_structured_buffer_whose_field_name_holds_an_o_is_plain_data():
    """Only a buffer of Python objects is refused: a field named 'Other' is not one."""
    blob = bq.quantize(np.linspace(-1, 1, 12, dtype=np.float32), INT8).to_bytes()
    rec = np.frombuffer(blob, [("Other", "<u2")])
    assert memoryview(rec).format.count("O")
    assert bq.QTensor.from_bytes(rec, INT8, (12,)).to_bytes() == blob
    assert ref.to_bytes(ref.from_bytes(rec, INT8, (12,))) == blob
