//! Quantize and dequantize (SPEC §3–§7): scales from α, then every value against its block's
//! stored (or effective) scale, written straight into the caller's storage.

use rayon::prelude::*;

use crate::calibrate::{amplitudes, Calibration, MIN_TASK_ELEMS};
use crate::codec::{decode_table, minifloat, FloatCode, IntHalfAway, IntHalfEven, Rounding};
use crate::error::{QuantError, Result};
use crate::layout::Layout;
use crate::pack::{for_each_segment, IntDecode, Storage, StorageMut, TableDecode};
use crate::scale::{check_scales, ScaleRounding};
use crate::scheme::ScaleDtype;

/// Options of a quantize call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuantizeOptions {
    pub calibration: Calibration,
    pub rounding: Rounding,
    pub scale_rounding: ScaleRounding,
}

/// Scales the caller gives instead of calibrating (SPEC §3, "explicit").
#[derive(Debug, Clone, Copy, Default)]
pub struct ExplicitScales<'a> {
    /// The scale grid in row-major order (one value for per-tensor); two-level: the block
    /// scales b_i in block-dtype units. `None`: calibrate them.
    pub scales: Option<&'a [f32]>,
    /// A two-level scheme's per-tensor scale g. `None`: derive it (only when calibrating).
    pub global: Option<f32>,
}

/// The scales a quantized tensor stores, and the ones its values were quantized against.
#[derive(Debug, Clone, PartialEq)]
pub struct Scales {
    /// Stored scales (the grid; two-level: the block scales b_i), exact in their dtype.
    pub stored: Vec<f32>,
    /// Two-level only: the per-tensor scale g, f32.
    pub global: Option<f32>,
    /// What values are divided by: `stored`, or `b_i × g` for two-level.
    pub effective: Vec<f32>,
}

impl Scales {
    /// Rebuild effective scales from stored ones (after `from_bytes` / `from_parts`).
    pub fn from_stored(layout: &Layout, stored: Vec<f32>, global: Option<f32>) -> Result<Self> {
        check_stored(layout, &stored, global)?;
        let effective = match global {
            Some(g) => stored.iter().map(|&b| effective_scale(b, g)).collect(),
            None => stored.clone(),
        };
        Ok(Self {
            stored,
            global,
            effective,
        })
    }
}

/// e = b × g (one f32 multiply). Capped at f32::MAX: only Q2 values of magnitude near f32::MAX
/// get there (b rounded up to the dtype max, times g), and an infinite scale would turn every
/// value of the block into NaN on the way back.
#[inline]
pub fn effective_scale(b: f32, g: f32) -> f32 {
    (b * g).min(f32::MAX)
}

/// Check that stored scales fit `layout`: count, representable in the dtype, global presence.
pub fn check_stored(layout: &Layout, stored: &[f32], global: Option<f32>) -> Result<()> {
    let scheme = &layout.scheme;
    if stored.len() != layout.num_scales {
        return Err(QuantError::Scale(format!(
            "expected {} scales (grid {:?}) for {scheme} on shape {:?}, got {}",
            layout.num_scales,
            layout.grid,
            layout.shape,
            stored.len()
        )));
    }
    let dtype = scheme.scale_dtype();
    if let Some((i, s)) = stored
        .iter()
        .enumerate()
        .find(|(_, s)| !dtype.is_representable(**s))
    {
        return Err(QuantError::Scale(format!(
            "scale {s} at index {i} is not a value of {dtype} (scales must be finite, >= 0 and exactly representable)"
        )));
    }
    check_global(layout, global, false)
}

fn check_global(layout: &Layout, global: Option<f32>, quantizing: bool) -> Result<()> {
    let scheme = &layout.scheme;
    match (scheme.is_two_level(), global) {
        (true, None) => Err(QuantError::MissingGlobalScale {
            scheme: scheme.to_string(),
        }),
        (false, Some(_)) if quantizing => Err(QuantError::UnexpectedGlobalScale {
            scheme: scheme.to_string(),
        }),
        (false, Some(_)) => Err(QuantError::GlobalScaleNotTaken {
            scheme: scheme.to_string(),
        }),
        (true, Some(g)) => check_scales(&[g], "the per-tensor scale"),
        (false, None) => Ok(()),
    }
}

/// Work out the scales of `x` (calibrated, or explicit and rounded to their dtype).
pub fn compute_scales(
    x: &[f32],
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
) -> Result<Scales> {
    let scheme = &layout.scheme;
    let dtype = scheme.scale_dtype();
    let mode = opts.scale_rounding;
    let ex = explicit.unwrap_or_default();
    if ex.global.is_some() && !scheme.is_two_level() {
        return Err(QuantError::UnexpectedGlobalScale {
            scheme: scheme.to_string(),
        });
    }
    if let Some(g) = ex.global {
        check_scales(&[g], "the per-tensor scale")?;
    }
    if let Some(given) = ex.scales {
        if given.len() != layout.num_scales {
            return Err(QuantError::Scale(format!(
                "expected {} scales (grid {:?}) for {scheme} on shape {:?}, got {}",
                layout.num_scales,
                layout.grid,
                layout.shape,
                given.len()
            )));
        }
        check_scales(given, "scales")?;
        check_global(layout, ex.global, true)?;
        let stored: Vec<f32> = given.iter().map(|&s| dtype.round(s, mode)).collect();
        return Scales::from_stored(layout, stored, ex.global);
    }

    let value = scheme.value;
    let half_range = value.half_range();
    let alpha = amplitudes(x, layout, opts.calibration);
    let raw: Vec<f32> = alpha.iter().map(|&a| a / half_range).collect();
    if scheme.is_two_level() {
        // g maps the largest raw block scale onto the block dtype's largest value.
        let max_raw = raw.iter().fold(0.0f32, |m, &s| if s > m { s } else { m });
        let g = match ex.global {
            Some(g) => g,
            None if max_raw == 0.0 => 1.0,
            None => max_raw / dtype.max_value(),
        };
        // A caller's g of 0 leaves nothing to normalize by: every block quantizes to 0.
        let stored: Vec<f32> = raw
            .iter()
            .map(|&s| dtype.round(if g == 0.0 { 0.0 } else { s / g }, mode))
            .collect();
        let effective = stored.iter().map(|&b| effective_scale(b, g)).collect();
        Ok(Scales {
            stored,
            global: Some(g),
            effective,
        })
    } else {
        let stored: Vec<f32> = raw.iter().map(|&s| dtype.round(s, mode)).collect();
        Ok(Scales {
            effective: stored.clone(),
            stored,
            global: None,
        })
    }
}

/// Quantize `x` (C order, `layout.num_elements` values) against `effective` scales into `out`.
/// On a non-finite input returns `NonFinite` naming the first one; `out` is then unspecified
/// (callers hand in fresh storage and drop it on error).
pub fn encode_values(
    x: &[f32],
    layout: &Layout,
    effective: &[f32],
    rounding: Rounding,
    out: StorageMut<'_>,
) -> Result<()> {
    assert_eq!(x.len(), layout.num_elements, "input length");
    assert_eq!(effective.len(), layout.num_scales, "scale count");
    let value = layout.scheme.value;
    let bad = match (minifloat(value), rounding) {
        (Some(fmt), _) => crate::pack::encode_into(FloatCode(fmt), x, layout, effective, out),
        (None, Rounding::HalfAway) => {
            let (qmin, qmax) = value.range();
            crate::pack::encode_into(IntHalfAway { qmin, qmax }, x, layout, effective, out)
        }
        (None, Rounding::HalfEven) => {
            let (qmin, qmax) = value.range();
            crate::pack::encode_into(IntHalfEven { qmin, qmax }, x, layout, effective, out)
        }
    };
    if bad {
        return Err(first_non_finite(x));
    }
    Ok(())
}

fn first_non_finite(x: &[f32]) -> QuantError {
    let (index, &value) = x
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite())
        .expect("a non-finite value was seen");
    QuantError::NonFinite { index, value }
}

/// Calibrate, then quantize: the whole of `bq.quantize` for f32 input.
pub fn quantize(
    x: &[f32],
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
    out: StorageMut<'_>,
) -> Result<Scales> {
    let scales = compute_scales(x, layout, opts, explicit)?;
    encode_values(x, layout, &scales.effective, opts.rounding, out)?;
    Ok(scales)
}

/// x̂ = f32(decode(q)) × e into `out` (C order).
pub fn dequantize(layout: &Layout, storage: Storage<'_>, effective: &[f32], out: &mut [f32]) {
    assert_eq!(out.len(), layout.num_elements, "output length");
    assert_eq!(effective.len(), layout.num_scales, "scale count");
    let p = &layout.packing;
    if layout.scheme.value.is_float() {
        let mut table = [0.0f32; 256];
        let t = decode_table(layout.scheme.value, p);
        // Fields index the table; Native float bytes use only their low `bits` (SPEC §8).
        for (i, v) in table.iter_mut().enumerate() {
            *v = t[i & (t.len() - 1)];
        }
        crate::pack::decode_into(TableDecode(&table), layout, storage, effective, out);
    } else {
        let dec = IntDecode {
            shift: 8 - p.field_bits.min(8),
        };
        crate::pack::decode_into(dec, layout, storage, effective, out);
    }
}

/// Round an array of scales to `dtype` (`bq.round_scale`).
pub fn round_scales(
    scales: &[f32],
    dtype: ScaleDtype,
    mode: ScaleRounding,
    out: &mut [f32],
) -> Result<()> {
    check_scales(scales, "scales")?;
    out.par_iter_mut()
        .with_min_len(MIN_TASK_ELEMS)
        .zip(scales.par_iter())
        .for_each(|(o, &s)| *o = dtype.round(s, mode));
    Ok(())
}

/// Per-element scale lookups for callers outside the kernels (tests, tools).
pub fn scale_of_element(layout: &Layout, effective: &[f32], flat: usize) -> f32 {
    let mut e = f32::NAN;
    for_each_segment(layout, flat, 1, |_, _, s| e = effective[s]);
    e
}
