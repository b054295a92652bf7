//! Value codes (format.md "Quantizing a value", "Dequantizing"): one scaled f32 to an 8-bit code, and a code back to f32.
//!
//! The kernels are generic over [`Encode`] so each (value, rounding) pair compiles to its own
//! branch-free loop.

use crate::layout::Packing;
use crate::minifloat::{MiniFloat, E2M1, E4M3, E5M2};
use crate::scheme::QuantValue;

/// Ties in integer rounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rounding {
    /// Half away from zero: burn's and ggml's `round`.
    #[default]
    HalfAway,
    /// Half to even: numpy, ONNX, PyTorch.
    HalfEven,
}

/// Turns `x / e` into an 8-bit code: ints sign-extended two's complement, floats their bit
/// pattern (E2M1 in the low nibble).
pub trait Encode: Copy + Send + Sync {
    fn encode(&self, xs: f32) -> u8;

    /// The code of every value of a block whose scale is 0 (format.md "Storing a scale: rounding to its dtype"'s zero rule): 0, except for
    /// a codebook, whose field for +0 is the index of the entry nearest to 0.
    #[inline(always)]
    fn zero_code(&self) -> u8 {
        0
    }

    /// [`Encode::encode`] of eight quotients at once, each code in the low byte of its i32
    /// lane (the other bits 0). Must equal `encode` on every f32, NaN included (tested on all
    /// 2^32 of them: `simd::tests`).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn encode8(&self, q: __m256) -> __m256i;

    /// A bound b such that [`Encode::encode`] never clamps a quotient |q| < b, where the codec
    /// clamps at all (integers: the smaller of |qmin| and qmax, plus 0.5); None otherwise.
    #[inline(always)]
    fn unclamped_below(&self) -> Option<f32> {
        None
    }

    /// [`Encode::encode8`] of eight quotients each below [`Encode::unclamped_below`] in
    /// magnitude: the clamp left out (a one-pass kernel knows this of a whole group from its
    /// maxima). Must equal `encode` on every such f32 (tested with `encode8`).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn encode8_in_range(&self, q: __m256) -> __m256i {
        self.encode8(q)
    }

    /// `[qmin, qmax]` of integer codes within [-128, 127], whose rounding boundaries are the
    /// half-integers (ties to even or away: the two agree off the boundaries); None for other
    /// codes. The kernels then may divide by a scale as a multiply by its rounded reciprocal,
    /// checked (`simd::x86::int_codes8_recip`).
    #[inline(always)]
    fn int_range(&self) -> Option<(f32, f32)> {
        None
    }
}

/// [`Encode::int_range`] of integer codes in `[qmin, qmax]`.
fn int_range(qmin: f32, qmax: f32) -> Option<(f32, f32)> {
    (qmin >= -128.0 && qmax <= 127.0).then_some((qmin, qmax))
}

/// [`Encode::unclamped_below`] of integer codes in `[qmin, qmax]`.
fn int_unclamped_below(qmin: f32, qmax: f32) -> Option<f32> {
    Some(qmax.min(-qmin) + 0.5)
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Integer values with half-away-from-zero ties.
#[derive(Clone, Copy)]
pub struct IntHalfAway {
    pub qmin: f32,
    pub qmax: f32,
}

/// Integer values with ties to even.
#[derive(Clone, Copy)]
pub struct IntHalfEven {
    pub qmin: f32,
    pub qmax: f32,
}

/// Clamp to `[lo, hi]` with plain comparisons (they compile to packed min/max); a NaN becomes
/// `lo`, so the result is always a finite number in range.
#[inline(always)]
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    let v = if v >= lo { v } else { lo };
    if v <= hi {
        v
    } else {
        hi
    }
}

impl Encode for IntHalfAway {
    #[inline(always)]
    fn encode(&self, xs: f32) -> u8 {
        // Clamping first is exact (qmin/qmax are integers and rounding is monotone).
        let v = clamp(xs, self.qmin, self.qmax);
        // SAFETY: v is finite and within [-128, 127], so it fits an i32.
        let t: i32 = unsafe { v.to_int_unchecked() }; // truncates toward zero
        let frac = v - t as f32; // exact for |v| < 2^23
        let q = t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32;
        q as i8 as u8
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn encode8(&self, q: __m256) -> __m256i {
        self.encode8_in_range(clamp8(q, self.qmin, self.qmax))
    }

    #[inline(always)]
    fn unclamped_below(&self) -> Option<f32> {
        int_unclamped_below(self.qmin, self.qmax)
    }

    #[inline(always)]
    fn int_range(&self) -> Option<(f32, f32)> {
        int_range(self.qmin, self.qmax)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn encode8_in_range(&self, v: __m256) -> __m256i {
        // Half away from zero as trunc(v + copysign(0.49999997, v)): the add carries a true
        // half (and only a half or more) past the next integer. Checked against `encode` on
        // every f32 (`simd::tests::encode8_equals_encode_on_every_f32`). The sign is picked by
        // one blend on v's sign bit.
        let h = f32::from_bits(0x3EFF_FFFF);
        let half = _mm256_blendv_ps(_mm256_set1_ps(h), _mm256_set1_ps(-h), v);
        byte_lanes(_mm256_cvttps_epi32(_mm256_add_ps(v, half)))
    }
}

/// `clamp` of eight lanes: `max(q, lo)` takes `lo` when `q` is NaN, as `clamp` does.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn clamp8(q: __m256, lo: f32, hi: f32) -> __m256 {
    _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(lo)), _mm256_set1_ps(hi))
}

/// The low byte of each i32 lane (an int8 code's two's complement byte).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn byte_lanes(v: __m256i) -> __m256i {
    _mm256_and_si256(v, _mm256_set1_epi32(0xFF))
}

impl Encode for IntHalfEven {
    #[inline(always)]
    fn encode(&self, xs: f32) -> u8 {
        let v = clamp(xs, self.qmin, self.qmax);
        // SAFETY: v is finite and within [-128, 127], so it fits an i32.
        let t: i32 = unsafe { v.to_int_unchecked() };
        let frac = v - t as f32;
        let odd = t & 1 != 0;
        let up = (frac > 0.5) | ((frac == 0.5) & odd);
        let down = (frac < -0.5) | ((frac == -0.5) & odd);
        let q = t + up as i32 - down as i32;
        q as i8 as u8
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn encode8(&self, q: __m256) -> __m256i {
        self.encode8_in_range(clamp8(q, self.qmin, self.qmax))
    }

    #[inline(always)]
    fn unclamped_below(&self) -> Option<f32> {
        int_unclamped_below(self.qmin, self.qmax)
    }

    #[inline(always)]
    fn int_range(&self) -> Option<(f32, f32)> {
        int_range(self.qmin, self.qmax)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn encode8_in_range(&self, v: __m256) -> __m256i {
        // roundps with the mode in the instruction, not MXCSR's (which a caller may change).
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        byte_lanes(_mm256_cvttps_epi32(r))
    }
}

/// Float values: round to nearest even on the bit pattern, saturating.
#[derive(Clone, Copy)]
pub struct FloatCode(pub MiniFloat);

impl Encode for FloatCode {
    #[inline(always)]
    fn encode(&self, xs: f32) -> u8 {
        self.0.encode(xs)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn encode8(&self, q: __m256) -> __m256i {
        minifloat8(&self.0, q)
    }
}

/// [`MiniFloat::encode`] of eight lanes. The magnitude is first clamped to the largest value
/// (a NaN too: `min` takes its second operand), then rounded to nearest even two ways: normal
/// results on the bit pattern (add just under half an output step, plus the kept lowest bit,
/// shift), results below the smallest normal by adding a constant whose f32 step is the
/// format's subnormal step (the add itself rounds to nearest even; the difference of the
/// bit patterns counts the steps).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn minifloat8(fmt: &MiniFloat, q: __m256) -> __m256i {
    let bits = _mm256_castps_si256(q);
    let sign = _mm256_srli_epi32::<31>(bits);
    let sign = _mm256_sllv_epi32(sign, _mm256_set1_epi32(fmt.sign_shift() as i32));
    let abs = _mm256_and_ps(q, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)));
    let a = _mm256_min_ps(abs, _mm256_set1_ps(fmt.max_value()));
    let ab = _mm256_castps_si256(a);
    let shift = 23 - fmt.man_bits as i32;
    let shift_v = _mm256_set1_epi32(shift);
    let odd = _mm256_and_si256(_mm256_srlv_epi32(ab, shift_v), _mm256_set1_epi32(1));
    let bias = _mm256_set1_epi32((1 << (shift - 1)) - 1);
    let rounded = _mm256_srlv_epi32(_mm256_add_epi32(_mm256_add_epi32(ab, bias), odd), shift_v);
    let rebias = (127 - fmt.bias) << fmt.man_bits;
    let normal = _mm256_sub_epi32(rounded, _mm256_set1_epi32(rebias));
    let emin = 1 - fmt.bias;
    let magic = f32::from_bits(((emin - fmt.man_bits as i32 + 23 + 127) as u32) << 23);
    let sub = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(a, _mm256_set1_ps(magic))),
        _mm256_set1_epi32(magic.to_bits() as i32),
    );
    // a < 2^emin: compare the (non-negative) bit patterns as ints.
    let min_normal = _mm256_set1_epi32((((emin + 127) as u32) << 23) as i32);
    let is_sub = _mm256_cmpgt_epi32(min_normal, ab);
    let mag = _mm256_blendv_epi8(normal, sub, is_sub);
    _mm256_or_si256(mag, sign)
}

/// E2M1 by comparisons: with only eight magnitudes, counting the midpoints passed is cheaper
/// than the generic bit path and vectorizes without variable shifts. `>` at a midpoint keeps the
/// lower (even) code, `>=` takes the upper (even) one: round to nearest, ties to even. Values
/// past 5 (the last midpoint) saturate at 6.
#[derive(Clone, Copy)]
pub struct E2M1Code;

impl Encode for E2M1Code {
    #[inline(always)]
    fn encode(&self, xs: f32) -> u8 {
        let a = xs.abs();
        let code = (a > 0.25) as u8
            + (a >= 0.75) as u8
            + (a > 1.25) as u8
            + (a >= 1.75) as u8
            + (a > 2.5) as u8
            + (a >= 3.5) as u8
            + (a > 5.0) as u8;
        code | (((xs.to_bits() >> 31) as u8) << 3)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn encode8(&self, q: __m256) -> __m256i {
        // The generic minifloat rounding gives the same codes (tested on every f32), but for
        // NaN, which no comparison passes: its magnitude is 0 here, the largest there.
        let codes = minifloat8(&crate::minifloat::E2M1, q);
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(q, q));
        _mm256_andnot_si256(_mm256_and_si256(nan, _mm256_set1_epi32(0x7)), codes)
    }
}

/// The minifloat format of a float value.
pub fn minifloat(value: QuantValue) -> Option<MiniFloat> {
    match value {
        QuantValue::E4M3 => Some(E4M3),
        QuantValue::E5M2 => Some(E5M2),
        QuantValue::E2M1 => Some(E2M1),
        _ => None,
    }
}

/// Turns a stored field into its f32 value.
pub trait Decode: Copy + Send + Sync {
    fn decode(&self, field: u8) -> f32;

    /// [`Decode::decode`] of eight fields, one a u32 lane (zero-extended bytes), bit for bit.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn decode8(&self, fields: __m256i) -> __m256;

    /// Whether [`Decode::decode16`] is this decoder's own, cheaper than two `decode8`: the
    /// kernels then take sixteen fields a step (a constant, so the choice costs nothing).
    const HAS_DECODE16: bool = false;

    /// [`Decode::decode`] of sixteen fields, one a u16 lane (zero-extended bytes): the first
    /// eight, then the last eight, bit for bit.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode16(&self, fields: __m256i) -> (__m256, __m256) {
        let lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(fields));
        let hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256::<1>(fields));
        (self.decode8(lo), self.decode8(hi))
    }
}

/// Int fields: sign-extend from the field's width (8 for Native, whose fields are whole int8
/// bytes). Plain arithmetic, so the dequantize loop vectorizes.
#[derive(Clone, Copy)]
pub struct IntDecode {
    shift: u32,
}

impl IntDecode {
    pub fn new(packing: &Packing) -> Self {
        Self {
            shift: 8 - packing.field_bits.min(8),
        }
    }
}

impl Decode for IntDecode {
    #[inline(always)]
    fn decode(&self, field: u8) -> f32 {
        (((field << self.shift) as i8) >> self.shift) as f32
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode8(&self, fields: __m256i) -> __m256 {
        // The field's top bit to the lane's sign bit and back: the sign extension of an int8
        // or narrower field, as the scalar shifts do.
        let k = _mm_cvtsi32_si128(24 + self.shift as i32);
        _mm256_cvtepi32_ps(_mm256_sra_epi32(_mm256_sll_epi32(fields, k), k))
    }
}

/// Float fields: one load from a 256-entry table (see [`float_table`]).
#[derive(Clone, Copy)]
pub struct TableDecode<'a>(pub &'a [f32; 256]);

impl Decode for TableDecode<'_> {
    #[inline(always)]
    fn decode(&self, field: u8) -> f32 {
        self.0[field as usize]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode8(&self, fields: __m256i) -> __m256 {
        // Fields are bytes, so every index is within the 256 entries.
        _mm256_i32gather_ps::<4>(self.0.as_ptr(), fields)
    }
}

/// FP8 fields (E4M3, E5M2): the table for one value at a time, the format's bits for eight
/// (no gather); NaN codes give the table's NaNs, bit for bit.
#[derive(Clone, Copy)]
pub struct Fp8Decode<'a> {
    pub table: &'a [f32; 256],
    pub fmt: MiniFloat,
}

impl Decode for Fp8Decode<'_> {
    #[inline(always)]
    fn decode(&self, field: u8) -> f32 {
        self.table[field as usize]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode8(&self, fields: __m256i) -> __m256 {
        let f = &self.fmt;
        let mag = _mm256_and_si256(fields, _mm256_set1_epi32(0x7F));
        let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(fields, _mm256_set1_epi32(0x80)));
        // Normal: the exponent rebiased, the mantissa moved to the top of f32's.
        let shift = _mm_cvtsi32_si128(23 - f.man_bits as i32);
        let normal = _mm256_add_epi32(
            _mm256_sll_epi32(mag, shift),
            _mm256_set1_epi32((127 - f.bias) << 23),
        );
        // Subnormal: the code times the smallest step (exact).
        let step = crate::minifloat::exp2i(1 - f.bias - f.man_bits as i32);
        let sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(step)));
        let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(1 << f.man_bits), mag);
        let v = _mm256_blendv_epi8(normal, sub, is_sub);
        // Specials: E5M2's all-ones exponent (infinity, or NaN), E4M3's all-ones code (NaN).
        let (inf_mag, nan_from) = if f.ieee_specials {
            let e = ((1 << f.exp_bits) - 1) << f.man_bits;
            (e, e + 1)
        } else {
            (0x80, 0x7F) // no infinity; 0x7F alone is NaN
        };
        let inf = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(inf_mag));
        let nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(nan_from - 1));
        let v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x7F80_0000), inf);
        let v = _mm256_blendv_epi8(v, _mm256_set1_epi32(f32::NAN.to_bits() as i32), nan);
        _mm256_castsi256_ps(_mm256_or_si256(v, sign))
    }
}

/// E4M3 fields (FP8 of mxfp8 and the per-tensor E4M3 schemes): [`Fp8Decode`] for one or eight
/// at a time; sixteen at a time through float16 (F16C's conversion), with fewer instructions
/// than the bit assembly of `decode8`, which left the block-32 dequantize behind the memory.
#[derive(Clone, Copy)]
pub struct E4M3Decode<'a>(pub &'a [f32; 256]);

impl Decode for E4M3Decode<'_> {
    #[inline(always)]
    fn decode(&self, field: u8) -> f32 {
        self.0[field as usize]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode8(&self, fields: __m256i) -> __m256 {
        Fp8Decode {
            table: self.0,
            fmt: E4M3,
        }
        .decode8(fields)
    }

    const HAS_DECODE16: bool = true;

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode16(&self, fields: __m256i) -> (__m256, __m256) {
        // The byte s eeee mmm as the float16 s 0 eeee mmm 0000000 (shifted into the lane's top
        // byte, arithmetic-shifted back one, the copied sign bit cleared). float16 has one
        // more exponent bit and bias 15 against 7, so this is the E4M3 value times 2^-8 for
        // normals and subnormals alike: × 256 after the conversion is exact.
        let h = _mm256_srai_epi16::<1>(_mm256_slli_epi16::<8>(fields));
        let h = _mm256_and_si256(h, _mm256_set1_epi16(0xBFFF_u16 as i16));
        // NaN codes (0x7F, 0xFF) came out as ±1.875·2^-8 (magnitude bits 0x3F80): xor them
        // into float16's ±0x7E00, whose conversion has f32::NAN's bits (sign kept), as the
        // table's. NaN × 256 × e keeps those bits.
        let nan = _mm256_cmpeq_epi16(_mm256_slli_epi16::<1>(h), _mm256_set1_epi16(0x7F00));
        let h = _mm256_xor_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x3F80 ^ 0x7E00)));
        let k = _mm256_set1_ps(256.0);
        let lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        let hi = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
        (_mm256_mul_ps(lo, k), _mm256_mul_ps(hi, k))
    }
}

/// E2M1 fields (only the low nibble counts, as in [`float_table`]): eight magnitudes and a sign
/// bit, so eight fields decode with one in-register permute instead of a gather.
#[derive(Clone, Copy)]
pub struct E2M1Decode;

const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

impl Decode for E2M1Decode {
    #[inline(always)]
    fn decode(&self, field: u8) -> f32 {
        let m = E2M1_MAGNITUDES[(field & 7) as usize];
        if field & 8 != 0 {
            -m
        } else {
            m
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode8(&self, fields: __m256i) -> __m256 {
        // The permute reads the low three bits of each lane; bit 3 moves to the sign.
        let mags = _mm256_loadu_ps(E2M1_MAGNITUDES.as_ptr());
        let m = _mm256_permutevar8x32_ps(mags, fields);
        let sign = _mm256_and_si256(_mm256_slli_epi32::<28>(fields), _mm256_set1_epi32(i32::MIN));
        _mm256_xor_ps(m, _mm256_castsi256_ps(sign))
    }
}

/// The value of every byte as a field of float format `fmt`: only its low bits count, so a
/// Native E2M1 byte with a non-zero high nibble decodes by its low nibble (format.md "Stores and packing").
pub fn float_table(fmt: &MiniFloat) -> [f32; 256] {
    let mask = (1u32 << (fmt.sign_shift() + 1)) - 1;
    std::array::from_fn(|i| fmt.decode((i as u32 & mask) as u8))
}

/// Whether a stored field is a valid code of `value` (used when taking storage from a caller).
pub fn field_is_valid(value: QuantValue, packing: &Packing, field: u32) -> bool {
    match minifloat(value) {
        Some(fmt) => {
            let bits = value.bits();
            if field >> bits != 0 {
                return false; // Native E2M1 with a non-zero high nibble
            }
            fmt.decode(field as u8).is_finite() && fmt.decode(field as u8).abs() <= fmt.max_value()
        }
        None if value.is_unsigned() => field as f32 <= value.range().1,
        None => {
            let w = packing.field_bits;
            let v = (((field << (32 - w)) as i32) >> (32 - w)) as f32;
            let (lo, hi) = value.range();
            v >= lo && v <= hi
        }
    }
}

/// Encode one run against one scale; returns whether any input was non-finite.
#[inline(always)]
pub(crate) fn encode_run<C: Encode>(codec: C, xs: &[f32], e: f32, out: &mut [u8]) -> bool {
    let mut bad = 0u32;
    if e == 0.0 {
        // Zero rule: nothing to divide by, every code is the code of 0.
        let zero = codec.zero_code();
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = zero;
            bad |= non_finite(x);
        }
    } else {
        for (o, &x) in out.iter_mut().zip(xs) {
            // A true division, not a reciprocal multiply: format.md "Quantizing a value" pins the bits on it.
            *o = codec.encode(x / e);
            bad |= non_finite(x);
        }
    }
    bad != 0
}

#[inline(always)]
fn non_finite(x: f32) -> u32 {
    ((x.to_bits() & 0x7F80_0000) == 0x7F80_0000) as u32
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
