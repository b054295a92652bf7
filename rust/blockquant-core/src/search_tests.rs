//! Tests of [`crate::search`]: the search's definition, its fast paths against the plain
//! ones, and thread independence.

use super::*;
use crate::scheme::{QuantScheme, QuantStore};

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
    let sc = mse_scales(Input::F32(&x), None, &l, &mse_opts(), None);
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
            check(
                &|u| E2M1Q.qv(u),
                &|u| table[E2M1Code.encode(u) as usize],
                10.0,
            );
        } else {
            check(
                &|u| mq.qv(u),
                &|u| table[FloatCode(fmt).encode(u) as usize],
                1e6,
            );
        }
    }
    use crate::codec::{Encode, IntHalfAway, IntHalfEven};
    let (away, even) = (
        IntHalfAway {
            qmin: -8.0,
            qmax: 7.0,
        },
        IntHalfEven {
            qmin: -7.0,
            qmax: 7.0,
        },
    );
    let (aq, eq) = (
        IntAwayQ {
            qmin: -8.0,
            qmax: 7.0,
        },
        IntEvenQ {
            qmin: -7.0,
            qmax: 7.0,
        },
    );
    check(&|u| aq.qv(u), &|u| (away.encode(u) as i8) as f32, 20.0);
    check(&|u| eq.qv(u), &|u| (even.encode(u) as i8) as f32, 20.0);
}

/// The AVX2 loops (where the CPU has AVX2) give the portable loop's lanes, bit for bit,
/// with ties, saturation, tails and weights; elsewhere both sides are the portable loop.
#[test]
fn vector_lanes_equal_portable_lanes() {
    let mut xs: Vec<f32> = (0..203)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.0173)
        .collect();
    xs.extend([
        0.5, -0.5, 2.5, -3.5, 0.25, 0.75, 1.25, 1.75, 5.0, 7.5, -8.5, 100.0, -0.0,
    ]);
    let ws: Vec<f32> = (0..xs.len()).map(|i| (i % 5) as f32 * 0.3).collect();
    let eff = [0.37f32, 1.0, 1e-3, 55.0, 3e-39];
    let run = |q: &dyn Fn(&mut [[f32; 8]]), p: &dyn Fn(f32) -> [f32; 8]| {
        let mut out = [[0.0f32; 8]; 5];
        q(&mut out);
        for (o, &e) in out.iter().zip(&eff) {
            assert_eq!(o.map(f32::to_bits), p(e).map(f32::to_bits), "e = {e}");
        }
    };
    for w in [None, Some(&ws[..])] {
        for n in [xs.len(), 8, 7, 0] {
            let (x, w) = (&xs[..n], w.map(|w| &w[..n]));
            {
                let away = IntAwayQ {
                    qmin: -8.0,
                    qmax: 7.0,
                };
                let even = IntEvenQ {
                    qmin: -7.0,
                    qmax: 7.0,
                };
                run(&|o| away.lanes(x, w, &eff, o), &|e| {
                    portable_lanes(away, x, w, e)
                });
                run(&|o| even.lanes(x, w, &eff, o), &|e| {
                    portable_lanes(even, x, w, e)
                });
                run(&|o| E2M1Q.lanes(x, w, &eff, o), &|e| {
                    portable_lanes(E2M1Q, x, w, e)
                });
                for book in [&crate::lookup::IQ4_NL[..], &[1.5, -0.25, 0.25, -3.0]] {
                    let q = NearestEntry::new(&crate::lookup::Codebook::new(book).unwrap());
                    run(&|o| q.lanes(x, w, &eff, o), &|e| portable_lanes(q, x, w, e));
                }
            }
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
            .install(|| mse_scales(Input::F32(&x), Some(&w), l, &mse_opts(), None));
        let three = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap()
            .install(|| mse_scales(Input::F32(&x), Some(&w), l, &mse_opts(), None));
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
