//! Searched scales, calibration `mse` (SPEC §3a): per block, the stored scale that minimizes
//! the block's (weighted) squared error among a fixed set of candidates around the minmax scale.
//!
//! The search is a definition, reproduced bit for bit by `blockquant.reference`:
//! - candidates are stored scales (already rounded to the scale dtype, two-level: block scales
//!   under g), in a fixed order whose first entry is minmax's own scale;
//! - a candidate of effective scale e ≠ 0 has error e²·S, S = Σ w·(u − q(u))², u = x / e the
//!   f32 division quantize does and q(u) the value it quantizes to: the squared error in units
//!   of e, so f32 suffices (u stays within a few times the value range). The terms and the sum
//!   within a chunk are f32, the rest f64. A zero scale (it would zero the block) is +inf;
//! - S runs over the block in row-major in-block order, cut into chunks of [`CHUNK`] elements:
//!   within a chunk element i adds into lane i % 8, the lanes combine as
//!   ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), and the chunk sums add up (f64) in chunk order;
//! - the first candidate of smallest error wins.
//!
//! Nothing depends on the thread count: blocks are independent, and a per-tensor scale's chunks
//! are summed in chunk order whichever thread measured them.

use rayon::prelude::*;

use crate::calibrate::{amplitudes, Calibration, MIN_TASK_ELEMS};
use crate::codec::{minifloat, Rounding};
use crate::error::{QuantError, Result};
use crate::input::Input;
use crate::layout::Layout;
use crate::pack::StorageMut;
use crate::quantize::{effective_scale, encode_values, ExplicitScales, QuantizeOptions, Scales};
use crate::scale::{mx_scale_code, ScaleRounding};
use crate::scheme::{QuantValue, ScaleDtype};
use crate::simd::avx2_dispatch;

/// Elements per error chunk (part of the definition: the reference cuts blocks the same way).
pub const CHUNK: usize = 1 << 16;

/// The most candidates any value type has.
pub const MAX_CANDIDATES: usize = 11;

/// The divisors c of a value type's candidates, in search order: candidate k is the raw scale
/// α / (half_range · c_k), so the block's largest |x| lands at c_k times the half range. The
/// first is 1 (minmax itself, which therefore wins ties); the spacing is finer where the value
/// grid is finer. All are exact in f32, and so is half_range · c.
pub fn divisors(value: QuantValue) -> &'static [f32] {
    match value.bits() {
        8 => &[1.0, 62.0 / 64.0, 63.0 / 64.0, 65.0 / 64.0, 66.0 / 64.0],
        4 => &[
            1.0,
            27.0 / 32.0,
            28.0 / 32.0,
            29.0 / 32.0,
            30.0 / 32.0,
            31.0 / 32.0,
            33.0 / 32.0,
            34.0 / 32.0,
            35.0 / 32.0,
            36.0 / 32.0,
            37.0 / 32.0,
        ],
        // Ternary and 2-bit grids are coarse: the best scale sits well inside the range.
        _ => &[1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0],
    }
}

/// What the candidates of a block depend on, besides its amplitude.
#[derive(Debug, Clone, Copy)]
struct Ctx {
    value: QuantValue,
    dtype: ScaleDtype,
    mode: ScaleRounding,
    half_range: f32,
    emax: i32,
    /// Two-level: the per-tensor scale g.
    global: Option<f32>,
}

impl Ctx {
    fn new(layout: &Layout, mode: ScaleRounding, global: Option<f32>) -> Self {
        let value = layout.scheme.value;
        Self {
            value,
            dtype: layout.scheme.scale_dtype(),
            mode,
            half_range: value.half_range(),
            emax: value.mx_emax(),
            global,
        }
    }

    /// The candidate stored scales of a block of amplitude `alpha`, in search order, with
    /// repeats dropped (a repeat has the same error, and the first of equals wins anyway).
    /// UE8M0 (powers of two) takes the scale minmax would store and its two neighbours
    /// (×½ first, then ×2); every other dtype the divisors' raw scales, each rounded.
    fn candidates(&self, alpha: f32, out: &mut [f32; MAX_CANDIDATES]) -> usize {
        let mut n = 0;
        let mut push = |s: f32, out: &mut [f32; MAX_CANDIDATES]| {
            if !out[..n].iter().any(|&c| c.to_bits() == s.to_bits()) {
                out[n] = s;
                n += 1;
            }
        };
        if self.dtype == ScaleDtype::UE8M0 {
            // One-level only (a two-level block dtype is F16 or UE4M3).
            let base = match self.mode {
                ScaleRounding::Mx => mx_scale_code(alpha, self.emax),
                _ => self.dtype.round_code(alpha / self.half_range, self.mode),
            } as i32;
            for code in [base, base - 1, base + 1] {
                if (0..=254).contains(&code) {
                    push(self.dtype.decode_code(code as u32), out);
                }
            }
            return n;
        }
        for &c in divisors(self.value) {
            let raw = alpha / (self.half_range * c);
            let block = match self.global {
                None => raw,
                // As compute_scales: g = 0 leaves nothing to normalize by.
                Some(0.0) => 0.0,
                Some(g) => raw / g,
            };
            push(self.dtype.round(block, self.mode), out);
        }
        n
    }

    /// What values are divided by under stored scale `s`.
    #[inline]
    fn effective(&self, s: f32) -> f32 {
        match self.global {
            Some(g) => effective_scale(s, g),
            None => s,
        }
    }
}

/// The value a scaled input quantizes to, as f32: the code, decoded. Written without tables or
/// branches so the error loop vectorizes; tests hold each equal to decode(encode(u)).
trait Dequant: Copy + Send + Sync {
    fn qv(&self, u: f32) -> f32;
}

/// Integer values, half away from zero: `round` of the clamped value (the codec's integer).
#[derive(Clone, Copy)]
struct IntAwayQ {
    qmin: f32,
    qmax: f32,
}

impl Dequant for IntAwayQ {
    #[inline(always)]
    fn qv(&self, u: f32) -> f32 {
        clamp(u, self.qmin, self.qmax).round()
    }
}

/// Integer values, half to even.
#[derive(Clone, Copy)]
struct IntEvenQ {
    qmin: f32,
    qmax: f32,
}

impl Dequant for IntEvenQ {
    #[inline(always)]
    fn qv(&self, u: f32) -> f32 {
        clamp(u, self.qmin, self.qmax).round_ties_even()
    }
}

/// As the codec's clamp: plain comparisons, a NaN becomes `lo`.
#[inline(always)]
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    let v = if v >= lo { v } else { lo };
    if v <= hi {
        v
    } else {
        hi
    }
}

/// E2M1: the thresholds of [`crate::codec::E2M1Code`], each adding the step to the next magnitude.
#[derive(Clone, Copy)]
struct E2M1Q;

impl Dequant for E2M1Q {
    #[inline(always)]
    fn qv(&self, u: f32) -> f32 {
        let a = u.abs();
        let step = |c: bool, v: f32| if c { v } else { 0.0 };
        let m = step(a > 0.25, 0.5)
            + step(a >= 0.75, 0.5)
            + step(a > 1.25, 0.5)
            + step(a >= 1.75, 0.5)
            + step(a > 2.5, 1.0)
            + step(a >= 3.5, 1.0)
            + step(a > 5.0, 2.0);
        f32::from_bits(m.to_bits() | (u.to_bits() & 0x8000_0000))
    }
}

/// E4M3 / E5M2: round the f32 mantissa to the format's bits (ties to even) in its normal range,
/// add-and-subtract a power of two in its subnormal range, saturate at the largest value.
#[derive(Clone, Copy)]
struct MiniQ {
    /// 23 - mantissa bits.
    shift: u32,
    /// 2^emin, the smallest normal.
    min_normal: f32,
    /// 2^(emin - mbits + 23): adding it rounds to the subnormal quantum.
    magic: f32,
    max: f32,
}

impl MiniQ {
    fn new(value: QuantValue) -> Self {
        let fmt = minifloat(value).expect("a float value");
        let emin = 1 - fmt.bias;
        Self {
            shift: 23 - fmt.man_bits,
            min_normal: crate::minifloat::exp2i(emin),
            magic: crate::minifloat::exp2i(emin - fmt.man_bits as i32 + 23),
            max: fmt.max_value(),
        }
    }
}

impl Dequant for MiniQ {
    #[inline(always)]
    fn qv(&self, u: f32) -> f32 {
        let a = u.abs();
        let b = a.to_bits();
        let half = (1u32 << (self.shift - 1)) - 1;
        let normal = f32::from_bits(
            (b.wrapping_add(half + ((b >> self.shift) & 1))) & !((1u32 << self.shift) - 1),
        );
        let sub = (a + self.magic) - self.magic;
        let m = if a < self.min_normal { sub } else { normal };
        let m = if m < self.max { m } else { self.max };
        f32::from_bits(m.to_bits() | (u.to_bits() & 0x8000_0000))
    }
}

/// Runs `$body` with `$q` bound to the [`Dequant`] of `$value` under `$rounding`.
macro_rules! with_dequant {
    ($value:expr, $rounding:expr, |$q:ident| $body:expr) => {{
        let value: QuantValue = $value;
        let (qmin, qmax) = value.range();
        match value {
            QuantValue::E2M1 => {
                let $q = E2M1Q;
                $body
            }
            QuantValue::E4M3 | QuantValue::E5M2 => {
                let $q = MiniQ::new(value);
                $body
            }
            _ => match $rounding {
                Rounding::HalfAway => {
                    let $q = IntAwayQ { qmin, qmax };
                    $body
                }
                Rounding::HalfEven => {
                    let $q = IntEvenQ { qmin, qmax };
                    $body
                }
            },
        }
    }};
}

/// Σ w·(u - q(u))² over one chunk (≤ CHUNK elements), u = x / e, in f32: element i adds into
/// lane i % 8, lanes combine pairwise. `e` is not 0.
#[inline(always)]
fn chunk_sum<Q: Dequant>(q: Q, xs: &[f32], ws: Option<&[f32]>, e: f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let term = |x: f32| {
        let u = x / e;
        let t = u - q.qv(u);
        t * t
    };
    match ws {
        None => {
            let mut cx = xs.chunks_exact(8);
            for c in &mut cx {
                for i in 0..8 {
                    lanes[i] += term(c[i]);
                }
            }
            for (i, &x) in cx.remainder().iter().enumerate() {
                lanes[i] += term(x);
            }
        }
        Some(ws) => {
            let mut cx = xs.chunks_exact(8);
            let mut cw = ws.chunks_exact(8);
            for (c, w) in (&mut cx).zip(&mut cw) {
                for i in 0..8 {
                    lanes[i] += w[i] * term(c[i]);
                }
            }
            for (i, (&x, &w)) in cx.remainder().iter().zip(cw.remainder()).enumerate() {
                lanes[i] += w * term(x);
            }
        }
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

avx2_dispatch! {
    /// Each candidate's chunk sum over a run that starts a chunk (≤ CHUNK long), added (as
    /// f64) to `out`; candidates of effective scale 0 are skipped (their error is +inf).
    fn chunk_errors[Q: Dequant](
        q: Q,
        xs: &[f32],
        ws: Option<&[f32]>,
        eff: &[f32],
        out: &mut [f64],
    ) => chunk_errors_portable;
}

#[inline(always)]
fn chunk_errors_portable<Q: Dequant>(
    q: Q,
    xs: &[f32],
    ws: Option<&[f32]>,
    eff: &[f32],
    out: &mut [f64],
) {
    for (o, &e) in out.iter_mut().zip(eff) {
        if e != 0.0 {
            *o += chunk_sum(q, xs, ws, e) as f64;
        }
    }
}

/// A candidate's error from its summed chunks: e² · S in f64; a zero scale (which would zero
/// the whole block) +inf.
#[inline]
fn error(e: f32, sum: f64) -> f64 {
    if e == 0.0 {
        f64::INFINITY
    } else {
        (e as f64 * e as f64) * sum
    }
}

/// The candidate of least error, the first of equals (all +inf: the first).
fn pick(cand: &[f32], eff: &[f32], sums: &[f64]) -> f32 {
    let mut best = 0;
    let mut best_err = error(eff[0], sums[0]);
    for k in 1..cand.len() {
        let err = error(eff[k], sums[k]);
        if err < best_err {
            (best, best_err) = (k, err);
        }
    }
    cand[best]
}

/// Calls `f(start, len)` for each run of block `b`'s elements, in row-major in-block order.
fn block_runs(layout: &Layout, b: usize, mut f: impl FnMut(usize, usize)) {
    let rank = layout.rank();
    let n = layout.row_len();
    if layout.per_tensor {
        f(0, layout.num_elements);
        return;
    }
    // The block's grid coordinates, then its ranges on each axis.
    let mut lo = vec![0usize; rank];
    let mut hi = vec![0usize; rank];
    let mut rem = b;
    for ax in (0..rank).rev() {
        let gi = rem % layout.grid[ax];
        rem /= layout.grid[ax];
        lo[ax] = gi * layout.block[ax];
        hi[ax] = (lo[ax] + layout.block[ax]).min(layout.dims[ax]);
    }
    let (c0, len) = (lo[rank - 1], hi[rank - 1] - lo[rank - 1]);
    let mut idx = lo[..rank - 1].to_vec();
    loop {
        let row = idx
            .iter()
            .zip(&layout.dims)
            .fold(0, |acc, (&i, &d)| acc * d + i);
        f(row * n + c0, len);
        // Odometer over the leading axes, innermost fastest.
        let mut ax = rank - 1;
        loop {
            if ax == 0 {
                return;
            }
            ax -= 1;
            idx[ax] += 1;
            if idx[ax] < hi[ax] {
                break;
            }
            idx[ax] = lo[ax];
        }
    }
}

/// Reusable buffers of one worker.
#[derive(Default)]
struct Bufs {
    conv: Vec<f32>,
    xs: Vec<f32>,
    ws: Vec<f32>,
}

/// The searched stored scale of block `b`.
#[allow(clippy::too_many_arguments)]
fn search_block<Q: Dequant>(
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
    for (ci, cx) in bx.chunks(CHUNK).enumerate() {
        let cw = bw.map(|w| &w[ci * CHUNK..ci * CHUNK + cx.len()]);
        chunk_errors(q, cx, cw, &eff[..k], &mut total[..k]);
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
) -> f32 {
    let mut cand = [0.0f32; MAX_CANDIDATES];
    let k = ctx.candidates(alpha, &mut cand);
    if k == 1 || x.is_empty() {
        return cand[0];
    }
    let eff: Vec<f32> = cand[..k].iter().map(|&s| ctx.effective(s)).collect();
    let n = x.len();
    let parts: Vec<[f64; MAX_CANDIDATES]> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map_init(Vec::new, |buf, c| {
            let start = c * CHUNK;
            let len = CHUNK.min(n - start);
            let mut part = [0.0f64; MAX_CANDIDATES];
            let cw = weights.map(|w| &w[start..start + len]);
            chunk_errors(q, x.read(start, len, buf), cw, &eff, &mut part[..k]);
            part
        })
        .collect();
    // Chunk sums in chunk order, whichever thread measured them.
    let mut total = [0.0f64; MAX_CANDIDATES];
    for p in &parts {
        for (t, &v) in total.iter_mut().zip(&p[..k]) {
            *t += v;
        }
    }
    pick(&cand[..k], &eff, &total[..k])
}

/// The searched scales of `x` (SPEC §3a): the stored grid, and g for a two-level scheme (the
/// caller's, else derived from the minmax raw scales as SPEC §5 does). `weights`, if given, has
/// one finite value ≥ 0 per element ([`check_weights`]).
pub fn mse_scales(
    x: Input<'_>,
    weights: Option<&[f32]>,
    layout: &Layout,
    opts: &QuantizeOptions,
    given_global: Option<f32>,
) -> Scales {
    let scheme = &layout.scheme;
    let alpha = amplitudes(x, layout, Calibration::MinMax);
    let global = if scheme.is_two_level() {
        let half_range = scheme.value.half_range();
        let max_raw = alpha.iter().fold(0.0f32, |m, &a| m.max(a)) / half_range;
        Some(match given_global {
            Some(g) => g,
            None if max_raw == 0.0 => 1.0,
            None => max_raw / scheme.scale_dtype().max_value(),
        })
    } else {
        None
    };
    let ctx = Ctx::new(layout, opts.scale_rounding, global);
    let stored = with_dequant!(scheme.value, opts.rounding, |q| {
        if layout.per_tensor {
            vec![search_tensor(q, &ctx, x, weights, alpha[0])]
        } else {
            let per_block = layout.num_elements / layout.num_scales.max(1);
            alpha
                .par_iter()
                .enumerate()
                .with_min_len((MIN_TASK_ELEMS / per_block.max(1)).max(1))
                .map_init(Bufs::default, |bufs, (b, &a)| {
                    search_block(q, &ctx, x, weights, layout, b, a, bufs)
                })
                .collect()
        }
    });
    Scales::new(stored, global)
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
    crate::pool::install(|| {
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
        let scales = mse_scales(x, Some(weights), layout, opts, ex.global);
        encode_values(x, layout, scales.effective(), opts.rounding, out)?;
        Ok(scales)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheme::{QuantScheme, QuantStore};

    fn layout(value: QuantValue, block: &[usize], dtype: ScaleDtype, shape: &[usize]) -> Layout {
        let s = QuantScheme::default()
            .with_value(value)
            .with_store(QuantStore::Native)
            .per_block(block, dtype)
            .unwrap();
        Layout::new(&s, shape).unwrap()
    }

    fn mse_opts() -> QuantizeOptions {
        QuantizeOptions {
            calibration: Calibration::Mse,
            ..Default::default()
        }
    }

    /// The searched scale of each block is the candidate of least error, computed here the
    /// plain way (one block at a time, straight loops), and never worse than minmax's.
    #[test]
    fn each_block_takes_its_least_error_candidate() {
        let l = layout(QuantValue::Q4S, &[8], ScaleDtype::F16, &[4, 20]);
        let x: Vec<f32> = (0..80)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13)
            .collect();
        let sc = mse_scales(Input::F32(&x), None, &l, &mse_opts(), None);
        let ctx = Ctx::new(&l, ScaleRounding::Up, None);
        for b in 0..l.num_scales {
            let (r, k) = (b / 3, b % 3);
            let xs = &x[r * 20 + k * 8..r * 20 + (k * 8 + 8).min(20)];
            let alpha = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let mut cand = [0.0; MAX_CANDIDATES];
            let n = ctx.candidates(alpha, &mut cand);
            // Blocks of at most 8: one element a lane, the lanes summed pairwise.
            let err = |e: f32| -> f64 {
                let mut l = [0.0f32; 8];
                for (i, &v) in xs.iter().enumerate() {
                    let u = v / e;
                    let t = u - u.clamp(-7.0, 7.0).round();
                    l[i] = t * t;
                }
                let s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
                (e as f64 * e as f64) * s as f64
            };
            let best = cand[..n]
                .iter()
                .fold(cand[0], |b, &c| if err(c) < err(b) { c } else { b });
            assert_eq!(sc.stored[b], best, "block {b}");
            assert!(err(sc.stored[b]) <= err(cand[0]));
        }
    }

    /// Each branch-free value function equals decoding the codec's code, over a sweep of f32s
    /// (every 4099th bit pattern up to past the largest value, and each sign), NaN aside.
    #[test]
    fn value_functions_equal_decode_of_encode() {
        use crate::codec::{float_table, E2M1Code, FloatCode};
        let check = |q: &dyn Fn(f32) -> f32, code: &dyn Fn(f32) -> f32, top: f32| {
            for sign in [0u32, 0x8000_0000] {
                let mut bits = 0u32;
                while f32::from_bits(bits) <= top {
                    let u = f32::from_bits(bits | sign);
                    assert_eq!(q(u), code(u), "{u}"); // ±0 alike: only (u - q)² counts
                    bits += 4099;
                }
                let inf = f32::from_bits(0x7F80_0000 | sign);
                assert_eq!(q(inf), code(inf));
            }
        };
        for value in [QuantValue::E4M3, QuantValue::E5M2, QuantValue::E2M1] {
            let fmt = minifloat(value).unwrap();
            let table = float_table(&fmt);
            let mq = MiniQ::new(value);
            if value == QuantValue::E2M1 {
                check(
                    &|u| E2M1Q.qv(u),
                    &|u| table[E2M1Code.encode(u) as usize],
                    10.0,
                );
            } else {
                check(
                    &|u| mq.qv(u),
                    &|u| table[FloatCode(fmt).encode(u) as usize],
                    1e6,
                );
            }
        }
        use crate::codec::{Encode, IntHalfAway, IntHalfEven};
        let (away, even) = (
            IntHalfAway {
                qmin: -8.0,
                qmax: 7.0,
            },
            IntHalfEven {
                qmin: -7.0,
                qmax: 7.0,
            },
        );
        let (aq, eq) = (
            IntAwayQ {
                qmin: -8.0,
                qmax: 7.0,
            },
            IntEvenQ {
                qmin: -7.0,
                qmax: 7.0,
            },
        );
        check(&|u| aq.qv(u), &|u| (away.encode(u) as i8) as f32, 20.0);
        check(&|u| eq.qv(u), &|u| (even.encode(u) as i8) as f32, 20.0);
    }

    #[test]
    fn ue8m0_candidates_are_the_neighbouring_powers_of_two() {
        let l = layout(QuantValue::E2M1, &[32], ScaleDtype::UE8M0, &[32]);
        let ctx = Ctx::new(&l, ScaleRounding::Mx, None);
        let mut c = [0.0; MAX_CANDIDATES];
        // α = 5: MX scale 2^(2 - 2) = 1.
        assert_eq!(ctx.candidates(5.0, &mut c), 3);
        assert_eq!(&c[..3], &[1.0, 0.5, 2.0]);
        // The smallest code has no lower neighbour.
        assert_eq!(ctx.candidates(0.0, &mut c), 2);
    }

    /// Per-tensor and large blocks are summed chunk by chunk; the result does not depend on the
    /// thread count.
    #[test]
    fn the_result_does_not_depend_on_threads() {
        let n = 3 * CHUNK + 17;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i as u64 * 2654435761 % 1000) as f32 - 500.0) * 1e-3)
            .collect();
        let w: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25).collect();
        let per_tensor = Layout::new(
            &QuantScheme::default()
                .with_value(QuantValue::Q2S)
                .with_store(QuantStore::Native),
            &[n],
        )
        .unwrap();
        let big = layout(QuantValue::E2M1, &[CHUNK + 5], ScaleDtype::F16, &[n]);
        for l in [&per_tensor, &big] {
            let one = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap()
                .install(|| mse_scales(Input::F32(&x), Some(&w), l, &mse_opts(), None));
            let three = rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap()
                .install(|| mse_scales(Input::F32(&x), Some(&w), l, &mse_opts(), None));
            assert_eq!(one, three);
        }
    }

    #[test]
    fn bad_weights_are_refused() {
        assert!(check_weights(&[1.0, 0.0], 2).is_ok());
        let e = check_weights(&[1.0, -1.0], 2).unwrap_err();
        assert_eq!(
            e.to_string(),
            "weights must be finite and >= 0, got -1 at flat index 1"
        );
        assert!(check_weights(&[f32::NAN], 1).is_err());
        assert!(check_weights(&[1.0], 2).is_err());
    }
}
