//! The one-pass measure-and-encode's AVX2 build against its portable one, and the per-tensor
//! max |x| path against the two-pass one.

use super::*;

/// Scale bits, any NaN equal to any other.
fn key(v: f32) -> u32 {
    if v.is_nan() {
        u32::MAX
    } else {
        v.to_bits()
    }
}

/// On a CPU with AVX2 this compares the AVX2 build of the one-pass block kernel with the
/// portable one (scales, codes, non-finite flag); without it both sides are portable and
/// the test passes trivially. Non-finite input included: both builds must still agree.
#[test]
fn measure_encode_avx2_build_matches_portable() {
    fn check<C: Encode>(codec: C, x: &[f32], layout: &Layout, opts: &QuantizeOptions) {
        let mut k = FusedKernel::new(layout, opts, false);
        for p in pieces(layout).unwrap() {
            let xs = &x[p.start..p.start + p.len];
            let (mut s1, mut s2) = (vec![-1.0f32; p.scales], vec![-2.0f32; p.scales]);
            let (mut c1, mut c2) = (vec![1u8; p.len], vec![2u8; p.len]);
            let b1 = measure_encode(codec, &k, &p, xs, &mut s1, &mut c1);
            let b2 = measure_encode_portable(codec, &k, &p, xs, &mut s2, &mut c2);
            let ctx = || format!("{} {opts:?} {:?} {p:?}", layout.scheme, layout.shape);
            let (a, b): (Vec<u32>, Vec<u32>) = (
                s1.iter().map(|&v| key(v)).collect(),
                s2.iter().map(|&v| key(v)).collect(),
            );
            assert_eq!(a, b, "scales: {}", ctx());
            assert_eq!(c1, c2, "codes: {}", ctx());
            assert_eq!(b1, b2, "non-finite: {}", ctx());
            // With the non-temporal stores of large storage: the same codes.
            #[cfg(target_arch = "x86_64")]
            {
                k.stream = true;
                let mut c3 = vec![3u8; p.len];
                let b3 = measure_encode(codec, &k, &p, xs, &mut s1, &mut c3);
                // SAFETY: SSE is part of x86-64.
                unsafe { std::arch::x86_64::_mm_sfence() };
                k.stream = false;
                assert_eq!(c3, c2, "streamed codes: {}", ctx());
                assert_eq!(b3, b2, "streamed non-finite: {}", ctx());
            }
        }
    }
    let mut rng = Rng::new(12);
    for (shape, bc) in [
        (&[3, 1000][..], 37),
        (&[PIECE + 100], 64),
        (&[5, 33], 1),
        (&[2, 300], 300),
        (&[4, 96], 32),
        (&[3, 50], 16),
        (&[3, 512], 32),
        (&[2, 1024], 64),
        (&[2 * PIECE + 8], 8),
        // Whole blocks of 8 or a multiple of 16 in groups of eight: the fused kernel's fast
        // path (8, 16 and 32 with their lengths as constants).
        (&[4, 256], 8),
        (&[4, 256], 16),
        (&[2, 4096], 32),
        (&[3, 768], 48),
        (&[2, 2048], 128),
        // Rows that end in a partial block of a multiple-of-8 length: each row's whole
        // blocks eight at a time, its last block alone (rows of one piece; rows split
        // into pieces; a row shorter than a block).
        (&[7, 1000], 48),
        (&[5, 200], 24),
        (&[9, 100], 8),
        (&[2, PIECE + 100], 40),
        (&[3, 20], 32),
        // Blocks back to back of a length under 64 that is not a multiple of 8, eight at
        // a time (`fused_narrow`): rows shorter than a block (a conv kernel's rows of 3,
        // rows of 1 and 12, rows split over pieces), short blocks along rows, with and
        // without a partial last block, and a group cut short at a piece's end.
        (&[700, 3], 32),
        (&[300, 1], 16),
        (&[200, 12], 32),
        (&[6000, 5], 8),
        (&[4, 400], 4),
        (&[3, 1000], 12),
        (&[5, 101], 5),
        (&[2, 997], 63),
        (&[3, 130], 1),
        (&[PIECE / 2 + 3, 3], 4),
    ] {
        let n: usize = shape.iter().product();
        let mut x = tensor(&mut rng, n);
        for _ in 0..n / 500 {
            x[rng.below(n)] = rng.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        }
        for (j, dtype) in ScaleDtype::ALL.into_iter().enumerate() {
            for (i, opts) in all_opts().into_iter().enumerate() {
                let value = QuantValue::ALL[(i + j) % QuantValue::ALL.len()];
                let layout =
                    Layout::new(&one_level(value, QuantStore::Native, bc, dtype), shape).unwrap();
                let mut opts = opts;
                if dtype == ScaleDtype::UE8M0 && i % 2 == 0 {
                    opts.scale_rounding = ScaleRounding::Mx;
                }
                with_codec!(&layout.scheme, opts.rounding, |codec| check(
                    codec, &x, &layout, &opts
                ));
            }
        }
    }
}

/// Per-tensor scales from max |x| on f32 input (`quantize_per_tensor_avx2` where the CPU
/// has AVX2: the quick encode of integer codes one a byte, the general one for other
/// stores) against `compute_scales` + `encode_values`: values a few ulps from half-integer
/// multiples of the scale (where the product by 1 / e and the division round apart),
/// lengths around the 32s and the chunks, every integer range, rounding, scale rounding
/// and store; all zeros; a NaN or an infinity anywhere, refused naming the first.
#[test]
fn per_tensor_max_abs_matches_two_pass() {
    let mut rng = Rng::new(43);
    let mut misses = 0;
    for n in [0, 1, 31, 33, 1000, MIN_TASK_ELEMS + 77, 3 * MIN_TASK_ELEMS] {
        for value in [QuantValue::Q8S, QuantValue::Q4S, QuantValue::Q2S] {
            for (i, store) in STORES.into_iter().enumerate() {
                let dtype = [ScaleDtype::F32, ScaleDtype::F16, ScaleDtype::BF16][i];
                let scheme = QuantScheme::default()
                    .with_value(value)
                    .with_store(store)
                    .per_tensor(dtype);
                let Ok(layout) = Layout::new(&scheme, &[n]) else {
                    continue;
                };
                let opts = QuantizeOptions {
                    calibration: Calibration::MinMax,
                    rounding: [Rounding::HalfAway, Rounding::HalfEven][n % 2],
                    scale_rounding: [ScaleRounding::Up, ScaleRounding::Nearest][i % 2],
                };
                let k = FusedKernel::new(&layout, &opts, false);
                let alpha = f32::from_bits(0x3000_0000 + rng.below(0x1800_0000) as u32);
                let e = k.scale(alpha);
                let mut x: Vec<f32> = (0..n)
                    .map(|_| near_tie(&mut rng, value, e))
                    .map(|v| if v.abs() < alpha { v } else { 0.0 })
                    .collect();
                if n > 0 {
                    x[rng.below(n)] = alpha;
                }
                misses += product_misses(value, opts.rounding, &x, &vec![e; n]);
                let mut cases = vec![x.clone(), vec![0.0; n]];
                if n > 0 {
                    for bad in [f32::NAN, f32::INFINITY, f32::from_bits(0xFFC0_1234)] {
                        let mut y = x.clone();
                        let at = rng.below(n);
                        y[at] = bad;
                        y[rng.below(at + 1)] = -f32::INFINITY;
                        cases.push(y);
                    }
                }
                for y in &cases {
                    let input = Input::F32(y);
                    let want = compute_scales(input, &layout, &opts, None).and_then(|s| {
                        let mut w = Words::filled(&layout, 0xA5A5_A5A5);
                        encode_values(
                            input,
                            &layout,
                            s.effective().unwrap(),
                            opts.rounding,
                            w.as_mut(),
                        )
                        .map(|()| (s.stored, w))
                    });
                    let mut w = Words::filled(&layout, 0x5A5A_5A5A);
                    let got =
                        quantize(input, &layout, &opts, None, w.as_mut()).map(|s| (s.stored, w));
                    match (got, want) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b, "{scheme} n={n} {opts:?}"),
                        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                        (a, b) => {
                            panic!("{scheme} n={n}: {:?} against {:?}", a.is_ok(), b.is_ok())
                        }
                    }
                }
            }
        }
    }
    assert!(
        misses > 100,
        "only {misses} values where the product and division differ"
    );
}

// ---- quantize → dequantize against a scalar reading of format.md ----
