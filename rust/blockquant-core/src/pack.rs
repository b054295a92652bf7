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

impl<'a> Storage<'a> {
    /// u32 words as their bytes when `layout.bytewise()` says that changes nothing: the layout
    /// and storage the kernels should take (see [`Layout::bytewise`]).
    pub(crate) fn bytewise(self, layout: &Layout) -> (std::borrow::Cow<'_, Layout>, Self) {
        match (self, layout.bytewise()) {
            (Storage::U32(w), Some(l)) => {
                (std::borrow::Cow::Owned(l), Storage::U8(words_as_bytes(w)))
            }
            (s, _) => (std::borrow::Cow::Borrowed(layout), s),
        }
    }
}

impl<'a> StorageMut<'a> {
    /// [`Storage::bytewise`] for storage being written.
    pub(crate) fn bytewise(self, layout: &Layout) -> (std::borrow::Cow<'_, Layout>, Self) {
        match (self, layout.bytewise()) {
            (StorageMut::U32(w), Some(l)) => (
                std::borrow::Cow::Owned(l),
                StorageMut::U8(words_as_bytes_mut(w)),
            ),
            (s, _) => (std::borrow::Cow::Borrowed(layout), s),
        }
    }
}

/// u32 words' memory seen as bytes, in memory order: on a little-endian machine, the
/// storage's bytes as SPEC §9 lays them out.
pub fn words_as_bytes(w: &[u32]) -> &[u8] {
    // SAFETY: u8 has no alignment or invalid bit patterns to meet; the same memory and
    // lifetime.
    unsafe { std::slice::from_raw_parts(w.as_ptr() as *const u8, std::mem::size_of_val(w)) }
}

/// [`words_as_bytes`] for words being written (every byte pattern is a valid u32 too).
pub fn words_as_bytes_mut(w: &mut [u32]) -> &mut [u8] {
    // SAFETY: as in `words_as_bytes`; the borrow is carried over unchanged.
    unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr() as *mut u8, std::mem::size_of_val(w)) }
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

/// The scales dequantize multiplies block `i`'s values by: `effective_scale(stored[i], global)`,
/// worked out as a kernel reaches the block. A two-level scheme's block scales b_i come with its
/// g; a one-level scheme's scales (or effective scales already worked out) with g = 1, which
/// changes none of them: s × 1 is s for every finite s in the pool's IEEE environment (no
/// flush-to-zero), and the cap at f32::MAX leaves a finite s alone. Why not an array of b_i × g
/// first: its allocation, page faults and pass cost a block-16 4-bit dequantize (NVFP4's) a
/// fifth of its time on one thread.
#[derive(Debug, Clone, Copy)]
pub struct Effective<'a> {
    stored: &'a [f32],
    global: f32,
}

impl<'a> Effective<'a> {
    /// `stored` (checked finite, as `check_stored` does), times `global` for a two-level scheme.
    pub fn new(stored: &'a [f32], global: Option<f32>) -> Self {
        Self {
            stored,
            global: global.unwrap_or(1.0),
        }
    }

    #[inline(always)]
    pub fn len(&self) -> usize {
        self.stored.len()
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.stored.is_empty()
    }

    /// Block `i`'s effective scale.
    #[inline(always)]
    pub fn get(&self, i: usize) -> f32 {
        crate::quantize::effective_scale(self.stored[i], self.global)
    }

    /// Blocks `i..i + 8`'s effective scales in vector lanes, as [`Effective::get`] gives them.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub(crate) unsafe fn get8(&self, i: usize) -> std::arch::x86_64::__m256 {
        let b = &self.stored[i..i + 8];
        let b = std::arch::x86_64::_mm256_loadu_ps(b.as_ptr());
        crate::fused_avx2::effective8(b, self.global)
    }

    /// Blocks `range` of these.
    #[inline(always)]
    pub fn range(&self, range: std::ops::Range<usize>) -> Self {
        Self {
            stored: &self.stored[range],
            global: self.global,
        }
    }

    /// Each block's effective scale, in order.
    #[inline(always)]
    pub fn iter(&self) -> impl Iterator<Item = f32> + 'a {
        let g = self.global;
        self.stored
            .iter()
            .map(move |&b| crate::quantize::effective_scale(b, g))
    }

    /// The effective scales of blocks `first..`, for a kernel that reads a plain slice: all
    /// the stored ones from `first` on when g is 1 (one call, as a one-level scheme's kernel
    /// always ran), else the next [`SCALE_CHUNK`] at most, worked out into `buf` (a loop the
    /// compiler vectorizes).
    #[inline(always)]
    pub fn chunk<'b>(&self, first: usize, buf: &'b mut [f32; SCALE_CHUNK]) -> &'b [f32]
    where
        'a: 'b,
    {
        if self.global == 1.0 {
            return &self.stored[first..];
        }
        let stored = &self.stored[first..self.stored.len().min(first + SCALE_CHUNK)];
        let g = self.global;
        for (e, &b) in buf.iter_mut().zip(stored) {
            *e = crate::quantize::effective_scale(b, g);
        }
        &buf[..stored.len()]
    }
}

/// Blocks an [`Effective::chunk`] holds.
pub const SCALE_CHUNK: usize = 64;

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
    #[cfg(target_arch = "x86_64")]
    let (codes, words) = if bits < 8 && crate::simd::has_avx2() {
        // SAFETY: the words' memory seen as bytes (u8 and u32 have no invalid bit patterns;
        // the words are little-endian, as the packed bytes are laid out), and the CPU has
        // AVX2, checked just above.
        let done = unsafe {
            let bytes = std::slice::from_raw_parts_mut(
                words.as_mut_ptr() as *mut u8,
                std::mem::size_of_val(words),
            );
            crate::simd::x86::pack_fields(codes, bytes, bits)
        };
        (&codes[done..], &mut words[done / per..])
    } else {
        (codes, words)
    };
    let mask = ((1u16 << bits) - 1) as u8;
    // 64 codes at a time (whole words for every field width) through a small zeroed buffer:
    // a call on one short row's codes (rows of 12, say) zeroes 72 bytes, not a row's worth.
    const CH: usize = 64;
    for (codes, words) in codes.chunks(CH).zip(words.chunks_mut(CH / per)) {
        let mut bytes = [0u8; CH + 8];
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
    #[cfg(target_arch = "x86_64")]
    let (first, codes) = if W::BITS as usize / per == 4
        && first.is_multiple_of(2)
        && crate::simd::has_avx2()
    {
        // SAFETY: the words' memory seen as bytes (little-endian: field f of the line is the
        // nibble f % 2 of byte f / 2), from the byte of field `first` on; the CPU has AVX2.
        let done = unsafe {
            let bytes =
                std::slice::from_raw_parts(line.as_ptr() as *const u8, std::mem::size_of_val(line));
            crate::simd::x86::unpack_nibbles(&bytes[first / 2..], codes)
        };
        (first + done, &mut codes[done..])
    } else if W::BITS as usize / per == 2 && first.is_multiple_of(4) && crate::simd::has_avx2() {
        // SAFETY: as above, 2-bit fields: field f of the line is bits 2·(f % 4) of byte f / 4.
        let done = unsafe {
            let bytes =
                std::slice::from_raw_parts(line.as_ptr() as *const u8, std::mem::size_of_val(line));
            crate::simd::x86::unpack_crumbs(&bytes[first / 4..], codes)
        };
        (first + done, &mut codes[done..])
    } else {
        (first, codes)
    };
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
    while j < codes.len() && !(first + j).is_multiple_of(PER) {
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
pub(crate) fn encode_run<C: Encode>(codec: C, xs: &[f32], e: f32, out: &mut [u8]) -> bool {
    let mut bad = 0u32;
    if e == 0.0 {
        // Zero rule: nothing to divide by, every code is the code of 0.
        let zero = codec.zero_code();
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = zero;
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

/// [`encode_range`] on f32 values, `xs[0]` being element `x_start` of the tensor: the AVX2
/// kernel when the CPU has it.
#[inline]
pub fn encode_range_f32<C: Encode>(
    codec: C,
    xs: &[f32],
    x_start: usize,
    layout: &Layout,
    effective: ScaleSlice<'_>,
    start: usize,
    out: &mut [u8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe {
            encode_range_avx2(codec, xs, x_start, layout, effective, start, out, false)
        };
    }
    encode_range_portable(codec, xs, x_start, layout, effective, start, out)
}

/// `stream`: `out` is the final storage, written with non-temporal stores (see
/// `simd::x86::encode_run`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn encode_range_avx2<C: Encode>(
    codec: C,
    xs: &[f32],
    x_start: usize,
    layout: &Layout,
    effective: ScaleSlice<'_>,
    start: usize,
    out: &mut [u8],
    stream: bool,
) -> bool {
    if layout.per_tensor {
        // One scale: the range is one run, whatever the rows' length.
        let xs = &xs[start - x_start..start - x_start + out.len()];
        return crate::simd::x86::encode_run_or_zero(codec, xs, effective.get(0), out, stream);
    }
    let bc = layout.block_cols();
    let whole_blocks = crate::fused_avx2::eight_at_a_time(bc)
        && layout.rows_map_directly()
        && layout.row_len().is_multiple_of(bc)
        && start.is_multiple_of(bc)
        && out.len().is_multiple_of(bc)
        && crate::simd::has_f16c();
    if whole_blocks {
        // Block k of the range has scale start / bc + k (as the decode's whole blocks): eight
        // blocks at a time, as the one-pass kernel encodes them.
        let k0 = start / bc - effective.base;
        let eff = &effective.scales[k0..k0 + out.len() / bc];
        let xs = &xs[start - x_start..start - x_start + out.len()];
        // SAFETY: the CPU has AVX2 (this function's) and F16C, checked just above.
        return crate::fused_avx2::encode_groups_given(codec, bc, xs, eff, out, stream);
    }
    let mut bad = false;
    for (pos, len, s) in Segments::new(layout, start, out.len()) {
        let (o, i) = (pos - start, pos - x_start);
        let (xs, out) = (&xs[i..i + len], &mut out[o..o + len]);
        if len <= 256 {
            // Short runs (blocks of a 2-D grid) follow each other in memory: ask ahead for
            // the input, as a long run does for itself.
            let ahead = xs.as_ptr().wrapping_add(crate::simd::x86::PREFETCH_AHEAD);
            crate::simd::x86::prefetch(ahead, len);
        }
        bad |= crate::simd::x86::encode_run_or_zero(codec, xs, effective.get(s), out, stream);
    }
    bad
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
    if p.swapped {
        return encode_swapped(codec, x, layout, sc, out);
    }
    match out {
        StorageMut::U8(out) if p.per == 1 => out
            .par_chunks_mut(MIN_TASK_ELEMS)
            .enumerate()
            .map(|(ci, chunk)| encode_bytes(codec, x, layout, sc, ci * MIN_TASK_ELEMS, chunk))
            .reduce(|| false, |a, b| a | b),
        StorageMut::U8(out) => pack_words(codec, x, layout, sc, out),
        StorageMut::U32(out) => pack_words(codec, x, layout, sc, out),
    }
}

/// Codes of `[start, start + out.len())` one a byte, masked to their field where the store
/// keeps sub-byte ints one a byte (burn's PackedNative Q4/Q2: −1 is 0x0F, not 0xFF).
#[inline]
pub fn encode_bytes<C: Encode>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    sc: ScaleSlice<'_>,
    start: usize,
    out: &mut [u8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Input::F32(xs) = x.input {
        // Large final storage that is not read back (masked) here: past the cache.
        let large = layout.num_elements >= crate::simd::x86::STREAM_MIN_BYTES;
        if large && !layout.packing.masks_bytes() && crate::simd::has_avx2() {
            // SAFETY: the CPU has AVX2, checked just above.
            let bad =
                unsafe { encode_range_avx2(codec, xs, x.start, layout, sc, start, out, true) };
            // SAFETY: SSE is part of x86-64. The non-temporal stores are weakly ordered: done
            // before the task says it is done.
            unsafe { std::arch::x86_64::_mm_sfence() };
            return bad;
        }
    }
    let bad = encode_range(codec, x, layout, sc, start, out);
    if layout.packing.masks_bytes() {
        let mask = layout.packing.field_mask() as u8;
        out.iter_mut().for_each(|c| *c &= mask);
    }
    bad
}

/// Packing along an outer axis (burn's swapped order): quantize in natural order into a code
/// buffer, then gather each storage line from it. Slower than the last-axis kernels by one
/// pass over a byte per value, and rare.
fn encode_swapped<C: Encode>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    sc: ScaleSlice<'_>,
    out: StorageMut<'_>,
) -> bool {
    let mut codes = vec![0u8; layout.num_elements];
    let bad = codes
        .par_chunks_mut(MIN_TASK_ELEMS)
        .enumerate()
        .map(|(ci, chunk)| encode_range(codec, x, layout, sc, ci * MIN_TASK_ELEMS, chunk))
        .reduce(|| false, |a, b| a | b);
    match out {
        StorageMut::U8(words) => pack_swapped(layout, &codes, words),
        StorageMut::U32(words) => pack_swapped(layout, &codes, words),
    }
    bad
}

/// Storage lines of burn's swapped order moved between natural order and their words together.
/// A line's elements lie `inner` apart in natural order (4 KiB and more on a weight matrix),
/// so each may sit on a page of its own: taken one line at a time, a 4096 × 4096 tensor
/// missed the TLB on nearly every element (110 ms against 5 for the last axis). Taken
/// together, consecutive lines read or write their k-th elements side by side, a page once
/// for all of them.
const LINES_TOGETHER: usize = 32;

/// Bytes from one line's codes to the next's in the buffer of lines taken together: `n` and a
/// cache line more, so that their k-th codes fall in different cache sets. At a stride of
/// 4096 (a 4096-row matrix) they all fell in one set of the 8-way L1 and evicted each other
/// on every k: two thirds of the time.
#[inline]
fn line_stride(n: usize) -> usize {
    n.next_multiple_of(64) + 64
}

/// Rows (k) ahead that [`ask_ahead`] asks for: the loop over a row's few codes leaves room for
/// only one or two misses in flight, each a page of its own.
const AHEAD: usize = 16;

/// Whether the lines start at consecutive elements (their k-th codes one run in memory).
#[inline]
fn consecutive(bases: &[usize]) -> bool {
    bases.iter().enumerate().all(|(t, &b)| b == bases[0] + t)
}

/// Ask for the cache lines of the lines' codes at natural offset `at` past each base (the
/// first and last line's: the lines taken together lie between them when consecutive).
#[inline(always)]
fn ask_ahead(codes: *const u8, bases: &[usize], at: usize) {
    #[cfg(target_arch = "x86_64")]
    for b in [bases[0], bases[bases.len() - 1]] {
        // SAFETY: a prefetch never faults and the pointer is never dereferenced (it may lie
        // past the end of the codes, hence `wrapping_add`).
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<{ _MM_HINT_T0 }>(codes.wrapping_add(b + at) as *const i8);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (codes, bases, at);
}

/// The natural offsets of the first elements of storage lines `first..first + bases.len()`.
#[inline]
fn line_bases(layout: &Layout, first: usize, bases: &mut [usize]) {
    for (t, b) in bases.iter_mut().enumerate() {
        *b = layout.line_element(first + t, 0);
    }
}

/// Storage lines `ci · lines_per_task ..` (`count` of them: task `ci`'s) in groups of
/// [`LINES_TOGETHER`]: `f(g, bases, lines, stride)` for group g, with its lines' natural bases
/// and a buffer of a line every `stride` bytes ([`line_stride`]) for their codes.
#[inline]
fn line_groups(
    layout: &Layout,
    ci: usize,
    lines_per_task: usize,
    count: usize,
    mut f: impl FnMut(usize, &[usize], &mut [u8], usize),
) {
    let stride = line_stride(layout.packing.n_axis);
    let mut lines = vec![0u8; LINES_TOGETHER * stride];
    let mut bases = [0usize; LINES_TOGETHER];
    for g in 0..count.div_ceil(LINES_TOGETHER) {
        let first = g * LINES_TOGETHER;
        let bases = &mut bases[..LINES_TOGETHER.min(count - first)];
        line_bases(layout, ci * lines_per_task + first, bases);
        f(g, bases, &mut lines, stride);
    }
}

fn pack_swapped<W: Word>(layout: &Layout, codes: &[u8], words: &mut [W]) {
    let p = &layout.packing;
    let (nw, n, per, inner) = (p.words_axis, p.n_axis, p.per, p.inner);
    if nw == 0 || words.is_empty() {
        return;
    }
    let mask = p.field_mask() as u8;
    let lines_per_task = (MIN_TASK_ELEMS / n).max(1);
    words
        .par_chunks_mut(nw * lines_per_task)
        .enumerate()
        .for_each(|(ci, chunk)| {
            let count = chunk.len() / nw;
            line_groups(
                layout,
                ci,
                lines_per_task,
                count,
                move |g, bases, lines, stride| {
                    let side_by_side = consecutive(bases);
                    for k in 0..n {
                        let row = k * inner;
                        ask_ahead(codes.as_ptr(), bases, row + AHEAD * inner);
                        if side_by_side {
                            let src = &codes[bases[0] + row..][..bases.len()];
                            for (t, &c) in src.iter().enumerate() {
                                lines[t * stride + k] = c & mask;
                            }
                        } else {
                            for (t, &b) in bases.iter().enumerate() {
                                lines[t * stride + k] = codes[b + row] & mask;
                            }
                        }
                    }
                    let group = &mut chunk[g * LINES_TOGETHER * nw..][..bases.len() * nw];
                    for (line, wl) in lines.chunks_exact(stride).zip(group.chunks_exact_mut(nw)) {
                        pack_fields(&line[..n], wl, per);
                    }
                },
            );
        });
}

fn pack_words<C: Encode, W: Word>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    sc: ScaleSlice<'_>,
    out: &mut [W],
) -> bool {
    let words_per_task = (MIN_TASK_ELEMS / layout.packing.per).max(1);
    #[cfg(target_arch = "x86_64")]
    let fill = match crate::pack2_avx2::applies(layout, &x, &sc) {
        true => crate::pack2_avx2::encode_words::<C, W>,
        false => encode_words_last_axis::<C, W>,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let fill = encode_words_last_axis::<C, W>;
    out.par_chunks_mut(words_per_task)
        .enumerate()
        .map(|(ci, words)| fill(codec, x, layout, sc, ci * words_per_task, words))
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
        let lines = ((w_end - w) / nw).min(BUF / n_axis.max(1));
        if wi == 0 && lines > 1 {
            // Short lines: the codes of several in one call, each line then packed into its
            // own words (its last one padded).
            let (e0, len) = (line * n_axis, lines * n_axis);
            bad |= encode_range(codec, x, layout, sc, e0, &mut codes[..len]);
            let mine = &mut words[w - w0..w - w0 + lines * nw];
            if n_axis < FEW {
                pack_short_lines(&codes[..len], n_axis, mine, per);
            } else {
                for (c, ws) in codes[..len]
                    .chunks_exact(n_axis)
                    .zip(mine.chunks_exact_mut(nw))
                {
                    pack_fields(c, ws, per);
                }
            }
            w += lines * nw;
            continue;
        }
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

/// Pack the codes of the flat elements `[start, start + codes.len())` of a tensor packed along
/// its last axis into its words from global word `w0` on (`words` holds just those). `start`
/// is on a word boundary of its line; a line's last word gets zero padding.
pub fn pack_last_axis<W: Word>(
    layout: &Layout,
    codes: &[u8],
    start: usize,
    w0: usize,
    words: &mut [W],
) {
    // The codes a word as a constant: one short line after another (a conv kernel's rows of
    // 3) spent most of their time in divisions by it.
    match layout.packing.per {
        1 => pack_lines::<W, 1>(layout, codes, start, w0, words),
        2 => pack_lines::<W, 2>(layout, codes, start, w0, words),
        4 => pack_lines::<W, 4>(layout, codes, start, w0, words),
        8 => pack_lines::<W, 8>(layout, codes, start, w0, words),
        16 => pack_lines::<W, 16>(layout, codes, start, w0, words),
        _ => pack_lines::<W, 0>(layout, codes, start, w0, words),
    }
}

/// [`pack_last_axis`] with `PER` codes a word (0: the layout's, not known at compile time).
#[inline(always)]
fn pack_lines<W: Word, const PER: usize>(
    layout: &Layout,
    codes: &[u8],
    start: usize,
    w0: usize,
    words: &mut [W],
) {
    let p = &layout.packing;
    let per = if PER == 0 { p.per } else { PER };
    debug_assert_eq!(per, p.per);
    let (nw, n) = (p.words_axis, p.n_axis);
    let end = start + codes.len();
    let mut pos = start;
    let (mut line, mut col) = (start / n, start % n);
    debug_assert_eq!(col % per, 0, "a piece starts on a word boundary");
    while pos < end {
        let lines = (end - pos) / n;
        if col == 0 && n < FEW && lines > 1 {
            let w = line * nw - w0;
            let (c, w) = (
                &codes[pos - start..][..lines * n],
                &mut words[w..][..lines * nw],
            );
            pack_short_lines(c, n, w, per);
            pos += lines * n;
            line += lines;
            continue;
        }
        // At most BUF codes a call: `pack_fields` squeezes them through a stack buffer.
        let take = (end.min(line * n + n) - pos).min(BUF);
        let w = line * nw + col / per - w0;
        let (c, w) = (
            &codes[pos - start..][..take],
            &mut words[w..][..take.div_ceil(per)],
        );
        if take < FEW {
            pack_few(c, w, per);
        } else {
            pack_fields(c, w, per);
        }
        pos += take;
        col += take;
        if col == n {
            (line, col) = (line + 1, 0);
        }
    }
}

/// Runs shorter than this are packed by [`pack_few`]: the short lines of a conv kernel's
/// weight (rows of 3 codes, two words), where `pack_fields`' set-up cost several times the
/// packing.
const FEW: usize = 32;

/// Whole lines of `n` codes each (`n` < [`FEW`]) into their words (`words`: `nw` a line,
/// whole). Most lines by [`squeeze_lines`], the last ones (or all, on a big-endian machine) by
/// [`pack_few`].
#[inline(always)]
fn pack_short_lines<W: Word>(codes: &[u8], n: usize, words: &mut [W], per: usize) {
    let nw = words.len() / (codes.len() / n);
    #[cfg(target_endian = "little")]
    let done = squeeze_lines(codes, n, words, nw, per);
    #[cfg(not(target_endian = "little"))]
    let done = 0;
    for (c, w) in codes
        .chunks_exact(n)
        .zip(words.chunks_exact_mut(nw))
        .skip(done)
    {
        pack_few(c, w, per);
    }
}

/// [`pack_short_lines`]' fast part: each line eight codes at a time, squeezed
/// ([`squeeze8`]) and stored as 8 bytes at the line's next byte (the words' bytes are the
/// packed stream in order, little-endian). A store runs past the line's own bytes into the
/// next line's, which that line's stores then overwrite; its bytes past the line's fields are
/// zero, so the line's last word's padding is too. Returns how many lines it packed: all but
/// the last few, whose 8-byte reads or stores would leave the slices.
#[cfg(target_endian = "little")]
#[inline(always)]
fn squeeze_lines<W: Word>(codes: &[u8], n: usize, words: &mut [W], nw: usize, per: usize) -> usize {
    let bits = W::BITS as usize / per;
    let line_bytes = nw * std::mem::size_of::<W>();
    // SAFETY: the words' memory seen as bytes (u8 and u32 have no invalid bit patterns).
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, std::mem::size_of_val(words))
    };
    let (lines, last) = eight_byte_lines(n, bits, line_bytes, codes.len(), bytes.len());
    let keep = match n % 8 {
        0 => u64::MAX,
        r => (1u64 << (8 * r)) - 1,
    };
    let (from, to) = (codes.as_ptr(), bytes.as_mut_ptr());
    for l in 0..lines {
        let (c0, b0) = (l * n, l * line_bytes);
        // A plain loop over the line's eights: an iterator's set-up, once a line of 3 codes,
        // cost more than the packing.
        let mut c = 0;
        loop {
            // SAFETY: for every line below `lines` and c up to `last`, the 8 codes read and the
            // 8 bytes stored lie within `codes` and `bytes` (`fits`).
            let x = u64::from_le(unsafe { (from.add(c0 + c) as *const u64).read_unaligned() });
            let x = if c == last { x & keep } else { x };
            let v = squeeze8(x, bits).to_le();
            // SAFETY: as above.
            unsafe { (to.add(b0 + c * bits / 8) as *mut u64).write_unaligned(v) };
            if c == last {
                break;
            }
            c += 8;
        }
    }
    lines
}

/// The inverse of [`pack_short_lines`]: whole lines of `n` fields each (`n` < [`FEW`]) from
/// their words (`nw` a line) into `codes`. Most lines by [`expand_lines`], the last ones (or
/// all, on a big-endian machine) by [`unpack_fields`].
#[inline(always)]
fn unpack_short_lines<W: Word>(words: &[W], n: usize, codes: &mut [u8], per: usize) {
    let nw = words.len() / (codes.len() / n);
    #[cfg(target_endian = "little")]
    let done = expand_lines(words, n, nw, codes, per);
    #[cfg(not(target_endian = "little"))]
    let done = 0;
    for (w, c) in words
        .chunks_exact(nw)
        .zip(codes.chunks_exact_mut(n))
        .skip(done)
    {
        unpack_fields(w, 0, c, per);
    }
}

/// [`unpack_short_lines`]' fast part: each line eight fields at a time, 8 bytes read at the
/// line's next field and spread to one code a byte ([`expand8`]), stored as 8 codes. The
/// codes past the line's end land in the next line's place, which that line's stores then
/// overwrite. Returns how many lines it unpacked: all but the last few, whose 8-byte reads or
/// stores would leave the slices.
#[cfg(target_endian = "little")]
#[inline(always)]
fn expand_lines<W: Word>(words: &[W], n: usize, nw: usize, codes: &mut [u8], per: usize) -> usize {
    let bits = W::BITS as usize / per;
    let line_bytes = nw * std::mem::size_of::<W>();
    // SAFETY: the words' memory seen as bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts(words.as_ptr() as *const u8, std::mem::size_of_val(words))
    };
    let (lines, last) = eight_byte_lines(n, bits, line_bytes, codes.len(), bytes.len());
    let (from, to) = (bytes.as_ptr(), codes.as_mut_ptr());
    for l in 0..lines {
        let (c0, b0) = (l * n, l * line_bytes);
        let mut c = 0;
        loop {
            // SAFETY: for every line below `lines` and c up to `last`, the 8 bytes read and the
            // 8 codes stored lie within `bytes` and `codes` (`fits`).
            let x = u64::from_le(unsafe {
                (from.add(b0 + c * bits / 8) as *const u64).read_unaligned()
            });
            let v = expand8(x, bits).to_le();
            // SAFETY: as above.
            unsafe { (to.add(c0 + c) as *mut u64).write_unaligned(v) };
            if c == last {
                break;
            }
            c += 8;
        }
    }
    lines
}

/// For [`squeeze_lines`] and [`expand_lines`], lines of `n` codes (one a byte, `codes_len` of
/// them) and of `line_bytes` bytes of `bits`-bit fields (`bytes_len`): where a line's last
/// eight codes start, and how many lines from the first have their 8-byte accesses there (8
/// codes, and the 8 bytes from their first field) within both.
#[cfg(target_endian = "little")]
#[inline(always)]
fn eight_byte_lines(
    n: usize,
    bits: usize,
    line_bytes: usize,
    codes_len: usize,
    bytes_len: usize,
) -> (usize, usize) {
    let last = (n - 1) / 8 * 8;
    let fits = |len: usize, from: usize, step: usize| {
        len.checked_sub(from + 8).map_or(0, |r| r / step + 1)
    };
    let lines = fits(codes_len, last, n).min(fits(bytes_len, last * bits / 8, line_bytes));
    (lines, last)
}

/// The inverse of [`squeeze8`]: the low 8·bits bits of `x` as eight fields, one a byte.
#[inline(always)]
fn expand8(x: u64, bits: usize) -> u64 {
    match bits {
        8 => x,
        4 => {
            let x = x & 0xFFFF_FFFF;
            let x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
            let x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
            (x | (x << 4)) & 0x0F0F_0F0F_0F0F_0F0F
        }
        2 => {
            let x = x & 0xFFFF;
            let x = (x | (x << 24)) & 0x0000_00FF_0000_00FF;
            let x = (x | (x << 12)) & 0x000F_000F_000F_000F;
            (x | (x << 6)) & 0x0303_0303_0303_0303
        }
        _ => unreachable!("fields are 2, 4 or 8 bits"),
    }
}

/// [`pack_fields`] for a few codes: each word's fields or-ed together in turn.
#[inline(always)]
fn pack_few<W: Word>(codes: &[u8], words: &mut [W], per: usize) {
    let bits = W::BITS as usize / per;
    let mask = u32::MAX >> (32 - bits);
    for (w, fields) in words.iter_mut().zip(codes.chunks(per)) {
        let v = fields
            .iter()
            .enumerate()
            .fold(0u32, |v, (k, &c)| v | (c as u32 & mask) << (k * bits));
        *w = W::from_u32(v);
    }
}

/// An output element type of dequantize: the f32 result x̂, converted as a numpy cast would.
pub trait OutElem: Copy + Send + Sync + Default {
    fn from_f32(v: f32) -> Self;

    /// The slice as f32 when the element type is f32 (the AVX2 kernels write only that).
    #[inline(always)]
    fn as_f32(_out: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}

impl OutElem for f32 {
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }

    #[inline(always)]
    fn as_f32(out: &mut [Self]) -> Option<&mut [f32]> {
        Some(out)
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
    fn decode_range_autovec[D: Decode, O: OutElem](
        dec: D,
        layout: &Layout,
        effective: Effective<'_>,
        start: usize,
        codes: &[u8],
        out: &mut [O],
    ) => decode_range_portable;
}

/// Decode a flat range's codes (given in `codes`) against their scales into `out`: f32 output
/// by the hand-written AVX2 kernel when the CPU has it, other types by the compiler's.
#[inline]
fn decode_range<D: Decode, O: OutElem>(
    dec: D,
    layout: &Layout,
    effective: Effective<'_>,
    start: usize,
    codes: &[u8],
    out: &mut [O],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() && crate::simd::has_f16c() {
        if let Some(out) = O::as_f32(out) {
            // SAFETY: the CPU has AVX2 and F16C, checked just above.
            return unsafe { decode_range_f32_avx2(dec, layout, effective, start, codes, out) };
        }
    }
    decode_range_autovec(dec, layout, effective, start, codes, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")] // F16C for the decoders' `decode16`
unsafe fn decode_range_f32_avx2<D: Decode>(
    dec: D,
    layout: &Layout,
    effective: Effective<'_>,
    start: usize,
    codes: &[u8],
    out: &mut [f32],
) {
    // Large output streams, but a call is one of many runs (a task's, or the packed fields'
    // codes a buffer at a time): only one of whole vectors, or a long one (`x86::stream_runs`).
    let whole = out.len().is_multiple_of(8) && (out.as_ptr() as usize).is_multiple_of(16);
    if layout.num_elements * 4 >= crate::simd::x86::STREAM_MIN_BYTES
        && crate::simd::x86::stream_runs(out.len(), whole)
    {
        decode_range_f32_avx2_with::<D, true>(dec, layout, effective, start, codes, out);
        // The non-temporal stores are weakly ordered: done before the task says it is done.
        std::arch::x86_64::_mm_sfence();
    } else {
        decode_range_f32_avx2_with::<D, false>(dec, layout, effective, start, codes, out);
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn decode_range_f32_avx2_with<D: Decode, const STREAM: bool>(
    dec: D,
    layout: &Layout,
    effective: Effective<'_>,
    start: usize,
    codes: &[u8],
    out: &mut [f32],
) {
    if layout.per_tensor {
        // One scale: the range is one run, whatever the rows' length.
        return crate::simd::x86::decode_run::<D, STREAM>(dec, codes, effective.get(0), out);
    }
    let (n, bc) = (layout.row_len(), layout.block_cols());
    if let Some(m) = crate::quantize::block_run(layout).filter(|&m| crate::fused_narrow::narrow(m))
    {
        // Short blocks back to back (blocks of 4, a conv kernel's rows of 3): eight at a time.
        if crate::fused_narrow::decode_blocks::<D, STREAM>(dec, effective, m, start, codes, out) {
            return;
        }
    } else if !STREAM
        && layout.rows_map_directly()
        && crate::fused_narrow::narrow(bc)
        && n >= 16 * bc
        && !n.is_multiple_of(bc)
    {
        // Rows ending in a partial block (blocks of 5 on rows of 4096): row by row. Not when
        // the output streams: each row's head and tail would then be 4-byte non-temporal
        // stores, partial lines a row (block 5 on 4096 x 4096: 25 -> 82 ms, measured); the
        // path below spreads the scales across rows and stores whole vectors.
        return crate::fused_narrow::decode_rows(dec, effective, bc, n, start, codes, out);
    }
    let whole_blocks =
        n.is_multiple_of(bc) && start.is_multiple_of(bc) && out.len().is_multiple_of(bc);
    let vectors = bc.is_multiple_of(8) && (!STREAM || (out.as_ptr() as usize).is_multiple_of(16));
    if bc < 8 || (n < SCALE_CHUNK && !(whole_blocks && vectors)) {
        // Blocks narrower than a vector ([rows, 1] column blocks, [4, 4], ...), or rows too
        // short for runs (a conv kernel's rows of 3, blocks cut by rows of 12): the values'
        // scales spread over them, 64 values at a time across rows, then eight values a
        // vector (streamed where every chunk is whole vectors from a 16-byte boundary).
        let (mut pos, end) = (start, start + out.len());
        let (mut row, mut col) = (pos / n, pos % n);
        // The grid offset of `row` (a loop with divisions for blocks spanning rows): once a row.
        let direct = layout.rows_map_directly();
        let row_offset = |row: usize| match direct {
            true => row * layout.grid_cols(),
            false => layout.grid_row_offset(row),
        };
        let mut first = row_offset(row);
        let mut es = [0.0f32; SCALE_CHUNK];
        while pos < end {
            let take = (end - pos).min(SCALE_CHUNK);
            let es = if bc == 1 && take <= n - col {
                // Column blocks: the values' scales are a run of the grid row.
                let es = effective
                    .range(first + col..first + col + take)
                    .chunk(0, &mut es);
                col += take;
                if col == n {
                    (row, col) = (row + 1, 0);
                    first = row_offset(row);
                }
                es
            } else {
                let (mut j, mut b, mut left) = (0, first + col / bc, bc - col % bc);
                while j < take {
                    let k = left.min(n - col).min(take - j);
                    es[j..j + k].fill(effective.get(b));
                    (j, col, left) = (j + k, col + k, left - k);
                    if col == n {
                        (row, col) = (row + 1, 0);
                        (first, left) = (row_offset(row), bc);
                        b = first;
                    } else if left == 0 {
                        (b, left) = (b + 1, bc);
                    }
                }
                &es[..take]
            };
            let r = pos - start..pos - start + take;
            let (c, y) = (&codes[r.clone()], &mut out[r]);
            // Streamed only when every store is (a run of whole vectors): see `decode_run`.
            if STREAM && (y.as_ptr() as usize).is_multiple_of(16) && take.is_multiple_of(8) {
                crate::simd::x86::decode_lanes::<D, true>(dec, c, es, y);
            } else {
                crate::simd::x86::decode_lanes::<D, false>(dec, c, es, y);
            }
            pos += take;
        }
        return;
    }
    if whole_blocks && vectors {
        // Blocks of whole vectors that tile the rows: one loop over a run of blocks, no
        // per-block run set-up. A row's blocks are a run of its grid row; with 1-D blocks the
        // grid rows follow each other, so the whole range is one run.
        let (mut pos, end) = (start, start + out.len());
        while pos < end {
            let (row, col) = (pos / n, pos % n);
            let take = if layout.rows_map_directly() {
                end - pos
            } else {
                (end - pos).min(n - col)
            };
            let first = layout.grid_row_offset(row) + col / bc;
            let r = pos - start..pos - start + take;
            let eff = effective.range(first..first + take / bc);
            decode_block_run::<D, STREAM>(dec, &codes[r.clone()], eff, bc, &mut out[r]);
            pos += take;
        }
        return;
    }
    if whole_blocks && layout.rows_map_directly() {
        // Every block a whole run and the grid row-major over them: block k of the range has
        // scale start / bc + k, no segment walk needed.
        let eff = effective.range(start / bc..start / bc + out.len() / bc);
        let blocks = codes.chunks_exact(bc).zip(out.chunks_exact_mut(bc));
        // Blocks not of whole vectors (or `out` off a 16-byte boundary): streamed only when
        // long, see `stream_runs`.
        let stream = STREAM && crate::simd::x86::stream_runs(bc, false);
        for ((c, o), e) in blocks.zip(eff.iter()) {
            decode_run_streamed_or_not::<D, STREAM>(dec, c, e, o, stream);
        }
        return;
    }
    // Runs of whole vectors from 16-byte boundaries when the blocks and rows are: then every
    // store of every run streams; else only the long runs do (see `stream_runs`).
    let all_whole = bc.is_multiple_of(8)
        && n.is_multiple_of(8)
        && (out.as_ptr() as usize).is_multiple_of(16)
        && start.is_multiple_of(8);
    for (pos, len, s) in Segments::new(layout, start, out.len()) {
        let o = pos - start;
        let (c, y) = (&codes[o..o + len], &mut out[o..o + len]);
        let stream = STREAM && crate::simd::x86::stream_runs(len, all_whole);
        decode_run_streamed_or_not::<D, STREAM>(dec, c, effective.get(s), y, stream);
    }
}

/// `decode_run` with non-temporal stores when `stream` (only ever with `STREAM`: the caller's
/// task then ends with a fence).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn decode_run_streamed_or_not<D: Decode, const STREAM: bool>(
    dec: D,
    codes: &[u8],
    e: f32,
    out: &mut [f32],
    stream: bool,
) {
    if STREAM && stream {
        crate::simd::x86::decode_run::<D, true>(dec, codes, e, out);
    } else {
        crate::simd::x86::decode_run::<D, false>(dec, codes, e, out);
    }
}

/// The codes of consecutive whole blocks of `bc` values (a multiple of 8), block k's scale
/// `eff`'s k-th, into `out` (16-byte aligned when `STREAM`), 64 scales at a time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn decode_block_run<D: Decode, const STREAM: bool>(
    dec: D,
    codes: &[u8],
    eff: Effective<'_>,
    bc: usize,
    out: &mut [f32],
) {
    let (mut buf, mut k) = ([0.0f32; SCALE_CHUNK], 0);
    while k < eff.len() {
        let es = eff.chunk(k, &mut buf);
        let r = k * bc..(k + es.len()) * bc;
        let (c, o) = (&codes[r.clone()], &mut out[r]);
        crate::simd::x86::decode_blocks_8s::<D, STREAM>(dec, c, es, bc, o);
        k += es.len();
    }
}

#[inline(always)]
fn decode_range_portable<D: Decode, O: OutElem>(
    dec: D,
    layout: &Layout,
    effective: Effective<'_>,
    start: usize,
    codes: &[u8],
    out: &mut [O],
) {
    for (pos, len, s) in Segments::new(layout, start, out.len()) {
        let e = effective.get(s);
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
    effective: Effective<'_>,
    out: &mut [O],
) {
    if layout.packing.swapped {
        return decode_swapped(table, layout, storage, effective, out);
    }
    match storage {
        Storage::U8(codes) if layout.packing.per == 1 => {
            out.par_chunks_mut(MIN_TASK_ELEMS)
                .enumerate()
                .for_each(|(ci, chunk)| {
                    let start = ci * MIN_TASK_ELEMS;
                    let codes = &codes[start..start + chunk.len()];
                    decode_range(table, layout, effective, start, codes, chunk);
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
    effective: Effective<'_>,
    out: &mut [O],
) {
    let p = &layout.packing;
    let (per, nw, n_axis) = (p.per, p.words_axis, p.n_axis);
    if out.is_empty() {
        return;
    }
    // Packed along the last axis: tasks are whole lines, or pieces of one long line.
    let line_len = n_axis;
    let lines_per_task = (MIN_TASK_ELEMS / line_len.max(1)).max(1);
    let elems_per_task = if line_len >= MIN_TASK_ELEMS {
        MIN_TASK_ELEMS
    } else {
        lines_per_task * line_len
    };
    #[cfg(target_arch = "x86_64")]
    if let Some(out) = O::as_f32(out) {
        if let Some(stream) = nibble_blocks(layout, W::BITS as usize / per, elems_per_task, out) {
            out.par_chunks_mut(elems_per_task)
                .enumerate()
                .for_each(|(ci, chunk)| {
                    // SAFETY: `nibble_blocks` checked the CPU, the layout and the alignment.
                    unsafe {
                        decode_nibbles_f32(
                            table,
                            layout,
                            words,
                            effective,
                            ci * elems_per_task,
                            chunk,
                            stream,
                        )
                    }
                });
            return;
        }
    }
    out.par_chunks_mut(elems_per_task)
        .enumerate()
        .for_each(|(ci, chunk)| {
            let start = ci * elems_per_task;
            // A run of codes may span lines (short rows: one decode call for many of them),
            // each line's part unpacked from its own words.
            decode_runs(
                table,
                layout,
                effective,
                start,
                chunk,
                |_| BUF,
                |pos, codes| {
                    let mut done = 0;
                    while done < codes.len() {
                        let (line, col) = ((pos + done) / line_len, (pos + done) % line_len);
                        let lines = (codes.len() - done) / line_len;
                        if col == 0 && line_len < FEW && lines > 1 {
                            let w = &words[line * nw..(line + lines) * nw];
                            let c = &mut codes[done..done + lines * line_len];
                            unpack_short_lines(w, line_len, c, per);
                            done += lines * line_len;
                            continue;
                        }
                        let k = (codes.len() - done).min(line_len - col);
                        let w = &words[line * nw..(line + 1) * nw];
                        unpack_fields(w, col, &mut codes[done..done + k], per);
                        done += k;
                    }
                },
            );
        });
}

/// Whether f32 output of 4-bit fields packed along the last axis decodes straight from the
/// words ([`decode_nibbles_f32`]): AVX2 and F16C, blocks (of any rank) whose extent along the
/// rows is whole vectors and tiles them, tasks of whole blocks; Some(whether the stores
/// stream), None otherwise (and when streaming stores would find `out` unaligned).
#[cfg(target_arch = "x86_64")]
fn nibble_blocks(layout: &Layout, field_bits: usize, task: usize, out: &[f32]) -> Option<bool> {
    let bc = layout.block_cols();
    let fits = field_bits == 4
        && crate::simd::has_avx2()
        && crate::simd::has_f16c()
        && !layout.per_tensor
        && bc.is_multiple_of(8)
        && layout.row_len().is_multiple_of(bc)
        && task.is_multiple_of(bc);
    let stream = layout.num_elements * 4 >= crate::simd::x86::STREAM_MIN_BYTES;
    (fits && (!stream || (out.as_ptr() as usize).is_multiple_of(16))).then_some(stream)
}

/// The outputs `chunk` (from flat index `start`, whole blocks) of 4-bit fields packed along the
/// last axis, read straight from each line's bytes (no code buffer): what [`decode_runs`] with
/// `unpack_fields` and [`decode_range`] give, bit for bit, in one step.
///
/// # Safety
/// [`nibble_blocks`] said yes for this layout and output (the CPU has AVX2 and F16C).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn decode_nibbles_f32<W: Word, D: Decode>(
    dec: D,
    layout: &Layout,
    words: &[W],
    effective: Effective<'_>,
    start: usize,
    chunk: &mut [f32],
    stream: bool,
) {
    use crate::simd::x86::decode_nibble_blocks_8s;
    let (n, bc) = (layout.row_len(), layout.block_cols());
    // Little-endian words: field f of a line is nibble f % 2 of the line's byte f / 2.
    let bytes =
        std::slice::from_raw_parts(words.as_ptr() as *const u8, std::mem::size_of_val(words));
    let line_bytes = layout.packing.words_axis * std::mem::size_of::<W>();
    let (mut pos, end) = (start, start + chunk.len());
    while pos < end {
        // A run to the end of the line or the chunk; both are block boundaries, and with
        // whole blocks tiling the rows, the run's blocks are a run of the line's grid row.
        let (line, col) = (pos / n, pos % n);
        let take = (end - pos).min(n - col);
        let b = &bytes[line * line_bytes + col / 2..][..take / 2];
        let first = layout.grid_row_offset(line) + col / bc;
        let eff = effective.range(first..first + take / bc);
        let o = &mut chunk[pos - start..pos - start + take];
        let (mut buf, mut k) = ([0.0f32; SCALE_CHUNK], 0);
        while k < eff.len() {
            let es = eff.chunk(k, &mut buf);
            let (b, o) = (
                &b[k * bc / 2..(k + es.len()) * bc / 2],
                &mut o[k * bc..(k + es.len()) * bc],
            );
            if stream {
                decode_nibble_blocks_8s::<D, true>(dec, b, es, bc, o);
            } else {
                decode_nibble_blocks_8s::<D, false>(dec, b, es, bc, o);
            }
            k += es.len();
        }
        pos += take;
    }
    if stream {
        // The non-temporal stores are weakly ordered: done before the task says it is done.
        std::arch::x86_64::_mm_sfence();
    }
}

/// Decode `chunk` (the outputs from flat index `start`) a run of codes at a time: `fill(pos,
/// codes)` writes the codes of the run starting at `pos`, at most `run_len(pos)` and `BUF` long.
#[inline(always)]
fn decode_runs<D: Decode, O: OutElem>(
    table: D,
    layout: &Layout,
    effective: Effective<'_>,
    start: usize,
    chunk: &mut [O],
    run_len: impl Fn(usize) -> usize,
    fill: impl Fn(usize, &mut [u8]),
) {
    let mut codes = [0u8; BUF];
    let mut pos = start;
    let end = start + chunk.len();
    while pos < end {
        let take = (end - pos).min(run_len(pos)).min(BUF);
        fill(pos, &mut codes[..take]);
        let o = pos - start;
        let dst = &mut chunk[o..o + take];
        decode_range(table, layout, effective, pos, &codes[..take], dst);
        pos += take;
    }
}

/// Dequantize storage in burn's swapped order (packed along an outer axis): its codes put back
/// in natural order first (a byte a value, [`unswap_codes`]), then decoded as natural runs.
fn decode_swapped<D: Decode, O: OutElem>(
    table: D,
    layout: &Layout,
    storage: Storage<'_>,
    effective: Effective<'_>,
    out: &mut [O],
) {
    let codes = match storage {
        Storage::U8(ws) => unswap_codes(layout, ws),
        Storage::U32(ws) => unswap_codes(layout, ws),
    };
    out.par_chunks_mut(MIN_TASK_ELEMS)
        .enumerate()
        .for_each(|(ci, chunk)| {
            let start = ci * MIN_TASK_ELEMS;
            decode_runs(
                table,
                layout,
                effective,
                start,
                chunk,
                |_| BUF,
                |pos, c| c.copy_from_slice(&codes[pos..pos + c.len()]),
            );
        });
}

/// The fields of swapped-order storage, one a byte in natural order: each group of
/// [`LINES_TOGETHER`] lines unpacked, then written out k-th elements side by side.
fn unswap_codes<W: Word>(layout: &Layout, words: &[W]) -> Vec<u8> {
    let p = &layout.packing;
    let (nw, n, per, inner) = (p.words_axis, p.n_axis, p.per, p.inner);
    let mask = p.field_mask() as u8; // a one-a-byte field's bits above it are not the code's
    let mut codes = vec![0u8; layout.num_elements];
    if nw == 0 || words.is_empty() {
        return codes;
    }
    /// The natural codes, written by many tasks at once.
    struct Shared(*mut u8);
    // SAFETY: the tasks write disjoint elements (each is field k of exactly one line).
    unsafe impl Sync for Shared {}
    let shared = Shared(codes.as_mut_ptr());
    let len = codes.len();
    let lines_per_task = (MIN_TASK_ELEMS / n).max(1);
    words
        .par_chunks(nw * lines_per_task)
        .enumerate()
        .for_each(|(ci, chunk)| {
            let shared = &shared;
            let count = chunk.len() / nw;
            line_groups(
                layout,
                ci,
                lines_per_task,
                count,
                move |g, bases, lines, stride| {
                    let group = &chunk[g * LINES_TOGETHER * nw..][..bases.len() * nw];
                    for (line, wl) in lines.chunks_exact_mut(stride).zip(group.chunks_exact(nw)) {
                        unpack_fields(wl, 0, &mut line[..n], per);
                    }
                    let top = bases.iter().max().copied().unwrap_or(0);
                    assert!(
                        top + (n - 1) * inner < len,
                        "the lines lie within the tensor"
                    );
                    // The pointer in a local (and the closure's numbers moved in, `move`):
                    // a byte written through it may be any memory to the compiler, so
                    // whatever is read through a reference is read again after each one.
                    let to = shared.0;
                    for k in 0..n {
                        ask_ahead(to, bases, k * inner + AHEAD * inner);
                        for (t, &b) in bases.iter().enumerate() {
                            // SAFETY: within `codes` (b + k·inner ≤ top + (n − 1)·inner, checked
                            // above), and no other task writes this element: it is field k of
                            // this line alone.
                            unsafe { *to.add(b + k * inner) = lines[t * stride + k] & mask };
                        }
                    }
                },
            );
        });
    codes
}

/// Check storage taken from a caller: every field a valid code of the value, padding bits 0.
pub fn check_storage(layout: &Layout, storage: Storage<'_>) -> Result<()> {
    let bytes = match storage {
        Storage::U8(b) => Some(b),
        // Little-endian words are the storage's bytes in order.
        Storage::U32(w) if cfg!(target_endian = "little") => Some(words_as_bytes(w)),
        Storage::U32(_) => None,
    };
    if bytes.is_some_and(|b| storage_bytes_valid(layout, b)) {
        return Ok(());
    }
    report_storage(layout, storage)
}

/// [`check_storage`] on the storage as its little-endian bytes (`from_bytes`' input).
pub(crate) fn check_storage_bytes(layout: &Layout, bytes: &[u8]) -> Result<()> {
    if layout.packing.word_bits == 8 {
        return check_storage(layout, Storage::U8(bytes));
    }
    if storage_bytes_valid(layout, bytes) {
        return Ok(());
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    report_storage(layout, Storage::U32(&words))
}

/// Which fields are codes of the layout's value (indexed by the field's bits).
fn valid_fields(layout: &Layout) -> [bool; 256] {
    let p = &layout.packing;
    let value = layout.scheme.value;
    let mut valid = [false; 256];
    for (f, v) in valid.iter_mut().enumerate().take(1 << p.field_bits.min(8)) {
        *v = match layout.scheme.codebook {
            // Every index is an entry; a Native byte's bits above the index width are not.
            Some(_) => f >> value.bits() == 0,
            None => field_is_valid(value, p, f as u32),
        };
    }
    valid
}

/// Whether every stored word is valid, the storage seen as its little-endian bytes: a table
/// of the bytes a word's used fields may hold, one lookup a byte with no branch, and each
/// line's partly used last word on its own. A word-at-a-time check with its division per word
/// took 5 ns a value, ten times a copy of the float32 tensor, on every `from_bytes` (every
/// Burnpack tensor loaded). `true` means [`report_storage`] finds nothing; `false` sends the
/// caller there for the first bad word's message.
fn storage_bytes_valid(layout: &Layout, bytes: &[u8]) -> bool {
    let p = &layout.packing;
    let fb = p.field_bits as usize;
    let wb = p.word_bytes();
    if fb == 0 || 8 % fb != 0 || bytes.len() != p.num_words() * wb {
        return false;
    }
    let valid = valid_fields(layout);
    let mask = (1usize << fb) - 1;
    // Fields a byte holds: one a byte word, or the byte's 8 / fb fields of a u32 word (which
    // fill it: 32 / fb of them).
    let fields = if wb == 1 { p.per } else { 8 / fb };
    let ok = ByteSet::new(|b| {
        let b = b as usize;
        (0..fields).all(|k| valid[(b >> (k * fb)) & mask]) && b >> (fields * fb) == 0
    });
    let all_ok = |run: &[u8]| ok.contains_all(run);
    let used_last = p.n_axis - (p.words_axis.max(1) - 1) * p.per;
    if used_last == p.per || p.n_axis == 0 {
        return all_ok(bytes);
    }
    // Lines end in a partly used word: its unused fields and the bits above must be zero.
    let last_ok = |w: &[u8]| {
        let word = w.iter().rev().fold(0u32, |a, &b| (a << 8) | b as u32);
        let used_bits = used_last * fb;
        (0..used_last).all(|k| valid[(word >> (k * fb)) as usize & mask])
            && (used_bits >= 32 || word >> used_bits == 0)
    };
    let line = p.words_axis * wb;
    bytes.chunks_exact(line).all(|l| {
        let (full, last) = l.split_at(line - wb);
        all_ok(full) && last_ok(last)
    })
}

/// A set of byte values (those a stored word's bytes may hold), with the tables of its
/// non-members that [`crate::simd::x86::all_in_set`] looks 32 bytes up in at once.
pub(crate) struct ByteSet {
    member: [u8; 256],
    /// Bit h of `low[l]`: byte 16·h + l is not a member (h < 8); `high` for h ≥ 8, bit h − 8.
    low: [u8; 16],
    high: [u8; 16],
}

impl ByteSet {
    pub(crate) fn new(member: impl Fn(u8) -> bool) -> Self {
        let mut set = Self {
            member: [0; 256],
            low: [0; 16],
            high: [0; 16],
        };
        for b in 0..=255u8 {
            let (h, l) = ((b >> 4) as usize, (b & 15) as usize);
            if member(b) {
                set.member[b as usize] = 1;
            } else if h < 8 {
                set.low[l] |= 1 << h;
            } else {
                set.high[l] |= 1 << (h - 8);
            }
        }
        set
    }

    /// Whether every byte of `run` is a member: 32 at a time on AVX2, else one table lookup a
    /// byte with no branch (in 4 KiB pieces, so a bad byte ends the search soon).
    pub(crate) fn contains_all(&self, run: &[u8]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if run.len() >= 32 && crate::simd::has_avx2() {
            // SAFETY: the CPU has AVX2, checked just above; the run is at least 32 bytes.
            return unsafe { crate::simd::x86::all_in_set(run, &self.low, &self.high) };
        }
        self.contains_all_portable(run)
    }

    pub(crate) fn contains_all_portable(&self, run: &[u8]) -> bool {
        run.chunks(1 << 12)
            .all(|c| c.iter().fold(1u8, |a, &b| a & self.member[b as usize]) == 1)
    }
}

/// The first invalid stored word's error, or `Ok` when there is none: one word at a time.
fn report_storage(layout: &Layout, storage: Storage<'_>) -> Result<()> {
    let p = &layout.packing;
    let value = layout.scheme.value;
    let valid = valid_fields(layout);
    let check = |index: usize, word: u32| -> Result<()> {
        // Which fields of this word hold values (the last word of a line may be partly padding).
        let wi = index % p.words_axis; // storage is lines along its last axis
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
        // Bits above the last field (a sub-byte int stored one a byte) are padding too.
        let used_bits = p.per as u32 * p.field_bits;
        if used_bits < p.word_bits && word >> used_bits != 0 {
            return Err(QuantError::Layout(format!(
                "stored word {index} has non-zero padding bits above its {} field(s)",
                p.per
            )));
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

#[cfg(test)]
pub(crate) mod tests {
    //! Packing against a bit-at-a-time oracle, the kernels against scalar oracles, and every
    //! dispatching (AVX2) kernel against its portable build. The oracles also serve the tests
    //! of `quantize.rs`.

    use super::*;
    use crate::codec::{
        float_table, E2M1Code, FloatCode, IntDecode, IntHalfAway, IntHalfEven, TableDecode,
    };
    use crate::minifloat::{E2M1, E4M3, E5M2};
    use crate::quantize::{dequantize, encode_values, Output};
    use crate::scheme::{QuantScheme, QuantStore, QuantValue, ScaleDtype};
    use crate::Rounding;

    /// SplitMix64: seeded, so a failing case replays.
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Self {
            Self(seed)
        }
        pub(crate) fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
        pub(crate) fn byte(&mut self) -> u8 {
            self.next_u64() as u8
        }
        /// Uniform in [-1, 1).
        pub(crate) fn unit(&mut self) -> f32 {
            (self.next_u64() >> 40) as f32 / (1u32 << 23) as f32 - 1.0
        }
        pub(crate) fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
            xs[self.below(xs.len())]
        }
    }

    /// The values and codes of SPEC §1, from its tables alone (not from `scheme`/`minifloat`).
    pub(crate) mod oracle {
        use crate::scheme::QuantValue;
        use crate::Rounding;

        /// bits, qmin, qmax, and for a float value (mantissa bits, exponent bias).
        pub(crate) fn spec(value: QuantValue) -> (u32, f64, f64, Option<(u32, i32)>) {
            match value {
                QuantValue::Q8F => (8, -128.0, 127.0, None),
                QuantValue::Q8S => (8, -127.0, 127.0, None),
                QuantValue::Q4F => (4, -8.0, 7.0, None),
                QuantValue::Q4S => (4, -7.0, 7.0, None),
                QuantValue::Q2F => (2, -2.0, 1.0, None),
                QuantValue::Q2S => (2, -1.0, 1.0, None),
                QuantValue::E4M3 => (8, -448.0, 448.0, Some((3, 7))),
                QuantValue::E5M2 => (8, -57344.0, 57344.0, Some((2, 15))),
                QuantValue::E2M1 => (4, -6.0, 6.0, Some((1, 1))),
            }
        }

        /// Value of a float code's magnitude bits by the textbook formula; `None` for NaN/inf.
        pub(crate) fn float_magnitude(value: QuantValue, mag: u32) -> Option<f64> {
            let (_, _, qmax, fmt) = spec(value);
            let (mb, bias) = fmt.expect("a float value");
            let (e, m) = (mag >> mb, mag & ((1 << mb) - 1));
            let v = if e == 0 {
                m as f64 * 2f64.powi(1 - bias - mb as i32)
            } else {
                (1.0 + m as f64 / (1u32 << mb) as f64) * 2f64.powi(e as i32 - bias)
            };
            // Codes past the largest finite value are NaN or infinity (E4M3FN, E5M2).
            (v <= qmax).then_some(v)
        }

        /// The value a stored field (the low `bits` of a code) stands for; `None` if no value.
        pub(crate) fn field_value(value: QuantValue, field: u32) -> Option<f64> {
            let (bits, qmin, qmax, fmt) = spec(value);
            match fmt {
                None => {
                    let v = (((field << (32 - bits)) as i32) >> (32 - bits)) as f64;
                    (v >= qmin && v <= qmax).then_some(v)
                }
                Some(_) => {
                    let sign = if field >> (bits - 1) & 1 == 1 {
                        -1.0
                    } else {
                        1.0
                    };
                    float_magnitude(value, field & ((1 << (bits - 1)) - 1)).map(|m| sign * m)
                }
            }
        }

        /// The value of a field of `field_bits` as storage holds it (SPEC §8): 8-bit fields of a
        /// sub-byte int are int8 bytes, of a sub-byte float the code in the low bits, high bits 0.
        pub(crate) fn stored_value(value: QuantValue, field_bits: u32, f: u32) -> Option<f64> {
            let (bits, qmin, qmax, fmt) = spec(value);
            match fmt {
                Some(_) if f >> bits != 0 => None,
                Some(_) => field_value(value, f),
                None => {
                    let shift = 32 - field_bits;
                    let v = (((f << shift) as i32) >> shift) as f64;
                    (v >= qmin && v <= qmax).then_some(v)
                }
            }
        }

        /// The code of `xs = x / e` as the kernels write it one per byte: ints as int8 bytes,
        /// floats as their bit pattern (E2M1 in the low nibble). `xs` must not be NaN.
        pub(crate) fn encode(value: QuantValue, rounding: Rounding, xs: f32) -> u8 {
            assert!(!xs.is_nan());
            let (bits, qmin, qmax, fmt) = spec(value);
            if fmt.is_none() {
                let r = match rounding {
                    Rounding::HalfAway => xs.round(),
                    Rounding::HalfEven => xs.round_ties_even(),
                };
                return (r as f64).clamp(qmin, qmax) as i8 as u8;
            }
            let a = xs.abs() as f64;
            let sign = ((xs.to_bits() >> 31) as u8) << (bits - 1);
            let mags = magnitudes(value);
            let top = mags.len() - 1;
            if a >= mags[top] {
                return sign | top as u8;
            }
            let lo = mags.iter().rposition(|&v| v <= a).unwrap();
            let mid = (mags[lo] + mags[lo + 1]) / 2.0; // exact in f64
            let code = if a < mid || (a == mid && lo % 2 == 0) {
                lo
            } else {
                lo + 1
            };
            sign | code as u8
        }

        /// A float value's finite magnitudes in code order (codes are monotone in value).
        fn magnitudes(value: QuantValue) -> &'static [f64] {
            use std::sync::OnceLock;
            static TABLES: [OnceLock<Vec<f64>>; 3] = [const { OnceLock::new() }; 3];
            let (bits, _, _, _) = spec(value);
            let k = match value {
                QuantValue::E4M3 => 0,
                QuantValue::E5M2 => 1,
                _ => 2,
            };
            TABLES[k].get_or_init(|| {
                (0..1u32 << (bits - 1))
                    .map_while(|m| float_magnitude(value, m))
                    .collect()
            })
        }

        /// SPEC §4's zero rule and §6: the code of `x` against scale `e`.
        pub(crate) fn quantize_one(value: QuantValue, rounding: Rounding, x: f32, e: f32) -> u8 {
            if e == 0.0 {
                0
            } else {
                encode(value, rounding, x / e)
            }
        }

        /// SPEC §7: f32(decode(field)) × e.
        pub(crate) fn dequantize_one(value: QuantValue, field: u32, e: f32) -> f32 {
            field_value(value, field).expect("a valid field") as f32 * e
        }
    }

    /// Value storage of a layout, either word type.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) enum Words {
        U8(Vec<u8>),
        U32(Vec<u32>),
    }

    impl Words {
        /// Zeroed storage for `layout`.
        pub(crate) fn new(layout: &Layout) -> Self {
            Self::filled(layout, 0)
        }
        pub(crate) fn filled(layout: &Layout, v: u32) -> Self {
            let n = layout.packing.num_words();
            match layout.packing.word_bits {
                8 => Self::U8(vec![v as u8; n]),
                _ => Self::U32(vec![v; n]),
            }
        }
        pub(crate) fn as_mut(&mut self) -> StorageMut<'_> {
            match self {
                Self::U8(w) => StorageMut::U8(w),
                Self::U32(w) => StorageMut::U32(w),
            }
        }
        pub(crate) fn as_ref(&self) -> Storage<'_> {
            match self {
                Self::U8(w) => Storage::U8(w),
                Self::U32(w) => Storage::U32(w),
            }
        }
        pub(crate) fn get(&self, i: usize) -> u32 {
            match self {
                Self::U8(w) => w[i] as u32,
                Self::U32(w) => w[i],
            }
        }
        pub(crate) fn set(&mut self, i: usize, v: u32) {
            match self {
                Self::U8(w) => w[i] = v as u8,
                Self::U32(w) => w[i] = v,
            }
        }
        pub(crate) fn len(&self) -> usize {
            match self {
                Self::U8(w) => w.len(),
                Self::U32(w) => w.len(),
            }
        }
    }

    /// Index into the scale grid of element `flat` (C order), from the block shape alone.
    pub(crate) fn grid_index(layout: &Layout, flat: usize) -> usize {
        if layout.per_tensor {
            return 0;
        }
        let (dims, block) = (&layout.dims, &layout.block);
        let (mut rem, mut g, mut stride) = (flat, 0, 1);
        for ax in (0..dims.len()).rev() {
            g += (rem % dims[ax] / block[ax]) * stride;
            stride *= dims[ax].div_ceil(block[ax]);
            rem /= dims[ax];
        }
        g
    }

    /// f32 values that sit on the kernels' edges: signed zeros, subnormals, the largest
    /// values, exact ties of the int roundings and of the float formats.
    pub(crate) const EDGES: [f32; 26] = [
        0.0,
        -0.0,
        1e-45,
        -1e-45,
        1.1754942e-38,
        1e-40,
        -1e-40,
        f32::MAX,
        f32::MIN,
        1e38,
        -3e38,
        0.5,
        -0.5,
        1.5,
        -2.5,
        127.5,
        -127.5,
        0.25,
        0.75,
        5.0,
        -5.0,
        6.0,
        464.0,
        -432.0,
        61440.0,
        57344.0,
    ];

    /// A scale as the kernels may meet it: zero (zero rule), subnormal, a power of two (so
    /// that ties stay exact), ordinary, huge.
    pub(crate) fn sample_scale(rng: &mut Rng) -> f32 {
        match rng.below(8) {
            0 => 0.0,
            1 => f32::from_bits(1 + rng.below(1 << 20) as u32),
            2 | 3 => 2f32.powi(rng.below(40) as i32 - 20),
            4 => 3e38,
            _ => 10f32.powf(rng.unit() * 4.0) * 0.01,
        }
    }

    /// An input value for an element whose scale is `e`: often an exact multiple or midpoint
    /// of a code's value times `e`, sometimes an edge, otherwise a random magnitude.
    pub(crate) fn sample_value(rng: &mut Rng, e: f32, with_non_finite: bool) -> f32 {
        match rng.below(10) {
            0 if with_non_finite => rng.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]),
            0 | 1 => rng.pick(&EDGES),
            2 | 3 => {
                // k/2 for k in -260..260: integer ties, and E2M1/E4M3 midpoints at small scales.
                let k = rng.below(520) as f32 - 260.0;
                let v = (k / 2.0) * if e == 0.0 { 1.0 } else { e };
                if v.is_finite() {
                    v
                } else {
                    0.0
                }
            }
            _ => {
                let v = rng.unit() * 10f32.powf(rng.unit() * 3.0) * if e == 0.0 { 1.0 } else { e };
                if v.is_finite() {
                    v
                } else {
                    1.0
                }
            }
        }
    }

    // ---- pack_fields / unpack_fields / squeeze8 against bit-at-a-time oracles ----

    /// Codes packed `per` to a word of `word_bits`, first in the low bits, one bit at a time.
    fn pack_oracle(codes: &[u8], per: usize, word_bits: u32) -> Vec<u32> {
        let bits = word_bits as usize / per;
        let mut words = vec![0u32; codes.len().div_ceil(per)];
        for (i, &c) in codes.iter().enumerate() {
            for b in 0..bits {
                if (c >> b) & 1 == 1 {
                    words[i / per] |= 1 << ((i % per) * bits + b);
                }
            }
        }
        words
    }

    /// Field `f` of a line of words, one bit at a time.
    fn field_oracle(line: &[u32], f: usize, per: usize, word_bits: u32) -> u8 {
        let bits = word_bits as usize / per;
        let mut v = 0u8;
        for b in 0..bits.min(8) {
            let bit = (f % per) * bits + b;
            v |= (((line[f / per] >> bit) & 1) as u8) << b;
        }
        v
    }

    /// Lengths around every per-word count and up to the kernels' buffer size.
    fn lengths() -> impl Iterator<Item = usize> {
        (0..=70).chain([BUF - 9, BUF - 8, BUF - 7, BUF - 1, BUF])
    }

    fn check_pack<W: Word>(per: usize, rng: &mut Rng) {
        for len in lengths() {
            // Full random bytes: bits above a field's width must be dropped.
            let codes: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
            // Stale contents: every word, padding included, must be overwritten.
            let mut words = vec![W::from_u32(0xA5A5_A5A5); len.div_ceil(per)];
            pack_fields(&codes, &mut words, per);
            let got: Vec<u32> = words.iter().map(|w| w.to_u32()).collect();
            let want = pack_oracle(&codes, per, W::BITS);
            assert_eq!(got, want, "{} per {per} len {len}", W::BITS);
            if len < 3 * FEW {
                let mut words = vec![W::from_u32(0x5A5A_5A5A); len.div_ceil(per)];
                pack_few(&codes, &mut words, per);
                let got: Vec<u32> = words.iter().map(|w| w.to_u32()).collect();
                assert_eq!(got, want, "pack_few: {} per {per} len {len}", W::BITS);
            }
        }
    }

    #[test]
    fn pack_fields_matches_a_bit_at_a_time_oracle() {
        let mut rng = Rng::new(1);
        // u8 words: Q8 / Q4 / Q2 in PackedNative; u32 words: the same in PackedU32.
        for per in [1, 2, 4] {
            check_pack::<u8>(per, &mut rng);
        }
        for per in [4, 8, 16] {
            check_pack::<u32>(per, &mut rng);
        }
    }

    /// Many short lines at once (`pack_short_lines`: 8-byte stores that run into the next
    /// line, the last lines one word at a time) against each line packed alone by the oracle,
    /// over stale words; line counts around where the 8-byte reads and stores stop fitting.
    fn check_short_lines<W: Word>(per: usize, rng: &mut Rng) {
        for n in 1..FEW {
            let nw = n.div_ceil(per);
            for lines in [1, 2, 3, 4, 5, 9, 17, 40] {
                let codes: Vec<u8> = (0..n * lines).map(|_| rng.byte()).collect();
                let mut words = vec![W::from_u32(0xA5A5_A5A5); nw * lines];
                pack_short_lines(&codes, n, &mut words, per);
                let got: Vec<u32> = words.iter().map(|w| w.to_u32()).collect();
                let want: Vec<u32> = codes
                    .chunks(n)
                    .flat_map(|line| pack_oracle(line, per, W::BITS))
                    .collect();
                assert_eq!(got, want, "{} per {per}, {lines} lines of {n}", W::BITS);
                // And back, every field of every line, over stale codes.
                let mut back = vec![0xEEu8; codes.len()];
                unpack_short_lines(&words, n, &mut back, per);
                let mask = (u32::MAX >> (32 - W::BITS as usize / per)) as u8;
                let want: Vec<u8> = codes.iter().map(|&c| c & mask).collect();
                assert_eq!(
                    back,
                    want,
                    "unpack: {} per {per}, {lines} lines of {n}",
                    W::BITS
                );
            }
        }
    }

    #[test]
    fn short_lines_pack_and_unpack_as_each_line_alone() {
        let mut rng = Rng::new(5);
        for per in [1, 2, 4] {
            check_short_lines::<u8>(per, &mut rng);
        }
        for per in [4, 8, 16] {
            check_short_lines::<u32>(per, &mut rng);
        }
    }

    fn check_unpack<W: Word>(per: usize, rng: &mut Rng) {
        // Short lines: every (first, len) pair; padding words hold random bits, which a
        // correct unpack never reads into a field inside the range.
        for nw in [1, 2, 3, 5] {
            let line: Vec<u32> = (0..nw).map(|_| rng.next_u64() as u32).collect();
            let line_w: Vec<W> = line.iter().map(|&v| W::from_u32(v)).collect();
            let line: Vec<u32> = line_w.iter().map(|w| w.to_u32()).collect();
            let total = nw * per;
            for first in 0..total {
                for len in 0..=total - first {
                    let mut got = vec![0xEEu8; len];
                    unpack_fields(&line_w, first, &mut got, per);
                    let want: Vec<u8> = (first..first + len)
                        .map(|f| field_oracle(&line, f, per, W::BITS))
                        .collect();
                    assert_eq!(got, want, "{} per {per} first {first} len {len}", W::BITS);
                }
            }
        }
        // Long lines: buffer-sized runs from random starts.
        let nw = (3 * BUF).div_ceil(per);
        let line_w: Vec<W> = (0..nw)
            .map(|_| W::from_u32(rng.next_u64() as u32))
            .collect();
        let line: Vec<u32> = line_w.iter().map(|w| w.to_u32()).collect();
        for _ in 0..20 {
            let first = rng.below(BUF);
            let len = rng.below(BUF + 1);
            let mut got = vec![0u8; len];
            unpack_fields(&line_w, first, &mut got, per);
            for (j, &g) in got.iter().enumerate() {
                assert_eq!(g, field_oracle(&line, first + j, per, W::BITS));
            }
        }
    }

    #[test]
    fn unpack_fields_matches_a_bit_at_a_time_oracle() {
        let mut rng = Rng::new(2);
        // 8 per byte (1-bit fields) is not used by any value today, but the kernel has the arm.
        for per in [1, 2, 4, 8] {
            check_unpack::<u8>(per, &mut rng);
        }
        for per in [4, 8, 16] {
            check_unpack::<u32>(per, &mut rng);
        }
    }

    #[test]
    fn packed_fields_round_trip_with_padding_zero() {
        let mut rng = Rng::new(3);
        for (word_bits, per) in [(8, 1), (8, 2), (8, 4), (32, 4), (32, 8), (32, 16)] {
            let bits = word_bits / per as u32;
            let mask = ((1u32 << bits) - 1) as u8;
            for len in lengths() {
                let codes: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
                let masked: Vec<u8> = codes.iter().map(|&c| c & mask).collect();
                let mut back = vec![0u8; len];
                let padding = |ws: Vec<u32>| {
                    // Fields past the last code of the last word.
                    let used = len % per;
                    if used == 0 || ws.is_empty() {
                        return 0;
                    }
                    ws[ws.len() - 1] >> (used as u32 * bits)
                };
                if word_bits == 8 {
                    let mut w = vec![0xFFu8; len.div_ceil(per)];
                    pack_fields(&codes, &mut w, per);
                    unpack_fields(&w, 0, &mut back, per);
                    assert_eq!(padding(w.iter().map(|&v| v as u32).collect()), 0);
                } else {
                    let mut w = vec![u32::MAX; len.div_ceil(per)];
                    pack_fields(&codes, &mut w, per);
                    unpack_fields(&w, 0, &mut back, per);
                    assert_eq!(padding(w), 0, "per {per} len {len}");
                }
                assert_eq!(back, masked, "{word_bits}-bit words, per {per}, len {len}");
            }
        }
    }

    #[test]
    fn squeeze8_matches_a_bit_at_a_time_oracle() {
        let mut rng = Rng::new(4);
        for _ in 0..2000 {
            let x = rng.next_u64();
            for bits in [2usize, 4, 8] {
                let mut want = 0u64;
                for i in 0..8 {
                    for b in 0..bits {
                        want |= ((x >> (8 * i + b)) & 1) << (i * bits + b);
                    }
                }
                assert_eq!(squeeze8(x, bits), want, "{x:#x} {bits}");
            }
        }
    }

    // ---- whole-tensor encode/decode: outer axis against the transposed last axis ----

    fn scheme(value: QuantValue, store: QuantStore, block: Option<&[usize]>) -> QuantScheme {
        let s = QuantScheme::default().with_value(value).with_store(store);
        match block {
            Some(b) => s.per_block(b, ScaleDtype::F32).unwrap(),
            None => s,
        }
    }

    /// Words of a tensor of shape `[a, n, i]` packed along its middle axis, as `(a, wi, i)`,
    /// built one code at a time.
    fn outer_words_oracle(
        codes: &[u8],
        (a, n, inner): (usize, usize, usize),
        per: usize,
        field_bits: u32,
    ) -> Vec<u32> {
        let nw = n.div_ceil(per);
        let mask = (1u64 << field_bits) as u32 - 1;
        let mut words = vec![0u32; a * nw * inner];
        for o in 0..a {
            for j in 0..n {
                for i in 0..inner {
                    let q = codes[(o * n + j) * inner + i] as u32 & mask;
                    words[(o * nw + j / per) * inner + i] |= q << ((j % per) as u32 * field_bits);
                }
            }
        }
        words
    }

    fn transpose_last_two<T: Copy + Default>(
        x: &[T],
        (a, n, inner): (usize, usize, usize),
    ) -> Vec<T> {
        let mut t = vec![T::default(); x.len()];
        for o in 0..a {
            for j in 0..n {
                for i in 0..inner {
                    t[(o * inner + i) * n + j] = x[(o * n + j) * inner + i];
                }
            }
        }
        t
    }

    /// Packing along an outer axis is burn's layout: the tensor with the packed axis swapped to
    /// the last place, packed along it — so for `[a, n, i]` packed along `n` the storage is, word
    /// for word in the same order, the `[a, i, n]` transpose packed along its last axis (with the
    /// block and the scale grid transposed alike); both equal the scalar oracle, and both decode
    /// to the oracle's values.
    #[test]
    fn outer_axis_packing_is_the_transposed_last_axis_packing() {
        let mut rng = Rng::new(5);
        // (a, n, i): ragged packed axis, a 1-wide inner axis (packed "along an outer axis"
        // that is last in memory), an inner run longer than the kernels' buffer, and one with
        // enough words to split into several parallel tasks for every per-word count.
        let shapes = [
            (2, 13, 5),
            (1, 3, 7),
            (4, 9, 1),
            (1, 5, BUF + 300),
            (3, 37, 1000),
        ];
        let blocks: [&[usize]; 3] = [&[4, 3], &[1, 64], &[5, 1]];
        for (si, &(a, n, inner)) in shapes.iter().enumerate() {
            let len = a * n * inner;
            for value in QuantValue::ALL {
                for (ki, packed) in [QuantStore::PackedU32, QuantStore::PackedNative]
                    .into_iter()
                    .enumerate()
                {
                    if len > 20_000 && !(value as usize + ki).is_multiple_of(3) {
                        continue; // the big shape on a third of the cases keeps debug tests fast
                    }
                    let block = blocks[(si + value as usize) % blocks.len()];
                    let tblock = [block[1], block[0]];
                    let rounding = if ki == 0 {
                        Rounding::HalfAway
                    } else {
                        Rounding::HalfEven
                    };
                    let lo = Layout::new(&scheme(value, packed(1), Some(block)), &[a, n, inner])
                        .unwrap();
                    let lt = Layout::new(&scheme(value, packed(0), Some(&tblock)), &[a, inner, n])
                        .unwrap();
                    assert_eq!(lo.packing.n_axis, n);
                    let eff: Vec<f32> =
                        (0..lo.num_scales).map(|_| sample_scale(&mut rng)).collect();
                    // The transposed grid [a, gi, gn] holds the same scales.
                    let (gn, gi) = (lo.grid[1], lo.grid[2]);
                    let mut eff_t = vec![0.0; eff.len()];
                    for o in 0..a {
                        for p in 0..gn {
                            for q in 0..gi {
                                eff_t[(o * gi + q) * gn + p] = eff[(o * gn + p) * gi + q];
                            }
                        }
                    }
                    let e: Vec<f32> = (0..len).map(|f| eff[grid_index(&lo, f)]).collect();
                    let x: Vec<f32> = e
                        .iter()
                        .map(|&e| sample_value(&mut rng, e, false))
                        .collect();
                    let codes: Vec<u8> = x
                        .iter()
                        .zip(&e)
                        .map(|(&x, &e)| oracle::quantize_one(value, rounding, x, e))
                        .collect();
                    let xt = transpose_last_two(&x, (a, n, inner));

                    let mut wo = Words::filled(&lo, 0xFFFF_FFFF);
                    encode_values(Input::F32(&x), &lo, &eff, rounding, wo.as_mut()).unwrap();
                    let mut wt = Words::filled(&lt, 0xFFFF_FFFF);
                    encode_values(Input::F32(&xt), &lt, &eff_t, rounding, wt.as_mut()).unwrap();

                    let p = &lo.packing;
                    let want = outer_words_oracle(&codes, (a, n, inner), p.per, p.field_bits);
                    let nw = p.words_axis;
                    assert_eq!(wo.len(), want.len());
                    for (w, &expect) in want.iter().enumerate() {
                        let (o, wi, i) = (w / (nw * inner), w / inner % nw, w % inner);
                        let ctx = || {
                            format!(
                                "{} [{a},{n},{inner}] word (o {o}, wi {wi}, i {i})",
                                lo.scheme
                            )
                        };
                        let stored = (o * inner + i) * nw + wi; // burn's swapped order
                        assert_eq!(wo.get(stored), expect, "outer axis: {}", ctx());
                        assert_eq!(
                            wt.get((o * inner + i) * nw + wi),
                            expect,
                            "last axis: {}",
                            ctx()
                        );
                    }

                    let mut yo = vec![0.0f32; len];
                    dequantize(&lo, wo.as_ref(), &eff, None, Output::F32(&mut yo));
                    let mut yt = vec![0.0f32; len];
                    dequantize(&lt, wt.as_ref(), &eff_t, None, Output::F32(&mut yt));
                    let yt = transpose_last_two(&yt, (a, inner, n));
                    let mask = (1u32 << value.bits()) - 1;
                    for f in 0..len {
                        let want = oracle::dequantize_one(value, codes[f] as u32 & mask, e[f]);
                        assert_eq!(
                            yo[f].to_bits(),
                            want.to_bits(),
                            "{} decode outer {f}",
                            lo.scheme
                        );
                        assert_eq!(
                            yt[f].to_bits(),
                            want.to_bits(),
                            "{} decode last {f}",
                            lo.scheme
                        );
                    }
                }
            }
        }
    }

    // ---- check_storage ----

    /// Every field value in every slot of every word, one at a time on otherwise zero storage:
    /// accepted exactly when it is a code of the value (a used slot) or zero (padding).
    #[test]
    fn check_storage_rejects_bad_codes_and_padding() {
        let stores = [
            QuantStore::Native,
            QuantStore::PackedU32(0),
            QuantStore::PackedNative(0),
            QuantStore::PackedU32(1),
            QuantStore::PackedNative(1),
        ];
        for value in QuantValue::ALL {
            for store in stores {
                // Ragged along either axis for every per-word count, and lines of whole words
                // (the byte table's case) along the last axis or the first.
                for shape in [[3, 3], [2, 32], [32, 2], [2, 36]] {
                    let layout = Layout::new(&scheme(value, store, None), &shape).unwrap();
                    let p = layout.packing.clone();
                    let mut words = Words::new(&layout);
                    assert!(check_storage(&layout, words.as_ref()).is_ok());
                    // The words of the first storage line (lines run along the last storage axis in
                    // burn's layout, the packed axis swapped there), and the very last word.
                    let line = p.words_axis;
                    for w in (0..line).chain([words.len() - 1]) {
                        let wi = w % p.words_axis;
                        let used = p.per.min(p.n_axis - wi * p.per);
                        for t in 0..p.per {
                            for f in 0..(1u32 << p.field_bits.min(8)) {
                                words.set(w, f << (t as u32 * p.field_bits));
                                let ok = if t < used {
                                    oracle::stored_value(value, p.field_bits, f).is_some()
                                } else {
                                    f == 0
                                };
                                let got = check_storage(&layout, words.as_ref());
                                assert_eq!(
                                    got.is_ok(),
                                    ok,
                                    "{value} {store} word {w} slot {t} field {f:#x}: {got:?}"
                                );
                                if let Err(e) = got {
                                    assert!(matches!(e, QuantError::Layout(_)));
                                    let why = if t < used { "not a code" } else { "padding" };
                                    assert!(e.to_string().contains(why), "{e}");
                                    assert!(e.to_string().contains(&format!("word {w} ")), "{e}");
                                }
                            }
                            words.set(w, 0);
                        }
                    }
                }
            }
        }
    }

    /// The byte-table check says "valid" exactly when the word-by-word one finds nothing: every
    /// store, value and codebook, lines of whole words and ragged ones, on storage whose words
    /// are zero, random bytes, or one random byte set (bits above a one-a-byte field included).
    #[test]
    fn byte_table_check_agrees_with_the_word_by_word_one() {
        let nf4 = crate::lookup::Codebook::new(&crate::lookup::NAMED[0].1).unwrap();
        let mut rng = Rng::new(7);
        let stores = [
            QuantStore::Native,
            QuantStore::PackedU32(0),
            QuantStore::PackedNative(0),
            QuantStore::PackedU32(1),
            QuantStore::PackedNative(1),
        ];
        let (mut valid, mut invalid) = (0, 0);
        for value in QuantValue::ALL {
            for store in stores {
                let plain = scheme(value, store, None);
                let books = match value {
                    QuantValue::Q4F | QuantValue::Q4S => {
                        vec![plain, plain.with_codebook(nf4)]
                    }
                    QuantValue::Q2F | QuantValue::Q2S => {
                        let book = crate::lookup::Codebook::new(&[-1.0, -0.25, 0.5, 1.0]).unwrap();
                        vec![plain, plain.with_codebook(book)]
                    }
                    _ => vec![plain],
                };
                for sch in books {
                    for shape in [[3, 3], [2, 32], [32, 2], [2, 36], [5, 17], [0, 4], [4, 0]] {
                        let layout = Layout::new(&sch, &shape).unwrap();
                        let mut words = Words::new(&layout);
                        for trial in 0..200 {
                            for w in 0..words.len() {
                                words.set(w, 0);
                            }
                            let n = words.len();
                            if n > 0 && trial % 4 == 1 {
                                for w in 0..n {
                                    words.set(w, rng.next_u64() as u32);
                                }
                            } else if n > 0 && trial % 4 >= 2 {
                                let w = rng.below(n);
                                let byte = rng.below(layout.packing.word_bytes());
                                words.set(w, (rng.byte() as u32) << (8 * byte));
                            }
                            let st = words.as_ref();
                            let bytes: Vec<u8> = match st {
                                Storage::U8(b) => b.to_vec(),
                                Storage::U32(w) => w.iter().flat_map(|w| w.to_le_bytes()).collect(),
                            };
                            let slow = report_storage(&layout, st).is_ok();
                            assert_eq!(
                                storage_bytes_valid(&layout, &bytes),
                                slow,
                                "{} {shape:?} trial {trial}: {bytes:02x?}",
                                layout.scheme
                            );
                            assert_eq!(check_storage_bytes(&layout, &bytes).is_ok(), slow);
                            (valid, invalid) = if slow {
                                (valid + 1, invalid)
                            } else {
                                (valid, invalid + 1)
                            };
                        }
                    }
                }
            }
        }
        // Both answers came up often.
        assert!(
            valid > 10_000 && invalid > 10_000,
            "{valid} valid, {invalid} invalid"
        );
    }

    /// The 32-at-a-time set lookup against the byte-by-byte one and against the set's
    /// definition: every byte value as the one non-member, at every position of runs of 32 to
    /// 100 bytes (the 64-byte steps, the 32-byte one and the overlapping last read all find
    /// it); then random sets (all members, one non-member, sparse and dense) on runs of every
    /// length up to 200 and a few thousand bytes, of members only or with one non-member
    /// planted.
    #[test]
    fn byte_set_lookup_equals_the_table() {
        let mut rng = Rng::new(11);
        for out in 0..=255u8 {
            let set = ByteSet::new(|b| b != out);
            let members: Vec<u8> = (0..=255u8).filter(|&b| b != out).collect();
            for n in [32, 33, 63, 64, 65, 96, 100] {
                let mut run: Vec<u8> = (0..n).map(|_| members[rng.below(255)]).collect();
                assert!(set.contains_all(&run) && set.contains_all_portable(&run));
                for at in 0..n {
                    let keep = run[at];
                    run[at] = out;
                    assert!(!set.contains_all(&run), "{out:#x} at {at} of {n}");
                    assert!(!set.contains_all_portable(&run));
                    run[at] = keep;
                }
            }
        }
        for trial in 0..400 {
            let density = [256, 255, 128, 16, 1][trial % 5];
            let member: Vec<bool> = (0..256).map(|_| rng.below(256) < density).collect();
            let set = ByteSet::new(|b| member[b as usize]);
            let (ins, outs): (Vec<u8>, Vec<u8>) = (0..=255u8).partition(|&b| member[b as usize]);
            let n = if trial % 7 == 0 {
                4096 + rng.below(64)
            } else {
                rng.below(201)
            };
            let mut run: Vec<u8> = match ins.len() {
                0 => vec![0; n],
                k => (0..n).map(|_| ins[rng.below(k)]).collect(),
            };
            if !outs.is_empty() && n > 0 && trial % 2 == 1 {
                run[rng.below(n)] = outs[rng.below(outs.len())];
            }
            let truth = run.iter().all(|&b| member[b as usize]);
            assert_eq!(set.contains_all(&run), truth, "trial {trial}, {n} bytes");
            assert_eq!(
                set.contains_all_portable(&run),
                truth,
                "trial {trial}, {n} bytes"
            );
        }
    }

    // ---- AVX2 builds against portable ones ----
    //
    // `encode_range_f32` and `decode_range` run their body compiled with AVX2 when the CPU has
    // it; the `*_portable` twins are the same body compiled for baseline x86-64. On a CPU
    // without AVX2 (or off x86-64) both sides run portable code and these tests still pass
    // without comparing anything SIMD. Optimized builds (`cargo test --release`) are where the
    // loops actually vectorize.

    /// A layout of `[rows, n]` with blocks of `bc` along the rows (the kernels' segments).
    fn row_blocks(rows: usize, n: usize, bc: usize) -> Layout {
        let s = scheme(QuantValue::Q8S, QuantStore::Native, Some(&[bc]));
        Layout::new(&s, &[rows, n]).unwrap()
    }

    /// The codec's AVX2 build against its portable one, and both against the scalar oracle of
    /// `value` under `rounding` wherever x / e is a number (a NaN input has no code to pin).
    fn compare_encode<C: Encode>(codec: C, value: QuantValue, rounding: Rounding, seed: u64) {
        let mut rng = Rng::new(seed);
        for (rows, n, bc) in [(3, 1000, 37), (2, 64, 1), (1, 5000, 64), (7, 33, 32)] {
            let layout = row_blocks(rows, n, bc);
            let eff: Vec<f32> = (0..layout.num_scales)
                .map(|_| sample_scale(&mut rng))
                .collect();
            let len = layout.num_elements;
            let x: Vec<f32> = (0..len)
                .map(|f| sample_value(&mut rng, eff[grid_index(&layout, f)], true))
                .collect();
            // The whole tensor, and a window that starts and ends inside blocks.
            let (s0, s1) = (len / 3 + 1, len - len / 5);
            for (start, end) in [(0, len), (s0, s1)] {
                let xs = &x[start..end];
                let sc = ScaleSlice::all(&eff);
                let mut simd = vec![0xAAu8; end - start];
                let mut port = vec![0x55u8; end - start];
                let bad_simd = encode_range_f32(codec, xs, start, &layout, sc, start, &mut simd);
                let bad_port =
                    encode_range_portable(codec, xs, start, &layout, sc, start, &mut port);
                assert_eq!(
                    simd, port,
                    "codes, {rows}x{n} block {bc} range {start}..{end}"
                );
                assert_eq!(bad_simd, bad_port);
                assert_eq!(bad_port, xs.iter().any(|v| !v.is_finite()));
                // The non-temporal stores of large final storage, at each offset from a
                // 16-byte boundary (only an aligned run streams).
                #[cfg(target_arch = "x86_64")]
                if crate::simd::has_avx2() {
                    for off in 0..4 {
                        let mut buf = vec![0xAAu8; end - start + 32];
                        let at = buf.as_ptr().align_offset(16) + off;
                        let out = &mut buf[at..at + end - start];
                        // SAFETY: the CPU has AVX2, checked just above.
                        let bad = unsafe {
                            let b =
                                encode_range_avx2(codec, xs, start, &layout, sc, start, out, true);
                            std::arch::x86_64::_mm_sfence();
                            b
                        };
                        assert_eq!(&out[..], &port[..], "streamed, offset {off}");
                        assert_eq!(bad, bad_port);
                    }
                }
                for (k, (&xv, &c)) in xs.iter().zip(&port).enumerate() {
                    let e = eff[grid_index(&layout, start + k)];
                    if e == 0.0 || !(xv / e).is_nan() {
                        let want = oracle::quantize_one(value, rounding, xv, e);
                        assert_eq!(c, want, "{value} x {xv:e} e {e:e}");
                    }
                }
            }
        }
    }

    #[test]
    fn encode_range_avx2_build_matches_portable() {
        for (k, value) in QuantValue::ALL.into_iter().enumerate() {
            let seed = 100 + k as u64;
            let (qmin, qmax) = value.range();
            // Float values round to nearest even whatever `rounding` says (SPEC §6).
            match value {
                QuantValue::E4M3 => {
                    compare_encode(FloatCode(E4M3), value, Rounding::HalfEven, seed)
                }
                QuantValue::E5M2 => {
                    compare_encode(FloatCode(E5M2), value, Rounding::HalfEven, seed)
                }
                QuantValue::E2M1 => {
                    compare_encode(FloatCode(E2M1), value, Rounding::HalfEven, seed);
                    compare_encode(E2M1Code, value, Rounding::HalfEven, seed);
                }
                _ => {
                    compare_encode(IntHalfAway { qmin, qmax }, value, Rounding::HalfAway, seed);
                    compare_encode(IntHalfEven { qmin, qmax }, value, Rounding::HalfEven, seed);
                }
            }
        }
    }

    /// Output elements compared by bits, any NaN equal to any other (payloads are not pinned).
    trait Key: OutElem {
        fn key(self) -> u64;
    }
    impl Key for f32 {
        fn key(self) -> u64 {
            if self.is_nan() {
                u64::MAX
            } else {
                self.to_bits() as u64
            }
        }
    }
    impl Key for f64 {
        fn key(self) -> u64 {
            if self.is_nan() {
                u64::MAX
            } else {
                self.to_bits()
            }
        }
    }
    impl Key for F16Bits {
        fn key(self) -> u64 {
            if half::f16::from_bits(self.0).is_nan() {
                u64::MAX
            } else {
                self.0 as u64
            }
        }
    }
    impl Key for BF16Bits {
        fn key(self) -> u64 {
            if half::bf16::from_bits(self.0).is_nan() {
                u64::MAX
            } else {
                self.0 as u64
            }
        }
    }

    /// The ranges the decode tests take of `len` values: all, one from mid-block to mid-block,
    /// and one of whole blocks starting mid-row.
    fn ranges(layout: &Layout, len: usize) -> [(usize, usize); 3] {
        let bc = layout.block_cols();
        let (a, b) = (len / 3 / bc * bc, (len - len / 5) / bc * bc);
        [(0, len), (len / 3 + 1, len - len / 5), (a, b.max(a))]
    }

    fn compare_decode_as<D: Decode, O: Key>(dec: D, layout: &Layout, eff: Effective, codes: &[u8]) {
        let len = codes.len();
        for (start, end) in ranges(layout, len) {
            let mut simd = vec![O::default(); end - start];
            let mut port = vec![O::default(); end - start];
            decode_range(dec, layout, eff, start, &codes[start..end], &mut simd);
            decode_range_portable(dec, layout, eff, start, &codes[start..end], &mut port);
            let a: Vec<u64> = simd.into_iter().map(Key::key).collect();
            let b: Vec<u64> = port.into_iter().map(Key::key).collect();
            assert_eq!(a, b, "{} range {start}..{end}", std::any::type_name::<O>());
        }
    }

    /// The non-temporal stores (taken for large outputs only) against the portable loop, the
    /// output at each 4-byte offset from a 16-byte boundary, from the start and mid-range.
    fn compare_decode_streaming<D: Decode>(dec: D, layout: &Layout, eff: Effective, codes: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() && crate::simd::has_f16c() {
            for (start, end) in ranges(layout, codes.len()) {
                let mut port = vec![0.0f32; end - start];
                decode_range_portable(dec, layout, eff, start, &codes[start..end], &mut port);
                for off in 0..4 {
                    let mut buf = vec![0.0f32; end - start + 8];
                    let at = buf.as_ptr().align_offset(16) + off;
                    let out = &mut buf[at..at + end - start];
                    // SAFETY: the CPU has AVX2 and F16C, checked just above.
                    unsafe {
                        let c = &codes[start..end];
                        decode_range_f32_avx2_with::<D, true>(dec, layout, eff, start, c, out);
                        std::arch::x86_64::_mm_sfence();
                    }
                    let a: Vec<u64> = out.iter().map(|v| v.key()).collect();
                    let b: Vec<u64> = port.iter().map(|v| v.key()).collect();
                    assert_eq!(a, b, "streamed, range {start}..{end}, offset {off}");
                }
            }
        }
    }

    fn compare_decode<D: Decode>(dec: D, value: QuantValue, native: bool, seed: u64) {
        let mut rng = Rng::new(seed);
        // Whole blocks of a row (the no-walk path) and ragged ones; blocks spanning rows that
        // tile them (a row at a time) and that do not (the segment walk).
        let q8 = scheme(QuantValue::Q8S, QuantStore::Native, None);
        let spanning = [
            (vec![6, 256], vec![2, 32]),
            (vec![3, 5, 64], vec![2, 2, 16]),
            (vec![256, 384], vec![128, 128]),
            (vec![7, 96], vec![3, 8]),
            (vec![4, 100], vec![2, 37]),
            // Narrower than a vector: a scale spread over each value.
            (vec![9, 70], vec![3, 5]),
            (vec![40, 77], vec![8, 1]),
            (vec![5, 3, 41], vec![2, 3, 1]),
        ]
        .map(|(shape, block)| {
            let s = q8.per_block(&block, ScaleDtype::F32).unwrap();
            Layout::new(&s, &shape).unwrap()
        });
        let rows = [
            (3, 1000, 37),
            (1, 5000, 64),
            (7, 33, 1),
            (5, 256, 32),
            (3, 96, 8),
        ]
        .map(|(rows, n, bc)| row_blocks(rows, n, bc));
        for layout in rows.into_iter().chain(spanning) {
            let eff: Vec<f32> = (0..layout.num_scales)
                .map(|_| sample_scale(&mut rng))
                .collect();
            // Any byte: NaN/inf codes of the float formats and, for Native, high bits set.
            let field_mask = if native {
                0xFF
            } else {
                (1u32 << value.bits()) - 1
            } as u8;
            let codes: Vec<u8> = (0..layout.num_elements)
                .map(|_| rng.byte() & field_mask)
                .collect();
            // One-level, and two-level (g times each block's scale, as the kernels reach it).
            for g in [None, Some(0.3712)] {
                let e = Effective::new(&eff, g);
                compare_decode_as::<D, f32>(dec, &layout, e, &codes);
                compare_decode_as::<D, f64>(dec, &layout, e, &codes);
                compare_decode_as::<D, F16Bits>(dec, &layout, e, &codes);
                compare_decode_as::<D, BF16Bits>(dec, &layout, e, &codes);
                compare_decode_streaming(dec, &layout, e, &codes);
            }
            // And the f32 result against SPEC §7, for the fields that are codes.
            let mut y = vec![0.0f32; codes.len()];
            decode_range(dec, &layout, Effective::new(&eff, None), 0, &codes, &mut y);
            for (f, (&c, &yv)) in codes.iter().zip(&y).enumerate() {
                let field_bits = if native { 8 } else { value.bits() };
                if let Some(v) = oracle::stored_value(value, field_bits, c as u32) {
                    let want = v as f32 * eff[grid_index(&layout, f)];
                    assert_eq!(yv.key(), want.key(), "{value} code {c:#x}");
                }
            }
        }
    }

    /// 4-bit fields decoded straight from the words (`decode_nibbles_f32`) against a scalar
    /// reading of the nibbles, for each 4-bit decoder (int, E2M1, codebook), u8 and u32 words,
    /// blocks of 8 to 32, one and many tasks, and an output large enough to stream, aligned and
    /// not (which falls back to the code buffer).
    #[test]
    fn nibbles_decode_straight_from_the_words() {
        use crate::codec::{E2M1Decode, IntDecode};
        use crate::lookup::{decode_table, Codebook, LookupDecode, NAMED};
        let mut rng = Rng::new(77);
        let nf4 = Codebook::new(&NAMED[0].1).unwrap();
        let table = decode_table(&nf4);
        // `global`: a two-level scheme's g, multiplied into each block's scale as the kernel
        // reaches it (the big values' products capped at f32::MAX).
        fn check<D: Decode>(
            dec: D,
            layout: &Layout,
            rng: &mut Rng,
            offset: usize,
            global: Option<f32>,
        ) {
            let n = layout.num_elements;
            let bytes: Vec<u8> = (0..n / 2).map(|_| rng.byte()).collect();
            let words: Vec<u32> = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let stored: Vec<f32> = (0..layout.num_scales)
                .map(|k| match k % 7 {
                    0 => 0.0,
                    1 => 1e-40,
                    2 => 3e38,
                    _ => rng.unit() * 3.0,
                })
                .collect();
            let e = |k: usize| match global {
                None => stored[k],
                Some(g) => (stored[k] * g).min(f32::MAX), // SPEC: e = b × g, capped
            };
            let want: Vec<u32> = (0..n)
                .map(|i| {
                    let field = (bytes[i / 2] >> (4 * (i % 2))) & 0xF;
                    (dec.decode(field) * e(grid_index(layout, i))).to_bits()
                })
                .collect();
            let mut buf = vec![f32::NAN; n + 4];
            let storage = if layout.packing.word_bits == 8 {
                Storage::U8(&bytes)
            } else {
                Storage::U32(&words)
            };
            let out = &mut buf[offset..offset + n];
            decode_into(dec, layout, storage, Effective::new(&stored, global), out);
            let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(
                first, None,
                "{} on {:?}, offset {offset}, g {global:?}",
                layout.scheme, layout.shape
            );
        }
        for (value, store) in [
            // (burn's PackedNative keeps 4-bit ints one a byte: not nibbles.)
            (QuantValue::Q4S, QuantStore::PackedU32(0)),
            (QuantValue::E2M1, QuantStore::PackedNative(0)),
            (QuantValue::E2M1, QuantStore::PackedU32(0)),
            (QuantValue::Q4F, QuantStore::PackedU32(0)),
        ] {
            // 1-D blocks, and blocks spanning rows (the grid row found a row at a time).
            for (shape, block) in [
                (vec![3, 64], vec![16]),
                (vec![7, 48], vec![24]),
                (vec![5, 40], vec![8]),
                (vec![96], vec![32]),
                (vec![2, 1 << 17], vec![32]),
                (vec![1 << 10, 1 << 12], vec![16]),
                (vec![7, 3, 64], vec![2, 2, 16]),
                (vec![384, 512], vec![128, 128]),
            ] {
                let plain = scheme(value, store, Some(&block));
                let layout = Layout::new(&plain, &shape).unwrap();
                assert_eq!(
                    layout.packing.field_bits as usize * layout.packing.per,
                    layout.packing.word_bits as usize
                );
                // One-level, and two-level with a g of no power of two (and one that takes 3e38
                // past f32::MAX). An output large enough to stream (4 Mi values) also goes to
                // an `out` one value off a 16-byte boundary; there the three g are spread over
                // the two offsets (the slowest test in debug builds otherwise).
                let big = shape.iter().product::<usize>() >= 1 << 22;
                let cases: &[(usize, Option<f32>)] = if big {
                    &[(0, None), (1, Some(0.3712)), (1, Some(7.0))]
                } else {
                    &[(0, None), (0, Some(0.3712)), (0, Some(7.0))]
                };
                for &(off, g) in cases {
                    match value {
                        QuantValue::E2M1 => check(E2M1Decode, &layout, &mut rng, off, g),
                        _ => {
                            let dec = IntDecode::new(&layout.packing);
                            check(dec, &layout, &mut rng, off, g)
                        }
                    }
                }
                if value == QuantValue::Q4F {
                    let looked = Layout::new(&plain.with_codebook(nf4), &shape).unwrap();
                    check(LookupDecode(&table), &looked, &mut rng, 0, None);
                    check(LookupDecode(&table), &looked, &mut rng, 0, Some(0.3712));
                }
            }
        }
    }

    #[test]
    fn decode_range_avx2_build_matches_portable() {
        for (k, value) in QuantValue::ALL.into_iter().enumerate() {
            for (j, store) in [QuantStore::Native, QuantStore::PackedU32(0)]
                .into_iter()
                .enumerate()
            {
                let seed = 200 + 2 * k as u64 + j as u64;
                let layout = Layout::new(&scheme(value, store, None), &[4, 4]).unwrap();
                let native = store == QuantStore::Native;
                match crate::codec::minifloat(value) {
                    Some(fmt) => {
                        let table = float_table(&fmt);
                        compare_decode(TableDecode(&table), value, native, seed);
                        if value == QuantValue::E2M1 {
                            compare_decode(crate::codec::E2M1Decode, value, native, seed);
                        } else {
                            let dec = crate::codec::Fp8Decode { table: &table, fmt };
                            compare_decode(dec, value, native, seed);
                            if value == QuantValue::E4M3 {
                                let dec = crate::codec::E4M3Decode(&table);
                                compare_decode(dec, value, native, seed);
                            }
                        }
                    }
                    None => compare_decode(IntDecode::new(&layout.packing), value, native, seed),
                }
            }
        }
    }
}
