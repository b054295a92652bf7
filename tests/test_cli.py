"""The `blockquant` command on small checkpoints it builds itself: quantize, dequantize, inspect,
report, demo, --version; the file format; and every user error (exit 2, one line, nothing written)."""

import importlib.metadata
import io
import json
import os
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import blockquant as bq
from blockquant.checkpoint import SafetensorsWriter, quantize_file
from blockquant.cli import ProgressBar, main
from blockquant.metrics import ErrorStats, sqnr_db


# -- an independent, minimal safetensors codec (not the one under test) -------------------------
def write_raw(path, tensors, metadata=None):
    """tensors: name -> (safetensors dtype, shape, bytes)."""
    header, blobs, at = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def read_raw(path):
    """name -> (dtype, shape, bytes), and the metadata."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {k: (v["dtype"], tuple(v["shape"]), data[slice(*v["data_offsets"])]) for k, v in header.items()}
    return out, meta


@pytest.fixture
def tensors():
    rng = np.random.default_rng(7)
    return {
        "layer.0.w": rng.normal(0, 0.02, (48, 80)).astype(np.float32),  # 80 = 2.5 blocks of 32
        "layer.0.w16": rng.normal(0, 1.0, (16, 64)).astype(np.float16),
        "layer.1.wbf": rng.normal(0, 0.5, (8, 96)).astype(ml_dtypes.bfloat16),
        "layer.1.w64": rng.normal(0, 3.0, (5, 33)),
        "norm": (1 + rng.normal(0, 0.1, (80,))).astype(np.float32),
        "ids": np.arange(12, dtype=np.int64).reshape(3, 4),
        "mask": np.array([True, False, True]),
    }


_ST = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
       "bool": "BOOL"}


@pytest.fixture
def ckpt(tmp_path, tensors):
    path = tmp_path / "model.safetensors"
    write_raw(path, {k: (_ST[v.dtype.name], v.shape, v.tobytes()) for k, v in tensors.items()},
              {"format": "pt"})
    return path


def run(*argv):
    return main([str(a) for a in argv])


def one_error_line(capsys, *words):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blockquant: error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def only_files(folder):
    return sorted(p.name for p in folder.iterdir())


FLOATS = ["layer.0.w", "layer.0.w16", "layer.1.wbf", "layer.1.w64", "norm"]


# -- quantize -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "scheme",
    ["nvfp4", "mxfp4", "int8_block32", "int8", "bitnet", "q4f/packed_u32_1/block4x8:bf16",
     "e5m2/native/block16:ue4m3+tensor:f32"],
)
def test_quantize_equals_the_library_bit_for_bit(tmp_path, ckpt, tensors, scheme):
    out = tmp_path / "q.safetensors"
    s = bq.presets.resolve(scheme)
    two_d = s.store.dim > 0 or (s.block is not None and len(s.block.size) > 1)
    floats = [n for n in FLOATS if n != "norm"] if two_d else FLOATS  # norm is 1-D
    exclude = ["--exclude", "^norm$"] if two_d else []
    # --min-rank 1: the 1-D norm too (kept by default)
    assert run("quantize", ckpt, "-o", out, "--scheme", scheme, "-q", "--min-rank", "1",
               *exclude) == 0
    cal = s.options.calibration or "minmax"  # a preset's own (bitnet: absmean)
    loaded = load_file(out)  # the safetensors library reads it (strict about offsets)
    raw, meta = read_raw(out)
    assert meta["format"] == "pt"
    entries = json.loads(meta["blockquant"])
    assert entries["format"] == 2
    for name in floats:
        x = tensors[name]
        qt = bq.quantize(x, s)
        e = entries["tensors"][name]
        assert e["scheme"] == str(s) and e["shape"] == list(x.shape) and e["dtype"] == x.dtype.name
        assert e["calibration"] == cal
        np.testing.assert_array_equal(loaded[f"{name}.values"], qt.values)
        assert loaded[f"{name}.values"].dtype == qt.values.dtype
        # values, scales, global scale, one after the other, are burn's bytes exactly
        parts = [raw[f"{name}.values"][2], raw[f"{name}.scales"][2]]
        if s.is_two_level:
            assert raw[f"{name}.global_scale"][:2] == ("F32", ())
            parts.append(raw[f"{name}.global_scale"][2])
        assert b"".join(parts) == qt.to_bytes()
        # the scale grid in burn's byte order (swapped when values pack along an outer axis)
        assert loaded[f"{name}.scales"].shape == s.layout(x.shape).stored_scale_grid
        if s.store.dim == 0:
            assert loaded[f"{name}.scales"].shape == qt.scales.shape
    for name in ("ids", "mask", *set(FLOATS) - set(floats)):  # copied as they are
        np.testing.assert_array_equal(loaded[name], tensors[name])
    assert len(loaded) == len(tensors) + len(floats) * (2 if s.is_two_level else 1)


def test_scales_are_stored_in_their_dtype(tmp_path, ckpt, tensors):
    out = tmp_path / "q.safetensors"
    for scheme, st_dtype in [("nvfp4", "U8"), ("mxfp4", "U8"), ("int8_block32", "F16"),
                             ("int8", "F32"), ("q8s/native/block32:bf16", "U16")]:
        assert run("quantize", ckpt, "-o", out, "--scheme", scheme, "-q", "--force") == 0
        loaded = load_file(out)
        qt = bq.quantize(tensors["layer.0.w"], scheme)
        got = loaded["layer.0.w.scales"]
        assert got.dtype == {"U8": np.uint8, "F16": np.float16, "F32": np.float32,
                             "U16": np.uint16}[st_dtype]
        # ml_dtypes agrees on the codes
        np.testing.assert_array_equal(got.view(np.uint8), qt.scales_view().view(np.uint8))


def test_dequantize_round_trip(tmp_path, ckpt, tensors):
    q, d = tmp_path / "q.safetensors", tmp_path / "d.safetensors"
    assert run("quantize", ckpt, "-o", q, "--scheme", "nvfp4", "-q", "--min-rank", "1") == 0
    assert run("dequantize", q, "-o", d, "-q") == 0
    raw, meta = read_raw(d)
    assert meta == {"format": "pt"}
    assert set(raw) == set(tensors)
    for name in FLOATS:
        x = tensors[name]
        want = bq.quantize(x, bq.presets.nvfp4()).dequantize(x.dtype)
        dtype, shape, data = raw[name]
        assert (dtype, shape) == (_ST[x.dtype.name], x.shape)
        assert data == want.tobytes()  # bf16 too: written by blockquant, compared to ml_dtypes
    for name in ("ids", "mask"):
        assert raw[name][2] == tensors[name].tobytes()


def test_dequantize_dtype_override(tmp_path, ckpt, tensors):
    q, d = tmp_path / "q.safetensors", tmp_path / "d.safetensors"
    assert run("quantize", ckpt, "-o", q, "--scheme", "int8_block32", "-q", "--min-rank", "1") == 0
    assert run("dequantize", q, "-o", d, "--dtype", "float16", "-q") == 0
    loaded = load_file(d)
    for name in FLOATS:
        want = bq.quantize(tensors[name], bq.presets.int8_block32()).dequantize(np.float16)
        np.testing.assert_array_equal(loaded[name], want)


def test_npz_and_npy_inputs(tmp_path, tensors):
    plain = {k: v for k, v in tensors.items() if v.dtype.name != "bfloat16"}
    np.savez(tmp_path / "m.npz", **plain)
    np.save(tmp_path / "emb.npy", tensors["layer.0.w"])
    assert run("quantize", tmp_path / "m.npz", "-o", tmp_path / "a.safetensors", "--scheme", "mxfp4", "-q",
               "--min-rank", "1") == 0
    loaded = load_file(tmp_path / "a.safetensors")
    for name, x in plain.items():
        if x.dtype.kind == "f":
            np.testing.assert_array_equal(loaded[f"{name}.values"], bq.quantize(x, bq.presets.mxfp4()).values)
        else:
            np.testing.assert_array_equal(loaded[name], x)
    assert run("quantize", tmp_path / "emb.npy", "-o", tmp_path / "b.safetensors", "--scheme", "int8", "-q") == 0
    loaded = load_file(tmp_path / "b.safetensors")
    assert set(loaded) == {"emb.values", "emb.scales"}
    np.testing.assert_array_equal(loaded["emb.values"], bq.quantize(tensors["layer.0.w"], bq.presets.int8()).values)


def test_include_and_exclude(tmp_path, ckpt, tensors):
    out = tmp_path / "q.safetensors"
    assert run("quantize", ckpt, "-o", out, "--scheme", "e4m3/native/block16x16:ue8m0",
               "--include", r"^layer\.", "--exclude", "w64$", "-q") == 0
    loaded = load_file(out)
    quantized = {k[: -len(".values")] for k in loaded if k.endswith(".values")}
    assert quantized == {"layer.0.w", "layer.0.w16", "layer.1.wbf"}
    np.testing.assert_array_equal(loaded["norm"], tensors["norm"])
    np.testing.assert_array_equal(loaded["layer.1.w64"], tensors["layer.1.w64"])


def test_zero_d_and_empty_tensors(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"s": np.array(2.5, np.float32), "e": np.zeros((0, 7), np.float32)}, path)
    q, d = tmp_path / "q.safetensors", tmp_path / "d.safetensors"
    assert run("quantize", path, "-o", q, "--scheme", "nvfp4", "-q") == 0
    assert run("dequantize", q, "-o", d, "-q") == 0
    loaded = load_file(d)
    assert loaded["s"].shape == () and loaded["e"].shape == (0, 7)
    assert loaded["s"] == bq.quantize(np.float32(2.5), bq.presets.nvfp4()).dequantize()


def test_force(tmp_path, ckpt, capsys):
    out = tmp_path / "q.safetensors"
    out.write_bytes(b"precious")
    assert run("quantize", ckpt, "-o", out, "--scheme", "nvfp4") == 2
    one_error_line(capsys, str(out), "already exists", "--force")
    assert out.read_bytes() == b"precious"
    assert run("quantize", ckpt, "-o", out, "--scheme", "nvfp4", "--force") == 0
    assert "layer.0.w.values" in load_file(out)
    assert only_files(tmp_path) == ["model.safetensors", "q.safetensors"]
    out_d = tmp_path / "d.safetensors"
    out_d.write_bytes(b"precious")
    assert run("dequantize", out, "-o", out_d) == 2
    assert out_d.read_bytes() == b"precious"


def test_summary_and_quiet(tmp_path, ckpt, capsys):
    assert run("quantize", ckpt, "-o", tmp_path / "q.safetensors", "--scheme", "nvfp4") == 0
    out = capsys.readouterr()
    assert "4 of 7 tensors quantized with e2m1/packed_native0/block16:ue4m3+tensor:f32" in out.out
    assert "left 3 tensors unquantized: 1 of rank below 2" in out.out  # the 1-D norm
    assert out.err == ""  # not a terminal: no progress bar
    assert run("quantize", ckpt, "-o", tmp_path / "r.safetensors", "--scheme", "nvfp4", "-q") == 0
    assert capsys.readouterr() == ("", "")


def test_summary_compares_tensor_data_with_tensor_data_and_names_the_file_written(tmp_path,
                                                                                capsys):
    src = tmp_path / "w.npy"
    np.save(src, np.ones((64, 64), np.float32))
    assert run("quantize", src, "-o", f"{tmp_path}/out/", "--scheme", "int8") == 0
    line = capsys.readouterr().out.strip()
    written = tmp_path / "out" / "w.safetensors"
    # one tensor: singular; 16 KiB of float32 to 4 KiB of int8 codes (and a 4-byte scale)
    assert line.startswith(f"{written}: 1 of 1 tensor quantized with q8s/native/tensor:f32, "
                           "tensor data 16.0 KiB -> 4.0 KiB (4.00x), "), line
    assert f"{written.stat().st_size / 1024:.1f} KiB written in " in line
    dq = tmp_path / "back"
    assert run("dequantize", written, "-o", f"{dq}/") == 0
    assert capsys.readouterr().out.startswith(f"{dq / 'w.safetensors'}: 1 tensor dequantized, ")


# -- errors: exit 2, one line naming file and tensor, nothing written ----------------------------
def test_missing_input(tmp_path, capsys):
    assert run("quantize", tmp_path / "nope.safetensors", "-o", tmp_path / "q.safetensors", "--scheme", "nvfp4") == 2
    one_error_line(capsys, "nope.safetensors", "No such file")
    assert only_files(tmp_path) == []


@pytest.mark.parametrize(
    "mangle, words",
    [
        (lambda b: b[:5], ["too short"]),
        (lambda b: b[:40], ["truncated"]),
        (lambda b: b[:-10], [": ids: data offsets", "truncated"]),
        (lambda b: b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all", ["malformed safetensors header"]),
        (lambda b: os.urandom(300), ["not a safetensors file"]),
        (lambda b: b"PK\x03\x04garbage", ["not a valid .npz"]),
        (lambda b: b"\x93NUMPYgarbage", ["malformed .npy"]),
    ],
)
def test_malformed_input(tmp_path, ckpt, capsys, mangle, words):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(mangle(ckpt.read_bytes()))
    for cmd in (["quantize", bad, "-o", tmp_path / "q.safetensors", "--scheme", "nvfp4"],
                ["inspect", bad], ["report", bad, "--scheme", "nvfp4"]):
        assert run(*cmd) == 2
        one_error_line(capsys, str(bad), *words)
    assert only_files(tmp_path) == ["bad.safetensors", "model.safetensors"]


def test_bad_header_entries(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    write_raw(bad, {"w": ("F32", (2, 3), b"\x00" * 20)})  # 6 floats need 24 bytes
    assert run("inspect", bad) == 2
    one_error_line(capsys, f"{bad}: w: F32 [2, 3] takes 24 bytes, its offsets span 20")
    write_raw(bad, {"w": ("F32", (-2,), b"")})
    assert run("inspect", bad) == 2
    one_error_line(capsys, f"{bad}: w: malformed safetensors header entry")


@pytest.mark.parametrize("scheme, words", [
    ("q4s/native/block32:f8", ["--scheme", "unknown scale dtype 'f8' in 'q4s/native/block32:f8'"]),
    ("nvfp5", ["--scheme", "unknown scheme 'nvfp5'"]),
])
def test_unknown_scheme(tmp_path, ckpt, capsys, scheme, words):
    assert run("quantize", ckpt, "-o", tmp_path / "q.safetensors", "--scheme", scheme) == 2
    one_error_line(capsys, *words)
    assert run("report", ckpt, "--scheme", scheme) == 2
    one_error_line(capsys, *words)
    assert only_files(tmp_path) == ["model.safetensors"]


def test_tensor_that_cannot_take_the_scheme(tmp_path, ckpt, capsys):
    out = tmp_path / "q.safetensors"
    # --min-rank 1 lets the 1-D norm reach the scheme; --strict makes the misfit an error
    assert run("quantize", ckpt, "-o", out, "--scheme", "q8s/native/block32x32:f16",
               "--min-rank", "1", "--strict") == 2
    one_error_line(capsys, f"{ckpt}: norm: block [32, 32] has 2 dimensions", "--exclude")
    assert only_files(tmp_path) == ["model.safetensors"]
    assert run("quantize", ckpt, "-o", out, "--scheme", "q4s/packed_native1/block32:f16",
               "--min-rank", "1", "--strict") == 2
    one_error_line(capsys, f"{ckpt}: norm: packing dim 1")
    # without --strict it is kept, and the summary says so
    assert run("quantize", ckpt, "-o", out, "--scheme", "q8s/native/block32x32:f16",
               "--min-rank", "1") == 0
    assert "1 the scheme cannot take" in capsys.readouterr().out
    np.testing.assert_array_equal(load_file(out)["norm"], np.asarray(load_file(ckpt)["norm"]))


def test_non_finite_values_fail_midway_and_leave_nothing(tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    bad = np.ones((4, 32), np.float32)
    bad[2, 5] = np.nan
    save_file({"a": np.ones((64, 64), np.float32), "z": bad}, path)
    assert run("quantize", path, "-o", tmp_path / "q.safetensors", "--scheme", "nvfp4") == 2
    one_error_line(capsys, f"{path}: z:", "69")  # flat index 2 * 32 + 5
    assert only_files(tmp_path) == ["m.safetensors"]


def test_interrupted_run_leaves_nothing(tmp_path, ckpt):
    def interrupt(name, nbytes):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        quantize_file(ckpt, tmp_path / "q.safetensors", bq.presets.nvfp4(), progress=interrupt)
    assert only_files(tmp_path) == ["model.safetensors"]


def test_ctrl_c_while_the_arguments_are_read_is_one_line(monkeypatch, tmp_path, ckpt, capsys):
    import argparse

    def interrupt(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", interrupt)
    assert run("quantize", ckpt, "-o", tmp_path / "q.safetensors", "--scheme", "int8") == 130
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "\nblockquant: interrupted\n"
    assert only_files(tmp_path) == ["model.safetensors"]


def test_name_collision_is_an_error(tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones((4, 32), np.float32), "w.values": np.ones(3, np.int8)}, path)
    assert run("quantize", path, "-o", tmp_path / "q.safetensors", "--scheme", "int8") == 2
    one_error_line(capsys, "'w.values' is taken twice")
    assert only_files(tmp_path) == ["m.safetensors"]


def test_requantizing_or_dequantizing_the_wrong_file(tmp_path, ckpt, capsys):
    q = tmp_path / "q.safetensors"
    assert run("quantize", ckpt, "-o", q, "--scheme", "nvfp4", "-q") == 0
    assert run("quantize", q, "-o", tmp_path / "qq.safetensors", "--scheme", "nvfp4") == 2
    one_error_line(capsys, str(q), "already holds blockquant-quantized tensors")
    assert run("dequantize", ckpt, "-o", tmp_path / "d.safetensors") == 2
    one_error_line(capsys, str(ckpt), "no blockquant-quantized tensor")
    assert only_files(tmp_path) == ["model.safetensors", "q.safetensors"]


def test_dequantize_checks_the_parts(tmp_path, ckpt, capsys):
    q, bad = tmp_path / "q.safetensors", tmp_path / "bad.safetensors"
    assert run("quantize", ckpt, "-o", q, "--scheme", "mxfp4", "-q", "--min-rank", "1") == 0
    raw, meta = read_raw(q)
    dtype, shape, data = raw["norm.scales"]
    raw["norm.scales"] = (dtype, shape, b"\xff" + data[1:])  # UE8M0 0xFF is NaN
    write_raw(bad, raw, meta)
    assert run("dequantize", bad, "-o", tmp_path / "d.safetensors") == 2
    one_error_line(capsys, f"{bad}: norm:")
    del raw["norm.scales"]
    write_raw(bad, raw, meta)
    assert run("dequantize", bad, "-o", tmp_path / "d.safetensors") == 2
    one_error_line(capsys, f"{bad}: norm: its scales tensor 'norm.scales' is missing")
    raw, meta = read_raw(q)
    m = json.loads(meta["blockquant"])
    m["tensors"]["norm"]["scheme"] = "e2m1/packed_native0/block16:ue8m0"
    meta["blockquant"] = json.dumps(m)
    write_raw(bad, raw, meta)
    assert run("dequantize", bad, "-o", tmp_path / "d.safetensors") == 2
    one_error_line(capsys, f"{bad}: norm: norm.scales is U8 [3]")
    assert not (tmp_path / "d.safetensors").exists()


# -- inspect, report ----------------------------------------------------------------------------
def test_inspect(tmp_path, ckpt, capsys):
    q = tmp_path / "q.safetensors"
    assert run("quantize", ckpt, "-o", q, "--scheme", "int4_block32", "-q", "--min-rank", "1") == 0
    assert run("inspect", q) == 0
    out = capsys.readouterr().out
    assert "7 tensors (5 quantized)" in out and "format=pt" in out
    assert "| layer.0.w " in out and "q4s/packed_u32_0/block32:f16" in out and "48x80" in out
    assert run("inspect", q, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in info["tensors"]}
    assert [r["name"] for r in info["tensors"]] == ["ids", "layer.0.w", "layer.0.w16", "layer.1.w64", "layer.1.wbf", "mask", "norm"]
    w = rows["layer.0.w"]
    assert w["scheme"] == "q4s/packed_u32_0/block32:f16" and w["dtype"] == "float32"
    assert w["bytes"] == bq.quantize(np.zeros((48, 80), np.float32), bq.presets.int4_block32()).nbytes
    assert w["bits_per_value"] == pytest.approx(8 * w["bytes"] / (48 * 80))
    assert rows["ids"]["scheme"] is None and rows["ids"]["bits_per_value"] == 64
    assert run("inspect", ckpt, "--json") == 0  # a plain checkpoint too
    assert all(r["scheme"] is None for r in json.loads(capsys.readouterr().out)["tensors"])


def test_report(ckpt, tensors, capsys):
    assert run("report", ckpt, "--scheme", "nvfp4", "--json", "--exclude", "norm") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["scheme"] == "e2m1/packed_native0/block16:ue4m3+tensor:f32"
    rows = {r["name"]: r for r in rep["tensors"]}
    assert set(rows) == set(FLOATS) - {"norm"}
    total = ErrorStats()
    for name, r in rows.items():
        x = tensors[name]
        qt = bq.quantize(x, bq.presets.nvfp4())
        stats = ErrorStats.between(x, qt.dequantize())  # the formulas: tests/test_metrics.py
        assert r["sqnr_db"] == pytest.approx(sqnr_db(x, qt.dequantize()), rel=1e-9)
        assert r["max_abs_err"] == pytest.approx(stats.max_abs_err, rel=1e-12)
        assert r["bytes_before"] == x.nbytes and r["bytes_after"] == qt.nbytes
        total += stats
    o = rep["overall"]
    assert o["sqnr_db"] == pytest.approx(total.sqnr_db, rel=1e-9)  # summed, not averaged
    assert o["numel"] == total.numel
    assert o["bytes_after"] == sum(r["bytes_after"] for r in rows.values())
    assert rep["file_total"]["unquantized"] == 3
    assert run("report", ckpt, "--scheme", "int8_block32", "--min-rank", "1") == 0
    out = capsys.readouterr().out
    assert "| overall (5 tensors)" in out and "SQNR dB" in out and "whole file:" in out


def test_report_exact_tensor_has_null_sqnr(tmp_path, capsys):
    path = tmp_path / "m.npz"
    np.savez(path, z=np.zeros((4, 32), np.float32))
    assert run("report", path, "--scheme", "int8", "--json") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["tensors"][0]["sqnr_db"] is None and rep["overall"]["sqnr_db"] is None


# -- the rest of the command --------------------------------------------------------------------
def test_progress_bar_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = ProgressBar(100, "quantize", stream=tty)
    bar("a", 50)
    bar("b", 50)
    bar.close()
    assert "\r" in tty.getvalue() and "100%" in tty.getvalue() and "[" in tty.getvalue()
    for stream, quiet in ((io.StringIO(), False), (Tty(), True)):
        bar = ProgressBar(100, "quantize", quiet=quiet, stream=stream)
        bar("a", 100)
        bar.close()
        assert stream.getvalue() == ""


def test_demo_still_runs(capsys):
    assert run("demo", "--repeat", "1") == 0
    out = capsys.readouterr().out
    assert "| nvfp4 |" in out.replace("  ", " ") or "nvfp4" in out


def test_bench_is_not_a_command(capsys):
    assert run("bench") == 2  # the benchmark is benches/bench.py, outside the package
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def test_version(capsys, monkeypatch):
    assert run("--version") == 0
    assert capsys.readouterr().out == f"blockquant {importlib.metadata.version('blockquant')}\n"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert run("--version") == 0
    assert capsys.readouterr().out == f"blockquant {bq.__version__}\n"


def test_usage_errors_exit_2(capsys):
    assert run("quantize", "x.safetensors", "--scheme", "nvfp4") == 2  # no -o
    assert run("inspect", "x", "--bogus") == 2
    assert run("--help") == 0


def test_python_dash_m_in_a_subprocess(tmp_path, ckpt):
    out = tmp_path / "q.safetensors"
    cmd = [sys.executable, "-m", "blockquant"]
    ok = subprocess.run([*cmd, "quantize", str(ckpt), "-o", str(out), "--scheme", "mxfp4"],
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "quantized with e2m1/packed_native0/block32:ue8m0" in ok.stdout and ok.stderr == ""
    bad = subprocess.run([*cmd, "quantize", str(tmp_path / "missing.npz"), "-o", str(tmp_path / "x"),
                          "--scheme", "mxfp4"], capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("blockquant: error: ") and "missing.npz" in bad.stderr


def test_writer_never_replaces_without_force(tmp_path):
    target = tmp_path / "x.safetensors"
    w = SafetensorsWriter(target, [("a", "F32", (2,), 8)])
    target.write_bytes(b"someone else")  # appears while we write
    w.write("a", np.ones(2, np.float32))
    with pytest.raises(bq.QuantError, match="already exists"):
        w.commit()
    assert target.read_bytes() == b"someone else"
    assert only_files(tmp_path) == ["x.safetensors"]


@pytest.mark.parametrize("command", ["quantize", "report", "dequantize"])
@pytest.mark.parametrize("count", ["5000", "1025", "0"])
def test_a_thread_count_past_the_core_limit_is_a_usage_error(tmp_path, ckpt, capsys, command,
                                                             count):
    out = ["-o", str(tmp_path / "o.safetensors")] if command != "report" else []
    scheme = ["--scheme", "int8"] if command != "dequantize" else []
    assert run(command, str(ckpt), *out, *scheme, "--threads", count) == 2
    one_error_line(capsys, "--threads", "must be from 1 to 1024", count)
    assert not (tmp_path / "o.safetensors").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes")
@pytest.mark.parametrize("argv", [["inspect"], ["report", "--scheme", "int8"],
                                  ["quantize", "-o", "OUT", "--scheme", "int8"],
                                  ["quantize", "-o", "OUT.gguf", "--scheme", "q8_0"],
                                  ["dequantize", "-o", "OUT"]])
@pytest.mark.parametrize("suffix", [".safetensors", ".gguf"])
def test_a_named_pipe_as_input_is_one_line_not_a_hang(tmp_path, capsys, argv, suffix):
    pipe = tmp_path / f"pipe{suffix}"
    os.mkfifo(pipe)
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    # Opening the pipe for reading would wait for a writer: a regression hangs (pytest's
    # timeout, or CI's), it does not fail quietly.
    assert run(argv[0], str(pipe), *argv[1:]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(pipe) in err
    assert "regular file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [pipe.name]


@pytest.mark.parametrize("argv", [["quantize", "", "-o", "q.safetensors", "--scheme", "int8"],
                                  ["quantize", "IN", "-o", "", "--scheme", "int8"],
                                  ["dequantize", "", "-o", "d.safetensors"],
                                  ["dequantize", "IN", "-o", ""], ["inspect", ""],
                                  ["report", "", "--scheme", "int8"]])
def test_an_empty_path_is_a_usage_error(tmp_path, ckpt, capsys, monkeypatch, argv):
    monkeypatch.chdir(ckpt.parent)
    before = only_files(ckpt.parent)
    assert run(*[str(ckpt) if a == "IN" else a for a in argv]) == 2
    one_error_line(capsys, "an empty name is no file or folder")
    assert only_files(ckpt.parent) == before


# -- a signal once the output is in place ---------------------------------------------------------
def test_signals_wait_for_the_renames_that_put_an_output_in_place():
    import signal

    from blockquant._fs import signals_deferred

    seen = []

    class Stop(Exception):
        pass

    def handler(signum, frame):
        seen.append("handled")
        raise Stop

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(Stop):
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # a handler would run at any of these
                    pass
                seen.append("section done")
        assert seen == ["section done", "handled"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_signal_during_the_restore_loses_no_held_signal_and_leaves_no_handler(monkeypatch):
    import signal

    from blockquant import _fs

    seen = []
    mine = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append("term"))
    real_signal = signal.signal
    sent = []

    def signal_then_interrupt(sig, handler):
        old = real_signal(sig, handler)
        if sig == signal.SIGINT and handler is signal.default_int_handler and not sent:
            sent.append(sig)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C right after its handler is back
        return old

    try:
        with pytest.raises(KeyboardInterrupt):
            with _fs.signals_deferred():
                monkeypatch.setattr(signal, "signal", signal_then_interrupt)
                os.kill(os.getpid(), signal.SIGTERM)  # held until the block ends
        monkeypatch.setattr(signal, "signal", real_signal)
        assert sent and seen == ["term"]  # the held SIGTERM was handled, once
        handler = signal.getsignal(signal.SIGTERM)
        assert getattr(handler, "__qualname__", "").startswith(
            "test_a_signal_during_the_restore")  # the test's own handler is back
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        real_signal(signal.SIGTERM, mine)


def _sigterm_self(*args, **kwargs):
    import signal

    os.kill(os.getpid(), signal.SIGTERM)
    return ""


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_signal_after_the_output_is_in_place_says_it_was_written(tmp_path, ckpt, capsys,
                                                                    monkeypatch, kind):
    import blockquant.cli as cli

    src = ckpt
    if kind == "folder":
        src = tmp_path / "model"
        src.mkdir()
        ckpt.rename(src / "model.safetensors")
    out = tmp_path / ("q.safetensors" if kind == "file" else "q")
    # the summary, printed after the output was renamed into place, is where the signal lands
    monkeypatch.setattr(cli, "_schemes_used", _sigterm_self)
    assert run("quantize", src, "-o", out, "--scheme", "int8") == 128 + 15
    err = capsys.readouterr().err
    assert f"blockquant: terminated ({out} had been written)" in err, err
    assert out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_signal_while_the_replaced_folder_is_removed_leaves_nothing_behind(tmp_path, ckpt,
                                                                             capsys, monkeypatch):
    import shutil

    src = tmp_path / "model"
    src.mkdir()
    ckpt.rename(src / "model.safetensors")
    out = tmp_path / "q"
    assert run("quantize", src, "-o", out, "--scheme", "int8", "-q") == 0
    real_rmtree = shutil.rmtree

    def rmtree_then_signal(path, *args, **kwargs):
        if ".old" in str(path):
            _sigterm_self()
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree_then_signal)
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4", "--force", "-q") == 128 + 15
    assert f"({out} had been written)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "q"]  # no .q.*.old left
    schemes = {str(t.scheme) for t in bq.load(out).values() if isinstance(t, bq.QTensor)}
    assert schemes == {str(bq.presets.nvfp4())}  # the new output, whole


def test_force_over_a_link_to_a_model_folder_replaces_the_link_and_leaves_nothing(tmp_path,
                                                                                  ckpt):
    src = tmp_path / "model"
    src.mkdir()
    ckpt.rename(src / "model.safetensors")
    target = tmp_path / "old-output"
    assert run("quantize", src, "-o", target, "--scheme", "int8", "-q") == 0
    link = tmp_path / "linkq"
    link.symlink_to(target)
    assert run("quantize", src, "-o", link, "--scheme", "nvfp4", "--force", "-q") == 0
    assert link.is_dir() and not link.is_symlink()
    assert (target / "model.safetensors").is_file()  # the link's target is left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linkq", "model", "old-output"]
