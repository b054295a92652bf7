//! Scale dtypes: rounding a raw f32 scale to what the dtype can hold (format.md "Storing a scale: rounding to its dtype"), and the bytes.
//!
//! Rounding works in each dtype's code space: round to the nearest code (ties to even), then, for
//! `Up`, step one code up if that fell below the raw scale. Codes are monotone in value for
//! non-negative numbers, so the step gives the smallest representable value ≥ the raw scale.

use half::{bf16, f16};

use crate::alloc::{try_collect, try_zeroed};
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
/// gives the smallest value (format.md "Storing a scale: rounding to its dtype"'s zero rule).
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

    /// UE8M0 has no zero: its smallest value stands in for it (format.md "Storing a scale: rounding to its dtype"'s zero rule).
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
    pub fn read_le_all(self, bytes: &[u8]) -> Result<Vec<f32>> {
        let pairs = || {
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
        };
        match self {
            Self::F32 => try_collect(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            Self::BF16 => try_collect(pairs().map(|b| bf16::from_bits(b).to_f32())),
            Self::F16 => {
                use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
                let bits = try_collect(pairs())?;
                let mut out = try_zeroed(bits.len())?;
                bits.reinterpret_cast::<f16>()
                    .convert_to_f32_slice(&mut out);
                Ok(out)
            }
            Self::UE4M3 | Self::UE8M0 => {
                let table: [f32; 256] = std::array::from_fn(|c| self.decode_code(c as u32));
                try_collect(bytes.iter().map(|&b| table[b as usize]))
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

/// Check caller-given scales: finite and ≥ 0 (format.md "Calibration").
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
#[path = "scale_tests.rs"]
mod tests;
