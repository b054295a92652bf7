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
#[path = "minifloat_tests.rs"]
mod tests;
