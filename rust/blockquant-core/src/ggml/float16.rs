//! The float16 conversions every block type's scales go through: numpy's casts, bit for bit.

/// numpy's `astype(np.float16)`: round to nearest even.
#[inline(always)]
pub(super) fn f16_bits(v: f32) -> [u8; 2] {
    f32_to_f16(v).to_le_bytes()
}

/// f32 → float16 bits, rounded to nearest even (numpy's cast; a NaN keeps its top payload bits
/// and is quieted). Branch-free integer code, so it inlines into the kernels and vectorizes
/// (`half` calls out to F16C behind a run-time check on every value).
#[inline(always)]
pub(super) fn f32_to_f16(v: f32) -> u16 {
    let x = v.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let a = x & 0x7FFF_FFFF;
    // Normal results: drop 13 mantissa bits rounding to nearest even, rebias the exponent
    // (a carry out of the mantissa correctly bumps the exponent).
    let normal = ((a + 0x0FFF + ((a >> 13) & 1)) >> 13).wrapping_sub(112 << 10);
    // Subnormal results (|v| < 2^-14): adding 0.5 makes the f32 spacing 2^-24, f16's subnormal
    // step, so the f32 add rounds to nearest even and the low bits count the steps.
    let sub = (f32::from_bits(a) + 0.5)
        .to_bits()
        .wrapping_sub(0x3F00_0000);
    let nan = 0x7E00 | ((a >> 13) & 0x03FF) as u16;
    let h = if a > 0x7F80_0000 {
        nan
    } else if a >= 0x477F_F000 {
        0x7C00 // 65520 and up round to infinity (65520 is a tie, and inf's mantissa is even)
    } else if a >= 0x3880_0000 {
        normal as u16
    } else {
        sub as u16
    };
    sign | h
}

#[inline(always)]
pub(super) fn f16_value(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// float16 bits → f32, exactly, a NaN keeping its payload unquieted as numpy's cast does (F16C
/// and `half` set the quiet bit). Branch-free so a run of them vectorizes.
#[inline(always)]
pub(super) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let em = (h & 0x7FFF) as u32;
    // Normal: rebias the exponent by 127 − 15. Inf/NaN: all-ones exponent, mantissa as is.
    // Subnormal (and zero): m × 2^-24, exact in f32.
    let normal = (em << 13) + ((127 - 15) << 23);
    let special = (em << 13) | 0x7F80_0000;
    let sub = (em as f32 * f32::from_bits(0x3380_0000)).to_bits(); // 2^-24
    let bits = if em >= 0x7C00 {
        special
    } else if em < 0x0400 {
        sub
    } else {
        normal
    };
    f32::from_bits(sign | bits)
}
