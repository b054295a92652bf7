//! Each block type against a literal, scalar reading of gguf-py's numpy code (its f32
//! operations one by one, numpy's cast, argmax/argmin keeping the first); the AVX2 runs
//! against the portable ones; the float16 cast and the log2 table against direct
//! computations. Python's tests/test_gguf.py holds the same kernels to gguf-py itself.

use super::block::*;
use super::float::f64_to_f16_bits;
use super::float16::*;
use super::legacy::{max_ps, min_ps, np_reduce32};
use super::mxfp4::{e8m0_half, log2_round_up_from, np_floor_log2};
use super::*;
use crate::pack::tests::Rng;

/// MXFP4's codes, doubled: index = code, the sign in bit 3.
const KVALUES: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0,
];

/// numpy's float → (u)int8 cast on x86-64: `cvttss2si`'s i32 (i32::MIN for NaN and out of
/// range), low byte.
fn np_cast_u8(v: f32) -> u8 {
    if v.abs() < 2_147_483_648.0 {
        v as i32 as u8
    } else {
        0
    }
}

fn np_sign(v: f32) -> f32 {
    if v > 0.0 {
        1.0
    } else if v < 0.0 {
        -1.0
    } else if v == 0.0 {
        0.0
    } else {
        v
    }
}

fn np_roundf(n: f32) -> f32 {
    let a = n.abs();
    let floored = a.floor();
    let b = floored + (2.0 * (a - floored)).floor();
    np_sign(n) * b
}

fn np_amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

fn np_inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

fn literal_q8_0(x: &[f32]) -> Vec<u8> {
    let d = np_amax(x) / 127.0;
    let id = np_inverse(d);
    let mut out = f16_bits(d).to_vec();
    out.extend(x.iter().map(|&v| np_cast_u8(np_roundf(v * id))));
    out
}

fn literal_signed(x: &[f32], neg_half: f32, top: u8) -> (f32, Vec<u8>) {
    let amax = np_amax(x);
    let imax = x.iter().position(|v| v.abs() == amax).unwrap();
    // ggml's own rule where gguf-py's argmax differs: an all-zero block's maximum is +0.
    let max = if amax == 0.0 { 0.0 } else { x[imax] };
    let d = max / neg_half;
    let id = np_inverse(d);
    let q = x
        .iter()
        .map(|&v| np_cast_u8((v * id + (-neg_half + 0.5)).trunc()).min(top))
        .collect();
    (d, q)
}

fn literal_min(x: &[f32], steps: f32, top: u8) -> (f32, f32, Vec<u8>) {
    let mn = np_reduce32(x, min_ps);
    let mx = np_reduce32(x, max_ps);
    let d = (mx - mn) / steps;
    let id = np_inverse(d);
    let q = x
        .iter()
        .map(|&v| np_cast_u8(((v - mn) * id + 0.5).trunc()).min(top))
        .collect();
    (d, mn, q)
}

fn nibbles(q: &[u8]) -> Vec<u8> {
    (0..16).map(|j| (q[j] & 15) | (q[j + 16] << 4)).collect()
}

fn high_bits(q: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; 4];
    for (i, &c) in q.iter().enumerate() {
        if c >> 4 != 0 {
            bytes[i / 8] |= 1 << (i % 8);
        }
    }
    bytes
}

fn literal(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::Q8_0 => literal_q8_0(x),
        GgmlType::Q4_0 => {
            let (d, q) = literal_signed(x, -8.0, 15);
            [f16_bits(d).to_vec(), nibbles(&q)].concat()
        }
        GgmlType::Q5_0 => {
            let (d, q) = literal_signed(x, -16.0, 31);
            [f16_bits(d).to_vec(), high_bits(&q), nibbles(&q)].concat()
        }
        GgmlType::Q4_1 => {
            let (d, m, q) = literal_min(x, 15.0, 15);
            [f16_bits(d).to_vec(), f16_bits(m).to_vec(), nibbles(&q)].concat()
        }
        GgmlType::Q5_1 => {
            let (d, m, q) = literal_min(x, 31.0, 31);
            [
                f16_bits(d).to_vec(),
                f16_bits(m).to_vec(),
                high_bits(&q),
                nibbles(&q),
            ]
            .concat()
        }
        GgmlType::MXFP4 => literal_mxfp4(x),
        GgmlType::TQ1_0 | GgmlType::TQ2_0 => literal_ternary(ty, x),
        _ => unreachable!(),
    }
}

fn literal_mxfp4(x: &[f32]) -> Vec<u8> {
    let amax = np_amax(x);
    let e = if amax > 0.0 {
        let l = ((amax as f64).log2() as f32).floor();
        np_cast_u8(l - 2.0 + 127.0)
    } else {
        0
    };
    let d = e8m0_half(e);
    let q: Vec<u8> = x
        .iter()
        .map(|&v| {
            let errs = KVALUES.map(|k| (d * k - v).abs());
            let mut best = 0;
            for (i, &err) in errs.iter().enumerate() {
                if err < errs[best] {
                    best = i;
                }
            }
            best as u8
        })
        .collect();
    [vec![e], nibbles(&q)].concat()
}

fn literal_ternary(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let d = np_amax(x);
    let id = np_inverse(d);
    let q: Vec<u8> = x
        .iter()
        .map(|&v| (np_cast_u8(np_roundf(v * id)) as i8).wrapping_add(1) as u8)
        .collect();
    let mut out = Vec::new();
    if ty == GgmlType::TQ2_0 {
        for j in 0..2 {
            for m in 0..32 {
                let mut b = 0u8;
                for k in 0..4 {
                    b |= q[j * 128 + k * 32 + m] << (2 * k);
                }
                out.push(b);
            }
        }
    } else {
        // (start, columns, trits) of the three groups.
        for (start, cols, trits) in [(0, 32, 5), (160, 16, 5), (240, 4, 4)] {
            for m in 0..cols {
                let sum: u64 = (0..trits)
                    .map(|k| q[start + k * cols + m].wrapping_mul([81u8, 27, 9, 3, 1][k]) as u64)
                    .sum();
                let s = (sum as u16).wrapping_mul(256).wrapping_add(242) / 243;
                out.push(s as u8);
            }
        }
    }
    out.extend(f16_bits(d));
    out
}

const QUANT: [GgmlType; 8] = [
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::MXFP4,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
];

fn encode_one(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0xA5u8; ty.type_size()];
    let bad = match ty {
        GgmlType::Q8_0 => Q8_0::encode(x, &mut out),
        GgmlType::Q4_0 => Q4_0::encode(x, &mut out),
        GgmlType::Q4_1 => Q4_1::encode(x, &mut out),
        GgmlType::Q5_0 => Q5_0::encode(x, &mut out),
        GgmlType::Q5_1 => Q5_1::encode(x, &mut out),
        GgmlType::MXFP4 => MXFP4::encode(x, &mut out),
        GgmlType::TQ1_0 => TQ1_0::encode(x, &mut out),
        GgmlType::TQ2_0 => TQ2_0::encode(x, &mut out),
        _ => unreachable!(),
    };
    assert!(!bad);
    out
}

/// A block of one character: every value drawn around `mag` (ties at its power-of-two
/// multiples among them), or zeros of both signs, or mixes.
fn block(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mags = [
        0.0,
        1e-45,
        1e-42,
        1e-39,
        2e-38, // tiny normals: 1/d overflows in every type
        1e-37,
        1e-30,
        1e-3,
        1.0,
        300.0,
        65504.0,
        1e30,
        3e38,
        f32::MAX,
    ];
    let mag: f32 = rng.pick(&mags);
    let p2 = 2f32.powi(rng.below(60) as i32 - 30);
    (0..n)
        .map(|_| match rng.below(10) {
            0 => 0.0,
            1 => -0.0,
            2 => (rng.below(49) as f32 - 24.0) / 4.0 * p2, // exact ties
            3 => rng.unit() * rng.pick(&mags),
            4 => mag * if rng.below(2) == 0 { 1.0 } else { -1.0 },
            _ => rng.unit() * mag,
        })
        .collect()
}

#[test]
fn blocks_match_a_literal_reading_of_gguf_py() {
    let mut rng = Rng::new(11);
    for ty in QUANT {
        for _ in 0..6000 {
            let x = block(&mut rng, ty.block_size());
            assert_eq!(encode_one(ty, &x), literal(ty, &x), "{ty} on {x:?}");
        }
    }
}

#[test]
fn binade_tops_and_tiny_blocks_match_a_literal_reading() {
    // Blocks whose amax sits where log2f rounds up, or where 1/d or e wraps.
    let mut rng = Rng::new(12);
    let table = log2_round_up_from();
    for &bits in table.iter().filter(|&&b| b != u32::MAX) {
        for amax in [bits - 1, bits, bits + 1].map(f32::from_bits) {
            for ty in QUANT {
                let mut x: Vec<f32> = (0..ty.block_size()).map(|_| rng.unit() * amax).collect();
                let at = rng.below(x.len());
                x[at] = if rng.below(2) == 0 { amax } else { -amax };
                assert_eq!(encode_one(ty, &x), literal(ty, &x), "{ty} amax {amax:e}");
            }
        }
    }
}

#[test]
fn log2_table_matches_log2_in_f64() {
    let table = log2_round_up_from();
    for k in -149i32..=127 {
        let lo = (2f64.powi(k) as f32).to_bits();
        let hi = (2f64.powi(k + 1) as f32).to_bits() - 1;
        // The top 2^14 floats of the binade, where rounding up can happen, and its bottom.
        for b in hi.saturating_sub(1 << 14).max(lo)..=hi {
            let a = f32::from_bits(b);
            let want = ((a as f64).log2() as f32).floor() as i32;
            assert_eq!(np_floor_log2(a, table), want, "{a:e}");
        }
        assert_eq!(np_floor_log2(f32::from_bits(lo), table), k);
    }
    // float32 log2 rounds 2^128·(1 − 2^-24) up to 128: e = 253.
    assert_eq!(np_floor_log2(f32::MAX, table), 128);
}

#[test]
fn round_away_is_roundf() {
    for b in (0..0x4B00_0000u32)
        .step_by(7)
        .chain(0x3EFF_FF00..0x3F00_0100)
    {
        let v = f32::from_bits(b);
        assert_eq!(round_away(v) as f32, v.round(), "{v:e}");
        assert_eq!(round_away(-v) as f32, (-v).round(), "{v:e}");
    }
}

#[test]
fn f32_to_f16_matches_half() {
    // A sweep over all bit patterns, and every pattern around the rounding boundaries.
    let dense = (0x3300_0000u32..0x3900_0000).step_by(3);
    let top = 0x4770_0000u32..0x4780_0100;
    for b in (0..=u32::MAX).step_by(251).chain(dense).chain(top) {
        let v = f32::from_bits(b);
        let want = half::f16::from_f32(v).to_bits();
        let got = f32_to_f16(v);
        if v.is_nan() {
            assert!(got & 0x7C00 == 0x7C00 && got & 0x3FF != 0 && got >> 15 == want >> 15);
        } else {
            assert_eq!(got, want, "{v:e} ({b:#x})");
        }
    }
}

#[test]
fn f64_to_f16_rounds_once_to_nearest_even() {
    let mut rng = Rng::new(13);
    for _ in 0..200_000 {
        let v = f64::from_bits(rng.next_u64()).clamp(-1e6, 1e6);
        let v = if v.is_nan() {
            0.5
        } else {
            v * 2f64.powi(rng.below(40) as i32 - 30)
        };
        let got = f64_to_f16_bits(v);
        let g = half::f16::from_bits(got).to_f64();
        if g.is_infinite() {
            assert!(v.abs() >= 65520.0, "{v:e}");
            continue;
        }
        // No f16 is nearer, and on a tie the even one wins.
        let err = (g - v).abs();
        for n in [got.wrapping_sub(1), got.wrapping_add(1)] {
            let h = half::f16::from_bits(n).to_f64();
            if h.is_nan() || (h.is_sign_negative() != g.is_sign_negative() && g != 0.0) {
                continue;
            }
            let e2 = (h - v).abs();
            assert!(err < e2 || (err == e2 && got & 1 == 0), "{v:e} → {got:#x}");
        }
    }
    assert_eq!(f64_to_f16_bits(65519.99), 0x7BFF);
    assert_eq!(f64_to_f16_bits(-65520.0), 0xFC00);
    assert_eq!(f64_to_f16_bits(2f64.powi(-25)), 0); // tie between 0 and 2^-24: even
    assert_eq!(f64_to_f16_bits(2f64.powi(-25) * 1.000001), 1);
    assert_eq!(f64_to_f16_bits(-0.0), 0x8000);
}

/// Every type, quantized then dequantized on a run of many blocks: the AVX2 builds of the
/// runs (the compiled portable code and the hand-written kernels) against the portable one,
/// bit for bit (random bytes for dequantize, NaNs included); a run ending in a part group;
/// a NaN or infinity anywhere reported by each.
#[test]
fn avx2_runs_match_portable_runs() {
    fn check<B: Block>(ty: GgmlType, rng: &mut Rng) {
        let n = 64 * 256;
        let x: Vec<f32> = (0..n / 64).flat_map(|_| block(rng, 64)).collect();
        // Whole groups, then 3 blocks past them.
        for len in [n, (GROUP * 7 + 3) * B::BS.max(8)] {
            let (x, nb) = (&x[..len], len / B::BS);
            let (mut a, mut b) = (vec![0u8; nb * B::TS], vec![1u8; nb * B::TS]);
            let mut c = vec![2u8; nb * B::TS];
            assert!(!encode_run_best::<B>(x, &mut a));
            assert!(!encode_run(B::default(), x, &mut c));
            assert!(!encode_run_portable(B::default(), x, &mut b));
            assert_eq!(a, b, "{ty} quantize, {len} values");
            assert_eq!(c, b, "{ty} quantize, {len} values");
            let mut y = x.to_vec();
            for _ in 0..20 {
                let at = rng.below(len);
                y[at] = [f32::NAN, f32::INFINITY, -f32::INFINITY][rng.below(3)];
                assert!(encode_run_best::<B>(&y, &mut a), "{ty} non-finite at {at}");
                assert!(
                    encode_run(B::default(), &y, &mut a),
                    "{ty} non-finite at {at}"
                );
                y[at] = x[at];
            }
        }
        let nb = n / B::BS;
        let bytes: Vec<u8> = (0..nb * B::TS).map(|_| rng.byte()).collect();
        let (mut fa, mut fb) = (vec![0f32; n], vec![1f32; n]);
        let mut fc = vec![2f32; n];
        decode_run(B::default(), &bytes, &mut fa);
        decode_run_best::<B>(&bytes, &mut fc, false);
        decode_run_portable(B::default(), &bytes, &mut fb);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fa), bits(&fb), "{ty} dequantize");
        assert_eq!(bits(&fc), bits(&fb), "{ty} dequantize");
        // The non-temporal stores of a large output: the same values, and none past the end
        // (a Vec<f32> is 16-byte aligned here in practice; an unaligned one takes the cached
        // stores, also checked).
        let mut fd = vec![3f32; n + 1];
        decode_run_best::<B>(&bytes, &mut fd[..n], true);
        assert_eq!(bits(&fd[..n]), bits(&fb), "{ty} dequantize, streamed");
        assert_eq!(fd[n], 3.0, "{ty} dequantize, streamed: past the end");
        let mut fe = vec![4f32; n + 1];
        decode_run_best::<B>(&bytes, &mut fe[1..], true);
        assert_eq!(
            bits(&fe[1..]),
            bits(&fb),
            "{ty} dequantize, streamed, unaligned"
        );
        assert_eq!(
            fe[0], 4.0,
            "{ty} dequantize, streamed, unaligned: before the start"
        );
    }
    let mut rng = Rng::new(14);
    check::<F32>(GgmlType::F32, &mut rng);
    check::<F16>(GgmlType::F16, &mut rng);
    check::<BF16>(GgmlType::BF16, &mut rng);
    check::<Q8_0>(GgmlType::Q8_0, &mut rng);
    check::<Q4_0>(GgmlType::Q4_0, &mut rng);
    check::<Q4_1>(GgmlType::Q4_1, &mut rng);
    check::<Q5_0>(GgmlType::Q5_0, &mut rng);
    check::<Q5_1>(GgmlType::Q5_1, &mut rng);
    check::<MXFP4>(GgmlType::MXFP4, &mut rng);
    check::<TQ1_0>(GgmlType::TQ1_0, &mut rng);
    check::<TQ2_0>(GgmlType::TQ2_0, &mut rng);
}

/// An all-zero Q4_0/Q5_0 block stores ggml's d = −0 (f16 0x8000) whatever the signs of its
/// zeros, every code the middle one (8 or 16): the single-block encoder, the portable run and
/// the AVX2 runs alike, each block of a run a different pattern of ±0 (gguf-py would store +0
/// for a first −0).
#[test]
fn all_zero_signed_blocks_store_negative_zero_scale() {
    fn check<B: Block>(ty: GgmlType) {
        // Every sign pattern of a few positions, then whole blocks of +0, of −0, alternating.
        let zero = |negative: bool| if negative { -0.0f32 } else { 0.0 };
        let mut x = Vec::new();
        for bits in 0..64u32 {
            x.extend((0..32).map(|i| zero(i < 6 && bits >> i & 1 == 1)));
        }
        x.extend([0.0f32; 32]);
        x.extend([-0.0f32; 32]);
        x.extend((0..32).map(|i| zero(i % 2 == 1)));
        x.extend((0..32).map(|i| zero(i % 2 == 0)));
        // Whole groups and a part group; then one nonzero block keeps gguf-py's rule.
        x.truncate(GROUP * 8 * 32 + 3 * 32);
        x.extend((0..32).map(|i| if i == 0 { -0.0 } else { i as f32 - 16.0 }));
        let nb = x.len() / 32;
        let (mut a, mut b) = (vec![0u8; nb * B::TS], vec![1u8; nb * B::TS]);
        assert!(!encode_run_best::<B>(&x, &mut a));
        assert!(!encode_run_portable(B::default(), &x, &mut b));
        assert_eq!(a, b, "{ty}: AVX2 and portable runs");
        for (k, (blk, xb)) in b.chunks_exact(B::TS).zip(x.chunks_exact(32)).enumerate() {
            assert_eq!(
                blk,
                encode_one(ty, xb),
                "{ty} block {k}: run and single block"
            );
            if k + 1 < nb {
                assert_eq!(blk[..2], [0x00, 0x80], "{ty} block {k}: d = -0");
                let mut dq = [1f32; 32];
                B::decode(blk, &mut dq);
                assert!(dq.iter().all(|&v| v == 0.0), "{ty} block {k}: {dq:?}");
                assert_eq!(blk, literal(ty, xb), "{ty} block {k}: codes");
            } else {
                // max = -15 (the first of -15 and 15), d = -15 / -8 or -16.
                let d = if ty == GgmlType::Q4_0 { 1.875 } else { 0.9375 };
                assert_eq!(blk[..2], f16_bits(d), "{ty}: the nonzero block's d");
                assert_eq!(blk, literal(ty, xb), "{ty}: the nonzero block");
            }
        }
    }
    check::<Q4_0>(GgmlType::Q4_0);
    check::<Q5_0>(GgmlType::Q5_0);
}

/// F16C's conversion (the AVX2 F16 run and the scales of the hand-written kernels) against the
/// portable float16 cast, on a sweep of every finite magnitude and around the rounding edges;
/// and the F16 run against the portable one.
#[cfg(target_arch = "x86_64")]
#[test]
fn f16c_matches_the_portable_cast() {
    use super::legacy_avx2::{f16_lanes, f16_run};
    if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
        return;
    }
    let dense = (0x3300_0000u32..0x3900_0000).step_by(5);
    let top = 0x4770_0000u32..0x4780_0000;
    let bits: Vec<u32> = (0..0x7F80_0000u32)
        .step_by(97)
        .chain(dense)
        .chain(top)
        .collect();
    let mut lanes = [0f32; GROUP];
    for chunk in bits.chunks(GROUP / 2) {
        for (j, &b) in chunk.iter().enumerate() {
            lanes[2 * j] = f32::from_bits(b);
            lanes[2 * j + 1] = -f32::from_bits(b);
        }
        // SAFETY: the CPU has AVX2 and F16C, checked above.
        let got = unsafe { f16_lanes(&lanes) };
        for (v, g) in lanes.iter().zip(got) {
            assert_eq!(g, f32_to_f16(*v), "{v:e}");
        }
    }
    let mut rng = Rng::new(15);
    let x: Vec<f32> = (0..1001).flat_map(|_| block(&mut rng, 8)).collect();
    let (mut a, mut b) = (vec![0u8; x.len() * 2], vec![1u8; x.len() * 2]);
    // SAFETY: as above.
    assert!(!unsafe { f16_run(&x, &mut a) });
    assert!(!encode_run_portable(F16, &x, &mut b));
    assert_eq!(a, b);
    let mut y = x.clone();
    for at in [0, 9, x.len() - 1] {
        y[at] = f32::NAN;
        // SAFETY: as above.
        assert!(unsafe { f16_run(&y, &mut a) }, "NaN at {at}");
        y[at] = x[at];
    }
}

#[test]
fn mxfp4_decodes_as_gguf_py_table() {
    // Every scale byte, every code (each block holds all 16 codes twice).
    for e in 0..=255u8 {
        let mut b = [0u8; 17];
        b[0] = e;
        for (j, byte) in b[1..].iter_mut().enumerate() {
            *byte = (j as u8) | (15 - j as u8) << 4;
        }
        let mut out = [0f32; 32];
        MXFP4::decode(&b, &mut out);
        let d = e8m0_half(e);
        for j in 0..16 {
            assert_eq!(
                out[j].to_bits(),
                (d * KVALUES[j]).to_bits(),
                "e {e} code {j}"
            );
            let k = 15 - j;
            assert_eq!(
                out[j + 16].to_bits(),
                (d * KVALUES[k]).to_bits(),
                "e {e} code {k}"
            );
        }
    }
}

#[test]
fn codes_decode_to_their_values() {
    // Quantize → dequantize lands within half a step of a block of exact multiples.
    let x: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) / 16.0).collect();
    for ty in GgmlType::ALL {
        let mut q = vec![0u8; ty.row_bytes(256).unwrap()];
        quantize(ty, Input::F32(&x), 256, &mut q).unwrap();
        let mut y = vec![0f32; 256];
        dequantize(ty, &q, &mut y);
        let step = match ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0 => 0.1,
            GgmlType::TQ1_0 | GgmlType::TQ2_0 => 8.0,
            // The OCP scale 2^(floor(log2 amax) − 2) saturates values above 6 × scale.
            GgmlType::MXFP4 => 2.0,
            _ => 1.0,
        };
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= step, "{ty}: {a} → {b}");
        }
    }
}

#[test]
fn errors_name_the_problem() {
    let x = [1.0f32; 64];
    let mut out = vec![0u8; 1000];
    let err = quantize(GgmlType::Q8_0, Input::F32(&x[..48]), 48, &mut out).unwrap_err();
    assert!(matches!(err, QuantError::Layout(_)), "{err}");
    assert!(GgmlType::TQ2_0.row_bytes(128).is_err());
    assert!(GgmlType::Q4_0.row_len(17).is_err());
    assert_eq!(GgmlType::Q4_0.row_len(36).unwrap(), 64);
    let mut y = x;
    y[40] = f32::NAN;
    let mut out = vec![0u8; 40];
    let err = quantize(GgmlType::Q4_1, Input::F32(&y), 64, &mut out).unwrap_err();
    assert!(
        matches!(err, QuantError::NonFinite { index: 40, .. }),
        "{err}"
    );
    let big = [1e300f64; 4];
    let mut out = vec![0u8; 8];
    let err = quantize(GgmlType::F16, Input::F64(&big), 4, &mut out).unwrap_err();
    assert!(
        matches!(err, QuantError::NonFinite { index: 0, .. }),
        "{err}"
    );
}

#[test]
fn names_and_ids_round_trip() {
    for ty in GgmlType::ALL {
        assert_eq!(GgmlType::from_name(ty.name()), Some(ty));
        assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
    }
    assert_eq!(GgmlType::from_name("q8_0"), None);
    assert_eq!(GgmlType::from_id(16), None); // IQ2_XXS
}

/// The k-quants' dequantize into a large output (the cached stores: `Block::STREAMS` is
/// false for them) against the portable decode, bit for bit, on random bytes: 16-byte
/// aligned and not, a run ending short of a buffer's worth. (The types that stream are
/// checked in `avx2_runs_match_portable_runs`.)
#[test]
fn large_output_decode_matches_portable_for_k_quants() {
    fn check<B: Block>(rng: &mut Rng) {
        for nb in [64, 9] {
            let bytes: Vec<u8> = (0..nb * B::TS).map(|_| rng.byte()).collect();
            let n = nb * B::BS;
            let mut want = vec![0f32; n];
            decode_run_portable(B::default(), &bytes, &mut want);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            for at in [0, 1] {
                let mut got = vec![5f32; n + 2];
                decode_run_best::<B>(&bytes, &mut got[at..at + n], true);
                assert_eq!(bits(&got[at..at + n]), bits(&want), "{nb} blocks at {at}");
                assert!(got[..at].iter().chain(&got[at + n..]).all(|&v| v == 5.0));
            }
        }
    }
    let mut rng = Rng::new(15);
    check::<kquants::Q2_K>(&mut rng);
    check::<kquants::Q3_K>(&mut rng);
    check::<kquants::Q4_K>(&mut rng);
    check::<kquants::Q5_K>(&mut rng);
    check::<kquants::Q6_K>(&mut rng);
}
