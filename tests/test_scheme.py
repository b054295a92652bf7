"""The scheme model (format.md "The scheme"): values, builders, validity rules, presets."""

import dataclasses

import pytest

import blockquant as bq
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype, SchemeError


def test_default_is_burns_default():
    s = QuantScheme()
    assert s.value is QuantValue.Q8F
    assert s.store == QuantStore.packed_u32(0)
    assert s.mode is bq.QuantMode.Symmetric
    assert s.tensor is None and s.block is None
    assert s.scale_dtype is ScaleDtype.F32
    assert not s.is_two_level


def test_schemes_are_immutable_hashable_values():
    a = QuantScheme().with_value(QuantValue.Q4S).per_block([1, 32], ScaleDtype.F16)
    b = QuantScheme().with_value(QuantValue.Q4S).per_block([32], ScaleDtype.F16)
    assert a == b and hash(a) == hash(b)
    assert len({a, b, QuantScheme()}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.value = QuantValue.Q8S  # type: ignore[misc]
    assert a.block.size == (32,)


def test_hash_follows_equality_through_copies_and_options():
    """The hash is worked out once, at construction: schemes equal after any way of making them
    (a copy, a pickle, a preset's options that equality ignores, the text form) hash equal, and
    ones that differ in any identity field differ as dict keys."""
    import copy
    import pickle

    s = bq.presets.nvfp4()
    same = [copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s)), dataclasses.replace(s),
            QuantScheme.parse(str(s)), dataclasses.replace(s, options=bq.presets.nf4_block16().options)]
    for t in same:
        assert t == s and hash(t) == hash(s)
    others = [s.with_value(QuantValue.Q4S), s.with_store(QuantStore.Native),
              s.per_block([32], ScaleDtype.UE4M3),
              bq.presets.nf4_block16(), bq.presets.int4_block16()]
    keys = {s: 0, **{o: i + 1 for i, o in enumerate(others)}}
    assert len(keys) == len(others) + 1 and all(keys[t] == 0 for t in same)


def test_builders_return_new_schemes():
    s = QuantScheme()
    t = s.with_store(QuantStore.Native)
    assert s.store == QuantStore.packed_u32(0) and t.store is QuantStore.Native
    with pytest.raises(SchemeError, match="needs a codebook"):
        s.with_mode(bq.QuantMode.Lookup)
    q4 = s.with_value(QuantValue.Q4F)
    lk = q4.with_codebook(bq.codebooks.NF4)
    assert lk.mode is bq.QuantMode.Lookup and lk.codebook == tuple(bq.codebooks.NF4.tolist())
    assert lk.with_mode(bq.QuantMode.Lookup) == lk  # keeps its codebook
    assert lk.with_mode(bq.QuantMode.Symmetric) == q4  # drops it
    assert lk.with_mode(bq.QuantMode.Symmetric).codebook is None


def test_repr_is_readable():
    s = bq.presets.nvfp4()
    assert repr(s) == (
        "QuantScheme(value=E2M1, store=PackedNative(0), block=BlockScale([16], UE4M3), tensor=F32)"
    )
    assert repr(QuantScheme()) == "QuantScheme(value=Q8F, store=PackedU32(0))"


@pytest.mark.parametrize(
    "size, match",
    [
        ([], "1 to 5 dimensions"),
        ([0], "positive"),
        ([4, -1], "positive"),
        ([2, 2, 2, 2, 2, 2], "1 to 5 dimensions"),
    ],
)
def test_bad_block_sizes(size, match):
    with pytest.raises(SchemeError, match=match):
        QuantScheme().per_block(size, ScaleDtype.F32)


def test_block_size_types():
    with pytest.raises(TypeError):
        QuantScheme().per_block([2.5], ScaleDtype.F32)
    with pytest.raises(TypeError):
        QuantScheme().per_block([32], "F16")
    assert QuantScheme().per_block([1, 1, 2, 2, 2, 2, 2], ScaleDtype.F32).block.size == (2,) * 5


def test_two_level_global_must_be_f32():
    s = QuantScheme().per_block([16], ScaleDtype.UE4M3)
    with pytest.raises(SchemeError, match="a two-level scheme stores its per-tensor scale as f32, got"):
        s.per_tensor(ScaleDtype.F16)


@pytest.mark.parametrize("dtype", [ScaleDtype.F32, ScaleDtype.BF16, ScaleDtype.UE8M0])
def test_two_level_block_dtype_must_be_narrow(dtype):
    with pytest.raises(SchemeError, match="F16 or UE4M3"):
        QuantScheme().per_tensor(ScaleDtype.F32).per_block([16], dtype)


def test_store_rules():
    with pytest.raises(SchemeError):
        QuantStore.packed_u32(-1)
    with pytest.raises(TypeError):
        QuantStore.packed_native(1.0)
    assert repr(QuantStore.packed_native(2)) == "PackedNative(2)"
    assert repr(QuantStore.Native) == "Native"


def test_value_and_dtype_facts():
    assert [v.bits for v in QuantValue] == [8, 8, 4, 4, 2, 2, 8, 8, 4, 8, 4, 2]
    assert (QuantValue.Q2F.qmin, QuantValue.Q2F.qmax) == (-2, 1)
    assert QuantValue.E5M2.qmax == 57344
    assert [d.nbytes for d in ScaleDtype] == [4, 2, 2, 1, 1]
    assert ScaleDtype.UE8M0.smallest == 2.0**-127 and not ScaleDtype.UE8M0.has_zero


@pytest.mark.parametrize("name", list(bq.presets.PRESETS))
def test_presets_are_valid_schemes(name):
    s = bq.presets.PRESETS[name]()
    assert isinstance(s, QuantScheme)
    assert s == bq.presets.PRESETS[name]()


def test_preset_contents():
    p = bq.presets
    assert p.int8() == QuantScheme(QuantValue.Q8S, QuantStore.Native, tensor=ScaleDtype.F32)
    assert p.mxfp4().block == bq.BlockScale([32], ScaleDtype.UE8M0)
    assert p.nvfp4().is_two_level
    assert p.bitnet().store == QuantStore.packed_u32(0) and p.CALIBRATION["bitnet"] == "absmean"
