//! Scale searches for the ggml types whose quantizers are blockquant's own (the K-quants,
//! IQ4_NL/IQ4_XS, NVFP4): gguf-py only dequantizes these, so any codes that decode are valid
//! bytes, and the quantizer's job is the smallest squared error.
//!
//! A search tries candidate scales around the one that maps the block's largest value to the
//! end of the code range, rounds each value to its nearest code, and refits the scale (and
//! offset) to those codes by least squares; the candidate whose refit leaves the least error
//! wins. Then the super-block's stored scales are chosen ([`signed_subscales`], and
//! `encode_affine` in [`super::kquants`] for the types with minimums) and the codes
//! are taken once more with the scales as they will be decoded, so the error that counts is the
//! one measured. Everything is a fixed sequence of f32/f64 operations on one block: the bytes
//! do not depend on the thread count.

use super::block::round_away;
use super::float16::{f16_to_f32, f32_to_f16};

/// The importance of each value of a block, which the searches weigh its squared error by:
/// [`Unit`] for the plain quantizers (every value weighs 1) or the block's slice of an
/// importance row (llama.cpp's imatrix). Each weighted sum is written `w·(term)` with the
/// weight first, so that under [`Unit`] it is `1·term`, which is `term` exactly: the plain
/// quantizers' bytes do not change, and once inlined the products by 1 fold away.
pub(super) trait Weigh: Copy {
    /// Whether the searches widen where weights make it pay (the plain ones keep their
    /// candidates, so their bytes and pace stay as they were).
    const WIDE: bool;
    /// The weight of value `i`.
    fn at(self, i: usize) -> f32;
    /// The weights of values `8k..8k + 8` (one bounds check for the eight).
    fn lanes(self, k: usize) -> [f32; 8];
    /// The weights of values `start..start + len`.
    fn sub(self, start: usize, len: usize) -> Self;
}

/// Every value weighs 1.
#[derive(Clone, Copy)]
pub(super) struct Unit;

impl Weigh for Unit {
    const WIDE: bool = false;
    #[inline(always)]
    fn at(self, _: usize) -> f32 {
        1.0
    }
    #[inline(always)]
    fn lanes(self, _: usize) -> [f32; 8] {
        [1.0; 8]
    }
    #[inline(always)]
    fn sub(self, _: usize, _: usize) -> Self {
        self
    }
}

impl Weigh for &[f32] {
    const WIDE: bool = true;
    #[inline(always)]
    fn at(self, i: usize) -> f32 {
        self[i]
    }
    #[inline(always)]
    fn lanes(self, k: usize) -> [f32; 8] {
        let mut out = [0.0; 8];
        out.copy_from_slice(&self[8 * k..8 * k + 8]);
        out
    }
    #[inline(always)]
    fn sub(self, start: usize, len: usize) -> Self {
        &self[start..start + len]
    }
}

/// A set of codes a value rounds to (times a scale).
pub(super) trait Grid {
    /// The code nearest `v` (a scaled value, any finite or infinite f32) and its value.
    fn nearest(&self, v: f32) -> (i32, f32);
    /// The codes at the two ends, as values: the block's largest value goes to one of them.
    fn ends(&self) -> (f32, f32);
}

/// The integers `lo..=hi`.
pub(super) struct Uniform {
    pub lo: i32,
    pub hi: i32,
}

impl Grid for Uniform {
    #[inline(always)]
    fn nearest(&self, v: f32) -> (i32, f32) {
        let q = round_away(v.clamp(self.lo as f32, self.hi as f32));
        (q, q as f32)
    }
    fn ends(&self) -> (f32, f32) {
        (self.lo as f32, self.hi as f32)
    }
}

/// A sorted table of 16 values (IQ4_NL's codebook): the nearest is found by comparing with the
/// 15 midpoints, which vectorizes (a table lookup would be a gather, one value at a time).
pub(super) struct Book {
    pub values: &'static [i8; 16],
    /// The midpoints between neighbours, and the step from each value to the next.
    mids: [f32; 15],
    steps: [f32; 15],
}

impl Book {
    pub const fn new(values: &'static [i8; 16]) -> Self {
        let mut mids = [0.0f32; 15];
        let mut steps = [0.0f32; 15];
        let mut i = 0;
        while i < 15 {
            // Integers: the half-sums and differences are exact.
            mids[i] = (values[i] as i32 + values[i + 1] as i32) as f32 / 2.0;
            steps[i] = (values[i + 1] as i32 - values[i] as i32) as f32;
            i += 1;
        }
        Self {
            values,
            mids,
            steps,
        }
    }
}

impl Grid for Book {
    #[inline(always)]
    fn nearest(&self, v: f32) -> (i32, f32) {
        // Past each midpoint, one value up (a tie stays below); sums of integers, exact.
        let mut i = 0;
        let mut g = self.values[0] as f32;
        for (&m, &s) in self.mids.iter().zip(&self.steps) {
            let up = v > m;
            i += up as i32;
            g += if up { s } else { 0.0 };
        }
        (i, g)
    }
    fn ends(&self) -> (f32, f32) {
        (self.values[0] as f32, self.values[15] as f32)
    }
}

/// The value of largest magnitude (the first of equals) and that magnitude.
#[inline(always)]
pub(super) fn signed_max(x: &[f32]) -> (f32, f32) {
    let mut m = 0.0f32;
    for &v in x {
        if v.abs() > m.abs() {
            m = v;
        }
    }
    (m, m.abs())
}

/// Σ f(i) for i in 0..n (a multiple of 8) in eight lanes, folded in a fixed order. One chain
/// of adds would wait on each add's latency (without fast-math nothing reassociates it); the
/// fixed order keeps the result a function of the data alone.
#[inline(always)]
pub(super) fn sum8<T>(n: usize, f: impl Fn(usize) -> T) -> T
where
    T: Copy + Default + std::ops::Add<Output = T>,
{
    let mut acc = [T::default(); 8];
    for c in 0..n / 8 {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = *a + f(8 * c + l);
        }
    }
    fold8(acc)
}

/// Σ w(i)·f(i) for i in 0..n (a multiple of 8), as [`sum8`] (under [`Unit`], `sum8` of f).
#[inline(always)]
pub(super) fn wsum8<W: Weigh>(n: usize, w: W, f: impl Fn(usize) -> f64) -> f64 {
    let mut acc = [0.0f64; 8];
    for c in 0..n / 8 {
        let wc = w.lanes(c);
        for (l, a) in acc.iter_mut().enumerate() {
            *a += wc[l] as f64 * f(8 * c + l);
        }
    }
    fold8(acc)
}

#[inline(always)]
fn fold8<T: Copy + std::ops::Add<Output = T>>(a: [T; 8]) -> T {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// Candidate end-points tried on each side of the grid by default, as fractions of the end.
pub(super) const STEPS: usize = 12;

/// The scale s minimizing Σw·(x − s·g)² over codes g of `grid` (s may be negative: a signed
/// scale lets the largest value take either end). 0 for an all-zero block. x has ≤ 32 values.
#[inline(always)]
pub(super) fn symmetric<G: Grid, W: Weigh>(x: &[f32], w: W, grid: &G, steps: usize) -> f32 {
    let (m, amax) = signed_max(x);
    if amax == 0.0 {
        return 0.0;
    }
    // Searched in units of amax (so squares neither overflow nor underflow), scaled back.
    let mut y = [0.0f32; 32];
    let y = &mut y[..x.len()];
    for (y, &v) in y.iter_mut().zip(x) {
        *y = v / amax;
    }
    let sign = if m < 0.0 { -1.0 } else { 1.0 };
    let (lo, hi) = grid.ends();
    let mut best = (f32::NEG_INFINITY, 0.0f32);
    for end in [lo, hi] {
        for k in 0..steps {
            // The largest value lands from half a step past the end to ~20% inside it.
            let t = end * (1.0 + 0.5 / end.abs() - 0.2 * k as f32 / steps as f32);
            let s = sign / t;
            let (gain, refit) = refit_scale(y, w, s, grid);
            if gain > best.0 {
                best = (gain, refit);
            }
        }
        // Under importance weights the largest value may matter little: scales that clip it
        // (it lands up to half the range past the end) are tried too.
        for k in 1..if W::WIDE { steps + 1 } else { 0 } {
            let t = end * (1.0 + 0.5 / end.abs() + 0.5 * k as f32 / steps as f32);
            let (gain, refit) = refit_scale(y, w, sign / t, grid);
            if gain > best.0 {
                best = (gain, refit);
            }
        }
    }
    // One more round from the winner: its codes, refit.
    let (gain, refit) = refit_scale(y, w, best.1, grid);
    if gain > best.0 {
        best = (gain, refit);
    }
    best.1 * amax
}

/// Codes of y at scale s, then the least-squares scale for those codes: (Σwyg)²/Σwg² (the
/// error it removes, to maximize) and Σwyg/Σwg².
#[inline(always)]
fn refit_scale<G: Grid, W: Weigh>(y: &[f32], w: W, s: f32, grid: &G) -> (f32, f32) {
    if s == 0.0 || !s.is_finite() {
        return (0.0, 0.0);
    }
    // Candidates only steer the search: a product with 1/s is as good as a division here.
    let inv = 1.0 / s;
    let (mut sxg, mut sgg) = ([0.0f32; 8], [0.0f32; 8]);
    for (k, c) in y.chunks_exact(8).enumerate() {
        let wk = w.lanes(k);
        for l in 0..8 {
            let (_, g) = grid.nearest(c[l] * inv);
            let wl = wk[l];
            sxg[l] += wl * c[l] * g;
            sgg[l] += wl * g * g;
        }
    }
    let (sxg, sgg) = (fold8(sxg), fold8(sgg));
    if sgg == 0.0 {
        return (0.0, 0.0);
    }
    (sxg * sxg / sgg, sxg / sgg)
}

/// (a, b), a ≥ 0, minimizing Σw·(x − (a·q − b))² over codes q in 0..=nmax. For the K-quants
/// with a minimum the offset −b is at most 0 (b ≥ 0: it is stored unsigned); with `FREE` it
/// is any (Q4_1/Q5_1's stored minimum). x has ≤ 32 values.
#[inline(always)]
pub(super) fn affine<W: Weigh, const FREE: bool>(x: &[f32], w: W, nmax: i32) -> (f32, f32) {
    let (_, amax) = signed_max(x);
    if amax == 0.0 {
        return (0.0, 0.0);
    }
    let mut y = [0.0f32; 32];
    let y = &mut y[..x.len()];
    let mut mn = if FREE { f32::INFINITY } else { 0.0f32 };
    let mut mx = f32::NEG_INFINITY;
    for (y, &v) in y.iter_mut().zip(x) {
        *y = v / amax;
        mn = mn.min(*y);
        mx = mx.max(*y);
    }
    if mx <= mn {
        // Every value equal to the minimum: the offset alone holds it.
        return (0.0, -mn * amax);
    }
    // Σw (the count under Unit: a sum of ones, exact).
    let n: f32 = sum8(y.len(), |i| w.at(i));
    let sy: f32 = sum8(y.len(), |i| w.at(i) * y[i]);
    let syy: f64 = sum8(y.len(), |i| w.at(i) * y[i] * y[i]) as f64;
    let top = nmax as f32;
    // The plain min–max fit first, so a search never does worse.
    let mut best = (
        affine_error(y, w, (mx - mn) / top, mn, nmax),
        (mx - mn) / top,
        mn,
    );
    // Code ranges from one short of the top to one past it; under importance weights, up to
    // four past (the largest values clipped, when they matter little).
    let sums = Sums { n, sy, syy };
    for k in 0..=if W::WIDE { 50 } else { 20 } {
        let iscale = (top - 1.0 + 0.1 * k as f32) / (mx - mn);
        let fit = least_squares::<W, FREE>(y, w, &sums, |v| {
            round_away(((v - mn) * iscale).clamp(0.0, top)) as f32
        });
        if let Some((err, a, c)) = fit {
            if err < best.0 {
                best = (err, a, c);
            }
        }
    }
    // Under importance weights, a few more rounds from the winner: its codes, refit.
    for _ in 0..if W::WIDE { 3 } else { 0 } {
        let (a0, c0) = (best.1, best.2);
        let fit = least_squares::<W, FREE>(y, w, &sums, |v| {
            round_away(((v - c0) / a0).clamp(0.0, top)) as f32
        });
        match fit {
            Some((err, a, c)) if err < best.0 => best = (err, a, c),
            _ => break,
        }
    }
    (best.1 * amax, -best.2 * amax)
}

/// Σw, Σw·y and Σw·y² of a block.
struct Sums {
    n: f32,
    sy: f32,
    syy: f64,
}

/// The codes `code(y)` of the block, then the scale a > 0 and offset c (≤ 0 unless `FREE`)
/// minimizing Σw·(y − a·q − c)² for them, and that error; None when no such fit exists.
#[inline(always)]
fn least_squares<W: Weigh, const FREE: bool>(
    y: &[f32],
    w: W,
    s: &Sums,
    code: impl Fn(f32) -> f32,
) -> Option<(f32, f32, f32)> {
    let (mut sq, mut sqq, mut syq) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
    for (k, yc) in y.chunks_exact(8).enumerate() {
        let wk = w.lanes(k);
        for l in 0..8 {
            let c = code(yc[l]);
            let wl = wk[l];
            sq[l] += wl * c;
            sqq[l] += wl * c * c;
            syq[l] += wl * yc[l] * c;
        }
    }
    let (sq, sqq, syq) = (fold8(sq), fold8(sqq), fold8(syq));
    let (n, sy) = (s.n, s.sy);
    let det = n * sqq - sq * sq;
    if det <= 0.0 {
        return None;
    }
    let mut a = (n * syq - sy * sq) / det;
    let mut c = (sy - a * sq) / n;
    if c > 0.0 && !FREE {
        // The offset cannot be positive: refit the scale alone.
        c = 0.0;
        a = syq / sqq;
    }
    if a <= 0.0 {
        return None;
    }
    // Σ(y − a·q − c)² from the sums (in f64: the terms nearly cancel), not another pass.
    let (a64, c64) = (a as f64, c as f64);
    let err = (s.syy - 2.0 * a64 * syq as f64 - 2.0 * c64 * sy as f64
        + a64 * a64 * sqq as f64
        + 2.0 * a64 * c64 * sq as f64
        + n as f64 * c64 * c64) as f32;
    Some((err, a, c))
}

/// The code of v for the decoded value ea·q − eb (0 when ea is 0).
#[inline(always)]
pub(super) fn affine_code(v: f32, ea: f32, eb: f32, nmax: i32) -> i32 {
    if ea == 0.0 {
        0
    } else {
        round_away(((v + eb) / ea).clamp(0.0, nmax as f32))
    }
}

#[inline(always)]
fn affine_error<W: Weigh>(y: &[f32], w: W, a: f32, c: f32, nmax: i32) -> f32 {
    sum8(y.len(), |i| {
        let q = round_away(((y[i] - c) / a).clamp(0.0, nmax as f32)) as f32;
        w.at(i) * (y[i] - (a * q + c)) * (y[i] - (a * q + c))
    })
}

/// f32 → float16 bits, saturated to the largest finite f16 (a scale that would overflow is
/// stored as ±65504: the block then clips, rather than decoding to infinities).
#[inline(always)]
pub(super) fn f16_sat(v: f32) -> (u16, f32) {
    let h = f32_to_f16(v.clamp(-65504.0, 65504.0));
    (h, f16_to_f32(h))
}

/// Σw·(x − e·g)² in f64 for codes of `grid` at the decoded scale `e` (the codes as
/// [`nearest_codes`] picks them).
#[inline(always)]
pub(super) fn scaled_error<G: Grid, W: Weigh>(x: &[f32], w: W, e: f32, grid: &G) -> f64 {
    if e == 0.0 {
        return wsum8(x.len(), w, |i| (x[i] as f64) * (x[i] as f64));
    }
    wsum8(x.len(), w, |i| {
        let (_, g) = grid.nearest(x[i] / e);
        let d = x[i] as f64 - (e * g) as f64;
        d * d
    })
}

/// The codes of x at the decoded scale `e` (the code of 0 when e is 0).
#[inline(always)]
pub(super) fn nearest_codes<G: Grid>(x: &[f32], e: f32, grid: &G, out: &mut [i32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = grid.nearest(if e == 0.0 { 0.0 } else { v / e }).0;
    }
}

/// Given sub-block scales `s` (any sign) and the stored sub-scale range lo..=hi: the super-block
/// scale (f16 bits), each sub-block's integer sub-scale, chosen among the nearest and its two
/// neighbours by the sub-block's (weighted) error at the scale as decoded (f16(d)·sub-scale in
/// f32).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn signed_subscales<G: Grid, W: Weigh>(
    x: &[f32],
    w: W,
    sub: usize,
    s: &[f32],
    lo: i32,
    hi: i32,
    grid: &G,
    out: &mut [i32],
) -> u16 {
    let (smax, amax) = signed_max(s);
    if amax == 0.0 {
        out.fill(0);
        return 0;
    }
    // The largest sub-scale takes the negative end, exactly representable. With importance
    // weights, super-block scales that put it further inside the range are tried too: the
    // sub-blocks that matter may round better on another grid of sub-scales.
    let mut best = (f64::INFINITY, 0u16);
    let mut sc = [0i32; 16];
    for k in 0..if W::WIDE { SUPER_TRIES } else { 1 } {
        let t = lo as f32 * (1.0 - SUPER_STEP * k as f32);
        let (bits, d) = f16_sat(smax / t);
        let err = subscales_at(x, w, sub, s, d, lo, hi, grid, &mut sc[..out.len()]);
        if k == 0 || err < best.0 {
            best = (err, bits);
            out.copy_from_slice(&sc[..out.len()]);
        }
    }
    best.1
}

/// Super-block scales [`signed_subscales`] tries under importance weights, and the step
/// between them (as a fraction of the end of the range the largest sub-scale takes).
const SUPER_TRIES: usize = 8;
const SUPER_STEP: f32 = 0.025;

/// Each sub-block's sub-scale at the decoded super-block scale `d`, and the (weighted) error
/// they leave in all.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn subscales_at<G: Grid, W: Weigh>(
    x: &[f32],
    w: W,
    sub: usize,
    s: &[f32],
    d: f32,
    lo: i32,
    hi: i32,
    grid: &G,
    out: &mut [i32],
) -> f64 {
    let mut total = 0.0f64;
    for (j, ((o, &sj), xj)) in out.iter_mut().zip(s).zip(x.chunks_exact(sub)).enumerate() {
        if d == 0.0 {
            *o = 0;
            continue;
        }
        let r = round_away((sj / d).clamp(lo as f32, hi as f32));
        let mut best = (f64::INFINITY, r);
        for c in [r, r - 1, r + 1] {
            if c < lo || c > hi {
                continue;
            }
            let err = scaled_error(xj, w.sub(j * sub, sub), d * c as f32, grid);
            if err < best.0 {
                best = (err, c);
            }
        }
        *o = best.1;
        total += best.0;
    }
    total
}

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
