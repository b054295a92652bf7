//! quantize → dequantize against a scalar reading of format.md "Calibration" to "Dequantizing", codes next to ties against
//! the division's, and the vectorized test of scales representable in their dtype against one
//! scale at a time.

use super::*;

/// The positive values of a scale dtype in code order (F32: none, it is the identity).
fn dtype_values(dtype: ScaleDtype) -> Vec<f64> {
    match dtype {
        ScaleDtype::F32 => Vec::new(),
        ScaleDtype::F16 => (0..=0x7BFFu16)
            .map(|c| half::f16::from_bits(c).to_f64())
            .collect(),
        ScaleDtype::BF16 => (0..=0x7F7Fu16)
            .map(|c| half::bf16::from_bits(c).to_f64())
            .collect(),
        ScaleDtype::UE4M3 => (0..=0x7E)
            .map(|c| oracle::float_magnitude(QuantValue::E4M3, c).unwrap())
            .collect(),
        ScaleDtype::UE8M0 => (0..=254).map(|c| 2f64.powi(c - 127)).collect(),
    }
}

/// format.md "Storing a scale: rounding to its dtype": `up` is the smallest value ≥ s, `nearest` the nearest (ties to the even code,
/// UE8M0's ties up), both saturating; UE8M0 has no zero, its smallest value stands in.
fn round_scale(dtype: ScaleDtype, s: f32, mode: ScaleRounding) -> f32 {
    if dtype == ScaleDtype::F32 {
        return s;
    }
    let v = dtype_values(dtype);
    let s64 = s as f64;
    let top = v.len() - 1;
    if s64 >= v[top] {
        return v[top] as f32;
    }
    let Some(lo) = v.iter().rposition(|&x| x <= s64) else {
        return v[0] as f32; // UE8M0 below 2^-127
    };
    let code = if v[lo] == s64 {
        lo
    } else if mode == ScaleRounding::Up {
        lo + 1
    } else {
        let mid = (v[lo] + v[lo + 1]) / 2.0;
        let tie_up = dtype == ScaleDtype::UE8M0 || lo % 2 == 1;
        if s64 < mid || (s64 == mid && !tie_up) {
            lo
        } else {
            lo + 1
        }
    };
    v[code] as f32
}

/// Stored scales, global scale and effective scales of format.md "Calibration" to "Two-level schemes", one block at a time.
fn spec_scales(
    x: &[f32],
    layout: &Layout,
    opts: &QuantizeOptions,
) -> (Vec<f32>, Option<f32>, Vec<f32>) {
    let scheme = &layout.scheme;
    let (_, qmin, qmax, _) = oracle::spec(scheme.value);
    let (mut max, mut sum, mut count) = (
        vec![0.0f32; layout.num_scales],
        vec![0.0f64; layout.num_scales],
        vec![0usize; layout.num_scales],
    );
    for (f, &v) in x.iter().enumerate() {
        let g = grid_index(layout, f);
        max[g] = max[g].max(v.abs());
        sum[g] += v.abs() as f64; // exact for the test data (multiples of 2^-6, small)
        count[g] += 1;
    }
    let s_raw: Vec<f32> = (0..layout.num_scales)
        .map(|g| {
            let alpha = match opts.calibration {
                Calibration::MinMax | Calibration::Mse => max[g],
                Calibration::AbsMean if count[g] == 0 => 0.0,
                Calibration::AbsMean => (sum[g] / count[g] as f64) as f32,
            };
            (alpha + alpha) / (qmax - qmin) as f32
        })
        .collect();
    let dtype = scheme.scale_dtype();
    let mode = opts.scale_rounding;
    if !scheme.is_two_level() {
        let stored: Vec<f32> = s_raw.iter().map(|&s| round_scale(dtype, s, mode)).collect();
        return (stored.clone(), None, stored);
    }
    let max_raw = s_raw.iter().fold(0.0f32, |m, &s| m.max(s));
    let dmax = *dtype_values(dtype).last().unwrap() as f32;
    let g = if max_raw == 0.0 { 1.0 } else { max_raw / dmax };
    let stored: Vec<f32> = s_raw
        .iter()
        .map(|&s| round_scale(dtype, s / g, mode))
        .collect();
    let eff = stored.iter().map(|&b| (b * g).min(f32::MAX)).collect();
    (stored, Some(g), eff)
}

/// `quantize` then `dequantize` equal format.md computed one element at a time, for a spread
/// of schemes: per-tensor, 1-D and 2-D blocks, every scale dtype, two-level (NVFP4), both
/// calibrations, packed along the last and an outer axis.
#[test]
fn dequantize_of_quantize_matches_a_scalar_reading_of_spec() {
    use ScaleDtype::*;
    let nvfp4 = QuantScheme::default()
        .with_value(QuantValue::E2M1)
        .with_store(QuantStore::PackedNative(0))
        .per_block(&[16], UE4M3)
        .unwrap()
        .per_tensor(F32);
    let plain =
        |v: QuantValue, store: QuantStore| QuantScheme::default().with_value(v).with_store(store);
    let block = |v: QuantValue, store: QuantStore, b: &[usize], d: ScaleDtype| {
        plain(v, store).per_block(b, d).unwrap()
    };
    let opts = |calibration, rounding, scale_rounding| QuantizeOptions {
        calibration,
        rounding,
        scale_rounding,
    };
    use Calibration::{AbsMean, MinMax};
    use Rounding::{HalfAway, HalfEven};
    use ScaleRounding::{Nearest, Up};
    let cases = [
        (
            plain(QuantValue::Q8S, QuantStore::Native),
            &[5usize, 37][..],
            opts(MinMax, HalfAway, Up),
        ),
        (
            block(QuantValue::Q4S, QuantStore::PackedU32(0), &[32], F16),
            &[3, 70],
            opts(MinMax, HalfEven, Nearest),
        ),
        (
            block(QuantValue::E2M1, QuantStore::PackedNative(0), &[32], UE8M0),
            &[4, 40],
            opts(MinMax, HalfAway, Up),
        ),
        (nvfp4, &[4, 50], opts(MinMax, HalfAway, Nearest)),
        (nvfp4, &[3, 16], opts(MinMax, HalfAway, Up)),
        // Two-level with int4 values in u32 words (the presets' int4_block16), along the
        // last axis and along an outer one.
        (
            block(QuantValue::Q4F, QuantStore::PackedU32(0), &[16], UE4M3).per_tensor(F32),
            &[5, 64],
            opts(MinMax, HalfEven, Nearest),
        ),
        (
            block(QuantValue::Q4S, QuantStore::PackedU32(1), &[8], UE4M3).per_tensor(F32),
            &[10, 24],
            opts(AbsMean, HalfAway, Up),
        ),
        (
            block(QuantValue::E4M3, QuantStore::Native, &[2, 3], BF16),
            &[5, 7],
            opts(MinMax, HalfAway, Up),
        ),
        (
            plain(QuantValue::Q2S, QuantStore::PackedU32(0)),
            &[6, 21],
            opts(AbsMean, HalfAway, Up),
        ),
        (
            block(QuantValue::Q4F, QuantStore::PackedNative(1), &[8], UE4M3),
            &[9, 10],
            opts(AbsMean, HalfEven, Nearest),
        ),
        (
            block(QuantValue::E5M2, QuantStore::PackedU32(1), &[16], UE8M0),
            &[6, 20],
            opts(MinMax, HalfAway, Up),
        ),
        (
            block(QuantValue::Q8F, QuantStore::Native, &[3, 1, 4], F32),
            &[4, 2, 9],
            opts(AbsMean, HalfEven, Up),
        ),
    ];
    let mut rng = Rng::new(13);
    for (scheme, shape, opts) in cases {
        let layout = Layout::new(&scheme, shape).unwrap();
        let n = layout.num_elements;
        // Multiples of 2^-6 below 128 (f64 sums stay exact), some rows scaled far down,
        // one all-zero run (zero rule).
        let x: Vec<f32> = (0..n)
            .map(|i| {
                let v = (rng.below(2 * 128 * 64) as f32 - 128.0 * 64.0) / 64.0;
                match (i / 16) % 5 {
                    1 => v * 2f32.powi(-12),
                    3 if i < 32 => 0.0,
                    _ => v,
                }
            })
            .collect();
        let mut w = Words::new(&layout);
        let scales = quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
        // As the bindings call it (a two-level g multiplied in block by block), and against
        // the effective scales worked out first: the same bits.
        let mut y = vec![0.0f32; n];
        let st = w.as_ref();
        dequantize(
            &layout,
            st,
            &scales.stored,
            scales.global,
            Output::F32(&mut y),
        )
        .unwrap();
        let mut y_eff = vec![0.0f32; n];
        dequantize(
            &layout,
            st,
            scales.effective().unwrap(),
            None,
            Output::F32(&mut y_eff),
        )
        .unwrap();
        let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y), bits(&y_eff), "{scheme} {opts:?}");

        let (stored, global, eff) = spec_scales(&x, &layout, &opts);
        assert_eq!(
            bits(&scales.stored),
            bits(&stored),
            "{scheme} {opts:?} stored scales"
        );
        assert_eq!(
            scales.global.map(f32::to_bits),
            global.map(f32::to_bits),
            "{scheme}"
        );
        let mask = (1u32 << scheme.value.bits()) - 1;
        for f in 0..n {
            let e = eff[grid_index(&layout, f)];
            let q = oracle::quantize_one(scheme.value, opts.rounding, x[f], e);
            let want = oracle::dequantize_one(scheme.value, q as u32 & mask, e);
            assert_eq!(
                y[f].to_bits(),
                want.to_bits(),
                "{scheme} {opts:?} x[{f}] = {} e {e}: got {}",
                x[f],
                y[f]
            );
        }
    }
}

/// The values stored in `w` (against the grid's scales `eff`) are those of the division's
/// codes of `x` by `e` (each value's scale), per the scalar reading of format.md.
fn assert_division_codes(
    layout: &Layout,
    w: &Words,
    eff: &[f32],
    x: &[f32],
    e: &[f32],
    rounding: Rounding,
    ctx: &str,
) {
    let value = layout.scheme.value;
    let mut y = vec![0.0f32; x.len()];
    dequantize(layout, w.as_ref(), eff, None, Output::F32(&mut y)).unwrap();
    let mask = (1u32 << value.bits()) - 1;
    for (f, ((&y, &x), &e)) in y.iter().zip(x).zip(e).enumerate() {
        let q = oracle::quantize_one(value, rounding, x, e);
        let want = oracle::dequantize_one(value, q as u32 & mask, e);
        assert_eq!(
            y.to_bits(),
            want.to_bits(),
            "{ctx} x[{f}] = {x:e}, e = {e:e}"
        );
    }
}

const INTS: [QuantValue; 6] = [
    QuantValue::Q8S,
    QuantValue::Q8F,
    QuantValue::Q4S,
    QuantValue::Q4F,
    QuantValue::Q2S,
    QuantValue::Q2F,
];

/// Integer codes divide by a scale as a checked multiply by its reciprocal
/// (`simd::x86::int_codes8_recip`); values at the edge of a rounding boundary fall back to
/// the division. Given scales (float16, f32 from tiny to 2^118, subnormal, past 2^126) on
/// runs short and long, per tensor and per block, each rounding: the division's codes.
#[test]
fn near_ties_take_the_divisions_codes_with_given_scales() {
    let mut rng = Rng::new(16);
    let mut misses = 0;
    for value in INTS {
        for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
            for (block, shape) in [(None, &[4099usize][..]), (Some(64), &[8, 64][..])] {
                let plain = QuantScheme::default().with_value(value);
                let scheme = match block {
                    Some(b) => plain.per_block(&[b], ScaleDtype::F32).unwrap(),
                    None => plain,
                };
                let layout = Layout::new(&scheme, shape).unwrap();
                let scale = |rng: &mut Rng| match rng.below(5) {
                    0 | 1 => half::f16::from_bits(1 + rng.below(0x7BFF) as u16).to_f32(),
                    2 => f32::from_bits(0x0080_0000 + rng.below(0x7600_0000) as u32),
                    3 => f32::from_bits(1 + rng.below(0x007F_FFFF) as u32),
                    _ => f32::from_bits(0x7E00_0000 + rng.below(0x0100_0000) as u32),
                };
                for _ in 0..8 {
                    let eff: Vec<f32> = (0..layout.num_scales).map(|_| scale(&mut rng)).collect();
                    let n = layout.num_elements;
                    let e: Vec<f32> = (0..n).map(|f| eff[grid_index(&layout, f)]).collect();
                    let x: Vec<f32> = e.iter().map(|&e| near_tie(&mut rng, value, e)).collect();
                    misses += product_misses(value, rounding, &x, &e);
                    let mut w = Words::new(&layout);
                    encode_values(Input::F32(&x), &layout, &eff, rounding, w.as_mut()).unwrap();
                    let ctx = format!("{scheme} {rounding:?}");
                    assert_division_codes(&layout, &w, &eff, &x, &e, rounding, &ctx);
                }
            }
        }
    }
    assert!(
        misses > 1000,
        "only {misses} values where the product misses"
    );
}

/// Given scales on whole blocks of 8, 16, 32, 48 and 128 values, eight blocks at a time
/// (`fused_avx2::encode_groups_given`), every value kind, one code a byte and packed:
/// values near rounding boundaries, values past the range (clamped or saturated), zero
/// scales (the zero rule) alone in a group or not, subnormal and huge scales, a tail of
/// blocks short of a group; the division's codes. A non-finite value anywhere is an error.
#[test]
fn given_scales_eight_blocks_at_a_time_take_the_divisions_codes() {
    let mut rng = Rng::new(18);
    for value in QuantValue::ALL {
        let stores: &[QuantStore] = if value.bits() < 8 {
            &[QuantStore::Native, QuantStore::PackedU32(0)]
        } else {
            &[QuantStore::Native]
        };
        let sizes = [8, 16, 32, 48, 128];
        for (&store, bc) in stores.iter().flat_map(|s| sizes.map(|bc| (s, bc))) {
            for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
                let scheme = one_level(value, store, bc, ScaleDtype::F32);
                // Rows of 19 blocks: two groups of eight and a tail of three.
                let layout = Layout::new(&scheme, &[4, 19 * bc]).unwrap();
                let per_row = layout.grid_cols();
                let eff: Vec<f32> = (0..layout.num_scales)
                    .map(|k| match (k / per_row, rng.below(12)) {
                        (1, _) if k % per_row == 5 => 0.0, // one zero in a group
                        (2, 0) => 0.0,
                        (_, 1) => f32::from_bits(1 + rng.below(0x007F_FFFF) as u32),
                        (_, 2) => 2f32.powi(100 + rng.below(27) as i32),
                        _ => 2f32.powi(rng.below(40) as i32 - 20) * (0.5 + rng.unit()),
                    })
                    .collect();
                let n = layout.num_elements;
                let e: Vec<f32> = (0..n).map(|f| eff[grid_index(&layout, f)]).collect();
                let (_, qmin, qmax, _) = oracle::spec(value);
                let x: Vec<f32> = e
                    .iter()
                    .map(|&e| {
                        let v = match rng.below(3) {
                            0 if INTS.contains(&value) => near_tie(&mut rng, value, e),
                            // Up to twice the range: some clamp (or saturate).
                            _ => (rng.unit() * 4.0 - 2.0) * (qmax - qmin) as f32 / 2.0 * e,
                        };
                        if v.is_finite() {
                            v
                        } else {
                            e
                        }
                    })
                    .collect();
                let mut w = Words::new(&layout);
                encode_values(Input::F32(&x), &layout, &eff, rounding, w.as_mut()).unwrap();
                let ctx = format!("{scheme} {rounding:?}");
                assert_division_codes(&layout, &w, &eff, &x, &e, rounding, &ctx);
                // One non-finite value, in a group or in the tail: an error.
                for at in [3 * bc + 1, 17 * bc + 2] {
                    for bad in [f32::NAN, f32::INFINITY] {
                        let mut y = x.clone();
                        y[per_row * bc + at] = bad;
                        let got =
                            encode_values(Input::F32(&y), &layout, &eff, rounding, w.as_mut());
                        assert!(got.is_err(), "{ctx}: {bad} at {at}");
                    }
                }
            }
        }
    }
}

/// The one-pass kernel's blocks of 8, 16, 32, 48 and 128 (eight at a time) with scales from
/// the data:
/// each block's largest value sets its scale, the others lie at the edge of a rounding
/// boundary of that scale; the division's codes.
#[test]
fn near_ties_take_the_divisions_codes_in_one_pass() {
    let mut rng = Rng::new(17);
    let mut misses = 0;
    for value in INTS {
        for bc in [8, 16, 32, 48, 128] {
            for dtype in [ScaleDtype::F16, ScaleDtype::F32, ScaleDtype::BF16] {
                for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
                    let scheme = one_level(value, QuantStore::Native, bc, dtype);
                    let layout = Layout::new(&scheme, &[8, 768]).unwrap();
                    let opts = QuantizeOptions {
                        calibration: Calibration::MinMax,
                        rounding,
                        scale_rounding: rng.pick(&[ScaleRounding::Up, ScaleRounding::Nearest]),
                    };
                    let n = layout.num_elements;
                    // Each block's first value its largest, 2^-20 to 2^20.
                    let tops: Vec<f32> = (0..n / bc)
                        .map(|_| 2f32.powi(rng.below(41) as i32 - 20) * (1.0 + rng.unit() / 2.0))
                        .collect();
                    let mut x: Vec<f32> = (0..n)
                        .map(|f| if f % bc == 0 { tops[f / bc] } else { 0.0 })
                        .collect();
                    let mut w = Words::new(&layout);
                    let first = quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
                    let eff = first.effective().unwrap().to_vec();
                    let e: Vec<f32> = (0..n).map(|f| eff[f / bc]).collect();
                    for f in (0..n).filter(|f| f % bc != 0) {
                        let v = near_tie(&mut rng, value, e[f]);
                        x[f] = if v.abs() < tops[f / bc] { v } else { 0.0 };
                    }
                    misses += product_misses(value, rounding, &x, &e);
                    let scales =
                        quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
                    assert_eq!(
                        scales.effective().unwrap(),
                        &eff[..],
                        "{scheme}: the scales moved"
                    );
                    let ctx = format!("{scheme} {opts:?}");
                    assert_division_codes(&layout, &w, &eff, &x, &e, rounding, &ctx);
                }
            }
        }
    }
    assert!(
        misses > 1000,
        "only {misses} values where the product misses"
    );
}

/// The float16 check eight at a time against `is_representable` one at a time: a bad
/// scale (NaN, ±inf, negative, between two float16 values) at every position of a group,
/// among good ones (0, −0, subnormals, 65504).
#[test]
fn first_unrepresentable_f16_matches_one_at_a_time() {
    let good = [
        0.0f32,
        -0.0,
        5.9604645e-8,
        6.1035156e-5,
        1.0,
        0.5,
        65504.0,
        3.0,
    ];
    let bad = [
        f32::NAN,
        f32::INFINITY,
        -1.0,
        1.0 + 1e-6,
        65505.0,
        1e-9,
        f32::NEG_INFINITY,
    ];
    let mut rng = Rng::new(14);
    for len in [0, 7, 8, 9, 40] {
        for pos in 0..=len {
            let mut v: Vec<f32> = (0..len).map(|_| rng.pick(&good)).collect();
            if pos < len {
                v[pos] = rng.pick(&bad);
            }
            let want = v.iter().position(|&s| !ScaleDtype::F16.is_representable(s));
            assert_eq!(first_unrepresentable(ScaleDtype::F16, &v), want, "{v:?}");
        }
    }
}

/// The UE4M3 and UE8M0 vector checks and F32's runs of 64 against one at a time: good and
/// bad scales at every position around the groups of eight and 64, and eight copies of
/// each of a sweep of f32 bit patterns (every sign, exponent and many mantissas; NaNs,
/// infinities, subnormals).
#[test]
fn first_unrepresentable_ue4m3_ue8m0_f32_match_one_at_a_time() {
    let cases: [(ScaleDtype, &[f32], &[f32]); 3] = [
        (
            ScaleDtype::F32,
            &[0.0, -0.0, 1.0, 3.0e-42, 1.1754942e-38, f32::MAX, 0.1],
            &[
                f32::NAN,
                -f32::NAN,
                f32::INFINITY,
                -f32::INFINITY,
                -1.0,
                -3.0e-42,
            ],
        ),
        (
            ScaleDtype::UE4M3,
            &[
                0.0,
                -0.0,
                448.0,
                1.0 / 512.0,
                0.015625,
                1.125,
                240.0,
                7.0 / 512.0,
            ],
            &[f32::NAN, f32::INFINITY, -1.0, 449.0, 1.0625, 1e-4, 480.0],
        ),
        (
            ScaleDtype::UE8M0,
            &[
                1.0,
                0.5,
                2f32.powi(127),
                2f32.powi(-126),
                2f32.powi(-127),
                1024.0,
            ],
            &[
                0.0,
                -0.0,
                f32::NAN,
                f32::INFINITY,
                -1.0,
                3.0,
                2f32.powi(-128),
                1.5,
            ],
        ),
    ];
    let mut rng = Rng::new(15);
    for (dtype, good, bad) in cases {
        for len in [0, 7, 8, 9, 40, 64, 130] {
            for pos in 0..=len {
                let mut v: Vec<f32> = (0..len).map(|_| rng.pick(good)).collect();
                if pos < len {
                    v[pos] = rng.pick(bad);
                }
                let want = v.iter().position(|&s| !dtype.is_representable(s));
                assert_eq!(first_unrepresentable(dtype, &v), want, "{dtype} {v:?}");
            }
        }
        for bits in (0..=u32::MAX).step_by(4099) {
            let s = f32::from_bits(bits);
            let want = (!dtype.is_representable(s)).then_some(0);
            assert_eq!(first_unrepresentable(dtype, &[s; 8]), want, "{dtype} {s:e}");
        }
    }
}

/// format.md "Storing a scale: rounding to its dtype": under `nearest`, a UE8M0 tie goes up (as ml_dtypes' float8_e8m0fnu cast:
/// 3.0 → 4.0, 0.75 → 1.0), unlike the other dtypes' ties to even.
#[test]
fn ue8m0_nearest_scale_ties_go_up() {
    let scheme = one_level(QuantValue::Q8S, QuantStore::Native, 4, ScaleDtype::UE8M0);
    let layout = Layout::new(&scheme, &[8]).unwrap();
    // α = 381 and 95.25 give s_raw = 381/127 = 3.0 and 0.75, ties between powers of two.
    let x = [381.0, 1.0, -2.0, 3.0, -95.25, 0.5, 0.0, 1.0];
    let opts = QuantizeOptions {
        scale_rounding: ScaleRounding::Nearest,
        ..Default::default()
    };
    let mut w = Words::new(&layout);
    let scales = quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
    assert_eq!(scales.stored, [4.0, 1.0]);
}
