//! The mse search's error loop in AVX2 intrinsics (see [`crate::search`]): eight lanes in one
//! register, exactly the lanes of the portable loop, so the sums are the same bits. Written out
//! because the compiler's own vectorization of the portable loop stays at four lanes.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// Clamp as the codec does: `v >= lo ? v : lo` (NaN → lo), then `v <= hi ? v : hi`.
#[inline(always)]
unsafe fn clamp8(u: __m256, lo: __m256, hi: __m256) -> __m256 {
    // maxps/minps return the second operand when the first is NaN.
    _mm256_min_ps(_mm256_max_ps(u, lo), hi)
}

/// Half away from zero: truncate, step away on a fraction of at least one half.
#[inline(always)]
unsafe fn int_away8(u: __m256, qmin: f32, qmax: f32) -> __m256 {
    let v = clamp8(u, _mm256_set1_ps(qmin), _mm256_set1_ps(qmax));
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
    let f = _mm256_sub_ps(v, t);
    let one = _mm256_set1_ps(1.0);
    let up = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(f, _mm256_set1_ps(0.5)), one);
    let down = _mm256_and_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(f, _mm256_set1_ps(-0.5)), one);
    _mm256_sub_ps(_mm256_add_ps(t, up), down)
}

/// Half to even.
#[inline(always)]
unsafe fn int_even8(u: __m256, qmin: f32, qmax: f32) -> __m256 {
    let v = clamp8(u, _mm256_set1_ps(qmin), _mm256_set1_ps(qmax));
    _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
}

/// E2M1: the magnitude as the sum of the steps whose thresholds |u| passes, then u's sign.
#[inline(always)]
unsafe fn e2m1_8(u: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let a = _mm256_andnot_ps(sign, u);
    let step = |mask: __m256, s: f32| _mm256_and_ps(mask, _mm256_set1_ps(s));
    let (gt, ge) = (
        |t: f32| _mm256_cmp_ps::<_CMP_GT_OQ>(a, _mm256_set1_ps(t)),
        |t: f32| _mm256_cmp_ps::<_CMP_GE_OQ>(a, _mm256_set1_ps(t)),
    );
    // Added left to right, as the portable sum.
    let mut m = step(gt(0.25), 0.5);
    m = _mm256_add_ps(m, step(ge(0.75), 0.5));
    m = _mm256_add_ps(m, step(gt(1.25), 0.5));
    m = _mm256_add_ps(m, step(ge(1.75), 0.5));
    m = _mm256_add_ps(m, step(gt(2.5), 1.0));
    m = _mm256_add_ps(m, step(ge(3.5), 1.0));
    m = _mm256_add_ps(m, step(gt(5.0), 2.0));
    _mm256_or_ps(m, _mm256_and_ps(sign, u))
}

/// A codebook's nearest entry: the thresholds u reaches counted (each passed mask is −1), then
/// the count picks the sorted entry with two in-register permutes (each reads the low three
/// bits), chosen by bit 3: the entry the portable select chain ends on.
#[inline(always)]
unsafe fn nearest8(u: __m256, thresholds: &[f32; 15], lo: __m256, hi: __m256) -> __m256 {
    let mut rank = _mm256_setzero_si256();
    for &t in thresholds {
        let ge = _mm256_cmp_ps::<_CMP_GE_OQ>(u, _mm256_set1_ps(t));
        rank = _mm256_sub_epi32(rank, _mm256_castps_si256(ge));
    }
    let a = _mm256_permutevar8x32_ps(lo, rank);
    let b = _mm256_permutevar8x32_ps(hi, rank);
    let upper = _mm256_cmpgt_epi32(rank, _mm256_set1_epi32(7));
    _mm256_blendv_ps(a, b, _mm256_castsi256_ps(upper))
}

/// For each effective scale `eff[k]` (none 0), Σ w·(u − q(u))² of a chunk into eight lanes
/// `out[k]` (element i into lane i % 8): `$qv8` the vector value function, `$term` the portable
/// term of one element for the last `len % 8`. The candidates advance together, eight elements
/// at a time, so their sums are independent chains rather than one chain each.
macro_rules! lanes8 {
    ($xs:expr, $ws:expr, $eff:expr, $out:expr, |$u:ident| $qv8:expr, $term:expr) => {{
        let (xs, ws, eff, out): (&[f32], Option<&[f32]>, &[f32], &mut [[f32; 8]]) =
            ($xs, $ws, $eff, $out);
        let k = eff.len().min(MAX);
        let mut ev = [_mm256_setzero_ps(); MAX];
        let mut acc = [_mm256_setzero_ps(); MAX];
        for j in 0..k {
            ev[j] = _mm256_set1_ps(eff[j]);
        }
        let full = xs.len() / 8 * 8;
        let mut i = 0;
        while i < full {
            let x = _mm256_loadu_ps(xs.as_ptr().add(i));
            let w = ws.map(|w| _mm256_loadu_ps(w.as_ptr().add(i)));
            for j in 0..k {
                let $u = _mm256_div_ps(x, ev[j]);
                let t = _mm256_sub_ps($u, $qv8);
                let tt = _mm256_mul_ps(t, t);
                acc[j] = _mm256_add_ps(
                    acc[j],
                    match w {
                        None => tt,
                        Some(w) => _mm256_mul_ps(w, tt),
                    },
                );
            }
            i += 8;
        }
        let term = $term;
        for j in 0..k {
            _mm256_storeu_ps(out[j].as_mut_ptr(), acc[j]);
            for (l, &x) in xs[full..].iter().enumerate() {
                let t: f32 = term(x, eff[j]);
                out[j][l] += match ws {
                    None => t,
                    Some(ws) => ws[full + l] * t,
                };
            }
        }
    }};
}

const MAX: usize = crate::search::MAX_CANDIDATES;

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn lanes_int_away(
    xs: &[f32],
    ws: Option<&[f32]>,
    eff: &[f32],
    out: &mut [[f32; 8]],
    (qmin, qmax): (f32, f32),
    term: impl Fn(f32, f32) -> f32,
) {
    lanes8!(xs, ws, eff, out, |u| int_away8(u, qmin, qmax), term)
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn lanes_int_even(
    xs: &[f32],
    ws: Option<&[f32]>,
    eff: &[f32],
    out: &mut [[f32; 8]],
    (qmin, qmax): (f32, f32),
    term: impl Fn(f32, f32) -> f32,
) {
    lanes8!(xs, ws, eff, out, |u| int_even8(u, qmin, qmax), term)
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn lanes_e2m1(
    xs: &[f32],
    ws: Option<&[f32]>,
    eff: &[f32],
    out: &mut [[f32; 8]],
    term: impl Fn(f32, f32) -> f32,
) {
    lanes8!(xs, ws, eff, out, |u| e2m1_8(u), term)
}

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn lanes_lookup(
    xs: &[f32],
    ws: Option<&[f32]>,
    eff: &[f32],
    out: &mut [[f32; 8]],
    (thresholds, sorted): (&[f32; 15], &[f32; 16]),
    term: impl Fn(f32, f32) -> f32,
) {
    let lo = _mm256_loadu_ps(sorted.as_ptr());
    let hi = _mm256_loadu_ps(sorted.as_ptr().add(8));
    lanes8!(xs, ws, eff, out, |u| nearest8(u, thresholds, lo, hi), term)
}
