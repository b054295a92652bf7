//! ggml's original block types: Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1, 32 values a block with an
//! f16 scale (and an f16 minimum for the _1 types).

use super::block::{
    abs_max_bits, inverse, pack_nibbles, round_away, trunc_small, Block, Codes, GROUP, INF_BITS,
};
use super::float16::{f16_bits, f16_value, f32_to_f16};
use super::search::{affine, affine_code, f16_sat, nearest_codes, symmetric, Uniform, STEPS};

#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q8_0;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q4_0;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q4_1;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q5_0;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q5_1;

/// `np.min` / `np.max` of a 32-value block as numpy 2 computes them with AVX2: the first value
/// seeds eight lanes, values 1..=24 fold into them, the lanes fold pairwise (4 apart, 2, 1),
/// and values 25..=31 fold in one at a time; every fold is `minps`/`maxps`, which keeps the
/// second operand on equality. Only the sign of a zero result depends on this order.
#[inline(always)]
pub(super) fn np_reduce32(x: &[f32], pick: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [x[0]; 8];
    for v in 0..3 {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = pick(*a, x[1 + 8 * v + l]);
        }
    }
    let h: [f32; 4] = std::array::from_fn(|k| pick(acc[k], acc[k + 4]));
    let mut r = pick(pick(h[0], h[2]), pick(h[1], h[3]));
    for &v in &x[25..32] {
        r = pick(r, v);
    }
    r
}

#[inline(always)]
pub(super) fn min_ps(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

#[inline(always)]
pub(super) fn max_ps(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// d·q + m, values of a block with a minimum. numpy computes `(d * q) + m` and x86 returns the
/// first operand's NaN when both are NaN; LLVM may swap an add's operands, so a block whose d
/// or m is NaN picks the NaN explicitly.
#[inline(always)]
fn scale_and_shift(d: f32, m: f32, q: &Codes, out: &mut [f32]) {
    if d.is_nan() || m.is_nan() {
        for (o, &c) in out.iter_mut().zip(q) {
            let t = d * c as f32; // NaN (quieted) when d is; inf × 0 is the default NaN
            *o = if t.is_nan() {
                t
            } else if m.is_nan() {
                f32::from_bits(m.to_bits() | 0x0040_0000)
            } else {
                t + m
            };
        }
    } else {
        for (o, &c) in out.iter_mut().zip(q) {
            *o = d * c as f32 + m;
        }
    }
}

/// Bit i of the little-endian u32 is bit 4 of code i (Q5's fifth bits).
#[inline(always)]
fn pack_high_bits(q: &Codes) -> [u8; 4] {
    // Each code's bit 4 as a byte (a vector narrowing), then eight bytes a u64: one multiply
    // gathers byte k's bit into bit 56 + k (the partial products land on distinct bits, so
    // nothing carries). Left to itself, LLVM extracts and shifts the 32 bits one at a time.
    let mut hb = [0u8; 32];
    for (h, &c) in hb.iter_mut().zip(q) {
        *h = ((c >> 4) & 1) as u8;
    }
    // Through memory, so the words are loads rather than bytes reassembled one at a time.
    let hb = std::hint::black_box(hb);
    let mut qh = [0u8; 4];
    for (h, w) in qh.iter_mut().zip(hb.chunks_exact(8)) {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        *h = (w.wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8;
    }
    qh
}

/// d = amax/127 (f32), q = round-half-away(x × (1/d)); stored as f16(d), then 32 int8 codes.
impl Block for Q8_0 {
    const BS: usize = 32;
    const TS: usize = 34;
    #[cfg(target_arch = "x86_64")]
    const ENCODE_AVX2: Option<super::block::EncodeRun> = Some(super::legacy_avx2::q8_0_run::<Self>);
    #[cfg(target_arch = "x86_64")]
    const DECODE_AVX2: Option<super::block::DecodeRun> =
        Some(super::legacy_avx2::q8_0_decode::<Self>);
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        let m = abs_max_bits(x);
        if m >= INF_BITS {
            return true;
        }
        let d = f32::from_bits(m) / 127.0;
        q8_0_values(x, d, inverse(d), out);
        false
    }
    #[inline(always)]
    fn encode_group(x: &[f32], out: &mut [u8]) -> bool {
        // Scales first, a group of blocks a vector: the two divisions and the f16 conversion
        // of one block would otherwise be a chain of ~40 cycles that the next block waits on.
        let mut m = [0u32; GROUP];
        // An opaque trip count keeps LLVM from vectorizing the maxima across blocks (one lane
        // a block, every value gathered with a scalar insert).
        for g in 0..std::hint::black_box(GROUP) {
            m[g] = abs_max_bits(&x[g * 32..g * 32 + 32]);
        }
        if m.iter().fold(0, |a, &b| a.max(b)) >= INF_BITS {
            return true;
        }
        let mut d = [0f32; GROUP];
        let mut id = [0f32; GROUP];
        let mut dh = [0u16; GROUP];
        for g in 0..GROUP {
            d[g] = f32::from_bits(m[g]) / 127.0;
            id[g] = inverse(d[g]);
            dh[g] = f32_to_f16(d[g]);
        }
        for (g, (x, o)) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)).enumerate() {
            o[..2].copy_from_slice(&dh[g].to_le_bytes());
            q8_0_codes(x, id[g], &mut o[2..34]);
        }
        false
    }
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_value(b);
        for (o, &q) in out.iter_mut().zip(&b[2..34]) {
            *o = (q as i8 as f32) * d;
        }
    }
}

/// One Q8_0 block from its d and 1/d.
#[inline(always)]
fn q8_0_values(x: &[f32], d: f32, id: f32, out: &mut [u8]) {
    out[..2].copy_from_slice(&f16_bits(d));
    q8_0_codes(x, id, &mut out[2..34]);
}

#[inline(always)]
fn q8_0_codes(x: &[f32], id: f32, qs: &mut [u8]) {
    if id.is_finite() {
        // |x| <= amax and id ≈ 127/amax, so |x × id| <= 127 (and a little): round_away's range.
        // The clamp changes nothing (|q| <= 127); it lets LLVM pack with saturating packs.
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = round_away(v * id).clamp(-128, 127) as i8 as u8;
        }
    } else {
        // 1/d overflowed (amax < 127 × 2^-128): every x × id is ±inf or NaN, which numpy
        // casts to 0.
        qs.fill(0);
    }
}

/// The value of largest magnitude (the first, if several) maps to −2^(bits−1): d = max / −8
/// (Q4_0) or / −16 (Q5_0), q = trunc(x × (1/d) + 8.5 or 16.5), clipped to the top code.
/// Done in three steps, so that a group of blocks can take the middle one (two divisions, a
/// long dependency chain) in vector lanes: [`signed_max`], then d and 1/d, then
/// [`signed_codes`].
#[inline(always)]
fn encode_signed_scale(x: &[f32], neg_half: f32, top: i32, q: &mut Codes) -> Option<f32> {
    let m = abs_max_bits(x);
    if m >= INF_BITS {
        return None;
    }
    let d = signed_max(x, m) / neg_half;
    signed_codes(x, inverse(d), -neg_half + 0.5, top, q);
    Some(d)
}

/// The first value whose magnitude has the bits `m` (numpy's argmax keeps the first). When
/// every such value has the same sign (nearly always) it is ±m, found with two lane-wise
/// compares; only a block holding both +m and −m is searched in order. An all-zero block's is
/// +0 whatever its zeros' signs: ggml's `quantize_row_q4_0_ref` starts its maximum at +0.0f and
/// replaces it only on a larger magnitude, so d = −0 (gguf-py's argmax would take a first −0).
#[inline(always)]
fn signed_max(x: &[f32], m: u32) -> f32 {
    if m == 0 {
        return 0.0;
    }
    let (mut pos, mut neg) = ([0u32; 8], [0u32; 8]);
    for c in x.chunks_exact(8) {
        for l in 0..8 {
            let b = c[l].to_bits();
            pos[l] |= (b == m) as u32;
            neg[l] |= (b == m | 0x8000_0000) as u32;
        }
    }
    let (p, n) = (
        pos.into_iter().fold(0, |a, b| a | b),
        neg.into_iter().fold(0, |a, b| a | b),
    );
    if p != 0 && n != 0 {
        let first = x.iter().position(|v| v.to_bits() & 0x7FFF_FFFF == m);
        return x[first.unwrap_or(0)];
    }
    // The sign without a branch: which of the two it is, is a coin toss on random data.
    f32::from_bits(m | ((p == 0) as u32) << 31)
}

#[inline(always)]
fn signed_codes(x: &[f32], id: f32, offset: f32, top: i32, q: &mut Codes) {
    if id.is_finite() {
        // |x| <= |max| and id ≈ −offset/max, so x × id + offset lies in [0, 2·offset] (and a
        // little): finite and small, and trunc_small truncates as numpy's trunc does.
        for (c, &v) in q.iter_mut().zip(x) {
            *c = trunc_small(v * id + offset).min(top);
        }
    } else {
        // 1/d overflowed: ±inf or NaN everywhere, which numpy casts to 0.
        q.fill(0);
    }
}

/// A group of [`encode_signed_scale`] blocks, the scales in vector lanes; `Q5` picks the layout.
/// (A layout passed as a function or closure is called out of line, where it is not compiled
/// for AVX2.)
#[inline(always)]
fn encode_group_signed<const Q5: bool>(x: &[f32], out: &mut [u8]) -> bool {
    let (ts, neg_half, top) = if Q5 {
        (22, -16.0, 31)
    } else {
        (18, -8.0f32, 15)
    };
    let mut m = [0u32; GROUP];
    let mut v = [0f32; GROUP];
    // Opaque trip counts: unrolled, LLVM vectorizes across blocks, gathering every value.
    for g in 0..std::hint::black_box(GROUP) {
        let xb = &x[g * 32..g * 32 + 32];
        m[g] = abs_max_bits(xb);
        v[g] = signed_max(xb, m[g]);
    }
    if m.iter().fold(0, |a, &b| a.max(b)) >= INF_BITS {
        return true;
    }
    let mut d = [0f32; GROUP];
    let mut id = [0f32; GROUP];
    for g in 0..GROUP {
        d[g] = v[g] / neg_half;
        id[g] = inverse(d[g]);
    }
    for g in 0..std::hint::black_box(GROUP) {
        let mut q = [0i32; 32];
        signed_codes(&x[g * 32..g * 32 + 32], id[g], -neg_half + 0.5, top, &mut q);
        let o = &mut out[g * ts..(g + 1) * ts];
        if Q5 {
            write_q5_0(d[g], &q, o);
        } else {
            write_q4_0(d[g], &q, o);
        }
    }
    false
}

/// The block's min m and range: d = (max − m)/15 or /31, q = trunc((x − m) × (1/d) + 0.5).
#[inline(always)]
fn encode_with_min(x: &[f32], steps: f32, top: i32, q: &mut Codes) -> Option<(f32, f32)> {
    let m = abs_max_bits(x);
    if m >= INF_BITS {
        return None;
    }
    let mn = np_reduce32(x, min_ps);
    let d = (np_reduce32(x, max_ps) - mn) / steps;
    min_codes(x, mn, d, inverse(d), top, q);
    Some((d, mn))
}

#[inline(always)]
fn min_codes(x: &[f32], mn: f32, d: f32, id: f32, top: i32, q: &mut Codes) {
    if d.is_finite() && id.is_finite() {
        // 0 <= x − mn <= mx − mn (finite), so the sum lies in [0.5, steps + 0.5] and a little.
        for (c, &v) in q.iter_mut().zip(x) {
            *c = trunc_small((v - mn) * id + 0.5).min(top);
        }
    } else {
        // d = inf (the range overflowed; id = 0 but (x − mn) may be inf) or 1/d overflowed:
        // each value is 0.5, NaN or inf before the cast, all of which numpy truncates to 0.
        q.fill(0);
    }
}

/// A group of [`encode_with_min`] blocks, the scales in vector lanes; `Q5` picks the layout.
#[inline(always)]
fn encode_group_min<const Q5: bool>(x: &[f32], out: &mut [u8]) -> bool {
    let (ts, steps, top) = if Q5 {
        (24, 31.0, 31)
    } else {
        (20, 15.0f32, 15)
    };
    let mut m = [0u32; GROUP];
    let mut mn = [0f32; GROUP];
    let mut mx = [0f32; GROUP];
    for g in 0..std::hint::black_box(GROUP) {
        let xb = &x[g * 32..g * 32 + 32];
        m[g] = abs_max_bits(xb);
        mn[g] = np_reduce32(xb, min_ps);
        mx[g] = np_reduce32(xb, max_ps);
    }
    if m.iter().fold(0, |a, &b| a.max(b)) >= INF_BITS {
        return true;
    }
    let mut d = [0f32; GROUP];
    let mut id = [0f32; GROUP];
    for g in 0..GROUP {
        d[g] = (mx[g] - mn[g]) / steps;
        id[g] = inverse(d[g]);
    }
    for g in 0..std::hint::black_box(GROUP) {
        let mut q = [0i32; 32];
        min_codes(&x[g * 32..g * 32 + 32], mn[g], d[g], id[g], top, &mut q);
        let o = &mut out[g * ts..(g + 1) * ts];
        if Q5 {
            write_q5_1(d[g], mn[g], &q, o);
        } else {
            write_q4_1(d[g], mn[g], &q, o);
        }
    }
    false
}

/// Q5 codes from the fifth bits and the nibbles: one pass a kind, in i32 lanes (the bit of
/// code j is a per-lane variable shift), so both vectorize.
#[inline(always)]
fn q5_codes(qh: u32, nibbles: &[u8]) -> Codes {
    let mut q = [0i32; 32];
    for (j, &byte) in nibbles.iter().enumerate() {
        q[j] = (byte & 0x0F) as i32;
        q[j + 16] = (byte >> 4) as i32;
    }
    for (j, c) in q.iter_mut().enumerate() {
        *c |= (((qh >> j) & 1) << 4) as i32;
    }
    q
}

/// The block layouts: scales (f16), then Q5's fifth bits, then the nibbles.
#[inline(always)]
fn write_q4_0(d: f32, q: &Codes, out: &mut [u8]) {
    out[..2].copy_from_slice(&f16_bits(d));
    pack_nibbles(q, &mut out[2..18]);
}

#[inline(always)]
fn write_q4_1(d: f32, mn: f32, q: &Codes, out: &mut [u8]) {
    out[..2].copy_from_slice(&f16_bits(d));
    out[2..4].copy_from_slice(&f16_bits(mn));
    pack_nibbles(q, &mut out[4..20]);
}

#[inline(always)]
fn write_q5_0(d: f32, q: &Codes, out: &mut [u8]) {
    out[..2].copy_from_slice(&f16_bits(d));
    out[2..6].copy_from_slice(&pack_high_bits(q));
    pack_nibbles(q, &mut out[6..22]);
}

#[inline(always)]
fn write_q5_1(d: f32, mn: f32, q: &Codes, out: &mut [u8]) {
    out[..2].copy_from_slice(&f16_bits(d));
    out[2..4].copy_from_slice(&f16_bits(mn));
    out[4..8].copy_from_slice(&pack_high_bits(q));
    pack_nibbles(q, &mut out[8..24]);
}

impl Block for Q4_0 {
    const BS: usize = 32;
    const TS: usize = 18;
    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_signed_weighted::<false>(x, w, out)
    }
    #[cfg(target_arch = "x86_64")]
    const ENCODE_AVX2: Option<super::block::EncodeRun> = Some(super::legacy_avx2::q4_0_run::<Self>);
    #[cfg(target_arch = "x86_64")]
    const DECODE_AVX2: Option<super::block::DecodeRun> =
        Some(super::legacy_avx2::q4_0_decode::<Self>);
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        let mut q = [0i32; 32];
        let Some(d) = encode_signed_scale(x, -8.0, 15, &mut q) else {
            return true;
        };
        write_q4_0(d, &q, out);
        false
    }
    #[inline(always)]
    fn encode_group(x: &[f32], out: &mut [u8]) -> bool {
        encode_group_signed::<false>(x, out)
    }
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let mut q = [0i32; 32];
        for (j, &byte) in b[2..18].iter().enumerate() {
            q[j] = (byte & 0x0F) as i32;
            q[j + 16] = (byte >> 4) as i32;
        }
        let d = f16_value(b);
        for (o, &c) in out.iter_mut().zip(&q) {
            *o = d * (c - 8) as f32;
        }
    }
}

impl Block for Q4_1 {
    const BS: usize = 32;
    const TS: usize = 20;
    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_min_weighted::<false>(x, w, out)
    }
    #[cfg(target_arch = "x86_64")]
    const ENCODE_AVX2: Option<super::block::EncodeRun> = Some(super::legacy_avx2::q4_1_run::<Self>);
    #[cfg(target_arch = "x86_64")]
    const DECODE_AVX2: Option<super::block::DecodeRun> =
        Some(super::legacy_avx2::q4_1_decode::<Self>);
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        let mut q = [0i32; 32];
        let Some((d, mn)) = encode_with_min(x, 15.0, 15, &mut q) else {
            return true;
        };
        write_q4_1(d, mn, &q, out);
        false
    }
    #[inline(always)]
    fn encode_group(x: &[f32], out: &mut [u8]) -> bool {
        encode_group_min::<false>(x, out)
    }
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let mut q = [0i32; 32];
        for (j, &byte) in b[4..20].iter().enumerate() {
            q[j] = (byte & 0x0F) as i32;
            q[j + 16] = (byte >> 4) as i32;
        }
        scale_and_shift(f16_value(b), f16_value(&b[2..]), &q, out);
    }
}

impl Block for Q5_0 {
    const BS: usize = 32;
    const TS: usize = 22;
    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_signed_weighted::<true>(x, w, out)
    }
    #[cfg(target_arch = "x86_64")]
    const ENCODE_AVX2: Option<super::block::EncodeRun> = Some(super::legacy_avx2::q5_0_run::<Self>);
    #[cfg(target_arch = "x86_64")]
    const DECODE_AVX2: Option<super::block::DecodeRun> =
        Some(super::legacy_avx2::q5_0_decode::<Self>);
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        let mut q = [0i32; 32];
        let Some(d) = encode_signed_scale(x, -16.0, 31, &mut q) else {
            return true;
        };
        write_q5_0(d, &q, out);
        false
    }
    #[inline(always)]
    fn encode_group(x: &[f32], out: &mut [u8]) -> bool {
        encode_group_signed::<true>(x, out)
    }
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let q = q5_codes(u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &b[6..22]);
        let d = f16_value(b);
        for (o, &c) in out.iter_mut().zip(&q) {
            *o = d * (c - 16) as f32;
        }
    }
}

impl Block for Q5_1 {
    const BS: usize = 32;
    const TS: usize = 24;
    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_min_weighted::<true>(x, w, out)
    }
    #[cfg(target_arch = "x86_64")]
    const ENCODE_AVX2: Option<super::block::EncodeRun> = Some(super::legacy_avx2::q5_1_run::<Self>);
    #[cfg(target_arch = "x86_64")]
    const DECODE_AVX2: Option<super::block::DecodeRun> =
        Some(super::legacy_avx2::q5_1_decode::<Self>);
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        let mut q = [0i32; 32];
        let Some((d, mn)) = encode_with_min(x, 31.0, 31, &mut q) else {
            return true;
        };
        write_q5_1(d, mn, &q, out);
        false
    }
    #[inline(always)]
    fn encode_group(x: &[f32], out: &mut [u8]) -> bool {
        encode_group_min::<true>(x, out)
    }
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let q = q5_codes(u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24]);
        scale_and_shift(f16_value(b), f16_value(&b[2..]), &q, out);
    }
}

// ---------------------------------------------------------------------------------------------
// With importance weights (llama.cpp's imatrix), the rules above give way to searches of the
// weighted error, as ggml's own quantizers do when given one; the layouts are the same.

/// Q4_0 / Q5_0 (`Q5`): the searched signed scale, stored as f16, and each value's nearest code
/// at the scale as decoded.
fn encode_signed_weighted<const Q5: bool>(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
    if abs_max_bits(x) >= INF_BITS {
        return true;
    }
    let half = if Q5 { 16 } else { 8 };
    let grid = Uniform {
        lo: -half,
        hi: half - 1,
    };
    // An f16 value, so the layout's f16 conversion stores it as it is.
    let (_, d) = f16_sat(symmetric(x, w, &grid, STEPS));
    let mut q = [0i32; 32];
    nearest_codes(x, d, &grid, &mut q);
    for c in q.iter_mut() {
        *c += half;
    }
    if Q5 {
        write_q5_0(d, &q, out);
    } else {
        write_q4_0(d, &q, out);
    }
    false
}

/// Q4_1 / Q5_1 (`Q5`): the searched scale and minimum (of either sign), stored as f16, and each
/// value's nearest code at them as decoded (d·q + m).
fn encode_min_weighted<const Q5: bool>(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
    if abs_max_bits(x) >= INF_BITS {
        return true;
    }
    let top = if Q5 { 31 } else { 15 };
    let (a, b) = affine::<_, true>(x, w, top);
    let ((_, d), (_, mn)) = (f16_sat(a), f16_sat(-b));
    let mut q = [0i32; 32];
    for (c, &v) in q.iter_mut().zip(x) {
        *c = affine_code(v, d, -mn, top);
    }
    if Q5 {
        write_q5_1(d, mn, &q, out);
    } else {
        write_q4_1(d, mn, &q, out);
    }
    false
}
