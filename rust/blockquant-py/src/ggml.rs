//! The binding of `blockquant_core::ggml` (llama.cpp's block types), behind `blockquant.gguf`.
//!
//! Same shape as the rest of the binding: check arguments with the GIL held, allocate the
//! output, run the core with the GIL released, map its errors.

use blockquant_core::ggml::{self, GgmlType};
use numpy::{
    IxDyn, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::{errors, guarded, to_py, with_input};

/// One ggml type as the core knows it.
#[pyclass(frozen, get_all, module = "blockquant._core", name = "GgmlType")]
struct GgmlTypeInfo {
    name: &'static str,
    id: u32,
    block_size: usize,
    type_size: usize,
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
/// shape `(..., row_bytes)`.
#[pyfunction]
fn ggml_quantize<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyUntypedArray>,
    kind: &str,
    qtype: &str,
) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
    guarded(|| {
        let ty = ggml_type(qtype)?;
        let shape = x.shape().to_vec();
        let row_len = *shape.last().ok_or_else(no_rows)?;
        let row_bytes = ty.row_bytes(row_len).map_err(to_py)?;
        let out = PyArrayDyn::<u8>::zeros(py, IxDyn(&with_last(&shape, row_bytes)), false);
        {
            let mut rw = out.readwrite();
            let dst = rw.as_slice_mut().expect("a fresh array is contiguous");
            with_input(x, kind, |xs| {
                py.detach(|| ggml::quantize(ty, xs, row_len, dst))
                    .map_err(to_py)
            })?;
        }
        Ok(out)
    })
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
            .map_err(|_| PyTypeError::new_err("blocks must be a C-contiguous array"))?;
        let arr = match out {
            None => PyArrayDyn::<f32>::zeros(py, IxDyn(&want), false),
            Some(o) => {
                let a = o.cast_into::<PyArrayDyn<f32>>().map_err(|e| {
                    PyTypeError::new_err(format!(
                        "out must be a float32 array, got {}",
                        e.into_inner().get_type()
                    ))
                })?;
                if a.shape() != want.as_slice() {
                    return Err(errors::LayoutError::new_err(format!(
                        "out must have shape {want:?} for {ty} blocks of shape {shape:?}, got {:?}",
                        a.shape()
                    )));
                }
                a
            }
        };
        {
            let mut rw = arr.try_readwrite().map_err(|e| {
                PyTypeError::new_err(format!("out must be writeable and not overlap blocks: {e}"))
            })?;
            let dst = rw
                .as_slice_mut()
                .map_err(|_| PyTypeError::new_err("out must be a C-contiguous array"))?;
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
