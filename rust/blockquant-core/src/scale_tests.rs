use super::*;
use ScaleRounding::{Nearest, Up};

/// The slice reader against the one-scale reader, bit for bit: every code of the 8- and
/// 16-bit dtypes (NaNs and infinities included) in one slice, and f32 words of every
/// exponent; `sb` − 1 trailing bytes are not a scale.
#[test]
fn reading_a_slice_of_scales_equals_reading_each() {
    let mut f32_bytes = Vec::new();
    for e in 0..=255u32 {
        for m in [0, 1, 0x40_0000, 0x7F_FFFF, 0x12_3457] {
            f32_bytes.extend(((e << 23) | m).to_le_bytes());
            f32_bytes.extend(((1 << 31) | (e << 23) | m).to_le_bytes());
        }
    }
    let u8_bytes: Vec<u8> = (0..=255u8).collect();
    let u16_bytes: Vec<u8> = (0..=u16::MAX).flat_map(|c| c.to_le_bytes()).collect();
    for dtype in ScaleDtype::ALL {
        let sb = dtype.size_bytes();
        let bytes = match sb {
            4 => &f32_bytes,
            2 => &u16_bytes,
            _ => &u8_bytes,
        };
        for take in [bytes.len(), bytes.len() - 1, 7 * sb, 0] {
            let got = dtype.read_le_all(&bytes[..take]).unwrap();
            let want: Vec<f32> = bytes[..take]
                .chunks_exact(sb)
                .map(|c| dtype.read_le(c))
                .collect();
            assert_eq!(got.len(), take / sb, "{dtype}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{dtype} scale {i}");
            }
        }
    }
}

/// Scales are finite and ≥ 0 (−0 included): every other kind of value is refused, by index,
/// wherever it sits in a long array (the vectorized pass, then the search for it).
#[test]
fn check_scales_refuses_exactly_the_non_finite_and_negative() {
    let values = [
        0.0,
        -0.0,
        f32::from_bits(1),
        f32::MAX,
        1.5,
        -f32::from_bits(1),
        -1.0,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7FC0_0001),
        f32::from_bits(0xFF80_0001),
    ];
    for v in values {
        let ok = v.is_finite() && v >= 0.0;
        for (len, at) in [(1, 0), (1000, 0), (1000, 517), (1000, 999)] {
            let mut s = vec![0.25f32; len];
            s[at] = v;
            match check_scales(&s, "scales") {
                Ok(()) => assert!(ok, "{v} accepted"),
                Err(e) => {
                    assert!(!ok, "{v} refused");
                    assert!(e.to_string().contains(&format!("at index {at}")), "{e}");
                }
            }
        }
    }
}

/// Rounding leaves each value of the dtype as it is, in every mode the dtype takes (what
/// `compute_scales` relies on to copy given scales that are already in their dtype):
/// every code of the 16- and 8-bit dtypes, f32 at its edges and a spread of patterns.
#[test]
fn rounding_leaves_every_value_of_the_dtype_alone() {
    let f32_bits =
        (0..=0x7F7F_FFFFu32)
            .step_by(0x1_0001)
            .chain([0, 1, 0x007F_FFFF, 0x0080_0000, 0x7F7F_FFFF]);
    let cases: [(ScaleDtype, Vec<u32>); 5] = [
        (ScaleDtype::F32, f32_bits.collect()),
        (ScaleDtype::F16, (0..=0x7BFF).collect()),
        (ScaleDtype::BF16, (0..=0x7F7F).collect()),
        (ScaleDtype::UE4M3, (0..=0x7E).collect()),
        (ScaleDtype::UE8M0, (0..=UE8M0_MAX_CODE).collect()),
    ];
    for (dtype, codes) in cases {
        let modes: &[ScaleRounding] = if dtype == ScaleDtype::UE8M0 {
            &[Up, Nearest, ScaleRounding::Mx]
        } else {
            &[Up, Nearest]
        };
        for code in codes {
            let v = dtype.decode_code(code);
            assert!(dtype.is_representable(v), "{dtype} {v:e}");
            for &mode in modes {
                let r = dtype.round(v, mode);
                assert_eq!(r.to_bits(), v.to_bits(), "{dtype} {mode:?} {v:e}");
            }
        }
    }
}

fn next_up(v: f32) -> f32 {
    f32::from_bits(v.to_bits() + 1)
}
fn next_down(v: f32) -> f32 {
    f32::from_bits(v.to_bits() - 1)
}

#[test]
fn f32_is_the_identity() {
    for s in [0.0, 1e-45, 0.1, 3.0, 1e38, f32::MAX] {
        assert_eq!(ScaleDtype::F32.round(s, Up), s);
        assert_eq!(ScaleDtype::F32.round(s, Nearest), s);
    }
}

#[test]
fn zero_rule() {
    for d in ScaleDtype::ALL {
        let want = if d.has_zero() { 0.0 } else { exp2i(-127) };
        assert_eq!(d.round(0.0, Up), want, "{d}");
        assert_eq!(d.round(0.0, Nearest), want, "{d}");
        assert_eq!(d.round(-0.0, Up).to_bits(), want.to_bits(), "{d}");
    }
}

/// At every dtype's edges: exact values stay, one f32 ulp above steps up (Up) and stays
/// (Nearest), and anything past the max saturates.
#[test]
fn boundaries_of_every_dtype() {
    for d in ScaleDtype::ALL {
        let max = d.max_value();
        let tiny = d.smallest_positive();
        for v in [tiny, 1.0, 0.5, max] {
            assert_eq!(d.round(v, Up), v, "{d} {v}");
            assert_eq!(d.round(v, Nearest), v, "{d} {v}");
        }
        if d != ScaleDtype::F32 {
            assert_eq!(d.round(max * 1.5, Up), max, "{d}");
            assert_eq!(d.round(max * 1.5, Nearest), max, "{d}");
        }
        assert_eq!(d.round(f32::MAX, Nearest), max, "{d}");
        if d != ScaleDtype::F32 {
            assert!(d.round(next_up(1.0), Up) > 1.0, "{d}");
            assert_eq!(d.round(next_up(1.0), Nearest), 1.0, "{d}");
            assert_eq!(d.round(next_down(1.0), Nearest), 1.0, "{d}");
            assert!(d.round(next_down(1.0), Up) == 1.0, "{d}");
            if d != ScaleDtype::UE8M0 {
                // (UE8M0 follows ml_dtypes' cast there: see `ue8m0_specifics`.)
                assert_eq!(d.round(next_up(tiny), Nearest), tiny, "{d}");
            }
            assert!(d.round(next_up(tiny), Up) > tiny, "{d}");
        }
        if d.has_zero() && d != ScaleDtype::F32 {
            // Below the smallest value: up gives it, nearest gives 0 below half of it.
            assert_eq!(d.round(tiny / 4.0, Up), tiny, "{d}");
            assert_eq!(d.round(tiny / 4.0, Nearest), 0.0, "{d}");
        }
    }
}

/// The bit-level rounding agrees with the `half` crate's conversions (nearest) and is the
/// tightest upper bound (up), over a sweep of every 1031st positive f32.
#[test]
fn half_precision_rounding_matches_the_half_crate() {
    for bits in (0..0x7F80_0000u32).step_by(1031) {
        let s = f32::from_bits(bits);
        let h = f16::from_f32(s);
        let want = if h.is_infinite() { 65504.0 } else { h.to_f32() };
        assert_eq!(
            ScaleDtype::F16.round(s, Nearest).to_bits(),
            want.to_bits(),
            "f16 {s:e}"
        );
        let b = bf16::from_f32(s);
        let want = if b.is_infinite() {
            ScaleDtype::BF16.max_value()
        } else {
            b.to_f32()
        };
        assert_eq!(
            ScaleDtype::BF16.round(s, Nearest).to_bits(),
            want.to_bits(),
            "bf16 {s:e}"
        );
        for d in [
            ScaleDtype::F16,
            ScaleDtype::BF16,
            ScaleDtype::UE4M3,
            ScaleDtype::UE8M0,
        ] {
            let up = d.round(s, Up);
            let code = d.round_code(s, Up);
            if s <= d.max_value() {
                assert!(up >= s, "{d} up {s:e} -> {up:e}");
                if code > 0 {
                    assert!(d.decode_code(code - 1) < s, "{d} up {s:e} not tight");
                }
            }
        }
    }
}

#[test]
fn f16_specifics() {
    let d = ScaleDtype::F16;
    assert_eq!(d.round(65505.0, Up), 65504.0);
    assert_eq!(d.round(65519.0, Nearest), 65504.0); // would round to inf as a plain cast
    assert_eq!(d.round(exp2i(-25), Nearest), 0.0); // tie with 0 → even (0)
    assert_eq!(d.round(next_up(exp2i(-25)), Nearest), exp2i(-24));
    assert_eq!(d.round(1.0 + exp2i(-11), Nearest), 1.0); // tie → even
    assert_eq!(d.round(1.0 + exp2i(-11), Up), 1.0 + exp2i(-10));
}

#[test]
fn ue8m0_specifics() {
    let d = ScaleDtype::UE8M0;
    assert_eq!(d.round(3.0, Up), 4.0);
    assert_eq!(d.round(2.0, Up), 2.0);
    assert_eq!(d.round(next_up(2.0), Up), 4.0);
    // A tie goes up, as ml_dtypes' float8_e8m0fnu cast does: 1.5 → 2.0, 3.0 → 4.0.
    assert_eq!(d.round(1.5, Nearest), 2.0);
    assert_eq!(d.round(3.0, Nearest), 4.0);
    assert_eq!(d.round(next_down(3.0), Nearest), 2.0);
    assert_eq!(d.round(6.0, Nearest), 8.0);
    assert_eq!(d.round(exp2i(-140), Up), exp2i(-127));
    assert_eq!(d.round(exp2i(-140), Nearest), exp2i(-127));
    assert_eq!(d.round(f32::MAX, Up), exp2i(127));
    assert_eq!(d.round(exp2i(127) * 1.2, Up), exp2i(127));
    // Among f32 subnormals, the nearer of 2^-127 and 2^-126, a tie up (ml_dtypes 0.7's cast);
    // up: 2^-126 for anything above 2^-127.
    let tie = f32::from_bits(0x60_0000); // 1.5·2^-127
    assert_eq!(d.round(tie, Nearest), exp2i(-126));
    assert_eq!(d.round(f32::from_bits(0x5F_FFFF), Nearest), exp2i(-127));
    assert_eq!(d.round(f32::from_bits(0x40_0001), Nearest), exp2i(-127));
    assert_eq!(d.round(f32::from_bits(0x7F_FFFF), Nearest), exp2i(-126));
    assert_eq!(d.round(exp2i(-127), Nearest), exp2i(-127));
    assert_eq!(d.round(f32::from_bits(0x40_0001), Up), exp2i(-126));
    assert_eq!(d.round(exp2i(-127), Up), exp2i(-127));
}

#[test]
fn ue4m3_specifics() {
    let d = ScaleDtype::UE4M3;
    assert_eq!(d.round(0.3, Up), 0.3125);
    assert_eq!(d.round(0.3, Nearest), 0.3125);
    assert_eq!(d.round(449.0, Up), 448.0);
    assert_eq!(d.round(1e6, Nearest), 448.0);
    assert_eq!(d.round(exp2i(-10), Nearest), 0.0); // tie with 0 → even
    assert_eq!(d.round(exp2i(-10), Up), exp2i(-9));
}

#[test]
fn bytes_round_trip() {
    for d in ScaleDtype::ALL {
        for s in [0.0f32, 0.125, 3.0, d.max_value(), d.smallest_positive()] {
            let v = d.round(s, Up);
            let mut out = Vec::new();
            d.write_le(v, &mut out);
            assert_eq!(out.len(), d.size_bytes());
            assert_eq!(d.read_le(&out).to_bits(), v.to_bits(), "{d} {s}");
        }
    }
    for d in [
        ScaleDtype::F32,
        ScaleDtype::F16,
        ScaleDtype::BF16,
        ScaleDtype::UE4M3,
    ] {
        let mut out = Vec::new();
        d.write_le(-0.0, &mut out);
        assert_eq!(d.read_le(&out).to_bits(), (-0.0f32).to_bits(), "{d}");
    }
    let mut out = Vec::new();
    ScaleDtype::UE4M3.write_le(0.5, &mut out);
    ScaleDtype::UE4M3.write_le(0.125, &mut out);
    assert_eq!(out, [0x30, 0x20]);
}

#[test]
fn representability() {
    assert!(ScaleDtype::UE4M3.is_representable(0.5));
    assert!(!ScaleDtype::UE4M3.is_representable(0.3));
    assert!(!ScaleDtype::UE8M0.is_representable(0.0));
    assert!(ScaleDtype::F16.is_representable(65504.0));
    assert!(!ScaleDtype::F16.is_representable(65505.0));
    assert!(!ScaleDtype::F32.is_representable(f32::NAN));
    assert!(!ScaleDtype::F32.is_representable(-1.0));
}
