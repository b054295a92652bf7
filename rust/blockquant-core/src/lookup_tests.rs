use super::*;
use crate::codec::{Decode, Encode};

/// The AVX2 decoder against the table on every byte, for codebooks of 1, 4 and 16 entries
/// (−0.0 and the largest and smallest f32 among them), all eight lanes, every lane order.
#[test]
#[cfg(target_arch = "x86_64")]
fn lookup_decode8_equals_the_table_on_every_field() {
    if !crate::simd::has_avx2() {
        return;
    }
    let books: Vec<Vec<f32>> = vec![
        vec![0.5],
        vec![-1.0, -0.0, 0.25, f32::MAX],
        NAMED.iter().find(|(n, _)| *n == "nf4").unwrap().1.to_vec(),
        (0..16).map(|k| (k as f32 - 7.5) * 1e-30).collect(),
        (0..16)
            .map(|k| {
                if k == 9 {
                    f32::MIN
                } else {
                    k as f32 * 3.0 - 20.0
                }
            })
            .collect(),
    ];
    for values in books {
        let cb = Codebook::new(&values).unwrap();
        let table = decode_table(&cb);
        let dec = LookupDecode(&table);
        for f0 in 0..256u32 {
            // Lane j holds field (f0 + 37 j) mod 256: every field in every lane.
            let fields: [u32; 8] = std::array::from_fn(|j| (f0 + 37 * j as u32) % 256);
            // SAFETY: the CPU has AVX2 (checked above).
            let got: [f32; 8] = unsafe {
                std::mem::transmute(dec.decode8(_mm256_loadu_si256(fields.as_ptr().cast())))
            };
            for (f, g) in fields.iter().zip(got) {
                assert_eq!(g.to_bits(), table[*f as usize].to_bits(), "{values:?} {f}");
                assert_eq!(dec.decode(*f as u8).to_bits(), g.to_bits());
            }
        }
    }
}

fn next_down(x: f32) -> f32 {
    -next_up(-x)
}

/// |x − c| exactly, as a normalized f64 pair (TwoSum): pairs compare lexicographically.
fn distance(x: f32, c: f32) -> (f64, f64) {
    let (a, b) = (x as f64, -(c as f64));
    let s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    if s < 0.0 || (s == 0.0 && e < 0.0) {
        (-s, -e)
    } else {
        (s, e)
    }
}

/// The nearest entry by exact distances, ties to the larger magnitude, ±a ties to +a.
fn nearest(cb: &Codebook, x: f32) -> u8 {
    let mut best = 0usize;
    for k in 1..cb.len() {
        let (d, db) = (distance(x, cb.get(k)), distance(x, cb.get(best)));
        let (a, ab) = (cb.get(k).abs(), cb.get(best).abs());
        let closer = d.0 < db.0 || (d.0 == db.0 && d.1 < db.1);
        let tie = d == db;
        if closer || (tie && (a > ab || (a == ab && cb.get(k) > cb.get(best)))) {
            best = k;
        }
    }
    best as u8
}

fn books() -> Vec<Codebook> {
    vec![
        Codebook::new(&NF4).unwrap(),
        Codebook::new(&IQ4_NL).unwrap(),
        Codebook::new(&[1.5, -0.25, 0.0, -3.0]).unwrap(),
        Codebook::new(&[-1.0, 1.0, 0.5, -0.5]).unwrap(),
        // Entries far apart: their sums round in f64.
        Codebook::new(&[2.0, 2f32.powi(-60), -3.0, -1e-40]).unwrap(),
        Codebook::new(&[
            0.1, -7.0, 3.0, 2.5, -0.1, 6.0, -2.0, 1.0, -1.0, 0.75, 4.0, -5.0, 1e-30, -1e30, 2e30,
            -0.0,
        ])
        .unwrap(),
    ]
}

#[test]
fn thresholds_pick_the_nearest_entry() {
    for cb in books() {
        let code = LookupCode::new(&cb);
        // x / e may overflow to ±inf: the largest and smallest entries.
        let top = (0..cb.len()).max_by(|&a, &b| cb.get(a).total_cmp(&cb.get(b)));
        let bottom = (0..cb.len()).min_by(|&a, &b| cb.get(a).total_cmp(&cb.get(b)));
        assert_eq!(Some(code.encode(f32::INFINITY) as usize), top);
        assert_eq!(Some(code.encode(f32::NEG_INFINITY) as usize), bottom);
        let mut probes = vec![0.0f32, -0.0, 1e38, -1e38, f32::MAX, f32::MIN];
        for j in 0..cb.len() {
            for i in 0..cb.len() {
                let m = ((cb.get(i) as f64 + cb.get(j) as f64) / 2.0) as f32;
                for t in [m, next_up(m), next_down(m), -m, cb.get(i)] {
                    probes.push(t);
                }
            }
        }
        let mut s = 12345u64;
        for _ in 0..20000 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = f32::from_bits((s >> 32) as u32);
            if v.is_finite() {
                probes.push(v);
                probes.push(v * 1e-36);
            }
        }
        for x in probes {
            assert_eq!(code.encode(x), nearest(&cb, x), "{cb} at {x:e}");
        }
    }
}

#[test]
fn far_apart_entries_keep_the_exact_midpoint() {
    // m = 1 + 2^-61: 1.0 is below it, the next f32 above.
    let cb = Codebook::new(&[2f32.powi(-60), 2.0]).unwrap();
    let c = LookupCode::new(&cb);
    assert_eq!(c.encode(1.0), 0);
    assert_eq!(c.encode(next_up(1.0)), 1);
    // m = -(1e30 + 7) / 2: x = -1e30 / 2 is nearer to -7 by 3.5.
    let cb = Codebook::new(&[-7.0, -1e30]).unwrap();
    let c = LookupCode::new(&cb);
    let x = -1e30f32 / 2.0;
    assert_eq!(c.encode(x), 0);
    assert_eq!(c.encode(next_down(x)), 1);
}

#[test]
fn ties_go_to_the_larger_magnitude_and_plus() {
    let cb = Codebook::new(&[-1.0, 1.0, 0.5, -0.5]).unwrap();
    let c = LookupCode::new(&cb);
    assert_eq!(c.encode(0.0), 2); // 0 is ±0.5's midpoint: the tie goes to +0.5, field 2
    assert_eq!(cb.get(c.encode(0.0) as usize), 0.5);
    assert_eq!(cb.get(c.encode(-0.0) as usize), 0.5);
    assert_eq!(cb.get(c.encode(0.75) as usize), 1.0);
    assert_eq!(cb.get(c.encode(-0.75) as usize), -1.0);
    assert_eq!(cb.get(c.zero_code() as usize), 0.5);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn encode8_equals_encode() {
    if !crate::simd::has_avx2() {
        return;
    }
    for cb in books() {
        let code = LookupCode::new(&cb);
        let mut s = 99u64;
        for _ in 0..20_000 {
            let mut lanes = [0f32; 8];
            for l in &mut lanes {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let k = (s >> 60) as usize % cb.len();
                let jitter = ((s >> 20) as u32 % 5) as i32 - 2;
                // Entries, the thresholds the binary search compares with (each level's),
                // special values and any bits, each give or take two ulps.
                let base = match s & 3 {
                    0 => cb.get(k),
                    1 => code.thresholds[k % (cb.len() - 1)],
                    2 => [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]
                        [(s >> 40) as usize % 5],
                    _ => f32::from_bits((s >> 32) as u32),
                };
                let mut v = base;
                for _ in 0..jitter.abs() {
                    v = if jitter > 0 { next_up(v) } else { next_down(v) };
                }
                *l = v;
            }
            let mut got = [0i32; 8];
            // SAFETY: AVX2 checked above; the arrays hold eight lanes.
            unsafe {
                let r = code.encode8(_mm256_loadu_ps(lanes.as_ptr()));
                _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, r);
            }
            for (g, &x) in got.iter().zip(&lanes) {
                assert_eq!(*g, code.encode(x) as i32, "{cb} at {x:e}");
            }
        }
    }
}

#[test]
fn nearest_entry_is_the_decoded_code() {
    for cb in books() {
        let (code, q) = (LookupCode::new(&cb), NearestEntry::new(&cb));
        let mut s = 7u64;
        for _ in 0..20000 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = (s >> 60) as usize % cb.len();
            let u = if s & 1 == 0 {
                cb.get(k) * ((s >> 40) as u32 % 3) as f32 / 2.0
            } else {
                f32::from_bits((s >> 32) as u32)
            };
            if u.is_nan() {
                continue;
            }
            let want = cb.get(code.encode(u) as usize);
            assert_eq!(q.value(u).to_bits(), want.to_bits(), "{cb} at {u:e}");
        }
    }
}

#[test]
fn bad_codebooks_name_the_rule() {
    assert!(Codebook::new(&[1.0, f32::NAN])
        .unwrap_err()
        .to_string()
        .contains("finite"));
    assert!(Codebook::new(&[1.0, 1.0])
        .unwrap_err()
        .to_string()
        .contains("distinct"));
    assert!(Codebook::new(&[0.0, -0.0])
        .unwrap_err()
        .to_string()
        .contains("distinct"));
    let cb = Codebook::new(&[1.0, 2.0, 3.0]).unwrap();
    assert!(cb
        .check_bits(2, "Q2S")
        .unwrap_err()
        .to_string()
        .contains("4 entries"));
    assert!(Codebook::new(&NF4).unwrap().check_bits(8, "Q8F").is_err());
}

#[test]
fn named_codebooks_print_their_names() {
    assert_eq!(Codebook::new(&NF4).unwrap().to_string(), "nf4");
    assert_eq!(Codebook::named("iq4nl").unwrap().half_range(), 127.0);
    assert_eq!(
        Codebook::new(&[1.5, -0.25, 0.0, -3.0]).unwrap().to_string(),
        "[1.5,-0.25,0.0,-3.0]"
    );
    assert_eq!(Codebook::new(&NF4).unwrap().mx_emax(), 0);
    assert_eq!(Codebook::new(&IQ4_NL).unwrap().mx_emax(), 6);
}
