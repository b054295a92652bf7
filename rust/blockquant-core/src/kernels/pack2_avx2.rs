//! 2-bit codes under one per-tensor scale, packed along the last axis (BitNet's ternary Q2S,
//! 16 a u32 word), on AVX2: each value divided by the scale, encoded by the codec
//! and packed in registers straight into the words, 64 values (16 bytes) at a time. The
//! general path writes the codes to a buffer, then packs them from there into zeroed words;
//! this is the same arithmetic (tested against it) without that buffer and second pass.

use std::arch::x86_64::*;

use crate::codec::Encode;
use crate::input::{Input, Window};
use crate::layout::Layout;
use crate::pack::encode::encode_words_last_axis;
use crate::pack::storage::{ScaleSlice, Word};

/// Whether [`encode_words`] takes this call: f32 input, one scale for the tensor (not 0: the
/// zero rule stays with the general path), 2-bit fields filling their words, packed along the
/// last axis.
pub(crate) fn applies(layout: &Layout, x: &Window<'_>, sc: &ScaleSlice<'_>) -> bool {
    let p = &layout.packing;
    matches!(x.input, Input::F32(_))
        && layout.num_scales == 1
        && sc.scales.len() == 1
        && sc.scales[0] != 0.0
        && p.field_bits == 2
        && p.per * 2 == p.word_bits as usize
        && !p.swapped
        && crate::simd::has_avx2()
}

/// The words `[w0, w0 + words.len())` of the tensor ([`applies`]): whole runs of 64 values of
/// a line by [`encode_64s`], the rest of the line by the general path. Returns whether any
/// input was non-finite.
pub(crate) fn encode_words<C: Encode, W: Word>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    sc: ScaleSlice<'_>,
    w0: usize,
    words: &mut [W],
) -> bool {
    let Input::F32(xs) = x.input else {
        unreachable!("applies() checked the input is f32")
    };
    let p = &layout.packing;
    let (per, nw, n_axis) = (p.per, p.words_axis, p.n_axis);
    let e = sc.scales[0];
    // Integer values (not a codebook's indices) get their codes by comparisons, no division.
    let cuts = match layout.scheme.codebook {
        None => Thresholds::new(codec, e),
        Some(_) => None,
    };
    if n_axis < 64 {
        // No line holds a run of 64: every word by the general loop, in one call (not one a
        // line, each zeroing its code buffer).
        return encode_words_last_axis(codec, x, layout, sc, w0, words);
    }
    let w_end = w0 + words.len();
    let mut bad = false;
    let mut w = w0;
    while w < w_end {
        let (line, wi) = (w / nw, w % nw);
        let take = (w_end - w).min(nw - wi);
        let e0 = line * n_axis + wi * per;
        let e1 = (line * n_axis + (wi + take) * per).min((line + 1) * n_axis);
        // Whole words only: a run of 64 values is 64 / per of them (per = 4 or 16).
        let runs = (e1 - e0) / 64;
        let done = runs * 64 / per;
        let mine = &mut words[w - w0..w - w0 + done];
        // SAFETY: the words' memory seen as bytes (u8 and u32 have no invalid bit patterns;
        // u32 words are little-endian, the packed bytes' order), and `applies` checked the CPU
        // has AVX2.
        bad |= unsafe {
            let bytes = std::slice::from_raw_parts_mut(
                mine.as_mut_ptr() as *mut u8,
                std::mem::size_of_val(mine),
            );
            let run = &xs[e0 - x.start..e0 - x.start + runs * 64];
            match &cuts {
                Some(cuts) => encode_64s_by_thresholds(cuts, run, bytes),
                None => encode_64s(codec, run, e, bytes),
            }
        };
        if done < take {
            let rest = &mut words[w - w0 + done..w - w0 + take];
            bad |= encode_words_last_axis(codec, x, layout, sc, w + done, rest);
        }
        w += take;
    }
    bad
}

/// A 2-bit integer codec under one scale as comparisons: `code(x) = qmin + #{L : x ≥ cut[L]}`,
/// where `cut[L]` is the least float x whose `codec.encode(x / e)` has value L or more. Exact
/// because the quotient (correctly rounded) and the integer rounding are both monotone in x, so
/// each level is reached from one float on: the cuts are found by bisection on the ordered f32
/// patterns with the scalar codec itself. A NaN passes no comparison and gets qmin, as
/// `clamp` gives it.
pub(crate) struct Thresholds {
    /// Sign-extended value of the lowest code: the code of −∞ (and of NaN).
    qmin: i32,
    /// One per level above qmin, ascending; NaN past the codec's levels (never passed).
    cuts: [f32; 3],
}

impl Thresholds {
    /// None when the codec is not monotone as assumed (its ±0 codes differ, or −∞ and NaN
    /// codes do, or a level is skipped): then the division path runs.
    pub(crate) fn new<C: Encode>(codec: C, e: f32) -> Option<Self> {
        let level = |x: f32| -> i32 { (((codec.encode(x / e) & 3) << 6) as i8 >> 6) as i32 };
        // Ordered keys: u32 order of the keys is the float order (−0 just below +0).
        let key = |x: f32| {
            let b = x.to_bits();
            if b >> 31 == 1 {
                !b
            } else {
                b | 0x8000_0000
            }
        };
        let from_key = |k: u32| f32::from_bits(if k >> 31 == 1 { k & 0x7FFF_FFFF } else { !k });
        let (lo, hi) = (level(f32::NEG_INFINITY), level(f32::INFINITY));
        if !(e.is_finite() && e > 0.0)
            || level(-0.0) != level(0.0)
            || level(f32::NAN) != lo
            || hi - lo > 3
            || hi < lo
        {
            return None;
        }
        let mut cuts = [f32::NAN; 3];
        for (j, cut) in cuts.iter_mut().enumerate().take((hi - lo) as usize) {
            let want = lo + 1 + j as i32;
            // level(a) < want <= level(b), a < b as keys.
            let (mut a, mut b) = (key(f32::NEG_INFINITY), key(f32::INFINITY));
            while b - a > 1 {
                let m = a + (b - a) / 2;
                if level(from_key(m)) >= want {
                    b = m;
                } else {
                    a = m;
                }
            }
            *cut = from_key(b);
            // The least float of a level is never +0 (−0 has its code) and each level is
            // reached exactly at its cut, one step at a time.
            if *cut == 0.0 && cut.is_sign_positive() || level(*cut) != want {
                return None;
            }
        }
        Some(Self { qmin: lo, cuts })
    }
}

/// Eight values' 2-bit fields, one a dword (only its low two bits are kept): the one thing
/// the two encoders below differ in.
trait Codes8 {
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn codes8(&self, v: __m256) -> __m256i;
}

/// The codec's codes of the values divided by the scale.
struct Divided<C: Encode> {
    codec: C,
    e: __m256,
}

impl<C: Encode> Codes8 for Divided<C> {
    #[inline(always)]
    unsafe fn codes8(&self, v: __m256) -> __m256i {
        self.codec.encode8(_mm256_div_ps(v, self.e))
    }
}

/// [`Thresholds`]: three comparisons and two adds for eight values instead of a division (the
/// slowest instruction of the loop), rounding and clamping.
struct Cut {
    cut: [__m256; 3],
    qmin: __m256i,
}

impl Codes8 for Cut {
    #[inline(always)]
    unsafe fn codes8(&self, v: __m256) -> __m256i {
        // Each comparison passed is −1: qmin minus their sum counts them up (the field is the
        // low two bits of the two's complement).
        let m0 = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(v, self.cut[0]));
        let m1 = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(v, self.cut[1]));
        let m2 = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(v, self.cut[2]));
        let passed = _mm256_add_epi32(_mm256_add_epi32(m0, m1), m2);
        _mm256_and_si256(_mm256_sub_epi32(self.qmin, passed), _mm256_set1_epi32(3))
    }
}

/// [`encode_64s`] by [`Thresholds`].
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn encode_64s_by_thresholds(t: &Thresholds, xs: &[f32], out: &mut [u8]) -> bool {
    let k = Cut {
        cut: [
            _mm256_set1_ps(t.cuts[0]),
            _mm256_set1_ps(t.cuts[1]),
            _mm256_set1_ps(t.cuts[2]),
        ],
        qmin: _mm256_set1_epi32(t.qmin),
    };
    runs_of_64(&k, xs, out)
}

/// Codes of `xs` (a multiple of 64 values) against the scale `e` (not 0), four 2-bit fields a
/// byte (the first in the low bits, format.md "Stores and packing") into `out` (`xs.len() / 4` bytes). Returns whether
/// any value was non-finite.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn encode_64s<C: Encode>(codec: C, xs: &[f32], e: f32, out: &mut [u8]) -> bool {
    let k = Divided {
        codec,
        e: _mm256_set1_ps(e),
    };
    runs_of_64(&k, xs, out)
}

/// The loop of both encoders: 64 values (16 bytes) a step, the fields packed in registers.
/// Returns whether any value was non-finite.
#[inline(always)]
unsafe fn runs_of_64<K: Codes8>(k: &K, xs: &[f32], out: &mut [u8]) -> bool {
    let runs = xs.len() / 64;
    assert!(runs * 64 == xs.len() && out.len() == runs * 16);
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    // The packs work within 128-bit halves; this puts the dwords back in order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut top = _mm256_setzero_si256();
    for r in 0..runs {
        // In bounds: values 64r..64r + 64 of xs, bytes 16r..16r + 16 of out.
        let p = xs.as_ptr().add(64 * r);
        // As the general path's long runs: one thread alone otherwise waits on memory.
        crate::simd::x86::prefetch(p.wrapping_add(crate::simd::x86::PREFETCH_AHEAD), 64);
        let mut half = [_mm256_setzero_si256(); 2];
        for (h, hv) in half.iter_mut().enumerate() {
            let mut c = [_mm256_setzero_si256(); 4];
            for (t, ct) in c.iter_mut().enumerate() {
                let v = _mm256_loadu_ps(p.add(32 * h + 8 * t));
                // Largest |x| pattern: past f32::MAX's exactly when a value is not finite.
                top = _mm256_max_epi32(top, _mm256_and_si256(_mm256_castps_si256(v), abs));
                *ct = k.codes8(v);
            }
            // 32 code bytes in order: each dword holds four consecutive codes.
            let ab = _mm256_packus_epi32(c[0], c[1]);
            let cd = _mm256_packus_epi32(c[2], c[3]);
            let codes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
            // Fold each dword's four 2-bit fields into its low byte: byte 1 onto bits 2..3 of
            // byte 0 (and byte 3 onto byte 2), then byte 2 onto bits 4..7.
            let d = _mm256_and_si256(codes, _mm256_set1_epi8(3));
            let d = _mm256_or_si256(d, _mm256_srli_epi32::<6>(d));
            let d = _mm256_or_si256(d, _mm256_srli_epi32::<12>(d));
            *hv = _mm256_and_si256(d, _mm256_set1_epi32(0xFF));
        }
        // Sixteen bytes (dwords' low bytes) in order: the packs interleave the halves' dwords
        // by 128-bit lane, the permute takes them back.
        let z = _mm256_packus_epi32(half[0], half[1]);
        let z = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(z, z), order);
        _mm_storeu_si128(
            out.as_mut_ptr().add(16 * r) as *mut __m128i,
            _mm256_castsi256_si128(z),
        );
    }
    let over = _mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x7F7F_FFFF));
    _mm256_movemask_epi8(over) != 0
}

#[cfg(test)]
#[path = "pack2_avx2_tests.rs"]
mod tests;
