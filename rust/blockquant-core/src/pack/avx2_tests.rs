//! Every dispatching (AVX2) encode and decode of `pack` against its portable build and the
//! scalar oracles of `tests.rs`.

use super::*;

// ---- AVX2 builds against portable ones ----
//
// `encode_range_f32` and `decode_range` run their body compiled with AVX2 when the CPU has
// it; the `*_portable` twins are the same body compiled for baseline x86-64. On a CPU
// without AVX2 (or off x86-64) both sides run portable code and these tests still pass
// without comparing anything SIMD. Optimized builds (`cargo test --release`) are where the
// loops actually vectorize.

/// A layout of `[rows, n]` with blocks of `bc` along the rows (the kernels' segments).
fn row_blocks(rows: usize, n: usize, bc: usize) -> Layout {
    let s = scheme(QuantValue::Q8S, QuantStore::Native, Some(&[bc]));
    Layout::new(&s, &[rows, n]).unwrap()
}

/// The codec's AVX2 build against its portable one, and both against the scalar oracle of
/// `value` under `rounding` wherever x / e is a number (a NaN input has no code to pin).
fn compare_encode<C: Encode>(codec: C, value: QuantValue, rounding: Rounding, seed: u64) {
    let mut rng = Rng::new(seed);
    for (rows, n, bc) in [(3, 1000, 37), (2, 64, 1), (1, 5000, 64), (7, 33, 32)] {
        let layout = row_blocks(rows, n, bc);
        let eff: Vec<f32> = (0..layout.num_scales)
            .map(|_| sample_scale(&mut rng))
            .collect();
        let len = layout.num_elements;
        let x: Vec<f32> = (0..len)
            .map(|f| sample_value(&mut rng, eff[grid_index(&layout, f)], true))
            .collect();
        // The whole tensor, and a window that starts and ends inside blocks.
        let (s0, s1) = (len / 3 + 1, len - len / 5);
        for (start, end) in [(0, len), (s0, s1)] {
            let xs = &x[start..end];
            let sc = ScaleSlice::all(&eff);
            let mut simd = vec![0xAAu8; end - start];
            let mut port = vec![0x55u8; end - start];
            let bad_simd = encode_range_f32(codec, xs, start, &layout, sc, start, &mut simd);
            let bad_port = encode_range_portable(codec, xs, start, &layout, sc, start, &mut port);
            assert_eq!(
                simd, port,
                "codes, {rows}x{n} block {bc} range {start}..{end}"
            );
            assert_eq!(bad_simd, bad_port);
            assert_eq!(bad_port, xs.iter().any(|v| !v.is_finite()));
            // The non-temporal stores of large final storage, at each offset from a
            // 16-byte boundary (only an aligned run streams).
            #[cfg(target_arch = "x86_64")]
            if crate::simd::has_avx2() {
                for off in 0..4 {
                    let mut buf = vec![0xAAu8; end - start + 32];
                    let at = buf.as_ptr().align_offset(16) + off;
                    let out = &mut buf[at..at + end - start];
                    // SAFETY: the CPU has AVX2, checked just above.
                    let bad = unsafe {
                        let b = encode_range_avx2(codec, xs, start, &layout, sc, start, out, true);
                        std::arch::x86_64::_mm_sfence();
                        b
                    };
                    assert_eq!(&out[..], &port[..], "streamed, offset {off}");
                    assert_eq!(bad, bad_port);
                }
            }
            for (k, (&xv, &c)) in xs.iter().zip(&port).enumerate() {
                let e = eff[grid_index(&layout, start + k)];
                if e == 0.0 || !(xv / e).is_nan() {
                    let want = oracle::quantize_one(value, rounding, xv, e);
                    assert_eq!(c, want, "{value} x {xv:e} e {e:e}");
                }
            }
        }
    }
}

#[test]
fn encode_range_avx2_build_matches_portable() {
    for (k, value) in QuantValue::ALL.into_iter().enumerate() {
        let seed = 100 + k as u64;
        let (qmin, qmax) = value.range();
        // Float values round to nearest even whatever `rounding` says (format.md "Quantizing a value").
        match value {
            QuantValue::E4M3 => compare_encode(FloatCode(E4M3), value, Rounding::HalfEven, seed),
            QuantValue::E5M2 => compare_encode(FloatCode(E5M2), value, Rounding::HalfEven, seed),
            QuantValue::E2M1 => {
                compare_encode(FloatCode(E2M1), value, Rounding::HalfEven, seed);
                compare_encode(E2M1Code, value, Rounding::HalfEven, seed);
            }
            _ => {
                compare_encode(IntHalfAway { qmin, qmax }, value, Rounding::HalfAway, seed);
                compare_encode(IntHalfEven { qmin, qmax }, value, Rounding::HalfEven, seed);
            }
        }
    }
}

/// Output elements compared by bits, any NaN equal to any other (payloads are not pinned).
trait Key: OutElem {
    fn key(self) -> u64;
}
impl Key for f32 {
    fn key(self) -> u64 {
        if self.is_nan() {
            u64::MAX
        } else {
            self.to_bits() as u64
        }
    }
}
impl Key for f64 {
    fn key(self) -> u64 {
        if self.is_nan() {
            u64::MAX
        } else {
            self.to_bits()
        }
    }
}
impl Key for F16Bits {
    fn key(self) -> u64 {
        if half::f16::from_bits(self.0).is_nan() {
            u64::MAX
        } else {
            self.0 as u64
        }
    }
}
impl Key for BF16Bits {
    fn key(self) -> u64 {
        if half::bf16::from_bits(self.0).is_nan() {
            u64::MAX
        } else {
            self.0 as u64
        }
    }
}

/// The ranges the decode tests take of `len` values: all, one from mid-block to mid-block,
/// and one of whole blocks starting mid-row.
fn ranges(layout: &Layout, len: usize) -> [(usize, usize); 3] {
    let bc = layout.block_cols();
    let (a, b) = (len / 3 / bc * bc, (len - len / 5) / bc * bc);
    [(0, len), (len / 3 + 1, len - len / 5), (a, b.max(a))]
}

fn compare_decode_as<D: Decode, O: Key>(dec: D, layout: &Layout, eff: Effective, codes: &[u8]) {
    let len = codes.len();
    for (start, end) in ranges(layout, len) {
        let mut simd = vec![O::default(); end - start];
        let mut port = vec![O::default(); end - start];
        decode_range(dec, layout, eff, start, &codes[start..end], &mut simd);
        decode_range_portable(dec, layout, eff, start, &codes[start..end], &mut port);
        let a: Vec<u64> = simd.into_iter().map(Key::key).collect();
        let b: Vec<u64> = port.into_iter().map(Key::key).collect();
        assert_eq!(a, b, "{} range {start}..{end}", std::any::type_name::<O>());
    }
}

/// The non-temporal stores (taken for large outputs only) against the portable loop, the
/// output at each 4-byte offset from a 16-byte boundary, from the start and mid-range.
fn compare_decode_streaming<D: Decode>(dec: D, layout: &Layout, eff: Effective, codes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2() && crate::simd::has_f16c() {
        for (start, end) in ranges(layout, codes.len()) {
            let mut port = vec![0.0f32; end - start];
            decode_range_portable(dec, layout, eff, start, &codes[start..end], &mut port);
            for off in 0..4 {
                let mut buf = vec![0.0f32; end - start + 8];
                let at = buf.as_ptr().align_offset(16) + off;
                let out = &mut buf[at..at + end - start];
                // SAFETY: the CPU has AVX2 and F16C, checked just above.
                unsafe {
                    let c = &codes[start..end];
                    decode_range_f32_avx2_with::<D, true>(dec, layout, eff, start, c, out);
                    std::arch::x86_64::_mm_sfence();
                }
                let a: Vec<u64> = out.iter().map(|v| v.key()).collect();
                let b: Vec<u64> = port.iter().map(|v| v.key()).collect();
                assert_eq!(a, b, "streamed, range {start}..{end}, offset {off}");
            }
        }
    }
}

fn compare_decode<D: Decode>(dec: D, value: QuantValue, native: bool, seed: u64) {
    let mut rng = Rng::new(seed);
    // Whole blocks of a row (the no-walk path) and ragged ones; blocks spanning rows that
    // tile them (a row at a time) and that do not (the segment walk).
    let q8 = scheme(QuantValue::Q8S, QuantStore::Native, None);
    let spanning = [
        (vec![6, 256], vec![2, 32]),
        (vec![3, 5, 64], vec![2, 2, 16]),
        (vec![256, 384], vec![128, 128]),
        (vec![7, 96], vec![3, 8]),
        (vec![4, 100], vec![2, 37]),
        // Narrower than a vector: a scale spread over each value.
        (vec![9, 70], vec![3, 5]),
        (vec![40, 77], vec![8, 1]),
        (vec![5, 3, 41], vec![2, 3, 1]),
    ]
    .map(|(shape, block)| {
        let s = q8.per_block(&block, ScaleDtype::F32).unwrap();
        Layout::new(&s, &shape).unwrap()
    });
    let rows = [
        (3, 1000, 37),
        (1, 5000, 64),
        (7, 33, 1),
        (5, 256, 32),
        (3, 96, 8),
    ]
    .map(|(rows, n, bc)| row_blocks(rows, n, bc));
    for layout in rows.into_iter().chain(spanning) {
        let eff: Vec<f32> = (0..layout.num_scales)
            .map(|_| sample_scale(&mut rng))
            .collect();
        // Any byte: NaN/inf codes of the float formats and, for Native, high bits set.
        let field_mask = if native {
            0xFF
        } else {
            (1u32 << value.bits()) - 1
        } as u8;
        let codes: Vec<u8> = (0..layout.num_elements)
            .map(|_| rng.byte() & field_mask)
            .collect();
        // One-level, and two-level (g times each block's scale, as the kernels reach it).
        for g in [None, Some(0.3712)] {
            let e = Effective::new(&eff, g);
            compare_decode_as::<D, f32>(dec, &layout, e, &codes);
            compare_decode_as::<D, f64>(dec, &layout, e, &codes);
            compare_decode_as::<D, F16Bits>(dec, &layout, e, &codes);
            compare_decode_as::<D, BF16Bits>(dec, &layout, e, &codes);
            compare_decode_streaming(dec, &layout, e, &codes);
        }
        // And the f32 result against format.md "Dequantizing", for the fields that are codes.
        let mut y = vec![0.0f32; codes.len()];
        decode_range(dec, &layout, Effective::new(&eff, None), 0, &codes, &mut y);
        for (f, (&c, &yv)) in codes.iter().zip(&y).enumerate() {
            let field_bits = if native { 8 } else { value.bits() };
            if let Some(v) = oracle::stored_value(value, field_bits, c as u32) {
                let want = v as f32 * eff[grid_index(&layout, f)];
                assert_eq!(yv.key(), want.key(), "{value} code {c:#x}");
            }
        }
    }
}

/// 4-bit fields decoded straight from the words (`decode_nibbles_f32`) against a scalar
/// reading of the nibbles, for each 4-bit decoder (int, E2M1, codebook), u8 and u32 words,
/// blocks of 8 to 32, one and many tasks, and an output large enough to stream, aligned and
/// not (which falls back to the code buffer).
#[test]
fn nibbles_decode_straight_from_the_words() {
    use crate::codec::{E2M1Decode, IntDecode};
    use crate::lookup::{decode_table, Codebook, LookupDecode, NAMED};
    let mut rng = Rng::new(77);
    let nf4 = Codebook::new(&NAMED[0].1).unwrap();
    let table = decode_table(&nf4);
    // `global`: a two-level scheme's g, multiplied into each block's scale as the kernel
    // reaches it (the big values' products capped at f32::MAX).
    fn check<D: Decode>(
        dec: D,
        layout: &Layout,
        rng: &mut Rng,
        offset: usize,
        global: Option<f32>,
    ) {
        let n = layout.num_elements;
        let bytes: Vec<u8> = (0..n / 2).map(|_| rng.byte()).collect();
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let stored: Vec<f32> = (0..layout.num_scales)
            .map(|k| match k % 7 {
                0 => 0.0,
                1 => 1e-40,
                2 => 3e38,
                _ => rng.unit() * 3.0,
            })
            .collect();
        let e = |k: usize| match global {
            None => stored[k],
            Some(g) => (stored[k] * g).min(f32::MAX), // format.md: e = b × g, capped
        };
        let want: Vec<u32> = (0..n)
            .map(|i| {
                let field = (bytes[i / 2] >> (4 * (i % 2))) & 0xF;
                (dec.decode(field) * e(grid_index(layout, i))).to_bits()
            })
            .collect();
        let mut buf = vec![f32::NAN; n + 4];
        let storage = if layout.packing.word_bits == 8 {
            Storage::U8(&bytes)
        } else {
            Storage::U32(&words)
        };
        let out = &mut buf[offset..offset + n];
        decode_into(dec, layout, storage, Effective::new(&stored, global), out).unwrap();
        let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(
            first, None,
            "{} on {:?}, offset {offset}, g {global:?}",
            layout.scheme, layout.shape
        );
    }
    for (value, store) in [
        // (burn's PackedNative keeps 4-bit ints one a byte: not nibbles.)
        (QuantValue::Q4S, QuantStore::PackedU32(0)),
        (QuantValue::E2M1, QuantStore::PackedNative(0)),
        (QuantValue::E2M1, QuantStore::PackedU32(0)),
        (QuantValue::Q4F, QuantStore::PackedU32(0)),
    ] {
        // 1-D blocks, and blocks spanning rows (the grid row found a row at a time).
        for (shape, block) in [
            (vec![3, 64], vec![16]),
            (vec![7, 48], vec![24]),
            (vec![5, 40], vec![8]),
            (vec![96], vec![32]),
            (vec![2, 1 << 17], vec![32]),
            (vec![1 << 10, 1 << 12], vec![16]),
            (vec![7, 3, 64], vec![2, 2, 16]),
            (vec![384, 512], vec![128, 128]),
        ] {
            let plain = scheme(value, store, Some(&block));
            let layout = Layout::new(&plain, &shape).unwrap();
            assert_eq!(
                layout.packing.field_bits as usize * layout.packing.per,
                layout.packing.word_bits as usize
            );
            // One-level, and two-level with a g of no power of two (and one that takes 3e38
            // past f32::MAX). An output large enough to stream (4 Mi values) also goes to
            // an `out` one value off a 16-byte boundary; there the three g are spread over
            // the two offsets (the slowest test in debug builds otherwise).
            let big = shape.iter().product::<usize>() >= 1 << 22;
            let cases: &[(usize, Option<f32>)] = if big {
                &[(0, None), (1, Some(0.3712)), (1, Some(7.0))]
            } else {
                &[(0, None), (0, Some(0.3712)), (0, Some(7.0))]
            };
            for &(off, g) in cases {
                match value {
                    QuantValue::E2M1 => check(E2M1Decode, &layout, &mut rng, off, g),
                    _ => {
                        let dec = IntDecode::new(&layout.packing);
                        check(dec, &layout, &mut rng, off, g)
                    }
                }
            }
            if value == QuantValue::Q4F {
                let looked = Layout::new(&plain.with_codebook(nf4), &shape).unwrap();
                check(LookupDecode(&table), &looked, &mut rng, 0, None);
                check(LookupDecode(&table), &looked, &mut rng, 0, Some(0.3712));
            }
        }
    }
}

#[test]
fn decode_range_avx2_build_matches_portable() {
    for (k, value) in QuantValue::ALL.into_iter().enumerate() {
        for (j, store) in [QuantStore::Native, QuantStore::PackedU32(0)]
            .into_iter()
            .enumerate()
        {
            let seed = 200 + 2 * k as u64 + j as u64;
            let layout = Layout::new(&scheme(value, store, None), &[4, 4]).unwrap();
            let native = store == QuantStore::Native;
            match crate::codec::minifloat(value) {
                Some(fmt) => {
                    let table = float_table(&fmt);
                    compare_decode(TableDecode(&table), value, native, seed);
                    if value == QuantValue::E2M1 {
                        compare_decode(crate::codec::E2M1Decode, value, native, seed);
                    } else {
                        let dec = crate::codec::Fp8Decode { table: &table, fmt };
                        compare_decode(dec, value, native, seed);
                        if value == QuantValue::E4M3 {
                            let dec = crate::codec::E4M3Decode(&table);
                            compare_decode(dec, value, native, seed);
                        }
                    }
                }
                None => compare_decode(IntDecode::new(&layout.packing), value, native, seed),
            }
        }
    }
}
