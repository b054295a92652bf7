//! The E2M1 encode of [`crate::kernels::nvfp4_avx2`]'s group kernels on AVX-512 (F, BW and VBMI: Ice
//! Lake and later, Zen 4 and later): eight blocks of 16 or 32 values, 64 values a step, with no
//! division. Every E2M1-two-a-byte kernel there uses it: NVFP4's pass 2 and its one pass under
//! a given g, the one-level schemes' (MXFP4 and its kin), given scales'.
//!
//! The AVX2 kernel divides each value by its block's effective scale e, as format.md "Quantizing a value" says, and on
//! a machine with two divider-fed pipes that division and the integer work of the rounding are
//! each nearly the whole of its time (one in cache costs 0.6 cycles a value, the other about as
//! much). Here the quotient is `x · r` with r = 1 / e rounded, and a lane is *flagged* when that
//! product lies so near an E2M1 rounding boundary that the true quotient might lie on its other
//! side; a step with a flagged lane returns, and the caller encodes the group by the division.
//!
//! Why the unflagged codes are the division's. For e positive and normal below 2^125, r is a
//! normal f32, so with y = x / e (a real number), r = (1/e)(1 + δ1), the product p = y(1 + δ1)
//! (1 + δ2) and the quotient q = y(1 + δ3), every |δ| ≤ 2^-24: |p − q| < 3.01 · 2^-24 · |y|.
//! Where p or q is within a factor 2 of a boundary m (0.25 ≤ m ≤ 5, normal numbers) that is at
//! most 3 of p's ulps, or 6 across a power of two: their bit patterns lie fewer than
//! [`NEAR`] = 16 apart. (p may overflow to ∞ or underflow where q does not; both are then far
//! past 5 or below 0.25, where the code does not depend on which.) Each boundary has at most two
//! mantissa bits, so its pattern is a multiple of 2^21, and so is every other E2M1 value (0.5,
//! 1, 1.5, ...).
//!
//! The key of a lane, from a = |p|'s pattern, is ⌊(a − NEAR) / 2^21⌋ + ⌈(a + NEAR) / 2^21⌉.
//! Where no multiple of 2^21 lies within NEAR of a, it is the odd number 2k + 1 of the gap
//! (k·2^21, (k + 1)·2^21) that holds a, and q's pattern lies in that gap too: the same code.
//! Where one does, k·2^21, the key is 2k. If that multiple is a boundary, the table marks the
//! key (bit 6) and the step is flagged; if not (an E2M1 value, exact in dequantized data, or 0
//! with its neighbours), the codes on both sides of it are the same and the table gives that
//! code. The keys past 5 and below 0.25 saturate to the table's ends. The sign is p's, which is
//! x's and so q's.

use std::arch::x86_64::*;

use crate::simd::x86;

/// The half-width, in bit patterns, of the window around a rounding boundary in which a
/// product's code is not trusted (see the module's comment: fewer than 7 are needed).
const NEAR: i32 = 16;

/// The E2M1 code of each table index t = key − 999 clamped to 0..=63 (t = 0 below 0.25, 63 for
/// anything past 5 and for ∞). The seven boundaries (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5) have
/// the keys t = 1, 13, 19, 23, 27, 31, 35, and the code steps up past each. `MARK` (a product
/// that may lie on either side) sets bit 6 there; without it (an exact quotient on the
/// boundary: a tie) the entry is the even one of the two codes, as format.md's rounding says.
const fn e2m1_by_key(mark: bool) -> [u8; 64] {
    const BOUNDARIES: [usize; 7] = [1, 13, 19, 23, 27, 31, 35];
    let mut t = [0u8; 64];
    let mut k = 0;
    while k < 64 {
        let mut code = 0u8;
        let mut s = 0;
        while s < BOUNDARIES.len() {
            if k > BOUNDARIES[s] {
                code += 1;
            } else if k == BOUNDARIES[s] {
                // Between code s (below) and s + 1 (above).
                code = if mark {
                    s as u8 | 0x40
                } else {
                    (s as u8 + 1) & !1
                };
                break;
            }
            s += 1;
        }
        t[k] = code;
        k += 1;
    }
    t
}

/// [`e2m1_by_key`] for products (boundaries marked) and for exact quotients (ties to even).
static E2M1_BY_KEY: [[u8; 64]; 2] = [e2m1_by_key(false), e2m1_by_key(true)];

/// Eight blocks of `8 * V` values from `x0` (V = 2 or 4) against the reciprocals `r[j]` of
/// their effective scales (each e_j positive, normal, below 2^125: [`crate::simd::checked_reciprocal`]),
/// E2M1 codes packed two a byte into `o0` (`32 * V` bytes; non-temporal stores with `stream`,
/// `o0` then 16-byte aligned). With `CHECK` (r_j not exact), returns true as soon as a step has
/// a flagged lane (module comment): the caller must then encode the whole group again by the
/// division, the bytes written so far being no use. Without (every r_j exact, a power of two:
/// the product is the quotient), never flags.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VBMI ([`crate::simd::has_avx512_vbmi`]); `8 * 8 * V`
/// values from `x0` readable, `32 * V` bytes from `o0` writable.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2")]
pub(crate) unsafe fn encode_8blocks<const V: usize, const CHECK: bool>(
    x0: *const f32,
    r: &[f32; 8],
    o0: *mut u8,
    stream: bool,
) -> bool {
    let table = _mm512_loadu_si512(E2M1_BY_KEY[CHECK as usize].as_ptr() as *const _);
    let abs = _mm512_set1_epi32(0x7FFF_FFFF);
    // ⌈(a + w) / 2^21⌉ − 999 as one arithmetic shift, ⌊(a − w) / 2^21⌋ as another: w = NEAR
    // for a product, 0 for an exact quotient (its key is then even only on a boundary or an
    // E2M1 value itself).
    let w = if CHECK { NEAR } else { 0 };
    let up = _mm512_set1_epi32(w + (1 << 21) - 1 - (999 << 21));
    let near = _mm512_set1_epi32(w);
    let marked = _mm512_set1_epi8(0x40);
    // Output byte j of a step (values 2j and 2j + 1: vector j / 8, 128-bit lane j / 2 % 4)
    // comes from the low byte of the pair's word in `maddubs`' result: the packs below put
    // vector k's lane-L values at bytes 16L + 4k.., its pairs at words 8L + 2k...
    let gather = _mm512_set_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, // bytes 32..64: unused
        62, 60, 46, 44, 30, 28, 14, 12, 58, 56, 42, 40, 26, 24, 10, 8, // output bytes 16..32
        54, 52, 38, 36, 22, 20, 6, 4, 50, 48, 34, 32, 18, 16, 2, 0, // output bytes 0..16
    );
    let pair = _mm512_set1_epi16(0x1001);
    for u in 0..V {
        let x = x0.add(64 * u);
        let mut key = [_mm512_setzero_si512(); 4];
        let mut bits = [_mm512_setzero_si512(); 4];
        for k in 0..4 {
            // Vector u * 4 + k of the group lies in block (u * 4 + k) * 2 / V.
            let rv = _mm512_set1_ps(r[(u * 4 + k) * 2 / V]);
            x86::prefetch_line(x.wrapping_add(16 * k + x86::PREFETCH_AHEAD));
            let p = _mm512_mul_ps(_mm512_loadu_ps(x.add(16 * k)), rv);
            bits[k] = _mm512_castps_si512(p);
            let a = _mm512_and_si512(bits[k], abs);
            key[k] = _mm512_add_epi32(
                _mm512_srai_epi32::<21>(_mm512_add_epi32(a, up)),
                _mm512_srai_epi32::<21>(_mm512_sub_epi32(a, near)),
            );
        }
        // Keys to bytes, saturated (below 0.25 to 0 at the latest by the unsigned pack; the
        // key of ∞ is about 1040), then clamped into the table.
        let t = _mm512_packus_epi16(
            _mm512_packs_epi32(key[0], key[1]),
            _mm512_packs_epi32(key[2], key[3]),
        );
        let codes = _mm512_permutexvar_epi8(_mm512_min_epu8(t, _mm512_set1_epi8(63)), table);
        if CHECK && _mm512_test_epi8_mask(codes, marked) != 0 {
            return true;
        }
        // The sign of each product in the same byte order: the signed packs keep it (−0.0's
        // pattern saturates to the most negative value), shifted from bit 7 to bit 3.
        let signs = _mm512_packs_epi16(
            _mm512_packs_epi32(bits[0], bits[1]),
            _mm512_packs_epi32(bits[2], bits[3]),
        );
        // codes | (signs >> 4 & 8): ternary-logic truth table A | (B & C).
        let codes = _mm512_ternarylogic_epi32::<0xF8>(
            codes,
            _mm512_srli_epi16::<4>(signs),
            _mm512_set1_epi8(8),
        );
        let pairs = _mm512_maddubs_epi16(codes, pair);
        let out = _mm512_castsi512_si256(_mm512_permutexvar_epi8(gather, pairs));
        x86::store32(o0.add(32 * u), out, stream);
    }
    false
}
