//! The scheme model (format.md "The scheme"): value type, store, mode and scale levels, with the validity rules.
//!
//! Small `Copy` enums and a builder, after burn/cubecl's `QuantScheme`. Both printed forms of a
//! scheme, the canonical text and the `Display` form error messages use, are
//! [`crate::scheme_text`]'s.

use crate::codebook::Codebook;
use crate::error::{QuantError, Result};

/// Blocks have at most this many dimensions.
pub const MAX_BLOCK_DIMS: usize = 5;

/// The type of each stored value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantValue {
    Q8F,
    Q8S,
    Q4F,
    Q4S,
    Q2F,
    Q2S,
    E4M3,
    E5M2,
    E2M1,
    /// Unsigned integer codes in [0, 255], with a per-scale offset
    /// (format.md "Affine values (offsets)").
    U8,
    /// Unsigned integer codes in [0, 15], with an offset.
    U4,
    /// Unsigned integer codes in [0, 3], with an offset.
    U2,
}

impl QuantValue {
    /// The signed and float values: every value a scheme without an offset takes.
    pub const ALL: [QuantValue; 9] = [
        Self::Q8F,
        Self::Q8S,
        Self::Q4F,
        Self::Q4S,
        Self::Q2F,
        Self::Q2S,
        Self::E4M3,
        Self::E5M2,
        Self::E2M1,
    ];

    /// The unsigned values, which an affine scheme (one with an offset) takes.
    pub const UNSIGNED: [QuantValue; 3] = [Self::U8, Self::U4, Self::U2];

    /// Every value, in declaration order.
    pub const EVERY: [QuantValue; 12] = [
        Self::Q8F,
        Self::Q8S,
        Self::Q4F,
        Self::Q4S,
        Self::Q2F,
        Self::Q2S,
        Self::E4M3,
        Self::E5M2,
        Self::E2M1,
        Self::U8,
        Self::U4,
        Self::U2,
    ];

    /// Bits of one stored value.
    pub fn bits(self) -> u32 {
        match self {
            Self::Q8F | Self::Q8S | Self::E4M3 | Self::E5M2 | Self::U8 => 8,
            Self::Q4F | Self::Q4S | Self::E2M1 | Self::U4 => 4,
            Self::Q2F | Self::Q2S | Self::U2 => 2,
        }
    }

    /// The representable range `[qmin, qmax]`.
    pub fn range(self) -> (f32, f32) {
        match self {
            Self::Q8F => (-128.0, 127.0),
            Self::Q8S => (-127.0, 127.0),
            Self::Q4F => (-8.0, 7.0),
            Self::Q4S => (-7.0, 7.0),
            Self::Q2F => (-2.0, 1.0),
            Self::Q2S => (-1.0, 1.0),
            Self::E4M3 => (-448.0, 448.0),
            Self::E5M2 => (-57344.0, 57344.0),
            Self::E2M1 => (-6.0, 6.0),
            Self::U8 => (0.0, 255.0),
            Self::U4 => (0.0, 15.0),
            Self::U2 => (0.0, 3.0),
        }
    }

    /// `(qmax - qmin) / 2`, exact in f32. The raw scale is `alpha / half_range`: the same value as
    /// format.md's `(alpha + alpha) / (qmax - qmin)` (both round the same real), without overflowing
    /// when `alpha > f32::MAX / 2`.
    pub fn half_range(self) -> f32 {
        let (lo, hi) = self.range();
        (hi - lo) / 2.0
    }

    pub fn is_float(self) -> bool {
        matches!(self, Self::E4M3 | Self::E5M2 | Self::E2M1)
    }

    /// U8, U4, U2: codes in [0, 2^bits − 1], read with an offset.
    pub fn is_unsigned(self) -> bool {
        matches!(self, Self::U8 | Self::U4 | Self::U2)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Q8F => "Q8F",
            Self::Q8S => "Q8S",
            Self::Q4F => "Q4F",
            Self::Q4S => "Q4S",
            Self::Q2F => "Q2F",
            Self::Q2S => "Q2S",
            Self::E4M3 => "E4M3",
            Self::E5M2 => "E5M2",
            Self::E2M1 => "E2M1",
            Self::U8 => "U8",
            Self::U4 => "U4",
            Self::U2 => "U2",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::EVERY.into_iter().find(|v| v.name() == name)
    }

    /// The exponent of the largest normal value (OCP MX's emax): E2M1 2, E4M3 8, E5M2 15; for
    /// an integer value, floor(log2 qmax).
    pub fn mx_emax(self) -> i32 {
        match self {
            Self::E2M1 => 2,
            Self::E4M3 => 8,
            Self::E5M2 => 15,
            Self::Q8F | Self::Q8S => 6,
            Self::Q4F | Self::Q4S => 2,
            Self::Q2F | Self::Q2S => 0,
            // Never used: an affine scheme's scales are F32, F16 or BF16.
            Self::U8 => 7,
            Self::U4 => 3,
            Self::U2 => 1,
        }
    }
}

/// How a scale is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleDtype {
    F32,
    F16,
    BF16,
    /// `2^(e-127)`, one byte, no zero: the MX formats' shared exponent.
    UE8M0,
    /// E4M3 with the sign bit 0: NVFP4's block scale.
    UE4M3,
}

impl ScaleDtype {
    pub const ALL: [ScaleDtype; 5] = [Self::F32, Self::F16, Self::BF16, Self::UE8M0, Self::UE4M3];

    pub fn size_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::UE8M0 | Self::UE4M3 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::UE8M0 => "UE8M0",
            Self::UE4M3 => "UE4M3",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// The per-scale offset of an affine scheme (format.md "Affine values (offsets)"): one per
/// scale, on the same grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Offset {
    /// An integer zero point z in code units, one `u8` per scale: x̂ = f32(q − z) × s.
    Zero,
    /// A float bias b in F32, F16 or BF16: x̂ = f32(q) × s + b.
    Bias(ScaleDtype),
}

impl Offset {
    /// Bytes of one stored offset.
    pub fn size_bytes(self) -> usize {
        match self {
            Self::Zero => 1,
            Self::Bias(d) => d.size_bytes(),
        }
    }
}

/// How values map back to numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QuantMode {
    #[default]
    Symmetric,
    /// A stored field is an index into the scheme's codebook ([`crate::lookup`]).
    Lookup,
}

/// Where values live. `dim` counts from the innermost axis (0 = last axis).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantStore {
    /// One value per byte.
    Native,
    /// `32 / bits` values per `u32` word along axis `rank - 1 - dim`.
    PackedU32(usize),
    /// `8 / bits` values per byte along axis `rank - 1 - dim`.
    PackedNative(usize),
}

impl QuantMode {
    /// The mode named `name` ("Symmetric" or "Lookup").
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "Symmetric" => Ok(Self::Symmetric),
            "Lookup" => Ok(Self::Lookup),
            _ => Err(QuantError::Scheme(format!(
                "unknown mode {name:?}: expected \"Symmetric\" or \"Lookup\""
            ))),
        }
    }
}

impl QuantStore {
    /// The store of kind `kind` ("native", "packed_u32", "packed_native") packing along `dim`.
    pub fn from_name(kind: &str, dim: usize) -> Result<Self> {
        match kind {
            "native" if dim == 0 => Ok(Self::Native),
            "native" => Err(QuantError::Scheme(
                "the Native store has no packing dim".into(),
            )),
            "packed_u32" => Ok(Self::PackedU32(dim)),
            "packed_native" => Ok(Self::PackedNative(dim)),
            _ => Err(QuantError::Scheme(format!(
                "unknown store kind {kind:?}: expected \"native\", \"packed_u32\" or \"packed_native\""
            ))),
        }
    }
}

/// One scale per block of `size` elements (rank-relative: missing leading dims are 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockScale {
    size: [usize; MAX_BLOCK_DIMS],
    rank: usize,
    pub dtype: ScaleDtype,
}

impl BlockScale {
    /// A block of 1 to 5 positive dims; leading 1s are dropped, so `[1, 32]` equals `[32]`.
    pub fn new(size: &[usize], dtype: ScaleDtype) -> Result<Self> {
        let mut dims: &[usize] = size;
        while dims.len() > 1 && dims[0] == 1 {
            dims = &dims[1..];
        }
        if dims.is_empty() {
            return Err(QuantError::Scheme(
                "a block size has 1 to 5 dimensions, got none".into(),
            ));
        }
        if dims.contains(&0) {
            return Err(QuantError::Scheme(format!(
                "block sizes are positive integers, got {size:?}"
            )));
        }
        if dims.len() > MAX_BLOCK_DIMS {
            return Err(QuantError::Scheme(format!(
                "a block size has 1 to {MAX_BLOCK_DIMS} dimensions, got {}: {dims:?}",
                dims.len()
            )));
        }
        let mut arr = [1; MAX_BLOCK_DIMS];
        arr[..dims.len()].copy_from_slice(dims);
        Ok(Self {
            size: arr,
            rank: dims.len(),
            dtype,
        })
    }

    pub fn size(&self) -> &[usize] {
        &self.size[..self.rank]
    }
}

/// A quantization scheme. Neither level set means one per-tensor F32 scale (burn's rule); both
/// set means two-level: block scales normalized by one f32 per-tensor scale (as NVFP4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantScheme {
    pub value: QuantValue,
    pub store: QuantStore,
    pub mode: QuantMode,
    pub tensor: Option<ScaleDtype>,
    pub block: Option<BlockScale>,
    /// Lookup mode's table of 2^bits values (burn passes it beside the scheme; here it rides
    /// inline, so the scheme stays one `Copy` value). `None` for Symmetric.
    pub codebook: Option<Codebook>,
    /// An affine scheme's offset (unsigned values only); `None` for every other scheme.
    pub offset: Option<Offset>,
}

impl Default for QuantScheme {
    fn default() -> Self {
        Self {
            value: QuantValue::Q8F,
            store: QuantStore::PackedU32(0),
            mode: QuantMode::Symmetric,
            tensor: None,
            block: None,
            codebook: None,
            offset: None,
        }
    }
}

impl QuantScheme {
    pub fn with_value(self, value: QuantValue) -> Self {
        Self { value, ..self }
    }
    pub fn with_store(self, store: QuantStore) -> Self {
        Self { store, ..self }
    }
    /// Symmetric drops the codebook; Lookup keeps one already there (`validate` asks for it).
    pub fn with_mode(self, mode: QuantMode) -> Self {
        let codebook = match mode {
            QuantMode::Symmetric => None,
            QuantMode::Lookup => self.codebook,
        };
        Self {
            mode,
            codebook,
            ..self
        }
    }
    /// Lookup mode with this codebook.
    pub fn with_codebook(self, codebook: Codebook) -> Self {
        Self {
            mode: QuantMode::Lookup,
            codebook: Some(codebook),
            ..self
        }
    }

    /// An affine scheme with this offset (or none).
    pub fn with_offset(self, offset: Option<Offset>) -> Self {
        Self { offset, ..self }
    }

    /// Whether the scheme has an offset (unsigned values).
    pub fn is_affine(&self) -> bool {
        self.offset.is_some()
    }

    /// s_raw = α / half_range: (qmax − qmin) / 2 for a value, max |c_k| for a codebook.
    pub fn half_range(&self) -> f32 {
        match self.codebook {
            Some(cb) => cb.half_range(),
            None => self.value.half_range(),
        }
    }

    /// The exponent of the largest magnitude, for the MX scale rule.
    pub fn mx_emax(&self) -> i32 {
        match self.codebook {
            Some(cb) => cb.mx_emax(),
            None => self.value.mx_emax(),
        }
    }
    pub fn per_tensor(self, dtype: ScaleDtype) -> Self {
        Self {
            tensor: Some(dtype),
            ..self
        }
    }
    pub fn per_block(self, size: &[usize], dtype: ScaleDtype) -> Result<Self> {
        Ok(Self {
            block: Some(BlockScale::new(size, dtype)?),
            ..self
        })
    }

    pub fn is_two_level(&self) -> bool {
        self.tensor.is_some() && self.block.is_some()
    }

    /// The dtype of the scales stored right after the values.
    pub fn scale_dtype(&self) -> ScaleDtype {
        match (self.block, self.tensor) {
            (Some(b), _) => b.dtype,
            (None, Some(t)) => t,
            (None, None) => ScaleDtype::F32,
        }
    }

    /// The scheme-only rules (format.md "The scheme"). Tensor-dependent rules are checked by [`crate::Layout`].
    pub fn validate(&self) -> Result<()> {
        self.validate_affine()?;
        match (self.mode, self.codebook) {
            (QuantMode::Symmetric, None) => {}
            (QuantMode::Symmetric, Some(_)) => {
                return Err(QuantError::Scheme(
                    "a codebook comes with Lookup mode only".into(),
                ))
            }
            (QuantMode::Lookup, None) => {
                return Err(QuantError::Scheme(format!(
                    "Lookup mode needs a codebook (with_codebook, or .../lookup:nf4 in text), got {self}"
                )))
            }
            (QuantMode::Lookup, Some(cb)) => {
                if self.value.is_float() {
                    return Err(QuantError::Scheme(format!(
                        "a Lookup scheme's value is an integer width (Q4F, Q4S, Q2F, Q2S): a codebook index has no float semantics, got {}",
                        self.value
                    )));
                }
                cb.check_bits(self.value.bits(), self.value.name())?;
            }
        }
        if let (Some(tensor), Some(block)) = (self.tensor, self.block) {
            if tensor != ScaleDtype::F32 {
                return Err(QuantError::Scheme(format!(
                    "a two-level scheme stores its per-tensor scale as f32, got {self}"
                )));
            }
            // F32/BF16/UE8M0 block scales reach past f16's range: normalizing them by
            // max/dtype_max would drive the per-tensor scale subnormal.
            if !matches!(block.dtype, ScaleDtype::F16 | ScaleDtype::UE4M3) {
                return Err(QuantError::Scheme(format!(
                    "a two-level scheme's block scales must be F16 or UE4M3: wider block scales would drive the per-tensor scale subnormal, got {self}"
                )));
            }
        }
        Ok(())
    }
}

impl QuantScheme {
    /// The rules of offsets and unsigned values (format.md "Affine values (offsets)").
    fn validate_affine(&self) -> Result<()> {
        let unsigned = self.value.is_unsigned();
        let Some(offset) = self.offset else {
            if unsigned {
                return Err(QuantError::Scheme(format!(
                    "unsigned values ({}) need an offset: a zero point (.../zero:u8) or a bias (.../bias:DTYPE), got {self}",
                    self.value
                )));
            }
            return Ok(());
        };
        if !unsigned {
            return Err(QuantError::Scheme(format!(
                "an offset comes with unsigned values (U8, U4, U2) only, got {self}"
            )));
        }
        if self.mode == QuantMode::Lookup || self.codebook.is_some() {
            return Err(QuantError::Scheme(format!(
                "an affine scheme (with an offset) has no Lookup mode, got {self}"
            )));
        }
        if self.is_two_level() {
            return Err(QuantError::Scheme(format!(
                "an affine scheme (with an offset) has one scale level, not two, got {self}"
            )));
        }
        if !matches!(
            self.scale_dtype(),
            ScaleDtype::F32 | ScaleDtype::F16 | ScaleDtype::BF16
        ) {
            return Err(QuantError::Scheme(format!(
                "an affine scheme's scales are F32, F16 or BF16, got {self}"
            )));
        }
        if let Offset::Bias(d) = offset {
            if !matches!(d, ScaleDtype::F32 | ScaleDtype::F16 | ScaleDtype::BF16) {
                return Err(QuantError::Scheme(format!(
                    "a bias is F32, F16 or BF16, got {self}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "scheme_tests.rs"]
mod tests;
