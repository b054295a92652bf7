"""The text form of a scheme: QuantScheme.parse and str() are exact inverses."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blockquant as bq
from blockquant import QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype, SchemeError

PRESET_TEXT = {
    "int8": "q8s/native/tensor:f32",
    "int8_block32": "q8s/native/block32:f16",
    "int4_block32": "q4s/packed_u32_0/block32:f16",
    "mxfp8": "e4m3/native/block32:ue8m0",
    "mxfp4": "e2m1/packed_native0/block32:ue8m0",
    "nvfp4": "e2m1/packed_native0/block16:ue4m3+tensor:f32",
    "int4_block16": "q4f/packed_u32_0/block16:ue4m3+tensor:f32",
    "nf4_block16": "q4f/packed_u32_0/block16:ue4m3+tensor:f32/lookup:nf4",
    "bq4_block16": "q4f/packed_u32_0/block16:ue4m3+tensor:f32/lookup:bq4",
    "bitnet": "q2s/packed_u32_0/tensor:f32",
    "int8_per_channel": "q8s/native/block65536:f32",
    "int4_asym_block128": "u4/packed_u32_0/block128:bf16/zero:u8",
    "int4_affine_block64": "u4/packed_u32_0/block64:bf16/bias:bf16",
}


def test_every_preset_has_a_spelling():
    assert set(PRESET_TEXT) == set(bq.presets.PRESETS)


@pytest.mark.parametrize("name", list(PRESET_TEXT))
def test_presets_resolve_by_name_and_print_spelled_out(name):
    s = bq.presets.PRESETS[name]()
    assert bq.presets.resolve(name) == s
    # The grammar knows no preset names: resolve() is the one place names become schemes.
    with pytest.raises(SchemeError, match="presets.resolve"):
        QuantScheme.parse(name)
    assert str(s) == PRESET_TEXT[name]
    assert QuantScheme.parse(PRESET_TEXT[name]) == s


@pytest.mark.parametrize(
    "text",
    [
        "q4s/packed_native0/block32:f16",
        "e4m3/native/block32x32:ue8m0",
        "e2m1/packed_native0/block16:ue4m3+tensor:f32",
        "q8f/packed_u32_0/tensor",
        "q8f/packed_u32_0/tensor:f32",
        "q2f/packed_u32_3/block1:bf16",
        "e5m2/packed_native12/block2x3x4x5x6:f32",
        "q4f/native/tensor:ue4m3/lookup:nf4",
        "q4s/packed_u32_0/block16:ue4m3+tensor:f32/lookup:iq4nl",
        "q2s/packed_native0/block8:f16/lookup:[1.5,-0.25,0.0,-3.0]",
        "q2f/native/tensor/lookup:[1e-08,-1e+30,0.1,3.4028235e+38]",
        "q4f/packed_u32_1/block4x4:bf16/lookup:"
        "[0.0,1.0,2.0,3.0,4.0,5.0,6.0,7.0,8.0,9.0,10.0,11.0,12.0,13.0,14.0,-1.0]",
    ],
)
def test_spelled_out_texts_print_back_identically(text):
    assert str(QuantScheme.parse(text)) == text


def test_no_level_and_an_explicit_f32_level_are_different_schemes():
    assert str(QuantScheme()) == "q8f/packed_u32_0/tensor"
    assert str(QuantScheme().per_tensor(ScaleDtype.F32)) == "q8f/packed_u32_0/tensor:f32"
    assert QuantScheme.parse("q8f/packed_u32_0/tensor") == QuantScheme()
    assert QuantScheme.parse("q8f/packed_u32_0/tensor:f32") != QuantScheme()


def test_lookup_mode_is_a_suffix_naming_its_codebook():
    s = bq.presets.int4_block16().with_codebook(bq.codebooks.NF4)
    assert str(s) == "q4f/packed_u32_0/block16:ue4m3+tensor:f32/lookup:nf4"
    assert QuantScheme.parse(str(s)) == s
    # A codebook given as numbers prints by name when it is a named one, bit for bit.
    same = s.with_codebook([float(v) for v in bq.codebooks.NF4])
    assert str(same) == str(s) and same == s and hash(same) == hash(s)
    # Values are rounded to float32 when the scheme is built, and kept so.
    t = QuantScheme(QuantValue.Q2S).with_codebook([0.1, -1, 2, 3])
    assert t.codebook == (float(np.float32(0.1)), -1.0, 2.0, 3.0)
    assert str(t).endswith("/lookup:[0.1,-1.0,2.0,3.0]")
    assert QuantScheme.parse(str(t)) == t
    assert s != s.with_codebook(bq.codebooks.IQ4_NL)
    assert s != s.with_codebook(bq.codebooks.NF4[::-1])  # order matters: entry k is field k


def test_repr_is_unchanged():
    assert repr(bq.presets.nvfp4()) == (
        "QuantScheme(value=E2M1, store=PackedNative(0), block=BlockScale([16], UE4M3), tensor=F32)"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("q4s/native/block32:f8", "unknown scale dtype 'f8' in 'q4s/native/block32:f8'"),
        ("q9s/native/tensor", "unknown value 'q9s' in 'q9s/native/tensor'"),
        ("Q4S/native/tensor", "unknown value 'Q4S'"),
        ("q4s/packed/tensor", "unknown store 'packed' in"),
        ("q4s/packed_u320/tensor", "unknown store 'packed_u320'"),
        ("q4s/packed_native_0/tensor", "unknown store 'packed_native_0'"),
        ("q4s/packed_native01/tensor", "unknown store 'packed_native01'"),
        ("q4s/native/", "unknown levels ''"),
        ("q4s/native/per_tensor", "unknown levels 'per_tensor'"),
        ("q4s/native/tensor:", "unknown scale dtype ''"),
        ("q4s/native/block32", "block level 'block32' in 'q4s/native/block32' has no scale dtype"),
        ("q4s/native/block:f16", "bad block size 'block'"),
        ("q4s/native/block32x:f16", "bad block size 'block32x'"),
        ("q4s/native/block032:f16", "bad block size 'block032'"),
        ("q4s/native/block0:f16", "positive"),
        ("q4s/native/block1x32:f16", "leading 1: a block is rank-relative, write 'block32'"),
        ("q4s/native/block2x2x2x2x2x2:f16", "1 to 5 dimensions"),
        ("q4s/native/block16:ue4m3+tensor:f16", "stores its per-tensor scale as f32"),
        ("q4s/native/block16:f32+tensor:f32", "F16 or UE4M3"),
        ("q4s/native/block16:f16+tensor", "bad second level 'tensor'"),
        ("q4s/native/tensor:f32+block16:f16", "write the block level first"),
        ("q4s/native/tensor/symmetric", "unknown mode 'symmetric'"),
        ("q4s/native", "got 2 parts in 'q4s/native'"),
        ("q4s/native/tensor/lookup/x", "got 5 parts"),
        ("q4s/native/tensor/lookup", "Lookup mode needs a codebook in"),
        ("q4s/native/tensor/lookup:", "unknown codebook ''"),
        ("q4s/native/tensor/lookup:NF4", "unknown codebook 'NF4'"),
        ("q4s/native/tensor/lookup:[1.0,2.0]", "codebook has 2^4 = 16 entries, got 2"),
        ("q2s/native/tensor/lookup:[1.0,2.0,3.0,1.0]", "entries 0 and 3 are both 1"),
        ("q2s/native/tensor/lookup:[1.0,2.0,3.0,nan]", "must be finite"),
        ("q2s/native/tensor/lookup:[1.0,2.0,3.0,x]", "bad codebook entry 'x'"),
        ("q2s/native/tensor/lookup:[1,2.0,3.0,4.0]", "write '1.0'"),
        ("q2s/native/tensor/lookup:[1.0, 2.0,3.0,4.0]", "write '2.0'"),
        ("q2s/native/tensor/lookup:[0.1000000001,2.0,3.0,4.0]", "write '0.1'"),
        ("q8s/native/tensor/lookup:nf4", "8-bit value (Q8S) is not implemented"),
        ("e2m1/native/tensor/lookup:nf4", "no float semantics"),
        ("q4s/native/tensor/lookup:[" + ",".join(str(np.float32(v)) for v in bq.codebooks.NF4)
         + "]", "is the named one 'nf4': write lookup:nf4"),
        ("nvfp5", "unknown scheme 'nvfp5'"),
        ("", "unknown scheme ''"),
        (" nvfp4", "unknown scheme ' nvfp4'"),
    ],
)
def test_bad_texts_say_what_is_wrong(text, message):
    with pytest.raises(SchemeError) as e:
        QuantScheme.parse(text)
    assert message in str(e.value)


def test_parse_takes_a_str():
    with pytest.raises(TypeError):
        QuantScheme.parse(b"nvfp4")  # type: ignore[arg-type]


# -- round trips over every valid scheme ----------------------------------------------------------
stores = st.one_of(
    st.just(QuantStore.Native),
    st.integers(0, 20).map(QuantStore.packed_u32),
    st.integers(0, 20).map(QuantStore.packed_native),
)
block_sizes = st.lists(st.integers(1, 300), min_size=1, max_size=5)


f32s = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def codebooks(draw, n):
    named = [v for v in bq.codebooks.NAMED.values() if len(v) == n]
    if named and draw(st.booleans()):
        return draw(st.sampled_from(named))
    return draw(st.lists(f32s, min_size=n, max_size=n, unique_by=lambda v: v + 0.0))


@st.composite
def schemes(draw):
    s = QuantScheme(draw(st.sampled_from([v for v in QuantValue if not v.is_unsigned])), draw(stores))
    if draw(st.sampled_from(QuantMode)) is QuantMode.Lookup:
        value = draw(st.sampled_from([QuantValue.Q4F, QuantValue.Q4S, QuantValue.Q2F,
                                      QuantValue.Q2S]))
        s = s.with_value(value).with_codebook(draw(codebooks(1 << value.bits)))
    level = draw(st.sampled_from(["none", "tensor", "block", "two"]))
    if level == "tensor":
        s = s.per_tensor(draw(st.sampled_from(ScaleDtype)))
    elif level == "block":
        s = s.per_block(draw(block_sizes), draw(st.sampled_from(ScaleDtype)))
    elif level == "two":
        s = s.per_block(draw(block_sizes), draw(st.sampled_from([ScaleDtype.F16, ScaleDtype.UE4M3])))
        s = s.per_tensor(ScaleDtype.F32)
    return s


@settings(max_examples=400, deadline=None)
@given(schemes())
def test_parse_inverts_str(s):
    text = str(s)
    assert QuantScheme.parse(text) == s
    assert str(QuantScheme.parse(text)) == text


TOKENS = [
    "q8f", "q4s", "e2m1", "e4m3", "/", "native", "packed_u32_", "packed_native", "0", "1", "7",
    "32", "x", "block", "tensor", ":", "f16", "f32", "ue4m3", "ue8m0", "bf16", "+", "lookup", "_",
    "lookup:nf4", "lookup:iq4nl", "q2s", "[", "]", ",", "1.0", "-0.5", "0.0", "1e-08", "1.50",
]


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=12).map("".join))
def test_only_canonical_texts_parse(text):
    """Whatever parses prints back as the very same text: one spelling per scheme."""
    try:
        s = QuantScheme.parse(text)
    except SchemeError as e:
        assert repr(text) in str(e)
        return
    assert str(s) == text


@pytest.mark.parametrize("text", [
    "q8s/native/block" + "9" * 4301 + ":f16",  # past Python's int() digit limit
    "q2s/packed_u32_" + "9" * 4301 + "/block32:f16",
    "q8s/native/block" + "9" * 21 + ":f16",  # past any u64, within that limit
    "q8s/packed_native" + "1" * 25 + "/block32:f16",
    "q8s/native/block32:f16" + "/" * 2000,
])
def test_numbers_and_texts_too_long_for_a_scheme_are_scheme_errors(text):
    with pytest.raises(SchemeError) as e:
        QuantScheme.parse(text)
    assert len(str(e.value)) < 400  # quotes a part, not the whole text twice


def test_the_longest_real_scheme_texts_still_parse():
    # 16 distinct float32 entries, each written as its longest shortest text (9 digits, an
    # exponent)
    entries = np.float32(-1.2345679e-30) * np.arange(1, 17, dtype=np.float32)
    book = "[" + ",".join(str(v) for v in entries) + "]"
    text = f"q4f/packed_u32_0/block16x16x16x16x16:ue4m3+tensor:f32/lookup:{book}"
    assert str(QuantScheme.parse(text)) == text
