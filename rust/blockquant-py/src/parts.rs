//! The argument plumbing every entry point shares: a scheme's layout on a shape, options by
//! name, contiguous slices of numpy arrays, fresh storage of a layout and the storage of a
//! caller's array, read or written without the GIL.

use blockquant_core::{Layout, OptionName, Storage, StorageMut};
use numpy::{
    PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::arrays::new_array;
use crate::errors::{self, to_py};
use crate::scheme::{Scheme, StorageDtype};

pub(crate) fn layout(scheme: &Bound<'_, Scheme>, shape: &[usize]) -> PyResult<Layout> {
    Layout::new(&scheme.get().0, shape).map_err(to_py)
}

/// An option given by name (`calibration="absmean"`): parsed by the core, which lists the
/// choices when the name is unknown.
pub(crate) struct Opt<T>(pub(crate) T);

impl<'a, 'py, T: OptionName> FromPyObject<'a, 'py> for Opt<T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let name = obj.cast::<pyo3::types::PyString>().map_err(|_| {
            PyTypeError::new_err(format!("{} is a string, got {}", T::WHAT, obj.get_type()))
        })?;
        // Lossy: a name with a lone surrogate ("\ud800") is no name of an option, refused by
        // the core like any other (QuantError), not by UTF-8 encoding (UnicodeEncodeError).
        T::from_name(&name.to_string_lossy())
            .map(Opt)
            .map_err(to_py)
    }
}

pub(crate) fn contiguous<'a, T: numpy::Element>(
    a: &'a PyReadonlyArrayDyn<'_, T>,
    what: &str,
) -> PyResult<&'a [T]> {
    a.as_slice()
        .map_err(|_| PyTypeError::new_err(format!("{what} must be an aligned, C-contiguous array")))
}

/// int8 storage seen as bytes.
fn bytes_of(s: &[i8]) -> &[u8] {
    // SAFETY: i8 and u8 have the same size and alignment; every bit pattern is valid in both.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, s.len()) }
}

/// int8 storage seen as writable bytes.
fn bytes_of_mut(s: &mut [i8]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; the borrow is carried over unchanged.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, s.len()) }
}

/// Fresh storage of the layout's dtype and shape.
pub(crate) fn new_storage<'py>(
    py: Python<'py>,
    layout: &Layout,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let shape = layout.storage_shape();
    let arr = match StorageDtype::of(layout) {
        StorageDtype::U32 => new_array::<u32>(py, &shape)?.into_any(),
        StorageDtype::I8 => new_array::<i8>(py, &shape)?.into_any(),
        StorageDtype::U8 => new_array::<u8>(py, &shape)?.into_any(),
    };
    Ok(arr.cast_into::<PyUntypedArray>().expect("a numpy array"))
}

/// Fresh storage of `layout` holding `bytes`, the storage part of burn's byte layout (words
/// little-endian), copied without the GIL.
pub(crate) fn storage_from_bytes<'py>(
    py: Python<'py>,
    layout: &Layout,
    bytes: &[u8],
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let storage = new_storage(py, layout)?;
    with_storage_mut(&storage, layout, |out| match out {
        StorageMut::U8(dst) => dst.copy_from_slice(bytes),
        // On a little-endian machine the stored bytes are the words as they are.
        StorageMut::U32(dst) if cfg!(target_endian = "little") => {
            blockquant_core::pack::words_as_bytes_mut(dst).copy_from_slice(bytes)
        }
        StorageMut::U32(dst) => {
            for (w, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    })?;
    Ok(storage)
}

/// Run `f`, with the GIL released, on storage made by [`new_storage`] for `layout`.
pub(crate) fn with_storage_mut<R: Send>(
    arr: &Bound<'_, PyUntypedArray>,
    layout: &Layout,
    f: impl FnOnce(StorageMut<'_>) -> R + Send,
) -> PyResult<R> {
    let py = arr.py();
    fn not_ours<E>(_: E) -> PyErr {
        PyTypeError::new_err(
            "out values must be a writeable, aligned, C-contiguous array of the layout's storage dtype, \
             sharing no memory with the input",
        )
    }
    match StorageDtype::of(layout) {
        StorageDtype::U32 => {
            let mut rw = arr
                .cast::<PyArrayDyn<u32>>()
                .map_err(not_ours)?
                .try_readwrite()
                .map_err(|e| errors::out_unwritable("out values", e))?;
            let s = rw.as_slice_mut().map_err(not_ours)?;
            Ok(py.detach(|| f(StorageMut::U32(s))))
        }
        StorageDtype::U8 => {
            let mut rw = arr
                .cast::<PyArrayDyn<u8>>()
                .map_err(not_ours)?
                .try_readwrite()
                .map_err(|e| errors::out_unwritable("out values", e))?;
            let s = rw.as_slice_mut().map_err(not_ours)?;
            Ok(py.detach(|| f(StorageMut::U8(s))))
        }
        StorageDtype::I8 => {
            let mut rw = arr
                .cast::<PyArrayDyn<i8>>()
                .map_err(not_ours)?
                .try_readwrite()
                .map_err(|e| errors::out_unwritable("out values", e))?;
            let s = bytes_of_mut(rw.as_slice_mut().map_err(not_ours)?);
            Ok(py.detach(|| f(StorageMut::U8(s))))
        }
    }
}

/// Run `f`, with the GIL released, on read-only storage checked against the layout's dtype
/// and shape.
pub(crate) fn with_storage<R: Send>(
    arr: &Bound<'_, PyUntypedArray>,
    layout: &Layout,
    f: impl FnOnce(Storage<'_>) -> R + Send,
) -> PyResult<R> {
    let py = arr.py();
    let want_shape = layout.storage_shape();
    if arr.shape() != want_shape.as_slice() {
        return Err(errors::LayoutError::new_err(format!(
            "values for {} with shape {:?} have storage shape {:?}, got {:?}",
            layout.scheme,
            layout.shape,
            want_shape,
            arr.shape()
        )));
    }
    let want = StorageDtype::of(layout);
    let wrong = |_| {
        errors::LayoutError::new_err(format!(
            "values for {} are stored as {}, got {}",
            layout.scheme,
            want.name(),
            arr.dtype()
        ))
    };
    match want {
        StorageDtype::U32 => {
            let ro = arr.cast::<PyArrayDyn<u32>>().map_err(wrong)?.readonly();
            let s = contiguous(&ro, "values")?;
            Ok(py.detach(|| f(Storage::U32(s))))
        }
        StorageDtype::U8 => {
            let ro = arr.cast::<PyArrayDyn<u8>>().map_err(wrong)?.readonly();
            let s = contiguous(&ro, "values")?;
            Ok(py.detach(|| f(Storage::U8(s))))
        }
        StorageDtype::I8 => {
            let ro = arr.cast::<PyArrayDyn<i8>>().map_err(wrong)?.readonly();
            let s = bytes_of(contiguous(&ro, "values")?);
            Ok(py.detach(|| f(Storage::U8(s))))
        }
    }
}

pub(crate) fn f32_array<'py>(
    py: Python<'py>,
    data: &[f32],
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let arr = new_array::<f32>(py, shape)?;
    {
        let mut rw = arr.readwrite();
        rw.as_slice_mut()
            .expect("a fresh array is contiguous")
            .copy_from_slice(data);
    }
    Ok(arr)
}
