//! The ternary BitNet types TQ1_0 and TQ2_0: 256 values in {−1, 0, 1} times an f16 scale.

use super::block::{abs_max_bits, inverse, round_away, Block, INF_BITS};
use super::float16::{f16_bits, f16_value};

#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct TQ1_0;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct TQ2_0;

/// The ternary types: d = amax, q = round-half-away(x × (1/d)) + 1 in {0, 1, 2}.
#[inline(always)]
fn encode_ternary(x: &[f32], q: &mut [u8; 256]) -> Option<f32> {
    let m = abs_max_bits(x);
    if m >= INF_BITS {
        return None;
    }
    let d = f32::from_bits(m);
    let id = inverse(d);
    if id.is_finite() {
        // |x| <= amax = d, so |x × id| <= 1 (and a little).
        for (c, &v) in q.iter_mut().zip(x) {
            *c = (round_away(v * id) + 1) as u8;
        }
    } else {
        // 1/d overflowed: NaN or ±inf, cast to 0, plus 1.
        q.fill(1);
    }
    Some(d)
}

/// Five trits a byte (weights 81, 27, 9, 3, 1), then scaled to ⌈256·v/243⌉ so the top trit can
/// be read back with a multiply and a shift.
#[inline(always)]
fn trit_byte(sum: u32) -> u8 {
    (sum * 256).div_ceil(243) as u8
}

const POW3: [u32; 5] = [81, 27, 9, 3, 1];

/// 256 values: bytes 0..32 hold values k·32 + m (k = 0..5), bytes 32..48 values 160 + k·16 + m,
/// bytes 48..52 values 240 + k·4 + m (four trits), then f16(d).
impl Block for TQ1_0 {
    const STREAMS: bool = true;
    const BS: usize = 256;
    const TS: usize = 54;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        let mut q = [0u8; 256];
        let Some(d) = encode_ternary(x, &mut q) else {
            return true;
        };
        for m in 0..32 {
            let s: u32 = (0..5).map(|k| q[k * 32 + m] as u32 * POW3[k]).sum();
            out[m] = trit_byte(s);
        }
        for m in 0..16 {
            let s: u32 = (0..5).map(|k| q[160 + k * 16 + m] as u32 * POW3[k]).sum();
            out[32 + m] = trit_byte(s);
        }
        for m in 0..4 {
            let s: u32 = (0..4).map(|k| q[240 + k * 4 + m] as u32 * POW3[k]).sum();
            out[48 + m] = trit_byte(s);
        }
        out[52..54].copy_from_slice(&f16_bits(d));
        false
    }
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_value(&b[52..]);
        // Multiplying by 3^k (mod 256) brings trit k to the top; ×3 >> 8 reads it. In u32
        // lanes, one power a pass over contiguous bytes and values, so it vectorizes.
        let trits = |bytes: &[u8], p: u32, out: &mut [f32]| {
            for (o, &byte) in out.iter_mut().zip(bytes) {
                let t = (byte as u32 * p) & 0xFF;
                *o = d * (((t * 3) >> 8) as i32 - 1) as f32;
            }
        };
        for (k, p) in [1u32, 3, 9, 27, 81].into_iter().enumerate() {
            trits(&b[..32], p, &mut out[k * 32..k * 32 + 32]);
            trits(&b[32..48], p, &mut out[160 + k * 16..160 + k * 16 + 16]);
        }
        for (k, p) in [1u32, 3, 9, 27].into_iter().enumerate() {
            trits(&b[48..52], p, &mut out[240 + k * 4..240 + k * 4 + 4]);
        }
    }
}

/// 256 values, four 2-bit codes a byte: value j·128 + k·32 + m in byte j·32 + m at bit 2k;
/// then f16(d).
impl Block for TQ2_0 {
    const STREAMS: bool = true;
    const BS: usize = 256;
    const TS: usize = 66;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        let mut q = [0u8; 256];
        let Some(d) = encode_ternary(x, &mut q) else {
            return true;
        };
        for j in 0..2 {
            for m in 0..32 {
                let base = j * 128 + m;
                out[j * 32 + m] =
                    q[base] | q[base + 32] << 2 | q[base + 64] << 4 | q[base + 96] << 6;
            }
        }
        out[64..66].copy_from_slice(&f16_bits(d));
        false
    }
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let d = f16_value(&b[64..]);
        for j in 0..2 {
            for k in 0..4 {
                for m in 0..32 {
                    let c = (b[j * 32 + m] >> (2 * k)) & 3;
                    out[j * 128 + k * 32 + m] = d * (c as i32 - 1) as f32;
                }
            }
        }
    }
}
