//! The encode runs: a flat range of the tensor to its codes (one a byte) against its scales,
//! by the AVX2 kernels where the CPU has them, and the words of a tensor packed along its last
//! axis filled from those runs.

use rayon::prelude::*;

use super::fields::{pack_fields, pack_short_lines, pack_swapped, FEW};
use super::storage::{ScaleSlice, Segments, StorageMut, Word, BUF};
use crate::alloc::try_zeroed;
use crate::calibrate::MIN_TASK_ELEMS;
use crate::codec::{encode_run, Encode};
use crate::error::Result;
use crate::input::{Input, Window};
use crate::layout::Layout;

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
/// `simd::x86_runs::encode_run`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn encode_range_avx2<C: Encode>(
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
        return crate::simd::x86_runs::encode_run_or_zero(codec, xs, effective.get(0), out, stream);
    }
    let bc = layout.block_cols();
    let whole_blocks = crate::kernels::fused_avx2::eight_at_a_time(bc)
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
        return crate::kernels::fused_avx2::encode_groups_given(codec, bc, xs, eff, out, stream);
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
        bad |= crate::simd::x86_runs::encode_run_or_zero(codec, xs, effective.get(s), out, stream);
    }
    bad
}

#[inline(always)]
pub(super) fn encode_range_portable<C: Encode>(
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
pub(super) fn encode_swapped<C: Encode>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    sc: ScaleSlice<'_>,
    out: StorageMut<'_>,
) -> Result<bool> {
    let mut codes = try_zeroed(layout.num_elements)?;
    let bad = codes
        .par_chunks_mut(MIN_TASK_ELEMS)
        .enumerate()
        .map(|(ci, chunk)| encode_range(codec, x, layout, sc, ci * MIN_TASK_ELEMS, chunk))
        .reduce(|| false, |a, b| a | b);
    match out {
        StorageMut::U8(words) => pack_swapped(layout, &codes, words)?,
        StorageMut::U32(words) => pack_swapped(layout, &codes, words)?,
    }
    Ok(bad)
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
