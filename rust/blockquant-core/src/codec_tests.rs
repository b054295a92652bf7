use super::*;

#[test]
fn int_rounding_modes() {
    let away = IntHalfAway {
        qmin: -127.0,
        qmax: 127.0,
    };
    let even = IntHalfEven {
        qmin: -127.0,
        qmax: 127.0,
    };
    let cases = [
        (0.5f32, 1i8, 0i8),
        (1.5, 2, 2),
        (2.5, 3, 2),
        (-0.5, -1, 0),
        (-1.5, -2, -2),
        (-2.5, -3, -2),
        (0.49999997, 0, 0),
        (-0.49999997, 0, 0),
        (126.5, 127, 126),
        (1000.0, 127, 127),
        (-1000.0, -127, -127),
        (-0.0, 0, 0),
        (f32::MAX, 127, 127),
    ];
    for (x, a, e) in cases {
        assert_eq!(away.encode(x) as i8, a, "away {x}");
        assert_eq!(even.encode(x) as i8, e, "even {x}");
        assert_eq!(x.round().clamp(-127.0, 127.0) as i8, a);
        assert_eq!(x.round_ties_even().clamp(-127.0, 127.0) as i8, e);
    }
}

#[test]
fn int_rounding_matches_std_on_a_sweep() {
    let away = IntHalfAway {
        qmin: -8.0,
        qmax: 7.0,
    };
    let even = IntHalfEven {
        qmin: -8.0,
        qmax: 7.0,
    };
    let mut x = -10.0f32;
    while x < 10.0 {
        assert_eq!(
            away.encode(x) as i8,
            x.round().clamp(-8.0, 7.0) as i8,
            "{x}"
        );
        assert_eq!(
            even.encode(x) as i8,
            x.round_ties_even().clamp(-8.0, 7.0) as i8,
            "{x}"
        );
        x += 1.0 / 64.0;
    }
}

/// The comparison encoder equals the generic bit-level one on a sweep of f32s in [-8, 8]
/// (every 997th bit pattern), midpoints and their neighbours included.
#[test]
fn e2m1_comparisons_equal_the_bit_path() {
    let generic = FloatCode(E2M1);
    // Positive and negative halves: walk magnitudes up from 0 in small bit steps.
    for sign in [0u32, 0x8000_0000] {
        let mut bits = 0u32;
        while f32::from_bits(bits) <= 8.0 {
            let x = f32::from_bits(bits | sign);
            assert_eq!(E2M1Code.encode(x), generic.encode(x), "{x}");
            bits += 997;
        }
    }
    for m in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] {
        for x in [
            m,
            f32::from_bits(m.to_bits() - 1),
            f32::from_bits(m.to_bits() + 1),
        ] {
            assert_eq!(E2M1Code.encode(x), generic.encode(x), "{x}");
            assert_eq!(E2M1Code.encode(-x), generic.encode(-x), "{x}");
        }
    }
    assert_eq!(E2M1Code.encode(1e30), 0x7);
    assert_eq!(E2M1Code.encode(-0.0), 0x8);
}

/// The permute decoder is the E2M1 table, on every byte (high nibble ignored, −0 kept).
#[test]
fn e2m1_decoder_is_the_table() {
    let t = float_table(&E2M1);
    for b in 0..=255u8 {
        assert_eq!(
            E2M1Decode.decode(b).to_bits(),
            t[b as usize].to_bits(),
            "{b:#x}"
        );
    }
}

#[test]
fn native_and_packed_decoders() {
    let native = Packing {
        word_bits: 8,
        per: 1,
        field_bits: 8,
        axis: 0,
        outer: 1,
        n_axis: 1,
        inner: 1,
        words_axis: 1,
        swapped: false,
        native: true,
    };
    let packed = Packing {
        field_bits: 4,
        per: 2,
        ..native.clone()
    };
    let d = IntDecode::new(&native);
    assert_eq!(d.decode(0xFF), -1.0);
    assert_eq!(d.decode(0x7F), 127.0);
    let d = IntDecode::new(&packed);
    assert_eq!(d.decode(0xF), -1.0);
    assert_eq!(d.decode(0x8), -8.0);
    let t = float_table(&E2M1);
    assert_eq!((t[0x7], t[0xF], t[0x17]), (6.0, -6.0, 6.0));
    assert!(field_is_valid(QuantValue::Q4S, &packed, 0x9)); // -7
    assert!(!field_is_valid(QuantValue::Q4S, &packed, 0x8)); // -8
    assert!(!field_is_valid(QuantValue::Q4S, &native, 0x08)); // 8 as int8
    assert!(!field_is_valid(QuantValue::E2M1, &native, 0x17));
    assert!(!field_is_valid(QuantValue::E4M3, &native, 0x7F));
    assert!(!field_is_valid(QuantValue::E5M2, &native, 0x7C));
    assert!(field_is_valid(QuantValue::E5M2, &native, 0xFB));
}
