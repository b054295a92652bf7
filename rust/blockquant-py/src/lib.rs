//! `blockquant._core`: the thin binding over `blockquant-core`.
//!
//! Every entry point follows one shape: extract and check arguments with the GIL held, allocate
//! the output numpy arrays, release the GIL (`py.detach`) around the core call that fills them,
//! then map a core error onto its `blockquant.errors` class. Panics are caught at each entry point
//! and raised as `blockquant.errors.InternalError`, never as pyo3's `PanicException`.

use blockquant_core::{
    bytes, pack, pool, quantize as q, BF16Bits, Calibration, ExplicitScales, F16Bits, Layout,
    Output, QuantizeOptions, Rounding, ScaleRounding, Scales,
};
use numpy::{
    PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

mod affine;
mod arrays;
mod errors;
mod ggml;
mod input;
mod parts;
mod scheme;

use arrays::new_array;
use errors::{guarded, to_py};
use input::with_input;
use parts::{
    contiguous, f32_array, layout, new_storage, storage_from_bytes, with_storage, with_storage_mut,
    Opt,
};
use scheme::{scale_dtype_arg, Scheme};

type Quantized<'py> = (
    Bound<'py, PyUntypedArray>,
    Bound<'py, PyArrayDyn<f32>>,
    Option<f32>,
);

/// The option names of a quantize call, checked (`TypeError` for a non-string, `QuantError`
/// for an unknown name) before the input's dtype is, as the reference checks them.
#[pyfunction]
fn check_options(
    calibration: Opt<Calibration>,
    rounding: Opt<Rounding>,
    scale_rounding: Opt<ScaleRounding>,
) -> PyResult<()> {
    guarded(|| {
        let _ = (calibration, rounding, scale_rounding);
        Ok(())
    })
}

/// The checks of a quantize call that need no value of its arguments (`q::check_call`), made
/// by the Python side before it checks the values of g, the weights and the scales: a call
/// with several faults then fails on the one the reference names.
#[pyfunction]
fn check_call(
    scheme: &Bound<'_, Scheme>,
    shape: Vec<usize>,
    calibration: Opt<Calibration>,
    rounding: Opt<Rounding>,
    scale_rounding: Opt<ScaleRounding>,
    has_scales: bool,
    has_global: bool,
) -> PyResult<()> {
    guarded(|| {
        let opts = QuantizeOptions {
            calibration: calibration.0,
            rounding: rounding.0,
            scale_rounding: scale_rounding.0,
        };
        q::check_call(&scheme.get().0, &shape, &opts, has_scales, has_global)
            .map(|_| ())
            .map_err(to_py)
    })
}

/// Quantize a C-contiguous float array (see `with_input` for `kind`). Returns
/// `(values, scales, global_scale)`.
#[pyfunction]
#[pyo3(signature = (x, kind, scheme, calibration, rounding, scale_rounding, scales=None, global_scale=None, out_values=None, out_scales=None, weights=None))]
#[allow(clippy::too_many_arguments)]
fn quantize<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyUntypedArray>,
    kind: &str,
    scheme: &Bound<'py, Scheme>,
    calibration: Opt<Calibration>,
    rounding: Opt<Rounding>,
    scale_rounding: Opt<ScaleRounding>,
    scales: Option<PyReadonlyArrayDyn<'py, f32>>,
    global_scale: Option<f32>,
    out_values: Option<Bound<'py, PyUntypedArray>>,
    out_scales: Option<Bound<'py, PyUntypedArray>>,
    weights: Option<PyReadonlyArrayDyn<'py, f32>>,
) -> PyResult<Quantized<'py>> {
    guarded(|| {
        let layout = layout(scheme, x.shape())?;
        let opts = QuantizeOptions {
            calibration: calibration.0,
            rounding: rounding.0,
            scale_rounding: scale_rounding.0,
        };
        let given = match &scales {
            Some(s) => Some(contiguous(s, "scales")?),
            None => None,
        };
        let explicit = ExplicitScales {
            scales: given,
            global: global_scale,
        };
        let w = match &weights {
            Some(w) => Some(contiguous(w, "weights")?),
            None => None,
        };
        // The caller's arrays (quantize(out=...)): checked for dtype, shape and contiguity
        // here, before anything is written; the Python side has checked overlap.
        let (storage, scales_out) = match (out_values, out_scales) {
            (Some(v), Some(s)) => {
                let want = layout.storage_shape();
                if v.shape() != want.as_slice() || s.shape() != layout.grid.as_slice() {
                    return Err(PyValueError::new_err(format!(
                        "out arrays must have the shapes {want:?} and {:?}, got {:?} and {:?}",
                        layout.grid,
                        v.shape(),
                        s.shape()
                    )));
                }
                let s = s
                    .cast_into::<PyArrayDyn<f32>>()
                    .map_err(|_| PyTypeError::new_err("out scales must be a float32 array"))?;
                (v, Some(s))
            }
            (None, None) => (new_storage(py, &layout)?, None),
            _ => {
                return Err(PyTypeError::new_err(
                    "out takes both arrays: (values, scales)",
                ))
            }
        };
        // The scales' borrow is taken before anything is written, so an unwriteable or
        // overlapping scales array is refused with the values untouched. Without `out`, a fresh
        // array: the core writes every stored scale straight into either.
        let scales = match scales_out {
            Some(arr) => arr,
            None => new_array::<f32>(py, &layout.grid)?,
        };
        let mut scales_rw = scales
            .try_readwrite()
            .map_err(|e| errors::out_unwritable("out scales", e))?;
        let sc = scales_rw
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("out scales must be aligned and C-contiguous"))?;
        let global = with_input(x, kind, |xs| {
            with_storage_mut(&storage, &layout, |out| {
                pool::install_sized(layout.num_elements, || match w {
                    Some(w) => blockquant_core::search::quantize_weighted(
                        xs,
                        w,
                        &layout,
                        &opts,
                        Some(explicit),
                        out,
                    )
                    .map(|s| {
                        sc.copy_from_slice(&s.stored);
                        s.global
                    }),
                    None => q::quantize_into(xs, &layout, &opts, Some(explicit), out, sc),
                })
            })
        })?
        .map_err(to_py)?;
        drop(scales_rw);
        Ok((storage, scales, global))
    })
}

fn stored_scales(
    layout: &Layout,
    scales: &PyReadonlyArrayDyn<'_, f32>,
    global: Option<f32>,
) -> PyResult<Scales> {
    let s = contiguous(scales, "scales")?;
    let s = blockquant_core::alloc::try_to_vec(s).map_err(to_py)?;
    Scales::from_stored(layout, s, global).map_err(to_py)
}

/// The array dequantize writes: the caller's `out` (checked: dtype, shape, C-contiguous,
/// writeable, not shared with an input), or a fresh one.
fn output_array<'py, T: numpy::Element>(
    py: Python<'py>,
    shape: &[usize],
    out: Option<&Bound<'py, PyUntypedArray>>,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let Some(out) = out else {
        return new_array::<T>(py, shape);
    };
    let a = out.cast::<PyArrayDyn<T>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "out must be a {} array, got {}",
            numpy::dtype::<T>(py),
            out.dtype()
        ))
    })?;
    if a.shape() != shape {
        return Err(PyTypeError::new_err(format!(
            "out must have shape {shape:?}, got {:?}",
            a.shape()
        )));
    }
    Ok(a.clone())
}

/// Dequantize storage + stored scales to an array of `shape`: float32, float64, or float16 /
/// bfloat16 as their uint16 bit patterns (the Python side views them); into `out` if given.
#[pyfunction]
#[pyo3(signature = (values, scales, global_scale, scheme, shape, dtype="float32", out=None))]
#[allow(clippy::too_many_arguments)]
fn dequantize<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyUntypedArray>,
    scales: PyReadonlyArrayDyn<'py, f32>,
    global_scale: Option<f32>,
    scheme: &Bound<'py, Scheme>,
    shape: Vec<usize>,
    dtype: &str,
    out: Option<Bound<'py, PyUntypedArray>>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    guarded(|| {
        let layout = layout(scheme, &shape)?;
        let given = contiguous(&scales, "scales")?;
        q::check_stored(&layout, given, global_scale).map_err(to_py)?;
        // The caller's scales as they are, and a two-level g multiplied in block by block: a
        // copy of the grid, or of b_i × g, on every call would cost its page faults and a pass.
        let run = |out: Output<'_>| {
            with_storage(values, &layout, |st| {
                pool::install_sized(layout.num_elements, || {
                    q::dequantize(&layout, st, given, global_scale, out)
                })
            })?
            .map_err(to_py)
        };
        // A caller's array may alias an input or be read-only or strided: numpy's borrow
        // tracking and contiguity checks say so as errors, never as a panic.
        fn writable<'a, T: numpy::Element>(
            rw: &'a mut numpy::PyReadwriteArrayDyn<'_, T>,
        ) -> PyResult<&'a mut [T]> {
            rw.as_slice_mut()
                .map_err(|_| PyTypeError::new_err("out must be an aligned, C-contiguous array"))
        }
        fn borrow<'py, T: numpy::Element>(
            a: &Bound<'py, PyArrayDyn<T>>,
        ) -> PyResult<numpy::PyReadwriteArrayDyn<'py, T>> {
            a.try_readwrite()
                .map_err(|e| errors::out_unwritable("out", e))
        }
        let arr = match dtype {
            "float32" => {
                let a = output_array::<f32>(py, &shape, out.as_ref())?;
                run(Output::F32(writable(&mut borrow(&a)?)?))?;
                a.into_any()
            }
            "float64" => {
                let a = output_array::<f64>(py, &shape, out.as_ref())?;
                run(Output::F64(writable(&mut borrow(&a)?)?))?;
                a.into_any()
            }
            "float16" | "bfloat16" => {
                let a = output_array::<u16>(py, &shape, out.as_ref())?;
                {
                    let mut rw = borrow(&a)?;
                    let bits = writable(&mut rw)?;
                    let (ptr, len) = (bits.as_mut_ptr(), bits.len());
                    if dtype == "float16" {
                        // SAFETY: F16Bits is a repr(transparent) u16; the slice is ours alone.
                        run(Output::F16(unsafe {
                            std::slice::from_raw_parts_mut(ptr as *mut F16Bits, len)
                        }))?;
                    } else {
                        // SAFETY: BF16Bits is a repr(transparent) u16; the slice is ours alone.
                        run(Output::BF16(unsafe {
                            std::slice::from_raw_parts_mut(ptr as *mut BF16Bits, len)
                        }))?;
                    }
                }
                a.into_any()
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "dequantize returns float32, float64, float16 or bfloat16, got {other}"
                )))
            }
        };
        Ok(arr.cast_into::<PyUntypedArray>().expect("a numpy array"))
    })
}

/// burn's byte layout of storage + stored scales (+ global).
#[pyfunction]
#[pyo3(signature = (values, scales, global_scale, scheme, shape))]
fn to_bytes<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyUntypedArray>,
    scales: PyReadonlyArrayDyn<'py, f32>,
    global_scale: Option<f32>,
    scheme: &Bound<'py, Scheme>,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    guarded(|| {
        let layout = layout(scheme, &shape)?;
        let sc = stored_scales(&layout, &scales, global_scale)?;
        let n = layout.total_bytes();
        // Written straight into the bytes object: no copy, and a failed allocation is Python's
        // own MemoryError.
        PyBytes::new_with(py, n, |buf| {
            with_storage(values, &layout, |st| {
                bytes::write_bytes(&layout, st, &sc, buf)
            })?
            .map_err(to_py)
        })
    })
}

/// Split bytes into `(values, scales, global_scale)`; a wrong length is a `LayoutError`.
#[pyfunction]
fn from_bytes<'py>(
    py: Python<'py>,
    data: &[u8],
    scheme: &Bound<'py, Scheme>,
    shape: Vec<usize>,
) -> PyResult<Quantized<'py>> {
    guarded(|| {
        let layout = layout(scheme, &shape)?;
        // Checking every stored code reads the whole buffer: without the GIL.
        let parts = py
            .detach(|| bytes::from_bytes(&layout, data))
            .map_err(to_py)?;
        let storage = storage_from_bytes(py, &layout, parts.storage)?;
        let scales = f32_array(py, &parts.scales.stored, &layout.grid)?;
        Ok((storage, scales, parts.scales.global))
    })
}

/// Check parts taken from a caller (`QTensor.from_parts`): storage dtype, shape and codes,
/// scale count and representability, per-tensor scale presence.
#[pyfunction]
#[pyo3(signature = (values, scales, global_scale, scheme, shape))]
fn check_parts<'py>(
    values: &Bound<'py, PyUntypedArray>,
    scales: PyReadonlyArrayDyn<'py, f32>,
    global_scale: Option<f32>,
    scheme: &Bound<'py, Scheme>,
    shape: Vec<usize>,
) -> PyResult<()> {
    guarded(|| {
        let layout = layout(scheme, &shape)?;
        if scales.shape() != layout.grid.as_slice() {
            return Err(errors::ScaleError::new_err(format!(
                "scales for {} on shape {:?} have the grid shape {:?}, got {:?}",
                layout.scheme,
                layout.shape,
                layout.grid,
                scales.shape()
            )));
        }
        q::check_stored(&layout, contiguous(&scales, "scales")?, global_scale).map_err(to_py)?;
        with_storage(values, &layout, |st| pack::check_storage(&layout, st))?.map_err(to_py)
    })
}

/// Round scales to a dtype (`bq.round_scale`); returns float32 values.
#[pyfunction]
fn round_scale<'py>(
    py: Python<'py>,
    scales: PyReadonlyArrayDyn<'py, f32>,
    dtype: &str,
    mode: Opt<ScaleRounding>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    guarded(|| {
        let dtype = scale_dtype_arg(dtype)?;
        let mode = mode.0;
        let src = contiguous(&scales, "scales")?;
        let out = new_array::<f32>(py, scales.shape())?;
        {
            let mut rw = out.readwrite();
            let dst = rw.as_slice_mut().expect("a fresh array is contiguous");
            py.detach(|| pool::install_sized(src.len(), || q::round_scales(src, dtype, mode, dst)))
                .map_err(to_py)?;
        }
        Ok(out)
    })
}

/// Bound the kernels' thread pool (0: back to `BLOCKQUANT_NUM_THREADS` or all cores).
#[pyfunction]
fn set_num_threads(n: &Bound<'_, PyAny>) -> PyResult<()> {
    guarded(|| {
        if n.is_instance_of::<pyo3::types::PyBool>() || !n.is_instance_of::<pyo3::types::PyInt>() {
            return Err(PyTypeError::new_err(format!(
                "set_num_threads takes an int, got {}",
                n.get_type().name()?
            )));
        }
        let n = n
            .extract::<i64>()
            .ok()
            .filter(|&v| (0..=pool::MAX_THREADS as i64).contains(&v));
        let n = n.ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(
                "set_num_threads takes 0 (the default) to 1024 threads",
            )
        })?;
        pool::set_num_threads(n as usize);
        Ok(())
    })
}

/// Threads the kernels run on.
#[pyfunction]
fn get_num_threads() -> PyResult<usize> {
    guarded(|| Ok(pool::num_threads()))
}

/// Test hook: panic inside the core's thread pool, to prove panics surface as `InternalError`.
#[pyfunction]
fn _panic_for_tests(py: Python<'_>) -> PyResult<()> {
    guarded(|| {
        py.detach(pool::panic_in_worker);
        Ok(())
    })
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Every entry point catches panics and raises InternalError with the message; Rust's default
    // hook would also print it on stderr, which a caller's one-line error contract cannot have.
    // (This hook is this extension's own: each cdylib carries its own std.)
    std::panic::set_hook(Box::new(|_| {}));
    scheme::register(m)?;
    m.add_function(wrap_pyfunction!(quantize, m)?)?;
    m.add_function(wrap_pyfunction!(check_options, m)?)?;
    m.add_function(wrap_pyfunction!(check_call, m)?)?;
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(to_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(from_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(check_parts, m)?)?;
    m.add_function(wrap_pyfunction!(round_scale, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    ggml::register(m)?;
    affine::register(m)?;
    Ok(())
}
