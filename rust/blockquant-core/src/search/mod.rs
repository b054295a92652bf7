//! Searched scales, calibration `mse` (format.md "Searched scales: `mse`"): per block, the stored scale that minimizes
//! the block's (weighted) squared error among a fixed set of candidates around the minmax scale.
//!
//! The search is a definition, reproduced bit for bit by `blockquant.reference`:
//! - candidates are stored scales (already rounded to the scale dtype, two-level: block scales
//!   under g), in a fixed order whose first entry is minmax's own scale;
//! - a candidate of effective scale e has error e²·S, S = Σ w·(u − q(u))², u = x · r with
//!   r = 1 / e the f32 reciprocal, and q(u) the value u quantizes to: the squared error in units
//!   of e, so f32 suffices (u stays within a few times the value range). The terms and the sum
//!   within a chunk are f32, the rest f64. A scale whose reciprocal overflows (e = 0, which
//!   would zero the block, or e ≤ 2^-128) is +inf. The multiply, not quantize's division: the
//!   quotient is within an ulp of x / e, which moves an error by far less than the candidates'
//!   spacing, and the search's inner loop runs about a fifth faster without the divider;
//! - S runs over the block in row-major in-block order, cut into chunks of [`CHUNK`] elements:
//!   within a chunk element i adds into lane i % 8, the lanes combine as
//!   ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), and the chunk sums add up (f64) in chunk order;
//! - the first candidate of smallest error wins.
//!
//! Nothing depends on the thread count: blocks are independent, and a per-tensor scale's chunks
//! are summed in chunk order whichever thread measured them.
//!
//! Where the code is: this file walks blocks one at a time (any layout) and, for `quantize`,
//! hands blocks of 16 or 32 values laid end to end to `lanes.rs` (eight blocks in
//! AVX2 lanes, encoded in the same pass); candidates are in `cands.rs`, q(u) per value
//! kind in `values.rs`, the one-block AVX2 sums in `avx2.rs`.

use rayon::prelude::*;

use crate::alloc::{try_par_collect, try_zeroed};
use crate::calibrate::{amplitudes, Calibration, MIN_TASK_ELEMS};
use crate::error::{QuantError, Result};
use crate::input::Input;
use crate::layout::Layout;
use crate::options::QuantizeOptions;
use crate::pack::storage::StorageMut;
use crate::quantize::encode::encode_values;
use crate::quantize::scales::{ExplicitScales, Scales};
use crate::scheme::QuantValue;
use crate::search::cands::Ctx;
pub use crate::search::cands::{divisors, MAX_CANDIDATES};
use crate::search::values::{reciprocal, with_dequant, Dequant};
use crate::simd::avx2_dispatch;

// The search's vocabulary (candidates, what each value type quantizes to), then its kernels.
#[cfg(target_arch = "x86_64")]
mod avx2;
pub(crate) mod cands;
#[cfg(target_arch = "x86_64")]
mod lanes;
pub(crate) mod values;

/// Elements per error chunk (part of the definition: the reference cuts blocks the same way).
pub const CHUNK: usize = 1 << 16;

/// (u − q(u))² of one element, u = x · r.
#[inline(always)]
fn term<Q: Dequant>(q: Q, x: f32, r: f32) -> f32 {
    let u = x * r;
    let t = u - q.qv(u);
    t * t
}

/// Σ w·(u − q(u))² over one chunk (≤ CHUNK elements) in f32, element i into lane i % 8.
#[inline(always)]
fn portable_lanes<Q: Dequant>(q: Q, xs: &[f32], ws: Option<&[f32]>, r: f32) -> [f32; 8] {
    let mut lanes = [0.0f32; 8];
    match ws {
        None => {
            let mut cx = xs.chunks_exact(8);
            for c in &mut cx {
                for i in 0..8 {
                    lanes[i] += term(q, c[i], r);
                }
            }
            for (i, &x) in cx.remainder().iter().enumerate() {
                lanes[i] += term(q, x, r);
            }
        }
        Some(ws) => {
            let mut cx = xs.chunks_exact(8);
            let mut cw = ws.chunks_exact(8);
            for (c, w) in (&mut cx).zip(&mut cw) {
                for i in 0..8 {
                    lanes[i] += w[i] * term(q, c[i], r);
                }
            }
            for (i, (&x, &w)) in cx.remainder().iter().zip(cw.remainder()).enumerate() {
                lanes[i] += w * term(q, x, r);
            }
        }
    }
    lanes
}

/// Lanes combined pairwise.
#[inline(always)]
fn combine(l: &[f32; 8]) -> f32 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// For each effective scale `eff[j]`, the chunk's combined lanes into `sums[j]` (meaningless
/// where the reciprocal overflows: that error is +inf whatever the sum). The AVX2 kernel where
/// the CPU has it.
#[inline(always)]
fn chunk_sums<Q: Dequant>(q: Q, xs: &[f32], ws: Option<&[f32]>, eff: &[f32], sums: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2() {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { crate::search::avx2::chunk_sums(q, xs, ws, eff, sums) };
        }
    }
    chunk_sums_portable(q, xs, ws, eff, sums)
}

/// [`chunk_sums`] for a caller compiled with AVX2 (the block search's `avx2` build): the kernel
/// inlined. Elsewhere the dispatching [`chunk_sums`].
#[inline(always)]
fn block_sums<Q: Dequant>(q: Q, xs: &[f32], ws: Option<&[f32]>, eff: &[f32], sums: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx2() {
            // SAFETY: the CPU supports AVX2, checked just above; called only from the block
            // search, whose AVX2 build inlines the kernel (its portable build never runs on an
            // AVX2 CPU).
            return unsafe { crate::search::avx2::chunk_sums_inline(q, xs, ws, eff, sums) };
        }
    }
    chunk_sums_portable(q, xs, ws, eff, sums)
}

/// [`chunk_sums`] one candidate at a time, straight loops (also the tests' yardstick).
fn chunk_sums_portable<Q: Dequant>(
    q: Q,
    xs: &[f32],
    ws: Option<&[f32]>,
    eff: &[f32],
    sums: &mut [f32],
) {
    for (s, &e) in sums.iter_mut().zip(eff) {
        let r = reciprocal(e);
        *s = if r.is_infinite() {
            0.0
        } else {
            combine(&portable_lanes(q, xs, ws, r))
        };
    }
}

/// A candidate's error from its summed chunks: e² · S in f64; +inf where the reciprocal
/// overflows (a zero scale, which would zero the whole block, or one of 2^-128 or less).
#[inline(always)]
fn error(e: f32, sum: f64) -> f64 {
    if reciprocal(e).is_infinite() {
        f64::INFINITY
    } else {
        (e as f64 * e as f64) * sum
    }
}

/// The candidate of least error, the first of equals (all +inf: the first). The errors first
/// (a loop that vectorizes), then a pass that selects rather than branches: which candidate wins
/// is unpredictable.
#[inline(always)]
fn pick(cand: &[f32], eff: &[f32], sums: &[f64]) -> f32 {
    let mut err = [0.0f64; MAX_CANDIDATES];
    for ((r, &e), &s) in err.iter_mut().zip(eff).zip(sums) {
        *r = error(e, s);
    }
    let mut best = cand[0];
    let mut best_err = err[0];
    for k in 1..cand.len() {
        let better = err[k] < best_err;
        best = if better { cand[k] } else { best };
        best_err = if better { err[k] } else { best_err };
    }
    best
}

/// Calls `f(start, len)` for each run of block `b`'s elements, in row-major in-block order:
/// the block's columns on the last axis, in each tensor row its grid row spans (the walk
/// calibration uses).
fn block_runs(layout: &Layout, b: usize, mut f: impl FnMut(usize, usize)) {
    if layout.per_tensor {
        f(0, layout.num_elements);
        return;
    }
    let last = layout.rank() - 1;
    let c0 = b % layout.grid[last] * layout.block[last];
    let len = (c0 + layout.block[last]).min(layout.dims[last]) - c0;
    let n = layout.row_len();
    crate::calibrate::for_each_row_in_grid_row(layout, b / layout.grid[last], |row| {
        f(row * n + c0, len)
    });
}

/// Reusable buffers of one worker.
#[derive(Default)]
pub(crate) struct Bufs {
    conv: Vec<f32>,
    xs: Vec<f32>,
    ws: Vec<f32>,
}

avx2_dispatch! {
    /// The searched stored scale of block `b` (candidates computed in the AVX2 build too).
    #[allow(clippy::too_many_arguments)]
    fn search_block[Q: Dequant](
        q: Q,
        ctx: &Ctx,
        x: Input<'_>,
        weights: Option<&[f32]>,
        layout: &Layout,
        b: usize,
        alpha: f32,
        bufs: &mut Bufs,
    ) -> f32 => search_block_portable;
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn search_block_portable<Q: Dequant>(
    q: Q,
    ctx: &Ctx,
    x: Input<'_>,
    weights: Option<&[f32]>,
    layout: &Layout,
    b: usize,
    alpha: f32,
    bufs: &mut Bufs,
) -> f32 {
    let mut cand = [0.0f32; MAX_CANDIDATES];
    let k = ctx.candidates(alpha, &mut cand);
    if k == 1 {
        return cand[0];
    }
    let mut eff = [0.0f32; MAX_CANDIDATES];
    for (e, &s) in eff.iter_mut().zip(&cand[..k]) {
        *e = ctx.effective(s);
    }
    // The block's elements (and weights) in in-block order: one run of a row for 1-D blocks
    // (borrowed for f32 input), else gathered.
    let Bufs { conv, xs, ws } = bufs;
    xs.clear();
    ws.clear();
    let (bx, bw): (&[f32], Option<&[f32]>) = match layout.rows_map_directly() {
        true => {
            let (n, bc, gc) = (layout.row_len(), layout.block_cols(), layout.grid_cols());
            let c0 = (b % gc) * bc;
            let (start, len) = ((b / gc) * n + c0, bc.min(n - c0));
            (
                x.read(start, len, conv),
                weights.map(|w| &w[start..start + len]),
            )
        }
        false => {
            block_runs(layout, b, |start, len| {
                xs.extend_from_slice(x.read(start, len, conv));
                if let Some(w) = weights {
                    ws.extend_from_slice(&w[start..start + len]);
                }
            });
            (&xs[..], weights.map(|_| &ws[..]))
        }
    };
    let mut total = [0.0f64; MAX_CANDIDATES];
    let mut sums = [0.0f32; MAX_CANDIDATES];
    if bx.len() <= CHUNK {
        // One chunk (every block but huge ones): its sums are the totals.
        block_sums(q, bx, bw, &eff[..k], &mut sums[..k]);
        for (t, &s) in total.iter_mut().zip(&sums) {
            *t = s as f64;
        }
        return pick(&cand[..k], &eff[..k], &total[..k]);
    }
    for (ci, cx) in bx.chunks(CHUNK).enumerate() {
        let cw = bw.map(|w| &w[ci * CHUNK..ci * CHUNK + cx.len()]);
        chunk_sums(q, cx, cw, &eff[..k], &mut sums[..k]);
        for (t, &s) in total.iter_mut().zip(&sums[..k]) {
            *t += s as f64;
        }
    }
    pick(&cand[..k], &eff[..k], &total[..k])
}

/// A per-tensor scheme's one block: chunks measured in parallel, summed in chunk order.
fn search_tensor<Q: Dequant>(
    q: Q,
    ctx: &Ctx,
    x: Input<'_>,
    weights: Option<&[f32]>,
    alpha: f32,
) -> Result<f32> {
    let mut cand = [0.0f32; MAX_CANDIDATES];
    let k = ctx.candidates(alpha, &mut cand);
    if k == 1 || x.is_empty() {
        return Ok(cand[0]);
    }
    let eff: Vec<f32> = cand[..k].iter().map(|&s| ctx.effective(s)).collect();
    let n = x.len();
    // One entry a chunk; `buf`, a chunk's converted values, is bounded by CHUNK.
    let parts: Vec<[f32; MAX_CANDIDATES]> = try_par_collect(
        (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map_init(Vec::new, |buf, c| {
                let start = c * CHUNK;
                let len = CHUNK.min(n - start);
                let mut part = [0.0f32; MAX_CANDIDATES];
                let cw = weights.map(|w| &w[start..start + len]);
                chunk_sums(q, x.read(start, len, buf), cw, &eff, &mut part[..k]);
                part
            }),
    )?;
    // Chunk sums in chunk order, whichever thread measured them.
    let mut total = [0.0f64; MAX_CANDIDATES];
    for p in &parts {
        for (t, &v) in total.iter_mut().zip(&p[..k]) {
            *t += v as f64;
        }
    }
    Ok(pick(&cand[..k], &eff, &total[..k]))
}

/// The searched scales of `x` (format.md "Searched scales: `mse`"): the stored grid, and g for a two-level scheme (the
/// caller's, else derived from the minmax raw scales as format.md "Two-level schemes" does). `weights`, if given, has
/// one finite value ≥ 0 per element ([`check_weights`]).
pub fn mse_scales(
    x: Input<'_>,
    weights: Option<&[f32]>,
    layout: &Layout,
    opts: &QuantizeOptions,
    given_global: Option<f32>,
) -> Result<Scales> {
    let scheme = &layout.scheme;
    let alpha = amplitudes(x, layout, Calibration::MinMax)?;
    // g as the one-pass path (`quantize_searched`) derives it, by the same function.
    let global = scheme.is_two_level().then(|| {
        given_global.unwrap_or_else(|| {
            crate::scale::derived_global(&alpha, scheme.half_range(), scheme.scale_dtype())
        })
    });
    let ctx = Ctx::new(layout, opts.scale_rounding, global);
    #[cfg(target_arch = "x86_64")]
    if crate::search::lanes::fits(layout) {
        let stored = with_dequant!(scheme, |q| lane_scales(q, &ctx, x, weights, layout, &alpha))?;
        return Ok(Scales::new(stored, global));
    }
    let stored = with_dequant!(scheme, |q| {
        if layout.per_tensor {
            search_tensor(q, &ctx, x, weights, alpha[0]).map(|s| vec![s])
        } else {
            let per_block = layout.num_elements / layout.num_scales.max(1);
            // `bufs`: one block's values (and weights), a thread's scratch bounded by the block.
            try_par_collect(
                alpha
                    .par_iter()
                    .enumerate()
                    .with_min_len((MIN_TASK_ELEMS / per_block.max(1)).max(1))
                    .map_init(Bufs::default, |bufs, (b, &a)| {
                        search_block(q, &ctx, x, weights, layout, b, a, bufs)
                    }),
            )
        }
    })?;
    Ok(Scales::new(stored, global))
}

/// [`mse_scales`]' blocks by the lane kernel ([`crate::search::lanes`]), in parallel tasks of
/// whole groups of eight blocks (blocks are independent, so the split changes nothing).
#[cfg(target_arch = "x86_64")]
fn lane_scales<Q: Dequant>(
    q: Q,
    ctx: &Ctx,
    x: Input<'_>,
    weights: Option<&[f32]>,
    layout: &Layout,
    alpha: &[f32],
) -> Result<Vec<f32>> {
    let bc = layout.block_cols();
    let per_task = (MIN_TASK_ELEMS / bc).next_multiple_of(8);
    let mut stored = try_zeroed(layout.num_scales)?;
    stored
        .par_chunks_mut(per_task)
        .zip(alpha.par_chunks(per_task))
        .enumerate()
        .for_each_init(Vec::new, |buf, (i, (sc, a))| {
            let start = i * per_task * bc;
            let xs = x.read(start, sc.len() * bc, buf);
            let ws = weights.map(|w| &w[start..start + xs.len()]);
            // SAFETY: `fits` checked the CPU has AVX2 and F16C.
            unsafe { crate::search::lanes::search_run(q, ctx, xs, ws, a, sc) }
        });
    Ok(stored)
}

/// Whether `quantize` with calibration `mse` takes [`quantize_searched`]: blocks the lane kernel
/// takes, stored packed along the last axis (or one a byte).
pub(crate) fn searchable_in_one_pass(layout: &Layout) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::search::lanes::fits(layout) && layout.packing.axis + 1 == layout.rank()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = layout;
        false
    }
}

/// `quantize` with calibration `mse` ([`mse_scales`] + `encode_values`, the same scales and
/// codes) in one pass over memory where [`searchable_in_one_pass`]: each piece's blocks
/// measured, searched and encoded while in cache. A two-level scheme measures every block
/// first, for g.
#[cfg(target_arch = "x86_64")]
pub(crate) fn quantize_searched(
    x: Input<'_>,
    weights: Option<&[f32]>,
    layout: &Layout,
    opts: &QuantizeOptions,
    given_global: Option<f32>,
    out: StorageMut<'_>,
    stored: &mut [f32],
) -> Result<Option<f32>> {
    assert_eq!(stored.len(), layout.num_scales, "scale count");
    // What `with_codec!` names.
    use crate::codec::{minifloat, E2M1Code, FloatCode, IntHalfAway, IntHalfEven, Rounding};
    use crate::lookup::LookupCode;
    let scheme = &layout.scheme;
    // A two-level scheme's g needs only the largest amplitude, one reduction over the input
    // (none when the caller gives g): the search measures each block's own amplitude as it
    // reads the block, so no array of them is written here and read back there (the blocks'
    // maxima and the tensor's are the same |x| values, whatever the order of taking them).
    let global = scheme.is_two_level().then(|| {
        given_global.unwrap_or_else(|| {
            let top = crate::calibrate::tensor_amplitude(x, Calibration::MinMax);
            crate::scale::derived_global(&[top], scheme.half_range(), scheme.scale_dtype())
        })
    });
    let ctx = Ctx::new(layout, opts.scale_rounding, global);
    let bad = with_dequant!(scheme, |q| {
        crate::kernels::with_codec::with_codec!(scheme, opts.rounding, |codec| {
            crate::kernels::piece::encode_pieces(
                x,
                layout,
                &mut *stored,
                out,
                |p, xs, sc, codes| {
                    let ws = weights.map(|w| &w[p.start..p.start + p.len]);
                    // SAFETY: `searchable_in_one_pass` checked the CPU has AVX2 and F16C.
                    unsafe {
                        crate::search::lanes::search_encode(q, codec, &ctx, xs, ws, sc, codes)
                    }
                },
            )
        })
    })?;
    if bad {
        return Err(crate::kernels::piece::first_non_finite(x));
    }
    Ok(global)
}

/// Weights are one finite value ≥ 0 per element.
pub fn check_weights(weights: &[f32], n: usize) -> Result<()> {
    if weights.len() != n {
        return Err(QuantError::Option(format!(
            "weights must have one value per element ({n}), got {}",
            weights.len()
        )));
    }
    if let Some((i, w)) = weights
        .iter()
        .enumerate()
        .find(|(_, w)| !(w.is_finite() && **w >= 0.0))
    {
        return Err(QuantError::Option(format!(
            "weights must be finite and >= 0, got {} at flat index {i}",
            crate::error::python_float(*w)
        )));
    }
    Ok(())
}

/// `quantize` with per-element importance weights for the `mse` search (`bq.quantize(x, s,
/// calibration="mse", weights=w)`). Weights need `mse` and no explicit block scales: any other
/// calibration ignores them, so they are an error there rather than silently unused.
pub fn quantize_weighted(
    x: Input<'_>,
    weights: &[f32],
    layout: &Layout,
    opts: &QuantizeOptions,
    explicit: Option<ExplicitScales<'_>>,
    out: StorageMut<'_>,
) -> Result<Scales> {
    crate::pool::install_sized(layout.num_elements, || {
        let ex = explicit.unwrap_or_default();
        if opts.calibration != Calibration::Mse || ex.scales.is_some() {
            return Err(QuantError::Option(
                "weights= weighs the error of calibration='mse' and takes no explicit scales"
                    .into(),
            ));
        }
        check_weights(weights, x.len())?;
        // The same checks as an unweighted call, from the same code.
        let scheme = &layout.scheme;
        scheme.scale_dtype().check_rounding(opts.scale_rounding)?;
        match (ex.global, scheme.is_two_level()) {
            (Some(_), false) => {
                return Err(QuantError::UnexpectedGlobalScale {
                    scheme: scheme.to_string(),
                })
            }
            (Some(g), true) => crate::scale::check_scales(&[g], "the per-tensor scale")?,
            (None, _) => {}
        }
        #[cfg(target_arch = "x86_64")]
        if searchable_in_one_pass(layout) {
            let mut stored = try_zeroed(layout.num_scales)?;
            let g = quantize_searched(x, Some(weights), layout, opts, ex.global, out, &mut stored)?;
            return Ok(Scales::new(stored, g));
        }
        let scales = mse_scales(x, Some(weights), layout, opts, ex.global)?;
        encode_values(x, layout, scales.effective()?, opts.rounding, out)?;
        Ok(scales)
    })
}

#[cfg(test)]
mod tests;
