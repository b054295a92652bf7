//! E2M1 values two a byte on AVX2, blocks of 16 or 32 along the last axis: NVFP4's quantize
//! (two-level) in two passes over memory, each at about the memory's pace, and the one-pass
//! kernel of one-level E2M1 schemes (MXFP4: [`one_level_piece`]), which shares its rounding
//! and packing.
//!
//! Pass 1 measures every block's amplitude as the integer maximum of its |x| bit patterns: for
//! finite values the same order as the floats (so the same α), while a NaN or an infinity shows
//! as a maximum past the largest finite pattern. A non-finite input is thus found from the
//! amplitudes alone, before anything is written, and pass 2 runs only on finite input: it has
//! no check of its own. g comes from the largest pattern, not from another pass over the
//! amplitudes. Pass 2 turns each piece's amplitudes into block scales b_i (in place, all of
//! the piece's first), divides each block by e_i = min(b_i × g, f32::MAX) (format.md "Two-level schemes", "Quantizing a value": a true
//! division), rounds 32 quotients at a time to E2M1 by [`e2m1_codes32`] (integer keys and a
//! table, in bytes) and packs the nibbles in registers straight into the output (no code
//! buffer, no zeroing). The arithmetic is `compute_scales` + `encode_values`'s: the same bits,
//! tested against them.
//!
//! A g the caller gives needs no pass 1: [`measure_encode_piece`] measures each group of eight
//! blocks and encodes it at once, one read of the tensor (16 Mi values, one thread, best of 15
//! interleaved calls in three runs: 9.2-10.0 ms against 11.1-12.6 ms for the two passes). A
//! derived g keeps the two passes: a plain max |x| pass for g, then this kernel measuring
//! again, took longer (15.0-16.7 against 12.6-14.1 ms): its encode is bound by the divisions,
//! not memory, and pass 2 reads the stored amplitudes instead of measuring.

use std::arch::x86_64::*;

use rayon::prelude::*;

use crate::calibrate::Calibration;
use crate::codec::encode_run;
use crate::codec::E2M1Code;
use crate::input::Input;
use crate::kernels::piece::{FusedKernel, Piece};
use crate::layout::Layout;
use crate::scheme::QuantValue;
use crate::simd::x86;
use crate::simd::x86_runs;

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
/// order), blocks of `bc` values back to back (`piece::block_run`). Returns the largest |x|
/// bit pattern (past f32::MAX's when any input is not finite).
pub(crate) fn amplitudes(
    x: Input<'_>,
    bc: usize,
    pieces: &[Piece],
    stored: &mut [f32],
) -> crate::error::Result<u32> {
    let mut work = crate::alloc::try_with_capacity(pieces.len())?;
    let mut rest = stored;
    for p in pieces {
        let (sc, r) = std::mem::take(&mut rest).split_at_mut(p.scales);
        rest = r;
        work.push((*p, sc));
    }
    // `buf`: a piece's converted values, bounded by the piece.
    Ok(work
        .into_par_iter()
        .map_init(Vec::new, |buf, (p, sc)| {
            let xs = x.read(p.start, p.len, buf);
            // SAFETY: `applies` checked the CPU has AVX2.
            unsafe { amplitude_piece(xs, bc, sc) }
        })
        .reduce(|| 0, u32::max))
}

/// α = max |x| of each block of `bc` values of `xs` into `sc`, as f32 from the maximum |x|
/// bit pattern; returns the largest pattern (past f32::MAX's when a value is not finite).
/// Blocks of 16 and 32 with their lengths as constants, others (a conv kernel's rows of 3, say)
/// with their last vector a masked load.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn amplitude_piece(xs: &[f32], bc: usize, sc: &mut [f32]) -> u32 {
    let blocks = xs.len() / bc;
    assert!(blocks * bc == xs.len() && sc.len() == blocks && bc > 0);
    let mut top = _mm256_setzero_si256();
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within xs and sc.
        // No software prefetch: this pass only reads, and the hardware's stream prefetch
        // alone kept it at numpy's `max` pace (16 Mi values on Zen 3, one thread: 4.1-4.8 ms
        // with `x86::prefetch` 8 KiB ahead, 3.8-4.4 ms without, medians of 16 interleaved runs).
        let x0 = xs.as_ptr().add(b * bc);
        let bits = max_abs_bits8(x0, bc);
        _mm256_storeu_si256(sc.as_mut_ptr().add(b) as *mut __m256i, bits);
        top = _mm256_max_epi32(top, bits);
        b += 8;
    }
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, top);
    let mut top = lanes.into_iter().max().unwrap_or(0);
    for (j, s) in sc.iter_mut().enumerate().skip(b) {
        let m = max_abs_bits(&xs[j * bc..(j + 1) * bc]);
        top = top.max(m);
        *s = f32::from_bits(m);
    }
    top
}

/// The largest |x| bit pattern of each of eight blocks of `bc` values from `x0` (blocks of
/// 16 and 32 with their lengths as constants), past f32::MAX's for a block that is not finite.
///
/// # Safety
/// The CPU must have AVX2; `8 * bc` values from `x0` must be readable.
#[inline(always)]
unsafe fn max_abs_bits8(x0: *const f32, bc: usize) -> __m256i {
    match bc {
        16 => x86::max_abs_bits_8runs::<2>(x0),
        32 => x86::max_abs_bits_8runs::<4>(x0),
        _ => x86::max_abs_bits_8runs_any(x0, bc),
    }
}

/// [`max_abs_bits8`] of one block, the scalar way.
fn max_abs_bits(run: &[f32]) -> u32 {
    run.iter()
        .map(|v| v.to_bits() & 0x7FFF_FFFF)
        .max()
        .unwrap_or(0)
}

/// The E2M1 codes (sign in bit 3) of 32 finite quotients, one a byte, in the byte order
/// `packus_epi16(packus_epi32(a, b), packus_epi32(c, d))` gives.
///
/// Every E2M1 rounding boundary m (the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) has at
/// most two mantissa bits, so its pattern is a multiple of 2^21, and the code of |q| depends
/// only on which side of each m, or on it, |q| lies. t = ⌊a / 2^21⌋ + ⌈a / 2^21⌉ (a = |q|'s
/// pattern) tells exactly that: it is 2·bits(m) / 2^21 on m, one less just below, one more just
/// above. Where |q| = m is a tie, the table sends it to the even code. t − 1000 (1000 is
/// 0.25's) is packed to bytes with saturation (0 below 0.25, 255 from 2^16 on), clamped to 35
/// (just above 5: code 7, as the saturated 6) and looked up in three 16-entry tables.
/// Integer work on 32 values a step instead of float rounding on 8; MXCSR is not read.
/// Equal to [`E2M1Code::encode`] on every non-NaN f32 (tested on all of them).
#[inline(always)]
pub(crate) unsafe fn e2m1_codes32(q: &[__m256; 4]) -> __m256i {
    let t = _mm256_packus_epi16(
        _mm256_packus_epi32(e2m1_key(q[0]), e2m1_key(q[1])),
        _mm256_packus_epi32(e2m1_key(q[2]), e2m1_key(q[3])),
    );
    let t = _mm256_min_epu8(t, _mm256_set1_epi8(35));
    // Each table gives its own 16 entries, 0 below them (a negative index has its top bit set)
    // and no more than the true code above them (its low nibble wraps to smaller t): the max
    // of the three is the code.
    let tables = E2M1_BY_KEY.as_ptr() as *const __m256i;
    let mag = _mm256_max_epu8(
        _mm256_shuffle_epi8(_mm256_loadu_si256(tables), t),
        _mm256_max_epu8(
            _mm256_shuffle_epi8(
                _mm256_loadu_si256(tables.add(1)),
                _mm256_sub_epi8(t, _mm256_set1_epi8(16)),
            ),
            _mm256_shuffle_epi8(
                _mm256_loadu_si256(tables.add(2)),
                _mm256_sub_epi8(t, _mm256_set1_epi8(32)),
            ),
        ),
    );
    _mm256_or_si256(mag, sign_bits(q))
}

/// [`e2m1_codes32`]'s key of eight quotients: ⌈a / 2^21⌉ − 1000 + ⌊a / 2^21⌋, a = |q|'s
/// pattern (no overflow: a ≤ 0x7F80_0000, an overflowed ∞ at most).
#[inline(always)]
unsafe fn e2m1_key(q: __m256) -> __m256i {
    let a = _mm256_and_si256(_mm256_castps_si256(q), _mm256_set1_epi32(0x7FFF_FFFF));
    let up = _mm256_set1_epi32((1 << 21) - 1 - (1000 << 21));
    _mm256_add_epi32(
        _mm256_srai_epi32::<21>(_mm256_add_epi32(a, up)),
        _mm256_srli_epi32::<21>(a),
    )
}

/// The E2M1 magnitude code of each key t = 0..48 of [`e2m1_codes32`], 16 at a time, each
/// table twice (one for each 128-bit half of a `shuffle_epi8`). The code steps up at t = 1
/// (past 0.25), 12 (0.75 on: the tie goes up to 1.0, the even code), 19 (past 1.25), 22
/// (1.75 on), 27 (past 2.5), 30 (3.5 on) and 35 (past 5).
static E2M1_BY_KEY: [[u8; 32]; 3] = {
    const STEPS: [usize; 7] = [1, 12, 19, 22, 27, 30, 35];
    let mut t = [[0u8; 32]; 3];
    let mut k = 0;
    while k < 48 {
        let mut code = 0;
        let mut s = 0;
        while s < STEPS.len() {
            code += (k >= STEPS[s]) as u8;
            s += 1;
        }
        t[k / 16][k % 16] = code;
        t[k / 16][k % 16 + 16] = code;
        k += 1;
    }
    t
};

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
/// first in the low nibble, format.md "Stores and packing") into `out` (`xs.len() / 2` bytes). Every value of `xs`
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
    // The AVX-512 encode where there is one: faster in cache (1 Mi values, both passes: 0.46
    // against 0.51-0.53 ns a value on a Xeon with VBMI). From memory (16 Mi values) this pass
    // waits on the reads either way: alternating runs of the benchmark gave 0.61-0.81× `copyto`
    // with it and 0.73-0.84× without, no difference beyond the machine's noise.
    let avx512 = crate::simd::has_avx512_vbmi();
    // All the piece's block scales first: their chain (two divisions, the UE4M3 rounding, a
    // store) then overlaps from group to group instead of holding up each group's divisions.
    let mut b = 0;
    while b + 8 <= blocks {
        let p = sc.as_mut_ptr().add(b);
        _mm256_storeu_ps(
            p,
            crate::kernels::lanes::two_level_scales8(k, g, _mm256_loadu_ps(p)),
        );
        b += 8;
    }
    for s in &mut sc[b..] {
        *s = k.two_level_scale(*s, g);
    }
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within sc, xs and (at half a byte a value) out.
        encode_group_of(xs, sc, g, b, bc, out, avx512);
        b += 8;
    }
    for j in b..blocks {
        encode_block(&xs[j * bc..(j + 1) * bc], sc[j], g, &mut out[j * bc / 2..]);
    }
}

/// Pass 2 without pass 1, for a g known before the call (the caller's): each group of eight
/// blocks measured, its block scales b_i worked out in lanes (into `sc`) and its values divided
/// by e_i and packed, while the group is in registers and L1, so the tensor is read once.
/// [`encode_piece`]'s arithmetic on the amplitudes pass 1 would have stored: the same bits.
/// Returns as soon as a block holds a value that is not finite (true); the call then fails and
/// `sc` and `out` hold what was written up to there.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn measure_encode_piece(
    k: &FusedKernel<'_>,
    g: f32,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let bc = k.layout.block_cols();
    let blocks = xs.len() / bc;
    assert!(blocks * bc == xs.len() && sc.len() == blocks && out.len() * 2 == xs.len());
    assert!(bc == 16 || bc == 32);
    let avx512 = crate::simd::has_avx512_vbmi();
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within sc, xs and (at half a byte a value) out.
        let x0 = xs.as_ptr().add(b * bc);
        let bits = max_abs_bits8(x0, bc);
        let non_finite = _mm256_cmpgt_epi32(bits, _mm256_set1_epi32(0x7F7F_FFFF));
        if _mm256_movemask_epi8(non_finite) != 0 {
            return true;
        }
        let s = crate::kernels::lanes::two_level_scales8(k, g, _mm256_castsi256_ps(bits));
        _mm256_storeu_ps(sc.as_mut_ptr().add(b), s);
        encode_group_of(xs, sc, g, b, bc, out, avx512);
        b += 8;
    }
    for j in b..blocks {
        let run = &xs[j * bc..(j + 1) * bc];
        let top = max_abs_bits(run);
        if top > f32::MAX.to_bits() {
            return true;
        }
        sc[j] = k.two_level_scale(f32::from_bits(top), g);
        encode_block(run, sc[j], g, &mut out[j * bc / 2..]);
    }
    false
}

/// Blocks `b..b + 8` (of `bc` = 16 or 32 values) against their block scales `sc[b..b + 8]`
/// under g: e_j = min(b_j × g, f32::MAX) in lanes, each block divided by its own and packed
/// ([`encode_8blocks`]; on AVX-512 with VBMI, `avx512`, multiplied by the reciprocals where
/// that gives the same codes: [`encode_group512`]); where some e_j is 0 (the zero rule: an
/// all-zero block, or g = 0), block by block the scalar way. Pass 2's and
/// [`measure_encode_piece`]'s shared step.
///
/// # Safety
/// The CPU must have AVX2; blocks `b..b + 8` lie within `xs`, `sc` and (half a byte a value)
/// `out`.
#[inline(always)]
unsafe fn encode_group_of(
    xs: &[f32],
    sc: &[f32],
    g: f32,
    b: usize,
    bc: usize,
    out: &mut [u8],
    avx512: bool,
) {
    let (x0, o0) = (xs.as_ptr().add(b * bc), out.as_mut_ptr().add(b * bc / 2));
    let e = crate::simd::x86::effective8(_mm256_loadu_ps(sc.as_ptr().add(b)), g);
    let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(e, _mm256_setzero_ps());
    if _mm256_movemask_ps(zero) == 0 {
        if avx512 && encode_group512(bc, x0, e, o0, false) {
            return;
        }
        if bc == 16 {
            encode_8blocks::<2, false>(x0, e, o0, false);
        } else {
            encode_8blocks::<4, false>(x0, e, o0, false);
        }
    } else {
        for j in b..b + 8 {
            encode_block(&xs[j * bc..(j + 1) * bc], sc[j], g, &mut out[j * bc / 2..]);
        }
    }
}

/// One block (16 or 32 values) against its stored scale `b`, the scalar way: codes, then
/// nibble pairs into the start of `out`.
#[inline(always)]
fn encode_block(xs: &[f32], b: f32, g: f32, out: &mut [u8]) {
    let mut codes = [0u8; 32];
    let codes = &mut codes[..xs.len()];
    encode_run(E2M1Code, xs, crate::scale::effective_scale(b, g), codes);
    nibble_pairs(codes, out);
}

/// Codes (one a byte) two a byte into the start of `out`, the first in the low nibble.
#[inline(always)]
fn nibble_pairs(codes: &[u8], out: &mut [u8]) {
    for (o, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
        *o = pair[0] | (pair[1] << 4);
    }
}

/// Eight blocks of `8 * V` values from `x0` (V = 2 or 4), block j divided by lane j of `e`
/// (none 0; multiplied by it when `MUL`), E2M1 codes packed two a byte into `o0` (`32 * V`
/// bytes; non-temporal stores with `stream`, `o0` then 16-byte aligned). 64 values (32 bytes)
/// at a time: eight code vectors to 64 code bytes in order, each adjacent pair folded into
/// one byte (the second code's nibble shifted onto the first's), 32 bytes stored.
#[inline(always)]
unsafe fn encode_8blocks<const V: usize, const MUL: bool>(
    x0: *const f32,
    e: __m256,
    o0: *mut u8,
    stream: bool,
) {
    let mut ds = [0.0f32; 8];
    _mm256_storeu_ps(ds.as_mut_ptr(), e);
    // The packs work within 128-bit halves; this puts the dwords back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    // Two codes a byte, the first in the low nibble: c0 × 1 + c1 × 16 per 16-bit lane.
    let pair = _mm256_set1_epi16(0x1001);
    for u in 0..V {
        let x = x0.add(64 * u);
        let mut half = [_mm256_setzero_si256(); 2];
        for (h, hv) in half.iter_mut().enumerate() {
            let mut q = [_mm256_setzero_ps(); 4];
            for (t, qt) in q.iter_mut().enumerate() {
                // Vector u * 8 + h * 4 + t of the group lies in block (u * 8 + h * 4 + t) / V.
                let dv = _mm256_set1_ps(ds[(u * 8 + h * 4 + t) / V]);
                if t % 2 == 0 {
                    x86::prefetch_line(x.wrapping_add(32 * h + 8 * t + x86::PREFETCH_AHEAD));
                }
                let v = _mm256_loadu_ps(x.add(32 * h + 8 * t));
                *qt = if MUL {
                    _mm256_mul_ps(v, dv)
                } else {
                    _mm256_div_ps(v, dv)
                };
            }
            let codes = _mm256_permutevar8x32_epi32(e2m1_codes32(&q), order);
            *hv = _mm256_maddubs_epi16(codes, pair);
        }
        let packed =
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(half[0], half[1]));
        x86::store32(o0.add(32 * u), packed, stream);
    }
}

/// Whether a one-level scheme's one-pass kernel (`fused_with`) takes [`one_level_piece`]
/// for its pieces: E2M1 values (MXFP4 and its kin) two a byte of u8 storage, blocks of 16 or
/// 32 whole in every row, max |x| calibration.
pub(crate) fn applies_one_level(layout: &Layout, calibration: Calibration) -> bool {
    let bc = layout.block_cols();
    applies(layout)
        && calibration == Calibration::MinMax
        && (bc == 16 || bc == 32)
        && layout.row_len().is_multiple_of(bc)
}

/// The one-pass kernel of a piece ([`applies_one_level`]): each group of eight blocks
/// measured, its stored scales worked out in vector lanes (into `sc`), its values divided by
/// them (multiplied by the reciprocal when that is exact: MX scales are powers of two),
/// rounded 32 at a time by [`e2m1_codes32`] and packed two a byte straight into `out`
/// (`xs.len() / 2` bytes): no code buffer and no packing pass. A group with a non-finite
/// value or a zero scale, and the last blocks short of a group, go block by block the scalar
/// way. Returns whether any input was non-finite.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn one_level_piece(
    k: &FusedKernel<'_>,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    let bc = k.layout.block_cols();
    let blocks = xs.len() / bc;
    assert!(blocks * bc == xs.len() && sc.len() == blocks && out.len() * 2 == xs.len());
    assert!(bc == 16 || bc == 32);
    let stream = k.stream && (out.as_ptr() as usize).is_multiple_of(16);
    let avx512 = crate::simd::has_avx512_vbmi();
    let mut bad = false;
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within sc, xs and (at half a byte a value) out.
        let x0 = xs.as_ptr().add(b * bc);
        let o0 = out.as_mut_ptr().add(b * bc / 2);
        let bits = max_abs_bits8(x0, bc);
        if let Some(e) = crate::kernels::lanes::checked_scales8(k, bits) {
            _mm256_storeu_ps(sc.as_mut_ptr().add(b), e);
            encode_group(bc, x0, e, o0, stream, avx512);
        } else {
            // A non-finite value or a zero scale in the group: block by block.
            for j in b..b + 8 {
                bad |= one_level_block(k, &xs[j * bc..(j + 1) * bc], &mut sc[j], out, j * bc / 2);
            }
        }
        b += 8;
    }
    for j in b..blocks {
        bad |= one_level_block(k, &xs[j * bc..(j + 1) * bc], &mut sc[j], out, j * bc / 2);
    }
    if stream {
        // The non-temporal stores are weakly ordered: done before the task says it is done.
        _mm_sfence();
    }
    bad
}

/// [`encode_8blocks`] of eight blocks of `bc` = 16 or 32 values against the lanes of `e` (none
/// 0): multiplied by the reciprocals where they are exact (powers of two: MX scales), divided
/// otherwise; first [`encode_group512`] on AVX-512 with VBMI (`avx512`).
#[inline(always)]
unsafe fn encode_group(
    bc: usize,
    x0: *const f32,
    e: __m256,
    o0: *mut u8,
    stream: bool,
    avx512: bool,
) {
    if avx512 && encode_group512(bc, x0, e, o0, stream) {
        return;
    }
    let (mul, d) = x86::divisor_lanes(e);
    match (bc, mul) {
        (16, true) => encode_8blocks::<2, true>(x0, d, o0, stream),
        (16, false) => encode_8blocks::<2, false>(x0, d, o0, stream),
        (_, true) => encode_8blocks::<4, true>(x0, d, o0, stream),
        (_, false) => encode_8blocks::<4, false>(x0, d, o0, stream),
    }
}

/// Eight blocks of `bc` = 16 or 32 values against the lanes of `e` (none 0) by
/// [`crate::kernels::nvfp4_avx512::encode_8blocks`], which multiplies by the reciprocals: unchecked when
/// they are exact (powers of two), checked when they are normal f32s, not tried otherwise (a
/// scale at or past 2^125, or subnormal). Returns whether the group is written; if not (or if
/// the check flagged a value near a rounding boundary), the caller encodes it by the division.
/// Needs AVX-512 F, BW and VBMI (`crate::simd::has_avx512_vbmi`), which the caller checked.
#[inline(always)]
unsafe fn encode_group512(bc: usize, x0: *const f32, e: __m256, o0: *mut u8, stream: bool) -> bool {
    use crate::kernels::nvfp4_avx512::encode_8blocks as enc;
    let exact = _mm256_movemask_epi8(x86::exact_reciprocal_lanes(e)) == -1;
    if !exact && !x86::checked_reciprocal_lanes(e) {
        return false;
    }
    let mut r = [0.0f32; 8];
    _mm256_storeu_ps(r.as_mut_ptr(), _mm256_div_ps(_mm256_set1_ps(1.0), e));
    let flagged = match (bc, exact) {
        (16, true) => enc::<2, false>(x0, &r, o0, stream),
        (16, false) => enc::<2, true>(x0, &r, o0, stream),
        (_, true) => enc::<4, false>(x0, &r, o0, stream),
        (_, false) => enc::<4, true>(x0, &r, o0, stream),
    };
    !flagged
}

/// One block of a one-level piece the scalar way (any input): α with NaNs passed over, its
/// stored scale into `s`, its codes (those of 0 under a zero scale) packed two a byte into
/// `out` from byte `at`. Returns whether the block had a non-finite value.
#[inline(always)]
unsafe fn one_level_block(
    k: &FusedKernel<'_>,
    run: &[f32],
    s: &mut f32,
    out: &mut [u8],
    at: usize,
) -> bool {
    let mut codes = [0u8; 32];
    let codes = &mut codes[..run.len()];
    *s = k.scale(x86::max_abs(run));
    let bad = x86_runs::encode_run_or_zero(E2M1Code, run, *s, codes, false);
    nibble_pairs(codes, &mut out[at..]);
    bad
}

/// Whether a call with given scales takes [`given_pieces`]: E2M1 two a byte of u8 storage
/// ([`applies`]) along the last axis, blocks of 16 or 32 whole in every row.
pub(crate) fn applies_given(layout: &Layout) -> bool {
    let bc = layout.block_cols();
    applies(layout)
        && !layout.per_tensor
        && layout.rows_map_directly()
        && layout.packing.axis + 1 == layout.rank()
        && (bc == 16 || bc == 32)
        && layout.row_len().is_multiple_of(bc)
}

/// Quantize with given scales ([`applies_given`]) into `words`, piece by piece in the pool:
/// [`one_level_piece`]'s encode and in-register packing without its measuring. `stored`: the
/// block scales, one a block in order (only read), each block's e = min(b × g, f32::MAX) worked
/// out eight at a time (`g` = 1 for a one-level scheme, which changes no scale). Returns
/// whether any input was non-finite.
pub(crate) fn given_pieces(
    x: Input<'_>,
    layout: &Layout,
    stored: &mut [f32],
    g: f32,
    words: &mut [u8],
) -> crate::error::Result<bool> {
    let bc = layout.block_cols();
    let pieces = crate::kernels::piece::pieces(layout)?;
    crate::kernels::piece::fused_pieces(x, &pieces, stored, words, |_, xs, sc, w, _| {
        // SAFETY: `applies_given` checked the CPU has AVX2 and F16C.
        unsafe { given_piece(xs, sc, g, bc, w) }
    })
}

/// One piece of [`given_pieces`]: eight blocks at a time divided by their effective scales
/// (multiplied by the reciprocal when that is exact), rounded 32 at a time and packed two a
/// byte into `out`; a group with a non-finite value or a zero scale, and the last blocks short
/// of a group, block by block the scalar way.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn given_piece(xs: &[f32], stored: &[f32], g: f32, bc: usize, out: &mut [u8]) -> bool {
    let blocks = xs.len() / bc;
    assert!(blocks * bc == xs.len() && stored.len() == blocks && out.len() * 2 == xs.len());
    assert!(bc == 16 || bc == 32);
    let e_of = |b: f32| crate::scale::effective_scale(b, g);
    let avx512 = crate::simd::has_avx512_vbmi();
    let mut bad = false;
    let mut b = 0;
    while b + 8 <= blocks {
        // In bounds: blocks b..b + 8 lie within stored, xs and (at half a byte a value) out.
        let x0 = xs.as_ptr().add(b * bc);
        let o0 = out.as_mut_ptr().add(b * bc / 2);
        let e = crate::simd::x86::effective8(_mm256_loadu_ps(stored.as_ptr().add(b)), g);
        let bits = max_abs_bits8(x0, bc);
        if crate::kernels::lanes::finite_and_nonzero(bits, e) {
            encode_group(bc, x0, e, o0, false, avx512);
        } else {
            for (j, &sj) in stored.iter().enumerate().skip(b).take(8) {
                bad |= given_block(&xs[j * bc..(j + 1) * bc], e_of(sj), out, j * bc / 2);
            }
        }
        b += 8;
    }
    for (j, &sj) in stored.iter().enumerate().skip(b) {
        bad |= given_block(&xs[j * bc..(j + 1) * bc], e_of(sj), out, j * bc / 2);
    }
    bad
}

/// One block against its effective scale `e` the scalar way (any input, the zero rule too),
/// packed two a byte into `out` from byte `at`. Returns whether the block had a non-finite
/// value.
#[inline(always)]
unsafe fn given_block(run: &[f32], e: f32, out: &mut [u8], at: usize) -> bool {
    let mut codes = [0u8; 32];
    let codes = &mut codes[..run.len()];
    let bad = x86_runs::encode_run_or_zero(E2M1Code, run, e, codes, false);
    nibble_pairs(codes, &mut out[at..]);
    bad
}

/// The whole quantize of an NVFP4-like call ([`applies`]) into `words`, the block scales into
/// `stored` (the grid's size: the caller's array or a new vector); returns g. Under `global`
/// (the caller's g, already checked), one pass ([`measure_encode_piece`]); a non-finite input
/// is then refused where a piece finds it, `words` and `stored` partly written. Otherwise pass
/// 1, g from the largest amplitude, pass 2; a non-finite input is refused after pass 1, `words`
/// untouched (`stored` then holds amplitudes).
pub(crate) fn quantize_nvfp4(
    x: Input<'_>,
    layout: &Layout,
    opts: &crate::options::QuantizeOptions,
    global: Option<f32>,
    words: &mut [u8],
    stored: &mut [f32],
) -> crate::error::Result<f32> {
    use crate::kernels::piece::{first_non_finite, pieces};
    use crate::scale::derived_global;
    assert_eq!(stored.len(), layout.num_scales, "scale count");
    let pieces = pieces(layout)?;
    if let Some(g) = global {
        // g known: nothing to measure first, one pass over the tensor.
        let k = FusedKernel::new(layout, opts, false);
        let bad =
            crate::kernels::piece::fused_pieces(x, &pieces, stored, words, |_, xs, sc, w, _| {
                // SAFETY: `applies` checked the CPU has AVX2 and F16C.
                unsafe { measure_encode_piece(&k, g, xs, sc, w) }
            })?;
        return if bad { Err(first_non_finite(x)) } else { Ok(g) };
    }
    // Every scale is written by pass 1 (the pieces tile the blocks).
    let top = amplitudes(x, layout.block_cols(), &pieces, stored)?;
    if top > f32::MAX.to_bits() {
        return Err(first_non_finite(x));
    }
    let k = FusedKernel::new(layout, opts, false);
    // The largest amplitude stands for all of them (g depends on the maximum alone).
    let g = derived_global(&[f32::from_bits(top)], k.half_range, k.dtype);
    // Hand each piece its scales and bytes, in order. (Taking the last pieces first, which
    // pass 1 read last, was slower: a tensor larger than the cache leaves little of itself
    // there, and each piece then started a new stream against the prefetcher: pass 2 alone
    // took 8.1-8.9 ms forward, 8.7-10.5 ms backward, 16 Mi values, one thread.)
    let mut work = crate::alloc::try_with_capacity(pieces.len())?;
    let (mut sc_rest, mut w_rest) = (stored, words);
    for p in &pieces {
        let (sc, sr) = std::mem::take(&mut sc_rest).split_at_mut(p.scales);
        let (w, wr) = std::mem::take(&mut w_rest).split_at_mut(p.len / 2);
        (sc_rest, w_rest) = (sr, wr);
        work.push((*p, sc, w));
    }
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
