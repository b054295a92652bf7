//! Quantize and dequantize (SPEC §3–§7): scales from α, then every value against its block's
//! stored (or effective) scale, written straight into the caller's storage.

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::calibrate::{amplitudes, run_amplitude, Calibration, MIN_TASK_ELEMS};
use crate::codec::{
    float_table, minifloat, E2M1Code, E2M1Decode, E4M3Decode, Encode, FloatCode, Fp8Decode,
    IntDecode, IntHalfAway, IntHalfEven, Rounding,
};
use crate::error::{QuantError, Result};
use crate::input::{Input, Window};
use crate::layout::Layout;
use crate::lookup::{decode_table, LookupCode};
use crate::pack::{
    encode_run, pack_last_axis, BF16Bits, Effective, F16Bits, OutElem, Segments, Storage,
    StorageMut, Word,
};
use crate::pool;
use crate::scale::{check_scales, mx_scale_code, ScaleRounding};
use crate::scheme::{QuantValue, ScaleDtype};

/// Evaluates `$body` with `$codec` bound to the encoder of `$scheme`'s value (or codebook) under
/// `$rounding`: each (value, rounding) pair gets its own monomorphized kernel.
macro_rules! with_codec {
    ($scheme:expr, $rounding:expr, |$codec:ident| $body:expr) => {{
        let scheme: &crate::scheme::QuantScheme = $scheme;
        let value: QuantValue = scheme.value;
        let (qmin, qmax) = value.range();
        match (minifloat(value), $rounding) {
            _ if scheme.codebook.is_some() => {
                let $codec = LookupCode::new(scheme.codebook.as_ref().expect("checked"));
                $body
            }
            (Some(_), _) if value == QuantValue::E2M1 => {
                let $codec = E2M1Code;
                $body
            }
            (Some(fmt), _) => {
                let $codec = FloatCode(fmt);
                $body
            }
            (None, Rounding::HalfAway) => {
                let $codec = IntHalfAway { qmin, qmax };
                $body
            }
            (None, Rounding::HalfEven) => {
                let $codec = IntHalfEven { qmin, qmax };
                $body
            }
        }
    }};
}

pub(crate) use with_codec;

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

    /// What values are divided by: `stored`, or `b_i × g` for two-level.
    pub fn effective(&self) -> &[f32] {
        let Some(g) = self.global else {
            return &self.stored;
        };
        self.two_level_effective
            .get_or_init(|| effective_scales(&self.stored, g))
    }
}

/// A two-level scheme's effective scales b_i × g ([`effective_scale`]) of stored ones.
pub fn effective_scales(stored: &[f32], g: f32) -> Vec<f32> {
    // In the bounded pool like every other parallel loop: rayon's global pool would add
    // threads `set_num_threads` does not bound, and has none in a forked child (a hang).
    pool::install_sized(stored.len(), || {
        stored
            .par_iter()
            .with_min_len(MIN_TASK_ELEMS)
            .map(|&b| effective_scale(b, g))
            .collect()
    })
}

/// e = b × g (one f32 multiply). Capped at f32::MAX: only Q2 values of magnitude near f32::MAX
/// get there (b rounded up to the dtype max, times g), and an infinite scale would turn every
/// value of the block into NaN on the way back.
#[inline]
pub fn effective_scale(b: f32, g: f32) -> f32 {
    (b * g).min(f32::MAX)
}

fn scale_count_error(layout: &Layout, got: usize) -> QuantError {
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
fn first_unrepresentable(dtype: ScaleDtype, scales: &[f32]) -> Option<usize> {
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

fn first_unrepresentable_portable(dtype: ScaleDtype, scales: &[f32]) -> Option<usize> {
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

/// Work out the scales of `x` (calibrated, or explicit and rounded to their dtype).
pub fn compute_scales(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
) -> Result<Scales> {
    let scheme = &layout.scheme;
    let dtype = scheme.scale_dtype();
    let mode = opts.scale_rounding;
    dtype.check_rounding(mode)?;
    let ex = explicit.unwrap_or_default();
    check_global(scheme, ex.global)?;
    if let Some(given) = ex.scales {
        check_given(layout, given)?;
        let mut stored = vec![0.0f32; given.len()];
        round_given(dtype, mode, given, &mut stored);
        // A two-level scheme without its per-tensor scale is reported by `from_stored`.
        return Scales::from_stored(layout, stored, ex.global);
    }
    if opts.calibration == Calibration::Mse {
        return Ok(crate::search::mse_scales(x, None, layout, opts, ex.global));
    }

    let half_range = scheme.half_range();
    let emax = scheme.mx_emax();
    let alpha = amplitudes(x, layout, opts.calibration);
    // One pass from α to the stored scale: s_raw = α / half_range, then the dtype's rounding,
    // where `to_block` maps s_raw to the block dtype's units (two-level: ÷ g).
    let round_all = |to_block: fn(f32, f32) -> f32, g: f32| -> Vec<f32> {
        alpha
            .par_iter()
            .with_min_len(MIN_TASK_ELEMS)
            .map(|&a| stored_scale(a, half_range, dtype, mode, emax, |s| to_block(s, g)))
            .collect()
    };
    if !scheme.is_two_level() {
        return Ok(Scales::new(round_all(|s, _| s, 1.0), None));
    }
    let g = ex
        .global
        .unwrap_or_else(|| derived_global(&alpha, half_range, dtype));
    let stored = round_all(to_block, g);
    Ok(Scales::new(stored, Some(g)))
}

/// A caller's per-tensor scale g: refused for a one-level scheme, else finite and >= 0.
fn check_global(scheme: &crate::QuantScheme, global: Option<f32>) -> Result<()> {
    match (global, scheme.is_two_level()) {
        (Some(_), false) => Err(QuantError::UnexpectedGlobalScale {
            scheme: scheme.to_string(),
        }),
        (Some(g), true) => check_scales(&[g], "the per-tensor scale"),
        (None, _) => Ok(()),
    }
}

/// A caller's scales: one a block of the grid, each finite and >= 0.
fn check_given(layout: &Layout, given: &[f32]) -> Result<()> {
    if given.len() != layout.num_scales {
        return Err(scale_count_error(layout, given.len()));
    }
    check_scales(given, "scales")
}

/// Checked scales rounded to `dtype` into `stored` (as long), in the pool. Scales already in
/// it (another quantize's, a file's: the usual case) are copied a chunk at a time once the
/// vectorized check says so: rounding leaves every representable value as it is (tested),
/// except −0, stored as +0. Every value written is one of the dtype's.
fn round_given(dtype: ScaleDtype, mode: ScaleRounding, given: &[f32], stored: &mut [f32]) {
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

/// A two-level block's raw scale in the block dtype's units: ÷ g. A caller's g of 0 (or a
/// derived one that underflowed) leaves nothing to normalize by: every block quantizes to 0.
#[inline(always)]
fn to_block(s: f32, g: f32) -> f32 {
    if g == 0.0 {
        0.0
    } else {
        s / g
    }
}

/// The per-tensor scale g of a two-level scheme from its blocks' amplitudes: it maps the
/// largest raw block scale onto the block dtype's largest value (1 when all are 0).
pub(crate) fn derived_global(alpha: &[f32], half_range: f32, dtype: ScaleDtype) -> f32 {
    let max_raw = alpha.iter().fold(0.0f32, |m, &a| m.max(a)) / half_range;
    if max_raw == 0.0 {
        1.0
    } else {
        max_raw / dtype.max_value()
    }
}

/// The stored scale of a block of amplitude `alpha`: s_raw = α / half_range (mapped by
/// `to_block`: two-level ÷ g) rounded to the dtype, or the OCP MX scale straight from α.
#[inline(always)]
fn stored_scale(
    alpha: f32,
    half_range: f32,
    dtype: ScaleDtype,
    mode: ScaleRounding,
    emax: i32,
    to_block: impl Fn(f32) -> f32,
) -> f32 {
    match mode {
        ScaleRounding::Mx => dtype.decode_code(mx_scale_code(alpha, emax)),
        _ => dtype.round(to_block(alpha / half_range), mode),
    }
}

/// Quantize `x` (C order, `layout.num_elements` values) against `effective` scales into `out`.
/// On a non-finite input returns `NonFinite` naming the first one; `out` is then unspecified
/// (callers hand in fresh storage and drop it on error).
pub fn encode_values(
    x: Input<'_>,
    layout: &Layout,
    effective: &[f32],
    rounding: Rounding,
    out: StorageMut<'_>,
) -> Result<()> {
    assert_eq!(x.len(), layout.num_elements, "input length");
    assert_eq!(effective.len(), layout.num_scales, "scale count");
    check_rounding(&layout.scheme, rounding)?;
    let bad = with_codec!(&layout.scheme, rounding, |codec| {
        crate::pack::encode_into(codec, Window::all(x), layout, effective, out)
    });
    if bad {
        return Err(first_non_finite(x));
    }
    Ok(())
}

/// `rounding` names how integer ties go; a codebook has its own tie rule, so asking it for
/// half-even is refused rather than silently ignored.
fn check_rounding(scheme: &crate::QuantScheme, rounding: Rounding) -> Result<()> {
    if scheme.codebook.is_some() && rounding == Rounding::HalfEven {
        return Err(QuantError::Scheme(format!(
            "rounding='half_even' does not apply to a Lookup scheme (a tie goes to the entry of larger magnitude), got {scheme}"
        )));
    }
    Ok(())
}

/// The checks of a quantize call that read no value of its arguments, in the order
/// `blockquant.reference` makes them, so that a call with several faults fails on the same one
/// in both: the scale rounding against the scale dtype, a codebook's tie rule, the scheme
/// against the tensor's shape, then a per-tensor scale given to a one-level scheme, or missing
/// beside a two-level scheme's block scales. (Before them come the option names and the
/// input's dtype; after them the values of g, the weights and the scales, then the data.)
/// Returns the call's layout.
pub fn check_call(
    scheme: &crate::QuantScheme,
    shape: &[usize],
    opts: &QuantizeOptions,
    has_scales: bool,
    has_global: bool,
) -> Result<Layout> {
    scheme.scale_dtype().check_rounding(opts.scale_rounding)?;
    check_rounding(scheme, opts.rounding)?;
    let layout = Layout::new(scheme, shape)?;
    if has_global && !scheme.is_two_level() {
        return Err(QuantError::UnexpectedGlobalScale {
            scheme: scheme.to_string(),
        });
    }
    if has_scales && !has_global && scheme.is_two_level() {
        return Err(QuantError::MissingGlobalScale {
            scheme: scheme.to_string(),
        });
    }
    Ok(layout)
}

/// The first non-finite value of `x` (its flat index), once a kernel has seen one somewhere.
pub(crate) fn first_non_finite(x: Input<'_>) -> QuantError {
    let mut buf = Vec::new();
    for start in (0..x.len()).step_by(MIN_TASK_ELEMS) {
        let len = MIN_TASK_ELEMS.min(x.len() - start);
        let chunk = x.read(start, len, &mut buf);
        if let Some(i) = chunk.iter().position(|v| !v.is_finite()) {
            let given = match x {
                // A finite float64 that became ±inf: too large for f32.
                Input::F64(v) if v[start + i].is_finite() => Some(v[start + i]),
                _ => None,
            };
            return QuantError::NonFinite {
                index: start + i,
                value: chunk[i],
                given,
            };
        }
    }
    unreachable!("a non-finite value was seen")
}

/// Calibrate, then quantize: the whole of `bq.quantize`. Runs in the bounded pool.
pub fn quantize(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
    out: StorageMut<'_>,
) -> Result<Scales> {
    let (layout, out) = out.bytewise(layout);
    let layout = &*layout;
    pool::install_sized(layout.num_elements, || {
        // Untouched (so never faulted in) when no direct kernel takes the call.
        let mut stored = vec![0.0f32; layout.num_scales];
        match quantize_direct(x, layout, opts, explicit, out, &mut stored)? {
            Direct::Done(global) => Ok(Scales::new(stored, global)),
            Direct::Declined(out) => quantize_in_pool(x, layout, opts, explicit, out),
        }
    })
}

/// [`quantize`], its stored scales written into `scales` (the grid's size, C order) instead of
/// a new vector; returns the two-level global scale. The one-pass kernel writes them there
/// directly: a fresh grid-sized vector costs its page faults on every call, and the copy into
/// the caller's array another pass (together about a sixth of a block-32 int8 quantize).
/// On an error, `out` and `scales` may be partly written.
pub fn quantize_into(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
    out: StorageMut<'_>,
    scales: &mut [f32],
) -> Result<Option<f32>> {
    if scales.len() != layout.num_scales {
        return Err(QuantError::Layout(format!(
            "{} scales given for a grid of {}",
            scales.len(),
            layout.num_scales
        )));
    }
    let (layout, out) = out.bytewise(layout);
    let layout = &*layout;
    pool::install_sized(layout.num_elements, || {
        match quantize_direct(x, layout, opts, explicit, out, scales)? {
            Direct::Done(global) => Ok(global),
            Direct::Declined(out) => {
                let sc = quantize_in_pool(x, layout, opts, explicit, out)?;
                scales.copy_from_slice(&sc.stored);
                Ok(sc.global)
            }
        }
    })
}

/// What [`quantize_direct`] did: quantized (the global scale, two-level), or left the call
/// (storage untouched) to [`quantize_in_pool`].
enum Direct<'a> {
    Done(Option<f32>),
    Declined(StorageMut<'a>),
}

/// The kernels that write the stored scales straight into `scales` (the grid's size): given
/// scales rounded there, the one-pass and tile kernels, NVFP4's, the other two-level minmax
/// schemes' and the one-pass mse search. The options are checked first either way.
fn quantize_direct<'a>(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
    out: StorageMut<'a>,
    scales: &mut [f32],
) -> Result<Direct<'a>> {
    check_options(layout, opts)?;
    if let Some(given) = explicit.and_then(|e| e.scales) {
        let global = explicit.and_then(|e| e.global);
        quantize_given(x, layout, opts, given, global, out, scales)?;
        return Ok(Direct::Done(global));
    }
    if one_pass(layout, opts, explicit) || tiled(layout, opts, explicit) {
        quantize_fused(x, layout, opts, out, scales)?;
        return Ok(Direct::Done(None));
    }
    match out {
        #[cfg(target_arch = "x86_64")]
        StorageMut::U8(words) if nvfp4_path(layout, opts, explicit) => {
            let global = given_global(layout, explicit)?;
            let g = crate::nvfp4_avx2::quantize_nvfp4(x, layout, opts, global, words, scales)?;
            Ok(Direct::Done(Some(g)))
        }
        #[cfg(target_arch = "x86_64")]
        out if two_level_path(layout, opts, explicit) => {
            let global = given_global(layout, explicit)?;
            let g = quantize_two_level(x, layout, opts, global, out, scales)?;
            Ok(Direct::Done(Some(g)))
        }
        #[cfg(target_arch = "x86_64")]
        out if calibrating(explicit)
            && opts.calibration == Calibration::Mse
            && crate::search::searchable_in_one_pass(layout) =>
        {
            let g = crate::search::quantize_searched(x, None, layout, opts, None, out, scales)?;
            Ok(Direct::Done(g))
        }
        out => Ok(Direct::Declined(out)),
    }
}

/// Whether [`quantize_direct`] takes [`quantize_two_level`] (unless NVFP4's own kernel takes
/// the call first): block scales to calibrate with minmax, blocks back to back.
#[cfg(target_arch = "x86_64")]
fn two_level_path(
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
) -> bool {
    calibrating_blocks(explicit)
        && opts.calibration == Calibration::MinMax
        && two_level_fusable(layout)
        && crate::simd::has_avx2()
        && crate::simd::has_f16c()
}

/// Quantize against the caller's block scales: checked as [`compute_scales`] checks them,
/// rounded to the dtype straight into `scales` (the caller's array under `quantize_into`, no
/// vector of them between), then the values against them. A bad scale or g is refused before
/// anything is written.
fn quantize_given(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    given: &[f32],
    global: Option<f32>,
    out: StorageMut<'_>,
    scales: &mut [f32],
) -> Result<()> {
    let scheme = &layout.scheme;
    check_global(scheme, global)?;
    check_given(layout, given)?;
    if scheme.is_two_level() && global.is_none() {
        return Err(QuantError::MissingGlobalScale {
            scheme: scheme.to_string(),
        });
    }
    round_given(scheme.scale_dtype(), opts.scale_rounding, given, scales);
    match out {
        // E2M1 two a byte (MXFP4, NVFP4): packed in registers, the two-level e = b × g worked
        // out eight at a time (no array of them).
        #[cfg(target_arch = "x86_64")]
        StorageMut::U8(words) if crate::nvfp4_avx2::applies_given(layout) => {
            let g = global.unwrap_or(1.0);
            if crate::nvfp4_avx2::given_pieces(x, layout, scales, g, words) {
                return Err(first_non_finite(x));
            }
            Ok(())
        }
        out => match global {
            Some(g) => encode_values(x, layout, &effective_scales(scales, g), opts.rounding, out),
            None => encode_values(x, layout, scales, opts.rounding, out),
        },
    }
}

/// The options' checks against the scheme, before anything is written.
fn check_options(layout: &Layout, opts: &QuantizeOptions) -> Result<()> {
    layout
        .scheme
        .scale_dtype()
        .check_rounding(opts.scale_rounding)?;
    check_rounding(&layout.scheme, opts.rounding)
}

/// Whether the call works its scales out (neither block scales nor a global scale given).
fn calibrating(explicit: Option<ExplicitScales<'_>>) -> bool {
    explicit.is_none_or(|e| e.scales.is_none() && e.global.is_none())
}

/// Whether the call works its block scales out: none given. A two-level scheme's per-tensor
/// scale g may be given all the same (a model's g fixed ahead, say): the two-level kernels take
/// it instead of deriving it from the amplitudes, the rest of their work unchanged.
fn calibrating_blocks(explicit: Option<ExplicitScales<'_>>) -> bool {
    explicit.is_none_or(|e| e.scales.is_none())
}

/// The caller's per-tensor scale g, checked as [`compute_scales`] checks it.
fn given_global(layout: &Layout, explicit: Option<ExplicitScales<'_>>) -> Result<Option<f32>> {
    let global = explicit.and_then(|e| e.global);
    check_global(&layout.scheme, global)?;
    Ok(global)
}

/// Whether [`quantize_direct`] takes the one-pass kernel.
fn one_pass(layout: &Layout, opts: &QuantizeOptions, explicit: Option<ExplicitScales<'_>>) -> bool {
    // The mse search reads each block many times on its own; the one-pass kernel is minmax's.
    calibrating(explicit) && opts.calibration != Calibration::Mse && fusable(layout)
}

/// Whether [`quantize_direct`] takes the tile kernel (blocks spanning rows, `fused_tiles`).
fn tiled(layout: &Layout, opts: &QuantizeOptions, explicit: Option<ExplicitScales<'_>>) -> bool {
    calibrating(explicit) && crate::fused_tiles::applies(layout, opts.calibration)
}

/// Whether the CPU runs the AVX2 kernels.
fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::simd::has_avx2();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether [`quantize_direct`] takes `nvfp4_avx2`'s kernel (when the storage is u8): a
/// [`two_level_path`] call that this kernel has a case for.
#[cfg(target_arch = "x86_64")]
fn nvfp4_path(
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
) -> bool {
    two_level_path(layout, opts, explicit)
        && crate::nvfp4_avx2::applies(layout)
        && matches!(layout.block_cols(), 16 | 32)
        && layout.row_len().is_multiple_of(layout.block_cols())
}

/// The kernels that compute the scales on their own (after [`quantize_direct`] declined; the
/// options are checked).
fn quantize_in_pool(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
    out: StorageMut<'_>,
) -> Result<Scales> {
    // Two-level minmax and the one-pass mse search never reach here: `quantize_direct` takes them.
    #[cfg(target_arch = "x86_64")]
    if calibrating(explicit) && opts.calibration == Calibration::MinMax && layout.per_tensor {
        if let (Input::F32(xs), true) = (x, crate::simd::has_avx2()) {
            return quantize_per_tensor_avx2(xs, layout, opts, out);
        }
    }
    // Given block scales went to `quantize_given`.
    let scales = compute_scales(x, layout, opts, explicit)?;
    encode_values(x, layout, scales.effective(), opts.rounding, out)?;
    Ok(scales)
}

/// A per-tensor scale from max |x| (f32 input, AVX2): `compute_scales` + `encode_values`, the
/// same bits, with the maximum taken over the |x| bit patterns, so a non-finite input is
/// refused after that pass, and integer codes of one a byte then encoded by the checked
/// multiply without the clamp or the input check when every quotient is in range (the
/// largest |x| over the scale, by the division, below `Encode::unclamped_below`): half the
/// work a value of the general encode's.
#[cfg(target_arch = "x86_64")]
fn quantize_per_tensor_avx2(
    xs: &[f32],
    layout: &Layout,
    opts: &QuantizeOptions,
    mut out: StorageMut<'_>,
) -> Result<Scales> {
    #[target_feature(enable = "avx2")]
    unsafe fn max_bits(xs: &[f32]) -> u32 {
        crate::simd::x86::max_abs_bits_prefetching(xs)
    }
    let top = xs
        .par_chunks(MIN_TASK_ELEMS)
        // SAFETY: the caller checked the CPU has AVX2.
        .map(|c| unsafe { max_bits(c) })
        .reduce(|| 0, u32::max);
    if top > f32::MAX.to_bits() {
        return Err(first_non_finite(Input::F32(xs)));
    }
    let alpha = f32::from_bits(top);
    let e = FusedKernel::new(layout, opts, false).scale(alpha);
    let p = &layout.packing;
    let quick = match &mut out {
        StorageMut::U8(words) if p.per == 1 && !p.swapped && !p.masks_bytes() => {
            with_codec!(&layout.scheme, opts.rounding, |codec| {
                encode_in_range(codec, xs, layout, alpha, e, words)
            })
        }
        _ => false,
    };
    if !quick {
        encode_values(Input::F32(xs), layout, &[e], opts.rounding, out)?;
    }
    Ok(Scales::new(vec![e], None))
}

/// [`quantize_per_tensor_avx2`]'s quick encode into codes one a byte, when it applies (integer
/// codes, a checked reciprocal of `e`, the largest |x| `alpha` over `e` in range); returns
/// whether it did.
#[cfg(target_arch = "x86_64")]
fn encode_in_range<C: Encode>(
    codec: C,
    xs: &[f32],
    layout: &Layout,
    alpha: f32,
    e: f32,
    words: &mut [u8],
) -> bool {
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn chunk<C: Encode>(codec: C, xs: &[f32], e: f32, out: &mut [u8], stream: bool) {
        crate::simd::x86::encode_run_recip_in_range::<C, true>(codec, xs, e, out, stream);
        if stream {
            // The non-temporal stores are weakly ordered: done before the task says it is done.
            std::arch::x86_64::_mm_sfence();
        }
    }
    let in_range = codec
        .int_range()
        .and(codec.unclamped_below())
        .is_some_and(|b| alpha / e < b);
    if !in_range || crate::simd::checked_reciprocal(e).is_none() {
        return false;
    }
    let stream = layout.num_elements >= crate::simd::x86::STREAM_MIN_BYTES;
    words
        .par_chunks_mut(MIN_TASK_ELEMS)
        .zip(xs.par_chunks(MIN_TASK_ELEMS))
        // SAFETY: the caller checked the CPU has AVX2.
        .for_each(|(o, c)| unsafe { chunk(codec, c, e, o, stream) });
    true
}

/// Elements per piece (one task) of the one-pass kernels: 256 KiB of f32 (a converted input's
/// buffer too) stays in L2. What a piece costs beyond its values (the task, and the `sfence`
/// that ends a piece whose codes stream) was 9-14% of block-32 int8's time from memory with
/// pieces of 64 KiB, 1024 per 16 Mi values (one thread, old and new interleaved in one
/// process: 6.83 -> 5.89 ms, 5.98 -> 5.43; two threads 3.36 -> 3.07). A large input still
/// makes hundreds of pieces for the pool's threads to share.
const PIECE: usize = 1 << 16;

/// One-level block schemes whose blocks are runs along the last axis (and stores that pack along
/// it) are quantized in one pass over memory: each piece's scales are computed, then its values,
/// while the piece is still in cache. Same arithmetic as the two-pass path, so the same bits.
fn fusable(layout: &Layout) -> bool {
    !layout.per_tensor
        && !layout.scheme.is_two_level()
        && layout.rows_map_directly()
        // Native, or packed along the last axis (`inner == 1` alone also holds when the dims
        // after an outer packed axis are all 1).
        && layout.packing.axis + 1 == layout.rank()
        && layout.num_elements > 0
}

/// Two-level block schemes (NVFP4) with blocks along the last axis, back to back
/// ([`block_run`]) in runs of 16 or 32 values or short ones (`fused_narrow`), and storage
/// packed along it: [`quantize_two_level`]'s case.
fn two_level_fusable(layout: &Layout) -> bool {
    !layout.per_tensor
        && layout.scheme.is_two_level()
        && layout.rows_map_directly()
        && layout.packing.axis + 1 == layout.rank()
        && layout.num_elements > 0
        && block_run(layout).is_some_and(two_level_run)
}

/// Whether `quantize_two_level` has a kernel for blocks of `m` values back to back.
fn two_level_run(m: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return m == 16 || m == 32 || crate::fused_narrow::narrow(m);
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The length of the blocks when they lie back to back along the rows (blocks of one row):
/// the block's when it divides the rows, the row's when the rows are shorter than a block
/// (each row one block, as a conv kernel's rows of 3 under blocks of 32); None when the rows
/// end in a partial block.
pub(crate) fn block_run(layout: &Layout) -> Option<usize> {
    let (n, bc) = (layout.row_len(), layout.block_cols());
    match () {
        _ if !layout.rows_map_directly() || n == 0 => None,
        _ if n.is_multiple_of(bc) => Some(bc),
        _ if n < bc => Some(n),
        _ => None,
    }
}

/// A two-level scheme in two passes over memory: every block's amplitude (into `stored`, the
/// grid's size: the caller's array or a new vector; in parallel, `nvfp4_avx2::amplitudes`), g
/// from their maximum (unless `global` gives it), then per piece its block scales b_i from
/// those amplitudes, in place, each block's values against e_i = b_i × g while the piece is in
/// cache, packed. Returns g. The arithmetic of `compute_scales` + `encode_values` (the same
/// bits, tested), without their third pass (the effective scales). A non-finite input is
/// refused after pass 1, `out` untouched (`stored` then holds amplitudes).
#[cfg(target_arch = "x86_64")]
fn quantize_two_level(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    global: Option<f32>,
    out: StorageMut<'_>,
    stored: &mut [f32],
) -> Result<f32> {
    assert_eq!(stored.len(), layout.num_scales, "scale count");
    let m = block_run(layout).expect("blocks back to back");
    let pieces = pieces(layout);
    if crate::nvfp4_avx2::amplitudes(x, m, &pieces, stored) > f32::MAX.to_bits() {
        return Err(first_non_finite(x));
    }
    let k = FusedKernel::new(layout, opts, false);
    let g = global.unwrap_or_else(|| derived_global(stored, k.half_range, k.dtype));
    let bad = with_codec!(&layout.scheme, opts.rounding, |codec| {
        let encode = |_: &Piece, xs: &[f32], sc: &mut [f32], codes: &mut [u8]| {
            // SAFETY (both): the caller checked the CPU has AVX2 and F16C.
            if m == 16 || m == 32 {
                unsafe { crate::fused_avx2::two_level_piece(codec, &k, g, m, xs, sc, codes) }
            } else {
                unsafe { crate::fused_narrow::two_level_piece(codec, &k, g, m, xs, sc, codes) }
            }
        };
        match out {
            StorageMut::U8(words) if layout.packing.per == 1 => {
                // One code a byte: the codes are the bytes, less than 8-bit ones masked.
                let mask = layout.packing.field_mask() as u8;
                fused_pieces(x, &pieces, &mut *stored, words, |p, xs, sc, w, _| {
                    let bad = encode(p, xs, sc, w);
                    if layout.packing.masks_bytes() {
                        w.iter_mut().for_each(|c| *c &= mask);
                    }
                    bad
                })
            }
            StorageMut::U8(words) => {
                fused_pieces(x, &pieces, &mut *stored, words, |p, xs, sc, w, codes| {
                    codes.resize(p.len, 0);
                    let bad = encode(p, xs, sc, codes);
                    pack_last_axis(layout, codes, p.start, p.word0, w);
                    bad
                })
            }
            StorageMut::U32(words) => {
                fused_pieces(x, &pieces, &mut *stored, words, |p, xs, sc, w, codes| {
                    codes.resize(p.len, 0);
                    let bad = encode(p, xs, sc, codes);
                    pack_last_axis(layout, codes, p.start, p.word0, w);
                    bad
                })
            }
        }
    });
    if bad {
        return Err(first_non_finite(x));
    }
    Ok(g)
}

/// A piece of the tensor for the one-pass kernel: elements, and the scales and storage words
/// they own (all three contiguous, because pieces are whole rows or block- and word-aligned
/// parts of one row).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) scale0: usize,
    pub(crate) scales: usize,
    /// Global index of the first storage word, and the count.
    word0: usize,
    words: usize,
}

pub(crate) fn pieces(layout: &Layout) -> Vec<Piece> {
    let n = layout.row_len();
    let (bc, gc) = (layout.block_cols(), layout.grid_cols());
    let (per, nw) = (layout.packing.per, layout.packing.words_axis);
    let rows = layout.num_rows();
    let mut out = Vec::new();
    if n <= PIECE {
        let step = (PIECE / n).max(1);
        for r0 in (0..rows).step_by(step) {
            let r1 = (r0 + step).min(rows);
            out.push(Piece {
                start: r0 * n,
                len: (r1 - r0) * n,
                scale0: r0 * gc,
                scales: (r1 - r0) * gc,
                word0: r0 * nw,
                words: (r1 - r0) * nw,
            });
        }
    } else {
        let unit = lcm(bc, per);
        let plen = (PIECE / unit).max(1) * unit;
        for r in 0..rows {
            for c0 in (0..n).step_by(plen) {
                let c1 = (c0 + plen).min(n);
                out.push(Piece {
                    start: r * n + c0,
                    len: c1 - c0,
                    scale0: r * gc + c0 / bc,
                    scales: c1.div_ceil(bc) - c0 / bc,
                    word0: r * nw + c0 / per,
                    words: c1.div_ceil(per) - c0 / per,
                });
            }
        }
    }
    out
}

fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

/// Whether the one-pass kernels store their codes non-temporally: one a byte, unmasked,
/// straight into final storage too large for the cache. (With per > 1 the kernel writes a code
/// buffer, which must stay in cache for the packing.) Rows that end in a partial block store
/// it through the cache beside their streamed blocks, a mixed line (`x86::stream_runs`) a row:
/// only rows long enough to make that a small part stream.
pub(crate) fn streams(layout: &Layout) -> bool {
    #[cfg(target_arch = "x86_64")]
    return layout.packing.per == 1
        && !layout.packing.masks_bytes()
        && layout.num_elements >= crate::simd::x86::STREAM_MIN_BYTES
        && (layout.per_tensor
            || layout.row_len().is_multiple_of(layout.block_cols())
            || layout.row_len() >= crate::simd::x86::LONG_RUN);
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The one-pass kernels: codes into `out`, every stored scale into `stored` (the grid's size);
/// blocks spanning rows by the tile kernel (`fused_tiles`), row runs by [`fused_with`].
fn quantize_fused(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    out: StorageMut<'_>,
    stored: &mut [f32],
) -> Result<()> {
    let bad = match out {
        #[cfg(target_arch = "x86_64")]
        StorageMut::U8(words)
            if layout.rows_map_directly()
                && crate::nvfp4_avx2::applies_one_level(layout, opts.calibration) =>
        {
            let k = FusedKernel::new(layout, opts, streams(layout));
            fused_pieces(x, &pieces(layout), stored, words, |_, xs, sc, w, _| {
                // SAFETY: `applies_one_level` checked the CPU has AVX2 and F16C.
                unsafe { crate::nvfp4_avx2::one_level_piece(&k, xs, sc, w) }
            })
        }
        out => with_codec!(&layout.scheme, opts.rounding, |codec| {
            if layout.rows_map_directly() {
                fused_with(codec, x, layout, opts, out, stored)
            } else {
                let k = FusedKernel::new(layout, opts, streams(layout));
                crate::fused_tiles::quantize_tiles(codec, x, &k, out, stored, avx2())
            }
        }),
    };
    if bad {
        return Err(first_non_finite(x));
    }
    Ok(())
}

fn fused_with<C: Encode>(
    codec: C,
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    out: StorageMut<'_>,
    stored: &mut [f32],
) -> bool {
    assert_eq!(stored.len(), layout.num_scales);
    let pieces = pieces(layout);
    let k = FusedKernel::new(layout, opts, streams(layout));
    let mask = layout
        .packing
        .masks_bytes()
        .then(|| layout.packing.field_mask() as u8);
    match out {
        StorageMut::U8(bytes) if layout.packing.per == 1 => {
            fused_pieces(x, &pieces, stored, bytes, |p, xs, sc, out, _| {
                let bad = measure_encode(codec, &k, p, xs, sc, out);
                #[cfg(target_arch = "x86_64")]
                if k.stream {
                    // SAFETY: SSE is part of x86-64. The non-temporal stores are weakly
                    // ordered: done before the task says it is done.
                    unsafe { std::arch::x86_64::_mm_sfence() };
                }
                if let Some(m) = mask {
                    out.iter_mut().for_each(|c| *c &= m);
                }
                bad
            })
        }
        StorageMut::U8(words) => fused_pieces(x, &pieces, stored, words, |p, xs, sc, w, codes| {
            codes.resize(p.len, 0);
            let bad = measure_encode(codec, &k, p, xs, sc, codes);
            pack_last_axis(layout, codes, p.start, p.word0, w);
            bad
        }),
        StorageMut::U32(words) => fused_pieces(x, &pieces, stored, words, |p, xs, sc, w, codes| {
            codes.resize(p.len, 0);
            let bad = measure_encode(codec, &k, p, xs, sc, codes);
            pack_last_axis(layout, codes, p.start, p.word0, w);
            bad
        }),
    }
}

/// What the one-pass kernel needs to turn a block's α into its stored scale.
pub(crate) struct FusedKernel<'a> {
    pub(crate) layout: &'a Layout,
    pub(crate) opts: &'a QuantizeOptions,
    pub(crate) dtype: ScaleDtype,
    pub(crate) half_range: f32,
    pub(crate) emax: i32,
    /// The codes go straight into large final storage: non-temporal stores (the caller ends
    /// each piece with an `_mm_sfence`).
    pub(crate) stream: bool,
}

impl<'a> FusedKernel<'a> {
    pub(crate) fn new(layout: &'a Layout, opts: &'a QuantizeOptions, stream: bool) -> Self {
        Self {
            layout,
            opts,
            dtype: layout.scheme.scale_dtype(),
            half_range: layout.scheme.half_range(),
            emax: layout.scheme.mx_emax(),
            stream,
        }
    }

    /// A two-level block's stored scale b from its amplitude, under the per-tensor scale g (as
    /// `compute_scales`).
    #[inline(always)]
    pub(crate) fn two_level_scale(&self, alpha: f32, g: f32) -> f32 {
        let o = self.opts;
        stored_scale(
            alpha,
            self.half_range,
            self.dtype,
            o.scale_rounding,
            self.emax,
            |s| to_block(s, g),
        )
    }

    #[inline(always)]
    pub(crate) fn scale(&self, alpha: f32) -> f32 {
        let o = self.opts;
        stored_scale(
            alpha,
            self.half_range,
            self.dtype,
            o.scale_rounding,
            self.emax,
            |s| s,
        )
    }
}

/// A piece's blocks while they are in L1: their α, their stored scales (into `sc`), their codes
/// (into `out`, one a byte; `xs` and `out` hold just the piece); eight blocks at a time where
/// a kernel takes their length (`fused_avx2`, `fused_narrow`), else one at a time. Returns
/// whether any input was non-finite.
#[inline]
fn measure_encode<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    p: &Piece,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        use crate::fused_avx2::{blocks_of, measure_encode_blocks, measure_encode_rows};
        let (n, bc) = (k.layout.row_len(), k.layout.block_cols());
        if k.opts.calibration == Calibration::MinMax && crate::simd::has_f16c() {
            // SAFETY (both): the CPU has AVX2 and F16C, checked just above.
            match block_run(k.layout) {
                Some(m) if blocks_of(m) => {
                    return unsafe { measure_encode_blocks(codec, k, m, xs, sc, out) };
                }
                // Rows of whole blocks and a partial one.
                None if n > bc && blocks_of(bc) => {
                    return unsafe { measure_encode_rows(codec, k, p, xs, sc, out) };
                }
                _ => {}
            }
        }
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { measure_encode_avx2(codec, k, p, xs, sc, out) };
    }
    measure_encode_portable(codec, k, p, xs, sc, out)
}

#[inline(always)]
fn measure_encode_portable<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    p: &Piece,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let mut bad = false;
    for (pos, len, s) in Segments::new(k.layout, p.start, p.len) {
        let i = pos - p.start;
        let run = &xs[i..i + len];
        let e = k.scale(run_amplitude(run, k.opts.calibration));
        sc[s - p.scale0] = e;
        bad |= encode_run(codec, run, e, &mut out[i..i + len]);
    }
    bad
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn measure_encode_avx2<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    p: &Piece,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    use crate::simd::x86;
    let mut bad = false;
    for (pos, len, s) in Segments::new(k.layout, p.start, p.len) {
        let i = pos - p.start;
        let run = &xs[i..i + len];
        x86::prefetch(run.as_ptr().wrapping_add(PREFETCH_AHEAD), len);
        let alpha = match k.opts.calibration {
            Calibration::MinMax => x86::max_abs(run),
            cal => run_amplitude(run, cal),
        };
        let e = k.scale(alpha);
        sc[s - p.scale0] = e;
        let o = &mut out[i..i + len];
        bad |= x86::encode_run_or_zero(codec, run, e, o, k.stream);
    }
    bad
}

/// How far ahead of the block being quantized its input is asked for, in values: on one
/// thread the hardware prefetcher alone leaves the kernel waiting on memory.
const PREFETCH_AHEAD: usize = 2048;

/// The one-pass kernels' storage: each piece's codes (one a byte) from `encode_piece(piece, its
/// values, its scales, its codes)`, then packed into `out` (or written straight, one code a
/// byte). Returns whether any piece saw a non-finite value.
pub(crate) fn encode_pieces(
    x: Input<'_>,
    layout: &Layout,
    stored: &mut [f32],
    out: StorageMut<'_>,
    encode_piece: impl Fn(&Piece, &[f32], &mut [f32], &mut [u8]) -> bool + Sync,
) -> bool {
    let pieces = pieces(layout);
    let mask = layout
        .packing
        .masks_bytes()
        .then(|| layout.packing.field_mask() as u8);
    match out {
        StorageMut::U8(bytes) if layout.packing.per == 1 => {
            fused_pieces(x, &pieces, stored, bytes, |p, xs, sc, out, _| {
                let bad = encode_piece(p, xs, sc, out);
                if let Some(m) = mask {
                    out.iter_mut().for_each(|c| *c &= m);
                }
                bad
            })
        }
        StorageMut::U8(words) => fused_pieces(x, &pieces, stored, words, |p, xs, sc, w, codes| {
            codes.resize(p.len, 0);
            let bad = encode_piece(p, xs, sc, codes);
            pack_last_axis(layout, codes, p.start, p.word0, w);
            bad
        }),
        StorageMut::U32(words) => fused_pieces(x, &pieces, stored, words, |p, xs, sc, w, codes| {
            codes.resize(p.len, 0);
            let bad = encode_piece(p, xs, sc, codes);
            pack_last_axis(layout, codes, p.start, p.word0, w);
            bad
        }),
    }
}

pub(crate) fn fused_pieces<W: Word>(
    x: Input<'_>,
    pieces: &[Piece],
    stored: &mut [f32],
    words: &mut [W],
    encode_piece: impl Fn(&Piece, &[f32], &mut [f32], &mut [W], &mut Vec<u8>) -> bool + Sync,
) -> bool {
    // Hand each piece its own scales and words (disjoint, in order).
    let mut work = Vec::with_capacity(pieces.len());
    let (mut sc_rest, mut w_rest) = (stored, words);
    for &p in pieces {
        let (sc, sr) = std::mem::take(&mut sc_rest).split_at_mut(p.scales);
        let (w, wr) = std::mem::take(&mut w_rest).split_at_mut(p.words);
        sc_rest = sr;
        w_rest = wr;
        work.push((p, sc, w));
    }
    work.into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new()),
            |(buf, codes), (p, sc, w)| {
                // Read (or convert) the piece once, then measure and quantize it a block at a
                // time.
                let xs = x.read(p.start, p.len, buf);
                encode_piece(&p, xs, sc, w, codes)
            },
        )
        .reduce(|| false, |a, b| a | b)
}

/// Where dequantize writes: x̂ as f32, or converted from that f32 (SPEC §7).
#[derive(Debug)]
pub enum Output<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    F16(&'a mut [F16Bits]),
    BF16(&'a mut [BF16Bits]),
}

/// x̂ = f32(decode(q)) × e into `out` (C order), converted to the output's type element by
/// element (no full-size f32 temporary). `stored`: the stored scales (checked by
/// [`check_stored`]), or effective ones already worked out; `global`: a two-level scheme's g,
/// multiplied in block by block ([`Effective`]). Runs in the bounded pool.
pub fn dequantize(
    layout: &Layout,
    storage: Storage<'_>,
    stored: &[f32],
    global: Option<f32>,
    out: Output<'_>,
) {
    let effective = Effective::new(stored, global);
    let (layout, storage) = storage.bytewise(layout);
    let layout = &*layout;
    pool::install_sized(layout.num_elements, || match out {
        Output::F32(o) => dequantize_into(layout, storage, effective, o),
        Output::F64(o) => dequantize_into(layout, storage, effective, o),
        Output::F16(o) => dequantize_into(layout, storage, effective, o),
        Output::BF16(o) => dequantize_into(layout, storage, effective, o),
    })
}

fn dequantize_into<O: OutElem>(
    layout: &Layout,
    storage: Storage<'_>,
    effective: Effective<'_>,
    out: &mut [O],
) {
    assert_eq!(out.len(), layout.num_elements, "output length");
    assert_eq!(effective.len(), layout.num_scales, "scale count");
    if let Some(cb) = &layout.scheme.codebook {
        let table = decode_table(cb);
        let dec = crate::lookup::LookupDecode(&table);
        crate::pack::decode_into(dec, layout, storage, effective, out);
        return;
    }
    match minifloat(layout.scheme.value) {
        Some(_) if layout.scheme.value == QuantValue::E2M1 => {
            crate::pack::decode_into(E2M1Decode, layout, storage, effective, out);
        }
        Some(fmt) if layout.scheme.value == QuantValue::E4M3 => {
            let table = float_table(&fmt);
            crate::pack::decode_into(E4M3Decode(&table), layout, storage, effective, out);
        }
        Some(fmt) => {
            let table = float_table(&fmt);
            let dec = Fp8Decode { table: &table, fmt };
            crate::pack::decode_into(dec, layout, storage, effective, out);
        }
        None => {
            let dec = IntDecode::new(&layout.packing);
            crate::pack::decode_into(dec, layout, storage, effective, out);
        }
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
    dtype.check_rounding(mode)?;
    pool::install_sized(out.len(), || {
        out.par_iter_mut()
            .with_min_len(MIN_TASK_ELEMS)
            .zip(scales.par_iter())
            .for_each(|(o, &s)| *o = dtype.round(s, mode))
    });
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    //! The one-pass kernel against the two-pass one (what `quantize` runs when it does not
    //! fuse), `measure_piece`'s AVX2 build against its portable one, and quantize → dequantize
    //! against a scalar reading of SPEC §3–§7.

    use super::*;
    use crate::pack::tests::{grid_index, oracle, Rng, Words, EDGES};
    use crate::scheme::{QuantScheme, QuantStore};

    const STORES: [QuantStore; 3] = [
        QuantStore::Native,
        QuantStore::PackedU32(0),
        QuantStore::PackedNative(0),
    ];

    /// The timing probes' input: n bell-shaped values (sums of four uniform ones), seeded.
    pub(crate) fn timing_data(n: usize) -> Vec<f32> {
        let mut rng = Rng::new(15);
        (0..n)
            .map(|_| (0..4).map(|_| rng.unit()).sum::<f32>())
            .collect()
    }

    pub(crate) fn one_level(
        value: QuantValue,
        store: QuantStore,
        bc: usize,
        dtype: ScaleDtype,
    ) -> QuantScheme {
        QuantScheme::default()
            .with_value(value)
            .with_store(store)
            .per_block(&[bc], dtype)
            .unwrap()
    }

    /// Runs of 1 to 80 values sharing a magnitude, from all-zero (zero rule) and subnormal to
    /// near f32::MAX, with edges sprinkled in; some runs mix 1e30 and 1e-30 (absmean's exact
    /// sum). Finite only.
    fn tensor(rng: &mut Rng, n: usize) -> Vec<f32> {
        let mags = [0.0, 1e-42, 1e-20, 1e-3, 1.0, 0.5, 300.0, 1e5, 1e30, 3e38];
        let mut x = Vec::with_capacity(n);
        while x.len() < n {
            let run = (1 + rng.below(80)).min(n - x.len());
            let mag: f32 = rng.pick(&mags);
            let mixed = rng.below(8) == 0;
            for _ in 0..run {
                let v = match rng.below(12) {
                    0 => rng.pick(&EDGES),
                    1 if mixed => rng.unit() * 1e30,
                    2 => (rng.below(33) as f32 - 16.0) / 2.0 * mag, // ties at power-of-two scales
                    _ => rng.unit() * mag,
                };
                x.push(if v.is_finite() { v } else { mag });
            }
        }
        x
    }

    /// The same values in each input dtype (saturated to its range: no overflow to inf).
    struct Inputs {
        f32: Vec<f32>,
        f16: Vec<u16>,
        bf16: Vec<u16>,
        f64: Vec<f64>,
    }

    impl Inputs {
        fn new(x: Vec<f32>) -> Self {
            let f16 = x
                .iter()
                .map(|&v| half::f16::from_f32(v.clamp(-65504.0, 65504.0)).to_bits())
                .collect();
            let bmax = half::bf16::MAX.to_f32();
            let bf16 = x
                .iter()
                .map(|&v| half::bf16::from_f32(v.clamp(-bmax, bmax)).to_bits())
                .collect();
            // Off the f32 grid, so the conversion rounds (but never overflows).
            let f64 = x
                .iter()
                .map(|&v| {
                    if v.abs() < 1e38 {
                        v as f64 * (1.0 + 1e-9)
                    } else {
                        v as f64
                    }
                })
                .collect();
            Self {
                f32: x,
                f16,
                bf16,
                f64,
            }
        }
        fn get(&self, k: usize) -> Input<'_> {
            match k % 4 {
                0 => Input::F32(&self.f32),
                1 => Input::F16(&self.f16),
                2 => Input::BF16(&self.bf16),
                _ => Input::F64(&self.f64),
            }
        }
    }

    /// Scales then values, in two passes over memory.
    fn two_pass(x: Input<'_>, layout: &Layout, opts: &QuantizeOptions) -> (Scales, Words) {
        let scales = compute_scales(x, layout, opts, None).unwrap();
        let mut w = Words::filled(layout, 0xA5A5_A5A5);
        encode_values(x, layout, scales.effective(), opts.rounding, w.as_mut()).unwrap();
        (scales, w)
    }

    fn one_pass(x: Input<'_>, layout: &Layout, opts: &QuantizeOptions) -> (Scales, Words) {
        assert!(
            fusable(layout),
            "{} on {:?} is fused",
            layout.scheme,
            layout.shape
        );
        let mut w = Words::filled(layout, 0x5A5A_5A5A);
        // Garbage (a NaN) in every scale: the kernel must write each one.
        let mut stored = vec![f32::from_bits(0x7FC0_5A5A); layout.num_scales];
        quantize_fused(x, layout, opts, w.as_mut(), &mut stored).unwrap();
        (Scales::new(stored, None), w)
    }

    fn assert_same(x: Input<'_>, layout: &Layout, opts: &QuantizeOptions) {
        let (s2, w2) = two_pass(x, layout, opts);
        let (s1, w1) = one_pass(x, layout, opts);
        let dtype = match x {
            Input::F32(_) => "f32",
            Input::F16(_) => "f16",
            Input::BF16(_) => "bf16",
            Input::F64(_) => "f64",
        };
        let ctx = || {
            format!(
                "{} on {:?}, {opts:?}, {dtype} input",
                layout.scheme, layout.shape
            )
        };
        if let Some(i) =
            (0..s1.stored.len()).find(|&i| s1.stored[i].to_bits() != s2.stored[i].to_bits())
        {
            panic!(
                "scale {i}: one pass {:e}, two pass {:e}: {}",
                s1.stored[i],
                s2.stored[i],
                ctx()
            );
        }
        assert_eq!(s1.stored.len(), s2.stored.len());
        assert_eq!((s1.global, s2.global), (None, None));
        if let Some(i) = (0..w1.len()).find(|&i| w1.get(i) != w2.get(i)) {
            panic!(
                "storage word {i}: one pass {:#x}, two pass {:#x}: {}",
                w1.get(i),
                w2.get(i),
                ctx()
            );
        }
        assert_eq!(w1.len(), w2.len());
    }

    fn all_opts() -> Vec<QuantizeOptions> {
        let mut v = Vec::new();
        for calibration in [Calibration::MinMax, Calibration::AbsMean] {
            for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
                for scale_rounding in [ScaleRounding::Up, ScaleRounding::Nearest] {
                    v.push(QuantizeOptions {
                        calibration,
                        rounding,
                        scale_rounding,
                    });
                }
            }
        }
        v
    }

    /// Every fusable one-level scheme: value × store × block × scale dtype × options, on small
    /// shapes with partial edge blocks (and a 0-d tensor), in every input dtype in turn.
    #[test]
    fn one_pass_matches_two_pass_for_every_fusable_scheme() {
        let mut rng = Rng::new(10);
        let shapes: [&[usize]; 3] = [&[3, 71], &[130], &[]];
        let data: Vec<Inputs> = shapes
            .iter()
            .map(|s| Inputs::new(tensor(&mut rng, s.iter().product())))
            .collect();
        let mut k = 0;
        for value in QuantValue::ALL {
            for store in STORES {
                for bc in [1, 7, 32, 33, 64] {
                    for dtype in ScaleDtype::ALL {
                        let scheme = one_level(value, store, bc, dtype);
                        for (shape, x) in shapes.iter().zip(&data) {
                            let layout = Layout::new(&scheme, shape).unwrap();
                            for opts in all_opts() {
                                assert_same(x.get(k), &layout, &opts);
                                k += 1;
                            }
                        }
                    }
                }
            }
        }
    }

    /// `quantize_into` writes every stored scale into the caller's slice (garbage before), the
    /// same as `quantize`'s, on the one-pass path and the others (per-tensor, two-level, the mse
    /// search), and refuses a slice of the wrong length.
    #[test]
    fn quantize_into_fills_the_callers_scales() {
        let mut rng = Rng::new(12);
        let x = tensor(&mut rng, 3 * 64);
        let minmax = QuantizeOptions::default();
        let mse = QuantizeOptions {
            calibration: Calibration::Mse,
            ..minmax
        };
        let schemes = [
            one_level(QuantValue::Q8S, QuantStore::Native, 32, ScaleDtype::F16),
            one_level(
                QuantValue::Q4S,
                QuantStore::PackedU32(0),
                16,
                ScaleDtype::BF16,
            ),
            QuantScheme::default(),
            one_level(
                QuantValue::E2M1,
                QuantStore::PackedU32(0),
                16,
                ScaleDtype::UE4M3,
            )
            .per_tensor(ScaleDtype::F32),
            // Two-level integers (`quantize_two_level`), packed and one a byte.
            one_level(
                QuantValue::Q4F,
                QuantStore::PackedU32(0),
                16,
                ScaleDtype::UE4M3,
            )
            .per_tensor(ScaleDtype::F32),
            one_level(QuantValue::Q8S, QuantStore::Native, 16, ScaleDtype::F16)
                .per_tensor(ScaleDtype::F32),
        ];
        // Each scheme with minmax's scales and with searched ones (`quantize_searched`).
        for (scheme, opts) in schemes.iter().flat_map(|s| [(s, minmax), (s, mse)]) {
            let layout = Layout::new(scheme, &[3, 64]).unwrap();
            #[cfg(target_arch = "x86_64")]
            if scheme.is_two_level() && crate::simd::has_avx2() && crate::simd::has_f16c() {
                let two_level = two_level_path(&layout, &opts, None);
                assert_eq!(
                    two_level,
                    opts.calibration == Calibration::MinMax,
                    "{scheme}"
                );
            }
            let mut w1 = Words::new(&layout);
            let want = quantize(Input::F32(&x), &layout, &opts, None, w1.as_mut()).unwrap();
            let mut w2 = Words::filled(&layout, 0x5A5A_5A5A);
            let mut got = vec![f32::from_bits(0x7FC0_5A5A); layout.num_scales];
            let g = quantize_into(Input::F32(&x), &layout, &opts, None, w2.as_mut(), &mut got);
            assert_eq!(g.unwrap(), want.global, "{scheme}");
            assert_eq!(got, want.stored, "{scheme}");
            assert!(w1 == w2, "{scheme}");
            let mut short = vec![0.0; layout.num_scales - 1];
            let err = quantize_into(
                Input::F32(&x),
                &layout,
                &opts,
                None,
                w2.as_mut(),
                &mut short,
            );
            assert!(matches!(err, Err(QuantError::Layout(_))), "{scheme}");
        }
    }

    /// Pieces tile the tensor, its scales and its words, in order and without overlap: the
    /// one-pass kernel hands each piece its scales and words by these counts.
    #[test]
    fn pieces_tile_elements_scales_and_words() {
        let shapes: [&[usize]; 6] = [
            &[PIECE + 1],
            &[2, PIECE - 1],
            &[3, 5462],
            &[4099, 4],
            &[2, 40000],
            &[5, 1],
        ];
        for shape in shapes {
            for bc in [1, 3, 7, 32, 33, 64, 20000] {
                for store in STORES {
                    for value in [QuantValue::Q8S, QuantValue::Q4S, QuantValue::Q2S] {
                        let layout =
                            Layout::new(&one_level(value, store, bc, ScaleDtype::F16), shape)
                                .unwrap();
                        let ps = pieces(&layout);
                        let (mut e, mut s, mut w) = (0, 0, 0);
                        let unit = lcm(layout.block_cols(), layout.packing.per);
                        for p in &ps {
                            assert_eq!((p.start, p.scale0, p.word0), (e, s, w), "{shape:?} {p:?}");
                            // Non-empty, cache-sized unless one block-and-word unit is larger,
                            // and starting on a block and word boundary of its row.
                            assert!(p.len > 0 && p.len <= PIECE.max(unit), "{shape:?} {p:?}");
                            let col = p.start % layout.row_len();
                            assert_eq!(col % layout.block_cols(), 0, "{shape:?} {p:?}");
                            assert_eq!(col % layout.packing.per, 0, "{shape:?} {p:?}");
                            assert_eq!(p.scale0, grid_index(&layout, p.start));
                            e += p.len;
                            s += p.scales;
                            w += p.words;
                        }
                        assert_eq!(
                            (e, s, w),
                            (
                                layout.num_elements,
                                layout.num_scales,
                                layout.packing.num_words()
                            )
                        );
                    }
                }
            }
        }
    }

    /// Shapes around the one-pass kernel's piece size (2^14 elements): one row of exactly a
    /// piece, rows just over and under it (split inside the row), several rows per piece with
    /// a short last piece, and blocks longer than a piece.
    #[test]
    fn one_pass_matches_two_pass_across_piece_boundaries() {
        let mut rng = Rng::new(11);
        // Rows longer than a piece (split inside the row, blocks longer than a piece too),
        // and rows that fit (whole rows per piece, a short last piece).
        let split: [&[usize]; 3] = [&[PIECE + 1], &[PIECE + 700], &[20500]];
        let whole: [&[usize]; 4] = [
            &[PIECE],
            &[2, PIECE / 2 + 1],
            &[3, PIECE / 3 + 1],
            &[PIECE / 4 + 3, 4],
        ];
        let mut data = |shapes: &[&[usize]]| -> Vec<Inputs> {
            shapes
                .iter()
                .map(|s| Inputs::new(tensor(&mut rng, s.iter().product())))
                .collect()
        };
        let (split_data, whole_data) = (data(&split), data(&whole));
        let opts = all_opts();
        let values = [
            QuantValue::Q8S,
            QuantValue::Q4F,
            QuantValue::Q2S,
            QuantValue::E4M3,
            QuantValue::E2M1,
        ];
        let mut k = 0;
        for value in values {
            for store in STORES {
                for bc in [1, 3, 7, 32, 33, 64, 20000] {
                    // One shape of each kind per case, taking turns (as do dtype, options and
                    // input dtype, on other cycles), keeps the debug test run short.
                    let (a, b) = (k % split.len(), k % whole.len());
                    for (shape, x) in [(split[a], &split_data[a]), (whole[b], &whole_data[b])] {
                        let dtype = ScaleDtype::ALL[k % ScaleDtype::ALL.len()];
                        let layout =
                            Layout::new(&one_level(value, store, bc, dtype), shape).unwrap();
                        assert_same(x.get(k / 8 + k), &layout, &opts[k % opts.len()]);
                        k += 1;
                    }
                }
            }
        }
    }

    #[test]
    fn one_pass_and_two_pass_name_the_same_non_finite_value() {
        let mut x: Vec<f32> = (0..3 * PIECE).map(|i| (i % 17) as f32 - 8.0).collect();
        x[PIECE + 5] = f32::NEG_INFINITY;
        x[2 * PIECE + 1] = f32::NAN;
        for store in STORES {
            let layout = Layout::new(
                &one_level(QuantValue::Q4S, store, 32, ScaleDtype::F16),
                &[3, PIECE],
            )
            .unwrap();
            let opts = QuantizeOptions::default();
            let mut w = Words::new(&layout);
            let mut stored = vec![0.0; layout.num_scales];
            let fused = quantize_fused(Input::F32(&x), &layout, &opts, w.as_mut(), &mut stored)
                .unwrap_err();
            let scales = compute_scales(Input::F32(&x), &layout, &opts, None).unwrap();
            let two = encode_values(
                Input::F32(&x),
                &layout,
                scales.effective(),
                opts.rounding,
                w.as_mut(),
            )
            .unwrap_err();
            assert_eq!(fused, two);
            assert_eq!(
                fused,
                QuantError::NonFinite {
                    index: PIECE + 5,
                    value: f32::NEG_INFINITY,
                    given: None,
                }
            );
        }
    }

    /// The two-level kernel (NVFP4 and its kin: blocks of 16 or 32, any value, store, both
    /// block dtypes, roundings) against `compute_scales` + `encode_values`: stored scales, g and storage
    /// bit for bit, in every input dtype; data with zero blocks, values near f32::MAX, and a
    /// tensor so small that g underflows to 0. Non-finite input names the same value.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn two_level_kernel_matches_two_pass() {
        use ScaleDtype::*;
        if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
            return;
        }
        let mut rng = Rng::new(15);
        let shapes: [(&[usize], usize); 10] = [
            (&[4, 256], 16),
            (&[3, 96], 32),
            (&[2, 48], 16),
            (&[PIECE + 64], 16),
            (&[5, 160], 32),
            // Short blocks back to back (`fused_narrow`): rows shorter than a block, blocks
            // of 4 along rows, rows of 16 under blocks of 32.
            (&[700, 3], 16),
            (&[40, 12], 32),
            (&[3, 400], 4),
            (&[30, 16], 32),
            (&[9, 1], 16),
        ];
        // Codebooks too: their code of 0 (the zero rule's) is the index of the entry nearest +0,
        // NF4's 7, IQ4_NL's (no zero entry) 7 as well, not 0.
        let nf4 = Some(crate::lookup::Codebook::new(&crate::lookup::NF4).unwrap());
        let iq4nl = Some(crate::lookup::Codebook::new(&crate::lookup::IQ4_NL).unwrap());
        let values = [
            (QuantValue::E2M1, None),
            (QuantValue::E4M3, None),
            (QuantValue::Q4S, None),
            (QuantValue::Q8F, None),
            (QuantValue::Q4F, nf4),
            (QuantValue::Q4S, iq4nl),
        ];
        // The block dtypes a two-level scheme takes.
        let dtypes = [UE4M3, F16];
        let mut k = 0;
        for (shape, bc) in shapes {
            let n: usize = shape.iter().product();
            let tiny: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 1e-44).collect();
            for x in [Inputs::new(tensor(&mut rng, n)), Inputs::new(tiny)] {
                for (value, codebook) in values {
                    for store in STORES {
                        let dtype = dtypes[k % dtypes.len()];
                        let mut opts = all_opts()[k % 8];
                        opts.calibration = Calibration::MinMax;
                        let mut scheme = one_level(value, store, bc, dtype).per_tensor(F32);
                        if let Some(cb) = codebook {
                            // A codebook has its own tie rule: half-even is refused.
                            scheme = scheme.with_codebook(cb);
                            opts.rounding = Rounding::HalfAway;
                        }
                        let layout = Layout::new(&scheme, shape).unwrap();
                        assert!(two_level_fusable(&layout));
                        let input = x.get(k);
                        let (s2, w2) = two_pass(input, &layout, &opts);
                        let mut w1 = Words::filled(&layout, 0x5A5A_5A5A);
                        let s1 = quantize(input, &layout, &opts, None, w1.as_mut()).unwrap();
                        let ctx = || format!("{scheme} {shape:?} {opts:?} input {}", k % 4);
                        let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&s1.stored), bits(&s2.stored), "{}", ctx());
                        assert_eq!(s1.global.map(f32::to_bits), s2.global.map(f32::to_bits));
                        assert_eq!(s1.effective(), s2.effective(), "{}", ctx());
                        if let Some(i) = (0..w1.len()).find(|&i| w1.get(i) != w2.get(i)) {
                            panic!("word {i}: {:#x} vs {:#x}: {}", w1.get(i), w2.get(i), ctx());
                        }
                        // The caller's g (block scales calibrated): the same kernels, against
                        // `compute_scales` under that g. A g between those of the inputs, one
                        // that saturates every block scale, 0, and the largest f32.
                        let g = [2.5e-4, 1e-40, 0.0, f32::MAX][k % 4];
                        let explicit = Some(ExplicitScales {
                            scales: None,
                            global: Some(g),
                        });
                        let s2 = compute_scales(input, &layout, &opts, explicit).unwrap();
                        let mut w2 = Words::filled(&layout, 0xA5A5_A5A5);
                        encode_values(input, &layout, s2.effective(), opts.rounding, w2.as_mut())
                            .unwrap();
                        let mut w1 = Words::filled(&layout, 0x5A5A_5A5A);
                        let s1 = quantize(input, &layout, &opts, explicit, w1.as_mut()).unwrap();
                        assert_eq!(bits(&s1.stored), bits(&s2.stored), "g {g}: {}", ctx());
                        assert_eq!(s1.global, Some(g));
                        if let Some(i) = (0..w1.len()).find(|&i| w1.get(i) != w2.get(i)) {
                            panic!(
                                "g {g}, word {i}: {:#x} vs {:#x}: {}",
                                w1.get(i),
                                w2.get(i),
                                ctx()
                            );
                        }
                        k += 1;
                    }
                }
            }
            let mut bad = tensor(&mut rng, n);
            bad[n - 3] = f32::NAN;
            bad[n / 2] = f32::NEG_INFINITY;
            let scheme =
                one_level(QuantValue::E2M1, QuantStore::PackedNative(0), bc, UE4M3).per_tensor(F32);
            let layout = Layout::new(&scheme, shape).unwrap();
            let opts = QuantizeOptions::default();
            let mut w = Words::new(&layout);
            let got = quantize(Input::F32(&bad), &layout, &opts, None, w.as_mut()).unwrap_err();
            assert_eq!(
                got,
                QuantError::NonFinite {
                    index: n / 2,
                    value: f32::NEG_INFINITY,
                    given: None,
                }
            );
        }
    }

    /// The two-level kernel's integer codes equal the codec's on the IEEE quotient where the
    /// kernel multiplies by a checked reciprocal: values a few ulps from half-integer multiples
    /// of their block's effective scale in every group (the product may round the other way
    /// there, and the group must be encoded again by division), each block's largest first
    /// (one e for all), both roundings, several integer ranges, and a zero block in some groups
    /// (the zero rule's path). Each case draws its data until some value's product and quotient
    /// round apart (whether any does depends on how 1/e rounded), so every case sees the redo,
    /// and the scale must be one the checked multiply stands in for (not a power of two).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn two_level_int_codes_next_to_ties_are_the_divisions() {
        if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
            return;
        }
        let mut rng = Rng::new(41);
        let mut misses = 0;
        let cases = [
            (QuantValue::Q8S, 16),
            (QuantValue::Q8F, 32),
            (QuantValue::Q4S, 32),
            (QuantValue::Q4F, 16),
            (QuantValue::Q2S, 16),
        ];
        // Some blocks all zeros: their groups take the zero rule's path.
        let zero = |b: usize| b % 37 == 5;
        for (value, bc) in cases {
            for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
                let scheme = one_level(value, QuantStore::Native, bc, ScaleDtype::UE4M3)
                    .per_tensor(ScaleDtype::F32);
                let layout = Layout::new(&scheme, &[40, 8 * bc]).unwrap();
                assert!(two_level_fusable(&layout));
                let opts = QuantizeOptions {
                    calibration: Calibration::MinMax,
                    rounding,
                    scale_rounding: ScaleRounding::Nearest,
                };
                let (qmin, qmax) = value.range();
                let (n, blocks) = (layout.num_elements, layout.num_scales);
                // (data, e, values whose product and quotient round apart)
                let mut drawn = None;
                for _ in 0..100 {
                    let top = 3.0 + rng.unit();
                    let mut x = vec![0.0f32; n];
                    for b in 0..blocks {
                        x[b * bc] = if b % 2 == 0 { top } else { -top };
                    }
                    let mut w = Words::new(&layout);
                    let e = quantize(Input::F32(&x), &layout, &opts, None, w.as_mut())
                        .unwrap()
                        .effective()[0];
                    for (i, v) in x.iter_mut().enumerate() {
                        let b = i / bc;
                        if zero(b) {
                            *v = 0.0;
                            continue;
                        }
                        if i % bc == 0 {
                            continue; // the block's largest
                        }
                        let k = rng.below((qmax - qmin) as usize + 2) as f64 + qmin as f64 - 0.5;
                        let t = (k * e as f64) as f32;
                        let t =
                            f32::from_bits((t.to_bits() as i32 + rng.below(7) as i32 - 3) as u32);
                        *v = if t.abs() < top { t } else { t * 0.25 };
                    }
                    let apart = with_codec!(&scheme, rounding, |c| x
                        .iter()
                        .filter(|&&v| c.encode(v * (1.0 / e)) != c.encode(v / e))
                        .count());
                    if apart > 0 {
                        drawn = Some((x, e, apart));
                        break;
                    }
                }
                let (x, e, apart) =
                    drawn.unwrap_or_else(|| panic!("{scheme} {rounding:?}: no value rounds apart"));
                misses += apart;
                assert!(
                    crate::simd::checked_reciprocal(e).is_some(),
                    "{scheme}: {e:e}"
                );
                assert!(
                    crate::simd::exact_reciprocal(e).is_none(),
                    "{scheme}: {e:e}"
                );
                let mut w = Words::filled(&layout, 0x5A5A_5A5A);
                let s = quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
                for (b, &f) in s.effective().iter().enumerate() {
                    assert_eq!(f.to_bits(), if zero(b) { 0 } else { e.to_bits() });
                }
                let mask = layout.packing.field_mask() as u8;
                let want: Vec<u8> = with_codec!(&scheme, rounding, |c| x
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| if zero(i / bc) {
                        c.zero_code()
                    } else {
                        c.encode(v / e)
                    })
                    .collect());
                for (i, &want) in want.iter().enumerate() {
                    let got = w.get(i) as u8;
                    assert_eq!(
                        got,
                        want & mask,
                        "{scheme} {rounding:?} value {i}: {:e} / {e:e}",
                        x[i]
                    );
                }
            }
        }
        assert!(
            misses > 100,
            "only {misses} values where the product rounds apart"
        );
    }

    /// Scale bits, any NaN equal to any other.
    fn key(v: f32) -> u32 {
        if v.is_nan() {
            u32::MAX
        } else {
            v.to_bits()
        }
    }

    /// On a CPU with AVX2 this compares the AVX2 build of the one-pass block kernel with the
    /// portable one (scales, codes, non-finite flag); without it both sides are portable and
    /// the test passes trivially. Non-finite input included: both builds must still agree.
    #[test]
    fn measure_encode_avx2_build_matches_portable() {
        fn check<C: Encode>(codec: C, x: &[f32], layout: &Layout, opts: &QuantizeOptions) {
            let mut k = FusedKernel::new(layout, opts, false);
            for p in pieces(layout) {
                let xs = &x[p.start..p.start + p.len];
                let (mut s1, mut s2) = (vec![-1.0f32; p.scales], vec![-2.0f32; p.scales]);
                let (mut c1, mut c2) = (vec![1u8; p.len], vec![2u8; p.len]);
                let b1 = measure_encode(codec, &k, &p, xs, &mut s1, &mut c1);
                let b2 = measure_encode_portable(codec, &k, &p, xs, &mut s2, &mut c2);
                let ctx = || format!("{} {opts:?} {:?} {p:?}", layout.scheme, layout.shape);
                let (a, b): (Vec<u32>, Vec<u32>) = (
                    s1.iter().map(|&v| key(v)).collect(),
                    s2.iter().map(|&v| key(v)).collect(),
                );
                assert_eq!(a, b, "scales: {}", ctx());
                assert_eq!(c1, c2, "codes: {}", ctx());
                assert_eq!(b1, b2, "non-finite: {}", ctx());
                // With the non-temporal stores of large storage: the same codes.
                #[cfg(target_arch = "x86_64")]
                {
                    k.stream = true;
                    let mut c3 = vec![3u8; p.len];
                    let b3 = measure_encode(codec, &k, &p, xs, &mut s1, &mut c3);
                    // SAFETY: SSE is part of x86-64.
                    unsafe { std::arch::x86_64::_mm_sfence() };
                    k.stream = false;
                    assert_eq!(c3, c2, "streamed codes: {}", ctx());
                    assert_eq!(b3, b2, "streamed non-finite: {}", ctx());
                }
            }
        }
        let mut rng = Rng::new(12);
        for (shape, bc) in [
            (&[3, 1000][..], 37),
            (&[PIECE + 100], 64),
            (&[5, 33], 1),
            (&[2, 300], 300),
            (&[4, 96], 32),
            (&[3, 50], 16),
            (&[3, 512], 32),
            (&[2, 1024], 64),
            (&[2 * PIECE + 8], 8),
            // Whole blocks of 8 or a multiple of 16 in groups of eight: the fused kernel's fast
            // path (8, 16 and 32 with their lengths as constants).
            (&[4, 256], 8),
            (&[4, 256], 16),
            (&[2, 4096], 32),
            (&[3, 768], 48),
            (&[2, 2048], 128),
            // Rows that end in a partial block of a multiple-of-8 length: each row's whole
            // blocks eight at a time, its last block alone (rows of one piece; rows split
            // into pieces; a row shorter than a block).
            (&[7, 1000], 48),
            (&[5, 200], 24),
            (&[9, 100], 8),
            (&[2, PIECE + 100], 40),
            (&[3, 20], 32),
            // Blocks back to back of a length under 64 that is not a multiple of 8, eight at
            // a time (`fused_narrow`): rows shorter than a block (a conv kernel's rows of 3,
            // rows of 1 and 12, rows split over pieces), short blocks along rows, with and
            // without a partial last block, and a group cut short at a piece's end.
            (&[700, 3], 32),
            (&[300, 1], 16),
            (&[200, 12], 32),
            (&[6000, 5], 8),
            (&[4, 400], 4),
            (&[3, 1000], 12),
            (&[5, 101], 5),
            (&[2, 997], 63),
            (&[3, 130], 1),
            (&[PIECE / 2 + 3, 3], 4),
        ] {
            let n: usize = shape.iter().product();
            let mut x = tensor(&mut rng, n);
            for _ in 0..n / 500 {
                x[rng.below(n)] = rng.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
            }
            for (j, dtype) in ScaleDtype::ALL.into_iter().enumerate() {
                for (i, opts) in all_opts().into_iter().enumerate() {
                    let value = QuantValue::ALL[(i + j) % QuantValue::ALL.len()];
                    let layout =
                        Layout::new(&one_level(value, QuantStore::Native, bc, dtype), shape)
                            .unwrap();
                    let mut opts = opts;
                    if dtype == ScaleDtype::UE8M0 && i % 2 == 0 {
                        opts.scale_rounding = ScaleRounding::Mx;
                    }
                    with_codec!(&layout.scheme, opts.rounding, |codec| check(
                        codec, &x, &layout, &opts
                    ));
                }
            }
        }
    }

    /// Per-tensor scales from max |x| on f32 input (`quantize_per_tensor_avx2` where the CPU
    /// has AVX2: the quick encode of integer codes one a byte, the general one for other
    /// stores) against `compute_scales` + `encode_values`: values a few ulps from half-integer
    /// multiples of the scale (where the product by 1 / e and the division round apart),
    /// lengths around the 32s and the chunks, every integer range, rounding, scale rounding
    /// and store; all zeros; a NaN or an infinity anywhere, refused naming the first.
    #[test]
    fn per_tensor_max_abs_matches_two_pass() {
        let mut rng = Rng::new(43);
        let mut misses = 0;
        for n in [0, 1, 31, 33, 1000, MIN_TASK_ELEMS + 77, 3 * MIN_TASK_ELEMS] {
            for value in [QuantValue::Q8S, QuantValue::Q4S, QuantValue::Q2S] {
                for (i, store) in STORES.into_iter().enumerate() {
                    let dtype = [ScaleDtype::F32, ScaleDtype::F16, ScaleDtype::BF16][i];
                    let scheme = QuantScheme::default()
                        .with_value(value)
                        .with_store(store)
                        .per_tensor(dtype);
                    let Ok(layout) = Layout::new(&scheme, &[n]) else {
                        continue;
                    };
                    let opts = QuantizeOptions {
                        calibration: Calibration::MinMax,
                        rounding: [Rounding::HalfAway, Rounding::HalfEven][n % 2],
                        scale_rounding: [ScaleRounding::Up, ScaleRounding::Nearest][i % 2],
                    };
                    let k = FusedKernel::new(&layout, &opts, false);
                    let alpha = f32::from_bits(0x3000_0000 + rng.below(0x1800_0000) as u32);
                    let e = k.scale(alpha);
                    let mut x: Vec<f32> = (0..n)
                        .map(|_| near_tie(&mut rng, value, e))
                        .map(|v| if v.abs() < alpha { v } else { 0.0 })
                        .collect();
                    if n > 0 {
                        x[rng.below(n)] = alpha;
                    }
                    misses += product_misses(value, opts.rounding, &x, &vec![e; n]);
                    let mut cases = vec![x.clone(), vec![0.0; n]];
                    if n > 0 {
                        for bad in [f32::NAN, f32::INFINITY, f32::from_bits(0xFFC0_1234)] {
                            let mut y = x.clone();
                            let at = rng.below(n);
                            y[at] = bad;
                            y[rng.below(at + 1)] = -f32::INFINITY;
                            cases.push(y);
                        }
                    }
                    for y in &cases {
                        let input = Input::F32(y);
                        let want = compute_scales(input, &layout, &opts, None).and_then(|s| {
                            let mut w = Words::filled(&layout, 0xA5A5_A5A5);
                            encode_values(input, &layout, s.effective(), opts.rounding, w.as_mut())
                                .map(|()| (s.stored, w))
                        });
                        let mut w = Words::filled(&layout, 0x5A5A_5A5A);
                        let got = quantize(input, &layout, &opts, None, w.as_mut())
                            .map(|s| (s.stored, w));
                        match (got, want) {
                            (Ok(a), Ok(b)) => assert_eq!(a, b, "{scheme} n={n} {opts:?}"),
                            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                            (a, b) => {
                                panic!("{scheme} n={n}: {:?} against {:?}", a.is_ok(), b.is_ok())
                            }
                        }
                    }
                }
            }
        }
        assert!(
            misses > 100,
            "only {misses} values where the product and division differ"
        );
    }

    // ---- quantize → dequantize against a scalar reading of SPEC ----

    /// The positive values of a scale dtype in code order (F32: none, it is the identity).
    fn dtype_values(dtype: ScaleDtype) -> Vec<f64> {
        match dtype {
            ScaleDtype::F32 => Vec::new(),
            ScaleDtype::F16 => (0..=0x7BFFu16)
                .map(|c| half::f16::from_bits(c).to_f64())
                .collect(),
            ScaleDtype::BF16 => (0..=0x7F7Fu16)
                .map(|c| half::bf16::from_bits(c).to_f64())
                .collect(),
            ScaleDtype::UE4M3 => (0..=0x7E)
                .map(|c| oracle::float_magnitude(QuantValue::E4M3, c).unwrap())
                .collect(),
            ScaleDtype::UE8M0 => (0..=254).map(|c| 2f64.powi(c - 127)).collect(),
        }
    }

    /// SPEC §4: `up` is the smallest value ≥ s, `nearest` the nearest (ties to the even code,
    /// UE8M0's ties up), both saturating; UE8M0 has no zero, its smallest value stands in.
    fn round_scale(dtype: ScaleDtype, s: f32, mode: ScaleRounding) -> f32 {
        if dtype == ScaleDtype::F32 {
            return s;
        }
        let v = dtype_values(dtype);
        let s64 = s as f64;
        let top = v.len() - 1;
        if s64 >= v[top] {
            return v[top] as f32;
        }
        let Some(lo) = v.iter().rposition(|&x| x <= s64) else {
            return v[0] as f32; // UE8M0 below 2^-127
        };
        let code = if v[lo] == s64 {
            lo
        } else if mode == ScaleRounding::Up {
            lo + 1
        } else {
            let mid = (v[lo] + v[lo + 1]) / 2.0;
            let tie_up = dtype == ScaleDtype::UE8M0 || lo % 2 == 1;
            if s64 < mid || (s64 == mid && !tie_up) {
                lo
            } else {
                lo + 1
            }
        };
        v[code] as f32
    }

    /// Stored scales, global scale and effective scales of SPEC §3–§5, one block at a time.
    fn spec_scales(
        x: &[f32],
        layout: &Layout,
        opts: &QuantizeOptions,
    ) -> (Vec<f32>, Option<f32>, Vec<f32>) {
        let scheme = &layout.scheme;
        let (_, qmin, qmax, _) = oracle::spec(scheme.value);
        let (mut max, mut sum, mut count) = (
            vec![0.0f32; layout.num_scales],
            vec![0.0f64; layout.num_scales],
            vec![0usize; layout.num_scales],
        );
        for (f, &v) in x.iter().enumerate() {
            let g = grid_index(layout, f);
            max[g] = max[g].max(v.abs());
            sum[g] += v.abs() as f64; // exact for the test data (multiples of 2^-6, small)
            count[g] += 1;
        }
        let s_raw: Vec<f32> = (0..layout.num_scales)
            .map(|g| {
                let alpha = match opts.calibration {
                    Calibration::MinMax | Calibration::Mse => max[g],
                    Calibration::AbsMean if count[g] == 0 => 0.0,
                    Calibration::AbsMean => (sum[g] / count[g] as f64) as f32,
                };
                (alpha + alpha) / (qmax - qmin) as f32
            })
            .collect();
        let dtype = scheme.scale_dtype();
        let mode = opts.scale_rounding;
        if !scheme.is_two_level() {
            let stored: Vec<f32> = s_raw.iter().map(|&s| round_scale(dtype, s, mode)).collect();
            return (stored.clone(), None, stored);
        }
        let max_raw = s_raw.iter().fold(0.0f32, |m, &s| m.max(s));
        let dmax = *dtype_values(dtype).last().unwrap() as f32;
        let g = if max_raw == 0.0 { 1.0 } else { max_raw / dmax };
        let stored: Vec<f32> = s_raw
            .iter()
            .map(|&s| round_scale(dtype, s / g, mode))
            .collect();
        let eff = stored.iter().map(|&b| (b * g).min(f32::MAX)).collect();
        (stored, Some(g), eff)
    }

    /// `quantize` then `dequantize` equal SPEC computed one element at a time, for a spread
    /// of schemes: per-tensor, 1-D and 2-D blocks, every scale dtype, two-level (NVFP4), both
    /// calibrations, packed along the last and an outer axis.
    #[test]
    fn dequantize_of_quantize_matches_a_scalar_reading_of_spec() {
        use ScaleDtype::*;
        let nvfp4 = QuantScheme::default()
            .with_value(QuantValue::E2M1)
            .with_store(QuantStore::PackedNative(0))
            .per_block(&[16], UE4M3)
            .unwrap()
            .per_tensor(F32);
        let plain = |v: QuantValue, store: QuantStore| {
            QuantScheme::default().with_value(v).with_store(store)
        };
        let block = |v: QuantValue, store: QuantStore, b: &[usize], d: ScaleDtype| {
            plain(v, store).per_block(b, d).unwrap()
        };
        let opts = |calibration, rounding, scale_rounding| QuantizeOptions {
            calibration,
            rounding,
            scale_rounding,
        };
        use Calibration::{AbsMean, MinMax};
        use Rounding::{HalfAway, HalfEven};
        use ScaleRounding::{Nearest, Up};
        let cases = [
            (
                plain(QuantValue::Q8S, QuantStore::Native),
                &[5usize, 37][..],
                opts(MinMax, HalfAway, Up),
            ),
            (
                block(QuantValue::Q4S, QuantStore::PackedU32(0), &[32], F16),
                &[3, 70],
                opts(MinMax, HalfEven, Nearest),
            ),
            (
                block(QuantValue::E2M1, QuantStore::PackedNative(0), &[32], UE8M0),
                &[4, 40],
                opts(MinMax, HalfAway, Up),
            ),
            (nvfp4, &[4, 50], opts(MinMax, HalfAway, Nearest)),
            (nvfp4, &[3, 16], opts(MinMax, HalfAway, Up)),
            // Two-level with int4 values in u32 words (the presets' int4_block16), along the
            // last axis and along an outer one.
            (
                block(QuantValue::Q4F, QuantStore::PackedU32(0), &[16], UE4M3).per_tensor(F32),
                &[5, 64],
                opts(MinMax, HalfEven, Nearest),
            ),
            (
                block(QuantValue::Q4S, QuantStore::PackedU32(1), &[8], UE4M3).per_tensor(F32),
                &[10, 24],
                opts(AbsMean, HalfAway, Up),
            ),
            (
                block(QuantValue::E4M3, QuantStore::Native, &[2, 3], BF16),
                &[5, 7],
                opts(MinMax, HalfAway, Up),
            ),
            (
                plain(QuantValue::Q2S, QuantStore::PackedU32(0)),
                &[6, 21],
                opts(AbsMean, HalfAway, Up),
            ),
            (
                block(QuantValue::Q4F, QuantStore::PackedNative(1), &[8], UE4M3),
                &[9, 10],
                opts(AbsMean, HalfEven, Nearest),
            ),
            (
                block(QuantValue::E5M2, QuantStore::PackedU32(1), &[16], UE8M0),
                &[6, 20],
                opts(MinMax, HalfAway, Up),
            ),
            (
                block(QuantValue::Q8F, QuantStore::Native, &[3, 1, 4], F32),
                &[4, 2, 9],
                opts(AbsMean, HalfEven, Up),
            ),
        ];
        let mut rng = Rng::new(13);
        for (scheme, shape, opts) in cases {
            let layout = Layout::new(&scheme, shape).unwrap();
            let n = layout.num_elements;
            // Multiples of 2^-6 below 128 (f64 sums stay exact), some rows scaled far down,
            // one all-zero run (zero rule).
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    let v = (rng.below(2 * 128 * 64) as f32 - 128.0 * 64.0) / 64.0;
                    match (i / 16) % 5 {
                        1 => v * 2f32.powi(-12),
                        3 if i < 32 => 0.0,
                        _ => v,
                    }
                })
                .collect();
            let mut w = Words::new(&layout);
            let scales = quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
            // As the bindings call it (a two-level g multiplied in block by block), and against
            // the effective scales worked out first: the same bits.
            let mut y = vec![0.0f32; n];
            let st = w.as_ref();
            dequantize(
                &layout,
                st,
                &scales.stored,
                scales.global,
                Output::F32(&mut y),
            );
            let mut y_eff = vec![0.0f32; n];
            dequantize(
                &layout,
                st,
                scales.effective(),
                None,
                Output::F32(&mut y_eff),
            );
            let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&y_eff), "{scheme} {opts:?}");

            let (stored, global, eff) = spec_scales(&x, &layout, &opts);
            assert_eq!(
                bits(&scales.stored),
                bits(&stored),
                "{scheme} {opts:?} stored scales"
            );
            assert_eq!(
                scales.global.map(f32::to_bits),
                global.map(f32::to_bits),
                "{scheme}"
            );
            let mask = (1u32 << scheme.value.bits()) - 1;
            for f in 0..n {
                let e = eff[grid_index(&layout, f)];
                let q = oracle::quantize_one(scheme.value, opts.rounding, x[f], e);
                let want = oracle::dequantize_one(scheme.value, q as u32 & mask, e);
                assert_eq!(
                    y[f].to_bits(),
                    want.to_bits(),
                    "{scheme} {opts:?} x[{f}] = {} e {e}: got {}",
                    x[f],
                    y[f]
                );
            }
        }
    }

    /// A value a few ulps either side of a half-integer multiple of `e` within the code range
    /// of `value`: where the product by a rounded reciprocal of `e` and the division by it can
    /// round to different codes.
    pub(crate) fn near_tie(rng: &mut Rng, value: QuantValue, e: f32) -> f32 {
        let (_, qmin, qmax, _) = oracle::spec(value);
        let k = qmin + rng.below((qmax - qmin) as usize) as f64 + 0.5;
        let x = (k * e as f64) as f32;
        let x = f32::from_bits((x.to_bits() as i32).wrapping_add(rng.below(7) as i32 - 3) as u32);
        // Past f32's range (the largest scales): the scale itself.
        if x.is_finite() {
            x
        } else {
            e
        }
    }

    /// How many of `x` (all against `e`) the reciprocal's product would code differently
    /// from the division: the data must hold some for the tests below to mean anything.
    pub(crate) fn product_misses(
        value: QuantValue,
        rounding: Rounding,
        x: &[f32],
        e: &[f32],
    ) -> usize {
        let one = |x: f32, e: f32| {
            let r = 1.0 / e;
            // A subnormal scale's reciprocal is infinite: the kernels divide then.
            let misses = r.is_finite()
                && oracle::encode(value, rounding, x * r)
                    != oracle::quantize_one(value, rounding, x, e);
            misses as usize
        };
        x.iter().zip(e).map(|(&x, &e)| one(x, e)).sum()
    }

    /// The values stored in `w` (against the grid's scales `eff`) are those of the division's
    /// codes of `x` by `e` (each value's scale), per the scalar reading of SPEC.
    fn assert_division_codes(
        layout: &Layout,
        w: &Words,
        eff: &[f32],
        x: &[f32],
        e: &[f32],
        rounding: Rounding,
        ctx: &str,
    ) {
        let value = layout.scheme.value;
        let mut y = vec![0.0f32; x.len()];
        dequantize(layout, w.as_ref(), eff, None, Output::F32(&mut y));
        let mask = (1u32 << value.bits()) - 1;
        for (f, ((&y, &x), &e)) in y.iter().zip(x).zip(e).enumerate() {
            let q = oracle::quantize_one(value, rounding, x, e);
            let want = oracle::dequantize_one(value, q as u32 & mask, e);
            assert_eq!(
                y.to_bits(),
                want.to_bits(),
                "{ctx} x[{f}] = {x:e}, e = {e:e}"
            );
        }
    }

    const INTS: [QuantValue; 6] = [
        QuantValue::Q8S,
        QuantValue::Q8F,
        QuantValue::Q4S,
        QuantValue::Q4F,
        QuantValue::Q2S,
        QuantValue::Q2F,
    ];

    /// Integer codes divide by a scale as a checked multiply by its reciprocal
    /// (`simd::x86::int_codes8_recip`); values at the edge of a rounding boundary fall back to
    /// the division. Given scales (float16, f32 from tiny to 2^118, subnormal, past 2^126) on
    /// runs short and long, per tensor and per block, each rounding: the division's codes.
    #[test]
    fn near_ties_take_the_divisions_codes_with_given_scales() {
        let mut rng = Rng::new(16);
        let mut misses = 0;
        for value in INTS {
            for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
                for (block, shape) in [(None, &[4099usize][..]), (Some(64), &[8, 64][..])] {
                    let plain = QuantScheme::default().with_value(value);
                    let scheme = match block {
                        Some(b) => plain.per_block(&[b], ScaleDtype::F32).unwrap(),
                        None => plain,
                    };
                    let layout = Layout::new(&scheme, shape).unwrap();
                    let scale = |rng: &mut Rng| match rng.below(5) {
                        0 | 1 => half::f16::from_bits(1 + rng.below(0x7BFF) as u16).to_f32(),
                        2 => f32::from_bits(0x0080_0000 + rng.below(0x7600_0000) as u32),
                        3 => f32::from_bits(1 + rng.below(0x007F_FFFF) as u32),
                        _ => f32::from_bits(0x7E00_0000 + rng.below(0x0100_0000) as u32),
                    };
                    for _ in 0..8 {
                        let eff: Vec<f32> =
                            (0..layout.num_scales).map(|_| scale(&mut rng)).collect();
                        let n = layout.num_elements;
                        let e: Vec<f32> = (0..n).map(|f| eff[grid_index(&layout, f)]).collect();
                        let x: Vec<f32> = e.iter().map(|&e| near_tie(&mut rng, value, e)).collect();
                        misses += product_misses(value, rounding, &x, &e);
                        let mut w = Words::new(&layout);
                        encode_values(Input::F32(&x), &layout, &eff, rounding, w.as_mut()).unwrap();
                        let ctx = format!("{scheme} {rounding:?}");
                        assert_division_codes(&layout, &w, &eff, &x, &e, rounding, &ctx);
                    }
                }
            }
        }
        assert!(
            misses > 1000,
            "only {misses} values where the product misses"
        );
    }

    /// Given scales on whole blocks of 8, 16, 32, 48 and 128 values, eight blocks at a time
    /// (`fused_avx2::encode_groups_given`), every value kind, one code a byte and packed:
    /// values near rounding boundaries, values past the range (clamped or saturated), zero
    /// scales (the zero rule) alone in a group or not, subnormal and huge scales, a tail of
    /// blocks short of a group; the division's codes. A non-finite value anywhere is an error.
    #[test]
    fn given_scales_eight_blocks_at_a_time_take_the_divisions_codes() {
        let mut rng = Rng::new(18);
        for value in QuantValue::ALL {
            let stores: &[QuantStore] = if value.bits() < 8 {
                &[QuantStore::Native, QuantStore::PackedU32(0)]
            } else {
                &[QuantStore::Native]
            };
            let sizes = [8, 16, 32, 48, 128];
            for (&store, bc) in stores.iter().flat_map(|s| sizes.map(|bc| (s, bc))) {
                for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
                    let scheme = one_level(value, store, bc, ScaleDtype::F32);
                    // Rows of 19 blocks: two groups of eight and a tail of three.
                    let layout = Layout::new(&scheme, &[4, 19 * bc]).unwrap();
                    let per_row = layout.grid_cols();
                    let eff: Vec<f32> = (0..layout.num_scales)
                        .map(|k| match (k / per_row, rng.below(12)) {
                            (1, _) if k % per_row == 5 => 0.0, // one zero in a group
                            (2, 0) => 0.0,
                            (_, 1) => f32::from_bits(1 + rng.below(0x007F_FFFF) as u32),
                            (_, 2) => 2f32.powi(100 + rng.below(27) as i32),
                            _ => 2f32.powi(rng.below(40) as i32 - 20) * (0.5 + rng.unit()),
                        })
                        .collect();
                    let n = layout.num_elements;
                    let e: Vec<f32> = (0..n).map(|f| eff[grid_index(&layout, f)]).collect();
                    let (_, qmin, qmax, _) = oracle::spec(value);
                    let x: Vec<f32> = e
                        .iter()
                        .map(|&e| {
                            let v = match rng.below(3) {
                                0 if INTS.contains(&value) => near_tie(&mut rng, value, e),
                                // Up to twice the range: some clamp (or saturate).
                                _ => (rng.unit() * 4.0 - 2.0) * (qmax - qmin) as f32 / 2.0 * e,
                            };
                            if v.is_finite() {
                                v
                            } else {
                                e
                            }
                        })
                        .collect();
                    let mut w = Words::new(&layout);
                    encode_values(Input::F32(&x), &layout, &eff, rounding, w.as_mut()).unwrap();
                    let ctx = format!("{scheme} {rounding:?}");
                    assert_division_codes(&layout, &w, &eff, &x, &e, rounding, &ctx);
                    // One non-finite value, in a group or in the tail: an error.
                    for at in [3 * bc + 1, 17 * bc + 2] {
                        for bad in [f32::NAN, f32::INFINITY] {
                            let mut y = x.clone();
                            y[per_row * bc + at] = bad;
                            let got =
                                encode_values(Input::F32(&y), &layout, &eff, rounding, w.as_mut());
                            assert!(got.is_err(), "{ctx}: {bad} at {at}");
                        }
                    }
                }
            }
        }
    }

    /// The one-pass kernel's blocks of 8, 16, 32, 48 and 128 (eight at a time) with scales from
    /// the data:
    /// each block's largest value sets its scale, the others lie at the edge of a rounding
    /// boundary of that scale; the division's codes.
    #[test]
    fn near_ties_take_the_divisions_codes_in_one_pass() {
        let mut rng = Rng::new(17);
        let mut misses = 0;
        for value in INTS {
            for bc in [8, 16, 32, 48, 128] {
                for dtype in [ScaleDtype::F16, ScaleDtype::F32, ScaleDtype::BF16] {
                    for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
                        let scheme = one_level(value, QuantStore::Native, bc, dtype);
                        let layout = Layout::new(&scheme, &[8, 768]).unwrap();
                        let opts = QuantizeOptions {
                            calibration: Calibration::MinMax,
                            rounding,
                            scale_rounding: rng.pick(&[ScaleRounding::Up, ScaleRounding::Nearest]),
                        };
                        let n = layout.num_elements;
                        // Each block's first value its largest, 2^-20 to 2^20.
                        let tops: Vec<f32> = (0..n / bc)
                            .map(|_| {
                                2f32.powi(rng.below(41) as i32 - 20) * (1.0 + rng.unit() / 2.0)
                            })
                            .collect();
                        let mut x: Vec<f32> = (0..n)
                            .map(|f| if f % bc == 0 { tops[f / bc] } else { 0.0 })
                            .collect();
                        let mut w = Words::new(&layout);
                        let first =
                            quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
                        let eff = first.effective().to_vec();
                        let e: Vec<f32> = (0..n).map(|f| eff[f / bc]).collect();
                        for f in (0..n).filter(|f| f % bc != 0) {
                            let v = near_tie(&mut rng, value, e[f]);
                            x[f] = if v.abs() < tops[f / bc] { v } else { 0.0 };
                        }
                        misses += product_misses(value, rounding, &x, &e);
                        let scales =
                            quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
                        assert_eq!(scales.effective(), &eff[..], "{scheme}: the scales moved");
                        let ctx = format!("{scheme} {opts:?}");
                        assert_division_codes(&layout, &w, &eff, &x, &e, rounding, &ctx);
                    }
                }
            }
        }
        assert!(
            misses > 1000,
            "only {misses} values where the product misses"
        );
    }

    /// The float16 check eight at a time against `is_representable` one at a time: a bad
    /// scale (NaN, ±inf, negative, between two float16 values) at every position of a group,
    /// among good ones (0, −0, subnormals, 65504).
    #[test]
    fn first_unrepresentable_f16_matches_one_at_a_time() {
        let good = [
            0.0f32,
            -0.0,
            5.9604645e-8,
            6.1035156e-5,
            1.0,
            0.5,
            65504.0,
            3.0,
        ];
        let bad = [
            f32::NAN,
            f32::INFINITY,
            -1.0,
            1.0 + 1e-6,
            65505.0,
            1e-9,
            f32::NEG_INFINITY,
        ];
        let mut rng = Rng::new(14);
        for len in [0, 7, 8, 9, 40] {
            for pos in 0..=len {
                let mut v: Vec<f32> = (0..len).map(|_| rng.pick(&good)).collect();
                if pos < len {
                    v[pos] = rng.pick(&bad);
                }
                let want = v.iter().position(|&s| !ScaleDtype::F16.is_representable(s));
                assert_eq!(first_unrepresentable(ScaleDtype::F16, &v), want, "{v:?}");
            }
        }
    }

    /// The UE4M3 and UE8M0 vector checks and F32's runs of 64 against one at a time: good and
    /// bad scales at every position around the groups of eight and 64, and eight copies of
    /// each of a sweep of f32 bit patterns (every sign, exponent and many mantissas; NaNs,
    /// infinities, subnormals).
    #[test]
    fn first_unrepresentable_ue4m3_ue8m0_f32_match_one_at_a_time() {
        let cases: [(ScaleDtype, &[f32], &[f32]); 3] = [
            (
                ScaleDtype::F32,
                &[0.0, -0.0, 1.0, 3.0e-42, 1.1754942e-38, f32::MAX, 0.1],
                &[
                    f32::NAN,
                    -f32::NAN,
                    f32::INFINITY,
                    -f32::INFINITY,
                    -1.0,
                    -3.0e-42,
                ],
            ),
            (
                ScaleDtype::UE4M3,
                &[
                    0.0,
                    -0.0,
                    448.0,
                    1.0 / 512.0,
                    0.015625,
                    1.125,
                    240.0,
                    7.0 / 512.0,
                ],
                &[f32::NAN, f32::INFINITY, -1.0, 449.0, 1.0625, 1e-4, 480.0],
            ),
            (
                ScaleDtype::UE8M0,
                &[
                    1.0,
                    0.5,
                    2f32.powi(127),
                    2f32.powi(-126),
                    2f32.powi(-127),
                    1024.0,
                ],
                &[
                    0.0,
                    -0.0,
                    f32::NAN,
                    f32::INFINITY,
                    -1.0,
                    3.0,
                    2f32.powi(-128),
                    1.5,
                ],
            ),
        ];
        let mut rng = Rng::new(15);
        for (dtype, good, bad) in cases {
            for len in [0, 7, 8, 9, 40, 64, 130] {
                for pos in 0..=len {
                    let mut v: Vec<f32> = (0..len).map(|_| rng.pick(good)).collect();
                    if pos < len {
                        v[pos] = rng.pick(bad);
                    }
                    let want = v.iter().position(|&s| !dtype.is_representable(s));
                    assert_eq!(first_unrepresentable(dtype, &v), want, "{dtype} {v:?}");
                }
            }
            for bits in (0..=u32::MAX).step_by(4099) {
                let s = f32::from_bits(bits);
                let want = (!dtype.is_representable(s)).then_some(0);
                assert_eq!(first_unrepresentable(dtype, &[s; 8]), want, "{dtype} {s:e}");
            }
        }
    }

    /// SPEC §4: under `nearest`, a UE8M0 tie goes up (as ml_dtypes' float8_e8m0fnu cast:
    /// 3.0 → 4.0, 0.75 → 1.0), unlike the other dtypes' ties to even.
    #[test]
    fn ue8m0_nearest_scale_ties_go_up() {
        let scheme = one_level(QuantValue::Q8S, QuantStore::Native, 4, ScaleDtype::UE8M0);
        let layout = Layout::new(&scheme, &[8]).unwrap();
        // α = 381 and 95.25 give s_raw = 381/127 = 3.0 and 0.75, ties between powers of two.
        let x = [381.0, 1.0, -2.0, 3.0, -95.25, 0.5, 0.0, 1.0];
        let opts = QuantizeOptions {
            scale_rounding: ScaleRounding::Nearest,
            ..Default::default()
        };
        let mut w = Words::new(&layout);
        let scales = quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
        assert_eq!(scales.stored, [4.0, 1.0]);
    }

    /// Not a test: one-pass schemes on 16 Mi values, one thread: the whole call, and the
    /// one-pass kernel alone on one 64 KiB piece in cache (packing included), for A/B runs
    /// (`cargo test --release -p blockquant-core -- --ignored --nocapture time_one_pass`;
    /// `BQ_TIME_CASE=int8` keeps the cases whose name holds it).
    #[test]
    #[ignore]
    fn time_one_pass() {
        crate::pool::set_num_threads(1);
        let n = 1usize << 24;
        let x = timing_data(n);
        let opts = QuantizeOptions::default();
        let mx = QuantizeOptions {
            scale_rounding: crate::scale::ScaleRounding::Mx,
            ..QuantizeOptions::default()
        };
        let cases = [
            (
                "block32 int8",
                one_level(QuantValue::Q8S, QuantStore::Native, 32, ScaleDtype::F16),
                opts,
            ),
            (
                "block32 int4 u32",
                one_level(
                    QuantValue::Q4S,
                    QuantStore::PackedU32(0),
                    32,
                    ScaleDtype::F16,
                ),
                opts,
            ),
            (
                "mxfp8",
                one_level(QuantValue::E4M3, QuantStore::Native, 32, ScaleDtype::UE8M0),
                mx,
            ),
            (
                "mxfp4",
                one_level(
                    QuantValue::E2M1,
                    QuantStore::PackedNative(0),
                    32,
                    ScaleDtype::UE8M0,
                ),
                mx,
            ),
        ];
        let only = std::env::var("BQ_TIME_CASE").unwrap_or_default();
        for (name, scheme, opts) in cases {
            if !name.contains(only.as_str()) {
                continue;
            }
            let layout = Layout::new(&scheme, &[n / 4096, 4096]).unwrap();
            let mut w = Words::new(&layout);
            let mut stored = vec![0.0; layout.num_scales];
            let small = Layout::new(&scheme, &[PIECE / 4096, 4096]).unwrap();
            let mut ws = Words::new(&small);
            let mut ss = vec![0.0; small.num_scales];
            let mut best = [f64::MAX; 2];
            for _ in 0..40 {
                let t = std::time::Instant::now();
                quantize_into(
                    Input::F32(&x),
                    &layout,
                    &opts,
                    None,
                    w.as_mut(),
                    &mut stored,
                )
                .unwrap();
                best[0] = best[0].min(t.elapsed().as_secs_f64() * 1e3);
                let t = std::time::Instant::now();
                for _ in 0..n / PIECE {
                    quantize_fused(Input::F32(&x[..PIECE]), &small, &opts, ws.as_mut(), &mut ss)
                        .unwrap();
                }
                best[1] = best[1].min(t.elapsed().as_secs_f64() * 1e3);
            }
            println!(
                "{name} 16 Mi: whole {:.2} ms; in cache {:.2} ms",
                best[0], best[1]
            );
        }
    }
}
