use super::*;
use crate::scheme::{QuantScheme, QuantStore, ScaleDtype};

/// The AVX2 max against the portable one: lengths around the 32-value step, NaNs (passed
/// over), infinities, −0, subnormals.
#[test]
fn max_abs_matches_portable() {
    let mut rng = crate::pack::tests::Rng::new(22);
    for len in [0, 1, 7, 8, 31, 32, 33, 100, 4096, 70001] {
        for special in [
            None,
            Some(f32::NAN),
            Some(f32::INFINITY),
            Some(-0.0),
            Some(-1e-42),
        ] {
            let mut xs: Vec<f32> = (0..len).map(|_| rng.unit() * 1e-3).collect();
            if let (Some(v), true) = (special, len > 0) {
                let i = rng.below(len);
                xs[i] = v;
            }
            let (a, b) = (max_abs(&xs), max_abs_portable(&xs));
            assert_eq!(a.to_bits(), b.to_bits(), "len {len} {special:?}");
        }
    }
}

/// Block maxima eight blocks at a time against the block-by-block loop: block widths that
/// are and are not multiples of 8, a partial last block, group counts around 8, NaNs
/// (passed over), infinities, −0, and earlier maxima in `out` (rows of a 2-D block).
#[test]
fn max_abs_blocks_matches_portable() {
    let mut rng = crate::pack::tests::Rng::new(23);
    for bc in [8, 16, 24, 32, 12] {
        for blocks in [1, 7, 8, 9, 16, 17, 40] {
            for cut in [0, 1, bc - 1] {
                let len = blocks * bc - cut;
                let mut xs: Vec<f32> = (0..len).map(|_| rng.unit() * 4.0).collect();
                for v in [f32::NAN, f32::INFINITY, -0.0, -1e-42] {
                    let i = rng.below(len);
                    xs[i] = v;
                }
                let init: Vec<f32> = (0..blocks).map(|_| rng.unit().abs() * 3.0).collect();
                let (mut a, mut b) = (init.clone(), init);
                max_abs_blocks(&xs, bc, &mut a);
                max_abs_blocks_portable(&xs, bc, &mut b);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "bc {bc} blocks {blocks} cut {cut}");
            }
        }
    }
}

#[test]
fn block_amplitudes_over_a_2d_block_with_partial_edges() {
    let scheme = QuantScheme::default()
        .with_store(QuantStore::Native)
        .per_block(&[2, 3], ScaleDtype::F32)
        .unwrap();
    let layout = Layout::new(&scheme, &[3, 4]).unwrap();
    let x: Vec<f32> = (0..12).map(|i| -(i as f32)).collect();
    // Blocks: rows {0,1} × cols {0,1,2}, rows {0,1} × col {3}, row {2} × ..., row {2} × col 3.
    assert_eq!(
        amplitudes(Input::F32(&x), &layout, Calibration::MinMax).unwrap(),
        [6.0, 7.0, 10.0, 11.0]
    );
    let means = amplitudes(Input::F32(&x), &layout, Calibration::AbsMean).unwrap();
    assert_eq!(means, [3.0, 5.0, 9.0, 11.0]);
}
