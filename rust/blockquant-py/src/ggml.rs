//! The binding of `blockquant_core::ggml` (llama.cpp's block types), behind `blockquant.gguf`.
//!
//! Same shape as the rest of the binding: check arguments with the GIL held, allocate the
//! output, run the core with the GIL released, map its errors.

use blockquant_core::ggml::{self, GgmlType};
use numpy::{
    PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::arrays::new_array;
use crate::errors::{self, guarded, to_py};
use crate::input::with_input;

/// One ggml type as the core knows it.
#[pyclass(frozen, get_all, module = "blockquant._core", name = "GgmlType")]
struct GgmlTypeInfo {
    name: &'static str,
    id: u32,
    block_size: usize,
    type_size: usize,
    /// Whether importance weights steer its quantizer (`ggml_quantize(weights=)`).
    takes_weights: bool,
}

/// Every type the core reads and writes.
#[pyfunction]
fn ggml_types() -> PyResult<Vec<GgmlTypeInfo>> {
    guarded(|| {
        Ok(GgmlType::ALL
            .into_iter()
            .map(|t| GgmlTypeInfo {
                name: t.name(),
                id: t.id(),
                block_size: t.block_size(),
                type_size: t.type_size(),
                takes_weights: ggml::takes_weights(t),
            })
            .collect())
    })
}

fn ggml_type(name: &str) -> PyResult<GgmlType> {
    GgmlType::from_name(name)
        .ok_or_else(|| errors::SchemeError::new_err(format!("unknown ggml type {name:?}")))
}

/// `(rows..., last)` → `(rows..., new_last)`; a 0-d array has no rows.
fn with_last(shape: &[usize], new_last: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    *s.last_mut().expect("checked: at least 1-D") = new_last;
    s
}

fn no_rows() -> PyErr {
    errors::LayoutError::new_err("a 0-d array has no rows to divide into blocks")
}

/// Quantize a C-contiguous float array (`kind` as for `quantize`) to `qtype`'s blocks: uint8 of
/// shape `(..., row_bytes)`, written into `out` when given (uint8, C-contiguous, writeable, that
/// shape). `weights`: C-contiguous float32 importance rows of the row length (one, one per
/// expert, or one per row), each block's error weighted by them (`ggml::quantize_weighted`).
#[pyfunction]
#[pyo3(signature = (x, kind, qtype, out=None, weights=None))]
fn ggml_quantize<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyUntypedArray>,
    kind: &str,
    qtype: &str,
    out: Option<Bound<'py, PyAny>>,
    weights: Option<PyReadonlyArrayDyn<'py, f32>>,
) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
    guarded(|| {
        let ty = ggml_type(qtype)?;
        let shape = x.shape().to_vec();
        let row_len = *shape.last().ok_or_else(no_rows)?;
        let row_bytes = ty.row_bytes(row_len).map_err(to_py)?;
        let want = with_last(&shape, row_bytes);
        let arr = output::<u8>(py, out, &want, "uint8", || {
            format!("{ty} blocks of values of shape {shape:?}")
        })?;
        // x is borrowed first, so an `out` overlapping it fails the write borrow (an error)
        // rather than the read borrow (a panic in rust-numpy).
        let w = match &weights {
            Some(w) => Some(crate::parts::contiguous(w, "weights")?),
            None => None,
        };
        with_input(x, kind, |xs| {
            let mut rw = writeable(&arr, "x")?;
            let dst = contiguous_mut(&mut rw)?;
            py.detach(|| match w {
                Some(w) => ggml::quantize_weighted(ty, xs, row_len, w, dst),
                None => ggml::quantize(ty, xs, row_len, dst),
            })
            .map_err(to_py)
        })?;
        Ok(arr)
    })
}

/// The caller's `out` (checked: dtype, shape) or a fresh array of shape `want` (numpy's own,
/// so no memory for it is `MemoryError`; every element is written).
fn output<'py, T: numpy::Element>(
    py: Python<'py>,
    out: Option<Bound<'py, PyAny>>,
    want: &[usize],
    dtype: &str,
    what: impl FnOnce() -> String,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let Some(o) = out else {
        return new_array::<T>(py, want);
    };
    let a = o.cast_into::<PyArrayDyn<T>>().map_err(|e| {
        let got = e.into_inner();
        let got = match got.getattr("dtype") {
            Ok(d) => d.to_string(),
            Err(_) => got.get_type().to_string(),
        };
        PyTypeError::new_err(format!("out must be a {dtype} array, got {got}"))
    })?;
    if a.shape() != want {
        return Err(errors::LayoutError::new_err(format!(
            "out must have shape {want:?} for {}, got {:?}",
            what(),
            a.shape()
        )));
    }
    Ok(a)
}

fn writeable<'py, T: numpy::Element>(
    arr: &Bound<'py, PyArrayDyn<T>>,
    input: &str,
) -> PyResult<numpy::PyReadwriteArrayDyn<'py, T>> {
    arr.try_readwrite()
        .map_err(|e| errors::out_unwritable(&format!("out (which must not overlap {input})"), e))
}

fn contiguous_mut<'a, T: numpy::Element>(
    rw: &'a mut numpy::PyReadwriteArrayDyn<'_, T>,
) -> PyResult<&'a mut [T]> {
    rw.as_slice_mut()
        .map_err(|_| PyValueError::new_err("out must be an aligned, C-contiguous array"))
}

/// Dequantize C-contiguous uint8 blocks of shape `(..., row_bytes)` to float32 `(..., row_len)`,
/// into `out` when given (float32, C-contiguous, writeable, that shape).
#[pyfunction]
#[pyo3(signature = (blocks, qtype, out=None))]
fn ggml_dequantize<'py>(
    py: Python<'py>,
    blocks: PyReadonlyArrayDyn<'py, u8>,
    qtype: &str,
    out: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    guarded(|| {
        let ty = ggml_type(qtype)?;
        let shape = blocks.shape().to_vec();
        let row_bytes = *shape.last().ok_or_else(no_rows)?;
        let row_len = ty.row_len(row_bytes).map_err(to_py)?;
        let want = with_last(&shape, row_len);
        let src = blocks
            .as_slice()
            .map_err(|_| PyTypeError::new_err("blocks must be an aligned, C-contiguous array"))?;
        let arr = output::<f32>(py, out, &want, "float32", || {
            format!("{ty} blocks of shape {shape:?}")
        })?;
        {
            let mut rw = writeable(&arr, "blocks")?;
            let dst = contiguous_mut(&mut rw)?;
            py.detach(|| ggml::dequantize(ty, src, dst));
        }
        Ok(arr)
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GgmlTypeInfo>()?;
    m.add_function(wrap_pyfunction!(ggml_types, m)?)?;
    m.add_function(wrap_pyfunction!(ggml_quantize, m)?)?;
    m.add_function(wrap_pyfunction!(ggml_dequantize, m)?)?;
    Ok(())
}
