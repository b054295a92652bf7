//! The storage vocabulary every packing and kernel shares: the caller's storage ([`Storage`],
//! [`StorageMut`]) and its words, the segments a tensor is walked in, the scales a range of it
//! is quantized against, and dequantize's output element types.

use crate::layout::Layout;

/// Codes are produced and consumed in stack buffers of this many values.
pub(crate) const BUF: usize = 2048;

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
/// storage's bytes as format.md "The byte layout" lays them out.
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
    pub(super) fn get(&self, i: usize) -> f32 {
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
        crate::scale::effective_scale(self.stored[i], self.global)
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
        crate::simd::x86::effective8(b, self.global)
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
            .map(move |&b| crate::scale::effective_scale(b, g))
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
            *e = crate::scale::effective_scale(b, g);
        }
        &buf[..stored.len()]
    }
}

/// Blocks an [`Effective::chunk`] holds.
pub const SCALE_CHUNK: usize = 64;

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
