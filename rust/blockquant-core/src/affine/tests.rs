//! Affine schemes: hand-worked examples, the text form, the rules, bytes both ways.

use super::*;
use crate::scale::ScaleRounding;
use crate::scheme::{QuantStore, QuantValue, ScaleDtype};
use crate::scheme_text::parse;

fn opts(calibration: Calibration, rounding: Rounding) -> QuantizeOptions {
    QuantizeOptions {
        calibration,
        rounding,
        scale_rounding: ScaleRounding::Up,
    }
}

/// Quantize `x` (shape `shape`) with the scheme `text`: (codes one a byte, scales, offsets).
fn run(
    text: &str,
    x: &[f32],
    shape: &[usize],
    o: QuantizeOptions,
) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let layout = Layout::new(&parse(text).unwrap(), shape).unwrap();
    let mut st = vec![0u8; layout.storage_bytes()];
    let mut sc = vec![0f32; layout.num_scales];
    let mut of = vec![0f32; layout.num_scales];
    quantize(
        Input::F32(x),
        &layout,
        &o,
        StorageMut::U8(&mut st),
        &mut sc,
        &mut of,
    )
    .unwrap();
    (st, sc, of)
}

fn deq(text: &str, st: &[u8], sc: &[f32], of: &[f32], shape: &[usize]) -> Vec<f32> {
    let layout = Layout::new(&parse(text).unwrap(), shape).unwrap();
    let mut out = vec![0f32; layout.num_elements];
    dequantize(&layout, Storage::U8(st), sc, of, &mut out).unwrap();
    out
}

#[test]
fn zero_point_by_hand() {
    // lo = −1.5, hi = 6: s = 7.5 / 15 = 0.5, z = 1.5 / 0.5 = 3; q = round(x / 0.5) + 3.
    let x = [-1.5, 0.25, 1.5, 6.0];
    let t = "u4/native/block4:f32/zero:u8";
    let (st, sc, of) = run(t, &x, &[4], opts(Calibration::MinMax, Rounding::HalfAway));
    assert_eq!(
        (st.as_slice(), sc[0], of[0]),
        (&[0u8, 4, 6, 15][..], 0.5, 3.0)
    );
    // 0.25 / 0.5 = 0.5: away from zero 1 (q 4, x̂ 0.5), to even 0 (q 3, x̂ 0).
    assert_eq!(deq(t, &st, &sc, &of, &[4]), [-1.5, 0.5, 1.5, 6.0]);
    let (st, _, _) = run(t, &x, &[4], opts(Calibration::MinMax, Rounding::HalfEven));
    assert_eq!(st, [0, 3, 6, 15]);
}

#[test]
fn zero_point_holds_zero_exactly() {
    // All positive: the range is widened to [0, 3] (s = 0.2, z = 0), so 0 stays exact.
    let t = "u4/native/tensor:f32/zero:u8";
    let (st, sc, of) = run(t, &[1.0, 3.0, 0.0], &[3], QuantizeOptions::default());
    assert_eq!((sc[0], of[0]), (3.0f32 / 15.0, 0.0));
    assert_eq!(st[2], 0);
    // All-zero block: s = 0, z = 0, every code 0.
    let (st, sc, of) = run(t, &[0.0, -0.0], &[2], QuantizeOptions::default());
    assert_eq!((st, sc[0], of[0]), (vec![0, 0], 0.0, 0.0));
}

#[test]
fn bias_by_hand() {
    // b = 1, s = (4 − 1) / 3 = 1, q = round(x − 1): 1.5 goes to 2 either way.
    let t = "u2/native/block4:f32/bias:bf16";
    let (st, sc, of) = run(t, &[1.0, 2.0, 2.5, 4.0], &[4], QuantizeOptions::default());
    assert_eq!(
        (st.as_slice(), sc[0], of[0]),
        (&[0u8, 1, 2, 3][..], 1.0, 1.0)
    );
    assert_eq!(deq(t, &st, &sc, &of, &[4]), [1.0, 2.0, 3.0, 4.0]);
    // lo = 1 + 2^-8 is halfway between the bfloat16 values 1 and 1 + 2^-7: to even, 1.
    let (_, _, of) = run(
        t,
        &[1.0 + 1.0 / 256.0, 2.0],
        &[2],
        QuantizeOptions::default(),
    );
    assert_eq!(of[0], 1.0);
    // A constant block whose bias rounds above it: the scale falls back to (hi − lo)/qmax = 0,
    // every code 0, x̂ = b.
    let (st, sc, of) = run(t, &[1.0 + 3.0 / 512.0; 3], &[3], QuantizeOptions::default());
    assert_eq!((st, sc[0], of[0]), (vec![0, 0, 0], 0.0, 1.0078125));
}

#[test]
fn bias_saturates_in_f16() {
    let t = "u8/native/tensor:f32/bias:f16";
    let (_, sc, of) = run(t, &[-1e6, 0.0], &[2], QuantizeOptions::default());
    assert_eq!(of[0], -65504.0);
    assert_eq!(sc[0], 65504.0 / 255.0);
}

#[test]
fn text_round_trips_and_rules() {
    for t in [
        "u4/packed_u32_0/block128:bf16/zero:u8",
        "u4/packed_u32_0/block64:bf16/bias:bf16",
        "u8/native/tensor:f32/zero:u8",
        "u2/packed_native1/block4x4:f16/bias:f32",
        "u8/packed_u32_0/tensor/zero:u8",
    ] {
        let s = parse(t).unwrap();
        assert_eq!(s.text().to_string(), t);
    }
    let s = parse("u4/packed_u32_0/block64:bf16/bias:bf16").unwrap();
    assert_eq!(
        s.to_string(),
        "QuantScheme(value=U4, store=PackedU32(0), block=BlockScale([64], BF16), offset=Bias(BF16))"
    );
    for (t, says) in [
        ("u4/native/tensor", "need an offset"),
        ("q4s/native/tensor/zero:u8", "unsigned values"),
        ("u4/native/block16:ue8m0/zero:u8", "F32, F16 or BF16"),
        ("u4/native/block16:ue4m3/zero:u8", "F32, F16 or BF16"),
        (
            "u4/native/block16:f16+tensor:f32/zero:u8",
            "one scale level",
        ),
        ("u4/native/tensor/bias:ue8m0", "a bias is"),
        ("u4/native/tensor/zero:u4", "unknown offset"),
        ("u4/native/tensor/lookup:nf4", "need an offset"),
    ] {
        let e = parse(t).unwrap_err().to_string();
        assert!(e.contains(says), "{t}: {e}");
    }
}

#[test]
fn options_and_given_scales_refused() {
    let s = parse("u4/native/block4:f32/zero:u8").unwrap();
    let o = opts(Calibration::AbsMean, Rounding::HalfAway);
    assert!(crate::quantize::check_call(&s, &[4], &o, false, false).is_err());
    let o = QuantizeOptions::default();
    assert!(matches!(
        crate::quantize::check_call(&s, &[4], &o, true, false),
        Err(QuantError::Scale(_))
    ));
    let o = QuantizeOptions {
        scale_rounding: ScaleRounding::Mx,
        ..o
    };
    assert!(crate::quantize::check_call(&s, &[4], &o, false, false).is_err());
}

#[test]
fn non_finite_refused() {
    let layout = Layout::new(&parse("u4/native/block4:f32/zero:u8").unwrap(), &[4]).unwrap();
    let mut st = vec![0u8; 4];
    let (mut sc, mut of) = (vec![0f32; 1], vec![0f32; 1]);
    let x = [0.0, 1.0, f32::NAN, 2.0];
    let e = quantize(
        Input::F32(&x),
        &layout,
        &QuantizeOptions::default(),
        StorageMut::U8(&mut st),
        &mut sc,
        &mut of,
    );
    assert!(matches!(e, Err(QuantError::NonFinite { index: 2, .. })));
}

#[test]
fn bytes_by_hand_and_back() {
    // Eight U4 codes in one word, two F32 scales, two zero points.
    let t = "u4/packed_u32_0/block4:f32/zero:u8";
    let x = [-1.5, 0.25, 1.5, 6.0, 0.0, 1.0, 2.0, 3.0];
    let layout = Layout::new(&parse(t).unwrap(), &[8]).unwrap();
    let mut words = vec![0u32; 1];
    let (mut sc, mut of) = (vec![0f32; 2], vec![0f32; 2]);
    quantize(
        Input::F32(&x),
        &layout,
        &QuantizeOptions::default(),
        StorageMut::U32(&mut words),
        &mut sc,
        &mut of,
    )
    .unwrap();
    // Block 2: [0, 3], s = 0.2, z = 0, codes 0, 5, 10, 15.
    assert_eq!((sc[1], of[1]), (3.0f32 / 15.0, 0.0));
    assert_eq!(words[0], 0xFA50_F640);
    let scales = Scales::from_stored(&layout, sc.clone(), None).unwrap();
    let mut bytes = vec![0u8; layout.total_bytes()];
    write_bytes(&layout, Storage::U32(&words), &scales, &of, &mut bytes).unwrap();
    assert_eq!(layout.total_bytes(), 4 + 8 + 2);
    assert_eq!(&bytes[..4], &[0x40, 0xF6, 0x50, 0xFA]);
    assert_eq!(&bytes[4..8], &0.5f32.to_le_bytes());
    assert_eq!(&bytes[12..], &[3, 0]);
    let back = from_bytes(&layout, &bytes).unwrap();
    assert_eq!((back.scales.stored, back.offsets.clone()), (sc, of));
    // A zero point above 15, a wrong length: LayoutError.
    let mut bad = bytes.clone();
    bad[12] = 16;
    assert!(matches!(
        from_bytes(&layout, &bad),
        Err(QuantError::Layout(_))
    ));
    assert!(matches!(
        from_bytes(&layout, &bytes[1..]),
        Err(QuantError::Layout(_))
    ));
    // A Native U4 byte above 15 is no code.
    let nl = Layout::new(&parse("u4/native/block4:f32/zero:u8").unwrap(), &[4]).unwrap();
    assert!(crate::pack::check_storage(&nl, Storage::U8(&[0, 15, 16, 1])).is_err());
    assert!(crate::pack::check_storage(&nl, Storage::U8(&[0, 15, 3, 1])).is_ok());
}

#[test]
fn offsets_checked() {
    let l = Layout::new(&parse("u4/native/block2:f32/zero:u8").unwrap(), &[4]).unwrap();
    assert!(check_offsets(&l, &[0.0, 15.0]).is_ok());
    assert!(check_offsets(&l, &[16.0, 0.0]).is_err());
    assert!(check_offsets(&l, &[1.5, 0.0]).is_err());
    assert!(check_offsets(&l, &[1.0]).is_err());
    let l = Layout::new(&parse("u4/native/block2:f32/bias:bf16").unwrap(), &[4]).unwrap();
    assert!(check_offsets(&l, &[1.0, -2.5]).is_ok());
    assert!(check_offsets(&l, &[1.001, 0.0]).is_err());
    assert!(check_offsets(&l, &[f32::INFINITY, 0.0]).is_err());
}

/// A deterministic pseudo-normal sample.
fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| {
            let (u, v) = (next(), next());
            (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect()
}

fn sq_err(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&p, &q)| ((p - q) as f64).powi(2))
        .sum()
}

#[test]
fn every_store_and_shape_round_trips_and_mse_helps() {
    let x = normal(6 * 40, 7);
    for value in QuantValue::UNSIGNED {
        for store in [
            QuantStore::Native,
            QuantStore::PackedU32(0),
            QuantStore::PackedNative(0),
            QuantStore::PackedU32(1),
            QuantStore::PackedNative(1),
        ] {
            for (block, offset) in [
                (Some(&[8usize][..]), Offset::Zero),
                (Some(&[3, 5][..]), Offset::Bias(ScaleDtype::BF16)),
                (None, Offset::Bias(ScaleDtype::F32)),
            ] {
                let mut s = QuantScheme::default()
                    .with_value(value)
                    .with_store(store)
                    .with_offset(Some(offset));
                if let Some(b) = block {
                    s = s.per_block(b, ScaleDtype::F16).unwrap();
                }
                let layout = Layout::new(&s, &[6, 40]).unwrap();
                let dq = |cal| {
                    let wide = layout.packing.word_bits == 32;
                    let mut st8 = vec![0u8; if wide { 0 } else { layout.storage_bytes() }];
                    let mut st32 = vec![0u32; if wide { layout.packing.num_words() } else { 0 }];
                    let out_st = if wide {
                        StorageMut::U32(&mut st32)
                    } else {
                        StorageMut::U8(&mut st8)
                    };
                    let (mut sc, mut of) =
                        (vec![0f32; layout.num_scales], vec![0f32; layout.num_scales]);
                    let o = opts(cal, Rounding::HalfAway);
                    quantize(Input::F32(&x), &layout, &o, out_st, &mut sc, &mut of).unwrap();
                    let st = if wide {
                        Storage::U32(&st32)
                    } else {
                        Storage::U8(&st8)
                    };
                    check_offsets(&layout, &of).unwrap();
                    crate::pack::check_storage(&layout, st).unwrap();
                    let scales = Scales::from_stored(&layout, sc.clone(), None).unwrap();
                    let mut bytes = vec![0u8; layout.total_bytes()];
                    write_bytes(&layout, st, &scales, &of, &mut bytes).unwrap();
                    let back = from_bytes(&layout, &bytes).unwrap();
                    assert_eq!((&back.scales.stored, &back.offsets), (&sc, &of));
                    assert_eq!(back.storage, &bytes[..layout.storage_bytes()]);
                    let mut out = vec![0f32; x.len()];
                    dequantize(&layout, st, &sc, &of, &mut out).unwrap();
                    sq_err(&out, &x)
                };
                let (e_minmax, e_mse) = (dq(Calibration::MinMax), dq(Calibration::Mse));
                assert!(e_mse <= e_minmax, "{s}: {e_mse} > {e_minmax}");
                let power: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
                assert!(e_minmax < 0.5 * power, "{s}: {e_minmax}");
            }
        }
    }
}

#[test]
fn non_f32_input_and_outputs() {
    let t = "u8/packed_u32_0/block16:bf16/bias:f16";
    let x = normal(64, 3);
    let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let layout = Layout::new(&parse(t).unwrap(), &[64]).unwrap();
    let go = |input: Input<'_>| {
        let mut st = vec![0u32; layout.packing.num_words()];
        let (mut sc, mut of) = (vec![0f32; 4], vec![0f32; 4]);
        quantize(
            input,
            &layout,
            &QuantizeOptions::default(),
            StorageMut::U32(&mut st),
            &mut sc,
            &mut of,
        )
        .unwrap();
        (st, sc, of)
    };
    let a = go(Input::F32(&x));
    assert_eq!(a, go(Input::F64(&x64)));
    let mut f = vec![0f32; 64];
    let mut d = vec![0f64; 64];
    dequantize(&layout, Storage::U32(&a.0), &a.1, &a.2, &mut f).unwrap();
    dequantize(&layout, Storage::U32(&a.0), &a.1, &a.2, &mut d).unwrap();
    assert!(f.iter().zip(&d).all(|(&p, &q)| p as f64 == q));
}

/// [`quantize_narrow`] into a U8 layout: (codes one a byte, scales, offsets).
fn run_narrow(
    text: &str,
    bits: u32,
    x: &[f32],
    shape: &[usize],
    o: QuantizeOptions,
) -> Result<(Vec<u8>, Vec<f32>, Vec<f32>)> {
    let layout = Layout::new(&parse(text).unwrap(), shape).unwrap();
    let mut st = vec![0u8; layout.storage_bytes()];
    let mut sc = vec![0f32; layout.num_scales];
    let mut of = vec![0f32; layout.num_scales];
    quantize_narrow(
        Input::F32(x),
        &layout,
        &o,
        bits,
        StorageMut::U8(&mut st),
        &mut sc,
        &mut of,
    )?;
    Ok((st, sc, of))
}

#[test]
fn narrow_codes_are_the_values_of_that_width() {
    // A U8 layout cut to 4 or 2 bits gives the U4 / U2 scheme's codes, scales and offsets.
    let x: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    for cal in [Calibration::MinMax, Calibration::Mse] {
        for (bits, value) in [(4, "u4"), (2, "u2"), (8, "u8")] {
            for off in ["bias:bf16", "zero:u8"] {
                let o = opts(cal, Rounding::HalfEven);
                let wide = run(
                    &format!("{value}/native/block32:bf16/{off}"),
                    &x,
                    &[8, 32],
                    o,
                );
                let narrow = run_narrow(
                    &format!("u8/native/block32:bf16/{off}"),
                    bits,
                    &x,
                    &[8, 32],
                    o,
                )
                .unwrap();
                assert_eq!(wide, narrow, "{value} {off} {cal:?}");
            }
        }
    }
}

#[test]
fn narrow_three_bits_by_hand() {
    // Bias rule on [0, 7] with 3 bits: b = 0, s = 7 / 7 = 1; every integer its own code.
    let x = [0.0, 1.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0];
    let o = opts(Calibration::MinMax, Rounding::HalfEven);
    let (st, sc, of) = run_narrow("u8/native/block8:f32/bias:f32", 3, &x, &[8], o).unwrap();
    assert_eq!((sc[0], of[0]), (1.0, 0.0));
    // 2.5 to even: 2
    assert_eq!(st, [0, 1, 2, 3, 4, 5, 6, 7]);
    // The search's shrunken ranges clamp: still no code above 2^3 − 1.
    let y: Vec<f32> = (0..64)
        .map(|i| ((i * 29 % 61) as f32).powi(3) / 9e3)
        .collect();
    let m = opts(Calibration::Mse, Rounding::HalfEven);
    let (st, _, _) = run_narrow("u8/native/block32:f32/bias:f32", 3, &y, &[64], m).unwrap();
    assert!(st.iter().all(|&q| q <= 7) && st.contains(&7) && st.contains(&0));
}

#[test]
fn narrow_refuses_other_values_and_widths() {
    let x = [0.0f32; 8];
    let o = opts(Calibration::MinMax, Rounding::HalfEven);
    for (text, bits) in [
        ("u4/native/block8:f32/bias:f32", 3),
        ("u8/native/block8:f32/bias:f32", 0),
        ("u8/native/block8:f32/bias:f32", 9),
    ] {
        let e = run_narrow(text, bits, &x, &[8], o).unwrap_err();
        assert!(matches!(e, QuantError::Scheme(_)), "{text} {bits}: {e}");
    }
}

/// The search with its shortcuts (a candidate given up once its partial error reaches the best,
/// a candidate met again skipped) against every candidate's full error, on blocks of every
/// kind: the same scale and offset, bit for bit.
#[test]
fn the_search_with_shortcuts_is_the_full_search() {
    use super::search::{block_error, search, SHRINK};
    let mut st = 12345u64;
    let mut next = || {
        st = st
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        st
    };
    for text in [
        "u4/native/block128:f32/zero:u8",
        "u8/native/block64:bf16/bias:bf16",
        "u2/native/block32:f16/zero:u8",
    ] {
        let scheme = parse(text).unwrap();
        for rounding in [Rounding::HalfEven, Rounding::HalfAway] {
            let rule = params::Rule::new(&scheme, ScaleRounding::Nearest, rounding);
            let full = |b: &[f32], lo: f32, hi: f32| {
                let mut best = rule.params(lo, hi);
                let mut be = block_error(&rule, b, best.0, best.1);
                let (mut bi, mut bj) = (0, 0);
                let mut one =
                    |i: usize, j: usize, best: &mut (f32, f32), bi: &mut usize, bj: &mut usize| {
                        let (s, o) = rule.params(lo * SHRINK[i], hi * SHRINK[j]);
                        let e = block_error(&rule, b, s, o);
                        if e < be {
                            *best = (s, o);
                            be = e;
                            (*bi, *bj) = (i, j);
                        }
                    };
                for k in 1..9 {
                    one(k, k, &mut best, &mut bi, &mut bj);
                }
                let j0 = bj;
                for i in 0..9 {
                    one(i, j0, &mut best, &mut bi, &mut bj);
                }
                let i0 = bi;
                for j in 0..9 {
                    one(i0, j, &mut best, &mut bi, &mut bj);
                }
                best
            };
            for n in [7usize, 32, 100, 128, 200] {
                for _ in 0..60 {
                    let spread = (next() % 9 + 1) as f32;
                    let b: Vec<f32> = (0..n)
                        .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.3) * spread)
                        .collect();
                    let lo = b.iter().cloned().fold(f32::INFINITY, f32::min);
                    let hi = b.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let (a, f) = (search(&rule, &b, lo, hi), full(&b, lo, hi));
                    assert_eq!(
                        (a.0.to_bits(), a.1.to_bits()),
                        (f.0.to_bits(), f.1.to_bits())
                    );
                }
            }
        }
    }
}
