//! The one-pass kernels' vocabulary: the pieces a tensor is cut into ([`Piece`], one task
//! each), what a kernel needs to turn a block's α into its stored scale ([`FusedKernel`]), the
//! drivers that hand each piece its values, scales and storage words ([`fused_pieces`],
//! [`encode_pieces`]), and the report of a non-finite input ([`first_non_finite`]).

use rayon::prelude::*;

use crate::alloc::try_with_capacity;
use crate::calibrate::MIN_TASK_ELEMS;
use crate::error::{QuantError, Result};
use crate::input::Input;
use crate::layout::Layout;
use crate::options::QuantizeOptions;
use crate::pack::fields::pack_last_axis;
use crate::pack::storage::{StorageMut, Word};
use crate::scale::{stored_scale, to_block};
use crate::scheme::ScaleDtype;

/// The first non-finite value of `x` (its flat index), once a kernel has seen one somewhere.
pub(crate) fn first_non_finite(x: Input<'_>) -> QuantError {
    // A chunk's converted values: bounded by MIN_TASK_ELEMS.
    let mut buf = Vec::new();
    for start in (0..x.len()).step_by(MIN_TASK_ELEMS) {
        let len = MIN_TASK_ELEMS.min(x.len() - start);
        let chunk = x.read(start, len, &mut buf);
        if let Some(i) = chunk.iter().position(|v| !v.is_finite()) {
            let given = match x {
                // A finite float64 that became ±inf: too large for f32.
                Input::F64(v) if v[start + i].is_finite() => Some(v[start + i]),
                _ => None,
            };
            return QuantError::NonFinite {
                index: start + i,
                value: chunk[i],
                given,
            };
        }
    }
    unreachable!("a non-finite value was seen")
}

/// Elements per piece (one task) of the one-pass kernels: 256 KiB of f32 (a converted input's
/// buffer too) stays in L2. What a piece costs beyond its values (the task, and the `sfence`
/// that ends a piece whose codes stream) was 9-14% of block-32 int8's time from memory with
/// pieces of 64 KiB, 1024 per 16 Mi values (one thread, old and new interleaved in one
/// process: 6.83 -> 5.89 ms, 5.98 -> 5.43; two threads 3.36 -> 3.07). A large input still
/// makes hundreds of pieces for the pool's threads to share.
pub(crate) const PIECE: usize = 1 << 16;

/// The length of the blocks when they lie back to back along the rows (blocks of one row):
/// the block's when it divides the rows, the row's when the rows are shorter than a block
/// (each row one block, as a conv kernel's rows of 3 under blocks of 32); None when the rows
/// end in a partial block.
pub(crate) fn block_run(layout: &Layout) -> Option<usize> {
    let (n, bc) = (layout.row_len(), layout.block_cols());
    match () {
        _ if !layout.rows_map_directly() || n == 0 => None,
        _ if n.is_multiple_of(bc) => Some(bc),
        _ if n < bc => Some(n),
        _ => None,
    }
}

/// A piece of the tensor for the one-pass kernel: elements, and the scales and storage words
/// they own (all three contiguous, because pieces are whole rows or block- and word-aligned
/// parts of one row).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) scale0: usize,
    pub(crate) scales: usize,
    /// Global index of the first storage word, and the count.
    pub(crate) word0: usize,
    pub(crate) words: usize,
}

/// The pieces of a tensor, in order; one allocation of their number (a piece a row at least,
/// so a tensor of many short rows has many).
pub(crate) fn pieces(layout: &Layout) -> Result<Vec<Piece>> {
    let n = layout.row_len();
    let (bc, gc) = (layout.block_cols(), layout.grid_cols());
    let (per, nw) = (layout.packing.per, layout.packing.words_axis);
    let rows = layout.num_rows();
    let mut out;
    if n <= PIECE {
        let step = (PIECE / n).max(1);
        out = try_with_capacity(rows.div_ceil(step))?;
        for r0 in (0..rows).step_by(step) {
            let r1 = (r0 + step).min(rows);
            out.push(Piece {
                start: r0 * n,
                len: (r1 - r0) * n,
                scale0: r0 * gc,
                scales: (r1 - r0) * gc,
                word0: r0 * nw,
                words: (r1 - r0) * nw,
            });
        }
    } else {
        let unit = lcm(bc, per);
        let plen = (PIECE / unit).max(1) * unit;
        out = try_with_capacity(rows.saturating_mul(n.div_ceil(plen)))?;
        for r in 0..rows {
            for c0 in (0..n).step_by(plen) {
                let c1 = (c0 + plen).min(n);
                out.push(Piece {
                    start: r * n + c0,
                    len: c1 - c0,
                    scale0: r * gc + c0 / bc,
                    scales: c1.div_ceil(bc) - c0 / bc,
                    word0: r * nw + c0 / per,
                    words: c1.div_ceil(per) - c0 / per,
                });
            }
        }
    }
    Ok(out)
}

pub(crate) fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

/// Whether the one-pass kernels store their codes non-temporally: one a byte, unmasked,
/// straight into final storage too large for the cache. (With per > 1 the kernel writes a code
/// buffer, which must stay in cache for the packing.) Rows that end in a partial block store
/// it through the cache beside their streamed blocks, a mixed line (`x86::stream_runs`) a row:
/// only rows long enough to make that a small part stream.
pub(crate) fn streams(layout: &Layout) -> bool {
    #[cfg(target_arch = "x86_64")]
    return layout.packing.per == 1
        && !layout.packing.masks_bytes()
        && layout.num_elements >= crate::simd::x86::STREAM_MIN_BYTES
        && (layout.per_tensor
            || layout.row_len().is_multiple_of(layout.block_cols())
            || layout.row_len() >= crate::simd::x86::LONG_RUN);
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// What the one-pass kernel needs to turn a block's α into its stored scale.
pub(crate) struct FusedKernel<'a> {
    pub(crate) layout: &'a Layout,
    pub(crate) opts: &'a QuantizeOptions,
    pub(crate) dtype: ScaleDtype,
    pub(crate) half_range: f32,
    pub(crate) emax: i32,
    /// The codes go straight into large final storage: non-temporal stores (the caller ends
    /// each piece with an `_mm_sfence`).
    pub(crate) stream: bool,
}

impl<'a> FusedKernel<'a> {
    pub(crate) fn new(layout: &'a Layout, opts: &'a QuantizeOptions, stream: bool) -> Self {
        Self {
            layout,
            opts,
            dtype: layout.scheme.scale_dtype(),
            half_range: layout.scheme.half_range(),
            emax: layout.scheme.mx_emax(),
            stream,
        }
    }

    /// A two-level block's stored scale b from its amplitude, under the per-tensor scale g (as
    /// `compute_scales`).
    #[inline(always)]
    pub(crate) fn two_level_scale(&self, alpha: f32, g: f32) -> f32 {
        let o = self.opts;
        stored_scale(
            alpha,
            self.half_range,
            self.dtype,
            o.scale_rounding,
            self.emax,
            |s| to_block(s, g),
        )
    }

    #[inline(always)]
    pub(crate) fn scale(&self, alpha: f32) -> f32 {
        let o = self.opts;
        stored_scale(
            alpha,
            self.half_range,
            self.dtype,
            o.scale_rounding,
            self.emax,
            |s| s,
        )
    }
}

/// The one-pass kernels' storage: each piece's codes (one a byte) from `encode_piece(piece, its
/// values, its scales, its codes)`, then packed into `out` (or written straight, one code a
/// byte). Returns whether any piece saw a non-finite value.
pub(crate) fn encode_pieces(
    x: Input<'_>,
    layout: &Layout,
    stored: &mut [f32],
    out: StorageMut<'_>,
    encode_piece: impl Fn(&Piece, &[f32], &mut [f32], &mut [u8]) -> bool + Sync,
) -> Result<bool> {
    let pieces = pieces(layout)?;
    let mask = layout
        .packing
        .masks_bytes()
        .then(|| layout.packing.field_mask() as u8);
    match out {
        StorageMut::U8(bytes) if layout.packing.per == 1 => {
            fused_pieces(x, &pieces, stored, bytes, |p, xs, sc, out, _| {
                let bad = encode_piece(p, xs, sc, out);
                if let Some(m) = mask {
                    out.iter_mut().for_each(|c| *c &= m);
                }
                bad
            })
        }
        StorageMut::U8(words) => fused_pieces(x, &pieces, stored, words, |p, xs, sc, w, codes| {
            codes.resize(p.len, 0);
            let bad = encode_piece(p, xs, sc, codes);
            pack_last_axis(layout, codes, p.start, p.word0, w);
            bad
        }),
        StorageMut::U32(words) => fused_pieces(x, &pieces, stored, words, |p, xs, sc, w, codes| {
            codes.resize(p.len, 0);
            let bad = encode_piece(p, xs, sc, codes);
            pack_last_axis(layout, codes, p.start, p.word0, w);
            bad
        }),
    }
}

pub(crate) fn fused_pieces<W: Word>(
    x: Input<'_>,
    pieces: &[Piece],
    stored: &mut [f32],
    words: &mut [W],
    encode_piece: impl Fn(&Piece, &[f32], &mut [f32], &mut [W], &mut Vec<u8>) -> bool + Sync,
) -> Result<bool> {
    // Hand each piece its own scales and words (disjoint, in order).
    let mut work = try_with_capacity(pieces.len())?;
    let (mut sc_rest, mut w_rest) = (stored, words);
    for &p in pieces {
        let (sc, sr) = std::mem::take(&mut sc_rest).split_at_mut(p.scales);
        let (w, wr) = std::mem::take(&mut w_rest).split_at_mut(p.words);
        sc_rest = sr;
        w_rest = wr;
        work.push((p, sc, w));
    }
    // A thread's converted values and codes: scratch bounded by a piece (PIECE values, or one
    // block when blocks are longer), so left to the infallible `Vec`.
    Ok(work
        .into_par_iter()
        .map_init(
            || (Vec::new(), Vec::new()),
            |(buf, codes), (p, sc, w)| {
                // Read (or convert) the piece once, then measure and quantize it a block at a
                // time.
                let xs = x.read(p.start, p.len, buf);
                encode_piece(&p, xs, sc, w, codes)
            },
        )
        .reduce(|| false, |a, b| a | b))
}
