"""compressed-tensors' bytes: a quantized weight as the parameters its compression format
defines (:func:`layer_tensors`), and those parameters back to the float weight exactly as the
``compressed_tensors`` package decompresses them (:func:`dequantize_layer`), in numpy.

The package is the arbiter: ``tests/test_compressed_tensors.py`` checks both directions against
it. What it does, per format (``docs/compressed-tensors.md``):

- ``pack-quantized``: int codes q in [−2^(b−1), 2^(b−1)−1] stored as q + 2^(b−1), packed
  densely into int32 words along each row, the first value in the lowest bits (for 2, 4 and 8
  bits a word holds 16, 8 or 4 whole values); asymmetric zero points packed the same way down
  the columns. x = (q − zp) · s, in the scale's dtype (the weight's).
- ``int-quantized`` / ``float-quantized`` / ``naive-quantized``: ``weight`` as int8 or
  float8_e4m3fn, x = q · s in the scale's dtype.
- ``nvfp4-pack-quantized``: E2M1 codes two a byte (low nibble first), E4M3 block scales and a
  float32 ``weight_global_scale`` gs: x = q · (s / gs), the division and the product in
  float32, then bfloat16.
- ``mxfp4-pack-quantized`` / ``mxfp8-quantized``: E8M0 exponents e in uint8, s = 2^(e − 127) in
  bfloat16, x = q · s in bfloat16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .safetensors import bf16_bits

#: safetensors dtype -> numpy dtype of its raw little-endian elements.
RAW = {"I8": "<i1", "U8": "<u1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "BF16": "<u2",
       "F16": "<f2", "F32": "<f4", "F8_E4M3": "<u1"}
_FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def _e4m3_table() -> np.ndarray:
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    out = (sign * mag).astype(np.float32)
    out[(codes & 0x7F) == 0x7F] = np.nan
    return out


_E4M3 = _e4m3_table()


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest even), as float32."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def _in_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 rounded to ``dtype`` (BF16, F16 or F32), kept as float32."""
    if dtype == "BF16":
        return to_bf16(x)
    if dtype == "F16":
        return x.astype(np.float16).astype(np.float32)
    return x


def raw_array(dtype: str, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=RAW[dtype]).reshape(shape)


def as_float(dtype: str, arr: np.ndarray) -> np.ndarray:
    """A raw array of safetensors ``dtype`` as the float32 values it holds."""
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F8_E4M3":
        return _E4M3[arr]
    return arr.astype(np.float32)


# -- packing ------------------------------------------------------------------------------------
_OFFSET_MASK = {2: 0xAAAAAAAA, 4: 0x88888888, 8: 0x80808080}


def pack_signed_words(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """blockquant's PackedU32 words of two's complement ``bits``-bit fields, as
    pack-quantized's int32 words (each field plus 2^(bits−1), unused fields 0)."""
    out = words ^ np.uint32(_OFFSET_MASK[bits])
    return clear_padding(out, bits, cols).view(np.int32)


def clear_padding(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    per = 32 // bits
    used = cols % per
    if used:
        words[..., -1] &= np.uint32((1 << (used * bits)) - 1)
    return words


def pack_columns(values: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned ``bits``-bit values (2, 4 or 8) of shape (rows, n) packed down each column:
    int32 of shape (ceil(rows·bits/32), n), as compressed-tensors packs zero points."""
    per = 32 // bits
    rows, n = values.shape
    words = -(-rows // per)
    padded = np.zeros((words * per, n), dtype=np.uint32)
    padded[:rows] = values
    lanes = padded.reshape(words, per, n)
    out = np.zeros((words, n), dtype=np.uint32)
    for k in range(per):
        out |= lanes[:, k, :] << np.uint32(k * bits)
    return out.view(np.int32)


def unpack_rows(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """pack-quantized's dense int32 words (rows, W) -> the unsigned fields (rows, cols)."""
    w = np.ascontiguousarray(words).view(np.uint32)
    rows = w.shape[0]
    if 32 % bits == 0:
        per = 32 // bits
        shifts = (np.arange(per, dtype=np.uint32) * bits)
        fields = (w[:, :, None] >> shifts) & np.uint32((1 << bits) - 1)
        return fields.reshape(rows, -1)[:, :cols].astype(np.int32)
    # 3, 5, 6, 7 bits straddle words: read the row as a little-endian bit stream
    stream = np.unpackbits(w.astype("<u4").view(np.uint8).reshape(rows, -1), axis=1,
                           bitorder="little")[:, : cols * bits].reshape(rows, cols, bits)
    return (stream.astype(np.int32) << np.arange(bits, dtype=np.int32)).sum(axis=2)


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """Two E2M1 codes a byte, low nibble first -> their values (float32)."""
    b = np.ascontiguousarray(packed, dtype=np.uint8)
    codes = np.stack((b & 0x0F, b >> 4), axis=-1).reshape(b.shape[0], -1)
    return _FP4[codes]


# -- compressed-tensors' MX scale rule ------------------------------------------------------------
#: mantissa bits of the weight dtypes compressed-tensors finds MX scales in
_MANTISSA = {"BF16": (7, "<u2"), "F16": (10, "<u2"), "F32": (23, "<u4")}


def ct_mx_scales(x: np.ndarray, dtype: str, emax: int, group: int = 32) -> np.ndarray:
    """compressed-tensors' MX scales of ``x`` (float32 holding values of the safetensors
    ``dtype``; rows of whole groups): each group's max |x| in its own dtype, rounded to a power
    of two by adding a quarter of the mantissa's range to its bits and keeping sign and exponent
    (so 2^e · m goes up to 2^(e+1) from m = 1.75 on), then 2^(that exponent − emax), within
    E8M0's [2^−127, 2^127]. An all-zero group gets 2^−127."""
    rows, cols = x.shape
    amax = np.abs(x).reshape(rows, cols // group, group).max(axis=2)
    mant, raw = _MANTISSA.get(dtype, _MANTISSA["F32"])
    if dtype == "BF16":
        bits_ = (amax.view(np.uint32) >> 16).astype(np.int64)
    elif dtype == "F16":
        bits_ = amax.astype(np.float16).view(np.uint16).astype(np.int64)
    else:
        bits_ = amax.view(np.uint32).astype(np.int64)
    rounded = (bits_ + (1 << (mant - 2))) >> mant  # the biased exponent left after the add
    bias = {7: 127, 10: 15, 23: 127}[mant]
    exp = rounded - bias - emax
    out = np.ldexp(np.float32(1.0), np.clip(exp, -127, 127).astype(np.int32)).astype(np.float32)
    out[amax == 0] = np.float32(2.0 ** -127)
    return out


# -- writing ------------------------------------------------------------------------------------
def _part_bytes(qt: Any) -> tuple[memoryview, memoryview]:
    """The value storage and the stored scales of ``qt`` as bytes (its ``to_bytes`` layout)."""
    lay = qt.scheme.layout(qt.shape)
    blob = memoryview(qt.to_bytes())
    n = lay.storage_nbytes
    scales = lay.scales_nbytes - (4 if qt.global_scale is not None else 0)  # less g's f32
    return blob[:n], blob[n: n + scales]


def layer_tensors(family: str, fmt: str, bits: int, symmetric: bool, qt: Any,
                  scale_st: str) -> list[tuple[str, str, tuple[int, ...], Any]]:
    """The parameters of one quantized weight ``qt`` (2-D), as (suffix, safetensors dtype,
    shape, data): ``weight_packed`` or ``weight``, ``weight_scale``, and as the format has them
    ``weight_shape``, ``weight_zero_point``, ``weight_global_scale``. ``scale_st``: the
    safetensors dtype of a scale kept in the weight's dtype."""
    rows, cols = qt.shape
    grid = tuple(qt.scheme.layout(qt.shape).scale_grid)
    values, scales = _part_bytes(qt)
    if family == "int":
        scale = ("weight_scale", scale_st, grid, scales)
        if fmt != "pack-quantized":  # int-quantized: int8 codes as they are
            return [("weight", "I8", (rows, cols), values), scale]
        words = np.frombuffer(values, dtype="<u4").reshape(qt.values.shape).copy()
        if symmetric:
            packed = pack_signed_words(words, bits, cols)
        else:  # affine codes are already q + 2^(b-1); the zero points likewise
            packed = clear_padding(words, bits, cols).view(np.int32)
        out = [("weight_packed", "I32", packed.shape, packed), scale,
               ("weight_shape", "I64", (2,), np.array([rows, cols], dtype=np.int64))]
        if not symmetric:
            zp = pack_columns(np.asarray(qt.offsets, dtype=np.uint32).reshape(grid), bits)
            out.append(("weight_zero_point", "I32", zp.shape, zp))
        return out
    if family == "fp8":
        return [("weight", "F8_E4M3", (rows, cols), values),
                ("weight_scale", scale_st, grid, scales)]
    if family == "mxfp8":
        return [("weight", "F8_E4M3", (rows, cols), values), ("weight_scale", "U8", grid, scales)]
    packed_shape = (rows, cols // 2)
    if family == "mxfp4":
        return [("weight_packed", "U8", packed_shape, values), ("weight_scale", "U8", grid, scales)]
    # nvfp4: the per-tensor scale g is a power of two (see ct_folder), so 1 / g is exact and
    # compressed-tensors' s / gs is blockquant's s · g to the bit
    gs = np.array([1.0 / qt.global_scale], dtype=np.float32)
    return [("weight_packed", "U8", packed_shape, values),
            ("weight_scale", "F8_E4M3", grid, scales),
            ("weight_global_scale", "F32", (1,), gs)]


# -- reading ------------------------------------------------------------------------------------
#: The parameters a quantized weight may have, in any format.
PARAMS = ("weight", "weight_packed", "weight_scale", "weight_shape", "weight_zero_point",
          "weight_global_scale")


def _expand(scale: np.ndarray, args: dict[str, Any], shape: tuple[int, int]) -> np.ndarray:
    """A scale (or zero point) grid broadcast to the weight's shape, by the strategy."""
    rows, cols = shape
    strategy = args.get("strategy")
    if strategy in ("group", "tensor_group"):
        g = int(args["group_size"])
        grid = (rows, -(-cols // g))
    elif strategy == "block":
        h, w = args["block_structure"]
        grid = (-(-rows // h), -(-cols // w))
    elif strategy == "channel":
        grid = (rows, 1)
    elif strategy == "tensor":
        grid = (1, 1)
    else:
        raise ValueError(f"strategy {strategy!r} is not one a weight is stored with")
    if scale.size != grid[0] * grid[1]:
        raise ValueError(f"its scale grid has {scale.size} entries, not the {grid} of a "
                         f"{strategy} layout of {shape}")
    scale = scale.reshape(grid)
    if strategy in ("group", "tensor_group"):
        return np.repeat(scale, g, axis=1)[:, :cols]
    if strategy == "block":
        return np.repeat(np.repeat(scale, h, axis=0), w, axis=1)[:rows, :cols]
    return scale


def dequantize_layer(fmt: str, args: dict[str, Any],
                     params: dict[str, tuple[str, tuple[int, ...], bytes]]) -> tuple[np.ndarray, str]:
    """One weight back from its parameters (name -> (safetensors dtype, shape, bytes)) as
    compressed-tensors decompresses it: (float32 array holding the values, the safetensors
    dtype they are in). Raises ValueError on parameters that do not fit together."""
    def arr(name: str) -> np.ndarray:
        if name not in params:
            raise ValueError(f"has no {name} ({fmt} needs it)")
        d, s, b = params[name]
        if d not in RAW:
            raise ValueError(f"{name} is {d}, which {fmt} does not use")
        return raw_array(d, s, b)

    sd, s_shape, _ = params.get("weight_scale", ("?", (), b""))
    scale_raw = arr("weight_scale")
    bits = args.get("num_bits")
    if type(bits) is not int or not 1 <= bits <= 8:
        raise ValueError(f"num_bits {bits!r} is not 1 to 8")
    if args.get("strategy") in ("group", "tensor_group"):
        g = args.get("group_size")
        if type(g) is not int or g < 1:
            raise ValueError(f"group_size {g!r} is not a positive integer")
    if args.get("strategy") == "block":
        b = args.get("block_structure")
        if not (isinstance(b, list) and len(b) == 2 and all(type(v) is int and v > 0 for v in b)):
            raise ValueError(f"block_structure {b!r} is not two positive integers")
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        q = unpack_fp4(arr("weight_packed"))
        shape = (q.shape[0], q.shape[1])
        if fmt == "mxfp4-pack-quantized":
            s = _mx_scale(scale_raw)
            return to_bf16(q * _expand(s, args, shape)), "BF16"
        s = to_bf16(as_float(sd, scale_raw))
        gs = as_float(params["weight_global_scale"][0], arr("weight_global_scale"))
        eff = (s / gs.reshape(-1)[0]).astype(np.float32)
        return to_bf16((q * _expand(eff, args, shape)).astype(np.float32)), "BF16"
    if fmt == "pack-quantized":
        shape_arr = arr("weight_shape").reshape(-1)
        if shape_arr.size != 2:
            raise ValueError("weight_shape is not a 2-D shape")
        shape = (int(shape_arr[0]), int(shape_arr[1]))
        words = arr("weight_packed")
        if words.shape != (shape[0], -(-shape[1] * bits // 32)):
            raise ValueError(f"weight_packed {words.shape} does not hold {shape}")
        q = unpack_rows(words, bits, shape[1]) - (1 << (bits - 1))
        zp = None
        if not args.get("symmetric", True) and args.get("strategy") in ("group", "channel"):
            zraw = arr("weight_zero_point")
            ng = scale_raw.reshape(shape[0], -1).shape[1]
            zp = unpack_rows(np.ascontiguousarray(zraw.T), bits, shape[0]).T - (1 << (bits - 1))
            zp = zp.reshape(shape[0], ng)
    else:  # weight stored as it is: int8, float8_e4m3fn
        wd, shape, _ = params.get("weight", ("?", (), b""))
        if len(shape) != 2:
            raise ValueError("weight is not 2-D")
        q = as_float(wd, arr("weight"))
        zp = None
        if not args.get("symmetric", True) and "weight_zero_point" in params:
            zp = arr("weight_zero_point").astype(np.int32)
    if fmt == "mxfp8-quantized":
        s = _mx_scale(scale_raw)
        return to_bf16(q * _expand(s, args, shape)), "BF16"
    s = as_float(sd, scale_raw)
    deq = q.astype(np.float32)
    if zp is not None:
        deq = (deq - _expand(zp.astype(np.float32), args, shape)).astype(np.float32)
    return _in_dtype((deq * _expand(s, args, shape)).astype(np.float32), sd), sd


def _mx_scale(e: np.ndarray) -> np.ndarray:
    """E8M0 exponents as compressed-tensors decodes them: 2^(e − 127) in bfloat16 (255 is
    2^128, which bfloat16 holds only as infinity)."""
    out = np.ldexp(np.float32(1.0), e.astype(np.int32) - 127).astype(np.float32)
    return to_bf16(out)
