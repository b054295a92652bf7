//! The codebook a Lookup scheme carries (burn's `QuantMode::Lookup`): 2^bits f32 values, entry k
//! being what field k decodes to, and the named ones. A plain value the scheme model holds;
//! the encoder and decoder that use it are [`crate::lookup`]'s.

use crate::error::{QuantError, Result};

/// Most entries a codebook holds: 2^4. An 8-bit index (256 entries) is refused when the scheme
/// is built (see [`Codebook::check_bits`]): keeping the scheme `Copy` and small needs a bound.
pub const MAX_ENTRIES: usize = 16;

/// QLoRA's NormalFloat4, as bitsandbytes lists it, rounded to f32.
pub const NF4: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// ggml's IQ4_NL values (`kvalues_iq4nl`).
pub const IQ4_NL: [f32; 16] = [
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0,
    89.0, 113.0,
];

/// blockquant's 4-bit codebook: Lloyd-Max for normal weights under the `bq4_block16` preset's
/// scales (benches/codebook.py derives it; python/blockquant/codebooks.py says how).
#[allow(clippy::excessive_precision)]
pub const BQ4: [f32; 16] = [
    -0.9937, -0.7543, -0.5738, -0.4299, -0.3083, -0.2008, -0.1026, -0.0104, 0.0791, 0.1694, 0.2635,
    0.3654, 0.4805, 0.6194, 0.8036, 1.0,
];

/// The named codebooks, by the name the scheme text uses (`.../lookup:nf4`).
pub const NAMED: [(&str, [f32; 16]); 3] = [("nf4", NF4), ("iq4nl", IQ4_NL), ("bq4", BQ4)];

/// 4 or 16 distinct finite f32 values; entry k is what field k decodes to. Kept as bit
/// patterns so the scheme stays `Copy`, `Eq` and `Hash`. −0 and +0 are the same value, so a
/// codebook may hold one of them, not both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Codebook {
    bits: [u32; MAX_ENTRIES],
    len: u8,
}

impl Codebook {
    /// The codebook of `values`: 1 to 16 finite, pairwise distinct values (its length is checked
    /// against the value's width by the scheme).
    pub fn new(values: &[f32]) -> Result<Self> {
        if values.is_empty() || values.len() > MAX_ENTRIES {
            return Err(QuantError::Scheme(format!(
                "a codebook has 2^bits entries (4 for a 2-bit value, 16 for a 4-bit one), got {}",
                values.len()
            )));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(QuantError::Scheme(format!(
                "codebook entries must be finite, entry {i} is {}",
                crate::error::python_float(values[i])
            )));
        }
        for (i, a) in values.iter().enumerate() {
            if let Some(j) = values[..i].iter().position(|b| b == a) {
                return Err(QuantError::Scheme(format!(
                    "codebook entries must be distinct, entries {j} and {i} are both {a}"
                )));
            }
        }
        let mut bits = [0u32; MAX_ENTRIES];
        for (b, v) in bits.iter_mut().zip(values) {
            *b = v.to_bits();
        }
        Ok(Self {
            bits,
            len: values.len() as u8,
        })
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, k: usize) -> f32 {
        f32::from_bits(self.bits[k])
    }

    pub fn entries(&self) -> Vec<f32> {
        (0..self.len()).map(|k| self.get(k)).collect()
    }

    /// The name of this codebook when it is one of [`NAMED`].
    pub fn name(&self) -> Option<&'static str> {
        NAMED
            .iter()
            .find(|(_, v)| {
                self.len() == v.len() && self.bits[..].iter().zip(v).all(|(b, x)| *b == x.to_bits())
            })
            .map(|(n, _)| *n)
    }

    /// The named codebook `name`.
    pub fn named(name: &str) -> Option<Self> {
        NAMED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| Self::new(v).expect("named codebooks are valid"))
    }

    /// The codebook fits a value of `bits` bits: exactly 2^bits entries, and 2 or 4 bits.
    pub fn check_bits(&self, bits: u32, value: &str) -> Result<()> {
        if bits > 4 {
            return Err(too_wide(value));
        }
        if self.len() != 1 << bits {
            return Err(QuantError::Scheme(format!(
                "a {value} codebook has 2^{bits} = {} entries, got {}",
                1 << bits,
                self.len()
            )));
        }
        Ok(())
    }

    /// max_k |c_k|: the divisor of α in s_raw = α / h (the role (qmax − qmin) / 2 plays for ints).
    pub fn half_range(&self) -> f32 {
        (0..self.len()).fold(0.0f32, |m, k| m.max(self.get(k).abs()))
    }

    /// The exponent of the largest magnitude, for the MX scale rule: floor(log2 h).
    pub fn mx_emax(&self) -> i32 {
        let h = self.half_range();
        // h > 0: entries are distinct, so at least one is non-zero. Exact for every f32.
        (h as f64).log2().floor() as i32
    }
}

pub(crate) fn too_wide(value: &str) -> QuantError {
    QuantError::Scheme(format!(
        "lookup with an 8-bit value ({value}) is not implemented: codebooks have 4 (Q2) or 16 (Q4) entries"
    ))
}

impl std::fmt::Display for Codebook {
    /// `nf4`, `iq4nl`, `bq4`, or `[v0,v1,...]` with each value's shortest round-trip text.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(n) = self.name() {
            return f.write_str(n);
        }
        let vals: Vec<String> = self.entries().iter().map(|v| format!("{v:?}")).collect();
        write!(f, "[{}]", vals.join(","))
    }
}
