//! The lane helpers every eight-blocks kernel shares (`fused_avx2`, `fused_narrow`,
//! `nvfp4_avx2`, `fused_tiles`, the decode's): eight blocks' scales in vector lanes and their
//! checks, a block at a time where a group cannot go eight at a time, and the stores of codes.
//! Every function is `unsafe` for one reason: the CPU must have AVX2 and F16C (callers check).

use std::arch::x86_64::*;

use crate::codec::Encode;
use crate::kernels::piece::FusedKernel;
use crate::scale::ScaleRounding;
use crate::scheme::ScaleDtype;
use crate::simd::x86;
use crate::simd::x86_runs;

/// Blocks of `bc` values back to back (`xs`, the last one possibly shorter), each measured,
/// its stored scale worked out (into `sc`) and its codes encoded (into `out`) on its own: the
/// general path, for any input (a non-finite value, a zero scale). Returns whether any input
/// was non-finite.
#[inline(always)]
pub(crate) unsafe fn one_at_a_time<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    bc: usize,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let mut bad = false;
    for ((run, o), s) in xs.chunks(bc).zip(out.chunks_mut(bc)).zip(sc) {
        let e = k.scale(x86::max_abs(run));
        *s = e;
        bad |= x86_runs::encode_run_or_zero(codec, run, e, o, k.stream);
    }
    bad
}

/// The stored scales of eight blocks from their amplitudes, in vector lanes: F32, F16, BF16,
/// UE4M3, UE8M0 (MX scales of a codebook whose largest entry is below 1 one at a time, as the
/// scalar path).
#[inline(always)]
pub(crate) unsafe fn scales8(k: &FusedKernel<'_>, alpha: __m256) -> __m256 {
    let mode = k.opts.scale_rounding;
    let up = mode == ScaleRounding::Up;
    // The raw scales α / half_range, which the roundings below take (one division a group).
    let s = _mm256_div_ps(alpha, _mm256_set1_ps(k.half_range));
    match (k.dtype, mode) {
        (ScaleDtype::F32, _) => s,
        (ScaleDtype::F16, ScaleRounding::Up | ScaleRounding::Nearest) => x86::round_f16_8(s, up),
        (ScaleDtype::BF16, ScaleRounding::Up | ScaleRounding::Nearest) => x86::round_bf16_8(s, up),
        (ScaleDtype::UE4M3, ScaleRounding::Up | ScaleRounding::Nearest) => {
            x86::round_ue4m3_8(s, up)
        }
        (ScaleDtype::UE8M0, ScaleRounding::Mx) if k.emax >= 0 => x86::mx_scale_8(alpha, k.emax),
        (ScaleDtype::UE8M0, ScaleRounding::Up | ScaleRounding::Nearest) => {
            x86::round_ue8m0_8(s, up)
        }
        _ => {
            let mut a = [0.0f32; 8];
            _mm256_storeu_ps(a.as_mut_ptr(), alpha);
            let e = a.map(|a| k.scale(a));
            _mm256_loadu_ps(e.as_ptr())
        }
    }
}

/// The stored scales of eight blocks from the maxima of their |x| bit patterns, or None when a
/// value is not finite (a maximum past f32::MAX's pattern) or a scale is zero: the one-pass
/// kernels then take those blocks one at a time.
#[inline(always)]
pub(crate) unsafe fn checked_scales8(k: &FusedKernel<'_>, bits: __m256i) -> Option<__m256> {
    let non_finite = _mm256_cmpgt_epi32(bits, _mm256_set1_epi32(0x7F7F_FFFF));
    if _mm256_movemask_epi8(non_finite) != 0 {
        return None;
    }
    let e = scales8(k, _mm256_castsi256_ps(bits));
    let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(e, _mm256_setzero_ps());
    (_mm256_movemask_ps(zero) == 0).then_some(e)
}

/// Whether no quotient of eight blocks needs clamping: each block's largest (`bits`, the
/// maxima of their |x| bit patterns, every value finite) over its scale (a lane of `e`, none
/// zero) below `codec.unclamped_below()`. The division is monotone, so the rest are too: the
/// usual case, as the scale is max |x| over the half range, rounded.
#[inline(always)]
pub(crate) unsafe fn in_range8<C: Encode>(codec: C, bits: __m256i, e: __m256) -> bool {
    codec.unclamped_below().is_some_and(|b| {
        let top = _mm256_div_ps(_mm256_castsi256_ps(bits), e);
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(top, _mm256_set1_ps(b))) == 0xFF
    })
}

/// Whether a group of eight blocks with given scales `e` takes the eight-at-a-time path:
/// every value finite (`bits`, the blocks' maxima of the |x| bit patterns, none past
/// f32::MAX's) and no scale zero (the zero rule goes block by block).
#[inline(always)]
pub(crate) unsafe fn finite_and_nonzero(bits: __m256i, e: __m256) -> bool {
    let non_finite = _mm256_cmpgt_epi32(bits, _mm256_set1_epi32(0x7F7F_FFFF));
    let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(e, _mm256_setzero_ps());
    _mm256_movemask_epi8(non_finite) == 0 && _mm256_movemask_ps(zero) == 0
}

/// A block's `8 * V` codes (V = 1, 2 or 4 vectors of i32 codes 0..=255) as bytes, in order, to
/// `o`: non-temporal with `stream` (`o` 16-byte aligned, or 8 for V = 1).
#[inline(always)]
pub(crate) unsafe fn store_codes<const V: usize>(c: &[__m256i; V], o: *mut u8, stream: bool) {
    if V == 1 {
        // Codes 0..=255 saturate to themselves through the unsigned packs.
        let w = _mm256_packus_epi32(c[0], c[0]);
        let w = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
        store8(o, w, stream);
        return;
    }
    // The packs work within 128-bit halves; this puts the dwords back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    // c[1] (V is 2 or 4 here; the index stays in bounds when V is 1).
    let ab = _mm256_packus_epi32(c[0], c[V.min(2) - 1]);
    if V == 4 {
        let cd = _mm256_packus_epi32(c[V - 2], c[V - 1]);
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
        x86::store32(o, bytes, stream);
    } else {
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, ab), order);
        store16(o, _mm256_castsi256_si128(bytes), stream);
    }
}

/// Eight code bytes to `o`, from the dwords 0 and 2 of `w` (the two 128-bit halves' packs of
/// one vector of codes): non-temporal (`o` 8-byte aligned) or not.
#[inline(always)]
pub(crate) unsafe fn store8(o: *mut u8, w: __m128i, stream: bool) {
    let bytes = _mm_cvtsi128_si64(_mm_shuffle_epi32::<0b00_00_10_00>(w));
    if stream {
        _mm_stream_si64(o as *mut i64, bytes);
    } else {
        (o as *mut i64).write_unaligned(bytes);
    }
}

/// 16 bytes to `o`: non-temporal (`o` 16-byte aligned) or not.
#[inline(always)]
pub(crate) unsafe fn store16(o: *mut u8, bytes: __m128i, stream: bool) {
    if stream {
        _mm_stream_si128(o as *mut __m128i, bytes);
    } else {
        _mm_storeu_si128(o as *mut __m128i, bytes);
    }
}

/// Block scales b_i of eight two-level blocks from their amplitudes: UE4M3 (NVFP4), F16 and
/// BF16 in vector lanes, g = 0 one at a time as the scalar path.
#[inline(always)]
pub(crate) unsafe fn two_level_scales8(k: &FusedKernel<'_>, g: f32, alpha: __m256) -> __m256 {
    let mode = k.opts.scale_rounding;
    let s = || {
        _mm256_div_ps(
            _mm256_div_ps(alpha, _mm256_set1_ps(k.half_range)),
            _mm256_set1_ps(g),
        )
    };
    let scalar = || {
        let mut a = [0.0f32; 8];
        _mm256_storeu_ps(a.as_mut_ptr(), alpha);
        let b = a.map(|a| k.two_level_scale(a, g));
        _mm256_loadu_ps(b.as_ptr())
    };
    match (k.dtype, mode) {
        _ if g == 0.0 => scalar(),
        (ScaleDtype::UE4M3, ScaleRounding::Up | ScaleRounding::Nearest) => {
            x86::round_ue4m3_8(s(), mode == ScaleRounding::Up)
        }
        (ScaleDtype::F16, ScaleRounding::Up | ScaleRounding::Nearest) => {
            x86::round_f16_8(s(), mode == ScaleRounding::Up)
        }
        (ScaleDtype::BF16, ScaleRounding::Up | ScaleRounding::Nearest) => {
            x86::round_bf16_8(s(), mode == ScaleRounding::Up)
        }
        _ => scalar(),
    }
}
