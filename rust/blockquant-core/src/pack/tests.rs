//! Packing against a bit-at-a-time oracle, the kernels against scalar oracles, and every
//! dispatching (AVX2) kernel against its portable build. The oracles also serve the tests
//! of `quantize/tests.rs`.

use super::check::*;
use super::decode::*;
use super::encode::*;
use super::fields::*;
use super::storage::*;
use super::*;
use crate::codec::Decode;
use crate::codec::{
    float_table, E2M1Code, FloatCode, IntDecode, IntHalfAway, IntHalfEven, TableDecode,
};
use crate::error::QuantError;
use crate::input::Input;
use crate::minifloat::{E2M1, E4M3, E5M2};
use crate::quantize::encode::encode_values;
use crate::quantize::{dequantize, Output};
use crate::scheme::{QuantScheme, QuantStore, QuantValue, ScaleDtype};
use crate::Rounding;

/// SplitMix64: seeded, so a failing case replays.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub(crate) fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u32 << 23) as f32 - 1.0
    }
    pub(crate) fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// The values and codes of format.md "The scheme", from its tables alone (not from `scheme`/`minifloat`).
pub(crate) mod oracle {
    use crate::scheme::QuantValue;
    use crate::Rounding;

    /// bits, qmin, qmax, and for a float value (mantissa bits, exponent bias).
    pub(crate) fn spec(value: QuantValue) -> (u32, f64, f64, Option<(u32, i32)>) {
        match value {
            QuantValue::Q8F => (8, -128.0, 127.0, None),
            QuantValue::Q8S => (8, -127.0, 127.0, None),
            QuantValue::Q4F => (4, -8.0, 7.0, None),
            QuantValue::Q4S => (4, -7.0, 7.0, None),
            QuantValue::Q2F => (2, -2.0, 1.0, None),
            QuantValue::Q2S => (2, -1.0, 1.0, None),
            QuantValue::E4M3 => (8, -448.0, 448.0, Some((3, 7))),
            QuantValue::E5M2 => (8, -57344.0, 57344.0, Some((2, 15))),
            QuantValue::E2M1 => (4, -6.0, 6.0, Some((1, 1))),
            QuantValue::U8 => (8, 0.0, 255.0, None),
            QuantValue::U4 => (4, 0.0, 15.0, None),
            QuantValue::U2 => (2, 0.0, 3.0, None),
        }
    }

    /// Value of a float code's magnitude bits by the textbook formula; `None` for NaN/inf.
    pub(crate) fn float_magnitude(value: QuantValue, mag: u32) -> Option<f64> {
        let (_, _, qmax, fmt) = spec(value);
        let (mb, bias) = fmt.expect("a float value");
        let (e, m) = (mag >> mb, mag & ((1 << mb) - 1));
        let v = if e == 0 {
            m as f64 * 2f64.powi(1 - bias - mb as i32)
        } else {
            (1.0 + m as f64 / (1u32 << mb) as f64) * 2f64.powi(e as i32 - bias)
        };
        // Codes past the largest finite value are NaN or infinity (E4M3FN, E5M2).
        (v <= qmax).then_some(v)
    }

    /// The value a stored field (the low `bits` of a code) stands for; `None` if no value.
    pub(crate) fn field_value(value: QuantValue, field: u32) -> Option<f64> {
        let (bits, qmin, qmax, fmt) = spec(value);
        match fmt {
            None => {
                let v = (((field << (32 - bits)) as i32) >> (32 - bits)) as f64;
                (v >= qmin && v <= qmax).then_some(v)
            }
            Some(_) => {
                let sign = if field >> (bits - 1) & 1 == 1 {
                    -1.0
                } else {
                    1.0
                };
                float_magnitude(value, field & ((1 << (bits - 1)) - 1)).map(|m| sign * m)
            }
        }
    }

    /// The value of a field of `field_bits` as storage holds it (format.md "Stores and packing"): 8-bit fields of a
    /// sub-byte int are int8 bytes, of a sub-byte float the code in the low bits, high bits 0.
    pub(crate) fn stored_value(value: QuantValue, field_bits: u32, f: u32) -> Option<f64> {
        let (bits, qmin, qmax, fmt) = spec(value);
        match fmt {
            Some(_) if f >> bits != 0 => None,
            Some(_) => field_value(value, f),
            None => {
                let shift = 32 - field_bits;
                let v = (((f << shift) as i32) >> shift) as f64;
                (v >= qmin && v <= qmax).then_some(v)
            }
        }
    }

    /// The code of `xs = x / e` as the kernels write it one per byte: ints as int8 bytes,
    /// floats as their bit pattern (E2M1 in the low nibble). `xs` must not be NaN.
    pub(crate) fn encode(value: QuantValue, rounding: Rounding, xs: f32) -> u8 {
        assert!(!xs.is_nan());
        let (bits, qmin, qmax, fmt) = spec(value);
        if fmt.is_none() {
            let r = match rounding {
                Rounding::HalfAway => xs.round(),
                Rounding::HalfEven => xs.round_ties_even(),
            };
            return (r as f64).clamp(qmin, qmax) as i8 as u8;
        }
        let a = xs.abs() as f64;
        let sign = ((xs.to_bits() >> 31) as u8) << (bits - 1);
        let mags = magnitudes(value);
        let top = mags.len() - 1;
        if a >= mags[top] {
            return sign | top as u8;
        }
        let lo = mags.iter().rposition(|&v| v <= a).unwrap();
        let mid = (mags[lo] + mags[lo + 1]) / 2.0; // exact in f64
        let code = if a < mid || (a == mid && lo % 2 == 0) {
            lo
        } else {
            lo + 1
        };
        sign | code as u8
    }

    /// A float value's finite magnitudes in code order (codes are monotone in value).
    fn magnitudes(value: QuantValue) -> &'static [f64] {
        use std::sync::OnceLock;
        static TABLES: [OnceLock<Vec<f64>>; 3] = [const { OnceLock::new() }; 3];
        let (bits, _, _, _) = spec(value);
        let k = match value {
            QuantValue::E4M3 => 0,
            QuantValue::E5M2 => 1,
            _ => 2,
        };
        TABLES[k].get_or_init(|| {
            (0..1u32 << (bits - 1))
                .map_while(|m| float_magnitude(value, m))
                .collect()
        })
    }

    /// format.md "Storing a scale: rounding to its dtype"'s zero rule and "Quantizing a value": the code of `x` against scale `e`.
    pub(crate) fn quantize_one(value: QuantValue, rounding: Rounding, x: f32, e: f32) -> u8 {
        if e == 0.0 {
            0
        } else {
            encode(value, rounding, x / e)
        }
    }

    /// format.md "Dequantizing": f32(decode(field)) × e.
    pub(crate) fn dequantize_one(value: QuantValue, field: u32, e: f32) -> f32 {
        field_value(value, field).expect("a valid field") as f32 * e
    }
}

/// Value storage of a layout, either word type.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Words {
    U8(Vec<u8>),
    U32(Vec<u32>),
}

impl Words {
    /// Zeroed storage for `layout`.
    pub(crate) fn new(layout: &Layout) -> Self {
        Self::filled(layout, 0)
    }
    pub(crate) fn filled(layout: &Layout, v: u32) -> Self {
        let n = layout.packing.num_words();
        match layout.packing.word_bits {
            8 => Self::U8(vec![v as u8; n]),
            _ => Self::U32(vec![v; n]),
        }
    }
    pub(crate) fn as_mut(&mut self) -> StorageMut<'_> {
        match self {
            Self::U8(w) => StorageMut::U8(w),
            Self::U32(w) => StorageMut::U32(w),
        }
    }
    pub(crate) fn as_ref(&self) -> Storage<'_> {
        match self {
            Self::U8(w) => Storage::U8(w),
            Self::U32(w) => Storage::U32(w),
        }
    }
    pub(crate) fn get(&self, i: usize) -> u32 {
        match self {
            Self::U8(w) => w[i] as u32,
            Self::U32(w) => w[i],
        }
    }
    pub(crate) fn set(&mut self, i: usize, v: u32) {
        match self {
            Self::U8(w) => w[i] = v as u8,
            Self::U32(w) => w[i] = v,
        }
    }
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::U8(w) => w.len(),
            Self::U32(w) => w.len(),
        }
    }
}

/// Index into the scale grid of element `flat` (C order), from the block shape alone.
pub(crate) fn grid_index(layout: &Layout, flat: usize) -> usize {
    if layout.per_tensor {
        return 0;
    }
    let (dims, block) = (&layout.dims, &layout.block);
    let (mut rem, mut g, mut stride) = (flat, 0, 1);
    for ax in (0..dims.len()).rev() {
        g += (rem % dims[ax] / block[ax]) * stride;
        stride *= dims[ax].div_ceil(block[ax]);
        rem /= dims[ax];
    }
    g
}

/// f32 values that sit on the kernels' edges: signed zeros, subnormals, the largest
/// values, exact ties of the int roundings and of the float formats.
pub(crate) const EDGES: [f32; 26] = [
    0.0,
    -0.0,
    1e-45,
    -1e-45,
    1.1754942e-38,
    1e-40,
    -1e-40,
    f32::MAX,
    f32::MIN,
    1e38,
    -3e38,
    0.5,
    -0.5,
    1.5,
    -2.5,
    127.5,
    -127.5,
    0.25,
    0.75,
    5.0,
    -5.0,
    6.0,
    464.0,
    -432.0,
    61440.0,
    57344.0,
];

/// A scale as the kernels may meet it: zero (zero rule), subnormal, a power of two (so
/// that ties stay exact), ordinary, huge.
pub(crate) fn sample_scale(rng: &mut Rng) -> f32 {
    match rng.below(8) {
        0 => 0.0,
        1 => f32::from_bits(1 + rng.below(1 << 20) as u32),
        2 | 3 => 2f32.powi(rng.below(40) as i32 - 20),
        4 => 3e38,
        _ => 10f32.powf(rng.unit() * 4.0) * 0.01,
    }
}

/// An input value for an element whose scale is `e`: often an exact multiple or midpoint
/// of a code's value times `e`, sometimes an edge, otherwise a random magnitude.
pub(crate) fn sample_value(rng: &mut Rng, e: f32, with_non_finite: bool) -> f32 {
    match rng.below(10) {
        0 if with_non_finite => rng.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]),
        0 | 1 => rng.pick(&EDGES),
        2 | 3 => {
            // k/2 for k in -260..260: integer ties, and E2M1/E4M3 midpoints at small scales.
            let k = rng.below(520) as f32 - 260.0;
            let v = (k / 2.0) * if e == 0.0 { 1.0 } else { e };
            if v.is_finite() {
                v
            } else {
                0.0
            }
        }
        _ => {
            let v = rng.unit() * 10f32.powf(rng.unit() * 3.0) * if e == 0.0 { 1.0 } else { e };
            if v.is_finite() {
                v
            } else {
                1.0
            }
        }
    }
}

// ---- whole-tensor encode/decode: outer axis against the transposed last axis ----

fn scheme(value: QuantValue, store: QuantStore, block: Option<&[usize]>) -> QuantScheme {
    let s = QuantScheme::default().with_value(value).with_store(store);
    match block {
        Some(b) => s.per_block(b, ScaleDtype::F32).unwrap(),
        None => s,
    }
}

/// Words of a tensor of shape `[a, n, i]` packed along its middle axis, as `(a, wi, i)`,
/// built one code at a time.
fn outer_words_oracle(
    codes: &[u8],
    (a, n, inner): (usize, usize, usize),
    per: usize,
    field_bits: u32,
) -> Vec<u32> {
    let nw = n.div_ceil(per);
    let mask = (1u64 << field_bits) as u32 - 1;
    let mut words = vec![0u32; a * nw * inner];
    for o in 0..a {
        for j in 0..n {
            for i in 0..inner {
                let q = codes[(o * n + j) * inner + i] as u32 & mask;
                words[(o * nw + j / per) * inner + i] |= q << ((j % per) as u32 * field_bits);
            }
        }
    }
    words
}

fn transpose_last_two<T: Copy + Default>(x: &[T], (a, n, inner): (usize, usize, usize)) -> Vec<T> {
    let mut t = vec![T::default(); x.len()];
    for o in 0..a {
        for j in 0..n {
            for i in 0..inner {
                t[(o * inner + i) * n + j] = x[(o * n + j) * inner + i];
            }
        }
    }
    t
}

/// Packing along an outer axis is burn's layout: the tensor with the packed axis swapped to
/// the last place, packed along it — so for `[a, n, i]` packed along `n` the storage is, word
/// for word in the same order, the `[a, i, n]` transpose packed along its last axis (with the
/// block and the scale grid transposed alike); both equal the scalar oracle, and both decode
/// to the oracle's values.
#[test]
fn outer_axis_packing_is_the_transposed_last_axis_packing() {
    let mut rng = Rng::new(5);
    // (a, n, i): ragged packed axis, a 1-wide inner axis (packed "along an outer axis"
    // that is last in memory), an inner run longer than the kernels' buffer, and one with
    // enough words to split into several parallel tasks for every per-word count.
    let shapes = [
        (2, 13, 5),
        (1, 3, 7),
        (4, 9, 1),
        (1, 5, BUF + 300),
        (3, 37, 1000),
    ];
    let blocks: [&[usize]; 3] = [&[4, 3], &[1, 64], &[5, 1]];
    for (si, &(a, n, inner)) in shapes.iter().enumerate() {
        let len = a * n * inner;
        for value in QuantValue::ALL {
            for (ki, packed) in [QuantStore::PackedU32, QuantStore::PackedNative]
                .into_iter()
                .enumerate()
            {
                if len > 20_000 && !(value as usize + ki).is_multiple_of(3) {
                    continue; // the big shape on a third of the cases keeps debug tests fast
                }
                let block = blocks[(si + value as usize) % blocks.len()];
                let tblock = [block[1], block[0]];
                let rounding = if ki == 0 {
                    Rounding::HalfAway
                } else {
                    Rounding::HalfEven
                };
                let lo =
                    Layout::new(&scheme(value, packed(1), Some(block)), &[a, n, inner]).unwrap();
                let lt =
                    Layout::new(&scheme(value, packed(0), Some(&tblock)), &[a, inner, n]).unwrap();
                assert_eq!(lo.packing.n_axis, n);
                let eff: Vec<f32> = (0..lo.num_scales).map(|_| sample_scale(&mut rng)).collect();
                // The transposed grid [a, gi, gn] holds the same scales.
                let (gn, gi) = (lo.grid[1], lo.grid[2]);
                let mut eff_t = vec![0.0; eff.len()];
                for o in 0..a {
                    for p in 0..gn {
                        for q in 0..gi {
                            eff_t[(o * gi + q) * gn + p] = eff[(o * gn + p) * gi + q];
                        }
                    }
                }
                let e: Vec<f32> = (0..len).map(|f| eff[grid_index(&lo, f)]).collect();
                let x: Vec<f32> = e
                    .iter()
                    .map(|&e| sample_value(&mut rng, e, false))
                    .collect();
                let codes: Vec<u8> = x
                    .iter()
                    .zip(&e)
                    .map(|(&x, &e)| oracle::quantize_one(value, rounding, x, e))
                    .collect();
                let xt = transpose_last_two(&x, (a, n, inner));

                let mut wo = Words::filled(&lo, 0xFFFF_FFFF);
                encode_values(Input::F32(&x), &lo, &eff, rounding, wo.as_mut()).unwrap();
                let mut wt = Words::filled(&lt, 0xFFFF_FFFF);
                encode_values(Input::F32(&xt), &lt, &eff_t, rounding, wt.as_mut()).unwrap();

                let p = &lo.packing;
                let want = outer_words_oracle(&codes, (a, n, inner), p.per, p.field_bits);
                let nw = p.words_axis;
                assert_eq!(wo.len(), want.len());
                for (w, &expect) in want.iter().enumerate() {
                    let (o, wi, i) = (w / (nw * inner), w / inner % nw, w % inner);
                    let ctx = || {
                        format!(
                            "{} [{a},{n},{inner}] word (o {o}, wi {wi}, i {i})",
                            lo.scheme
                        )
                    };
                    let stored = (o * inner + i) * nw + wi; // burn's swapped order
                    assert_eq!(wo.get(stored), expect, "outer axis: {}", ctx());
                    assert_eq!(
                        wt.get((o * inner + i) * nw + wi),
                        expect,
                        "last axis: {}",
                        ctx()
                    );
                }

                let mut yo = vec![0.0f32; len];
                dequantize(&lo, wo.as_ref(), &eff, None, Output::F32(&mut yo)).unwrap();
                let mut yt = vec![0.0f32; len];
                dequantize(&lt, wt.as_ref(), &eff_t, None, Output::F32(&mut yt)).unwrap();
                let yt = transpose_last_two(&yt, (a, inner, n));
                let mask = (1u32 << value.bits()) - 1;
                for f in 0..len {
                    let want = oracle::dequantize_one(value, codes[f] as u32 & mask, e[f]);
                    assert_eq!(
                        yo[f].to_bits(),
                        want.to_bits(),
                        "{} decode outer {f}",
                        lo.scheme
                    );
                    assert_eq!(
                        yt[f].to_bits(),
                        want.to_bits(),
                        "{} decode last {f}",
                        lo.scheme
                    );
                }
            }
        }
    }
}

// ---- check_storage ----

/// Every field value in every slot of every word, one at a time on otherwise zero storage:
/// accepted exactly when it is a code of the value (a used slot) or zero (padding).
#[test]
fn check_storage_rejects_bad_codes_and_padding() {
    let stores = [
        QuantStore::Native,
        QuantStore::PackedU32(0),
        QuantStore::PackedNative(0),
        QuantStore::PackedU32(1),
        QuantStore::PackedNative(1),
    ];
    for value in QuantValue::ALL {
        for store in stores {
            // Ragged along either axis for every per-word count, and lines of whole words
            // (the byte table's case) along the last axis or the first.
            for shape in [[3, 3], [2, 32], [32, 2], [2, 36]] {
                let layout = Layout::new(&scheme(value, store, None), &shape).unwrap();
                let p = layout.packing.clone();
                let mut words = Words::new(&layout);
                assert!(check_storage(&layout, words.as_ref()).is_ok());
                // The words of the first storage line (lines run along the last storage axis in
                // burn's layout, the packed axis swapped there), and the very last word.
                let line = p.words_axis;
                for w in (0..line).chain([words.len() - 1]) {
                    let wi = w % p.words_axis;
                    let used = p.per.min(p.n_axis - wi * p.per);
                    for t in 0..p.per {
                        for f in 0..(1u32 << p.field_bits.min(8)) {
                            words.set(w, f << (t as u32 * p.field_bits));
                            let ok = if t < used {
                                oracle::stored_value(value, p.field_bits, f).is_some()
                            } else {
                                f == 0
                            };
                            let got = check_storage(&layout, words.as_ref());
                            assert_eq!(
                                got.is_ok(),
                                ok,
                                "{value} {store} word {w} slot {t} field {f:#x}: {got:?}"
                            );
                            if let Err(e) = got {
                                assert!(matches!(e, QuantError::Layout(_)));
                                let why = if t < used { "not a code" } else { "padding" };
                                assert!(e.to_string().contains(why), "{e}");
                                assert!(e.to_string().contains(&format!("word {w} ")), "{e}");
                            }
                        }
                        words.set(w, 0);
                    }
                }
            }
        }
    }
}

/// The byte-table check says "valid" exactly when the word-by-word one finds nothing: every
/// store, value and codebook, lines of whole words and ragged ones, on storage whose words
/// are zero, random bytes, or one random byte set (bits above a one-a-byte field included).
#[test]
fn byte_table_check_agrees_with_the_word_by_word_one() {
    let nf4 = crate::lookup::Codebook::new(&crate::lookup::NAMED[0].1).unwrap();
    let mut rng = Rng::new(7);
    let stores = [
        QuantStore::Native,
        QuantStore::PackedU32(0),
        QuantStore::PackedNative(0),
        QuantStore::PackedU32(1),
        QuantStore::PackedNative(1),
    ];
    let (mut valid, mut invalid) = (0, 0);
    for value in QuantValue::ALL {
        for store in stores {
            let plain = scheme(value, store, None);
            let books = match value {
                QuantValue::Q4F | QuantValue::Q4S => {
                    vec![plain, plain.with_codebook(nf4)]
                }
                QuantValue::Q2F | QuantValue::Q2S => {
                    let book = crate::lookup::Codebook::new(&[-1.0, -0.25, 0.5, 1.0]).unwrap();
                    vec![plain, plain.with_codebook(book)]
                }
                _ => vec![plain],
            };
            for sch in books {
                for shape in [[3, 3], [2, 32], [32, 2], [2, 36], [5, 17], [0, 4], [4, 0]] {
                    let layout = Layout::new(&sch, &shape).unwrap();
                    let mut words = Words::new(&layout);
                    for trial in 0..200 {
                        for w in 0..words.len() {
                            words.set(w, 0);
                        }
                        let n = words.len();
                        if n > 0 && trial % 4 == 1 {
                            for w in 0..n {
                                words.set(w, rng.next_u64() as u32);
                            }
                        } else if n > 0 && trial % 4 >= 2 {
                            let w = rng.below(n);
                            let byte = rng.below(layout.packing.word_bytes());
                            words.set(w, (rng.byte() as u32) << (8 * byte));
                        }
                        let st = words.as_ref();
                        let bytes: Vec<u8> = match st {
                            Storage::U8(b) => b.to_vec(),
                            Storage::U32(w) => w.iter().flat_map(|w| w.to_le_bytes()).collect(),
                        };
                        let slow = report_storage(&layout, st).is_ok();
                        assert_eq!(
                            storage_bytes_valid(&layout, &bytes),
                            slow,
                            "{} {shape:?} trial {trial}: {bytes:02x?}",
                            layout.scheme
                        );
                        assert_eq!(check_storage_bytes(&layout, &bytes).is_ok(), slow);
                        (valid, invalid) = if slow {
                            (valid + 1, invalid)
                        } else {
                            (valid, invalid + 1)
                        };
                    }
                }
            }
        }
    }
    // Both answers came up often.
    assert!(
        valid > 10_000 && invalid > 10_000,
        "{valid} valid, {invalid} invalid"
    );
}

/// The 32-at-a-time set lookup against the byte-by-byte one and against the set's
/// definition: every byte value as the one non-member, at every position of runs of 32 to
/// 100 bytes (the 64-byte steps, the 32-byte one and the overlapping last read all find
/// it); then random sets (all members, one non-member, sparse and dense) on runs of every
/// length up to 200 and a few thousand bytes, of members only or with one non-member
/// planted.
#[test]
fn byte_set_lookup_equals_the_table() {
    let mut rng = Rng::new(11);
    for out in 0..=255u8 {
        let set = ByteSet::new(|b| b != out);
        let members: Vec<u8> = (0..=255u8).filter(|&b| b != out).collect();
        for n in [32, 33, 63, 64, 65, 96, 100] {
            let mut run: Vec<u8> = (0..n).map(|_| members[rng.below(255)]).collect();
            assert!(set.contains_all(&run) && set.contains_all_portable(&run));
            for at in 0..n {
                let keep = run[at];
                run[at] = out;
                assert!(!set.contains_all(&run), "{out:#x} at {at} of {n}");
                assert!(!set.contains_all_portable(&run));
                run[at] = keep;
            }
        }
    }
    for trial in 0..400 {
        let density = [256, 255, 128, 16, 1][trial % 5];
        let member: Vec<bool> = (0..256).map(|_| rng.below(256) < density).collect();
        let set = ByteSet::new(|b| member[b as usize]);
        let (ins, outs): (Vec<u8>, Vec<u8>) = (0..=255u8).partition(|&b| member[b as usize]);
        let n = if trial % 7 == 0 {
            4096 + rng.below(64)
        } else {
            rng.below(201)
        };
        let mut run: Vec<u8> = match ins.len() {
            0 => vec![0; n],
            k => (0..n).map(|_| ins[rng.below(k)]).collect(),
        };
        if !outs.is_empty() && n > 0 && trial % 2 == 1 {
            run[rng.below(n)] = outs[rng.below(outs.len())];
        }
        let truth = run.iter().all(|&b| member[b as usize]);
        assert_eq!(set.contains_all(&run), truth, "trial {trial}, {n} bytes");
        assert_eq!(
            set.contains_all_portable(&run),
            truth,
            "trial {trial}, {n} bytes"
        );
    }
}

#[path = "avx2_tests.rs"]
mod avx2;
#[path = "fields_tests.rs"]
mod fields;
