//! The group encoders of `nvfp4_avx2` (AVX2 division, AVX-512 products by the reciprocal)
//! against the division, on quotients near every E2M1 rounding boundary.

use super::*;

/// E2M1 codes of `x / e[j]` (block j of `bc`) packed two a byte: what every group encoder
/// must write.
fn divided_codes(x: &[f32], e: &[f32; 8], bc: usize) -> Vec<u8> {
    let codes: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| E2M1Code.encode(v / e[i / bc]))
        .collect();
    let mut out = vec![0u8; x.len() / 2];
    nibble_pairs(&codes, &mut out);
    out
}

/// E2M1's rounding boundaries: a quotient on one is a tie.
const BOUNDARIES: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];

/// A random quotient in (-7, 7) at least `margin` from every boundary.
fn clean_quotient(rng: &mut Rng, margin: f32) -> f32 {
    loop {
        let q = 7.0 * rng.unit();
        if BOUNDARIES.iter().all(|b| (q.abs() - b).abs() >= margin) {
            return q;
        }
    }
}

/// A group of eight blocks against the scales `e`, quotients aimed at the E2M1 rounding
/// boundaries and values (±0..40 patterns around them, both signs), at 0, ±0, past 6, tiny,
/// and at random; `exact_values` only: each value an E2M1 value times its block's scale,
/// exactly (dequantized data).
fn group_data(rng: &mut Rng, e: &[f32; 8], bc: usize, exact_values: bool) -> Vec<f32> {
    const AIMS: [f32; 14] = [
        0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    ];
    (0..8 * bc)
        .map(|i| {
            let e = e[i / bc];
            let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            if exact_values {
                return sign * rng.pick(&[0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]) * e;
            }
            match rng.below(8) {
                0 => 0.0,
                1 => -0.0,
                2 => sign * e * (7.0 + 100.0 * rng.unit().abs()),
                3 => sign * e * 1e-30,
                4 => sign * e * 6.5 * rng.unit(),
                _ => {
                    let m = rng.pick(&AIMS);
                    let q = f32::from_bits((m.to_bits() as i64 + rng.below(81) as i64 - 40) as u32);
                    let x = q * e;
                    sign * f32::from_bits((x.to_bits() as i64 + rng.below(3) as i64 - 1) as u32)
                }
            }
        })
        // Pass 2 sees only finite values (a huge scale's quotients past 6 may overflow).
        .map(|v: f32| if v.is_finite() { v } else { e[0] })
        .collect()
}

/// Effective scales for a group: normal f32s of every size a product by the reciprocal is
/// tried for (2^-126 to 2^125), some powers of two (exact reciprocals), and with `spread` also
/// ones it is not tried for (subnormal, at or past 2^125).
fn group_scales(rng: &mut Rng, all_powers: bool, spread: bool) -> [f32; 8] {
    std::array::from_fn(|_| {
        let exp = if spread && rng.below(4) == 0 {
            rng.pick(&[-149i32, -130, -127, 125, 126, 127])
        } else {
            rng.below(251) as i32 - 126
        };
        let base = crate::minifloat::exp2i(exp);
        if all_powers || exp >= 125 || rng.below(8) == 0 {
            base
        } else {
            base * (1.0 + (rng.next_u64() >> 41) as f32 / (1u64 << 23) as f32)
        }
    })
}

/// The AVX-512 group encode ([`encode_group512`]: products by the reciprocals, flagged near a
/// rounding boundary) and the AVX2 one (divisions) against the division value by value, on
/// quotients within ±40 patterns of every E2M1 boundary and value: whatever the AVX-512 kernel
/// writes without flagging is the division's codes, and both outcomes occur. Dequantized data
/// (exact E2M1 multiples of the scale) is never flagged.
#[test]
fn group_encoders_equal_the_division() {
    if !avx2() {
        return;
    }
    let avx512 = crate::simd::has_avx512_vbmi();
    let mut rng = Rng::new(0xE2);
    let (mut flagged, mut written, mut exact_written, mut untried) = (0, 0, 0, 0);
    for round in 0..6000 {
        let bc = if round % 2 == 0 { 16 } else { 32 };
        let exact_values = round % 5 == 4;
        let e = group_scales(&mut rng, round % 7 == 3, !exact_values);
        let e = if exact_values {
            // Scales with at most 22 significant bits: an E2M1 value (2 bits) times one is exact.
            e.map(|v| f32::from_bits(v.to_bits() & !3).max(f32::MIN_POSITIVE))
        } else {
            e
        };
        let x = group_data(&mut rng, &e, bc, exact_values);
        let want = divided_codes(&x, &e, bc);
        let ev = unsafe { _mm256_loadu_ps(e.as_ptr()) };
        let mut got = vec![0xA5u8; 4 * bc];
        // SAFETY: the CPU has AVX2 (checked above); x holds 8 blocks, got their bytes.
        unsafe {
            if bc == 16 {
                encode_8blocks::<2, false>(x.as_ptr(), ev, got.as_mut_ptr(), false)
            } else {
                encode_8blocks::<4, false>(x.as_ptr(), ev, got.as_mut_ptr(), false)
            }
        }
        assert_eq!(got, want, "AVX2, bc {bc}, e {e:?}, x {x:?}");
        if !avx512 {
            continue;
        }
        got.fill(0xA5);
        // SAFETY: the CPU has AVX-512 with VBMI (checked above).
        if unsafe { encode_group512(bc, x.as_ptr(), ev, got.as_mut_ptr(), false) } {
            assert_eq!(got, want, "AVX-512, bc {bc}, e {e:?}, x {x:?}");
            written += 1;
            exact_written += exact_values as usize;
        } else {
            assert!(!exact_values, "dequantized data flagged: e {e:?}, x {x:?}");
            if tried(&e) {
                flagged += 1;
            } else {
                untried += 1;
            }
        }
    }
    if avx512 {
        assert!(
            flagged > 100 && written > 1000 && untried > 100,
            "{flagged} flagged, {written} written, {untried} not tried"
        );
        assert_eq!(exact_written, 1200);
    }
}

/// Whether [`encode_group512`] multiplies for these scales: every one a power of two with an
/// f32 reciprocal, or every one normal and below 2^125.
fn tried(e: &[f32; 8]) -> bool {
    e.iter()
        .all(|v| crate::simd::exact_reciprocal(*v).is_some())
        || e.iter()
            .all(|v| crate::simd::checked_reciprocal(*v).is_some())
}

/// One value near each E2M1 boundary and each other multiple of 2^21 in [0.25, 6] (every f32
/// with at most two significant bits there: 0.3125, 0.5, 0.625, ...), `d` = -40..=40 patterns
/// from it in quotient space, in an otherwise clean group (quotients at least 0.01 from any
/// boundary), at a random place (often the last step, after earlier bytes are stored).
/// Checked reciprocals: within 2 patterns of a boundary the kernel must flag, from 32 on it
/// must write, between it may do either; next to any other multiple it must write. Exact
/// reciprocals (powers of two) must always write, ties included. Whatever is written is the
/// division's, and so is what [`encode_group`] and [`encode_group_of`] write after a flag, with
/// plain and non-temporal stores.
#[test]
fn avx512_flags_exactly_near_the_boundaries() {
    if !crate::simd::has_avx512_vbmi() {
        return;
    }
    let multiples: Vec<f32> = (500u32..=519).map(|k| f32::from_bits(k << 21)).collect();
    let mut rng = Rng::new(0xB0);
    // 64-byte aligned room for the non-temporal stores (16-byte alignment is what they need).
    let mut room = [0u8; 128 + 64];
    let at = room.as_ptr().align_offset(64);
    let (mut must_flag, mut must_write) = (0, 0);
    for (i, &m) in multiples.iter().enumerate() {
        let boundary = BOUNDARIES.contains(&m);
        for d in -40i32..=40 {
            let bc = if (i as i32 + d) % 2 == 0 { 16 } else { 32 };
            let exact = rng.below(4) == 0;
            let e: [f32; 8] = std::array::from_fn(|_| {
                let base = 2f32.powi(rng.below(200) as i32 - 100);
                if exact {
                    base
                } else {
                    base * (1.0 + (1 + (rng.next_u64() >> 42)) as f32 / (1u64 << 22) as f32)
                }
            });
            let mut x: Vec<f32> = (0..8 * bc)
                .map(|j| clean_quotient(&mut rng, 0.01) * e[j / bc])
                .collect();
            // The near value: in the last step half the time.
            let j = if rng.below(2) == 0 {
                8 * bc - 1 - rng.below(64)
            } else {
                rng.below(8 * bc)
            };
            let q = f32::from_bits((m.to_bits() as i32 + d) as u32);
            let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            x[j] = sign * q * e[j / bc];
            let want = divided_codes(&x, &e, bc);
            let ev = unsafe { _mm256_loadu_ps(e.as_ptr()) };
            let mut got = vec![0xA5u8; 4 * bc];
            // SAFETY: the CPU has AVX-512 with VBMI (checked above); x holds 8 blocks.
            let wrote = unsafe { encode_group512(bc, x.as_ptr(), ev, got.as_mut_ptr(), false) };
            let what = format!("m {m}, d {d}, bc {bc}, exact {exact}, x[{j}] = {:e}", x[j]);
            if wrote {
                assert_eq!(got, want, "{what}");
            }
            if exact || !boundary || d.abs() >= 32 {
                assert!(wrote, "not written: {what}");
                must_write += 1;
            } else if d.abs() <= 2 {
                assert!(!wrote, "not flagged: {what}");
                must_flag += 1;
            }
            // The dispatchers, which redo a flagged group by the division.
            for stream in [false, true] {
                let o0 = room[at..].as_mut_ptr();
                // SAFETY: as above; o0 is 64-byte aligned with 4 * bc bytes of room.
                unsafe {
                    std::ptr::write_bytes(o0, 0xA5, 4 * bc);
                    encode_group(bc, x.as_ptr(), ev, o0, stream, true);
                    _mm_sfence();
                }
                let got = &room[at..at + 4 * bc];
                assert_eq!(got, &want[..], "encode_group, stream {stream}: {what}");
            }
            got.fill(0xA5);
            // SAFETY: as above; e as block scales under g = 1 gives e itself.
            unsafe { encode_group_of(&x, &e, 1.0, 0, bc, &mut got, true) };
            assert_eq!(got, want, "encode_group_of: {what}");
        }
    }
    let enough = must_flag >= 20 && must_write > 1000;
    assert!(enough, "{must_flag} flagged, {must_write} written");
}

/// The AVX-512 kernel's product path on its own, with no value near a boundary to flag:
/// random quotients in every E2M1 interval (stopping short of the boundaries by far more
/// than the product's error), each written as the division would.
#[test]
fn avx512_products_away_from_boundaries_are_written() {
    if !crate::simd::has_avx512_vbmi() {
        return;
    }
    let mut rng = Rng::new(0x512);
    for round in 0..2000 {
        let bc = if round % 2 == 0 { 16 } else { 32 };
        let e = group_scales(&mut rng, false, false);
        let x: Vec<f32> = (0..8 * bc)
            .map(|i| clean_quotient(&mut rng, 1e-3) * e[i / bc])
            .collect();
        let ev = unsafe { _mm256_loadu_ps(e.as_ptr()) };
        let mut got = vec![0xA5u8; 4 * bc];
        // SAFETY: the CPU has AVX-512 with VBMI (checked above).
        assert!(unsafe { encode_group512(bc, x.as_ptr(), ev, got.as_mut_ptr(), false) });
        assert_eq!(got, divided_codes(&x, &e, bc), "bc {bc}, e {e:?}");
    }
}
