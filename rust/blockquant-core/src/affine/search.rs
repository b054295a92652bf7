//! Searched affine ranges, calibration `mse` (format.md "Affine values (offsets)"): per block,
//! the candidate range [lo · a, hi · b] of least squared error, a and b from 1 down to 1/2 in
//! steps of 1/16, in three sweeps over that grid.

use super::params::{round_int, value_of, Rule};
use crate::codec::Rounding;
use crate::scheme::Offset;
use crate::simd::avx2_dispatch;

/// The shrink factors of each end, in order: 1, 15/16, …, 8/16 (exact in f32).
pub const SHRINK: [f32; 9] = [
    1.0,
    15.0 / 16.0,
    14.0 / 16.0,
    13.0 / 16.0,
    12.0 / 16.0,
    11.0 / 16.0,
    10.0 / 16.0,
    9.0 / 16.0,
    8.0 / 16.0,
];

/// The squared error of `xs` quantized and dequantized with scale `s` and offset `off`: each
/// term (f64(x̂) − f64(x))² in f64, the k-th term added to lane k mod 4 (each lane in order from
/// its first term), the result (lane 0 + lane 1) + (lane 2 + lane 3). Four lanes rather than one
/// chain of additions let the loop run in SIMD registers; the reference sums the same way.
#[inline]
pub fn block_error(rule: &Rule, xs: &[f32], s: f32, off: f32) -> f64 {
    error_below(rule, xs, s, off, f64::INFINITY)
}

/// [`block_error`], or, once the partial sum reaches `limit`, that partial sum (some value of
/// at least `limit`) without the rest. Exact for the search's question "is it below `limit`":
/// every term is non-negative and each addition rounds monotonically, so each lane's partial
/// sum, and so their combination, is at most the full one.
#[inline]
pub fn error_below(rule: &Rule, xs: &[f32], s: f32, off: f32, limit: f64) -> f64 {
    let even = rule.rounding == Rounding::HalfEven;
    let q = rule.qmax;
    // One loop per (offset kind, rounding), branch-free inside, so that it vectorizes.
    match (matches!(rule.offset, Offset::Zero), even) {
        (true, true) => error_in(Kind::<true, true>, xs, s, off, q, limit),
        (true, false) => error_in(Kind::<true, false>, xs, s, off, q, limit),
        (false, true) => error_in(Kind::<false, true>, xs, s, off, q, limit),
        (false, false) => error_in(Kind::<false, false>, xs, s, off, q, limit),
    }
}

/// Octets of values between two looks at the partial sum against the limit.
const LOOK_EVERY: usize = 4;

/// The loop's kind as a type: zero point or bias, ties to even or away.
#[derive(Clone, Copy)]
struct Kind<const ZERO: bool, const EVEN: bool>;

avx2_dispatch! {
    fn error_in[const ZERO: bool, const EVEN: bool](
        kind: Kind<ZERO, EVEN>,
        xs: &[f32],
        s: f32,
        off: f32,
        qmax: f32,
        limit: f64,
    ) -> f64 => error_of;
}

#[inline(always)]
fn error_of<const ZERO: bool, const EVEN: bool>(
    _: Kind<ZERO, EVEN>,
    xs: &[f32],
    s: f32,
    off: f32,
    qmax: f32,
    limit: f64,
) -> f64 {
    // The value of x's code, branch-free (s = 0 is handled once, outside the loop).
    let value = |x: f32| -> f32 {
        let q = if ZERO {
            clamp(round_int(x / s, EVEN) + off, qmax)
        } else {
            clamp(round_int((x - off) / s, EVEN), qmax)
        };
        value_of(ZERO, q, s, off)
    };
    let zero_scale = s == 0.0;
    let at = |x: f32| -> f32 {
        if zero_scale {
            value_of(ZERO, 0.0, s, off)
        } else {
            value(x)
        }
    };
    let mut lanes = [0.0f64; 4];
    let mut octets = xs.chunks_exact(8);
    let mut seen = 0usize;
    for o in &mut octets {
        seen += 1;
        if seen.is_multiple_of(LOOK_EVERY) {
            let partial = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
            if partial >= limit {
                return partial;
            }
        }
        // Eight values at a time in f32 (one AVX2 register), then their squared errors in f64:
        // lane k takes elements k and k + 4, in that order, as the four-lane rule says.
        let mut v = [0.0f32; 8];
        for k in 0..8 {
            v[k] = if zero_scale {
                value_of(ZERO, 0.0, s, off)
            } else {
                value(o[k])
            };
        }
        for k in 0..4 {
            let d = v[k] as f64 - o[k] as f64;
            lanes[k] += d * d;
        }
        for k in 0..4 {
            let d = v[k + 4] as f64 - o[k + 4] as f64;
            lanes[k] += d * d;
        }
    }
    let mut quads = octets.remainder().chunks_exact(4);
    for q in &mut quads {
        for k in 0..4 {
            let d = at(q[k]) as f64 - q[k] as f64;
            lanes[k] += d * d;
        }
    }
    for (lane, &x) in lanes.iter_mut().zip(quads.remainder()) {
        let d = at(x) as f64 - x as f64;
        *lane += d * d;
    }
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

#[inline(always)]
fn clamp(v: f32, qmax: f32) -> f32 {
    let v = if v >= 0.0 { v } else { 0.0 };
    if v <= qmax {
        v
    } else {
        qmax
    }
}

/// The scale and offset of least error among the candidates [lo · SHRINK[i], hi · SHRINK[j]]
/// for a block `xs` (finite values in row-major order within the block) spanning [lo, hi],
/// searched in three sweeps: minmax's own range (i = j = 0) and the diagonal i = j; then every
/// i with the best j so far; then every j with the best i so far. A candidate replaces the best
/// only with a strictly smaller error, so the first found is kept (and minmax's range, first of
/// all, is never beaten by an equal one): 27 evaluations instead of the grid's 81, with nearly
/// all of its gain (format.md "Affine values (offsets)").
pub fn search(rule: &Rule, xs: &[f32], lo: f32, hi: f32) -> (f32, f32) {
    let mut best = rule.params(lo, hi);
    let mut best_err = block_error(rule, xs, best.0, best.1);
    let (mut bi, mut bj) = (0usize, 0usize);
    let mut tried = [[false; 9]; 9];
    tried[0][0] = true;
    let mut try_one =
        |i: usize, j: usize, best: &mut (f32, f32), bi: &mut usize, bj: &mut usize| {
            // A candidate met again has its error again: it cannot be strictly smaller.
            if std::mem::replace(&mut tried[i][j], true) {
                return;
            }
            let (s, off) = rule.params(lo * SHRINK[i], hi * SHRINK[j]);
            let err = error_below(rule, xs, s, off, best_err);
            if err < best_err {
                *best = (s, off);
                best_err = err;
                (*bi, *bj) = (i, j);
            }
        };
    for k in 1..SHRINK.len() {
        try_one(k, k, &mut best, &mut bi, &mut bj);
    }
    let j0 = bj;
    for i in 0..SHRINK.len() {
        try_one(i, j0, &mut best, &mut bi, &mut bj);
    }
    let i0 = bi;
    for j in 0..SHRINK.len() {
        try_one(i0, j, &mut best, &mut bi, &mut bj);
    }
    best
}
