//! The mse search's error sums in AVX2 intrinsics (see `search/mod.rs`): eight lanes in one
//! register, exactly the lanes of the portable loop, and the lanes combined in its order, so the
//! sums are the same bits. Written out because the compiler's own vectorization of the portable
//! loop stays at four lanes and combines each candidate's lanes one by one.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use crate::search::cands::MAX_CANDIDATES;
use crate::search::values::reciprocal;
use crate::search::values::Dequant;

/// Candidate slots, rounded up to whole groups of eight for [`combine8`].
const SLOTS: usize = MAX_CANDIDATES.div_ceil(8) * 8;

/// For each effective scale `eff[j]`, Σ w·(u − q(u))² over one chunk (≤ CHUNK elements), element
/// i into lane i % 8, the lanes combined pairwise, into `sums[j]`. The sum of a scale whose
/// reciprocal overflows is meaningless (the caller's error is +inf for it).
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn chunk_sums<Q: Dequant>(
    q: Q,
    xs: &[f32],
    ws: Option<&[f32]>,
    eff: &[f32],
    sums: &mut [f32],
) {
    chunk_sums_inline(q, xs, ws, eff, sums)
}

/// [`chunk_sums`] inlined into its caller, which must have AVX2 enabled (else the intrinsics
/// stay calls): the block search, so its sums stay in registers.
///
/// # Safety
/// The CPU must support AVX2.
#[inline(always)]
pub(crate) unsafe fn chunk_sums_inline<Q: Dequant>(
    q: Q,
    xs: &[f32],
    ws: Option<&[f32]>,
    eff: &[f32],
    sums: &mut [f32],
) {
    let k = eff.len().min(MAX_CANDIDATES);
    let mut acc = [_mm256_setzero_ps(); SLOTS];
    // The common blocks (16 and 32 unweighted values) with their vectors loaded once and the
    // loops unrolled.
    match (xs.len(), ws) {
        (32, None) => fixed::<Q, 4>(q, xs, &eff[..k], &mut acc),
        (16, None) => fixed::<Q, 2>(q, xs, &eff[..k], &mut acc),
        _ => {
            for (a, &e) in acc.iter_mut().zip(&eff[..k]) {
                *a = match ws {
                    None => lanes::<Q, false>(q, xs, None, reciprocal(e)),
                    Some(w) => lanes::<Q, true>(q, xs, Some(w), reciprocal(e)),
                };
            }
        }
    }
    let mut out = [0.0f32; SLOTS];
    for g in 0..k.div_ceil(8) {
        let a = &acc[8 * g..8 * g + 8];
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * g), combine8(a));
    }
    sums[..k].copy_from_slice(&out[..k]);
}

/// [`lanes`] of an unweighted run of exactly 8·N values, for each candidate into `acc`.
#[inline(always)]
unsafe fn fixed<Q: Dequant, const N: usize>(q: Q, xs: &[f32], eff: &[f32], acc: &mut [__m256]) {
    // A loop, not `array::from_fn`: its closure would not inherit AVX2.
    let mut x = [_mm256_setzero_ps(); N];
    for (i, v) in x.iter_mut().enumerate() {
        *v = _mm256_loadu_ps(xs.as_ptr().add(8 * i));
    }
    let zero = _mm256_setzero_ps();
    for (a, &e) in acc.iter_mut().zip(eff) {
        let mut s = zero;
        let rv = _mm256_set1_ps(reciprocal(e));
        for &xv in &x {
            s = _mm256_add_ps(s, term::<Q, false>(q, xv, zero, rv));
        }
        *a = s;
    }
}

/// The eight lanes of Σ w·(u − q(u))², u = x · r.
#[inline(always)]
unsafe fn lanes<Q: Dequant, const W: bool>(q: Q, xs: &[f32], ws: Option<&[f32]>, r: f32) -> __m256 {
    let rv = _mm256_set1_ps(r);
    let wp = ws.map_or(std::ptr::null(), |w| w.as_ptr());
    let n = xs.len();
    let full = n / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < full {
        let x = _mm256_loadu_ps(xs.as_ptr().add(i));
        let w = if W {
            _mm256_loadu_ps(wp.add(i))
        } else {
            _mm256_setzero_ps()
        };
        acc = _mm256_add_ps(acc, term::<Q, W>(q, x, w, rv));
        i += 8;
    }
    if full < n {
        // The last n % 8 elements into lanes 0.., the other lanes adding +0 (which leaves a
        // sum of non-negative terms as it is), whatever q(0) is.
        let live = _mm256_cmpgt_epi32(
            _mm256_set1_epi32((n - full) as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let x = _mm256_maskload_ps(xs.as_ptr().add(full), live);
        let w = if W {
            _mm256_maskload_ps(wp.add(full), live)
        } else {
            _mm256_setzero_ps()
        };
        let t = _mm256_and_ps(term::<Q, W>(q, x, w, rv), _mm256_castsi256_ps(live));
        acc = _mm256_add_ps(acc, t);
    }
    acc
}

/// w·(u − q(u))² of eight elements, u = x · r. A function, not a closure: a closure would not
/// inherit the caller's AVX2 and its intrinsics would stay calls.
#[inline(always)]
unsafe fn term<Q: Dequant, const W: bool>(q: Q, x: __m256, w: __m256, rv: __m256) -> __m256 {
    let u = _mm256_mul_ps(x, rv);
    let t = _mm256_sub_ps(u, q.qv8(u));
    let tt = _mm256_mul_ps(t, t);
    if W {
        _mm256_mul_ps(w, tt)
    } else {
        tt
    }
}

/// Eight candidates' lanes combined, each as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)): `hadd`
/// adds neighbouring lanes within each half, so two rounds of it give every candidate's
/// (l0+l1)+(l2+l3) in the low half and (l4+l5)+(l6+l7) in the high half.
#[inline(always)]
unsafe fn combine8(a: &[__m256]) -> __m256 {
    let h01 = _mm256_hadd_ps(a[0], a[1]);
    let h23 = _mm256_hadd_ps(a[2], a[3]);
    let h45 = _mm256_hadd_ps(a[4], a[5]);
    let h67 = _mm256_hadd_ps(a[6], a[7]);
    // [c0 c1 c2 c3 | c0' c1' c2' c3'] for candidates 0-3, then 4-7 (c the low four lanes' sum,
    // c' the high four's).
    let q0 = _mm256_hadd_ps(h01, h23);
    let q1 = _mm256_hadd_ps(h45, h67);
    let lo = _mm256_permute2f128_ps::<0x20>(q0, q1);
    let hi = _mm256_permute2f128_ps::<0x31>(q0, q1);
    _mm256_add_ps(lo, hi)
}
