"""The ``blockquant`` command with burn's ``.bpk`` files: quantize writes Burnpack by extension
or ``--format``, one QFloat tensor per quantized input tensor under its own name; inspect,
dequantize and report read it; a corrupt file is one error line, exit 2, nothing written."""

import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import blockquant as bq
from blockquant.burnpack import load_burnpack, load_burnpack_metadata
from blockquant.cli import main

NAMES = ["encoder.layer.0.attention.self.query.weight", "encoder.layer.0.output.dense.weight"]


def run(*argv):
    return main([str(a) for a in argv])


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(5)
    tensors = {
        NAMES[0]: rng.standard_normal((64, 96)).astype(np.float32),
        NAMES[1]: rng.standard_normal((32, 64)).astype(np.float16),
        "encoder.layer.0.output.LayerNorm.weight": np.ones(64, np.float32),
        "embeddings.position_ids": np.arange(12, dtype=np.int64).reshape(1, 12),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path, tensors


@pytest.mark.parametrize("scheme", ["int8", "int8_block32", "int4_block32", "nvfp4", "mxfp8",
                                    "q4s/packed_u32_1/block8x4:f16", "q2s/packed_native0/tensor"])
def test_quantize_writes_burnpack_by_extension(tmp_path, model, scheme):
    src, tensors = model
    out = tmp_path / "model.bpk"
    assert run("quantize", src, "-o", out, "--scheme", scheme, "--exclude", "LayerNorm", "-q") == 0
    got = load_burnpack(out)
    assert set(got) == set(tensors)  # names stay as in the input
    s = bq.presets.resolve(scheme)
    for name in NAMES:
        want = bq.quantize(tensors[name], s)
        assert isinstance(got[name], bq.QTensor) and got[name].scheme == s
        assert got[name].to_bytes() == want.to_bytes()
    for name in ("encoder.layer.0.output.LayerNorm.weight", "embeddings.position_ids"):
        np.testing.assert_array_equal(got[name], tensors[name])
        assert got[name].dtype == tensors[name].dtype
    assert load_burnpack_metadata(out) == {"format": "pt"}


def test_format_option_and_round_trip_through_the_commands(tmp_path, model, capsys):
    src, tensors = model
    out = tmp_path / "model.weights"  # no .bpk extension: --format decides
    assert run("quantize", src, "-o", out, "--format", "burnpack", "--scheme", "int8_block32",
               "--exclude", "LayerNorm", "-q") == 0
    assert out.read_bytes()[:4] == b"NRUB"
    capsys.readouterr()
    assert run("inspect", out) == 0
    text = capsys.readouterr().out
    assert "burnpack" in text and "q8s/native/block32:f16" in text and NAMES[0] in text
    dq = tmp_path / "dq.safetensors"
    assert run("dequantize", out, "-o", dq, "-q") == 0
    back = load_file(str(dq))
    for name in NAMES:
        np.testing.assert_array_equal(
            back[name], bq.quantize(tensors[name], bq.presets.int8_block32()).dequantize())
    np.testing.assert_array_equal(back["embeddings.position_ids"],
                                  tensors["embeddings.position_ids"])
    # report quantizes a float .bpk in memory
    plain = tmp_path / "plain.bpk"
    bq.save_burnpack(plain, {"w": tensors[NAMES[0]]})
    assert run("report", plain, "--scheme", "int8") == 0


def test_an_existing_output_needs_force(tmp_path, model, capsys):
    src, _ = model
    out = tmp_path / "m.bpk"
    out.write_bytes(b"keep")
    assert run("quantize", src, "-o", out, "--scheme", "int8", "-q") == 2
    assert "already exists" in capsys.readouterr().err
    assert out.read_bytes() == b"keep"
    assert run("quantize", src, "-o", out, "--scheme", "int8", "-q", "--force") == 0
    assert out.read_bytes()[:4] == b"NRUB"


def test_a_quantized_bpk_is_not_quantized_again(tmp_path, model, capsys):
    src, _ = model
    out = tmp_path / "m.bpk"
    assert run("quantize", src, "-o", out, "--scheme", "int8", "-q") == 0
    capsys.readouterr()
    assert run("quantize", out, "-o", tmp_path / "again.bpk", "--scheme", "int8", "-q") == 2
    assert "already holds quantized tensors" in capsys.readouterr().err
    assert not (tmp_path / "again.bpk").exists()


@pytest.mark.parametrize("cut", [3, 9, 40, -1])
@pytest.mark.parametrize("command", ["inspect", "dequantize", "quantize"])
def test_corrupt_bpk_is_one_error_line_and_writes_nothing(tmp_path, model, capsys, cut, command):
    src, _ = model
    good = tmp_path / "m.bpk"
    assert run("quantize", src, "-o", good, "--scheme", "nvfp4", "--exclude", "LayerNorm",
               "-q") == 0
    data = good.read_bytes()
    bad = tmp_path / "bad.bpk"
    bad.write_bytes(data[:cut])
    capsys.readouterr()
    out = tmp_path / "out.safetensors"
    extra = {"inspect": [], "dequantize": ["-o", out],
             "quantize": ["-o", out, "--scheme", "int8"]}[command]
    assert run(command, bad, *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("blockquant: error: "), err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_crafted_code_in_a_bpk_is_refused(tmp_path, capsys):
    s = bq.QuantScheme(bq.QuantValue.Q4S, bq.QuantStore.packed_native(0)).per_tensor(
        bq.ScaleDtype.F32)
    path = tmp_path / "m.bpk"
    bq.save_burnpack(path, {"w": bq.quantize(np.ones(4, np.float32), s)})
    data = bytearray(path.read_bytes())
    start = len(data) - (4 + 4)  # four one-byte Q4 values, then the f32 scale
    data[start] = 0x08  # -8: no Q4S code
    path.write_bytes(bytes(data))
    with pytest.raises(bq.LayoutError, match="not a code of Q4S"):
        load_burnpack(path)
    assert run("dequantize", path, "-o", tmp_path / "o.safetensors") == 2
    assert "not a code of Q4S" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o.safetensors")


def test_dequantize_to_a_bpk_name_is_refused(tmp_path, model, capsys):
    src, _ = model
    q = tmp_path / "m.bpk"
    assert run("quantize", src, "-o", q, "--scheme", "int8", "-q") == 0
    capsys.readouterr()
    assert run("dequantize", q, "-o", tmp_path / "back.bpk") == 2
    assert "writes safetensors" in capsys.readouterr().err
    assert not (tmp_path / "back.bpk").exists()
