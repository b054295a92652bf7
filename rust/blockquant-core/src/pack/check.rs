//! The check of storage taken from a caller: every field a valid code of the value, padding
//! bits 0, a table of valid bytes at a time.

use super::storage::{words_as_bytes, Storage};
use crate::alloc::try_collect;
use crate::codec::field_is_valid;
use crate::error::{QuantError, Result};
use crate::layout::Layout;

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
    let words = try_collect(
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    )?;
    report_storage(layout, Storage::U32(&words))
}

/// Which fields are codes of the layout's value (indexed by the field's bits).
pub(super) fn valid_fields(layout: &Layout) -> [bool; 256] {
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
pub(super) fn storage_bytes_valid(layout: &Layout, bytes: &[u8]) -> bool {
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
/// non-members that [`crate::simd::x86_runs::all_in_set`] looks 32 bytes up in at once.
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
            return unsafe { crate::simd::x86_runs::all_in_set(run, &self.low, &self.high) };
        }
        self.contains_all_portable(run)
    }

    pub(crate) fn contains_all_portable(&self, run: &[u8]) -> bool {
        run.chunks(1 << 12)
            .all(|c| c.iter().fold(1u8, |a, &b| a & self.member[b as usize]) == 1)
    }
}

/// The first invalid stored word's error, or `Ok` when there is none: one word at a time.
pub(super) fn report_storage(layout: &Layout, storage: Storage<'_>) -> Result<()> {
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
