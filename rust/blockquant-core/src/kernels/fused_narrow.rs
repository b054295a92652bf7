//! The one-pass kernel's AVX2 path for blocks back to back whose length `m` is under 64 and
//! not a multiple of 8: blocks of 4, 12 or 20 along long rows, and the rows of a conv kernel.
//! A (c_out, c_in, 3, 3) weight with blocks of 32 along its last axis has rows of 3, each row
//! one block of 3: block by block, each block cost some 50 ns of set-up for 3 values.
//!
//! `fused_avx2`'s kernel needs whole vectors a block; this one takes eight blocks (8·m values,
//! so m vectors) at a time:
//! - the eight maxima of the |x| bit patterns, each block read by its whole vectors and a
//!   masked load of its rest, folded into one vector's lanes;
//! - the eight stored scales in lanes (`fused_avx2::checked_scales8`, the same as the scalar
//!   rounding's);
//! - the m vectors of values, each lane divided by its own block's scale: value i of the group
//!   is in block i / m, and a permute spreads the scales' lanes to the values' by that pattern,
//!   worked out once a piece ([`Spread`]).
//!
//! A group with a non-finite value or a zero scale (the zero rule) goes block by block, as in
//! `fused_avx2`, which gives the same bits on every input.
//!
//! Dequantize's side ([`decode_blocks`]) spreads the scales the same way: eight blocks' scales
//! in lanes, a permute a vector of values.

use std::arch::x86_64::*;

use crate::codec::{Decode, Encode};
use crate::kernels::lanes::{checked_scales8, finite_and_nonzero, in_range8};
use crate::kernels::lanes::{one_at_a_time, store8, store_codes, two_level_scales8};
use crate::kernels::piece::FusedKernel;
use crate::pack::storage::Effective;
use crate::scale::effective_scale;
use crate::simd::x86;
use crate::simd::x86::effective8;

/// Blocks shorter than this take [`measure_encode_narrow`] (when not a multiple of 8): the
/// spreading patterns are m vectors, and a longer block's set-up is a small part of it anyway.
const NARROW_MAX: usize = 64;

/// Whether blocks of `m` values back to back take [`measure_encode_narrow`].
pub(crate) fn narrow(m: usize) -> bool {
    m > 0 && m < NARROW_MAX && !m.is_multiple_of(8)
}

/// Which block of a group each value is in: vector t of the group (values 8t … 8t + 7) takes
/// its lanes' scales from lanes `pattern[t]` of the eight blocks' scales.
struct Spread {
    patterns: [__m256i; NARROW_MAX],
    m: usize,
}

impl Spread {
    #[inline(always)]
    unsafe fn new(m: usize) -> Self {
        let mut patterns = [_mm256_setzero_si256(); NARROW_MAX];
        for (t, p) in patterns.iter_mut().take(m).enumerate() {
            // Values 8t … 8t + 7 of the group are in blocks (8t + lane) / m.
            let lanes: [i32; 8] = std::array::from_fn(|lane| ((8 * t + lane) / m) as i32);
            *p = _mm256_loadu_si256(lanes.as_ptr() as *const __m256i);
        }
        Self { patterns, m }
    }

    #[inline(always)]
    fn patterns(&self) -> &[__m256i] {
        &self.patterns[..self.m]
    }
}

/// One-pass kernel of a piece (`xs`, its scales `sc`, its codes `out`, one a byte) of whole
/// blocks of `m` values back to back ([`narrow`]), max |x| calibration. Returns whether any
/// input was non-finite.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn measure_encode_narrow<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    m: usize,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    assert!(narrow(m), "a short block that is not whole vectors");
    let blocks = xs.len() / m;
    assert!(blocks * m == xs.len() && sc.len() == blocks && out.len() == xs.len());
    if blocks < 8 {
        // No group (a row of a few blocks and a partial one): no patterns to work out.
        return one_at_a_time(codec, k, m, xs, sc, out);
    }
    let spread = Spread::new(m);
    let mut bad = false;
    let mut b = 0;
    while b + 8 <= blocks {
        let r = b * m..(b + 8) * m;
        // In bounds: blocks b..b + 8 lie within xs, sc and out.
        let x0 = xs.as_ptr().add(r.start);
        x86::prefetch(x0.wrapping_add(x86::PREFETCH_AHEAD), 8 * m);
        let bits = x86::max_abs_bits_8runs_any(x0, m);
        if let Some(e) = checked_scales8(k, bits) {
            _mm256_storeu_ps(sc.as_mut_ptr().add(b), e);
            encode_group(
                codec,
                x0,
                &spread,
                bits,
                e,
                out.as_mut_ptr().add(r.start),
                k.stream,
            );
        } else {
            bad |= one_at_a_time(codec, k, m, &xs[r.clone()], &mut sc[b..b + 8], &mut out[r]);
        }
        b += 8;
    }
    bad | one_at_a_time(codec, k, m, &xs[b * m..], &mut sc[b..], &mut out[b * m..])
}

/// Pass 2 of a two-level scheme on a piece of whole blocks of `m` values back to back
/// ([`narrow`]), as `fused_avx2::two_level_piece`: block scales b_i from the amplitudes `sc`
/// holds on entry (replaced by the b_i), each block's values against e_i = min(b_i × g,
/// f32::MAX), codes into `out` (one a byte). A group with a non-finite value or a zero e_i
/// goes block by block. Returns whether any input was non-finite. The amplitudes must be pass
/// 1's, each block's largest |x|, as there.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn two_level_piece<C: Encode>(
    codec: C,
    k: &FusedKernel<'_>,
    g: f32,
    m: usize,
    xs: &[f32],
    sc: &mut [f32],
    out: &mut [u8],
) -> bool {
    assert!(narrow(m), "a short block that is not whole vectors");
    let blocks = xs.len() / m;
    assert!(blocks * m == xs.len() && sc.len() == blocks && out.len() == xs.len());
    let mut bad = false;
    let mut b = 0;
    let spread = (blocks >= 8).then(|| Spread::new(m));
    while b + 8 <= blocks {
        let r = b * m..(b + 8) * m;
        // In bounds: blocks b..b + 8 lie within xs, sc and out.
        let x0 = xs.as_ptr().add(r.start);
        x86::prefetch(x0.wrapping_add(x86::PREFETCH_AHEAD), 8 * m);
        let alpha = _mm256_loadu_ps(sc.as_ptr().add(b));
        let bs = two_level_scales8(k, g, alpha);
        _mm256_storeu_ps(sc.as_mut_ptr().add(b), bs);
        let e = effective8(bs, g);
        let bits = _mm256_castps_si256(alpha); // the blocks' maxima, measured by pass 1
        if let (Some(spread), true) = (&spread, finite_and_nonzero(bits, e)) {
            encode_group(
                codec,
                x0,
                spread,
                bits,
                e,
                out.as_mut_ptr().add(r.start),
                false,
            );
        } else {
            for (j, &s) in sc.iter().enumerate().skip(b).take(8) {
                let r = j * m..(j + 1) * m;
                let e = effective_scale(s, g);
                bad |= crate::codec::encode_run(codec, &xs[r.clone()], e, &mut out[r]);
            }
        }
        b += 8;
    }
    for (j, s) in sc.iter_mut().enumerate().skip(b) {
        let r = j * m..(j + 1) * m;
        *s = k.two_level_scale(*s, g);
        let e = effective_scale(*s, g);
        bad |= crate::codec::encode_run(codec, &xs[r.clone()], e, &mut out[r]);
    }
    bad
}

/// Codes of eight blocks of m values from `x0` into `o0`, block j divided by lane j of `e`
/// (every lane non-zero, every value finite; `bits`: the blocks' maxima of the |x| bit
/// patterns): the checked multiply by the reciprocals for integer codes, as `fused_avx2`'s
/// groups, else the division (a multiply where every scale is a power of two). `stream`:
/// non-temporal 8-byte stores where `o0` is 8-byte aligned (the group's stores are then all
/// whole, so its lines are never mixed).
#[inline(always)]
unsafe fn encode_group<C: Encode>(
    codec: C,
    x0: *const f32,
    spread: &Spread,
    bits: __m256i,
    e: __m256,
    o0: *mut u8,
    stream: bool,
) {
    let stream = stream && (o0 as usize).is_multiple_of(8);
    let in_range = in_range8(codec, bits, e);
    let (mul, d) = x86::divisor_lanes(e);
    if let (false, Some(range), true) = (mul, codec.int_range(), x86::checked_reciprocal_lanes(e)) {
        let r = _mm256_div_ps(_mm256_set1_ps(1.0), e);
        let near = if in_range {
            encode_recip::<true>(x0, spread, r, range, o0, stream)
        } else {
            encode_recip::<false>(x0, spread, r, range, o0, stream)
        };
        if !near {
            return;
        }
        // A flagged quotient: the group again by the division, over the codes stored.
    }
    match (mul, in_range) {
        (true, true) => encode_with::<C, true, true>(codec, x0, spread, d, o0, stream),
        (true, false) => encode_with::<C, true, false>(codec, x0, spread, d, o0, stream),
        (false, true) => encode_with::<C, false, true>(codec, x0, spread, d, o0, stream),
        (false, false) => encode_with::<C, false, false>(codec, x0, spread, d, o0, stream),
    }
}

/// Codes of a group's m vectors: each value divided by its block's lane of `d` (multiplied by
/// it when `MUL`), encoded (without the clamp when `IN_RANGE`), 8 bytes a vector.
#[inline(always)]
unsafe fn encode_with<C: Encode, const MUL: bool, const IN_RANGE: bool>(
    codec: C,
    x0: *const f32,
    spread: &Spread,
    d: __m256,
    o0: *mut u8,
    stream: bool,
) {
    for (t, &pattern) in spread.patterns().iter().enumerate() {
        let dv = _mm256_permutevar8x32_ps(d, pattern);
        let v = _mm256_loadu_ps(x0.add(8 * t));
        let q = if MUL {
            _mm256_mul_ps(v, dv)
        } else {
            _mm256_div_ps(v, dv)
        };
        let c = if IN_RANGE {
            codec.encode8_in_range(q)
        } else {
            codec.encode8(q)
        };
        store_codes::<1>(&[c], o0.add(8 * t), stream);
    }
}

/// Integer codes of a group's m vectors by the checked multiply by the reciprocals `r` of the
/// blocks' scales ([`x86::int_codes8_recip`]), 8 bytes a vector. Returns whether a value was
/// flagged (its code then wrong: the caller encodes the group again by the division).
#[inline(always)]
unsafe fn encode_recip<const IN_RANGE: bool>(
    x0: *const f32,
    spread: &Spread,
    r: __m256,
    (lo, hi): (f32, f32),
    o0: *mut u8,
    stream: bool,
) -> bool {
    let (lov, hiv) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    let mut near = _mm256_set1_epi32(-1);
    for (t, &pattern) in spread.patterns().iter().enumerate() {
        let rv = _mm256_permutevar8x32_ps(r, pattern);
        let v = _mm256_loadu_ps(x0.add(8 * t));
        let c = x86::int_codes8_recip::<IN_RANGE>(v, rv, lov, hiv, &mut near);
        // i32 codes within [-128, 127]: the signed packs keep them.
        let w = _mm256_packs_epi32(c, c);
        let w = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
        store8(o0.add(8 * t), w, stream);
    }
    x86::recip_was_near(near)
}

/// Dequantize of blocks of `m` values back to back ([`narrow`]; the codes `codes` of flat
/// elements `start..`, one a byte) into `out`: eight blocks at a time from a block boundary,
/// each vector of values times its lanes' scales spread from the eight blocks' (`effective`,
/// all of the tensor's), the values before and after one at a time; the product of
/// `Decode::decode` and the scale either way, as `x86_runs::decode_lanes`. With `STREAM` every
/// store is non-temporal (the one-at-a-time ones too, so no line is written both ways): the
/// groups then start where `out` is 16-byte aligned too. Returns false, having written
/// nothing, when no such start is near (`out` at an odd place for even blocks, or too short a
/// range): the caller's general path then runs.
#[inline(always)]
pub(crate) unsafe fn decode_blocks<D: Decode, const STREAM: bool>(
    dec: D,
    effective: Effective<'_>,
    m: usize,
    start: usize,
    codes: &[u8],
    out: &mut [f32],
) -> bool {
    let n = out.len();
    assert!(
        narrow(m) && codes.len() == n,
        "a code a value, short blocks"
    );
    // Block boundaries come every m values, 16-byte ones every 4: one of the first four
    // boundaries is both, unless m is even and `out` is at an odd place.
    let lead = (m - start % m) % m;
    let aligned = |i: usize| !STREAM || (out.as_ptr().wrapping_add(i) as usize).is_multiple_of(16);
    let Some(g0) = (0..4).map(|k| lead + k * m).find(|&i| aligned(i)) else {
        return false;
    };
    if g0 + 8 * m > n {
        return false;
    }
    one_at_a_time_out::<D, STREAM>(dec, effective, m, start, &codes[..g0], &mut out[..g0]);
    let spread = Spread::new(m);
    let (mut i, mut b) = (g0, (start + g0) / m);
    while i + 8 * m <= n {
        let e = effective.get8(b);
        for (t, &pattern) in spread.patterns().iter().enumerate() {
            // In bounds: values i .. i + 8m lie within codes and out.
            let at = i + 8 * t;
            let fields = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(at) as *const _));
            let v = _mm256_mul_ps(dec.decode8(fields), _mm256_permutevar8x32_ps(e, pattern));
            x86::store8::<STREAM>(out.as_mut_ptr().add(at), v);
        }
        (i, b) = (i + 8 * m, b + 8);
    }
    one_at_a_time_out::<D, STREAM>(dec, effective, m, start + i, &codes[i..], &mut out[i..]);
    true
}

/// Dequantize of rows of `n` values that end in a partial block, blocks of `m` ([`narrow`])
/// along them, row r's scales in grid row r (`effective`, all of the tensor's; the codes
/// `codes` of flat elements `start..`, one a byte) into `out`, through the cache: each row's
/// part of the range by [`decode_blocks`] against the row's scales, which takes the partial
/// block one value at a time with the rest of its tail (eight whole blocks at a time never
/// reach it); one value at a time where [`decode_blocks`] finds no start. (Not for a streamed
/// output: each row's head and tail would be 4-byte non-temporal stores, partial lines a row.)
pub(crate) unsafe fn decode_rows<D: Decode>(
    dec: D,
    effective: Effective<'_>,
    m: usize,
    n: usize,
    start: usize,
    codes: &[u8],
    out: &mut [f32],
) {
    assert!(narrow(m) && codes.len() == out.len());
    let gc = n.div_ceil(m);
    let end = start + out.len();
    let mut pos = start;
    while pos < end {
        let (row, col) = (pos / n, pos % n);
        let stop = (pos - col + n).min(end);
        let scales = effective.range(row * gc..(row + 1) * gc);
        let (c, o) = (
            &codes[pos - start..stop - start],
            &mut out[pos - start..stop - start],
        );
        if !decode_blocks::<D, false>(dec, scales, m, col, c, o) {
            one_at_a_time_out::<D, false>(dec, scales, m, col, c, o);
        }
        pos = stop;
    }
}

/// `out[i] = dec.decode(codes[i]) × e` for the flat elements `start..` of blocks of `m` values
/// back to back, e each one's block's scale; with `STREAM` non-temporal 4-byte stores.
#[inline(always)]
unsafe fn one_at_a_time_out<D: Decode, const STREAM: bool>(
    dec: D,
    effective: Effective<'_>,
    m: usize,
    start: usize,
    codes: &[u8],
    out: &mut [f32],
) {
    if codes.is_empty() {
        return;
    }
    let (mut b, mut left) = (start / m, m - start % m);
    let mut e = effective.get(b);
    for (y, &c) in out.iter_mut().zip(codes) {
        if left == 0 {
            (b, left) = (b + 1, m);
            e = effective.get(b);
        }
        let v = dec.decode(c) * e;
        if STREAM {
            _mm_stream_si32(y as *mut f32 as *mut i32, v.to_bits() as i32);
        } else {
            *y = v;
        }
        left -= 1;
    }
}
