//! The one-pass kernel against the two-pass one (what `quantize` runs when it does not
//! fuse), `measure_piece`'s AVX2 build against its portable one, and quantize → dequantize
//! against a scalar reading of format.md "Calibration" to "Dequantizing".

use super::scales::*;
use super::*;
use crate::kernels::piece::*;
use crate::pack::tests::{grid_index, oracle, Rng, Words, EDGES};
use crate::scheme::{QuantScheme, QuantStore};

const STORES: [QuantStore; 3] = [
    QuantStore::Native,
    QuantStore::PackedU32(0),
    QuantStore::PackedNative(0),
];

/// The timing probes' input: n bell-shaped values (sums of four uniform ones), seeded.
pub(crate) fn timing_data(n: usize) -> Vec<f32> {
    let mut rng = Rng::new(15);
    (0..n)
        .map(|_| (0..4).map(|_| rng.unit()).sum::<f32>())
        .collect()
}

pub(crate) fn one_level(
    value: QuantValue,
    store: QuantStore,
    bc: usize,
    dtype: ScaleDtype,
) -> QuantScheme {
    QuantScheme::default()
        .with_value(value)
        .with_store(store)
        .per_block(&[bc], dtype)
        .unwrap()
}

/// Runs of 1 to 80 values sharing a magnitude, from all-zero (zero rule) and subnormal to
/// near f32::MAX, with edges sprinkled in; some runs mix 1e30 and 1e-30 (absmean's exact
/// sum). Finite only.
fn tensor(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mags = [0.0, 1e-42, 1e-20, 1e-3, 1.0, 0.5, 300.0, 1e5, 1e30, 3e38];
    let mut x = Vec::with_capacity(n);
    while x.len() < n {
        let run = (1 + rng.below(80)).min(n - x.len());
        let mag: f32 = rng.pick(&mags);
        let mixed = rng.below(8) == 0;
        for _ in 0..run {
            let v = match rng.below(12) {
                0 => rng.pick(&EDGES),
                1 if mixed => rng.unit() * 1e30,
                2 => (rng.below(33) as f32 - 16.0) / 2.0 * mag, // ties at power-of-two scales
                _ => rng.unit() * mag,
            };
            x.push(if v.is_finite() { v } else { mag });
        }
    }
    x
}

/// The same values in each input dtype (saturated to its range: no overflow to inf).
struct Inputs {
    f32: Vec<f32>,
    f16: Vec<u16>,
    bf16: Vec<u16>,
    f64: Vec<f64>,
}

impl Inputs {
    fn new(x: Vec<f32>) -> Self {
        let f16 = x
            .iter()
            .map(|&v| half::f16::from_f32(v.clamp(-65504.0, 65504.0)).to_bits())
            .collect();
        let bmax = half::bf16::MAX.to_f32();
        let bf16 = x
            .iter()
            .map(|&v| half::bf16::from_f32(v.clamp(-bmax, bmax)).to_bits())
            .collect();
        // Off the f32 grid, so the conversion rounds (but never overflows).
        let f64 = x
            .iter()
            .map(|&v| {
                if v.abs() < 1e38 {
                    v as f64 * (1.0 + 1e-9)
                } else {
                    v as f64
                }
            })
            .collect();
        Self {
            f32: x,
            f16,
            bf16,
            f64,
        }
    }
    fn get(&self, k: usize) -> Input<'_> {
        match k % 4 {
            0 => Input::F32(&self.f32),
            1 => Input::F16(&self.f16),
            2 => Input::BF16(&self.bf16),
            _ => Input::F64(&self.f64),
        }
    }
}

/// Scales then values, in two passes over memory.
fn two_pass(x: Input<'_>, layout: &Layout, opts: &QuantizeOptions) -> (Scales, Words) {
    let scales = compute_scales(x, layout, opts, None).unwrap();
    let mut w = Words::filled(layout, 0xA5A5_A5A5);
    encode_values(
        x,
        layout,
        scales.effective().unwrap(),
        opts.rounding,
        w.as_mut(),
    )
    .unwrap();
    (scales, w)
}

fn one_pass(x: Input<'_>, layout: &Layout, opts: &QuantizeOptions) -> (Scales, Words) {
    assert!(
        fusable(layout),
        "{} on {:?} is fused",
        layout.scheme,
        layout.shape
    );
    let mut w = Words::filled(layout, 0x5A5A_5A5A);
    // Garbage (a NaN) in every scale: the kernel must write each one.
    let mut stored = vec![f32::from_bits(0x7FC0_5A5A); layout.num_scales];
    quantize_fused(x, layout, opts, w.as_mut(), &mut stored).unwrap();
    (Scales::new(stored, None), w)
}

fn assert_same(x: Input<'_>, layout: &Layout, opts: &QuantizeOptions) {
    let (s2, w2) = two_pass(x, layout, opts);
    let (s1, w1) = one_pass(x, layout, opts);
    let dtype = match x {
        Input::F32(_) => "f32",
        Input::F16(_) => "f16",
        Input::BF16(_) => "bf16",
        Input::F64(_) => "f64",
    };
    let ctx = || {
        format!(
            "{} on {:?}, {opts:?}, {dtype} input",
            layout.scheme, layout.shape
        )
    };
    if let Some(i) =
        (0..s1.stored.len()).find(|&i| s1.stored[i].to_bits() != s2.stored[i].to_bits())
    {
        panic!(
            "scale {i}: one pass {:e}, two pass {:e}: {}",
            s1.stored[i],
            s2.stored[i],
            ctx()
        );
    }
    assert_eq!(s1.stored.len(), s2.stored.len());
    assert_eq!((s1.global, s2.global), (None, None));
    if let Some(i) = (0..w1.len()).find(|&i| w1.get(i) != w2.get(i)) {
        panic!(
            "storage word {i}: one pass {:#x}, two pass {:#x}: {}",
            w1.get(i),
            w2.get(i),
            ctx()
        );
    }
    assert_eq!(w1.len(), w2.len());
}

fn all_opts() -> Vec<QuantizeOptions> {
    let mut v = Vec::new();
    for calibration in [Calibration::MinMax, Calibration::AbsMean] {
        for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
            for scale_rounding in [ScaleRounding::Up, ScaleRounding::Nearest] {
                v.push(QuantizeOptions {
                    calibration,
                    rounding,
                    scale_rounding,
                });
            }
        }
    }
    v
}

/// Every fusable one-level scheme: value × store × block × scale dtype × options, on small
/// shapes with partial edge blocks (and a 0-d tensor), in every input dtype in turn.
#[test]
fn one_pass_matches_two_pass_for_every_fusable_scheme() {
    let mut rng = Rng::new(10);
    let shapes: [&[usize]; 3] = [&[3, 71], &[130], &[]];
    let data: Vec<Inputs> = shapes
        .iter()
        .map(|s| Inputs::new(tensor(&mut rng, s.iter().product())))
        .collect();
    let mut k = 0;
    for value in QuantValue::ALL {
        for store in STORES {
            for bc in [1, 7, 32, 33, 64] {
                for dtype in ScaleDtype::ALL {
                    let scheme = one_level(value, store, bc, dtype);
                    for (shape, x) in shapes.iter().zip(&data) {
                        let layout = Layout::new(&scheme, shape).unwrap();
                        for opts in all_opts() {
                            assert_same(x.get(k), &layout, &opts);
                            k += 1;
                        }
                    }
                }
            }
        }
    }
}

/// `quantize_into` writes every stored scale into the caller's slice (garbage before), the
/// same as `quantize`'s, on the one-pass path and the others (per-tensor, two-level, the mse
/// search), and refuses a slice of the wrong length.
#[test]
fn quantize_into_fills_the_callers_scales() {
    let mut rng = Rng::new(12);
    let x = tensor(&mut rng, 3 * 64);
    let minmax = QuantizeOptions::default();
    let mse = QuantizeOptions {
        calibration: Calibration::Mse,
        ..minmax
    };
    let schemes = [
        one_level(QuantValue::Q8S, QuantStore::Native, 32, ScaleDtype::F16),
        one_level(
            QuantValue::Q4S,
            QuantStore::PackedU32(0),
            16,
            ScaleDtype::BF16,
        ),
        QuantScheme::default(),
        one_level(
            QuantValue::E2M1,
            QuantStore::PackedU32(0),
            16,
            ScaleDtype::UE4M3,
        )
        .per_tensor(ScaleDtype::F32),
        // Two-level integers (`quantize_two_level`), packed and one a byte.
        one_level(
            QuantValue::Q4F,
            QuantStore::PackedU32(0),
            16,
            ScaleDtype::UE4M3,
        )
        .per_tensor(ScaleDtype::F32),
        one_level(QuantValue::Q8S, QuantStore::Native, 16, ScaleDtype::F16)
            .per_tensor(ScaleDtype::F32),
    ];
    // Each scheme with minmax's scales and with searched ones (`quantize_searched`).
    for (scheme, opts) in schemes.iter().flat_map(|s| [(s, minmax), (s, mse)]) {
        let layout = Layout::new(scheme, &[3, 64]).unwrap();
        #[cfg(target_arch = "x86_64")]
        if scheme.is_two_level() && crate::simd::has_avx2() && crate::simd::has_f16c() {
            let two_level = two_level_path(&layout, &opts, None);
            assert_eq!(
                two_level,
                opts.calibration == Calibration::MinMax,
                "{scheme}"
            );
        }
        let mut w1 = Words::new(&layout);
        let want = quantize(Input::F32(&x), &layout, &opts, None, w1.as_mut()).unwrap();
        let mut w2 = Words::filled(&layout, 0x5A5A_5A5A);
        let mut got = vec![f32::from_bits(0x7FC0_5A5A); layout.num_scales];
        let g = quantize_into(Input::F32(&x), &layout, &opts, None, w2.as_mut(), &mut got);
        assert_eq!(g.unwrap(), want.global, "{scheme}");
        assert_eq!(got, want.stored, "{scheme}");
        assert!(w1 == w2, "{scheme}");
        let mut short = vec![0.0; layout.num_scales - 1];
        let err = quantize_into(
            Input::F32(&x),
            &layout,
            &opts,
            None,
            w2.as_mut(),
            &mut short,
        );
        assert!(matches!(err, Err(QuantError::Layout(_))), "{scheme}");
    }
}

/// Pieces tile the tensor, its scales and its words, in order and without overlap: the
/// one-pass kernel hands each piece its scales and words by these counts.
#[test]
fn pieces_tile_elements_scales_and_words() {
    let shapes: [&[usize]; 6] = [
        &[PIECE + 1],
        &[2, PIECE - 1],
        &[3, 5462],
        &[4099, 4],
        &[2, 40000],
        &[5, 1],
    ];
    for shape in shapes {
        for bc in [1, 3, 7, 32, 33, 64, 20000] {
            for store in STORES {
                for value in [QuantValue::Q8S, QuantValue::Q4S, QuantValue::Q2S] {
                    let layout =
                        Layout::new(&one_level(value, store, bc, ScaleDtype::F16), shape).unwrap();
                    let ps = pieces(&layout).unwrap();
                    let (mut e, mut s, mut w) = (0, 0, 0);
                    let unit = lcm(layout.block_cols(), layout.packing.per);
                    for p in &ps {
                        assert_eq!((p.start, p.scale0, p.word0), (e, s, w), "{shape:?} {p:?}");
                        // Non-empty, cache-sized unless one block-and-word unit is larger,
                        // and starting on a block and word boundary of its row.
                        assert!(p.len > 0 && p.len <= PIECE.max(unit), "{shape:?} {p:?}");
                        let col = p.start % layout.row_len();
                        assert_eq!(col % layout.block_cols(), 0, "{shape:?} {p:?}");
                        assert_eq!(col % layout.packing.per, 0, "{shape:?} {p:?}");
                        assert_eq!(p.scale0, grid_index(&layout, p.start));
                        e += p.len;
                        s += p.scales;
                        w += p.words;
                    }
                    assert_eq!(
                        (e, s, w),
                        (
                            layout.num_elements,
                            layout.num_scales,
                            layout.packing.num_words()
                        )
                    );
                }
            }
        }
    }
}

/// Shapes around the one-pass kernel's piece size (2^14 elements): one row of exactly a
/// piece, rows just over and under it (split inside the row), several rows per piece with
/// a short last piece, and blocks longer than a piece.
#[test]
fn one_pass_matches_two_pass_across_piece_boundaries() {
    let mut rng = Rng::new(11);
    // Rows longer than a piece (split inside the row, blocks longer than a piece too),
    // and rows that fit (whole rows per piece, a short last piece).
    let split: [&[usize]; 3] = [&[PIECE + 1], &[PIECE + 700], &[20500]];
    let whole: [&[usize]; 4] = [
        &[PIECE],
        &[2, PIECE / 2 + 1],
        &[3, PIECE / 3 + 1],
        &[PIECE / 4 + 3, 4],
    ];
    let mut data = |shapes: &[&[usize]]| -> Vec<Inputs> {
        shapes
            .iter()
            .map(|s| Inputs::new(tensor(&mut rng, s.iter().product())))
            .collect()
    };
    let (split_data, whole_data) = (data(&split), data(&whole));
    let opts = all_opts();
    let values = [
        QuantValue::Q8S,
        QuantValue::Q4F,
        QuantValue::Q2S,
        QuantValue::E4M3,
        QuantValue::E2M1,
    ];
    let mut k = 0;
    for value in values {
        for store in STORES {
            for bc in [1, 3, 7, 32, 33, 64, 20000] {
                // One shape of each kind per case, taking turns (as do dtype, options and
                // input dtype, on other cycles), keeps the debug test run short.
                let (a, b) = (k % split.len(), k % whole.len());
                for (shape, x) in [(split[a], &split_data[a]), (whole[b], &whole_data[b])] {
                    let dtype = ScaleDtype::ALL[k % ScaleDtype::ALL.len()];
                    let layout = Layout::new(&one_level(value, store, bc, dtype), shape).unwrap();
                    assert_same(x.get(k / 8 + k), &layout, &opts[k % opts.len()]);
                    k += 1;
                }
            }
        }
    }
}

#[test]
fn one_pass_and_two_pass_name_the_same_non_finite_value() {
    let mut x: Vec<f32> = (0..3 * PIECE).map(|i| (i % 17) as f32 - 8.0).collect();
    x[PIECE + 5] = f32::NEG_INFINITY;
    x[2 * PIECE + 1] = f32::NAN;
    for store in STORES {
        let layout = Layout::new(
            &one_level(QuantValue::Q4S, store, 32, ScaleDtype::F16),
            &[3, PIECE],
        )
        .unwrap();
        let opts = QuantizeOptions::default();
        let mut w = Words::new(&layout);
        let mut stored = vec![0.0; layout.num_scales];
        let fused =
            quantize_fused(Input::F32(&x), &layout, &opts, w.as_mut(), &mut stored).unwrap_err();
        let scales = compute_scales(Input::F32(&x), &layout, &opts, None).unwrap();
        let two = encode_values(
            Input::F32(&x),
            &layout,
            scales.effective().unwrap(),
            opts.rounding,
            w.as_mut(),
        )
        .unwrap_err();
        assert_eq!(fused, two);
        assert_eq!(
            fused,
            QuantError::NonFinite {
                index: PIECE + 5,
                value: f32::NEG_INFINITY,
                given: None,
            }
        );
    }
}

/// The two-level kernel (NVFP4 and its kin: blocks of 16 or 32, any value, store, both
/// block dtypes, roundings) against `compute_scales` + `encode_values`: stored scales, g and storage
/// bit for bit, in every input dtype; data with zero blocks, values near f32::MAX, and a
/// tensor so small that g underflows to 0. Non-finite input names the same value.
#[cfg(target_arch = "x86_64")]
#[test]
fn two_level_kernel_matches_two_pass() {
    use ScaleDtype::*;
    if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
        return;
    }
    let mut rng = Rng::new(15);
    let shapes: [(&[usize], usize); 10] = [
        (&[4, 256], 16),
        (&[3, 96], 32),
        (&[2, 48], 16),
        (&[PIECE + 64], 16),
        (&[5, 160], 32),
        // Short blocks back to back (`fused_narrow`): rows shorter than a block, blocks
        // of 4 along rows, rows of 16 under blocks of 32.
        (&[700, 3], 16),
        (&[40, 12], 32),
        (&[3, 400], 4),
        (&[30, 16], 32),
        (&[9, 1], 16),
    ];
    // Codebooks too: their code of 0 (the zero rule's) is the index of the entry nearest +0,
    // NF4's 7, IQ4_NL's (no zero entry) 7 as well, not 0.
    let nf4 = Some(crate::lookup::Codebook::new(&crate::lookup::NF4).unwrap());
    let iq4nl = Some(crate::lookup::Codebook::new(&crate::lookup::IQ4_NL).unwrap());
    let values = [
        (QuantValue::E2M1, None),
        (QuantValue::E4M3, None),
        (QuantValue::Q4S, None),
        (QuantValue::Q8F, None),
        (QuantValue::Q4F, nf4),
        (QuantValue::Q4S, iq4nl),
    ];
    // The block dtypes a two-level scheme takes.
    let dtypes = [UE4M3, F16];
    let mut k = 0;
    for (shape, bc) in shapes {
        let n: usize = shape.iter().product();
        let tiny: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 1e-44).collect();
        for x in [Inputs::new(tensor(&mut rng, n)), Inputs::new(tiny)] {
            for (value, codebook) in values {
                for store in STORES {
                    let dtype = dtypes[k % dtypes.len()];
                    let mut opts = all_opts()[k % 8];
                    opts.calibration = Calibration::MinMax;
                    let mut scheme = one_level(value, store, bc, dtype).per_tensor(F32);
                    if let Some(cb) = codebook {
                        // A codebook has its own tie rule: half-even is refused.
                        scheme = scheme.with_codebook(cb);
                        opts.rounding = Rounding::HalfAway;
                    }
                    let layout = Layout::new(&scheme, shape).unwrap();
                    assert!(two_level_fusable(&layout));
                    let input = x.get(k);
                    let (s2, w2) = two_pass(input, &layout, &opts);
                    let mut w1 = Words::filled(&layout, 0x5A5A_5A5A);
                    let s1 = quantize(input, &layout, &opts, None, w1.as_mut()).unwrap();
                    let ctx = || format!("{scheme} {shape:?} {opts:?} input {}", k % 4);
                    let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&s1.stored), bits(&s2.stored), "{}", ctx());
                    assert_eq!(s1.global.map(f32::to_bits), s2.global.map(f32::to_bits));
                    assert_eq!(
                        s1.effective().unwrap(),
                        s2.effective().unwrap(),
                        "{}",
                        ctx()
                    );
                    if let Some(i) = (0..w1.len()).find(|&i| w1.get(i) != w2.get(i)) {
                        panic!("word {i}: {:#x} vs {:#x}: {}", w1.get(i), w2.get(i), ctx());
                    }
                    // The caller's g (block scales calibrated): the same kernels, against
                    // `compute_scales` under that g. A g between those of the inputs, one
                    // that saturates every block scale, 0, and the largest f32.
                    let g = [2.5e-4, 1e-40, 0.0, f32::MAX][k % 4];
                    let explicit = Some(ExplicitScales {
                        scales: None,
                        global: Some(g),
                    });
                    let s2 = compute_scales(input, &layout, &opts, explicit).unwrap();
                    let mut w2 = Words::filled(&layout, 0xA5A5_A5A5);
                    encode_values(
                        input,
                        &layout,
                        s2.effective().unwrap(),
                        opts.rounding,
                        w2.as_mut(),
                    )
                    .unwrap();
                    let mut w1 = Words::filled(&layout, 0x5A5A_5A5A);
                    let s1 = quantize(input, &layout, &opts, explicit, w1.as_mut()).unwrap();
                    assert_eq!(bits(&s1.stored), bits(&s2.stored), "g {g}: {}", ctx());
                    assert_eq!(s1.global, Some(g));
                    if let Some(i) = (0..w1.len()).find(|&i| w1.get(i) != w2.get(i)) {
                        panic!(
                            "g {g}, word {i}: {:#x} vs {:#x}: {}",
                            w1.get(i),
                            w2.get(i),
                            ctx()
                        );
                    }
                    k += 1;
                }
            }
        }
        let mut bad = tensor(&mut rng, n);
        bad[n - 3] = f32::NAN;
        bad[n / 2] = f32::NEG_INFINITY;
        let scheme =
            one_level(QuantValue::E2M1, QuantStore::PackedNative(0), bc, UE4M3).per_tensor(F32);
        let layout = Layout::new(&scheme, shape).unwrap();
        let opts = QuantizeOptions::default();
        let mut w = Words::new(&layout);
        let got = quantize(Input::F32(&bad), &layout, &opts, None, w.as_mut()).unwrap_err();
        assert_eq!(
            got,
            QuantError::NonFinite {
                index: n / 2,
                value: f32::NEG_INFINITY,
                given: None,
            }
        );
    }
}

/// The two-level kernel's integer codes equal the codec's on the IEEE quotient where the
/// kernel multiplies by a checked reciprocal: values a few ulps from half-integer multiples
/// of their block's effective scale in every group (the product may round the other way
/// there, and the group must be encoded again by division), each block's largest first
/// (one e for all), both roundings, several integer ranges, and a zero block in some groups
/// (the zero rule's path). Each case draws its data until some value's product and quotient
/// round apart (whether any does depends on how 1/e rounded), so every case sees the redo,
/// and the scale must be one the checked multiply stands in for (not a power of two).
#[cfg(target_arch = "x86_64")]
#[test]
fn two_level_int_codes_next_to_ties_are_the_divisions() {
    if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
        return;
    }
    let mut rng = Rng::new(41);
    let mut misses = 0;
    let cases = [
        (QuantValue::Q8S, 16),
        (QuantValue::Q8F, 32),
        (QuantValue::Q4S, 32),
        (QuantValue::Q4F, 16),
        (QuantValue::Q2S, 16),
    ];
    // Some blocks all zeros: their groups take the zero rule's path.
    let zero = |b: usize| b % 37 == 5;
    for (value, bc) in cases {
        for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
            let scheme = one_level(value, QuantStore::Native, bc, ScaleDtype::UE4M3)
                .per_tensor(ScaleDtype::F32);
            let layout = Layout::new(&scheme, &[40, 8 * bc]).unwrap();
            assert!(two_level_fusable(&layout));
            let opts = QuantizeOptions {
                calibration: Calibration::MinMax,
                rounding,
                scale_rounding: ScaleRounding::Nearest,
            };
            let (qmin, qmax) = value.range();
            let (n, blocks) = (layout.num_elements, layout.num_scales);
            // (data, e, values whose product and quotient round apart)
            let mut drawn = None;
            for _ in 0..100 {
                let top = 3.0 + rng.unit();
                let mut x = vec![0.0f32; n];
                for b in 0..blocks {
                    x[b * bc] = if b % 2 == 0 { top } else { -top };
                }
                let mut w = Words::new(&layout);
                let e = quantize(Input::F32(&x), &layout, &opts, None, w.as_mut())
                    .unwrap()
                    .effective()
                    .unwrap()[0];
                for (i, v) in x.iter_mut().enumerate() {
                    let b = i / bc;
                    if zero(b) {
                        *v = 0.0;
                        continue;
                    }
                    if i % bc == 0 {
                        continue; // the block's largest
                    }
                    let k = rng.below((qmax - qmin) as usize + 2) as f64 + qmin as f64 - 0.5;
                    let t = (k * e as f64) as f32;
                    let t = f32::from_bits((t.to_bits() as i32 + rng.below(7) as i32 - 3) as u32);
                    *v = if t.abs() < top { t } else { t * 0.25 };
                }
                let apart = with_codec!(&scheme, rounding, |c| x
                    .iter()
                    .filter(|&&v| c.encode(v * (1.0 / e)) != c.encode(v / e))
                    .count());
                if apart > 0 {
                    drawn = Some((x, e, apart));
                    break;
                }
            }
            let (x, e, apart) =
                drawn.unwrap_or_else(|| panic!("{scheme} {rounding:?}: no value rounds apart"));
            misses += apart;
            assert!(
                crate::simd::checked_reciprocal(e).is_some(),
                "{scheme}: {e:e}"
            );
            assert!(
                crate::simd::exact_reciprocal(e).is_none(),
                "{scheme}: {e:e}"
            );
            let mut w = Words::filled(&layout, 0x5A5A_5A5A);
            let s = quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
            for (b, &f) in s.effective().unwrap().iter().enumerate() {
                assert_eq!(f.to_bits(), if zero(b) { 0 } else { e.to_bits() });
            }
            let mask = layout.packing.field_mask() as u8;
            let want: Vec<u8> = with_codec!(&scheme, rounding, |c| x
                .iter()
                .enumerate()
                .map(|(i, &v)| if zero(i / bc) {
                    c.zero_code()
                } else {
                    c.encode(v / e)
                })
                .collect());
            for (i, &want) in want.iter().enumerate() {
                let got = w.get(i) as u8;
                assert_eq!(
                    got,
                    want & mask,
                    "{scheme} {rounding:?} value {i}: {:e} / {e:e}",
                    x[i]
                );
            }
        }
    }
    assert!(
        misses > 100,
        "only {misses} values where the product rounds apart"
    );
}

/// A value a few ulps either side of a half-integer multiple of `e` within the code range
/// of `value`: where the product by a rounded reciprocal of `e` and the division by it can
/// round to different codes.
pub(crate) fn near_tie(rng: &mut Rng, value: QuantValue, e: f32) -> f32 {
    let (_, qmin, qmax, _) = oracle::spec(value);
    let k = qmin + rng.below((qmax - qmin) as usize) as f64 + 0.5;
    let x = (k * e as f64) as f32;
    let x = f32::from_bits((x.to_bits() as i32).wrapping_add(rng.below(7) as i32 - 3) as u32);
    // Past f32's range (the largest scales): the scale itself.
    if x.is_finite() {
        x
    } else {
        e
    }
}

/// How many of `x` (all against `e`) the reciprocal's product would code differently
/// from the division: the data must hold some for the tests below to mean anything.
pub(crate) fn product_misses(value: QuantValue, rounding: Rounding, x: &[f32], e: &[f32]) -> usize {
    let one = |x: f32, e: f32| {
        let r = 1.0 / e;
        // A subnormal scale's reciprocal is infinite: the kernels divide then.
        let misses = r.is_finite()
            && oracle::encode(value, rounding, x * r)
                != oracle::quantize_one(value, rounding, x, e);
        misses as usize
    };
    x.iter().zip(e).map(|(&x, &e)| one(x, e)).sum()
}

/// Not a test: one-pass schemes on 16 Mi values, one thread: the whole call, and the
/// one-pass kernel alone on one 64 KiB piece in cache (packing included), for A/B runs
/// (`cargo test --release -p blockquant-core -- --ignored --nocapture time_one_pass`;
/// `BQ_TIME_CASE=int8` keeps the cases whose name holds it).
#[test]
#[ignore]
fn time_one_pass() {
    crate::pool::set_num_threads(1);
    let n = 1usize << 24;
    let x = timing_data(n);
    let opts = QuantizeOptions::default();
    let mx = QuantizeOptions {
        scale_rounding: crate::scale::ScaleRounding::Mx,
        ..QuantizeOptions::default()
    };
    let cases = [
        (
            "block32 int8",
            one_level(QuantValue::Q8S, QuantStore::Native, 32, ScaleDtype::F16),
            opts,
        ),
        (
            "block32 int4 u32",
            one_level(
                QuantValue::Q4S,
                QuantStore::PackedU32(0),
                32,
                ScaleDtype::F16,
            ),
            opts,
        ),
        (
            "mxfp8",
            one_level(QuantValue::E4M3, QuantStore::Native, 32, ScaleDtype::UE8M0),
            mx,
        ),
        (
            "mxfp4",
            one_level(
                QuantValue::E2M1,
                QuantStore::PackedNative(0),
                32,
                ScaleDtype::UE8M0,
            ),
            mx,
        ),
    ];
    let only = std::env::var("BQ_TIME_CASE").unwrap_or_default();
    for (name, scheme, opts) in cases {
        if !name.contains(only.as_str()) {
            continue;
        }
        let layout = Layout::new(&scheme, &[n / 4096, 4096]).unwrap();
        let mut w = Words::new(&layout);
        let mut stored = vec![0.0; layout.num_scales];
        let small = Layout::new(&scheme, &[PIECE / 4096, 4096]).unwrap();
        let mut ws = Words::new(&small);
        let mut ss = vec![0.0; small.num_scales];
        let mut best = [f64::MAX; 2];
        for _ in 0..40 {
            let t = std::time::Instant::now();
            quantize_into(
                Input::F32(&x),
                &layout,
                &opts,
                None,
                w.as_mut(),
                &mut stored,
            )
            .unwrap();
            best[0] = best[0].min(t.elapsed().as_secs_f64() * 1e3);
            let t = std::time::Instant::now();
            for _ in 0..n / PIECE {
                quantize_fused(Input::F32(&x[..PIECE]), &small, &opts, ws.as_mut(), &mut ss)
                    .unwrap();
            }
            best[1] = best[1].min(t.elapsed().as_secs_f64() * 1e3);
        }
        println!(
            "{name} 16 Mi: whole {:.2} ms; in cache {:.2} ms",
            best[0], best[1]
        );
    }
}

#[path = "avx2_tests.rs"]
mod avx2;
#[path = "spec_tests.rs"]
mod spec;
