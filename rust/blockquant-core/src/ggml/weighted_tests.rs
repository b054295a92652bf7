//! [`quantize_weighted`]: importance weights steer every searched type toward the columns that
//! matter, never leave a block worse by the weighted measure than the plain quantizer, and are
//! refused when malformed.

use super::*;
use crate::pack::tests::Rng;

const SEARCHED: [GgmlType; 12] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::NVFP4,
];

/// Rows of sums of uniforms (near Gaussian), a few large values among them.
fn matrix(rng: &mut Rng, rows: usize, row_len: usize) -> Vec<f32> {
    (0..rows * row_len)
        .map(|_| {
            let v: f32 = (0..4).map(|_| rng.unit()).sum();
            if rng.below(64) == 0 {
                v * 6.0
            } else {
                v
            }
        })
        .collect()
}

fn plain(ty: GgmlType, x: &[f32], row_len: usize) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / ty.block_size() * ty.type_size()];
    quantize(ty, Input::F32(x), row_len, &mut out).unwrap();
    out
}

fn weighted(ty: GgmlType, x: &[f32], row_len: usize, w: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / ty.block_size() * ty.type_size()];
    quantize_weighted(ty, Input::F32(x), row_len, w, &mut out).unwrap();
    out
}

/// Σ w·(x − x̂)² over the whole tensor, the weights repeated on every row.
fn weighted_error(ty: GgmlType, x: &[f32], bytes: &[u8], w: &[f32]) -> f64 {
    let mut y = vec![0f32; x.len()];
    dequantize(ty, bytes, &mut y);
    x.iter()
        .zip(&y)
        .enumerate()
        .map(|(i, (&a, &b))| w[i % w.len()] as f64 * (a as f64 - b as f64).powi(2))
        .sum()
}

#[test]
fn weights_lower_the_weighted_error_of_every_searched_type() {
    let mut rng = Rng::new(7);
    let (rows, row_len) = (16, 512);
    let x = matrix(&mut rng, rows, row_len);
    // One column in eight matters 100 times more, as a few activation channels do.
    let w: Vec<f32> = (0..row_len)
        .map(|j| if j % 8 == 3 { 100.0 } else { 1.0 })
        .collect();
    for ty in SEARCHED {
        assert!(takes_weights(ty));
        let (p, q) = (plain(ty, &x, row_len), weighted(ty, &x, row_len, &w));
        let (ep, eq) = (
            weighted_error(ty, &x, &p, &w),
            weighted_error(ty, &x, &q, &w),
        );
        assert!(eq < 0.9 * ep, "{ty}: weighted {eq} against plain {ep}");
    }
}

#[test]
fn no_block_is_worse_by_the_weighted_measure() {
    // Block by block (one block a row), under random weights, zeros among them.
    let mut rng = Rng::new(11);
    for ty in SEARCHED {
        let row_len = ty.block_size();
        for _ in 0..40 {
            let x = matrix(&mut rng, 1, row_len);
            let w: Vec<f32> = (0..row_len)
                .map(|_| match rng.below(4) {
                    0 => 0.0,
                    1 => rng.unit().abs() * 1e4,
                    _ => rng.unit().abs(),
                })
                .collect();
            let (p, q) = (plain(ty, &x, row_len), weighted(ty, &x, row_len, &w));
            let (ep, eq) = (
                weighted_error(ty, &x, &p, &w),
                weighted_error(ty, &x, &q, &w),
            );
            assert!(eq <= ep, "{ty}: {eq} > {ep}");
        }
    }
}

#[test]
fn zero_weights_keep_the_plain_bytes_and_unit_weights_the_plain_error() {
    // All-zero weights (no measure at all) keep the plain bytes; under unit weights (the plain
    // measure) the weighted searches, wider than the plain ones, never leave more error.
    let mut rng = Rng::new(3);
    let row_len = 512;
    let x = matrix(&mut rng, 8, row_len);
    let ones = vec![1.0; row_len];
    for ty in SEARCHED {
        let zero = weighted(ty, &x, row_len, &vec![0.0; row_len]);
        assert_eq!(zero, plain(ty, &x, row_len), "{ty} zero weights");
        let (p, q) = (plain(ty, &x, row_len), weighted(ty, &x, row_len, &ones));
        let (ep, eq) = (
            weighted_error(ty, &x, &p, &ones),
            weighted_error(ty, &x, &q, &ones),
        );
        assert!(eq <= ep, "{ty}: {eq} > {ep}");
    }
}

#[test]
fn expert_rows_take_their_own_weights() {
    // Two experts of 4 rows each: the stacked call equals each expert quantized alone.
    let mut rng = Rng::new(5);
    let row_len = 256;
    let x = matrix(&mut rng, 8, row_len);
    let w: Vec<f32> = (0..2 * row_len).map(|_| rng.unit().abs() * 10.0).collect();
    for ty in [GgmlType::Q4_K, GgmlType::Q4_0, GgmlType::IQ4_XS] {
        let both = weighted(ty, &x, row_len, &w);
        let half = x.len() / 2;
        let mut each = weighted(ty, &x[..half], row_len, &w[..row_len]);
        each.extend(weighted(ty, &x[half..], row_len, &w[row_len..]));
        assert_eq!(both, each, "{ty}");
    }
}

#[test]
fn types_without_a_search_ignore_the_weights() {
    let mut rng = Rng::new(9);
    let row_len = 256;
    let x = matrix(&mut rng, 2, row_len);
    let w: Vec<f32> = (0..row_len).map(|_| rng.unit().abs()).collect();
    for ty in [
        GgmlType::Q8_0,
        GgmlType::MXFP4,
        GgmlType::TQ2_0,
        GgmlType::F16,
    ] {
        assert!(!takes_weights(ty));
        assert_eq!(
            weighted(ty, &x, row_len, &w),
            plain(ty, &x, row_len),
            "{ty}"
        );
    }
}

#[test]
fn malformed_weights_and_values_are_errors() {
    let row_len = 64;
    let x = vec![0.5f32; 4 * row_len];
    let mut out = vec![0u8; 4 * row_len / 32 * 18];
    let mut call = |w: &[f32], x: &[f32]| {
        quantize_weighted(GgmlType::Q4_0, Input::F32(x), row_len, w, &mut out)
            .unwrap_err()
            .to_string()
    };
    // Not rows of row_len; three rows do not split four evenly.
    assert!(call(&[1.0; 63], &x).contains("rows of 64"));
    assert!(call(&[1.0; 192], &x).contains("even split of its 4 rows"));
    assert!(call(&[], &x).contains("rows of 64"));
    let mut w = vec![1.0f32; 64];
    w[5] = -1.0;
    assert!(call(&w, &x).contains("flat index 5"));
    w[5] = f32::NAN;
    assert!(call(&w, &x).contains("finite"));
    let mut bad = x.clone();
    bad[70] = f32::INFINITY;
    assert!(call(&[1.0; 64], &bad).contains("index 70"));
}
