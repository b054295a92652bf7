//! Searched affine ranges, calibration `mse` (format.md "Affine values (offsets)"): per block,
//! the candidate range [lo · a, hi · b] of least squared error, a and b each from 1 down to 1/2
//! in steps of 1/16.

use super::params::Rule;

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
/// term (f64(x̂) − f64(x))² in f64, added in order from the first element.
#[inline]
pub fn block_error(rule: &Rule, xs: &[f32], s: f32, off: f32) -> f64 {
    let mut sum = 0.0f64;
    for &x in xs {
        let xh = rule.value(rule.code(x, s, off), s, off);
        let d = xh as f64 - x as f64;
        sum += d * d;
    }
    sum
}

/// The scale and offset of least error among the candidates, for a block `xs` (finite values
/// in row-major order within the block) spanning [lo, hi]: a outer, b inner, the first of least
/// error kept (a = b = 1 is minmax's own range, so never worse by this measure).
pub fn search(rule: &Rule, xs: &[f32], lo: f32, hi: f32) -> (f32, f32) {
    let mut best = rule.params(lo, hi);
    let mut best_err = block_error(rule, xs, best.0, best.1);
    for (i, &a) in SHRINK.iter().enumerate() {
        for (j, &b) in SHRINK.iter().enumerate() {
            if i == 0 && j == 0 {
                continue;
            }
            let (s, off) = rule.params(lo * a, hi * b);
            let err = block_error(rule, xs, s, off);
            if err < best_err {
                best = (s, off);
                best_err = err;
            }
        }
    }
    best
}
