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
use crate::lookup::NearestEntry;
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

/// Rounding to F16, BF16 or UE4M3 without the generic code-space path (the search rounds
/// eleven candidates a block): the f32 bits rounded to the mantissa width (ties to even) in the
/// normal range, a power of two added and taken away in the subnormal range, saturating at the
/// largest value; `up` steps to the next value when that fell below. Equal to
/// [`ScaleDtype::round`] (tested), for finite s ≥ 0.
#[derive(Debug, Clone, Copy)]
struct FastRound {
    shift: u32,
    min_normal: f32,
    magic: f32,
    max: f32,
    /// The spacing of the subnormal values.
    sub_quantum: f32,
}

impl FastRound {
    fn new(dtype: ScaleDtype) -> Option<Self> {
        let (mbits, emin) = match dtype {
            ScaleDtype::F16 => (10, -14),
            ScaleDtype::BF16 => (7, -126),
            ScaleDtype::UE4M3 => (3, -6),
            _ => return None,
        };
        Some(Self {
            shift: 23 - mbits,
            min_normal: crate::minifloat::exp2i(emin),
            magic: crate::minifloat::exp2i(emin - mbits as i32 + 23),
            max: dtype.max_value(),
            sub_quantum: crate::minifloat::exp2i(emin - mbits as i32),
        })
    }

    /// Branch-free (both roundings computed, then chosen), so a loop of them vectorizes.
    #[inline(always)]
    fn round(&self, s: f32, up: bool) -> f32 {
        let b = s.to_bits();
        let sub = (s + self.magic) - self.magic;
        let half = (1u32 << (self.shift - 1)) - 1;
        let normal = f32::from_bits(
            b.wrapping_add(half + ((b >> self.shift) & 1)) & !((1u32 << self.shift) - 1),
        );
        let n = if s < self.min_normal { sub } else { normal };
        let n = if n < self.max { n } else { self.max };
        if !up {
            return n;
        }
        let next_sub = n + self.sub_quantum;
        let next_normal = f32::from_bits(n.to_bits().wrapping_add(1u32 << self.shift));
        let next = if n < self.min_normal {
            next_sub
        } else {
            next_normal
        };
        let next = if next < self.max { next } else { self.max };
        if n >= s {
            n
        } else {
            next
        }
    }
}

/// What the candidates of a block depend on, besides its amplitude.
#[derive(Debug, Clone, Copy)]
struct Ctx {
    /// half_range · c_k for each divisor (exact), padded with the last.
    denoms: [f32; MAX_CANDIDATES],
    n_divisors: usize,
    fast: Option<FastRound>,
    dtype: ScaleDtype,
    mode: ScaleRounding,
    half_range: f32,
    emax: i32,
    /// Two-level: the per-tensor scale g.
    global: Option<f32>,
}

impl Ctx {
    fn new(layout: &Layout, mode: ScaleRounding, global: Option<f32>) -> Self {
        let scheme = &layout.scheme;
        let divs = divisors(scheme.value);
        // A codebook's half range is max |c_k|: the product may round, the reference's too.
        let denoms = std::array::from_fn(|k| scheme.half_range() * divs[k.min(divs.len() - 1)]);
        Self {
            denoms,
            n_divisors: divs.len(),
            fast: FastRound::new(layout.scheme.scale_dtype()),
            dtype: layout.scheme.scale_dtype(),
            mode,
            half_range: scheme.half_range(),
            emax: scheme.mx_emax(),
            global,
        }
    }

    /// The candidate stored scales of a block of amplitude `alpha`, in search order, with
    /// repeats dropped (a repeat has the same error, and the first of equals wins anyway).
    /// UE8M0 (powers of two) takes the scale minmax would store and its two neighbours
    /// (×½ first, then ×2); every other dtype the divisors' raw scales, each rounded.
    #[inline(always)]
    fn candidates(&self, alpha: f32, out: &mut [f32; MAX_CANDIDATES]) -> usize {
        let mut n = 0;
        // Candidates 1.. are monotone in k, so a repeat is the one before or the first.
        let mut push = |s: f32, out: &mut [f32; MAX_CANDIDATES]| {
            let seen =
                n > 0 && (out[0].to_bits() == s.to_bits() || out[n - 1].to_bits() == s.to_bits());
            if !seen {
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
        // Every candidate's arithmetic first (independent, so the divisions overlap), then the
        // repeats dropped.
        // Every candidate's arithmetic first, over a fixed-size array (independent, so the
        // divisions overlap and the loops vectorize), then the repeats dropped.
        let mut block = [0.0f32; MAX_CANDIDATES];
        for (b, &d) in block.iter_mut().zip(&self.denoms) {
            *b = alpha / d;
        }
        match self.global {
            None => {}
            // As compute_scales: g = 0 leaves nothing to normalize by.
            Some(0.0) => block = [0.0; MAX_CANDIDATES],
            Some(g) => block.iter_mut().for_each(|b| *b /= g),
        }
        let mut stored = [0.0f32; MAX_CANDIDATES];
        match self.fast {
            Some(f) if self.mode == ScaleRounding::Up => {
                for (st, &b) in stored.iter_mut().zip(&block) {
                    *st = f.round(b, true);
                }
            }
            Some(f) => {
                for (st, &b) in stored.iter_mut().zip(&block) {
                    *st = f.round(b, false);
                }
            }
            None => {
                for (st, &b) in stored.iter_mut().zip(&block) {
                    *st = self.dtype.round(b, self.mode);
                }
            }
        }
        for &st in &stored[..self.n_divisors] {
            push(st, out);
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

    /// For each effective scale `eff[k]` (none 0), Σ w·(u − q(u))² of one chunk into the eight
    /// lanes `out[k]`; value types with an AVX2 loop override it.
    #[inline(always)]
    fn lanes(&self, xs: &[f32], ws: Option<&[f32]>, eff: &[f32], out: &mut [[f32; 8]]) {
        for (o, &e) in out.iter_mut().zip(eff) {
            *o = portable_lanes(*self, xs, ws, e);
        }
    }
}

/// Runs the AVX2 loop `$avx2` when the CPU has it, else the portable one.
macro_rules! lanes_avx2_or_portable {
    ($self:expr, $xs:expr, $ws:expr, $eff:expr, $out:expr, $avx2:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::has_avx2() {
                // SAFETY: the CPU supports AVX2, checked just above.
                return unsafe { $avx2 };
            }
        }
        for (o, &e) in $out.iter_mut().zip($eff) {
            *o = portable_lanes(*$self, $xs, $ws, e);
        }
    }};
}

/// Integer values, half away from zero: `round` of the clamped value (the codec's integer).
#[derive(Clone, Copy)]
struct IntAwayQ {
    qmin: f32,
    qmax: f32,
}

impl Dequant for IntAwayQ {
    #[inline(always)]
    fn lanes(&self, xs: &[f32], ws: Option<&[f32]>, eff: &[f32], out: &mut [[f32; 8]]) {
        let term = |x: f32, e: f32| term(*self, x, e);
        lanes_avx2_or_portable!(
            self,
            xs,
            ws,
            eff,
            out,
            crate::search_avx2::lanes_int_away(xs, ws, eff, out, (self.qmin, self.qmax), term)
        )
    }

    #[inline(always)]
    fn qv(&self, u: f32) -> f32 {
        // As the codec: truncate, then step away from zero on a fraction of at least one half
        // (`f32::round` vectorizes poorly).
        let v = clamp(u, self.qmin, self.qmax);
        let t = v.trunc();
        let f = v - t;
        let up = if f >= 0.5 { 1.0 } else { 0.0 };
        let down = if f <= -0.5 { 1.0 } else { 0.0 };
        t + up - down
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
    fn lanes(&self, xs: &[f32], ws: Option<&[f32]>, eff: &[f32], out: &mut [[f32; 8]]) {
        let term = |x: f32, e: f32| term(*self, x, e);
        lanes_avx2_or_portable!(
            self,
            xs,
            ws,
            eff,
            out,
            crate::search_avx2::lanes_int_even(xs, ws, eff, out, (self.qmin, self.qmax), term)
        )
    }

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
    fn lanes(&self, xs: &[f32], ws: Option<&[f32]>, eff: &[f32], out: &mut [[f32; 8]]) {
        let term = |x: f32, e: f32| term(*self, x, e);
        lanes_avx2_or_portable!(
            self,
            xs,
            ws,
            eff,
            out,
            crate::search_avx2::lanes_e2m1(xs, ws, eff, out, term)
        )
    }

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

/// Lookup mode: the nearest codebook entry (`rounding` does not apply).
impl Dequant for NearestEntry {
    #[inline(always)]
    fn lanes(&self, xs: &[f32], ws: Option<&[f32]>, eff: &[f32], out: &mut [[f32; 8]]) {
        let term = |x: f32, e: f32| term(*self, x, e);
        lanes_avx2_or_portable!(
            self,
            xs,
            ws,
            eff,
            out,
            crate::search_avx2::lanes_lookup(xs, ws, eff, out, self.parts(), term)
        )
    }

    #[inline(always)]
    fn qv(&self, u: f32) -> f32 {
        self.value(u)
    }
}

/// Runs `$body` with `$q` bound to the [`Dequant`] of `$scheme`'s value (or codebook) under
/// `$rounding`.
macro_rules! with_dequant {
    ($scheme:expr, $rounding:expr, |$q:ident| $body:expr) => {{
        let scheme: &crate::scheme::QuantScheme = $scheme;
        let value: QuantValue = scheme.value;
        let (qmin, qmax) = value.range();
        match value {
            _ if scheme.codebook.is_some() => {
                let $q = NearestEntry::new(scheme.codebook.as_ref().expect("checked"));
                $body
            }
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

/// (u − q(u))² of one element, u = x / e.
#[inline(always)]
fn term<Q: Dequant>(q: Q, x: f32, e: f32) -> f32 {
    let u = x / e;
    let t = u - q.qv(u);
    t * t
}

/// Σ w·(u − q(u))² over one chunk (≤ CHUNK elements) in f32, element i into lane i % 8.
#[inline(always)]
fn portable_lanes<Q: Dequant>(q: Q, xs: &[f32], ws: Option<&[f32]>, e: f32) -> [f32; 8] {
    let mut lanes = [0.0f32; 8];
    match ws {
        None => {
            let mut cx = xs.chunks_exact(8);
            for c in &mut cx {
                for i in 0..8 {
                    lanes[i] += term(q, c[i], e);
                }
            }
            for (i, &x) in cx.remainder().iter().enumerate() {
                lanes[i] += term(q, x, e);
            }
        }
        Some(ws) => {
            let mut cx = xs.chunks_exact(8);
            let mut cw = ws.chunks_exact(8);
            for (c, w) in (&mut cx).zip(&mut cw) {
                for i in 0..8 {
                    lanes[i] += w[i] * term(q, c[i], e);
                }
            }
            for (i, (&x, &w)) in cx.remainder().iter().zip(cw.remainder()).enumerate() {
                lanes[i] += w * term(q, x, e);
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
    // The candidates of scale 0 are left out (their error is +inf whatever the sum).
    let mut nz = [0.0f32; MAX_CANDIDATES];
    let mut at = [0usize; MAX_CANDIDATES];
    let mut k = 0;
    for (j, &e) in eff.iter().enumerate() {
        if e != 0.0 {
            (nz[k], at[k]) = (e, j);
            k += 1;
        }
    }
    let mut lanes = [[0.0f32; 8]; MAX_CANDIDATES];
    q.lanes(xs, ws, &nz[..k], &mut lanes[..k]);
    for j in 0..k {
        out[at[j]] += combine(&lanes[j]) as f64;
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
struct Bufs {
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
fn search_block_portable<Q: Dequant>(
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
        let half_range = scheme.half_range();
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
    let stored = with_dequant!(scheme, opts.rounding, |q| {
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
#[path = "search_tests.rs"]
mod tests;
