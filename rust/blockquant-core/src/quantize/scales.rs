//! The scales of a quantize call: the ones a caller gives ([`ExplicitScales`]) checked and
//! rounded to their dtype, the ones a tensor stores ([`Scales`]) and its effective ones.

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::alloc::try_par_collect;
use crate::calibrate::MIN_TASK_ELEMS;
use crate::error::{QuantError, Result};
use crate::layout::Layout;
use crate::pool;
use crate::scale::{check_scales, effective_scale, ScaleRounding};
use crate::scheme::{QuantScheme, ScaleDtype};

/// Scales the caller gives instead of calibrating (format.md "Calibration", "explicit").
#[derive(Debug, Clone, Copy, Default)]
pub struct ExplicitScales<'a> {
    /// The scale grid in row-major order (one value for per-tensor); two-level: the block
    /// scales b_i in block-dtype units. `None`: calibrate them.
    pub scales: Option<&'a [f32]>,
    /// A two-level scheme's per-tensor scale g. `None`: derive it (only when calibrating).
    pub global: Option<f32>,
}

/// The scales a quantized tensor stores, and the ones its values were quantized against.
#[derive(Debug, Clone)]
pub struct Scales {
    /// Stored scales (the grid; two-level: the block scales b_i), exact in their dtype.
    pub stored: Vec<f32>,
    /// Two-level only: the per-tensor scale g, f32.
    pub global: Option<f32>,
    /// Two-level only: b_i × g, worked out when first asked for (a quantize call that only
    /// hands back the stored scales never needs them). One-level values are divided by
    /// `stored` itself.
    two_level_effective: OnceLock<Vec<f32>>,
}

/// Equal stored scales and global scale: the effective ones follow from them.
impl PartialEq for Scales {
    fn eq(&self, other: &Self) -> bool {
        self.stored == other.stored && self.global == other.global
    }
}

impl Scales {
    /// Scales as stored; for two-level (`global` set) the effective scales are derived from
    /// them when first asked for.
    pub fn new(stored: Vec<f32>, global: Option<f32>) -> Self {
        Self {
            stored,
            global,
            two_level_effective: OnceLock::new(),
        }
    }

    /// Check stored scales against `layout`, then [`Scales::new`] (after `from_bytes` /
    /// `from_parts`, or explicit scales).
    pub fn from_stored(layout: &Layout, stored: Vec<f32>, global: Option<f32>) -> Result<Self> {
        check_stored(layout, &stored, global)?;
        Ok(Self::new(stored, global))
    }

    /// What values are divided by: `stored`, or `b_i × g` for two-level (the one error: no
    /// memory for them).
    pub fn effective(&self) -> Result<&[f32]> {
        let Some(g) = self.global else {
            return Ok(&self.stored);
        };
        if let Some(e) = self.two_level_effective.get() {
            return Ok(e);
        }
        // (`OnceLock::get_or_try_init` is not stable: a racing caller's copy is dropped.)
        let e = effective_scales(&self.stored, g)?;
        Ok(self.two_level_effective.get_or_init(|| e))
    }
}

/// A two-level scheme's effective scales b_i × g ([`effective_scale`]) of stored ones.
pub fn effective_scales(stored: &[f32], g: f32) -> Result<Vec<f32>> {
    // In the bounded pool like every other parallel loop: rayon's global pool would add
    // threads `set_num_threads` does not bound, and has none in a forked child (a hang).
    pool::install_sized(stored.len(), || {
        try_par_collect(
            stored
                .par_iter()
                .with_min_len(MIN_TASK_ELEMS)
                .map(|&b| effective_scale(b, g)),
        )
    })
}

pub(super) fn scale_count_error(layout: &Layout, got: usize) -> QuantError {
    QuantError::Scale(format!(
        "expected {} scales (grid {:?}) for {} on shape {:?}, got {got}",
        layout.num_scales, layout.grid, layout.scheme, layout.shape
    ))
}

/// Check that stored scales fit `layout`: count, representable in the dtype, global presence.
pub fn check_stored(layout: &Layout, stored: &[f32], global: Option<f32>) -> Result<()> {
    if stored.len() != layout.num_scales {
        return Err(scale_count_error(layout, stored.len()));
    }
    let scheme = &layout.scheme;
    let dtype = scheme.scale_dtype();
    // In the pool, a chunk a task: dequantize checks every scale on every call, and one
    // thread alone takes a tenth of a block-32 dequantize's time over it.
    let first_bad = pool::install_sized(stored.len(), || {
        stored
            .par_chunks(MIN_TASK_ELEMS)
            .enumerate()
            .find_map_first(|(c, chunk)| {
                Some(c * MIN_TASK_ELEMS + first_unrepresentable(dtype, chunk)?)
            })
    });
    if let Some((i, s)) = first_bad.map(|i| (i, stored[i])) {
        return Err(QuantError::Scale(format!(
            "scale {s} at index {i} is not a value of {dtype} (scales must be finite, >= 0 and exactly representable)"
        )));
    }
    match (scheme.is_two_level(), global) {
        (true, None) => Err(QuantError::MissingGlobalScale {
            scheme: scheme.to_string(),
        }),
        (false, Some(_)) => Err(QuantError::GlobalScaleNotTaken {
            scheme: scheme.to_string(),
        }),
        (true, Some(g)) => check_scales(&[g], "the per-tensor scale"),
        (false, None) => Ok(()),
    }
}

/// The index of the first scale that is not a value of `dtype`: float16 scales eight at a time
/// where the CPU converts them in hardware.
pub(super) fn first_unrepresentable(dtype: ScaleDtype, scales: &[f32]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        use crate::simd::x86;
        // SAFETY: the CPU has AVX2 (and F16C for float16), checked here.
        let whole = unsafe {
            match dtype {
                ScaleDtype::F16 if crate::simd::has_f16c() => x86::f16_prefix_len(scales),
                ScaleDtype::UE4M3 => x86::ue4m3_prefix_len(scales),
                ScaleDtype::UE8M0 => x86::ue8m0_prefix_len(scales),
                _ => 0,
            }
        };
        return first_unrepresentable_portable(dtype, &scales[whole..]).map(|i| whole + i);
    }
    first_unrepresentable_portable(dtype, scales)
}

pub(super) fn first_unrepresentable_portable(dtype: ScaleDtype, scales: &[f32]) -> Option<usize> {
    if dtype == ScaleDtype::F32 {
        // float32 holds every finite value: only the sign and finiteness to test, 64 at a time
        // with no branch (vectorized; a rounding per scale took a sixth of `from_bytes`), then
        // the place of the first bad one in its 64.
        let ok = |s: f32| s.is_finite() && s >= 0.0;
        return scales.chunks(64).enumerate().find_map(|(c, run)| {
            let all = run.iter().fold(true, |a, &s| a & ok(s));
            (!all).then(|| 64 * c + run.iter().position(|&s| !ok(s)).unwrap_or(0))
        });
    }
    scales.iter().position(|&s| !dtype.is_representable(s))
}

/// A caller's per-tensor scale g: refused for a one-level scheme, else finite and >= 0.
pub(super) fn check_global(scheme: &QuantScheme, global: Option<f32>) -> Result<()> {
    match (global, scheme.is_two_level()) {
        (Some(_), false) => Err(QuantError::UnexpectedGlobalScale {
            scheme: scheme.to_string(),
        }),
        (Some(g), true) => check_scales(&[g], "the per-tensor scale"),
        (None, _) => Ok(()),
    }
}

/// A caller's scales: one a block of the grid, each finite and >= 0.
pub(super) fn check_given(layout: &Layout, given: &[f32]) -> Result<()> {
    if given.len() != layout.num_scales {
        return Err(scale_count_error(layout, given.len()));
    }
    check_scales(given, "scales")
}

/// Checked scales rounded to `dtype` into `stored` (as long), in the pool. Scales already in
/// it (another quantize's, a file's: the usual case) are copied a chunk at a time once the
/// vectorized check says so: rounding leaves every representable value as it is (tested),
/// except −0, stored as +0. Every value written is one of the dtype's.
pub(super) fn round_given(
    dtype: ScaleDtype,
    mode: ScaleRounding,
    given: &[f32],
    stored: &mut [f32],
) {
    assert_eq!(given.len(), stored.len(), "scale count");
    stored
        .par_chunks_mut(MIN_TASK_ELEMS)
        .zip(given.par_chunks(MIN_TASK_ELEMS))
        .for_each(|(out, given)| {
            let exact = first_unrepresentable(dtype, given).is_none()
                && !given.iter().any(|s| s.to_bits() == (-0.0f32).to_bits());
            if exact {
                out.copy_from_slice(given);
            } else {
                for (o, &s) in out.iter_mut().zip(given) {
                    *o = dtype.round(s, mode);
                }
            }
        });
}
