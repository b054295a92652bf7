//! Calibration (format.md "Calibration"): the amplitude α of every block (or of the tensor).
//!
//! `minmax` is max |x|. `absmean` is mean |x| with the sum taken exactly: the f64 sum of a
//! block is kept when it is provably exact (every partial sum representable), else recomputed
//! with an exact accumulator. Exactness makes the result independent of summation order, so
//! threads and the numpy reference agree to the bit.

use rayon::prelude::*;

use crate::alloc::{try_vec, try_zeroed};
use crate::error::Result;
use crate::exact_sum::{mean, AbsSum, ExactSum};
use crate::input::Input;
use crate::layout::Layout;
use crate::simd::{avx2_dispatch, max_abs, max_abs_portable};

/// How α is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Calibration {
    /// α = max |x| over the block.
    #[default]
    MinMax,
    /// α = mean |x| over the block (BitNet b1.58).
    AbsMean,
    /// The stored scale of least squared error among candidates around minmax's
    /// (`crate::search`); its α is minmax's.
    Mse,
}

/// Work per rayon task, in elements: small arrays stay on one thread.
pub(crate) const MIN_TASK_ELEMS: usize = 1 << 16;

/// Tasks [`amplitudes`] aims for at least (a few per thread, so a slow thread is waited for
/// briefly), before cutting grid rows into column ranges.
const TASKS_WANTED: usize = 16;

/// α for every block of `layout` (one value for per-tensor).
pub fn amplitudes(x: Input<'_>, layout: &Layout, calibration: Calibration) -> Result<Vec<f32>> {
    if layout.per_tensor {
        return Ok(vec![tensor_amplitude(x, calibration)]);
    }
    let gc = layout.grid_cols();
    let mut alpha = try_zeroed(layout.num_scales)?;
    if layout.num_elements == 0 || gc == 0 {
        return Ok(alpha);
    }
    let bc = layout.block_cols();
    let rows_per_block: usize = layout.block[..layout.rank() - 1].iter().product();
    let elems_per_grid_row = rows_per_block * layout.row_len();
    let grid_rows_per_task = (MIN_TASK_ELEMS / elems_per_grid_row.max(1)).max(1);
    // A grid row is split along its columns only as far as it takes to give the threads work:
    // a narrow task of a 2-D block reads every row of it in short strided pieces, which the
    // hardware prefetcher follows badly (block[128, 128]: 2 KiB a row a task).
    let grid_rows = layout.num_scales / gc;
    let splits = (TASKS_WANTED.div_ceil(grid_rows.max(1))).min(gc);
    let min_cols = (MIN_TASK_ELEMS / (rows_per_block * bc).max(1)).max(1);
    // At most 2^19 values of a row a task (a non-f32 input is converted a row piece at a time).
    let max_cols = ((8 * MIN_TASK_ELEMS) / bc.max(1)).max(min_cols);
    let cols_per_task = gc.div_ceil(splits).clamp(min_cols, max_cols);
    alpha
        .par_chunks_mut(gc)
        .with_min_len(grid_rows_per_task)
        .enumerate()
        .try_for_each(|(g, arow)| {
            let cols = |ci: usize, achunk: &mut [f32]| {
                let k0 = ci * cols_per_task;
                match calibration {
                    Calibration::MinMax | Calibration::Mse => {
                        max_abs_cols(x, layout, g, k0, achunk);
                        Ok(())
                    }
                    Calibration::AbsMean => mean_abs_cols(x, layout, g, k0, achunk),
                }
            };
            // A grid row of one task's columns (short rows: a conv kernel's rows of 3 are a
            // grid row each) without a nested parallel loop's set-up.
            if arow.len() <= cols_per_task {
                cols(0, arow)
            } else {
                arow.par_chunks_mut(cols_per_task)
                    .enumerate()
                    .try_for_each(|(ci, achunk)| cols(ci, achunk))
            }
        })?;
    Ok(alpha)
}

/// Calls `f(row)` for every tensor row in grid row `g` (the rows its blocks span).
pub(crate) fn for_each_row_in_grid_row(layout: &Layout, g: usize, mut f: impl FnMut(usize)) {
    let rank = layout.rank();
    let lead = rank - 1;
    if !layout.per_tensor && layout.rows_map_directly() {
        // Blocks one row high: grid row g is tensor row g (no odometer, no allocation).
        f(g);
        return;
    }
    // Start and end of the row range on each leading axis.
    let mut lo = vec![0usize; lead];
    let mut hi = vec![0usize; lead];
    let mut rem = g;
    for ax in (0..lead).rev() {
        let gi = rem % layout.grid[ax];
        rem /= layout.grid[ax];
        lo[ax] = gi * layout.block[ax];
        hi[ax] = (lo[ax] + layout.block[ax]).min(layout.dims[ax]);
    }
    if lead == 0 {
        f(0);
        return;
    }
    let mut idx = lo.clone();
    loop {
        let mut row = 0;
        for (d, i) in layout.dims[..lead].iter().zip(&idx[..lead]) {
            row = row * d + i;
        }
        f(row);
        // Odometer over the leading axes, innermost fastest.
        let mut ax = lead;
        loop {
            if ax == 0 {
                return;
            }
            ax -= 1;
            idx[ax] += 1;
            if idx[ax] < hi[ax] {
                break;
            }
            idx[ax] = lo[ax];
        }
    }
}

/// The columns of `row` that blocks `k0..k0 + blocks` of a grid row cover, as f32.
fn row_blocks<'s>(
    x: &'s Input<'_>,
    layout: &Layout,
    row: usize,
    k0: usize,
    blocks: usize,
    buf: &'s mut Vec<f32>,
) -> &'s [f32] {
    // `buf` (a non-f32 input's converted piece) holds one task's columns of a row: at most
    // 2^19 values, or one block where blocks are wider (see `amplitudes`).
    let n = layout.row_len();
    let bc = layout.block_cols();
    let c0 = k0 * bc;
    let c1 = ((k0 + blocks) * bc).min(n);
    x.read(row * n + c0, c1 - c0, buf)
}

fn max_abs_cols(x: Input<'_>, layout: &Layout, g: usize, k0: usize, out: &mut [f32]) {
    let bc = layout.block_cols();
    let mut buf = Vec::new();
    for_each_row_in_grid_row(layout, g, |row| {
        let cols = row_blocks(&x, layout, row, k0, out.len(), &mut buf);
        max_abs_blocks(cols, bc, out);
    });
}

/// `out[k] = max(out[k], max |x| over block k of cols)`, blocks of `bc` columns: eight whole
/// blocks at a time in vector lanes when `bc` is a multiple of 8 and the CPU has AVX2 (one
/// horizontal maximum per block costs more than reading it), else block by block.
pub(crate) fn max_abs_blocks(cols: &[f32], bc: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if bc.is_multiple_of(8) && crate::simd::has_avx2() {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { max_abs_blocks_8s(cols, bc, out) };
    }
    max_abs_blocks_any(cols, bc, out)
}

avx2_dispatch! {
    fn max_abs_blocks_any[](cols: &[f32], bc: usize, out: &mut [f32]) => max_abs_blocks_portable;
}

/// [`max_abs_blocks`] for `bc` a multiple of 8: groups of eight whole blocks by
/// `x86::max_abs_8runs` (the same maxima as [`max_abs_portable`], NaNs passed over alike), the
/// rest (and a partial last block) by the portable loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_abs_blocks_8s(cols: &[f32], bc: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let groups = (cols.len() / bc).min(out.len()) / 8;
    for g in 0..groups {
        // In bounds: blocks 8g..8g + 8 are whole within cols and out.
        let p = cols.as_ptr().add(g * 8 * bc);
        crate::simd::x86::prefetch(p.wrapping_add(crate::simd::x86::PREFETCH_AHEAD), 8 * bc);
        let m = crate::simd::x86::max_abs_8runs(p, bc);
        let o = out.as_mut_ptr().add(g * 8);
        // `max(m, old)` keeps old where m is NaN (never: NaNs were passed over) and takes m
        // where it is larger, as the portable `if m > a { m } else { a }`.
        _mm256_storeu_ps(o, _mm256_max_ps(m, _mm256_loadu_ps(o)));
    }
    let done = groups * 8;
    max_abs_blocks_portable(&cols[(done * bc).min(cols.len())..], bc, &mut out[done..]);
}

/// [`max_abs_blocks`] with the maxima taken over the |x| bit patterns (`out` holds f32s,
/// compared as their patterns, which order as the values for finite |x|), eight whole blocks
/// at a time: the same maxima for finite and infinite values, but a NaN is not passed over. A
/// block holding one gets a NaN maximum, so one look at the maxima tells whether any input
/// was not finite. The CPU must have AVX2 (the tile kernel's measure).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn max_abs_bits_blocks(cols: &[f32], bc: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut done = 0;
    if bc == 1 {
        // Column blocks ([rows, 1]): each value is its block's run in this row, eight
        // neighbouring blocks a vector.
        let abs = _mm256_set1_epi32(0x7FFF_FFFF);
        let n = cols.len().min(out.len());
        while done + 8 <= n {
            // In bounds: done + 8 <= both lengths.
            let v = _mm256_loadu_si256(cols.as_ptr().add(done) as *const __m256i);
            let o = out.as_mut_ptr().add(done) as *mut __m256i;
            let m = _mm256_max_epi32(_mm256_and_si256(v, abs), _mm256_loadu_si256(o));
            _mm256_storeu_si256(o, m);
            done += 8;
        }
    } else if bc.is_multiple_of(8) {
        let groups = (cols.len() / bc).min(out.len()) / 8;
        for g in 0..groups {
            // In bounds: blocks 8g..8g + 8 are whole within cols and out.
            let p = cols.as_ptr().add(g * 8 * bc);
            crate::simd::x86::prefetch(p.wrapping_add(crate::simd::x86::PREFETCH_AHEAD), 8 * bc);
            let m = crate::simd::x86::max_abs_bits_8runs_len(p, bc);
            let o = out.as_mut_ptr().add(g * 8) as *mut __m256i;
            _mm256_storeu_si256(o, _mm256_max_epi32(m, _mm256_loadu_si256(o)));
        }
        done = groups * 8;
    }
    for (a, seg) in out[done..]
        .iter_mut()
        .zip(cols[(done * bc).min(cols.len())..].chunks(bc))
    {
        let m = seg
            .iter()
            .map(|v| v.to_bits() & 0x7FFF_FFFF)
            .max()
            .unwrap_or(0);
        *a = f32::from_bits(m.max(a.to_bits()));
    }
}

#[inline(always)]
fn max_abs_blocks_portable(cols: &[f32], bc: usize, out: &mut [f32]) {
    for (a, seg) in out.iter_mut().zip(cols.chunks(bc)) {
        let m = max_abs_portable(seg);
        *a = if m > *a { m } else { *a };
    }
}

fn mean_abs_cols(
    x: Input<'_>,
    layout: &Layout,
    g: usize,
    k0: usize,
    out: &mut [f32],
) -> Result<()> {
    let bc = layout.block_cols();
    let mut buf = Vec::new();
    // One accumulator a block of the task's columns (up to 2^19 of them: fallible).
    let mut acc = try_vec(out.len(), AbsSum::default())?;
    for_each_row_in_grid_row(layout, g, |row| {
        let cols = row_blocks(&x, layout, row, k0, out.len(), &mut buf);
        for (a, seg) in acc.iter_mut().zip(cols.chunks(bc)) {
            a.add_all(seg);
        }
    });
    let gc = layout.grid_cols();
    for (j, (a, o)) in acc.iter().zip(out.iter_mut()).enumerate() {
        let count = layout.block_count(g * gc + k0 + j);
        *o = a.mean(count, || {
            let mut exact = ExactSum::default();
            for_each_row_in_grid_row(layout, g, |row| {
                exact.add_all(row_blocks(&x, layout, row, k0 + j, 1, &mut buf));
            });
            exact.to_f64()
        });
    }
    Ok(())
}

/// α of one block held in one contiguous run (1-D blocks): what [`amplitudes`] computes for it.
/// Inlined into its caller's (possibly AVX2) build.
#[inline(always)]
pub(crate) fn run_amplitude(xs: &[f32], calibration: Calibration) -> f32 {
    match calibration {
        Calibration::MinMax | Calibration::Mse => max_abs_portable(xs),
        Calibration::AbsMean => {
            let mut a = AbsSum::default();
            a.add_all(xs);
            a.mean(xs.len(), || {
                let mut e = ExactSum::default();
                e.add_all(xs);
                e.to_f64()
            })
        }
    }
}

pub(crate) fn tensor_amplitude(x: Input<'_>, calibration: Calibration) -> f32 {
    let n = x.len();
    let chunks = n.div_ceil(MIN_TASK_ELEMS);
    let span = |c: usize| {
        let start = c * MIN_TASK_ELEMS;
        (start, MIN_TASK_ELEMS.min(n - start))
    };
    match calibration {
        Calibration::MinMax | Calibration::Mse => (0..chunks)
            .into_par_iter()
            .map_init(Vec::new, |buf, c| {
                let (start, len) = span(c);
                max_abs(x.read(start, len, buf))
            })
            .reduce(|| 0.0, f32::max),
        Calibration::AbsMean => {
            // One pass: the exact sum of each chunk, mostly in f64 lanes (see
            // `ExactSum::add_chunk`), merged exactly.
            let sum = (0..chunks)
                .into_par_iter()
                .map_init(
                    || (Vec::new(), 0),
                    |(buf, guess), c| {
                        let (start, len) = span(c);
                        let mut e = ExactSum::default();
                        // The guess carries over from this thread's last chunk (its
                        // neighbour, mostly): only a call's first sub-chunk takes two passes.
                        *guess = e.add_chunk_guessing(x.read(start, len, buf), *guess);
                        e
                    },
                )
                .reduce(ExactSum::default, ExactSum::merge)
                .to_f64();
            mean(sum, n)
        }
    }
}

#[cfg(test)]
#[path = "calibrate_tests.rs"]
mod tests;
