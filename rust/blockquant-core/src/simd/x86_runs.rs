//! Hand-written AVX2 runs over whole runs of values: decode (codes to scaled f32), the byte
//! work of packing and checking storage, and encode (values to codes, by division or by the
//! checked reciprocal, AVX-512 where the CPU has it). Built on [`super::x86`]'s primitives;
//! the same contract: `unsafe` because the CPU must have AVX2 (and F16C or AVX-512 where
//! said), `#[inline(always)]`, called only from `#[target_feature]` functions.

use std::arch::x86_64::*;

use super::exact_reciprocal;
use super::x86::*;
use crate::codec::{Decode, Encode};

/// `out[i] = dec.decode(codes[i]) * e` (same length), eight at a time. With `STREAM` the
/// stores from the first 16-byte boundary on are non-temporal (see
/// [`STREAM_MIN_BYTES`]); the caller then ends its task with an `_mm_sfence`. The head and
/// tail go through the cache: a caller that runs this on many short runs streams only
/// when they are all whole vectors ([`stream_runs`]).
#[inline(always)]
pub(crate) unsafe fn decode_run<D: Decode, const STREAM: bool>(
    dec: D,
    codes: &[u8],
    e: f32,
    out: &mut [f32],
) {
    let n = codes.len();
    assert_eq!(out.len(), n, "outputs of a run");
    let ev = _mm256_set1_ps(e);
    let (src, dst) = (codes.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    if STREAM {
        // Up to a 16-byte boundary one at a time, then aligned 16-byte stores that skip the
        // cache (no read of the lines first: the output is written, never read, here).
        // 16 bytes rather than 32: numpy's large arrays are 16-byte aligned, not 32.
        let head = (dst.align_offset(16)).min(n);
        for (y, &c) in out[..head].iter_mut().zip(&codes[..head]) {
            *y = dec.decode(c) * e;
        }
        i = head;
        if D::HAS_DECODE16 {
            i += decode16s::<D, true>(dec, &codes[i..], ev, &mut out[i..]);
        }
        // i + 8 <= n: in bounds; dst + i is 16-byte aligned (i - head a multiple of 8).
        while i + 8 <= n {
            let fields = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.add(i) as *const __m128i));
            store8::<true>(dst.add(i), _mm256_mul_ps(dec.decode8(fields), ev));
            i += 8;
        }
    }
    if D::HAS_DECODE16 && !STREAM {
        i += decode16s::<D, false>(dec, &codes[i..], ev, &mut out[i..]);
    }
    // i + 8 <= n = codes.len() = out.len(): loads and stores in bounds.
    while i + 8 <= n {
        let fields = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.add(i) as *const __m128i));
        _mm256_storeu_ps(dst.add(i), _mm256_mul_ps(dec.decode8(fields), ev));
        i += 8;
    }
    for (y, &c) in out[i..].iter_mut().zip(&codes[i..]) {
        *y = dec.decode(c) * e;
    }
}

/// `out[i] = dec.decode(codes[i]) * ev` for the leading multiple of 16 (returned), by
/// [`Decode::decode16`]. With `STREAM` `out` is 16-byte aligned and the stores are
/// non-temporal. The CPU must have F16C too (the caller's target features say so).
#[inline(always)]
pub(crate) unsafe fn decode16s<D: Decode, const STREAM: bool>(
    dec: D,
    codes: &[u8],
    ev: __m256,
    out: &mut [f32],
) -> usize {
    let n = codes.len().min(out.len()) / 16 * 16;
    let (src, dst) = (codes.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    // i + 16 <= n: loads and stores in bounds.
    while i + 16 <= n {
        let fields = _mm256_cvtepu8_epi16(_mm_loadu_si128(src.add(i) as *const __m128i));
        let (a, b) = dec.decode16(fields);
        store8::<STREAM>(dst.add(i), _mm256_mul_ps(a, ev));
        store8::<STREAM>(dst.add(i + 8), _mm256_mul_ps(b, ev));
        i += 16;
    }
    n
}

/// `out[i] = dec.decode(codes[i]) * es[i]`: a scale a value (blocks narrower than a
/// vector, whose scales the caller spread over their values), eight at a time, the last
/// few one at a time (the same product). With `STREAM`, `out` is 16-byte aligned and the
/// vector stores are non-temporal.
#[inline(always)]
pub(crate) unsafe fn decode_lanes<D: Decode, const STREAM: bool>(
    dec: D,
    codes: &[u8],
    es: &[f32],
    out: &mut [f32],
) {
    let n = out.len();
    assert!(codes.len() == n && es.len() == n, "a scale a value");
    let mut t = 0;
    while t + 8 <= n {
        // t + 8 <= n: loads and stores in bounds.
        let fields = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(t) as *const __m128i));
        let e = _mm256_loadu_ps(es.as_ptr().add(t));
        store8::<STREAM>(
            out.as_mut_ptr().add(t),
            _mm256_mul_ps(dec.decode8(fields), e),
        );
        t += 8;
    }
    for i in t..n {
        out[i] = dec.decode(codes[i]) * es[i];
    }
}

/// [`decode_run`] of whole blocks of `bc` values (a multiple of 8), block k against
/// `eff[k]`: `codes` and `out` hold `eff.len()` blocks. With `STREAM`, `out` is 16-byte
/// aligned (so is every eight values' start) and the stores are non-temporal.
#[inline(always)]
pub(crate) unsafe fn decode_blocks_8s<D: Decode, const STREAM: bool>(
    dec: D,
    codes: &[u8],
    eff: &[f32],
    bc: usize,
    out: &mut [f32],
) {
    let n = eff.len() * bc;
    assert!(
        bc.is_multiple_of(8) && codes.len() == n && out.len() == n,
        "whole blocks"
    );
    let (src, dst) = (codes.as_ptr(), out.as_mut_ptr());
    if D::HAS_DECODE16 && bc.is_multiple_of(16) {
        for (k, &e) in eff.iter().enumerate() {
            // Block k: codes and outputs k * bc .. (k + 1) * bc, within the n.
            let (c, o) = (k * bc, k * bc);
            decode16s::<D, STREAM>(
                dec,
                &codes[c..c + bc],
                _mm256_set1_ps(e),
                &mut out[o..o + bc],
            );
        }
        return;
    }
    for (k, &e) in eff.iter().enumerate() {
        let ev = _mm256_set1_ps(e);
        // k * bc + t + 8 <= n: loads and stores in bounds.
        for t in (k * bc..(k + 1) * bc).step_by(8) {
            let fields = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.add(t) as *const __m128i));
            store8::<STREAM>(dst.add(t), _mm256_mul_ps(dec.decode8(fields), ev));
        }
    }
}

/// [`decode_blocks_8s`] of 4-bit fields read straight from their packed bytes (value t
/// is the low nibble of byte t / 2 for even t, the high one for odd t: format.md "Stores and packing"), with no
/// code buffer between: eight fields from four bytes by one broadcast, one variable shift
/// and a mask. `bytes` holds the `eff.len() * bc / 2` bytes of the blocks.
#[inline(always)]
pub(crate) unsafe fn decode_nibble_blocks_8s<D: Decode, const STREAM: bool>(
    dec: D,
    bytes: &[u8],
    eff: &[f32],
    bc: usize,
    out: &mut [f32],
) {
    let n = eff.len() * bc;
    assert!(
        bc.is_multiple_of(8) && bytes.len() == n / 2 && out.len() == n,
        "whole blocks"
    );
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let low = _mm256_set1_epi32(0xF);
    let (src, dst) = (bytes.as_ptr(), out.as_mut_ptr());
    for (k, &e) in eff.iter().enumerate() {
        let ev = _mm256_set1_ps(e);
        // k * bc + t + 8 <= n: the four bytes from t / 2 and the eight outputs in bounds.
        for t in (k * bc..(k + 1) * bc).step_by(8) {
            let four = (src.add(t / 2) as *const i32).read_unaligned();
            let fields = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(four), shifts), low);
            store8::<STREAM>(dst.add(t), _mm256_mul_ps(dec.decode8(fields), ev));
        }
    }
}

/// Pack 4- or 2-bit fields (the low bits of each code byte) 32 codes at a time into
/// `out`, the first code in the low bits of each byte (format.md "Stores and packing"); returns how many codes
/// were packed (a multiple of 32: the caller packs the rest). `out` must hold
/// `codes.len() * bits / 8` bytes rounded down.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn pack_fields(codes: &[u8], out: &mut [u8], bits: usize) -> usize {
    let chunks = codes.len() / 32;
    assert!(
        out.len() >= chunks * 32 * bits / 8,
        "room for the packed fields"
    );
    let (src, dst) = (codes.as_ptr(), out.as_mut_ptr());
    for k in 0..chunks {
        let c = _mm256_loadu_si256(src.add(32 * k) as *const __m256i);
        let mask = _mm256_set1_epi8(((1u16 << bits) - 1) as i8);
        let c = _mm256_and_si256(c, mask);
        // Each 16-bit lane holds two fields a byte apart: fold the second onto the first.
        let pairs = if bits == 4 {
            _mm256_or_si256(c, _mm256_srli_epi16::<4>(c))
        } else {
            _mm256_or_si256(c, _mm256_srli_epi16::<6>(c))
        };
        let pairs = _mm256_and_si256(pairs, _mm256_set1_epi16(0xFF));
        // 16 bytes of pairs, in order (the pack works within 128-bit halves).
        let bytes = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(pairs, pairs));
        if bits == 4 {
            _mm_storeu_si128(
                dst.add(16 * k) as *mut __m128i,
                _mm256_castsi256_si128(bytes),
            );
        } else {
            // Two 4-bit pairs a 16-bit lane again: fold once more, to 8 bytes.
            let b = _mm256_castsi256_si128(bytes);
            let quads = _mm_and_si128(
                _mm_or_si128(b, _mm_srli_epi16::<4>(b)),
                _mm_set1_epi16(0xFF),
            );
            _mm_storel_epi64(
                dst.add(8 * k) as *mut __m128i,
                _mm_packus_epi16(quads, quads),
            );
        }
    }
    chunks * 32
}

/// The bytes of `x` that are not in the set whose non-members `low` and `high` list
/// ([`all_in_set`]): such a byte's bit, 0 for a member.
#[inline(always)]
unsafe fn outside_set32(x: __m256i, low: __m256i, high: __m256i, bits: __m256i) -> __m256i {
    let nibble = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(x, nibble);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), nibble);
    // The row of x's low nibble, for high nibbles 0-7 or 8-15: blendv takes the second
    // where x's own top bit (a high nibble ≥ 8) is set.
    let row = _mm256_blendv_epi8(
        _mm256_shuffle_epi8(low, lo),
        _mm256_shuffle_epi8(high, lo),
        x,
    );
    _mm256_and_si256(row, _mm256_shuffle_epi8(bits, hi))
}

/// Whether every byte of `bytes` (at least 32 of them) is in a set of byte values given by
/// its non-members: bit h of `low[l]` is set when byte 16·h + l is not in the set, and bit
/// h − 8 of `high[l]` likewise for h ≥ 8. Two table lookups and a blend find a byte's row,
/// a third its bit: 32 bytes in about ten instructions, so the check of a stored tensor
/// (`crate::pack::check_storage`) runs at the memory's pace. A run that is not a multiple
/// of 32 ends with its last 32 bytes read again.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn all_in_set(bytes: &[u8], low: &[u8; 16], high: &[u8; 16]) -> bool {
    let n = bytes.len();
    assert!(n >= 32, "a run of at least 32 bytes");
    let low = _mm256_broadcastsi128_si256(_mm_loadu_si128(low.as_ptr() as *const __m128i));
    let high = _mm256_broadcastsi128_si256(_mm_loadu_si128(high.as_ptr() as *const __m128i));
    let bits = _mm256_broadcastsi128_si256(_mm_setr_epi8(
        1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128,
    ));
    let p = bytes.as_ptr();
    let load = |i: usize| _mm256_loadu_si256(p.add(i) as *const __m256i);
    // Two accumulators: the steps of a 64-byte stride do not wait for each other.
    let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let mut i = 0;
    while i + 64 <= n {
        a = _mm256_or_si256(a, outside_set32(load(i), low, high, bits));
        b = _mm256_or_si256(b, outside_set32(load(i + 32), low, high, bits));
        i += 64;
    }
    if i + 32 <= n {
        a = _mm256_or_si256(a, outside_set32(load(i), low, high, bits));
        i += 32;
    }
    if i < n {
        b = _mm256_or_si256(b, outside_set32(load(n - 32), low, high, bits));
    }
    let bad = _mm256_or_si256(a, b);
    _mm256_testz_si256(bad, bad) == 1
}

/// Unpack 4-bit fields (two a byte, the first in the low nibble) 32 at a time from `bytes`
/// into `codes`; returns how many were unpacked (a multiple of 32, within both slices: the
/// caller unpacks the rest).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn unpack_nibbles(bytes: &[u8], codes: &mut [u8]) -> usize {
    let chunks = (codes.len() / 32).min(bytes.len() / 16);
    let low = _mm_set1_epi8(0x0F);
    for k in 0..chunks {
        // 16 bytes in, 32 codes out: both in bounds for k < chunks.
        let b = _mm_loadu_si128(bytes.as_ptr().add(16 * k) as *const __m128i);
        let lo = _mm_and_si128(b, low);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), low);
        let dst = codes.as_mut_ptr().add(32 * k);
        _mm_storeu_si128(dst as *mut __m128i, _mm_unpacklo_epi8(lo, hi));
        _mm_storeu_si128(dst.add(16) as *mut __m128i, _mm_unpackhi_epi8(lo, hi));
    }
    chunks * 32
}

/// Unpack 2-bit fields (four a byte, the first in the low bits) 32 at a time from `bytes`
/// into `codes`; returns how many were unpacked (a multiple of 32, within both slices: the
/// caller unpacks the rest). Each byte is copied to four output bytes, and output byte j
/// keeps bits 2·(j % 4) of its copy: shifts of 16-bit lanes move those bits to the bottom
/// of the same byte (a shift by at most 6 keeps them there), and a mask per position picks
/// the right shift.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn unpack_crumbs(bytes: &[u8], codes: &mut [u8]) -> usize {
    let chunks = (codes.len() / 32).min(bytes.len() / 8);
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, //
        4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
    );
    let at = |k: i32| _mm256_set1_epi32(3 << (8 * k));
    let (m0, m1, m2, m3) = (at(0), at(1), at(2), at(3));
    for k in 0..chunks {
        // 8 bytes in, 32 codes out: both in bounds for k < chunks.
        let b = _mm256_set1_epi64x((bytes.as_ptr().add(8 * k) as *const i64).read_unaligned());
        let r = _mm256_shuffle_epi8(b, spread);
        let c = _mm256_or_si256(
            _mm256_or_si256(
                _mm256_and_si256(r, m0),
                _mm256_and_si256(_mm256_srli_epi16::<2>(r), m1),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(r), m2),
                _mm256_and_si256(_mm256_srli_epi16::<6>(r), m3),
            ),
        );
        _mm256_storeu_si256(codes.as_mut_ptr().add(32 * k) as *mut __m256i, c);
    }
    chunks * 32
}

/// Lanes whose f32 is an infinity or a NaN, as all-ones i32 lanes.
#[inline(always)]
unsafe fn non_finite8(v: __m256) -> __m256i {
    let exp = _mm256_set1_epi32(0x7F80_0000);
    _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exp), exp)
}

/// [`encode_run`] for any scale `e`: a zero one (the zero rule, every code that of 0) takes
/// the portable loop, which never divides. `stream`: see [`encode_run`].
#[inline(always)]
pub(crate) unsafe fn encode_run_or_zero<C: Encode>(
    codec: C,
    xs: &[f32],
    e: f32,
    out: &mut [u8],
    stream: bool,
) -> bool {
    match e {
        0.0 => crate::codec::encode_run(codec, xs, 0.0, out),
        e => encode_run(codec, xs, e, out, stream),
    }
}

/// Codes of `xs[i] / e` into `out` (same length), `e` ≠ 0; returns whether any input was
/// non-finite. The quotient is an IEEE division, or the multiply by an exact reciprocal that
/// equals it ([`exact_reciprocal`]). With `stream` (`out` is the caller's final, large
/// storage, see [`STREAM_MIN_BYTES`]) the 32-code stores are non-temporal where `out` is
/// 16-byte aligned; the task then ends with an `_mm_sfence`.
#[inline(always)]
pub(crate) unsafe fn encode_run<C: Encode>(
    codec: C,
    xs: &[f32],
    e: f32,
    out: &mut [u8],
    stream: bool,
) -> bool {
    let long = xs.len() > 256;
    // Streamed where every store is (32 codes at a time), or the run is long: see
    // [`stream_runs`]. The neighbouring runs' side is the layout's (`kernels::piece::streams`).
    let stream = stream
        && (out.as_ptr() as usize).is_multiple_of(16)
        && stream_runs(xs.len(), xs.len().is_multiple_of(32));
    if let (None, Some(range), Some(r)) = (
        exact_reciprocal(e),
        codec.int_range(),
        super::checked_reciprocal(e),
    ) {
        return if long && super::has_avx512() {
            encode_run_recip512(codec, xs, e, r, range, out, stream)
        } else if long {
            encode_run_recip::<C, true>(codec, xs, e, r, range, out, stream)
        } else {
            encode_run_recip::<C, false>(codec, xs, e, r, range, out, stream)
        };
    }
    // A run longer than a block group is read straight from memory: ask ahead for it.
    match (exact_reciprocal(e), long) {
        (Some(r), false) => encode_run_with::<C, true, false>(codec, xs, r, out, stream),
        (Some(r), true) => encode_run_with::<C, true, true>(codec, xs, r, out, stream),
        (None, false) => encode_run_with::<C, false, false>(codec, xs, e, out, stream),
        (None, true) => encode_run_with::<C, false, true>(codec, xs, e, out, stream),
    }
}

/// [`encode_run`] of integer codes by the checked multiply ([`int_codes8_recip`]) by 1 / e,
/// when the caller knows `e` has a [`super::checked_reciprocal`], every value is finite and
/// every |x / e| below `Encode::unclamped_below` (its run's largest |x| over e, by the
/// division, is): no clamp and no check of the inputs. The flags are tested once a span (a span with a
/// flagged lane is encoded again by the division, over the codes already stored): the
/// whole run, or with `LONG` (a run read straight from memory, its input then asked for
/// [`PREFETCH_AHEAD`] values ahead) each 256 values, of which a few in a hundred are
/// flagged (a value about once in 7,000). The values past the last whole 32 go by the
/// division.
#[inline(always)]
pub(crate) unsafe fn encode_run_recip_in_range<C: Encode, const LONG: bool>(
    codec: C,
    xs: &[f32],
    e: f32,
    out: &mut [u8],
    stream: bool,
) {
    let n = xs.len();
    assert_eq!(out.len(), n, "codes of a run");
    let stream = stream && (out.as_ptr() as usize).is_multiple_of(16);
    let rv = _mm256_set1_ps(1.0 / e);
    let (src, dst) = (xs.as_ptr(), out.as_mut_ptr());
    let whole = n - n % 32;
    let mut i = 0;
    while i < whole {
        let (start, end) = (i, if LONG { whole.min(i + 256) } else { whole });
        let mut near = _mm256_set1_epi32(-1);
        // i + 32 <= end <= n = xs.len() = out.len(): loads and stores in bounds.
        while i < end {
            let p = src.add(i);
            let mut c = [_mm256_setzero_si256(); 4];
            for (k, ck) in c.iter_mut().enumerate() {
                if LONG && k % 2 == 0 {
                    prefetch_line(p.wrapping_add(8 * k + PREFETCH_AHEAD));
                }
                let v = _mm256_loadu_ps(p.add(8 * k));
                // In range: the clamp bounds are not read.
                *ck = int_codes8_recip::<true>(v, rv, rv, rv, &mut near);
            }
            store32(dst.add(i), recip_bytes32(c[0], c[1], c[2], c[3]), stream);
            i += 32;
        }
        if recip_was_near(near) {
            let (x, o) = (&xs[start..end], &mut out[start..end]);
            encode_run_with::<C, false, false>(codec, x, e, o, stream);
        }
    }
    encode_run_with::<C, false, false>(codec, &xs[whole..], e, &mut out[whole..], stream);
}

/// [`encode_run`] of integer codes by the checked multiply ([`int_codes8_recip`]) by
/// `r`, the reciprocal of `e`: 32 values a step, those of a step with a flagged lane by
/// the division instead.
#[inline(always)]
pub(crate) unsafe fn encode_run_recip<C: Encode, const LONG: bool>(
    codec: C,
    xs: &[f32],
    e: f32,
    r: f32,
    (lo, hi): (f32, f32),
    out: &mut [u8],
    stream: bool,
) -> bool {
    let n = xs.len();
    assert_eq!(out.len(), n, "codes of a run");
    let (rv, ev) = (_mm256_set1_ps(r), _mm256_set1_ps(e));
    let (lov, hiv) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    // The largest |x| pattern: past f32::MAX's when an input is not finite.
    let mut top = _mm256_setzero_si256();
    let (src, dst) = (xs.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    // i + 32 <= n = xs.len() = out.len(): loads and stores in bounds.
    while i + 32 <= n {
        let p = src.add(i);
        // Loops, not closures: a closure is not reliably inlined into AVX2 code.
        let mut near = _mm256_set1_epi32(-1);
        let (mut v, mut c) = ([_mm256_setzero_ps(); 4], [_mm256_setzero_si256(); 4]);
        for k in 0..4 {
            if LONG && k % 2 == 0 {
                prefetch_line(p.wrapping_add(8 * k + PREFETCH_AHEAD));
            }
            v[k] = _mm256_loadu_ps(p.add(8 * k));
            top = _mm256_max_epi32(top, _mm256_and_si256(_mm256_castps_si256(v[k]), abs));
            c[k] = int_codes8_recip::<false>(v[k], rv, lov, hiv, &mut near);
        }
        let bytes = if recip_was_near(near) {
            for k in 0..4 {
                c[k] = codec.encode8(_mm256_div_ps(v[k], ev));
            }
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let ab = _mm256_packus_epi32(c[0], c[1]);
            let cd = _mm256_packus_epi32(c[2], c[3]);
            _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order)
        } else {
            recip_bytes32(c[0], c[1], c[2], c[3])
        };
        // dst + i is 16-byte aligned when `stream` (dst is, and i is a multiple of 32).
        store32(dst.add(i), bytes, stream);
        i += 32;
    }
    let bad = _mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x7F7F_FFFF));
    // The rest (under 32 values) by the division.
    let rest = encode_run_with::<C, false, false>(codec, &xs[i..], e, &mut out[i..], false);
    rest || _mm256_movemask_epi8(bad) != 0
}

/// [`encode_run_recip`] of a long run on AVX-512, 64 values a step: 16 lanes a vector,
/// each code byte the low byte of its lane (no packing). The rounding and the flag are
/// [`int_codes8_recip`]'s, with 128 · 2^15 more in the add so that the shifted lane's low
/// byte is the code itself (135 · 256 + 256 + round(q)). A step with a flagged lane is
/// encoded by the AVX2 division.
///
/// # Safety
/// The CPU must have AVX-512 F and BW ([`super::has_avx512`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
pub(crate) unsafe fn encode_run_recip512<C: Encode>(
    codec: C,
    xs: &[f32],
    e: f32,
    r: f32,
    (lo, hi): (f32, f32),
    out: &mut [u8],
    stream: bool,
) -> bool {
    let n = xs.len();
    assert_eq!(out.len(), n, "codes of a run");
    let rv = _mm512_set1_ps(r);
    let (lov, hiv) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
    let abs = _mm512_set1_epi32(0x7FFF_FFFF);
    // The largest |x| pattern: past f32::MAX's when an input is not finite.
    let mut top = _mm512_setzero_si512();
    let (src, dst) = (xs.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    // i + 64 <= n = xs.len() = out.len(): loads and stores in bounds.
    while i + 64 <= n {
        let p = src.add(i);
        let mut near = _mm512_set1_epi32(-1);
        let mut bytes = [_mm_setzero_si128(); 4];
        for (k, b) in bytes.iter_mut().enumerate() {
            prefetch_line(p.wrapping_add(16 * k + PREFETCH_AHEAD));
            let v = _mm512_loadu_ps(p.add(16 * k));
            top = _mm512_max_epi32(top, _mm512_and_si512(_mm512_castps_si512(v), abs));
            // `max` takes lo for a NaN, as the codecs' clamp does.
            let q = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, rv), lov), hiv);
            let m = _mm512_castps_si512(_mm512_add_ps(q, _mm512_set1_ps(384.0)));
            let t = _mm512_add_epi32(m, _mm512_set1_epi32(0x4002 + (128 << 15)));
            near = _mm512_min_epu32(near, _mm512_and_si512(t, _mm512_set1_epi32(0x7FFF)));
            *b = _mm512_cvtepi32_epi8(_mm512_srli_epi32::<15>(t));
        }
        if _mm512_cmplt_epu32_mask(near, _mm512_set1_epi32(5)) != 0 {
            let (x, o) = (&xs[i..i + 64], &mut out[i..i + 64]);
            // dst + i is 16-byte aligned when `stream` (dst is, and i is a multiple of 64).
            encode_run_with::<C, false, false>(codec, x, e, o, stream);
        } else {
            for (k, &b) in bytes.iter().enumerate() {
                let o = dst.add(i + 16 * k) as *mut __m128i;
                if stream {
                    _mm_stream_si128(o, b);
                } else {
                    _mm_storeu_si128(o, b);
                }
            }
        }
        i += 64;
    }
    let bad = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x7F7F_FFFF)) != 0;
    // The rest (under 64 values) by the AVX2 loop.
    let (x, o) = (&xs[i..], &mut out[i..]);
    let stream = stream && (o.as_ptr() as usize).is_multiple_of(16);
    bad | encode_run_recip::<C, false>(codec, x, e, r, (lo, hi), o, stream)
}

#[inline(always)]
unsafe fn encode_run_with<C: Encode, const MUL: bool, const LONG: bool>(
    codec: C,
    xs: &[f32],
    d: f32,
    out: &mut [u8],
    stream: bool,
) -> bool {
    let n = xs.len();
    assert_eq!(out.len(), n, "codes of a run");
    let dv = _mm256_set1_ps(d);
    let mut bad = _mm256_setzero_si256();
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let (src, dst) = (xs.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    // i + 32 <= n (then i + 8 <= n) = xs.len() = out.len(): loads and stores in bounds.
    while i + 32 <= n {
        let p = src.add(i);
        if LONG {
            prefetch_line(p.wrapping_add(PREFETCH_AHEAD));
        }
        let c0 = codes8::<C, MUL>(codec, _mm256_loadu_ps(p), dv, &mut bad);
        let c1 = codes8::<C, MUL>(codec, _mm256_loadu_ps(p.add(8)), dv, &mut bad);
        if LONG {
            prefetch_line(p.wrapping_add(PREFETCH_AHEAD + 16));
        }
        let c2 = codes8::<C, MUL>(codec, _mm256_loadu_ps(p.add(16)), dv, &mut bad);
        let c3 = codes8::<C, MUL>(codec, _mm256_loadu_ps(p.add(24)), dv, &mut bad);
        // i32 codes (0..=255) to bytes: the packs work within 128-bit halves, the permute
        // puts the dwords back in order.
        let ab = _mm256_packus_epi32(c0, c1);
        let cd = _mm256_packus_epi32(c2, c3);
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
        // dst + i is 16-byte aligned when `stream` (dst is, and i is a multiple of 32).
        store32(dst.add(i), bytes, stream);
        i += 32;
    }
    while i + 8 <= n {
        let c = codes8::<C, MUL>(codec, _mm256_loadu_ps(src.add(i)), dv, &mut bad);
        let w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c));
        _mm_storel_epi64(dst.add(i) as *mut __m128i, _mm_packus_epi16(w, w));
        i += 8;
    }
    let mut tail_bad = false;
    for (o, &x) in out[i..].iter_mut().zip(&xs[i..]) {
        *o = codec.encode(if MUL { x * d } else { x / d });
        tail_bad |= !x.is_finite();
    }
    tail_bad || _mm256_testz_si256(bad, bad) == 0
}

/// Codes of eight values: divided by `d`, or multiplied by it when `MUL`.
#[inline(always)]
unsafe fn codes8<C: Encode, const MUL: bool>(
    codec: C,
    v: __m256,
    d: __m256,
    bad: &mut __m256i,
) -> __m256i {
    *bad = _mm256_or_si256(*bad, non_finite8(v));
    let q = if MUL {
        _mm256_mul_ps(v, d)
    } else {
        _mm256_div_ps(v, d)
    };
    codec.encode8(q)
}
