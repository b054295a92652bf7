//! The mse search (`search/mod.rs`) of eight blocks at once, block j in AVX2 lane j: for
//! blocks of 16 or 32 values laid end to end (1-D blocks along the last axis, whole in every
//! row), the common case, where one block at a time spends as long on its candidates, their
//! sums and the pick as on its error loop.
//!
//! The eight blocks are transposed once (vector i holds element i of each block), so every step
//! of the definition is a vertical operation on eight blocks: candidate k of each block is lane
//! j of one vector, a block's lane l sums elements l, l + 8, ... down the vectors, the lanes
//! combine ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) vector by vector, e²·S is computed in f64 lanes
//! and the first least error is kept with compares and blends. Same operations in the same
//! order as the portable search, so the same bits (tested against it).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use crate::codec::Encode;
use crate::layout::Layout;
use crate::search::cands::Ctx;
use crate::search::cands::MAX_CANDIDATES;
use crate::search::values::{Bracket8, Dequant};
use crate::simd::x86;
use crate::simd::x86_runs;

/// Whether `layout`'s blocks are whole runs of 16 or 32 values end to end (block b at b · bc),
/// the lane kernel's case.
pub(crate) fn fits(layout: &Layout) -> bool {
    let bc = layout.block_cols();
    !layout.per_tensor
        && layout.rows_map_directly()
        && (bc == 16 || bc == 32)
        && layout.num_elements > 0
        && layout.row_len().is_multiple_of(bc)
        && crate::simd::has_avx2()
        && crate::simd::has_f16c()
}

/// The searched stored scales of the whole blocks of `xs` (each `xs.len() / sc.len()` = 16 or
/// 32 values, weights `ws` alike) into `sc`, from their amplitudes `alpha` (max |x|, one a
/// block).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn search_run<Q: Dequant>(
    q: Q,
    ctx: &Ctx,
    xs: &[f32],
    ws: Option<&[f32]>,
    alpha: &[f32],
    sc: &mut [f32],
) {
    let blocks = sc.len();
    assert!(alpha.len() == blocks && blocks > 0 && ws.is_none_or(|w| w.len() == xs.len()));
    match (xs.len() / blocks, ws) {
        (16, None) => run::<Q, 2, false>(q, ctx, xs, None, alpha, sc),
        (16, Some(w)) => run::<Q, 2, true>(q, ctx, xs, Some(w), alpha, sc),
        (32, None) => run::<Q, 4, false>(q, ctx, xs, None, alpha, sc),
        (32, Some(w)) => run::<Q, 4, true>(q, ctx, xs, Some(w), alpha, sc),
        _ => panic!("blocks of 16 or 32 values"),
    }
}

/// [`search_run`] for blocks of `8 * V` values: eight blocks at a time, the last few padded with
/// empty blocks (amplitude 0: every candidate 0, whatever their sums; their scales dropped).
#[inline(always)]
unsafe fn run<Q: Dequant, const V: usize, const W: bool>(
    q: Q,
    ctx: &Ctx,
    xs: &[f32],
    ws: Option<&[f32]>,
    alpha: &[f32],
    sc: &mut [f32],
) {
    let bc = 8 * V;
    let blocks = sc.len();
    assert_eq!(xs.len(), blocks * bc);
    let wp = ws.map_or(std::ptr::null(), |w| w.as_ptr());
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within xs (and ws), alpha and sc.
        let a = _mm256_loadu_ps(alpha.as_ptr().add(b));
        let w0 = if W { wp.add(b * bc) } else { wp };
        let s = search8::<Q, V, W>(q, ctx, xs.as_ptr().add(b * bc), w0, a);
        _mm256_storeu_ps(sc.as_mut_ptr().add(b), s);
        b += 8;
    }
    if b < blocks {
        let n = blocks - b;
        let (mut x, mut w) = ([0.0f32; 8 * 32], [0.0f32; 8 * 32]);
        let mut a = [0.0f32; 8];
        x[..n * bc].copy_from_slice(&xs[b * bc..]);
        if let Some(ws) = ws {
            w[..n * bc].copy_from_slice(&ws[b * bc..]);
        }
        a[..n].copy_from_slice(&alpha[b..]);
        let s = search8::<Q, V, W>(q, ctx, x.as_ptr(), w.as_ptr(), _mm256_loadu_ps(a.as_ptr()));
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), s);
        sc[b..].copy_from_slice(&out[..n]);
    }
}

/// One group of eight blocks in the search: the inputs (and weights) transposed, vector
/// 8t + l holding element 8t + l of each block, and, where every input has one, their brackets
/// (codebooks), which the encode after the search reuses.
pub(crate) struct Group {
    xt: [__m256; 32],
    wt: [__m256; 32],
    // Uninitialized: filling 32 brackets would cost as much as a candidate's sums; only the
    // first 8 * V are written, and read only after.
    br: [MaybeUninit<Bracket8>; 32],
    bracketed: bool,
}

impl Group {
    pub(crate) fn new() -> Self {
        // SAFETY: all-zero bits are valid vectors.
        let zero = unsafe { std::mem::zeroed::<__m256>() };
        Self {
            xt: [zero; 32],
            wt: [zero; 32],
            br: [const { MaybeUninit::uninit() }; 32],
            bracketed: false,
        }
    }
}

/// The searched stored scales of the eight blocks of `8 * V` values from `x0` (weights from
/// `w0` when `W`), lane j block j's, from their amplitudes.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn search8<Q: Dequant, const V: usize, const W: bool>(
    q: Q,
    ctx: &Ctx,
    x0: *const f32,
    w0: *const f32,
    alpha: __m256,
) -> __m256 {
    search8_in::<Q, V, W>(q, ctx, x0, w0, alpha, &mut Group::new())
}

/// [`search8`], leaving the group's transposed inputs and brackets in `g`. A function of its
/// own (not inlined into the drivers) so that everything it inlines is compiled for AVX2
/// whatever the size of the caller.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn search8_in<Q: Dequant, const V: usize, const W: bool>(
    q: Q,
    ctx: &Ctx,
    x0: *const f32,
    w0: *const f32,
    alpha: __m256,
    g: &mut Group,
) -> __m256 {
    let zero = _mm256_setzero_ps();
    let Group {
        xt,
        wt,
        br,
        bracketed,
    } = g;
    for t in 0..V {
        transpose8(x0.add(8 * t), 8 * V, &mut xt[8 * t..8 * t + 8]);
        if W {
            transpose8(w0.add(8 * t), 8 * V, &mut wt[8 * t..8 * t + 8]);
        }
    }
    let mut cand = [zero; MAX_CANDIDATES];
    let n = ctx.candidates8(alpha, &mut cand);
    let (mut best_lo, mut best_hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let (mut err_lo, mut err_hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    // The effective scales, and their sums two candidates at a time (each vector loaded once
    // for both).
    let mut eff = [zero; MAX_CANDIDATES];
    for (e, &stored) in eff.iter_mut().zip(&cand[..n]) {
        *e = match ctx.global() {
            None => stored,
            // effective_scale in lanes.
            Some(g) => _mm256_min_ps(
                _mm256_mul_ps(stored, _mm256_set1_ps(g)),
                _mm256_set1_ps(f32::MAX),
            ),
        };
    }
    // The reciprocals the quotients multiply by (`search::reciprocal`).
    let mut rec = [zero; MAX_CANDIDATES];
    for (r, &e) in rec.iter_mut().zip(&eff[..n]) {
        *r = _mm256_div_ps(_mm256_set1_ps(1.0), e);
    }
    let mut sum = [zero; MAX_CANDIDATES];
    // A codebook's q(u) from each input's bracket where every input has one (the usual case),
    // else by its search.
    *bracketed = Q::BRACKETS && brackets::<Q, V>(q, xt, &rec[..n], br);
    if *bracketed {
        all_sums::<Q, V, W, true>(q, xt, wt, br, alpha, &rec[..n], &mut sum);
    } else {
        all_sums::<Q, V, W, false>(q, xt, wt, br, alpha, &rec[..n], &mut sum);
    }
    for (k, &stored) in cand[..n].iter().enumerate() {
        let (e, s) = (eff[k], sum[k]);
        let inf = _mm256_cmp_ps::<_CMP_EQ_OQ>(rec[k], _mm256_set1_ps(f32::INFINITY));
        let lo = errors(lo128(e), lo128(s), lo128(inf));
        let hi = errors(hi128(e), hi128(s), hi128(inf));
        let (c_lo, c_hi) = (
            _mm256_cvtps_pd(lo128(stored)),
            _mm256_cvtps_pd(hi128(stored)),
        );
        if k == 0 {
            (best_lo, best_hi, err_lo, err_hi) = (c_lo, c_hi, lo, hi);
        } else {
            // The first of equals stays: only a strictly smaller error (never a NaN) replaces.
            let m_lo = _mm256_cmp_pd::<_CMP_LT_OQ>(lo, err_lo);
            let m_hi = _mm256_cmp_pd::<_CMP_LT_OQ>(hi, err_hi);
            best_lo = _mm256_blendv_pd(best_lo, c_lo, m_lo);
            best_hi = _mm256_blendv_pd(best_hi, c_hi, m_hi);
            err_lo = _mm256_blendv_pd(err_lo, lo, m_lo);
            err_hi = _mm256_blendv_pd(err_hi, hi, m_hi);
        }
    }
    // f32 → f64 → f32 is exact.
    _mm256_set_m128(_mm256_cvtpd_ps(best_hi), _mm256_cvtpd_ps(best_lo))
}

/// The sums of every candidate (`rec`, the reciprocals of their effective scales) into `sum`,
/// two candidates at a time (each vector loaded once for both); q(u) from the brackets `br`
/// when `B`.
#[inline(always)]
unsafe fn all_sums<Q: Dequant, const V: usize, const W: bool, const B: bool>(
    q: Q,
    xt: &[__m256; 32],
    wt: &[__m256; 32],
    br: &[MaybeUninit<Bracket8>; 32],
    alpha: __m256,
    rec: &[__m256],
    sum: &mut [__m256; MAX_CANDIDATES],
) {
    // Whether a candidate's quotients all stay inside the value range (|x · r| ≤ α · r, as
    // multiplication rounds monotonically), where q(u) needs no clamp.
    macro_rules! inside {
        ($r:expr) => {
            q.inside8(_mm256_mul_ps(alpha, $r))
        };
    }
    let n = rec.len();
    let mut k = 0;
    while k + 2 <= n {
        let r = [rec[k], rec[k + 1]];
        [sum[k], sum[k + 1]] = if inside!(r[0]) && inside!(r[1]) {
            sums::<Q, V, W, B, 2, true>(q, xt, wt, br, r)
        } else {
            sums::<Q, V, W, B, 2, false>(q, xt, wt, br, r)
        };
        k += 2;
    }
    if k < n {
        [sum[k]] = if inside!(rec[k]) {
            sums::<Q, V, W, B, 1, true>(q, xt, wt, br, [rec[k]])
        } else {
            sums::<Q, V, W, B, 1, false>(q, xt, wt, br, [rec[k]])
        };
    }
}

/// Each input vector's [`Bracket8`] over every candidate's u (the candidates' reciprocals
/// `rec`, of which the smallest and the largest finite give each lane's extreme quotients:
/// multiplication rounds monotonically, so every other quotient lies between them; an infinite
/// one's sums are never used). False if some lane of some input has none.
///
/// The range is widened so that the bracket also holds the quotient x / e that quantizing
/// divides out for the winner ([`codes_from_brackets`]): for a normal r = RN(1/e), x / e and
/// x · r are each within half an ulp of exact values that differ by less than half an ulp, so
/// they differ by a relative 2^-22 at most, or by a subnormal ulp or two where the quotient is
/// subnormal. The extreme reciprocals scaled by 1 ∓ 2^-20 (then the products rounded) and
/// 2^-146 taken off and added cover both.
#[inline(always)]
unsafe fn brackets<Q: Dequant, const V: usize>(
    q: Q,
    xt: &[__m256; 32],
    rec: &[__m256],
    br: &mut [MaybeUninit<Bracket8>; 32],
) -> bool {
    let mut r_lo = rec[0];
    for &r in &rec[1..] {
        r_lo = _mm256_min_ps(r_lo, r);
    }
    let mut r_hi = r_lo;
    for &r in rec {
        let inf = _mm256_cmp_ps::<_CMP_EQ_OQ>(r, _mm256_set1_ps(f32::INFINITY));
        r_hi = _mm256_max_ps(r_hi, _mm256_blendv_ps(r, r_lo, inf));
    }
    let r_lo = _mm256_mul_ps(r_lo, _mm256_set1_ps(1.0 - 2f32.powi(-20)));
    let r_hi = _mm256_mul_ps(r_hi, _mm256_set1_ps(1.0 + 2f32.powi(-20)));
    let tiny = _mm256_set1_ps(2f32.powi(-146));
    let mut far = _mm256_setzero_ps();
    for i in 0..8 * V {
        let (a, b) = (_mm256_mul_ps(xt[i], r_lo), _mm256_mul_ps(xt[i], r_hi));
        let lo = _mm256_sub_ps(_mm256_min_ps(a, b), tiny);
        let hi = _mm256_add_ps(_mm256_max_ps(a, b), tiny);
        let (bracket, f) = q.bracket8(lo, hi);
        br[i].write(bracket);
        far = _mm256_or_ps(far, f);
    }
    _mm256_testz_ps(far, far) == 1
}

#[inline(always)]
unsafe fn lo128(v: __m256) -> __m128 {
    _mm256_castps256_ps128(v)
}

#[inline(always)]
unsafe fn hi128(v: __m256) -> __m128 {
    _mm256_extractf128_ps::<1>(v)
}

/// e² · S in f64 of four blocks (`search::error`): +inf where `inf` (the reciprocal
/// overflowed).
#[inline(always)]
unsafe fn errors(e: __m128, s: __m128, inf: __m128) -> __m256d {
    let e = _mm256_cvtps_pd(e);
    let err = _mm256_mul_pd(_mm256_mul_pd(e, e), _mm256_cvtps_pd(s));
    // f32 → f64 of an all-ones pattern (a NaN) keeps the sign bit blendv reads.
    _mm256_blendv_pd(err, _mm256_set1_pd(f64::INFINITY), _mm256_cvtps_pd(inf))
}

/// S of each of eight blocks under each of `N` candidates' reciprocals `r` (lane j block j's):
/// block lane l the sum of elements l, l + 8, ... from 0 in order, the lanes combined
/// pairwise, each vector loaded once for the `N`.
// Index loops over fixed counts: they unroll, and follow the definition's element indices.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn sums<
    Q: Dequant,
    const V: usize,
    const W: bool,
    const B: bool,
    const N: usize,
    const I: bool,
>(
    q: Q,
    xt: &[__m256; 32],
    wt: &[__m256; 32],
    br: &[MaybeUninit<Bracket8>; 32],
    r: [__m256; N],
) -> [__m256; N] {
    let mut l = [[_mm256_setzero_ps(); 8]; N];
    for j in 0..8 {
        let mut acc = [_mm256_setzero_ps(); N];
        for t in 0..V {
            let i = 8 * t + j;
            for c in 0..N {
                acc[c] = _mm256_add_ps(acc[c], term::<Q, W, B, I>(q, xt[i], wt[i], &br[i], r[c]));
            }
        }
        for c in 0..N {
            l[c][j] = acc[c];
        }
    }
    let mut s = [_mm256_setzero_ps(); N];
    for c in 0..N {
        s[c] = combine(&l[c]);
    }
    s
}

/// w·(u − q(u))² of eight elements, u = x · r, q(u) from x's bracket when `B` (then `br`
/// must be written), or without the clamp when `I` (the candidate is inside the range).
#[inline(always)]
unsafe fn term<Q: Dequant, const W: bool, const B: bool, const I: bool>(
    q: Q,
    x: __m256,
    w: __m256,
    br: &MaybeUninit<Bracket8>,
    r: __m256,
) -> __m256 {
    let u = _mm256_mul_ps(x, r);
    // SAFETY (B): `brackets` wrote the bracket of every input vector the sums read.
    let d = _mm256_sub_ps(
        u,
        if B {
            br.assume_init_ref().qv8(u)
        } else if I {
            q.qv8_inside(u)
        } else {
            q.qv8(u)
        },
    );
    let tt = _mm256_mul_ps(d, d);
    if W {
        _mm256_mul_ps(w, tt)
    } else {
        tt
    }
}

/// Lanes combined pairwise, ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), vector by vector.
#[inline(always)]
unsafe fn combine(l: &[__m256; 8]) -> __m256 {
    _mm256_add_ps(
        _mm256_add_ps(_mm256_add_ps(l[0], l[1]), _mm256_add_ps(l[2], l[3])),
        _mm256_add_ps(_mm256_add_ps(l[4], l[5]), _mm256_add_ps(l[6], l[7])),
    )
}

/// The 8×8 transpose of the eight vectors at `p`, `p + stride`, ...: out[l] lane j is element l
/// of the vector j.
#[inline(always)]
unsafe fn transpose8(p: *const f32, stride: usize, out: &mut [__m256]) {
    out[..8].copy_from_slice(&transposed([
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(stride)),
        _mm256_loadu_ps(p.add(2 * stride)),
        _mm256_loadu_ps(p.add(3 * stride)),
        _mm256_loadu_ps(p.add(4 * stride)),
        _mm256_loadu_ps(p.add(5 * stride)),
        _mm256_loadu_ps(p.add(6 * stride)),
        _mm256_loadu_ps(p.add(7 * stride)),
    ]));
}

/// The 8×8 transpose of `r`: out[l] lane j is lane l of r[j].
#[inline(always)]
unsafe fn transposed(r: [__m256; 8]) -> [__m256; 8] {
    // Per 128-bit half: (a0 b0 a1 b1), (a2 b2 a3 b3), then (a0 b0 c0 d0), ... .
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// The codes (one a byte, block j's from `o0 + 8 * V * j`) of a group's eight blocks against
/// their effective scales `e`, lane j block j's, after a codebook search that bracketed every
/// input (`g.bracketed`; every reciprocal of `e` normal): u = x / e as quantizing divides it,
/// which lies in x's widened bracket ([`brackets`]), so its rank is the bracket's two compares
/// rather than the codec's fifteen. Four codes pack into a u32 per lane, and an
/// 8×8 transpose puts each block's words in order.
#[inline(always)]
unsafe fn codes_from_brackets<Q: Dequant, const V: usize>(q: Q, g: &Group, e: __m256, o0: *mut u8) {
    debug_assert!(g.bracketed);
    let mut words = [_mm256_setzero_ps(); 8];
    for (t, word) in words.iter_mut().enumerate().take(2 * V) {
        // SAFETY: `brackets` wrote the bracket of every input vector (g.bracketed).
        macro_rules! field {
            ($k:expr) => {{
                let i = 4 * t + $k;
                let u = _mm256_div_ps(g.xt[i], e);
                q.field8(g.br[i].assume_init_ref().rank8(u))
            }};
        }
        let w = _mm256_or_si256(
            _mm256_or_si256(field!(0), _mm256_slli_epi32::<8>(field!(1))),
            _mm256_or_si256(
                _mm256_slli_epi32::<16>(field!(2)),
                _mm256_slli_epi32::<24>(field!(3)),
            ),
        );
        *word = _mm256_castsi256_ps(w);
    }
    let blocks = transposed(words);
    for (j, b) in blocks.iter().enumerate() {
        let o = o0.add(8 * V * j);
        if V == 4 {
            _mm256_storeu_ps(o.cast(), *b);
        } else {
            _mm_storeu_ps(o.cast(), _mm256_castps256_ps128(*b));
        }
    }
}

/// The codes of eight blocks of `8 * V` values from `x0` into `o0`, block j's values divided by
/// lane j of `e` (none 0), with cached stores: the fused kernel's group encode (the clamp left
/// out where no quotient needs it, a checked reciprocal's multiply for integer codes, exact
/// reciprocals' for powers of two) when every value is finite (`bits`, the blocks' maxima of
/// the |x| patterns), else plain division. Not inlined, as [`search8`].
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn encode8<C: Encode, const V: usize>(
    codec: C,
    x0: *const f32,
    bits: __m256i,
    e: __m256,
    o0: *mut u8,
) {
    let non_finite = _mm256_cmpgt_epi32(bits, _mm256_set1_epi32(0x7F7F_FFFF));
    if _mm256_movemask_epi8(non_finite) == 0 {
        crate::kernels::fused_avx2::encode_group_of(codec, x0, 8 * V, bits, e, o0, false);
    } else {
        // The call fails (a NaN or infinity): any codes of the right length do.
        crate::kernels::fused_avx2::encode_8blocks::<C, V, false, false>(
            codec,
            x0,
            8 * V,
            e,
            o0,
            false,
        );
    }
}

/// The one-pass mse quantize of a piece of whole blocks (`search::quantize_searched`): each
/// eight blocks' scales searched into `sc` and their codes (one a byte) into `out` while they
/// are in cache, each block's amplitude measured as it is read. Returns whether any input was
/// non-finite (then the scales and codes are meaningless).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn search_encode<Q: Dequant, C: Encode>(
    q: Q,
    codec: C,
    ctx: &Ctx,
    xs: &[f32],
    ws: Option<&[f32]>,
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let blocks = sc.len();
    assert!(blocks > 0 && out.len() == xs.len() && ws.is_none_or(|w| w.len() == xs.len()));
    match (xs.len() / blocks, ws) {
        (16, None) => piece::<Q, C, 2, false>(q, codec, ctx, xs, None, sc, out),
        (16, Some(w)) => piece::<Q, C, 2, true>(q, codec, ctx, xs, Some(w), sc, out),
        (32, None) => piece::<Q, C, 4, false>(q, codec, ctx, xs, None, sc, out),
        (32, Some(w)) => piece::<Q, C, 4, true>(q, codec, ctx, xs, Some(w), sc, out),
        _ => panic!("blocks of 16 or 32 values"),
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn piece<Q: Dequant, C: Encode, const V: usize, const W: bool>(
    q: Q,
    codec: C,
    ctx: &Ctx,
    xs: &[f32],
    ws: Option<&[f32]>,
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let bc = 8 * V;
    let blocks = sc.len();
    assert_eq!(xs.len(), blocks * bc);
    let wp = ws.map_or(std::ptr::null(), |w| w.as_ptr());
    let mut bad = false;
    let mut group = Group::new();
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within xs (ws), out and sc.
        let x0 = xs.as_ptr().add(b * bc);
        x86::prefetch(x0.wrapping_add(x86::PREFETCH_AHEAD), 8 * bc);
        let bits = x86::max_abs_bits_8runs::<V>(x0);
        let non_finite = _mm256_cmpgt_epi32(bits, _mm256_set1_epi32(0x7F7F_FFFF));
        bad |= _mm256_movemask_epi8(non_finite) != 0;
        // A block with a NaN or infinity is measured as 0: the call fails anyway.
        let a = _mm256_castsi256_ps(_mm256_andnot_si256(non_finite, bits));
        let w0 = if W { wp.add(b * bc) } else { wp };
        let s = search8_in::<Q, V, W>(q, ctx, x0, w0, a, &mut group);
        _mm256_storeu_ps(sc.as_mut_ptr().add(b), s);
        let e = match ctx.global() {
            None => s,
            Some(g) => _mm256_min_ps(
                _mm256_mul_ps(s, _mm256_set1_ps(g)),
                _mm256_set1_ps(f32::MAX),
            ),
        };
        let o0 = out.as_mut_ptr().add(b * bc);
        // Codes from the brackets where every reciprocal is normal (finite: no zero scale),
        // so that x / e lies within the bracket of x · r.
        let r = _mm256_div_ps(_mm256_set1_ps(1.0), e);
        let normal = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(r, _mm256_set1_ps(f32::MIN_POSITIVE)),
            _mm256_cmp_ps::<_CMP_LT_OQ>(r, _mm256_set1_ps(f32::INFINITY)),
        );
        if Q::BRACKETS && group.bracketed && _mm256_movemask_ps(normal) == 0xFF {
            codes_from_brackets::<Q, V>(q, &group, e, o0);
        } else if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(e, _mm256_setzero_ps())) == 0 {
            encode8::<C, V>(codec, x0, bits, e, o0);
        } else {
            // The zero rule (all values to the code of 0, which a codebook may lack) block by
            // block.
            let mut es = [0.0f32; 8];
            _mm256_storeu_ps(es.as_mut_ptr(), e);
            for (j, &ej) in es.iter().enumerate() {
                let r = (b + j) * bc..(b + j + 1) * bc;
                bad |= x86_runs::encode_run_or_zero(codec, &xs[r.clone()], ej, &mut out[r], false);
            }
        }
        b += 8;
    }
    if b < blocks {
        let (xs, out) = (&xs[b * bc..], &mut out[b * bc..]);
        let mut a = [0.0f32; 8];
        for (j, aj) in a.iter_mut().enumerate().take(blocks - b) {
            *aj = x86::max_abs(&xs[j * bc..(j + 1) * bc]);
        }
        run::<Q, V, W>(
            q,
            ctx,
            xs,
            ws.map(|w| &w[b * bc..]),
            &a[..blocks - b],
            &mut sc[b..],
        );
        for (j, &s) in sc[b..].iter().enumerate() {
            let e = ctx.effective(s);
            let r = j * bc..(j + 1) * bc;
            bad |= x86_runs::encode_run_or_zero(codec, &xs[r.clone()], e, &mut out[r], false);
        }
    }
    bad
}

#[cfg(test)]
#[path = "lanes_tests.rs"]
mod tests;
