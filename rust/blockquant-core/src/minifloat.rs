//! Small IEEE-like float formats (FP8 E4M3FN, FP8 E5M2, FP4 E2M1, and the unsigned UE4M3 scale),
//! encoded from f32 on the bit pattern: round to nearest, ties to even, saturating at ±max.
//!
//! Working on bits (not through a table of every f32, not through f32 arithmetic) keeps the
//! rounding exact in the subnormal range of both the format and f32.

/// A sign + exponent + mantissa format narrower than f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MiniFloat {
    pub exp_bits: u32,
    pub man_bits: u32,
    pub bias: i32,
    /// Code (without sign) of the largest finite value.
    pub max_code: u32,
    /// IEEE-style infinities and NaNs in the all-ones exponent (E5M2); otherwise only the
    /// all-ones code is NaN (E4M3FN) or every code is finite (E2M1).
    pub ieee_specials: bool,
    /// E4M3FN: S.1111.111 is NaN.
    pub all_ones_nan: bool,
}

pub const E4M3: MiniFloat = MiniFloat {
    exp_bits: 4,
    man_bits: 3,
    bias: 7,
    max_code: 0x7E,
    ieee_specials: false,
    all_ones_nan: true,
};

pub const E5M2: MiniFloat = MiniFloat {
    exp_bits: 5,
    man_bits: 2,
    bias: 15,
    max_code: 0x7B,
    ieee_specials: true,
    all_ones_nan: false,
};

/// IEEE binary16, as a scale dtype (finite values only are ever produced).
pub const F16: MiniFloat = MiniFloat {
    exp_bits: 5,
    man_bits: 10,
    bias: 15,
    max_code: 0x7BFF,
    ieee_specials: true,
    all_ones_nan: false,
};

/// bfloat16, as a scale dtype.
pub const BF16: MiniFloat = MiniFloat {
    exp_bits: 8,
    man_bits: 7,
    bias: 127,
    max_code: 0x7F7F,
    ieee_specials: true,
    all_ones_nan: false,
};

pub const E2M1: MiniFloat = MiniFloat {
    exp_bits: 2,
    man_bits: 1,
    bias: 1,
    max_code: 0x7,
    ieee_specials: false,
    all_ones_nan: false,
};

impl MiniFloat {
    /// Position of the sign bit.
    #[inline]
    pub const fn sign_shift(&self) -> u32 {
        self.exp_bits + self.man_bits
    }

    /// The largest finite magnitude.
    pub fn max_value(&self) -> f32 {
        self.magnitude_value(self.max_code)
    }

    /// Encode a finite f32: round to nearest, ties to even; |x| ≥ max gives ±max. −0 keeps its
    /// sign. A NaN input gives ±max too (callers reject non-finite input beforehand).
    #[inline(always)]
    pub fn encode(&self, x: f32) -> u8 {
        let bits = x.to_bits();
        let sign = (bits >> 31) << self.sign_shift();
        let abs = bits & 0x7FFF_FFFF;
        let mag = self.round_magnitude(f32::from_bits(abs), false);
        (sign | mag) as u8
    }

    /// The code of `s ≥ 0` rounded to nearest (ties to even) or up (the smallest value ≥ s),
    /// saturating at the largest value (+inf and NaN bit patterns, being above it, too).
    /// Branch-light so it vectorizes.
    #[inline(always)]
    pub fn round_magnitude(&self, s: f32, up: bool) -> u32 {
        let abs = s.to_bits() & 0x7FFF_FFFF;
        if abs >= self.max_value_bits() {
            return self.max_code;
        }
        let shift_round = |v: u32, shift: u32| {
            if up {
                (v >> shift) + ((v & ((1u32 << shift) - 1)) != 0) as u32
            } else {
                round_shift_rne(v, shift)
            }
        };
        let f32_exp = (abs >> 23) as i32; // biased f32 exponent, 0 for subnormals
        let emin = 1 - self.bias; // unbiased exponent of the smallest normal
        if f32_exp - 127 >= emin {
            // Normal in the target: rebias the exponent, round the mantissa. A carry out of
            // the mantissa correctly bumps the exponent; abs < max keeps it ≤ max_code.
            let rebias = ((127 - self.bias) as u32) << 23;
            shift_round(abs - rebias, 23 - self.man_bits)
        } else {
            // Subnormal in the target: value = M · 2^(E-23); code = value / 2^(emin - man_bits).
            let m = if f32_exp == 0 {
                abs
            } else {
                (abs & 0x7F_FFFF) | 0x80_0000
            };
            let e = f32_exp.max(1) - 127;
            let shift = (23 + emin - self.man_bits as i32 - e) as u32; // > 23 - man_bits
            if shift >= 25 {
                // Below half the smallest value: 0, or the smallest value when rounding up.
                (up && abs != 0) as u32
            } else {
                shift_round(m, shift)
            }
        }
    }

    /// The value of a non-negative finite code (≤ `max_code`), built from bits.
    #[inline(always)]
    pub fn magnitude_value(&self, code: u32) -> f32 {
        let e = code >> self.man_bits;
        let m = code & ((1 << self.man_bits) - 1);
        if e == 0 {
            m as f32 * exp2i(1 - self.bias - self.man_bits as i32)
        } else {
            f32::from_bits(
                (((e as i32 - self.bias + 127) as u32) << 23) | (m << (23 - self.man_bits)),
            )
        }
    }

    /// The f32 bit pattern of the largest finite value.
    #[inline(always)]
    fn max_value_bits(&self) -> u32 {
        let e = (self.max_code >> self.man_bits) as i32 - self.bias + 127;
        let m = self.max_code & ((1 << self.man_bits) - 1);
        ((e as u32) << 23) | (m << (23 - self.man_bits))
    }

    /// Decode any code (sign included) to f32; NaN and infinity codes decode to NaN / ±inf.
    pub fn decode(&self, code: u8) -> f32 {
        let code = code as u32;
        let sign = if (code >> self.sign_shift()) & 1 == 1 {
            -1.0f32
        } else {
            1.0
        };
        let mag = code & ((1 << self.sign_shift()) - 1);
        let exp_field = mag >> self.man_bits;
        let man = mag & ((1 << self.man_bits) - 1);
        let exp_all_ones = (1 << self.exp_bits) - 1;
        // NaNs keep the code's sign bit, as ml_dtypes and hardware converters do.
        let nan = if sign < 0.0 { -f32::NAN } else { f32::NAN };
        if self.ieee_specials && exp_field == exp_all_ones {
            return if man == 0 { sign * f32::INFINITY } else { nan };
        }
        if self.all_ones_nan && mag == (1 << self.sign_shift()) - 1 {
            return nan;
        }
        let value = if exp_field == 0 {
            man as f32 * exp2i(1 - self.bias - self.man_bits as i32)
        } else {
            ((1 << self.man_bits) | man) as f32
                * exp2i(exp_field as i32 - self.bias - self.man_bits as i32)
        };
        sign * value
    }
}

/// `v >> shift` rounded to nearest, ties to even (1 ≤ shift ≤ 31).
#[inline(always)]
pub(crate) fn round_shift_rne(v: u32, shift: u32) -> u32 {
    let q = v >> shift;
    let rem = v & ((1u32 << shift) - 1);
    let half = 1u32 << (shift - 1);
    let up = (rem > half) | ((rem == half) & (q & 1 == 1));
    q + up as u32
}

/// 2^e as f32, exact for e in -149..=127.
pub(crate) fn exp2i(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (e + 149))
    }
}

#[cfg(test)]
mod tests {
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
}
