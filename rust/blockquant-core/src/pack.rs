//! Storage (SPEC §8): codes written one per byte, or packed into u8/u32 words along an axis,
//! first value in the least significant bits, each line along the axis padded on its own.
//!
//! The kernels walk the tensor in "segments": runs of consecutive elements in one row that share
//! one scale. Parallel tasks own disjoint ranges of the output, so no locking is needed.

use rayon::prelude::*;

use crate::calibrate::MIN_TASK_ELEMS;
use crate::codec::{field_is_valid, Decode, Encode};
use crate::error::{QuantError, Result};
use crate::input::{Input, Window};
use crate::layout::Layout;
use crate::simd::avx2_dispatch;

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
    const BITS: u32;
    fn from_u32(v: u32) -> Self;
    fn to_u32(self) -> u32;
}

impl Word for u8 {
    const BITS: u32 = 8;
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
    const BITS: u32 = 32;
    #[inline(always)]
    fn from_u32(v: u32) -> Self {
        v
    }
    #[inline(always)]
    fn to_u32(self) -> u32 {
        self
    }
}

/// The runs of `[start, start + len)` (flat, C order) that lie in one row and one block, as
/// `(pos, len, scale_index)`. An iterator rather than a callback so the loop body stays in the
/// caller (and in its AVX2 build).
pub struct Segments<'a> {
    layout: &'a Layout,
    pos: usize,
    end: usize,
    row_end: usize,
    block_end: usize,
    scale: usize,
}

impl<'a> Segments<'a> {
    #[inline(always)]
    pub fn new(layout: &'a Layout, start: usize, len: usize) -> Self {
        Self {
            layout,
            pos: start,
            end: start + len,
            row_end: start, // forces a row lookup on the first step
            block_end: start,
            scale: 0,
        }
    }
}

impl Iterator for Segments<'_> {
    type Item = (usize, usize, usize);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.end {
            return None;
        }
        if self.pos >= self.row_end {
            let n = self.layout.row_len();
            let bc = self.layout.block_cols();
            let row = self.pos / n;
            let row_start = row * n;
            self.row_end = self.end.min(row_start + n);
            let k = (self.pos - row_start) / bc;
            self.block_end = row_start + (k + 1) * bc;
            self.scale = self.layout.grid_row_offset(row) + k;
        } else {
            self.block_end += self.layout.block_cols();
            self.scale += 1;
        }
        let seg_end = self.row_end.min(self.block_end);
        let item = (self.pos, seg_end - self.pos, self.scale);
        self.pos = seg_end;
        Some(item)
    }
}

/// Effective scales for part of the grid: grid scale `i` is `scales[i - base]`. Lets a kernel
/// run on a piece of the tensor whose scales were just computed into a piece-sized buffer.
#[derive(Debug, Clone, Copy)]
pub struct ScaleSlice<'a> {
    pub scales: &'a [f32],
    pub base: usize,
}

impl<'a> ScaleSlice<'a> {
    /// The whole grid.
    pub fn all(scales: &'a [f32]) -> Self {
        Self { scales, base: 0 }
    }

    #[inline(always)]
    fn get(&self, i: usize) -> f32 {
        self.scales[i - self.base]
    }
}

/// Pack consecutive codes into words, `per` fields per word, the first in the low bits; a last
/// partial word gets zero padding. Eight codes at a time are squeezed together with shifts and
/// masks inside one u64 (SWAR), which is little-endian bytes of the words either way.
#[inline]
fn pack_fields<W: Word>(codes: &[u8], words: &mut [W], per: usize) {
    let bits = (W::BITS as usize) / per;
    if bits == 8 && W::BITS == 8 {
        words
            .iter_mut()
            .zip(codes)
            .for_each(|(w, &c)| *w = W::from_u32(c as u32));
        return;
    }
    let mask = ((1u16 << bits) - 1) as u8;
    let mut bytes = [0u8; BUF + 8];
    let full = codes.len() / 8;
    for (i, c8) in codes.chunks_exact(8).enumerate() {
        let x = u64::from_le_bytes(c8.try_into().expect("8 codes"));
        let v = squeeze8(x, bits);
        bytes[i * bits..(i + 1) * bits].copy_from_slice(&v.to_le_bytes()[..bits]);
    }
    let mut bit = full * 8 * bits;
    for &c in &codes[full * 8..] {
        bytes[bit / 8] |= (c & mask) << (bit % 8);
        bit += bits;
    }
    let wb = W::BITS as usize / 8;
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(wb)) {
        let mut v = 0u32;
        for (k, &byte) in b.iter().enumerate() {
            v |= (byte as u32) << (8 * k);
        }
        *w = W::from_u32(v);
    }
}

/// Eight byte-wide fields of `x` (low `bits` of each kept) packed into the low 8·bits bits.
#[inline(always)]
fn squeeze8(x: u64, bits: usize) -> u64 {
    match bits {
        8 => x,
        4 => {
            let x = x & 0x0F0F_0F0F_0F0F_0F0F;
            let x = (x | (x >> 4)) & 0x00FF_00FF_00FF_00FF;
            let x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
            (x | (x >> 16)) & 0xFFFF_FFFF
        }
        2 => {
            let x = x & 0x0303_0303_0303_0303;
            let x = (x | (x >> 6)) & 0x000F_000F_000F_000F;
            let x = (x | (x >> 12)) & 0x0000_00FF_0000_00FF;
            (x | (x >> 24)) & 0xFFFF
        }
        _ => unreachable!("fields are 2, 4 or 8 bits"),
    }
}

/// The inverse of [`pack_fields`] for `codes.len()` fields of a line, starting at field `first`.
#[inline]
fn unpack_fields<W: Word>(line: &[W], first: usize, codes: &mut [u8], per: usize) {
    match per {
        1 => unpack_fields_n::<W, 1>(line, first, codes),
        2 => unpack_fields_n::<W, 2>(line, first, codes),
        4 => unpack_fields_n::<W, 4>(line, first, codes),
        8 => unpack_fields_n::<W, 8>(line, first, codes),
        16 => unpack_fields_n::<W, 16>(line, first, codes),
        _ => unreachable!("values per word is 1, 2, 4, 8 or 16"),
    }
}

#[inline(always)]
fn unpack_fields_n<W: Word, const PER: usize>(line: &[W], first: usize, codes: &mut [u8]) {
    let bits = W::BITS / PER as u32;
    let mask = if bits == 32 {
        u32::MAX
    } else {
        (1u32 << bits) - 1
    };
    let mut j = 0;
    // Head: fields up to the next word boundary.
    while j < codes.len() && (first + j) % PER != 0 {
        let f = first + j;
        codes[j] = ((line[f / PER].to_u32() >> ((f % PER) as u32 * bits)) & mask) as u8;
        j += 1;
    }
    // Whole words.
    let w0 = (first + j) / PER;
    let whole = (codes.len() - j) / PER;
    for (k, out) in codes[j..j + whole * PER].chunks_exact_mut(PER).enumerate() {
        let word = line[w0 + k].to_u32();
        for (t, c) in out.iter_mut().enumerate() {
            *c = ((word >> (t as u32 * bits)) & mask) as u8;
        }
    }
    j += whole * PER;
    // Tail.
    while j < codes.len() {
        let f = first + j;
        codes[j] = ((line[f / PER].to_u32() >> ((f % PER) as u32 * bits)) & mask) as u8;
        j += 1;
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

/// Codes of the flat range `[start, start + out.len())`; returns whether any input was
/// non-finite. Non-f32 input is converted a stack buffer at a time.
#[inline]
pub fn encode_range<C: Encode>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    effective: ScaleSlice<'_>,
    start: usize,
    out: &mut [u8],
) -> bool {
    if let Input::F32(xs) = x.input {
        return encode_range_f32(codec, xs, x.start, layout, effective, start, out);
    }
    let mut buf = [0.0f32; BUF];
    let mut bad = false;
    let mut off = 0;
    while off < out.len() {
        let take = (out.len() - off).min(BUF);
        let pos = start + off;
        x.input.convert(pos - x.start, &mut buf[..take]);
        bad |= encode_range_f32(
            codec,
            &buf[..take],
            pos,
            layout,
            effective,
            pos,
            &mut out[off..off + take],
        );
        off += take;
    }
    bad
}

avx2_dispatch! {
    /// [`encode_range`] on f32 values, `xs[0]` being element `x_start` of the tensor.
    pub fn encode_range_f32[C: Encode](
        codec: C,
        xs: &[f32],
        x_start: usize,
        layout: &Layout,
        effective: ScaleSlice<'_>,
        start: usize,
        out: &mut [u8],
    ) -> bool => encode_range_portable;
}

#[inline(always)]
fn encode_range_portable<C: Encode>(
    codec: C,
    xs: &[f32],
    x_start: usize,
    layout: &Layout,
    effective: ScaleSlice<'_>,
    start: usize,
    out: &mut [u8],
) -> bool {
    let mut bad = false;
    for (pos, len, s) in Segments::new(layout, start, out.len()) {
        let (o, i) = (pos - start, pos - x_start);
        bad |= encode_run(
            codec,
            &xs[i..i + len],
            effective.get(s),
            &mut out[o..o + len],
        );
    }
    bad
}

/// Quantize all of `x` into `out`; returns whether any input was non-finite.
pub fn encode_into<C: Encode>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    effective: &[f32],
    out: StorageMut<'_>,
) -> bool {
    let p = &layout.packing;
    let sc = ScaleSlice::all(effective);
    match out {
        StorageMut::U8(out) if p.per == 1 => out
            .par_chunks_mut(MIN_TASK_ELEMS)
            .enumerate()
            .map(|(ci, chunk)| encode_range(codec, x, layout, sc, ci * MIN_TASK_ELEMS, chunk))
            .reduce(|| false, |a, b| a | b),
        StorageMut::U8(out) => pack_words(codec, x, layout, sc, out),
        StorageMut::U32(out) => pack_words(codec, x, layout, sc, out),
    }
}

fn pack_words<C: Encode, W: Word>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    sc: ScaleSlice<'_>,
    out: &mut [W],
) -> bool {
    let words_per_task = (MIN_TASK_ELEMS / layout.packing.per).max(1);
    let last_axis = layout.packing.inner == 1;
    out.par_chunks_mut(words_per_task)
        .enumerate()
        .map(|(ci, words)| {
            let w0 = ci * words_per_task;
            if last_axis {
                encode_words_last_axis(codec, x, layout, sc, w0, words)
            } else {
                encode_words_outer_axis(codec, x, layout, sc, w0, words)
            }
        })
        .reduce(|| false, |a, b| a | b)
}

/// Fill words `[w0, w0 + words.len())` of a tensor packed along its last axis: a word's values
/// are consecutive in memory.
pub fn encode_words_last_axis<C: Encode, W: Word>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    sc: ScaleSlice<'_>,
    w0: usize,
    words: &mut [W],
) -> bool {
    let p = &layout.packing;
    let (per, nw, n_axis) = (p.per, p.words_axis, p.n_axis);
    let mut codes = [0u8; BUF];
    let mut bad = false;
    let mut w = w0;
    let w_end = w0 + words.len();
    while w < w_end {
        let (line, wi) = (w / nw, w % nw);
        let take = (w_end - w).min(nw - wi).min(BUF / per);
        let e0 = line * n_axis + wi * per;
        let e1 = (line * n_axis + (wi + take) * per).min((line + 1) * n_axis);
        let buf = &mut codes[..e1 - e0];
        bad |= encode_range(codec, x, layout, sc, e0, buf);
        pack_fields(buf, &mut words[w - w0..w - w0 + take], per);
        w += take;
    }
    bad
}

/// Fill words `[w0, w0 + words.len())` of a tensor packed along an outer axis: field t of word
/// (o, wi, i) is element (o, wi·per + t, i), and runs over i are contiguous.
fn encode_words_outer_axis<C: Encode, W: Word>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    sc: ScaleSlice<'_>,
    w0: usize,
    words: &mut [W],
) -> bool {
    let p = &layout.packing;
    let (per, nw, inner, n_axis) = (p.per, p.words_axis, p.inner, p.n_axis);
    let (bits, mask) = (p.field_bits, p.field_mask());
    let mut codes = [0u8; BUF];
    let mut bad = false;
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
            bad |= encode_range(codec, x, layout, sc, e0, buf);
            let shift = t as u32 * bits;
            for (d, &c) in dst.iter_mut().zip(buf.iter()) {
                *d = W::from_u32(d.to_u32() | ((c as u32 & mask) << shift));
            }
        }
        w += take;
    }
    bad
}

/// An output element type of dequantize: the f32 result x̂, converted as a numpy cast would.
pub trait OutElem: Copy + Send + Sync + Default {
    fn from_f32(v: f32) -> Self;
}

impl OutElem for f32 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl OutElem for f64 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
}

/// IEEE binary16 bits, rounded to nearest even (overflow gives ±inf, as numpy's cast).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct F16Bits(pub u16);

impl OutElem for F16Bits {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        F16Bits(half::f16::from_f32(v).to_bits())
    }
}

/// bfloat16 bits, rounded to nearest even (as ml_dtypes' cast).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct BF16Bits(pub u16);

impl OutElem for BF16Bits {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        BF16Bits(half::bf16::from_f32(v).to_bits())
    }
}

avx2_dispatch! {
    /// Decode a flat range's codes (given in `codes`) against their scales into `out`.
    fn decode_range[D: Decode, O: OutElem](
        dec: D,
        layout: &Layout,
        effective: &[f32],
        start: usize,
        codes: &[u8],
        out: &mut [O],
    ) => decode_range_portable;
}

#[inline(always)]
fn decode_range_portable<D: Decode, O: OutElem>(
    dec: D,
    layout: &Layout,
    effective: &[f32],
    start: usize,
    codes: &[u8],
    out: &mut [O],
) {
    for (pos, len, s) in Segments::new(layout, start, out.len()) {
        let e = effective[s];
        let o = pos - start;
        for (y, &c) in out[o..o + len].iter_mut().zip(&codes[o..o + len]) {
            *y = O::from_f32(dec.decode(c) * e);
        }
    }
}

/// Dequantize every value of `storage` into `out`.
pub fn decode_into<D: Decode, O: OutElem>(
    table: D,
    layout: &Layout,
    storage: Storage<'_>,
    effective: &[f32],
    out: &mut [O],
) {
    match storage {
        Storage::U8(codes) if layout.packing.per == 1 => {
            out.par_chunks_mut(MIN_TASK_ELEMS)
                .enumerate()
                .for_each(|(ci, chunk)| {
                    let start = ci * MIN_TASK_ELEMS;
                    decode_range(
                        table,
                        layout,
                        effective,
                        start,
                        &codes[start..start + chunk.len()],
                        chunk,
                    )
                });
        }
        Storage::U8(words) => unpack_words(table, layout, words, effective, out),
        Storage::U32(words) => unpack_words(table, layout, words, effective, out),
    }
}

fn unpack_words<W: Word, D: Decode, O: OutElem>(
    table: D,
    layout: &Layout,
    words: &[W],
    effective: &[f32],
    out: &mut [O],
) {
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
                    unpack_fields(&words[w0..w0 + nw], col, &mut codes[..take], per);
                    let o = pos - start;
                    decode_range(
                        table,
                        layout,
                        effective,
                        pos,
                        &codes[..take],
                        &mut chunk[o..o + take],
                    );
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
        Storage::U8(ws) => ws
            .iter()
            .enumerate()
            .try_for_each(|(i, &w)| check(i, w as u32)),
        Storage::U32(ws) => ws.iter().enumerate().try_for_each(|(i, &w)| check(i, w)),
    }
}
