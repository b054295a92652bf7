"""MLX's bytes: codes packed into MLX's uint32 words (:func:`pack`, :func:`unpack`), MLX's own
quantizer (:func:`mlx_quantize`, the rule ``mx.quantize`` follows on the CPU) and MLX's
dequantization (:func:`dequantize`), all in numpy.

mlx is the arbiter: ``tests/consumers/test_mlx_consumers.py`` checks each function against it.
What MLX does, per mode (``docs/mlx.md``):

- **words**: a row's codes as one little-endian bit stream, the first code in the lowest bits,
  seen as uint32 words (``cols · bits / 32`` of them). For 2, 4 and 8 bits a word holds whole
  codes; 3-, 5- and 6-bit codes straddle words.
- ``affine`` (2, 3, 4, 5, 6, 8 bits; groups of 32, 64, 128): codes q in [0, 2^b − 1], a scale s
  and a bias b per group, both in the weight's dtype T: x = T(T(q · s) + b), each operation
  rounded to T.
- ``mxfp4`` / ``nvfp4``: E2M1 codes (sign bit 3) with an E8M0 exponent byte per 32 values
  (x = q · 2^(e − 127) in T) or an E4M3 scale byte per 16 values (x = q · s in T).
- ``mxfp8``: E4M3 codes with an E8M0 exponent byte per 32 values.

MLX's rule (``mlx_quantize``), where it differs from blockquant's:

- affine: the range's larger-magnitude end is a code exactly (q0 = round(edge / s),
  s = edge / q0, b = edge), so the scale is negative when max dominates and 0 is a code; the
  codes are computed with the scale and bias before they are rounded to T.
- fp: the scale is amax / max_value in T; MX exponents are round(log2(s)) (in T, ties to
  even), not OCP's floor(log2(amax)) − emax; E2M1 codes are the nearest LUT entry, ties to the
  smaller magnitude (and −0 as +0); nvfp4 has no second-level scale.
"""

from __future__ import annotations

import math

import numpy as np

from .ct_codec import _E4M3, _in_dtype

#: MLX's modes: (bits it takes, group sizes it takes).
MODES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "affine": ((2, 3, 4, 5, 6, 8), (32, 64, 128)),
    "mxfp4": ((4,), (32,)),
    "mxfp8": ((8,), (32,)),
    "nvfp4": ((4,), (16,)),
}
#: mlx-lm's defaults when a mode is named alone.
DEFAULTS = {"affine": (4, 64), "mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}

_FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float32 -> E4M3 bytes as MLX's ``to_fp8`` makes them: nearest, ties to the even code,
    magnitudes of 448 and more (infinity and NaN too) saturated to 448 (0x7E), the sign kept
    (−0 and negatives that round to 0 are 0x80). MLX's bit arithmetic, step for step: a
    magnitude below 2^-6 (E4M3's subnormals) is rounded by a float32 add of 2^14, which leaves
    its code in the low bits; any other has its exponent rebased and half an E4M3 ulp (less
    one, plus the lowest kept mantissa bit: ties to even) added to its bits before the shift."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    sign = u & np.uint32(0x80000000)
    mag = u ^ sign
    denorm = np.uint32(141 << 23)  # 2^14: adding it leaves an E4M3 subnormal's code in the bits
    low = ((mag.view(np.float32) + denorm.view(np.float32)).view(np.uint32) - denorm)
    odd = (mag >> np.uint32(20)) & np.uint32(1)
    high = (mag + np.uint32(((7 - 127) << 23) + 0x7FFFF & 0xFFFFFFFF) + odd) >> np.uint32(20)
    code = np.where(mag < np.uint32(121 << 23), low, high).astype(np.uint8)
    code = np.where(mag >= np.uint32(543 << 21), np.uint8(0x7E), code)
    return code | (sign >> np.uint32(24)).astype(np.uint8)


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    return _E4M3[np.asarray(codes, dtype=np.uint8)]


# -- words --------------------------------------------------------------------------------------
def _run(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the shortest run of codes that fills whole bytes."""
    n = 8 // math.gcd(bits, 8)
    return n, n * bits // 8


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (rows, cols) in [0, 2^bits) -> MLX's uint32 words (rows, cols · bits / 32)."""
    rows, cols = codes.shape
    if (cols * bits) % 32:
        raise ValueError(f"{cols} codes of {bits} bits do not fill whole words")
    n, nbytes = _run(bits)
    c = codes.reshape(rows, cols // n, n)
    if bits == 8:
        out = codes.astype(np.uint8, copy=False)
    elif nbytes == 1:
        acc = c[..., 0].astype(np.uint8)
        for k in range(1, n):
            acc |= (c[..., k].astype(np.uint8) << np.uint8(k * bits))
        out = acc
    else:
        v = c[..., 0].astype(np.uint64)
        for k in range(1, n):
            v |= c[..., k].astype(np.uint64) << np.uint64(k * bits)
        out = np.empty((rows, cols // n, nbytes), np.uint8)
        for j in range(nbytes):
            out[..., j] = (v >> np.uint64(8 * j)).astype(np.uint8)
    return np.ascontiguousarray(out).reshape(rows, -1).view("<u4")


def unpack(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """MLX's uint32 words (rows, cols · bits / 32) -> codes (rows, cols) as uint8."""
    rows = words.shape[0]
    if words.shape[1] * 32 != cols * bits:
        raise ValueError(f"{words.shape[1]} words a row do not hold {cols} codes of {bits} bits")
    b = np.ascontiguousarray(words).astype("<u4", copy=False).view(np.uint8).reshape(rows, -1)
    if bits == 8:
        return b.copy()
    n, nbytes = _run(bits)
    b = b.reshape(rows, cols // n, nbytes)
    v = b[..., 0].astype(np.uint64)
    for j in range(1, nbytes):
        v |= b[..., j].astype(np.uint64) << np.uint64(8 * j)
    mask = np.uint64((1 << bits) - 1)
    out = np.empty((rows, cols // n, n), np.uint8)
    for k in range(n):
        out[..., k] = (v >> np.uint64(k * bits)) & mask
    return out.reshape(rows, cols)


# -- MLX's quantizer ----------------------------------------------------------------------------
def _affine(x: np.ndarray, bits: int, group: int, dtype: str):
    n_bins = np.float32((1 << bits) - 1)
    g = x.reshape(-1, group)
    w_max, w_min = g.max(axis=1), g.min(axis=1)
    mask = np.abs(w_min) > np.abs(w_max)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = np.maximum((w_max - w_min) / n_bins, np.float32(1e-7))
        scale = np.where(mask, scale, -scale)
        edge = np.where(mask, w_min, w_max)
        q0 = np.rint(edge / scale)
        moved = q0 != 0
        scale = np.where(moved, edge / np.where(moved, q0, 1), scale).astype(np.float32)
        bias = np.where(moved, edge, np.float32(0)).astype(np.float32)
        q = np.rint((g - bias[:, None]) / scale[:, None])
    q = np.clip(q, 0, n_bins).astype(np.uint8).reshape(x.shape)
    grid = (x.shape[0], x.shape[1] // group)
    return q, _in_dtype(scale, dtype).reshape(grid), _in_dtype(bias, dtype).reshape(grid)


#: Where E2M1's nearest magnitude steps up, a tie going to the smaller (MLX's argmin takes the
#: first of equally near table entries).
_FP4_STEPS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)


def _nearest_fp4(wq: np.ndarray) -> np.ndarray:
    """The first LUT index of the least |wq − entry| (MLX's argmin over its 16-entry table):
    ties to the smaller magnitude, every value that rounds to 0 as +0 (index 0), and NaN and
    ±infinity (x / 0 in an nvfp4 group whose scale rounds to 0: every entry equally far) as 0."""
    mag = np.abs(wq)
    code = np.searchsorted(_FP4_STEPS, mag, side="left").astype(np.uint8)
    code[~np.isfinite(mag)] = 0
    code |= np.where((wq < 0) & (code != 0), np.uint8(8), np.uint8(0))
    return code


def _fp(x: np.ndarray, mode: str, dtype: str):
    group = MODES[mode][1][0]
    maxval = np.float32(448.0 if mode == "mxfp8" else 6.0)
    g = x.reshape(-1, group)
    amax = np.abs(g).max(axis=1)
    scale = _in_dtype((amax / maxval).astype(np.float32), dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if mode == "nvfp4":
            sbytes = e4m3_encode(scale)
            s = e4m3_decode(sbytes)
            wq = _in_dtype((g / s[:, None]).astype(np.float32), dtype)
        else:
            m, e = np.frexp(scale)  # scale = m · 2^e, 0.5 <= m < 1: ⌈log2⌉ = e, or e − 1
            e = np.where(scale == 0, 0, e - (m == 0.5)).astype(np.int32)
            p = _in_dtype(np.ldexp(np.float32(1), e).astype(np.float32), dtype)
            wq = _in_dtype((g / p[:, None]).astype(np.float32), dtype)
            sbytes = (e + 127).astype(np.uint8)
    if mode == "mxfp8":
        q = e4m3_encode(wq)
    else:
        q = _nearest_fp4(wq)
    return q.reshape(x.shape), sbytes.reshape(x.shape[0], -1)


def mlx_quantize(x: np.ndarray, mode: str, bits: int, group: int, dtype: str):
    """MLX's codes and scales of ``x`` (float32 (rows, cols) holding values of ``dtype``, BF16,
    F16 or F32): ``(codes uint8, scales, biases)``; affine scales and biases as float32 holding
    T's values, fp scales as their bytes and biases None."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if mode == "affine":
        return _affine(x, bits, group, dtype)
    q, s = _fp(x, mode, dtype)
    return q, s, None


# -- MLX's dequantization -----------------------------------------------------------------------
def dequantize(mode: str, bits: int, group: int, dtype: str, words: np.ndarray,
               scales: np.ndarray, biases: np.ndarray | None) -> np.ndarray:
    """The weight as ``mx.dequantize`` gives it: float32 holding values of ``dtype`` (the
    scales' dtype for affine; the weight's for the fp modes). ``scales`` / ``biases``: float32
    holding T's values (affine) or the scale bytes (fp)."""
    rows = words.shape[0]
    cols = words.shape[1] * 32 // bits
    if scales.shape != (rows, cols // group):
        raise ValueError(f"scales {scales.shape} do not fit {rows} rows of {cols} in groups "
                         f"of {group}")
    q = unpack(words, bits, cols)
    if mode == "affine":
        if biases is None or biases.shape != scales.shape:
            raise ValueError("affine needs biases of the scales' shape")
        s = np.repeat(scales.astype(np.float32), group, axis=1)
        b = np.repeat(biases.astype(np.float32), group, axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            prod = _in_dtype((q.astype(np.float32) * s).astype(np.float32), dtype)
            return _in_dtype((prod + b).astype(np.float32), dtype)
    if mode == "mxfp8":
        v = e4m3_decode(q)
    else:
        v = _FP4[q]
    if mode == "nvfp4":
        s = e4m3_decode(scales)
    else:
        e = scales.astype(np.int32) - 127
        s = _in_dtype(np.ldexp(np.float32(1), e).astype(np.float32), dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        return _in_dtype((v * np.repeat(s, group, axis=1)).astype(np.float32), dtype)
