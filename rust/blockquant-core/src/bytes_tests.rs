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

/// format.md "The byte layout"'s 14-byte example, byte for byte.
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
    assert_eq!(parts.scales.effective().unwrap(), [1.5, 0.375]);
    let again = to_bytes(&layout, Storage::U8(parts.storage), &parts.scales).unwrap();
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
    let bytes = to_bytes(&layout, Storage::U8(&out), &scales).unwrap();
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
