//! Dequantize's decode: codes (unpacked from their words) to f32 against their scales, then
//! converted to the output's type; the AVX2 kernels where the CPU has them.

use rayon::prelude::*;

use super::fields::{
    ask_ahead, line_groups, unpack_fields, unpack_short_lines, AHEAD, FEW, LINES_TOGETHER,
};
use super::storage::{Effective, OutElem, Segments, Storage, Word, BUF, SCALE_CHUNK};
use crate::alloc::try_zeroed;
use crate::calibrate::MIN_TASK_ELEMS;
use crate::codec::Decode;
use crate::error::Result;
use crate::layout::Layout;
use crate::simd::avx2_dispatch;

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
pub(super) fn decode_range<D: Decode, O: OutElem>(
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
pub(super) unsafe fn decode_range_f32_avx2<D: Decode>(
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
pub(super) unsafe fn decode_range_f32_avx2_with<D: Decode, const STREAM: bool>(
    dec: D,
    layout: &Layout,
    effective: Effective<'_>,
    start: usize,
    codes: &[u8],
    out: &mut [f32],
) {
    if layout.per_tensor {
        // One scale: the range is one run, whatever the rows' length.
        return crate::simd::x86_runs::decode_run::<D, STREAM>(dec, codes, effective.get(0), out);
    }
    let (n, bc) = (layout.row_len(), layout.block_cols());
    if let Some(m) = crate::kernels::piece::block_run(layout)
        .filter(|&m| crate::kernels::fused_narrow::narrow(m))
    {
        // Short blocks back to back (blocks of 4, a conv kernel's rows of 3): eight at a time.
        if crate::kernels::fused_narrow::decode_blocks::<D, STREAM>(
            dec, effective, m, start, codes, out,
        ) {
            return;
        }
    } else if !STREAM
        && layout.rows_map_directly()
        && crate::kernels::fused_narrow::narrow(bc)
        && n >= 16 * bc
        && !n.is_multiple_of(bc)
    {
        // Rows ending in a partial block (blocks of 5 on rows of 4096): row by row. Not when
        // the output streams: each row's head and tail would then be 4-byte non-temporal
        // stores, partial lines a row (block 5 on 4096 x 4096: 25 -> 82 ms, measured); the
        // path below spreads the scales across rows and stores whole vectors.
        return crate::kernels::fused_narrow::decode_rows(dec, effective, bc, n, start, codes, out);
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
                crate::simd::x86_runs::decode_lanes::<D, true>(dec, c, es, y);
            } else {
                crate::simd::x86_runs::decode_lanes::<D, false>(dec, c, es, y);
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
pub(super) unsafe fn decode_run_streamed_or_not<D: Decode, const STREAM: bool>(
    dec: D,
    codes: &[u8],
    e: f32,
    out: &mut [f32],
    stream: bool,
) {
    if STREAM && stream {
        crate::simd::x86_runs::decode_run::<D, true>(dec, codes, e, out);
    } else {
        crate::simd::x86_runs::decode_run::<D, false>(dec, codes, e, out);
    }
}

/// The codes of consecutive whole blocks of `bc` values (a multiple of 8), block k's scale
/// `eff`'s k-th, into `out` (16-byte aligned when `STREAM`), 64 scales at a time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn decode_block_run<D: Decode, const STREAM: bool>(
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
        crate::simd::x86_runs::decode_blocks_8s::<D, STREAM>(dec, c, es, bc, o);
        k += es.len();
    }
}

#[inline(always)]
pub(super) fn decode_range_portable<D: Decode, O: OutElem>(
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

/// Dequantize every value of `storage` into `out` (the one error: no memory for the codes of
/// swapped-order storage).
pub fn decode_into<D: Decode, O: OutElem>(
    table: D,
    layout: &Layout,
    storage: Storage<'_>,
    effective: Effective<'_>,
    out: &mut [O],
) -> Result<()> {
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
    Ok(())
}

pub(super) fn unpack_words<W: Word, D: Decode, O: OutElem>(
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
pub(super) fn nibble_blocks(
    layout: &Layout,
    field_bits: usize,
    task: usize,
    out: &[f32],
) -> Option<bool> {
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
pub(super) unsafe fn decode_nibbles_f32<W: Word, D: Decode>(
    dec: D,
    layout: &Layout,
    words: &[W],
    effective: Effective<'_>,
    start: usize,
    chunk: &mut [f32],
    stream: bool,
) {
    use crate::simd::x86_runs::decode_nibble_blocks_8s;
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
pub(super) fn decode_runs<D: Decode, O: OutElem>(
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
pub(super) fn decode_swapped<D: Decode, O: OutElem>(
    table: D,
    layout: &Layout,
    storage: Storage<'_>,
    effective: Effective<'_>,
    out: &mut [O],
) -> Result<()> {
    let codes = match storage {
        Storage::U8(ws) => unswap_codes(layout, ws)?,
        Storage::U32(ws) => unswap_codes(layout, ws)?,
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
    Ok(())
}

/// The fields of swapped-order storage, one a byte in natural order: each group of
/// [`LINES_TOGETHER`] lines unpacked, then written out k-th elements side by side.
pub(super) fn unswap_codes<W: Word>(layout: &Layout, words: &[W]) -> Result<Vec<u8>> {
    let p = &layout.packing;
    let (nw, n, per, inner) = (p.words_axis, p.n_axis, p.per, p.inner);
    let mask = p.field_mask() as u8; // a one-a-byte field's bits above it are not the code's
    let mut codes = try_zeroed(layout.num_elements)?;
    if nw == 0 || words.is_empty() {
        return Ok(codes);
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
        .try_for_each(|(ci, chunk)| {
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
            )
        })?;
    Ok(codes)
}
