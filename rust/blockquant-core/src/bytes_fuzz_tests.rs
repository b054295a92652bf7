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
                        assert_eq!(
                            to_bytes(&layout, st.as_storage(), &parts.scales).unwrap(),
                            data
                        );
                        let _ = check_storage(&layout, st.as_storage());
                        let mut out = vec![0.0f32; layout.num_elements];
                        dequantize(
                            &layout,
                            st.as_storage(),
                            &parts.scales.stored,
                            parts.scales.global,
                            Output::F32(&mut out),
                        )
                        .unwrap();
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
