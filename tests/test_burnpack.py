"""burn-pack (.bpk) files: round trips, burn's exact bytes, atomic writes, and corrupt files.

The files under tests/burn_interop/samples/ were written by burn 0.22.1's own burn-pack
``Writer`` (``burn-interop-checker --write-samples``); they pin the container byte for byte
without needing burn here. tests/test_burn_interop.py runs burn itself on what we write.
"""

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import blockquant as bq
from blockquant import BlockScale, QuantScheme, QuantStore, QuantValue, ScaleDtype
from blockquant.burnpack import (
    ALIGNMENT,
    BURN_BLOCK_MAX,
    MAX_CBOR_DEPTH,
    decode_cbor,
    encode_cbor,
    load_burnpack,
    load_burnpack_metadata,
    save_burnpack,
    scheme_from_burn,
    scheme_to_burn,
)

SAMPLES = Path(__file__).parent / "burn_interop" / "samples"

V, D = QuantValue, ScaleDtype
STORES = [
    QuantStore.Native,
    QuantStore.packed_u32(0),
    QuantStore.packed_u32(1),
    QuantStore.packed_native(0),
    QuantStore.packed_native(1),
]
LEVELS = {
    "none": lambda s: s,
    **{f"tensor_{d.value}": lambda s, d=d: s.per_tensor(d) for d in D},
    **{f"block5_{d.value}": lambda s, d=d: s.per_block([5], d) for d in D},
    "block2x3_f16": lambda s: s.per_block([2, 3], D.F16),
    "block1_f32": lambda s: s.per_block([1], D.F32),
    "two_level_ue4m3": lambda s: s.per_block([4], D.UE4M3).per_tensor(D.F32),
    "two_level_2x3_f16": lambda s: s.per_block([2, 3], D.F16).per_tensor(D.F32),
}


def same_qtensor(a, b):
    assert isinstance(b, bq.QTensor)
    assert a.scheme == b.scheme and a.shape == b.shape
    assert a.to_bytes() == b.to_bytes()
    np.testing.assert_array_equal(a.dequantize().view(np.uint32), b.dequantize().view(np.uint32))


# -- round trips -----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [v for v in V if not v.is_unsigned], ids=str)
def test_every_store_and_level_round_trips(tmp_path, rng, value):
    x = (rng.standard_normal((5, 12)) * 3).astype(np.float32)
    x[:2, :5] = 0  # an all-zero block: a zero scale
    tensors = {}
    for store in STORES:
        for name, level in LEVELS.items():
            scheme = level(QuantScheme(value, store))
            tensors[f"{store}/{name}"] = bq.quantize(x, scheme)
    path = tmp_path / "all.bpk"
    save_burnpack(path, tensors)
    loaded = load_burnpack(path)
    assert list(loaded) == sorted(tensors)
    for name, qt in tensors.items():
        same_qtensor(qt, loaded[name])


@pytest.mark.parametrize(
    "shape, scheme",
    [
        ((), QuantScheme(V.Q8S, QuantStore.Native)),
        ((), QuantScheme(V.Q4S).per_block([4], D.F16)),
        ((0, 4), QuantScheme(V.Q4F).per_block([2], D.F16)),
        ((0, 4), QuantScheme(V.E2M1, QuantStore.packed_native(0)).per_tensor(D.F32)),
        ((7,), QuantScheme(V.Q2S).per_block([3], D.UE8M0)),
        ((3, 5, 7), QuantScheme(V.E4M3, QuantStore.packed_u32(2)).per_block([2, 2, 3], D.BF16)),
        ((2, 3, 4, 5, 6), QuantScheme(V.Q8F).per_block([2, 1, 3, 2, 4], D.UE4M3)),
        ((4, 300), QuantScheme(V.Q8S, QuantStore.Native).per_block([255], D.F16)),
    ],
    ids=str,
)
def test_shapes_round_trip(tmp_path, rng, shape, scheme):
    x = rng.standard_normal(shape).astype(np.float32)
    qt = bq.quantize(x, scheme)
    save_burnpack(tmp_path / "t.bpk", {"t": qt})
    same_qtensor(qt, load_burnpack(tmp_path / "t.bpk")["t"])


@pytest.mark.parametrize("name", list(bq.presets.PRESETS))
def test_presets_round_trip(tmp_path, rng, name):
    qt = bq.quantize(rng.standard_normal((4, 64)).astype(np.float32), bq.presets.PRESETS[name]())
    if qt.scheme.codebook is not None:  # burn's Burnpack has no place for a codebook
        with pytest.raises(bq.SchemeError, match="no place for a Lookup"):
            save_burnpack(tmp_path / "p.bpk", {name: qt})
        return
    if qt.scheme.offset is not None:  # burn has no affine values
        with pytest.raises(bq.SchemeError, match="no affine values"):
            save_burnpack(tmp_path / "p.bpk", {name: qt})
        return
    if max(qt.scheme.block_size or (1,)) > BURN_BLOCK_MAX:  # int8_per_channel's one-row blocks
        with pytest.raises(bq.SchemeError, match=r"block dims as u8 \(at most 255\)"):
            save_burnpack(tmp_path / "p.bpk", {name: qt})
        return
    save_burnpack(tmp_path / "p.bpk", {name: qt})
    same_qtensor(qt, load_burnpack(tmp_path / "p.bpk")[name])


PLAIN = ["float64", "float32", "float16", "int64", "int32", "int16", "int8",
         "uint64", "uint32", "uint16", "uint8", "bool"]  # fmt: skip
BURN_NAMES = ["F64", "F32", "F16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8",
              {"Bool": "Native"}]  # fmt: skip


@pytest.mark.parametrize("dtype, burn_name", list(zip(PLAIN, BURN_NAMES)), ids=PLAIN)
def test_plain_dtypes_round_trip(tmp_path, rng, dtype, burn_name):
    x = (rng.standard_normal((3, 4)) * 100).astype(dtype)
    tensors = {
        "x": x,
        "strided": x[::2, ::-1],
        "big_endian": x.astype(np.dtype(dtype).newbyteorder(">")),
        "scalar": x[0, 0],
        "empty": x[:0],
    }
    save_burnpack(tmp_path / "p.bpk", tensors)
    loaded = load_burnpack(tmp_path / "p.bpk")
    for name, a in tensors.items():
        b = loaded[name]
        assert b.dtype == np.dtype(dtype) and b.dtype.isnative and b.shape == np.shape(a)
        np.testing.assert_array_equal(b, a)
    descriptors = read_meta(tmp_path / "p.bpk")["tensors"]
    assert descriptors["x"]["dtype"] == burn_name
    assert descriptors["scalar"]["shape"] == []


def test_bfloat16_round_trips(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([[1.5, -2.0], [3.25, 1e30]], dtype=ml_dtypes.bfloat16)
    save_burnpack(tmp_path / "b.bpk", {"x": x})
    y = load_burnpack(tmp_path / "b.bpk")["x"]
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))
    assert read_meta(tmp_path / "b.bpk")["tensors"]["x"]["dtype"] == "BF16"


def test_unsupported_arguments_raise_before_writing(tmp_path):
    path = tmp_path / "x.bpk"
    with pytest.raises(TypeError, match="no dtype"):
        save_burnpack(path, {"c": np.zeros(3, np.complex64)})
    with pytest.raises(TypeError, match="QTensor or a numpy array"):
        save_burnpack(path, {"l": [1.0, 2.0]})
    with pytest.raises(TypeError, match="names are str"):
        save_burnpack(path, {1: np.zeros(3)})
    with pytest.raises(TypeError, match="str to str"):
        save_burnpack(path, {"a": np.zeros(3)}, metadata={"k": 1})
    wide = bq.quantize(np.ones(600, np.float32), QuantScheme(V.Q8S).per_block([300], D.F16))
    with pytest.raises(bq.SchemeError, match="u8"):
        save_burnpack(path, {"w": wide})
    assert list(tmp_path.iterdir()) == []


def test_metadata_round_trips(tmp_path):
    meta = {"zeta": "last", "alpha": "first", "unicode": "ünï ✓"}
    save_burnpack(tmp_path / "m.bpk", {"x": np.zeros(2, np.float32)}, metadata=meta)
    assert load_burnpack_metadata(tmp_path / "m.bpk") == meta
    assert list(read_meta(tmp_path / "m.bpk")["metadata"]) == sorted(meta)  # BTreeMap order
    save_burnpack(tmp_path / "n.bpk", {"x": np.zeros(2, np.float32)})
    assert "metadata" not in read_meta(tmp_path / "n.bpk")  # skipped when empty, as burn does


def test_tensor_data_is_256_aligned_in_input_order(tmp_path):
    tensors = {"z": np.zeros(3, np.uint8), "a": np.zeros(300, np.uint8), "m": np.zeros(0, np.uint8)}
    save_burnpack(tmp_path / "o.bpk", tensors)
    d = read_meta(tmp_path / "o.bpk")["tensors"]
    assert list(d) == ["a", "m", "z"]
    assert [d[n]["data_offsets"] for n in ("z", "a", "m")] == [[0, 3], [256, 556], [768, 768]]
    size = (tmp_path / "o.bpk").stat().st_size
    start = data_start(tmp_path / "o.bpk")
    assert start % ALIGNMENT == 0 and size == start + 768


# -- burn's own files ----------------------------------------------------------------------------
def sample_tensors():
    """What ``burn-interop-checker --write-samples`` writes, built with blockquant."""
    q8f = QuantScheme(V.Q8F, QuantStore.Native).per_block([4], D.UE4M3).per_tensor(D.F32)
    no_level = QuantScheme(V.Q8S, QuantStore.Native)
    return {
        "w_two_level": bq.QTensor.from_parts(
            np.array([0, 25, 51, 76, 102, 127, -128, -1], np.int8),
            [0.5, 0.125],
            q8f,
            (8,),
            global_scale=3.0,
        ),
        "b_f32": (np.arange(6, dtype=np.float32) * 0.5 - 1).reshape(2, 3),
        "q_no_level": bq.QTensor.from_parts(
            np.array([[0, 25, -51], [127, -127, 1]], np.int8), [0.25], no_level, (2, 3)
        ),
        "i_i64": np.array([-3, 0, 7, 2**63 - 1], np.int64),
        "m_bool": np.array([True, False, True]),
        "q_f16": bq.QTensor.from_parts(
            np.array([1, -2, 3], np.int8), [0.5], no_level.per_tensor(D.F16), (3,)
        ),
        "q_block_2d": bq.QTensor.from_parts(
            np.arange(12, dtype=np.int8).reshape(3, 4),
            [[1.0, 2.0], [0.5, 4.0]],
            no_level.per_block([2, 2], D.BF16),
            (3, 4),
        ),
        "u_u8": np.array([0, 255, 9], np.uint8),
        "e_empty": np.zeros((0, 2), np.float32),
    }


SAMPLE_META = {"producer": "burn 0.22.1", "format": "sample"}


def test_writes_the_bytes_burn_writes(tmp_path):
    save_burnpack(tmp_path / "s.bpk", sample_tensors(), metadata=SAMPLE_META)
    assert (tmp_path / "s.bpk").read_bytes() == (SAMPLES / "sample.bpk").read_bytes()


@pytest.mark.parametrize("sample", ["sample.bpk", "sample_extras.bpk"])
def test_reads_the_files_burn_writes(sample):
    loaded = load_burnpack(SAMPLES / sample)
    expected = sample_tensors()
    assert list(loaded) == sorted(expected)
    for name, want in expected.items():
        got = loaded[name]
        if isinstance(want, bq.QTensor):
            same_qtensor(want, got)
        else:
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    assert load_burnpack_metadata(SAMPLES / sample)["producer"] == "burn 0.22.1"


def test_the_spec_example_is_burns_bytes():
    two_level = sample_tensors()["w_two_level"]
    assert two_level.to_bytes().hex(" ") == "00 19 33 4c 66 7f 80 ff 30 20 00 00 40 40"


BURN_0_23_BYTES = SAMPLES / "quantized_bytes_0.23.jsonl"
FLOAT_CODES = {V.E4M3: "float8_e4m3fn", V.E5M2: "float8_e5m2", V.E2M1: "float4_e2m1fn"}


def burn_0_23_probes():
    return [json.loads(line) for line in BURN_0_23_BYTES.read_text().splitlines()]


@pytest.mark.parametrize("probe", burn_0_23_probes(), ids=lambda p: p["name"])
def test_to_bytes_is_burn_0_23s_quantized_bytes(probe):
    """samples/quantized_bytes_0.23.jsonl: what burn 0.23.0-pre.1's ``TensorData::quantized``
    writes for given codes and scales (tests/burn_interop/bytes-0.23). Quantizing
    ``decode(code) * scale`` against those scales gives back the codes, so ``to_bytes`` must
    give back burn's bytes; the scheme's CBOR must be burn's too."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dtype_cbor = bytes.fromhex(probe["dtype_cbor"])
    scheme = scheme_from_burn(decode_cbor(dtype_cbor)["QFloat"])
    assert encode_cbor({"QFloat": scheme_to_burn(scheme)}) == dtype_cbor
    shape = tuple(probe["shape"])
    codes = np.array(probe["codes"], np.int64).reshape(shape)
    if scheme.value.is_float:
        dt = getattr(ml_dtypes, FLOAT_CODES[scheme.value])
        decoded = (codes & 0xFF).astype(np.uint8).view(dt).astype(np.float32)
    else:
        decoded = codes.astype(np.float32)
    grid = np.array(probe["scales"], np.float32).reshape(scheme.layout(shape).scale_grid)
    g = probe["global"]
    if scheme.block is None:
        scale = np.full(shape, grid.reshape(-1)[0], np.float32)
    else:
        block = (1,) * (len(shape) - len(scheme.block.size)) + scheme.block.size
        scale = grid[tuple(i // b for i, b in zip(np.indices(shape), block))]
        scale = scale * np.float32(1 if g is None else g)
    options = {} if g is None else {"global_scale": g}
    qt = bq.quantize(decoded * scale, scheme, scales=grid, **options)
    assert qt.to_bytes().hex() == probe["hex"]


# -- schemes ---------------------------------------------------------------------------------------
def test_nvfp4_is_burns_scheme():
    assert scheme_to_burn(bq.presets.nvfp4()) == {
        "value": "E2M1",
        "store": {"PackedNative": 0},
        "mode": "Symmetric",
        "tensor": "F32",
        "block": {"size": {"storage": [16, 1, 1, 1, 1], "len": 1}, "dtype": "UE4M3"},
    }


def test_no_level_is_not_an_explicit_f32_tensor_level():
    implicit = scheme_to_burn(QuantScheme(V.Q8S, QuantStore.Native))
    explicit = scheme_to_burn(QuantScheme(V.Q8S, QuantStore.Native).per_tensor(D.F32))
    assert implicit == {
        "value": "Q8S", "store": "Native", "mode": "Symmetric", "tensor": None, "block": None
    }  # fmt: skip
    assert explicit["tensor"] == "F32" and explicit["block"] is None
    assert scheme_from_burn(implicit).tensor is None
    assert scheme_from_burn(explicit).tensor is D.F32


@pytest.mark.parametrize(
    "size, storage, n",
    [([32], [32, 1, 1, 1, 1], 1), ([2, 4], [2, 4, 1, 1, 1], 2), ([1, 32], [32, 1, 1, 1, 1], 1),
     ([1], [1, 1, 1, 1, 1], 0), ([1, 1], [1, 1, 1, 1, 1], 0), ([3, 1, 2, 1, 5], [3, 1, 2, 1, 5], 5),
     ([255], [255, 1, 1, 1, 1], 1)],
)  # fmt: skip
def test_block_sizes_are_burns_canonical_u8_array(size, storage, n):
    scheme = QuantScheme().per_block(size, D.F16)
    assert scheme_to_burn(scheme)["block"]["size"] == {"storage": storage, "len": n}
    assert scheme_from_burn(scheme_to_burn(scheme)) == scheme


def test_every_scheme_maps_back_exactly():
    for value in [v for v in V if not v.is_unsigned]:
        for store in STORES + [QuantStore.packed_u32(4), QuantStore.packed_native(3)]:
            for level in LEVELS.values():
                s = level(QuantScheme(value, store))
                assert scheme_from_burn(decode_cbor(encode_cbor(scheme_to_burn(s)))) == s
                if value.bits == 4 and not value.is_float:  # burn has no field for a codebook
                    with pytest.raises(bq.SchemeError, match="no place for a Lookup"):
                        scheme_to_burn(s.with_codebook(bq.codebooks.IQ4_NL))


def test_a_leading_one_written_by_hand_reads_as_the_canonical_block():
    raw = scheme_to_burn(QuantScheme().per_block([32], D.F16))
    raw["block"]["size"] = {"storage": [1, 32, 1, 1, 1], "len": 2}
    assert scheme_from_burn(raw).block == BlockScale([32], D.F16)


# -- CBOR ------------------------------------------------------------------------------------------
def test_cbor_encodes_as_ciborium():
    assert encode_cbor({"a": [0, 23, 24, 255, 256, -1, -25]}).hex() == (
        "a16161870017181818ff190100203818"
    )
    assert encode_cbor([None, True, False, "é", b"\x01"]).hex() == "85f6f5f462c3a94101"
    assert encode_cbor(2**64 - 1).hex() == "1bffffffffffffffff"
    with pytest.raises(ValueError):
        encode_cbor(2**64)


def test_cbor_round_trips():
    obj = {"t": {"x": [1, -(2**64), 2**64 - 1, "s", None, True, 1.5, b"raw"]}, "n": {}, "l": []}
    assert decode_cbor(encode_cbor(obj)) == obj


def test_cbor_reads_every_float_width():
    assert decode_cbor(bytes.fromhex("f93e00")) == 1.5
    assert decode_cbor(bytes.fromhex("fa3fc00000")) == 1.5
    assert decode_cbor(bytes.fromhex("fb3ff8000000000000")) == 1.5


@pytest.mark.parametrize(
    "hexdata, message",
    [
        ("", "0 left"),
        ("9f01ff", "indefinite"),
        ("bf6161ff", "indefinite"),
        ("5f4101ff", "indefinite"),
        ("c001", "tag"),
        ("f7", "simple value 23"),
        ("ff", "break"),
        ("1c", "reserved"),
        ("1b00000001", "8 bytes declared"),
        ("9b7fffffffffffffff", "bytes declared"),
        ("7affffffff", "bytes declared"),
        ("bb000000ffffffffff", "overruns"),
        ("a2616101616102", "duplicate map key 'a'"),
        ("a1f501", "not text or an integer"),
        ("a1810101", "not text or an integer"),
        ("62c328", "not UTF-8"),
        ("0000", "1 bytes after"),
        ("81" * MAX_CBOR_DEPTH + "00", "deeper"),
    ],
)
def test_cbor_rejects(hexdata, message):
    with pytest.raises(bq.LayoutError, match=message):
        decode_cbor(bytes.fromhex(hexdata))


def test_cbor_nesting_up_to_the_limit_is_fine():
    assert decode_cbor(bytes.fromhex("81" * (MAX_CBOR_DEPTH - 1) + "00")) is not None


# -- atomic writes ---------------------------------------------------------------------------------
def test_a_save_leaves_only_the_file(tmp_path):
    save_burnpack(tmp_path / "a.bpk", {"x": np.ones(3, np.float32)})
    with pytest.raises(FileExistsError):  # the default refuses, as quantize_file does
        save_burnpack(tmp_path / "a.bpk", {"y": np.ones(4, np.float32)})
    assert list(load_burnpack(tmp_path / "a.bpk")) == ["x"]
    save_burnpack(tmp_path / "a.bpk", {"y": np.ones(4, np.float32)}, force=True)  # replaces
    assert [p.name for p in tmp_path.iterdir()] == ["a.bpk"]
    assert list(load_burnpack(tmp_path / "a.bpk")) == ["y"]


@pytest.mark.parametrize("fail_in", ["fsync", "replace", "write"])
def test_a_failed_save_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch, fail_in):
    path = tmp_path / "a.bpk"
    save_burnpack(path, {"old": np.ones(3, np.float32)})
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if fail_in == "write":
        # The second tensor's bytes cannot be produced: found half-way through the file.
        from blockquant.burnpack import _Entry

        data = _Entry.data
        monkeypatch.setattr(_Entry, "data", lambda e: boom() if e.name == "z" else data(e))
    else:
        monkeypatch.setattr(f"blockquant.burnpack.os.{fail_in}", boom)
    with pytest.raises(OSError, match="No space"):
        save_burnpack(path, {"new": np.ones(5, np.float32), "z": np.ones(2, np.float32)},
                      force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["a.bpk"]
    assert path.read_bytes() == before


# -- corrupt files ---------------------------------------------------------------------------------
def read_meta(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack_from("<I", raw, 6)
    return decode_cbor(raw[10 : 10 + n])


def data_start(path):
    (n,) = struct.unpack_from("<I", Path(path).read_bytes(), 6)
    return -(-(10 + n) // ALIGNMENT) * ALIGNMENT


def build(meta, data=b"", *, header=None, pad=True):
    """A burn-pack file from a metadata object (CBOR-encoded here) and the data section."""
    blob = meta if isinstance(meta, bytes) else encode_cbor(meta)
    head = header if header is not None else struct.pack("<IHI", 0x4255524E, 1, len(blob))
    raw = head + blob
    if pad:
        raw += bytes(-len(raw) % ALIGNMENT)
    return raw + data


Q8 = {"QFloat": scheme_to_burn(QuantScheme(V.Q8S, QuantStore.Native))}


def tensor(dtype="F32", shape=(2,), offsets=(0, 8), **extra):
    return {"dtype": dtype, "shape": shape and list(shape), "data_offsets": list(offsets), **extra}


def one(desc, data=bytes(8)):
    return build({"tensors": {"t": desc}}, data)


def with_scheme(**change):
    raw = scheme_to_burn(QuantScheme(V.Q8S, QuantStore.Native).per_block([2], D.F16))
    raw.update(change)
    return one(tensor({"QFloat": raw}, (4,), (0, 8)), bytes(8))


def nested(depth):
    return bytes.fromhex("81" * depth + "00")


VALID = one(tensor())
CORRUPT = {
    "empty file": b"",
    "truncated header": VALID[:7],
    "bad magic": b"NRUC" + VALID[4:],
    "bad version 2": VALID[:4] + b"\x02\x00" + VALID[6:],
    "bad version 0": VALID[:4] + b"\x00\x00" + VALID[6:],
    "metadata length past EOF": VALID[:6] + struct.pack("<I", len(VALID)) + VALID[10:],
    "metadata length over 100 MiB": VALID[:6] + struct.pack("<I", 0xFFFFFFFF) + VALID[10:],
    "metadata not CBOR": build(b"\xff\xff\xff"),
    "metadata with trailing bytes": build(encode_cbor({"tensors": {}}) + b"\x00"),
    "metadata not a map": build([1, 2]),
    "no tensors key": build({"metadata": {}}),
    "tensors not a map": build({"tensors": [1]}),
    "non-text tensor name": build({"tensors": {7: tensor()}}, bytes(8)),
    "non-text top-level key": build({"tensors": {}, 3: 1}),
    "duplicate tensor name": build(
        bytes.fromhex("a1")
        + encode_cbor("tensors")
        + bytes.fromhex("a2")
        + encode_cbor("t")
        + encode_cbor(tensor())
        + encode_cbor("t")
        + encode_cbor(tensor()),
        bytes(8),
    ),
    "deep CBOR nesting": build(
        encode_cbor({"tensors": {}, "x": 0})[:-1] + nested(MAX_CBOR_DEPTH + 8)
    ),
    "huge map length": build(
        bytes.fromhex("a1") + encode_cbor("tensors") + bytes.fromhex("bb7fffffffffffffff")
    ),
    "huge array length": build(
        bytes.fromhex("a2")
        + encode_cbor("tensors")
        + b"\xa0"
        + encode_cbor("x")
        + bytes.fromhex("9b7fffffffffffffff")
    ),
    "huge text length": build(
        bytes.fromhex("a1") + encode_cbor("tensors") + bytes.fromhex("a17bffffffffffffff00")
    ),
    "indefinite map": build(bytes.fromhex("bf") + encode_cbor("tensors") + b"\xa0\xff"),
    "descriptor missing shape": one({"dtype": "F32", "data_offsets": [0, 8]}),
    "descriptor not a map": one([1, 2, 3]),
    "shape not a list": one(tensor(shape=None)),
    "negative dim": one(tensor(shape=(-2,))),
    "offsets not a pair": one(tensor(offsets=(0, 8, 16))),
    "offsets run backwards": one(tensor(offsets=(256, 8))),
    "offset past EOF": one(tensor(shape=(64,), offsets=(0, 256))),
    "huge offset": one(tensor(offsets=(0, 2**64 - 1))),
    "misaligned offset": build({"tensors": {"t": tensor(offsets=(8, 16))}}, bytes(16)),
    "overlapping tensors": build(
        {
            "tensors": {
                "a": tensor(shape=(64,), offsets=(0, 256)),
                "b": tensor(shape=(2,), offsets=(0, 8)),
            }
        },
        bytes(256),
    ),
    "plain length mismatch": one(tensor(shape=(3,), offsets=(0, 8))),
    "quantized length mismatch": one(tensor(Q8, (5,), (0, 8))),
    "huge quantized shape": one(tensor(Q8, (2**40, 2**40), (0, 8))),
    "huge plain shape": one(tensor("F32", (2**62, 2**62), (0, 8))),
    "huge shape around a zero": one(tensor("F32", (0, 2**62, 2**62), (0, 0)), b""),
    "huge quantized shape around a zero": one(tensor(Q8, (0, 2**62, 2**62), (0, 4)), bytes(4)),
    "unknown dtype": one(tensor("F128")),
    "unknown dtype variant": one(tensor({"Complex": "F32"})),
    "unknown bool store": one(tensor({"Bool": "U16"})),
    # Not a name at all: a set lookup of a list or map was a TypeError (found by review).
    "bool store a list": one(tensor({"Bool": [1]})),
    "bool store a map": one(tensor({"Bool": {"a": 1}})),
    "bool store null": one(tensor({"Bool": None})),
    "bool byte not 0/1": one(tensor({"Bool": "Native"}, (8,), (0, 8)), bytes(7) + b"\x02"),
    "unknown QuantValue": with_scheme(value="Q3S"),
    "unknown store": with_scheme(store={"PackedU16": 0}),
    "store dim negative": with_scheme(store={"PackedU32": -1}),
    "unknown mode": with_scheme(mode="Asymmetric"),
    "unknown scale dtype": with_scheme(tensor="F8"),
    "scheme key missing": one(tensor({"QFloat": {"value": "Q8S"}}, (4,), (0, 8))),
    "scheme extra key": with_scheme(zero_point=None),
    "block storage too long": with_scheme(
        block={"size": {"storage": [2, 1, 1, 1, 1, 1], "len": 1}, "dtype": "F16"}
    ),
    "block len over 5": with_scheme(
        block={"size": {"storage": [2, 1, 1, 1, 1], "len": 6}, "dtype": "F16"}
    ),
    "block dim zero": with_scheme(
        block={"size": {"storage": [0, 1, 1, 1, 1], "len": 1}, "dtype": "F16"}
    ),
    "block dim over u8": with_scheme(
        block={"size": {"storage": [256, 1, 1, 1, 1], "len": 1}, "dtype": "F16"}
    ),
    "block filler not 1": with_scheme(
        block={"size": {"storage": [2, 7, 1, 1, 1], "len": 1}, "dtype": "F16"}
    ),
    "invalid two-level scheme": with_scheme(tensor="BF16"),
    "packing dim past the rank": with_scheme(store={"PackedU32": 3}),
    "block of higher rank than the tensor": with_scheme(
        block={"size": {"storage": [2, 2, 1, 1, 1], "len": 2}, "dtype": "F16"}
    ),
    "quantized code out of range": one(tensor(Q8, (4,), (0, 8)), b"\x80\x00\x00\x00" + bytes(4)),
    "scale NaN": one(tensor(Q8, (4,), (0, 8)), bytes(4) + b"\x00\x00\xc0\x7f"),
    "sub-byte code with high bits": one(
        tensor({"QFloat": scheme_to_burn(QuantScheme(V.Q4S, QuantStore.Native))}, (4,), (0, 8)),
        b"\x7f" + bytes(7),
    ),
    "E4M3 NaN code": one(
        tensor({"QFloat": scheme_to_burn(QuantScheme(V.E4M3, QuantStore.Native))}, (4,), (0, 8)),
        b"\x7f" + bytes(7),
    ),
    "metadata value not text": build({"tensors": {}, "metadata": {"a": 1}}),
    "scalar of unknown kind": build({"tensors": {}, "scalars": {"a": {"Str": "x"}}}),
    "param_id negative": one(tensor(param_id=-1)),
}


# Defects in the tensor data itself, found when the data is read: the metadata alone is fine.
DATA_ONLY = {
    "bool byte not 0/1", "quantized code out of range", "scale NaN",
    "sub-byte code with high bits", "E4M3 NaN code",
}  # fmt: skip


@pytest.mark.parametrize("name", list(CORRUPT))
def test_corrupt_files_raise_layout_error(tmp_path, name):
    path = tmp_path / "bad.bpk"
    path.write_bytes(CORRUPT[name])
    with pytest.raises(bq.LayoutError) as info:
        load_burnpack(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    if name in DATA_ONLY:
        load_burnpack_metadata(path)
    else:
        with pytest.raises(bq.LayoutError):
            load_burnpack_metadata(path)


def test_the_valid_base_files_load(tmp_path):
    # Every corrupt file above is one defect away from one of these.
    for raw in (VALID, one(tensor(Q8, (4,), (0, 8)), bytes(4) + b"\x00\x00\x80\x3f"),
                with_scheme()):  # fmt: skip
        path = tmp_path / "ok.bpk"
        path.write_bytes(raw)
        load_burnpack(path)


def test_a_lookup_tensor_is_a_scheme_error_naming_it(tmp_path):
    path = tmp_path / "l.bpk"
    path.write_bytes(with_scheme(mode="Lookup"))
    with pytest.raises(bq.SchemeError, match="^tensor 't': .*no codebook"):
        load_burnpack(path)


def test_a_lookup_scheme_is_refused_and_nothing_written(tmp_path, rng):
    s = bq.QuantScheme(bq.QuantValue.Q4F, bq.QuantStore.Native).with_codebook(bq.codebooks.NF4)
    qt = bq.quantize(rng.standard_normal(8).astype(np.float32), s)
    with pytest.raises(bq.SchemeError, match="Burnpack has no place for a Lookup scheme's codebook"):
        save_burnpack(tmp_path / "l.bpk", {"w": qt})
    assert list(tmp_path.iterdir()) == []


def test_ignored_parts_are_accepted(tmp_path):
    path = tmp_path / "x.bpk"
    meta = {
        "tensors": {"t": tensor(param_id=12, future_field=[1, 2])},
        "scalars": {"s": {"Float": 0.5}, "n": {"Int": -1}, "u": {"UInt": 3}, "b": {"Bool": True}},
        "some_future_section": {"k": "v"},
    }
    path.write_bytes(build(meta, np.array([1.0, 2.0], "<f4").tobytes()))
    np.testing.assert_array_equal(load_burnpack(path)["t"], [1.0, 2.0])


def test_random_corruptions_raise_only_layout_error(tmp_path, rng):
    base = Path(tmp_path / "base.bpk")
    save_burnpack(
        base,
        {
            "q": bq.quantize(rng.standard_normal((3, 8)).astype(np.float32), bq.presets.nvfp4()),
            "f": rng.standard_normal(5).astype(np.float32),
            "b": np.array([True, False]),
        },
        metadata={"k": "v"},
    )
    raw = bytearray(base.read_bytes())
    (meta_len,) = struct.unpack_from("<I", raw, 6)
    path = tmp_path / "mutant.bpk"
    for _ in range(400):
        mutant = bytearray(raw)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, 10 + meta_len))  # mostly the header and metadata
            mutant[at] = int(rng.integers(0, 256))
        if rng.random() < 0.2:
            mutant = mutant[: int(rng.integers(0, len(mutant)))]
        path.write_bytes(bytes(mutant))
        try:
            load_burnpack(path)
        except bq.LayoutError as e:
            assert "\n" not in str(e)
        except bq.SchemeError:
            pass  # a mutated mode byte can spell "Lookup"; not reachable by one flip, but fine


def test_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_burnpack(tmp_path / "nope.bpk")


def test_nothing_is_allocated_from_a_crafted_length(tmp_path):
    # 4 GiB of declared metadata, 16 EiB of declared tensor: refused from the numbers alone.
    path = tmp_path / "huge.bpk"
    path.write_bytes(CORRUPT["metadata length over 100 MiB"])
    with pytest.raises(bq.LayoutError, match="over"):
        load_burnpack(path)
    path.write_bytes(CORRUPT["huge offset"])
    with pytest.raises(bq.LayoutError, match="past the end"):
        load_burnpack(path)
    assert os.path.getsize(path) < 4096


def test_a_write_the_file_system_refuses_names_the_target_not_the_temporary_file(tmp_path):
    t = {"a": np.zeros(3, np.float32)}
    missing = tmp_path / "no-such-folder" / "x.bpk"
    with pytest.raises(FileNotFoundError) as e:
        save_burnpack(missing, t)
    assert e.value.filename == str(missing) and ".tmp" not in str(e.value)
    with pytest.raises(IsADirectoryError) as e:
        save_burnpack(tmp_path, t)
    assert e.value.filename == str(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


@pytest.mark.parametrize("out", ["o.bpk", "o.safetensors"])
def test_a_bool_byte_burn_refuses_is_not_copied_into_an_output(tmp_path, capsys, out):
    # burn's Bool holds 0 or 1; blockquant's reader refuses any other byte, and so does every
    # output it would be copied into (a .bpk blockquant itself could not read back).
    from blockquant.cli import main

    src = tmp_path / "bad.bpk"
    src.write_bytes(CORRUPT["bool byte not 0/1"])
    assert main(["quantize", str(src), "-o", str(tmp_path / out), "--scheme", "int8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bool" in err.lower() and "0 or 1" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.bpk"]
