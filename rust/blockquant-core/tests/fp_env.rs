//! A caller's floating-point environment (MXCSR: rounding toward −∞, flush-to-zero,
//! denormals-are-zero) changes nothing a call computes, on the calling thread (small calls)
//! or on the pool's workers (large ones, the pool built under that environment), and is the
//! caller's again after the call. A test binary of its own: the pool must be built here.
#![cfg(target_arch = "x86_64")]

use std::hint::black_box;

use blockquant_core::quantize::{dequantize, quantize};
use blockquant_core::{
    Input, Layout, Output, QuantScheme, QuantStore, QuantValue, QuantizeOptions, ScaleDtype,
    Storage, StorageMut,
};

/// Round to nearest, no flush-to-zero, no denormals-are-zero, exceptions masked.
const DEFAULT: u32 = 0x1F80;
/// Rounding toward −∞ (bits 13-14 = 01), flush-to-zero (bit 15), denormals-are-zero (bit 6).
const HOSTILE: u32 = DEFAULT | 0x2000 | 0x8000 | 0x40;

fn mxcsr() -> u32 {
    let mut v: u32 = 0;
    // SAFETY: stmxcsr stores 4 bytes into `v`.
    unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack, preserves_flags)) };
    v
}

fn set_mxcsr(v: u32) {
    // SAFETY: ldmxcsr reads 4 bytes from `v`; no reserved bit is set.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, preserves_flags)) };
}

/// Values a few ulps from half-integer multiples of `e` (where rounding direction decides a
/// quotient's code), scaled by `mag`, with the largest `alpha` at the front.
fn data(n: usize, e: f32, alpha: f32) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |m: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % m
    };
    let mut x: Vec<f32> = (0..n)
        .map(|_| {
            let h = next(250) as f64 - 125.0 + 0.5;
            let near = (h * e as f64) as f32;
            f32::from_bits((near.to_bits() as i32).wrapping_add(next(5) as i32 - 2) as u32)
        })
        .collect();
    x[0] = alpha;
    x
}

/// Stored scales, code bytes and dequantized values of `x` under `scheme`.
fn run(scheme: &QuantScheme, x: &[f32]) -> (Vec<u32>, Vec<u8>, Vec<u32>) {
    let layout = Layout::new(scheme, &[x.len() / 64, 64]).unwrap();
    let mut w = vec![0u8; layout.packing.num_words()];
    let opts = QuantizeOptions::default();
    let s = quantize(Input::F32(x), &layout, &opts, None, StorageMut::U8(&mut w)).unwrap();
    let mut y = vec![0.0f32; x.len()];
    dequantize(
        &layout,
        Storage::U8(&w),
        &s.stored,
        s.global,
        Output::F32(&mut y),
    )
    .unwrap();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect();
    (bits(&s.stored), w, bits(&y))
}

#[test]
fn a_callers_rounding_and_flush_modes_change_nothing_and_are_put_back() {
    let q8 = QuantScheme::default()
        .with_value(QuantValue::Q8S)
        .with_store(QuantStore::Native);
    let per_tensor = q8.per_tensor(ScaleDtype::F32);
    let block32 = q8.per_block(&[32], ScaleDtype::F16).unwrap();
    // Large calls (handed to the pool, which the first builds from this thread) and small ones
    // (on the calling thread); normal values near half-integer quotients, and subnormal ones
    // (which denormals-are-zero reads as 0).
    let cases = [
        (block32, data(1 << 20, 1e-41, 1.25e-39)),
        (per_tensor, data(1 << 22, 0.03, 3.81)),
        (block32, data(1 << 22, 0.03, 3.81)),
        (per_tensor, data(4096, 0.03, 3.81)),
        (block32, data(4096, 0.03, 3.81)),
        (per_tensor, data(4096, 1e-41, 1.25e-39)),
    ];
    // The hostile environment first: the pool is built under it (its workers inherit it).
    set_mxcsr(HOSTILE);
    let got: Vec<_> = cases.iter().map(|(s, x)| run(s, x)).collect();
    // The pool's workers (built under it, which a thread inherits) run with the default.
    let worker = blockquant_core::pool::install(mxcsr);
    let after = mxcsr();
    // It does change plain arithmetic here: the test can fail.
    let tiny = black_box(1e-40f32) * black_box(1.0f32);
    set_mxcsr(DEFAULT);
    assert_eq!(after & !0x3F, HOSTILE, "the caller's MXCSR is put back");
    assert_eq!(worker & !0x3F, DEFAULT, "a worker's MXCSR");
    assert_eq!(tiny, 0.0, "denormals-are-zero took effect");
    for (i, ((s, x), g)) in cases.iter().zip(&got).enumerate() {
        assert!(*g == run(s, x), "case {i} ({s}, {} values)", x.len());
    }
}
