//! Dequantize (format.md "Dequantizing"): x̂ = f32(decode(q)) × e, the value decoder picked by
//! the scheme, written into the caller's output of its element type.

use crate::codec::{float_table, minifloat, E2M1Decode, E4M3Decode, Fp8Decode, IntDecode};
use crate::error::Result;
use crate::layout::Layout;
use crate::lookup::decode_table;
use crate::pack::storage::{BF16Bits, Effective, F16Bits, OutElem, Storage};
use crate::pool;
use crate::scheme::QuantValue;

/// Where dequantize writes: x̂ as f32, or converted from that f32 (format.md "Dequantizing").
#[derive(Debug)]
pub enum Output<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    F16(&'a mut [F16Bits]),
    BF16(&'a mut [BF16Bits]),
}

/// x̂ = f32(decode(q)) × e into `out` (C order), converted to the output's type element by
/// element (no full-size f32 temporary). `stored`: the stored scales (checked by
/// `check_stored` (in `scales.rs`)), or effective ones already worked out; `global`: a two-level scheme's g,
/// multiplied in block by block ([`Effective`]). Runs in the bounded pool. The one error: no
/// memory for the codes of swapped-order storage.
pub fn dequantize(
    layout: &Layout,
    storage: Storage<'_>,
    stored: &[f32],
    global: Option<f32>,
    out: Output<'_>,
) -> Result<()> {
    let effective = Effective::new(stored, global);
    let (layout, storage) = storage.bytewise(layout);
    let layout = &*layout;
    pool::install_sized(layout.num_elements, || match out {
        Output::F32(o) => dequantize_into(layout, storage, effective, o),
        Output::F64(o) => dequantize_into(layout, storage, effective, o),
        Output::F16(o) => dequantize_into(layout, storage, effective, o),
        Output::BF16(o) => dequantize_into(layout, storage, effective, o),
    })
}

fn dequantize_into<O: OutElem>(
    layout: &Layout,
    storage: Storage<'_>,
    effective: Effective<'_>,
    out: &mut [O],
) -> Result<()> {
    assert_eq!(out.len(), layout.num_elements, "output length");
    assert_eq!(effective.len(), layout.num_scales, "scale count");
    if let Some(cb) = &layout.scheme.codebook {
        let table = decode_table(cb);
        let dec = crate::lookup::LookupDecode(&table);
        return crate::pack::decode_into(dec, layout, storage, effective, out);
    }
    match minifloat(layout.scheme.value) {
        Some(_) if layout.scheme.value == QuantValue::E2M1 => {
            crate::pack::decode_into(E2M1Decode, layout, storage, effective, out)
        }
        Some(fmt) if layout.scheme.value == QuantValue::E4M3 => {
            let table = float_table(&fmt);
            crate::pack::decode_into(E4M3Decode(&table), layout, storage, effective, out)
        }
        Some(fmt) => {
            let table = float_table(&fmt);
            let dec = Fp8Decode { table: &table, fmt };
            crate::pack::decode_into(dec, layout, storage, effective, out)
        }
        None => {
            let dec = IntDecode::new(&layout.packing);
            crate::pack::decode_into(dec, layout, storage, effective, out)
        }
    }
}
