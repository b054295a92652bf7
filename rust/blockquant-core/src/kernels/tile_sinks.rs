//! Where the tile kernels (`fused_tiles.rs`) write: the storage shared by every
//! task ([`Shared`], each task writing only its own tile's part), and a tile row's codes put
//! into it ([`Sink`]: one code a byte, or packed into words).

use crate::layout::Layout;
use crate::pack::fields::pack_last_axis;
use crate::pack::storage::Word;

/// A mutable slice handed to every task; each writes only its own tile's elements.
#[derive(Clone, Copy)]
pub(crate) struct Shared<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: tasks write disjoint parts of the slice (`Shared::part`'s contract), of a `Send` type.
unsafe impl<T: Send> Send for Shared<T> {}
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        Self {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// `[start, start + len)` of the slice.
    ///
    /// # Safety
    /// No other live reference overlaps it (tiles are disjoint: their rows × columns, their
    /// words, which start on word boundaries, and their scales).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "within the slice"
        );
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}

/// Where a tile row's codes go: `out(row)` is the code bytes to fill (the storage itself, or a
/// buffer), `done(row)` finishes them (masks them, or packs the buffer into the row's words).
pub(crate) trait Sink<'l> {
    type W: Word;
    fn new(layout: &'l Layout, words: Shared<Self::W>) -> Self;
    /// The tile's columns `[c0, c0 + w)` from now on.
    fn set_tile(&mut self, c0: usize, w: usize);
    /// # Safety
    /// Only the task of this tile uses the row's part of the storage.
    unsafe fn out(&mut self, row: usize) -> &mut [u8];
    /// # Safety
    /// As [`Sink::out`], after it.
    unsafe fn done(&mut self, row: usize);
}

/// The storage words of one tile row: columns `[c0, c0 + w)` of tensor row `row`.
struct RowWords<'l, W> {
    layout: &'l Layout,
    words: Shared<W>,
    c0: usize,
    w: usize,
}

impl<'l, W> RowWords<'l, W> {
    fn new(layout: &'l Layout, words: Shared<W>) -> Self {
        Self {
            layout,
            words,
            c0: 0,
            w: 0,
        }
    }

    /// The first word of the tile in its row, and the count (a tile starts on a word
    /// boundary; a row's last word is the tile's whether full or not).
    #[inline(always)]
    fn span(&self) -> (usize, usize) {
        let per = self.layout.packing.per;
        let lo = self.c0 / per;
        (lo, (self.c0 + self.w).div_ceil(per) - lo)
    }

    /// # Safety
    /// As [`Shared::part`]: only this tile's task uses the row's words.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    unsafe fn of(&self, row: usize) -> &mut [W] {
        let (lo, len) = self.span();
        self.words
            .part(row * self.layout.packing.words_axis + lo, len)
    }
}

/// One code a byte: the storage bytes are the codes (sub-byte ints masked to their field).
pub(crate) struct Bytes<'l> {
    at: RowWords<'l, u8>,
    mask: Option<u8>,
}

impl<'l> Sink<'l> for Bytes<'l> {
    type W = u8;
    fn new(layout: &'l Layout, words: Shared<u8>) -> Self {
        let p = &layout.packing;
        Self {
            at: RowWords::new(layout, words),
            mask: p.masks_bytes().then(|| p.field_mask() as u8),
        }
    }
    fn set_tile(&mut self, c0: usize, w: usize) {
        (self.at.c0, self.at.w) = (c0, w);
    }
    #[inline(always)]
    unsafe fn out(&mut self, row: usize) -> &mut [u8] {
        self.at.of(row)
    }
    #[inline(always)]
    unsafe fn done(&mut self, row: usize) {
        if let Some(m) = self.mask {
            self.at.of(row).iter_mut().for_each(|c| *c &= m);
        }
    }
}

/// Several codes a word: each row's codes into a buffer, then packed into its words.
pub(crate) struct Packed<'l, W> {
    at: RowWords<'l, W>,
    codes: Vec<u8>,
}

impl<'l, W: Word> Sink<'l> for Packed<'l, W> {
    type W = W;
    fn new(layout: &'l Layout, words: Shared<W>) -> Self {
        Self {
            at: RowWords::new(layout, words),
            codes: Vec::new(),
        }
    }
    fn set_tile(&mut self, c0: usize, w: usize) {
        (self.at.c0, self.at.w) = (c0, w);
        self.codes.resize(w, 0);
    }
    #[inline(always)]
    unsafe fn out(&mut self, _row: usize) -> &mut [u8] {
        &mut self.codes
    }
    #[inline(always)]
    unsafe fn done(&mut self, row: usize) {
        let at = &self.at;
        let (lo, _) = at.span();
        let start = row * at.layout.row_len() + at.c0;
        let w0 = row * at.layout.packing.words_axis + lo;
        pack_last_axis(at.layout, &self.codes, start, w0, at.of(row));
    }
}
