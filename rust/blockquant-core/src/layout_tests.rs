use super::*;
use crate::scheme::{QuantValue, ScaleDtype};

fn scheme(store: QuantStore, block: Option<&[usize]>) -> QuantScheme {
    let s = QuantScheme::default()
        .with_value(QuantValue::Q4S)
        .with_store(store);
    match block {
        Some(b) => s.per_block(b, ScaleDtype::F16).unwrap(),
        None => s,
    }
}

#[test]
fn partial_edge_blocks_and_grid() {
    let l = Layout::new(&scheme(QuantStore::Native, Some(&[2, 4])), &[5, 3, 9]).unwrap();
    assert_eq!(l.block, [1, 2, 4]);
    assert_eq!(l.grid, [5, 2, 3]);
    assert_eq!(l.num_scales, 30);
    // Block (0, 1, 2): rows 2..3 (1 of 2), cols 8..9 (1 of 4).
    assert_eq!(l.block_count(5), 1);
    assert_eq!(l.block_count(0), 8);
    assert_eq!(l.grid_row_offset(0), 0);
    assert_eq!(l.grid_row_offset(1), 0);
    assert_eq!(l.grid_row_offset(2), 3);
    assert_eq!(l.grid_row_offset(3), 6);
}

#[test]
fn a_q4_3x3_tensor_takes_3_words() {
    let l = Layout::new(&scheme(QuantStore::PackedU32(0), None), &[3, 3]).unwrap();
    assert_eq!(l.storage_shape(), [3, 1]);
    assert_eq!(l.storage_bytes(), 12);
    // burn: PackedNative keeps Q4 one a byte; an outer packed axis is swapped innermost.
    let l = Layout::new(&scheme(QuantStore::PackedNative(1), None), &[3, 3]).unwrap();
    assert_eq!(l.storage_shape(), [3, 3]);
    let l = Layout::new(&scheme(QuantStore::PackedU32(1), None), &[5, 3, 2]).unwrap();
    assert!(l.packing.swapped);
    assert_eq!(l.storage_shape(), [5, 2, 1]);
    let l = Layout::new(&scheme(QuantStore::PackedU32(2), None), &[4, 2, 3]).unwrap();
    assert_eq!(l.storage_shape(), [3, 2, 1]);
}

/// burn's own example: `[4, 8]`, PackedU32(1), block `[2, 4]`: the row-major grid
/// `[[1, 2], [3, 4]]` is stored `1, 3, 2, 4`.
#[test]
fn block_scales_follow_the_values_packed_along_an_outer_axis() {
    let s = scheme(QuantStore::PackedU32(1), Some(&[2, 4]));
    let l = Layout::new(&s, &[4, 8]).unwrap();
    assert_eq!(l.scale_byte_order().unwrap(), Some(vec![0, 2, 1, 3]));
    let l = Layout::new(&scheme(QuantStore::PackedU32(0), Some(&[2, 4])), &[4, 8]).unwrap();
    assert_eq!(l.scale_byte_order().unwrap(), None);
}

/// The order on 3-d and 4-d grids, every outer packing axis, against the definition: the
/// swapped grid read row-major, each multi-index's axis a and last swapped back.
#[test]
fn scale_order_is_the_swapped_grid_read_row_major() {
    for (shape, block) in [
        (vec![6, 4, 10], vec![2, 1, 4]),
        (vec![3, 5, 7, 9], vec![1, 2, 3, 4]),
        (vec![5, 1, 8], vec![2, 1, 3]),
    ] {
        for dim in 1..shape.len() {
            let s = scheme(QuantStore::PackedU32(dim), Some(&block));
            let l = Layout::new(&s, &shape).unwrap();
            let (rank, a) = (l.rank(), l.packing.axis);
            let mut swapped = l.grid.clone();
            swapped.swap(a, rank - 1);
            let mut want = Vec::new();
            for flat in 0..l.num_scales {
                let (mut rem, mut nat) = (flat, vec![0; rank]);
                for j in (0..rank).rev() {
                    nat[j] = rem % swapped[j];
                    rem /= swapped[j];
                }
                nat.swap(a, rank - 1);
                want.push(nat.iter().zip(&l.grid).fold(0, |acc, (&i, &g)| acc * g + i));
            }
            assert_eq!(
                l.scale_byte_order().unwrap(),
                Some(want),
                "{shape:?} {block:?} dim {dim}"
            );
        }
    }
}

/// Storage line `l` element `k` of `[4, 2, 3]` packed along axis 0 is burn's swapped
/// `[3, 2, 4]` read row-major: line (c, b), element k is natural (k, b, c).
#[test]
fn swapped_lines_read_the_packed_axis() {
    let l = Layout::new(&scheme(QuantStore::PackedU32(2), None), &[4, 2, 3]).unwrap();
    for c in 0..3 {
        for b in 0..2 {
            for k in 0..4 {
                assert_eq!(l.line_element(c * 2 + b, k), k * 6 + b * 3 + c);
            }
        }
    }
}

#[test]
fn tensor_dependent_rules() {
    let too_deep = Layout::new(&scheme(QuantStore::Native, Some(&[2, 4])), &[8]);
    assert!(matches!(too_deep, Err(QuantError::Scheme(_))));
    let bad_dim = Layout::new(&scheme(QuantStore::PackedU32(2), None), &[4, 4]);
    assert!(matches!(bad_dim, Err(QuantError::Scheme(_))));
    let huge = Layout::new(&scheme(QuantStore::Native, None), &[usize::MAX / 2, 3]);
    assert!(matches!(huge, Err(QuantError::Layout(_))));
    let empty_but_huge = Layout::new(&scheme(QuantStore::Native, None), &[0, 1 << 40, 1 << 40]);
    assert!(matches!(empty_but_huge, Err(QuantError::Layout(_))));
}

#[test]
fn zero_d_is_one_element() {
    let l = Layout::new(&scheme(QuantStore::PackedU32(0), Some(&[32])), &[]).unwrap();
    assert_eq!(l.dims, [1]);
    assert_eq!(l.grid, [1]);
    assert_eq!(l.storage_shape(), [1]);
    let empty = Layout::new(&scheme(QuantStore::Native, Some(&[32])), &[0, 5]).unwrap();
    assert_eq!(empty.num_scales, 0);
    assert_eq!(empty.num_rows(), 0);
}
