"""One weight as ONNX: a blockquant scheme lowered to initializers and the nodes that decode them.

Two forms:

- **QDQ**: the codes as an initializer of ONNX's own type (INT8, INT4, INT2, FLOAT8E4M3FN,
  FLOAT8E5M2), the scales as an f32 tensor, and one ``DequantizeLinear`` whose output takes the
  weight's name, so every consumer (and any subgraph) reads the dequantized weight unchanged.
  Scales of another dtype are stored in that dtype (F16, BF16; UE4M3 as FLOAT8E4M3FN; UE8M0 as
  BF16, which holds every power of two UE8M0 has) and widened by a ``Cast`` (exact); a
  two-level scheme's per-tensor scale g is one ``Mul`` after it, the f32 product e = b × g that
  blockquant itself dequantizes with (format.md "Two-level schemes"), so the result stays bit for bit blockquant's.
- **MatMulNBits** (com.microsoft, onnxruntime's fused low-bit MatMul): the codes packed along
  K, one f32 scale per block; symmetric codes + 2^(bits-1) with no zero-point input (the
  operator's zero point is then 2^(bits-1)), an affine scheme's codes as they are with its zero
  points as the ``zero_points`` input.

Affine values with a zero point (``u8``/``u4``/``u2`` ``.../zero:u8``) are ONNX's own: UINT8,
UINT4 or UINT2 codes and a zero-point tensor of the same type beside the scales (x = (q − z) ×
s, the f32 product blockquant dequantizes with). A float bias (``bias:f32``) has no ONNX form.

E2M1 (FP4) has a ``DequantizeLinear`` from opset 23, but onnxruntime 1.32's CPU provider has no
kernel for it (nor a Cast from it): by default its codes are stored as INT4 bit patterns (the
same 4 bits) and decoded by a 16-entry ``Gather`` table, then multiplied by the scales
(``fp4="dq"`` writes the standard opset-23 node instead).

A Lookup scheme (a codebook) has no ONNX type: its indices are stored the same way, as INT4
(0..15, read as a 4-bit two's complement; a negative index counts from the table's end, so
index k still lands on entry k), and decoded by a ``Gather`` from the codebook.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import SchemeError
from ..qtensor import QTensor
from ..qtensor import _quantize as quantize
from ..scheme import QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype

#: blockquant value -> (ONNX TensorProto type name, lowest ai.onnx opset of a per-tensor or
#: per-axis DequantizeLinear over it). Blocked quantization needs opset 21 whatever the type.
VALUE_TYPES = {
    QuantValue.Q8F: ("INT8", 13),
    QuantValue.Q8S: ("INT8", 13),
    QuantValue.Q4F: ("INT4", 21),
    QuantValue.Q4S: ("INT4", 21),
    QuantValue.Q2F: ("INT2", 25),
    QuantValue.Q2S: ("INT2", 25),
    QuantValue.E4M3: ("FLOAT8E4M3FN", 19),
    QuantValue.E5M2: ("FLOAT8E5M2", 19),
    QuantValue.E2M1: ("FLOAT4E2M1", 23),
    QuantValue.U8: ("UINT8", 13),
    QuantValue.U4: ("UINT4", 21),
    QuantValue.U2: ("UINT2", 25),
}
BLOCKED_OPSET = 21
#: E2M1 decoded by a Gather table: Cast from INT4 is opset 21.
FP4_LOOKUP_OPSET = 21

#: The float dtypes a weight may have, by ONNX name, and numpy's name of each.
FLOAT_TYPES = {"FLOAT": "float32", "FLOAT16": "float16", "BFLOAT16": "bfloat16",
               "DOUBLE": "float64"}

#: E2M1 code -> value (bit 3 the sign): the Gather table, indexed by the code read as INT4
#: (-8..7; a negative index counts from the end, so code c lands on entry c).
_FP4_TABLE = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


#: ml_dtypes' sub-byte types and their bits.
SUB_BYTE_DTYPES = {"int4": 4, "uint4": 4, "float4_e2m1fn": 4, "int2": 2, "uint2": 2}


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """``bits``-bit codes (uint8, high bits ignored) packed 8 // bits a byte along the last
    axis, the first in the low bits; a last byte short of codes is padded with zero bits."""
    per = 8 // bits
    if per == 1:
        return codes
    n = codes.shape[-1]
    if n % per:
        pad = np.zeros(codes.shape[:-1] + (per - n % per,), dtype=np.uint8)
        codes = np.concatenate([codes, pad], axis=-1)
    mask = (1 << bits) - 1
    if sys.byteorder == "little":
        # The `per` codes of a byte read as one wider little-endian word (the first code its
        # low byte), each moved down into its bits: whole-array operations, several times
        # faster than gathering every per-th code.
        wide = np.uint16 if per == 2 else np.uint32
        v = np.ascontiguousarray(codes).view(wide)
        out = v & wide(mask)
        for i in range(1, per):
            out |= (v >> wide((8 - bits) * i)) & wide(mask << (bits * i))
        return out.astype(np.uint8)
    c = codes.reshape(codes.shape[:-1] + (-1, per))
    low = c[..., 0] & np.uint8(mask)
    for i in range(1, per):
        low |= (c[..., i] & np.uint8(mask)) << np.uint8(bits * i)
    return low


def _ml() -> Any:
    try:
        import ml_dtypes
    except ImportError:  # onnx depends on it; this is for a broken environment
        raise SchemeError("writing ONNX low-bit types needs ml_dtypes (pip install ml-dtypes)") \
            from None
    return ml_dtypes


@dataclass
class Lowered:
    """A weight written as ONNX: new initializers (numpy arrays, by name), nodes to put first
    in the graph, the ai.onnx opset they need, and a note of every lowering made."""

    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list[Any] = field(default_factory=list)
    opset: int = 1
    notes: list[str] = field(default_factory=list)
    qtensor: QTensor | None = None  # the weight quantized (reduction axis last if moved)
    moved: bool = False
    onnx: dict[str, Any] = field(default_factory=dict)  # what inspect shows

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(a) for a in self.initializers.values())


def _nbytes(a: np.ndarray) -> int:
    bits = SUB_BYTE_DTYPES.get(a.dtype.name, 8 * a.dtype.itemsize)
    return (a.size * bits + 7) // 8


def check_offset(scheme: QuantScheme) -> None:
    """Raise SchemeError when ``scheme``'s offset has no ONNX form: a float bias."""
    if scheme.offset is not None and scheme.offset.kind != "zero":
        raise SchemeError(f"{scheme}: ONNX dequantizes with integer zero points, not a float "
                          "bias (x = q·s + b); use a zero point (.../zero:u8)")


def check_scheme(scheme: QuantScheme) -> None:
    """Raise SchemeError when no ONNX form holds ``scheme``."""
    check_offset(scheme)
    bs = scheme.block_size
    if bs is not None and len(bs) > 1:
        raise SchemeError(f"{scheme}: ONNX's DequantizeLinear blocks along one axis; "
                          f"2-D blocks {list(bs)} have no ONNX form")


def quantize_along(w: np.ndarray, kaxis: int, scheme: QuantScheme,
                   options: dict[str, str]) -> tuple[QTensor, bool]:
    """``w`` quantized with its blocks along ``kaxis``, and whether the returned tensor has
    that axis moved last. blockquant blocks the last axis; blocks along the one before it are
    the 2-D blocks (B, 1), which need no transposed copy of the weight (the same blocks, so the
    same scales and codes) and are the faster for a plain minmax scale; a search (``mse``) or
    an affine range walks those blocks a column at a time, several times slower than a
    transposed copy. Values are one per element (the store is storage only: it changes no
    value)."""
    native = _native_store(scheme)
    bs = scheme.block_size
    if w.ndim == 0 or bs is None or kaxis == w.ndim - 1:
        return quantize(w, native, **options), False
    if kaxis == w.ndim - 2 and options.get("calibration") != "mse" and scheme.offset is None:
        return quantize(w, _column_blocks(scheme), **options), False
    x = np.ascontiguousarray(np.moveaxis(w, kaxis, -1))
    return quantize(x, native, **options), True


# Derived schemes, made once per scheme (building one checks it in the core: tens of
# microseconds, which a model of hundreds of small weights paid per weight). Options play no
# part: the caller passes them to quantize.
@functools.lru_cache(maxsize=64)
def _native_store(scheme: QuantScheme) -> QuantScheme:
    return scheme.with_store(QuantStore.Native)


@functools.lru_cache(maxsize=64)
def _column_blocks(scheme: QuantScheme) -> QuantScheme:
    native = _native_store(scheme)
    assert native.block_size is not None
    return native.per_block([native.block_size[0], 1], native.scale_dtype)


@dataclass
class Quantized:
    """A weight quantized for its ONNX form (:func:`quantize_weight`): ``qt`` holds it with K
    last when ``moved``; the scheme asked for, the weight's shape and K axis go with it."""

    qt: QTensor
    moved: bool
    scheme: QuantScheme
    shape: tuple[int, ...]
    kaxis: int


def quantize_weight(w: np.ndarray, kaxis: int, scheme: QuantScheme, options: dict[str, str],
                    form: str) -> Quantized:
    """``w`` quantized with its blocks along ``kaxis``, as ``form`` ("qdq" or "matmulnbits")
    lays it out: the expensive part of lowering a weight, which names nothing (several run at
    once, and the names are given after, in order)."""
    if form == "matmulnbits":
        check_matmulnbits(scheme)
        if kaxis == 0:
            # MatMulNBits wants (N, K): quantizing a transposed copy along its last axis takes
            # the core's one-pass kernel (the same blocks, so the same scales and codes as
            # (B, 1) blocks of w, which walk the weight a column at a time, several times
            # slower).
            qt = quantize_along(np.ascontiguousarray(w.T), 1, scheme, options)[0]
            return Quantized(qt, True, scheme, w.shape, kaxis)
    else:
        check_scheme(scheme)
    qt, moved = quantize_along(w, kaxis, scheme, options)
    return Quantized(qt, moved, scheme, w.shape, kaxis)


def qdq_opset(scheme: QuantScheme, shape: tuple[int, ...], kaxis: int, fp4: str) -> int:
    """The ai.onnx opset :func:`lower_qdq` needs for this weight (the model is converted to it
    first when its own is lower)."""
    check_scheme(scheme)
    op = VALUE_TYPES[scheme.value][1]
    bs = scheme.block_size
    k = shape[kaxis] if shape else 1
    if bs is not None and not (bs[0] >= k and len(shape) == 2):
        op = max(op, BLOCKED_OPSET)
    if _gathered(scheme, fp4):
        op = FP4_LOOKUP_OPSET
    if scheme.scale_dtype is ScaleDtype.UE4M3:
        op = max(op, 19)  # Cast from FLOAT8E4M3FN
    return op


def _scale_decode(name: str, qt: QTensor, grid: np.ndarray, out: Lowered,
                  new_name: Callable[[str], str]) -> str:
    """Initializers and nodes that produce the f32 scales (``grid`` is qt.scales with the
    reduction axis back in place); returns the name of the f32 scale tensor."""
    from onnx import TensorProto, helper

    scheme = qt.scheme
    dtype = scheme.scale_dtype
    ml = _ml()
    if dtype is ScaleDtype.F32 and not scheme.is_two_level:
        sname = new_name(f"{name}_scale")
        out.initializers[sname] = grid.astype(np.float32)
        return sname
    stored = {ScaleDtype.F32: np.float32, ScaleDtype.F16: np.float16,
              ScaleDtype.BF16: ml.bfloat16, ScaleDtype.UE4M3: ml.float8_e4m3fn,
              ScaleDtype.UE8M0: ml.bfloat16}[dtype]
    if dtype is ScaleDtype.UE8M0:
        out.notes.append("UE8M0 scales stored as BF16 (exact: every power of two of UE8M0 is a "
                         "BF16 value; onnxruntime 1.32 has no FLOAT8E8M0 DequantizeLinear)")
    if dtype is ScaleDtype.UE4M3:
        out.opset = max(out.opset, 19)  # Cast from FLOAT8E4M3FN
    codes = new_name(f"{name}_scale_{np.dtype(stored).name}")
    arr = grid.astype(stored)
    assert np.array_equal(arr.astype(np.float32), grid), "scale not exact in its dtype"
    out.initializers[codes] = arr
    sname = new_name(f"{name}_scale")
    if not scheme.is_two_level:
        out.nodes.append(helper.make_node("Cast", [codes], [sname], to=TensorProto.FLOAT))
        return sname
    wide = new_name(f"{name}_scale_f32")
    gname = new_name(f"{name}_global_scale")
    out.initializers[gname] = np.array(qt.global_scale, dtype=np.float32)
    out.nodes.append(helper.make_node("Cast", [codes], [wide], to=TensorProto.FLOAT))
    out.nodes.append(helper.make_node("Mul", [wide, gname], [sname]))
    out.notes.append("two-level scales: block scales times the f32 per-tensor scale by a Mul "
                     "(the same f32 product blockquant dequantizes with)")
    return sname


def _codes(qt: QTensor, kaxis: int, moved: bool, onnx_type: str) -> np.ndarray:
    """The value codes in the weight's layout, as the ml_dtypes array onnx's numpy_helper
    writes for ``onnx_type``."""
    ml = _ml()
    v = np.ascontiguousarray(np.moveaxis(qt.values, -1, kaxis) if moved else qt.values)
    if onnx_type in ("INT8", "UINT8"):
        return v.astype(np.int8 if onnx_type == "INT8" else np.uint8)
    if onnx_type in ("INT4", "INT2", "UINT4", "UINT2"):
        return v.astype({"INT4": ml.int4, "INT2": ml.int2, "UINT4": ml.uint4,
                         "UINT2": ml.uint2}[onnx_type])
    if onnx_type == "FP4_AS_INT4":  # the E2M1 bits (or an index) as a 4-bit two's complement
        signed = v.astype(np.int16)
        return np.where(signed >= 8, signed - 16, signed).astype(ml.int4)
    target = {"FLOAT8E4M3FN": ml.float8_e4m3fn, "FLOAT8E5M2": ml.float8_e5m2,
              "FLOAT4E2M1": ml.float4_e2m1fn}[onnx_type]
    if onnx_type == "FLOAT4E2M1":
        return _fp4_array(v, ml)
    return v.view(np.uint8).view(target)


def _fp4_array(codes: np.ndarray, ml: Any) -> np.ndarray:
    """E2M1 codes (uint8, one a byte) as ml_dtypes' float4_e2m1fn, value by value."""
    return _FP4_TABLE[codes.astype(np.intp)].astype(ml.float4_e2m1fn)


def lower_qdq(name: str, q: Quantized, new_name: Callable[[str], str], *,
              out_type: str = "FLOAT", fp4: str = "lookup") -> Lowered:
    """The weight ``q`` (the initializer ``name``) as a QDQ subgraph whose last node outputs
    ``name``.

    Blocks run along the consumer's reduction axis (K), as onnxruntime's DequantizeLinear +
    MatMul fusion and every 4-bit kernel want. A block as long as K or longer on a matrix is
    written per-axis (one scale per output channel, opset 13 for INT8).
    """
    from onnx import TensorProto, helper

    qt, moved, scheme, shape, kaxis = q.qt, q.moved, q.scheme, q.shape, q.kaxis
    out = Lowered()
    out.qtensor, out.moved = qt, moved
    onnx_type, op = VALUE_TYPES[scheme.value]
    bs = scheme.block_size
    k = shape[kaxis] if shape else 1
    attrs: dict[str, Any] = {}
    if bs is None:
        def arrange(a: np.ndarray) -> np.ndarray:
            return a.reshape(())
        layout = "per-tensor"
    elif bs[0] >= k and len(shape) == 2:
        def arrange(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a.reshape(-1))  # one scale per line along K
        attrs["axis"] = 1 - kaxis
        layout = f"per-axis (axis {1 - kaxis})"
    else:
        def arrange(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(np.moveaxis(a, -1, kaxis) if moved else a)
        attrs.update(axis=kaxis, block_size=bs[0])
        layout = f"blocked (axis {kaxis}, block {bs[0]})"
        op = max(op, BLOCKED_OPSET)
    grid = arrange(np.asarray(qt.scales, dtype=np.float32))
    out.opset = op
    lookup = _gathered(scheme, fp4)
    if lookup:
        out.opset = FP4_LOOKUP_OPSET
    sname = _scale_decode(name, qt, grid, out, new_name)
    f32 = name if out_type == "FLOAT" else new_name(f"{name}_f32")
    cname = new_name(f"{name}_quantized")
    if lookup:
        out.initializers[cname] = _codes(qt, kaxis, moved, "FP4_AS_INT4")
        if scheme.codebook is not None:
            table = np.array(scheme.codebook, dtype=np.float32)
            onnx_type = "codebook indices as INT4"
            out.notes.append("Lookup: indices stored as INT4 and decoded by a Gather from the "
                             "codebook (ONNX has no codebook type)")
        else:
            table = _FP4_TABLE
            onnx_type = "FLOAT4E2M1 bits as INT4"
            out.notes.append("E2M1 codes stored as INT4 bit patterns and decoded by a Gather "
                             "table (onnxruntime 1.32 has no FLOAT4E2M1 kernel)")
        _fp4_lookup(name, cname, sname, attrs, shape, f32, out, new_name, table)
    else:
        codes = _codes(qt, kaxis, moved, onnx_type)
        out.initializers[cname] = codes
        inputs = [cname, sname]
        if qt.offsets is not None:  # the zero points, of the codes' own type
            zname = new_name(f"{name}_zero_point")
            out.initializers[zname] = arrange(np.asarray(qt.offsets)).astype(codes.dtype)
            inputs.append(zname)
            onnx_type += " with zero points"
        out.nodes.append(helper.make_node("DequantizeLinear", inputs, [f32], **attrs))
    if out_type != "FLOAT":  # a float16/bfloat16/double model: its own type, rounded from f32
        out.nodes.append(helper.make_node("Cast", [f32], [name],
                                          to=getattr(TensorProto, out_type)))
    assert out.opset == qdq_opset(scheme, shape, kaxis, fp4)
    out.onnx = {"form": "qdq", "type": onnx_type, "layout": layout, "opset": out.opset}
    return out


def _gathered(scheme: QuantScheme, fp4: str) -> bool:
    """Whether the codes are decoded by a Gather table: a codebook, or E2M1 in "lookup" form."""
    return scheme.codebook is not None or (scheme.value is QuantValue.E2M1 and fp4 == "lookup")


def _fp4_lookup(name: str, cname: str, sname: str, attrs: dict[str, Any],
                shape: tuple[int, ...], result: str, out: Lowered,
                new_name: Callable[[str], str], table_values: np.ndarray) -> None:
    """Nodes decoding INT4-held codes (E2M1 bits or codebook indices): Cast to int32, Gather
    from the value table, and a Mul by the scales (blocked: first gathered to one scale per
    element along the axis)."""
    from onnx import TensorProto, helper

    idx, table, vals = (new_name(f"{name}_{s}") for s in ("fp4_index", "fp4_table", "fp4_values"))
    out.initializers[table] = np.array(table_values, dtype=np.float32)
    out.nodes.append(helper.make_node("Cast", [cname], [idx], to=TensorProto.INT32))
    out.nodes.append(helper.make_node("Gather", [table, idx], [vals], axis=0))
    scale = sname
    if "block_size" in attrs:
        axis, b = attrs["axis"], attrs["block_size"]
        rows = new_name(f"{name}_scale_rows")
        out.initializers[rows] = (np.arange(shape[axis], dtype=np.int32) // b).astype(np.int32)
        scale = new_name(f"{name}_scale_full")
        out.nodes.append(helper.make_node("Gather", [sname, rows], [scale], axis=axis))
    elif "axis" in attrs and attrs["axis"] == 0:  # per-axis on rows: broadcast as a column
        col = new_name(f"{name}_scale_shape")
        out.initializers[col] = np.array([-1, 1], dtype=np.int64)
        scale = new_name(f"{name}_scale_col")
        out.nodes.append(helper.make_node("Reshape", [sname, col], [scale]))
    out.nodes.append(helper.make_node("Mul", [vals, scale], [result]))


#: MatMulNBits' bit widths, by blockquant value: integer values (an affine scheme's with its
#: zero points; onnxruntime's CPU kernel runs 2, 4 and 8 bits).
NBITS = {QuantValue.Q8F: 8, QuantValue.Q8S: 8, QuantValue.Q4F: 4, QuantValue.Q4S: 4,
         QuantValue.Q2F: 2, QuantValue.Q2S: 2, QuantValue.U8: 8, QuantValue.U4: 4,
         QuantValue.U2: 2}


def check_matmulnbits(scheme: QuantScheme) -> None:
    """Raise SchemeError unless MatMulNBits holds ``scheme``: 2-, 4- or 8-bit ints (unsigned
    ones with zero points), blocks of 16 to 256 (a power of two) along K."""
    check_scheme(scheme)
    if scheme.mode is QuantMode.Lookup:
        raise SchemeError(f"{scheme}: MatMulNBits has no codebook; a Lookup scheme is written "
                          "as QDQ (--onnx-op qdq)")
    if scheme.value not in NBITS:
        raise SchemeError(f"{scheme}: MatMulNBits (--onnx-op matmulnbits) takes integer values "
                          f"(q8, q4, q2; u8, u4, u2 with zero points), got {scheme.value.name}")
    bs = scheme.block_size
    if bs is None or not (16 <= bs[0] <= 256 and bs[0] & (bs[0] - 1) == 0):
        raise SchemeError(f"{scheme}: MatMulNBits takes blocks of 16, 32, 64, 128 or 256 along "
                          "K (per-tensor and other block sizes have no MatMulNBits form)")


def lower_matmulnbits(name: str, q: Quantized, new_name: Callable[[str], str],
                      scale_type: str = "FLOAT") -> Lowered:
    """The 2-D weight ``q`` as MatMulNBits' B, scales and (an affine scheme's) zero_points
    initializers, blocks along K, in (N, K) order. The node itself is the caller's (it
    replaces the consumer)."""
    qt, scheme = q.qt, q.scheme
    out = Lowered()
    out.qtensor, out.moved = qt, q.moved
    bits = NBITS[scheme.value]
    # (N, K) codes and (N, K/block) scales.
    values, scales = qt.values, np.asarray(qt.scales, dtype=np.float32)
    n, k = values.shape
    block = scheme.block_size[0]  # type: ignore[index]
    kb = -(-k // block)
    if qt.offsets is None:
        zero = 1 << (bits - 1)
        # The codes + zero, in uint8 arithmetic (two's complement wraps onto 0..2^bits - 1).
        codes = values.view(np.uint8) + np.uint8(zero)
        pad = np.full((n, 1), zero, dtype=np.uint8)
        stored = f"uint{bits} (codes + {zero})"
    else:
        codes = values
        pad = np.asarray(qt.offsets)[:, -1:]
        stored = f"uint{bits} with zero points"
    if k < kb * block:  # the last block's padding: its zero point, which dequantizes to 0
        codes = np.concatenate([codes, np.repeat(pad, kb * block - k, axis=1)], axis=1)
    packed = pack_bits(codes, bits).reshape(n, kb, -1)
    if scheme.is_two_level:  # e = b × g, the f32 product blockquant dequantizes with
        scales = scales * np.float32(qt.global_scale)
        out.notes.append("two-level scales folded into f32 block scales (e = b × g, exact)")
    elif scheme.scale_dtype is not ScaleDtype.F32:
        out.notes.append(f"{scheme.scale_dtype.name} scales widened to f32 (exact)")
    if scale_type == "FLOAT16":
        if not np.array_equal(scales.astype(np.float16).astype(np.float32), scales):
            raise SchemeError(f"{scheme}: a float16 model's MatMulNBits takes float16 scales, "
                              "and these are not all float16 values (use f16 block scales)")
        scales = scales.astype(np.float16)
    elif scale_type != "FLOAT":
        raise SchemeError(f"MatMulNBits here takes float32 or float16 activations, got "
                          f"{scale_type}")
    bname, sname = new_name(f"{name}_MatMulNBits_B"), new_name(f"{name}_MatMulNBits_scales")
    out.initializers[bname] = packed
    out.initializers[sname] = np.ascontiguousarray(scales.reshape(-1))
    out.onnx = {"form": "matmulnbits", "type": stored, "layout": f"blocked (K, block {block})",
                "bits": bits, "block_size": block, "K": k, "N": n, "B": bname, "scales": sname}
    if qt.offsets is not None:  # (N, ceil(kb * bits / 8)): each row's packed like B's blocks
        zname = new_name(f"{name}_MatMulNBits_zero_points")
        out.initializers[zname] = pack_bits(np.asarray(qt.offsets), bits)
        out.onnx["zero_points"] = zname
    return out
