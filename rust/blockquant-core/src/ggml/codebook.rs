//! ggml's non-uniform 4-bit types: IQ4_NL and IQ4_XS (a 16-value integer codebook times a
//! scale) and NVFP4 (FP4 E2M1 values times an unsigned E4M3 scale per 16 values).
//!
//! Layouts as gguf-py's `dequantize` reads them (ggml-common.h's `block_iq4_nl`,
//! `block_iq4_xs`, `block_nvfp4`); decoding is its one f32 product per value. The quantizers
//! are blockquant's own searches ([`super::search`]), gguf-py having none.
//! - IQ4_NL (18 bytes, 32 values): d (f16), qs[16]: value j < 16 in the low nibble of qs[j],
//!   j ≥ 16 in the high nibble of qs[j − 16]; value = d · CODEBOOK[nibble].
//! - IQ4_XS (136 bytes, 256 values): d (f16), scales_h (u16), scales_l[4], qs[128]. Sub-block s
//!   (of 32) has the 6-bit sub-scale (low nibble s%2 of scales_l[s/2], high two bits at bit 2s of
//!   scales_h) minus 32, and its nibbles as IQ4_NL's in qs[16s..16s + 16].
//! - NVFP4 (36 bytes, 64 values): four E4M3 scale bytes (bias 7, no sign; 0x00 and 0x7F decode
//!   to 0; the value halved, since the codes below are E2M1 values doubled), then four runs of 8
//!   bytes holding 16 nibbles each as IQ4_NL's; nibble = sign · 8 + index into 0,1,2,3,4,6,8,12.

use super::block::{abs_max_bits, Block, INF_BITS};
use super::float16::f16_value;
use super::search::{
    nearest_codes, scaled_error, signed_max, signed_subscales, symmetric, Book, Grid, Unit, Weigh,
    STEPS,
};

/// IQ4_NL's codebook (`kvalues_iq4nl`).
const CODEBOOK: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
static BOOK: Book = Book::new(&CODEBOOK);

#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct IQ4_NL;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct IQ4_XS;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct NVFP4;

/// 32 nibbles: j < 16 low in byte j, j ≥ 16 high in byte j − 16.
fn pack32(q: &[i32], out: &mut [u8]) {
    for (j, o) in out[..16].iter_mut().enumerate() {
        *o = (q[j] | (q[j + 16] << 4)) as u8;
    }
}

fn unpack32(b: &[u8], out: &mut [u8; 32]) {
    for (j, &v) in b[..16].iter().enumerate() {
        out[j] = v & 0xF;
        out[j + 16] = v >> 4;
    }
}

impl Block for IQ4_NL {
    const BS: usize = 32;
    const TS: usize = 18;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        encode_iq4_nl(x, Unit, out)
    }

    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_iq4_nl(x, w, out)
    }

    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_value(&b[..2]);
        let mut q = [0u8; 32];
        unpack32(&b[2..18], &mut q);
        for (o, &c) in out.iter_mut().zip(&q) {
            *o = d * CODEBOOK[c as usize] as f32;
        }
    }
}

#[inline(always)]
fn encode_iq4_nl<W: Weigh>(x: &[f32], w: W, out: &mut [u8]) -> bool {
    if abs_max_bits(x) >= INF_BITS {
        return true;
    }
    let (bits, d) = super::search::f16_sat(symmetric(x, w, &BOOK, STEPS));
    let mut q = [0i32; 32];
    nearest_codes(x, d, &BOOK, &mut q);
    out[..2].copy_from_slice(&bits.to_le_bytes());
    pack32(&q, &mut out[2..18]);
    false
}

impl Block for IQ4_XS {
    const BS: usize = 256;
    const TS: usize = 136;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        encode_iq4_xs(x, Unit, out)
    }

    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_iq4_xs(x, w, out)
    }

    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_value(&b[..2]);
        let high = u16::from_le_bytes([b[2], b[3]]);
        for (j, o) in out.chunks_exact_mut(32).enumerate() {
            let u =
                ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | ((((high >> (2 * j)) & 3) as u8) << 4);
            let dl = d * (u as i8 - 32) as f32;
            let mut q = [0u8; 32];
            unpack32(&b[8 + 16 * j..24 + 16 * j], &mut q);
            for (o, &c) in o.iter_mut().zip(&q) {
                *o = dl * CODEBOOK[c as usize] as f32;
            }
        }
    }
}

#[inline(always)]
fn encode_iq4_xs<W: Weigh>(x: &[f32], w: W, out: &mut [u8]) -> bool {
    if abs_max_bits(x) >= INF_BITS {
        return true;
    }
    let mut s = [0.0f32; 8];
    for (j, (s, xj)) in s.iter_mut().zip(x.chunks_exact(32)).enumerate() {
        *s = symmetric(xj, w.sub(32 * j, 32), &BOOK, STEPS);
    }
    let mut sc = [0i32; 8];
    let bits = signed_subscales(x, w, 32, &s, -32, 31, &BOOK, &mut sc);
    let d = super::float16::f16_to_f32(bits);
    out[..2].copy_from_slice(&bits.to_le_bytes());
    let mut high = 0u16;
    for (j, &c) in sc.iter().enumerate() {
        let u = (c + 32) as u16;
        high |= (u >> 4) << (2 * j);
    }
    out[2..4].copy_from_slice(&high.to_le_bytes());
    for k in 0..4 {
        out[4 + k] = (((sc[2 * k] + 32) & 0xF) | (((sc[2 * k + 1] + 32) & 0xF) << 4)) as u8;
    }
    for (j, xj) in x.chunks_exact(32).enumerate() {
        let mut q = [0i32; 32];
        nearest_codes(xj, d * sc[j] as f32, &BOOK, &mut q);
        pack32(&q, &mut out[8 + 16 * j..24 + 16 * j]);
    }
    false
}

/// E2M1 magnitudes, doubled (ggml's convention; the scale is halved to match).
const E2M1X2: [f32; 8] = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0];

/// The unsigned E4M3 scale byte's value, halved, as gguf-py decodes every byte (bit 7 ignored
/// except that 0x7F alone is the zero/NaN code).
const fn ue4m3_half(c: u8) -> f32 {
    if c == 0 || c == 0x7F {
        return 0.0;
    }
    let e = ((c >> 3) & 0xF) as i32;
    let m = (c & 7) as f32;
    let v = if e == 0 {
        m / 512.0
    } else {
        // (1 + m/8)·2^(e − 7), exact: e − 7 is in −6..=8.
        let mut p = 1.0f32;
        let mut k = 7;
        while k < e {
            p *= 2.0;
            k += 1;
        }
        while k > e {
            p /= 2.0;
            k -= 1;
        }
        (1.0 + m / 8.0) * p
    };
    v * 0.5
}

static UE4M3: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = ue4m3_half(c as u8);
        c += 1;
    }
    t
};

/// NVFP4's codes as a [`Grid`] for the shared error helpers: signed E2M1 (doubled) values.
struct Fp4;

impl Grid for Fp4 {
    #[inline(always)]
    fn nearest(&self, v: f32) -> (i32, f32) {
        // Midpoints between the doubled magnitudes; a tie goes to the smaller.
        const MID: [f32; 7] = [0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0];
        let a = v.abs();
        let i = MID.iter().filter(|&&m| m < a).count();
        let neg = v < 0.0;
        (i as i32 | if neg { 8 } else { 0 }, E2M1X2[i].copysign(v))
    }
    fn ends(&self) -> (f32, f32) {
        (-12.0, 12.0)
    }
}

impl Block for NVFP4 {
    const BS: usize = 64;
    const TS: usize = 36;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        encode_nvfp4(x, Unit, out)
    }

    fn encode_weighted(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
        encode_nvfp4(x, w, out)
    }

    fn decode(b: &[u8], out: &mut [f32]) {
        for (j, o) in out.chunks_exact_mut(16).enumerate() {
            let d = UE4M3[b[j] as usize];
            for (k, &v) in b[4 + 8 * j..12 + 8 * j].iter().enumerate() {
                o[k] = d * fp4_code(v & 0xF);
                o[k + 8] = d * fp4_code(v >> 4);
            }
        }
    }
}

#[inline(always)]
fn encode_nvfp4<W: Weigh>(x: &[f32], w: W, out: &mut [u8]) -> bool {
    if abs_max_bits(x) >= INF_BITS {
        return true;
    }
    for (j, xj) in x.chunks_exact(16).enumerate() {
        let c = nvfp4_scale(xj, w.sub(16 * j, 16));
        out[j] = c;
        let mut q = [0i32; 16];
        nearest_codes(xj, UE4M3[c as usize], &Fp4, &mut q);
        for (k, o) in out[4 + 8 * j..12 + 8 * j].iter_mut().enumerate() {
            *o = (q[k] | (q[k + 8] << 4)) as u8;
        }
    }
    false
}

/// A nibble's doubled E2M1 value, gguf-py's int8 table (so the negative zero code is +0).
#[inline(always)]
fn fp4_code(n: u8) -> f32 {
    const TABLE: [f32; 16] = [
        0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0,
    ];
    TABLE[n as usize]
}

/// The scale byte for 16 values: of the E4M3 scales putting the largest value between 7 and 14
/// (E2M1 doubled: its top values are 8 and 12), the one with the least error.
#[inline(always)]
fn nvfp4_scale<W: Weigh>(x: &[f32], w: W) -> u8 {
    let (_, amax) = signed_max(x);
    if amax == 0.0 {
        return 0;
    }
    // Scales rise with the byte over 1..=0x7E; the first at or above amax/14, and on.
    let lo = amax / 14.0;
    let hi = amax / 7.0;
    let first = (1 + UE4M3[1..=0x7E].partition_point(|&s| s < lo)).min(0x7E) as u8;
    let mut best = (f64::INFINITY, first);
    let mut c = first;
    loop {
        let err = scaled_error(x, w, UE4M3[c as usize], &Fp4);
        if err < best.0 {
            best = (err, c);
        }
        if c == 0x7E || UE4M3[c as usize] > hi {
            break;
        }
        c += 1;
    }
    // A smaller scale may still win when the block is tiny (below the first normal scale).
    if first > 1 && UE4M3[first as usize - 1] > 0.0 {
        let err = scaled_error(x, w, UE4M3[first as usize - 1], &Fp4);
        if err < best.0 {
            best = (err, first - 1);
        }
    }
    best.1
}

#[cfg(test)]
#[path = "codebook_tests.rs"]
mod tests;
