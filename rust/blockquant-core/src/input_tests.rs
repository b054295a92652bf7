use super::*;

#[test]
fn conversions_match_casts() {
    let f16s: Vec<u16> = [1.5f32, -0.0, 65504.0, 6e-8]
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    let mut out = [0.0f32; 4];
    Input::F16(&f16s).convert(0, &mut out);
    assert_eq!(out[0], 1.5);
    assert!(out[1] == 0.0 && out[1].is_sign_negative());
    assert_eq!(out[2], 65504.0);
    assert_eq!(out[3], half::f16::from_bits(f16s[3]).to_f32());
    let bf = [0x3FC0u16, 0xC000];
    let mut out = [0.0f32; 2];
    Input::BF16(&bf).convert(0, &mut out);
    assert_eq!(out, [1.5, -2.0]);
    let f64s = [1.0 + 2f64.powi(-24), 1.0 + 3.0 * 2f64.powi(-24), 1e300];
    let mut out = [0.0f32; 3];
    Input::F64(&f64s).convert(0, &mut out);
    assert_eq!(out[0], 1.0); // tie → even
    assert_eq!(out[1], 1.0 + 2f32.powi(-22)); // tie → even (up)
    assert_eq!(out[2], f32::INFINITY);
}
