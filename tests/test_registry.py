"""The front door for formats: every format recognised by its name and by its first bytes, an
unknown one refused, the output format decided in one place, and every writer publishing
through the one atomic helper (a failed publish leaves nothing behind)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import blockquant as bq
from blockquant import _fs
from blockquant.burnpack import save_burnpack
from blockquant.checkpoint import CheckpointError, SafetensorsWriter, open_checkpoint
from blockquant.checkpoint import formats as F
from blockquant.cli import main

W = {"w": np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32),
     "b": np.ones(32, np.float32)}


def safetensors_file(path: Path) -> Path:
    with SafetensorsWriter(path, [("w", "F32", (64, 32), 64 * 32 * 4),
                                  ("b", "F32", (32,), 32 * 4)]) as out:
        out.write("w", W["w"])
        out.write("b", W["b"])
        out.commit()
    return path


def each_format(tmp_path: Path) -> dict[str, Path]:
    """One file of each format blockquant reads, under its usual name."""
    files = {"safetensors": safetensors_file(tmp_path / "m.safetensors")}
    np.savez(tmp_path / "m.npz", **W)
    files["npz"] = tmp_path / "m.npz"
    np.save(tmp_path / "m.npy", W["w"])
    files["npy"] = tmp_path / "m.npy"
    save_burnpack(tmp_path / "m.bpk", W)
    files["burnpack"] = tmp_path / "m.bpk"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    files["gguf"] = gguf
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"\x08\x08\x12\x04test")  # ir_version 8, a producer name: no magic
    files["onnx"] = onnx
    (tmp_path / "folder").mkdir()
    files["folder"] = tmp_path / "folder"
    return files


def test_every_format_is_recognised_by_its_name_and_by_its_content(tmp_path):
    for name, path in each_format(tmp_path).items():
        assert F.detect(path).name == name
        if name != "folder":
            assert F.from_extension(path).name == name
        if F.by_name(name).magic is not None or name == "safetensors":
            # the content decides, whatever the name
            renamed = path.rename(path.with_name(f"renamed-{name}.data"))
            assert F.detect(renamed).name == name
            assert F.from_extension(renamed) is None


def test_content_wins_over_the_extension(tmp_path):
    path = safetensors_file(tmp_path / "really-safetensors.bpk")
    assert F.detect(path) is F.SAFETENSORS
    with open_checkpoint(path) as ckpt:
        assert ckpt.format == "safetensors"


def test_an_unknown_format_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"just some text, no checkpoint")
    assert F.from_extension(path) is None
    with pytest.raises(CheckpointError, match=r"notes\.txt: is not a file format blockquant"):
        F.detect(path)


@pytest.mark.parametrize(("src", "dst", "requested", "expected"), [
    ("m.safetensors", "q.safetensors", None, "safetensors"),
    ("m.safetensors", "q.bpk", None, "burnpack"),
    ("m.safetensors", "q.out", "burnpack", "burnpack"),
    ("m.bpk", "q.safetensors", None, "safetensors"),
    ("m.bpk", "q.BPK", None, "safetensors"),  # burn's loader wants .bpk: the name as before
    ("m.gguf", "q.gguf", None, "gguf"),
    ("m.gguf", "q.GGUF", None, "gguf"),
    ("m.onnx", "q.onnx", None, "onnx"),
    ("m.safetensors", "q.onnx", None, "onnx"),
    ("folder", "out.bpk/", None, "safetensors"),
])
def test_the_output_format_is_decided_in_one_place(src, dst, requested, expected):
    assert F.output_format(src, dst, requested).name == expected


def test_an_unknown_requested_format_is_refused():
    with pytest.raises(CheckpointError, match="unknown output format 'h5'"):
        F.output_format("m.safetensors", "q.h5", "h5")


@pytest.mark.parametrize("out, says", [
    ("q.gguf", "int8 is a blockquant preset, for safetensors and burn-pack outputs"),
    ("q.onnx", "an ONNX model is quantized into an ONNX model"),
])
def test_the_api_and_the_command_refuse_through_the_same_door(tmp_path, capsys, out, says):
    src = safetensors_file(tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=says) as raised:
        bq.quantize_file(src, tmp_path / out, "int8")
    assert main(["quantize", str(src), "-o", str(tmp_path / out), "--scheme", "int8"]) == 2
    assert capsys.readouterr().err == f"blockquant: error: {raised.value}\n"
    assert not (tmp_path / out).exists()


def test_the_api_writes_gguf_and_onnx_as_the_command_does(tmp_path):
    gguf = pytest.importorskip("gguf")
    src = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(src, "llama")
    w.add_tensor("blk.0.attn_q.weight", W["w"])
    w.add_tensor("blk.0.attn_norm.weight", W["b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    res = bq.quantize_file(src, tmp_path / "api.gguf", "q8_0")
    assert res.quantized == ["blk.0.attn_q.weight"]
    assert main(["quantize", str(src), "-o", str(tmp_path / "cli.gguf"), "--scheme", "q8_0",
                 "--quiet"]) == 0
    assert (tmp_path / "api.gguf").read_bytes() == (tmp_path / "cli.gguf").read_bytes()

    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [numpy_helper.from_array(W["w"], "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
              tmp_path / "m.onnx")
    res = bq.quantize_file(tmp_path / "m.onnx", tmp_path / "api.onnx", "int8_block32")
    assert res.quantized == ["w"]
    assert main(["quantize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "cli.onnx"),
                 "--scheme", "int8_block32", "--quiet"]) == 0
    a, c = onnx.load(tmp_path / "api.onnx"), onnx.load(tmp_path / "cli.onnx")
    assert [numpy_helper.to_array(t).tobytes() for t in a.graph.initializer] == \
        [numpy_helper.to_array(t).tobytes() for t in c.graph.initializer]


# -- one publish helper -------------------------------------------------------------------------
def _failing_publish(monkeypatch):
    calls = []

    def fail(tmp, path, *, force, record=True):
        calls.append(Path(path).name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_fs, "publish", fail)
    return calls


@pytest.mark.parametrize("out", ["q.safetensors", "q.bpk"])
def test_a_failed_publish_leaves_nothing_quantize(tmp_path, monkeypatch, out):
    src = safetensors_file(tmp_path / "m.safetensors")
    before = sorted(p.name for p in tmp_path.iterdir())
    calls = _failing_publish(monkeypatch)
    with pytest.raises((CheckpointError, OSError), match="No space left"):
        bq.quantize_file(src, tmp_path / out, "int8")
    assert calls == [out]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_failed_publish_leaves_nothing_dequantize_and_burnpack(tmp_path, monkeypatch):
    src = safetensors_file(tmp_path / "m.safetensors")
    bq.quantize_file(src, tmp_path / "q.safetensors", "int8")
    before = sorted(p.name for p in tmp_path.iterdir())
    calls = _failing_publish(monkeypatch)
    with pytest.raises(CheckpointError, match="No space left"):
        bq.dequantize_file(tmp_path / "q.safetensors", tmp_path / "d.safetensors")
    with pytest.raises(OSError, match="No space left"):
        save_burnpack(tmp_path / "s.bpk", W)
    assert calls == ["d.safetensors", "s.bpk"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_failed_publish_leaves_nothing_gguf(tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")
    from blockquant.checkpoint.gguf_file import requantize_gguf

    src = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(src, "llama")
    w.add_tensor("blk.0.ffn_up.weight", W["w"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    before = sorted(p.name for p in tmp_path.iterdir())
    calls = _failing_publish(monkeypatch)
    with pytest.raises(CheckpointError, match="No space left"):
        requantize_gguf(src, tmp_path / "q.gguf", "Q8_0")
    assert calls == ["q.gguf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_failed_publish_leaves_nothing_onnx(tmp_path, monkeypatch):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from blockquant.onnx import quantize_model

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
        [numpy_helper.from_array(W["w"], "w")])
    src = tmp_path / "m.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                    str(src))
    before = sorted(p.name for p in tmp_path.iterdir())
    calls = _failing_publish(monkeypatch)
    with pytest.raises((CheckpointError, OSError), match="No space left"):
        quantize_model(src, tmp_path / "q.onnx", "int8_block32")
    assert calls == ["q.onnx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_every_format_enters_by_the_front_door():
    # A format is recognised, read and written through one table: what says it writes has a
    # planner, what a file of it holds has a reader, and nothing is planned for a format the
    # table does not name.
    from blockquant.checkpoint import registry

    table = registry.entries()
    assert set(table) == {f.name for f in F.FORMATS}
    for name, entry in table.items():
        assert entry.format.name == name
        assert (entry.plan is not None) == entry.format.writes, name
        if entry.format.magic is not None or name == "safetensors":
            assert entry.reader is not None, name  # a file told by its content is read
    assert set(registry.PLANNERS) <= set(F.FORMATS)
