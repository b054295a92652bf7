//! Hand-written AVX2 runs of the legacy quantizers (Q8_0, Q4_0/Q5_0, Q4_1/Q5_1) and of F16,
//! for CPUs with AVX2 and F16C: the compiled portable code spends its time moving single values
//! between lanes (packing codes, gathering Q5's fifth bits, folding a block's maximum).
//!
//! Each does the portable code's f32 operations in the same order (no fused multiply-add), so
//! the bytes are the same; tests.rs holds every run to the portable one. Eight blocks at a
//! time, as the portable group: their maxima fold into one vector, one lane a block, and the
//! scale arithmetic (two divisions, the float16 conversion) runs once for the eight.
//!
//! Every function is `unsafe` for one reason: the CPU must have AVX2 and F16C (callers check
//! both); pointers are only read and written inside the blocks their callers hand over.

use std::arch::x86_64::*;

use super::block::{prefetch, Block, GROUP, INF_BITS, PREFETCH_AHEAD};
use super::float16::{f16_to_f32, f32_to_f16};
use crate::simd::x86::store8;

/// Values a block of every legacy type.
const BS: usize = 32;

/// The bits of |x| for eight values.
#[inline(always)]
unsafe fn abs_bits(p: *const f32) -> __m256i {
    let v = _mm256_loadu_si256(p as *const __m256i);
    _mm256_and_si256(v, _mm256_set1_epi32(0x7FFF_FFFF))
}

/// Whether a lane of |x| bits is an infinity or NaN.
#[inline(always)]
unsafe fn any_non_finite(m: __m256i) -> bool {
    let big = _mm256_cmpgt_epi32(m, _mm256_set1_epi32(INF_BITS as i32 - 1));
    _mm256_movemask_epi8(big) != 0
}

/// [`super::inverse`] in lanes: 1/d, or 0 for d = ±0.
#[inline(always)]
unsafe fn inverse8(d: __m256) -> __m256 {
    let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(d, _mm256_setzero_ps());
    _mm256_andnot_ps(zero, _mm256_div_ps(_mm256_set1_ps(1.0), d))
}

/// All ones in the lanes whose value is finite.
#[inline(always)]
unsafe fn finite8(v: __m256) -> __m256 {
    let abs = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)));
    _mm256_cmp_ps::<_CMP_LT_OQ>(abs, _mm256_set1_ps(f32::INFINITY))
}

/// float16 bits of eight finite values, rounded to nearest even (numpy's cast, as
/// [`super::f32_to_f16`]; F16C rounds subnormal results too, and takes no MXCSR mode here).
#[inline(always)]
unsafe fn f16x8(v: __m256) -> [u16; GROUP] {
    let mut h = [0u16; GROUP];
    let bits = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    _mm_storeu_si128(h.as_mut_ptr() as *mut __m128i, bits);
    h
}

#[inline(always)]
unsafe fn lanes_f32(v: __m256) -> [f32; GROUP] {
    let mut a = [0f32; GROUP];
    _mm256_storeu_ps(a.as_mut_ptr(), v);
    a
}

#[inline(always)]
unsafe fn lanes_i32(v: __m256i) -> [i32; GROUP] {
    let mut a = [0i32; GROUP];
    _mm256_storeu_si256(a.as_mut_ptr() as *mut __m256i, v);
    a
}

#[inline(always)]
unsafe fn put_u16(o: *mut u8, h: u16) {
    (o as *mut [u8; 2]).write_unaligned(h.to_le_bytes());
}

/// [`super::round_away`] in lanes: trunc(v ± 0.49999997), for finite |v| < 2^23.
#[inline(always)]
unsafe fn round_away8(v: __m256) -> __m256i {
    let sign = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN)));
    let half = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x3EFF_FFFF)));
    _mm256_cvttps_epi32(_mm256_add_ps(v, half))
}

/// 32 i32 codes (each in i8's range) as 32 bytes in order.
#[inline(always)]
unsafe fn pack_bytes(q: [__m256i; 4]) -> __m256i {
    // packs work within 128-bit halves: the bytes come out as 4-byte runs of q0 q1 q2 q3 (low
    // halves) then the same of the high halves; one permute puts the runs in order.
    let ab = _mm256_packs_epi32(q[0], q[1]);
    let cd = _mm256_packs_epi32(q[2], q[3]);
    let bytes = _mm256_packs_epi16(ab, cd);
    _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Codes (0..=31) as the legacy layouts store them: with `Q5`, their fifth bits as a
/// little-endian u32 at `o` (bit i of code i: one `movemask` per eight codes), then the
/// nibbles, code j and j + 16 sharing byte j.
#[inline(always)]
unsafe fn write_codes<const Q5: bool>(q: [__m256i; 4], o: *mut u8) {
    let o = if Q5 {
        let mut qh = 0u32;
        for (k, &c) in q.iter().enumerate() {
            let top = _mm256_castsi256_ps(_mm256_slli_epi32::<27>(c));
            qh |= (_mm256_movemask_ps(top) as u32) << (8 * k);
        }
        (o as *mut [u8; 4]).write_unaligned(qh.to_le_bytes());
        o.add(4)
    } else {
        o
    };
    let bytes = pack_bytes(q);
    let low = _mm_set1_epi8(0x0F);
    let first = _mm_and_si128(_mm256_castsi256_si128(bytes), low);
    let second = _mm_and_si128(_mm256_extracti128_si256::<1>(bytes), low);
    let both = _mm_or_si128(first, _mm_slli_epi16::<4>(second));
    _mm_storeu_si128(o as *mut __m128i, both);
}

/// The runs: whole groups by `$group`, the blocks after them by the portable `encode`
/// (compiled here for AVX2).
macro_rules! run {
    ($(#[$meta:meta])* $name:ident, $group:expr) => {
        $(#[$meta])*
        #[target_feature(enable = "avx2,f16c")]
        pub(super) unsafe fn $name<B: Block>(xs: &[f32], out: &mut [u8]) -> bool {
            let mut bad = false;
            let (gx, gt) = (GROUP * B::BS, GROUP * B::TS);
            let groups = xs.len() / gx;
            for (x, o) in xs.chunks_exact(gx).zip(out.chunks_exact_mut(gt)) {
                prefetch(x.as_ptr().wrapping_add(PREFETCH_AHEAD), gx);
                bad |= $group(x.as_ptr(), o.as_mut_ptr());
            }
            let (x_rest, o_rest) = (&xs[groups * gx..], &mut out[groups * gt..]);
            for (x, o) in x_rest.chunks_exact(B::BS).zip(o_rest.chunks_exact_mut(B::TS)) {
                bad |= B::encode(x, o);
            }
            bad
        }
    };
}

run!(
    /// Q8_0: d = amax/127, codes round_away(x · (1/d)); a 1/d that overflows is taken as 0,
    /// which makes every code 0 as the portable code's fill does.
    q8_0_run,
    q8_0_group
);
run!(q4_0_run, signed_group::<false>);
run!(q5_0_run, signed_group::<true>);
run!(q4_1_run, min_group::<false>);
run!(q5_1_run, min_group::<true>);

#[inline(always)]
unsafe fn q8_0_group(x: *const f32, out: *mut u8) -> bool {
    let m = crate::simd::x86::max_abs_bits_8runs::<{ BS / 8 }>(x);
    if any_non_finite(m) {
        return true;
    }
    let d = _mm256_div_ps(_mm256_castsi256_ps(m), _mm256_set1_ps(127.0));
    let id = _mm256_div_ps(_mm256_set1_ps(1.0), d);
    // d >= 0: 1/0 = inf, so "finite" also covers inverse's d = 0.
    let id = lanes_f32(_mm256_and_ps(id, finite8(id)));
    let dh = f16x8(d);
    for g in 0..GROUP {
        let (xb, o) = (x.add(g * BS), out.add(g * 34));
        put_u16(o, dh[g]);
        let s = _mm256_set1_ps(id[g]);
        let mut q = [_mm256_setzero_si256(); 4];
        for (k, qk) in q.iter_mut().enumerate() {
            *qk = round_away8(_mm256_mul_ps(_mm256_loadu_ps(xb.add(8 * k)), s));
        }
        _mm256_storeu_si256(o.add(2) as *mut __m256i, pack_bytes(q));
    }
    false
}

/// `legacy.rs`'s `signed_max`: the first value of magnitude bits `m`, +0 for an all-zero
/// block (ggml's d = −0 there).
#[inline(always)]
unsafe fn signed_max(x: *const f32, m: u32) -> f32 {
    if m == 0 {
        return 0.0;
    }
    let (pv, nv) = (
        _mm256_set1_epi32(m as i32),
        _mm256_set1_epi32((m | 0x8000_0000) as i32),
    );
    let (mut pos, mut neg) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for k in 0..4 {
        let b = _mm256_loadu_si256(x.add(8 * k) as *const __m256i);
        pos = _mm256_or_si256(pos, _mm256_cmpeq_epi32(b, pv));
        neg = _mm256_or_si256(neg, _mm256_cmpeq_epi32(b, nv));
    }
    let (p, n) = (
        _mm256_testz_si256(pos, pos) == 0,
        _mm256_testz_si256(neg, neg) == 0,
    );
    if p && n {
        let block = std::slice::from_raw_parts(x, BS);
        let first = block.iter().position(|v| v.to_bits() & 0x7FFF_FFFF == m);
        return block[first.unwrap_or(0)];
    }
    f32::from_bits(m | (!p as u32) << 31)
}

/// Q4_0 / Q5_0: d = max / −8 or −16, codes min(trunc(x · (1/d) + 8.5 or 16.5), top), all 0
/// where 1/d overflowed.
#[inline(always)]
unsafe fn signed_group<const Q5: bool>(x: *const f32, out: *mut u8) -> bool {
    let (ts, neg_half, top) = if Q5 {
        (22, -16.0f32, 31)
    } else {
        (18, -8.0, 15)
    };
    let m = crate::simd::x86::max_abs_bits_8runs::<{ BS / 8 }>(x);
    if any_non_finite(m) {
        return true;
    }
    let m = lanes_i32(m);
    let mut v = [0f32; GROUP];
    for (g, vg) in v.iter_mut().enumerate() {
        *vg = signed_max(x.add(g * BS), m[g] as u32);
    }
    let d = _mm256_div_ps(_mm256_loadu_ps(v.as_ptr()), _mm256_set1_ps(neg_half));
    let id = inverse8(d);
    let keep = lanes_i32(_mm256_castps_si256(finite8(id)));
    let (dh, id) = (f16x8(d), lanes_f32(id));
    let offset = _mm256_set1_ps(-neg_half + 0.5);
    for g in 0..GROUP {
        let (xb, o) = (x.add(g * BS), out.add(g * ts));
        let (s, k) = (_mm256_set1_ps(id[g]), _mm256_set1_epi32(keep[g]));
        let mut q = [_mm256_setzero_si256(); 4];
        for (j, qj) in q.iter_mut().enumerate() {
            let t = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(xb.add(8 * j)), s), offset);
            let c = _mm256_min_epi32(_mm256_cvttps_epi32(t), _mm256_set1_epi32(top));
            *qj = _mm256_and_si256(c, k);
        }
        put_u16(o, dh[g]);
        write_codes::<Q5>(q, o.add(2));
    }
    false
}

/// numpy's AVX2 `np.min` (`MIN` = true) or `np.max` of a block, in the order
/// [`super::legacy::np_reduce32`] spells out (only the sign of a zero result depends on it).
#[inline(always)]
unsafe fn np_reduce<const MIN: bool>(p: *const f32) -> f32 {
    #[inline(always)]
    unsafe fn pick<const MIN: bool>(a: __m256, b: __m256) -> __m256 {
        if MIN {
            _mm256_min_ps(a, b)
        } else {
            _mm256_max_ps(a, b)
        }
    }
    #[inline(always)]
    unsafe fn pick4<const MIN: bool>(a: __m128, b: __m128) -> __m128 {
        if MIN {
            _mm_min_ps(a, b)
        } else {
            _mm_max_ps(a, b)
        }
    }
    #[inline(always)]
    unsafe fn pick1<const MIN: bool>(a: __m128, b: __m128) -> __m128 {
        if MIN {
            _mm_min_ss(a, b)
        } else {
            _mm_max_ss(a, b)
        }
    }
    let mut acc = _mm256_set1_ps(*p);
    for k in 0..3 {
        acc = pick::<MIN>(acc, _mm256_loadu_ps(p.add(1 + 8 * k)));
    }
    let h = pick4::<MIN>(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let h = pick4::<MIN>(h, _mm_movehl_ps(h, h));
    let mut r = pick1::<MIN>(h, _mm_shuffle_ps::<1>(h, h));
    for i in 25..BS {
        r = pick1::<MIN>(r, _mm_load_ss(p.add(i)));
    }
    _mm_cvtss_f32(r)
}

/// Q4_1 / Q5_1: d = (max − min)/15 or /31, codes min(trunc((x − min) · (1/d) + 0.5), top),
/// all 0 where d or 1/d is not finite.
#[inline(always)]
unsafe fn min_group<const Q5: bool>(x: *const f32, out: *mut u8) -> bool {
    let (ts, steps, top) = if Q5 {
        (24, 31.0f32, 31)
    } else {
        (20, 15.0, 15)
    };
    let m = crate::simd::x86::max_abs_bits_8runs::<{ BS / 8 }>(x);
    if any_non_finite(m) {
        return true;
    }
    let (mut mn, mut mx) = ([0f32; GROUP], [0f32; GROUP]);
    for g in 0..GROUP {
        mn[g] = np_reduce::<true>(x.add(g * BS));
        mx[g] = np_reduce::<false>(x.add(g * BS));
    }
    let mnv = _mm256_loadu_ps(mn.as_ptr());
    let range = _mm256_sub_ps(_mm256_loadu_ps(mx.as_ptr()), mnv);
    let d = _mm256_div_ps(range, _mm256_set1_ps(steps));
    let id = inverse8(d);
    let keep = lanes_i32(_mm256_castps_si256(_mm256_and_ps(finite8(d), finite8(id))));
    let (dh, mh, id) = (f16x8(d), f16x8(mnv), lanes_f32(id));
    for g in 0..GROUP {
        let (xb, o) = (x.add(g * BS), out.add(g * ts));
        let (s, k, base) = (
            _mm256_set1_ps(id[g]),
            _mm256_set1_epi32(keep[g]),
            _mm256_set1_ps(mn[g]),
        );
        let mut q = [_mm256_setzero_si256(); 4];
        for (j, qj) in q.iter_mut().enumerate() {
            let t = _mm256_sub_ps(_mm256_loadu_ps(xb.add(8 * j)), base);
            let t = _mm256_add_ps(_mm256_mul_ps(t, s), _mm256_set1_ps(0.5));
            let c = _mm256_min_epi32(_mm256_cvttps_epi32(t), _mm256_set1_epi32(top));
            *qj = _mm256_and_si256(c, k);
        }
        put_u16(o, dh[g]);
        put_u16(o.add(2), mh[g]);
        write_codes::<Q5>(q, o.add(4));
    }
    false
}

/// F16 (numpy's cast to float16): eight values an F16C conversion; a NaN or infinity
/// reported, as by the portable code.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_run(xs: &[f32], out: &mut [u8]) -> bool {
    let mut m = _mm256_setzero_si256();
    let full = xs.len() / 8 * 8;
    for (i, (x, o)) in xs.chunks_exact(8).zip(out.chunks_exact_mut(16)).enumerate() {
        if i % 8 == 0 {
            prefetch(x.as_ptr().wrapping_add(PREFETCH_AHEAD), 64);
        }
        m = _mm256_max_epi32(m, abs_bits(x.as_ptr()));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.as_ptr()));
        _mm_storeu_si128(o.as_mut_ptr() as *mut __m128i, h);
    }
    let mut bad = any_non_finite(m);
    for (&v, o) in xs[full..].iter().zip(out[full * 2..].chunks_exact_mut(2)) {
        o.copy_from_slice(&f32_to_f16(v).to_le_bytes());
        bad |= !v.is_finite();
    }
    bad
}

// ---------------------------------------------------------------------------------------------
// Dequantization: codes widened to i32 lanes, converted, scaled. The scale is converted by the
// portable `f16_to_f32` (F16C would quiet a signalling NaN, and numpy's cast does not).

/// The dequantizing runs: each block by `$block`, which returns false for a block it leaves
/// to the portable `decode` (compiled here for AVX2). With `stream` (a large output: see
/// `simd::x86::STREAM_MIN_BYTES`) and `out` 16-byte aligned, the stores skip the cache: every
/// block's 32 values then start 16-byte aligned too.
macro_rules! decode_run {
    ($name:ident, $block:ident $(, $q5:expr)?) => {
        #[target_feature(enable = "avx2,f16c")]
        pub(super) unsafe fn $name<B: Block>(blocks: &[u8], out: &mut [f32], stream: bool) {
            #[inline(always)]
            unsafe fn each<B: Block, const STREAM: bool>(blocks: &[u8], out: &mut [f32]) {
                for (b, o) in blocks.chunks_exact(B::TS).zip(out.chunks_exact_mut(B::BS)) {
                    if !$block::<$($q5,)? STREAM>(b.as_ptr(), o.as_mut_ptr()) {
                        B::decode(b, o);
                    }
                }
            }
            if stream && (out.as_ptr() as usize) % 16 == 0 {
                each::<B, true>(blocks, out);
                // The non-temporal stores are weakly ordered: done before the task says so.
                _mm_sfence();
            } else {
                each::<B, false>(blocks, out);
            }
        }
    };
}

decode_run!(q8_0_decode, q8_0_block);
decode_run!(q4_0_decode, signed_block, false);
decode_run!(q5_0_decode, signed_block, true);
decode_run!(q4_1_decode, min_block, false);
decode_run!(q5_1_decode, min_block, true);

#[inline(always)]
unsafe fn scale_at(b: *const u8) -> f32 {
    f16_to_f32(u16::from_le_bytes(*(b as *const [u8; 2])))
}

#[inline(always)]
unsafe fn q8_0_block<const STREAM: bool>(b: *const u8, o: *mut f32) -> bool {
    let d = _mm256_set1_ps(scale_at(b));
    for k in 0..4 {
        let q = _mm_loadl_epi64(b.add(2 + 8 * k) as *const __m128i);
        let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        store8::<STREAM>(o.add(8 * k), _mm256_mul_ps(v, d));
    }
    true
}

/// A block's 32 codes from its nibbles at `b` (and with `Q5` its fifth bits, the
/// little-endian u32 before them), eight a vector.
#[inline(always)]
unsafe fn codes<const Q5: bool>(b: *const u8) -> [__m256i; 4] {
    let (qh, nib) = if Q5 {
        (u32::from_le_bytes(*(b as *const [u8; 4])), b.add(4))
    } else {
        (0, b)
    };
    let bytes = _mm_loadu_si128(nib as *const __m128i);
    let low = _mm_set1_epi8(0x0F);
    let first = _mm_and_si128(bytes, low);
    let second = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low);
    let mut q = [
        _mm256_cvtepu8_epi32(first),
        _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(first)),
        _mm256_cvtepu8_epi32(second),
        _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(second)),
    ];
    if Q5 {
        let qh = _mm256_set1_epi32(qh as i32);
        for (k, c) in q.iter_mut().enumerate() {
            let at = 8 * k as i32;
            let shift =
                _mm256_setr_epi32(at, at + 1, at + 2, at + 3, at + 4, at + 5, at + 6, at + 7);
            let bit = _mm256_and_si256(_mm256_srlv_epi32(qh, shift), _mm256_set1_epi32(1));
            *c = _mm256_or_si256(*c, _mm256_slli_epi32::<4>(bit));
        }
    }
    q
}

/// Q4_0 / Q5_0: d · (q − 8 or 16).
#[inline(always)]
unsafe fn signed_block<const Q5: bool, const STREAM: bool>(b: *const u8, o: *mut f32) -> bool {
    let d = _mm256_set1_ps(scale_at(b));
    let offset = _mm256_set1_epi32(if Q5 { 16 } else { 8 });
    for (k, c) in codes::<Q5>(b.add(2)).into_iter().enumerate() {
        let v = _mm256_cvtepi32_ps(_mm256_sub_epi32(c, offset));
        store8::<STREAM>(o.add(8 * k), _mm256_mul_ps(d, v));
    }
    true
}

/// Q4_1 / Q5_1: d · q + m; a block whose d or m is NaN left to the portable code, which picks
/// the NaN numpy returns.
#[inline(always)]
unsafe fn min_block<const Q5: bool, const STREAM: bool>(b: *const u8, o: *mut f32) -> bool {
    let (d, m) = (scale_at(b), scale_at(b.add(2)));
    if d.is_nan() || m.is_nan() {
        return false;
    }
    let (d, m) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
    for (k, c) in codes::<Q5>(b.add(4)).into_iter().enumerate() {
        let v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(c));
        store8::<STREAM>(o.add(8 * k), _mm256_add_ps(v, m));
    }
    true
}

/// F16 and BF16 values to f32, eight a step (stored non-temporally with `stream` into a
/// 16-byte aligned `out`). BF16 is its bits shifted up. F16 goes through F16C, except eight
/// values with a NaN among them: F16C would quiet a signalling NaN, which numpy's cast keeps,
/// so those take the portable conversion.
macro_rules! half_decode {
    ($name:ident, $bf16:expr) => {
        #[target_feature(enable = "avx2,f16c")]
        pub(super) unsafe fn $name<B: Block>(blocks: &[u8], out: &mut [f32], stream: bool) {
            if stream && (out.as_ptr() as usize) % 16 == 0 {
                half_run::<B, $bf16, true>(blocks, out);
                // The non-temporal stores are weakly ordered: done before the task says so.
                _mm_sfence();
            } else {
                half_run::<B, $bf16, false>(blocks, out);
            }
        }
    };
}

half_decode!(f16_decode, false);
half_decode!(bf16_decode, true);

/// Values of `B` (F16 or BF16, as `BF16` says) eight a step; NaN groups and the tail by
/// `B::decode`, one value at a time.
#[inline(always)]
unsafe fn half_run<B: Block, const BF16: bool, const STREAM: bool>(blocks: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert_eq!(blocks.len(), 2 * n, "two bytes a value");
    let full = n / 8 * 8;
    let (src, dst) = (blocks.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i < full {
        // In bounds: values i..i + 8 lie within out, their 16 bytes within blocks.
        let h = _mm_loadu_si128(src.add(2 * i) as *const __m128i);
        let v = if BF16 {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        } else {
            let mag = _mm_and_si128(h, _mm_set1_epi16(0x7FFF));
            if _mm_movemask_epi8(_mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7C00))) != 0 {
                // Through `dst` (not a new borrow of `out`, which the stores still use).
                let group = std::slice::from_raw_parts_mut(dst.add(i), 8);
                for (j, o) in (i..i + 8).zip(group.chunks_exact_mut(1)) {
                    B::decode(&blocks[2 * j..2 * j + 2], o);
                }
                i += 8;
                continue;
            }
            _mm256_cvtph_ps(h)
        };
        store8::<STREAM>(dst.add(i), v);
        i += 8;
    }
    for j in full..n {
        B::decode(&blocks[2 * j..2 * j + 2], &mut out[j..j + 1]);
    }
}

/// F16C's conversion of eight values, for the tests' sweep against [`super::f32_to_f16`].
#[cfg(test)]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_lanes(v: &[f32; GROUP]) -> [u16; GROUP] {
    f16x8(_mm256_loadu_ps(v.as_ptr()))
}
