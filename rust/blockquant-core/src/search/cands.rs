//! The candidate scales of the mse search (`search/mod.rs`): per block, stored scales around
//! minmax's, rounded to the scale dtype, in search order.

use crate::layout::Layout;
use crate::scale::effective_scale;
use crate::scale::{mx_scale_code, ScaleRounding};
use crate::scheme::{QuantValue, ScaleDtype};

/// The most candidates any value type has.
pub const MAX_CANDIDATES: usize = 11;

/// The divisors c of a value type's candidates, in search order: candidate k is the raw scale
/// α / (half_range · c_k), so the block's largest |x| lands at c_k times the half range. The
/// first is 1 (minmax itself, which therefore wins ties); the spacing is finer where the value
/// grid is finer. All are exact in f32, and so is half_range · c.
pub fn divisors(value: QuantValue) -> &'static [f32] {
    match value.bits() {
        8 => &[1.0, 62.0 / 64.0, 63.0 / 64.0, 65.0 / 64.0, 66.0 / 64.0],
        4 => &[
            1.0,
            27.0 / 32.0,
            28.0 / 32.0,
            29.0 / 32.0,
            30.0 / 32.0,
            31.0 / 32.0,
            33.0 / 32.0,
            34.0 / 32.0,
            35.0 / 32.0,
            36.0 / 32.0,
            37.0 / 32.0,
        ],
        // Ternary and 2-bit grids are coarse: the best scale sits well inside the range.
        _ => &[1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0],
    }
}

/// Rounding to F16, BF16 or UE4M3 without the generic code-space path (the search rounds
/// eleven candidates a block): the f32 bits rounded to the mantissa width (ties to even) in the
/// normal range, a power of two added and taken away in the subnormal range, saturating at the
/// largest value; `up` steps to the next value when that fell below. Equal to
/// [`ScaleDtype::round`] (tested), for finite s ≥ 0.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FastRound {
    shift: u32,
    min_normal: f32,
    magic: f32,
    max: f32,
    /// The spacing of the subnormal values.
    sub_quantum: f32,
}

impl FastRound {
    pub(crate) fn new(dtype: ScaleDtype) -> Option<Self> {
        let (mbits, emin) = match dtype {
            ScaleDtype::F16 => (10, -14),
            ScaleDtype::BF16 => (7, -126),
            ScaleDtype::UE4M3 => (3, -6),
            _ => return None,
        };
        Some(Self {
            shift: 23 - mbits,
            min_normal: crate::minifloat::exp2i(emin),
            magic: crate::minifloat::exp2i(emin - mbits as i32 + 23),
            max: dtype.max_value(),
            sub_quantum: crate::minifloat::exp2i(emin - mbits as i32),
        })
    }

    /// Branch-free (both roundings computed, then chosen), so a loop of them vectorizes.
    #[inline(always)]
    pub(crate) fn round(&self, s: f32, up: bool) -> f32 {
        let b = s.to_bits();
        let sub = (s + self.magic) - self.magic;
        let half = (1u32 << (self.shift - 1)) - 1;
        let normal = f32::from_bits(
            b.wrapping_add(half + ((b >> self.shift) & 1)) & !((1u32 << self.shift) - 1),
        );
        let n = if s < self.min_normal { sub } else { normal };
        let n = if n < self.max { n } else { self.max };
        if !up {
            return n;
        }
        let next_sub = n + self.sub_quantum;
        let next_normal = f32::from_bits(n.to_bits().wrapping_add(1u32 << self.shift));
        let next = if n < self.min_normal {
            next_sub
        } else {
            next_normal
        };
        let next = if next < self.max { next } else { self.max };
        if n >= s {
            n
        } else {
            next
        }
    }
}

/// What the candidates of a block depend on, besides its amplitude.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx {
    /// half_range · c_k for each divisor (exact), padded with the last.
    denoms: [f32; MAX_CANDIDATES],
    n_divisors: usize,
    fast: Option<FastRound>,
    dtype: ScaleDtype,
    mode: ScaleRounding,
    half_range: f32,
    emax: i32,
    /// Two-level: the per-tensor scale g.
    global: Option<f32>,
    /// Whether a block's distinct candidates are every stored value from its smallest
    /// candidate to its largest when the smallest is normal ([`contiguous`]): the lanes then
    /// list them instead of rounding every divisor's and dropping the repeats.
    contiguous: bool,
}

/// Whether the rounded candidates of a block whose smallest candidate is a normal `dtype`
/// value are exactly the `dtype` values from the smallest candidate to the largest, none
/// skipped: true for UE4M3 (up or nearest) when the divisors, in order of size, are at most
/// 1/16 apart (relative), as the 8- and 4-bit ones are (at most 1/31).
///
/// Why: a normal UE4M3 value m · 2^e (m = 8..15) takes every raw scale in an interval whose
/// top is at least 1.0667 times its bottom: (m + ½) / (m − ½), or 8.5 / 7.75 at m = 8, to the
/// nearest; m / (m − 1), or 8 / 7.5 at m = 8, rounding up. Raw scales at most 1.0625 apart
/// (the f32 divisions add 2^-22 at most) cannot step over such an interval, so every value
/// between the extremes is some candidate's. (The 2-bit divisors are 1.25 apart and skip
/// values; F16's values are 2^-10 apart, so its candidates are nearly all distinct anyway.)
fn contiguous(dtype: ScaleDtype, mode: ScaleRounding, denoms: &[f32]) -> bool {
    let mut d: Vec<f64> = denoms.iter().map(|&v| f64::from(v)).collect();
    d.sort_by(f64::total_cmp);
    dtype == ScaleDtype::UE4M3
        && matches!(mode, ScaleRounding::Up | ScaleRounding::Nearest)
        && d.len() >= 3
        && d[0] > 0.0
        && d.windows(2).all(|w| w[1] > w[0] && w[1] / w[0] <= 1.0625)
        // The lanes take candidate 1 as the largest scale and the last as the smallest.
        && f64::from(denoms[1]) == d[0]
        && f64::from(denoms[denoms.len() - 1]) == d[d.len() - 1]
}

impl Ctx {
    pub(crate) fn new(layout: &Layout, mode: ScaleRounding, global: Option<f32>) -> Self {
        let scheme = &layout.scheme;
        let divs = divisors(scheme.value);
        // A codebook's half range is max |c_k|: the product may round, the reference's too.
        let denoms: [f32; MAX_CANDIDATES] =
            std::array::from_fn(|k| scheme.half_range() * divs[k.min(divs.len() - 1)]);
        let dtype = layout.scheme.scale_dtype();
        Self {
            denoms,
            n_divisors: divs.len(),
            fast: FastRound::new(dtype),
            dtype,
            mode,
            half_range: scheme.half_range(),
            emax: scheme.mx_emax(),
            global,
            contiguous: contiguous(dtype, mode, &denoms[..divs.len()]),
        }
    }

    /// The candidate stored scales of a block of amplitude `alpha`, in search order, with
    /// repeats dropped (a repeat has the same error, and the first of equals wins anyway).
    /// UE8M0 (powers of two) takes the scale minmax would store and its two neighbours
    /// (×½ first, then ×2); every other dtype the divisors' raw scales, each rounded.
    #[inline(always)]
    pub(crate) fn candidates(&self, alpha: f32, out: &mut [f32; MAX_CANDIDATES]) -> usize {
        if self.dtype == ScaleDtype::UE8M0 {
            // One-level only (a two-level block dtype is F16 or UE4M3).
            let base = match self.mode {
                ScaleRounding::Mx => mx_scale_code(alpha, self.emax),
                _ => self.dtype.round_code(alpha / self.half_range, self.mode),
            } as i32;
            // Three distinct codes: no repeats to drop.
            let mut n = 0;
            for code in [base, base - 1, base + 1] {
                if (0..=254).contains(&code) {
                    out[n] = self.dtype.decode_code(code as u32);
                    n += 1;
                }
            }
            return n;
        }
        // Every candidate's arithmetic first, over a fixed-size array (independent, so the
        // divisions overlap and the loops vectorize), then the repeats dropped.
        let mut block = [0.0f32; MAX_CANDIDATES];
        for (b, &d) in block.iter_mut().zip(&self.denoms) {
            *b = alpha / d;
        }
        match self.global {
            None => {}
            // As compute_scales: g = 0 leaves nothing to normalize by.
            Some(0.0) => block = [0.0; MAX_CANDIDATES],
            Some(g) => block.iter_mut().for_each(|b| *b /= g),
        }
        let mut stored = [0.0f32; MAX_CANDIDATES];
        match self.fast {
            Some(f) if self.mode == ScaleRounding::Up => {
                for (st, &b) in stored.iter_mut().zip(&block) {
                    *st = f.round(b, true);
                }
            }
            Some(f) => {
                for (st, &b) in stored.iter_mut().zip(&block) {
                    *st = f.round(b, false);
                }
            }
            None => {
                for (st, &b) in stored.iter_mut().zip(&block) {
                    *st = self.dtype.round(b, self.mode);
                }
            }
        }
        // Candidates 1.. are monotone in k, so a repeat equals the first or the one just before
        // it (kept or not). Without branches: each is written, and kept by counting it.
        let mut keep = [false; MAX_CANDIDATES];
        for i in 1..MAX_CANDIDATES {
            let st = stored[i].to_bits();
            keep[i] = st != stored[0].to_bits() && st != stored[i - 1].to_bits();
        }
        out[0] = stored[0];
        let mut n = 1;
        for i in 1..self.n_divisors {
            out[n] = stored[i];
            n += usize::from(keep[i]);
        }
        n
    }

    /// Two-level: the per-tensor scale g.
    pub(crate) fn global(&self) -> Option<f32> {
        self.global
    }

    /// What values are divided by under stored scale `s`.
    #[inline]
    pub(crate) fn effective(&self, s: f32) -> f32 {
        match self.global {
            Some(g) => effective_scale(s, g),
            None => s,
        }
    }
}

/// The candidates of eight blocks at once, block j in AVX2 lane j (for `lanes.rs`).
#[cfg(target_arch = "x86_64")]
mod lanes {
    use std::arch::x86_64::*;

    use super::{Ctx, MAX_CANDIDATES};
    use crate::scale::ScaleRounding;
    use crate::scheme::ScaleDtype;
    use crate::simd::x86;

    impl Ctx {
        /// The candidate stored scales of eight blocks ([`Ctx::candidates`] in lanes) into
        /// `out`, in search order; returns how many vectors to try. A lane with fewer distinct
        /// candidates than that has its first candidate in the spare slots: a repeat has the
        /// same error, and the first of equals wins, so repeats (here as in
        /// [`Ctx::candidates`]) never change the pick. F16 and UE4M3 (up or nearest) and UE8M0
        /// (mx) in vector lanes; other dtypes block by block.
        #[inline(always)]
        pub(crate) unsafe fn candidates8(
            &self,
            alpha: __m256,
            out: &mut [__m256; MAX_CANDIDATES],
        ) -> usize {
            match (self.dtype, self.mode) {
                (ScaleDtype::UE8M0, ScaleRounding::Mx) if self.emax >= 0 => {
                    // Code 0 is 2^-127, exponent field 0 as well.
                    let code = _mm256_srli_epi32::<23>(_mm256_castps_si256(x86::mx_scale_8(
                        alpha, self.emax,
                    )));
                    let one = _mm256_set1_epi32(1);
                    let below = _mm256_sub_epi32(code, one);
                    let above = _mm256_add_epi32(code, one);
                    out[0] = x86::ue8m0_value8(code);
                    // Codes outside 0..=254 are dropped: the first candidate instead.
                    let has_below = _mm256_cmpgt_epi32(code, _mm256_setzero_si256());
                    let has_above = _mm256_cmpgt_epi32(_mm256_set1_epi32(255), above);
                    out[1] = _mm256_blendv_ps(
                        out[0],
                        x86::ue8m0_value8(below),
                        _mm256_castsi256_ps(has_below),
                    );
                    out[2] = _mm256_blendv_ps(
                        out[0],
                        x86::ue8m0_value8(above),
                        _mm256_castsi256_ps(has_above),
                    );
                    3
                }
                (
                    ScaleDtype::F16 | ScaleDtype::UE4M3,
                    ScaleRounding::Up | ScaleRounding::Nearest,
                ) => match self.listed8(alpha, out) {
                    Some(m) => m,
                    None => self.rounded8(alpha, out),
                },
                _ => {
                    let mut a = [0.0f32; 8];
                    _mm256_storeu_ps(a.as_mut_ptr(), alpha);
                    let mut lanes = [[0.0f32; 8]; MAX_CANDIDATES];
                    let mut most = 1;
                    for (j, &aj) in a.iter().enumerate() {
                        let mut c = [0.0f32; MAX_CANDIDATES];
                        let m = self.candidates(aj, &mut c);
                        most = most.max(m);
                        for (k, lane) in lanes.iter_mut().enumerate() {
                            lane[j] = if k < m { c[k] } else { c[0] };
                        }
                    }
                    for (o, lane) in out.iter_mut().zip(&lanes) {
                        *o = _mm256_loadu_ps(lane.as_ptr());
                    }
                    most
                }
            }
        }

        /// [`Ctx::candidates8`] of F16 and UE4M3 scales (up or nearest) the general way: every
        /// divisor's candidate rounded, then each lane's repeats dropped.
        #[inline(always)]
        pub(crate) unsafe fn rounded8(
            &self,
            alpha: __m256,
            out: &mut [__m256; MAX_CANDIDATES],
        ) -> usize {
            let up = self.mode == ScaleRounding::Up;
            let n = self.n_divisors;
            // The global scale's case outside the loop: the compiler would otherwise
            // divide by g in every iteration and select, which doubles the divisions
            // of one-level schemes.
            macro_rules! fill {
                (|$raw:ident| $to_block:expr) => {
                    for (k, o) in out[..n].iter_mut().enumerate() {
                        let $raw = _mm256_div_ps(alpha, _mm256_set1_ps(self.denoms[k]));
                        let raw = $to_block;
                        *o = if self.dtype == ScaleDtype::F16 {
                            x86::round_f16_8(raw, up)
                        } else {
                            x86::round_ue4m3_8(raw, up)
                        };
                    }
                };
            }
            match self.global {
                None => fill!(|raw| raw),
                Some(0.0) => fill!(|raw| {
                    let _ = raw;
                    _mm256_setzero_ps()
                }),
                Some(g) => fill!(|raw| _mm256_div_ps(raw, _mm256_set1_ps(g))),
            }
            compact(out, n)
        }

        /// [`Ctx::candidates8`] of contiguous candidates ([`Ctx::contiguous`]), listed: only the
        /// first candidate (minmax's) and the two extremes are rounded, and slot j ≥ 1 of a lane
        /// holds its j-th value down from the largest, minmax's passed over, as dropping the
        /// repeats of every divisor's candidate in search order would leave them (candidates
        /// 1.. descend; the first lies between two of them). Normal UE4M3 values one apart have
        /// bit patterns 2^20 apart. None (nothing written) unless every lane's smallest
        /// candidate is normal: zero, subnormal and g = 0 go the general way.
        #[inline(always)]
        pub(crate) unsafe fn listed8(
            &self,
            alpha: __m256,
            out: &mut [__m256; MAX_CANDIDATES],
        ) -> Option<usize> {
            if !self.contiguous || self.global == Some(0.0) {
                return None;
            }
            let up = self.mode == ScaleRounding::Up;
            let n = self.n_divisors;
            macro_rules! candidate {
                ($k:expr) => {{
                    let raw = _mm256_div_ps(alpha, _mm256_set1_ps(self.denoms[$k]));
                    let raw = match self.global {
                        None => raw,
                        Some(g) => _mm256_div_ps(raw, _mm256_set1_ps(g)),
                    };
                    x86::round_ue4m3_8(raw, up)
                }};
            }
            let (first, top, bottom) = (candidate!(0), candidate!(1), candidate!(n - 1));
            let normal = _mm256_cmp_ps::<_CMP_GE_OQ>(bottom, _mm256_set1_ps(2f32.powi(-6)));
            if _mm256_movemask_ps(normal) != 0xFF {
                return None;
            }
            let (first_bits, top_bits) = (_mm256_castps_si256(first), _mm256_castps_si256(top));
            let step = _mm256_set1_epi32(1 << 20);
            // Each lane's count of distinct values, and the most of them.
            let count = _mm256_add_epi32(
                _mm256_srli_epi32::<20>(_mm256_sub_epi32(top_bits, _mm256_castps_si256(bottom))),
                _mm256_set1_epi32(1),
            );
            let m = hmax_epi32(count) as usize;
            if m > n {
                // Cannot be (each value is some divisor's); the general way if it were.
                return None;
            }
            out[0] = first;
            for (j, o) in out.iter_mut().enumerate().take(m).skip(1) {
                let t = _mm256_sub_epi32(top_bits, _mm256_set1_epi32(((j - 1) << 20) as i32));
                // At or below minmax's value: one further down, past it.
                let past = _mm256_andnot_si256(_mm256_cmpgt_epi32(t, first_bits), step);
                let v = _mm256_castsi256_ps(_mm256_sub_epi32(t, past));
                // A lane with fewer values repeats the first in its spare slots.
                let live = _mm256_cmpgt_epi32(count, _mm256_set1_epi32(j as i32));
                *o = _mm256_blendv_ps(first, v, _mm256_castsi256_ps(live));
            }
            Some(m)
        }
    }

    /// The largest of eight i32 lanes.
    #[inline(always)]
    unsafe fn hmax_epi32(v: __m256i) -> i32 {
        let m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let m = _mm_max_epi32(m, _mm_shuffle_epi32::<0b01_00_11_10>(m));
        let m = _mm_max_epi32(m, _mm_shuffle_epi32::<0b10_11_00_01>(m));
        _mm_cvtsi128_si32(m)
    }

    /// The first `n` candidate vectors with each lane's repeats dropped (order kept), its spare
    /// slots holding its first candidate; returns the most any lane keeps. As in
    /// `Ctx::candidates`, candidates 1.. are monotone, so a repeat equals the first or the one just
    /// before it.
    #[inline(always)]
    unsafe fn compact(c: &mut [__m256; MAX_CANDIDATES], n: usize) -> usize {
        // A fixed count, so the loops unroll.
        match n {
            11 => compact_n::<11>(c),
            9 => compact_n::<9>(c),
            5 => compact_n::<5>(c),
            _ => n,
        }
    }

    #[inline(always)]
    unsafe fn compact_n<const N: usize>(c: &mut [__m256; MAX_CANDIDATES]) -> usize {
        let mut keep = [_mm256_setzero_si256(); N];
        let mut all = _mm256_set1_epi32(-1);
        for k in 1..N {
            let same = _mm256_or_si256(
                _mm256_cmpeq_epi32(_mm256_castps_si256(c[k]), _mm256_castps_si256(c[0])),
                _mm256_cmpeq_epi32(_mm256_castps_si256(c[k]), _mm256_castps_si256(c[k - 1])),
            );
            keep[k] = _mm256_andnot_si256(same, _mm256_set1_epi32(-1));
            all = _mm256_and_si256(all, keep[k]);
        }
        if _mm256_movemask_epi8(all) == -1 {
            return N;
        }
        // Candidate k goes to slot pos[k] of its lane (1 + the candidates kept before it) where
        // kept; slot 0 stays the first, and so do slots no candidate reaches.
        let mut pos = [_mm256_setzero_si256(); N];
        let mut count = _mm256_set1_epi32(1);
        for k in 1..N {
            pos[k] = count;
            count = _mm256_sub_epi32(count, keep[k]);
        }
        // Slot by slot, each built in a register and written once (a read-modify-write of a slot
        // in memory per candidate would become a masked store, slow on some CPUs).
        let mut out = [c[0]; N];
        #[allow(clippy::needless_range_loop)]
        for slot in 1..N {
            let want = _mm256_set1_epi32(slot as i32);
            let mut v = c[0];
            for k in slot..N {
                let here = _mm256_and_si256(keep[k], _mm256_cmpeq_epi32(pos[k], want));
                v = _mm256_blendv_ps(v, c[k], _mm256_castsi256_ps(here));
            }
            out[slot] = v;
        }
        c[..N].copy_from_slice(&out);
        // The most kept.
        hmax_epi32(count) as usize
    }
}
