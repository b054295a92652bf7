//! ggml's K-quants: super-blocks of 256 values in sub-blocks of 16 or 32, each sub-block with a
//! small integer scale (and minimum) under the super-block's f16 scale(s).
//!
//! The byte layouts are those gguf-py's `dequantize` reads (ggml-common.h's `block_q2_K` …
//! `block_q6_K`), and decoding repeats its f32 operations in its order — `(d·sc)·q − dmin·m`,
//! `(d·sc)·q` — so the values agree bit for bit. The quantizers are blockquant's own searches
//! ([`super::search`]): gguf-py has none for these types, and ggml's reference ones are one
//! choice among many that decode.
//!
//! Layout facts (offsets in bytes, element j of the super-block):
//! - Q2_K (84): scales[16] (low nibble sub-scale, high nibble minimum), qs[64], d, dmin.
//!   2-bit q of j in qs[32·(j/128) + j%32] at bit 2·((j%128)/32). Sub-blocks of 16.
//! - Q3_K (110): hmask[32], qs[64], scales[12], d. q ∈ −4..=3 as u = q + 4: low two bits as
//!   Q2_K, bit 2 in hmask[j%32] at bit j/32. Sub-scale + 32 in 6 bits: low nibble in
//!   scales[i%8] (nibble i/8), high two bits in scales[8 + i%4] at bit 2·(i/4). Sub-blocks of 16.
//! - Q4_K (144): d, dmin, scales[12], qs[128]. Sub-block s (of 32): nibble s%2 of
//!   qs[32·(s/2) + l]. 6-bit sub-scale sc_s and minimum m_s: for s < 4 in the low six bits of
//!   scales[s] and scales[4 + s]; for s ≥ 4 their low nibbles in scales[4 + s] (sc low, m
//!   high) and their top two bits in the top two bits of scales[s − 4] (sc) and scales[s] (m).
//! - Q5_K (176): as Q4_K with qh[32] before qs: bit 4 of the code in qh[l] at bit s.
//! - Q6_K (210): ql[128], qh[64], scales[16] (i8), d. q ∈ −32..=31 as u = q + 32: with
//!   h = j/128, r = j%128, low nibble in ql[64h + r%64] (nibble r/64), high two bits in
//!   qh[32h + r%32] at bit 2·(r/32). Sub-blocks of 16.

use super::block::{abs_max_bits, round_away, Block, INF_BITS};
use super::float16::f16_value;
use super::search::{
    self, affine, affine_code, f16_sat, nearest_codes, signed_subscales, symmetric, Uniform, Unit,
    Weigh,
};

#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q2_K;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q3_K;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q4_K;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q5_K;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct Q6_K;

const QK: usize = 256;

// ---------------------------------------------------------------------------------------------
// Quantizing: sub-block searches, then the stored scales, then the codes at those scales.

/// A super-block with minimums: f16 bits of d and dmin, sub-scales, minimums, codes.
struct Affine {
    d: u16,
    dmin: u16,
    sc: [i32; 16],
    m: [i32; 16],
    q: [i32; QK],
}

/// Sub-blocks of `sub` values with codes 0..=nmax and sub-scales/minimums 0..=top.
#[inline(always)]
fn encode_affine<W: Weigh>(x: &[f32], w: W, sub: usize, nmax: i32, top: i32) -> Affine {
    let n = QK / sub;
    let mut a = [0.0f32; 16];
    let mut b = [0.0f32; 16];
    for (j, xj) in x.chunks_exact(sub).enumerate() {
        (a[j], b[j]) = affine::<W, false>(xj, w.sub(j * sub, sub), nmax);
    }
    let amax = a[..n].iter().fold(0.0f32, |m, &v| m.max(v));
    let bmax = b[..n].iter().fold(0.0f32, |m, &v| m.max(v));
    let (d_bits, d) = f16_sat(amax / top as f32);
    let (m_bits, dm) = f16_sat(bmax / top as f32);
    let mut out = Affine {
        d: d_bits,
        dmin: m_bits,
        sc: [0; 16],
        m: [0; 16],
        q: [0; QK],
    };
    let near = |v: f32, step: f32| {
        if step == 0.0 {
            0
        } else {
            round_away((v / step).clamp(0.0, top as f32))
        }
    };
    for (j, xj) in x.chunks_exact(sub).enumerate() {
        let (r_sc, r_m) = (near(a[j], d), near(b[j], dm));
        let mut best = (f64::INFINITY, 0, 0);
        // The nearest sub-scale and minimum and their neighbours, judged as they decode.
        for sc in [r_sc, r_sc - 1, r_sc + 1] {
            for m in [r_m, r_m - 1, r_m + 1] {
                if !(0..=top).contains(&sc) || !(0..=top).contains(&m) {
                    continue;
                }
                let err = affine_error(xj, w.sub(j * sub, sub), d * sc as f32, dm * m as f32, nmax);
                if err < best.0 {
                    best = (err, sc, m);
                }
            }
        }
        (out.sc[j], out.m[j]) = (best.1, best.2);
        let (ea, eb) = (d * best.1 as f32, dm * best.2 as f32);
        for (q, &v) in out.q[j * sub..(j + 1) * sub].iter_mut().zip(xj) {
            *q = affine_code(v, ea, eb, nmax);
        }
    }
    out
}

#[inline(always)]
fn affine_error<W: Weigh>(x: &[f32], w: W, ea: f32, eb: f32, nmax: i32) -> f64 {
    search::wsum8(x.len(), w, |i| {
        let q = affine_code(x[i], ea, eb, nmax);
        let e = x[i] as f64 - (ea * q as f32 - eb) as f64;
        e * e
    })
}

/// A super-block with signed sub-scales: f16 bits of d, sub-scales, codes.
struct Symmetric {
    d: u16,
    sc: [i32; 16],
    q: [i32; QK],
}

/// Sub-blocks of `sub` values with codes lo..=hi and sub-scales slo..=shi.
#[inline(always)]
fn encode_symmetric<W: Weigh>(
    x: &[f32],
    w: W,
    sub: usize,
    grid: &Uniform,
    steps: usize,
    slo: i32,
    shi: i32,
) -> Symmetric {
    let n = QK / sub;
    let mut s = [0.0f32; 16];
    for (j, xj) in x.chunks_exact(sub).enumerate() {
        s[j] = symmetric(xj, w.sub(j * sub, sub), grid, steps);
    }
    let mut out = Symmetric {
        d: 0,
        sc: [0; 16],
        q: [0; QK],
    };
    out.d = signed_subscales(x, w, sub, &s[..n], slo, shi, grid, &mut out.sc[..n]);
    let d = super::float16::f16_to_f32(out.d);
    for (j, xj) in x.chunks_exact(sub).enumerate() {
        let e = d * out.sc[j] as f32;
        nearest_codes(xj, e, grid, &mut out.q[j * sub..(j + 1) * sub]);
    }
    out
}

/// Q4_K/Q5_K's twelve bytes of 6-bit sub-scales and minimums.
fn pack_scales_k4(sc: &[i32], m: &[i32], out: &mut [u8]) {
    for s in 0..4 {
        out[s] = (sc[s] | ((sc[s + 4] >> 4) << 6)) as u8;
        out[4 + s] = (m[s] | ((m[s + 4] >> 4) << 6)) as u8;
        out[8 + s] = ((sc[s + 4] & 0xF) | ((m[s + 4] & 0xF) << 4)) as u8;
    }
}

fn unpack_scales_k4(b: &[u8]) -> ([f32; 8], [f32; 8]) {
    let mut sc = [0.0; 8];
    let mut m = [0.0; 8];
    for s in 0..4 {
        sc[s] = (b[s] & 0x3F) as f32;
        m[s] = (b[4 + s] & 0x3F) as f32;
        sc[s + 4] = ((b[8 + s] & 0x0F) | ((b[s] >> 2) & 0x30)) as f32;
        m[s + 4] = ((b[8 + s] >> 4) | ((b[4 + s] >> 2) & 0x30)) as f32;
    }
    (sc, m)
}

/// Element j's place among 2-bit fields: byte 32·(j/128) + j%32, shift 2·((j%128)/32).
#[inline(always)]
fn crumb(j: usize) -> (usize, u32) {
    (32 * (j / 128) + j % 32, 2 * ((j % 128) / 32) as u32)
}

fn bad(x: &[f32]) -> bool {
    abs_max_bits(x) >= INF_BITS
}

impl Block for Q2_K {
    const BS: usize = QK;
    const TS: usize = 84;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        encode_q2_k(x, Unit, out)
    }

    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_q2_k(x, w, out)
    }

    fn decode(b: &[u8], out: &mut [f32]) {
        let (d, dmin) = (f16_value(&b[80..82]), f16_value(&b[82..84]));
        for (s, o) in out.chunks_exact_mut(16).enumerate() {
            let dl = d * (b[s] & 0xF) as f32;
            let ml = dmin * (b[s] >> 4) as f32;
            for (l, o) in o.iter_mut().enumerate() {
                let (i, sh) = crumb(16 * s + l);
                *o = dl * ((b[16 + i] >> sh) & 3) as f32 - ml;
            }
        }
    }
}

#[inline(always)]
fn encode_q2_k<W: Weigh>(x: &[f32], w: W, out: &mut [u8]) -> bool {
    if bad(x) {
        return true;
    }
    let k = encode_affine(x, w, 16, 3, 15);
    for ((o, &sc), &m) in out[..16].iter_mut().zip(&k.sc).zip(&k.m) {
        *o = (sc | (m << 4)) as u8;
    }
    let qs = &mut out[16..80];
    qs.fill(0);
    for (j, &q) in k.q.iter().enumerate() {
        let (i, sh) = crumb(j);
        qs[i] |= (q as u8) << sh;
    }
    out[80..82].copy_from_slice(&k.d.to_le_bytes());
    out[82..84].copy_from_slice(&k.dmin.to_le_bytes());
    false
}

impl Block for Q3_K {
    const BS: usize = QK;
    const TS: usize = 110;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        encode_q3_k(x, Unit, out)
    }

    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_q3_k(x, w, out)
    }

    fn decode(b: &[u8], out: &mut [f32]) {
        decode_q3_k(b, out)
    }
}

#[inline(always)]
fn encode_q3_k<W: Weigh>(x: &[f32], w: W, out: &mut [u8]) -> bool {
    if bad(x) {
        return true;
    }
    let k = encode_symmetric(x, w, 16, &Uniform { lo: -4, hi: 3 }, search::STEPS, -32, 31);
    out[..108].fill(0);
    for (j, &q) in k.q.iter().enumerate() {
        let u = (q + 4) as u8;
        let (i, sh) = crumb(j);
        out[32 + i] |= (u & 3) << sh;
        out[j % 32] |= (u >> 2) << (j / 32);
    }
    let scales = &mut out[96..108];
    for (i, &sc) in k.sc.iter().enumerate() {
        let u = (sc + 32) as u8;
        scales[i % 8] |= (u & 0xF) << (4 * (i / 8));
        scales[8 + i % 4] |= (u >> 4) << (2 * (i / 4));
    }
    out[108..110].copy_from_slice(&k.d.to_le_bytes());
    false
}

fn decode_q3_k(b: &[u8], out: &mut [f32]) {
    let d = f16_value(&b[108..110]);
    let scales = &b[96..108];
    for (s, o) in out.chunks_exact_mut(16).enumerate() {
        let lo = (scales[s % 8] >> (4 * (s / 8))) & 0xF;
        let hi = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
        let dl = d * ((lo | (hi << 4)) as i8 - 32) as f32;
        for (l, o) in o.iter_mut().enumerate() {
            let j = 16 * s + l;
            let (i, sh) = crumb(j);
            let low = ((b[32 + i] >> sh) & 3) as i8;
            let high = (b[j % 32] >> (j / 32)) & 1;
            *o = dl * (low - 4 * (1 - high) as i8) as f32;
        }
    }
}

/// Q4_K and Q5_K: d, dmin, 12 bytes of sub-scales, then (Q5_K) the fifth bits, then nibbles.
#[inline(always)]
fn encode_k45<W: Weigh, const Q5: bool>(x: &[f32], w: W, out: &mut [u8]) -> bool {
    if bad(x) {
        return true;
    }
    let k = encode_affine(x, w, 32, if Q5 { 31 } else { 15 }, 63);
    out[0..2].copy_from_slice(&k.d.to_le_bytes());
    out[2..4].copy_from_slice(&k.dmin.to_le_bytes());
    pack_scales_k4(&k.sc, &k.m, &mut out[4..16]);
    let qs_at = if Q5 { 48 } else { 16 };
    out[16..].fill(0);
    for (j, &q) in k.q.iter().enumerate() {
        let (s, l) = (j / 32, j % 32);
        out[qs_at + 32 * (s / 2) + l] |= ((q & 0xF) as u8) << (4 * (s % 2));
        if Q5 {
            out[16 + l] |= ((q >> 4) as u8) << s;
        }
    }
    false
}

fn decode_k45<const Q5: bool>(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_value(&b[0..2]), f16_value(&b[2..4]));
    let (sc, m) = unpack_scales_k4(&b[4..16]);
    let qs_at = if Q5 { 48 } else { 16 };
    for (s, o) in out.chunks_exact_mut(32).enumerate() {
        let dl = d * sc[s];
        let ml = dmin * m[s];
        for (l, o) in o.iter_mut().enumerate() {
            let mut q = (b[qs_at + 32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF;
            if Q5 {
                q |= ((b[16 + l] >> s) & 1) << 4;
            }
            *o = dl * q as f32 - ml;
        }
    }
}

impl Block for Q4_K {
    const BS: usize = QK;
    const TS: usize = 144;

    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        encode_k45::<Unit, false>(x, Unit, out)
    }

    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_k45::<&[f32], false>(x, w, out)
    }

    fn decode(b: &[u8], out: &mut [f32]) {
        decode_k45::<false>(b, out)
    }
}

impl Block for Q5_K {
    const BS: usize = QK;
    const TS: usize = 176;

    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        encode_k45::<Unit, true>(x, Unit, out)
    }

    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_k45::<&[f32], true>(x, w, out)
    }

    fn decode(b: &[u8], out: &mut [f32]) {
        decode_k45::<true>(b, out)
    }
}

impl Block for Q6_K {
    const BS: usize = QK;
    const TS: usize = 210;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        encode_q6_k(x, Unit, out)
    }

    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_q6_k(x, w, out)
    }

    fn decode(b: &[u8], out: &mut [f32]) {
        decode_q6_k(b, out)
    }
}

#[inline(always)]
fn encode_q6_k<W: Weigh>(x: &[f32], w: W, out: &mut [u8]) -> bool {
    if bad(x) {
        return true;
    }
    // 64 levels: the refit does most of the work; half the candidates cost ~0.1 dB on real
    // weights (benches/quality_gguf.py: 34.77 against 34.88) for ~2x the speed.
    let k = encode_symmetric(x, w, 16, &Uniform { lo: -32, hi: 31 }, 6, -128, 127);
    out[..192].fill(0);
    for (j, &q) in k.q.iter().enumerate() {
        let u = (q + 32) as u8;
        let (h, r) = (j / 128, j % 128);
        out[64 * h + r % 64] |= (u & 0xF) << (4 * (r / 64));
        out[128 + 32 * h + r % 32] |= (u >> 4) << (2 * (r / 32));
    }
    for (o, &sc) in out[192..208].iter_mut().zip(&k.sc) {
        *o = sc as i8 as u8;
    }
    out[208..210].copy_from_slice(&k.d.to_le_bytes());
    false
}

fn decode_q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_value(&b[208..210]);
    for (s, o) in out.chunks_exact_mut(16).enumerate() {
        let dl = d * (b[192 + s] as i8) as f32;
        for (l, o) in o.iter_mut().enumerate() {
            let (h, r) = ((16 * s + l) / 128, (16 * s + l) % 128);
            let low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
            let high = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
            *o = dl * ((low | (high << 4)) as i8 - 32) as f32;
        }
    }
}
