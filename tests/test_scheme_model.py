"""The scheme is modelled once, in the core: the Python classes are its face, and the oracle
(``blockquant.reference``) keeps facts of its own that are checked against the core's."""

import ast
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blockquant as bq
from blockquant import QuantScheme, QuantValue, ScaleDtype, SchemeError, _native
from blockquant import _reference_common as oracle
from blockquant import reference as ref
from blockquant._legacy_packing import format1_storage

PACKAGE = Path(bq.__file__).resolve().parent

TEXTS = [
    "q4s/packed_native0/block32:f16",
    "e4m3/native/block32x32:ue8m0",
    "e2m1/packed_native0/block16:ue4m3+tensor:f32",
    "q8f/packed_u32_0/tensor",
    "q2f/packed_u32_3/block1:bf16",
    "e5m2/packed_native12/block2x3x4x5x6:f32",
    "q4s/packed_u32_0/block16:ue4m3+tensor:f32/lookup:iq4nl",
    "q2f/native/tensor/lookup:[1e-08,-1e+30,0.1,3.4028235e+38]",
]


@pytest.mark.parametrize("text", TEXTS + [str(make()) for make in bq.presets.PRESETS.values()])
def test_texts_round_trip_through_the_core(text):
    core = _native.parse_scheme(text)
    assert str(core) == text
    s = QuantScheme.parse(text)
    assert str(s) == text and s._handle == core
    assert repr(s) == repr(core)


def test_the_value_facts_are_the_cores():
    # One row per member, in the enums' order: the core's lists are the enums.
    assert [i.name for i in _native.value_info()] == [v.value for v in QuantValue]
    assert [i.name for i in _native.scale_info()] == [d.value for d in ScaleDtype]


@pytest.mark.parametrize("value", [v for v in QuantValue if not v.is_unsigned])
def test_the_oracle_agrees_with_the_core_on_each_value(value):
    assert (value.bits, value.qmin, value.qmax, value.is_float) == oracle.VALUE_FACTS[value]


@pytest.mark.parametrize("dtype", list(ScaleDtype))
def test_the_oracle_agrees_with_the_core_on_each_scale_dtype(dtype):
    facts = (dtype.nbytes, dtype.max, dtype.smallest, dtype.has_zero)
    assert facts == oracle.SCALE_FACTS[dtype]
    # The oracle's own rounding agrees with those bounds: the max is held, above it saturates,
    # and the smallest value is the least the dtype rounds a tiny scale up to.
    top = np.float32(dtype.max)
    assert ref.round_scale([top], dtype, "nearest")[0] == top
    assert ref.round_scale([np.float32(1e-45)], dtype, "up")[0] == np.float32(dtype.smallest)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=4,
                max_size=4, unique_by=lambda v: v + 0.0))
def test_codebook_entries_print_as_numpy_writes_a_float32(values):
    s = QuantScheme(QuantValue.Q2S).with_codebook(values)
    assert QuantScheme.parse(str(s)) == s  # the text is the core's, whatever numpy is installed
    if np.lib.NumpyVersion(np.__version__) < "2.0.0":
        return  # numpy 1.x writes a float32 by other rules (1e6 as 1000000.0): 2.x's are the text
    want = "[" + ",".join(str(np.float32(v)) for v in values) + "]"
    if bq.codebooks.name_of(tuple(values)) is None:
        assert str(s).endswith(f"/lookup:{want}")
        assert f"codebook={want}" in repr(s)


@pytest.mark.parametrize("part", ["é", "\xa0", "\u200b", "\x00", "'", "'\"", "\\", "\ud800"])
def test_messages_quote_texts_as_python_repr_does(part):
    text = f"q4s/{part}/tensor"
    with pytest.raises(SchemeError) as e:
        QuantScheme.parse(text)
    if part == "\ud800":  # no UTF-8 form: the core sees U+FFFD, and still says what is wrong
        assert str(e.value).startswith("unknown store '\ufffd' in 'q4s/\ufffd/tensor'")
        return
    assert str(e.value).startswith(f"unknown store {part!r} in {text!r}: expected native")


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports (relative imports resolved within the package)."""
    names = set()
    package = "blockquant." + ".".join(path.relative_to(PACKAGE).parent.parts)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.rstrip(".").split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def test_no_production_module_imports_the_oracle():
    oracle_modules = {"blockquant.reference"} | {
        f"blockquant.{p.stem}" for p in PACKAGE.glob("_reference*.py")
    }
    for path in PACKAGE.rglob("*.py"):
        if path.stem == "reference" or path.stem.startswith("_reference"):
            continue
        if path == PACKAGE / "__init__.py":  # `blockquant.reference`, loaded on first use
            continue
        assert not _imports(path) & oracle_modules, path


def test_the_oracle_takes_nothing_from_the_core():
    for path in [PACKAGE / "reference.py", *PACKAGE.glob("_reference*.py")]:
        assert not {"blockquant._native", "blockquant._core"} & _imports(path), path


def _old_pack(fields, axis, per, bits, word_dtype):
    """Format 1's packing: ``per`` fields a word along ``axis`` in place, the first lowest."""
    f = np.moveaxis(fields.astype(np.uint64), axis, -1)
    n = f.shape[-1]
    f = np.pad(f, [(0, 0)] * (f.ndim - 1) + [(0, -n % per)])
    f = f.reshape(f.shape[:-1] + (f.shape[-1] // per, per))
    words = np.bitwise_or.reduce(f << (np.arange(per, dtype=np.uint64) * np.uint64(bits)), -1)
    return np.ascontiguousarray(np.moveaxis(words.astype(word_dtype), -1, axis))


@pytest.mark.parametrize("text", [
    "q4s/packed_native0/tensor", "q2f/packed_native1/block4:f16", "q4f/packed_u32_1/tensor",
    "e2m1/packed_native2/block2:ue8m0", "q2s/packed_u32_2/tensor", "q8s/packed_native1/tensor",
])
def test_format1_storage_is_the_oracles_storage(text):
    """The format-1 reader's repacking (production) against the oracle's packing of the same
    codes."""
    s = QuantScheme.parse(text)
    shape = (3, 5, 7)
    rng = np.random.default_rng(0)
    fields = rng.integers(0, 1 << s.value.bits, size=shape)
    axis = len(shape) - 1 - s.store.dim
    word_bits = 32 if s.store.kind == "packed_u32" else 8
    old = _old_pack(fields, axis, word_bits // s.value.bits, s.value.bits,
                    np.uint32 if word_bits == 32 else np.uint8)
    got = format1_storage(old, s, shape)
    assert got.dtype == old.dtype
    np.testing.assert_array_equal(got, ref._store(fields, s))
