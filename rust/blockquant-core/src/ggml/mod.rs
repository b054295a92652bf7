//! ggml's block types, bit for bit: the tensor formats llama.cpp keeps in GGUF files.
//!
//! The rules are gguf-py's (`gguf.quants`), whose bytes are ggml's C reference quantizers' for
//! these types. They are not blockquant's own (format.md "Calibration" to "Two-level schemes"): Q8_0 multiplies by 1/d with the
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
//! One corner follows ggml where gguf-py differs, ggml being the arbiter of its format's bytes:
//! an all-zero Q4_0/Q5_0 block stores d = −0 (f16 0x8000) whatever its zeros' signs, as
//! `quantize_row_q4_0_ref`/`q5_0_ref` start the signed maximum at +0.0f (gguf-py's argmax takes
//! the first value, so a first −0 gives +0 there).
//!
//! A tensor is rows of `row_len` values, each a whole number of blocks, so in memory it is one
//! run of blocks: the kernels work on runs of blocks, split across the bounded pool.

use rayon::prelude::*;

use crate::error::{QuantError, Result};
use crate::input::Input;
use crate::kernels::piece::first_non_finite;
use crate::pool;
use crate::simd::avx2_dispatch;

// The vocabulary the types and kernels below share (nothing here dispatches into them).
mod block;
mod float16;
// The types gguf-py quantizes, whose rules these follow bit for bit.
mod float;
mod legacy;
#[cfg(target_arch = "x86_64")]
mod legacy_avx2;
mod mxfp4;
mod ternary;
// The types whose quantizers are blockquant's own searches (gguf-py only dequantizes them).
mod codebook;
mod kquants;
mod search;

use block::{prefetch, Block, GROUP, PREFETCH_AHEAD, TASK_VALUES};
use float::{encode_f16, encode_f16_from_f64, BF16, F16, F32};
use legacy::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use mxfp4::MXFP4;
use ternary::{TQ1_0, TQ2_0};

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
        if !row_len.is_multiple_of(bs) {
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
        if !row_bytes.is_multiple_of(ts) {
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
    check_rows(ty, x, row_len, out)?;
    let bad = pool::install_sized(x.len(), || match ty {
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

/// [`quantize`] with importance weights, as llama-quantize takes an imatrix: `weights` holds
/// `k` rows of `row_len` values (one importance ≥ 0 per column; `k` = 1 for a matrix, one row
/// per expert for stacked experts, the rows of `x` split evenly among them), and each block is
/// quantized to the least error weighted by its columns' importance. The types whose quantizer
/// is a search take them (the K-quants, IQ4_NL/IQ4_XS, NVFP4, and Q4_0/Q4_1/Q5_0/Q5_1, whose
/// gguf-py rule becomes a search); the others ignore them, as ggml's own quantizers do. A
/// block keeps the unweighted quantizer's bytes where they leave no more weighted error, so
/// weights never make a block worse by the measure they give. Bytes do not depend on the
/// thread count. Errors as [`quantize`]'s, and an `Option` error for weights of the wrong
/// length or a NaN, infinite or negative weight.
///
/// # Panics
/// When `out` does not have the length the rows need.
pub fn quantize_weighted(
    ty: GgmlType,
    x: Input<'_>,
    row_len: usize,
    weights: &[f32],
    out: &mut [u8],
) -> Result<()> {
    check_rows(ty, x, row_len, out)?;
    let rows = x.len() / row_len.max(1);
    let k = weights.len() / row_len.max(1);
    if row_len == 0 || k == 0 || weights.len() != k * row_len || !rows.is_multiple_of(k) {
        return Err(QuantError::Option(format!(
            "importance weights must be rows of {row_len} values, one for the tensor or one \
             for each of an even split of its {rows} rows, got {} values",
            weights.len()
        )));
    }
    crate::search::check_weights(weights, weights.len())?;
    let imp = Importance {
        w: weights,
        row_len,
        rows_per: (rows / k).max(1),
    };
    let Some(run) = weighted_run(ty) else {
        return quantize(ty, x, row_len, out);
    };
    if pool::install_sized(x.len(), || run(x, &imp, out)) {
        return Err(first_non_finite(x));
    }
    Ok(())
}

/// Whether [`quantize_weighted`]'s weights steer `ty`'s quantizer.
pub fn takes_weights(ty: GgmlType) -> bool {
    weighted_run(ty).is_some()
}

type WeightedRun = fn(Input<'_>, &Importance<'_>, &mut [u8]) -> bool;

/// The weighted driver of the types whose quantizer is a search.
fn weighted_run(ty: GgmlType) -> Option<WeightedRun> {
    Some(match ty {
        GgmlType::Q4_0 => encode_all_weighted::<Q4_0>,
        GgmlType::Q4_1 => encode_all_weighted::<Q4_1>,
        GgmlType::Q5_0 => encode_all_weighted::<Q5_0>,
        GgmlType::Q5_1 => encode_all_weighted::<Q5_1>,
        GgmlType::Q2_K => encode_all_weighted::<kquants::Q2_K>,
        GgmlType::Q3_K => encode_all_weighted::<kquants::Q3_K>,
        GgmlType::Q4_K => encode_all_weighted::<kquants::Q4_K>,
        GgmlType::Q5_K => encode_all_weighted::<kquants::Q5_K>,
        GgmlType::Q6_K => encode_all_weighted::<kquants::Q6_K>,
        GgmlType::IQ4_NL => encode_all_weighted::<codebook::IQ4_NL>,
        GgmlType::IQ4_XS => encode_all_weighted::<codebook::IQ4_XS>,
        GgmlType::NVFP4 => encode_all_weighted::<codebook::NVFP4>,
        _ => return None,
    })
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
    pool::install_sized(out.len(), || match ty {
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

/// `x` is whole rows of whole blocks and `out` their length.
fn check_rows(ty: GgmlType, x: Input<'_>, row_len: usize, out: &[u8]) -> Result<()> {
    ty.row_bytes(row_len)?;
    if !x.len().is_multiple_of(ty.block_size()) {
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
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The drivers: runs of blocks on the pool, each run compiled once portably and once for AVX2.

fn encode_all<B: Block>(x: Input<'_>, out: &mut [u8]) -> bool {
    encode_tasks::<B>(x, out, |_, xs, o| encode_run_best::<B>(xs, o))
}

/// `x`'s blocks in tasks of [`TASK_VALUES`] values on the pool: `run(start, xs, out)` quantizes
/// one task's values (from flat index `start`, read as f32) into its bytes; true when any task
/// met a NaN or infinity.
fn encode_tasks<B: Block>(
    x: Input<'_>,
    out: &mut [u8],
    run: impl Fn(usize, &[f32], &mut [u8]) -> bool + Sync,
) -> bool {
    let blocks_per_task = (TASK_VALUES / B::BS).max(1);
    out.par_chunks_mut(blocks_per_task * B::TS)
        .enumerate()
        .map_init(Vec::new, |buf, (t, o)| {
            let start = t * blocks_per_task * B::BS;
            let xs = x.read(start, o.len() / B::TS * B::BS, buf);
            run(start, xs, o)
        })
        .reduce(|| false, |a, b| a | b)
}

/// The type's hand-written AVX2 run where it has one and the CPU runs it, else [`encode_run`].
fn encode_run_best<B: Block>(xs: &[f32], out: &mut [u8]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(run) = B::ENCODE_AVX2 {
        if crate::simd::has_avx2() && crate::simd::has_f16c() {
            // SAFETY: the CPU has AVX2 and F16C, checked just above.
            return unsafe { run(xs, out) };
        }
    }
    encode_run(B::default(), xs, out)
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

/// The importance rows of [`quantize_weighted`]: row r of the tensor takes row r / `rows_per`.
struct Importance<'a> {
    w: &'a [f32],
    row_len: usize,
    rows_per: usize,
}

impl Importance<'_> {
    /// The weights of the `len` values from flat index `start` (inside one row).
    fn of(&self, start: usize, len: usize) -> &[f32] {
        let (row, col) = (start / self.row_len, start % self.row_len);
        let at = row / self.rows_per * self.row_len + col;
        &self.w[at..at + len]
    }
}

/// [`encode_all`] with importance weights, one block at a time (no hand-written runs: the
/// searches are the cost here).
fn encode_all_weighted<B: Block>(x: Input<'_>, imp: &Importance<'_>, out: &mut [u8]) -> bool {
    encode_tasks::<B>(x, out, |start, xs, o| {
        let mut bad = false;
        for (i, (xb, ob)) in xs
            .chunks_exact(B::BS)
            .zip(o.chunks_exact_mut(B::TS))
            .enumerate()
        {
            bad |= encode_block_weighted::<B>(xb, imp.of(start + i * B::BS, B::BS), ob);
        }
        bad
    })
}

/// Bytes and values of the largest block (Q6_K's 210 bytes, 256 values).
const MAX_TS: usize = 256;
const MAX_BS: usize = 256;

/// One block by the weighted search and by the plain quantizer; the weighted search's bytes
/// only where they leave less weighted error as decoded.
fn encode_block_weighted<B: Block>(x: &[f32], w: &[f32], out: &mut [u8]) -> bool {
    let mut plain = [0u8; MAX_TS];
    let plain = &mut plain[..B::TS];
    if B::encode(x, plain) {
        return true;
    }
    B::encode_weighted(x, w, out);
    let mut y = [0f32; MAX_BS];
    let y = &mut y[..B::BS];
    let error = |b: &[u8], y: &mut [f32]| {
        B::decode(b, y);
        x.iter()
            .zip(y.iter())
            .zip(w)
            .fold(0.0f64, |acc, ((&v, &q), &wi)| {
                let d = v as f64 - q as f64;
                acc + wi as f64 * d * d
            })
    };
    if error(plain, y) <= error(out, y) {
        out.copy_from_slice(plain);
    }
    false
}

fn decode_all<B: Block>(blocks: &[u8], out: &mut [f32]) {
    let blocks_per_task = (TASK_VALUES / B::BS).max(1);
    #[cfg(target_arch = "x86_64")]
    let stream = out.len() * 4 >= crate::simd::x86::STREAM_MIN_BYTES;
    #[cfg(not(target_arch = "x86_64"))]
    let stream = false;
    out.par_chunks_mut(blocks_per_task * B::BS)
        .zip(blocks.par_chunks(blocks_per_task * B::TS))
        .for_each(|(o, b)| decode_run_best::<B>(b, o, stream));
}

/// The type's hand-written AVX2 run where it has one and the CPU runs it (its stores
/// non-temporal with `stream`), else [`decode_run`].
fn decode_run_best<B: Block>(blocks: &[u8], out: &mut [f32], stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if let Some(run) = B::DECODE_AVX2 {
        if crate::simd::has_avx2() && crate::simd::has_f16c() {
            // SAFETY: the CPU has AVX2 and F16C, checked just above.
            return unsafe { run(blocks, out, stream) };
        }
    }
    #[cfg(target_arch = "x86_64")]
    if stream
        && B::STREAMS
        && B::BS <= STREAM_BUF
        && crate::simd::has_avx2()
        && (out.as_ptr() as usize).is_multiple_of(16)
    {
        // SAFETY: the CPU has AVX2 (checked just above); `out` is 16-byte aligned.
        return unsafe { decode_run_streamed::<B>(blocks, out) };
    }
    let _ = stream;
    decode_run(B::default(), blocks, out)
}

/// Values a step of [`decode_run_streamed`] (4 KiB): whole blocks of every type.
#[cfg(target_arch = "x86_64")]
const STREAM_BUF: usize = 1024;

/// [`decode_run`] into a large output, for the types without a hand-written run (blocks of at
/// most [`STREAM_BUF`] values): a few blocks at a time into a buffer that stays in the
/// first-level cache, copied out with non-temporal stores (a cached store to a line not in the
/// cache reads it first).
///
/// # Safety
/// The CPU must have AVX2; `out` must be 16-byte aligned.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_run_streamed<B: Block>(blocks: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::{_mm_loadu_ps, _mm_sfence, _mm_stream_ps};
    let per = STREAM_BUF / B::BS;
    let mut buf = [0f32; STREAM_BUF];
    for (b, o) in blocks.chunks(per * B::TS).zip(out.chunks_mut(per * B::BS)) {
        let n = o.len();
        decode_run(B::default(), b, &mut buf[..n]);
        // Every chunk but the last is whole 4 KiB, so each starts 16-byte aligned.
        let whole = n / 4 * 4;
        for i in (0..whole).step_by(4) {
            _mm_stream_ps(o.as_mut_ptr().add(i), _mm_loadu_ps(buf.as_ptr().add(i)));
        }
        o[whole..].copy_from_slice(&buf[whole..n]);
    }
    // The non-temporal stores are weakly ordered: done before the task says so.
    _mm_sfence();
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

#[cfg(test)]
mod tests;
#[cfg(test)]
mod weighted_tests;
