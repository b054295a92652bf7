//! Calibration (format.md "Calibration"): the amplitude α of every block (or of the tensor).
//!
//! `minmax` is max |x|. `absmean` is mean |x| with the sum taken exactly: the f64 sum of a
//! block is kept when it is provably exact (every partial sum representable), else recomputed
//! with an exact accumulator. Exactness makes the result independent of summation order, so
//! threads and the numpy reference agree to the bit.

use rayon::prelude::*;

use crate::alloc::{try_vec, try_zeroed};
use crate::error::Result;
use crate::input::Input;
use crate::layout::Layout;
use crate::simd::avx2_dispatch;

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

fn mean(sum: f64, count: usize) -> f32 {
    if count == 0 {
        0.0
    } else {
        (sum / count as f64) as f32
    }
}

/// max |x| of a slice (NaNs passed over): the AVX2 kernel when the CPU has it.
pub(crate) fn max_abs(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(xs: &[f32]) -> f32 {
            crate::simd::x86::max_abs_prefetching(xs)
        }
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { avx2(xs) };
    }
    max_abs_portable(xs)
}

/// Written so it compiles to packed max instructions: 8 independent lanes.
#[inline(always)]
fn max_abs_portable(xs: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            let a = c[i].abs();
            lanes[i] = if a > lanes[i] { a } else { lanes[i] };
        }
    }
    let mut m = 0.0f32;
    for &a in lanes.iter() {
        m = if a > m { a } else { m };
    }
    for v in chunks.remainder() {
        let a = v.abs();
        m = if a > m { a } else { m };
    }
    m
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

/// An f64 sum of |x| with what it takes to prove it exact.
#[derive(Debug, Clone, Copy)]
struct AbsSum {
    sum: f64,
    max: f32,
    /// The smallest nonzero |x| (its ulp divides every partial sum).
    min_nonzero: f32,
}

impl Default for AbsSum {
    fn default() -> Self {
        Self {
            sum: 0.0,
            max: 0.0,
            min_nonzero: f32::INFINITY,
        }
    }
}

impl AbsSum {
    fn add_all(&mut self, xs: &[f32]) {
        for &x in xs {
            let a = x.abs();
            self.sum += a as f64;
            self.max = if a > self.max { a } else { self.max };
            if a != 0.0 && a < self.min_nonzero {
                self.min_nonzero = a;
            }
        }
    }

    /// The mean |x| over `count` values: from this f64 sum when it is provably exact, else from
    /// `exact_sum` (rare: magnitudes spanning more than ~2^29 within one block).
    fn mean(&self, count: usize, exact_sum: impl FnOnce() -> f64) -> f32 {
        let sum = if self.is_exact(count) {
            self.sum
        } else {
            exact_sum()
        };
        mean(sum, count)
    }

    /// Every partial sum is a multiple of u = ulp(min_nonzero) and at most count·max; if that
    /// is ≤ 2^53·u, all of them are exact in f64, in any order.
    fn is_exact(&self, count: usize) -> bool {
        if self.max == 0.0 {
            return true;
        }
        if !self.max.is_finite() {
            return false;
        }
        let e = ((self.min_nonzero.to_bits() >> 23) as i32).max(1);
        let ulp = 2f64.powi(e - 127 - 23);
        (count as f64) * (self.max as f64) <= 2f64.powi(53) * ulp
    }
}

/// The exact sum of |x| over f32 values: mantissas accumulated per exponent, combined into a
/// wide integer, then rounded once to f64 (what Python's `math.fsum` returns).
#[derive(Debug, Clone)]
struct ExactSum {
    by_exp: Box<[u64; 255]>,
}

impl Default for ExactSum {
    fn default() -> Self {
        Self {
            by_exp: Box::new([0; 255]),
        }
    }
}

/// Limbs of the wide accumulator: 2^(254+24+40) fits in 6 × 64 bits.
const LIMBS: usize = 6;

impl ExactSum {
    fn add_all(&mut self, xs: &[f32]) {
        for &x in xs {
            let b = x.to_bits() & 0x7FFF_FFFF;
            let e = (b >> 23) as usize;
            if e == 255 {
                continue; // non-finite: rejected later by the quantize pass
            }
            let m = (b & 0x7F_FFFF) as u64 | if e == 0 { 0 } else { 0x80_0000 };
            self.by_exp[e] += m;
        }
    }

    /// [`ExactSum::add_all`] of at most 2^16 values, fast: with E the exponent of their
    /// largest |x|, those of exponent T = E − 13 or more are multiples of 2^(T−23) and sum to
    /// less than 2^16 · 2^(E+1) = 2^(T+30), so every partial sum of them is exact in f64, in
    /// any order: they are summed in eight f64 lanes, and the total (exact) added as one
    /// entry. The few smaller ones (and nothing else) go through the per-exponent entries.
    ///
    /// Done a sub-chunk of [`SUB_CHUNK`] values at a time: while one is summed (from cache,
    /// compute-bound), the next is asked for from memory, so the max pass over it, which waits
    /// on memory, finds it in cache.
    fn add_chunk(&mut self, xs: &[f32]) {
        assert!(xs.len() <= 1 << 16, "a chunk of at most 2^16 values");
        let mut rest = xs;
        while !rest.is_empty() {
            let (sub, next) = rest.split_at(rest.len().min(SUB_CHUNK));
            self.add_sub_chunk(sub, next);
            rest = next;
        }
    }

    /// [`ExactSum::add_chunk`] in one pass over memory where it can: each sub-chunk's
    /// threshold T from `guess`, the bits of the largest |x| of the sub-chunk before (0: none),
    /// its max found in the same pass (see [`ExactSum::add_sub_chunk_guessed`]). The max pass
    /// of `add_chunk` waits on memory, then its sum from cache is compute-bound: two thirds more
    /// time than one pass at the memory's pace. Returns the last sub-chunk's max |x| bits.
    fn add_chunk_guessing(&mut self, xs: &[f32], mut guess: u32) -> u32 {
        assert!(xs.len() <= 1 << 16, "a chunk of at most 2^16 values");
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2() {
            for sub in xs.chunks(SUB_CHUNK) {
                guess = if guess == 0 || guess >= 0x7F80_0000 {
                    self.add_sub_chunk(sub, &[])
                } else {
                    // SAFETY: the CPU has AVX2, checked just above.
                    unsafe { self.add_sub_chunk_guessed(sub, guess) }
                };
            }
            return guess;
        }
        self.add_chunk(xs);
        guess
    }

    /// One sub-chunk (at most [`SUB_CHUNK`] values) in one pass: T from `guess` (bits of a
    /// finite nonzero |x|), the big values summed as in [`big_sum`] while their max E' is
    /// found. The sum is exact when the lanes' partial sums, at most n · 2^(E'+1), stay within
    /// 2^53 units of 2^(T−23); when E' is past that (or non-finite), the small values entered
    /// are taken out again (integer entries: exactly) and the sub-chunk goes through
    /// [`ExactSum::add_sub_chunk`]. A guess too large costs time only (more small values), and
    /// the next sub-chunk guesses this one's max. Returns the bits of its max |x|.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn add_sub_chunk_guessed(&mut self, xs: &[f32], guess: u32) -> u32 {
        debug_assert!(xs.len() <= SUB_CHUNK && guess != 0 && guess < 0x7F80_0000);
        let t = ((guess >> 23) as i32 - 13).max(1) as u32;
        let (total, max_bits) = big_sum_max_avx2(xs, t, self);
        // Biased exponents: |x| < 2^(max(E', 1) − 126); units 2^(T − 150).
        let e_max = (max_bits >> 23).max(1);
        let log_n = xs.len().next_power_of_two().trailing_zeros();
        if max_bits >= 0x7F80_0000 || e_max + log_n > t + 29 {
            small_ones_taken_out(xs, t, self);
            return self.add_sub_chunk(xs, &[]);
        }
        let units = total * 2f64.powi(150 - t as i32);
        debug_assert!(units.fract() == 0.0 && units < 2f64.powi(53));
        self.by_exp[t as usize] += units as u64;
        max_bits
    }

    /// [`ExactSum::add_chunk`] of one sub-chunk; the start of `next` is prefetched meanwhile.
    /// Returns the bits of its max |x| (NaNs passed over).
    fn add_sub_chunk(&mut self, xs: &[f32], next: &[f32]) -> u32 {
        let max = max_abs(xs);
        if max == 0.0 {
            // All zero (NaNs, passed over by the max, are not summed either): nothing to add.
            return 0;
        }
        if !max.is_finite() {
            self.add_all(xs); // a non-finite value (rejected later)
            return max.to_bits();
        }
        // Biased exponents: T = max(E − 13, −126), so that 2^(T−23) is an entry's unit.
        let t = ((max.to_bits() >> 23) as i32 - 13).max(1) as u32;
        // Every partial sum is exact, so the order (lanes, vectors) does not matter.
        let total = big_sum(xs, t, self, &next[..next.len().min(SUB_CHUNK)]);
        // total = M · 2^(T−23) with M < 2^53: entry T (biased) holds units of 2^(T−150).
        let units = total * 2f64.powi(150 - t as i32);
        debug_assert!(units.fract() == 0.0 && units < 2f64.powi(53));
        self.by_exp[t as usize] += units as u64;
        max.to_bits()
    }

    fn merge(mut self, o: Self) -> Self {
        for (a, b) in self.by_exp.iter_mut().zip(o.by_exp.iter()) {
            *a += b;
        }
        self
    }

    /// Σ by_exp[e] · 2^(max(e,1) - 150), correctly rounded to f64.
    fn to_f64(&self) -> f64 {
        // Integer in units of 2^-149.
        let mut big = [0u64; LIMBS];
        for (e, &m) in self.by_exp.iter().enumerate() {
            if m == 0 {
                continue;
            }
            let shift = e.max(1) - 1;
            add_shifted(&mut big, m, shift);
        }
        big_to_f64(&big, -149)
    }
}

/// Values of a sub-chunk of [`ExactSum::add_chunk`]: 64 KiB, half of a core's L2 with the
/// next one coming in.
const SUB_CHUNK: usize = 1 << 14;

/// The f64 sum of the |x| of biased exponent `t` or more (and finite) in `xs`; every other
/// value goes into `small`'s per-exponent entries. See [`ExactSum::add_chunk`].
/// `ahead`'s cache lines are asked for meanwhile (the AVX2 build).
fn big_sum(xs: &[f32], t: u32, small: &mut ExactSum, ahead: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { big_sum_avx2(xs, t, small, ahead) };
    }
    let _ = ahead;
    big_sum_portable(xs, t, small)
}

#[inline(always)]
fn big_sum_portable(xs: &[f32], t: u32, small: &mut ExactSum) -> f64 {
    let mut lanes = [0.0f64; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        let mut any_small = false;
        for (l, &x) in lanes.iter_mut().zip(c) {
            let b = x.to_bits() & 0x7FFF_FFFF;
            let e = b >> 23;
            let big = e >= t && e != 255; // a NaN (max passes over it) is skipped below
            *l += if big { f32::from_bits(b) as f64 } else { 0.0 };
            any_small |= !big;
        }
        if any_small {
            small_ones(c, t, small);
        }
    }
    let rest = chunks.remainder();
    small_ones(rest, t, small);
    for &x in rest {
        let e = (x.to_bits() & 0x7FFF_FFFF) >> 23;
        if e >= t && e != 255 {
            lanes[0] += x.abs() as f64;
        }
    }
    lanes.iter().sum()
}

/// The values of `xs` below exponent `t` (or non-finite) into `small`'s entries.
#[inline(always)]
fn small_ones(xs: &[f32], t: u32, small: &mut ExactSum) {
    for &x in xs {
        let e = (x.to_bits() & 0x7FFF_FFFF) >> 23;
        if e < t || e == 255 {
            small.add_all(std::slice::from_ref(&x));
        }
    }
}

/// Eight values from `p` (`m`: the |x| mask, the bits just below the big range and infinity's):
/// the big ones' |x| widened to f64 into two accumulators, every |x| pattern into the max `mx`
/// (NaN above all; callers that ignore it lose its instruction to the compiler); false if any is
/// small. A zero adds nothing to either sum: taken as big, so that a pruned tensor (zeros in
/// most groups of eight) stays off the one-at-a-time path.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum_step(
    p: *const f32,
    m: [std::arch::x86_64::__m256i; 3],
    acc: &mut [std::arch::x86_64::__m256d; 2],
    mx: &mut std::arch::x86_64::__m256i,
) -> bool {
    use std::arch::x86_64::*;
    let bits = _mm256_and_si256(_mm256_loadu_si256(p as *const __m256i), m[0]);
    *mx = _mm256_max_epu32(*mx, bits);
    let big = _mm256_and_si256(
        _mm256_cmpgt_epi32(bits, m[1]),
        _mm256_cmpgt_epi32(m[2], bits),
    );
    let big = _mm256_or_si256(big, _mm256_cmpeq_epi32(bits, _mm256_setzero_si256()));
    let v = _mm256_castsi256_ps(_mm256_and_si256(bits, big));
    acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
    _mm256_movemask_ps(_mm256_castsi256_ps(big)) == 0xFF
}

/// [`big_sum_portable`] sixteen values a step: the big ones' |x| widened to f64 in four
/// accumulators, the rare step with another value finishing those eight one at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn big_sum_avx2(xs: &[f32], t: u32, small: &mut ExactSum, ahead: &[f32]) -> f64 {
    use std::arch::x86_64::*;
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let below = _mm256_set1_epi32(((t << 23) - 1) as i32); // t ≥ 1
    let inf = _mm256_set1_epi32(0x7F80_0000);
    let m = [abs, below, inf];
    // Named accumulators (an indexed array of them lives on the stack, one store a step).
    let (mut a, mut b) = ([_mm256_setzero_pd(); 2], [_mm256_setzero_pd(); 2]);
    // The max this sum does not use (the compiler drops its instructions).
    let mut unused = _mm256_setzero_si256();
    let (n, p) = (xs.len(), xs.as_ptr());
    // One line of `ahead` (16 values) per 16 values here: as long as `xs` when it is as long.
    let lines = ahead.len().div_ceil(16);
    let mut i = 0;
    // i + 16 <= n: loads in bounds; i / 16 < lines: the prefetched address within `ahead`.
    while i + 16 <= n {
        if i / 16 < lines {
            crate::simd::x86::prefetch_line(ahead.as_ptr().add(i));
        }
        if !sum_step(p.add(i), m, &mut a, &mut unused) {
            small_ones(&xs[i..i + 8], t, small);
        }
        if !sum_step(p.add(i + 8), m, &mut b, &mut unused) {
            small_ones(&xs[i + 8..i + 16], t, small);
        }
        i += 16;
    }
    let s = _mm256_add_pd(_mm256_add_pd(a[0], a[1]), _mm256_add_pd(b[0], b[1]));
    let mut l = [0.0f64; 4];
    _mm256_storeu_pd(l.as_mut_ptr(), s);
    l.iter().sum::<f64>() + big_sum_portable(&xs[i..], t, small)
}

/// Undo [`small_ones`] (the same values, subtracted from the same integer entries).
#[cfg(target_arch = "x86_64")]
fn small_ones_taken_out(xs: &[f32], t: u32, small: &mut ExactSum) {
    let mut entered = ExactSum::default();
    small_ones(xs, t, &mut entered);
    for (a, b) in small.by_exp.iter_mut().zip(entered.by_exp.iter()) {
        *a -= b;
    }
}

/// [`big_sum_avx2`] (prefetching its own input ahead, not the next sub-chunk's) that also
/// returns the bits of the largest |x| (NaN bits above every other).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn big_sum_max_avx2(xs: &[f32], t: u32, small: &mut ExactSum) -> (f64, u32) {
    use std::arch::x86_64::*;
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let below = _mm256_set1_epi32(((t << 23) - 1) as i32); // t ≥ 1
    let inf = _mm256_set1_epi32(0x7F80_0000);
    let m = [abs, below, inf];
    let (mut a, mut b) = ([_mm256_setzero_pd(); 2], [_mm256_setzero_pd(); 2]);
    let (mut ma, mut mb) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let (n, p) = (xs.len(), xs.as_ptr());
    let mut i = 0;
    // i + 16 <= n: loads in bounds. One line asked for each step, far enough ahead (past the
    // slice too: a prefetch never faults) that one thread does not wait on memory.
    while i + 16 <= n {
        crate::simd::x86::prefetch_line(p.wrapping_add(i + crate::simd::x86::PREFETCH_AHEAD));
        if !sum_step(p.add(i), m, &mut a, &mut ma) {
            small_ones(&xs[i..i + 8], t, small);
        }
        if !sum_step(p.add(i + 8), m, &mut b, &mut mb) {
            small_ones(&xs[i + 8..i + 16], t, small);
        }
        i += 16;
    }
    let s = _mm256_add_pd(_mm256_add_pd(a[0], a[1]), _mm256_add_pd(b[0], b[1]));
    let mut l = [0.0f64; 4];
    _mm256_storeu_pd(l.as_mut_ptr(), s);
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, _mm256_max_epu32(ma, mb));
    let tail = &xs[i..];
    let max_bits = lanes
        .into_iter()
        .chain(tail.iter().map(|x| x.to_bits() & 0x7FFF_FFFF))
        .max()
        .unwrap_or(0);
    (
        l.iter().sum::<f64>() + big_sum_portable(tail, t, small),
        max_bits,
    )
}

fn add_shifted(big: &mut [u64; LIMBS], m: u64, shift: usize) {
    let limb = shift / 64;
    let off = shift % 64;
    let wide = (m as u128) << off;
    let mut carry = 0u128;
    for (i, part) in [wide as u64, (wide >> 64) as u64].into_iter().enumerate() {
        if limb + i >= LIMBS {
            break;
        }
        let s = big[limb + i] as u128 + part as u128 + carry;
        big[limb + i] = s as u64;
        carry = s >> 64;
    }
    let mut i = limb + 2;
    while carry != 0 && i < LIMBS {
        let s = big[i] as u128 + carry;
        big[i] = s as u64;
        carry = s >> 64;
        i += 1;
    }
}

/// `big · 2^exp` rounded to nearest even f64 (the result is far from f64's limits here).
fn big_to_f64(big: &[u64; LIMBS], exp: i32) -> f64 {
    let Some(top) = (0..LIMBS).rev().find(|&i| big[i] != 0) else {
        return 0.0;
    };
    let msb = top * 64 + 63 - big[top].leading_zeros() as usize; // bit index of the leading 1
    let bit = |i: usize| (big[i / 64] >> (i % 64)) & 1;
    if msb < 53 {
        let mut v = 0u64;
        for i in (0..=msb).rev() {
            v = (v << 1) | bit(i);
        }
        return v as f64 * 2f64.powi(exp);
    }
    let low = msb - 52; // bits below the 53-bit mantissa
    let mut mant = 0u64;
    for i in (low..=msb).rev() {
        mant = (mant << 1) | bit(i);
    }
    let half = bit(low - 1) == 1;
    let sticky = (0..low - 1).any(|i| bit(i) == 1);
    if half && (sticky || mant & 1 == 1) {
        mant += 1; // may become 2^53: still exact as f64
    }
    mant as f64 * 2f64.powi(exp + low as i32)
}

#[cfg(test)]
#[path = "calibrate_tests.rs"]
mod tests;
