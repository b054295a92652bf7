//! The one error type of the core. Each variant maps onto one Python exception class
//! (`blockquant.errors`), so the variant is the contract and the message is for people.

use thiserror::Error;

/// Everything the caller can get wrong, plus a catch-all for internal bugs.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum QuantError {
    /// An invalid scheme, or a scheme that does not fit the tensor (→ `SchemeError`).
    #[error("{0}")]
    Scheme(String),
    /// A two-level scheme got no per-tensor scale (→ `MissingGlobalScaleError`).
    #[error("{scheme} requires a per-tensor scale")]
    MissingGlobalScale { scheme: String },
    /// Quantize was given a per-tensor scale for a one-level scheme (→ `UnexpectedGlobalScaleError`).
    #[error("a per-tensor scale should come with a two-level scheme, got {scheme}")]
    UnexpectedGlobalScale { scheme: String },
    /// A tensor was built from parts with a per-tensor scale on a one-level scheme
    /// (→ `UnexpectedGlobalScaleError`).
    #[error("{scheme} does not take a per-tensor scale")]
    GlobalScaleNotTaken { scheme: String },
    /// Wrong number or shape of scales, negative, non-finite or unrepresentable (→ `ScaleError`).
    #[error("{0}")]
    Scale(String),
    /// A valid scheme with no implementation (→ `UnsupportedSchemeError`).
    #[error("Quantization not supported for scheme {scheme}")]
    Unsupported { scheme: String },
    /// Bytes or storage that do not fit scheme and shape (→ `LayoutError`).
    #[error("{0}")]
    Layout(String),
    /// An unknown option name, such as `calibration="max"` (→ `QuantError`, the base class).
    #[error("{0}")]
    Option(String),
    /// NaN or infinity in the input (→ `NonFiniteError`).
    #[error("non-finite value {} at flat index {index}", python_float(*value))]
    NonFinite { index: usize, value: f32 },
}

pub type Result<T> = std::result::Result<T, QuantError>;

/// A float as Python prints it (`nan`, `inf`, `-inf`), so messages read the same from either side.
pub(crate) fn python_float(v: f32) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        v.to_string()
    }
}
