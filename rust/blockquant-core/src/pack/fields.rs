//! Bit packing (format.md "Stores and packing"): codes one a byte to and from the fields of u8/u32 words, first value
//! in the least significant bits, each line along the packed axis padded on its own; burn's
//! swapped order (packing along an outer axis) by lines taken together.

use rayon::prelude::*;

use super::storage::{Word, BUF};
use crate::alloc::try_zeroed;
use crate::calibrate::MIN_TASK_ELEMS;
use crate::error::Result;
use crate::layout::Layout;

/// Pack consecutive codes into words, `per` fields per word, the first in the low bits; a last
/// partial word gets zero padding. Eight codes at a time are squeezed together with shifts and
/// masks inside one u64 (SWAR), which is little-endian bytes of the words either way.
#[inline]
pub(super) fn pack_fields<W: Word>(codes: &[u8], words: &mut [W], per: usize) {
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
            crate::simd::x86_runs::pack_fields(codes, bytes, bits)
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
pub(super) fn squeeze8(x: u64, bits: usize) -> u64 {
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
pub(super) fn unpack_fields<W: Word>(line: &[W], first: usize, codes: &mut [u8], per: usize) {
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
            crate::simd::x86_runs::unpack_nibbles(&bytes[first / 2..], codes)
        };
        (first + done, &mut codes[done..])
    } else if W::BITS as usize / per == 2 && first.is_multiple_of(4) && crate::simd::has_avx2() {
        // SAFETY: as above, 2-bit fields: field f of the line is bits 2·(f % 4) of byte f / 4.
        let done = unsafe {
            let bytes =
                std::slice::from_raw_parts(line.as_ptr() as *const u8, std::mem::size_of_val(line));
            crate::simd::x86_runs::unpack_crumbs(&bytes[first / 4..], codes)
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
pub(super) fn unpack_fields_n<W: Word, const PER: usize>(
    line: &[W],
    first: usize,
    codes: &mut [u8],
) {
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

/// Storage lines of burn's swapped order moved between natural order and their words together.
/// A line's elements lie `inner` apart in natural order (4 KiB and more on a weight matrix),
/// so each may sit on a page of its own: taken one line at a time, a 4096 × 4096 tensor
/// missed the TLB on nearly every element (110 ms against 5 for the last axis). Taken
/// together, consecutive lines read or write their k-th elements side by side, a page once
/// for all of them.
pub(super) const LINES_TOGETHER: usize = 32;

/// Bytes from one line's codes to the next's in the buffer of lines taken together: `n` and a
/// cache line more, so that their k-th codes fall in different cache sets. At a stride of
/// 4096 (a 4096-row matrix) they all fell in one set of the 8-way L1 and evicted each other
/// on every k: two thirds of the time.
#[inline]
pub(super) fn line_stride(n: usize) -> usize {
    n.next_multiple_of(64) + 64
}

/// Rows (k) ahead that [`ask_ahead`] asks for: the loop over a row's few codes leaves room for
/// only one or two misses in flight, each a page of its own.
pub(super) const AHEAD: usize = 16;

/// Whether the lines start at consecutive elements (their k-th codes one run in memory).
#[inline]
pub(super) fn consecutive(bases: &[usize]) -> bool {
    bases.iter().enumerate().all(|(t, &b)| b == bases[0] + t)
}

/// Ask for the cache lines of the lines' codes at natural offset `at` past each base (the
/// first and last line's: the lines taken together lie between them when consecutive).
#[inline(always)]
pub(super) fn ask_ahead(codes: *const u8, bases: &[usize], at: usize) {
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
pub(super) fn line_bases(layout: &Layout, first: usize, bases: &mut [usize]) {
    for (t, b) in bases.iter_mut().enumerate() {
        *b = layout.line_element(first + t, 0);
    }
}

/// Storage lines `ci · lines_per_task ..` (`count` of them: task `ci`'s) in groups of
/// [`LINES_TOGETHER`]: `f(g, bases, lines, stride)` for group g, with its lines' natural bases
/// and a buffer of a line every `stride` bytes ([`line_stride`]) for their codes (as long as
/// the packed axis: fallible).
#[inline]
pub(super) fn line_groups(
    layout: &Layout,
    ci: usize,
    lines_per_task: usize,
    count: usize,
    mut f: impl FnMut(usize, &[usize], &mut [u8], usize),
) -> Result<()> {
    let stride = line_stride(layout.packing.n_axis);
    let mut lines = try_zeroed(LINES_TOGETHER.saturating_mul(stride))?;
    let mut bases = [0usize; LINES_TOGETHER];
    for g in 0..count.div_ceil(LINES_TOGETHER) {
        let first = g * LINES_TOGETHER;
        let bases = &mut bases[..LINES_TOGETHER.min(count - first)];
        line_bases(layout, ci * lines_per_task + first, bases);
        f(g, bases, &mut lines, stride);
    }
    Ok(())
}

pub(super) fn pack_swapped<W: Word>(layout: &Layout, codes: &[u8], words: &mut [W]) -> Result<()> {
    let p = &layout.packing;
    let (nw, n, per, inner) = (p.words_axis, p.n_axis, p.per, p.inner);
    if nw == 0 || words.is_empty() {
        return Ok(());
    }
    let mask = p.field_mask() as u8;
    let lines_per_task = (MIN_TASK_ELEMS / n).max(1);
    words
        .par_chunks_mut(nw * lines_per_task)
        .enumerate()
        .try_for_each(|(ci, chunk)| {
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
            )
        })
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
pub(super) fn pack_lines<W: Word, const PER: usize>(
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
pub(super) const FEW: usize = 32;

/// Whole lines of `n` codes each (`n` < [`FEW`]) into their words (`words`: `nw` a line,
/// whole). Most lines by [`squeeze_lines`], the last ones (or all, on a big-endian machine) by
/// [`pack_few`].
#[inline(always)]
pub(super) fn pack_short_lines<W: Word>(codes: &[u8], n: usize, words: &mut [W], per: usize) {
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
pub(super) fn squeeze_lines<W: Word>(
    codes: &[u8],
    n: usize,
    words: &mut [W],
    nw: usize,
    per: usize,
) -> usize {
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
pub(super) fn unpack_short_lines<W: Word>(words: &[W], n: usize, codes: &mut [u8], per: usize) {
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
pub(super) fn expand_lines<W: Word>(
    words: &[W],
    n: usize,
    nw: usize,
    codes: &mut [u8],
    per: usize,
) -> usize {
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
pub(super) fn eight_byte_lines(
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
pub(super) fn expand8(x: u64, bits: usize) -> u64 {
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
pub(super) fn pack_few<W: Word>(codes: &[u8], words: &mut [W], per: usize) {
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
