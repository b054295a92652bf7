//! Blocks that span several rows (block [128, 128], [2, 3, 8], ...) quantized in one pass over
//! memory, a tile at a time.
//!
//! A tile is the rows of one grid row (the tensor rows a row of blocks spans), whole up to a
//! few MiB, else cut into ranges of block columns: its blocks' amplitudes are measured, their
//! stored scales worked out, then its values encoded while the tile is still in cache (the
//! last-level cache: a whole grid row of block [128, 128] on 4096 columns is 2 MiB). The
//! two-pass path (`compute_scales`, then `encode_values`) reads a large tensor from memory
//! twice.
//!
//! Why whole grid rows, not L2-sized column ranges: a column range reads each of its rows as a
//! short strided run, which the hardware prefetcher follows badly; on a 4096 × 4096 block
//! [128, 128] int8 quantize, 128 KiB tiles took twice as long as whole grid rows (25 against
//! 12 ms, one thread), 1 MiB ones (half a grid row) 1.4 times as long.
//!
//! With f32 input and AVX2, consecutive tiles form a pipeline: tile t + 1 is measured while
//! tile t is encoded, a row of each in turn, and the row of t + 1 measured next is asked for
//! while the row of t is encoded. Measuring waits on memory, encoding (from cache) on the
//! divider; interleaved, the two overlap.
//!
//! Column blocks ([rows, 1]) take eight blocks a vector, in the measuring and the encode
//! (lane-varying divisors); when their grid row is too large for one tile they go in two
//! passes over whole rows instead (`run_columns`, which says why).
//!
//! The arithmetic is `compute_scales`' and `encode_values`' (max |x|, `stored_scale`, one
//! IEEE division a value), so the bytes and scales are the same bits.

use rayon::prelude::*;

use crate::alloc::try_zeroed;
use crate::calibrate::{for_each_row_in_grid_row, max_abs_blocks, Calibration, MIN_TASK_ELEMS};
use crate::codec::encode_run;
use crate::codec::Encode;
use crate::error::Result;
use crate::input::Input;
use crate::kernels::piece::FusedKernel;
use crate::kernels::tile_sinks::{Bytes, Packed, Shared, Sink};
use crate::layout::Layout;
use crate::pack::storage::StorageMut;

/// Bytes of f32 input a tile holds at most: a grid row up to this size is one tile. Two tiles a
/// thread (the one encoded, the one measured) stay well within the shared last-level cache.
const TILE_BYTES: usize = 4 << 20;

/// A block column (rows × block columns × 4 bytes) larger than this does not stay in cache
/// between measuring and encoding it: such schemes keep the two-pass path.
const MAX_BLOCK_BYTES: usize = 2 << 20;

/// One-level, calibrated by max |x|, blocks spanning rows, stored natively or packed along the
/// last axis: what [`quantize_tiles`] takes. Blocks whose last dim is 1 ([128, 1]) are taken
/// too: the same code is right for them, and no slower than the two-pass path (both walk them
/// a value at a time).
pub(crate) fn applies(layout: &Layout, calibration: Calibration) -> bool {
    calibration == Calibration::MinMax
        && !layout.per_tensor
        && !layout.scheme.is_two_level()
        && !layout.rows_map_directly()
        && layout.packing.axis + 1 == layout.rank()
        && layout.num_elements > 0
        && rows_per_block(layout) * layout.block_cols() * 4 <= MAX_BLOCK_BYTES
}

fn rows_per_block(layout: &Layout) -> usize {
    layout.block[..layout.rank() - 1].iter().product()
}

/// The tiles of a layout: grid row × a range of block columns.
struct Tiles {
    /// Block columns a tile (the last of a grid row may have fewer).
    blocks: usize,
    per_grid_row: usize,
    count: usize,
}

impl Tiles {
    fn new(layout: &Layout, tile_bytes: usize) -> Self {
        let (bc, gc) = (layout.block_cols(), layout.grid_cols());
        let per = layout.packing.per;
        // A tile starts on a word boundary of its rows, so no two tiles share a packed word.
        let unit = per / gcd(bc, per);
        let want = (tile_bytes / (rows_per_block(layout) * bc * 4).max(1)).max(1);
        let blocks = want.div_ceil(unit) * unit;
        let blocks = if blocks >= gc { gc } else { blocks };
        let per_grid_row = gc.div_ceil(blocks);
        let grid_rows = layout.num_scales / gc;
        Self {
            blocks,
            per_grid_row,
            count: grid_rows * per_grid_row,
        }
    }

    /// Tile `t`: its grid row, first block column and block column count.
    fn get(&self, layout: &Layout, t: usize) -> (usize, usize, usize) {
        let (g, j) = (t / self.per_grid_row, t % self.per_grid_row);
        let k0 = j * self.blocks;
        (g, k0, self.blocks.min(layout.grid_cols() - k0))
    }
}

fn gcd(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    x
}

/// A tile's values: `src[offs[i]..offs[i] + w]` is its row i (the input itself for f32, a
/// converted copy else).
struct TileRows<'a> {
    src: &'a [f32],
    offs: &'a [usize],
    w: usize,
}

impl TileRows<'_> {
    #[inline(always)]
    fn row(&self, i: usize) -> &[f32] {
        &self.src[self.offs[i]..self.offs[i] + self.w]
    }
}

/// Per-thread buffers, reused from tile to tile (no allocation a value). Bounded by a tile
/// (`TILE_BYTES`, or one block column when that is larger), so left to the infallible `Vec`.
#[derive(Default)]
struct Scratch {
    rows: Vec<usize>,
    offs: Vec<usize>,
    buf: Vec<f32>,
}

/// Quantize `x` into `out`, every stored scale into `stored` (the grid's size), a tile at a
/// time: the AVX2 build when `avx2` (the caller checked the CPU), else the portable one.
/// Returns whether any input was non-finite (the caller then builds the error).
pub(crate) fn quantize_tiles<C: Encode>(
    codec: C,
    x: Input<'_>,
    k: &FusedKernel<'_>,
    out: StorageMut<'_>,
    stored: &mut [f32],
    avx2: bool,
) -> Result<bool> {
    let sizes = Sizes {
        tile_bytes: TILE_BYTES,
        task_elems: MIN_TASK_ELEMS,
    };
    quantize_tiles_of(codec, x, k, out, stored, avx2, sizes)
}

/// How [`quantize_tiles`] cuts the work (tests make both small).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Bytes of f32 input a tile holds at most (at least one block column).
    tile_bytes: usize,
    /// Elements a task at least: small tensors stay on one thread.
    task_elems: usize,
}

/// [`quantize_tiles`], its work cut by `sizes`.
fn quantize_tiles_of<C: Encode>(
    codec: C,
    x: Input<'_>,
    k: &FusedKernel<'_>,
    out: StorageMut<'_>,
    stored: &mut [f32],
    avx2: bool,
    sizes: Sizes,
) -> Result<bool> {
    let layout = k.layout;
    assert_eq!(stored.len(), layout.num_scales);
    let tiles = Tiles::new(layout, sizes.tile_bytes);
    let sc = Shared::new(stored);
    match out {
        StorageMut::U8(w) if layout.packing.per == 1 => {
            run::<C, Bytes<'_>>(codec, x, k, &tiles, sc, Shared::new(w), avx2, sizes)
        }
        StorageMut::U8(w) => {
            run::<C, Packed<'_, u8>>(codec, x, k, &tiles, sc, Shared::new(w), avx2, sizes)
        }
        StorageMut::U32(w) => {
            run::<C, Packed<'_, u32>>(codec, x, k, &tiles, sc, Shared::new(w), avx2, sizes)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run<'l, C: Encode, S: Sink<'l>>(
    codec: C,
    x: Input<'_>,
    k: &FusedKernel<'l>,
    tiles: &Tiles,
    sc: Shared<f32>,
    words: Shared<S::W>,
    avx2: bool,
    sizes: Sizes,
) -> Result<bool> {
    let layout = k.layout;
    #[cfg(target_arch = "x86_64")]
    if let (Input::F32(xs), true) = (x, avx2) {
        if layout.block_cols() == 1 && tiles.per_grid_row > 1 {
            return run_columns::<C, S>(codec, xs, k, sc, words, sizes);
        }
        return Ok(run_pipelined::<C, S>(codec, xs, k, tiles, sc, words, sizes));
    }
    let tile_elems = rows_per_block(layout) * tiles.blocks * layout.block_cols();
    Ok((0..tiles.count)
        .into_par_iter()
        .with_min_len((sizes.task_elems / tile_elems.max(1)).max(1))
        .map_init(
            || (Scratch::default(), S::new(layout, words)),
            |(s, sink), t| {
                // SAFETY: each tile is one task, which writes only its own scales and words.
                unsafe { tile(codec, x, k, tiles, t, sc, sink, s, avx2) }
            },
        )
        .reduce(|| false, |a, b| a | b))
}

/// Column blocks ([rows, 1]) whose grid row is too large for a tile: two passes over memory,
/// each reading whole tensor rows in order. A tile of some columns would read each of its
/// rows as a short run a whole row apart, and such runs (a power of two apart, as tensor rows
/// often are) fall into the same few cache sets and evict each other before the encode comes
/// back to them: on a 4096 × 4096 block [4096, 1] int8 quantize the tiles took 33 ms, their
/// encode waiting on memory. Pass 1 takes each grid row's column maxima (the tasks' partial
/// maxima combined: a maximum does not depend on the order), pass 2 encodes its rows against
/// the scales, a row a task step.
#[cfg(target_arch = "x86_64")]
fn run_columns<'l, C: Encode, S: Sink<'l>>(
    codec: C,
    xs: &[f32],
    k: &FusedKernel<'l>,
    sc: Shared<f32>,
    words: Shared<S::W>,
    sizes: Sizes,
) -> Result<bool> {
    let layout = k.layout;
    let n = layout.row_len();
    let grid_rows = layout.num_scales / n;
    let min_rows = (sizes.task_elems / n.max(1)).max(1);
    let mut bad = false;
    // A grid row's tensor rows: as many as a block is high.
    let mut rows = Vec::new();
    for g in 0..grid_rows {
        rows.clear();
        for_each_row_in_grid_row(layout, g, |r| rows.push(r));
        // Pass 1: the maxima of the |x| patterns (a NaN shows in its column's, see below), a
        // row of them a task (a row of the input: allocated fallibly).
        let maxima = rows
            .par_iter()
            .with_min_len(min_rows)
            .fold(
                || try_zeroed::<f32>(n),
                |m, &r| {
                    let mut m = m?;
                    // SAFETY: the caller checked the CPU has AVX2.
                    unsafe {
                        crate::calibrate::max_abs_bits_blocks(&xs[r * n..(r + 1) * n], 1, &mut m)
                    };
                    Ok(m)
                },
            )
            .reduce_with(|a, b| {
                let (mut a, b) = (a?, b?);
                for (a, b) in a.iter_mut().zip(&b) {
                    *a = f32::from_bits(a.to_bits().max(b.to_bits()));
                }
                Ok(a)
            })
            .unwrap_or_else(|| try_zeroed(n))?;
        // SAFETY: only this loop writes grid row g's scales, and no task is running.
        let scales = unsafe { sc.part(g * n, n) };
        for (s, &a) in scales.iter_mut().zip(&maxima) {
            // A NaN maximum (the input holds a NaN: the call fails) becomes infinity, as the
            // largest |x| it stands for could be; the encode then finds the NaN.
            *s = k.scale(if a.is_nan() { f32::INFINITY } else { a });
        }
        let scales: &[f32] = scales;
        // Pass 2: each row against the scales, straight into its storage.
        bad |= rows
            .par_iter()
            .with_min_len(min_rows)
            .map_init(
                || {
                    let mut sink = S::new(layout, words);
                    sink.set_tile(0, n);
                    sink
                },
                |sink, &r| {
                    // SAFETY: each row is one task step, which writes only its own words; the
                    // caller checked the CPU has AVX2.
                    unsafe {
                        let out = sink.out(r);
                        let xr = &xs[r * n..(r + 1) * n];
                        let bad = encode_row_of_columns(codec, xr, scales, 1, out, k.stream);
                        sink.done(r);
                        bad
                    }
                },
            )
            .reduce(|| false, |a, b| a | b);
    }
    Ok(bad)
}

/// Runs of consecutive tiles, each a task, in which tile t + 1 is measured while tile t is
/// encoded, a row of each in turn: the measuring waits on memory, the encoding (from cache)
/// on the divider, and interleaved the two overlap. A run's first tile is measured alone, so
/// runs are few: two a thread (a slow thread is waited for briefly).
#[cfg(target_arch = "x86_64")]
fn run_pipelined<'l, C: Encode, S: Sink<'l>>(
    codec: C,
    xs: &[f32],
    k: &FusedKernel<'l>,
    tiles: &Tiles,
    sc: Shared<f32>,
    words: Shared<S::W>,
    sizes: Sizes,
) -> bool {
    let layout = k.layout;
    let tile_elems = rows_per_block(layout) * tiles.blocks * layout.block_cols();
    let by_size = (tiles.count * tile_elems).div_ceil(sizes.task_elems).max(1);
    let runs = (2 * rayon::current_num_threads())
        .min(by_size)
        .min(tiles.count);
    let per_run = tiles.count.div_ceil(runs);
    (0..tiles.count.div_ceil(per_run))
        .into_par_iter()
        .map_init(
            || (Scratch::default(), Vec::new(), S::new(layout, words)),
            |(s, next_rows, sink), j| {
                let (t0, t1) = (j * per_run, ((j + 1) * per_run).min(tiles.count));
                // SAFETY: each run of tiles is one task, which writes only its own tiles'
                // scales and words; the CPU has AVX2 (the caller's `avx2`).
                unsafe {
                    run_avx2(
                        codec,
                        xs,
                        k,
                        tiles,
                        t0..t1,
                        sc,
                        sink,
                        &mut s.rows,
                        next_rows,
                    )
                }
            },
        )
        .reduce(|| false, |a, b| a | b)
}

/// Tile `t`'s grid row, first column, width, scales (uninitialized) and tensor rows (into
/// `rows`).
///
/// # Safety
/// Only this task uses tile `t`'s scales.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::mut_from_ref)]
unsafe fn tile_at<'a>(
    layout: &Layout,
    tiles: &Tiles,
    t: usize,
    sc: &'a Shared<f32>,
    rows: &mut Vec<usize>,
) -> (usize, usize, &'a mut [f32]) {
    let (n, bc, gc) = (layout.row_len(), layout.block_cols(), layout.grid_cols());
    let (g, k0, blocks) = tiles.get(layout, t);
    let c0 = k0 * bc;
    rows.clear();
    for_each_row_in_grid_row(layout, g, |r| rows.push(r));
    (
        c0,
        ((k0 + blocks) * bc).min(n) - c0,
        sc.part(g * gc + k0, blocks),
    )
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn run_avx2<'l, C: Encode, S: Sink<'l>>(
    codec: C,
    xs: &[f32],
    k: &FusedKernel<'l>,
    tiles: &Tiles,
    run: std::ops::Range<usize>,
    sc: Shared<f32>,
    sink: &mut S,
    rows: &mut Vec<usize>,
    next_rows: &mut Vec<usize>,
) -> bool {
    use crate::simd::x86;
    use crate::simd::x86_runs;
    let layout = k.layout;
    let (n, bc) = (layout.row_len(), layout.block_cols());
    let stream = k.stream;
    // The maxima over |x| patterns: a NaN shows in its block's maximum (see `finish`).
    let measure = |rows: &[usize], c0: usize, w: usize, scales: &mut [f32], i: usize| {
        crate::calibrate::max_abs_bits_blocks(
            &xs[rows[i] * n + c0..rows[i] * n + c0 + w],
            bc,
            scales,
        );
    };
    // The tile's stored scales from its maxima, and whether its rows take the quick encode:
    // integer codes, every scale with a checked reciprocal and every quotient in range (each
    // block's largest |x| over its scale below `unclamped_below`, so every value finite too).
    // A NaN maximum (the tile holds a NaN: the call fails) becomes infinity, as the largest
    // |x| it stands for could be; the encode then finds the NaN.
    let bound = codec.int_range().and(codec.unclamped_below());
    let finish = |scales: &mut [f32]| {
        let mut quick = bound.is_some();
        for a in scales.iter_mut() {
            let alpha = if a.is_nan() { f32::INFINITY } else { *a };
            let e = k.scale(alpha);
            quick &= crate::simd::checked_reciprocal(e).is_some()
                && bound.is_some_and(|b| alpha / e < b);
            *a = e;
        }
        quick
    };
    // The run's first tile alone.
    let (mut c0, mut w, mut scales) = tile_at(layout, tiles, run.start, &sc, rows);
    scales.fill(0.0);
    for i in 0..rows.len() {
        measure(rows, c0, w, scales, i);
    }
    let mut quick = finish(scales);
    let mut bad = false;
    for t in run.clone() {
        let mut next = if t + 1 < run.end {
            let (c1, w1, s1) = tile_at(layout, tiles, t + 1, &sc, next_rows);
            s1.fill(0.0);
            Some((c1, w1, s1))
        } else {
            next_rows.clear();
            None
        };
        sink.set_tile(c0, w);
        for i in 0..rows.len().max(next_rows.len()) {
            if let Some((c1, w1, s1)) = &mut next {
                if i < next_rows.len() {
                    measure(next_rows, *c1, *w1, s1, i);
                }
            }
            let Some(&r) = rows.get(i) else { continue };
            // The next tile's row after this one is asked for a block's worth at a time as
            // this row is encoded, so its measuring finds it in cache: the encoding alone
            // keeps no load from memory in flight.
            let ahead = match (&next, next_rows.get(i + 1)) {
                (Some((c1, w1, _)), Some(&r1)) => (xs.as_ptr().wrapping_add(r1 * n + c1), *w1),
                _ => (xs.as_ptr(), 0),
            };
            let xr = &xs[r * n + c0..r * n + c0 + w];
            let out = sink.out(r);
            if narrow(bc) {
                // Column blocks (a scale a value) and blocks of one or two vectors: eight
                // values a vector, four vectors a step, whatever their blocks.
                x86::prefetch(ahead.0, ahead.1);
                bad |= encode_row_of_columns(codec, xr, &scales[..w.div_ceil(bc)], bc, out, stream);
                sink.done(r);
                continue;
            }
            let mut off = 0;
            for ((run, o), &e) in xr.chunks(bc).zip(out.chunks_mut(bc)).zip(scales.iter()) {
                if off < ahead.1 {
                    x86::prefetch(ahead.0.wrapping_add(off), bc.min(ahead.1 - off));
                    off += bc;
                }
                if quick {
                    x86_runs::encode_run_recip_in_range::<C, false>(codec, run, e, o, stream);
                } else {
                    bad |= x86_runs::encode_run_or_zero(codec, run, e, o, stream);
                }
            }
            if off < ahead.1 {
                x86::prefetch(ahead.0.wrapping_add(off), ahead.1 - off);
            }
            sink.done(r);
        }
        let Some((c1, w1, s1)) = next else { break };
        quick = finish(s1);
        (c0, w, scales) = (c1, w1, s1);
        std::mem::swap(rows, next_rows);
    }
    if stream {
        // The non-temporal stores are weakly ordered: done before the task says it is done.
        std::arch::x86_64::_mm_sfence();
    }
    bad
}

/// Measure and encode tile `t` (converted input, or no AVX2).
///
/// # Safety
/// No other task works on tile `t` at the same time; `avx2` only where the CPU has AVX2.
#[allow(clippy::too_many_arguments)]
unsafe fn tile<'l, C: Encode, S: Sink<'l>>(
    codec: C,
    x: Input<'_>,
    k: &FusedKernel<'l>,
    tiles: &Tiles,
    t: usize,
    sc: Shared<f32>,
    sink: &mut S,
    s: &mut Scratch,
    avx2: bool,
) -> bool {
    let layout = k.layout;
    let (n, bc, gc) = (layout.row_len(), layout.block_cols(), layout.grid_cols());
    let (g, k0, blocks) = tiles.get(layout, t);
    let c0 = k0 * bc;
    let w = ((k0 + blocks) * bc).min(n) - c0;
    sink.set_tile(c0, w);
    s.rows.clear();
    for_each_row_in_grid_row(layout, g, |r| s.rows.push(r));
    s.offs.clear();
    let src: &[f32] = match x {
        Input::F32(xs) => {
            s.offs.extend(s.rows.iter().map(|r| r * n + c0));
            xs
        }
        _ => {
            s.buf.resize(s.rows.len() * w, 0.0);
            for (i, r) in s.rows.iter().enumerate() {
                x.convert(r * n + c0, &mut s.buf[i * w..(i + 1) * w]);
                s.offs.push(i * w);
            }
            &s.buf
        }
    };
    let rows = TileRows {
        src,
        offs: &s.offs,
        w,
    };
    let scales = sc.part(g * gc + k0, blocks);
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        return tile_avx2(codec, k, &rows, &s.rows, scales, sink);
    }
    tile_portable(codec, k, &rows, &s.rows, scales, sink)
}

/// The stored scales of a tile's blocks into `scales`, from the max |x| over its `count` rows.
#[inline(always)]
fn measure(k: &FusedKernel<'_>, rows: &TileRows<'_>, count: usize, scales: &mut [f32]) {
    let bc = k.layout.block_cols();
    scales.fill(0.0);
    for i in 0..count {
        max_abs_blocks(rows.row(i), bc, scales);
    }
    for a in scales.iter_mut() {
        *a = k.scale(*a);
    }
}

unsafe fn tile_portable<'l, C: Encode, S: Sink<'l>>(
    codec: C,
    k: &FusedKernel<'_>,
    rows: &TileRows<'_>,
    tensor_rows: &[usize],
    scales: &mut [f32],
    sink: &mut S,
) -> bool {
    let bc = k.layout.block_cols();
    measure(k, rows, tensor_rows.len(), scales);
    let mut bad = false;
    for (i, &r) in tensor_rows.iter().enumerate() {
        let xs = rows.row(i);
        let out = sink.out(r);
        for ((run, o), &e) in xs.chunks(bc).zip(out.chunks_mut(bc)).zip(scales.iter()) {
            bad |= encode_run(codec, run, e, o);
        }
        sink.done(r);
    }
    bad
}

/// [`tile_portable`] with AVX2 (converted input, read from its buffer): the runs by the AVX2
/// encoder, non-temporal stores into large one-a-byte storage.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2<'l, C: Encode, S: Sink<'l>>(
    codec: C,
    k: &FusedKernel<'_>,
    rows: &TileRows<'_>,
    tensor_rows: &[usize],
    scales: &mut [f32],
    sink: &mut S,
) -> bool {
    use crate::simd::x86_runs;
    let layout = k.layout;
    let bc = layout.block_cols();
    let stream = k.stream;
    measure(k, rows, tensor_rows.len(), scales);
    let mut bad = false;
    for (i, &r) in tensor_rows.iter().enumerate() {
        let xs = rows.row(i);
        let out = sink.out(r);
        if narrow(bc) {
            let sc = &scales[..xs.len().div_ceil(bc)];
            bad |= encode_row_of_columns(codec, xs, sc, bc, out, stream);
        } else {
            for ((run, o), &e) in xs.chunks(bc).zip(out.chunks_mut(bc)).zip(scales.iter()) {
                bad |= x86_runs::encode_run_or_zero(codec, run, e, o, stream);
            }
        }
        sink.done(r);
    }
    if stream {
        // The non-temporal stores are weakly ordered: done before the task says it is done.
        std::arch::x86_64::_mm_sfence();
    }
    bad
}

/// Whether [`encode_row_of_columns`] takes a tile row of blocks `bc` wide: column blocks, and
/// blocks of 8 or 16 (one or two vectors, where handing each block to `encode_run` on its own
/// cost more than encoding it: block [8, 8] ran at a third of `np.copyto`'s pace).
fn narrow(bc: usize) -> bool {
    matches!(bc, 1 | 8 | 16)
}

/// A tile row of narrow blocks, `bc` 1 (column blocks, block [rows, 1]), 8 or 16: value c
/// divided by its block's stored scale `scales[c / bc]`, eight values a vector (lane-varying
/// divisors for column blocks, a block's broadcast else; the division of `encode_run`, so the
/// same codes), codes one a byte into `out`, 32 at a time (non-temporal with `stream` where
/// `out` allows, then fenced), the rest eight at a time. Values with a zero scale among their
/// 32 (or 8) go one at a time (the zero rule). Returns whether any value was not finite.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn encode_row_of_columns<C: Encode>(
    codec: C,
    xr: &[f32],
    scales: &[f32],
    bc: usize,
    out: &mut [u8],
    stream: bool,
) -> bool {
    use std::arch::x86_64::*;
    let n = xr.len();
    assert!(narrow(bc) && scales.len() == n.div_ceil(bc) && out.len() == n);
    let shift = bc.trailing_zeros();
    // Values `r` one at a time, each a run of its own (the zero rule, the tail).
    #[inline(always)]
    unsafe fn each<C: Encode>(
        codec: C,
        r: std::ops::Range<usize>,
        xr: &[f32],
        scales: &[f32],
        shift: u32,
        out: &mut [u8],
    ) -> bool {
        let mut bad = false;
        for j in r {
            let (x, o) = (&xr[j..j + 1], &mut out[j..j + 1]);
            let e = scales[j >> shift];
            bad |= crate::simd::x86_runs::encode_run_or_zero(codec, x, e, o, false);
        }
        bad
    }
    // The divisors of values c..c + 8 (in bounds: c + 8 <= n, and c / bc < scales.len()).
    let divisors = |c: usize| {
        if bc == 1 {
            _mm256_loadu_ps(scales.as_ptr().add(c))
        } else {
            _mm256_set1_ps(*scales.get_unchecked(c >> shift))
        }
    };
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let mut big = _mm256_setzero_si256();
    let mut bad = false;
    let mut c = 0;
    let zero = _mm256_setzero_ps();
    let base = out.as_ptr() as usize;
    let mut streamed = false;
    while c + 32 <= n {
        // In bounds: c + 32 <= n, the length of all three.
        let x = xr.as_ptr().add(c);
        let e: [__m256; 4] = std::array::from_fn(|t| divisors(c + 8 * t));
        let zeros = e.iter().fold(0, |m, &e| {
            m | _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(e, zero))
        });
        if zeros != 0 {
            bad |= each(codec, c..c + 32, xr, scales, shift, out);
            c += 32;
            continue;
        }
        let mut codes = [_mm256_setzero_si256(); 4];
        for (t, code) in codes.iter_mut().enumerate() {
            let v = _mm256_loadu_ps(x.add(8 * t));
            big = _mm256_max_epi32(big, _mm256_and_si256(_mm256_castps_si256(v), abs));
            *code = codec.encode8(_mm256_div_ps(v, e[t]));
        }
        let s = stream && (base + c).is_multiple_of(16);
        streamed |= s;
        crate::kernels::lanes::store_codes::<4>(&codes, out.as_mut_ptr().add(c), s);
        c += 32;
    }
    if streamed {
        // The non-temporal stores are weakly ordered: done before the task says it is done.
        _mm_sfence();
    }
    while c + 8 <= n {
        // In bounds: c + 8 <= n, the length of all three.
        let v = _mm256_loadu_ps(xr.as_ptr().add(c));
        let e = divisors(c);
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(e, zero)) != 0 {
            bad |= each(codec, c..c + 8, xr, scales, shift, out);
        } else {
            big = _mm256_max_epi32(big, _mm256_and_si256(_mm256_castps_si256(v), abs));
            let code = codec.encode8(_mm256_div_ps(v, e));
            // Eight i32 codes (0..=255) to eight bytes, in order.
            let w = _mm256_packus_epi32(code, code);
            let b = _mm256_packus_epi16(w, w);
            let lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(b)) as u32;
            let hi = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(b)) as u32;
            let bytes = (lo as u64) | ((hi as u64) << 32);
            std::ptr::write_unaligned(out.as_mut_ptr().add(c) as *mut u64, bytes.to_le());
        }
        c += 8;
    }
    bad |= each(codec, c..n, xr, scales, shift, out);
    // A value past f32::MAX's pattern is an infinity or a NaN.
    let non_finite = _mm256_cmpgt_epi32(big, _mm256_set1_epi32(0x7F7F_FFFF));
    bad | (_mm256_movemask_epi8(non_finite) != 0)
}

#[cfg(test)]
#[path = "fused_tiles_tests.rs"]
mod tests;
