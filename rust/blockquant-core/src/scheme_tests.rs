use super::*;

#[test]
fn leading_ones_are_dropped() {
    let a = BlockScale::new(&[1, 1, 32], ScaleDtype::F16).unwrap();
    let b = BlockScale::new(&[32], ScaleDtype::F16).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.size(), &[32]);
}

#[test]
fn bad_block_sizes_are_rejected() {
    assert!(BlockScale::new(&[], ScaleDtype::F32).is_err());
    assert!(BlockScale::new(&[0], ScaleDtype::F32).is_err());
    assert!(BlockScale::new(&[2, 2, 2, 2, 2, 2], ScaleDtype::F32).is_err());
    assert!(BlockScale::new(&[1, 2, 2, 2, 2, 2], ScaleDtype::F32).is_ok());
}

#[test]
fn two_level_rules() {
    let s = QuantScheme::default()
        .per_block(&[16], ScaleDtype::UE4M3)
        .unwrap();
    assert!(s.per_tensor(ScaleDtype::F32).validate().is_ok());
    let err = s.per_tensor(ScaleDtype::F16).validate().unwrap_err();
    assert!(err
        .to_string()
        .starts_with("a two-level scheme stores its per-tensor scale as f32, got QuantScheme("));
    for wide in [ScaleDtype::F32, ScaleDtype::BF16, ScaleDtype::UE8M0] {
        let s = QuantScheme::default()
            .per_block(&[16], wide)
            .unwrap()
            .per_tensor(ScaleDtype::F32);
        assert!(matches!(s.validate(), Err(QuantError::Scheme(_))));
    }
}

#[test]
fn half_range_matches_spec_divisors() {
    assert_eq!(QuantValue::Q8F.half_range(), 127.5);
    assert_eq!(QuantValue::Q8S.half_range(), 127.0);
    assert_eq!(QuantValue::E2M1.half_range(), 6.0);
    assert_eq!(QuantValue::E4M3.half_range(), 448.0);
}
