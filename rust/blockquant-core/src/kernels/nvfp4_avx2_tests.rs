//! Tests of [`crate::kernels::nvfp4_avx2`]: the vector E2M1 rounding against the scalar one and format.md's
//! oracle, and the two-pass NVFP4 kernel against `compute_scales` + `encode_values` (the
//! general path, itself tested against the portable build and the Python reference).

use super::*;
use crate::codec::Encode;
use crate::error::QuantError;
use crate::options::QuantizeOptions;
use crate::pack::tests::{oracle, Rng, Words, EDGES};
use crate::quantize::compute_scales;
use crate::quantize::encode::encode_values;
use crate::quantize::scales::Scales;
use crate::scale::ScaleRounding;
use crate::scheme::{QuantScheme, QuantStore, ScaleDtype};
use crate::Rounding;

fn avx2() -> bool {
    crate::simd::has_avx2() && crate::simd::has_f16c()
}

/// Eight E2M1 codes by the kernel's [`e2m1_codes32`] (on a group of four vectors: the same
/// eight repeated), one an i32 lane.
#[target_feature(enable = "avx2")]
unsafe fn codes8(q: __m256) -> __m256i {
    let bytes = e2m1_codes32(&[q; 4]);
    // In pack order, lanes 0..4 of the first vector are bytes 0..4, lanes 4..8 bytes 16..20.
    let mut b = [0u8; 32];
    _mm256_storeu_si256(b.as_mut_ptr() as *mut __m256i, bytes);
    let lanes: [i32; 8] = std::array::from_fn(|j| b[if j < 4 { j } else { 12 + j }] as i32);
    _mm256_loadu_si256(lanes.as_ptr() as *const __m256i)
}

/// The kernel's E2M1 rounding against `E2M1Code::encode` on the f32 patterns `first, first + step, ...`
/// (NaNs skipped: pass 2 never sees one); returns the first disagreement.
fn codes_mismatch(first: u64, step: u64, count: u64) -> Option<(u32, u32, u8)> {
    #[target_feature(enable = "avx2")]
    unsafe fn run(first: u64, step: u64, count: u64) -> Option<(u32, u32, u8)> {
        let mut lanes = [0u32; 8];
        let mut got = [0u32; 8];
        for k in (0..count).step_by(8) {
            for (j, l) in lanes.iter_mut().enumerate() {
                let b = (first + (k + j as u64) * step) as u32;
                *l = if f32::from_bits(b).is_nan() { 0 } else { b };
            }
            let v = _mm256_loadu_ps(lanes.as_ptr() as *const f32);
            _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, codes8(v));
            for (&b, &g) in lanes.iter().zip(&got) {
                let want = E2M1Code.encode(f32::from_bits(b));
                if g != want as u32 {
                    return Some((b, g, want));
                }
            }
        }
        None
    }
    // SAFETY: the callers checked the CPU has AVX2.
    unsafe { run(first, step, count) }
}

fn assert_codes(first: u64, step: u64, count: u64) {
    if let Some((b, got, want)) = codes_mismatch(first, step, count) {
        panic!(
            "{:e} ({b:#010x}): codes8 {got:#x}, encode {want:#x}",
            f32::from_bits(b)
        );
    }
}

/// Every E2M1 midpoint (ties: the even code wins), the values, ±0, subnormals, huge values
/// and infinities, in both signs, each against format.md's oracle too.
#[test]
fn e2m1_codes_on_ties_and_edges() {
    if !avx2() {
        return;
    }
    let mut xs = vec![
        0.0f32,
        0.25,
        0.75,
        1.25,
        1.75,
        2.5,
        3.5,
        5.0,
        0.5,
        1.0,
        1.5,
        2.0,
        3.0,
        4.0,
        6.0,
        6.5,
        7.0,
        12.0,
        1e-45,
        1e-40,
        1.1754942e-38,
        1e30,
        3.4e38,
        f32::MAX,
        f32::INFINITY,
    ];
    for m in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 2.0, 4.0, 6.0] {
        xs.push(f32::from_bits(m.to_bits() - 1));
        xs.push(f32::from_bits(m.to_bits() + 1));
    }
    xs.extend(EDGES.iter().filter(|v| !v.is_nan()));
    let n = xs.len();
    for i in 0..n {
        xs.push(-xs[i]);
    }
    while xs.len() % 8 != 0 {
        xs.push(0.0);
    }
    for chunk in xs.chunks(8) {
        let mut got = [0u32; 8];
        // SAFETY: the CPU has AVX2, checked above; the chunk holds eight values.
        unsafe {
            let v = _mm256_loadu_ps(chunk.as_ptr());
            _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, codes8(v));
        }
        for (&x, &g) in chunk.iter().zip(&got) {
            let want = oracle::encode(QuantValue::E2M1, Rounding::HalfEven, x);
            assert_eq!(g, want as u32, "{x:e}: vector {g:#x}, oracle {want:#x}");
            assert_eq!(want, E2M1Code.encode(x), "{x:e}: oracle vs encode");
        }
    }
}

/// A sweep over all bit patterns (every 8191st) and every pattern near each midpoint and
/// stretch boundary.
#[test]
fn e2m1_codes_on_a_sweep() {
    if !avx2() {
        return;
    }
    assert_codes(0, 8191, (1u64 << 32) / 8191 / 8 * 8);
    for m in [0.25f32, 0.75, 1.25, 1.75, 2.0, 2.5, 3.5, 4.0, 5.0, 6.0] {
        for sign in [0u32, 0x8000_0000] {
            assert_codes((m.to_bits() | sign) as u64 - 4096, 1, 8192);
        }
    }
}

/// Every f32 pattern: the proof. Slow; run with
/// `cargo test --release -p blockquant-core -- --ignored every_f32`.
#[test]
#[ignore]
fn e2m1_codes_on_every_f32() {
    if avx2() {
        assert_codes(0, 1, 1u64 << 32);
    }
}

/// `v`, or f32::MAX in its place when not finite.
fn finite(v: f32) -> f32 {
    if v.is_finite() {
        v
    } else {
        f32::MAX
    }
}

fn nvfp4(bc: usize) -> QuantScheme {
    QuantScheme::default()
        .with_value(QuantValue::E2M1)
        .with_store(QuantStore::PackedNative(0))
        .per_block(&[bc], ScaleDtype::UE4M3)
        .unwrap()
        .per_tensor(ScaleDtype::F32)
}

fn two_pass(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    global: Option<f32>,
) -> (Scales, Words) {
    let explicit = crate::quantize::scales::ExplicitScales {
        scales: None,
        global,
    };
    let scales = compute_scales(x, layout, opts, Some(explicit)).unwrap();
    let mut w = Words::filled(layout, 0xA5);
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

fn kernel(
    x: Input<'_>,
    layout: &Layout,
    opts: &QuantizeOptions,
    global: Option<f32>,
) -> crate::error::Result<(Scales, Words)> {
    assert!(applies(layout));
    let mut w = Words::filled(layout, 0x5A);
    let Words::U8(bytes) = &mut w else {
        unreachable!("E2M1 two a byte is u8 storage")
    };
    let mut stored = vec![0.0; layout.num_scales];
    let g = crate::pool::install(|| quantize_nvfp4(x, layout, opts, global, bytes, &mut stored))?;
    Ok((Scales::new(stored, Some(g)), w))
}

fn assert_same(x: &[f32], shape: &[usize], bc: usize, opts: &QuantizeOptions, what: &str) {
    assert_same_given(x, shape, bc, opts, None, what);
}

/// [`assert_same`] under the caller's per-tensor scale `global` (None: derived).
fn assert_same_given(
    x: &[f32],
    shape: &[usize],
    bc: usize,
    opts: &QuantizeOptions,
    global: Option<f32>,
    what: &str,
) {
    let layout = Layout::new(&nvfp4(bc), shape).unwrap();
    let (s2, w2) = two_pass(Input::F32(x), &layout, opts, global);
    let (s1, w1) = kernel(Input::F32(x), &layout, opts, global).unwrap();
    let ctx = || format!("{what}: {shape:?}, blocks of {bc}, {opts:?}, g {global:?}");
    let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&s1.stored),
        bits(&s2.stored),
        "block scales: {}",
        ctx()
    );
    assert_eq!(
        s1.global.map(f32::to_bits),
        s2.global.map(f32::to_bits),
        "{}",
        ctx()
    );
    if let Some(i) = (0..w1.len()).find(|&i| w1.get(i) != w2.get(i)) {
        panic!("byte {i}: {:#x} vs {:#x}: {}", w1.get(i), w2.get(i), ctx());
    }
}

/// Block 0 holds 6 · 448 (so g = 1 and block j's scale is its own max / 6, exact); the other
/// blocks hold 6 · 2^j and every E2M1 midpoint and value times 2^j, in both signs: exact ties
/// after the division.
fn ties(blocks: usize, bc: usize) -> Vec<f32> {
    let pattern = [
        0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, -0.0, 0.0,
    ];
    let mut x = Vec::with_capacity(blocks * bc);
    for b in 0..blocks {
        let p = 2f32.powi((b % 9) as i32 - 4);
        for i in 0..bc {
            let v = match (b, i) {
                (0, 0) => 6.0 * 448.0,
                (_, 0) => 6.0 * p,
                _ => pattern[(i + b) % pattern.len()] * p,
            };
            x.push(if (i + b) % 3 == 0 { -v } else { v });
        }
    }
    x
}

/// The default options under each scale rounding NVFP4 takes.
fn scale_roundings() -> [QuantizeOptions; 2] {
    [ScaleRounding::Up, ScaleRounding::Nearest].map(|scale_rounding| QuantizeOptions {
        scale_rounding,
        ..QuantizeOptions::default()
    })
}

/// The kernel against the two-pass path: ties at every midpoint, zero blocks (the zero rule,
/// alone and in a group of eight), subnormal and huge inputs, random data, on block counts
/// that are and are not multiples of 8 and pieces past one row, in every scale rounding.
#[test]
fn nvfp4_kernel_matches_two_pass() {
    if !avx2() {
        return;
    }
    let mut rng = Rng::new(13);
    let all_opts = scale_roundings();
    for bc in [16usize, 32] {
        for shape in [
            vec![3, 8 * bc],
            vec![2, 13 * bc],
            vec![5, bc],
            vec![1, 7 * bc],
            vec![(1 << 14) / bc + 9, bc * 3],
            vec![2, (1 << 14) + 24 * bc],
        ] {
            let n: usize = shape.iter().product();
            let blocks = n / bc;
            for opts in &all_opts {
                assert_same(&ties(blocks, bc), &shape, bc, opts, "ties");
                let r: Vec<f32> = (0..n).map(|_| rng.unit() * 3.0).collect();
                assert_same(&r, &shape, bc, opts, "random");
                let mut z = r.clone();
                // One zero block, then a group of eight with one (and one all zero).
                z[bc..2 * bc].fill(0.0);
                z[..bc].fill(-0.0);
                assert_same(&z, &shape, bc, opts, "zero blocks");
                assert_same(&vec![0.0; n], &shape, bc, opts, "all zero (g = 1)");
                let sub: Vec<f32> = (0..n)
                    .map(|i| (i % 11) as f32 * 1e-44 * rng.unit())
                    .collect();
                assert_same(&sub, &shape, bc, opts, "subnormal");
                let huge: Vec<f32> = (0..n)
                    .map(|i| {
                        rng.pick(&[f32::MAX, -3e38, 1e38, 1.0, 0.0, 1e-40]) * ((i % 5) as f32 / 4.0)
                    })
                    .collect();
                assert_same(&huge, &shape, bc, opts, "huge");
                let mixed: Vec<f32> = (0..n)
                    .map(|i| finite(rng.pick(&EDGES)) * ((i % 3) as f32 - 1.0))
                    .collect();
                assert_same(&mixed, &shape, bc, opts, "edges");
            }
        }
    }
}

/// The caller's per-tensor scale g in place of the derived one: the kernel's block scales and
/// codes against the two-pass path's under the same g. The g's: 0 (every block to 0), a
/// subnormal and a tiny one (block scales saturate at the dtype's largest), ones below and
/// above the derived g (values clamp at ±6, or blocks take small and subnormal scales), the
/// largest f32 (every b × g past f32::MAX where b is not 0).
#[test]
fn nvfp4_kernel_takes_a_given_global_scale() {
    if !avx2() {
        return;
    }
    let mut rng = Rng::new(17);
    let all_opts = scale_roundings();
    for bc in [16usize, 32] {
        for shape in [
            vec![3, 8 * bc],
            vec![2, 13 * bc],
            vec![(1 << 14) / bc + 9, bc * 3],
        ] {
            let n: usize = shape.iter().product();
            let r: Vec<f32> = (0..n).map(|_| rng.unit() * 3.0).collect();
            let mut z = r.clone();
            z[bc..2 * bc].fill(0.0);
            let derived = 3.0 / 6.0 / 448.0;
            for g in [
                0.0,
                1e-44,
                1e-30,
                derived * 0.013,
                derived * 0.37,
                derived,
                derived * 5.5,
                1.0,
                3e30,
                f32::MAX,
            ] {
                for opts in &all_opts {
                    assert_same_given(&r, &shape, bc, opts, Some(g), "random");
                    assert_same_given(&z, &shape, bc, opts, Some(g), "a zero block");
                }
            }
            let t = ties(n / bc, bc);
            assert_same_given(&t, &shape, bc, &all_opts[0], Some(1.0), "ties");
        }
    }
}

/// NaN and ±inf refused with the first one's index, wherever they fall (a full group, a tail
/// block), under a derived g (the storage left as it was: pass 1 finds them) and under given
/// ones (the one-pass kernel, which stops where it finds one).
#[test]
fn nvfp4_kernel_refuses_non_finite_unchanged() {
    if !avx2() {
        return;
    }
    let mut rng = Rng::new(14);
    let shape = [3usize, 16 * 11];
    let n = 3 * 16 * 11;
    let layout = Layout::new(&nvfp4(16), &shape).unwrap();
    for (pos, bad) in [
        (0, f32::NAN),
        (n - 1, f32::INFINITY),
        (16 * 9 + 3, f32::NEG_INFINITY),
        (16 * 11 + 5, -f32::NAN),
    ] {
        let mut x: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
        x[pos] = bad;
        let first = x.iter().position(|v| !v.is_finite()).unwrap();
        for global in [None, Some(0.01), Some(0.0), Some(f32::MAX)] {
            let mut w = Words::filled(&layout, 0x5A);
            let Words::U8(bytes) = &mut w else {
                unreachable!()
            };
            let opts = QuantizeOptions::default();
            let mut stored = vec![0.0; layout.num_scales];
            let got = crate::pool::install(|| {
                quantize_nvfp4(Input::F32(&x), &layout, &opts, global, bytes, &mut stored)
            });
            match got {
                Err(QuantError::NonFinite { index, value, .. }) => {
                    assert_eq!(index, first, "g {global:?}");
                    assert_eq!(value.to_bits(), x[first].to_bits());
                }
                other => panic!("{bad} at {pos}, g {global:?}: {other:?}"),
            }
            if global.is_none() {
                assert!(bytes.iter().all(|&b| b == 0x5A), "storage written on error");
            }
        }
    }
}

fn one_level(bc: usize, dtype: ScaleDtype) -> QuantScheme {
    let store = QuantStore::PackedNative(0);
    crate::quantize::tests::one_level(QuantValue::E2M1, store, bc, dtype)
}

/// Data for the one-level kernel: runs sharing a magnitude (zero blocks for the zero rule,
/// subnormals, values near f32::MAX whose quotients overflow under small scales), E2M1 ties
/// at power-of-two scales, and edge values sprinkled in.
fn one_level_data(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mags = [0.0, 1e-42, 1e-39, 1e-3, 1.0, 300.0, 1e30, 3e38];
    let mut x = Vec::with_capacity(n);
    while x.len() < n {
        let run = (1 + rng.below(70)).min(n - x.len());
        let mag: f32 = rng.pick(&mags);
        for _ in 0..run {
            x.push(match rng.below(12) {
                0 => rng.pick(&EDGES),
                1 | 2 => (rng.below(25) as f32 - 12.0) / 4.0 * mag.max(1e-30),
                _ => rng.unit() * mag,
            });
        }
    }
    x.iter()
        .map(|v| if v.is_finite() { *v } else { 1.0 })
        .collect()
}

/// The one-level E2M1 kernel (MXFP4 and its kin) against `compute_scales` + `encode_values`:
/// blocks of 16 and 32, every scale dtype and its roundings (MX's for UE8M0), rows of whole
/// groups, groups and a short tail, pieces past one row; its pieces called directly (plain
/// and non-temporal stores) and through `quantize` (the dispatch). Bit for bit.
#[test]
fn one_level_kernel_matches_two_pass() {
    if !avx2() {
        return;
    }
    let mut rng = Rng::new(16);
    let mut k = 0;
    for bc in [16usize, 32] {
        let shapes = [
            vec![3, 8 * bc],
            vec![2, 11 * bc],
            vec![bc],
            vec![5, 3 * bc],
            vec![2, (1 << 14) + 8 * bc],
            vec![1 << 15],
        ];
        for shape in shapes {
            let n: usize = shape.iter().product();
            let mut x = one_level_data(&mut rng, n);
            if k % 2 == 0 {
                // Ties at every E2M1 midpoint under power-of-two scales.
                let t = ties(n / bc, bc);
                x[..t.len()].copy_from_slice(&t);
            }
            for dtype in ScaleDtype::ALL {
                for scale_rounding in [ScaleRounding::Up, ScaleRounding::Nearest, ScaleRounding::Mx]
                {
                    if dtype.check_rounding(scale_rounding).is_err() {
                        continue;
                    }
                    k += 1;
                    let opts = QuantizeOptions {
                        scale_rounding,
                        ..QuantizeOptions::default()
                    };
                    let layout = Layout::new(&one_level(bc, dtype), &shape).unwrap();
                    assert!(applies_one_level(&layout, opts.calibration));
                    let ctx = format!("{shape:?}, blocks of {bc}, {dtype}, {opts:?}");
                    let (s2, w2) = two_pass(Input::F32(&x), &layout, &opts, None);
                    let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
                    // Through `quantize`.
                    let mut w1 = Words::filled(&layout, 0x5A);
                    let s1 = crate::quantize::quantize(
                        Input::F32(&x),
                        &layout,
                        &opts,
                        None,
                        w1.as_mut(),
                    )
                    .unwrap();
                    assert_eq!(bits(&s1.stored), bits(&s2.stored), "scales: {ctx}");
                    if let Some(i) = (0..w1.len()).find(|&i| w1.get(i) != w2.get(i)) {
                        panic!("byte {i}: {:#x} vs {:#x}: {ctx}", w1.get(i), w2.get(i));
                    }
                    // The pieces directly, both stores.
                    for stream in [false, true] {
                        let kern = FusedKernel::new(&layout, &opts, stream);
                        let mut bytes = vec![0x5Au8; n / 2];
                        let mut sc = vec![f32::NAN; layout.num_scales];
                        for p in crate::kernels::piece::pieces(&layout).unwrap() {
                            let xs = &x[p.start..p.start + p.len];
                            let o = &mut bytes[p.start / 2..(p.start + p.len) / 2];
                            let s = &mut sc[p.scale0..p.scale0 + p.scales];
                            // SAFETY: the CPU has AVX2 and F16C (checked above).
                            assert!(!unsafe { one_level_piece(&kern, xs, s, o) }, "{ctx}");
                        }
                        assert_eq!(bits(&sc), bits(&s2.stored), "scales, {stream}: {ctx}");
                        if let Some(i) = (0..n / 2).find(|&i| bytes[i] as u32 != w2.get(i)) {
                            panic!(
                                "byte {i}, {stream}: {:#x} vs {:#x}: {ctx}",
                                bytes[i],
                                w2.get(i)
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A non-finite input anywhere (inside a group of eight, in the tail past the last group)
/// is refused by the one-level kernel with the first one named, as by the two-pass path.
#[test]
fn one_level_kernel_names_the_first_non_finite_value() {
    if !avx2() {
        return;
    }
    let mut rng = Rng::new(17);
    for bc in [16usize, 32] {
        let n = 2 * 11 * bc;
        for (pos, bad) in [
            (3, f32::NAN),
            (8 * bc + 1, f32::INFINITY),
            (n - 1, f32::NEG_INFINITY),
            (11 * bc + 9 * bc, -f32::NAN),
        ] {
            let mut x = one_level_data(&mut rng, n);
            x[pos] = bad;
            x[pos + 1..]
                .iter_mut()
                .take(3)
                .for_each(|v| *v = f32::INFINITY);
            let layout = Layout::new(&one_level(bc, ScaleDtype::UE8M0), &[2, 11 * bc]).unwrap();
            let opts = QuantizeOptions {
                scale_rounding: ScaleRounding::Mx,
                ..QuantizeOptions::default()
            };
            let mut w = Words::new(&layout);
            let got = crate::quantize::quantize(Input::F32(&x), &layout, &opts, None, w.as_mut());
            match got {
                Err(QuantError::NonFinite { index, value, .. }) => {
                    assert_eq!((index, value.to_bits()), (pos, bad.to_bits()));
                }
                other => panic!("{bad} at {pos}: {other:?}"),
            }
        }
    }
}

/// Not a test: the kernel's time on 16 Mi values (blocks of 16, one thread), whole and its
/// pass 2 alone on one 64 KiB piece in cache, for A/B runs of two builds
/// (`cargo test --release -p blockquant-core -- --ignored --nocapture time_nvfp4`).
#[test]
#[ignore]
fn time_nvfp4() {
    if !avx2() {
        return;
    }
    crate::pool::set_num_threads(1);
    let n = 1usize << 24;
    let x = crate::quantize::tests::timing_data(n);
    let layout = Layout::new(&nvfp4(16), &[n / 4096, 4096]).unwrap();
    let opts = QuantizeOptions::default();
    let mut bytes = vec![0u8; n / 2];
    let mut stored = vec![0.0; layout.num_scales];
    let k = FusedKernel::new(&layout, &opts, false);
    let piece = 1 << 14;
    let mut amps = vec![0.0f32; piece / 16];
    // SAFETY: the CPU has AVX2 (checked above).
    unsafe { amplitude_piece(&x[..piece], 16, &mut amps) };
    let amps0 = amps.clone();
    let mut best = [f64::MAX; 4];
    let pieces = crate::kernels::piece::pieces(&layout).unwrap();
    for _ in 0..21 {
        let t = std::time::Instant::now();
        crate::pool::install(|| {
            amplitudes(Input::F32(&x), layout.block_cols(), &pieces, &mut stored).unwrap()
        });
        best[3] = best[3].min(t.elapsed().as_secs_f64() * 1e3);
        let t = std::time::Instant::now();
        crate::pool::install(|| {
            quantize_nvfp4(
                Input::F32(&x),
                &layout,
                &opts,
                None,
                &mut bytes,
                &mut stored,
            )
            .unwrap()
        });
        best[0] = best[0].min(t.elapsed().as_secs_f64() * 1e3);
        let t = std::time::Instant::now();
        for _ in 0..n / piece {
            // SAFETY: the CPU has AVX2 (checked above).
            unsafe { amplitude_piece(&x[..piece], 16, &mut amps) };
        }
        best[1] = best[1].min(t.elapsed().as_secs_f64() * 1e3);
        let t = std::time::Instant::now();
        for _ in 0..n / piece {
            amps.copy_from_slice(&amps0);
            // SAFETY: the CPU has AVX2 and F16C (checked above); every value is finite.
            unsafe { encode_piece(&k, 1.0, &x[..piece], &mut amps, &mut bytes[..piece / 2]) };
        }
        best[2] = best[2].min(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "nvfp4 16 Mi: whole {:.2} ms (pass 1 {:.2}); in cache: pass 1 {:.2} ms, pass 2 {:.2} ms",
        best[0], best[3], best[1], best[2]
    );
}

#[path = "nvfp4_group_tests.rs"]
mod group;
