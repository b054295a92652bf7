//! Tests of [`crate::search::lanes`]: eight blocks in lanes give the scales of the portable
//! block-by-block search, and the one-pass quantize the codes of the two-pass one.

use super::*;
use crate::calibrate::{amplitudes, Calibration};
use crate::input::Input;
use crate::lookup::Codebook;
use crate::options::QuantizeOptions;
use crate::pack::storage::StorageMut;
use crate::quantize::encode::encode_values;
use crate::scale::effective_scale;
use crate::scale::ScaleRounding;
use crate::scheme::{QuantScheme, QuantStore, QuantValue, ScaleDtype};
use crate::search::values::with_dequant;
use crate::search::{search_block_portable, Bufs};

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.below(1 << 24) as f32 / (1 << 23) as f32) - 1.0
    }
}

/// Blocks of `bc` values of mixed magnitudes: zero blocks, subnormal and huge ones, values on
/// the half steps of power-of-two scales (ties), a lone large value.
fn blocks(rng: &mut Rng, n: usize, bc: usize) -> Vec<f32> {
    let mags = [0.0f32, 1e-42, 1e-20, 1e-3, 1.0, 0.37, 300.0, 1e30, 3e38];
    let mut x = Vec::with_capacity(n);
    while x.len() < n {
        let mag = mags[rng.below(mags.len() as u64) as usize];
        let kind = rng.below(4);
        for i in 0..bc.min(n - x.len()) {
            let v = match kind {
                0 => (rng.below(33) as f32 - 16.0) / 2.0 * mag,
                1 if i == 3 => 7.0 * mag,
                _ => rng.unit() * mag,
            };
            x.push(if v.is_finite() { v } else { mag });
        }
    }
    x
}

/// Weights ≥ 0 with zeros (and −0) among them.
fn weights(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| match rng.below(8) {
            0 => 0.0,
            1 => -0.0,
            _ => rng.below(1000) as f32 / 300.0,
        })
        .collect()
}

/// Schemes of every path of the candidates in lanes (F16, UE4M3, UE8M0 mx) and of the
/// block-by-block fallback (BF16, F32, UE8M0 up), one- and two-level, with each value kind.
fn schemes(bc: usize) -> Vec<(QuantScheme, ScaleRounding)> {
    use ScaleDtype::*;
    use ScaleRounding::*;
    let iq4nl = Codebook::new(&crate::lookup::IQ4_NL).unwrap();
    let one = |v: QuantValue, d: ScaleDtype| {
        QuantScheme::default()
            .with_value(v)
            .with_store(QuantStore::PackedU32(0))
            .per_block(&[bc], d)
            .unwrap()
    };
    let mut out = Vec::new();
    for v in [
        QuantValue::Q4S,
        QuantValue::Q4F,
        QuantValue::Q8S,
        QuantValue::Q2S,
        QuantValue::E2M1,
        QuantValue::E4M3,
    ] {
        for (d, mode) in [(F16, Up), (F16, Nearest), (UE4M3, Nearest), (UE8M0, Mx)] {
            out.push((one(v, d), mode));
        }
    }
    out.push((one(QuantValue::Q4S, BF16), Up));
    out.push((one(QuantValue::Q4S, F32), Nearest));
    out.push((one(QuantValue::E2M1, UE8M0), Up));
    out.push((one(QuantValue::Q4F, F16).with_codebook(iq4nl), Nearest));
    out.push((one(QuantValue::Q4F, UE4M3).with_codebook(iq4nl), Up));
    for (v, d) in [
        (QuantValue::E2M1, UE4M3),
        (QuantValue::Q4F, UE4M3),
        (QuantValue::Q4S, F16),
    ] {
        for mode in [Up, Nearest] {
            out.push((one(v, d).per_tensor(F32), mode));
        }
    }
    out
}

/// g of a two-level scheme as the search derives it; None for one level.
fn global(x: &[f32], layout: &Layout) -> Option<f32> {
    let s = &layout.scheme;
    s.is_two_level().then(|| {
        let a = amplitudes(Input::F32(x), layout, Calibration::MinMax).unwrap();
        crate::scale::derived_global(&a, s.half_range(), s.scale_dtype())
    })
}

/// Every block's scale searched the portable way, one block at a time.
fn portable_scales(
    x: &[f32],
    w: Option<&[f32]>,
    layout: &Layout,
    mode: ScaleRounding,
    g: Option<f32>,
) -> Vec<f32> {
    let ctx = Ctx::new(layout, mode, g);
    let alpha = amplitudes(Input::F32(x), layout, Calibration::MinMax).unwrap();
    let mut bufs = Bufs::default();
    with_dequant!(&layout.scheme, |q| (0..layout.num_scales)
        .map(|b| search_block_portable(q, &ctx, Input::F32(x), w, layout, b, alpha[b], &mut bufs))
        .collect())
}

fn assert_bits_eq(a: &[f32], b: &[f32], what: &dyn Fn() -> String) {
    assert_eq!(a.len(), b.len());
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{}: scale {i}: {:e} vs {:e}", what(), a[i], b[i]);
    }
}

/// The lanes' scales are the portable search's, bit for bit: every candidate path, 16 and 32
/// values a block, weighted or not, whole groups of eight and a short last group.
#[test]
fn lane_search_equals_block_search() {
    if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
        return;
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for bc in [16, 32] {
        for (scheme, mode) in schemes(bc) {
            for shape in [[3, 7 * bc], [1, bc], [2, 8 * bc]] {
                let layout = Layout::new(&scheme, &shape).unwrap();
                let n = layout.num_elements;
                let x = blocks(&mut rng, n, bc);
                let ws = weights(&mut rng, n);
                for w in [None, Some(&ws[..])] {
                    let g = global(&x, &layout);
                    let ctx = Ctx::new(&layout, mode, g);
                    let alpha = amplitudes(Input::F32(&x), &layout, Calibration::MinMax).unwrap();
                    let mut lanes = vec![0.0f32; layout.num_scales];
                    with_dequant!(&scheme, |q| unsafe {
                        // SAFETY: the CPU has AVX2 and F16C, checked above.
                        search_run(q, &ctx, &x, w, &alpha, &mut lanes)
                    });
                    let plain = portable_scales(&x, w, &layout, mode, g);
                    let what = || format!("{scheme} {mode:?} {shape:?} weighted {}", w.is_some());
                    assert_bits_eq(&lanes, &plain, &what);
                }
            }
        }
    }
}

/// Eight blocks' candidates both ways: listed (None where the lanes would not list them) and
/// every divisor's rounded with the repeats dropped; each as its count and its first `count`
/// slots, lane by lane.
type Slots = (usize, Vec<[u32; 8]>);

#[target_feature(enable = "avx2,f16c")]
unsafe fn both_candidates(ctx: &Ctx, alpha: [f32; 8]) -> (Option<Slots>, Slots) {
    let a = _mm256_loadu_ps(alpha.as_ptr());
    let slots = |c: &[__m256; MAX_CANDIDATES], m: usize| {
        let v = c[..m]
            .iter()
            .map(|v| {
                let mut l = [0u32; 8];
                _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, _mm256_castps_si256(*v));
                l
            })
            .collect();
        (m, v)
    };
    let (mut listed, mut rounded) = (
        [_mm256_setzero_ps(); MAX_CANDIDATES],
        [_mm256_setzero_ps(); MAX_CANDIDATES],
    );
    let got = ctx.listed8(a, &mut listed).map(|m| slots(&listed, m));
    let m = ctx.rounded8(a, &mut rounded);
    (got, slots(&rounded, m))
}

/// Listing a block's UE4M3 candidates (the values from the smallest to the largest, minmax's
/// first) gives exactly the slots that rounding every divisor's candidate and dropping each
/// lane's repeats gives, and the same count: 8- and 4-bit values and a codebook, one and two
/// levels (g from tiny to huge), up and nearest, amplitudes over 2^±40 with raw scales on
/// UE4M3's midpoints (ties), on the normal range's bottom edge and past its top (saturation).
/// Both the listing and the way around it (a lane's smallest candidate not normal, g = 0)
/// must occur; 2-bit values, whose divisors skip values, are never listed.
#[test]
fn listed_candidates_equal_the_rounded_ones() {
    use ScaleDtype::UE4M3;
    if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
        return;
    }
    let iq4nl = Codebook::new(&crate::lookup::IQ4_NL).unwrap();
    let one = |v: QuantValue| {
        QuantScheme::default()
            .with_value(v)
            .with_store(QuantStore::PackedU32(0))
            .per_block(&[16], UE4M3)
            .unwrap()
    };
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let (mut listed, mut around) = (0usize, 0usize);
    for base in [
        one(QuantValue::Q4S),
        one(QuantValue::Q4F),
        one(QuantValue::Q8S),
        one(QuantValue::E2M1),
        one(QuantValue::E4M3),
        one(QuantValue::Q4F).with_codebook(iq4nl),
        one(QuantValue::Q2S),
    ] {
        let two_bit = base.value.bits() == 2;
        for two_level in [false, true] {
            let scheme = if two_level {
                base.per_tensor(ScaleDtype::F32)
            } else {
                base
            };
            let layout = Layout::new(&scheme, &[1, 16]).unwrap();
            let gs: Vec<Option<f32>> = if two_level {
                [0.0, 1e-30, 2f32.powi(-20), 0.37, 1.0, 3.0, 1e3, 1e30]
                    .map(Some)
                    .to_vec()
            } else {
                vec![None]
            };
            for g in gs {
                for mode in [ScaleRounding::Up, ScaleRounding::Nearest] {
                    let ctx = Ctx::new(&layout, mode, g);
                    let (h, gg) = (scheme.half_range(), g.unwrap_or(1.0));
                    let divs = crate::search::cands::divisors(scheme.value);
                    for _ in 0..400 {
                        // Three groups in four with every lane's raw scales inside UE4M3's
                        // range (listed, unless g is 0), the others anywhere.
                        let inside = rng.below(4) != 0;
                        let alpha: [f32; 8] = std::array::from_fn(|_| match rng.below(6) {
                            0 if !inside => 0.0,
                            // A UE4M3 midpoint (m + ½) · 2^e as some candidate's raw scale.
                            0 | 1 => {
                                let m = 8.0 + rng.below(8) as f32 + 0.5;
                                let e = rng.below(12) as i32 - 2;
                                let c = divs[rng.below(divs.len() as u64) as usize];
                                m * 2f32.powi(e) * h * c * gg
                            }
                            // About the normal range's bottom (2^-6) and top (448).
                            2 => 2f32.powi(-6) * h * gg * (1.1 + 0.2 * rng.unit().abs()),
                            3 => 448.0 * h * gg * (0.8 + 0.5 * rng.unit().abs()),
                            _ if inside => {
                                2f32.powi(rng.below(14) as i32 - 5)
                                    * h
                                    * gg
                                    * (1.0 + rng.unit().abs())
                            }
                            _ => {
                                let e = rng.below(81) as i32 - 40;
                                2f32.powi(e) * (1.0 + rng.unit().abs())
                            }
                        });
                        let alpha = alpha.map(|a| if a.is_finite() { a } else { f32::MAX });
                        // SAFETY: the CPU has AVX2 and F16C, checked above.
                        let (got, want) = unsafe { both_candidates(&ctx, alpha) };
                        match got {
                            Some(got) => {
                                assert!(!two_bit, "{scheme}: 2-bit candidates listed");
                                assert_eq!(got, want, "{scheme} {mode:?} g {g:?} α {alpha:?}");
                                listed += 1;
                            }
                            None => around += 1,
                        }
                    }
                }
            }
        }
    }
    assert!(
        listed > 10_000 && around > 1_000,
        "listed {listed}, around {around}"
    );
}

/// Byte or u32 storage, whichever the layout's words are.
fn storage<'a>(layout: &Layout, w8: &'a mut [u8], w32: &'a mut [u32]) -> StorageMut<'a> {
    if layout.packing.word_bytes() == 1 {
        StorageMut::U8(w8)
    } else {
        StorageMut::U32(w32)
    }
}

/// One-pass `quantize` (`quantize_weighted` with weights) gives the portable search's scales
/// and the codes `encode_values` gives for them.
fn one_pass_equals_two_passes(
    layout: &Layout,
    opts: &QuantizeOptions,
    x: &[f32],
    w: Option<&[f32]>,
    what: &dyn Fn() -> String,
) {
    let mode = opts.scale_rounding;
    let words = layout.packing.num_words();
    assert!(crate::search::searchable_in_one_pass(layout), "{}", what());
    let g = global(x, layout);
    let plain = portable_scales(x, w, layout, mode, g);
    let eff: Vec<f32> = match g {
        Some(g) => plain.iter().map(|&s| effective_scale(s, g)).collect(),
        None => plain.clone(),
    };
    let (mut w8a, mut w32a) = (vec![0xA5u8; words], vec![0xA5A5u32; words]);
    let out = storage(layout, &mut w8a, &mut w32a);
    encode_values(Input::F32(x), layout, &eff, opts.rounding, out).unwrap();
    // Another fill: a word left unwritten shows.
    let (mut w8b, mut w32b) = (vec![0x5Au8; words], vec![0x5A5Au32; words]);
    let out = storage(layout, &mut w8b, &mut w32b);
    let xi = Input::F32(x);
    let got = match w {
        None => crate::quantize::quantize(xi, layout, opts, None, out),
        Some(w) => crate::search::quantize_weighted(xi, w, layout, opts, None, out),
    }
    .unwrap();
    assert_bits_eq(&got.stored, &plain, what);
    assert_eq!(got.global, g, "{}", what());
    let word = |w8: &[u8], w32: &[u32], i: usize| match layout.packing.word_bytes() {
        1 => w8[i] as u32,
        _ => w32[i],
    };
    if let Some(i) = (0..words).find(|&i| word(&w8a, &w32a, i) != word(&w8b, &w32b, i)) {
        let bc = layout.block_cols();
        let b = i * layout.packing.per / bc;
        panic!(
            "word {i}: {:#x} vs {:#x} (block {b}, scale {:e}): {}",
            word(&w8a, &w32a, i),
            word(&w8b, &w32b, i),
            plain[b],
            what()
        );
    }
}

/// `quantize` and `quantize_weighted` with calibration mse in one pass give the scales of the
/// portable search and the codes `encode_values` gives for them, in each store (taken in turn);
/// a non-finite value is reported as the two-pass path reports it.
#[test]
fn one_pass_search_equals_scales_then_values() {
    if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
        return;
    }
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let stores = [
        QuantStore::PackedU32(0),
        QuantStore::Native,
        QuantStore::PackedNative(0),
    ];
    let mut k = 0;
    for bc in [16, 32] {
        for (scheme, mode) in schemes(bc) {
            let Some(scheme) = (0..3)
                .map(|i| scheme.with_store(stores[(k + i) % 3]))
                .find(|s| s.validate().is_ok())
            else {
                continue;
            };
            k += 1;
            // Rows of 13 blocks, several to a piece (2^14 values), over more than one piece:
            // groups of eight straddle rows and each piece ends on a short group.
            let shape = [2 + (1 << 14) / (13 * bc), 13 * bc];
            let layout = Layout::new(&scheme, &shape).unwrap();
            let opts = QuantizeOptions {
                calibration: Calibration::Mse,
                scale_rounding: mode,
                ..Default::default()
            };
            let n = layout.num_elements;
            let x = blocks(&mut rng, n, bc);
            let ws = weights(&mut rng, n);
            for w in [None, Some(&ws[..])] {
                let what = || format!("{scheme} {mode:?} weighted {}", w.is_some());
                one_pass_equals_two_passes(&layout, &opts, &x, w, &what);
            }
            // A NaN or infinity anywhere: the two-pass path's error.
            for bad in [f32::NAN, f32::INFINITY] {
                let mut xb = x.clone();
                xb[n - 5 - k] = bad;
                let words = layout.packing.num_words();
                let (mut w8, mut w32) = (vec![0u8; words], vec![0u32; words]);
                let out = storage(&layout, &mut w8, &mut w32);
                let xb = Input::F32(&xb);
                let e = crate::quantize::quantize(xb, &layout, &opts, None, out).unwrap_err();
                assert_eq!(
                    e.to_string(),
                    crate::kernels::piece::first_non_finite(xb).to_string()
                );
            }
        }
    }
}

/// Sums of every candidate of eight blocks of 32 by both ways of q(u): from each input's
/// bracket (None when some lane has none) and by the codebook's search.
#[target_feature(enable = "avx2,f16c")]
unsafe fn both_sums(
    q: crate::lookup::NearestEntry,
    x: &[f32; 256],
    eff: &[[f32; 8]],
) -> (Option<Vec<[f32; 8]>>, Vec<[f32; 8]>) {
    let zero = _mm256_setzero_ps();
    let mut xt = [zero; 32];
    for t in 0..4 {
        transpose8(x.as_ptr().add(8 * t), 32, &mut xt[8 * t..8 * t + 8]);
    }
    let wt = [zero; 32];
    // The sums take the candidates' reciprocals.
    let e: Vec<__m256> = eff
        .iter()
        .map(|e| _mm256_loadu_ps(e.map(crate::search::values::reciprocal).as_ptr()))
        .collect();
    let out = |s: &[__m256; MAX_CANDIDATES]| {
        s[..e.len()]
            .iter()
            .map(|v| {
                let mut a = [0.0f32; 8];
                _mm256_storeu_ps(a.as_mut_ptr(), *v);
                a
            })
            .collect::<Vec<_>>()
    };
    let mut br = [const { std::mem::MaybeUninit::<Bracket8>::uninit() }; 32];
    let mut searched = [zero; MAX_CANDIDATES];
    let alpha = _mm256_set1_ps(f32::MAX);
    all_sums::<_, 4, false, false>(q, &xt, &wt, &br, alpha, &e, &mut searched);
    let bracketed = brackets::<_, 4>(q, &xt, &e, &mut br).then(|| {
        let mut s = [zero; MAX_CANDIDATES];
        all_sums::<_, 4, false, true>(q, &xt, &wt, &br, alpha, &e, &mut s);
        out(&s)
    });
    (bracketed, out(&searched))
}

/// q(u) from the brackets gives the searched q(u)'s sums bit for bit: shipped and user
/// codebooks of 16 and 4 entries, inputs on the thresholds of some candidate (ties) and beside
/// them, zero blocks and zero scales, candidates close together (brackets hold) and far apart
/// (some lane has none: the caller searches; both cases must occur).
#[test]
fn bracketed_sums_equal_searched_sums() {
    use crate::lookup::NearestEntry;
    if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
        return;
    }
    let books: [&[f32]; 6] = [
        &crate::lookup::IQ4_NL,
        &crate::lookup::NF4,
        &crate::lookup::BQ4,
        &[1.5, -0.25, 0.0, -3.0],
        &[-1.0, 1.0, 0.5, -0.5],
        &[
            0.1, -7.0, 3.0, 2.5, -0.1, 6.0, -2.0, 1.0, -1.0, 0.75, 4.0, -5.0, 1e-30, -1e30, 2e30,
            -0.0,
        ],
    ];
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for book in books {
        let cb = Codebook::new(book).unwrap();
        let q = NearestEntry::new(&cb);
        let mids: Vec<f32> = (0..cb.len())
            .flat_map(|i| (0..cb.len()).map(move |j| (i, j)))
            .map(|(i, j)| ((cb.get(i) as f64 + cb.get(j) as f64) / 2.0) as f32)
            .collect();
        let (mut held, mut fell) = (0, 0);
        for trial in 0..300 {
            // Candidates 27/32 .. 37/32 of a scale per lane, or (every third trial) spread
            // over a factor up to 16; lane 5 all zero scales some trials.
            let spread = if trial % 3 == 0 {
                1.0 + rng.below(15) as f32
            } else {
                0.37
            };
            let base: [f32; 8] = std::array::from_fn(|_| 2f32.powi(rng.below(20) as i32 - 10));
            let n = 1 + rng.below(MAX_CANDIDATES as u64) as usize;
            let eff: Vec<[f32; 8]> = (0..n)
                .map(|k| {
                    std::array::from_fn(|l| {
                        let f = 1.0 + spread * (k as f32 / MAX_CANDIDATES as f32 - 0.15);
                        let e = half::f16::from_f32(base[l] * f).to_f32();
                        if l == 5 && trial % 4 == 0 {
                            0.0
                        } else {
                            e
                        }
                    })
                })
                .collect();
            let x: [f32; 256] = std::array::from_fn(|i| {
                let (lane, k) = (i / 32, rng.below(n as u64) as usize);
                let e = eff[k][lane];
                let m = mids[rng.below(mids.len() as u64) as usize];
                match rng.below(5) {
                    _ if lane == 2 && trial % 5 == 0 => 0.0,
                    0 => m * e,
                    1 => f32::from_bits(
                        (m * e)
                            .to_bits()
                            .wrapping_add(rng.below(3) as u32)
                            .wrapping_sub(1),
                    ),
                    2 => -m * e,
                    _ => rng.unit() * e * cb.half_range() * 1.2,
                }
            });
            let x = x.map(|v| if v.is_finite() { v } else { 0.0 });
            // SAFETY: the CPU has AVX2 and F16C, checked above.
            let (bracketed, searched) = unsafe { both_sums(q, &x, &eff) };
            match bracketed {
                Some(b) => {
                    held += 1;
                    for (k, (a, s)) in b.iter().zip(&searched).enumerate() {
                        for l in 0..8 {
                            let zero_scale = eff[k][l] == 0.0;
                            assert!(
                                zero_scale || a[l].to_bits() == s[l].to_bits(),
                                "{cb} trial {trial} candidate {k} lane {l}: {:e} vs {:e}",
                                a[l],
                                s[l]
                            );
                        }
                    }
                }
                None => fell += 1,
            }
        }
        assert!(
            held > 0 && fell > 0,
            "{cb}: {held} bracketed, {fell} searched"
        );
    }
}

/// Codes taken from the brackets after a codebook search are the codec's: blocks whose values
/// sit on the midpoints between entries (and 1–2 ulps beside them) under the candidates' own
/// scales, so that whichever candidate wins, quotients x / e fall on and around its thresholds,
/// where x · r and x / e may round to different sides. Shipped and user codebooks (unsorted,
/// tiny and huge entries, −0), 16 and 4 entries, blocks of 16 and 32, whole and short groups.
#[test]
fn codes_from_brackets_equal_the_codec() {
    use crate::search::divisors;
    if !(crate::simd::has_avx2() && crate::simd::has_f16c()) {
        return;
    }
    let books: [&[f32]; 6] = [
        &crate::lookup::IQ4_NL,
        &crate::lookup::NF4,
        &crate::lookup::BQ4,
        &[
            0.1, -7.0, 3.0, 2.5, -0.1, 6.0, -2.0, 1.0, -1.0, 0.75, 4.0, -5.0, 1e-30, -3e-30, 5.5,
            -0.0,
        ],
        &[1.5, -0.25, 0.0, -3.0],
        &[-1.0, 1.0, 0.5, -0.5],
    ];
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for book in books {
        let cb = Codebook::new(book).unwrap();
        let value = if cb.len() == 16 {
            QuantValue::Q4F
        } else {
            QuantValue::Q2F
        };
        let mut sorted = cb.entries();
        sorted.sort_by(f32::total_cmp);
        let mids: Vec<f32> = sorted.windows(2).map(|p| (p[0] + p[1]) / 2.0).collect();
        for bc in [16, 32] {
            let scheme = QuantScheme::default()
                .with_value(value)
                .with_store(QuantStore::Native)
                .per_block(&[bc], ScaleDtype::F16)
                .unwrap()
                .with_codebook(cb);
            let layout = Layout::new(&scheme, &[37, 3 * bc]).unwrap();
            let hr = cb.half_range();
            let mut x = Vec::with_capacity(layout.num_elements);
            while x.len() < layout.num_elements {
                let alpha = (1.0 + rng.unit().abs()) * 2f32.powi(rng.below(16) as i32 - 8);
                let cand: Vec<f32> = divisors(value)
                    .iter()
                    .map(|&c| half::f16::from_f32(alpha / (hr * c)).to_f32())
                    .collect();
                x.push(if rng.below(2) == 0 { alpha } else { -alpha });
                for _ in 1..bc {
                    let e = cand[rng.below(cand.len() as u64) as usize];
                    let m = mids[rng.below(mids.len() as u64) as usize] * e;
                    let v = f32::from_bits(
                        m.to_bits()
                            .wrapping_add(rng.below(5) as u32)
                            .wrapping_sub(2),
                    );
                    x.push(if v.is_finite() && v.abs() <= alpha {
                        v
                    } else {
                        0.0
                    });
                }
            }
            let opts = QuantizeOptions {
                calibration: Calibration::Mse,
                scale_rounding: ScaleRounding::Nearest,
                ..Default::default()
            };
            let what = || format!("{cb} blocks of {bc}");
            one_pass_equals_two_passes(&layout, &opts, &x, None, &what);
        }
    }
}

/// Not a test: the one-pass mse quantize's time on 3.5 Mi values (blocks of 32, F16 scales),
/// for A/B runs of two builds (`cargo test --release -- --ignored --nocapture time_search`).
#[test]
#[ignore]
fn time_search() {
    crate::pool::set_num_threads(1);
    let mut rng = Rng(12345);
    let n = 6 * 384 * 1536;
    let x: Vec<f32> = (0..n)
        .map(|_| (0..4).map(|_| rng.unit()).sum::<f32>() * 0.02)
        .collect();
    let iq4nl = Codebook::new(&crate::lookup::IQ4_NL).unwrap();
    let one = |v: QuantValue| {
        QuantScheme::default()
            .with_value(v)
            .with_store(QuantStore::Native)
            .per_block(&[32], ScaleDtype::F16)
            .unwrap()
    };
    for (name, scheme) in [
        ("int4", one(QuantValue::Q4S)),
        ("iq4nl", one(QuantValue::Q4F).with_codebook(iq4nl)),
    ] {
        let layout = Layout::new(&scheme, &[6 * 384, 1536]).unwrap();
        let mut out = vec![0u8; n];
        let mut best = [f64::MAX; 2];
        for _ in 0..15 {
            for (k, cal) in [Calibration::MinMax, Calibration::Mse]
                .into_iter()
                .enumerate()
            {
                let opts = QuantizeOptions {
                    calibration: cal,
                    ..Default::default()
                };
                let t = std::time::Instant::now();
                let o = StorageMut::U8(&mut out);
                crate::pool::install(|| {
                    crate::quantize::quantize(Input::F32(&x), &layout, &opts, None, o).unwrap()
                });
                best[k] = best[k].min(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        println!(
            "{name}: minmax {:.2} ms, mse {:.2} ms, ratio {:.2}",
            best[0],
            best[1],
            best[1] / best[0]
        );
    }
}
