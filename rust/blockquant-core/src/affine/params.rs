//! The arithmetic of one affine block (format.md "Affine values (offsets)"): its scale and
//! offset from a range [lo, hi], the code of one value, and the value of one code. Plain f32
//! operations in a fixed order, so that `blockquant.reference` reproduces every bit.

use half::{bf16, f16};

use crate::codec::Rounding;
use crate::scale::ScaleRounding;
use crate::scheme::{Offset, QuantScheme, ScaleDtype};

/// What an affine scheme and the call's options fix: the offset kind, qmax, the scale dtype
/// and the two roundings.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub offset: Offset,
    pub qmax: f32,
    pub dtype: ScaleDtype,
    pub scale_rounding: ScaleRounding,
    pub rounding: Rounding,
}

/// (hi − lo) / qmax in f32; where hi − lo overflows f32, hi / qmax − lo / qmax.
#[inline]
pub fn span(hi: f32, lo: f32, qmax: f32) -> f32 {
    let d = hi - lo;
    if d.is_finite() {
        d / qmax
    } else {
        hi / qmax - lo / qmax
    }
}

/// `v` rounded to nearest, ties to even, in the bias dtype, saturating at its largest finite
/// value; −0 becomes +0.
#[inline]
pub fn round_bias(v: f32, dtype: ScaleDtype) -> f32 {
    let r = match dtype {
        ScaleDtype::F16 => {
            let h = f16::from_f32(v).to_f32();
            if h.is_infinite() {
                f16::MAX.to_f32().copysign(v)
            } else {
                h
            }
        }
        ScaleDtype::BF16 => {
            let h = bf16::from_f32(v).to_f32();
            if h.is_infinite() {
                bf16::MAX.to_f32().copysign(v)
            } else {
                h
            }
        }
        _ => v,
    };
    r + 0.0
}

/// Whether `v` is exactly a finite value of the bias dtype.
pub fn bias_representable(v: f32, dtype: ScaleDtype) -> bool {
    v.is_finite()
        && match dtype {
            ScaleDtype::F16 => f16::from_f32(v).to_f32() == v,
            ScaleDtype::BF16 => bf16::from_f32(v).to_f32() == v,
            _ => true,
        }
}

/// The little-endian bytes of a bias (representable in `dtype`): the first `size_bytes()`.
pub fn bias_le_bytes(v: f32, dtype: ScaleDtype) -> ([u8; 4], usize) {
    match dtype {
        ScaleDtype::F16 => ((f16::from_f32(v).to_bits() as u32).to_le_bytes(), 2),
        ScaleDtype::BF16 => ((bf16::from_f32(v).to_bits() as u32).to_le_bytes(), 2),
        _ => (v.to_le_bytes(), 4),
    }
}

/// A bias read from its little-endian bytes (`size_bytes()` of them).
pub fn bias_read_le(b: &[u8], dtype: ScaleDtype) -> f32 {
    match dtype {
        ScaleDtype::F16 => f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        ScaleDtype::BF16 => bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }
}

#[inline(always)]
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    let v = if v >= lo { v } else { lo };
    if v <= hi {
        v
    } else {
        hi
    }
}

/// 2^22: at most this far from 0 an f32 can be a half.
const ROUND_LIMIT: f32 = 4_194_304.0;
/// 1.5 · 2^23: added to an f32 of magnitude at most 2^22, it leaves no fraction bits, so the
/// addition rounds to an integer, to even (the FPU's mode); subtracting it again is exact.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// The integer nearest `v` by the call's rounding (half away from zero, or to even), for
/// `|v|` up to 2^22; beyond, ±2^22 (every caller clamps to [0, qmax] after, so the result is
/// the same). Plain adds and compares rather than `round`/`round_ties_even`, which the baseline
/// x86-64 target has no instruction for (SSE4.1's `roundps`) and would call libm per value: this
/// form runs in SIMD registers. A result of 0 may be −0 where the library's is +0 or the other
/// way; an offset is added or the code clamped and encoded after, which makes both 0.
#[inline(always)]
pub fn round_int(v: f32, even: bool) -> f32 {
    let v = v.clamp(-ROUND_LIMIT, ROUND_LIMIT);
    if even {
        (v + ROUND_MAGIC) - ROUND_MAGIC
    } else {
        let a = v.abs() + 0.5; // exact: |v| <= 2^22 has a spacing of at most 1/2
        let r = (a + ROUND_MAGIC) - ROUND_MAGIC;
        let floor = if r > a { r - 1.0 } else { r };
        floor.copysign(v)
    }
}

impl Rule {
    /// The rule of an affine scheme (`scheme.offset` set) under these options.
    pub fn new(scheme: &QuantScheme, scale_rounding: ScaleRounding, rounding: Rounding) -> Self {
        Self {
            offset: scheme.offset.expect("an affine scheme"),
            qmax: scheme.value.range().1,
            dtype: scheme.scale_dtype(),
            scale_rounding,
            rounding,
        }
    }

    /// The stored scale and offset of a block whose values span [lo, hi] (lo ≤ hi, finite).
    ///
    /// Zero: the range is widened to hold 0, s = (hi − lo) / qmax rounded to the scale dtype,
    /// z = clamp(round_half_even(−lo / s), 0, qmax); s = 0 gives z = 0.
    /// Bias: b = lo rounded to nearest even in the bias dtype, s = (hi − b) / qmax rounded
    /// (where b rounded above hi, so that this is negative: (hi − lo) / qmax).
    #[inline]
    pub fn params(&self, lo: f32, hi: f32) -> (f32, f32) {
        match self.offset {
            Offset::Zero => {
                let lo = if lo < 0.0 { lo } else { 0.0 };
                let hi = if hi > 0.0 { hi } else { 0.0 };
                let s = self
                    .dtype
                    .round(span(hi, lo, self.qmax), self.scale_rounding);
                if s == 0.0 {
                    return (0.0, 0.0);
                }
                let z = clamp((-lo / s).round_ties_even(), 0.0, self.qmax) + 0.0;
                (s, z)
            }
            Offset::Bias(bd) => {
                let b = round_bias(lo, bd);
                let mut raw = span(hi, b, self.qmax);
                if raw < 0.0 {
                    // b rounded above hi (or a searched range came out reversed): never a
                    // negative scale.
                    let r = span(hi, lo, self.qmax);
                    raw = if r > 0.0 { r } else { 0.0 };
                }
                (self.dtype.round(raw, self.scale_rounding), b)
            }
        }
    }

    /// The code of `x` (finite) in a block of scale `s` and offset `off`, as an f32 integer.
    #[inline(always)]
    pub fn code(&self, x: f32, s: f32, off: f32) -> f32 {
        code_of(
            self.offset,
            self.rounding == Rounding::HalfEven,
            self.qmax,
            x,
            s,
            off,
        )
    }

    /// The value of code `q` in a block of scale `s` and offset `off`.
    #[inline(always)]
    pub fn value(&self, q: f32, s: f32, off: f32) -> f32 {
        value_of(matches!(self.offset, Offset::Zero), q, s, off)
    }
}

/// [`Rule::code`] spelled out: zero point q = clamp(round(x / s) + z, 0, qmax), bias
/// q = clamp(round((x − b) / s), 0, qmax); 0 when s = 0.
#[inline(always)]
pub fn code_of(offset: Offset, even: bool, qmax: f32, x: f32, s: f32, off: f32) -> f32 {
    if s == 0.0 {
        return 0.0;
    }
    let v = match offset {
        Offset::Zero => round_int(x / s, even) + off,
        Offset::Bias(_) => round_int((x - off) / s, even),
    };
    clamp(v, 0.0, qmax)
}

/// [`Rule::value`] spelled out: zero point f32(q − z) × s, bias f32(q) × s + b (two roundings,
/// never fused).
#[inline(always)]
pub fn value_of(zero: bool, q: f32, s: f32, off: f32) -> f32 {
    if zero {
        (q - off) * s
    } else {
        q * s + off
    }
}
