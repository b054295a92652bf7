//! Lookup mode (burn's `QuantMode::Lookup`): a stored field is an index into a codebook of
//! 2^bits f32 values, and a read is `codebook[field] × scale`.
//!
//! Everything Lookup-specific lives here: the [`Codebook`] value the scheme carries and the named
//! codebooks (defined low, in `codebook.rs`, so the scheme model needs nothing of this file),
//! the encoder (nearest entry by precomputed f32 thresholds) and decoder.
//! The codebook is not part of the bytes: like burn's table binding, it travels with the scheme.

use crate::codebook::too_wide;
pub use crate::codebook::{Codebook, BQ4, IQ4_NL, MAX_ENTRIES, NAMED, NF4};
use crate::error::Result;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

impl Codebook {
    /// The codebook of `values` for a scheme of `value`: its width checked first, so 256
    /// entries for an 8-bit value say what is missing rather than "too many entries".
    pub fn for_value(values: &[f32], value: crate::scheme::QuantValue) -> Result<Self> {
        if !value.is_float() && value.bits() > 4 {
            return Err(too_wide(value.name()));
        }
        let cb = Self::new(values)?;
        if !value.is_float() {
            cb.check_bits(value.bits(), value.name())?;
        }
        Ok(cb)
    }
}

/// The next f32 up (`f32::next_up`, which is newer than the crate's MSRV); x finite.
fn next_up(x: f32) -> f32 {
    if x == 0.0 {
        f32::from_bits(1)
    } else if x > 0.0 {
        f32::from_bits(x.to_bits() + 1)
    } else {
        f32::from_bits(x.to_bits() - 1)
    }
}

/// The encoder: the index of the nearest entry. Entries sorted ascending s_0 < … < s_{n−1};
/// `x ≥ t_j` for the f32 threshold t_j between s_j and s_{j+1} is exactly "x is past the
/// midpoint (or on it, when the tie goes up)", so the number of thresholds passed is the sorted
/// rank, and `perm` maps it back to the field. Unused thresholds are NaN, which nothing passes.
#[derive(Debug, Clone, Copy)]
pub struct LookupCode {
    thresholds: [f32; MAX_ENTRIES - 1],
    perm: [u8; MAX_ENTRIES],
    /// The thresholds as a binary search, for `encode8` and the search's `qv8`.
    rank: RankTree,
    /// `perm` for `encode8`: sorted rank r's field at slot (−r) & 7 of `field_lo` (r < 8) or
    /// `field_hi` (r ≥ 8), as [`RankTree::neg_rank8`] leaves the rank.
    field_lo: [i32; 8],
    field_hi: [i32; 8],
}

impl LookupCode {
    pub fn new(cb: &Codebook) -> Self {
        let n = cb.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| cb.get(a).total_cmp(&cb.get(b)));
        let mut perm = [0u8; MAX_ENTRIES];
        for (r, &k) in order.iter().enumerate() {
            perm[r] = k as u8;
        }
        let mut thresholds = [f32::NAN; MAX_ENTRIES - 1];
        for j in 0..n - 1 {
            let (lo, hi) = (cb.get(order[j]), cb.get(order[j + 1]));
            thresholds[j] = threshold(lo, hi);
        }
        let (mut field_lo, mut field_hi) = ([0; 8], [0; 8]);
        for p in 0..8 {
            field_lo[slot(p)] = i32::from(perm[p]);
            field_hi[slot(p)] = i32::from(perm[8 + p]);
        }
        Self {
            thresholds,
            perm,
            rank: RankTree::new(&thresholds),
            field_lo,
            field_hi,
        }
    }

    /// The sorted rank of `xs`: how many thresholds it reaches.
    #[inline(always)]
    fn rank(&self, xs: f32) -> usize {
        self.thresholds.iter().map(|&t| (xs >= t) as usize).sum()
    }
}

/// The smallest f32 t with `x ≥ t ⇔ x goes to hi` for every f32 x, between sorted entries
/// lo < hi: x goes to hi past the midpoint m = (lo + hi) / 2, and on it when hi is the larger
/// magnitude or the magnitudes are equal (−a and +a: their midpoint, ±0, goes to +a).
///
/// m is exact as the f64 pair `half + err / 2` (TwoSum): lo + hi rounds in f64 only when the
/// entries are more than 29 binades apart, and then m lies strictly between f64s, so no f32 is m.
fn threshold(lo: f32, hi: f32) -> f32 {
    let (a, b) = (lo as f64, hi as f64);
    let s = a + b;
    let bb = s - a;
    let err = (a - (s - bb)) + (b - bb); // a + b == s + err exactly
    let half = s / 2.0; // exact: f32 operands keep s far above f64's subnormals
    let near = half as f32;
    if err != 0.0 {
        // m = half + err/2 is no f32. The nearest f64 to m is `half`, so no f32 lies strictly
        // between them: the smallest f32 >= m is `half` itself or the one after it.
        return if near as f64 == half {
            if err > 0.0 {
                next_up(near)
            } else {
                near
            }
        } else if (near as f64) < half {
            next_up(near)
        } else {
            near
        };
    }
    let tie_up = hi.abs() >= lo.abs();
    let t = if (near as f64) < half {
        next_up(near)
    } else {
        near
    }; // smallest f32 >= m
    if t as f64 == half && !tie_up {
        next_up(t) // the midpoint itself stays down
    } else if t == 0.0 {
        0.0 // −0 ≥ +0: both zeros go up, as a tie between −a and +a does
    } else {
        t
    }
}

impl crate::codec::Encode for LookupCode {
    #[inline(always)]
    fn encode(&self, xs: f32) -> u8 {
        self.perm[self.rank(xs)]
    }

    #[inline(always)]
    fn zero_code(&self) -> u8 {
        // format.md "Lookup mode (codebooks)": with e = 0 the quotient is taken as +0, whose nearest entry is stored.
        self.encode(0.0)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn encode8(&self, q: __m256) -> __m256i {
        // The rank by binary search (seven compares, two permutes), the same count as `rank`'s
        // fifteen compares; then its field, one 8-entry permute per half, picked by rank ≥ 8.
        let (i, upper) = self.rank.neg_rank8(q);
        let lo = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(self.field_lo.as_ptr().cast()), i);
        let hi = _mm256_permutevar8x32_epi32(_mm256_loadu_si256(self.field_hi.as_ptr().cast()), i);
        _mm256_blendv_epi8(lo, hi, upper)
    }
}

/// Slot (−p) & 7 of an 8-entry table: where [`RankTree::neg_rank8`]'s running index −p reads
/// prefix p's entry.
fn slot(p: usize) -> usize {
    (8 - p % 8) % 8
}

/// The thresholds t_j as a binary search, for eight lanes at once: the rank r = Σ (u ≥ t_j)
/// found two bits at a time, then one bit at a time. The top two bits are
/// p = (u ≥ t_3) + (u ≥ t_7) + (u ≥ t_11) (three compares, no dependency between them); then
/// b1 = (u ≥ t_{4p+1}) and b0 = (u ≥ t_{2p'}) with p' = 2p + b1, and r = 2p' + b0. That is the
/// count because the thresholds rise strictly (t_j ≤ s_{j+1} < t_{j+1}: an entry is its own
/// nearest) and the NaN padding, which no compare passes, comes last.
///
/// A level's thresholds fit one register, indexed by the prefix as the compares leave it: a
/// passed compare is −1, so the running index is −p, whose low three bits (all a permute reads)
/// are (−p) & 7. Slot (−p) & 7 of a table therefore holds prefix p's threshold ([`slot`]).
/// Unreached slots are NaN.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RankTree {
    /// t_3, t_7, t_11.
    top: [f32; 3],
    l3: [f32; 8],
    l4: [f32; 8],
}

impl RankTree {
    fn new(thresholds: &[f32; MAX_ENTRIES - 1]) -> Self {
        debug_assert!({
            let n = thresholds.iter().take_while(|t| !t.is_nan()).count();
            thresholds[..n].windows(2).all(|w| w[0] < w[1])
                && thresholds[n..].iter().all(|t| t.is_nan())
        });
        let mut tree = Self {
            top: [thresholds[3], thresholds[7], thresholds[11]],
            l3: [f32::NAN; 8],
            l4: [f32::NAN; 8],
        };
        for p in 0..4 {
            tree.l3[slot(p)] = thresholds[4 * p + 1];
        }
        for p in 0..8 {
            tree.l4[slot(p)] = thresholds[2 * p];
        }
        tree
    }

    /// The rank of each lane of `u` among the thresholds (how many it reaches), negated, and
    /// the top bit's mask (rank ≥ 8). Shared by the encoder, the search's q(u) and its
    /// brackets, so all of them take the same compares.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn neg_rank8(&self, u: __m256) -> (__m256i, __m256i) {
        // Macros, not closures: a closure would not be compiled for AVX2.
        macro_rules! ge {
            ($th:expr) => {
                _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(u, $th))
            };
        }
        macro_rules! step {
            ($i:expr, $table:expr) => {{
                let i = $i;
                let th = _mm256_permutevar8x32_ps(_mm256_loadu_ps($table.as_ptr()), i);
                _mm256_add_epi32(_mm256_add_epi32(i, i), ge!(th))
            }};
        }
        let upper = ge!(_mm256_set1_ps(self.top[1]));
        let i2 = _mm256_add_epi32(
            _mm256_add_epi32(ge!(_mm256_set1_ps(self.top[0])), upper),
            ge!(_mm256_set1_ps(self.top[2])),
        );
        (step!(step!(i2, self.l3), self.l4), upper)
    }
}

/// The entry a scaled value quantizes to (for the `mse` search's error): the sorted entries,
/// and the same thresholds as [`LookupCode`]. A select per threshold, no table load, so the
/// search's error loop vectorizes.
#[derive(Debug, Clone, Copy)]
pub struct NearestEntry {
    thresholds: [f32; MAX_ENTRIES - 1],
    sorted: [f32; MAX_ENTRIES],
    tree: SearchTree,
}

/// The search's tables beside the thresholds' [`RankTree`] (the encoder's): `lo` and `hi` hold
/// sorted entry r at slot (−r) & 7, for r < 8 and r ≥ 8 (chosen by u ≥ t_7), so q(u) follows
/// the rank as the field does in [`LookupCode::encode8`]; and the brackets. Unreached slots are
/// NaN.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SearchTree {
    pub rank: RankTree,
    pub lo: [f32; 8],
    pub hi: [f32; 8],
    /// The stored field of each sorted rank ([`LookupCode`]'s `perm`), for codes taken from
    /// the brackets.
    pub fields: [i32; MAX_ENTRIES],
    /// The bracket that starts at rank r, by r: thresholds t_r, t_{r+1}, t_{r+2} (the last to
    /// tell whether the bracket holds) and sorted entries s_r, s_{r+1}, s_{r+2}; NaN past the
    /// end. Tables by r itself, so that one index (and one half mask) serves all six lookups.
    pub bracket: [[f32; MAX_ENTRIES]; 6],
    /// n − 3: the highest rank a bracket of three entries starts at (negative: none fits).
    pub bracket_max: i32,
}

impl SearchTree {
    fn new(code: &LookupCode, sorted: &[f32; MAX_ENTRIES], n: usize) -> Self {
        let thresholds = &code.thresholds;
        let mut tree = Self {
            rank: code.rank,
            lo: [f32::NAN; 8],
            hi: [f32::NAN; 8],
            fields: code.perm.map(i32::from),
            bracket: std::array::from_fn(|k| {
                let (table, shift): (&[f32], usize) = match k {
                    0..=2 => (thresholds, k),
                    _ => (&sorted[..n], k - 3),
                };
                std::array::from_fn(|r| table.get(r + shift).copied().unwrap_or(f32::NAN))
            }),
            bracket_max: n as i32 - 3,
        };
        for p in 0..8 {
            tree.lo[slot(p)] = sorted[p];
            tree.hi[slot(p)] = sorted[8 + p];
        }
        tree
    }
}

impl NearestEntry {
    pub fn new(cb: &Codebook) -> Self {
        let code = LookupCode::new(cb);
        let sorted = std::array::from_fn(|r| {
            if r < cb.len() {
                cb.get(code.perm[r] as usize)
            } else {
                0.0
            }
        });
        Self {
            thresholds: code.thresholds,
            sorted,
            tree: SearchTree::new(&code, &sorted, cb.len()),
        }
    }

    /// The binary-search tables (the search's AVX2 `qv8` reads them).
    pub(crate) fn tree(&self) -> &SearchTree {
        &self.tree
    }

    /// codebook[encode(u)], bit for bit: the thresholds rise, so the last one passed names the
    /// entry (NaN padding is never passed).
    #[inline(always)]
    pub fn value(&self, u: f32) -> f32 {
        let mut v = self.sorted[0];
        for (j, &t) in self.thresholds.iter().enumerate() {
            v = if u >= t { self.sorted[j + 1] } else { v };
        }
        v
    }
}

/// The decode table of a codebook: entry k for field k, 0 past the codebook (no valid field
/// reaches there: storage taken from a caller is checked first).
pub fn decode_table(cb: &Codebook) -> [f32; 256] {
    std::array::from_fn(|i| if i < cb.len() { cb.get(i) } else { 0.0 })
}

/// The decoder of codebook fields: [`decode_table`]'s value of each field, bit for bit. A
/// codebook has at most 16 entries, so eight fields decode with two in-register permutes (one
/// per half of the table's first 16 entries) and a blend on bit 3, instead of a gather: the
/// gather left the block-16 codebook presets' dequantize at 0.6 of `np.copyto`'s pace.
#[derive(Clone, Copy)]
pub struct LookupDecode<'a>(pub &'a [f32; 256]);

impl crate::codec::Decode for LookupDecode<'_> {
    #[inline(always)]
    fn decode(&self, field: u8) -> f32 {
        self.0[field as usize]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn decode8(&self, fields: __m256i) -> __m256 {
        // Each permute reads its lane's low three bits; bit 3 (moved to the sign) picks the
        // half. Fields past 15 are +0, as the table's entries there.
        let t = self.0.as_ptr();
        let lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t), fields);
        let hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.add(8)), fields);
        let v = _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(fields)));
        let past = _mm256_cmpgt_epi32(fields, _mm256_set1_epi32(15));
        _mm256_andnot_ps(_mm256_castsi256_ps(past), v)
    }
}

#[cfg(test)]
#[path = "lookup_tests.rs"]
mod tests;
