//! burn's byte layout (format.md "The byte layout"): value storage little-endian, then the scales in their dtype,
//! then (two-level only) the per-tensor scale as f32. Dense, no padding, no header.

use crate::alloc::{try_to_vec, try_zeroed};
use crate::error::{QuantError, Result};
use crate::layout::Layout;
use crate::pack::check::check_storage_bytes;
use crate::pack::storage::{words_as_bytes, Storage};
use crate::quantize::scales::Scales;

/// Serialize a quantized tensor. `scales` must already fit `layout` (see [`Scales::from_stored`]).
pub fn to_bytes(layout: &Layout, storage: Storage<'_>, scales: &Scales) -> Result<Vec<u8>> {
    let mut out = try_zeroed(layout.total_bytes() - layout.offsets_bytes())?;
    write_bytes(layout, storage, scales, &mut out)?;
    Ok(out)
}

/// [`to_bytes`] into a caller's buffer of exactly `layout.total_bytes()` bytes (the binding
/// hands Python's own bytes object, so a failed allocation is Python's `MemoryError`).
/// Fails only when the scales' byte order (one index a scale) cannot be allocated.
pub fn write_bytes(
    layout: &Layout,
    storage: Storage<'_>,
    scales: &Scales,
    out: &mut [u8],
) -> Result<()> {
    // An affine scheme's offsets follow; `crate::affine` writes them.
    let head = layout.total_bytes() - layout.offsets_bytes();
    assert_eq!(out.len(), head, "output length");
    let dtype = layout.scheme.scale_dtype();
    let mut at = 0;
    let mut put = |b: &[u8]| {
        out[at..at + b.len()].copy_from_slice(b);
        at += b.len();
    };
    match storage {
        Storage::U8(b) => put(b),
        // Little-endian words are their own bytes.
        Storage::U32(ws) if cfg!(target_endian = "little") => put(words_as_bytes(ws)),
        Storage::U32(ws) => ws.iter().for_each(|w| put(&w.to_le_bytes())),
    }
    let mut scale = |s: f32| {
        let (b, n) = dtype.le_bytes(s);
        put(&b[..n]);
    };
    // burn stores block scales in the values' swapped order when they pack along an outer axis.
    match layout.scale_byte_order()? {
        None => scales.stored.iter().for_each(|&s| scale(s)),
        Some(order) => order.iter().for_each(|&g| scale(scales.stored[g])),
    }
    if let Some(g) = scales.global {
        put(&g.to_le_bytes());
    }
    Ok(())
}

/// The parts of a byte layout: storage bytes (words little-endian), decoded scales, global.
#[derive(Debug, Clone, PartialEq)]
pub struct Parts<'a> {
    pub storage: &'a [u8],
    pub scales: Scales,
}

/// Split `data` into its parts. The length must match exactly; every scale must decode to a
/// finite, non-negative number (a NaN code is corrupt data, not a scale); and every stored code
/// must be one quantize can produce, with zero padding (format.md "The byte layout": `from_bytes` accepts exactly
/// what `from_parts` accepts). Scales are checked before values (format.md "Rules for edge cases").
pub fn from_bytes<'a>(layout: &Layout, data: &'a [u8]) -> Result<Parts<'a>> {
    // Without an affine scheme's offsets, which `crate::affine` reads after these parts.
    let expected = layout.total_bytes() - layout.offsets_bytes();
    if data.len() != expected {
        return Err(QuantError::Layout(format!(
            "expected {expected} bytes for {} with shape {:?}, got {}",
            layout.scheme,
            layout.shape,
            data.len()
        )));
    }
    let (storage, rest) = data.split_at(layout.storage_bytes());
    let dtype = layout.scheme.scale_dtype();
    let sb = dtype.size_bytes();
    let (scale_bytes, global_bytes) = rest.split_at(layout.num_scales * sb);
    let mut stored = dtype.read_le_all(scale_bytes)?;
    if let Some(order) = layout.scale_byte_order()? {
        let in_bytes = try_to_vec(&stored)?;
        for (&s, &g) in in_bytes.iter().zip(&order) {
            stored[g] = s;
        }
    }
    let global = (global_bytes.len() == 4).then(|| {
        f32::from_le_bytes([
            global_bytes[0],
            global_bytes[1],
            global_bytes[2],
            global_bytes[3],
        ])
    });
    let scales = Scales::from_stored(layout, stored, global).map_err(|e| match e {
        QuantError::Scale(m) => QuantError::Layout(format!("corrupt scales: {m}")),
        other => other,
    })?;
    check_storage_bytes(layout, storage)?;
    Ok(Parts { storage, scales })
}

#[cfg(test)]
#[path = "bytes_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "bytes_fuzz_tests.rs"]
mod fuzz_tests;
