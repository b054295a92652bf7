"""What a numpy user would write for each scheme: the yardstick blockquant's speed is measured
against (benches/bench.py's "numpy" columns).

These are idiomatic vectorized numpy, written the way a careful user would (reshape into blocks,
``abs().max()``, one division, ``np.rint``/``np.clip`` in place, one ``astype``; ml_dtypes casts
for FP8; a ``searchsorted`` over the E2M1 midpoints for FP4; NVFP4's two scale levels one after
the other; the searched presets' candidate scales tried one at a time over all blocks, keeping
each block's least error; dequantizing into the caller's array with ``np.multiply(..., out=)``). They do the same
work as blockquant's kernels but not its exact arithmetic: scales are rounded to nearest by a
plain cast instead of up, ``np.rint`` ties go to even, FP4 ties go down. The benchmark reports
how many stored values agree with blockquant's, so a reader can see they do the same job.

Each scheme is a pair of functions: ``quantize(x, scale=None) -> dict`` with ``values`` laid out
like blockquant's (same dtype and shape) and whatever scales it needs, and
``dequantize(q, out)`` writing float32 values into ``out`` (x's shape). Only whole blocks:
``supports(shape)`` says whether a shape divides into them.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional, Tuple

import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with the test extra
    ml_dtypes = None

F32 = np.float32

# E2M1 magnitudes by code (bit 3 is the sign), and the midpoints between neighbours.
FP4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], F32)
FP4_MID = (FP4[1:] + FP4[:-1]) / 2
FP4_SIGNED = np.concatenate([FP4, -FP4])


class NumpyScheme(NamedTuple):
    quantize: Callable[..., Dict[str, np.ndarray]]
    dequantize: Callable[[Dict[str, np.ndarray], np.ndarray], None]
    supports: Callable[[Tuple[int, ...]], bool]
    needs_ml_dtypes: bool = False


def _last_axis(block: int) -> Callable[[Tuple[int, ...]], bool]:
    return lambda shape: len(shape) >= 1 and shape[-1] % block == 0


def _round_clip(y: np.ndarray, q: float) -> np.ndarray:
    """In place: round half to even and clip to [-q, q]."""
    np.rint(y, out=y)
    np.clip(y, -q, q, out=y)
    return y


def _nonzero(s: np.ndarray) -> np.ndarray:
    # An all-zero block has scale 0: divide by 1 instead (its values are 0 either way).
    return np.where(s == 0, F32(1), s)


# ---- int8 / int4 / ternary, integer codes -------------------------------------------------------

def int8_per_tensor_q(x: np.ndarray, scale: Optional[float] = None) -> Dict[str, np.ndarray]:
    s = F32(np.abs(x).max() / F32(127)) if scale is None else F32(scale)
    y = x / (s if s else F32(1))
    return dict(values=_round_clip(y, 127).astype(np.int8), scale=np.array(s, F32))


def int8_per_tensor_dq(q: Dict[str, np.ndarray], out: np.ndarray) -> None:
    np.multiply(q["values"], q["scale"], out=out)


def _block_scales(xb: np.ndarray, qmax: float, dtype) -> np.ndarray:
    return (np.abs(xb).max(axis=-1) / F32(qmax)).astype(dtype)


def int8_block32_q(x: np.ndarray) -> Dict[str, np.ndarray]:
    xb = x.reshape(-1, 32)
    d = _block_scales(xb, 127, np.float16)
    y = xb / _nonzero(d.astype(F32))[:, None]
    return dict(values=_round_clip(y, 127).astype(np.int8).reshape(x.shape), scales=d)


def int8_block32_dq(q: Dict[str, np.ndarray], out: np.ndarray) -> None:
    np.multiply(q["values"].reshape(-1, 32), q["scales"].astype(F32)[:, None],
                out=out.reshape(-1, 32))


def int4_block32_q(x: np.ndarray) -> Dict[str, np.ndarray]:
    """Q4S in [-7, 7], eight codes per uint32 word, the first in the low nibble."""
    xb = x.reshape(-1, 32)
    d = _block_scales(xb, 7, np.float16)
    y = xb / _nonzero(d.astype(F32))[:, None]
    codes = _round_clip(y, 7).astype(np.int8).view(np.uint8).reshape(*x.shape[:-1], -1, 2)
    packed = (codes[..., 0] & 0xF) | (codes[..., 1] << 4)
    return dict(values=packed.view(np.uint32), scales=d)


def int4_block32_dq(q: Dict[str, np.ndarray], out: np.ndarray) -> None:
    b = q["values"].view(np.uint8)
    pairs = out.reshape(*b.shape, 2)
    # Sign-extend each nibble by an arithmetic shift of int8.
    pairs[..., 0] = (b << 4).view(np.int8) >> 4
    pairs[..., 1] = b.view(np.int8) >> 4
    blocks = out.reshape(-1, 32)
    blocks *= q["scales"].astype(F32)[:, None]


def bitnet_q(x: np.ndarray) -> Dict[str, np.ndarray]:
    """Q2S in [-1, 1] against the mean |x|, sixteen 2-bit codes per uint32 word."""
    s = F32(np.abs(x).mean())
    y = x / (s if s else F32(1))
    codes = _round_clip(y, 1).astype(np.int8).view(np.uint8).reshape(*x.shape[:-1], -1, 4)
    codes &= 3
    packed = codes[..., 0] | (codes[..., 1] << 2) | (codes[..., 2] << 4) | (codes[..., 3] << 6)
    return dict(values=packed.view(np.uint32), scale=np.array(s, F32))


def bitnet_dq(q: Dict[str, np.ndarray], out: np.ndarray) -> None:
    b = q["values"].view(np.uint8)
    quads = out.reshape(*b.shape, 4)
    for k in range(4):
        np.multiply((b << (6 - 2 * k)).view(np.int8) >> 6, q["scale"], out=quads[..., k])


def int8_block128x128_q(x: np.ndarray) -> Dict[str, np.ndarray]:
    r, c = x.shape
    xb = x.reshape(r // 128, 128, c // 128, 128)
    s = np.abs(xb).max(axis=(1, 3)) / F32(127)
    y = xb / _nonzero(s)[:, None, :, None]
    return dict(values=_round_clip(y, 127).astype(np.int8).reshape(x.shape), scales=s)


def int8_block128x128_dq(q: Dict[str, np.ndarray], out: np.ndarray) -> None:
    r, c = out.shape
    np.multiply(q["values"].reshape(r // 128, 128, c // 128, 128),
                q["scales"][:, None, :, None], out=out.reshape(r // 128, 128, c // 128, 128))


# ---- FP8 / FP4, float codes ----------------------------------------------------------------------

def e4m3_per_tensor_q(x: np.ndarray, scale: Optional[float] = None) -> Dict[str, np.ndarray]:
    s = F32(np.abs(x).max() / F32(448)) if scale is None else F32(scale)
    y = x / (s if s else F32(1))
    np.clip(y, -448, 448, out=y)  # ml_dtypes' cast gives NaN past the largest value
    return dict(values=y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), scale=np.array(s, F32))


def e4m3_per_tensor_dq(q: Dict[str, np.ndarray], out: np.ndarray) -> None:
    np.multiply(q["values"].view(ml_dtypes.float8_e4m3fn).astype(F32), q["scale"], out=out)


def _mx_scales(xb: np.ndarray, emax: int) -> Tuple[np.ndarray, np.ndarray]:
    """The OCP MX rule: 2^(floor(log2 amax) - emax), as UE8M0 codes and as float32."""
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(xb).max(axis=-1))) - emax
    e = np.clip(e, -127, 127)
    return (e + 127).astype(np.uint8), np.exp2(e).astype(F32)


def _mx_decode(codes: np.ndarray) -> np.ndarray:
    return np.exp2(codes.astype(F32) - F32(127))


def mxfp8_q(x: np.ndarray) -> Dict[str, np.ndarray]:
    xb = x.reshape(-1, 32)
    codes, s = _mx_scales(xb, 8)
    y = xb / s[:, None]
    np.clip(y, -448, 448, out=y)
    v = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(x.shape)
    return dict(values=v, scales=codes)


def mxfp8_dq(q: Dict[str, np.ndarray], out: np.ndarray) -> None:
    v = q["values"].view(ml_dtypes.float8_e4m3fn).astype(F32).reshape(-1, 32)
    np.multiply(v, _mx_decode(q["scales"])[:, None], out=out.reshape(-1, 32))


def fp4_codes(y: np.ndarray) -> np.ndarray:
    """E2M1 codes of y (saturating at 6), bit 3 the sign."""
    codes = np.searchsorted(FP4_MID, np.abs(y)).astype(np.uint8)
    codes |= np.signbit(y).view(np.uint8) << 3
    return codes


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def _fp4_decode_into(b: np.ndarray, out: np.ndarray) -> np.ndarray:
    pairs = out.reshape(*b.shape, 2)
    pairs[..., 0] = FP4_SIGNED[b & 0xF]
    pairs[..., 1] = FP4_SIGNED[b >> 4]
    return out


def mxfp4_q(x: np.ndarray) -> Dict[str, np.ndarray]:
    xb = x.reshape(-1, 32)
    codes, s = _mx_scales(xb, 2)
    return dict(values=_pack_nibbles(fp4_codes(xb / s[:, None]).reshape(x.shape)), scales=codes)


def mxfp4_dq(q: Dict[str, np.ndarray], out: np.ndarray) -> None:
    blocks = _fp4_decode_into(q["values"], out).reshape(-1, 32)
    blocks *= _mx_decode(q["scales"])[:, None]


def nvfp4_q(x: np.ndarray) -> Dict[str, np.ndarray]:
    """Two levels: g = max block scale / 448 (f32), then UE4M3 block scales b = s / g."""
    xb = x.reshape(-1, 16)
    s = np.abs(xb).max(axis=-1) / F32(6)
    g = F32(s.max() / F32(448)) or F32(1)
    b = (s / g).astype(ml_dtypes.float8_e4m3fn)
    e = b.astype(F32) * g
    codes = fp4_codes(xb / _nonzero(e)[:, None]).reshape(x.shape)
    return dict(values=_pack_nibbles(codes), scales=b.view(np.uint8), g=np.array(g, F32))


def nvfp4_dq(q: Dict[str, np.ndarray], out: np.ndarray) -> None:
    blocks = _fp4_decode_into(q["values"], out).reshape(-1, 16)
    blocks *= (q["scales"].view(ml_dtypes.float8_e4m3fn).astype(F32) * q["g"])[:, None]


# ---- searched block scales (the *_block16 presets): UE4M3 per 16 under an f32 tensor scale ---

# The search's divisors for 4-bit values: the largest |x| lands at c · half_range.
SEARCH_4BIT = np.array([1] + [k / 32 for k in range(27, 32)] + [k / 32 for k in range(33, 38)], F32)


def _searched_q(x: np.ndarray, half: float, nearest: Callable[[np.ndarray], np.ndarray]) -> Dict:
    """Each block's UE4M3 scale picked among the candidates by least squared error (as
    blockquant's ``calibration="mse"`` does, one candidate at a time over all blocks), then
    codes by ``nearest`` (u -> (code, value)), eight 4-bit codes per uint32 word."""
    xb = x.reshape(-1, 16)
    alpha = np.abs(xb).max(axis=-1)
    g = F32(alpha.max() / F32(half) / F32(448)) or F32(1)
    # A candidate past UE4M3's largest scale casts to NaN: its error is NaN, never the least.
    with np.errstate(invalid="ignore"):
        best_b = _search(xb, alpha, g, half, nearest)
    e = best_b.astype(F32) * g
    codes = nearest(xb / _nonzero(e)[:, None])[0].astype(np.uint8).reshape(*x.shape[:-1], -1, 2)
    packed = (codes[..., 0] & 0xF) | (codes[..., 1] << 4)
    return dict(values=packed.view(np.uint32), scales=best_b.view(np.uint8), g=np.array(g, F32))


def _search(xb: np.ndarray, alpha: np.ndarray, g: np.float32, half: float,
             nearest: Callable) -> np.ndarray:
    """Each block's UE4M3 scale of least error among the candidates (the first on ties)."""
    best_b = np.zeros(alpha.shape, ml_dtypes.float8_e4m3fn)
    best_err = np.full(alpha.shape, np.inf)
    for c in SEARCH_4BIT:
        b = (alpha / (F32(half) * c) / g).astype(ml_dtypes.float8_e4m3fn)
        e = b.astype(F32) * g
        u = xb / _nonzero(e)[:, None]
        err = np.square(u - nearest(u)[1]).sum(axis=-1) * np.square(e)
        err[e == 0] = np.inf
        better = err < best_err
        best_err[better] = err[better]
        best_b[better] = b[better]
    return best_b


def _searched_dq(q: Dict[str, np.ndarray], out: np.ndarray, decode: Callable) -> None:
    b = q["values"].view(np.uint8)
    pairs = out.reshape(*b.shape, 2)
    pairs[..., 0] = decode(b & 0xF)
    pairs[..., 1] = decode(b >> 4)
    blocks = out.reshape(-1, 16)
    blocks *= (q["scales"].view(ml_dtypes.float8_e4m3fn).astype(F32) * q["g"])[:, None]


def _q4f_nearest(u: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    v = np.clip(np.rint(u), -8, 7)
    return v.astype(np.int8).view(np.uint8), v


def _q4f_decode(nibbles: np.ndarray) -> np.ndarray:
    return (nibbles << 4).view(np.int8) >> 4


def _codebook(book: np.ndarray) -> Tuple[Callable, Callable]:
    mids = (book[1:] + book[:-1]) / 2

    def nearest(u: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        idx = np.searchsorted(mids, u)
        return idx, book[idx]

    return nearest, (lambda nibbles: book[nibbles])


def _searched(nearest: Callable, decode: Callable, half: float) -> "NumpyScheme":
    return NumpyScheme(lambda x: _searched_q(x, half, nearest),
                       lambda q, out: _searched_dq(q, out, decode), _last_axis(16), True)


def _searched_codebook(name: str) -> "NumpyScheme":
    from blockquant import codebooks

    book = getattr(codebooks, name)
    return _searched(*_codebook(book), float(np.abs(book).max()))


SCHEMES: Dict[str, NumpyScheme] = {
    "int8": NumpyScheme(int8_per_tensor_q, int8_per_tensor_dq, lambda shape: True),
    "int8_block32": NumpyScheme(int8_block32_q, int8_block32_dq, _last_axis(32)),
    "int4_block32": NumpyScheme(int4_block32_q, int4_block32_dq, _last_axis(32)),
    "bitnet": NumpyScheme(bitnet_q, bitnet_dq, _last_axis(16)),
    "int8_block128x128": NumpyScheme(
        int8_block128x128_q, int8_block128x128_dq,
        lambda shape: len(shape) == 2 and shape[0] % 128 == 0 and shape[1] % 128 == 0),
    "e4m3": NumpyScheme(e4m3_per_tensor_q, e4m3_per_tensor_dq, lambda shape: True, True),
    "mxfp8": NumpyScheme(mxfp8_q, mxfp8_dq, _last_axis(32), True),
    "mxfp4": NumpyScheme(mxfp4_q, mxfp4_dq, _last_axis(32)),
    "nvfp4": NumpyScheme(nvfp4_q, nvfp4_dq, _last_axis(16), True),
    "int4_block16": _searched(_q4f_nearest, _q4f_decode, 7.5),
    "nf4_block16": _searched_codebook("NF4"),
    "bq4_block16": _searched_codebook("BQ4"),
}


def scheme(name: str, shape: Tuple[int, ...]) -> Optional[NumpyScheme]:
    """The numpy version of a benchmark case, or None where it does not apply."""
    impl = SCHEMES.get(name)
    if impl is None or not impl.supports(shape) or (impl.needs_ml_dtypes and ml_dtypes is None):
        return None
    return impl
