use super::*;

const VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
static BOOK: Book = Book::new(&VALUES);

#[test]
fn book_finds_the_nearest_value() {
    // A sweep in steps of 1/64 over and past the codebook's range: the value found is at
    // least as near as every other (ties on a midpoint may go either way).
    for k in -150 * 64..150 * 64 {
        let v = k as f32 / 64.0;
        let (i, g) = BOOK.nearest(v);
        assert_eq!(g, VALUES[i as usize] as f32);
        let best = VALUES
            .iter()
            .map(|&c| (v - c as f32).abs())
            .fold(f32::MAX, f32::min);
        assert_eq!((v - g).abs(), best, "{v}");
    }
    assert_eq!(BOOK.nearest(f32::INFINITY).0, 15);
    assert_eq!(BOOK.nearest(f32::NEG_INFINITY).0, 0);
}

#[test]
fn searched_scales_beat_the_max_to_end_scale() {
    // Deterministic pseudo-Gaussian blocks: the search's scale, as its codes decode, never
    // does worse than mapping the largest value to the grid's negative end.
    let mut s = 12345u64;
    let grid = Uniform { lo: -8, hi: 7 };
    for _ in 0..200 {
        let x: Vec<f32> = (0..32)
            .map(|_| {
                let mut a = 0.0;
                for _ in 0..4 {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    a += (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                }
                a
            })
            .collect();
        let (m, _) = signed_max(&x);
        let plain = scaled_error(&x, Unit, m / -8.0, &grid);
        let searched = scaled_error(&x, Unit, symmetric(&x, Unit, &grid, STEPS), &grid);
        assert!(searched <= plain * (1.0 + 1e-6), "{searched} > {plain}");
        let (a, b) = affine::<_, false>(&x, Unit, 15);
        assert!(a > 0.0 && b >= 0.0);
    }
    assert_eq!(symmetric(&[0.0; 16], Unit, &grid, STEPS), 0.0);
    assert_eq!(affine::<_, false>(&[0.0; 16], Unit, 15), (0.0, 0.0));
    assert_eq!(affine::<_, false>(&[-2.0; 16], Unit, 15), (0.0, 2.0));
}

#[test]
fn f16_scales_saturate() {
    assert_eq!(f16_sat(1e30), (0x7BFF, 65504.0));
    assert_eq!(f16_sat(-1e30), (0xFBFF, -65504.0));
    assert_eq!(f16_sat(1e-30).1, 0.0);
}
