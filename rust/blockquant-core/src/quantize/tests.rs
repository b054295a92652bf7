//! The one-pass kernel against the two-pass one (what `quantize` runs when it does not
//! fuse), `measure_piece`'s AVX2 build against its portable one, and quantize → dequantize
//! against a scalar reading of SPEC §3–§7.

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
    encode_values(x, layout, scales.effective(), opts.rounding, w.as_mut()).unwrap();
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
                    let ps = pieces(&layout);
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
            scales.effective(),
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
                    assert_eq!(s1.effective(), s2.effective(), "{}", ctx());
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
                    encode_values(input, &layout, s2.effective(), opts.rounding, w2.as_mut())
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
                    .effective()[0];
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
            for (b, &f) in s.effective().iter().enumerate() {
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
        for p in pieces(layout) {
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
                        encode_values(input, &layout, s.effective(), opts.rounding, w.as_mut())
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

// ---- quantize → dequantize against a scalar reading of SPEC ----

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

/// SPEC §4: `up` is the smallest value ≥ s, `nearest` the nearest (ties to the even code,
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

/// Stored scales, global scale and effective scales of SPEC §3–§5, one block at a time.
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

/// `quantize` then `dequantize` equal SPEC computed one element at a time, for a spread
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
        );
        let mut y_eff = vec![0.0f32; n];
        dequantize(
            &layout,
            st,
            scales.effective(),
            None,
            Output::F32(&mut y_eff),
        );
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

/// The values stored in `w` (against the grid's scales `eff`) are those of the division's
/// codes of `x` by `e` (each value's scale), per the scalar reading of SPEC.
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
    dequantize(layout, w.as_ref(), eff, None, Output::F32(&mut y));
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
                    let eff = first.effective().to_vec();
                    let e: Vec<f32> = (0..n).map(|f| eff[f / bc]).collect();
                    for f in (0..n).filter(|f| f % bc != 0) {
                        let v = near_tie(&mut rng, value, e[f]);
                        x[f] = if v.abs() < tops[f / bc] { v } else { 0.0 };
                    }
                    misses += product_misses(value, rounding, &x, &e);
                    let scales =
                        quantize(Input::F32(&x), &layout, &opts, None, w.as_mut()).unwrap();
                    assert_eq!(scales.effective(), &eff[..], "{scheme}: the scales moved");
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

/// SPEC §4: under `nearest`, a UE8M0 tie goes up (as ml_dtypes' float8_e8m0fnu cast:
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
