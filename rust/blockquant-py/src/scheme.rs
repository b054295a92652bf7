//! The scheme as Python sees it: the frozen `Scheme` pyclass (the core's `QuantScheme`), its
//! text form both ways, the facts of each value type and scale dtype, and the `Layout` of a
//! scheme on one shape.

use blockquant_core::{
    scheme_text, Codebook, Layout, Offset, QuantMode, QuantScheme, QuantStore, QuantValue,
    ScaleDtype,
};
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;

use crate::errors::{self, guarded, to_py};

/// A scheme, built and validated once on the Python side's request and then handed to every
/// call as it is: Rust is the one validator of the scheme rules (format.md "The scheme").
#[pyclass(frozen, eq, hash, module = "blockquant._core", name = "Scheme")]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Scheme(pub(crate) QuantScheme);

/// A non-negative size from Python: a negative or huge int is a `SchemeError` (`negative`
/// says which rule a negative one breaks), not an `OverflowError`.
fn size_arg(obj: &Bound<'_, PyAny>, what: &str, negative: &str) -> PyResult<usize> {
    if obj.is_instance_of::<pyo3::types::PyBool>() || !obj.is_instance_of::<pyo3::types::PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{what} is an int, got {}",
            obj.get_type().name()?
        )));
    }
    match obj.extract::<usize>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
            let msg = if obj.lt(0)? {
                format!("{negative}, got {obj}")
            } else {
                format!("{what} must be at most {}, got {obj}", usize::MAX)
            };
            Err(errors::SchemeError::new_err(msg))
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn scale_dtype_arg(name: &str) -> PyResult<ScaleDtype> {
    ScaleDtype::from_name(name)
        .ok_or_else(|| errors::SchemeError::new_err(format!("unknown scale dtype {name:?}")))
}

#[pymethods]
impl Scheme {
    /// `value`, `store` ("native", "packed_u32", "packed_native") and `mode` by name, scale
    /// dtypes by name; raises `SchemeError` naming the broken rule.
    #[new]
    #[pyo3(signature = (*, value, store, dim, mode, tensor=None, block_size=None, block_dtype=None, codebook=None, offset=None, offset_dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        value: &str,
        store: &str,
        dim: &Bound<'_, PyAny>,
        mode: &str,
        tensor: Option<&str>,
        block_size: Option<Vec<Bound<'_, PyAny>>>,
        block_dtype: Option<&str>,
        codebook: Option<Vec<f32>>,
        offset: Option<&str>,
        offset_dtype: Option<&str>,
    ) -> PyResult<Self> {
        guarded(|| {
            let value = QuantValue::from_name(value)
                .ok_or_else(|| errors::SchemeError::new_err(format!("unknown value {value:?}")))?;
            let dim = size_arg(
                dim,
                "a packing dim",
                "a packing dim counts from the innermost axis and is >= 0",
            )?;
            let store = QuantStore::from_name(store, dim).map_err(to_py)?;
            let mode = QuantMode::from_name(mode).map_err(to_py)?;
            let mut scheme = QuantScheme::default()
                .with_value(value)
                .with_store(store)
                .with_mode(mode);
            if let Some(values) = codebook {
                // Set as given, not through `with_codebook`: a codebook on a Symmetric scheme
                // is an error `validate` reports, not a silent switch to Lookup.
                scheme.codebook = Some(Codebook::for_value(&values, value).map_err(to_py)?);
            }
            if let Some(t) = tensor {
                scheme = scheme.per_tensor(scale_dtype_arg(t)?);
            }
            match (block_size, block_dtype) {
                (Some(size), Some(d)) => {
                    let dims = size
                        .iter()
                        .map(|b| size_arg(b, "a block size", "block sizes are positive integers"))
                        .collect::<PyResult<Vec<usize>>>()?;
                    scheme = scheme
                        .per_block(&dims, scale_dtype_arg(d)?)
                        .map_err(to_py)?;
                }
                (None, None) => {}
                _ => {
                    return Err(PyTypeError::new_err(
                        "block_size and block_dtype come together",
                    ))
                }
            }
            scheme.offset = match (offset, offset_dtype) {
                (None, None) => None,
                (Some("zero"), None | Some("U8")) => Some(Offset::Zero),
                (Some("bias"), Some(d)) => Some(Offset::Bias(scale_dtype_arg(d)?)),
                _ => {
                    return Err(errors::SchemeError::new_err(format!(
                        "an offset is 'zero' (dtype U8) or 'bias' with a dtype, got {offset:?} {offset_dtype:?}"
                    )))
                }
            };
            scheme.validate().map_err(to_py)?;
            Ok(Self(scheme))
        })
    }

    /// Lookup mode's codebook (entry k is field k's value), or None.
    #[getter]
    fn codebook(&self) -> Option<Vec<f32>> {
        self.0.codebook.map(|cb| cb.entries())
    }

    /// An affine scheme's offset kind: "zero" or "bias"; None without one.
    #[getter]
    fn offset(&self) -> Option<&'static str> {
        self.0.offset.map(|o| match o {
            Offset::Zero => "zero",
            Offset::Bias(_) => "bias",
        })
    }

    /// The offsets' dtype name: "U8" for zero points, a bias's dtype; None without one.
    #[getter]
    fn offset_dtype(&self) -> Option<&'static str> {
        self.0.offset.map(|o| match o {
            Offset::Zero => "U8",
            Offset::Bias(d) => d.name(),
        })
    }

    /// The block size as the scheme keeps it (leading 1s dropped), or None.
    #[getter]
    fn block_size(&self) -> Option<Vec<usize>> {
        self.0.block.map(|b| b.size().to_vec())
    }

    /// This scheme on a tensor of `shape`; `SchemeError` when the tensor cannot take it.
    fn layout(&self, shape: Vec<usize>) -> PyResult<LayoutInfo> {
        guarded(|| {
            let l = Layout::new(&self.0, &shape).map_err(to_py)?;
            let storage_nbytes = l.storage_bytes();
            let nbytes = l.total_bytes();
            let offsets_nbytes = l.offsets_bytes();
            let mut stored_scale_grid = l.grid.clone();
            if l.scales_swapped() {
                let last = stored_scale_grid.len() - 1;
                stored_scale_grid.swap(l.packing.axis, last);
            }
            Ok(LayoutInfo {
                shape: l.shape.clone(),
                storage_shape: l.storage_shape(),
                storage_dtype: StorageDtype::of(&l).name(),
                scale_grid: l.grid.clone(),
                stored_scale_grid,
                n_scales: l.num_scales,
                storage_nbytes,
                scales_nbytes: nbytes - storage_nbytes - offsets_nbytes,
                offsets_nbytes,
                nbytes,
            })
        })
    }

    /// The value type's name ("Q8F", ...).
    #[getter]
    fn value(&self) -> &'static str {
        self.0.value.name()
    }

    /// The store's kind: "native", "packed_u32" or "packed_native".
    #[getter]
    fn store(&self) -> &'static str {
        match self.0.store {
            QuantStore::Native => "native",
            QuantStore::PackedU32(_) => "packed_u32",
            QuantStore::PackedNative(_) => "packed_native",
        }
    }

    /// The packed axis, from the innermost (0 for Native).
    #[getter]
    fn dim(&self) -> usize {
        match self.0.store {
            QuantStore::Native => 0,
            QuantStore::PackedU32(d) | QuantStore::PackedNative(d) => d,
        }
    }

    /// "Symmetric" or "Lookup".
    #[getter]
    fn mode(&self) -> &'static str {
        match self.0.mode {
            QuantMode::Symmetric => "Symmetric",
            QuantMode::Lookup => "Lookup",
        }
    }

    /// The per-tensor scale's dtype name, or None.
    #[getter]
    fn tensor(&self) -> Option<&'static str> {
        self.0.tensor.map(ScaleDtype::name)
    }

    /// The block scales' dtype name, or None.
    #[getter]
    fn block_dtype(&self) -> Option<&'static str> {
        self.0.block.map(|b| b.dtype.name())
    }

    /// The canonical text form, which `parse_scheme` reads back.
    fn __str__(&self) -> String {
        self.0.text().to_string()
    }

    fn __repr__(&self) -> String {
        self.0.to_string()
    }
}

/// The scheme a canonical text names (`QuantScheme.parse`); `SchemeError` quoting the bad part.
#[pyfunction]
fn parse_scheme(text: &Bound<'_, pyo3::types::PyString>) -> PyResult<Scheme> {
    guarded(|| {
        let text = match text.to_str() {
            Ok(t) => t.to_owned(),
            Err(_) => with_replaced_surrogates(text)?,
        };
        scheme_text::parse(&text).map(Scheme).map_err(to_py)
    })
}

/// A str holding lone surrogates (no UTF-8 form), each replaced by U+FFFD: the grammar refuses
/// it as any other bad text (`SchemeError`, not `UnicodeEncodeError`), counting its characters
/// as Python does.
fn with_replaced_surrogates(text: &Bound<'_, pyo3::types::PyString>) -> PyResult<String> {
    let units = text.call_method1("encode", ("utf-32-le", "surrogatepass"))?;
    let units = units.cast::<pyo3::types::PyBytes>()?;
    Ok(units
        .as_bytes()
        .chunks_exact(4)
        .map(|b| char::from_u32(u32::from_le_bytes([b[0], b[1], b[2], b[3]])).unwrap_or('\u{FFFD}'))
        .collect())
}

/// One value type's facts (`QuantValue.bits`, ...).
#[pyclass(frozen, get_all, module = "blockquant._core", name = "ValueInfo")]
struct ValueInfo {
    name: &'static str,
    bits: u32,
    qmin: f32,
    qmax: f32,
    is_float: bool,
}

/// One scale dtype's facts (`ScaleDtype.nbytes`, ...).
#[pyclass(frozen, get_all, module = "blockquant._core", name = "ScaleInfo")]
struct ScaleInfo {
    name: &'static str,
    nbytes: usize,
    max: f32,
    /// The smallest value > 0.
    smallest: f32,
    has_zero: bool,
}

/// The facts of every value type, in declaration order.
#[pyfunction]
fn value_info() -> PyResult<Vec<ValueInfo>> {
    guarded(|| {
        Ok(QuantValue::EVERY
            .into_iter()
            .map(|v| ValueInfo {
                name: v.name(),
                bits: v.bits(),
                qmin: v.range().0,
                qmax: v.range().1,
                is_float: v.is_float(),
            })
            .collect())
    })
}

/// The facts of every scale dtype, in declaration order.
#[pyfunction]
fn scale_info() -> PyResult<Vec<ScaleInfo>> {
    guarded(|| {
        Ok(ScaleDtype::ALL
            .into_iter()
            .map(|d| ScaleInfo {
                name: d.name(),
                nbytes: d.size_bytes(),
                max: d.max_value(),
                smallest: d.smallest_positive(),
                has_zero: d.has_zero(),
            })
            .collect())
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Scheme>()?;
    m.add_class::<LayoutInfo>()?;
    m.add_function(wrap_pyfunction!(parse_scheme, m)?)?;
    m.add_class::<ValueInfo>()?;
    m.add_class::<ScaleInfo>()?;
    m.add_function(wrap_pyfunction!(value_info, m)?)?;
    m.add_function(wrap_pyfunction!(scale_info, m)?)?;
    Ok(())
}

/// A scheme applied to one shape, with named fields (`QuantScheme.layout` wraps it).
#[pyclass(frozen, get_all, module = "blockquant._core", name = "Layout")]
pub(crate) struct LayoutInfo {
    shape: Vec<usize>,
    storage_shape: Vec<usize>,
    storage_dtype: &'static str,
    scale_grid: Vec<usize>,
    stored_scale_grid: Vec<usize>,
    n_scales: usize,
    storage_nbytes: usize,
    scales_nbytes: usize,
    offsets_nbytes: usize,
    nbytes: usize,
}

/// The numpy dtype of a layout's value storage (format.md "Stores and packing").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StorageDtype {
    /// Native int values, sign-extended (a codebook's indices and unsigned values: U8).
    I8,
    /// Native float codes, and PackedNative.
    U8,
    /// PackedU32.
    U32,
}

impl StorageDtype {
    pub(crate) fn of(layout: &Layout) -> Self {
        if layout.packing.word_bits == 32 {
            Self::U32
        } else if layout.packing.native
            && !layout.scheme.value.is_float()
            && !layout.scheme.value.is_unsigned()
            && layout.scheme.codebook.is_none()
        {
            Self::I8
        } else {
            Self::U8
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::I8 => "int8",
            Self::U8 => "uint8",
            Self::U32 => "uint32",
        }
    }
}
