//! The one-pass kernel for blocks that span rows: blocks `[.., br, bc]` over the last two axes
//! (the `[128, 128]` tiles of DeepSeek-style FP8 weights), codes one a byte, max |x|
//! calibration.
//!
//! The general path reads such a tensor from memory twice: every tile's max |x| first (a pass
//! over the whole tensor), then the codes. Here a band of `br` rows is taken a group of tile
//! columns at a time (about 1 MiB of input): the group's maxima, its scales, then its codes while
//! the group is still in cache. Same maxima (a max does not depend on order), same scale
//! rounding and the same division per value as the general path, so the same bits (tested
//! against it). Bands are independent tasks of the bounded pool.

#![cfg(target_arch = "x86_64")]

use rayon::prelude::*;

use crate::calibrate::Calibration;
use crate::codec::Encode;
use crate::input::Input;
use crate::layout::Layout;
use crate::quantize::{FusedKernel, QuantizeOptions};
use crate::simd::x86;

/// Input bytes of one group of tiles: well inside this core's share of the last-level cache, so
/// the encode re-reads from cache what the maxima just read from memory.
const GROUP_BYTES: usize = 1 << 20;

/// Whether `layout` is this kernel's case: blocks over rows (`br` > 1) only on the last two
/// axes, one code a byte in C order (no packing, no mask), and the CPU has AVX2.
pub(crate) fn fits(layout: &Layout, opts: &QuantizeOptions) -> bool {
    let rank = layout.rank();
    rank >= 2
        && !layout.per_tensor
        && !layout.scheme.is_two_level()
        && layout.block[..rank - 2].iter().all(|&b| b == 1)
        && layout.block[rank - 2] > 1
        // Codes in C order: packing (of one value a word) along the last axis, not burn's
        // swapped order.
        && layout.packing.axis + 1 == rank
        && !layout.packing.swapped
        && layout.packing.per == 1
        && !layout.packing.masks_bytes()
        && layout.num_elements > 0
        && opts.calibration == Calibration::MinMax
        && crate::simd::has_avx2()
}

/// Codes into `out` (one a byte, C order) and every stored scale into `stored`; returns whether
/// any input was non-finite. `layout` must [`fits`].
pub(crate) fn quantize_tiles<C: Encode>(
    codec: C,
    x: Input<'_>,
    k: &FusedKernel<'_>,
    out: &mut [u8],
    stored: &mut [f32],
) -> bool {
    let layout = k.layout;
    let rank = layout.rank();
    let (m, n) = (layout.dims[rank - 2], layout.row_len());
    let (br, gm, gc) = (
        layout.block[rank - 2],
        layout.grid[rank - 2],
        layout.grid_cols(),
    );
    assert!(out.len() == layout.num_elements && stored.len() == layout.num_scales);
    // Band t is grid row t: rows from (t / gm)·m + (t % gm)·br, the last band of each matrix
    // possibly short; its scales are grid entries t·gc.., its codes the rows' elements.
    let mut work = Vec::with_capacity(stored.len() / gc);
    let (mut sc_rest, mut out_rest) = (stored, out);
    let mut row0 = 0;
    for t in 0..sc_rest.len() / gc {
        let rows = br.min(m - (t % gm) * br);
        let (sc, sr) = std::mem::take(&mut sc_rest).split_at_mut(gc);
        let (o, or) = std::mem::take(&mut out_rest).split_at_mut(rows * n);
        (sc_rest, out_rest) = (sr, or);
        work.push((row0, rows, sc, o));
        row0 += rows;
    }
    work.into_par_iter()
        .map_init(Vec::new, |buf, (row0, rows, sc, o)| {
            // SAFETY: `fits` checked the CPU for AVX2.
            let bad = unsafe { band(codec, x, k, row0, rows, sc, o, buf) };
            if k.stream {
                // SAFETY: SSE is part of x86-64. The non-temporal stores are weakly ordered:
                // done before the task says it is done.
                unsafe { std::arch::x86_64::_mm_sfence() };
            }
            bad
        })
        .reduce(|| false, |a, b| a | b)
}

/// One band: `rows` rows from `row0`, their scales `sc` (one a tile column) and codes `out`.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn band<C: Encode>(
    codec: C,
    x: Input<'_>,
    k: &FusedKernel<'_>,
    row0: usize,
    rows: usize,
    sc: &mut [f32],
    out: &mut [u8],
    buf: &mut Vec<f32>,
) -> bool {
    let n = k.layout.row_len();
    let bc = k.layout.block_cols();
    let per_group = (GROUP_BYTES / (4 * rows * bc)).max(1);
    let mut bad = false;
    for j0 in (0..sc.len()).step_by(per_group) {
        let j1 = (j0 + per_group).min(sc.len());
        let (c0, c1) = (j0 * bc, (j1 * bc).min(n));
        let alpha = &mut sc[j0..j1];
        alpha.fill(0.0);
        for r in 0..rows {
            let xs = x.read((row0 + r) * n + c0, c1 - c0, buf);
            for (a, run) in alpha.iter_mut().zip(xs.chunks(bc)) {
                // NaNs pass over, as in the general path's maxima; the encode reports them.
                let m = x86::max_abs(run);
                *a = if m > *a { m } else { *a };
            }
        }
        for a in alpha.iter_mut() {
            *a = k.scale(*a);
        }
        for r in 0..rows {
            let xs = x.read((row0 + r) * n + c0, c1 - c0, buf);
            let o = &mut out[r * n + c0..r * n + c1];
            for ((run, o), &e) in xs.chunks(bc).zip(o.chunks_mut(bc)).zip(&sc[j0..j1]) {
                bad |= x86::encode_run_or_zero(codec, run, e, o, k.stream);
            }
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use crate::pack::tests::{Rng, Words};
    use crate::quantize::tests::{tensor, two_pass, Inputs};
    use crate::quantize::{quantize, QuantizeOptions};
    use crate::scale::ScaleRounding;
    use crate::{Calibration, Input, Layout, QuantScheme, QuantStore, QuantValue, Rounding};
    use crate::{QuantError, ScaleDtype};

    /// Every value type, one a byte or packed (those take the general path), every scale dtype, f32/f16/bf16/f64 input, bands cut short
    /// at each matrix's end and tile columns at each row's end: the banded kernel (through
    /// `quantize`) gives the general two-pass path's scales and codes, bit for bit.
    #[test]
    fn tiles_match_the_two_pass_path() {
        if !crate::simd::has_avx2() {
            return;
        }
        let mut rng = Rng::new(41);
        let cases: [(&[usize], &[usize]); 5] = [
            (&[37, 50], &[8, 16]),
            (&[3, 20, 33], &[7, 8]),
            (&[2, 9, 40], &[1, 9, 40]),
            (&[64, 24], &[64, 5]),
            (&[5, 3], &[2, 1]),
        ];
        let (mut k, mut covered) = (0, 0);
        for (shape, block) in cases {
            let x = Inputs::new(tensor(&mut rng, shape.iter().product()));
            let stores = [
                QuantStore::Native,
                QuantStore::PackedNative(1), // burn's swapped order: not this kernel's case
                QuantStore::PackedNative(0),
                QuantStore::PackedU32(0),
            ];
            for (value, store) in QuantValue::ALL
                .into_iter()
                .flat_map(|v| stores.map(|s| (v, s)))
            {
                for dtype in ScaleDtype::ALL {
                    let scheme = QuantScheme::default()
                        .with_value(value)
                        .with_store(store)
                        .per_block(block, dtype)
                        .unwrap();
                    let Ok(layout) = Layout::new(&scheme, shape) else {
                        continue; // packed along an axis the shape does not divide, say
                    };
                    covered += super::fits(&layout, &QuantizeOptions::default()) as usize;
                    for rounding in [Rounding::HalfAway, Rounding::HalfEven] {
                        for scale_rounding in
                            [ScaleRounding::Up, ScaleRounding::Nearest, ScaleRounding::Mx]
                        {
                            let opts = QuantizeOptions {
                                calibration: Calibration::MinMax,
                                rounding,
                                scale_rounding,
                            };
                            k += 1;
                            check(x.get(k), &layout, &opts);
                        }
                    }
                }
            }
        }
        assert!(covered > 100, "{covered} layouts took the banded kernel");
    }

    /// Groups of tile columns (more input in a band than one group holds), and a non-finite
    /// value: the same error as the general path, naming the same first index.
    #[test]
    fn tiles_in_groups_and_non_finite_input() {
        if !crate::simd::has_avx2() {
            return;
        }
        let mut rng = Rng::new(42);
        let shape = [40, 3000];
        let mut x = tensor(&mut rng, 40 * 3000);
        let scheme = QuantScheme::default()
            .with_store(QuantStore::Native)
            .per_block(&[32, 128], ScaleDtype::F16)
            .unwrap();
        let layout = Layout::new(&scheme, &shape).unwrap();
        assert!(super::fits(&layout, &QuantizeOptions::default()));
        check(Input::F32(&x), &layout, &QuantizeOptions::default());
        x[39 * 3000 + 2999] = f32::NAN;
        x[35 * 3000 + 2500] = f32::INFINITY;
        let mut w = Words::new(&layout);
        let err = quantize(
            Input::F32(&x),
            &layout,
            &Default::default(),
            None,
            w.as_mut(),
        );
        match err {
            Err(QuantError::NonFinite { index, .. }) => assert_eq!(index, 35 * 3000 + 2500),
            other => panic!("{other:?}"),
        }
    }

    fn check(x: Input<'_>, layout: &Layout, opts: &QuantizeOptions) {
        let ctx = || format!("{} on {:?}, {opts:?}", layout.scheme, layout.shape);
        let Ok(want) = crate::quantize::compute_scales(x, layout, opts, None) else {
            // Refused (a rounding this scale dtype does not take): refused alike.
            let mut w = Words::new(layout);
            assert!(
                quantize(x, layout, opts, None, w.as_mut()).is_err(),
                "{}",
                ctx()
            );
            return;
        };
        let (s2, w2) = two_pass(x, layout, opts);
        assert_eq!(want.stored, s2.stored);
        let mut w1 = Words::filled(layout, 0x5A5A_5A5A);
        let s1 = quantize(x, layout, opts, None, w1.as_mut()).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&s1.stored), bits(&s2.stored), "{}", ctx());
        assert!(w1 == w2, "{}", ctx());
    }
}
