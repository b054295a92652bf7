//! MXFP4: 32 E2M1 codes under an E8M0 power-of-two scale (OCP MX), as gguf-py computes them.

use std::sync::OnceLock;

use super::block::{abs_max_bits, pack_nibbles, Block, INF_BITS};

#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
pub(super) struct MXFP4;

/// The largest f32 below which `floor(log2f(a))` is still the binade's own exponent k, for
/// every binade k = −149..=127 (index k + 149): a float32 log2 rounds values just below 2^(k+1)
/// up to k + 1 once its spacing there is coarse enough, and gguf-py's (numpy's float32
/// `np.log2`, correctly rounded) and ggml's `log2f` do. `u32::MAX`: it never does.
pub(super) fn log2_round_up_from() -> &'static [u32; 277] {
    static TABLE: OnceLock<[u32; 277]> = OnceLock::new();
    TABLE.get_or_init(|| {
        std::array::from_fn(|i| {
            let k = i as i32 - 149;
            // log2 in f64 rounded to f32 is the correctly rounded float32 log2 except within
            // 2^-29 of an f32 rounding boundary, which no float's log2 comes that near to here.
            let rounds_up = |b: u32| ((f32::from_bits(b) as f64).log2() as f32) >= (k + 1) as f32;
            let lo = (2f64.powi(k) as f32).to_bits();
            let hi = (2f64.powi(k + 1) as f32).to_bits() - 1;
            if !rounds_up(hi) {
                return u32::MAX;
            }
            let (mut a, mut b) = (lo, hi); // rounds_up(b), and the answer is in [a, b]
            while a < b {
                let mid = a + (b - a) / 2;
                if rounds_up(mid) {
                    b = mid;
                } else {
                    a = mid + 1;
                }
            }
            a
        })
    })
}

/// `floor(log2f(a))` for a positive finite f32, as gguf-py computes it.
#[inline(always)]
pub(super) fn np_floor_log2(a: f32, table: &[u32; 277]) -> i32 {
    let b = a.to_bits();
    let k = if b >= 0x0080_0000 {
        (b >> 23) as i32 - 127
    } else {
        31 - b.leading_zeros() as i32 - 149
    };
    k + (b >= table[(k + 149) as usize]) as i32
}

/// ggml's `ggml_e8m0_to_fp32_half`: half the E8M0 scale 2^(e−127), as the doubled E2M1 codes
/// want it.
#[inline(always)]
pub(super) fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e - 1) as u32) << 23)
    }
}

/// e = floor(log2f(amax)) − 2 + 127 as a byte (numpy's cast: wraps below 0, for amax < 2^-125),
/// d = 2^(e−128); each value takes the code nearest to x/d, ties to the smaller magnitude (numpy's
/// argmin keeps the first of equal errors) and 0 as +0. The errors |d·k − x| gguf-py compares are
/// exact for the two codes around x, so comparing |x| with the midpoints d·{0.5, 1.5, ...} (exact:
/// d is a power of two) picks the same code. Where d·8 overflows (amax rounds to 2^128) the
/// codes 8 and 12 have an infinite error and are never picked.
impl Block for MXFP4 {
    const STREAMS: bool = true;
    const BS: usize = 32;
    const TS: usize = 17;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        let m = abs_max_bits(x);
        if m >= INF_BITS {
            return true;
        }
        let e = if m > 0 {
            (np_floor_log2(f32::from_bits(m), log2_round_up_from()) + 125) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        let mids = [0.5f32, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0].map(|k| k * d);
        let top = if (8.0 * d).is_finite() { 7 } else { 5 };
        // i32 lanes throughout (u8 counters make LLVM narrow early and shuffle bytes).
        let mut idx = [0i32; 32];
        for (c, &v) in idx.iter_mut().zip(x) {
            let a = v.abs();
            let mut i = 0i32;
            for &t in &mids {
                i += (a > t) as i32;
            }
            let i = i.min(top);
            *c = i | (((v < 0.0) & (i > 0)) as i32) << 3;
        }
        out[0] = e;
        pack_nibbles(&idx, &mut out[1..17]);
        false
    }
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        let mut q = [0i32; 32];
        for (j, &byte) in b[1..17].iter().enumerate() {
            q[j] = (byte & 0x0F) as i32;
            q[j + 16] = (byte >> 4) as i32;
        }
        let d = e8m0_half(b[0]);
        // The doubled E2M1 values (0 1 2 3 4 6 8 12) computed rather than looked up, so it
        // vectorizes: magnitude index i = 2e + m is m for e = 0, else (2 + m) << (e − 1); bit 3
        // the sign (code 8, −0, is the integer 0, so d·0 = +0 as in gguf-py's table).
        for (o, &n) in out.iter_mut().zip(&q) {
            let (e, m) = ((n & 7) >> 1, n & 1);
            let mag = if e == 0 { m } else { (2 + m) << (e - 1) };
            let k = if n & 8 != 0 { -mag } else { mag };
            *o = d * k as f32;
        }
    }
}
