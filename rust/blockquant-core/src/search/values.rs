//! The one thing the mse search (`search/mod.rs`) knows about each value type: q(u), the value
//! a scaled input u quantizes to, written without tables or branches so the error loops
//! vectorize. A new value kind is a [`Dequant`] (its `qv`, and `qv8` for AVX2 speed) plus an arm
//! of [`with_dequant!`]; tests hold each equal to decode(encode(u)).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::codec::minifloat;
use crate::scheme::QuantValue;

/// The reciprocal the search multiplies by for a candidate of effective scale `e` (the
/// definition's r = 1 / e in f32); infinite for a scale whose error is +inf (`search::error`).
#[inline(always)]
pub(crate) fn reciprocal(e: f32) -> f32 {
    1.0 / e
}

/// q(u) of one value type, one element at a time and (x86_64) eight at a time.
pub(crate) trait Dequant: Copy + Send + Sync {
    /// The value u quantizes to, as f32 (any ±0: only (u − q(u))² is used).
    fn qv(&self, u: f32) -> f32;

    /// `qv` of each lane, the same bits. The default goes lane by lane; value types with an
    /// AVX2 form override it.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn qv8(&self, u: __m256) -> __m256 {
        let mut a = [0.0f32; 8];
        _mm256_storeu_ps(a.as_mut_ptr(), u);
        _mm256_loadu_ps(a.map(|v| self.qv(v)).as_ptr())
    }

    /// Whether every lane's u with |u| ≤ `m` quantizes without saturating, so that
    /// [`Dequant::qv8_inside`] gives its q(u). The default never says so.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn inside8(&self, m: __m256) -> bool {
        let _ = m;
        false
    }

    /// `qv8` of lanes that [`Dequant::inside8`] vouched for: the same bits there, cheaper.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn qv8_inside(&self, u: __m256) -> __m256 {
        self.qv8(u)
    }

    /// Whether [`Dequant::bracket8`] narrows q (codebooks), for the lane search to use.
    const BRACKETS: bool = false;

    /// For eight lanes whose u all lie in [lo, hi] (one lane's u under every candidate scale),
    /// the [`Bracket8`] that gives each lane's q(u) from two compares, and a mask of the lanes
    /// where it would not (u may cross more than two thresholds: the caller must use `qv8`).
    /// Called only when [`Dequant::BRACKETS`].
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn bracket8(&self, lo: __m256, hi: __m256) -> (Bracket8, __m256) {
        let _ = (lo, hi);
        unreachable!("bracket8 of a value type without brackets")
    }

    /// The stored field of each lane of sorted rank `rank` (codebooks: [`Dequant::BRACKETS`]).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn field8(&self, rank: __m256i) -> __m256i {
        let _ = rank;
        unreachable!("field8 of a value type without brackets")
    }
}

/// Three consecutive sorted entries v[0] < v[1] < v[2] of a codebook, per lane, and the two
/// thresholds between them, a < b: for a u whose entry is among the three,
/// q(u) = u ≥ b ? v[2] : u ≥ a ? v[1] : v[0] (the thresholds rise, so u ≥ b implies u ≥ a).
/// The lane search brackets each input once, then pays two compares and two blends per
/// candidate instead of a search; the encode after it takes the code from the bracket too
/// (`r`, v[0]'s sorted rank).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Bracket8 {
    pub a: __m256,
    pub b: __m256,
    pub v: [__m256; 3],
    pub r: __m256i,
}

#[cfg(target_arch = "x86_64")]
impl Bracket8 {
    /// q(u) of each lane, u within the bracket.
    ///
    /// # Safety
    /// The CPU must support AVX.
    #[inline(always)]
    pub(crate) unsafe fn qv8(&self, u: __m256) -> __m256 {
        let q = _mm256_blendv_ps(self.v[0], self.v[1], _mm256_cmp_ps::<_CMP_GE_OQ>(u, self.a));
        _mm256_blendv_ps(q, self.v[2], _mm256_cmp_ps::<_CMP_GE_OQ>(u, self.b))
    }

    /// The sorted rank of each lane's entry, u within the bracket (a passed compare is −1).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[inline(always)]
    pub(crate) unsafe fn rank8(&self, u: __m256) -> __m256i {
        let ge_a = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(u, self.a));
        let ge_b = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(u, self.b));
        _mm256_sub_epi32(_mm256_sub_epi32(self.r, ge_a), ge_b)
    }
}

/// Integer values, either rounding: half away from zero and half to even differ only at a tie,
/// where |u − q(u)| is ½ both ways, so the error is the same bits and one function (half to
/// even, one instruction) serves both. q(u) itself may differ from the codec's at a tie.
#[derive(Clone, Copy)]
pub(crate) struct IntQ {
    pub qmin: f32,
    pub qmax: f32,
}

impl Dequant for IntQ {
    #[inline(always)]
    fn qv(&self, u: f32) -> f32 {
        clamp(u, self.qmin, self.qmax).round_ties_even()
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn qv8(&self, u: __m256) -> __m256 {
        // maxps/minps return the second operand when the first is NaN: NaN → qmin, as `clamp`.
        let v = _mm256_min_ps(
            _mm256_max_ps(u, _mm256_set1_ps(self.qmin)),
            _mm256_set1_ps(self.qmax),
        );
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn inside8(&self, m: __m256) -> bool {
        // |u| < qmax + ½ and < ½ − qmin: u rounds into [qmin, qmax], where the clamp does
        // nothing (and just outside it, the clamp and the rounding both give the end).
        let lim = (self.qmax + 0.5).min(0.5 - self.qmin);
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(m, _mm256_set1_ps(lim))) == 0xFF
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn qv8_inside(&self, u: __m256) -> __m256 {
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(u)
    }
}

/// As the codec's clamp: plain comparisons, a NaN becomes `lo`.
#[inline(always)]
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    let v = if v >= lo { v } else { lo };
    if v <= hi {
        v
    } else {
        hi
    }
}

/// E2M1 / E4M3 / E5M2: round the f32 mantissa to the format's bits (ties to even) in its normal
/// range, add-and-subtract a power of two in its subnormal range, saturate at the largest value.
/// (E2M1's codec thresholds, 0.25 < a, 0.75 ≤ a, 1.25 < a, ..., 5 < a, are exactly this
/// rounding's ties to even; tested against the codec.)
#[derive(Clone, Copy)]
pub(crate) struct MiniQ {
    /// 23 - mantissa bits.
    shift: u32,
    /// 2^emin, the smallest normal.
    min_normal: f32,
    /// 2^(emin - mbits + 23): adding it rounds to the subnormal quantum.
    magic: f32,
    max: f32,
}

impl MiniQ {
    pub(crate) fn new(value: QuantValue) -> Self {
        let fmt = minifloat(value).expect("a float value");
        let emin = 1 - fmt.bias;
        Self {
            shift: 23 - fmt.man_bits,
            min_normal: crate::minifloat::exp2i(emin),
            magic: crate::minifloat::exp2i(emin - fmt.man_bits as i32 + 23),
            max: fmt.max_value(),
        }
    }
}

impl Dequant for MiniQ {
    #[inline(always)]
    fn qv(&self, u: f32) -> f32 {
        let a = u.abs();
        let b = a.to_bits();
        let half = (1u32 << (self.shift - 1)) - 1;
        let normal = f32::from_bits(
            (b.wrapping_add(half + ((b >> self.shift) & 1))) & !((1u32 << self.shift) - 1),
        );
        let sub = (a + self.magic) - self.magic;
        let m = if a < self.min_normal { sub } else { normal };
        let m = if m < self.max { m } else { self.max };
        f32::from_bits(m.to_bits() | (u.to_bits() & 0x8000_0000))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn qv8(&self, u: __m256) -> __m256 {
        let sign = _mm256_set1_ps(-0.0);
        let a = _mm256_andnot_ps(sign, u);
        let b = _mm256_castps_si256(a);
        let shift = _mm_cvtsi32_si128(self.shift as i32);
        let half = _mm256_set1_epi32(((1u32 << (self.shift - 1)) - 1) as i32);
        let odd = _mm256_and_si256(_mm256_srl_epi32(b, shift), _mm256_set1_epi32(1));
        let keep = _mm256_set1_epi32(!((1u32 << self.shift) - 1) as i32);
        let normal = _mm256_castsi256_ps(_mm256_and_si256(
            _mm256_add_epi32(b, _mm256_add_epi32(half, odd)),
            keep,
        ));
        let magic = _mm256_set1_ps(self.magic);
        let sub = _mm256_sub_ps(_mm256_add_ps(a, magic), magic);
        let m = _mm256_blendv_ps(
            normal,
            sub,
            _mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(self.min_normal)),
        );
        let max = _mm256_set1_ps(self.max);
        let m = _mm256_blendv_ps(max, m, _mm256_cmp_ps::<_CMP_LT_OQ>(m, max));
        _mm256_or_ps(m, _mm256_and_ps(sign, u))
    }
}

/// Lookup mode: the codebook entry nearest to u ([`crate::lookup::NearestEntry`]).
impl Dequant for crate::lookup::NearestEntry {
    #[inline(always)]
    fn qv(&self, u: f32) -> f32 {
        self.value(u)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn qv8(&self, u: __m256) -> __m256 {
        let t = self.tree();
        let (i4, upper) = t.rank.neg_rank8(u);
        let lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.lo.as_ptr()), i4);
        let hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.hi.as_ptr()), i4);
        _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(upper))
    }

    const BRACKETS: bool = true;

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn bracket8(&self, lo: __m256, hi: __m256) -> (Bracket8, __m256) {
        // The rank r of lo (u ≥ lo, so every rank is ≥ r) by the same search as `qv8`, moved
        // down to at most n − 3 so that r + 2 is an entry; the bracket is entries r..r + 2. It
        // holds every u ≤ hi unless hi passes t_{r+2} (the NaN past the last never is).
        let t = self.tree();
        let (i4, _) = t.rank.neg_rank8(lo);
        let r = _mm256_min_epi32(
            _mm256_sub_epi32(_mm256_setzero_si256(), i4),
            _mm256_set1_epi32(t.bracket_max),
        );
        // Slot r of a 16-entry table: the low three bits pick within a half, bit 3 the half.
        let upper = _mm256_castsi256_ps(_mm256_cmpgt_epi32(r, _mm256_set1_epi32(7)));
        macro_rules! at {
            ($k:expr) => {{
                let table = &t.bracket[$k];
                let lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table.as_ptr()), r);
                let hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table.as_ptr().add(8)), r);
                _mm256_blendv_ps(lo, hi, upper)
            }};
        }
        let bracket = Bracket8 {
            a: at!(0),
            b: at!(1),
            v: [at!(3), at!(4), at!(5)],
            r,
        };
        // Too few entries for a bracket (bracket_max < 0): every lane falls back.
        let far = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(hi, at!(2)),
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_setzero_si256(), r)),
        );
        (bracket, far)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn field8(&self, rank: __m256i) -> __m256i {
        // Two 8-entry permutes (each reads the low three bits), picked by bit 3.
        let f = &self.tree().fields;
        let lo = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(f.as_ptr().cast()), rank);
        let hi = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(f.as_ptr().add(8).cast()), rank);
        let upper = _mm256_cmpgt_epi32(rank, _mm256_set1_epi32(7));
        _mm256_blendv_epi8(lo, hi, upper)
    }
}

/// Runs `$body` with `$q` bound to the [`Dequant`] of `$scheme`'s value, or its codebook (the
/// integer rounding does not change the error, see [`IntQ`]).
macro_rules! with_dequant {
    ($scheme:expr, |$q:ident| $body:expr) => {{
        let scheme: &$crate::scheme::QuantScheme = $scheme;
        let value: QuantValue = scheme.value;
        match value {
            _ if scheme.codebook.is_some() => {
                let cb = scheme.codebook.as_ref().expect("checked");
                let $q = $crate::lookup::NearestEntry::new(cb);
                $body
            }
            QuantValue::E2M1 | QuantValue::E4M3 | QuantValue::E5M2 => {
                let $q = $crate::search::values::MiniQ::new(value);
                $body
            }
            _ => {
                let (qmin, qmax) = value.range();
                let $q = $crate::search::values::IntQ { qmin, qmax };
                $body
            }
        }
    }};
}

pub(crate) use with_dequant;
