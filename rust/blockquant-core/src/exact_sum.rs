//! Exact sums of |x| for `absmean` calibration (format.md "Calibration"): an f64 sum kept when
//! it is provably exact (every partial sum representable, whatever the order), else the exact
//! sum from an accumulator of mantissas per exponent, rounded once to f64. Either way the result
//! does not depend on the order of summation, so threads and the numpy reference agree to the
//! bit.

use crate::simd::max_abs;

/// The mean of `count` values whose sum is `sum` (0 for none), rounded once to f32.
pub(crate) fn mean(sum: f64, count: usize) -> f32 {
    if count == 0 {
        0.0
    } else {
        (sum / count as f64) as f32
    }
}

/// An f64 sum of |x| with what it takes to prove it exact.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AbsSum {
    sum: f64,
    max: f32,
    /// The smallest nonzero |x| (its ulp divides every partial sum).
    min_nonzero: f32,
}

impl Default for AbsSum {
    fn default() -> Self {
        Self {
            sum: 0.0,
            max: 0.0,
            min_nonzero: f32::INFINITY,
        }
    }
}

impl AbsSum {
    pub(crate) fn add_all(&mut self, xs: &[f32]) {
        for &x in xs {
            let a = x.abs();
            self.sum += a as f64;
            self.max = if a > self.max { a } else { self.max };
            if a != 0.0 && a < self.min_nonzero {
                self.min_nonzero = a;
            }
        }
    }

    /// The mean |x| over `count` values: from this f64 sum when it is provably exact, else from
    /// `exact_sum` (rare: magnitudes spanning more than ~2^29 within one block).
    pub(crate) fn mean(&self, count: usize, exact_sum: impl FnOnce() -> f64) -> f32 {
        let sum = if self.is_exact(count) {
            self.sum
        } else {
            exact_sum()
        };
        mean(sum, count)
    }

    /// Every partial sum is a multiple of u = ulp(min_nonzero) and at most count·max; if that
    /// is ≤ 2^53·u, all of them are exact in f64, in any order.
    pub(crate) fn is_exact(&self, count: usize) -> bool {
        if self.max == 0.0 {
            return true;
        }
        if !self.max.is_finite() {
            return false;
        }
        let e = ((self.min_nonzero.to_bits() >> 23) as i32).max(1);
        let ulp = 2f64.powi(e - 127 - 23);
        (count as f64) * (self.max as f64) <= 2f64.powi(53) * ulp
    }
}

/// The exact sum of |x| over f32 values: mantissas accumulated per exponent, combined into a
/// wide integer, then rounded once to f64 (what Python's `math.fsum` returns).
#[derive(Debug, Clone)]
pub(crate) struct ExactSum {
    by_exp: Box<[u64; 255]>,
}

impl Default for ExactSum {
    fn default() -> Self {
        Self {
            by_exp: Box::new([0; 255]),
        }
    }
}

/// Limbs of the wide accumulator: 2^(254+24+40) fits in 6 × 64 bits.
const LIMBS: usize = 6;

impl ExactSum {
    pub(crate) fn add_all(&mut self, xs: &[f32]) {
        for &x in xs {
            let b = x.to_bits() & 0x7FFF_FFFF;
            let e = (b >> 23) as usize;
            if e == 255 {
                continue; // non-finite: rejected later by the quantize pass
            }
            let m = (b & 0x7F_FFFF) as u64 | if e == 0 { 0 } else { 0x80_0000 };
            self.by_exp[e] += m;
        }
    }

    /// [`ExactSum::add_all`] of at most 2^16 values, fast: with E the exponent of their
    /// largest |x|, those of exponent T = E − 13 or more are multiples of 2^(T−23) and sum to
    /// less than 2^16 · 2^(E+1) = 2^(T+30), so every partial sum of them is exact in f64, in
    /// any order: they are summed in eight f64 lanes, and the total (exact) added as one
    /// entry. The few smaller ones (and nothing else) go through the per-exponent entries.
    ///
    /// Done a sub-chunk of [`SUB_CHUNK`] values at a time: while one is summed (from cache,
    /// compute-bound), the next is asked for from memory, so the max pass over it, which waits
    /// on memory, finds it in cache.
    pub(crate) fn add_chunk(&mut self, xs: &[f32]) {
        assert!(xs.len() <= 1 << 16, "a chunk of at most 2^16 values");
        let mut rest = xs;
        while !rest.is_empty() {
            let (sub, next) = rest.split_at(rest.len().min(SUB_CHUNK));
            self.add_sub_chunk(sub, next);
            rest = next;
        }
    }

    /// [`ExactSum::add_chunk`] in one pass over memory where it can: each sub-chunk's
    /// threshold T from `guess`, the bits of the largest |x| of the sub-chunk before (0: none),
    /// its max found in the same pass (see [`ExactSum::add_sub_chunk_guessed`]). The max pass
    /// of `add_chunk` waits on memory, then its sum from cache is compute-bound: two thirds more
    /// time than one pass at the memory's pace. Returns the last sub-chunk's max |x| bits.
    pub(crate) fn add_chunk_guessing(&mut self, xs: &[f32], mut guess: u32) -> u32 {
        assert!(xs.len() <= 1 << 16, "a chunk of at most 2^16 values");
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            for sub in xs.chunks(SUB_CHUNK) {
                guess = if guess == 0 || guess >= 0x7F80_0000 {
                    self.add_sub_chunk(sub, &[])
                } else {
                    // SAFETY: the CPU has AVX2, checked just above.
                    unsafe { self.add_sub_chunk_guessed(sub, guess) }
                };
            }
            return guess;
        }
        self.add_chunk(xs);
        guess
    }

    /// One sub-chunk (at most [`SUB_CHUNK`] values) in one pass: T from `guess` (bits of a
    /// finite nonzero |x|), the big values summed as in [`big_sum`] while their max E' is
    /// found. The sum is exact when the lanes' partial sums, at most n · 2^(E'+1), stay within
    /// 2^53 units of 2^(T−23); when E' is past that (or non-finite), the small values entered
    /// are taken out again (integer entries: exactly) and the sub-chunk goes through
    /// [`ExactSum::add_sub_chunk`]. A guess too large costs time only (more small values), and
    /// the next sub-chunk guesses this one's max. Returns the bits of its max |x|.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn add_sub_chunk_guessed(&mut self, xs: &[f32], guess: u32) -> u32 {
        debug_assert!(xs.len() <= SUB_CHUNK && guess != 0 && guess < 0x7F80_0000);
        let t = ((guess >> 23) as i32 - 13).max(1) as u32;
        let (total, max_bits) = big_sum_max_avx2(xs, t, self);
        // Biased exponents: |x| < 2^(max(E', 1) − 126); units 2^(T − 150).
        let e_max = (max_bits >> 23).max(1);
        let log_n = xs.len().next_power_of_two().trailing_zeros();
        if max_bits >= 0x7F80_0000 || e_max + log_n > t + 29 {
            small_ones_taken_out(xs, t, self);
            return self.add_sub_chunk(xs, &[]);
        }
        let units = total * 2f64.powi(150 - t as i32);
        debug_assert!(units.fract() == 0.0 && units < 2f64.powi(53));
        self.by_exp[t as usize] += units as u64;
        max_bits
    }

    /// [`ExactSum::add_chunk`] of one sub-chunk; the start of `next` is prefetched meanwhile.
    /// Returns the bits of its max |x| (NaNs passed over).
    fn add_sub_chunk(&mut self, xs: &[f32], next: &[f32]) -> u32 {
        let max = max_abs(xs);
        if max == 0.0 {
            // All zero (NaNs, passed over by the max, are not summed either): nothing to add.
            return 0;
        }
        if !max.is_finite() {
            self.add_all(xs); // a non-finite value (rejected later)
            return max.to_bits();
        }
        // Biased exponents: T = max(E − 13, −126), so that 2^(T−23) is an entry's unit.
        let t = ((max.to_bits() >> 23) as i32 - 13).max(1) as u32;
        // Every partial sum is exact, so the order (lanes, vectors) does not matter.
        let total = big_sum(xs, t, self, &next[..next.len().min(SUB_CHUNK)]);
        // total = M · 2^(T−23) with M < 2^53: entry T (biased) holds units of 2^(T−150).
        let units = total * 2f64.powi(150 - t as i32);
        debug_assert!(units.fract() == 0.0 && units < 2f64.powi(53));
        self.by_exp[t as usize] += units as u64;
        max.to_bits()
    }

    pub(crate) fn merge(mut self, o: Self) -> Self {
        for (a, b) in self.by_exp.iter_mut().zip(o.by_exp.iter()) {
            *a += b;
        }
        self
    }

    /// Σ by_exp[e] · 2^(max(e,1) - 150), correctly rounded to f64.
    pub(crate) fn to_f64(&self) -> f64 {
        // Integer in units of 2^-149.
        let mut big = [0u64; LIMBS];
        for (e, &m) in self.by_exp.iter().enumerate() {
            if m == 0 {
                continue;
            }
            let shift = e.max(1) - 1;
            add_shifted(&mut big, m, shift);
        }
        big_to_f64(&big, -149)
    }
}

/// Values of a sub-chunk of [`ExactSum::add_chunk`]: 64 KiB, half of a core's L2 with the
/// next one coming in.
pub(crate) const SUB_CHUNK: usize = 1 << 14;

/// The f64 sum of the |x| of biased exponent `t` or more (and finite) in `xs`; every other
/// value goes into `small`'s per-exponent entries. See [`ExactSum::add_chunk`].
/// `ahead`'s cache lines are asked for meanwhile (the AVX2 build).
pub(crate) fn big_sum(xs: &[f32], t: u32, small: &mut ExactSum, ahead: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { big_sum_avx2(xs, t, small, ahead) };
    }
    let _ = ahead;
    big_sum_portable(xs, t, small)
}

#[inline(always)]
pub(crate) fn big_sum_portable(xs: &[f32], t: u32, small: &mut ExactSum) -> f64 {
    let mut lanes = [0.0f64; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        let mut any_small = false;
        for (l, &x) in lanes.iter_mut().zip(c) {
            let b = x.to_bits() & 0x7FFF_FFFF;
            let e = b >> 23;
            let big = e >= t && e != 255; // a NaN (max passes over it) is skipped below
            *l += if big { f32::from_bits(b) as f64 } else { 0.0 };
            any_small |= !big;
        }
        if any_small {
            small_ones(c, t, small);
        }
    }
    let rest = chunks.remainder();
    small_ones(rest, t, small);
    for &x in rest {
        let e = (x.to_bits() & 0x7FFF_FFFF) >> 23;
        if e >= t && e != 255 {
            lanes[0] += x.abs() as f64;
        }
    }
    lanes.iter().sum()
}

/// The values of `xs` below exponent `t` (or non-finite) into `small`'s entries.
#[inline(always)]
pub(crate) fn small_ones(xs: &[f32], t: u32, small: &mut ExactSum) {
    for &x in xs {
        let e = (x.to_bits() & 0x7FFF_FFFF) >> 23;
        if e < t || e == 255 {
            small.add_all(std::slice::from_ref(&x));
        }
    }
}

/// Eight values from `p` (`m`: the |x| mask, the bits just below the big range and infinity's):
/// the big ones' |x| widened to f64 into two accumulators, every |x| pattern into the max `mx`
/// (NaN above all; callers that ignore it lose its instruction to the compiler); false if any is
/// small. A zero adds nothing to either sum: taken as big, so that a pruned tensor (zeros in
/// most groups of eight) stays off the one-at-a-time path.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum_step(
    p: *const f32,
    m: [std::arch::x86_64::__m256i; 3],
    acc: &mut [std::arch::x86_64::__m256d; 2],
    mx: &mut std::arch::x86_64::__m256i,
) -> bool {
    use std::arch::x86_64::*;
    let bits = _mm256_and_si256(_mm256_loadu_si256(p as *const __m256i), m[0]);
    *mx = _mm256_max_epu32(*mx, bits);
    let big = _mm256_and_si256(
        _mm256_cmpgt_epi32(bits, m[1]),
        _mm256_cmpgt_epi32(m[2], bits),
    );
    let big = _mm256_or_si256(big, _mm256_cmpeq_epi32(bits, _mm256_setzero_si256()));
    let v = _mm256_castsi256_ps(_mm256_and_si256(bits, big));
    acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
    _mm256_movemask_ps(_mm256_castsi256_ps(big)) == 0xFF
}

/// [`big_sum_portable`] sixteen values a step: the big ones' |x| widened to f64 in four
/// accumulators, the rare step with another value finishing those eight one at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn big_sum_avx2(xs: &[f32], t: u32, small: &mut ExactSum, ahead: &[f32]) -> f64 {
    use std::arch::x86_64::*;
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let below = _mm256_set1_epi32(((t << 23) - 1) as i32); // t ≥ 1
    let inf = _mm256_set1_epi32(0x7F80_0000);
    let m = [abs, below, inf];
    // Named accumulators (an indexed array of them lives on the stack, one store a step).
    let (mut a, mut b) = ([_mm256_setzero_pd(); 2], [_mm256_setzero_pd(); 2]);
    // The max this sum does not use (the compiler drops its instructions).
    let mut unused = _mm256_setzero_si256();
    let (n, p) = (xs.len(), xs.as_ptr());
    // One line of `ahead` (16 values) per 16 values here: as long as `xs` when it is as long.
    let lines = ahead.len().div_ceil(16);
    let mut i = 0;
    // i + 16 <= n: loads in bounds; i / 16 < lines: the prefetched address within `ahead`.
    while i + 16 <= n {
        if i / 16 < lines {
            crate::simd::x86::prefetch_line(ahead.as_ptr().add(i));
        }
        if !sum_step(p.add(i), m, &mut a, &mut unused) {
            small_ones(&xs[i..i + 8], t, small);
        }
        if !sum_step(p.add(i + 8), m, &mut b, &mut unused) {
            small_ones(&xs[i + 8..i + 16], t, small);
        }
        i += 16;
    }
    let s = _mm256_add_pd(_mm256_add_pd(a[0], a[1]), _mm256_add_pd(b[0], b[1]));
    let mut l = [0.0f64; 4];
    _mm256_storeu_pd(l.as_mut_ptr(), s);
    l.iter().sum::<f64>() + big_sum_portable(&xs[i..], t, small)
}

/// Undo [`small_ones`] (the same values, subtracted from the same integer entries).
#[cfg(target_arch = "x86_64")]
fn small_ones_taken_out(xs: &[f32], t: u32, small: &mut ExactSum) {
    let mut entered = ExactSum::default();
    small_ones(xs, t, &mut entered);
    for (a, b) in small.by_exp.iter_mut().zip(entered.by_exp.iter()) {
        *a -= b;
    }
}

/// [`big_sum_avx2`] (prefetching its own input ahead, not the next sub-chunk's) that also
/// returns the bits of the largest |x| (NaN bits above every other).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn big_sum_max_avx2(xs: &[f32], t: u32, small: &mut ExactSum) -> (f64, u32) {
    use std::arch::x86_64::*;
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let below = _mm256_set1_epi32(((t << 23) - 1) as i32); // t ≥ 1
    let inf = _mm256_set1_epi32(0x7F80_0000);
    let m = [abs, below, inf];
    let (mut a, mut b) = ([_mm256_setzero_pd(); 2], [_mm256_setzero_pd(); 2]);
    let (mut ma, mut mb) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let (n, p) = (xs.len(), xs.as_ptr());
    let mut i = 0;
    // i + 16 <= n: loads in bounds. One line asked for each step, far enough ahead (past the
    // slice too: a prefetch never faults) that one thread does not wait on memory.
    while i + 16 <= n {
        crate::simd::x86::prefetch_line(p.wrapping_add(i + crate::simd::x86::PREFETCH_AHEAD));
        if !sum_step(p.add(i), m, &mut a, &mut ma) {
            small_ones(&xs[i..i + 8], t, small);
        }
        if !sum_step(p.add(i + 8), m, &mut b, &mut mb) {
            small_ones(&xs[i + 8..i + 16], t, small);
        }
        i += 16;
    }
    let s = _mm256_add_pd(_mm256_add_pd(a[0], a[1]), _mm256_add_pd(b[0], b[1]));
    let mut l = [0.0f64; 4];
    _mm256_storeu_pd(l.as_mut_ptr(), s);
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, _mm256_max_epu32(ma, mb));
    let tail = &xs[i..];
    let max_bits = lanes
        .into_iter()
        .chain(tail.iter().map(|x| x.to_bits() & 0x7FFF_FFFF))
        .max()
        .unwrap_or(0);
    (
        l.iter().sum::<f64>() + big_sum_portable(tail, t, small),
        max_bits,
    )
}

fn add_shifted(big: &mut [u64; LIMBS], m: u64, shift: usize) {
    let limb = shift / 64;
    let off = shift % 64;
    let wide = (m as u128) << off;
    let mut carry = 0u128;
    for (i, part) in [wide as u64, (wide >> 64) as u64].into_iter().enumerate() {
        if limb + i >= LIMBS {
            break;
        }
        let s = big[limb + i] as u128 + part as u128 + carry;
        big[limb + i] = s as u64;
        carry = s >> 64;
    }
    let mut i = limb + 2;
    while carry != 0 && i < LIMBS {
        let s = big[i] as u128 + carry;
        big[i] = s as u64;
        carry = s >> 64;
        i += 1;
    }
}

/// `big · 2^exp` rounded to nearest even f64 (the result is far from f64's limits here).
fn big_to_f64(big: &[u64; LIMBS], exp: i32) -> f64 {
    let Some(top) = (0..LIMBS).rev().find(|&i| big[i] != 0) else {
        return 0.0;
    };
    let msb = top * 64 + 63 - big[top].leading_zeros() as usize; // bit index of the leading 1
    let bit = |i: usize| (big[i / 64] >> (i % 64)) & 1;
    if msb < 53 {
        let mut v = 0u64;
        for i in (0..=msb).rev() {
            v = (v << 1) | bit(i);
        }
        return v as f64 * 2f64.powi(exp);
    }
    let low = msb - 52; // bits below the 53-bit mantissa
    let mut mant = 0u64;
    for i in (low..=msb).rev() {
        mant = (mant << 1) | bit(i);
    }
    let half = bit(low - 1) == 1;
    let sticky = (0..low - 1).any(|i| bit(i) == 1);
    if half && (sticky || mant & 1 == 1) {
        mant += 1; // may become 2^53: still exact as f64
    }
    mant as f64 * 2f64.powi(exp + low as i32)
}

#[cfg(test)]
#[path = "exact_sum_tests.rs"]
mod tests;
