//! Storage (SPEC §8): codes written one per byte, or packed into u8/u32 words along an axis,
//! first value in the least significant bits, each line along the axis padded on its own.
//!
//! The kernels walk the tensor in "segments": runs of consecutive elements in one row that share
//! one scale. Parallel tasks own disjoint ranges of the output, so no locking is needed.

use rayon::prelude::*;

use crate::calibrate::MIN_TASK_ELEMS;
use crate::codec::{field_is_valid, Encode};
use crate::error::{QuantError, Result};
use crate::layout::Layout;

/// Codes are produced and consumed in stack buffers of this many values.
const BUF: usize = 2048;

/// Read-only value storage.
#[derive(Debug, Clone, Copy)]
pub enum Storage<'a> {
    /// int8 (as bytes) or uint8.
    U8(&'a [u8]),
    U32(&'a [u32]),
}

/// Writable value storage.
#[derive(Debug)]
pub enum StorageMut<'a> {
    U8(&'a mut [u8]),
    U32(&'a mut [u32]),
}

/// A storage word.
pub trait Word: Copy + Send + Sync + Default {
    fn from_u32(v: u32) -> Self;
    fn to_u32(self) -> u32;
}

impl Word for u8 {
    #[inline(always)]
    fn from_u32(v: u32) -> Self {
        v as u8
    }
    #[inline(always)]
    fn to_u32(self) -> u32 {
        self as u32
    }
}

impl Word for u32 {
    #[inline(always)]
    fn from_u32(v: u32) -> Self {
        v
    }
    #[inline(always)]
    fn to_u32(self) -> u32 {
        self
    }
}

/// Calls `f(pos, len, scale_index)` for each run of `[start, start + len)` (flat, C order) that
/// lies in one row and one block.
#[inline]
pub fn for_each_segment(
    layout: &Layout,
    start: usize,
    len: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let n = layout.row_len();
    let bc = layout.block_cols();
    let end = start + len;
    let mut pos = start;
    while pos < end {
        let row = pos / n;
        let row_start = row * n;
        let row_end = end.min(row_start + n);
        let grid_row = layout.grid_row_offset(row);
        while pos < row_end {
            let k = (pos - row_start) / bc;
            let seg_end = row_end.min(row_start + (k + 1) * bc);
            f(pos, seg_end - pos, grid_row + k);
            pos = seg_end;
        }
    }
}

/// Encode one run against one scale; returns whether any input was non-finite.
#[inline(always)]
fn encode_run<C: Encode>(codec: C, xs: &[f32], e: f32, out: &mut [u8]) -> bool {
    let mut bad = 0u32;
    if e == 0.0 {
        // Zero rule: nothing to divide by, every code is 0.
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = 0;
            bad |= non_finite(x);
        }
    } else {
        for (o, &x) in out.iter_mut().zip(xs) {
            // A true division, not a reciprocal multiply: SPEC §6 pins the bits on it.
            *o = codec.encode(x / e);
            bad |= non_finite(x);
        }
    }
    bad != 0
}

#[inline(always)]
fn non_finite(x: f32) -> u32 {
    ((x.to_bits() & 0x7F80_0000) == 0x7F80_0000) as u32
}

/// Codes of the flat range `[start, start + out.len())`.
#[inline]
fn encode_range<C: Encode>(
    codec: C,
    x: &[f32],
    layout: &Layout,
    effective: &[f32],
    start: usize,
    out: &mut [u8],
) -> bool {
    let mut bad = false;
    for_each_segment(layout, start, out.len(), |pos, len, s| {
        let o = pos - start;
        bad |= encode_run(codec, &x[pos..pos + len], effective[s], &mut out[o..o + len]);
    });
    bad
}

/// Quantize all of `x` into `out`; returns whether any input was non-finite.
pub fn encode_into<C: Encode>(
    codec: C,
    x: &[f32],
    layout: &Layout,
    effective: &[f32],
    out: StorageMut<'_>,
) -> bool {
    let p = &layout.packing;
    match out {
        StorageMut::U8(out) if p.per == 1 => out
            .par_chunks_mut(MIN_TASK_ELEMS)
            .enumerate()
            .map(|(ci, chunk)| encode_range(codec, x, layout, effective, ci * MIN_TASK_ELEMS, chunk))
            .reduce(|| false, |a, b| a | b),
        StorageMut::U8(out) => pack_words(codec, x, layout, effective, out),
        StorageMut::U32(out) => pack_words(codec, x, layout, effective, out),
    }
}

fn pack_words<C: Encode, W: Word>(
    codec: C,
    x: &[f32],
    layout: &Layout,
    effective: &[f32],
    out: &mut [W],
) -> bool {
    let p = &layout.packing;
    let (per, nw, inner, n_axis) = (p.per, p.words_axis, p.inner, p.n_axis);
    let bits = p.field_bits;
    let mask = p.field_mask();
    let words_per_task = (MIN_TASK_ELEMS / per).max(1);
    if out.is_empty() {
        return false;
    }
    out.par_chunks_mut(words_per_task)
        .enumerate()
        .map(|(ci, words)| {
            let mut codes = [0u8; BUF];
            let mut bad = false;
            let w0 = ci * words_per_task;
            if inner == 1 {
                // Packed along the last axis: a word's values are consecutive in memory.
                let mut w = w0;
                let w_end = w0 + words.len();
                while w < w_end {
                    let (line, wi) = (w / nw, w % nw);
                    let take = (w_end - w).min(nw - wi).min(BUF / per);
                    let e0 = line * n_axis + wi * per;
                    let e1 = (line * n_axis + (wi + take) * per).min((line + 1) * n_axis);
                    let buf = &mut codes[..e1 - e0];
                    bad |= encode_range(codec, x, layout, effective, e0, buf);
                    for (j, word) in words[w - w0..w - w0 + take].iter_mut().enumerate() {
                        let fields = &buf[(j * per).min(buf.len())..((j + 1) * per).min(buf.len())];
                        let mut acc = 0u32;
                        for (t, &c) in fields.iter().enumerate() {
                            acc |= (c as u32 & mask) << (t as u32 * bits);
                        }
                        *word = W::from_u32(acc);
                    }
                    w += take;
                }
            } else {
                // Packed along an outer axis: field t of word (o, wi, i) is element
                // (o, wi·per + t, i); runs over i are contiguous.
                let mut w = w0;
                let w_end = w0 + words.len();
                while w < w_end {
                    let group = w / inner;
                    let i0 = w % inner;
                    let take = (w_end - w).min(inner - i0).min(BUF);
                    let (o, wi) = (group / nw, group % nw);
                    let dst = &mut words[w - w0..w - w0 + take];
                    dst.iter_mut().for_each(|d| *d = W::default());
                    let count = per.min(n_axis - wi * per);
                    for t in 0..count {
                        let e0 = (o * n_axis + wi * per + t) * inner + i0;
                        let buf = &mut codes[..take];
                        bad |= encode_range(codec, x, layout, effective, e0, buf);
                        let shift = t as u32 * bits;
                        for (d, &c) in dst.iter_mut().zip(buf.iter()) {
                            *d = W::from_u32(d.to_u32() | ((c as u32 & mask) << shift));
                        }
                    }
                    w += take;
                }
            }
            bad
        })
        .reduce(|| false, |a, b| a | b)
}

/// Decode a flat range's codes (given in `codes`) against their scales into `out`.
#[inline]
fn decode_range(table: &[f32], layout: &Layout, effective: &[f32], start: usize, codes: &[u8], out: &mut [f32]) {
    for_each_segment(layout, start, out.len(), |pos, len, s| {
        let e = effective[s];
        let o = pos - start;
        for (y, &c) in out[o..o + len].iter_mut().zip(&codes[o..o + len]) {
            *y = table[c as usize] * e;
        }
    });
}

/// Dequantize every value of `storage` into `out`.
pub fn decode_into(table: &[f32], layout: &Layout, storage: Storage<'_>, effective: &[f32], out: &mut [f32]) {
    match storage {
        Storage::U8(codes) if layout.packing.per == 1 => {
            out.par_chunks_mut(MIN_TASK_ELEMS)
                .enumerate()
                .for_each(|(ci, chunk)| {
                    let start = ci * MIN_TASK_ELEMS;
                    decode_range(table, layout, effective, start, &codes[start..start + chunk.len()], chunk)
                });
        }
        Storage::U8(words) => unpack_words(table, layout, words, effective, out),
        Storage::U32(words) => unpack_words(table, layout, words, effective, out),
    }
}

fn unpack_words<W: Word>(table: &[f32], layout: &Layout, words: &[W], effective: &[f32], out: &mut [f32]) {
    let p = &layout.packing;
    let (per, nw, inner, n_axis) = (p.per, p.words_axis, p.inner, p.n_axis);
    let bits = p.field_bits;
    let mask = p.field_mask();
    if out.is_empty() {
        return;
    }
    if inner == 1 {
        // Packed along the last axis: tasks are whole lines, or pieces of one long line.
        let line_len = n_axis;
        let lines_per_task = (MIN_TASK_ELEMS / line_len.max(1)).max(1);
        let elems_per_task = if line_len >= MIN_TASK_ELEMS {
            MIN_TASK_ELEMS
        } else {
            lines_per_task * line_len
        };
        out.par_chunks_mut(elems_per_task)
            .enumerate()
            .for_each(|(ci, chunk)| {
                let mut codes = [0u8; BUF];
                let start = ci * elems_per_task;
                let mut pos = start;
                let end = start + chunk.len();
                while pos < end {
                    let (line, col) = (pos / line_len, pos % line_len);
                    let take = (end - pos).min(line_len - col).min(BUF);
                    let w0 = line * nw;
                    for (j, c) in codes[..take].iter_mut().enumerate() {
                        let f = col + j;
                        let word = words[w0 + f / per].to_u32();
                        *c = ((word >> ((f % per) as u32 * bits)) & mask) as u8;
                    }
                    let o = pos - start;
                    decode_range(table, layout, effective, pos, &codes[..take], &mut chunk[o..o + take]);
                    pos += take;
                }
            });
    } else {
        // Packed along an outer axis: one task per outer index, words grouped as (wi, i).
        out.par_chunks_mut(n_axis * inner)
            .enumerate()
            .for_each(|(o, slab)| {
                let mut codes = [0u8; BUF];
                for j in 0..n_axis {
                    let (wi, t) = (j / per, j % per);
                    let shift = t as u32 * bits;
                    let wbase = (o * nw + wi) * inner;
                    let mut i0 = 0;
                    while i0 < inner {
                        let take = (inner - i0).min(BUF);
                        for (k, c) in codes[..take].iter_mut().enumerate() {
                            *c = ((words[wbase + i0 + k].to_u32() >> shift) & mask) as u8;
                        }
                        let pos = (o * n_axis + j) * inner + i0;
                        let dst = &mut slab[j * inner + i0..j * inner + i0 + take];
                        decode_range(table, layout, effective, pos, &codes[..take], dst);
                        i0 += take;
                    }
                }
            });
    }
}

/// Check storage taken from a caller: every field a valid code of the value, padding bits 0.
pub fn check_storage(layout: &Layout, storage: Storage<'_>) -> Result<()> {
    let p = &layout.packing;
    let value = layout.scheme.value;
    let mut valid = [false; 256];
    for (f, v) in valid.iter_mut().enumerate().take(1 << p.field_bits.min(8)) {
        *v = field_is_valid(value, p, f as u32);
    }
    let check = |index: usize, word: u32| -> Result<()> {
        // Which fields of this word hold values (the last word of a line may be partly padding).
        let wi = (index / p.inner) % p.words_axis;
        let used = p.per.min(p.n_axis - wi * p.per);
        for t in 0..p.per {
            let field = (word >> (t as u32 * p.field_bits)) & p.field_mask();
            if t < used && !valid[field as usize] {
                return Err(QuantError::Layout(format!(
                    "stored word {index} holds {field:#x}, which is not a code of {value} (field {t})"
                )));
            }
            if t >= used && field != 0 {
                return Err(QuantError::Layout(format!(
                    "stored word {index} has non-zero padding bits in field {t}"
                )));
            }
        }
        Ok(())
    };
    match storage {
        Storage::U8(ws) => ws.iter().enumerate().try_for_each(|(i, &w)| check(i, w as u32)),
        Storage::U32(ws) => ws.iter().enumerate().try_for_each(|(i, &w)| check(i, w)),
    }
}
