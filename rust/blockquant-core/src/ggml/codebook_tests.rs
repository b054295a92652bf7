use super::*;

#[test]
fn ue4m3_scales_rise_with_the_byte() {
    // 1..=0x7E are the nonzero scales in order (the search walks them upward); the first
    // eight are subnormal (m·2^-9), the last 448, each halved.
    for c in 1..0x7E {
        assert!(UE4M3[c] < UE4M3[c + 1], "{c}");
    }
    assert_eq!(UE4M3[1], 2f32.powi(-10));
    assert_eq!(UE4M3[0x08], 2f32.powi(-7));
    assert_eq!(UE4M3[0x38], 0.5);
    assert_eq!(UE4M3[0x7E], 224.0);
    assert_eq!(UE4M3[0x7F], 0.0);
    assert_eq!(UE4M3[0xFF], 240.0); // bit 7 is not a sign: 0xFF is not 0x7F
}

#[test]
fn nvfp4_scale_covers_the_block() {
    for amax in [1e-6f32, 3e-3, 0.1, 1.0, 7.5, 300.0, 2688.0, 1e9] {
        let x = [amax, -amax / 3.0, amax / 7.0, 0.0].repeat(4);
        let c = nvfp4_scale(&x, Unit);
        assert!((1..=0x7E).contains(&c), "{amax}");
        let plain = scaled_error(&x, Unit, UE4M3[c as usize], &Fp4);
        // No other scale byte does better.
        for other in 1..=0x7Eu8 {
            assert!(plain <= scaled_error(&x, Unit, UE4M3[other as usize], &Fp4) * (1.0 + 1e-9));
        }
    }
    assert_eq!(nvfp4_scale(&[0.0; 16], Unit), 0);
}
