use std::arch::x86_64::*;

use crate::codec::{E2M1Code, Encode, FloatCode, IntHalfAway, IntHalfEven};
use crate::minifloat::{E2M1, E4M3, E5M2};

/// The checked reciprocal's runs (AVX2, long and short, and AVX-512 where the CPU has it)
/// against the portable division, for every integer range and rounding: values a few
/// ulps from half-integer multiples of the scale, others far past the range, and NaNs,
/// infinities and zeros among them; runs of every length up to 300 at several offsets.
#[test]
fn reciprocal_runs_equal_the_division() {
    use crate::pack::tests::Rng;
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn avx2<C: Encode, const LONG: bool>(c: C, xs: &[f32], e: f32, out: &mut [u8]) -> bool {
        let r = super::checked_reciprocal(e).unwrap();
        let range = c.int_range().unwrap();
        super::x86_runs::encode_run_recip::<C, LONG>(c, xs, e, r, range, out, false)
    }
    fn check<C: Encode>(c: C, rng: &mut Rng, qmax: f32) {
        let mut misses = 0;
        for _ in 0..40 {
            let e = f32::from_bits(0x0080_0000 + rng.below(0x7400_0000) as u32);
            let x: Vec<f32> = (0..1000)
                .map(|_| {
                    let k = (rng.below(2 * qmax as usize + 6) as f32 - qmax - 3.0) + 0.5;
                    let x = (k as f64 * e as f64) as f32;
                    let x = f32::from_bits(
                        (x.to_bits() as i32).wrapping_add(rng.below(7) as i32 - 3) as u32,
                    );
                    match rng.below(60) {
                        0 => f32::NAN,
                        1 => f32::INFINITY,
                        2 => -0.0,
                        3 => x * 1e6,
                        _ if x.is_finite() => x,
                        _ => e,
                    }
                })
                .collect();
            let want: Vec<u8> = x.iter().map(|&v| c.encode(v / e)).collect();
            let bad = x.iter().any(|v| !v.is_finite());
            misses += x
                .iter()
                .filter(|&&v| c.encode(v * (1.0 / e)) != c.encode(v / e))
                .count();
            for (start, len) in [(0, 1000), (3, 997), (1, 300), (5, 64), (7, 63), (2, 31)] {
                let (xs, want) = (&x[start..start + len], &want[start..start + len]);
                let wbad = xs.iter().any(|v| !v.is_finite());
                let mut got = vec![0xA5u8; len];
                // SAFETY: the CPU's features checked first.
                if super::has_avx2() && super::has_f16c() {
                    assert_eq!(unsafe { avx2::<C, true>(c, xs, e, &mut got) }, wbad);
                    assert_eq!(got, want, "AVX2 long, e = {e:e}");
                    got.fill(0xA5);
                    assert_eq!(unsafe { avx2::<C, false>(c, xs, e, &mut got) }, wbad);
                    assert_eq!(got, want, "AVX2, e = {e:e}");
                }
                if super::has_avx512() {
                    got.fill(0xA5);
                    let (r, range) = (1.0 / e, c.int_range().unwrap());
                    let b = unsafe {
                        super::x86_runs::encode_run_recip512(c, xs, e, r, range, &mut got, false)
                    };
                    assert_eq!(b, wbad);
                    assert_eq!(got, want, "AVX-512, e = {e:e}");
                }
            }
            assert!(bad);
        }
        assert!(misses > 20, "only {misses} values where the product misses");
    }
    let mut rng = Rng::new(31);
    for (qmin, qmax) in [
        (-127.0, 127.0),
        (-128.0, 127.0),
        (-8.0, 7.0),
        (-7.0, 7.0),
        (-2.0, 1.0),
    ] {
        check(IntHalfAway { qmin, qmax }, &mut rng, qmax);
        check(IntHalfEven { qmin, qmax }, &mut rng, qmax);
    }
}

/// `encode8` against `encode` on the f32 bit patterns `first, first + step, ...` (a
/// multiple of 8 of them), eight at a time; returns the first disagreement.
fn mismatch<C: Encode>(codec: C, first: u64, step: u64, count: u64) -> Option<(u32, u8, u8)> {
    #[target_feature(enable = "avx2")]
    unsafe fn run<C: Encode>(codec: C, first: u64, step: u64, count: u64) -> Option<(u32, u8, u8)> {
        let mut lanes = [0u32; 8];
        let (mut got, mut in_range) = ([0u32; 8], [0u32; 8]);
        for k in (0..count).step_by(8) {
            for (j, l) in lanes.iter_mut().enumerate() {
                *l = (first + (k + j as u64) * step) as u32;
            }
            let v = _mm256_loadu_ps(lanes.as_ptr() as *const f32);
            _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, codec.encode8(v));
            _mm256_storeu_si256(in_range.as_mut_ptr() as *mut __m256i, {
                codec.encode8_in_range(v)
            });
            let bound = codec.unclamped_below().unwrap_or(0.0);
            for (j, &b) in lanes.iter().enumerate() {
                let want = codec.encode(f32::from_bits(b));
                if got[j] != want as u32 {
                    return Some((b, got[j] as u8, want));
                }
                // The unclamped encoder, where it is allowed.
                if f32::from_bits(b).abs() < bound && in_range[j] != want as u32 {
                    return Some((b, in_range[j] as u8, want));
                }
            }
        }
        None
    }
    if !super::has_avx2() {
        return None;
    }
    // SAFETY: the CPU has AVX2, checked just above.
    unsafe { run(codec, first, step, count) }
}

/// Every codec's vector encoder, on `count` patterns `step` apart from `first`.
fn check_all(first: u64, step: u64, count: u64) {
    fn check<C: Encode>(name: &str, codec: C, first: u64, step: u64, count: u64) {
        if let Some((b, got, want)) = mismatch(codec, first, step, count) {
            panic!(
                "{name}: {:e} ({b:#010x}) gives {got:#x}, encode {want:#x}",
                f32::from_bits(b)
            );
        }
    }
    for (lo, hi) in [
        (-128.0, 127.0),
        (-127.0, 127.0),
        (-8.0, 7.0),
        (-7.0, 7.0),
        (-2.0, 1.0),
        (-1.0, 1.0),
    ] {
        check(
            "half away",
            IntHalfAway { qmin: lo, qmax: hi },
            first,
            step,
            count,
        );
        check(
            "half even",
            IntHalfEven { qmin: lo, qmax: hi },
            first,
            step,
            count,
        );
    }
    check("E4M3", FloatCode(E4M3), first, step, count);
    check("E5M2", FloatCode(E5M2), first, step, count);
    check("E2M1", FloatCode(E2M1), first, step, count);
    check("E2M1 comparisons", E2M1Code, first, step, count);
}

/// A sweep over all bit patterns (every 8191st), and every pattern of the ranges where the
/// rounding decisions lie: near 0.5 (the half-away identity), the int and float ties.
#[test]
fn encode8_equals_encode_on_a_sweep() {
    check_all(0, 8191, (1u64 << 32) / 8191 / 8 * 8);
    for center in [
        0.5f32, 1.5, 2.5, 126.5, 0.25, 0.75, 5.0, 448.0, 464.0, 57344.0, 0.015625,
    ] {
        for sign in [0u32, 0x8000_0000] {
            let b = (center.to_bits() | sign) as u64;
            check_all(b - 4096, 1, 8192);
        }
    }
    // Through the formats' subnormal ranges (E5M2's from 2^-16, E4M3's and E2M1's).
    check_all(0x3780_0000, 257, 0x0600_0000 / 257 / 8 * 8);
}

/// `decode8` against `decode` on every byte, bit for bit (NaN payloads included), for
/// every decoder the kernels use.
#[test]
fn decode8_equals_decode_on_every_byte() {
    use crate::codec::{float_table, Decode, E2M1Decode, E4M3Decode, Fp8Decode, IntDecode};
    use crate::layout::Packing;
    #[target_feature(enable = "avx2")]
    unsafe fn check<D: Decode>(name: &str, dec: D) {
        let mut got = [0f32; 8];
        for b0 in (0..256u32).step_by(8) {
            let lanes: [u32; 8] = std::array::from_fn(|j| b0 + j as u32);
            let v = _mm256_loadu_si256(lanes.as_ptr() as *const __m256i);
            _mm256_storeu_ps(got.as_mut_ptr(), dec.decode8(v));
            for (&b, g) in lanes.iter().zip(got) {
                let want = dec.decode(b as u8);
                assert_eq!(g.to_bits(), want.to_bits(), "{name} byte {b:#x}");
            }
        }
    }
    // decode16 (own or the default of two decode8) against decode: every byte in every
    // lane position (the bytes rotated by 0..16).
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn check16<D: Decode>(name: &str, dec: D) {
        let mut got = [0f32; 16];
        for rot in 0..16u32 {
            for b0 in (0..256u32).step_by(16) {
                let lanes: [u16; 16] =
                    std::array::from_fn(|j| ((b0 + (j as u32 + rot) % 16) & 0xFF) as u16);
                let v = _mm256_loadu_si256(lanes.as_ptr() as *const __m256i);
                let (a, b) = dec.decode16(v);
                _mm256_storeu_ps(got.as_mut_ptr(), a);
                _mm256_storeu_ps(got.as_mut_ptr().add(8), b);
                for (&b, g) in lanes.iter().zip(got) {
                    let want = dec.decode(b as u8);
                    assert_eq!(g.to_bits(), want.to_bits(), "{name} decode16 byte {b:#x}");
                }
            }
        }
    }
    if !super::has_avx2() {
        return;
    }
    let (t4, t5) = (float_table(&E4M3), float_table(&E5M2));
    if super::has_f16c() {
        // SAFETY: the CPU has AVX2 and F16C, checked just above.
        unsafe {
            check16("E4M3", E4M3Decode(&t4));
            check16("E2M1", E2M1Decode);
        }
    }
    // SAFETY: the CPU has AVX2, checked just above.
    unsafe {
        check("E4M3 (E4M3Decode)", E4M3Decode(&t4));
        check(
            "E4M3",
            Fp8Decode {
                table: &t4,
                fmt: E4M3,
            },
        );
        check(
            "E5M2",
            Fp8Decode {
                table: &t5,
                fmt: E5M2,
            },
        );
        check("E2M1", E2M1Decode);
        for field_bits in [8, 4, 2] {
            let p = Packing {
                word_bits: 8,
                per: 8 / field_bits as usize,
                field_bits,
                axis: 0,
                outer: 1,
                n_axis: 1,
                inner: 1,
                words_axis: 1,
                swapped: false,
                native: field_bits == 8,
            };
            check("int", IntDecode::new(&p));
        }
    }
}

/// The vector scale roundings against `ScaleDtype::round` / `mx_scale_code` on the
/// non-negative bit patterns `first, first + step, ...` (NaNs left out: a block's max never
/// is one).
fn check_scales(first: u32, step: u32, count: u32) {
    use crate::scale::{mx_scale_code, ScaleRounding};
    use crate::scheme::ScaleDtype;
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn run(first: u32, step: u32, count: u32) {
        let mut lanes = [0f32; 8];
        let mut got = [0f32; 8];
        for k in (0..count).step_by(8) {
            for (j, l) in lanes.iter_mut().enumerate() {
                let b = first.wrapping_add((k + j as u32).wrapping_mul(step)) & 0x7FFF_FFFF;
                *l = if b > 0x7F80_0000 {
                    0.0
                } else {
                    f32::from_bits(b)
                };
            }
            let v = _mm256_loadu_ps(lanes.as_ptr());
            for up in [false, true] {
                let mode = if up {
                    ScaleRounding::Up
                } else {
                    ScaleRounding::Nearest
                };
                _mm256_storeu_ps(got.as_mut_ptr(), super::x86::round_f16_8(v, up));
                for (&s, &g) in lanes.iter().zip(&got) {
                    let want = ScaleDtype::F16.round(s, mode);
                    assert_eq!(g.to_bits(), want.to_bits(), "f16 {mode:?} {s:e}");
                }
            }
            for up in [false, true] {
                let mode = if up {
                    ScaleRounding::Up
                } else {
                    ScaleRounding::Nearest
                };
                _mm256_storeu_ps(got.as_mut_ptr(), super::x86::round_bf16_8(v, up));
                for (&s, &g) in lanes.iter().zip(&got) {
                    let want = ScaleDtype::BF16.round(s, mode);
                    assert_eq!(g.to_bits(), want.to_bits(), "bf16 {mode:?} {s:e}");
                }
            }
            for up in [false, true] {
                let mode = if up {
                    ScaleRounding::Up
                } else {
                    ScaleRounding::Nearest
                };
                _mm256_storeu_ps(got.as_mut_ptr(), super::x86::round_ue4m3_8(v, up));
                for (&s, &g) in lanes.iter().zip(&got) {
                    let want = ScaleDtype::UE4M3.round(s, mode);
                    assert_eq!(g.to_bits(), want.to_bits(), "ue4m3 {mode:?} {s:e}");
                }
            }
            for up in [false, true] {
                let mode = if up {
                    ScaleRounding::Up
                } else {
                    ScaleRounding::Nearest
                };
                _mm256_storeu_ps(got.as_mut_ptr(), super::x86::round_ue8m0_8(v, up));
                for (&s, &g) in lanes.iter().zip(&got) {
                    let want = ScaleDtype::UE8M0.round(s, mode);
                    assert_eq!(g.to_bits(), want.to_bits(), "ue8m0 {mode:?} {s:e}");
                }
            }
            for emax in [0, 2, 6, 8, 15] {
                _mm256_storeu_ps(got.as_mut_ptr(), super::x86::mx_scale_8(v, emax));
                for (&s, &g) in lanes.iter().zip(&got) {
                    let want = ScaleDtype::UE8M0.decode_code(mx_scale_code(s, emax));
                    assert_eq!(g.to_bits(), want.to_bits(), "mx emax {emax} {s:e}");
                }
            }
        }
    }
    if super::has_avx2() && super::has_f16c() {
        // SAFETY: the CPU has AVX2 and F16C, checked just above.
        unsafe { run(first, step, count) }
    }
}

#[test]
fn vector_scales_equal_scalar_on_a_sweep() {
    check_scales(0, 4093, (1u32 << 31) / 4093 / 8 * 8);
    // Around f16's subnormals, its largest value and the saturation point; UE4M3's
    // subnormals, smallest normal and largest value (448); bfloat16's largest value,
    // f32's subnormals and smallest normal (bfloat16's too), and the infinity; UE8M0's
    // subnormal rounding points (2^-127, 1.5 · 2^-127) and its largest value, 2^127.
    for b in [
        0x0040_0000u32,
        0x0060_0000,
        0x7F00_0000,
        0x7F7F_0000,
        0x7F80_0000,
        0x0000_2000,
        0x0080_0000,
        0x3A80_0000,
        0x3C80_0000,
        0x43E0_0000,
        0x43E8_0000,
        0x3380_0000,
        0x3880_0000,
        0x477F_E000,
        0x477F_F000,
        0x4780_0000,
    ] {
        check_scales(b - 8192, 1, 16384);
    }
}

/// Every non-negative f32 through the vector scale roundings. Run with
/// `cargo test --release -p blockquant-core -- --ignored every_f32`.
#[test]
#[ignore]
fn vector_scales_equal_scalar_on_every_f32() {
    check_scales(0, 1, 1 << 31);
}

/// Every f32 bit pattern, every codec: the proof the identities in the vector encoders
/// hold. Slow (minutes in release); run with
/// `cargo test --release -p blockquant-core -- --ignored every_f32`.
#[test]
#[ignore]
fn encode8_equals_encode_on_every_f32() {
    check_all(0, 1, 1u64 << 32);
}
