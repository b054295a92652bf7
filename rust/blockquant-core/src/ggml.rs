//! ggml's block types, bit for bit: the tensor formats llama.cpp keeps in GGUF files.
//!
//! The rules are gguf-py's (`gguf.quants`), whose bytes are ggml's C reference quantizers' for
//! these types. They are not blockquant's own (SPEC §3–§5): Q8_0 multiplies by 1/d with the
//! unrounded d = amax/127 and stores f16(d) afterwards; Q4_0/Q5_0 take a signed scale that maps
//! the block's largest-magnitude value to the most negative code; Q4_1/Q5_1 carry the block
//! minimum; MXFP4 takes the OCP scale from a float32 `log2` and rounds ties toward the smaller
//! magnitude. Each value goes through the same f32 operations in the same order as gguf-py's
//! numpy code (no fused multiply-add, no reassociation), so the bytes agree exactly.
//!
//! Two corners follow gguf-py's numpy arithmetic on x86-64 rather than a rule of ggml's own:
//! a code whose f32 value is NaN or out of range (only in a block whose 1/d overflows, i.e. a
//! block of tiny subnormals) is numpy's cast, the low byte of `cvttss2si`; and the sign of a
//! zero block minimum or maximum (Q4_1/Q5_1) is the one numpy's vectorized reduction returns.
//!
//! A tensor is rows of `row_len` values, each a whole number of blocks, so in memory it is one
//! run of blocks: the kernels work on runs of blocks, split across the bounded pool.

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::error::{QuantError, Result};
use crate::input::Input;
use crate::pool;
use crate::simd::avx2_dispatch;

// The types whose quantizers are blockquant's own searches (gguf-py only dequantizes them).
mod codebook;
mod kquants;
mod search;

/// A ggml tensor type this module reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    MXFP4,
    TQ1_0,
    TQ2_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    NVFP4,
}

impl GgmlType {
    /// Every type, pass-through ones first.
    pub const ALL: [Self; 19] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::MXFP4,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::IQ4_NL,
        Self::IQ4_XS,
        Self::NVFP4,
    ];

    /// ggml's name (`GGMLQuantizationType.name` in gguf-py).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q8_0 => "Q8_0",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::MXFP4 => "MXFP4",
            Self::TQ1_0 => "TQ1_0",
            Self::TQ2_0 => "TQ2_0",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ4_XS => "IQ4_XS",
            Self::NVFP4 => "NVFP4",
        }
    }

    /// The type of ggml's name (exact spelling), if it is one of these.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The number GGUF files store for the type (`enum ggml_type`).
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::BF16 => 30,
            Self::TQ1_0 => 34,
            Self::TQ2_0 => 35,
            Self::MXFP4 => 39,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::IQ4_NL => 20,
            Self::IQ4_XS => 23,
            Self::NVFP4 => 40,
        }
    }

    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// Values per block (1 for the float types).
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::TQ1_0 | Self::TQ2_0 => 256,
            Self::Q2_K | Self::Q3_K | Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::IQ4_XS => 256,
            Self::NVFP4 => 64,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q8_0 => 34,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::MXFP4 => 17,
            Self::TQ1_0 => 54,
            Self::TQ2_0 => 66,
            Self::Q2_K => 84,
            Self::Q3_K => 110,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::IQ4_NL => 18,
            Self::IQ4_XS => 136,
            Self::NVFP4 => 36,
        }
    }

    /// Bytes of a row of `row_len` values; a `LayoutError` when the row is not whole blocks.
    pub fn row_bytes(self, row_len: usize) -> Result<usize> {
        let bs = self.block_size();
        if row_len % bs != 0 {
            return Err(QuantError::Layout(format!(
                "a row of {row_len} values is not a whole number of {} blocks of {bs}",
                self.name()
            )));
        }
        Ok(row_len / bs * self.type_size())
    }

    /// Values in a row of `row_bytes` bytes; a `LayoutError` when they are not whole blocks.
    pub fn row_len(self, row_bytes: usize) -> Result<usize> {
        let ts = self.type_size();
        if row_bytes % ts != 0 {
            return Err(QuantError::Layout(format!(
                "a row of {row_bytes} bytes is not a whole number of {} blocks of {ts} bytes",
                self.name()
            )));
        }
        Ok(row_bytes / ts * self.block_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Quantize `x` (rows of `row_len` values, C order) to `ty`'s blocks in `out`
/// (`x.len() / row_len` rows of [`GgmlType::row_bytes`] bytes). A row that is not whole blocks
/// is a `Layout` error, a NaN or infinity a `NonFinite` one naming the first (`out` is then
/// unspecified). Runs in the bounded pool.
///
/// # Panics
/// When `out` does not have the length the rows need.
pub fn quantize(ty: GgmlType, x: Input<'_>, row_len: usize, out: &mut [u8]) -> Result<()> {
    ty.row_bytes(row_len)?;
    if x.len() % ty.block_size() != 0 {
        return Err(QuantError::Layout(format!(
            "{} values are not whole rows of {row_len}",
            x.len()
        )));
    }
    assert_eq!(
        out.len(),
        x.len() / ty.block_size() * ty.type_size(),
        "output length"
    );
    let bad = pool::install(|| match ty {
        GgmlType::F32 => encode_all::<F32>(x, out),
        GgmlType::F16 => match x {
            // gguf-py casts float64 to float16 directly, not through float32.
            Input::F64(x64) => encode_f16_from_f64(x64, out),
            _ => encode_f16(x, out),
        },
        GgmlType::BF16 => encode_all::<BF16>(x, out),
        GgmlType::Q8_0 => encode_all::<Q8_0>(x, out),
        GgmlType::Q4_0 => encode_all::<Q4_0>(x, out),
        GgmlType::Q4_1 => encode_all::<Q4_1>(x, out),
        GgmlType::Q5_0 => encode_all::<Q5_0>(x, out),
        GgmlType::Q5_1 => encode_all::<Q5_1>(x, out),
        GgmlType::MXFP4 => encode_all::<MXFP4>(x, out),
        GgmlType::TQ1_0 => encode_all::<TQ1_0>(x, out),
        GgmlType::TQ2_0 => encode_all::<TQ2_0>(x, out),
        GgmlType::Q2_K => encode_all::<kquants::Q2_K>(x, out),
        GgmlType::Q3_K => encode_all::<kquants::Q3_K>(x, out),
        GgmlType::Q4_K => encode_all::<kquants::Q4_K>(x, out),
        GgmlType::Q5_K => encode_all::<kquants::Q5_K>(x, out),
        GgmlType::Q6_K => encode_all::<kquants::Q6_K>(x, out),
        GgmlType::IQ4_NL => encode_all::<codebook::IQ4_NL>(x, out),
        GgmlType::IQ4_XS => encode_all::<codebook::IQ4_XS>(x, out),
        GgmlType::NVFP4 => encode_all::<codebook::NVFP4>(x, out),
    });
    if bad {
        return Err(first_non_finite(x));
    }
    Ok(())
}

/// Dequantize `blocks` (whole blocks of `ty`) into `out` (`block_size` values a block). Every
/// byte pattern decodes (a NaN or infinite scale gives NaN or infinite values, as in gguf-py).
/// Runs in the bounded pool.
///
/// # Panics
/// When `blocks` is not whole blocks or `out` has the wrong length.
pub fn dequantize(ty: GgmlType, blocks: &[u8], out: &mut [f32]) {
    assert_eq!(blocks.len() % ty.type_size(), 0, "whole blocks");
    assert_eq!(
        out.len(),
        blocks.len() / ty.type_size() * ty.block_size(),
        "output length"
    );
    pool::install(|| match ty {
        GgmlType::F32 => decode_all::<F32>(blocks, out),
        GgmlType::F16 => decode_all::<F16>(blocks, out),
        GgmlType::BF16 => decode_all::<BF16>(blocks, out),
        GgmlType::Q8_0 => decode_all::<Q8_0>(blocks, out),
        GgmlType::Q4_0 => decode_all::<Q4_0>(blocks, out),
        GgmlType::Q4_1 => decode_all::<Q4_1>(blocks, out),
        GgmlType::Q5_0 => decode_all::<Q5_0>(blocks, out),
        GgmlType::Q5_1 => decode_all::<Q5_1>(blocks, out),
        GgmlType::MXFP4 => decode_all::<MXFP4>(blocks, out),
        GgmlType::TQ1_0 => decode_all::<TQ1_0>(blocks, out),
        GgmlType::TQ2_0 => decode_all::<TQ2_0>(blocks, out),
        GgmlType::Q2_K => decode_all::<kquants::Q2_K>(blocks, out),
        GgmlType::Q3_K => decode_all::<kquants::Q3_K>(blocks, out),
        GgmlType::Q4_K => decode_all::<kquants::Q4_K>(blocks, out),
        GgmlType::Q5_K => decode_all::<kquants::Q5_K>(blocks, out),
        GgmlType::Q6_K => decode_all::<kquants::Q6_K>(blocks, out),
        GgmlType::IQ4_NL => decode_all::<codebook::IQ4_NL>(blocks, out),
        GgmlType::IQ4_XS => decode_all::<codebook::IQ4_XS>(blocks, out),
        GgmlType::NVFP4 => decode_all::<codebook::NVFP4>(blocks, out),
    })
}

fn first_non_finite(x: Input<'_>) -> QuantError {
    const STEP: usize = 1 << 14;
    let mut buf = Vec::new();
    for start in (0..x.len()).step_by(STEP) {
        let len = STEP.min(x.len() - start);
        let chunk = x.read(start, len, &mut buf);
        if let Some(i) = chunk.iter().position(|v| !v.is_finite()) {
            return QuantError::NonFinite {
                index: start + i,
                value: chunk[i],
            };
        }
    }
    unreachable!("a non-finite value was seen")
}

// ---------------------------------------------------------------------------------------------
// The drivers: runs of blocks on the pool, each run compiled once portably and once for AVX2.

/// Values per task: small tensors stay on one thread.
const TASK_VALUES: usize = 1 << 16;

/// One ggml block type: `BS` values ↔ `TS` bytes.
trait Block: Copy + Default + Send + Sync {
    const BS: usize;
    const TS: usize;
    /// Quantize one block; true when it holds a NaN or infinity (`out` is then unspecified).
    fn encode(x: &[f32], out: &mut [u8]) -> bool;
    /// Quantize [`GROUP`] blocks. A type whose per-block scale arithmetic (divisions, scale
    /// conversion) is a long dependency chain does it for the group at once, in vector lanes.
    #[inline(always)]
    fn encode_group(x: &[f32], out: &mut [u8]) -> bool {
        let mut bad = false;
        // An opaque trip count: unrolled, the blocks get vectorized across one another (one
        // lane a block, every value gathered and scattered one at a time).
        for g in 0..std::hint::black_box(GROUP) {
            let o = &mut out[g * Self::TS..(g + 1) * Self::TS];
            bad |= Self::encode(&x[g * Self::BS..(g + 1) * Self::BS], o);
        }
        bad
    }
    /// Dequantize one block.
    fn decode(b: &[u8], out: &mut [f32]);
}

fn encode_all<B: Block>(x: Input<'_>, out: &mut [u8]) -> bool {
    let blocks_per_task = (TASK_VALUES / B::BS).max(1);
    out.par_chunks_mut(blocks_per_task * B::TS)
        .enumerate()
        .map_init(Vec::new, |buf, (t, o)| {
            let start = t * blocks_per_task * B::BS;
            let xs = x.read(start, o.len() / B::TS * B::BS, buf);
            encode_run(B::default(), xs, o)
        })
        .reduce(|| false, |a, b| a | b)
}

avx2_dispatch! {
    // `block` only names the type for the macro's call.
    fn encode_run[B: Block](block: B, xs: &[f32], out: &mut [u8]) -> bool => encode_run_portable;
}

#[inline(always)]
fn encode_run_portable<B: Block>(_: B, xs: &[f32], out: &mut [u8]) -> bool {
    let mut bad = false;
    let groups = xs.len() / (GROUP * B::BS);
    let (xg, x_rest) = xs.split_at(groups * GROUP * B::BS);
    let (og, o_rest) = out.split_at_mut(groups * GROUP * B::TS);
    for (x, o) in xg
        .chunks_exact(GROUP * B::BS)
        .zip(og.chunks_exact_mut(GROUP * B::TS))
    {
        prefetch(x.as_ptr().wrapping_add(PREFETCH_AHEAD), GROUP * B::BS);
        bad |= B::encode_group(x, o);
    }
    for (x, o) in x_rest
        .chunks_exact(B::BS)
        .zip(o_rest.chunks_exact_mut(B::TS))
    {
        bad |= B::encode(x, o);
    }
    bad
}

/// Blocks a [`Block::encode_group`] call takes: eight f32 lanes of AVX2.
const GROUP: usize = 8;

/// How far ahead of the group being quantized its input is fetched into cache, in values.
/// The quantizers read much more than they write, and on one thread the hardware prefetcher
/// alone leaves them waiting on memory.
const PREFETCH_AHEAD: usize = 2048;

/// Ask for the cache lines of `len` f32 values from `p` (which may lie past the end of the
/// input: a prefetch never faults).
#[inline(always)]
fn prefetch(p: *const f32, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..len).step_by(16) {
        // SAFETY: _mm_prefetch only hints the cache (SSE, in every x86-64 CPU); it reads
        // nothing and never faults, whatever the address. The pointer is not dereferenced.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(i) as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

fn decode_all<B: Block>(blocks: &[u8], out: &mut [f32]) {
    let blocks_per_task = (TASK_VALUES / B::BS).max(1);
    out.par_chunks_mut(blocks_per_task * B::BS)
        .zip(blocks.par_chunks(blocks_per_task * B::TS))
        .for_each(|(o, b)| decode_run(B::default(), b, o));
}

avx2_dispatch! {
    fn decode_run[B: Block](block: B, blocks: &[u8], out: &mut [f32]) => decode_run_portable;
}

#[inline(always)]
fn decode_run_portable<B: Block>(_: B, blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(B::TS).zip(out.chunks_exact_mut(B::BS)) {
        if B::BS == 1 {
            B::decode(b, o);
        } else {
            // An opaque block: a block's loops are fully unrolled, and LLVM would then
            // vectorize the loop over blocks, one lane a block, shuffling every value.
            B::decode(std::hint::black_box(b), o);
        }
    }
}

/// F16 output: `half` converts a slice at a time with F16C where the CPU has it (one
/// instruction for eight values; the same rounding to nearest even as numpy's cast).
fn encode_f16(x: Input<'_>, out: &mut [u8]) -> bool {
    use half::slice::HalfFloatSliceExt;
    out.par_chunks_mut(TASK_VALUES * 2)
        .enumerate()
        .map_init(Vec::new, |buf, (t, o)| {
            let xs = x.read(t * TASK_VALUES, o.len() / 2, buf);
            let mut bad = false;
            let mut h = [half::f16::ZERO; 1024];
            for (xc, oc) in xs.chunks(1024).zip(o.chunks_mut(2048)) {
                bad |= xc.iter().fold(0, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF)) >= INF_BITS;
                let h = &mut h[..xc.len()];
                h.convert_from_f32_slice(xc);
                for (b, v) in oc.chunks_exact_mut(2).zip(h.iter()) {
                    b.copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
            bad
        })
        .reduce(|| false, |a, b| a | b)
}

/// float64 → float16 for F16 output (the other inputs go through [`F16`] via f32, which is
/// exact for float16/bfloat16 input and is what numpy does for float32).
fn encode_f16_from_f64(x: &[f64], out: &mut [u8]) -> bool {
    out.par_chunks_mut(TASK_VALUES * 2)
        .zip(x.par_chunks(TASK_VALUES))
        .map(|(o, xs)| {
            let mut bad = false;
            for (&v, o) in xs.iter().zip(o.chunks_exact_mut(2)) {
                // Non-finite as the other types see it: after the cast to f32.
                bad |= !(v as f32).is_finite();
                o.copy_from_slice(&f64_to_f16_bits(v).to_le_bytes());
            }
            bad
        })
        .reduce(|| false, |a, b| a | b)
}

// ---------------------------------------------------------------------------------------------
// Arithmetic shared by the block types.

/// The bits of |x| at or above this are an infinity or NaN.
const INF_BITS: u32 = 0x7F80_0000;

/// The largest |x| of a block, as bits: for non-negative floats the order of the bits is the
/// order of the values, and an integer max sees NaN too (at or above [`INF_BITS`]).
/// Eight lanes a step, spelled out: left to itself LLVM vectorizes a group of blocks across
/// blocks (one lane a block), gathering every value with scalar inserts.
#[inline(always)]
fn abs_max_bits(x: &[f32]) -> u32 {
    let mut acc = [0u32; 8];
    for c in x.chunks_exact(8) {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = (*a).max(v.to_bits() & 0x7FFF_FFFF);
        }
    }
    acc.into_iter().fold(0, u32::max)
}

/// numpy's `astype(np.float16)`: round to nearest even.
#[inline(always)]
fn f16_bits(v: f32) -> [u8; 2] {
    f32_to_f16(v).to_le_bytes()
}

/// f32 → float16 bits, rounded to nearest even (numpy's cast; a NaN keeps its top payload bits
/// and is quieted). Branch-free integer code, so it inlines into the kernels and vectorizes
/// (`half` calls out to F16C behind a run-time check on every value).
#[inline(always)]
fn f32_to_f16(v: f32) -> u16 {
    let x = v.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let a = x & 0x7FFF_FFFF;
    // Normal results: drop 13 mantissa bits rounding to nearest even, rebias the exponent
    // (a carry out of the mantissa correctly bumps the exponent).
    let normal = ((a + 0x0FFF + ((a >> 13) & 1)) >> 13).wrapping_sub(112 << 10);
    // Subnormal results (|v| < 2^-14): adding 0.5 makes the f32 spacing 2^-24, f16's subnormal
    // step, so the f32 add rounds to nearest even and the low bits count the steps.
    let sub = (f32::from_bits(a) + 0.5)
        .to_bits()
        .wrapping_sub(0x3F00_0000);
    let nan = 0x7E00 | ((a >> 13) & 0x03FF) as u16;
    let h = if a > 0x7F80_0000 {
        nan
    } else if a >= 0x477F_F000 {
        0x7C00 // 65520 and up round to infinity (65520 is a tie, and inf's mantissa is even)
    } else if a >= 0x3880_0000 {
        normal as u16
    } else {
        sub as u16
    };
    sign | h
}

#[inline(always)]
fn f16_value(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// float16 bits → f32, exactly, a NaN keeping its payload unquieted as numpy's cast does (F16C
/// and `half` set the quiet bit). Branch-free so a run of them vectorizes.
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let em = (h & 0x7FFF) as u32;
    // Normal: rebias the exponent by 127 − 15. Inf/NaN: all-ones exponent, mantissa as is.
    // Subnormal (and zero): m × 2^-24, exact in f32.
    let normal = (em << 13) + ((127 - 15) << 23);
    let special = (em << 13) | 0x7F80_0000;
    let sub = (em as f32 * f32::from_bits(0x3380_0000)).to_bits(); // 2^-24
    let bits = if em >= 0x7C00 {
        special
    } else if em < 0x0400 {
        sub
    } else {
        normal
    };
    f32::from_bits(sign | bits)
}

/// float64 → float16 bits, rounded once to nearest even (as numpy casts; `half`'s F16C path
/// would round to f32 first, and double rounding differs on some values).
fn f64_to_f16_bits(v: f64) -> u16 {
    let sign = ((v.to_bits() >> 48) & 0x8000) as u16;
    let a = v.abs();
    if a.is_nan() {
        return sign | 0x7E00;
    }
    // 65520 is halfway between f16's largest value and the next step: a tie to even, i.e. inf.
    if a >= 65520.0 {
        return sign | 0x7C00;
    }
    if a < 2f64.powi(-14) {
        // Subnormal: multiples of 2^-24. Scaling by a power of two is exact, so the one rounding
        // is the round_ties_even; 1024 comes out as the smallest normal's bits.
        return sign | (a * 2f64.powi(24)).round_ties_even() as u16;
    }
    let e = ((a.to_bits() >> 52) as i32) - 1023; // -14..=15
    let m = (a * 2f64.powi(10 - e)).round_ties_even() as u16; // 1024..=2048
                                                              // m = 2048 carries into the exponent, as it should.
    sign | ((((e + 15) as u16) << 10) + (m - 1024))
}

/// `v` truncated toward zero, for a `v` its caller has shown to be finite and of magnitude below
/// 2^24 (each call says why). One `cvttps2dq` per eight values, where Rust's saturating `as`
/// (which must handle NaN and overflow) becomes scalar code.
#[inline(always)]
fn trunc_small(v: f32) -> i32 {
    debug_assert!(v.abs() < 16_777_216.0, "{v}");
    // SAFETY: callers pass finite values of magnitude < 2^24, inside i32's range, as
    // `to_int_unchecked` requires (debug builds check it above).
    unsafe { v.to_int_unchecked::<i32>() }
}

/// Round half away from zero (gguf-py's `np_roundf`, C's `roundf`) for a finite |v| < 2^23:
/// trunc(v ± 0.49999997), which equals `roundf` on every finite f32 (checked over all of them
/// when this was written; the tests check a sweep): the add rounds a true half up to the next
/// integer and anything less stays below it.
#[inline(always)]
fn round_away(v: f32) -> i32 {
    trunc_small(v + f32::from_bits(0x3EFF_FFFF).copysign(v))
}

/// 1/d, or 0 for d = 0 (`np.where(d == 0, 0, 1 / d)`).
#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// `np.min` / `np.max` of a 32-value block as numpy 2 computes them with AVX2: the first value
/// seeds eight lanes, values 1..=24 fold into them, the lanes fold pairwise (4 apart, 2, 1),
/// and values 25..=31 fold in one at a time; every fold is `minps`/`maxps`, which keeps the
/// second operand on equality. Only the sign of a zero result depends on this order.
#[inline(always)]
fn np_reduce32(x: &[f32], pick: impl Fn(f32, f32) -> f32) -> f32 {
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
fn min_ps(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

#[inline(always)]
fn max_ps(a: f32, b: f32) -> f32 {
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

/// Codes as the encoders compute them: i32 lanes until they are packed (narrowing early makes
/// LLVM shuffle single bytes).
type Codes = [i32; 32];

/// Element j and j + 16 share byte j: low nibble, high nibble (bits above 4 are dropped).
#[inline(always)]
fn pack_nibbles(q: &Codes, out: &mut [u8]) {
    let mut both = [0i32; 16];
    for (j, b) in both.iter_mut().enumerate() {
        *b = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
    }
    for (o, &b) in out.iter_mut().zip(&both) {
        *o = b as u8;
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

// ---------------------------------------------------------------------------------------------
// The block types.

#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct F32;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct F16;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct BF16;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct Q8_0;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct Q4_0;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct Q4_1;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct Q5_0;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct Q5_1;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct MXFP4;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct TQ1_0;
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Default)]
struct TQ2_0;

/// The float types: a "block" is one value, and a group is converted in one straight loop.
macro_rules! plain_group {
    ($to_bits:expr, $ty:ty) => {
        #[inline(always)]
        fn encode_group(x: &[f32], out: &mut [u8]) -> bool {
            let mut bits = [0 as $ty; GROUP];
            let mut m = 0u32;
            for (b, &v) in bits.iter_mut().zip(x) {
                *b = $to_bits(v);
                m = m.max(v.to_bits() & 0x7FFF_FFFF);
            }
            for (o, b) in out.chunks_exact_mut(Self::TS).zip(bits) {
                o.copy_from_slice(&b.to_le_bytes());
            }
            m >= INF_BITS
        }
    };
}

impl Block for F32 {
    const BS: usize = 1;
    const TS: usize = 4;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        out.copy_from_slice(&x[0].to_le_bytes());
        !x[0].is_finite()
    }
    plain_group!(f32::to_bits, u32);
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

impl Block for F16 {
    const BS: usize = 1;
    const TS: usize = 2;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        out.copy_from_slice(&f16_bits(x[0]));
        !x[0].is_finite()
    }
    plain_group!(f32_to_f16, u16);
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        out[0] = f16_value(b);
    }
}

/// Round to nearest even on the bits, as gguf-py (and ggml's `ggml_compute_fp32_to_bf16`) do.
impl Block for BF16 {
    const BS: usize = 1;
    const TS: usize = 2;
    #[inline(always)]
    fn encode(x: &[f32], out: &mut [u8]) -> bool {
        out.copy_from_slice(&f32_to_bf16(x[0]).to_le_bytes());
        !x[0].is_finite()
    }
    plain_group!(f32_to_bf16, u16);
    #[inline(always)]
    fn decode(b: &[u8], out: &mut [f32]) {
        out[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
    }
}

/// Round to nearest even on the bits (finite values; a NaN or infinity is refused before it is
/// written). In u32: 0x7F7F_FFFF + 0x8000 does not overflow.
#[inline(always)]
fn f32_to_bf16(v: f32) -> u16 {
    let n = v.to_bits();
    (n.wrapping_add(0x7FFF + ((n >> 16) & 1)) >> 16) as u16
}

/// d = amax/127 (f32), q = round-half-away(x × (1/d)); stored as f16(d), then 32 int8 codes.
impl Block for Q8_0 {
    const BS: usize = 32;
    const TS: usize = 34;
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
/// compares; only a block holding both +m and −m is searched in order.
#[inline(always)]
fn signed_max(x: &[f32], m: u32) -> f32 {
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

/// The largest f32 below which `floor(log2f(a))` is still the binade's own exponent k, for
/// every binade k = −149..=127 (index k + 149): a float32 log2 rounds values just below 2^(k+1)
/// up to k + 1 once its spacing there is coarse enough, and gguf-py's (numpy's float32
/// `np.log2`, correctly rounded) and ggml's `log2f` do. `u32::MAX`: it never does.
fn log2_round_up_from() -> &'static [u32; 277] {
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
fn np_floor_log2(a: f32, table: &[u32; 277]) -> i32 {
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
fn e8m0_half(e: u8) -> f32 {
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

#[cfg(test)]
mod tests {
    //! Each block type against a literal, scalar reading of gguf-py's numpy code (its f32
    //! operations one by one, numpy's cast, argmax/argmin keeping the first); the AVX2 runs
    //! against the portable ones; the float16 cast and the log2 table against direct
    //! computations. Python's tests/test_gguf.py holds the same kernels to gguf-py itself.

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
        let d = x[imax] / neg_half;
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
                        .map(|k| {
                            q[start + k * cols + m].wrapping_mul([81u8, 27, 9, 3, 1][k]) as u64
                        })
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

    /// Every type, quantized then dequantized on a run of many blocks: the AVX2 build of the
    /// runs against the portable one, bit for bit (random bytes for dequantize, NaNs included).
    #[test]
    fn avx2_runs_match_portable_runs() {
        fn check<B: Block>(ty: GgmlType, rng: &mut Rng) {
            let n = 64 * 256;
            let x: Vec<f32> = (0..n / 64).flat_map(|_| block(rng, 64)).collect();
            let nb = n / B::BS;
            let (mut a, mut b) = (vec![0u8; nb * B::TS], vec![1u8; nb * B::TS]);
            assert!(!encode_run(B::default(), &x, &mut a));
            assert!(!encode_run_portable(B::default(), &x, &mut b));
            assert_eq!(a, b, "{ty} quantize");
            let bytes: Vec<u8> = (0..nb * B::TS).map(|_| rng.byte()).collect();
            let (mut fa, mut fb) = (vec![0f32; n], vec![1f32; n]);
            decode_run(B::default(), &bytes, &mut fa);
            decode_run_portable(B::default(), &bytes, &mut fb);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fa), bits(&fb), "{ty} dequantize");
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
}
