//! Throughput of the quantize and dequantize kernels on f32 input, in the crate's own thread
//! pool as the binding runs them: `cargo bench -p blockquant-core --bench kernels`.
//!
//! Throughput is counted in f32 bytes (read by quantize, written by dequantize), so the numbers
//! compare directly with memory bandwidth. The large size (16 Mi values, 64 MiB) is past every
//! cache; the small one (64 Ki values) fits in L2 and shows the per-call overhead.

use std::hint::black_box;
use std::time::Duration;

use blockquant_core::pool;
use blockquant_core::quantize::{dequantize, quantize};
use blockquant_core::{
    Input, Layout, Output, QuantScheme, QuantStore, QuantValue, QuantizeOptions, ScaleDtype,
    ScaleRounding, Storage, StorageMut,
};
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};

/// (rows, cols): 16 Mi and 64 Ki values.
const SIZES: [(usize, usize); 2] = [(4096, 4096), (256, 256)];

struct Case {
    name: &'static str,
    scheme: QuantScheme,
    opts: QuantizeOptions,
}

fn cases() -> Vec<Case> {
    let base = |value: QuantValue, store: QuantStore| {
        QuantScheme::default().with_value(value).with_store(store)
    };
    let block = |value, store, size: usize, dtype| {
        base(value, store)
            .per_block(&[size], dtype)
            .expect("a valid block")
    };
    let up = QuantizeOptions::default();
    // MX scales are powers of two; `Up` costs the same per block as the OCP rule.
    let nearest = QuantizeOptions {
        scale_rounding: ScaleRounding::Nearest,
        ..up
    };
    vec![
        Case {
            name: "q8s_per_tensor",
            scheme: base(QuantValue::Q8S, QuantStore::Native),
            opts: up,
        },
        Case {
            name: "q8s_block32_f16",
            scheme: block(QuantValue::Q8S, QuantStore::Native, 32, ScaleDtype::F16),
            opts: up,
        },
        Case {
            name: "q4s_block32_f16_packed_u32",
            scheme: block(
                QuantValue::Q4S,
                QuantStore::PackedU32(0),
                32,
                ScaleDtype::F16,
            ),
            opts: up,
        },
        Case {
            name: "nvfp4",
            scheme: block(
                QuantValue::E2M1,
                QuantStore::PackedNative(0),
                16,
                ScaleDtype::UE4M3,
            )
            .per_tensor(ScaleDtype::F32),
            opts: nearest,
        },
        Case {
            name: "mxfp8",
            scheme: block(QuantValue::E4M3, QuantStore::Native, 32, ScaleDtype::UE8M0),
            opts: up,
        },
        Case {
            name: "mxfp4",
            scheme: block(
                QuantValue::E2M1,
                QuantStore::PackedNative(0),
                32,
                ScaleDtype::UE8M0,
            ),
            opts: up,
        },
    ]
}

/// Roughly normal values (sum of four uniforms) from a fixed seed, with a few outliers per
/// block as real weights have.
fn data(n: usize) -> Vec<f32> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut uniform = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    (0..n)
        .map(|i| {
            let v = uniform() + uniform() + uniform() + uniform();
            if i % 97 == 0 {
                v * 8.0
            } else {
                v
            }
        })
        .collect()
}

enum Words {
    U8(Vec<u8>),
    U32(Vec<u32>),
}

impl Words {
    fn new(layout: &Layout) -> Self {
        let n = layout.packing.num_words();
        match layout.packing.word_bits {
            8 => Self::U8(vec![0; n]),
            _ => Self::U32(vec![0; n]),
        }
    }
    fn as_mut(&mut self) -> StorageMut<'_> {
        match self {
            Self::U8(w) => StorageMut::U8(w),
            Self::U32(w) => StorageMut::U32(w),
        }
    }
    fn as_ref(&self) -> Storage<'_> {
        match self {
            Self::U8(w) => Storage::U8(w),
            Self::U32(w) => Storage::U32(w),
        }
    }
}

fn configure<'a>(c: &'a mut Criterion, name: &str, n: usize) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Bytes((n * 4) as u64));
    if n >= 1 << 20 {
        // Tens of milliseconds a call: fewer, longer samples keep a run to minutes.
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(4));
    }
    group
}

fn bench_quantize(c: &mut Criterion) {
    for (rows, cols) in SIZES {
        let n = rows * cols;
        let x = data(n);
        let mut group = configure(c, &format!("quantize/{n}"), n);
        for case in cases() {
            let layout = Layout::new(&case.scheme, &[rows, cols]).expect("a valid layout");
            let mut out = Words::new(&layout);
            group.bench_function(BenchmarkId::from_parameter(case.name), |b| {
                b.iter(|| {
                    pool::install(|| {
                        quantize(
                            Input::F32(black_box(&x)),
                            &layout,
                            &case.opts,
                            None,
                            out.as_mut(),
                        )
                    })
                    .expect("finite input")
                })
            });
        }
        group.finish();
    }
}

fn bench_dequantize(c: &mut Criterion) {
    for (rows, cols) in SIZES {
        let n = rows * cols;
        let x = data(n);
        let mut y = vec![0.0f32; n];
        let mut group = configure(c, &format!("dequantize/{n}"), n);
        for case in cases() {
            let layout = Layout::new(&case.scheme, &[rows, cols]).expect("a valid layout");
            let mut q = Words::new(&layout);
            let scales = quantize(Input::F32(&x), &layout, &case.opts, None, q.as_mut())
                .expect("finite input");
            group.bench_function(BenchmarkId::from_parameter(case.name), |b| {
                b.iter(|| {
                    pool::install(|| {
                        dequantize(
                            &layout,
                            black_box(q.as_ref()),
                            &scales.stored,
                            scales.global,
                            Output::F32(&mut y),
                        )
                    })
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_quantize, bench_dequantize);
criterion_main!(benches);
