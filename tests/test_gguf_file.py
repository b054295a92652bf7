"""GGUF files: ``blockquant quantize IN.gguf -o OUT.gguf --scheme TYPE --pure`` requantizes as
llama-quantize --pure does (the named mixes: test_gguf_mixes.py), checked by reading the output back with gguf-py's GGUFReader:
every key/value pair identical (but the two llama-quantize sets), tensor order, names, shapes
and alignment kept, the quantized tensors' bytes equal to gguf-py's quantize of the input's
values (so gguf-py's dequantize and blockquant's agree on them; for the types gguf-py cannot
quantize, blockquant.gguf's bytes, which gguf-py dequantizes as blockquant does), the others'
bytes unchanged.
Corrupt files are one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest

from blockquant import gguf as bg
from blockquant.checkpoint import FileOptions, open_checkpoint
from blockquant.checkpoint.gguf_file import requantize_gguf
from blockquant.cli import main

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import GGUFReader, GGUFValueType, GGUFWriter  # noqa: E402
from gguf import quants as gq  # noqa: E402

ALL_TYPES = [t for t in bg.TYPES if t in GT.__members__]  # MXFP4 needs a recent gguf-py
ALIGNMENT = 64  # not GGUF's default 32: the output must keep it
#: llama_ftype names where they are not MOSTLY_<type> (llama-quantize's Q3_K, Q4_K and Q5_K
#: are aliases of the _M file types).
FILE_TYPE_NAMES = {"F32": "ALL_F32", "MXFP4": "MOSTLY_MXFP4_MOE", "Q3_K": "MOSTLY_Q3_K_M",
                   "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M"}

#: (name, shape in numpy order, type) of the model's tensors.
TENSORS = [
    ("token_embd.weight", (16, 256), "F16"),
    ("blk.0.attn_norm.weight", (256,), "F32"),
    ("blk.0.attn_q.weight", (64, 256), "F32"),
    ("blk.0.attn_q.bias", (64,), "F32"),
    ("blk.0.attn_k.weight", (32, 96), "BF16"),  # rows of 96: not whole TQ blocks (256)
    ("blk.0.ffn_gate_inp.weight", (4, 256), "F32"),  # an MoE router: llama-quantize keeps it
    ("blk.0.ffn_up_exps.weight", (2, 32, 256), "F16"),  # experts: 3-D, quantized
    ("blk.0.odd.weight", (8, 40), "F32"),  # rows of 40: no type's blocks
    ("blk.0.ffn_down.weight", (256, 64), "BF16"),
    ("output.weight", (16, 256), "BF16"),
]


def bf16_bits(x: np.ndarray) -> np.ndarray:
    b = x.astype(np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A small GGUF model written by gguf-py: key/value pairs of every type, a tokenizer, 1-D,
    2-D and 3-D tensors in F32, F16 and BF16."""
    path = tmp_path_factory.mktemp("gguf") / "model-f16.gguf"
    rng = np.random.default_rng(7)
    w = GGUFWriter(path, "llama")
    w.add_custom_alignment(ALIGNMENT)
    w.add_uint8("test.u8", 7)
    w.add_int8("test.i8", -7)
    w.add_uint16("test.u16", 65535)
    w.add_int16("test.i16", -300)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -5)
    w.add_float32("test.f32", 0.1)
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", 1 / 3)
    w.add_bool("test.bool", True)
    w.add_string("general.name", "tiny")
    w.add_uint32("general.file_type", 1)
    w.add_array("test.arr_i32", [1, 2, 3])
    w.add_array("test.arr_f32", [0.5, -1.25])
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "héllo", "▁the", "日本"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.5, -3.0, -4.0])
    w.add_array("tokenizer.ggml.token_type", [3, 3, 1, 1, 1])
    w.add_array("tokenizer.ggml.merges", ["▁ t", "h e"])
    for name, shape, t in TENSORS:
        x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if t == "F32":
            w.add_tensor(name, x)
        elif t == "F16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, bf16_bits(x).view(np.uint8), raw_dtype=GT.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


#: llama.cpp's fallback when a row is not whole blocks of the type (llama-quant.cpp's
#: tensor_type_fallback, read by hand); a type not here has none (llama-quantize refuses).
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "TQ1_0": "Q4_0", "TQ2_0": "Q4_0", "Q4_K": "Q5_0",
            "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}


def expected_type(name: str, shape: tuple[int, ...], src: str, target: str) -> str:
    """The type llama-quantize --pure gives the tensor, by its rules as this test reads them:
    the fallback still applies under --pure; F16 when the fallback's 32 do not fit either;
    blockquant keeps a tensor whose type has no fallback."""
    if len(shape) < 2 or not name.endswith("weight") or "ffn_gate_inp" in name:
        return src
    if shape[-1] % gguf.GGML_QUANT_SIZES[GT[target]][0]:
        if target not in FALLBACK:
            return src
        return "F16" if shape[-1] % 32 else FALLBACK[target]
    return target


def values_of(t) -> np.ndarray:
    """A tensor's values as float32, read the way gguf-py reads them."""
    if t.tensor_type == GT.BF16:
        return (t.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(t.data, np.float32)


def fields(reader: GGUFReader) -> dict[str, tuple[list[GGUFValueType], object]]:
    return {k: (f.types, f.contents()) for k, f in reader.fields.items()
            if not k.startswith("GGUF.")}


def run(*argv: str) -> int:
    return main([str(a) for a in argv])


@pytest.mark.parametrize("target", ALL_TYPES)
def test_requantize_every_type(model, tmp_path, target):
    out = tmp_path / f"model-{target.lower()}.gguf"
    assert run("quantize", model, "-o", out, "--scheme", target.lower(), "--pure", "-q") == 0
    a, b = GGUFReader(model), GGUFReader(out)

    # Metadata: every pair identical, but the two llama-quantize sets.
    fa, fb = fields(a), fields(b)
    assert list(fb) == list(fa) + ["general.quantization_version"]  # appended: input lacks it
    for key, (types, value) in fa.items():
        if key == "general.file_type":
            assert fb[key] == ([GGUFValueType.UINT32], int(gguf.LlamaFileType[
                FILE_TYPE_NAMES.get(target, f"MOSTLY_{target}")]))
        else:
            assert fb[key] == (types, value), key
    assert fb["general.quantization_version"] == ([GGUFValueType.UINT32],
                                                  gguf.GGML_QUANT_VERSION)
    assert b.alignment == a.alignment == ALIGNMENT

    # Tensors: order, names, shapes; each quantized as gguf-py quantizes it, or kept.
    assert [t.name for t in b.tensors] == [t.name for t in a.tensors]
    for ta, tb in zip(a.tensors, b.tensors):
        assert list(tb.shape) == list(ta.shape)
        assert tb.data_offset % ALIGNMENT == 0
        shape = tuple(int(d) for d in reversed(ta.shape.tolist()))
        want = expected_type(ta.name, shape, ta.tensor_type.name, target)
        assert tb.tensor_type.name == want, ta.name
        if want == ta.tensor_type.name:
            assert np.array_equal(tb.data.view(np.uint8), ta.data.view(np.uint8)), ta.name
            continue
        x = values_of(ta).reshape(shape)
        with np.errstate(all="ignore"):
            try:
                oracle = gq.quantize(x, GT[want])
            except NotImplementedError:  # the K-quants, IQ4 and NVFP4: blockquant's own
                oracle = bg.quantize(x, want)
        assert np.array_equal(np.asarray(tb.data).view(np.uint8).reshape(-1),
                              oracle.view(np.uint8).reshape(-1)), ta.name
        # gguf-py's dequantize of what was written equals blockquant's, bit for bit.
        theirs = gq.dequantize(tb.data, GT[want])
        ours = bg.dequantize(tb.data, want)
        assert np.array_equal(np.asarray(theirs, np.float32).view(np.uint32),
                              ours.view(np.uint32)), ta.name


def test_summary_says_what_was_kept(model, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert run("quantize", model, "-o", out, "--scheme", "q8_0", "--pure") == 0
    text = capsys.readouterr().out
    assert "Q8_0 (--pure) (general.file_type 7), 6 of 10 tensors quantized (Q8_0: 6)" in text
    assert "2 of rank below 2" in text
    assert "blk.0.ffn_gate_inp.weight" in text
    assert "rows are not whole blocks of their type, which has no fallback: blk.0.odd.weight" in text


def test_dry_run_writes_nothing(model, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert run("quantize", model, "-o", out, "--scheme", "q4_0", "--dry-run") == 0
    assert not out.exists()
    assert "rows not whole blocks" in capsys.readouterr().out


def test_already_quantized_input_needs_allow_requantize(model, tmp_path, capsys):
    q8 = tmp_path / "m-q8.gguf"
    assert run("quantize", model, "-o", q8, "--scheme", "q8_0", "-q") == 0
    capsys.readouterr()
    out = tmp_path / "m-q4.gguf"
    assert run("quantize", q8, "-o", out, "--scheme", "q4_0") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already quantized (Q8_0)" in err
    assert "--allow-requantize" in err and not out.exists()
    assert run("quantize", q8, "-o", out, "--scheme", "q4_0", "--pure", "--allow-requantize",
               "-q") == 0
    a, b = GGUFReader(q8), GGUFReader(out)
    for ta, tb in zip(a.tensors, b.tensors):
        if ta.tensor_type == GT.Q8_0:
            # Dequantized (as gguf-py dequantizes), then quantized again.
            x = gq.dequantize(ta.data, GT.Q8_0)
            with np.errstate(all="ignore"):
                want = gq.quantize(x, GT.Q4_0)
            assert tb.tensor_type == GT.Q4_0
            assert np.array_equal(np.asarray(tb.data).reshape(-1), want.reshape(-1))
    # The same type again is a copy, not a requantization.
    same = tmp_path / "m-q8-again.gguf"
    assert run("quantize", q8, "-o", same, "--scheme", "q8_0", "-q") == 0
    for ta, tb in zip(GGUFReader(q8).tensors, GGUFReader(same).tensors):
        assert np.array_equal(tb.data.view(np.uint8), ta.data.view(np.uint8))


def test_include_exclude_min_rank_strict(model, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert run("quantize", model, "-o", out, "--scheme", "q8_0", "--exclude", "output", "-q") == 0
    types = {t.name: t.tensor_type for t in GGUFReader(out).tensors}
    assert types["output.weight"] == GT.BF16 and types["token_embd.weight"] == GT.Q8_0
    assert run("quantize", model, "-o", out, "--scheme", "q8_0", "--strict", "-f") == 2
    assert "blk.0.odd.weight" in capsys.readouterr().err
    assert run("quantize", model, "-o", out, "--scheme", "q8_0", "--min-rank", "3", "-f",
               "-q") == 0
    types = {t.name: t.tensor_type for t in GGUFReader(out).tensors}
    assert types["blk.0.ffn_up_exps.weight"] == GT.Q8_0 and types["output.weight"] == GT.BF16


def test_options_and_names_gguf_does_not_take(model, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    for extra in (["--scheme", "int4"], ["--scheme", "iq2_xxs"], ["--scheme", "q4_0",
                  "--calibration", "absmean"], ["--scheme", "q4_0", "--rule", "x=int8"]):
        assert run("quantize", model, "-o", out, *extra) == 2
        assert capsys.readouterr().err.startswith("blockquant: error: ")
    assert not out.exists()
    st = tmp_path / "x.safetensors"
    np.savez(tmp_path / "x.npz", a=np.zeros((4, 32), np.float32))
    assert run("quantize", tmp_path / "x.npz", "-o", tmp_path / "x.gguf", "--scheme", "q4_0") == 2
    assert "GGUF output is made from a GGUF file" in capsys.readouterr().err
    assert run("quantize", tmp_path / "x.npz", "-o", st, "--scheme", "int8", "--pure") == 2
    assert "--pure: is llama-quantize's option, for a .gguf output only" in capsys.readouterr().err
    assert run("quantize", tmp_path / "x.npz", "-o", st, "--scheme", "int8",
               "--allow-requantize") == 2


def test_output_is_not_replaced_without_force(model, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"keep me")
    assert run("quantize", model, "-o", out, "--scheme", "q4_0") == 2
    assert "already exists" in capsys.readouterr().err
    assert out.read_bytes() == b"keep me"
    assert run("quantize", model, "-o", out, "--scheme", "q4_0", "-f", "-q") == 0
    assert out.read_bytes()[:4] == b"GGUF"
    assert run("quantize", model, "-o", model, "--scheme", "q4_0", "-f") == 2  # the input


def test_inspect_report_dequantize_read_gguf(model, tmp_path, capsys):
    q = tmp_path / "m-q5_1.gguf"
    assert run("quantize", model, "-o", q, "--scheme", "q5_1", "-q") == 0
    capsys.readouterr()
    assert run("inspect", q, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "gguf"
    rows = {r["name"]: r for r in info["tensors"]}
    assert rows["blk.0.attn_q.weight"]["scheme"] == "Q5_1"
    assert rows["blk.0.attn_q.weight"]["shape"] == [64, 256]
    assert rows["blk.0.attn_norm.weight"]["scheme"] is None
    assert info["metadata"]["general.name"] == "tiny"
    assert "tokenizer.ggml.tokens" not in info["metadata"]  # arrays are left out

    assert run("report", model, "--scheme", "q5_1", "--json") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["scheme"] == "Q5_1" and rep["overall"]["tensors"] == 6
    assert 20 < rep["overall"]["sqnr_db"] < 40

    st = tmp_path / "m.safetensors"
    assert run("dequantize", q, "-o", st, "-q") == 0
    from safetensors.numpy import load_file

    got = load_file(st)
    for t in GGUFReader(q).tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.tensor_type == GT.Q5_1:
            want = gq.dequantize(t.data, GT.Q5_1).reshape(shape)
            assert got[t.name].dtype == np.float32
            assert np.array_equal(got[t.name], want)
        elif t.tensor_type in (GT.F32, GT.F16):
            assert np.array_equal(got[t.name], np.asarray(t.data).reshape(shape))
    # A file with nothing quantized has nothing to dequantize.
    assert run("dequantize", model, "-o", tmp_path / "n.safetensors") == 2


def test_gguf_tensors_quantize_into_safetensors_with_blockquant_schemes(model, tmp_path):
    st = tmp_path / "m.safetensors"
    assert run("quantize", model, "-o", st, "--scheme", "int8", "-q") == 0
    with open_checkpoint(model) as ckpt:
        assert ckpt.format == "gguf"
        x = ckpt.read("blk.0.ffn_down.weight")  # BF16, read as float32
        assert x.dtype == np.float32 and x.shape == (256, 64)
    assert run("inspect", st, "--json") == 0


def test_streams_one_tensor_at_a_time_in_order(model, tmp_path):
    seen = []
    res = requantize_gguf(model, tmp_path / "m.gguf", "Q4_1", FileOptions(),
                          progress=lambda name, n: seen.append(name))
    assert seen == [name for name, _, _ in TENSORS]
    assert res.quantized == [d.tensor.name for d in res.decisions if d.quantized]


# --- corrupt files ----------------------------------------------------------------------------------


def _corruptions(good: bytes) -> dict[str, bytes]:
    reader = GGUFReader_bytes(good)
    first = reader.tensors[0]
    info_at = first.field.offset
    type_at = info_at + sum(int(p.nbytes) for p in first.field.parts[:4])
    bad_type = bytearray(good)
    bad_type[type_at: type_at + 4] = (999).to_bytes(4, "little")
    far = bytearray(good)
    off_at = type_at + 4
    far[off_at: off_at + 8] = (2**40).to_bytes(8, "little")
    huge_kv = bytearray(good)
    huge_kv[16:24] = (2**60).to_bytes(8, "little")
    bad_version = bytearray(good)
    bad_version[4:8] = (99).to_bytes(4, "little")
    long_string = bytearray(good)
    long_string[24:32] = (2**62).to_bytes(8, "little")  # the first key's length
    return {
        "empty": b"",
        "magic only": b"GGUF",
        "truncated header": good[:40],
        "truncated data": good[: len(good) - 100],
        "bad version": bytes(bad_version),
        "unknown tensor type": bytes(bad_type),
        "tensor past the end": bytes(far),
        "huge kv count": bytes(huge_kv),
        "huge string": bytes(long_string),
    }


def GGUFReader_bytes(data: bytes) -> GGUFReader:  # noqa: N802 - a reader of bytes
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".gguf", delete=False) as f:
        f.write(data)
    try:
        return GGUFReader(f.name)
    finally:
        os.unlink(f.name)


@pytest.mark.parametrize("command", ["quantize", "inspect", "report", "dequantize"])
def test_corrupt_files_are_one_line_exit_2_nothing_written(model, tmp_path, capsys, command):
    for what, data in _corruptions(model.read_bytes()).items():
        src = tmp_path / "bad.gguf"
        src.write_bytes(data)
        out = tmp_path / ("out.gguf" if command == "quantize" else "out.safetensors")
        argv = {"quantize": ["quantize", src, "-o", out, "--scheme", "q4_0"],
                "inspect": ["inspect", src],
                "report": ["report", src, "--scheme", "q4_0"],
                "dequantize": ["dequantize", src, "-o", out]}[command]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # and no warning either
            code = run(*argv)
        cap = capsys.readouterr()
        if what == "empty" and command in ("inspect", "report", "dequantize"):
            # Not recognized as GGUF (no magic): the other readers refuse it, one line too.
            assert code == 2, what
        else:
            assert code == 2, (what, cap)
            assert cap.err.startswith(f"blockquant: error: {src}"), (what, cap.err)
        assert cap.err.count("\n") == 1, (what, cap.err)
        assert sorted(os.listdir(tmp_path)) == ["bad.gguf"], what


@pytest.mark.parametrize("content, says", [(b"", "empty file"), (b"PK\x03\x04rest", "PK")])
def test_a_gguf_named_file_that_is_not_one_says_so(tmp_path, capsys, content, says):
    src = tmp_path / "model.gguf"
    src.write_bytes(content)
    out = tmp_path / "out.gguf"
    assert run("quantize", src, "-o", out, "--scheme", "q8_0") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a GGUF file" in err and says in err
    assert not out.exists()


def test_report_of_a_gguf_file_with_an_unknown_scheme_names_ggmls_types_too(model, capsys):
    assert run("report", str(model), "--scheme", "q9_9") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown scheme 'q9_9'" in err
    assert "not a preset (int8" in err and "one of ggml's types (f32, f16, bf16, q8_0" in err


def _kv_file(path, vtype: int, payload: bytes, n_tensors: int = 0, n_kv: int = 1) -> Path:
    """A GGUF file of one key "a" of type ``vtype`` followed by ``payload`` (hand-built, so
    that counts can lie)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)
    path.write_bytes(head + struct.pack("<Q", 1) + b"a" + struct.pack("<I", vtype) + payload
                     + bytes(64))
    return path


@pytest.mark.parametrize("make, words", [
    # an array of 2^40 uint32 in 16 bytes: gguf-py would allocate and loop until memory ran out
    (lambda p: _kv_file(p, 9, struct.pack("<IQ", 4, 2**40) + bytes(16)), "an array of 1099511627776"),
    (lambda p: _kv_file(p, 9, struct.pack("<IQ", 8, 2**40) + bytes(16)), "an array of 1099511627776"),
    (lambda p: _kv_file(p, 8, struct.pack("<Q", 2**50)), "needs 1125899906842624 bytes"),
    (lambda p: _kv_file(p, 4, bytes(4), n_kv=2**40), "1099511627776 key/value pairs"),
    (lambda p: _kv_file(p, 4, bytes(4), n_tensors=2**40), "1099511627776 tensors"),
    (lambda p: _kv_file(p, 77, bytes(4)), "unknown value type 77"),
    (lambda p: _kv_file(p, 9, struct.pack("<IQ", 9, 1) * 20 + bytes(16)), "nested more than 8"),
])
def test_a_gguf_header_whose_counts_lie_is_refused_before_gguf_py_reads_it(tmp_path, capsys,
                                                                          make, words):
    bad = make(tmp_path / "bad.gguf")
    for argv in (["inspect", bad], ["report", bad, "--scheme", "q8_0"],
                 ["dequantize", bad, "-o", tmp_path / "d.safetensors"],
                 ["quantize", bad, "-o", tmp_path / "q.gguf", "--scheme", "q8_0"]):
        assert run(*map(str, argv)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not a valid GGUF file" in err and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_real_gguf_headers_pass_the_length_walk(model):
    # every key/value type and a tokenizer array, as gguf-py writes them
    from blockquant.checkpoint.gguf_reader import _check_lengths

    _check_lengths(model)


def _one_raw_tensor(path: Path, gtype, nbytes_per_row: int, rows: int = 4,
                    seed: int = 0) -> Path:
    """A GGUF file of one tensor "a.weight" of ggml type ``gtype`` holding random bytes."""
    w = GGUFWriter(path, "llama")
    raw = np.random.default_rng(seed).integers(0, 256, (rows, nbytes_per_row), dtype=np.uint8)
    w.add_tensor("a.weight", raw, raw_dtype=gtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_type_gguf_py_cannot_dequantize_is_named_once(tmp_path, capsys):
    src = _one_raw_tensor(tmp_path / "q81.gguf", GT.Q8_1, 40 * 8)  # 8 blocks of 32 a row
    assert run("quantize", src, "-o", tmp_path / "o.gguf", "--scheme", "q4_0",
               "--allow-requantize") == 2
    err = capsys.readouterr().err
    assert err == f"blockquant: error: {src}: a.weight: gguf-py cannot dequantize Q8_1\n", err


def test_corrupt_scales_of_another_type_are_one_error_line_without_numpys_warnings(tmp_path,
                                                                                  capsys):
    # IQ1_M of random bytes (seed 6): an infinite scale times a zero, numpy warns in gguf-py
    src = _one_raw_tensor(tmp_path / "iq1m.gguf", GT.IQ1_M, 56 * 2, rows=8, seed=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):  # the data does make numpy warn
            gq.dequantize(GGUFReader(src).tensors[0].data, GT.IQ1_M)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail the command here
        for argv in (["report", src, "--scheme", "q4_0"],
                     ["quantize", src, "-o", tmp_path / "o.gguf", "--scheme", "q4_0",
                      "--allow-requantize"]):
            assert run(*map(str, argv)) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "non-finite value" in err, err


def test_gguf_metadata_arrays_past_any_tokenizer_are_refused_before_gguf_py_reads_them(
        tmp_path, capsys):
    from blockquant.checkpoint.gguf_reader import MAX_ARRAY_ITEMS

    # honest counts: 2 Mi + 1 one-byte items fit the file, yet gguf-py would make a numpy
    # object of each (gigabytes)
    n = MAX_ARRAY_ITEMS + 1
    bad = _kv_file(tmp_path / "many.gguf", 9, struct.pack("<IQ", 0, n) + bytes(n))
    assert run("inspect", str(bad)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"hold over {MAX_ARRAY_ITEMS} items" in err, err


@pytest.mark.parametrize("version, words", [
    (struct.pack("<I", 1), "GGUF version 1: blockquant reads versions 2 and 3"),
    (struct.pack(">I", 3), "is a big-endian GGUF file"),
])
def test_a_gguf_version_or_byte_order_not_read_is_said_before_the_counts(tmp_path, capsys,
                                                                         version, words):
    bad = tmp_path / "v.gguf"
    bad.write_bytes(b"GGUF" + version + bytes(64))
    assert run("inspect", str(bad)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "key/value pairs" not in err, err
