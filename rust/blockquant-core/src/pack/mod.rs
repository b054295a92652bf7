//! Storage (format.md "Stores and packing"): codes written one per byte, or packed into u8/u32 words along an axis,
//! first value in the least significant bits, each line along the axis padded on its own.
//!
//! The kernels walk the tensor in "segments": runs of consecutive elements in one row that share
//! one scale. Parallel tasks own disjoint ranges of the output, so no locking is needed.
//!
//! The files, low to high: `storage` (the storage types and the scales of a range), `fields`
//! (bit packing), `check` (storage taken from a caller), `encode` (codes of a range, the words
//! of the last axis), `decode` (dequantize's runs); this file dispatches a whole tensor's
//! encode into them and the AVX2 word kernel (`kernels::pack2_avx2`).

use rayon::prelude::*;

pub(crate) mod check;
pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod fields;
pub(crate) mod storage;

pub use check::check_storage;
pub use decode::decode_into;
use encode::encode_swapped;
pub use encode::{encode_bytes, encode_range, encode_range_f32, encode_words_last_axis};
pub use fields::pack_last_axis;
pub use storage::{
    words_as_bytes, words_as_bytes_mut, BF16Bits, Effective, F16Bits, OutElem, ScaleSlice,
    Segments, Storage, StorageMut, Word, SCALE_CHUNK,
};

use crate::calibrate::MIN_TASK_ELEMS;
use crate::codec::Encode;
use crate::error::Result;
use crate::input::Window;
use crate::layout::Layout;

/// Quantize all of `x` into `out`; returns whether any input was non-finite (the one error:
/// no memory for the codes of swapped-order storage).
pub fn encode_into<C: Encode>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    effective: &[f32],
    out: StorageMut<'_>,
) -> Result<bool> {
    let p = &layout.packing;
    let sc = ScaleSlice::all(effective);
    if p.swapped {
        return encode_swapped(codec, x, layout, sc, out);
    }
    Ok(match out {
        StorageMut::U8(out) if p.per == 1 => out
            .par_chunks_mut(MIN_TASK_ELEMS)
            .enumerate()
            .map(|(ci, chunk)| encode_bytes(codec, x, layout, sc, ci * MIN_TASK_ELEMS, chunk))
            .reduce(|| false, |a, b| a | b),
        StorageMut::U8(out) => pack_words(codec, x, layout, sc, out),
        StorageMut::U32(out) => pack_words(codec, x, layout, sc, out),
    })
}

fn pack_words<C: Encode, W: Word>(
    codec: C,
    x: Window<'_>,
    layout: &Layout,
    sc: ScaleSlice<'_>,
    out: &mut [W],
) -> bool {
    let words_per_task = (MIN_TASK_ELEMS / layout.packing.per).max(1);
    #[cfg(target_arch = "x86_64")]
    let fill = match crate::kernels::pack2_avx2::applies(layout, &x, &sc) {
        true => crate::kernels::pack2_avx2::encode_words::<C, W>,
        false => encode_words_last_axis::<C, W>,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let fill = encode_words_last_axis::<C, W>;
    out.par_chunks_mut(words_per_task)
        .enumerate()
        .map(|(ci, words)| fill(codec, x, layout, sc, ci * words_per_task, words))
        .reduce(|| false, |a, b| a | b)
}

#[cfg(test)]
pub(crate) mod tests;
