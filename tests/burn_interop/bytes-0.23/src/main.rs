//! Prints, one JSON line per probe, the bytes burn 0.23.0-pre.1's `TensorData::quantized` (its
//! `QuantizedBytes`) writes for given codes, shape, scheme and scales: the layouts blockquant's
//! `to_bytes()` has to match (format.md "The byte layout", "burn is the arbiter of bytes"), in particular packing
//! along an outer axis and `PackedNative` of sub-byte integers, which burn 0.22.1 cannot read.
//!
//! ```text
//! cargo run > ../samples/quantized_bytes_0.23.jsonl
//! ```
use burn_core::tensor::quantization::{QuantScheme, QuantStore, QuantValue, ScaleDtype};
use burn_core::tensor::{DType, TensorData};

fn show(
    name: &str,
    codes: Vec<i8>,
    shape: Vec<usize>,
    scheme: QuantScheme,
    scales: &[f32],
    global: Option<f32>,
) {
    let mut dtype = Vec::new();
    ciborium::into_writer(&DType::QFloat(scheme), &mut dtype).expect("a scheme serializes");
    let dtype: String = dtype.iter().map(|b| format!("{b:02x}")).collect();
    let data = TensorData::quantized(codes.clone(), shape.clone(), scheme, scales, global);
    let hex: Vec<String> = data.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    println!(
        "{{\"name\": \"{name}\", \"shape\": {shape:?}, \"codes\": {codes:?}, \"scales\": {scales:?}, \"global\": {}, \"dtype_cbor\": \"{dtype}\", \"hex\": \"{}\"}}",
        global.map_or("null".to_string(), |g| g.to_string()),
        hex.join("")
    );
}

fn main() {
    let s = |v, st| QuantScheme::default().with_value(v).with_store(st);
    use QuantStore::*;
    use QuantValue::*;
    show(
        "q4s_pn0",
        vec![1, -1, 2, 3, -7, 7],
        vec![2, 3],
        s(Q4S, PackedNative(0)),
        &[1.0],
        None,
    );
    show(
        "q2s_pn0",
        vec![1, -1, 0, 1, -1, 1],
        vec![2, 3],
        s(Q2S, PackedNative(0)),
        &[1.0],
        None,
    );
    show(
        "q4f_pn0_block",
        vec![-8, 7, -1, 0, 1, 2, 3, 4],
        vec![2, 4],
        s(Q4F, PackedNative(0)).per_block([2], ScaleDtype::F16),
        &[1.0, 2.0, 0.5, 4.0],
        None,
    );
    show(
        "q8s_pn1",
        vec![1, -1, 2, 3, -7, 7],
        vec![2, 3],
        s(Q8S, PackedNative(1)),
        &[1.0],
        None,
    );
    show(
        "q4s_pn1",
        vec![1, -1, 2, 3, -7, 7],
        vec![3, 2],
        s(Q4S, PackedNative(1)),
        &[1.0],
        None,
    );
    show(
        "e2m1_pn0",
        vec![1, 9, 2, 15, 7, 0],
        vec![2, 3],
        s(E2M1, PackedNative(0)),
        &[1.0],
        None,
    );
    show(
        "e2m1_pn1",
        vec![1, 9, 2, 15, 7, 0, 3, 4, 5, 6, 10, 11],
        vec![3, 4],
        s(E2M1, PackedNative(1)),
        &[1.0],
        None,
    );
    show(
        "q8s_u32_1_ragged",
        (0..15).collect(),
        vec![3, 5],
        s(Q8S, PackedU32(1)),
        &[1.0],
        None,
    );
    show(
        "q4s_u32_1",
        (0..18).map(|i| (i % 15 - 7) as i8).collect(),
        vec![9, 2],
        s(Q4S, PackedU32(1)),
        &[1.0],
        None,
    );
    show(
        "q8s_u32_2_rank3",
        (0..24).collect(),
        vec![4, 2, 3],
        s(Q8S, PackedU32(2)),
        &[1.0],
        None,
    );
    show(
        "q8s_u32_1_block_order",
        (0..16).collect(),
        vec![4, 4],
        s(Q8S, PackedU32(1)).per_block([2, 1], ScaleDtype::F32),
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        None,
    );
    show(
        "q4s_u32_1_two_level",
        (0..24).map(|i| (i % 15 - 7) as i8).collect(),
        vec![3, 8],
        s(Q4S, PackedU32(1))
            .per_block([2, 4], ScaleDtype::UE4M3)
            .per_tensor(ScaleDtype::F32),
        &[1.0, 2.0, 0.5, 4.0],
        Some(3.0),
    );
    show(
        "q2s_u32_0_ragged",
        vec![1, -1, 0, 1, -1],
        vec![1, 5],
        s(Q2S, PackedU32(0)),
        &[1.0],
        None,
    );
    show(
        "q8s_u32_1_rank3_block",
        (0..24).collect(),
        vec![2, 4, 3],
        s(Q8S, PackedU32(1)).per_block([1, 2, 2], ScaleDtype::F16),
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        None,
    );
    // Layouts blockquant already shares with burn.
    show(
        "q4s_native",
        vec![1, -1, 2, 3, -7, 7],
        vec![2, 3],
        s(Q4S, Native),
        &[1.0],
        None,
    );
    show(
        "q8s_pn0",
        vec![1, -1, 2, 3, -7, 7],
        vec![2, 3],
        s(Q8S, PackedNative(0)),
        &[1.0],
        None,
    );
    show(
        "e4m3_u32_0_ragged",
        vec![1, 2, 3, 0x7e, -2, 0x40],
        vec![2, 3],
        s(E4M3, PackedU32(0)),
        &[1.0],
        None,
    );
    show(
        "q4s_u32_0_scalar",
        vec![-3],
        vec![],
        s(Q4S, PackedU32(0)),
        &[0.5],
        None,
    );
    show(
        "q8f_two_level_spec",
        vec![0, 25, 51, 76, 102, 127, -128, -1],
        vec![8],
        s(Q8F, Native)
            .per_block([4], ScaleDtype::UE4M3)
            .per_tensor(ScaleDtype::F32),
        &[0.5, 0.125],
        Some(3.0),
    );
    show(
        "e5m2_native_ue8m0",
        vec![0x3c, -0x3c, 0x7b, 1],
        vec![4],
        s(E5M2, Native).per_block([2], ScaleDtype::UE8M0),
        &[0.25, 8.0],
        None,
    );
    show(
        "q4s_u32_0_block2d_partial",
        (0..24).map(|i| (i % 15 - 7) as i8).collect(),
        vec![3, 8],
        s(Q4S, PackedU32(0)).per_block([2, 3], ScaleDtype::BF16),
        &[1.0, 2.0, 3.0, 0.5, 0.25, 4.0],
        None,
    );
}
