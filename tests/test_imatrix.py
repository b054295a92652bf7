"""llama.cpp's importance matrices: both file formats written here by hand from their
definitions (the GGUF one's NAME.in_sum2 / NAME.counts, the legacy .dat's int32 counts and
lengths), read back as sum / count; hostile files refused in one line; the report's
importance-weighted SQNR recomputed here; calibration mse's search weighted by the matrix."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

import blockquant as bq
from blockquant.checkpoint import CheckpointError, FileOptions
from blockquant.checkpoint.imatrix import ggml_floor, read_imatrix
from blockquant.cli import main
from blockquant.presets import resolve

gguf = pytest.importorskip("gguf")
st = pytest.importorskip("safetensors.numpy")
from gguf import GGUFReader, GGUFWriter  # noqa: E402


def imatrix_gguf(path: Path, entries: dict[str, tuple[np.ndarray, np.ndarray]],
                 meta: bool = True, sums_dtype=np.float32) -> Path:
    """``entries``: name -> (sums of shape (n_mat, ne0), counts of n_mat)."""
    w = GGUFWriter(path, "")
    w.add_string("general.type", "imatrix")
    if meta:
        w.add_array("imatrix.datasets", ["calibration.txt"])
        w.add_uint32("imatrix.chunk_count", 7)
        w.add_uint32("imatrix.chunk_size", 512)
    for name, (sums, counts) in entries.items():
        w.add_tensor(f"{name}.in_sum2", sums.astype(sums_dtype))
        w.add_tensor(f"{name}.counts", np.asarray(counts, np.float32).reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def legacy(entries: list[tuple[bytes, int, list[float]]], trailer: bytes = b"",
           count: int | None = None) -> bytes:
    out = struct.pack("<i", len(entries) if count is None else count)
    for name, ncall, values in entries:
        out += struct.pack("<i", len(name)) + name + struct.pack("<ii", ncall, len(values))
        out += struct.pack(f"<{len(values)}f", *values)
    return out + trailer


def test_gguf_format_is_sum_over_count(tmp_path):
    dense = np.arange(1, 65, dtype=np.float32).reshape(1, 64)
    experts = np.full((3, 32), 6.0, np.float32)
    path = imatrix_gguf(tmp_path / "imatrix.gguf", {
        "blk.0.ffn_down.weight": (dense, [4.0]),
        "blk.0.ffn_up_exps.weight": (experts, [2.0, 0.0, 3.0])})
    m = read_imatrix(path)
    assert not m.legacy and m.chunks == 7 and m.datasets == ("calibration.txt",)
    np.testing.assert_array_equal(m.values["blk.0.ffn_down.weight"], dense / 4)
    # an expert no token reached (count 0) weighs 1, as llama-quantize reads it
    np.testing.assert_array_equal(m.values["blk.0.ffn_up_exps.weight"][:, 0], [3.0, 1.0, 2.0])
    assert m.weights("blk.0.ffn_down.weight", (8, 64)).shape == (64,)
    assert m.weights("blk.0.ffn_up_exps.weight", (3, 16, 32)).shape == (3, 1, 32)
    assert m.weights("blk.9.attn_q.weight", (8, 64)) is None
    with pytest.raises(CheckpointError, match="does not fit"):
        m.weights("blk.0.ffn_down.weight", (8, 32))


def test_legacy_format_is_value_over_calls(tmp_path):
    data = legacy([(b"blk.0.attn_q.weight", 10, [10.0, 20.0, 30.0, 40.0]),
                   (b"blk.0.attn_k.weight", 0, [1.5, 2.5])],
                  trailer=struct.pack("<ii", 12, 4) + b"wiki")
    (tmp_path / "m.dat").write_bytes(data)
    m = read_imatrix(tmp_path / "m.dat")
    assert m.legacy and m.chunks == 12 and m.datasets == ("wiki",)
    np.testing.assert_array_equal(m.values["blk.0.attn_q.weight"], [[1.0, 2.0, 3.0, 4.0]])
    np.testing.assert_array_equal(m.values["blk.0.attn_k.weight"], [[1.5, 2.5]])


def test_every_cut_of_a_legacy_file_is_refused_or_whole(tmp_path):
    entries = [(b"a.weight", 2, [2.0, 4.0]), (b"b.weight", 1, [1.0])]
    body = legacy(entries)
    full = body + struct.pack("<ii", 3, 2) + b"ds"
    for cut in range(len(full)):
        p = tmp_path / f"cut{cut}.dat"
        p.write_bytes(full[:cut])
        # whole entries and then the whole chunk count: a file without (part of) its trailer
        if cut in (len(body), len(body) + 4):
            assert set(read_imatrix(p).values) == {"a.weight", "b.weight"}
            continue
        with pytest.raises(CheckpointError):
            read_imatrix(p)


@pytest.mark.parametrize("data, says", [
    (struct.pack("<i", 0), "0 entries"),
    (struct.pack("<i", 2**31 - 1) + b"\0" * 32, "entries in"),
    (legacy([(b"x", 1, [1.0])], count=-3), "entries in"),
    (struct.pack("<i", 1) + struct.pack("<i", -5) + b"\0" * 16, "needs -5 bytes"),
    (struct.pack("<i", 1) + struct.pack("<i", 2**30) + b"\0" * 16, "needs 1073741824 bytes"),
    (legacy([(b"x", 1, [])]) + b"\0" * 12, "has 0 values"),
    (struct.pack("<i", 1) + struct.pack("<i", 1) + b"x" + struct.pack("<ii", 1, 2**30)
     + b"\0" * 8, "values needs"),
    (legacy([(b"x", 1, [float("nan")])]), "NaN"),
    (legacy([(b"x", 1, [-1.0])]), "negative"),
    (legacy([(b"\xff\xfe", 1, [1.0])]), "not UTF-8"),
    (legacy([(b"x", 1, [1.0]), (b"x", 1, [2.0])]), "given twice"),
    (legacy([(b"x", 1, [1.0])], trailer=struct.pack("<ii", 1, 99)), "dataset name needs"),
])
def test_hostile_legacy_files_are_one_line(tmp_path, capsys, data, says):
    src = tmp_path / "m.safetensors"
    st.save_file({"x": np.ones((4, 32), np.float32)}, str(src))
    bad = tmp_path / "bad.dat"
    bad.write_bytes(data)
    assert main(["report", str(src), "--scheme", "int4_block16", "--imatrix", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"blockquant: error: {bad}")
    assert says in err


def test_hostile_gguf_imatrix_files(tmp_path):
    ok = np.ones((1, 32), np.float32)
    cases = {
        "no counts": lambda p: _one(p, "x.weight.in_sum2", ok),
        "counts of another size": lambda p: imatrix_gguf(p, {"x.weight": (ok, [1.0, 2.0])}),
        "not F32": lambda p: imatrix_gguf(p, {"x.weight": (ok, [1.0])}, sums_dtype=np.float16),
        "NaN": lambda p: imatrix_gguf(p, {"x.weight": (ok * np.nan, [1.0])}),
        "no NAME.in_sum2": lambda p: _one(p, "token_embd.weight", ok),
    }
    for what, make in cases.items():
        p = make(tmp_path / f"{what}.gguf")
        with pytest.raises(CheckpointError):
            read_imatrix(p)
    p = tmp_path / "cut.gguf"
    p.write_bytes(imatrix_gguf(tmp_path / "whole.gguf",
                               {"x.weight": (ok, [1.0])}).read_bytes()[:-40])
    with pytest.raises(CheckpointError):
        read_imatrix(p)


def _one(path: Path, name: str, x: np.ndarray) -> Path:
    w = GGUFWriter(path, "")
    w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def weighted_sqnr(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    x, y = x.astype(np.float64), y.astype(np.float64)
    return 10 * math.log10(float(np.sum(w * x * x)) / float(np.sum(w * (x - y) ** 2)))


def test_report_weighs_a_gguf_files_error_by_the_matrix(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((16, 64)) * 0.1).astype(np.float32)
    model = tmp_path / "m.gguf"
    w = GGUFWriter(model, "llama")
    w.add_tensor("blk.0.attn_q.weight", x)
    w.add_tensor("blk.0.attn_k.weight", x[:, :32].copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    imp = np.exp(rng.normal(0, 2, 64)).astype(np.float32)
    im = imatrix_gguf(tmp_path / "i.gguf", {"blk.0.attn_q.weight": (imp[None] * 5, [5.0])})
    assert main(["report", str(model), "--scheme", "q4_0", "--pure", "--imatrix", str(im),
                 "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in rep["tensors"]}
    # measured as written: Q4_0 searched under the tensor's importance (as read, floored)
    read = read_imatrix(im).values["blk.0.attn_q.weight"][0]
    y = bq.gguf.dequantize(bq.gguf.quantize(x, "Q4_0", weights=ggml_floor(read)), "Q4_0")
    plain = bq.gguf.dequantize(bq.gguf.quantize(x, "Q4_0"), "Q4_0")
    got = rows["blk.0.attn_q.weight"]["sqnr_imatrix_db"]
    assert got == pytest.approx(weighted_sqnr(x, y, read), abs=1e-9)
    assert got > weighted_sqnr(x, plain, read) + 1.0  # the weights pay where they are large
    assert rows["blk.0.attn_k.weight"]["sqnr_imatrix_db"] is None  # no entry for it
    assert rep["overall"]["imatrix_tensors"] == 1
    # a GGUF output takes it too: the tensor it names is weighted, the other one is not
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(model), "-o", str(out), "--scheme", "q4_0", "--pure",
                 "--imatrix", str(im)]) == 0
    capsys.readouterr()
    tensors = {t.name: t for t in GGUFReader(out).tensors}
    assert bytes(tensors["blk.0.attn_q.weight"].data) == \
        bq.gguf.quantize(x, "Q4_0", weights=ggml_floor(read)).tobytes()
    assert bytes(tensors["blk.0.attn_k.weight"].data) == \
        bq.gguf.quantize(x[:, :32], "Q4_0").tobytes()


def llama_file(root: Path, x: np.ndarray) -> Path:
    root.mkdir()
    st.save_file({"model.layers.0.self_attn.q_proj.weight": x}, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1,
        "num_attention_heads": 2, "hidden_size": x.shape[1]}))
    return root / "model.safetensors"


def test_mse_searches_the_weighted_error_under_hugging_face_names(tmp_path, capsys):
    rng = np.random.default_rng(1)
    x = rng.standard_t(4, (64, 256)).astype(np.float32) * 0.02
    src = llama_file(tmp_path / "m", x)
    imp = np.exp(rng.normal(0, 2, 256)).astype(np.float32)
    # the matrix is keyed by the GGUF name llama.cpp gives the tensor
    im = imatrix_gguf(tmp_path / "i.gguf", {"blk.0.attn_q.weight": (imp[None], [1.0])})
    scheme = "int4_block16"  # searched scales (mse)
    assert main(["report", str(src), "--scheme", scheme, "--imatrix", str(im), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["tensors"][0]
    plain = bq.quantize(x, scheme).dequantize()
    weighted = bq.quantize(x, scheme, weights=np.broadcast_to(imp, x.shape)).dequantize()
    assert row["sqnr_imatrix_db"] == pytest.approx(weighted_sqnr(x, weighted, imp), abs=1e-9)
    assert row["sqnr_imatrix_db"] > weighted_sqnr(x, plain, imp) + 0.5
    # the file written is the weighted quantization, bit for bit
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(src), "-o", str(out), "--scheme", scheme, "--imatrix", str(im),
                 "-q"]) == 0
    got = bq.load(out)["model.layers.0.self_attn.q_proj.weight"].dequantize()
    assert np.array_equal(got.view(np.uint32), weighted.view(np.uint32))
    # minmax calibration does not search: the matrix only measures
    opts = FileOptions(imatrix=str(im), calibration="minmax")
    rep = bq.checkpoint.report_file(src, resolve("int4_block32"), opts)
    assert rep["tensors"][0]["sqnr_imatrix_db"] is not None
