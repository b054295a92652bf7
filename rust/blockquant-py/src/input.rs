//! The input array of a quantize call, borrowed from numpy without a copy.

use blockquant_core::Input;
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// Run `f` on the input values, borrowed from the numpy array without a copy. `kind` says how to
/// read it: "f32", "f64", or "f16" / "bf16" for a uint16 view of half-precision bits.
pub(crate) fn with_input<R>(
    x: &Bound<'_, PyUntypedArray>,
    kind: &str,
    f: impl FnOnce(Input<'_>) -> PyResult<R>,
) -> PyResult<R> {
    let bad = || {
        PyTypeError::new_err(format!(
            "x of kind {kind:?} must be an aligned, C-contiguous array of its dtype"
        ))
    };
    match kind {
        "f32" => {
            let a = x.cast::<PyArrayDyn<f32>>().map_err(|_| bad())?.readonly();
            f(Input::F32(a.as_slice().map_err(|_| bad())?))
        }
        "f64" => {
            let a = x.cast::<PyArrayDyn<f64>>().map_err(|_| bad())?.readonly();
            f(Input::F64(a.as_slice().map_err(|_| bad())?))
        }
        "f16" | "bf16" => {
            let a = x.cast::<PyArrayDyn<u16>>().map_err(|_| bad())?.readonly();
            let bits = a.as_slice().map_err(|_| bad())?;
            f(if kind == "f16" {
                Input::F16(bits)
            } else {
                Input::BF16(bits)
            })
        }
        _ => Err(crate::errors::QuantError::new_err(format!(
            "unknown input kind {kind:?}"
        ))),
    }
}
