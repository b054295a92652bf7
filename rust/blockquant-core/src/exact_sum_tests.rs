use super::*;
use crate::simd::max_abs_portable;

/// The chunk fast path against the per-exponent sum of every value: full chunks of normal
/// data (the f64 lanes take nearly all), magnitudes 2^60 apart (many small ones), all
/// subnormal, a ragged tail, zeros; with a NaN or an infinity the f64 lanes are skipped.
#[test]
fn add_chunk_equals_add_all() {
    let mut rng = crate::pack::tests::Rng::new(21);
    let mut cases: Vec<Vec<f32>> = Vec::new();
    cases.push((0..1 << 16).map(|_| rng.unit() * 3.0).collect());
    cases.push(
        (0..1 << 16)
            .map(|i| rng.unit() * if i % 7 == 0 { 1e18 } else { 1.0 })
            .collect(),
    );
    cases.push((0..1001).map(|_| rng.unit() * 1e-39).collect());
    cases.push(
        (0..77)
            .map(|i| (i % 3) as f32 * rng.unit() * 3e38)
            .collect(),
    );
    cases.push(vec![0.0; 20]);
    cases.push(vec![f32::MAX; 1 << 16]);
    let mut with_nan: Vec<f32> = (0..100).map(|_| rng.unit()).collect();
    with_nan[50] = f32::NAN;
    cases.push(with_nan);
    let mut with_inf: Vec<f32> = (0..100).map(|_| rng.unit()).collect();
    with_inf[3] = f32::NEG_INFINITY;
    cases.push(with_inf);
    for xs in cases {
        let (mut a, mut b) = (ExactSum::default(), ExactSum::default());
        a.add_all(&xs);
        b.add_chunk(&xs);
        assert_eq!(
            a.to_f64().to_bits(),
            b.to_f64().to_bits(),
            "{} values",
            xs.len()
        );
    }
}

/// The one-pass sum with a guessed threshold against the per-exponent sum of every value:
/// magnitudes that jump between sub-chunks (a guess too small, redone; too large, many
/// small values), guesses from nothing to the largest, subnormals, a NaN or an infinity
/// in a later sub-chunk, ragged lengths.
#[test]
fn add_chunk_guessing_equals_add_all() {
    let mut rng = crate::pack::tests::Rng::new(23);
    let sub = SUB_CHUNK;
    let mut cases: Vec<Vec<f32>> = Vec::new();
    let scaled = |rng: &mut crate::pack::tests::Rng, n: usize, scale: &dyn Fn(usize) -> f32| {
        (0..n).map(|i| rng.unit() * scale(i)).collect::<Vec<f32>>()
    };
    cases.push(scaled(&mut rng, 1 << 16, &|_| 3.0));
    cases.push(scaled(&mut rng, 1 << 16, &|i| {
        if (i / sub).is_multiple_of(2) {
            1e-3
        } else {
            1e3
        }
    }));
    cases.push(scaled(&mut rng, 1 << 16, &|i| {
        if i / sub == 0 {
            1e30
        } else {
            1e-30
        }
    }));
    cases.push(scaled(&mut rng, 3 * sub + 5, &|i| {
        if i < sub {
            1.0
        } else {
            4.0
        }
    }));
    cases.push(scaled(&mut rng, 2 * sub + 77, &|_| 1e-39));
    cases.push(scaled(&mut rng, 2 * sub, &|i| {
        if i % 5 == 0 {
            1e18
        } else {
            1.0
        }
    }));
    let mut with_nan = scaled(&mut rng, 3 * sub, &|_| 1.0);
    with_nan[2 * sub + 9] = f32::NAN;
    cases.push(with_nan);
    let mut with_inf = scaled(&mut rng, 3 * sub, &|_| 1.0);
    with_inf[sub + 1] = f32::INFINITY;
    cases.push(with_inf);
    // Pruned: half the values zero (each group of eight holds some), and a NaN among
    // zeros only.
    cases.push(scaled(&mut rng, 2 * sub + 40, &|i| {
        if i % 2 == 0 {
            0.0
        } else {
            2.0
        }
    }));
    let mut nan_in_zeros = vec![0.0f32; 2 * sub];
    nan_in_zeros[sub + 3] = f32::NAN;
    cases.push(nan_in_zeros);
    let mut zeros_then = vec![0.0f32; 2 * sub];
    zeros_then.extend(scaled(&mut rng, sub, &|_| 2.0));
    cases.push(zeros_then);
    for xs in &cases {
        for guess in [
            0,
            1,
            1e-30f32.to_bits(),
            1f32.to_bits(),
            1e30f32.to_bits(),
            f32::MAX.to_bits(),
        ] {
            let (mut a, mut b) = (ExactSum::default(), ExactSum::default());
            a.add_all(xs);
            let last = b.add_chunk_guessing(xs, guess);
            assert_eq!(
                a.to_f64().to_bits(),
                b.to_f64().to_bits(),
                "{} values, guess {guess:#x}",
                xs.len()
            );
            let tail = &xs[(xs.len() - 1) / sub * sub..];
            if tail.iter().all(|x| x.is_finite()) {
                assert_eq!(
                    last,
                    max_abs_portable(tail).to_bits(),
                    "{} values",
                    xs.len()
                );
            }
        }
    }
}

/// The AVX2 sum of the big values against the portable loop, small and non-finite values
/// mixed in at every position of a vector, and ragged tails.
#[test]
fn big_sum_matches_portable() {
    let mut rng = crate::pack::tests::Rng::new(24);
    for len in [0, 7, 8, 9, 64, 1000, 1 << 16] {
        let mut xs: Vec<f32> = (0..len).map(|_| rng.unit() * 3.0).collect();
        for (k, v) in [1e-9, f32::NAN, -1e-30, f32::INFINITY, 0.0]
            .into_iter()
            .enumerate()
        {
            if len > k * 3 {
                let i = rng.below(len);
                xs[i] = v;
            }
        }
        let t = 129 - 13;
        let (mut a, mut b) = (ExactSum::default(), ExactSum::default());
        let sa = big_sum(&xs, t, &mut a, &xs);
        let sb = big_sum_portable(&xs, t, &mut b);
        assert_eq!(sa.to_bits(), sb.to_bits(), "len {len}");
        assert_eq!(a.by_exp[..], b.by_exp[..], "len {len}");
    }
}

#[test]
fn exact_sum_beats_naive_f64() {
    // 1e30 + many tiny values: the naive f64 sum loses the tiny ones; fsum does not.
    let mut xs = vec![1e30f32];
    xs.extend(std::iter::repeat_n(1e14f32, 1000));
    let mut e = ExactSum::default();
    e.add_all(&xs);
    let exact = 1e30f32 as f64 + 1000.0 * (1e14f32 as f64);
    assert_eq!(e.to_f64(), exact);
    let mut a = AbsSum::default();
    a.add_all(&xs);
    assert!(!a.is_exact(xs.len()));
}

#[test]
fn exact_sum_rounds_ties_to_even() {
    // 2^53 + 1 is a tie between 2^53 and 2^53 + 2: even → 2^53.
    let mut e = ExactSum::default();
    e.add_all(&[2f32.powi(53), 1.0]);
    assert_eq!(e.to_f64(), 2f64.powi(53));
    let mut e = ExactSum::default();
    e.add_all(&[2f32.powi(53), 1.0, 2f32.powi(-20)]);
    assert_eq!(e.to_f64(), 2f64.powi(53) + 2.0);
    let mut e = ExactSum::default();
    e.add_all(&[f32::from_bits(1), f32::from_bits(1), -0.5]);
    assert_eq!(e.to_f64(), 0.5 + 2.0 * 2f64.powi(-149));
}

#[test]
fn small_range_sums_are_provably_exact() {
    let xs: Vec<f32> = (0..32).map(|i| i as f32 * 0.37 - 5.0).collect();
    let mut a = AbsSum::default();
    a.add_all(&xs);
    assert!(a.is_exact(32));
    let mut e = ExactSum::default();
    e.add_all(&xs);
    assert_eq!(a.sum, e.to_f64());
}
