//! NVFP4's quantize on AVX2 (two-level, E2M1 values two a byte, blocks of 16 or 32 along the
//! last axis): two passes over memory, each at about the memory's pace.
//!
//! Pass 1 measures every block's amplitude as the integer maximum of its |x| bit patterns: for
//! finite values the same order as the floats (so the same α), while a NaN or an infinity shows
//! as a maximum past the largest finite pattern. A non-finite input is thus found from the
//! amplitudes alone, before anything is written, and pass 2 runs only on finite input: it has
//! no check of its own. g comes from the largest pattern, not from another pass over the
//! amplitudes. Pass 2 turns each piece's amplitudes into block scales b_i (in place, all of
//! the piece's first), divides each block by e_i = min(b_i × g, f32::MAX) (SPEC §5, §6: a true
//! division), rounds to E2M1 by [`e2m1_magnitudes8`] and [`sign_bits`] and packs the nibbles
//! in registers straight into the output (no code buffer, no zeroing). It takes the pieces
//! last first, so the end of a tensor larger than the cache is read from the cache. The
//! arithmetic is `compute_scales` + `encode_values`'s: the same bits, tested against them.

use std::arch::x86_64::*;

use rayon::prelude::*;

use crate::codec::E2M1Code;
use crate::input::Input;
use crate::layout::Layout;
use crate::pack::encode_run;
use crate::quantize::{FusedKernel, Piece};
use crate::scheme::QuantValue;
use crate::simd::x86;

/// Whether [`quantize_nvfp4`] takes this call: a two-level E2M1 scheme already found fusable
/// (blocks of 16 or 32, whole in every row, packed along the last axis), two codes a byte of
/// u8 storage.
pub(crate) fn applies(layout: &Layout) -> bool {
    let p = &layout.packing;
    layout.scheme.value == QuantValue::E2M1
        && layout.scheme.codebook.is_none()
        && p.word_bits == 8
        && p.per == 2
        && p.field_bits == 4
        && crate::simd::has_avx2()
        && crate::simd::has_f16c()
}

/// Pass 1 of every piece (in the pool): the amplitudes into `stored` (one per block, in
/// order). Returns the largest |x| bit pattern (past f32::MAX's when any input is not finite).
pub(crate) fn amplitudes(
    x: Input<'_>,
    layout: &Layout,
    pieces: &[Piece],
    stored: &mut [f32],
) -> u32 {
    let bc = layout.block_cols();
    let mut work = Vec::with_capacity(pieces.len());
    let mut rest = stored;
    for p in pieces {
        let (sc, r) = std::mem::take(&mut rest).split_at_mut(p.scales);
        rest = r;
        work.push((*p, sc));
    }
    work.into_par_iter()
        .map_init(Vec::new, |buf, (p, sc)| {
            let xs = x.read(p.start, p.len, buf);
            // SAFETY: `applies` checked the CPU has AVX2.
            unsafe { amplitude_piece(xs, bc, sc) }
        })
        .reduce(|| 0, u32::max)
}

/// α = max |x| of each block of `bc` (16 or 32) values of `xs` into `sc`, as f32 from the
/// maximum |x| bit pattern; returns the largest pattern (past f32::MAX's when a value is not
/// finite).
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn amplitude_piece(xs: &[f32], bc: usize, sc: &mut [f32]) -> u32 {
    let blocks = xs.len() / bc;
    assert!(blocks * bc == xs.len() && sc.len() == blocks && (bc == 16 || bc == 32));
    let mut top = _mm256_setzero_si256();
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within xs and sc.
        let x0 = xs.as_ptr().add(b * bc);
        x86::prefetch(x0.wrapping_add(x86::PREFETCH_AHEAD), 8 * bc);
        let bits = if bc == 16 {
            x86::max_abs_bits_8runs::<2>(x0)
        } else {
            x86::max_abs_bits_8runs::<4>(x0)
        };
        _mm256_storeu_si256(sc.as_mut_ptr().add(b) as *mut __m256i, bits);
        top = _mm256_max_epi32(top, bits);
        b += 8;
    }
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, top);
    let mut top = lanes.into_iter().max().unwrap_or(0);
    for (j, s) in sc.iter_mut().enumerate().skip(b) {
        let m = xs[j * bc..(j + 1) * bc]
            .iter()
            .map(|v| v.to_bits() & 0x7FFF_FFFF)
            .max()
            .unwrap_or(0);
        top = top.max(m);
        *s = f32::from_bits(m);
    }
    top
}

/// E2M1 codes of the magnitudes of eight finite quotients (NaN gives 7, not the scalar's 0:
/// pass 2 never sees one), each in the low bits of its i32 lane; the sign is added later, a
/// byte at a time. With a = min(|q|, 6), the code is round-half-even(a × m) + k with (m, k) =
/// (2, 0) below 2, (1, 2) in [2, 4), (½, 4) from 4: on each stretch E2M1's values are evenly
/// spaced, so rounding to the nearest step with ties to the even step is the format's
/// rounding (its even codes are the even steps), and the stretches agree at 2 and 4. The
/// multiply is exact (a power of two); the rounding mode is in the instruction (MXCSR is not
/// read). With [`sign_bits`], equal to [`E2M1Code::encode`] on every non-NaN f32 (tested).
#[inline(always)]
pub(crate) unsafe fn e2m1_magnitudes8(q: __m256) -> __m256i {
    let abs = _mm256_and_si256(_mm256_castps_si256(q), _mm256_set1_epi32(0x7FFF_FFFF));
    let a = _mm256_min_ps(_mm256_castsi256_ps(abs), _mm256_set1_ps(6.0));
    let ge2 = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(a, _mm256_set1_ps(2.0)));
    let ge4 = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(a, _mm256_set1_ps(4.0)));
    // Minus the stretches passed (each mask is −1): m = 2^(1 − passed), k = 2 × passed.
    let neg = _mm256_add_epi32(ge2, ge4);
    let m = _mm256_add_epi32(_mm256_set1_epi32(0x4000_0000), _mm256_slli_epi32::<23>(neg));
    let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        a,
        _mm256_castsi256_ps(m),
    ));
    _mm256_sub_epi32(_mm256_sub_epi32(_mm256_cvttps_epi32(r), neg), neg)
}

/// The E2M1 sign bit (0x08) of 32 quotients, one a byte, in the byte order
/// `packus_epi16(packus_epi32(a, b), packus_epi32(c, d))` gives their codes: the signed packs
/// keep each f32's sign (−0.0's pattern saturates to the most negative i16, then i8).
#[inline(always)]
unsafe fn sign_bits(q: &[__m256; 4]) -> __m256i {
    let i = |v: __m256| _mm256_castps_si256(v);
    let ab = _mm256_packs_epi32(i(q[0]), i(q[1]));
    let cd = _mm256_packs_epi32(i(q[2]), i(q[3]));
    // Bit 7 of each byte to bit 3 (the shift moves the odd byte's bit 7 to its own bit 3).
    _mm256_and_si256(
        _mm256_srli_epi16::<4>(_mm256_packs_epi16(ab, cd)),
        _mm256_set1_epi8(8),
    )
}

/// Pass 2 of a piece: block scales b_i from the amplitudes `sc` holds on entry (replaced by the
/// b_i), each block's values against e_i = min(b_i × g, f32::MAX), two E2M1 codes a byte (the
/// first in the low nibble, SPEC §8) into `out` (`xs.len() / 2` bytes). Every value of `xs`
/// must be finite (pass 1 made sure).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn encode_piece(
    k: &FusedKernel<'_>,
    g: f32,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) {
    let bc = k.layout.block_cols();
    let blocks = xs.len() / bc;
    assert!(blocks * bc == xs.len() && sc.len() == blocks && out.len() * 2 == xs.len());
    assert!(bc == 16 || bc == 32);
    // All the piece's block scales first: their chain (two divisions, the UE4M3 rounding, a
    // store) then overlaps from group to group instead of holding up each group's divisions.
    let mut b = 0;
    while b + 8 <= blocks {
        let p = sc.as_mut_ptr().add(b);
        _mm256_storeu_ps(
            p,
            crate::fused_avx2::two_level_scales8(k, g, _mm256_loadu_ps(p)),
        );
        b += 8;
    }
    for s in &mut sc[b..] {
        *s = k.two_level_scale(*s, g);
    }
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within sc, xs and (at half a byte a value) out.
        let x0 = xs.as_ptr().add(b * bc);
        let o0 = out.as_mut_ptr().add(b * bc / 2);
        x86::prefetch(x0.wrapping_add(x86::PREFETCH_AHEAD), 8 * bc);
        let e = _mm256_min_ps(
            _mm256_mul_ps(_mm256_loadu_ps(sc.as_ptr().add(b)), _mm256_set1_ps(g)),
            _mm256_set1_ps(f32::MAX),
        );
        let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(e, _mm256_setzero_ps());
        if _mm256_movemask_ps(zero) == 0 {
            if bc == 16 {
                encode_8blocks::<2>(x0, e, o0);
            } else {
                encode_8blocks::<4>(x0, e, o0);
            }
        } else {
            // The zero rule somewhere in the group (an all-zero block, or g = 0): block by
            // block.
            for j in b..b + 8 {
                encode_block(&xs[j * bc..(j + 1) * bc], sc[j], g, &mut out[j * bc / 2..]);
            }
        }
        b += 8;
    }
    for j in b..blocks {
        encode_block(&xs[j * bc..(j + 1) * bc], sc[j], g, &mut out[j * bc / 2..]);
    }
}

/// One block (16 or 32 values) against its stored scale `b`, the scalar way: codes, then
/// nibble pairs into the start of `out`.
#[inline(always)]
fn encode_block(xs: &[f32], b: f32, g: f32, out: &mut [u8]) {
    let mut codes = [0u8; 32];
    let codes = &mut codes[..xs.len()];
    encode_run(E2M1Code, xs, crate::quantize::effective_scale(b, g), codes);
    for (o, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
        *o = pair[0] | (pair[1] << 4);
    }
}

/// Eight blocks of `8 * V` values from `x0` (V = 2 or 4), block j divided by lane j of `e`
/// (none 0), E2M1 codes packed two a byte into `o0` (`32 * V` bytes). 64 values (32 bytes)
/// at a time: eight code vectors to 64 code bytes in order, each adjacent pair folded into
/// one byte (the second code's nibble shifted onto the first's), 32 bytes stored.
#[inline(always)]
unsafe fn encode_8blocks<const V: usize>(x0: *const f32, e: __m256, o0: *mut u8) {
    let mut ds = [0.0f32; 8];
    _mm256_storeu_ps(ds.as_mut_ptr(), e);
    // The packs work within 128-bit halves; this puts the dwords back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let low = _mm256_set1_epi16(0xFF);
    for u in 0..V {
        let x = x0.add(64 * u);
        let mut half = [_mm256_setzero_si256(); 2];
        for (h, hv) in half.iter_mut().enumerate() {
            let mut q = [_mm256_setzero_ps(); 4];
            let mut c = [_mm256_setzero_si256(); 4];
            for t in 0..4 {
                // Vector u * 8 + h * 4 + t of the group lies in block (u * 8 + h * 4 + t) / V.
                let dv = _mm256_set1_ps(ds[(u * 8 + h * 4 + t) / V]);
                q[t] = _mm256_div_ps(_mm256_loadu_ps(x.add(32 * h + 8 * t)), dv);
                c[t] = e2m1_magnitudes8(q[t]);
            }
            let ab = _mm256_packus_epi32(c[0], c[1]);
            let cd = _mm256_packus_epi32(c[2], c[3]);
            let codes = _mm256_or_si256(_mm256_packus_epi16(ab, cd), sign_bits(&q));
            let codes = _mm256_permutevar8x32_epi32(codes, order);
            // Each 16-bit lane holds two codes a byte apart: fold the second onto the first.
            *hv = _mm256_and_si256(_mm256_or_si256(codes, _mm256_srli_epi16::<4>(codes)), low);
        }
        let packed =
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(half[0], half[1]));
        _mm256_storeu_si256(o0.add(32 * u) as *mut __m256i, packed);
    }
}

/// The whole quantize of an NVFP4-like call ([`applies`]): pass 1, g from the largest
/// amplitude, pass 2 into `words`, the block scales into `stored` (the grid's size: the
/// caller's array or a new vector); returns g. A non-finite input is refused after pass 1,
/// `words` untouched (`stored` then holds amplitudes).
pub(crate) fn quantize_nvfp4(
    x: Input<'_>,
    layout: &Layout,
    opts: &crate::quantize::QuantizeOptions,
    words: &mut [u8],
    stored: &mut [f32],
) -> crate::Result<f32> {
    use crate::quantize::{derived_global, first_non_finite, pieces};
    assert_eq!(stored.len(), layout.num_scales, "scale count");
    let pieces = pieces(layout);
    // Every scale is written by pass 1 (the pieces tile the blocks).
    let top = amplitudes(x, layout, &pieces, stored);
    if top > f32::MAX.to_bits() {
        return Err(first_non_finite(x));
    }
    let k = FusedKernel::new(layout, opts, false);
    // The largest amplitude stands for all of them (g depends on the maximum alone).
    let g = derived_global(&[f32::from_bits(top)], k.half_range, k.dtype);
    // Hand each piece its scales and bytes; the last pieces first: pass 1 just read them, so
    // the end of a tensor larger than the cache is still in it.
    let mut work = Vec::with_capacity(pieces.len());
    let (mut sc_rest, mut w_rest) = (stored, words);
    for p in &pieces {
        let (sc, sr) = std::mem::take(&mut sc_rest).split_at_mut(p.scales);
        let (w, wr) = std::mem::take(&mut w_rest).split_at_mut(p.len / 2);
        (sc_rest, w_rest) = (sr, wr);
        work.push((*p, sc, w));
    }
    work.reverse();
    work.into_par_iter()
        .for_each_init(Vec::new, |buf, (p, sc, w)| {
            let xs = x.read(p.start, p.len, buf);
            // SAFETY: `applies` checked the CPU has AVX2 and F16C; pass 1 found every value finite.
            unsafe { encode_piece(&k, g, xs, sc, w) };
        });
    Ok(g)
}

#[cfg(test)]
#[path = "nvfp4_avx2_tests.rs"]
mod tests;
