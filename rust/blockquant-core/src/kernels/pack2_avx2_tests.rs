//! Tests of [`crate::kernels::pack2_avx2`]: the in-register 2-bit packing against the general path
//! (codes to a buffer, then `pack_fields`), word for word, with the same non-finite flag.

use super::*;
use crate::codec::{IntHalfAway, IntHalfEven};
use crate::pack::tests::{Rng, EDGES};
use crate::scheme::{QuantScheme, QuantStore, QuantValue, ScaleDtype};

fn q2(value: QuantValue, store: QuantStore) -> QuantScheme {
    QuantScheme::default()
        .with_value(value)
        .with_store(store)
        .per_tensor(ScaleDtype::F32)
}

/// Values around the scale `e`: ties at every half step (both signs), ±0, subnormal, huge and
/// edge values, random ones.
fn values(rng: &mut Rng, n: usize, e: f32) -> Vec<f32> {
    (0..n)
        .map(|i| match rng.below(6) {
            0 => (rng.below(9) as f32 - 4.0) / 2.0 * e,
            1 => rng.pick(&[0.0, -0.0, 1e-45, -1e-40, 3e38, -f32::MAX, 1e30]),
            2 => {
                let v = EDGES[i % EDGES.len()];
                if v.is_finite() {
                    v
                } else {
                    -1.0
                }
            }
            _ => rng.unit() * 3.0 * e,
        })
        .collect()
}

/// `encode_words` in tasks of `task` words against `encode_words_last_axis` over all words.
fn check<C: Encode, W: Word + PartialEq + std::fmt::Debug>(
    codec: C,
    layout: &Layout,
    x: &[f32],
    e: f32,
    task: usize,
    what: &str,
) {
    let n = layout.packing.num_words();
    let win = Window::all(Input::F32(x));
    let sc = [e];
    let sc = ScaleSlice::all(&sc);
    assert!(applies(layout, &win, &sc), "{what}");
    let mut want = vec![W::default(); n];
    let bad_want = encode_words_last_axis(codec, win, layout, sc, 0, &mut want);
    let mut got = vec![W::default(); n];
    let mut bad_got = false;
    for (ci, words) in got.chunks_mut(task).enumerate() {
        bad_got |= encode_words(codec, win, layout, sc, ci * task, words);
    }
    assert_eq!(bad_got, bad_want, "non-finite flag: {what}");
    if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
        panic!("word {i}: {:?} vs {:?}: {what}", got[i], want[i]);
    }
}

/// Both codecs, Q2S and Q2F in u32 words (the only store packing 2-bit fields), lines of whole runs of 64 and not (partial last words), tasks
/// starting mid-line, and non-finite values in a run and in a line's tail.
#[test]
fn pack2_matches_the_general_path() {
    if !crate::simd::has_avx2() {
        return;
    }
    let mut rng = Rng::new(21);
    for shape in [
        vec![4, 256],
        vec![3, 64 * 5 + 16],
        vec![5, 70],
        vec![2, 7],
        vec![1, 64 * 300 + 3],
        vec![9, 128],
    ] {
        let n: usize = shape.iter().product();
        for e in [1.0f32, 0.37, 3e-39, 2e30] {
            let mut x = values(&mut rng, n, e);
            for task in [1usize, 5, 4096] {
                for (store, value) in [
                    (QuantStore::PackedU32(0), QuantValue::Q2S),
                    (QuantStore::PackedU32(0), QuantValue::Q2F),
                ] {
                    let layout = Layout::new(&q2(value, store), &shape).unwrap();
                    let (qmin, qmax) = value.range();
                    let what = format!("{value:?} {store:?} {shape:?} e {e:e} task {task}");
                    let away = IntHalfAway { qmin, qmax };
                    let even = IntHalfEven { qmin, qmax };
                    if layout.packing.word_bits == 32 {
                        check::<_, u32>(away, &layout, &x, e, task, &what);
                        check::<_, u32>(even, &layout, &x, e, task, &what);
                    } else {
                        check::<_, u8>(away, &layout, &x, e, task, &what);
                        check::<_, u8>(even, &layout, &x, e, task, &what);
                    }
                }
            }
            // Non-finite, in the first run and in the last line's tail.
            for (pos, bad) in [
                (3, f32::NAN),
                (n - 1, f32::INFINITY),
                (n / 2, f32::NEG_INFINITY),
            ] {
                let keep = x[pos];
                x[pos] = bad;
                let layout =
                    Layout::new(&q2(QuantValue::Q2S, QuantStore::PackedU32(0)), &shape).unwrap();
                let away = IntHalfAway {
                    qmin: -1.0,
                    qmax: 1.0,
                };
                check::<_, u32>(away, &layout, &x, e, 4096, &format!("{bad} at {pos}"));
                x[pos] = keep;
            }
        }
    }
}

/// The comparisons' cuts at their edges: for each scale, values one and two floats either side
/// of every half step (the rounding ties) and of the clamps, both codecs, Q2S and Q2F; and the
/// cuts themselves are where the scalar codec's level changes.
#[test]
fn thresholds_match_the_division_at_every_cut() {
    if !crate::simd::has_avx2() {
        return;
    }
    let step = |x: f32, k: i32| -> f32 {
        // k floats up (k > 0) or down, through ±0.
        let mut v = x;
        for _ in 0..k.abs() {
            v = if k > 0 { v.next_up() } else { v.next_down() };
        }
        v
    };
    for e in [1.0f32, 0.37, 3e-39, 1e-45, 2e30, f32::MAX, 0.1] {
        let mut x = Vec::new();
        for h in -5..=5 {
            let tie = h as f32 / 2.0 * e;
            for k in -2..=2 {
                x.push(step(tie, k));
                x.push(step(-tie, k));
            }
        }
        for v in [0.0, -0.0, 1e-45, -1e-45, f32::MAX, -f32::MAX, f32::NAN] {
            x.push(v);
        }
        x.resize(x.len().div_ceil(64) * 64 + 64, 0.3 * e);
        let shape = [x.len()];
        for value in [QuantValue::Q2S, QuantValue::Q2F] {
            let layout = Layout::new(&q2(value, QuantStore::PackedU32(0)), &shape).unwrap();
            let (qmin, qmax) = value.range();
            let what = format!("{value:?} e {e:e}");
            check::<_, u32>(IntHalfAway { qmin, qmax }, &layout, &x, e, 4096, &what);
            check::<_, u32>(IntHalfEven { qmin, qmax }, &layout, &x, e, 4096, &what);
            let codec = IntHalfAway { qmin, qmax };
            let t = Thresholds::new(codec, e).expect("an int codec is monotone");
            for &c in t.cuts.iter().filter(|c| !c.is_nan()) {
                let (below, at) = (codec.encode(c.next_down() / e), codec.encode(c / e));
                assert_ne!(
                    below & 3,
                    at & 3,
                    "{what}: the level changes at the cut {c:e}"
                );
            }
        }
    }
}
