//! The binding's error side: the `blockquant.errors` classes, the map from a core error onto
//! them, and the guard that turns a panic into `InternalError`. Every entry point uses these;
//! they use nothing else of the binding.

use std::panic::{catch_unwind, AssertUnwindSafe};

use blockquant_core::QuantError as CoreError;
use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;

pyo3::import_exception!(blockquant.errors, QuantError);
pyo3::import_exception!(blockquant.errors, SchemeError);
pyo3::import_exception!(blockquant.errors, ScaleError);
pyo3::import_exception!(blockquant.errors, MissingGlobalScaleError);
pyo3::import_exception!(blockquant.errors, UnexpectedGlobalScaleError);
pyo3::import_exception!(blockquant.errors, UnsupportedSchemeError);
pyo3::import_exception!(blockquant.errors, LayoutError);
pyo3::import_exception!(blockquant.errors, NonFiniteError);
pyo3::import_exception!(blockquant.errors, InternalError);

/// One core error → its Python class (format.md "Errors").
pub(crate) fn to_py(err: CoreError) -> PyErr {
    let msg = err.to_string();
    match err {
        CoreError::Scheme(_) => SchemeError::new_err(msg),
        CoreError::MissingGlobalScale { .. } => MissingGlobalScaleError::new_err(msg),
        CoreError::UnexpectedGlobalScale { .. } | CoreError::GlobalScaleNotTaken { .. } => {
            UnexpectedGlobalScaleError::new_err(msg)
        }
        CoreError::Scale(_) => ScaleError::new_err(msg),
        CoreError::Unsupported { .. } => UnsupportedSchemeError::new_err(msg),
        CoreError::Layout(_) => LayoutError::new_err(msg),
        CoreError::NonFinite { .. } => NonFiniteError::new_err(msg),
        CoreError::Option(_) => QuantError::new_err(msg),
        // Python's own class: callers (the CLI too) already handle it as running out of memory.
        CoreError::OutOfMemory { .. } => PyMemoryError::new_err(msg),
    }
}

/// A caller's `out` array the call cannot write into. One rule for every `out=` of the module:
/// a wrong type or dtype is a `TypeError`, anything else wrong with an array of the right dtype
/// (shape, layout, read-only, in use) a `ValueError`. "In use" is numpy's borrow of it: another
/// call, from another thread, is reading or writing the same array (or, within the call, it
/// shares memory with the input).
pub(crate) fn out_unwritable(what: &str, e: numpy::BorrowError) -> PyErr {
    let why = match e {
        numpy::BorrowError::NotWriteable => "is read-only: it must be writeable",
        _ => {
            "is in use: another call (from another thread) is reading or writing the same \
             array, or it shares memory with this call's input"
        }
    };
    pyo3::exceptions::PyValueError::new_err(format!("{what} {why}"))
}

/// Run an entry point's body; a panic anywhere in it (rayon workers included) becomes
/// `InternalError` with the panic message.
pub(crate) fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(InternalError::new_err(format!(
                "internal error in blockquant (please report it): {what}"
            )))
        }
    }
}
