//! `pack_fields`, `unpack_fields` and `squeeze8` of `pack` against bit-at-a-time oracles.

use super::*;

/// Codes packed `per` to a word of `word_bits`, first in the low bits, one bit at a time.
fn pack_oracle(codes: &[u8], per: usize, word_bits: u32) -> Vec<u32> {
    let bits = word_bits as usize / per;
    let mut words = vec![0u32; codes.len().div_ceil(per)];
    for (i, &c) in codes.iter().enumerate() {
        for b in 0..bits {
            if (c >> b) & 1 == 1 {
                words[i / per] |= 1 << ((i % per) * bits + b);
            }
        }
    }
    words
}

/// Field `f` of a line of words, one bit at a time.
fn field_oracle(line: &[u32], f: usize, per: usize, word_bits: u32) -> u8 {
    let bits = word_bits as usize / per;
    let mut v = 0u8;
    for b in 0..bits.min(8) {
        let bit = (f % per) * bits + b;
        v |= (((line[f / per] >> bit) & 1) as u8) << b;
    }
    v
}

/// Lengths around every per-word count and up to the kernels' buffer size.
fn lengths() -> impl Iterator<Item = usize> {
    (0..=70).chain([BUF - 9, BUF - 8, BUF - 7, BUF - 1, BUF])
}

fn check_pack<W: Word>(per: usize, rng: &mut Rng) {
    for len in lengths() {
        // Full random bytes: bits above a field's width must be dropped.
        let codes: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
        // Stale contents: every word, padding included, must be overwritten.
        let mut words = vec![W::from_u32(0xA5A5_A5A5); len.div_ceil(per)];
        pack_fields(&codes, &mut words, per);
        let got: Vec<u32> = words.iter().map(|w| w.to_u32()).collect();
        let want = pack_oracle(&codes, per, W::BITS);
        assert_eq!(got, want, "{} per {per} len {len}", W::BITS);
        if len < 3 * FEW {
            let mut words = vec![W::from_u32(0x5A5A_5A5A); len.div_ceil(per)];
            pack_few(&codes, &mut words, per);
            let got: Vec<u32> = words.iter().map(|w| w.to_u32()).collect();
            assert_eq!(got, want, "pack_few: {} per {per} len {len}", W::BITS);
        }
    }
}

#[test]
fn pack_fields_matches_a_bit_at_a_time_oracle() {
    let mut rng = Rng::new(1);
    // u8 words: Q8 / Q4 / Q2 in PackedNative; u32 words: the same in PackedU32.
    for per in [1, 2, 4] {
        check_pack::<u8>(per, &mut rng);
    }
    for per in [4, 8, 16] {
        check_pack::<u32>(per, &mut rng);
    }
}

/// Many short lines at once (`pack_short_lines`: 8-byte stores that run into the next
/// line, the last lines one word at a time) against each line packed alone by the oracle,
/// over stale words; line counts around where the 8-byte reads and stores stop fitting.
fn check_short_lines<W: Word>(per: usize, rng: &mut Rng) {
    for n in 1..FEW {
        let nw = n.div_ceil(per);
        for lines in [1, 2, 3, 4, 5, 9, 17, 40] {
            let codes: Vec<u8> = (0..n * lines).map(|_| rng.byte()).collect();
            let mut words = vec![W::from_u32(0xA5A5_A5A5); nw * lines];
            pack_short_lines(&codes, n, &mut words, per);
            let got: Vec<u32> = words.iter().map(|w| w.to_u32()).collect();
            let want: Vec<u32> = codes
                .chunks(n)
                .flat_map(|line| pack_oracle(line, per, W::BITS))
                .collect();
            assert_eq!(got, want, "{} per {per}, {lines} lines of {n}", W::BITS);
            // And back, every field of every line, over stale codes.
            let mut back = vec![0xEEu8; codes.len()];
            unpack_short_lines(&words, n, &mut back, per);
            let mask = (u32::MAX >> (32 - W::BITS as usize / per)) as u8;
            let want: Vec<u8> = codes.iter().map(|&c| c & mask).collect();
            assert_eq!(
                back,
                want,
                "unpack: {} per {per}, {lines} lines of {n}",
                W::BITS
            );
        }
    }
}

#[test]
fn short_lines_pack_and_unpack_as_each_line_alone() {
    let mut rng = Rng::new(5);
    for per in [1, 2, 4] {
        check_short_lines::<u8>(per, &mut rng);
    }
    for per in [4, 8, 16] {
        check_short_lines::<u32>(per, &mut rng);
    }
}

fn check_unpack<W: Word>(per: usize, rng: &mut Rng) {
    // Short lines: every (first, len) pair; padding words hold random bits, which a
    // correct unpack never reads into a field inside the range.
    for nw in [1, 2, 3, 5] {
        let line: Vec<u32> = (0..nw).map(|_| rng.next_u64() as u32).collect();
        let line_w: Vec<W> = line.iter().map(|&v| W::from_u32(v)).collect();
        let line: Vec<u32> = line_w.iter().map(|w| w.to_u32()).collect();
        let total = nw * per;
        for first in 0..total {
            for len in 0..=total - first {
                let mut got = vec![0xEEu8; len];
                unpack_fields(&line_w, first, &mut got, per);
                let want: Vec<u8> = (first..first + len)
                    .map(|f| field_oracle(&line, f, per, W::BITS))
                    .collect();
                assert_eq!(got, want, "{} per {per} first {first} len {len}", W::BITS);
            }
        }
    }
    // Long lines: buffer-sized runs from random starts.
    let nw = (3 * BUF).div_ceil(per);
    let line_w: Vec<W> = (0..nw)
        .map(|_| W::from_u32(rng.next_u64() as u32))
        .collect();
    let line: Vec<u32> = line_w.iter().map(|w| w.to_u32()).collect();
    for _ in 0..20 {
        let first = rng.below(BUF);
        let len = rng.below(BUF + 1);
        let mut got = vec![0u8; len];
        unpack_fields(&line_w, first, &mut got, per);
        for (j, &g) in got.iter().enumerate() {
            assert_eq!(g, field_oracle(&line, first + j, per, W::BITS));
        }
    }
}

#[test]
fn unpack_fields_matches_a_bit_at_a_time_oracle() {
    let mut rng = Rng::new(2);
    // 8 per byte (1-bit fields) is not used by any value today, but the kernel has the arm.
    for per in [1, 2, 4, 8] {
        check_unpack::<u8>(per, &mut rng);
    }
    for per in [4, 8, 16] {
        check_unpack::<u32>(per, &mut rng);
    }
}

#[test]
fn packed_fields_round_trip_with_padding_zero() {
    let mut rng = Rng::new(3);
    for (word_bits, per) in [(8, 1), (8, 2), (8, 4), (32, 4), (32, 8), (32, 16)] {
        let bits = word_bits / per as u32;
        let mask = ((1u32 << bits) - 1) as u8;
        for len in lengths() {
            let codes: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
            let masked: Vec<u8> = codes.iter().map(|&c| c & mask).collect();
            let mut back = vec![0u8; len];
            let padding = |ws: Vec<u32>| {
                // Fields past the last code of the last word.
                let used = len % per;
                if used == 0 || ws.is_empty() {
                    return 0;
                }
                ws[ws.len() - 1] >> (used as u32 * bits)
            };
            if word_bits == 8 {
                let mut w = vec![0xFFu8; len.div_ceil(per)];
                pack_fields(&codes, &mut w, per);
                unpack_fields(&w, 0, &mut back, per);
                assert_eq!(padding(w.iter().map(|&v| v as u32).collect()), 0);
            } else {
                let mut w = vec![u32::MAX; len.div_ceil(per)];
                pack_fields(&codes, &mut w, per);
                unpack_fields(&w, 0, &mut back, per);
                assert_eq!(padding(w), 0, "per {per} len {len}");
            }
            assert_eq!(back, masked, "{word_bits}-bit words, per {per}, len {len}");
        }
    }
}

#[test]
fn squeeze8_matches_a_bit_at_a_time_oracle() {
    let mut rng = Rng::new(4);
    for _ in 0..2000 {
        let x = rng.next_u64();
        for bits in [2usize, 4, 8] {
            let mut want = 0u64;
            for i in 0..8 {
                for b in 0..bits {
                    want |= ((x >> (8 * i + b)) & 1) << (i * bits + b);
                }
            }
            assert_eq!(squeeze8(x, bits), want, "{x:#x} {bits}");
        }
    }
}
