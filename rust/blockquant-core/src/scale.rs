//! Scale dtypes: rounding a raw f32 scale to what the dtype can hold (SPEC §4), and the bytes.
//!
//! Rounding works in each dtype's code space: round to the nearest code (ties to even), then, for
//! `Up`, step one code up if that fell below the raw scale. Codes are monotone in value for
//! non-negative numbers, so the step gives the smallest representable value ≥ the raw scale.

use half::{bf16, f16};

use crate::error::{QuantError, Result};
use crate::minifloat::{exp2i, BF16, E4M3, F16};
use crate::scheme::ScaleDtype;

/// How a raw scale becomes a stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScaleRounding {
    /// The smallest representable value ≥ the raw scale (burn's rule): the block's largest
    /// value never clips.
    #[default]
    Up,
    /// Round to nearest, ties to even (a plain cast; NVFP4 producers, GGUF): values may clip.
    Nearest,
    /// The OCP Microscaling v1.0 rule, UE8M0 only: 2^(floor(log2 α) − emax) from the block's
    /// amplitude α (see [`mx_scale_code`]); the largest values may saturate. A scale given as
    /// it is rounds down to a power of two.
    Mx,
}

/// The UE8M0 code of the OCP MX scale of a block of amplitude `alpha`: 2^(floor(log2 α) − emax),
/// `emax` the exponent of the value format's largest normal, clamped to UE8M0's range; α = 0
/// gives the smallest value (SPEC §4's zero rule).
#[inline(always)]
pub fn mx_scale_code(alpha: f32, emax: i32) -> u32 {
    (floor_log2(alpha) - emax + 127).clamp(0, UE8M0_MAX_CODE as i32) as u32
}

/// floor(log2 |x|) of a finite f32 from its bits (subnormals too); 0 maps far below any range.
#[inline(always)]
fn floor_log2(x: f32) -> i32 {
    let bits = x.to_bits() & 0x7FFF_FFFF;
    let exp = (bits >> 23) as i32;
    if exp != 0 {
        exp - 127
    } else if bits == 0 {
        i32::MIN / 2
    } else {
        -149 + (31 - bits.leading_zeros() as i32)
    }
}

const UE8M0_MAX_CODE: u32 = 254;

impl ScaleDtype {
    /// The largest finite value.
    pub fn max_value(self) -> f32 {
        match self {
            Self::F32 => f32::MAX,
            Self::F16 => 65504.0,
            Self::BF16 => BF16.max_value(),
            Self::UE8M0 => exp2i(127),
            Self::UE4M3 => 448.0,
        }
    }

    /// The smallest value > 0.
    pub fn smallest_positive(self) -> f32 {
        match self {
            Self::F32 => f32::from_bits(1),
            Self::F16 => exp2i(-24),
            Self::BF16 => bf16::from_bits(1).to_f32(),
            Self::UE8M0 => exp2i(-127),
            Self::UE4M3 => exp2i(-9),
        }
    }

    /// UE8M0 has no zero: its smallest value stands in for it (SPEC §4's zero rule).
    pub fn has_zero(self) -> bool {
        self != Self::UE8M0
    }

    /// Round a scale (finite, ≥ 0) to this dtype; returns the stored code. −0 is stored as +0.
    #[inline(always)]
    pub fn round_code(self, s: f32, mode: ScaleRounding) -> u32 {
        let s = if s == 0.0 { 0.0 } else { s };
        let up = mode == ScaleRounding::Up;
        match self {
            Self::F32 => s.to_bits(),
            Self::F16 => F16.round_magnitude(s, up),
            Self::BF16 => BF16.round_magnitude(s, up),
            Self::UE4M3 => E4M3.round_magnitude(s, up),
            // A given scale under the MX rule: down to a power of two, within range.
            Self::UE8M0 if mode == ScaleRounding::Mx => mx_scale_code(s, 0),
            Self::UE8M0 => ue8m0_round(s, up),
        }
    }

    /// Round a scale (finite, ≥ 0) to this dtype and return the stored value as f32 (exact).
    #[inline(always)]
    pub fn round(self, s: f32, mode: ScaleRounding) -> f32 {
        let code = self.round_code(s, mode);
        match self {
            Self::F32 => f32::from_bits(code),
            Self::F16 => F16.magnitude_value(code),
            Self::BF16 => BF16.magnitude_value(code),
            Self::UE4M3 => E4M3.magnitude_value(code),
            Self::UE8M0 => exp2i(code as i32 - 127),
        }
    }

    /// `mode` is allowed for this dtype: `Mx` is the MX formats' rule for UE8M0 scales only.
    pub fn check_rounding(self, mode: ScaleRounding) -> Result<()> {
        if mode == ScaleRounding::Mx && self != Self::UE8M0 {
            return Err(QuantError::Scheme(format!(
                "scale_rounding='mx' is the OCP MX rule for UE8M0 scales, not {self}"
            )));
        }
        Ok(())
    }

    /// Round to nearest, ties to even, saturating at the largest value.
    fn nearest_code(self, s: f32) -> u32 {
        self.round_code(s, ScaleRounding::Nearest)
    }

    /// The value of a stored code.
    pub fn decode_code(self, code: u32) -> f32 {
        match self {
            Self::F32 => f32::from_bits(code),
            Self::F16 => f16::from_bits(code as u16).to_f32(),
            Self::BF16 => bf16::from_bits(code as u16).to_f32(),
            Self::UE4M3 => E4M3.decode(code as u8),
            Self::UE8M0 => {
                if code > UE8M0_MAX_CODE {
                    f32::NAN
                } else {
                    exp2i(code as i32 - 127)
                }
            }
        }
    }

    /// Whether `v` is exactly one of this dtype's values.
    pub fn is_representable(self, v: f32) -> bool {
        // `round` builds the value from the code's bits (no conversion call), and equals
        // `decode_code(nearest_code(v))` on every code it returns.
        v.is_finite() && v >= 0.0 && self.round(v, ScaleRounding::Nearest) == v
    }

    /// Append the little-endian encoding of `v`, which must be representable.
    pub fn write_le(self, v: f32, out: &mut Vec<u8>) {
        let (bytes, n) = self.le_bytes(v);
        out.extend_from_slice(&bytes[..n]);
    }

    /// The little-endian encoding of `v`, which must be representable: the first
    /// `size_bytes()` bytes of the array.
    pub fn le_bytes(self, v: f32) -> ([u8; 4], usize) {
        // A −0 read from bytes is kept as −0, so a bytes round trip is exact (rounding a computed
        // scale never makes one).
        let code = if v == 0.0 && v.is_sign_negative() && self.has_zero() {
            match self {
                Self::F32 => 0x8000_0000,
                Self::F16 | Self::BF16 => 0x8000,
                _ => 0x80,
            }
        } else {
            self.nearest_code(v)
        };
        (code.to_le_bytes(), self.size_bytes())
    }

    /// Every little-endian scale of `bytes` (a whole number of them), as [`Self::read_le`]
    /// reads each: a slice at a time, float16 through F16C where the CPU has it and the 8-bit
    /// dtypes through a table of their 256 values. One `read_le` a scale took 2.5 ns, an eighth
    /// of a block-32 tensor's `from_bytes`.
    pub fn read_le_all(self, bytes: &[u8]) -> Vec<f32> {
        let pairs = || {
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
        };
        match self {
            Self::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Self::BF16 => pairs().map(|b| bf16::from_bits(b).to_f32()).collect(),
            Self::F16 => {
                use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
                let bits: Vec<u16> = pairs().collect();
                let mut out = vec![0.0; bits.len()];
                bits.reinterpret_cast::<f16>()
                    .convert_to_f32_slice(&mut out);
                out
            }
            Self::UE4M3 | Self::UE8M0 => {
                let table: [f32; 256] = std::array::from_fn(|c| self.decode_code(c as u32));
                bytes.iter().map(|&b| table[b as usize]).collect()
            }
        }
    }

    /// Read one little-endian scale. `bytes.len()` must be `size_bytes()`.
    pub fn read_le(self, bytes: &[u8]) -> f32 {
        let code = match bytes.len() {
            4 => u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            2 => u16::from_le_bytes([bytes[0], bytes[1]]) as u32,
            _ => bytes[0] as u32,
        };
        self.decode_code(code)
    }
}

/// UE8M0: a float with no mantissa bits; up is 2^ceil(log2 s). Nearest is the nearer power of
/// two with a tie going up, as ml_dtypes' `float8_e8m0fnu` cast does (3.0 → 4.0), and so equals
/// that cast wherever the cast is finite, f32 subnormals included (ml_dtypes 0.7 on; 0.6 sent
/// every subnormal above 2^-127 to 2^-126, and blockquant followed it until then).
/// No zero: 0 and tiny values give 2^-127 (code 0); everything saturates at 2^127 (code 254).
#[inline(always)]
fn ue8m0_round(s: f32, up: bool) -> u32 {
    let bits = s.to_bits();
    let exp = bits >> 23;
    let man = bits & 0x7F_FFFF;
    let code = if exp == 0 {
        // f32 subnormal: between 2^-127 (code 0, mantissa 0x40_0000) and 2^-126 (code 1), whose
        // midpoint 1.5·2^-127 is mantissa 0x60_0000; up: anything above 2^-127.
        if up {
            (man > 0x40_0000) as u32
        } else {
            (man >= 0x60_0000) as u32
        }
    } else if up {
        exp + (man != 0) as u32
    } else {
        exp + (man >= 0x40_0000) as u32
    };
    code.min(UE8M0_MAX_CODE)
}

/// Check caller-given scales: finite and ≥ 0 (SPEC §3).
pub fn check_scales(scales: &[f32], what: &str) -> Result<()> {
    // First one pass without a branch (it vectorizes) over the bit patterns: finite and ≥ 0
    // is a pattern up to f32::MAX's, or −0's. The bad one is looked for only if there is one.
    let bad = |s: &f32| {
        let b = s.to_bits();
        (b > f32::MAX.to_bits() && b != (-0.0f32).to_bits()) as u32
    };
    if scales.iter().fold(0, |any, s| any | bad(s)) == 0 {
        return Ok(());
    }
    if let Some((i, s)) = scales
        .iter()
        .enumerate()
        .find(|(_, s)| !s.is_finite() || **s < 0.0)
    {
        let why = if s.is_finite() {
            "negative"
        } else {
            "non-finite"
        };
        return Err(QuantError::Scale(format!(
            "{what} must be finite and >= 0, got {why} {s} at index {i}"
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// From a block's amplitude to its stored scale, and the effective scale of two-level schemes.

/// e = b × g (one f32 multiply). Capped at f32::MAX: only Q2 values of magnitude near f32::MAX
/// get there (b rounded up to the dtype max, times g), and an infinite scale would turn every
/// value of the block into NaN on the way back.
#[inline]
pub fn effective_scale(b: f32, g: f32) -> f32 {
    (b * g).min(f32::MAX)
}

/// A two-level block's raw scale in the block dtype's units: ÷ g. A caller's g of 0 (or a
/// derived one that underflowed) leaves nothing to normalize by: every block quantizes to 0.
#[inline(always)]
pub(crate) fn to_block(s: f32, g: f32) -> f32 {
    if g == 0.0 {
        0.0
    } else {
        s / g
    }
}

/// The per-tensor scale g of a two-level scheme from its blocks' amplitudes: it maps the
/// largest raw block scale onto the block dtype's largest value (1 when all are 0).
pub(crate) fn derived_global(alpha: &[f32], half_range: f32, dtype: ScaleDtype) -> f32 {
    let max_raw = alpha.iter().fold(0.0f32, |m, &a| m.max(a)) / half_range;
    if max_raw == 0.0 {
        1.0
    } else {
        max_raw / dtype.max_value()
    }
}

/// The stored scale of a block of amplitude `alpha`: s_raw = α / half_range (mapped by
/// `to_block`: two-level ÷ g) rounded to the dtype, or the OCP MX scale straight from α.
#[inline(always)]
pub(crate) fn stored_scale(
    alpha: f32,
    half_range: f32,
    dtype: ScaleDtype,
    mode: ScaleRounding,
    emax: i32,
    to_block: impl Fn(f32) -> f32,
) -> f32 {
    match mode {
        ScaleRounding::Mx => dtype.decode_code(mx_scale_code(alpha, emax)),
        _ => dtype.round(to_block(alpha / half_range), mode),
    }
}

#[cfg(test)]
mod tests {
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
                let got = dtype.read_le_all(&bytes[..take]);
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
        let f32_bits = (0..=0x7F7F_FFFFu32).step_by(0x1_0001).chain([
            0,
            1,
            0x007F_FFFF,
            0x0080_0000,
            0x7F7F_FFFF,
        ]);
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
}
