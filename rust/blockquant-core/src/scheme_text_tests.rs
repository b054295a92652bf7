use super::*;

fn msg(text: &str) -> String {
    match parse(text) {
        Err(QuantError::Scheme(m)) => m,
        other => panic!("{text:?} should be a scheme error, got {other:?}"),
    }
}

#[test]
fn canonical_texts_print_back_identically() {
    for text in [
        "q4s/packed_native0/block32:f16",
        "e4m3/native/block32x32:ue8m0",
        "e2m1/packed_native0/block16:ue4m3+tensor:f32",
        "q8f/packed_u32_0/tensor",
        "q8f/packed_u32_0/tensor:f32",
        "q2f/packed_u32_3/block1:bf16",
        "e5m2/packed_native12/block2x3x4x5x6:f32",
        "q4f/native/tensor:ue4m3/lookup:nf4",
        "q4s/packed_u32_0/block16:ue4m3+tensor:f32/lookup:iq4nl",
        "q4f/packed_u32_0/block16:ue4m3+tensor:f32/lookup:bq4",
        "q2s/packed_native0/block8:f16/lookup:[1.5,-0.25,0.0,-3.0]",
        "q2f/native/tensor/lookup:[1e-08,-1e+30,0.1,3.4028235e+38]",
    ] {
        let s: QuantScheme = text.parse().unwrap();
        assert_eq!(s.text().to_string(), text);
    }
}

#[test]
fn the_default_scheme_has_no_level_written() {
    assert_eq!(
        QuantScheme::default().text().to_string(),
        "q8f/packed_u32_0/tensor"
    );
    assert_eq!(
        parse("q8f/packed_u32_0/tensor").unwrap(),
        QuantScheme::default()
    );
    assert_ne!(
        parse("q8f/packed_u32_0/tensor:f32").unwrap(),
        QuantScheme::default()
    );
}

#[test]
fn parsed_parts_land_in_the_scheme() {
    let s = parse("e2m1/packed_native0/block16:ue4m3+tensor:f32").unwrap();
    assert_eq!(s.value, QuantValue::E2M1);
    assert_eq!(s.store, QuantStore::PackedNative(0));
    assert_eq!(s.tensor, Some(ScaleDtype::F32));
    assert_eq!(s.block.unwrap().size(), &[16]);
    assert_eq!(s.block.unwrap().dtype, ScaleDtype::UE4M3);
    let l = parse("q4f/native/tensor/lookup:nf4").unwrap();
    assert_eq!(l.mode, QuantMode::Lookup);
    assert_eq!(l.codebook.unwrap().name(), Some("nf4"));
}

#[test]
fn bad_texts_say_what_is_wrong() {
    for (text, want) in [
        ("q4s/native/block32:f8", "unknown scale dtype 'f8' in 'q4s/native/block32:f8': expected f32, f16, bf16, ue8m0 or ue4m3"),
        ("q9s/native/tensor", "unknown value 'q9s' in 'q9s/native/tensor': expected q8f, q8s, q4f, q4s, q2f, q2s, e4m3, e5m2, e2m1, u8, u4 or u2"),
        ("q4s/packed_native01/tensor", "unknown store 'packed_native01'"),
        ("q4s/native/per_tensor", "unknown levels 'per_tensor'"),
        ("q4s/native/block32", "block level 'block32' in 'q4s/native/block32' has no scale dtype: write e.g. 'block32:f16'"),
        ("q4s/native/block032:f16", "bad block size 'block032'"),
        ("q4s/native/block0:f16", "block sizes are positive integers, got [0] (in 'q4s/native/block0:f16')"),
        ("q4s/native/block1x32:f16", "block size 'block1x32' in 'q4s/native/block1x32:f16' has a leading 1: a block is rank-relative, write 'block32'"),
        ("q4s/native/block1x1x32:f16", "write 'block32'"),
        ("q4s/native/block2x2x2x2x2x2:f16", "1 to 5 dimensions"),
        ("q4s/native/block16:ue4m3+tensor:f16", "a two-level scheme stores its per-tensor scale as f32, got QuantScheme(value=Q4S, store=Native, block=BlockScale([16], UE4M3), tensor=F16) (in 'q4s/native/block16:ue4m3+tensor:f16')"),
        ("q4s/native/block16:f16+tensor", "bad second level 'tensor'"),
        ("q4s/native/tensor:f32+block16:f16", "write the block level first"),
        ("q4s/native/tensor/symmetric", "unknown mode 'symmetric'"),
        ("q4s/native", "got 2 parts in 'q4s/native'"),
        ("q4s/native/tensor/lookup", "Lookup mode needs a codebook in 'q4s/native/tensor/lookup': write lookup:NAME (nf4, iq4nl or bq4) or lookup:[V,V,...]"),
        ("q4s/native/tensor/lookup:NF4", "unknown codebook 'NF4'"),
        ("q4s/native/tensor/lookup:[1.0,2.0]", "a Q4S codebook has 2^4 = 16 entries, got 2"),
        ("q2s/native/tensor/lookup:[1.0,2.0,3.0,nan]", "must be finite"),
        ("q2s/native/tensor/lookup:[1.0,2.0,3.0,x]", "bad codebook entry 'x'"),
        ("q2s/native/tensor/lookup:[1,2.0,3.0,4.0]", "write '1.0'"),
        ("q2s/native/tensor/lookup:[1.0, 2.0,3.0,4.0]", "write '2.0'"),
        ("q2s/native/tensor/lookup:[1_0.0,2.0,3.0,4.0]", "write '10.0'"),
        ("q2s/native/tensor/lookup:[1e39,2.0,3.0,4.0]", "write 'inf'"),
        ("q8s/native/tensor/lookup:nf4", "8-bit value (Q8S) is not implemented"),
        ("e2m1/native/tensor/lookup:nf4", "no float semantics"),
        ("nvfp4", "unknown scheme 'nvfp4': a scheme text is VALUE/STORE/LEVELS such as 'q4s/packed_u32_0/block32:f16' (preset names: blockquant.presets.resolve; blockquant presets lists them)"),
        ("it's", "unknown scheme \"it's\""),
    ] {
        let m = msg(text);
        assert!(m.contains(want), "{text:?}: {m:?} lacks {want:?}");
    }
}

#[test]
fn a_list_spelling_a_named_codebook_is_refused_with_its_name() {
    let list: Vec<String> = crate::lookup::NF4
        .iter()
        .map(|v| float32_text(*v))
        .collect();
    let text = format!("q4s/native/tensor/lookup:[{}]", list.join(","));
    assert!(msg(&text).ends_with("is the named one 'nf4': write lookup:nf4"));
}

#[test]
fn numbers_past_a_size_are_scheme_errors() {
    assert_eq!(
        msg("q2s/packed_u32_99999999999999999999/tensor"),
        "a packing dim must be at most 18446744073709551615, got 99999999999999999999"
    );
    assert!(
        msg("q8s/native/block99999999999999999999:f16").starts_with("a block size must be at most")
    );
    assert!(msg(&format!("q8s/native/block{}:f16", "9".repeat(21))).starts_with("bad block size"));
    let long = format!("q8s/native/block32:f16{}", "/".repeat(2000));
    assert!(msg(&long).starts_with("a scheme text of 2022 characters is too long"));
}

#[test]
fn float32_text_is_numpys() {
    for (v, want) in [
        (0.0f32, "0.0"),
        (-0.0, "-0.0"),
        (1.0, "1.0"),
        (-0.25, "-0.25"),
        (0.1, "0.1"),
        (100.0, "100.0"),
        (999_999.94, "999999.94"),
        (1e6, "1e+06"),
        (16_777_216.0, "1.6777216e+07"),
        (1e-4, "1e-04"),
        (0.000_100_01, "0.00010001"),
        (1e-8, "1e-08"),
        (-1e30, "-1e+30"),
        // 2^20 + 0.25 and + 0.75: equally near two shortest texts, numpy takes the even digit
        (f32::from_bits(0x4980_0002), "1.0485762e+06"),
        (f32::from_bits(0x4980_0006), "1.0485768e+06"),
        (f32::MAX, "3.4028235e+38"),
        (f32::from_bits(1), "1e-45"),
        (f32::NAN, "nan"),
        (f32::NEG_INFINITY, "-inf"),
    ] {
        assert_eq!(float32_text(v), want, "{v:e}");
    }
}

#[test]
fn quote_is_pythons_repr() {
    assert_eq!(quote("q4s"), "'q4s'");
    assert_eq!(quote("it's"), "\"it's\"");
    assert_eq!(quote("'\""), "'\\'\"'");
    assert_eq!(quote("a\\b\n\t\x00\x7f"), "'a\\\\b\\n\\t\\x00\\x7f'");
    assert_eq!(
        quote("é\u{a0}\u{200b}\u{10ffff}"),
        "'é\\xa0\\u200b\\U0010ffff'"
    );
}

#[test]
fn display_is_the_python_repr() {
    let s = QuantScheme::default()
        .with_value(QuantValue::E2M1)
        .with_store(QuantStore::PackedNative(0))
        .per_block(&[16], ScaleDtype::UE4M3)
        .unwrap()
        .per_tensor(ScaleDtype::F32);
    assert_eq!(
        s.to_string(),
        "QuantScheme(value=E2M1, store=PackedNative(0), block=BlockScale([16], UE4M3), tensor=F32)"
    );
    assert_eq!(
        QuantScheme::default().to_string(),
        "QuantScheme(value=Q8F, store=PackedU32(0))"
    );
    let l = parse("q2f/native/tensor/lookup:[1e-08,-1e+30,0.1,3.0]").unwrap();
    assert_eq!(
        l.to_string(),
        "QuantScheme(value=Q2F, store=Native, mode=Lookup, codebook=[1e-08,-1e+30,0.1,3.0])"
    );
}

#[test]
fn every_scheme_of_a_grid_round_trips() {
    let stores = [
        QuantStore::Native,
        QuantStore::PackedU32(0),
        QuantStore::PackedNative(7),
    ];
    // (per-tensor dtype, block) pairs: none, tensor only, block only (1-d, 3-d), two-level.
    type Levels = (Option<ScaleDtype>, Option<(&'static [usize], ScaleDtype)>);
    let levels: [Levels; 5] = [
        (None, None),
        (Some(ScaleDtype::BF16), None),
        (None, Some((&[32], ScaleDtype::UE8M0))),
        (None, Some((&[4, 1, 8], ScaleDtype::F32))),
        (Some(ScaleDtype::F32), Some((&[16], ScaleDtype::F16))),
    ];
    for value in QuantValue::ALL {
        for store in stores {
            for (tensor, block) in levels {
                let mut s = QuantScheme::default().with_value(value).with_store(store);
                s.tensor = tensor;
                if let Some((size, dtype)) = block {
                    s = s.per_block(size, dtype).unwrap();
                }
                let text = s.text().to_string();
                assert_eq!(parse(&text).unwrap(), s, "{text}");
            }
        }
    }
}
