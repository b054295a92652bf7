"""The blockquant file format's versions: format 2 stores burn's layout; format 1 files (written
before blockquant followed burn's packing) still read, to the same tensors.

The format-1 files here are built by hand from the old packing rules, independently of the code
under test: fields ``word_bits / bits`` a word along the packed axis, that axis shrunk in place,
the first value in the low bits; scales row-major in the grid's shape.
"""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import blockquant as bq
from blockquant.checkpoint import FileOptions, dequantize_file, quantize_file
from blockquant.checkpoint.format import FORMAT_VERSION, READ_VERSIONS

V, S, D = bq.QuantValue, bq.QuantStore, bq.ScaleDtype


def old_pack(codes: np.ndarray, axis: int, bits: int, word_bits: int) -> np.ndarray:
    """Format 1's packing: along ``axis`` in place, ``word_bits // bits`` fields a word."""
    per = word_bits // bits
    c = np.moveaxis(codes.astype(np.int64) & ((1 << bits) - 1), axis, -1)
    n = c.shape[-1]
    words = np.zeros(c.shape[:-1] + (-(-n // per),), np.uint64)
    for k in range(n):
        words[..., k // per] |= c[..., k].astype(np.uint64) << np.uint64((k % per) * bits)
    dtype = np.uint32 if word_bits == 32 else np.uint8
    return np.ascontiguousarray(np.moveaxis(words.astype(dtype), -1, axis))


CASES = [
    # scheme, shape, packed axis, word bits
    (bq.QuantScheme(V.Q4S, S.packed_native(0)).per_block([4], D.F16), (3, 10), 1, 8),
    (bq.QuantScheme(V.Q8S, S.packed_u32(1)).per_block([2, 4], D.F16), (5, 8), 0, 32),
    (bq.QuantScheme(V.Q2S, S.packed_native(1)).per_tensor(D.F32), (5, 3), 0, 8),
    (bq.QuantScheme(V.E2M1, S.packed_u32(1)).per_block([3, 1], D.UE4M3)
     .per_tensor(D.F32), (7, 4), 0, 32),
]


@pytest.mark.parametrize("scheme, shape, axis, word_bits", CASES, ids=lambda c: str(c))
def test_format_1_files_still_read(tmp_path, scheme, shape, axis, word_bits):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    qt = bq.quantize(x, scheme)  # the tensor the old file must read back as
    # Its codes, from the dequantized values and the scales (exact: scales are stored values).
    e = qt.scales if qt.global_scale is None else qt.scales * np.float32(qt.global_scale)
    if scheme.block is None:
        e_full = np.full(shape, e.reshape(-1)[0], np.float32)
    else:
        block = (1,) * (len(shape) - len(scheme.block.size)) + scheme.block.size
        e_full = e
        for ax, b in enumerate(block):
            e_full = np.repeat(e_full, b, axis=ax)
        e_full = e_full[tuple(slice(0, d) for d in shape)]
    y = qt.dequantize()
    if scheme.value.is_float:
        import ml_dtypes

        codes = (y / e_full).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    else:
        codes = np.rint(y / e_full).astype(np.int64)
    tensors = {
        "w.values": old_pack(codes, axis, scheme.value.bits, word_bits),
        "w.scales": _scale_codes(qt, scheme),
    }
    if scheme.is_two_level:
        tensors["w.global_scale"] = np.array(qt.global_scale, np.float32)
    entry = {"scheme": str(scheme), "shape": list(shape), "dtype": "float32",
             "values": "w.values", "scales": "w.scales"}
    if scheme.is_two_level:
        entry["global_scale"] = "w.global_scale"
    meta = {"blockquant": json.dumps({"format": 1, "tensors": {"w": entry}})}
    old = tmp_path / "old.safetensors"
    save_file(tensors, str(old), metadata=meta)
    out = tmp_path / "dq.safetensors"
    dequantize_file(old, out, FileOptions())
    np.testing.assert_array_equal(load_file(str(out))["w"], y)


def _scale_codes(qt: bq.QTensor, scheme: bq.QuantScheme) -> np.ndarray:
    """The scale grid as format 1 stored it: row-major, in its dtype's encoding."""
    d = scheme.scale_dtype
    if d is D.F32:
        return qt.scales.astype(np.float32)
    if d is D.F16:
        return qt.scales.astype(np.float16)
    import ml_dtypes

    return qt.scales.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # UE4M3 codes


def test_new_files_are_format_2_and_both_versions_are_read(tmp_path):
    assert FORMAT_VERSION == 2 and READ_VERSIONS == (1, 2)
    src = tmp_path / "m.safetensors"
    save_file({"w": np.ones((4, 8), np.float32)}, str(src))
    dst = tmp_path / "q.safetensors"
    quantize_file(src, dst, bq.presets.resolve("int4_block32"), FileOptions())
    with open(dst, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    assert json.loads(header["__metadata__"]["blockquant"])["format"] == 2
