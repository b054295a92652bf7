//! The pass-through types F32, F16 and BF16 (a "block" is one value), and the float16
//! conversions every block type's scales go through: numpy's casts, bit for bit.

use rayon::prelude::*;

use super::block::{Block, GROUP, INF_BITS, TASK_VALUES};
use super::float16::{f16_bits, f16_value, f32_to_f16};
use crate::input::Input;

#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct F32;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct F16;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct BF16;

/// The float types: a "block" is one value, and a group is converted in one straight loop.
macro_rules! plain_group {
    ($to_bits:expr, $ty:ty) => {
        #[inline(always)]
        fn encode_group(x: &[f32], out: &mut [u8]) -> bool {
            let mut bits = [0 as $ty; GROUP];
            let mut m = 0u32;
            for (b, &v) in bits.iter_mut().zip(x) {
                *b = $to_bits(v);
                m = m.max(v.to_bits() & 0x7FFF_FFFF);
            }
            for (o, b) in out.chunks_exact_mut(Self::TS).zip(bits) {
                o.copy_from_slice(&b.to_le_bytes());
            }
            m >= INF_BITS
        }
    };
}

impl Block for F32 {
    const BS: usize = 1;
    const TS: usize = 4;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        out.copy_from_slice(&x[0].to_le_bytes());
        !x[0].is_finite()
    }
    plain_group!(f32::to_bits, u32);
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

impl Block for F16 {
    const BS: usize = 1;
    const TS: usize = 2;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        out.copy_from_slice(&f16_bits(x[0]));
        !x[0].is_finite()
    }
    plain_group!(f32_to_f16, u16);
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        out[0] = f16_value(b);
    }
    #[cfg(target_arch = "x86_64")]
    const DECODE_AVX2: Option<super::block::DecodeRun> =
        Some(super::legacy_avx2::f16_decode::<Self>);
}

/// Round to nearest even on the bits, as gguf-py (and ggml's `ggml_compute_fp32_to_bf16`) do.
impl Block for BF16 {
    const BS: usize = 1;
    const TS: usize = 2;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        out.copy_from_slice(&f32_to_bf16(x[0]).to_le_bytes());
        !x[0].is_finite()
    }
    plain_group!(f32_to_bf16, u16);
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        out[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
    }
    #[cfg(target_arch = "x86_64")]
    const DECODE_AVX2: Option<super::block::DecodeRun> =
        Some(super::legacy_avx2::bf16_decode::<Self>);
}

/// Round to nearest even on the bits (finite values; a NaN or infinity is refused before it is
/// written). In u32: 0x7F7F_FFFF + 0x8000 does not overflow.
#[inline(always)]
fn f32_to_bf16(v: f32) -> u16 {
    let n = v.to_bits();
    (n.wrapping_add(0x7FFF + ((n >> 16) & 1)) >> 16) as u16
}

/// F16 output: `half` converts a slice at a time with F16C where the CPU has it (one
/// instruction for eight values; the same rounding to nearest even as numpy's cast).
pub(super) fn encode_f16(x: Input<'_>, out: &mut [u8]) -> bool {
    use half::slice::HalfFloatSliceExt;
    out.par_chunks_mut(TASK_VALUES * 2)
        .enumerate()
        .map_init(Vec::new, |buf, (t, o)| {
            let xs = x.read(t * TASK_VALUES, o.len() / 2, buf);
            #[cfg(target_arch = "x86_64")]
            if crate::simd::has_avx2() && crate::simd::has_f16c() {
                // SAFETY: the CPU has AVX2 and F16C, checked just above.
                return unsafe { super::legacy_avx2::f16_run(xs, o) };
            }
            let mut bad = false;
            let mut h = [half::f16::ZERO; 1024];
            for (xc, oc) in xs.chunks(1024).zip(o.chunks_mut(2048)) {
                bad |= xc.iter().fold(0, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF)) >= INF_BITS;
                let h = &mut h[..xc.len()];
                h.convert_from_f32_slice(xc);
                for (b, v) in oc.chunks_exact_mut(2).zip(h.iter()) {
                    b.copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
            bad
        })
        .reduce(|| false, |a, b| a | b)
}

/// float64 → float16 for F16 output (the other inputs go through [`F16`] via f32, which is
/// exact for float16/bfloat16 input and is what numpy does for float32).
pub(super) fn encode_f16_from_f64(x: &[f64], out: &mut [u8]) -> bool {
    out.par_chunks_mut(TASK_VALUES * 2)
        .zip(x.par_chunks(TASK_VALUES))
        .map(|(o, xs)| {
            let mut bad = false;
            for (&v, o) in xs.iter().zip(o.chunks_exact_mut(2)) {
                // Non-finite as the other types see it: after the cast to f32.
                bad |= !(v as f32).is_finite();
                o.copy_from_slice(&f64_to_f16_bits(v).to_le_bytes());
            }
            bad
        })
        .reduce(|| false, |a, b| a | b)
}
/// float64 → float16 bits, rounded once to nearest even (as numpy casts; `half`'s F16C path
/// would round to f32 first, and double rounding differs on some values).
pub(super) fn f64_to_f16_bits(v: f64) -> u16 {
    let sign = ((v.to_bits() >> 48) & 0x8000) as u16;
    let a = v.abs();
    if a.is_nan() {
        return sign | 0x7E00;
    }
    // 65520 is halfway between f16's largest value and the next step: a tie to even, i.e. inf.
    if a >= 65520.0 {
        return sign | 0x7C00;
    }
    if a < 2f64.powi(-14) {
        // Subnormal: multiples of 2^-24. Scaling by a power of two is exact, so the one rounding
        // is the round_ties_even; 1024 comes out as the smallest normal's bits.
        return sign | (a * 2f64.powi(24)).round_ties_even() as u16;
    }
    let e = ((a.to_bits() >> 52) as i32) - 1023; // -14..=15
    let m = (a * 2f64.powi(10 - e)).round_ties_even() as u16; // 1024..=2048
                                                              // m = 2048 carries into the exponent, as it should.
    sign | ((((e + 15) as u16) << 10) + (m - 1024))
}
