//! The entry points of affine schemes (unsigned values with offsets,
//! format.md "Affine values (offsets)"): quantize, dequantize, bytes both ways and the check of parts, each returning or
//! taking the offsets beside the values and scales. Same shape as `lib.rs`'s: arguments checked
//! with the GIL held, the core's work without it.

use blockquant_core::{
    affine, pool, BF16Bits, Calibration, F16Bits, QuantizeOptions, Rounding, ScaleRounding, Scales,
    Storage,
};
use numpy::{
    PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::arrays::new_array;
use crate::errors::{self, guarded, to_py};
use crate::input::with_input;
use crate::parts::{
    contiguous, f32_array, layout, new_storage, storage_from_bytes, with_storage, with_storage_mut,
    Opt,
};
use crate::scheme::Scheme;

type Affine<'py> = (
    Bound<'py, PyUntypedArray>,
    Bound<'py, PyArrayDyn<f32>>,
    Bound<'py, PyArrayDyn<f32>>,
);

/// Quantize with an affine scheme: `(values, scales, offsets)`, offsets as float32 in the
/// grid's shape (zero points as whole numbers). `bits` (a U8 scheme only): codes of that many
/// bits (`affine::quantize_narrow`).
#[pyfunction]
#[pyo3(signature = (x, kind, scheme, calibration, rounding, scale_rounding, bits=None))]
#[allow(clippy::too_many_arguments)]
fn affine_quantize<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyUntypedArray>,
    kind: &str,
    scheme: &Bound<'py, Scheme>,
    calibration: Opt<Calibration>,
    rounding: Opt<Rounding>,
    scale_rounding: Opt<ScaleRounding>,
    bits: Option<u32>,
) -> PyResult<Affine<'py>> {
    guarded(|| {
        let layout = layout(scheme, x.shape())?;
        let opts = QuantizeOptions {
            calibration: calibration.0,
            rounding: rounding.0,
            scale_rounding: scale_rounding.0,
        };
        let storage = new_storage(py, &layout)?;
        let scales = new_array::<f32>(py, &layout.grid)?;
        let offsets = new_array::<f32>(py, &layout.grid)?;
        {
            let mut srw = scales.readwrite();
            let mut orw = offsets.readwrite();
            let sc = srw.as_slice_mut().expect("a fresh array is contiguous");
            let of = orw.as_slice_mut().expect("a fresh array is contiguous");
            with_input(x, kind, |xs| {
                with_storage_mut(&storage, &layout, |out| match bits {
                    None => affine::quantize(xs, &layout, &opts, out, sc, of),
                    Some(b) => affine::quantize_narrow(xs, &layout, &opts, b, out, sc, of),
                })
            })?
            .map_err(to_py)?;
        }
        Ok((storage, scales, offsets))
    })
}

fn checked_parts(
    layout: &blockquant_core::Layout,
    scales: &PyReadonlyArrayDyn<'_, f32>,
    offsets: &PyReadonlyArrayDyn<'_, f32>,
) -> PyResult<()> {
    for (a, what) in [(scales, "scales"), (offsets, "offsets")] {
        if a.shape() != layout.grid.as_slice() {
            return Err(errors::ScaleError::new_err(format!(
                "{what} for {} on shape {:?} have the grid shape {:?}, got {:?}",
                layout.scheme,
                layout.shape,
                layout.grid,
                a.shape()
            )));
        }
    }
    blockquant_core::quantize::check_stored(layout, contiguous(scales, "scales")?, None)
        .map_err(to_py)?;
    affine::check_offsets(layout, contiguous(offsets, "offsets")?).map_err(to_py)
}

/// Dequantize an affine tensor: float32, float64, or float16 / bfloat16 as uint16 bits.
#[pyfunction]
#[pyo3(signature = (values, scales, offsets, scheme, shape, dtype="float32"))]
#[allow(clippy::too_many_arguments)]
fn affine_dequantize<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyUntypedArray>,
    scales: PyReadonlyArrayDyn<'py, f32>,
    offsets: PyReadonlyArrayDyn<'py, f32>,
    scheme: &Bound<'py, Scheme>,
    shape: Vec<usize>,
    dtype: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    guarded(|| {
        let layout = layout(scheme, &shape)?;
        checked_parts(&layout, &scales, &offsets)?;
        let (sc, of) = (
            contiguous(&scales, "scales")?,
            contiguous(&offsets, "offsets")?,
        );
        fn fill<'py, T: numpy::Element, O: blockquant_core::pack::OutElem>(
            py: Python<'py>,
            shape: &[usize],
            values: &Bound<'py, PyUntypedArray>,
            layout: &blockquant_core::Layout,
            sc: &[f32],
            of: &[f32],
            cast: impl FnOnce(&mut [T]) -> &mut [O] + Send,
        ) -> PyResult<Bound<'py, PyUntypedArray>> {
            let a = new_array::<T>(py, shape)?;
            {
                let mut rw = a.readwrite();
                let o = cast(rw.as_slice_mut().expect("a fresh array is contiguous"));
                with_storage(values, layout, |st: Storage<'_>| {
                    pool::install_sized(layout.num_elements, || {
                        affine::dequantize(layout, st, sc, of, o)
                    })
                })?
                .map_err(to_py)?;
            }
            Ok(a.into_any()
                .cast_into::<PyUntypedArray>()
                .expect("a numpy array"))
        }
        match dtype {
            "float32" => fill::<f32, f32>(py, &shape, values, &layout, sc, of, |s| s),
            "float64" => fill::<f64, f64>(py, &shape, values, &layout, sc, of, |s| s),
            // SAFETY (both): F16Bits and BF16Bits are repr(transparent) u16s.
            "float16" => fill::<u16, F16Bits>(py, &shape, values, &layout, sc, of, |s| unsafe {
                std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut F16Bits, s.len())
            }),
            "bfloat16" => fill::<u16, BF16Bits>(py, &shape, values, &layout, sc, of, |s| unsafe {
                std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut BF16Bits, s.len())
            }),
            other => Err(PyTypeError::new_err(format!(
                "dequantize returns float32, float64, float16 or bfloat16, got {other}"
            ))),
        }
    })
}

/// The byte layout of an affine tensor: values, scales, then offsets.
#[pyfunction]
fn affine_to_bytes<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyUntypedArray>,
    scales: PyReadonlyArrayDyn<'py, f32>,
    offsets: PyReadonlyArrayDyn<'py, f32>,
    scheme: &Bound<'py, Scheme>,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    guarded(|| {
        let layout = layout(scheme, &shape)?;
        checked_parts(&layout, &scales, &offsets)?;
        let s =
            blockquant_core::alloc::try_to_vec(contiguous(&scales, "scales")?).map_err(to_py)?;
        let sc = Scales::from_stored(&layout, s, None).map_err(to_py)?;
        let of = contiguous(&offsets, "offsets")?;
        PyBytes::new_with(py, layout.total_bytes(), |buf| {
            with_storage(values, &layout, |st| {
                affine::write_bytes(&layout, st, &sc, of, buf)
            })?
            .map_err(to_py)
        })
    })
}

/// Split an affine tensor's bytes into `(values, scales, offsets)`.
#[pyfunction]
fn affine_from_bytes<'py>(
    py: Python<'py>,
    data: &[u8],
    scheme: &Bound<'py, Scheme>,
    shape: Vec<usize>,
) -> PyResult<Affine<'py>> {
    guarded(|| {
        let layout = layout(scheme, &shape)?;
        let parts = py
            .detach(|| affine::from_bytes(&layout, data))
            .map_err(to_py)?;
        let storage = storage_from_bytes(py, &layout, parts.storage)?;
        let scales = f32_array(py, &parts.scales.stored, &layout.grid)?;
        let offsets = f32_array(py, &parts.offsets, &layout.grid)?;
        Ok((storage, scales, offsets))
    })
}

/// Check an affine tensor's parts from a caller (`QTensor.from_parts`).
#[pyfunction]
fn check_affine_parts<'py>(
    values: &Bound<'py, PyUntypedArray>,
    scales: PyReadonlyArrayDyn<'py, f32>,
    offsets: PyReadonlyArrayDyn<'py, f32>,
    scheme: &Bound<'py, Scheme>,
    shape: Vec<usize>,
) -> PyResult<()> {
    guarded(|| {
        let layout = layout(scheme, &shape)?;
        checked_parts(&layout, &scales, &offsets)?;
        with_storage(values, &layout, |st| {
            blockquant_core::pack::check_storage(&layout, st)
        })?
        .map_err(to_py)
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(affine_quantize, m)?)?;
    m.add_function(wrap_pyfunction!(affine_dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(affine_to_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(affine_from_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(check_affine_parts, m)?)?;
    Ok(())
}
