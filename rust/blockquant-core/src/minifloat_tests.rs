use super::*;

fn all_codes(fmt: &MiniFloat) -> Vec<(u8, f32)> {
    (0..1u32 << (fmt.sign_shift() + 1))
        .map(|c| (c as u8, fmt.decode(c as u8)))
        .collect()
}

#[test]
fn known_values() {
    assert_eq!(E4M3.max_value(), 448.0);
    assert_eq!(E5M2.max_value(), 57344.0);
    assert_eq!(E2M1.max_value(), 6.0);
    assert_eq!(E4M3.decode(0x01), exp2i(-9));
    assert_eq!(E5M2.decode(0x01), exp2i(-16));
    assert_eq!(E2M1.decode(0x01), 0.5);
    assert!(E4M3.decode(0x7F).is_nan() && E4M3.decode(0xFF).is_nan());
    assert_eq!(E5M2.decode(0x7C), f32::INFINITY);
    assert_eq!(E5M2.decode(0xFC), f32::NEG_INFINITY);
    let e2m1: Vec<f32> = (0..8).map(|c| E2M1.decode(c)).collect();
    assert_eq!(e2m1, [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]);
}

#[test]
fn every_finite_code_round_trips() {
    for fmt in [E4M3, E5M2, E2M1] {
        for (code, v) in all_codes(&fmt) {
            if v.is_finite() {
                assert_eq!(fmt.encode(v), code, "{fmt:?} code {code:#x}");
            }
        }
    }
}

/// Midpoints between neighbouring codes go to the even code; one ulp either side goes to
/// the nearer code. This pins rounding at every boundary of every format, subnormals included.
#[test]
fn midpoints_round_to_even() {
    for fmt in [E4M3, E5M2, E2M1] {
        let max = fmt.max_code;
        for c in 0..max {
            let lo = fmt.decode(c as u8);
            let hi = fmt.decode(c as u8 + 1);
            let mid = ((lo as f64 + hi as f64) / 2.0) as f32;
            assert_eq!(
                mid as f64,
                (lo as f64 + hi as f64) / 2.0,
                "midpoint exact in f32"
            );
            let even = if c % 2 == 0 { c } else { c + 1 };
            assert_eq!(fmt.encode(mid) as u32, even, "{fmt:?} mid {mid}");
            assert_eq!(fmt.encode(-mid) as u32, even | 1 << fmt.sign_shift());
            let below = f32::from_bits(mid.to_bits() - 1);
            let above = f32::from_bits(mid.to_bits() + 1);
            assert_eq!(fmt.encode(below) as u32, c);
            assert_eq!(fmt.encode(above) as u32, c + 1);
        }
    }
}

#[test]
fn saturates_and_keeps_negative_zero() {
    for fmt in [E4M3, E5M2, E2M1] {
        let max = fmt.max_value();
        for x in [max, max * 1.01, 1e30, f32::MAX, f32::INFINITY] {
            assert_eq!(fmt.encode(x) as u32, fmt.max_code);
            assert_eq!(fmt.encode(-x) as u32, fmt.max_code | 1 << fmt.sign_shift());
        }
        assert_eq!(fmt.encode(0.0), 0);
        assert_eq!(fmt.encode(-0.0) as u32, 1 << fmt.sign_shift());
        // The smallest f32 subnormal rounds to zero.
        assert_eq!(fmt.encode(f32::from_bits(1)), 0);
    }
}

#[test]
fn values_beyond_the_last_midpoint_below_max_still_round() {
    // 464 is the E4M3 midpoint between 448 and the (absent) 480: everything ≥ 448 is 448.
    assert_eq!(E4M3.encode(447.9), 0x7E);
    assert_eq!(E4M3.encode(432.0), 0x7E); // midpoint 416|448 → even (448 = 0x7E)
    assert_eq!(E4M3.encode(431.9), 0x7D);
    assert_eq!(E2M1.encode(5.0), 0x6); // tie 4|6 → even code 6 (value 4)
    assert_eq!(E2M1.encode(5.01), 0x7);
}
