"""Names a new user types: output names whose extension says another format are refused (not
written as safetensors under that name), the scheme the help suggests compresses, preset names
in any case, and a ggml type or llama.cpp mix named where a blockquant scheme is taken (or a
preset where a ggml type is) says what the equivalent is."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import blockquant as bq
from blockquant.checkpoint import CheckpointError, SafetensorsWriter
from blockquant.cli import main


def run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture
def model(tmp_path) -> Path:
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    path = tmp_path / "m.safetensors"
    with SafetensorsWriter(path, [("w", "F32", (64, 64), w.nbytes)]) as out:
        out.write("w", w)
        out.commit()
    return path


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("blockquant: error: "), err
    return err


@pytest.mark.parametrize("name", ["x.npz", "x.npy", "x.pt", "x.bin", "x.pth", "X.NPZ"])
def test_a_quantize_output_named_for_another_format_is_refused(tmp_path, model, capsys, name):
    out = tmp_path / name
    assert run("quantize", model, "-o", out, "--scheme", "int8") == 2
    err = one_line(capsys)
    assert Path(name).suffix.lower() in err and ".safetensors" in err and ".bpk" in err
    assert not out.exists()
    with pytest.raises(CheckpointError, match="does not write"):
        bq.quantize_file(model, out, "int8")
    assert not out.exists()


@pytest.mark.parametrize("name", ["y.npy", "y.npz", "y.bpk", "y.gguf"])
def test_a_dequantize_output_named_for_another_format_is_refused(tmp_path, model, capsys, name):
    q = tmp_path / "q.safetensors"
    assert run("quantize", model, "-o", q, "--scheme", "int8", "-q") == 0
    out = tmp_path / name
    assert run("dequantize", q, "-o", out) == 2
    assert ".safetensors" in one_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("name", ["plain", "x.safetensors", "x.bpk", "dir/"])
def test_outputs_named_for_what_is_written_still_work(tmp_path, model, name):
    if name.endswith("/"):
        (tmp_path / name).mkdir()
    assert run("quantize", model, "-o", str(tmp_path / name), "--scheme", "int8", "-q") == 0


def test_the_scheme_the_help_suggests_compresses(capsys):
    assert main(["quantize", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    suggested = re.findall(r"[a-z0-9]+/[a-z0-9_]+/[a-z0-9:+]+", text)
    assert suggested, text
    for s in suggested:
        layout = bq.QuantScheme.parse(s).layout((4096, 4096))
        assert layout.nbytes * 8 / 4096**2 <= 4.5, s  # 4-bit codes, not one a byte
    with pytest.raises(bq.SchemeError) as e:
        bq.presets.resolve("q4")
    for s in re.findall(r"'([a-z0-9]+/[^']+)'", str(e.value)):
        assert bq.QuantScheme.parse(s).layout((4096, 4096)).nbytes * 8 / 4096**2 <= 4.5


@pytest.mark.parametrize("name", ["NVFP4", "Int8_Block32", "MXFP4", "BITNET"])
def test_preset_names_in_any_case(name):
    assert bq.presets.resolve(name) == bq.presets.resolve(name.lower())


@pytest.mark.parametrize("name, says", [
    ("q8_0", ["one of ggml's types", "int8_block32"]),
    ("Q4_K", ["one of ggml's types", "int4_block16"]),
    ("Q4_K_M", ["llama.cpp's file types", "-o model.gguf --scheme Q4_K_M"]),
    ("f16", ["float type"]),
])
def test_a_ggml_name_on_a_safetensors_input_says_the_equivalent(model, capsys, name, says):
    assert run("quantize", model, "-o", model.with_name("o.safetensors"), "--scheme", name) == 2
    err = one_line(capsys)
    for word in says:
        assert word in err, (word, err)


@pytest.fixture
def gguf_model(tmp_path) -> Path:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("blk.0.attn_q.weight",
                 np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("name, says", [
    ("int8_block32", ["blockquant preset", "q8_0"]),
    ("INT4_BLOCK32", ["blockquant preset", "q4_0"]),
    ("Q2_K_S", ["Q2_K_S", "importance matrix"]),  # a mix blockquant cannot make yet
])
def test_a_preset_or_mix_on_a_gguf_says_the_ggml_type(gguf_model, capsys, name, says):
    assert run("quantize", gguf_model, "-o", gguf_model.with_name("o.gguf"), "--scheme", name) == 2
    err = one_line(capsys)
    for word in says:
        assert word in err, (word, err)


@pytest.mark.parametrize("name", ["Q6_K", "q6_k", "NVFP4", "nvfp4", "Q4_K_M", "q4_k_m"])
def test_ggml_types_in_any_case_on_a_gguf(gguf_model, name):
    assert run("quantize", gguf_model, "-o", gguf_model.with_name(f"{name}.gguf"), "--scheme",
               name, "-q") == 0


def test_the_equivalence_tables_cover_every_type_and_preset():
    from blockquant import gguf as bg

    assert set(bq.presets.GGML_NEAREST) == set(bg.TYPES)
    assert set(bq.presets.PRESET_NEAREST_GGML) <= set(bq.presets.PRESETS)
    for near in bq.presets.GGML_NEAREST.values():
        assert near == "" or near in bq.presets.PRESETS
    for t in [*bq.presets.PRESET_NEAREST_GGML.values(), *bq.presets.LLAMA_MIXES.values()]:
        assert t.upper() in bg.TYPES
