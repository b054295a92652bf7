//! Hand-written AVX2 primitives (maxima, scale rounding, reciprocals, stores): left to itself
//! the compiler turns a block's division, rounding and clamping into code well short of the
//! memory's pace. The runs built on them (decode, byte packing, encode) are in `x86_runs`.
//!
//! Every function here is `unsafe` for one reason: the CPU must have AVX2 (and F16C where
//! said; callers check [`super::has_avx2`]); slices are indexed only within their bounds.
//! They are `#[inline(always)]` without `#[target_feature]` (which stable Rust does not
//! allow together), and called only from `#[target_feature(enable = "avx2")]` functions:
//! inlined there, their intrinsics compile to AVX2 code.

use std::arch::x86_64::*;

/// Ask for the cache lines of `len` f32 values from `p`, which may lie past the end of the
/// input: a prefetch never faults, and the pointer is never dereferenced.
#[inline(always)]
pub(crate) unsafe fn prefetch(p: *const f32, len: usize) {
    for i in (0..len).step_by(16) {
        _mm_prefetch::<{ _MM_HINT_T0 }>(p.wrapping_add(i) as *const i8);
    }
}

/// `effective_scale` of eight block scales `b` in the lanes: min(b × g, f32::MAX).
#[inline(always)]
pub(crate) unsafe fn effective8(b: __m256, g: f32) -> __m256 {
    _mm256_min_ps(
        _mm256_mul_ps(b, _mm256_set1_ps(g)),
        _mm256_set1_ps(f32::MAX),
    )
}

/// max |x| of a run, NaNs passed over (as `calibrate::max_abs`: `max` keeps its second
/// operand when the first is NaN); 0 for an empty run.
#[inline(always)]
pub(crate) unsafe fn max_abs(xs: &[f32]) -> f32 {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let (mut a, mut b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (n, p) = (xs.len(), xs.as_ptr());
    let mut i = 0;
    // i + 16 (then i + 8) <= n: loads in bounds.
    while i + 16 <= n {
        a = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(i)), abs), a);
        b = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(i + 8)), abs), b);
        i += 16;
    }
    if i + 8 <= n {
        a = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(i)), abs), a);
        i += 8;
    }
    let m = _mm256_max_ps(a, b);
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    let mut m = _mm_cvtss_f32(m);
    for v in &xs[i..] {
        let a = v.abs();
        m = if a > m { a } else { m };
    }
    m
}

/// [`max_abs`] of a long slice: four accumulators (a chain of one waits on each max), and
/// the input asked for [`PREFETCH_AHEAD`] values ahead (one thread alone otherwise waits
/// on memory).
#[inline(always)]
pub(crate) unsafe fn max_abs_prefetching(xs: &[f32]) -> f32 {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut m = [_mm256_setzero_ps(); 4];
    let (n, p) = (xs.len(), xs.as_ptr());
    let mut i = 0;
    // i + 32 <= n: loads in bounds.
    while i + 32 <= n {
        for (k, acc) in m.iter_mut().enumerate() {
            if k % 2 == 0 {
                prefetch_line(p.wrapping_add(i + 8 * k + PREFETCH_AHEAD));
            }
            let v = _mm256_and_ps(_mm256_loadu_ps(p.add(i + 8 * k)), abs);
            *acc = _mm256_max_ps(v, *acc);
        }
        i += 32;
    }
    let a = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    let a = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    let a = _mm_cvtss_f32(_mm_max_ss(a, _mm_shuffle_ps::<1>(a, a)));
    let rest = max_abs(&xs[i..]);
    if rest > a {
        rest
    } else {
        a
    }
}

/// The largest |x| bit pattern of a slice, as [`max_abs_prefetching`] but in integers: a
/// NaN is not passed over (its pattern is above every other's), so the result is past
/// f32::MAX's pattern exactly when a value is not finite.
#[inline(always)]
pub(crate) unsafe fn max_abs_bits_prefetching(xs: &[f32]) -> u32 {
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let mut m = [_mm256_setzero_si256(); 4];
    let (n, p) = (xs.len(), xs.as_ptr());
    let mut i = 0;
    // i + 32 <= n: loads in bounds.
    while i + 32 <= n {
        for (k, acc) in m.iter_mut().enumerate() {
            if k % 2 == 0 {
                prefetch_line(p.wrapping_add(i + 8 * k + PREFETCH_AHEAD));
            }
            let v = _mm256_loadu_si256(p.add(i + 8 * k) as *const __m256i);
            *acc = _mm256_max_epi32(_mm256_and_si256(v, abs), *acc);
        }
        i += 32;
    }
    let a = _mm256_max_epi32(_mm256_max_epi32(m[0], m[1]), _mm256_max_epi32(m[2], m[3]));
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, a);
    let rest = xs[i..].iter().map(|v| v.to_bits() & 0x7FFF_FFFF);
    lanes.into_iter().chain(rest).max().unwrap_or(0)
}

/// Ask for the cache line holding `p` (any address: a prefetch never faults) here, in
/// program order. The fences keep the compiler from moving the request, so that a loop
/// that asks for its lines one a vector or two does so among its loads, not in a burst
/// (the compiler otherwise gathers a loop body's requests at one place): a request waits
/// for a free line-fill buffer, and in a burst the later ones stall the loop. Measured on
/// 16 Mi values not in any cache, one thread (AVX-512 machine, medians of 7): per-tensor
/// int8 with a given scale 8.3-8.7 -> 5.1-5.2 ms, E4M3 9.6 -> 6.5, calibrated int8
/// 11.4 -> 8.3 (np.copyto 9.1-9.4).
#[inline(always)]
pub(crate) unsafe fn prefetch_line(p: *const f32) {
    use std::sync::atomic::{compiler_fence, Ordering::SeqCst};
    compiler_fence(SeqCst);
    _mm_prefetch::<{ _MM_HINT_T0 }>(p as *const i8);
    compiler_fence(SeqCst);
}

/// How far ahead of the values being read the long-run kernels ask for input, in values.
pub(crate) const PREFETCH_AHEAD: usize = 2048;

/// max of the |x| bit patterns of each of eight runs of `8 * V` values from `p`: lane j is run
/// j's (as i32; the pattern of the float maximum when every value is finite, and above
/// every finite one's when the run holds a NaN or infinity).
#[inline(always)]
pub(crate) unsafe fn max_abs_bits_8runs<const V: usize>(p: *const f32) -> __m256i {
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let mut m = [_mm256_setzero_si256(); 8];
    for (j, acc) in m.iter_mut().enumerate() {
        let run = p.add(j * 8 * V);
        for t in 0..V {
            let v = _mm256_and_si256(_mm256_loadu_si256(run.add(8 * t) as *const __m256i), abs);
            *acc = _mm256_max_epi32(v, *acc);
        }
    }
    fold_max8_epi32(&m)
}

/// Lane j: the largest i32 lane of `m[j]` (the eight vectors folded into one of their
/// maxima, as `max_abs_8runs` folds its floats). Inner functions, not closures: a closure
/// is not compiled for AVX2 when it is not inlined.
#[inline(always)]
unsafe fn fold_max8_epi32(m: &[__m256i; 8]) -> __m256i {
    #[inline(always)]
    unsafe fn pair(a: __m256i, b: __m256i) -> __m256i {
        _mm256_max_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b))
    }
    #[inline(always)]
    unsafe fn quad(ab: __m256i, cd: __m256i) -> __m256i {
        _mm256_max_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd))
    }
    let lo = quad(pair(m[0], m[1]), pair(m[2], m[3]));
    let hi = quad(pair(m[4], m[5]), pair(m[6], m[7]));
    _mm256_max_epi32(
        _mm256_permute2x128_si256::<0x20>(lo, hi),
        _mm256_permute2x128_si256::<0x31>(lo, hi),
    )
}

/// The largest |x| bit pattern of each of eight runs of `len` values (a multiple of 8)
/// from `p`, `p + len`, ...: lane j is run j's. As [`max_abs_8runs`] but in integers, so a
/// NaN is not passed over: its pattern is above every other's (an infinity's is above every
/// finite one's), and one look at the maxima tells whether a run holds either.
#[inline(always)]
pub(crate) unsafe fn max_abs_bits_8runs_len(p: *const f32, len: usize) -> __m256i {
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let mut m = [_mm256_setzero_si256(); 8];
    for (j, acc) in m.iter_mut().enumerate() {
        let run = p.add(j * len);
        for t in (0..len).step_by(8) {
            let v = _mm256_loadu_si256(run.add(t) as *const __m256i);
            *acc = _mm256_max_epi32(_mm256_and_si256(v, abs), *acc);
        }
    }
    fold_max8_epi32(&m)
}

/// [`max_abs_bits_8runs_len`] for runs of any length `len` ≥ 1: each run's last part vector
/// is a masked load, whose lanes past the run read as 0 (below every |x| pattern but zero's)
/// and touch no memory, so nothing past the eighth run is read.
#[inline(always)]
pub(crate) unsafe fn max_abs_bits_8runs_any(p: *const f32, len: usize) -> __m256i {
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let whole = len - len % 8;
    let tail = _mm256_cmpgt_epi32(
        _mm256_set1_epi32((len % 8) as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let mut m = [_mm256_setzero_si256(); 8];
    for (j, acc) in m.iter_mut().enumerate() {
        let run = p.add(j * len);
        for t in (0..whole).step_by(8) {
            let v = _mm256_loadu_si256(run.add(t) as *const __m256i);
            *acc = _mm256_max_epi32(_mm256_and_si256(v, abs), *acc);
        }
        let v = _mm256_maskload_epi32(run.add(whole) as *const i32, tail);
        *acc = _mm256_max_epi32(_mm256_and_si256(v, abs), *acc);
    }
    fold_max8_epi32(&m)
}

/// max |x| of each of eight runs of `len` values (a multiple of 8) from `p`, `p + len`, ...:
/// lane j is run j's. NaNs passed over, as [`max_abs`].
#[inline(always)]
pub(crate) unsafe fn max_abs_8runs(p: *const f32, len: usize) -> __m256 {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut m = [_mm256_setzero_ps(); 8];
    for (j, acc) in m.iter_mut().enumerate() {
        let run = p.add(j * len);
        for t in (0..len).step_by(8) {
            *acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(run.add(t)), abs), *acc);
        }
    }
    // Fold the eight vectors into one of their eight maxima (no NaN is left to order).
    let lo = quad(pair(m[0], m[1]), pair(m[2], m[3]));
    let hi = quad(pair(m[4], m[5]), pair(m[6], m[7]));
    _mm256_max_ps(
        _mm256_permute2f128_ps::<0x20>(lo, hi),
        _mm256_permute2f128_ps::<0x31>(lo, hi),
    )
}

/// Per 128-bit half: lanes (max of a's 0,2; of b's 0,2; of a's 1,3; of b's 1,3).
#[inline(always)]
unsafe fn pair(a: __m256, b: __m256) -> __m256 {
    _mm256_max_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b))
}

/// Per 128-bit half, from two [`pair`]s: the maxima of the half of a, b, c, d.
#[inline(always)]
unsafe fn quad(ab: __m256, cd: __m256) -> __m256 {
    _mm256_max_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(ab, cd),
        _mm256_shuffle_ps::<0b11_10_11_10>(ab, cd),
    )
}

/// Eight f32 ≥ 0 rounded to float16 values (format.md "Storing a scale: rounding to its dtype"), as f32: `up` the smallest value ≥ s,
/// else the nearest (ties to even); both saturate at 65504. F16C's conversion takes the
/// rounding direction in its immediate (toward +inf is `up` for s ≥ 0; MXCSR is not read);
/// past 65504 it gives infinity, whose code 0x7C00 is the next after 65504's 0x7BFF, so an
/// unsigned min saturates. The CPU must have F16C too. Equal to `ScaleDtype::F16.round`
/// (tested on every non-negative f32: `vector_scales_equal_scalar_on_every_f32`).
#[inline(always)]
pub(crate) unsafe fn round_f16_8(s: __m256, up: bool) -> __m256 {
    let h = if up {
        _mm256_cvtps_ph::<_MM_FROUND_TO_POS_INF>(s)
    } else {
        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(s)
    };
    _mm256_cvtph_ps(_mm_min_epu16(h, _mm_set1_epi16(0x7BFF)))
}

/// Eight f32 ≥ 0 (finite, or +inf) rounded to bfloat16 values (format.md "Storing a scale: rounding to its dtype"), as f32: `up` the
/// smallest value ≥ s, else the nearest (ties to even); both saturate at bfloat16's largest
/// (code 0x7F7F). bfloat16 is f32's top half with f32's exponent range, so every f32 (its
/// subnormals included) rounds by its bit pattern shifted right by 16, the integer way;
/// a carry into the exponent is the right next value, and one past 0x7F7F is the
/// saturation. Equal to `ScaleDtype::BF16.round` (tested on every non-negative f32).
#[inline(always)]
pub(crate) unsafe fn round_bf16_8(s: __m256, up: bool) -> __m256 {
    let bits = _mm256_castps_si256(s);
    let code = if up {
        // Truncate, then one up where any dropped bit is set.
        let low = _mm256_and_si256(bits, _mm256_set1_epi32(0xFFFF));
        let exact = _mm256_cmpeq_epi32(low, _mm256_setzero_si256());
        // exact is all ones (−1) where nothing was dropped: code + 1 + exact.
        let t = _mm256_srli_epi32::<16>(bits);
        _mm256_add_epi32(_mm256_add_epi32(t, _mm256_set1_epi32(1)), exact)
    } else {
        // Nearest, ties to even: add 0x7FFF plus the kept part's lowest bit, truncate.
        let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd);
        _mm256_srli_epi32::<16>(_mm256_add_epi32(bits, bias))
    };
    let code = _mm256_min_epi32(code, _mm256_set1_epi32(0x7F7F));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(code))
}

/// Eight f32 ≥ 0 (finite, or +inf) rounded to UE8M0 values (format.md "Storing a scale: rounding to its dtype"), as f32: powers of two
/// 2^(c − 127), c = 0..=254. A normal s of exponent field E and mantissa m takes E, plus one
/// where m is past the rounding point (up: m > 0; nearest: m ≥ half, a tie going up); an f32
/// subnormal lies between 2^-127 (m = 0x40_0000) and 2^-126, so there the point is 2^-127
/// (up) or the midpoint 0x60_0000 (nearest). One compare against a per-lane threshold, a
/// subtract of its mask, and a min saturate at 254; code 0 is 2^-127's subnormal pattern.
/// Equal to `ScaleDtype::UE8M0.round` (tested on every non-negative f32).
#[inline(always)]
pub(crate) unsafe fn round_ue8m0_8(s: __m256, up: bool) -> __m256 {
    let bits = _mm256_castps_si256(s);
    let exp = _mm256_srli_epi32::<23>(bits);
    let man = _mm256_and_si256(bits, _mm256_set1_epi32(0x7F_FFFF));
    // Rounds up past these mantissas (compared as man > t): normal, subnormal.
    let (normal, sub) = if up {
        (0, 0x40_0000)
    } else {
        (0x3F_FFFF, 0x5F_FFFF)
    };
    let subnormal = _mm256_cmpeq_epi32(exp, _mm256_setzero_si256());
    let t = _mm256_blendv_epi8(_mm256_set1_epi32(normal), _mm256_set1_epi32(sub), subnormal);
    // The compare's mask is −1 where it rounds up.
    let code = _mm256_sub_epi32(exp, _mm256_cmpgt_epi32(man, t));
    let code = _mm256_min_epi32(code, _mm256_set1_epi32(254));
    // c << 23 for c ≥ 1; 2^-127's pattern 0x40_0000 for c = 0 (the max of the two).
    _mm256_castsi256_ps(_mm256_max_epi32(
        _mm256_slli_epi32::<23>(code),
        _mm256_set1_epi32(0x40_0000),
    ))
}

/// Eight f32 ≥ 0 rounded to UE4M3 values (format.md "Storing a scale: rounding to its dtype"), as f32: `up` the smallest value ≥ s,
/// else the nearest (ties to even); both saturate at 448. The nearest code is E4M3's
/// encoder's (which saturates); for `up`, when its value lies below s the next code up is the
/// smallest value above (codes are in value order), but never past the largest, 0x7E. Equal
/// to `ScaleDtype::UE4M3.round` (tested on every non-negative f32).
#[inline(always)]
pub(crate) unsafe fn round_ue4m3_8(s: __m256, up: bool) -> __m256 {
    use crate::codec::{Encode, FloatCode};
    let code = FloatCode(crate::minifloat::E4M3).encode8(s);
    let v = ue4m3_value_8(code);
    if !up {
        return v;
    }
    let below = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(v, s));
    let code = _mm256_min_epi32(_mm256_sub_epi32(code, below), _mm256_set1_epi32(0x7E));
    ue4m3_value_8(code)
}

/// The values of eight UE4M3 codes (0..=0x7E, in i32 lanes): normal codes c are the f32
/// with exponent and mantissa fields (c + (127 − 7) · 8) << 20, subnormal ones (c < 8)
/// c · 2^-9.
#[inline(always)]
unsafe fn ue4m3_value_8(code: __m256i) -> __m256 {
    let normal = _mm256_slli_epi32::<20>(_mm256_add_epi32(code, _mm256_set1_epi32(120 << 3)));
    let sub = _mm256_mul_ps(_mm256_cvtepi32_ps(code), _mm256_set1_ps(1.0 / 512.0));
    let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), code);
    _mm256_blendv_ps(
        _mm256_castsi256_ps(normal),
        sub,
        _mm256_castsi256_ps(is_sub),
    )
}

/// One `*_prefix_len`: the leading scales, in whole groups of eight, that are finite, ≥ 0
/// (−0 included) and unchanged by `$round` (exactly representable). A macro rather than a
/// function taking the rounding: a closure argument is not reliably inlined into AVX2 code.
macro_rules! exact_prefix_len {
    ($(#[$doc:meta])* $name:ident, $features:literal, $round:ident) => {
        $(#[$doc])*
        #[inline]
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(scales: &[f32]) -> usize {
            let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
            let mut i = 0;
            // i + 8 <= len: the load is in bounds.
            while i + 8 <= scales.len() {
                let v = _mm256_loadu_ps(scales.as_ptr().add(i));
                let a = _mm256_and_ps(v, abs);
                // NaN fails both compares; an infinity or a value past the largest rounds
                // to the largest, so it fails the second.
                let ok = _mm256_and_ps(
                    _mm256_cmp_ps::<_CMP_GE_OQ>(v, _mm256_setzero_ps()),
                    _mm256_cmp_ps::<_CMP_EQ_OQ>($round(a, false), a),
                );
                if _mm256_movemask_ps(ok) != 0xFF {
                    break;
                }
                i += 8;
            }
            i
        }
    };
}

exact_prefix_len!(
    /// How many leading scales, in whole groups of eight, are all float16 values (finite,
    /// ≥ 0, −0 included, exactly representable): the caller checks from there one at a
    /// time. The CPU must have F16C too.
    f16_prefix_len,
    "avx2,f16c",
    round_f16_8
);
exact_prefix_len!(
    /// [`f16_prefix_len`] for UE4M3 scales (NVFP4's): the same test with the vector rounding.
    ue4m3_prefix_len,
    "avx2",
    round_ue4m3_8
);

/// [`f16_prefix_len`] for UE8M0 scales (the MX formats'): the values are 2^k, k in
/// -127..=127, so a test of the bits: a normal power of two (mantissa and sign 0, exponent
/// field 1..=254), or 2^-127 (the subnormal 0x0040_0000). No zero.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn ue8m0_prefix_len(scales: &[f32]) -> usize {
    let mut i = 0;
    // i + 8 <= len: the load is in bounds.
    while i + 8 <= scales.len() {
        let v = _mm256_loadu_ps(scales.as_ptr().add(i));
        let pow2 = exact_reciprocal_lanes(v);
        let b = _mm256_castps_si256(v);
        let ok = _mm256_or_si256(pow2, _mm256_cmpeq_epi32(b, _mm256_set1_epi32(0x0040_0000)));
        if _mm256_movemask_epi8(ok) != -1 {
            break;
        }
        i += 8;
    }
    i
}

/// What eight blocks' values are divided by: `(true, 1 / e)` when every lane of `e` is a
/// power of two (multiplying by the reciprocal then equals the division, see
/// [`super::exact_reciprocal`]; MX scales always are), else `(false, e)`.
#[inline(always)]
pub(crate) unsafe fn divisor_lanes(e: __m256) -> (bool, __m256) {
    if _mm256_movemask_epi8(exact_reciprocal_lanes(e)) == -1 {
        (true, _mm256_div_ps(_mm256_set1_ps(1.0), e))
    } else {
        (false, e)
    }
}

/// [`super::exact_reciprocal`]'s test in lanes: all ones where the lane of `e` is a power
/// of two 2^k, k in -126..=127 (dividing by it equals multiplying by 2^-k).
#[inline(always)]
pub(crate) unsafe fn exact_reciprocal_lanes(e: __m256) -> __m256i {
    let b = _mm256_castps_si256(e);
    let exp = _mm256_srli_epi32::<23>(b);
    _mm256_and_si256(
        _mm256_cmpeq_epi32(
            _mm256_and_si256(b, _mm256_set1_epi32(0x807F_FFFF_u32 as i32)),
            _mm256_setzero_si256(),
        ),
        _mm256_and_si256(
            _mm256_cmpgt_epi32(exp, _mm256_setzero_si256()),
            _mm256_cmpgt_epi32(_mm256_set1_epi32(255), exp),
        ),
    )
}

/// [`super::checked_reciprocal`]'s test in lanes: whether every lane of `e` has one.
#[inline(always)]
pub(crate) unsafe fn checked_reciprocal_lanes(e: __m256) -> bool {
    let b = _mm256_castps_si256(e);
    let ok = _mm256_and_si256(
        _mm256_cmpgt_epi32(b, _mm256_set1_epi32(0x007F_FFFF)),
        _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7E00_0000), b),
    );
    _mm256_movemask_epi8(ok) == -1
}

/// Integer codes of eight values `v` divided by a scale e, computed as `v · r` with
/// r = 1 / e rounded ([`super::checked_reciprocal`]), clamped to `[lo, hi]` ⊂ [-128, 127]
/// unless `IN_RANGE` (every |v / e| below `Encode::unclamped_below`, at most 127.5),
/// rounded to nearest: i32 lanes.
///
/// Why this is the division's code: the product q is within 2^-16 of v / e for |v / e| ≤ 128
/// (two roundings of 2^-24 relative), the correctly rounded quotient within 2^-18 of it,
/// so the two lie within 2^-15 of each other, as do their clamps (the clamp bounds are
/// integers and a clamp never moves two points apart); past 128 both clamp. They round to
/// the same integer unless a half-integer lies between them, so a lane whose q is
/// within 2.5 · 2^-15 of one is flagged: `near` takes the minimum of each lane's distance
/// measure, and [`recip_was_near`] says whether any lane was flagged. The caller then
/// encodes those values by the division; a flagged lane's code is not to be used.
///
/// The code is `cvtps2dq` of q: round to nearest, ties to even under the default MXCSR,
/// which every other step here assumes too (the product, the division it stands for). An
/// unflagged q is no tie, so that is the half-away rounding of `Encode::encode`.
///
/// The distance measure: s = q + 384 + 0x4002 · 2^-15 lies in [256, 512) (q < 127.49994),
/// where an f32's step is 2^-15, so s is q rounded to 15 fraction bits plus 0x4002 steps
/// (an even number of steps, so the tie rule of that rounding is unmoved), and its pattern's
/// low 15 bits are (f + 0x4002) mod 2^15 for f the fraction of q + 384 times 2^15: at most
/// 4 exactly when f is in [0x3FFE, 0x4002], 2 steps either side of a half. A q above that
/// (within 2^-16 of 127.5 in the `IN_RANGE` case) takes s to 512 or just past it, where
/// the low bits are 0 to 2: flagged, as it should be. One add, one and, one min a vector.
#[inline(always)]
pub(crate) unsafe fn int_codes8_recip<const IN_RANGE: bool>(
    v: __m256,
    r: __m256,
    lo: __m256,
    hi: __m256,
    near: &mut __m256i,
) -> __m256i {
    let mut q = _mm256_mul_ps(v, r);
    if !IN_RANGE {
        // `max` takes lo for a NaN, as the codecs' clamp does.
        q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
    }
    let s = _mm256_add_ps(q, _mm256_set1_ps(RECIP_NEAR_BIAS));
    let low = _mm256_and_si256(_mm256_castps_si256(s), _mm256_set1_epi32(0x7FFF));
    *near = _mm256_min_epu32(*near, low);
    _mm256_cvtps_epi32(q)
}

/// 384 + 0x4002 · 2^-15 (exact in f32): see [`int_codes8_recip`].
const RECIP_NEAR_BIAS: f32 = 384.0 + 0x4002 as f32 / 32768.0;

/// Whether [`int_codes8_recip`] flagged a lane since `near` was all ones.
#[inline(always)]
pub(crate) unsafe fn recip_was_near(near: __m256i) -> bool {
    let flagged = _mm256_cmpgt_epi32(_mm256_set1_epi32(5), near);
    _mm256_movemask_epi8(flagged) != 0
}

/// The 32 code bytes, in order, of four [`int_codes8_recip`] results (of a, b, c, d
/// values in turn): i32 codes within [-128, 127], which the signed packs keep.
#[inline(always)]
pub(crate) unsafe fn recip_bytes32(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m256i {
    let ab = _mm256_packs_epi32(a, b);
    let cd = _mm256_packs_epi32(c, d);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order)
}

/// The 16 code bytes, in order, of two [`int_codes8_recip`] results (as
/// [`recip_bytes32`]).
#[inline(always)]
pub(crate) unsafe fn recip_bytes16(a: __m256i, b: __m256i) -> __m128i {
    let ab = _mm256_packs_epi32(a, b);
    let ab = _mm_packs_epi16(
        _mm256_castsi256_si128(ab),
        _mm256_extracti128_si256::<1>(ab),
    );
    // Bytes a0..3 b0..3 a4..7 b4..7 (each pack works within 128-bit halves): reorder.
    _mm_shuffle_epi32::<0b11_01_10_00>(ab)
}

/// The OCP MX scale (format.md "Storing a scale: rounding to its dtype" `mx`) of eight amplitudes as f32: 2^(floor(log2 α) − emax)
/// within [2^-127, 2^127], for `emax` ≥ 0 (so a subnormal or zero α gives 2^-127, as
/// `scale::mx_scale_code`). An infinite α gives 2^127; a NaN is never passed in (the max
/// passes NaNs over).
#[inline(always)]
pub(crate) unsafe fn mx_scale_8(alpha: __m256, emax: i32) -> __m256 {
    let exp = _mm256_srli_epi32::<23>(_mm256_castps_si256(alpha));
    let code = _mm256_sub_epi32(exp, _mm256_set1_epi32(emax));
    let code = _mm256_min_epi32(
        _mm256_max_epi32(code, _mm256_setzero_si256()),
        _mm256_set1_epi32(254),
    );
    ue8m0_value8(code)
}

/// UE8M0 codes 0..=254 (i32 lanes) to their values: 2^(c − 127), code 0 the subnormal
/// 2^-127 (bit 22 alone).
#[inline(always)]
pub(crate) unsafe fn ue8m0_value8(code: __m256i) -> __m256 {
    let normal = _mm256_slli_epi32::<23>(code);
    let zero = _mm256_cmpeq_epi32(code, _mm256_setzero_si256());
    _mm256_castsi256_ps(_mm256_blendv_epi8(
        normal,
        _mm256_set1_epi32(0x0040_0000),
        zero,
    ))
}

/// Eight f32 to `p`: non-temporal (two 16-byte halves; `p` 16-byte aligned) or not.
#[inline(always)]
pub(crate) unsafe fn store8<const STREAM: bool>(p: *mut f32, v: __m256) {
    if STREAM {
        _mm_stream_ps(p, _mm256_castps256_ps128(v));
        _mm_stream_ps(p.add(4), _mm256_extractf128_ps::<1>(v));
    } else {
        _mm256_storeu_ps(p, v);
    }
}

/// Whether a kernel that stores runs one after another, non-temporally, stores this one so:
/// a run of `len` values, every one of them in a whole 8-value vector when `all_whole`.
/// A run's head and tail (a block of 12 values, say: 8 streamed, 4 not) go through the
/// cache, into lines whose other bytes the next runs stream; a line written partly
/// non-temporally and partly not is flushed in pieces, which made blocks of 12 fifty times
/// slower to dequantize. So short runs stream only when all of them are whole vectors; a
/// long run's two mixed lines are a small part of it.
#[inline(always)]
pub(crate) fn stream_runs(len: usize, all_whole: bool) -> bool {
    all_whole || len >= LONG_RUN
}

/// A run this long streams even beside runs that do not: its at most two mixed lines are
/// under 1/30 of its stores.
pub(crate) const LONG_RUN: usize = 4096;

/// Outputs (quantized codes, dequantized values) of at least this many bytes are written
/// with non-temporal stores: a store that misses the cache otherwise reads its line first,
/// a third memory pass (a 16 Mi float32 dequantize moves 16 + 64 + 64 MiB instead of
/// 16 + 64), and an output this large does not stay in the last-level cache for its reader
/// anyway. Smaller ones go through the cache, where the caller will likely read them.
pub(crate) const STREAM_MIN_BYTES: usize = 16 << 20;

/// 32 bytes to `p`: non-temporal (two 16-byte halves; `p` 16-byte aligned) or not.
#[inline(always)]
pub(crate) unsafe fn store32(p: *mut u8, v: __m256i, stream: bool) {
    if stream {
        _mm_stream_si128(p as *mut __m128i, _mm256_castsi256_si128(v));
        _mm_stream_si128(p.add(16) as *mut __m128i, _mm256_extracti128_si256::<1>(v));
    } else {
        _mm256_storeu_si256(p as *mut __m256i, v);
    }
}
