//! Hand-written AVX2 kernels: left to itself the compiler turns a block's division,
//! rounding and clamping into code well short of the memory's pace.
//!
//! Every function here is `unsafe` for one reason: the CPU must have AVX2 (and F16C where
//! said; callers check [`super::has_avx2`]); slices are indexed only within their bounds.
//! They are `#[inline(always)]` without `#[target_feature]` (which stable Rust does not
//! allow together), and called only from `#[target_feature(enable = "avx2")]` functions:
//! inlined there, their intrinsics compile to AVX2 code.

use std::arch::x86_64::*;

use super::exact_reciprocal;
use crate::codec::{Decode, Encode};

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

/// Eight f32 ≥ 0 rounded to float16 values (SPEC §4), as f32: `up` the smallest value ≥ s,
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

/// Eight f32 ≥ 0 (finite, or +inf) rounded to bfloat16 values (SPEC §4), as f32: `up` the
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

/// Eight f32 ≥ 0 (finite, or +inf) rounded to UE8M0 values (SPEC §4), as f32: powers of two
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

/// Eight f32 ≥ 0 rounded to UE4M3 values (SPEC §4), as f32: `up` the smallest value ≥ s,
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

/// The OCP MX scale (SPEC §4 `mx`) of eight amplitudes as f32: 2^(floor(log2 α) − emax)
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
/// is the low nibble of byte t / 2 for even t, the high one for odd t: SPEC §8), with no
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
/// `out`, the first code in the low bits of each byte (SPEC §8); returns how many codes
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
    // [`stream_runs`]. The neighbouring runs' side is the layout's (`quantize::streams`).
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
