//! burn's byte layout (SPEC §9): value storage little-endian, then the scales in their dtype,
//! then (two-level only) the per-tensor scale as f32. Dense, no padding, no header.

use crate::error::{QuantError, Result};
use crate::layout::Layout;
use crate::pack::check::check_storage_bytes;
use crate::pack::storage::{words_as_bytes, Storage};
use crate::quantize::scales::Scales;

/// Serialize a quantized tensor. `scales` must already fit `layout` (see [`Scales::from_stored`]).
pub fn to_bytes(layout: &Layout, storage: Storage<'_>, scales: &Scales) -> Vec<u8> {
    let mut out = vec![0u8; layout.total_bytes()];
    write_bytes(layout, storage, scales, &mut out);
    out
}

/// [`to_bytes`] into a caller's buffer of exactly `layout.total_bytes()` bytes (the binding
/// hands Python's own bytes object, so a failed allocation is Python's `MemoryError`).
pub fn write_bytes(layout: &Layout, storage: Storage<'_>, scales: &Scales, out: &mut [u8]) {
    assert_eq!(out.len(), layout.total_bytes(), "output length");
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
    match layout.scale_byte_order() {
        None => scales.stored.iter().for_each(|&s| scale(s)),
        Some(order) => order.iter().for_each(|&g| scale(scales.stored[g])),
    }
    if let Some(g) = scales.global {
        put(&g.to_le_bytes());
    }
}

/// The parts of a byte layout: storage bytes (words little-endian), decoded scales, global.
#[derive(Debug, Clone, PartialEq)]
pub struct Parts<'a> {
    pub storage: &'a [u8],
    pub scales: Scales,
}

/// Split `data` into its parts. The length must match exactly; every scale must decode to a
/// finite, non-negative number (a NaN code is corrupt data, not a scale); and every stored code
/// must be one quantize can produce, with zero padding (SPEC §9: `from_bytes` accepts exactly
/// what `from_parts` accepts). Scales are checked before values (SPEC §12).
pub fn from_bytes<'a>(layout: &Layout, data: &'a [u8]) -> Result<Parts<'a>> {
    let expected = layout.total_bytes();
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
    let mut stored = dtype.read_le_all(scale_bytes);
    if let Some(order) = layout.scale_byte_order() {
        let in_bytes = stored.clone();
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
mod tests {
    use super::*;
    use crate::options::QuantizeOptions;
    use crate::pack::storage::{Storage, StorageMut};
    use crate::quantize::quantize;
    use crate::quantize::scales::ExplicitScales;
    use crate::scheme::{QuantScheme, QuantStore, QuantValue, ScaleDtype};

    fn spec_example_scheme() -> QuantScheme {
        QuantScheme::default()
            .with_value(QuantValue::Q8F)
            .with_store(QuantStore::Native)
            .per_block(&[4], ScaleDtype::UE4M3)
            .unwrap()
            .per_tensor(ScaleDtype::F32)
    }

    /// SPEC §9's 14-byte example, byte for byte.
    #[test]
    fn spec_example_round_trips() {
        let data = [
            0x00, 0x19, 0x33, 0x4c, 0x66, 0x7f, 0x80, 0xff, 0x30, 0x20, 0x00, 0x00, 0x40, 0x40,
        ];
        let layout = Layout::new(&spec_example_scheme(), &[8]).unwrap();
        assert_eq!(layout.total_bytes(), 14);
        let parts = from_bytes(&layout, &data).unwrap();
        assert_eq!(parts.scales.stored, [0.5, 0.125]);
        assert_eq!(parts.scales.global, Some(3.0));
        assert_eq!(parts.scales.effective(), [1.5, 0.375]);
        let again = to_bytes(&layout, Storage::U8(parts.storage), &parts.scales);
        assert_eq!(again, data);
    }

    /// The same bytes from quantize with explicit scales: -48 / 0.375 = -128, Q8F's minimum.
    #[test]
    fn spec_example_from_quantize() {
        let layout = Layout::new(&spec_example_scheme(), &[8]).unwrap();
        let x = [0.0f32, 37.5, 76.5, 114.0, 38.25, 47.625, -48.0, -0.375];
        let mut out = vec![0u8; 8];
        let scales = quantize(
            crate::input::Input::F32(&x),
            &layout,
            &QuantizeOptions::default(),
            Some(ExplicitScales {
                scales: Some(&[0.5, 0.125]),
                global: Some(3.0),
            }),
            StorageMut::U8(&mut out),
        )
        .unwrap();
        let bytes = to_bytes(&layout, Storage::U8(&out), &scales);
        assert_eq!(
            bytes,
            [0x00, 0x19, 0x33, 0x4c, 0x66, 0x7f, 0x80, 0xff, 0x30, 0x20, 0x00, 0x00, 0x40, 0x40]
        );
    }

    #[test]
    fn wrong_lengths_are_layout_errors() {
        let layout = Layout::new(&spec_example_scheme(), &[8]).unwrap();
        for len in [0, 13, 15] {
            let err = from_bytes(&layout, &vec![0u8; len]).unwrap_err();
            assert!(
                matches!(err, QuantError::Layout(ref m) if m.contains("expected 14 bytes") && m.contains(&format!("got {len}")))
            );
        }
        let mut data = vec![0u8; 14];
        data[8] = 0x7F; // a NaN UE4M3 scale
        assert!(matches!(
            from_bytes(&layout, &data),
            Err(QuantError::Layout(_))
        ));
    }
}

#[cfg(test)]
mod fuzz_tests {
    use super::*;
    use crate::pack::check_storage;
    use crate::pack::storage::Storage;
    use crate::quantize::{dequantize, Output};
    use crate::scheme::{QuantScheme, QuantStore, QuantValue, ScaleDtype};

    /// A tiny deterministic generator: the test needs no dependency and is the same every run.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Arbitrary bytes never panic: from_bytes either rejects them or gives parts that
    /// serialize back to the same bytes and dequantize without trouble.
    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let shapes: [&[usize]; 5] = [&[], &[0], &[7], &[3, 5], &[2, 3, 9]];
        let mut accepted = 0;
        for value in QuantValue::ALL {
            for store in [
                QuantStore::Native,
                QuantStore::PackedU32(0),
                QuantStore::PackedNative(1),
            ] {
                for levels in 0..3 {
                    let s = QuantScheme::default().with_value(value).with_store(store);
                    let s = match levels {
                        0 => s.per_tensor(ScaleDtype::UE8M0),
                        1 => s.per_block(&[4], ScaleDtype::UE4M3).unwrap(),
                        _ => s
                            .per_block(&[4], ScaleDtype::F16)
                            .unwrap()
                            .per_tensor(ScaleDtype::F32),
                    };
                    for shape in shapes {
                        let Ok(layout) = Layout::new(&s, shape) else {
                            continue;
                        };
                        let n = layout.total_bytes();
                        for len in [n, n.saturating_sub(1), n + 1] {
                            let mut data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                            // Random value bytes are rarely all valid codes; zero codes are, so
                            // half the time the scales and the rest of the checks get their turn.
                            if rng.next().is_multiple_of(2) {
                                let n = layout.storage_bytes().min(len);
                                data[..n].fill(0);
                            }
                            let Ok(parts) = from_bytes(&layout, &data) else {
                                continue;
                            };
                            accepted += 1;
                            let st = storage_of(&layout, parts.storage);
                            assert_eq!(to_bytes(&layout, st.as_storage(), &parts.scales), data);
                            let _ = check_storage(&layout, st.as_storage());
                            let mut out = vec![0.0f32; layout.num_elements];
                            dequantize(
                                &layout,
                                st.as_storage(),
                                &parts.scales.stored,
                                parts.scales.global,
                                Output::F32(&mut out),
                            );
                        }
                    }
                }
            }
        }
        assert!(
            accepted > 100,
            "the generator should produce valid layouts too ({accepted})"
        );
    }

    enum Owned {
        U8(Vec<u8>),
        U32(Vec<u32>),
    }
    impl Owned {
        fn as_storage(&self) -> Storage<'_> {
            match self {
                Owned::U8(v) => Storage::U8(v),
                Owned::U32(v) => Storage::U32(v),
            }
        }
    }
    fn storage_of(layout: &Layout, bytes: &[u8]) -> Owned {
        if layout.packing.word_bits == 32 {
            Owned::U32(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            )
        } else {
            Owned::U8(bytes.to_vec())
        }
    }
}
