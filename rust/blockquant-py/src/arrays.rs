//! Fresh numpy arrays for the binding's outputs, made so that an allocation that fails is
//! Python's `MemoryError` and never a panic. Uses nothing else of the binding.

use numpy::PyArrayDyn;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// A fresh numpy array, made by numpy itself so that an allocation it cannot make is Python's
/// `MemoryError` (the numpy crate's constructors turn a failed allocation into a null pointer
/// panic). Not zeroed: every caller writes every element (storage, scales, dequantize's
/// output, ggml's blocks and values), and zeroing costs a serial pass over the memory in the
/// calling thread (glibc's calloc clears reused heap memory with memset) before the kernel's
/// parallel one.
pub(crate) fn new_array<'py, T: numpy::Element>(
    py: Python<'py>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let np = py.import("numpy")?;
    let shape = pyo3::types::PyTuple::new(py, shape)?;
    let arr = np.call_method1("empty", (shape, numpy::dtype::<T>(py)))?;
    arr.cast_into::<PyArrayDyn<T>>()
        .map_err(|_| PyTypeError::new_err("numpy.empty made an array of another type"))
}
