//! The one-pass kernel's AVX2 path for whole blocks of a multiple of 8 values (block-32 int8,
//! MX formats, ...): eight blocks at a time.
//!
//! Every such block (16 and 32, the common case; 64, 128, ... as GPTQ-style groups; 8, 24,
//! 40, ...) takes a path with no per-block branch: the eight blocks' maxima as integer maxima
//! of the |x| bit patterns (for finite values the same order as the floats; a NaN or an
//! infinity shows as a maximum at or past the infinity's pattern, so one compare finds a group
//! with a non-finite value), their scales rounded in vector lanes, then each block divided by
//! its scale (broadcast from the stored vector), encoded,
//! packed to bytes and stored. A group with a non-finite value or a zero scale (the zero rule)
//! takes the general path, block by block, which gives the same bits on every input: the fast
//! path only skips the checks that group needs.

use std::arch::x86_64::*;

use crate::codec::{encode_run, Encode};
use crate::kernels::lanes::{
    checked_scales8, finite_and_nonzero, in_range8, one_at_a_time, scales8, store16, store8,
    store_codes, two_level_scales8,
};
use crate::kernels::piece::{FusedKernel, Piece};
use crate::simd::x86;
use crate::simd::x86::effective8;
use crate::simd::x86_runs;

/// Whether blocks of `m` values back to back take an eight-blocks kernel:
/// [`measure_encode_groups`] for a multiple of 8, `fused_narrow`'s for a short length that is
/// not one.
pub(crate) fn blocks_of(m: usize) -> bool {
    eight_at_a_time(m) || crate::kernels::fused_narrow::narrow(m)
}

/// Whole blocks of `m` values back to back ([`blocks_of`]), max |x| calibration: the kernel
/// for their length. Returns whether any input was non-finite.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn measure_encode_blocks<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    m: usize,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    if eight_at_a_time(m) {
        measure_encode_groups(codec, k, m, xs, sc, out)
    } else {
        crate::kernels::fused_narrow::measure_encode_narrow(codec, k, m, xs, sc, out)
    }
}

/// One-pass kernel of a piece whose rows end in a partial block (a row length longer than
/// `bc`, which does not divide it, [`blocks_of`]; rows mapping straight to scale rows): each
/// row's whole blocks by [`measure_encode_blocks`], then its last, short block on its own. A
/// piece is whole rows or a block-aligned part of one row, so each of its row runs starts a
/// block. Returns whether any input was non-finite.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn measure_encode_rows<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    p: &Piece,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let (n, bc) = (k.layout.row_len(), k.layout.block_cols());
    let mut bad = false;
    let mut pos = p.start;
    while pos < p.start + p.len {
        let row = pos / n;
        let run_end = (p.start + p.len).min((row + 1) * n);
        let col = pos - row * n;
        debug_assert!(col.is_multiple_of(bc), "a row run starts a block");
        let (i, len) = (pos - p.start, run_end - pos);
        let s = k.layout.grid_row_offset(row) + col / bc - p.scale0;
        let whole = len - len % bc;
        let r = i..i + whole;
        bad |= measure_encode_blocks(codec, k, bc, &xs[r.clone()], &mut sc[s..s + whole / bc], {
            &mut out[r]
        });
        if whole < len {
            let (r, last) = (i + whole..i + len, s + whole / bc);
            let (run, o) = (&xs[r.clone()], &mut out[r]);
            bad |= one_at_a_time(codec, k, len - whole, run, &mut sc[last..last + 1], o);
        }
        pos = run_end;
    }
    bad
}

/// One-pass kernel of a piece (`xs`, its scales `sc`, its codes `out`, one a byte) whose
/// blocks are all whole runs of `bc` values, `bc` a multiple of 8. Returns whether any input
/// was non-finite.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn measure_encode_groups<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    bc: usize,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let blocks = xs.len() / bc;
    assert!(blocks * bc == xs.len() && sc.len() == blocks && out.len() == xs.len());
    let mut bad = false;
    let fast = eight_at_a_time(bc);
    // Each group is measured one group ahead of its encode: the chain from its maxima to its
    // scales (fold, division, rounding, checks) is long, and issued before the encode of the
    // group before it, it runs beside that encode instead of holding up its own.
    // In bounds: blocks 0..8 lie within xs.
    let mut cur = if fast && blocks >= 8 {
        measured8(codec, k, xs.as_ptr(), bc)
    } else {
        None
    };
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within xs, sc and out, and blocks b + 8..b + 16 (when
        // measured) within xs.
        let x0 = xs.as_ptr().add(b * bc);
        let o0 = out.as_mut_ptr().add(b * bc);
        let s0 = sc.as_mut_ptr().add(b);
        let next = if fast && b + 16 <= blocks {
            measured8(codec, k, x0.add(8 * bc), bc)
        } else {
            None
        };
        if bc != 16 && bc != 32 {
            x86::prefetch(x0.wrapping_add(x86::PREFETCH_AHEAD), 8 * bc);
        }
        match cur {
            Some(plan) => {
                _mm256_storeu_ps(s0, plan.e);
                encode_planned(codec, x0, bc, &plan, o0, k.stream);
            }
            None => {
                bad |= group_general(codec, k, &xs[b * bc..(b + 8) * bc], &mut sc[b..b + 8], {
                    &mut out[b * bc..(b + 8) * bc]
                })
            }
        }
        cur = next;
        b += 8;
    }
    bad | one_at_a_time(
        codec,
        k,
        bc,
        &xs[b * bc..],
        &mut sc[b..],
        &mut out[b * bc..],
    )
}

/// Eight blocks, each a run of `bc` values, one at a time after their scales: any input.
#[inline(always)]
unsafe fn group_general<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let bc = xs.len() / 8;
    let alpha = x86::max_abs_8runs(xs.as_ptr(), bc);
    _mm256_storeu_ps(sc.as_mut_ptr(), scales8(k, alpha));
    let mut bad = false;
    for (j, &e) in sc.iter().enumerate() {
        let r = j * bc..(j + 1) * bc;
        let (run, o) = (&xs[r.clone()], &mut out[r]);
        bad |= x86_runs::encode_run_or_zero(codec, run, e, o, k.stream);
    }
    bad
}

/// Whether blocks of `bc` values take [`measured8`] and [`encode_group_of`]: any multiple of
/// 8 (whole vectors a block).
#[inline(always)]
pub(crate) fn eight_at_a_time(bc: usize) -> bool {
    bc.is_multiple_of(8)
}

/// The [`GroupPlan`] of eight blocks of `bc` values from `x0` ([`eight_at_a_time`]), from their
/// maxima and stored scales, when every value is finite and every scale non-zero (the group's
/// fast path); None otherwise (the caller then runs [`group_general`]).
#[inline(always)]
unsafe fn measured8<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    x0: *const f32,
    bc: usize,
) -> Option<GroupPlan> {
    let bits = max_abs_bits_8blocks(x0, bc);
    let e = checked_scales8(k, bits)?;
    Some(plan8(codec, bits, e))
}

/// The largest |x| bit pattern of each of eight blocks of `bc` values (a multiple of 8)
/// from `x0`: lane j is block j's; the common lengths 8, 16 and 32 as constants.
#[inline(always)]
unsafe fn max_abs_bits_8blocks(x0: *const f32, bc: usize) -> __m256i {
    match bc {
        8 => x86::max_abs_bits_8runs::<1>(x0),
        16 => x86::max_abs_bits_8runs::<2>(x0),
        32 => x86::max_abs_bits_8runs::<4>(x0),
        _ => x86::max_abs_bits_8runs_len(x0, bc),
    }
}

/// [`encode_group`] of eight blocks of `bc` values, a multiple of 8: 32 values at a time
/// where 32 divides `bc`, else 16 where 16 does, else 8; the common lengths 8, 16 and 32 as
/// constants.
#[inline(always)]
pub(crate) unsafe fn encode_group_of<C: Encode>(
    codec: C,
    x0: *const f32,
    bc: usize,
    bits: __m256i,
    e: __m256,
    o0: *mut u8,
    stream: bool,
) {
    encode_planned(codec, x0, bc, &plan8(codec, bits, e), o0, stream);
}

/// How a group of eight blocks is encoded, worked out from their maxima and scales alone, so
/// that it can be made a group ahead of the encode.
#[derive(Clone, Copy)]
struct GroupPlan {
    /// The blocks' scales: every lane non-zero, every value of the blocks finite.
    e: __m256,
    /// No quotient needs clamping ([`in_range8`]).
    in_range: bool,
    /// `d` holds the exact reciprocals of `e`, to multiply by; else `d` is `e`, to divide by.
    mul: bool,
    d: __m256,
    /// Integer codes by the checked reciprocal ([`x86::int_codes8_recip`]) where it applies.
    recip: Option<__m256>,
}

/// The [`GroupPlan`] of eight blocks with scales `e` (every lane non-zero, every value finite;
/// `bits`: the blocks' maxima of the |x| bit patterns).
#[inline(always)]
unsafe fn plan8<C: Encode>(codec: C, bits: __m256i, e: __m256) -> GroupPlan {
    let in_range = in_range8(codec, bits, e);
    let (mul, d) = x86::divisor_lanes(e);
    let recip = if !mul && codec.int_range().is_some() && x86::checked_reciprocal_lanes(e) {
        Some(_mm256_div_ps(_mm256_set1_ps(1.0), e))
    } else {
        None
    };
    GroupPlan {
        e,
        in_range,
        mul,
        d,
        recip,
    }
}

/// [`encode_group_of`] by a plan already made.
#[inline(always)]
unsafe fn encode_planned<C: Encode>(
    codec: C,
    x0: *const f32,
    bc: usize,
    plan: &GroupPlan,
    o0: *mut u8,
    stream: bool,
) {
    match bc {
        8 => encode_group::<C, 1>(codec, x0, 8, plan, o0, stream),
        16 => encode_group::<C, 2>(codec, x0, 16, plan, o0, stream),
        32 => encode_group::<C, 4>(codec, x0, 32, plan, o0, stream),
        _ if bc.is_multiple_of(32) => encode_group::<C, 4>(codec, x0, bc, plan, o0, stream),
        _ if bc.is_multiple_of(16) => encode_group::<C, 2>(codec, x0, bc, plan, o0, stream),
        _ => encode_group::<C, 1>(codec, x0, bc, plan, o0, stream),
    }
}

/// Codes of eight blocks of `bc` values from `x0` (a multiple of 8 · V, V = 1, 2 or 4) into
/// `o0`, block j divided by lane j of the plan's scales, `8 * V` values at a time. `stream`:
/// non-temporal stores where `o0` allows them.
#[inline(always)]
unsafe fn encode_group<C: Encode, const V: usize>(
    codec: C,
    x0: *const f32,
    bc: usize,
    plan: &GroupPlan,
    o0: *mut u8,
    stream: bool,
) {
    // Non-temporal stores need 16-byte alignment (numpy's storage has it; runs of 16 or 32
    // codes keep it, and blocks of 8 the 8 bytes of their `_mm_stream_si64` stores).
    let stream = stream && (o0 as usize).is_multiple_of(16);
    let &GroupPlan {
        e,
        in_range,
        mul,
        d,
        recip,
    } = plan;
    if let (Some(r), Some(range)) = (recip, codec.int_range()) {
        if in_range {
            encode_8blocks_recip::<C, V, true>(codec, x0, bc, e, r, range, o0, stream);
        } else {
            encode_8blocks_recip::<C, V, false>(codec, x0, bc, e, r, range, o0, stream);
        }
        return;
    }
    match (mul, in_range) {
        (true, true) => encode_8blocks::<C, V, true, true>(codec, x0, bc, d, o0, stream),
        (true, false) => encode_8blocks::<C, V, true, false>(codec, x0, bc, d, o0, stream),
        (false, true) => encode_8blocks::<C, V, false, true>(codec, x0, bc, d, o0, stream),
        (false, false) => encode_8blocks::<C, V, false, false>(codec, x0, bc, d, o0, stream),
    }
}

/// Codes of whole blocks of `bc` values, a multiple of 8 (`xs`, `out` one code a byte) against
/// given effective scales `eff`, one a block (explicit scales: no measuring): eight blocks at
/// a time by the one-pass kernel's encode, a group with a zero scale (the zero rule) or a
/// non-finite value block by block. The same bits as [`encode_run`] block by block. Returns
/// whether any input was non-finite.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn encode_groups_given<C: Encode>(
    codec: C,
    bc: usize,
    xs: &[f32],
    eff: &[f32],
    out: &mut [u8],
    stream: bool,
) -> bool {
    let blocks = eff.len();
    assert!(eight_at_a_time(bc), "blocks of a multiple of 8 values");
    assert!(
        xs.len() == blocks * bc && out.len() == xs.len(),
        "whole blocks"
    );
    let mut bad = false;
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within xs, eff and out.
        let (x0, o0) = (xs.as_ptr().add(b * bc), out.as_mut_ptr().add(b * bc));
        let e = _mm256_loadu_ps(eff.as_ptr().add(b));
        let bits = max_abs_bits_8blocks(x0, bc);
        if !finite_and_nonzero(bits, e) {
            for (j, &e) in eff.iter().enumerate().skip(b).take(8) {
                let r = j * bc..(j + 1) * bc;
                let (run, o) = (&xs[r.clone()], &mut out[r]);
                bad |= x86_runs::encode_run_or_zero(codec, run, e, o, stream);
            }
        } else {
            encode_group_of(codec, x0, bc, bits, e, o0, stream);
        }
        b += 8;
    }
    for (j, &e) in eff.iter().enumerate().skip(b) {
        let r = j * bc..(j + 1) * bc;
        let (run, o) = (&xs[r.clone()], &mut out[r]);
        bad |= x86_runs::encode_run_or_zero(codec, run, e, o, stream);
    }
    bad
}

/// Codes of eight blocks of `bc` values (a multiple of 8 · V) from `x0` into `o0`: block j's
/// values divided by lane j of `d` (multiplied by it when `MUL`), encoded (without the clamp
/// when `IN_RANGE`: every quotient below `codec.unclamped_below()`), packed to bytes in order,
/// `8 * V` at a time; stored non-temporally with `stream` (`o0` 16-byte aligned). Loops, not
/// closures: a closure is not reliably inlined into the AVX2 caller (the lane search calls
/// this too).
#[inline(always)]
pub(crate) unsafe fn encode_8blocks<
    C: Encode,
    const V: usize,
    const MUL: bool,
    const IN_RANGE: bool,
>(
    codec: C,
    x0: *const f32,
    bc: usize,
    d: __m256,
    o0: *mut u8,
    stream: bool,
) {
    let mut ds = [0.0f32; 8];
    _mm256_storeu_ps(ds.as_mut_ptr(), d);
    for (j, &dj) in ds.iter().enumerate() {
        let dv = _mm256_set1_ps(dj);
        for run in (j * bc..(j + 1) * bc).step_by(8 * V) {
            let (x, o) = (x0.add(run), o0.add(run));
            let mut c = [_mm256_setzero_si256(); V];
            for (t, ct) in c.iter_mut().enumerate() {
                // One request a 64-byte line.
                if (run + 8 * t) % 16 == 0 {
                    x86::prefetch_line(x.wrapping_add(8 * t + x86::PREFETCH_AHEAD));
                }
                let v = _mm256_loadu_ps(x.add(8 * t));
                let q = if MUL {
                    _mm256_mul_ps(v, dv)
                } else {
                    _mm256_div_ps(v, dv)
                };
                *ct = if IN_RANGE {
                    codec.encode8_in_range(q)
                } else {
                    codec.encode8(q)
                };
            }
            store_codes(&c, o, stream);
        }
    }
}

/// [`encode_8blocks`] of integer codes with division by the lanes of `e`, computed as the
/// checked multiply by their reciprocals `r` ([`x86::int_codes8_recip`]). The flags of all
/// eight blocks are gathered and tested once: a group with a flagged value (a few in a hundred
/// of random data, where a value is flagged about once in 7,000) is encoded again by the
/// division, over the codes already stored. One test a group instead of one a block kept the
/// branch and its compare off the loop of every block.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the kernel's state, all of it read in the loop
unsafe fn encode_8blocks_recip<C: Encode, const V: usize, const IN_RANGE: bool>(
    codec: C,
    x0: *const f32,
    bc: usize,
    e: __m256,
    r: __m256,
    (lo, hi): (f32, f32),
    o0: *mut u8,
    stream: bool,
) {
    let mut rs = [0.0f32; 8];
    _mm256_storeu_ps(rs.as_mut_ptr(), r);
    let (lov, hiv) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    let mut near = _mm256_set1_epi32(-1);
    for (j, &rj) in rs.iter().enumerate() {
        let rv = _mm256_set1_ps(rj);
        for run in (j * bc..(j + 1) * bc).step_by(8 * V) {
            let (x, o) = (x0.add(run), o0.add(run));
            let mut c = [_mm256_setzero_si256(); V];
            for (t, ct) in c.iter_mut().enumerate() {
                // One request a 64-byte line.
                if (run + 8 * t) % 16 == 0 {
                    x86::prefetch_line(x.wrapping_add(8 * t + x86::PREFETCH_AHEAD));
                }
                let v = _mm256_loadu_ps(x.add(8 * t));
                *ct = x86::int_codes8_recip::<IN_RANGE>(v, rv, lov, hiv, &mut near);
            }
            if V == 1 {
                // i32 codes within [-128, 127]: the signed packs keep them.
                let w = _mm256_packs_epi32(c[0], c[0]);
                let w =
                    _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
                store8(o, w, stream);
            } else if V == 4 {
                x86::store32(
                    o,
                    x86::recip_bytes32(c[0], c[1], c[V - 2], c[V - 1]),
                    stream,
                );
            } else {
                store16(o, x86::recip_bytes16(c[0], c[V - 1]), stream);
            }
        }
    }
    if x86::recip_was_near(near) {
        encode_8blocks::<C, V, false, IN_RANGE>(codec, x0, bc, e, o0, stream);
    }
}

/// Pass 2 of a two-level scheme on a piece of whole blocks of `bc` = 16 or 32 values: block scales
/// b_i from the amplitudes `sc` holds on entry (replaced by the b_i, in place: no second
/// array of the grid's size), each block's values against
/// e_i = min(b_i × g, f32::MAX) (codes into `out`, one a byte). Returns whether any input was
/// non-finite.
///
/// The amplitudes must be pass 1's: each block's largest |x| (minmax), so that their bit
/// patterns are the blocks' maxima of the |x| patterns, which the encode's range test takes
/// instead of measuring them again.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn two_level_piece<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    g: f32,
    bc: usize,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let blocks = xs.len() / bc;
    assert!(blocks * bc == xs.len() && sc.len() == blocks);
    assert!(out.len() == xs.len() && (bc == 16 || bc == 32));
    let mut bad = false;
    // As in `measure_encode_groups`, each group's scales and plan are worked out a group ahead
    // of its encode, so that their chain of divisions runs beside the encode before it.
    // In bounds: amplitudes 0..8 lie within sc.
    let mut cur = if blocks >= 8 {
        Some(two_level_group(codec, k, g, _mm256_loadu_ps(sc.as_ptr())))
    } else {
        None
    };
    let mut b = 0;
    while let Some(group) = cur {
        // In bounds: blocks b..b + 8 lie within sc, xs and out, and amplitudes b + 8..b + 16
        // (when loaded) within sc.
        let x0 = xs.as_ptr().add(b * bc);
        let o0 = out.as_mut_ptr().add(b * bc);
        cur = if b + 16 <= blocks {
            let alpha = _mm256_loadu_ps(sc.as_ptr().add(b + 8));
            Some(two_level_group(codec, k, g, alpha))
        } else {
            None
        };
        x86::prefetch(x0.wrapping_add(x86::PREFETCH_AHEAD), 8 * bc);
        _mm256_storeu_ps(sc.as_mut_ptr().add(b), group.bs);
        bad |= group.non_finite;
        match group.plan {
            // The usual group (every value finite, no scale zero): the one-level kernel's
            // encode, which skips the clamp where no quotient needs it and multiplies by a
            // checked reciprocal instead of dividing where it can (integer codes).
            Some(plan) => encode_planned(codec, x0, bc, &plan, o0, false),
            // The zero rule: a block whose e is 0 gets the code of 0 (its quotients are
            // masked away).
            None if bc == 16 => encode_8blocks_masked::<C, 2>(codec, x0, group.e, group.keep, o0),
            None => encode_8blocks_masked::<C, 4>(codec, x0, group.e, group.keep, o0),
        }
        b += 8;
    }
    for (j, s) in sc.iter_mut().enumerate().skip(b) {
        let r = j * bc..(j + 1) * bc;
        *s = k.two_level_scale(*s, g);
        let e = crate::scale::effective_scale(*s, g);
        bad |= encode_run(codec, &xs[r.clone()], e, &mut out[r]);
    }
    bad
}

/// One group of eight two-level blocks in pass 2, before its encode: block scales `bs` from
/// the amplitudes, effective scales `e`, the lanes whose e is not zero (`keep`), whether a
/// value is not finite, and the plan of the usual group (none of either).
#[derive(Clone, Copy)]
struct TwoLevelGroup {
    bs: __m256,
    e: __m256,
    keep: __m256i,
    non_finite: bool,
    plan: Option<GroupPlan>,
}

#[inline(always)]
unsafe fn two_level_group<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    g: f32,
    alpha: __m256,
) -> TwoLevelGroup {
    let bs = two_level_scales8(k, g, alpha);
    let e = effective8(bs, g);
    // The blocks' maxima of the |x| patterns are the amplitudes' patterns: reducing the
    // eight blocks again was about a quarter of this pass's instructions.
    let bits = _mm256_castps_si256(alpha);
    let non_finite = _mm256_cmpgt_epi32(bits, _mm256_set1_epi32(0x7F7F_FFFF));
    let keep = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_NEQ_UQ>(e, _mm256_setzero_ps()));
    let usual = _mm256_movemask_epi8(_mm256_or_si256(
        non_finite,
        _mm256_cmpeq_epi32(keep, _mm256_setzero_si256()),
    )) == 0;
    TwoLevelGroup {
        bs,
        e,
        keep,
        non_finite: _mm256_movemask_epi8(non_finite) != 0,
        plan: if usual {
            Some(plan8(codec, bits, e))
        } else {
            None
        },
    }
}

/// [`encode_8blocks`] (division) with block j's bytes kept where lane j of `keep` is all ones,
/// each the code of 0 (the zero rule) where it is 0.
#[inline(always)]
unsafe fn encode_8blocks_masked<C: Encode, const V: usize>(
    codec: C,
    x0: *const f32,
    d: __m256,
    keep: __m256i,
    o0: *mut u8,
) {
    let (mut ds, mut ks) = ([0.0f32; 8], [0i32; 8]);
    _mm256_storeu_ps(ds.as_mut_ptr(), d);
    _mm256_storeu_si256(ks.as_mut_ptr() as *mut __m256i, keep);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    // Not always 0: a codebook's is the index of its entry nearest +0.
    let zero = _mm256_set1_epi8(codec.zero_code() as i8);
    for j in 0..8 {
        let dv = _mm256_set1_ps(ds[j]);
        let kv = _mm256_set1_epi32(ks[j]);
        let (x, o) = (x0.add(j * 8 * V), o0.add(j * 8 * V));
        let c: [__m256i; V] = std::array::from_fn(|t| {
            codec.encode8(_mm256_div_ps(_mm256_loadu_ps(x.add(8 * t)), dv))
        });
        if V == 4 {
            let ab = _mm256_packus_epi32(c[0], c[1]);
            let cd = _mm256_packus_epi32(c[2], c[3]);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
            _mm256_storeu_si256(o as *mut __m256i, _mm256_blendv_epi8(zero, bytes, kv));
        } else {
            let ab = _mm256_packus_epi32(c[0], c[1]);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, ab), order);
            let bytes = _mm256_blendv_epi8(zero, bytes, kv);
            _mm_storeu_si128(o as *mut __m128i, _mm256_castsi256_si128(bytes));
        }
    }
}
