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
    /// NaN or infinity in the input (→ `NonFiniteError`): `value` as it reached the kernels, and
    /// `given`, a float64 input's own value where that is finite but too large for f32 (it became
    /// ±inf on the way), named in the message as `blockquant.reference` names it.
    #[error(
        "non-finite value {} at flat index {index}{}",
        python_float(*value),
        overflow_note(*given)
    )]
    NonFinite {
        index: usize,
        value: f32,
        given: Option<f64>,
    },
    /// An allocation sized by the input could not be made (→ Python's `MemoryError`): the
    /// call fails and the process lives on, where Rust's infallible `Vec` would abort it.
    #[error("out of memory: could not allocate {bytes} bytes")]
    OutOfMemory { bytes: usize },
}

pub type Result<T> = std::result::Result<T, QuantError>;

/// " (1e+300 overflows float32)" for a float64 input value beyond f32's range, the value as
/// Python's `repr` prints it; empty otherwise. Beyond 3.4e38, `repr` is the shortest digits in
/// scientific form with a signed exponent, which is Rust's `{:e}` with the `+` added.
fn overflow_note(given: Option<f64>) -> String {
    match given {
        Some(v) => format!(
            " ({} overflows float32)",
            format!("{v:e}").replace('e', "e+")
        ),
        None => String::new(),
    }
}

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
