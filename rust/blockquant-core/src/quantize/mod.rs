//! Quantize and dequantize (format.md "Calibration" to "Dequantizing"): scales from α, then every value against its block's
//! stored (or effective) scale, written straight into the caller's storage.
//!
//! This file is the dispatcher: it picks a path (one pass or two, given scales, per tensor,
//! two-level) and the kernel for it from `crate::kernels`, which never import it back. The
//! scales live in `scales`, the two-pass encode in `encode`.

use rayon::prelude::*;

use crate::alloc::{try_par_collect, try_zeroed};
use crate::calibrate::{amplitudes, run_amplitude, Calibration, MIN_TASK_ELEMS};
use crate::codec::{
    encode_run, minifloat, E2M1Code, Encode, FloatCode, IntHalfAway, IntHalfEven, Rounding,
};
use crate::error::{QuantError, Result};
use crate::input::Input;
use crate::kernels::piece::{
    block_run, first_non_finite, fused_pieces, pieces, streams, FusedKernel, Piece,
};
use crate::kernels::with_codec::with_codec;
use crate::layout::Layout;
use crate::lookup::LookupCode;
use crate::pack::fields::pack_last_axis;
use crate::pack::storage::{Segments, StorageMut};
use crate::pool;
use crate::scale::{check_scales, derived_global, stored_scale, to_block, ScaleRounding};
use crate::scheme::{QuantScheme, QuantValue, ScaleDtype};

mod dequantize;
pub(crate) mod encode;
pub(crate) mod scales;

pub use crate::options::QuantizeOptions;
pub use crate::scale::effective_scale;
pub use dequantize::{dequantize, Output};
use encode::check_rounding;
pub use encode::encode_values;
use scales::{check_given, check_global, round_given};
pub use scales::{check_stored, effective_scales, ExplicitScales, Scales};

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
        let mut stored = try_zeroed(given.len())?;
        round_given(dtype, mode, given, &mut stored);
        // A two-level scheme without its per-tensor scale is reported by `from_stored`.
        return Scales::from_stored(layout, stored, ex.global);
    }
    if opts.calibration == Calibration::Mse {
        return crate::search::mse_scales(x, None, layout, opts, ex.global);
    }

    let half_range = scheme.half_range();
    let emax = scheme.mx_emax();
    let alpha = amplitudes(x, layout, opts.calibration)?;
    // One pass from α to the stored scale: s_raw = α / half_range, then the dtype's rounding,
    // where `to_block` maps s_raw to the block dtype's units (two-level: ÷ g).
    let round_all = |to_block: fn(f32, f32) -> f32, g: f32| -> Result<Vec<f32>> {
        try_par_collect(
            alpha
                .par_iter()
                .with_min_len(MIN_TASK_ELEMS)
                .map(|&a| stored_scale(a, half_range, dtype, mode, emax, |s| to_block(s, g))),
        )
    };
    if !scheme.is_two_level() {
        return Ok(Scales::new(round_all(|s, _| s, 1.0)?, None));
    }
    let g = ex
        .global
        .unwrap_or_else(|| derived_global(&alpha, half_range, dtype));
    let stored = round_all(to_block, g)?;
    Ok(Scales::new(stored, Some(g)))
}

/// The checks of a quantize call that read no value of its arguments, in the order
/// `blockquant.reference` makes them, so that a call with several faults fails on the same one
/// in both: the scale rounding against the scale dtype, a codebook's tie rule, the scheme
/// against the tensor's shape, then a per-tensor scale given to a one-level scheme, or missing
/// beside a two-level scheme's block scales. (Before them come the option names and the
/// input's dtype; after them the values of g, the weights and the scales, then the data.)
/// Returns the call's layout.
pub fn check_call(
    scheme: &QuantScheme,
    shape: &[usize],
    opts: &QuantizeOptions,
    has_scales: bool,
    has_global: bool,
) -> Result<Layout> {
    scheme.scale_dtype().check_rounding(opts.scale_rounding)?;
    check_rounding(scheme, opts.rounding)?;
    if scheme.is_affine() {
        crate::affine::check_options(scheme, opts)?;
    }
    let layout = Layout::new(scheme, shape)?;
    if has_scales && scheme.is_affine() {
        return Err(crate::affine::given_scales_refused(scheme));
    }
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
        let mut stored = try_zeroed(layout.num_scales)?;
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
            let g =
                crate::kernels::nvfp4_avx2::quantize_nvfp4(x, layout, opts, global, words, scales)?;
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
        StorageMut::U8(words) if crate::kernels::nvfp4_avx2::applies_given(layout) => {
            let g = global.unwrap_or(1.0);
            if crate::kernels::nvfp4_avx2::given_pieces(x, layout, scales, g, words)? {
                return Err(first_non_finite(x));
            }
            Ok(())
        }
        out => match global {
            Some(g) => encode_values(x, layout, &effective_scales(scales, g)?, opts.rounding, out),
            None => encode_values(x, layout, scales, opts.rounding, out),
        },
    }
}

/// The options' checks against the scheme, before anything is written.
fn check_options(layout: &Layout, opts: &QuantizeOptions) -> Result<()> {
    if layout.scheme.is_affine() {
        return Err(QuantError::Scheme(format!(
            "an affine scheme is quantized by affine::quantize, got {}",
            layout.scheme
        )));
    }
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
    calibrating(explicit) && crate::kernels::fused_tiles::applies(layout, opts.calibration)
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
        && crate::kernels::nvfp4_avx2::applies(layout)
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
    encode_values(x, layout, scales.effective()?, opts.rounding, out)?;
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
        crate::simd::x86_runs::encode_run_recip_in_range::<C, true>(codec, xs, e, out, stream);
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
    return m == 16 || m == 32 || crate::kernels::fused_narrow::narrow(m);
    #[cfg(not(target_arch = "x86_64"))]
    false
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
    let pieces = pieces(layout)?;
    if crate::kernels::nvfp4_avx2::amplitudes(x, m, &pieces, stored)? > f32::MAX.to_bits() {
        return Err(first_non_finite(x));
    }
    let k = FusedKernel::new(layout, opts, false);
    let g = global.unwrap_or_else(|| derived_global(stored, k.half_range, k.dtype));
    let bad = with_codec!(&layout.scheme, opts.rounding, |codec| {
        let encode = |_: &Piece, xs: &[f32], sc: &mut [f32], codes: &mut [u8]| {
            // SAFETY (both): the caller checked the CPU has AVX2 and F16C.
            if m == 16 || m == 32 {
                unsafe {
                    crate::kernels::fused_avx2::two_level_piece(codec, &k, g, m, xs, sc, codes)
                }
            } else {
                unsafe {
                    crate::kernels::fused_narrow::two_level_piece(codec, &k, g, m, xs, sc, codes)
                }
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
    })?;
    if bad {
        return Err(first_non_finite(x));
    }
    Ok(g)
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
                && crate::kernels::nvfp4_avx2::applies_one_level(layout, opts.calibration) =>
        {
            let k = FusedKernel::new(layout, opts, streams(layout));
            fused_pieces(x, &pieces(layout)?, stored, words, |_, xs, sc, w, _| {
                // SAFETY: `applies_one_level` checked the CPU has AVX2 and F16C.
                unsafe { crate::kernels::nvfp4_avx2::one_level_piece(&k, xs, sc, w) }
            })
        }
        out => with_codec!(&layout.scheme, opts.rounding, |codec| {
            if layout.rows_map_directly() {
                fused_with(codec, x, layout, opts, out, stored)
            } else {
                let k = FusedKernel::new(layout, opts, streams(layout));
                crate::kernels::fused_tiles::quantize_tiles(codec, x, &k, out, stored, avx2())
            }
        }),
    }?;
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
) -> Result<bool> {
    assert_eq!(stored.len(), layout.num_scales);
    let pieces = pieces(layout)?;
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
        use crate::kernels::fused_avx2::{blocks_of, measure_encode_blocks, measure_encode_rows};
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
    use crate::simd::x86_runs;
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
        bad |= x86_runs::encode_run_or_zero(codec, run, e, o, k.stream);
    }
    bad
}

/// How far ahead of the block being quantized its input is asked for, in values: on one
/// thread the hardware prefetcher alone leaves the kernel waiting on memory.
const PREFETCH_AHEAD: usize = 2048;

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
pub(crate) mod tests;
