"""The Python API for files (issue 12): ``bq.quantize_file``, ``bq.dequantize_file`` and
``bq.load``, on files and folders, so nobody decodes scale bytes by hand."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import blockquant as bq
from blockquant.checkpoint import CheckpointError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "api.md"


@pytest.fixture
def src(tmp_path):
    rng = np.random.default_rng(11)
    tensors = {
        "w": rng.normal(0, 0.02, (48, 64)).astype(np.float32),
        "w16": rng.normal(0, 1, (16, 32)).astype(np.float16),
        "wbf": rng.normal(0, 1, (8, 32)).astype(ml_dtypes.bfloat16),
        "bias": rng.normal(0, 1, 64).astype(np.float32),
        "bias_bf": rng.normal(0, 1, 64).astype(ml_dtypes.bfloat16),
        "ids": np.arange(5, dtype=np.int64),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path, tensors


def test_exported_and_documented():
    text = DOCS.read_text()
    for name in ("quantize_file", "dequantize_file", "load"):
        assert name in bq.__all__ and callable(getattr(bq, name))
        assert re.search(rf"^### `{name}`", text, re.M), name


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "int8_block32", "int4_block32", "bitnet",
                                    "e4m3/native/block16:ue4m3+tensor:f32"])
def test_load_gives_qtensors_back(tmp_path, src, scheme):
    path, tensors = src
    q = tmp_path / "q.safetensors"
    res = bq.quantize_file(path, q, scheme)
    assert sorted(res.quantized) == ["w", "w16", "wbf"]
    assert set(res.copied) == {"bias", "bias_bf", "ids"}
    got = bq.load(q)
    assert set(got) == set(bq.load(path))  # the same names
    for name in res.quantized:
        assert isinstance(got[name], bq.QTensor)
        assert got[name].to_bytes() == bq.quantize(tensors[name], scheme).to_bytes()
        assert got[name].shape == tensors[name].shape
    np.testing.assert_array_equal(got["ids"], tensors["ids"])
    assert got["bias_bf"].dtype == ml_dtypes.bfloat16  # plain tensors keep their dtype
    np.testing.assert_array_equal(got["bias_bf"], tensors["bias_bf"])


def test_load_folders_burnpack_and_numpy(tmp_path, src):
    path, tensors = src
    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"a": tensors["w"]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"b": tensors["w16"]}, str(folder / "model-00002-of-00002.safetensors"))
    bq.quantize_file(folder, tmp_path / "q", "int8")
    got = bq.load(tmp_path / "q")
    assert set(got) == {"a", "b"} and all(isinstance(v, bq.QTensor) for v in got.values())
    bq.quantize_file(path, tmp_path / "q.bpk", "nvfp4")
    got = bq.load(tmp_path / "q.bpk")
    assert got["w"].to_bytes() == bq.quantize(tensors["w"], "nvfp4").to_bytes()
    np.savez(tmp_path / "n.npz", x=np.ones(3))
    assert list(bq.load(tmp_path / "n.npz")) == ["x"]


def test_load_refuses_a_name_in_two_shards(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    for k in (1, 2):
        save_file({"a": np.ones(2, np.float32)}, str(folder / f"model-0000{k}-of-00002.safetensors"))
    with pytest.raises(CheckpointError, match="a: is in another file of the folder too"):
        bq.load(folder)


def test_quantize_file_options(tmp_path, src):
    path, tensors = src
    q = tmp_path / "q.safetensors"
    res = bq.quantize_file(path, q, bq.presets.nvfp4(), rules={"w16": "int8", "bf": "keep"},
                           min_rank=1, rounding="half_even", scale_rounding="nearest")
    assert set(res.quantized) == {"w", "w16", "bias"}
    got = bq.load(q)
    assert got["w16"].scheme == bq.presets.int8()
    want = bq.quantize(tensors["w"], "nvfp4", rounding="half_even", scale_rounding="nearest")
    assert got["w"].to_bytes() == want.to_bytes()
    with pytest.raises(CheckpointError, match="already exists"):
        bq.quantize_file(path, q, "int8")
    assert sorted(bq.quantize_file(path, q, "int8", force=True).quantized) == ["w", "w16", "wbf"]
    with pytest.raises(CheckpointError, match="is the input file"):
        bq.quantize_file(path, path, "int8", force=True)
    with pytest.raises(CheckpointError, match="^--scheme: unknown scheme"):  # api.md: every problem
        bq.quantize_file(path, tmp_path / "x.safetensors", "nvfp5")
    with pytest.raises(CheckpointError, match="bias: block"):
        bq.quantize_file(path, tmp_path / "x.safetensors", "q8s/native/block32x32:f16",
                         strict=True, include="^bias$", min_rank=1)


def test_dequantize_file(tmp_path, src):
    path, tensors = src
    q, d = tmp_path / "q.safetensors", tmp_path / "d.safetensors"
    bq.quantize_file(path, q, "int8_block32")
    res = bq.dequantize_file(q, d)
    assert (res.dequantized, res.copied) == (3, 3) and res.bytes_out == d.stat().st_size
    back = load_file(d)
    for name in ("w", "w16"):
        want = bq.quantize(tensors[name], "int8_block32").dequantize(tensors[name].dtype)
        np.testing.assert_array_equal(back[name], want)
    res = bq.dequantize_file(q, d, dtype=np.float64, force=True)
    assert load_file(d)["w16"].dtype == np.float64
    with pytest.raises(CheckpointError, match="no blockquant-quantized tensor"):
        bq.dequantize_file(path, tmp_path / "e.safetensors")


def test_progress_callback_sees_every_input_byte(tmp_path, src):
    path, tensors = src
    seen = []
    bq.quantize_file(path, tmp_path / "q.safetensors", "int8", progress=lambda *a: seen.append(a))
    assert {name for _, name, _ in seen} == set(tensors)
    assert sum(n for _, _, n in seen) == sum(t.nbytes for t in tensors.values())
    seen.clear()
    bq.dequantize_file(tmp_path / "q.safetensors", tmp_path / "d.safetensors",
                       progress=lambda *a: seen.append(a))
    assert {name for _, name, _ in seen} == set(tensors)


def test_progress_true_is_silent_off_a_terminal(tmp_path, src, capsys):
    path, _ = src
    bq.quantize_file(path, tmp_path / "q.safetensors", "int8", progress=True)
    assert capsys.readouterr() == ("", "")


def test_dry_run_writes_nothing(tmp_path, src):
    path, _ = src
    res = bq.quantize_file(path, tmp_path / "out/", "nvfp4", dry_run=True)
    assert sorted(res.quantized) == ["w", "w16", "wbf"] and res.seconds == 0.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


@pytest.mark.parametrize("kw, option", [
    (dict(jobs=0), "--jobs"), (dict(jobs=-1), "--jobs"), (dict(jobs="2"), "--jobs"),
    (dict(jobs=True), "--jobs"), (dict(jobs=1.0), "--jobs"), (dict(threads=0), "--threads"),
    (dict(threads=-1), "--threads"), (dict(threads=1025), "--threads"),
    (dict(threads=5000), "--threads"), (dict(threads="4"), "--threads"),
])
def test_bad_job_and_thread_counts_are_checkpoint_errors_before_anything_is_read(
        tmp_path, src, kw, option):
    path, _ = src
    q = tmp_path / "q.safetensors"
    before = bq.get_num_threads()
    for call in (lambda: bq.quantize_file(path, q, "int8", **kw),
                 lambda: bq.quantize_file(tmp_path / "absent.safetensors", q, "int8", **kw),
                 lambda: bq.dequantize_file(path, tmp_path / "d.safetensors", **kw)):
        with pytest.raises(CheckpointError, match=f"^{option}: expected an integer"):
            call()
    assert not q.exists() and bq.get_num_threads() == before


def test_numpy_integers_are_counts_too(tmp_path, src):
    path, tensors = src
    q = tmp_path / "q.safetensors"
    res = bq.quantize_file(path, q, "int8", jobs=np.int64(1), threads=np.int32(2))
    assert sorted(res.quantized) == ["w", "w16", "wbf"]


def test_an_unknown_scheme_is_a_checkpoint_error_naming_the_option(tmp_path, src):
    path, _ = src
    with pytest.raises(CheckpointError, match=r"^--scheme: unknown scheme 'nvfp5'"):
        bq.quantize_file(path, tmp_path / "q.safetensors", "nvfp5")
    assert not (tmp_path / "q.safetensors").exists()


@pytest.mark.parametrize("name", ["m.bpk", "m.safetensors", "m.npz"])
def test_a_folder_is_not_written_under_a_file_name(tmp_path, src, name):
    path, _ = src
    folder = tmp_path / "model"
    folder.mkdir()
    path.rename(folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"names a \.\w+ file, but a model folder"):
        bq.quantize_file(folder, tmp_path / name, "int8")
    assert not (tmp_path / name).exists()
    # a trailing slash, or a name without the extension, says "a folder"
    bq.quantize_file(folder, tmp_path / "out", "int8")
    bq.quantize_file(folder, str(tmp_path / name) + "/", "int8")
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert (tmp_path / name / "model.safetensors").is_file()


def test_a_folder_into_a_gguf_name_is_converted_into_one_file(tmp_path, src):
    pytest.importorskip("gguf")
    path, _ = src
    folder = tmp_path / "model"
    folder.mkdir()
    path.rename(folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="int8 is a blockquant preset"):
        bq.quantize_file(folder, tmp_path / "m.gguf", "int8")
    res = bq.quantize_file(folder, tmp_path / "m.gguf", "Q8_0")
    assert (tmp_path / "m.gguf").is_file() and res.bytes_out == (tmp_path / "m.gguf").stat().st_size


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="POSIX named pipes")
def test_a_named_pipe_or_a_device_is_refused_without_waiting(tmp_path):
    import os

    pipe = tmp_path / "pipe.safetensors"
    os.mkfifo(pipe)
    # Reading the pipe would wait for a writer forever: the test would hang, not fail.
    for p in (pipe, Path("/dev/zero"), Path("/dev/null")):
        if not p.exists():
            continue
        with pytest.raises(CheckpointError, match="is not a regular file"):
            bq.load(p)
        with pytest.raises(CheckpointError, match="is not a regular file"):
            bq.quantize_file(p, tmp_path / "q.safetensors", "int8")
    assert not (tmp_path / "q.safetensors").exists()


def test_an_empty_path_is_refused_not_read_as_the_current_folder(tmp_path, src, monkeypatch):
    path, _ = src
    monkeypatch.chdir(tmp_path)  # a folder holding a checkpoint: '' must not find it
    for call in (lambda: bq.load(""), lambda: bq.quantize_file("", "q.safetensors", "int8"),
                 lambda: bq.quantize_file(path, "", "int8"),
                 lambda: bq.dequantize_file("", "d.safetensors")):
        with pytest.raises(CheckpointError, match="an empty name is no file or folder"):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
