//! Tests of [`crate::kernels::fused_tiles`]: the tile kernel (AVX2 and portable builds, one and two
//! threads) against `compute_scales` + `encode_values`, the two-pass path it replaces (itself
//! tested against format.md's oracle and the Python reference), on ragged grids, N-d blocks, every
//! value type, store and scale dtype, and non-finite input.

use super::*;
use crate::codec::{minifloat, E2M1Code, FloatCode, IntHalfAway, IntHalfEven, Rounding};
use crate::error::QuantError;
use crate::lookup::LookupCode;
use crate::options::QuantizeOptions;
use crate::pack::tests::{Rng, Words, EDGES};
use crate::quantize::encode::encode_values;
use crate::quantize::scales::Scales;
use crate::quantize::tests::{near_tie, product_misses};
use crate::quantize::{compute_scales, quantize};
use crate::scale::ScaleRounding;
use crate::scheme::{QuantScheme, QuantStore, QuantValue, ScaleDtype};

/// Standard-normal-like values at mixed magnitudes, edges (zeros, subnormals, huge), ties at
/// power-of-two scales, and an all-zero stretch (the zero rule).
fn data(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mags = [1e-42, 1e-3, 1.0, 300.0, 1e30];
    let mut x = Vec::with_capacity(n);
    while x.len() < n {
        let run = (1 + rng.below(100)).min(n - x.len());
        let mag: f32 = rng.pick(&mags);
        let zero = rng.below(10) == 0;
        for _ in 0..run {
            x.push(match rng.below(10) {
                _ if zero => 0.0,
                0 => rng.pick(&EDGES),
                1 => (rng.below(33) as f32 - 16.0) / 2.0 * mag,
                _ => rng.unit() * mag,
            });
        }
    }
    x
}

fn two_pass(x: Input<'_>, layout: &Layout, opts: &QuantizeOptions) -> Result<(Scales, Words)> {
    let scales = compute_scales(x, layout, opts, None)?;
    let mut w = Words::filled(layout, 0xA5A5_A5A5);
    encode_values(
        x,
        layout,
        scales.effective().unwrap(),
        opts.rounding,
        w.as_mut(),
    )?;
    Ok((scales, w))
}

/// The tile kernel alone (`avx2` or portable), on whatever pool is installed; the error is
/// built as `quantize` builds it.
fn tiled(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    avx2: bool,
    sizes: Sizes,
) -> Result<(Vec<f32>, Words)> {
    assert!(applies(layout, opts.calibration), "{}", layout.scheme);
    let mut w = Words::filled(layout, 0x5A5A_5A5A);
    // Garbage (a NaN) in every scale: the kernel must write each one.
    let mut stored = vec![f32::from_bits(0x7FC0_5A5A); layout.num_scales];
    let k = FusedKernel::new(layout, opts, crate::kernels::piece::streams(layout));
    let bad = crate::kernels::with_codec::with_codec!(&layout.scheme, opts.rounding, |codec| {
        quantize_tiles_of(codec, x, &k, w.as_mut(), &mut stored, avx2, sizes).unwrap()
    });
    if bad {
        return Err(crate::kernels::piece::first_non_finite(x));
    }
    Ok((stored, w))
}

fn same(a: &[f32], b: &[f32]) -> Option<usize> {
    (0..a.len().max(b.len()))
        .find(|&i| a.get(i).map(|v| v.to_bits()) != b.get(i).map(|v| v.to_bits()))
}

fn same_words(a: &Words, b: &Words) -> Option<usize> {
    assert_eq!(a.len(), b.len());
    (0..a.len()).find(|&i| a.get(i) != b.get(i))
}

/// Every build (portable; AVX2 where the CPU has it) on one and two threads, with small and
/// large tiles, and `quantize`
/// itself, against the two-pass path: the same scales and words, or the same error.
fn check(x: Input<'_>, layout: &Layout, opts: &QuantizeOptions) {
    let ctx = || format!("{} on {:?}, {opts:?}", layout.scheme, layout.shape);
    let want = two_pass(x, layout, opts);
    let mut builds = vec![false];
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() {
        builds.push(true);
    }
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        // Tiles of one block column (or one word's worth), a few, and the kernel's own size;
        // tasks (with AVX2, pipelines of tiles) of every size.
        let sizes = [
            (1, 1),
            (3000, 1),
            (3000, 1 << 12),
            (TILE_BYTES, MIN_TASK_ELEMS),
        ];
        for (&avx2, (tile_bytes, task_elems)) in builds.iter().flat_map(|b| sizes.map(|z| (b, z))) {
            let sizes = Sizes {
                tile_bytes,
                task_elems,
            };
            let got = pool.install(|| tiled(x, layout, opts, avx2, sizes));
            let what = format!("{threads} threads, avx2 {avx2}, {sizes:?}: {}", ctx());
            match (&got, &want) {
                (Ok((s1, w1)), Ok((s2, w2))) => {
                    if let Some(i) = same(s1, &s2.stored) {
                        panic!(
                            "scale {i}: tiles {:e}, two pass {:e}: {what}",
                            s1[i], s2.stored[i]
                        );
                    }
                    if let Some(i) = same_words(w1, w2) {
                        panic!(
                            "word {i}: tiles {:#x}, two pass {:#x}: {what}",
                            w1.get(i),
                            w2.get(i)
                        );
                    }
                }
                (Err(e1), Err(e2)) => assert_eq!(e1.to_string(), e2.to_string(), "{what}"),
                _ => panic!(
                    "tiles {:?}, two pass {:?}: {what}",
                    got.is_ok(),
                    want.is_ok()
                ),
            }
        }
    }
    // `quantize` takes the tile kernel for these layouts.
    let mut w = Words::filled(layout, 0x5A5A_5A5A);
    match (quantize(x, layout, opts, None, w.as_mut()), &want) {
        (Ok(s1), Ok((s2, w2))) => {
            assert_eq!(same(&s1.stored, &s2.stored), None, "quantize: {}", ctx());
            assert_eq!(same_words(&w, w2), None, "quantize: {}", ctx());
        }
        (Err(e1), Err(e2)) => assert_eq!(e1.to_string(), e2.to_string(), "{}", ctx()),
        (got, _) => panic!("quantize {:?}: {}", got.is_ok(), ctx()),
    }
}

fn scheme(value: QuantValue, store: QuantStore, block: &[usize], dtype: ScaleDtype) -> QuantScheme {
    QuantScheme::default()
        .with_value(value)
        .with_store(store)
        .per_block(block, dtype)
        .unwrap()
}

/// Shapes and blocks: ragged edges on every axis, 3-D blocks, blocks whose last dim is 1, a
/// block wider than its axis, tiles several to a grid row.
const CASES: [(&[usize], &[usize]); 12] = [
    (&[37, 45], &[8, 8]),
    (&[20, 300], &[4, 32]),
    (&[5, 7, 30], &[2, 3, 8]),
    (&[4, 6, 16], &[2, 3, 8]),
    (&[33, 10], &[16, 1]),
    (&[9, 70], &[3, 5]),
    (&[130, 260], &[128, 128]),
    (&[6, 2000], &[2, 16]),
    (&[3, 4, 50], &[2, 1, 7]),
    (&[7, 9], &[4, 32]),
    // Column blocks, eight to a vector: rows of whole vectors and a tail.
    (&[40, 77], &[8, 1]),
    (&[5, 3, 40], &[2, 3, 1]),
];

fn stores() -> [QuantStore; 4] {
    [
        QuantStore::Native,
        QuantStore::PackedU32(0),
        QuantStore::PackedNative(0),
        QuantStore::PackedNative(1),
    ]
}

#[test]
fn tiles_equal_two_passes_on_every_value_store_and_scale_dtype() {
    let mut rng = Rng::new(21);
    for (c, &(shape, block)) in CASES.iter().enumerate() {
        let n: usize = shape.iter().product();
        let x = data(&mut rng, n);
        for (i, value) in QuantValue::ALL.into_iter().enumerate() {
            for (j, store) in stores().into_iter().enumerate() {
                let dtype = ScaleDtype::ALL[(c + i + j) % ScaleDtype::ALL.len()];
                let s = scheme(value, store, block, dtype);
                let Ok(layout) = Layout::new(&s, shape) else {
                    continue;
                };
                if !applies(&layout, Calibration::MinMax) {
                    continue; // packed along an outer axis
                }
                let opts = QuantizeOptions {
                    calibration: Calibration::MinMax,
                    rounding: [Rounding::HalfAway, Rounding::HalfEven][(i + j) % 2],
                    scale_rounding: match dtype {
                        ScaleDtype::UE8M0 if (c + j) % 2 == 0 => ScaleRounding::Mx,
                        _ => [ScaleRounding::Up, ScaleRounding::Nearest][(c + i) % 2],
                    },
                };
                if layout
                    .scheme
                    .scale_dtype()
                    .check_rounding(opts.scale_rounding)
                    .is_err()
                {
                    continue;
                }
                check(Input::F32(&x), &layout, &opts);
            }
        }
    }
}

#[test]
fn tiles_equal_two_passes_on_converted_input() {
    let mut rng = Rng::new(22);
    let shape = [19, 70];
    let x: Vec<f32> = data(&mut rng, 19 * 70)
        .iter()
        .map(|v| v.clamp(-6e4, 6e4))
        .collect();
    let h: Vec<u16> = x
        .iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect();
    let b: Vec<u16> = x
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    let d: Vec<f64> = x.iter().map(|&v| v as f64 * (1.0 + 1e-9)).collect();
    for store in [QuantStore::Native, QuantStore::PackedU32(0)] {
        let layout = Layout::new(
            &scheme(QuantValue::Q4S, store, &[4, 8], ScaleDtype::F16),
            &shape,
        )
        .unwrap();
        let opts = QuantizeOptions::default();
        for input in [Input::F16(&h), Input::BF16(&b), Input::F64(&d)] {
            check(input, &layout, &opts);
        }
    }
}

/// The quick encode of integer codes (the checked multiply, no clamp): every value but each
/// block's largest a few ulps from a half-integer multiple of its block's stored scale, where
/// the product by 1 / e and the division round apart; in every integer range, rounding, scale
/// rounding and several scale dtypes, blocks of one and several rows, with and without whole
/// 32s in a tile row. Against the two-pass path (the division), bit for bit.
#[test]
fn tiles_equal_two_passes_near_half_integers() {
    let mut rng = Rng::new(24);
    let mut misses = 0;
    for (shape, block) in [
        (&[64usize, 512][..], &[4usize, 64][..]),
        (&[256, 384], &[128, 128]),
        (&[24, 100], &[3, 20]),
    ] {
        for value in [QuantValue::Q8S, QuantValue::Q4S, QuantValue::Q2S] {
            for dtype in [ScaleDtype::F32, ScaleDtype::F16, ScaleDtype::BF16] {
                for (r, rounding) in [Rounding::HalfAway, Rounding::HalfEven]
                    .into_iter()
                    .enumerate()
                {
                    let layout =
                        Layout::new(&scheme(value, QuantStore::Native, block, dtype), shape)
                            .unwrap();
                    let opts = QuantizeOptions {
                        calibration: Calibration::MinMax,
                        rounding,
                        scale_rounding: [ScaleRounding::Up, ScaleRounding::Nearest][r],
                    };
                    let k = FusedKernel::new(&layout, &opts, false);
                    let (rows, cols) = (shape[0], shape[1]);
                    let (br, bc) = (block[0], block[1]);
                    let mut x = vec![0.0f32; rows * cols];
                    for gr in 0..rows / br {
                        for gc in 0..cols / bc {
                            let alpha = f32::from_bits(0x3000_0000 + rng.below(0x1800_0000) as u32);
                            let e = k.scale(alpha);
                            for i in gr * br..(gr + 1) * br {
                                for j in gc * bc..(gc + 1) * bc {
                                    let v = near_tie(&mut rng, value, e);
                                    let v = if v.abs() < alpha { v } else { 0.0 };
                                    misses += product_misses(value, rounding, &[v], &[e]);
                                    x[i * cols + j] = v;
                                }
                            }
                            // The block's largest, which sets its scale.
                            x[gr * br * cols + gc * bc] =
                                if rng.below(2) == 0 { alpha } else { -alpha };
                        }
                    }
                    check(Input::F32(&x), &layout, &opts);
                }
            }
        }
    }
    // The data must reach the values where the product alone would be wrong.
    assert!(
        misses > 100,
        "only {misses} values where the product and division differ"
    );
}

/// A NaN or an infinity anywhere (first row of a tile, last column, a ragged edge block): the
/// same `NonFinite` error naming the first one, from every build and thread count.
#[test]
fn non_finite_input_is_refused_naming_the_first() {
    let mut rng = Rng::new(23);
    let shape = [37, 45];
    let n = 37 * 45;
    let clean = data(&mut rng, n);
    for (value, store) in [
        (QuantValue::Q8S, QuantStore::Native),
        (QuantValue::Q4S, QuantStore::PackedU32(0)),
        (QuantValue::E2M1, QuantStore::PackedNative(0)),
        (QuantValue::Q2S, QuantStore::PackedNative(0)),
    ] {
        for (block, pos) in [&[8, 8], &[8, 1]]
            .into_iter()
            .flat_map(|b| [0, 44, 45 * 8, n - 1, n / 2, 45 * 36 + 40, 45 * 3 + 17].map(|p| (b, p)))
        {
            let layout =
                Layout::new(&scheme(value, store, block, ScaleDtype::BF16), &shape).unwrap();
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut x = clean.clone();
                x[pos] = bad;
                if pos > 100 {
                    x[pos - 3 - pos % 7] = f32::NAN; // another one before it, in this block or the last
                }
                let err = two_pass(Input::F32(&x), &layout, &QuantizeOptions::default());
                assert!(matches!(err, Err(QuantError::NonFinite { .. })));
                check(Input::F32(&x), &layout, &QuantizeOptions::default());
            }
        }
    }
}

/// Layouts the tile kernel leaves to others: 1-D blocks (the row kernel), absmean and mse,
/// two-level, packing along an outer axis, and blocks too large to stay in cache.
#[test]
fn what_the_tiles_take() {
    let take =
        |s: QuantScheme, shape: &[usize], cal| applies(&Layout::new(&s, shape).unwrap(), cal);
    let q8 = |block: &[usize]| scheme(QuantValue::Q8S, QuantStore::Native, block, ScaleDtype::F32);
    assert!(take(q8(&[128, 128]), &[256, 256], Calibration::MinMax));
    assert!(take(q8(&[128, 1]), &[256, 256], Calibration::MinMax));
    assert!(!take(q8(&[1, 128]), &[256, 256], Calibration::MinMax));
    assert!(!take(q8(&[32]), &[256, 256], Calibration::MinMax));
    assert!(!take(q8(&[8, 8]), &[64, 64], Calibration::AbsMean));
    assert!(!take(q8(&[8, 8]), &[64, 64], Calibration::Mse));
    assert!(!take(q8(&[1024, 1024]), &[1024, 1024], Calibration::MinMax));
    let outer = scheme(
        QuantValue::Q4S,
        QuantStore::PackedU32(1),
        &[8, 8],
        ScaleDtype::F32,
    );
    assert!(!take(outer, &[64, 64], Calibration::MinMax));
    let two = scheme(
        QuantValue::Q8S,
        QuantStore::Native,
        &[8, 8],
        ScaleDtype::F16,
    )
    .per_tensor(ScaleDtype::F32);
    assert!(!take(two, &[64, 64], Calibration::MinMax));
}
