//! Tests of [`crate::search`]: the search's definition, its fast paths against the plain
//! ones, and thread independence.

use super::*;
use crate::codec::minifloat;
use crate::lookup::{Codebook, NearestEntry};
use crate::scale::ScaleRounding;
use crate::scheme::{QuantScheme, QuantStore, ScaleDtype};
use crate::search::cands::FastRound;
use crate::search::values::{IntQ, MiniQ};

fn layout(value: QuantValue, block: &[usize], dtype: ScaleDtype, shape: &[usize]) -> Layout {
    let s = QuantScheme::default()
        .with_value(value)
        .with_store(QuantStore::Native)
        .per_block(block, dtype)
        .unwrap();
    Layout::new(&s, shape).unwrap()
}

fn mse_opts() -> QuantizeOptions {
    QuantizeOptions {
        calibration: Calibration::Mse,
        ..Default::default()
    }
}

/// The searched scale of each block is the candidate of least error, computed here the
/// plain way (one block at a time, straight loops), and never worse than minmax's.
#[test]
fn each_block_takes_its_least_error_candidate() {
    let l = layout(QuantValue::Q4S, &[8], ScaleDtype::F16, &[4, 20]);
    let x: Vec<f32> = (0..80)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13)
        .collect();
    let sc = mse_scales(Input::F32(&x), None, &l, &mse_opts(), None).unwrap();
    let ctx = Ctx::new(&l, ScaleRounding::Up, None);
    for b in 0..l.num_scales {
        let (r, k) = (b / 3, b % 3);
        let xs = &x[r * 20 + k * 8..r * 20 + (k * 8 + 8).min(20)];
        let alpha = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let mut cand = [0.0; MAX_CANDIDATES];
        let n = ctx.candidates(alpha, &mut cand);
        // Blocks of at most 8: one element a lane, the lanes summed pairwise.
        let err = |e: f32| -> f64 {
            let mut l = [0.0f32; 8];
            for (i, &v) in xs.iter().enumerate() {
                let u = v / e;
                let t = u - u.clamp(-7.0, 7.0).round();
                l[i] = t * t;
            }
            let s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
            (e as f64 * e as f64) * s as f64
        };
        let best = cand[..n]
            .iter()
            .fold(cand[0], |b, &c| if err(c) < err(b) { c } else { b });
        assert_eq!(sc.stored[b], best, "block {b}");
        assert!(err(sc.stored[b]) <= err(cand[0]));
    }
}

/// Each branch-free value function equals decoding the codec's code, over a sweep of f32s
/// (every 4099th bit pattern up to past the largest value, and each sign), NaN aside.
#[test]
fn value_functions_equal_decode_of_encode() {
    use crate::codec::{float_table, E2M1Code, FloatCode};
    let check = |q: &dyn Fn(f32) -> f32, code: &dyn Fn(f32) -> f32, top: f32| {
        for sign in [0u32, 0x8000_0000] {
            let mut bits = 0u32;
            while f32::from_bits(bits) <= top {
                let u = f32::from_bits(bits | sign);
                assert_eq!(q(u), code(u), "{u}"); // ±0 alike: only (u - q)² counts
                bits += 4099;
            }
            let inf = f32::from_bits(0x7F80_0000 | sign);
            assert_eq!(q(inf), code(inf));
        }
    };
    for value in [QuantValue::E4M3, QuantValue::E5M2, QuantValue::E2M1] {
        let fmt = minifloat(value).unwrap();
        let table = float_table(&fmt);
        let mq = MiniQ::new(value);
        if value == QuantValue::E2M1 {
            check(&|u| mq.qv(u), &|u| table[E2M1Code.encode(u) as usize], 10.0);
            // Each threshold of the codec and its neighbours.
            for t in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0] {
                for u in [t, t.next_up(), t.next_down()] {
                    for u in [u, -u] {
                        assert_eq!(mq.qv(u), table[E2M1Code.encode(u) as usize], "{u}");
                    }
                }
            }
        } else {
            check(
                &|u| mq.qv(u),
                &|u| table[FloatCode(fmt).encode(u) as usize],
                1e6,
            );
        }
    }
    // One integer function serves both roundings: the same error (u - q)², tie or not.
    use crate::codec::{Encode, IntHalfAway, IntHalfEven};
    for (lo, hi) in [(-8.0, 7.0), (-7.0, 7.0), (-1.0, 1.0), (-128.0, 127.0)] {
        let iq = IntQ { qmin: lo, qmax: hi };
        let away = IntHalfAway { qmin: lo, qmax: hi };
        let even = IntHalfEven { qmin: lo, qmax: hi };
        let sq = |u: f32, q: f32| ((u - q) * (u - q)).to_bits();
        check(&|u| iq.qv(u), &|u| (even.encode(u) as i8) as f32, 300.0);
        let mut bits = 0u32;
        while f32::from_bits(bits) <= 300.0 {
            for u in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let a = (away.encode(u) as i8) as f32;
                assert_eq!(sq(u, iq.qv(u)), sq(u, a), "{u}");
            }
            bits += 4099;
        }
        for t in -300..300 {
            let u = t as f32 + 0.5;
            let a = (away.encode(u) as i8) as f32;
            assert_eq!(sq(u, iq.qv(u)), sq(u, a), "{u}");
        }
    }
}

/// Each AVX2 value function gives its scalar one's bits, lane by lane, over the same sweep
/// (and the default lane-by-lane `qv8` stands for any value type without one).
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_value_functions_equal_scalar_ones() {
    use std::arch::x86_64::*;
    if !crate::simd::has_avx2() {
        return;
    }
    #[target_feature(enable = "avx2")]
    unsafe fn eight<Q: Dequant>(q: Q, u: &[f32; 8]) -> [f32; 8] {
        let mut o = [0.0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), q.qv8(_mm256_loadu_ps(u.as_ptr())));
        o
    }
    fn check<Q: Dequant>(q: Q, top: f32) {
        let mut us: Vec<f32> = Vec::new();
        let mut bits = 0u32;
        while f32::from_bits(bits) <= top {
            us.extend([f32::from_bits(bits), -f32::from_bits(bits)]);
            bits += 4099;
        }
        us.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.5, 2.5, -3.5]);
        for c in us.chunks(8) {
            let mut u = [0.0f32; 8];
            u[..c.len()].copy_from_slice(c);
            // SAFETY: AVX2 checked above.
            let v = unsafe { eight(q, &u) };
            for i in 0..8 {
                assert_eq!(v[i].to_bits(), q.qv(u[i]).to_bits(), "{}", u[i]);
            }
        }
    }
    check(
        IntQ {
            qmin: -8.0,
            qmax: 7.0,
        },
        20.0,
    );
    check(MiniQ::new(QuantValue::E2M1), 10.0);
    for book in [
        &crate::lookup::IQ4_NL[..],
        &crate::lookup::NF4[..],
        &[1.5, -0.25, 0.25, -3.0],
    ] {
        check(NearestEntry::new(&Codebook::new(book).unwrap()), 300.0);
    }
    check(MiniQ::new(QuantValue::E4M3), 1e6);
    check(MiniQ::new(QuantValue::E5M2), 1e6);
}

/// Codebooks for the Lookup tests: every shipped one, user ones of 16 and 4 entries (unsorted,
/// with −0, entries far apart whose midpoints round in f64, ±a pairs whose tie goes to +a).
fn test_codebooks() -> Vec<Codebook> {
    let mut books: Vec<Codebook> = crate::lookup::NAMED
        .iter()
        .map(|(_, v)| Codebook::new(v).unwrap())
        .collect();
    for v in [
        &[1.5, -0.25, 0.0, -3.0][..],
        &[-1.0, 1.0, 0.5, -0.5],
        &[2.0, 2f32.powi(-60), -3.0, -1e-40],
        &[
            0.1, -7.0, 3.0, 2.5, -0.1, 6.0, -2.0, 1.0, -1.0, 0.75, 4.0, -5.0, 1e-30, -1e30, 2e30,
            -0.0,
        ],
    ] {
        books.push(Codebook::new(v).unwrap());
    }
    books
}

/// u where the nearest entry changes, and around them: each midpoint of two entries (as f32)
/// and its neighbours up to 2 ulps away, each entry, ±0, the smallest and largest f32s, ±inf.
fn probes_at_thresholds(cb: &Codebook) -> Vec<f32> {
    let step = |x: f32, up: bool| {
        let b = x.to_bits() as i64 + if (x >= 0.0) == up { 1 } else { -1 };
        if x == 0.0 {
            if up {
                f32::from_bits(1)
            } else {
                -f32::from_bits(1)
            }
        } else {
            f32::from_bits(b as u32)
        }
    };
    let mut us = vec![
        0.0f32,
        -0.0,
        1e-45,
        -1e-45,
        1e-38,
        -1e-38,
        f32::MAX,
        f32::MIN,
    ];
    us.extend([f32::INFINITY, f32::NEG_INFINITY]);
    for i in 0..cb.len() {
        us.push(cb.get(i));
        for j in 0..cb.len() {
            let m = ((cb.get(i) as f64 + cb.get(j) as f64) / 2.0) as f32;
            let (mut lo, mut hi) = (m, m);
            us.push(m);
            for _ in 0..2 {
                lo = step(lo, false);
                hi = step(hi, true);
                us.extend([lo, hi]);
            }
        }
    }
    us
}

/// The codebook's AVX2 q(u) (a binary search) equals its scalar one (a select per threshold)
/// and the decoded code (the codec's count of thresholds) exactly at every threshold and a few
/// ulps either side, in every lane position.
#[cfg(target_arch = "x86_64")]
#[test]
fn codebook_vector_value_is_the_decoded_code_at_thresholds() {
    use crate::codec::Encode;
    use crate::lookup::LookupCode;
    use std::arch::x86_64::*;
    if !crate::simd::has_avx2() {
        return;
    }
    #[target_feature(enable = "avx2")]
    unsafe fn eight(q: NearestEntry, u: &[f32; 8]) -> [f32; 8] {
        let mut o = [0.0f32; 8];
        _mm256_storeu_ps(o.as_mut_ptr(), q.qv8(_mm256_loadu_ps(u.as_ptr())));
        o
    }
    for cb in test_codebooks() {
        let (q, code) = (NearestEntry::new(&cb), LookupCode::new(&cb));
        let us = probes_at_thresholds(&cb);
        for shift in 0..8 {
            for c in us[shift.min(us.len())..].chunks(8) {
                let mut u = [0.0f32; 8];
                u[..c.len()].copy_from_slice(c);
                // SAFETY: AVX2 checked above.
                let v = unsafe { eight(q, &u) };
                for i in 0..8 {
                    let want = cb.get(code.encode(u[i]) as usize);
                    assert_eq!(q.qv(u[i]).to_bits(), want.to_bits(), "{cb} at {:e}", u[i]);
                    assert_eq!(v[i].to_bits(), want.to_bits(), "{cb} at {:e}", u[i]);
                }
            }
        }
    }
}

/// A value type without a vector form: `qv8` is the default, lane by lane.
#[derive(Clone, Copy)]
struct Halves;

impl Dequant for Halves {
    fn qv(&self, u: f32) -> f32 {
        (u * 2.0).round() / 2.0 + 0.25
    }
}

/// The AVX2 sums (where the CPU has it) equal the portable ones bit for bit: every value
/// function, with ties, saturation, tails, weights, power-of-two scales (multiplied by their
/// reciprocal) and more candidates than one register group; elsewhere both sides are the
/// portable loop.
#[test]
fn vector_sums_equal_portable_sums() {
    let mut xs: Vec<f32> = (0..203)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.0173)
        .collect();
    xs.extend([
        0.5, -0.5, 2.5, -3.5, 0.25, 0.75, 1.25, 1.75, 5.0, 7.5, -8.5, 100.0, -0.0,
    ]);
    let ws: Vec<f32> = (0..xs.len()).map(|i| (i % 5) as f32 * 0.3).collect();
    let eff = [
        0.37f32,
        1.0,
        1e-3,
        55.0,
        3e-39,
        0.5,
        0.0,
        2.0f32.powi(-20),
        0.013,
        7.0,
        0.25,
    ];
    fn run<Q: Dequant>(q: Q, x: &[f32], w: Option<&[f32]>, eff: &[f32]) {
        for k in [1, 3, 8, eff.len()] {
            let (mut fast, mut plain) = ([0.0f32; MAX_CANDIDATES], [0.0f32; MAX_CANDIDATES]);
            chunk_sums(q, x, w, &eff[..k], &mut fast[..k]);
            chunk_sums_portable(q, x, w, &eff[..k], &mut plain[..k]);
            for j in 0..k {
                if eff[j] != 0.0 {
                    assert_eq!(fast[j].to_bits(), plain[j].to_bits(), "e = {}", eff[j]);
                }
            }
        }
    }
    for w in [None, Some(&ws[..])] {
        for n in [xs.len(), 32, 16, 8, 7, 1, 0] {
            let (x, w) = (&xs[..n], w.map(|w| &w[..n]));
            run(
                IntQ {
                    qmin: -8.0,
                    qmax: 7.0,
                },
                x,
                w,
                &eff,
            );
            run(
                IntQ {
                    qmin: -1.0,
                    qmax: 1.0,
                },
                x,
                w,
                &eff,
            );
            run(MiniQ::new(QuantValue::E2M1), x, w, &eff);
            for book in [&crate::lookup::IQ4_NL[..], &[1.5, -0.25, 0.25, -3.0]] {
                run(NearestEntry::new(&Codebook::new(book).unwrap()), x, w, &eff);
            }
            run(MiniQ::new(QuantValue::E4M3), x, w, &eff);
            run(MiniQ::new(QuantValue::E5M2), x, w, &eff);
            run(Halves, x, w, &eff);
        }
    }
}

/// The fast rounding equals the dtype's own, both modes, over a sweep of f32s from 0 past
/// the largest value (every 997th bit pattern), the dtype's values and their neighbours.
#[test]
fn fast_rounding_equals_the_dtypes_rounding() {
    for dtype in [ScaleDtype::F16, ScaleDtype::BF16, ScaleDtype::UE4M3] {
        let f = FastRound::new(dtype).unwrap();
        let mut xs: Vec<f32> = Vec::new();
        let mut bits = 0u32;
        while bits < 0x7F80_0000 {
            xs.push(f32::from_bits(bits));
            bits += 997;
        }
        for code in 0..0x7C00u32 {
            let v = dtype.decode_code(code);
            if v.is_finite() {
                xs.extend([v, f32::from_bits(v.to_bits() + 1), v.next_down()]);
            }
        }
        for s in xs.into_iter().filter(|s| s.is_finite() && *s >= 0.0) {
            for (up, mode) in [(true, ScaleRounding::Up), (false, ScaleRounding::Nearest)] {
                assert_eq!(
                    f.round(s, up).to_bits(),
                    dtype.round(s, mode).to_bits(),
                    "{dtype} {s:e} {mode:?}"
                );
            }
        }
    }
}

#[test]
fn ue8m0_candidates_are_the_neighbouring_powers_of_two() {
    let l = layout(QuantValue::E2M1, &[32], ScaleDtype::UE8M0, &[32]);
    let ctx = Ctx::new(&l, ScaleRounding::Mx, None);
    let mut c = [0.0; MAX_CANDIDATES];
    // α = 5: MX scale 2^(2 - 2) = 1.
    assert_eq!(ctx.candidates(5.0, &mut c), 3);
    assert_eq!(&c[..3], &[1.0, 0.5, 2.0]);
    // The smallest code has no lower neighbour.
    assert_eq!(ctx.candidates(0.0, &mut c), 2);
}

/// Per-tensor and large blocks are summed chunk by chunk; the result does not depend on the
/// thread count.
#[test]
fn the_result_does_not_depend_on_threads() {
    let n = 3 * CHUNK + 17;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i as u64 * 2654435761 % 1000) as f32 - 500.0) * 1e-3)
        .collect();
    let w: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25).collect();
    let per_tensor = Layout::new(
        &QuantScheme::default()
            .with_value(QuantValue::Q2S)
            .with_store(QuantStore::Native),
        &[n],
    )
    .unwrap();
    let big = layout(QuantValue::E2M1, &[CHUNK + 5], ScaleDtype::F16, &[n]);
    for l in [&per_tensor, &big] {
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| mse_scales(Input::F32(&x), Some(&w), l, &mse_opts(), None).unwrap());
        let three = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap()
            .install(|| mse_scales(Input::F32(&x), Some(&w), l, &mse_opts(), None).unwrap());
        assert_eq!(one, three);
    }
}

#[test]
fn bad_weights_are_refused() {
    assert!(check_weights(&[1.0, 0.0], 2).is_ok());
    let e = check_weights(&[1.0, -1.0], 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "weights must be finite and >= 0, got -1 at flat index 1"
    );
    assert!(check_weights(&[f32::NAN], 1).is_err());
    assert!(check_weights(&[1.0], 2).is_err());
}
