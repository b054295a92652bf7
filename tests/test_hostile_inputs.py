"""Crafted files and arguments (issue 12's list): each is one line on stderr,
``blockquant: error: FILE: TENSOR: message``, exit code 2, nothing written, no temporary file
left, and nothing from the input ever run. Also the output-path rules (a trailing slash means a
folder, the input is never an output, long names, SIGTERM) and dtype names for dequantize."""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import blockquant as bq
from blockquant.cli import main


def run(*argv):
    return main([str(a) for a in argv])


def one_error_line(capsys, *words):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blockquant: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def listing(folder):
    """Every entry below ``folder``, hidden ones included (a temp file would show)."""
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


def write_header(path, header, data=b""):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def all_commands(src, out):
    """Every command that reads ``src``, writing to ``out`` where it writes."""
    return [
        ("quantize", src, "-o", out, "--scheme", "int8"),
        ("quantize", src, "-o", out, "--scheme", "int8", "--dry-run"),
        ("dequantize", src, "-o", out),
        ("inspect", src),
        ("inspect", src, "--json"),
        ("report", src, "--scheme", "int8"),
    ]


def assert_refused(tmp_path, capsys, src, *words):
    """Every command refuses ``src`` in one line holding ``words``; nothing is written."""
    before = listing(tmp_path)
    lines = []
    for argv in all_commands(src, tmp_path / "out.safetensors"):
        assert run(*argv) == 2, argv
        lines.append(one_error_line(capsys, *words))
        assert listing(tmp_path) == before, argv
    return lines


# -- crafted safetensors headers ----------------------------------------------------------------
def test_deeply_nested_json_header(tmp_path, capsys):
    src = tmp_path / "deep.safetensors"
    write_header(src, b"[" * 200_000 + b"]" * 200_000)
    assert_refused(tmp_path, capsys, src, str(src), "nested too deeply")


def test_deeply_nested_blockquant_metadata(tmp_path, capsys):
    src = tmp_path / "deep.safetensors"
    write_header(src, {"__metadata__": {"blockquant": "[" * 100_000 + "]" * 100_000}})
    before = listing(tmp_path)
    for argv in [("dequantize", src, "-o", tmp_path / "o.safetensors"), ("inspect", src)]:
        assert run(*argv) == 2
        one_error_line(capsys, str(src), "blockquant metadata")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("where", ["name", "metadata key", "metadata value"])
def test_lone_surrogate_in_names_and_metadata(tmp_path, capsys, where):
    src = tmp_path / "s.safetensors"
    name = "w\\ud800" if where == "name" else "w"
    meta = {"k\\udfff": "v"} if where == "metadata key" else {"k": "v\\ud800"}
    raw = ('{"__metadata__": %s, "%s": {"dtype": "F32", "shape": [2, 2], '
           '"data_offsets": [0, 16]}}' % (json.dumps(meta).replace("\\\\", "\\"), name))
    write_header(src, raw.encode(), bytes(16))
    for line in assert_refused(tmp_path, capsys, src, "lone surrogate"):
        line.encode("utf-8")  # printable: no surrogate reaches the terminal


@pytest.mark.parametrize("shape", [[0, 2**64], [2**64, 0], [0, 2**63], [-1, 4], [3, -2]])
def test_dims_out_of_range(tmp_path, capsys, shape):
    src = tmp_path / "d.safetensors"
    write_header(src, {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}})
    assert_refused(tmp_path, capsys, src, f"{src}: w: malformed safetensors header entry")


@pytest.mark.parametrize("shape", [[0, 2**62], [2**62, 0], [0, 2**61], [2**31, 0, 2**31]])
def test_empty_tensors_whose_dims_span_past_numpys_limit(tmp_path, capsys, shape):
    # numpy (so the safetensors library) refuses nonzero dimensions past 2^63 - 1 bytes even
    # when another is 0: such a tensor would be copied into an output nothing else loads.
    src = tmp_path / "e.safetensors"
    write_header(src, {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}})
    assert_refused(tmp_path, capsys, src, f"{src}: w: F32", "past 2^63 bytes")


def test_empty_tensors_numpy_takes_are_copied(tmp_path):
    src = tmp_path / "e.safetensors"
    write_header(src, {"w": {"dtype": "F32", "shape": [0, 2**60], "data_offsets": [0, 0]},
                       "x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}},
                 bytes(16))
    out = tmp_path / "o.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "int8") == 0
    assert bq.load(out)["w"].shape == (0, 2**60)
    load_file(out)  # and the safetensors library loads it


def with_blockquant_metadata(tmp_path, scheme, edit):
    """A blockquant file of one tensor "w" quantized with ``scheme``, whose ``blockquant``
    metadata has gone through ``edit``: a function changing the parsed JSON in place, or a
    text to replace it."""
    src = tmp_path / "m.safetensors"
    save_file({"w": np.ones((4, 32), np.float32)}, str(src))
    q = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", q, "--scheme", scheme, "-q") == 0
    raw = q.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8: 8 + n])
    meta = json.loads(header["__metadata__"]["blockquant"])
    if not isinstance(edit, str):
        edit(meta)
    header["__metadata__"]["blockquant"] = edit if isinstance(edit, str) else json.dumps(meta)
    bad = tmp_path / "bad.safetensors"
    write_header(bad, header, raw[8 + n:])
    return bad


def test_huge_shape_in_blockquant_metadata(tmp_path, capsys):
    bad = with_blockquant_metadata(
        tmp_path, "int8", lambda m: m["tensors"]["w"].__setitem__("shape", [0, 2**64]))
    before = listing(tmp_path)
    for argv in [("dequantize", bad, "-o", tmp_path / "o.safetensors"), ("inspect", bad)]:
        assert run(*argv) == 2
        one_error_line(capsys, f"{bad}: w: malformed blockquant metadata")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("edit, words", [
    (lambda m: m["tensors"]["w"].pop("global_scale"), "w: malformed blockquant metadata: the key "
     "'global_scale' is missing"),
    (lambda m: m["tensors"].__setitem__("w", [1, 2]), "w: malformed blockquant metadata: its entry "
     "is an array, not an object"),
    (lambda m: m.pop("format"), ": malformed blockquant metadata: the key 'format' is missing"),
    (lambda m: m.__setitem__("tensors", "w"), "malformed blockquant metadata: 'tensors' is a "
     "string, not an object"),
    ("[]", "malformed blockquant metadata: a JSON object was expected, not an array"),
])
def test_malformed_blockquant_metadata_says_what_is_wrong_in_words(tmp_path, capsys, edit, words):
    bad = with_blockquant_metadata(tmp_path, "nvfp4", edit)
    assert run("inspect", bad) == 2
    line = one_error_line(capsys, f"{bad}", words)
    assert "list indices" not in line and "KeyError" not in line


def test_huge_block_in_a_scheme_is_a_scheme_error(tmp_path, capsys):
    src = tmp_path / "m.safetensors"
    save_file({"w": np.ones((4, 32), np.float32)}, str(src))
    assert run("quantize", src, "-o", tmp_path / "q.safetensors",
               "--scheme", "q8s/native/block99999999999999999999999:f16") == 2
    one_error_line(capsys, "--scheme")
    assert listing(tmp_path) == ["m.safetensors"]


# -- names that would break the line or drive the terminal -------------------------------------
CONTROL_NAME = "evil\nname\x1b[31m\r\x07"


def test_control_characters_in_names_are_escaped(tmp_path, capsys):
    src = tmp_path / "c.safetensors"
    bad = np.ones((2, 32), np.float32)
    bad[0, 0] = np.nan  # quantize fails on this tensor: the error names it
    save_file({CONTROL_NAME: bad}, str(src))
    assert run("quantize", src, "-o", tmp_path / "q.safetensors", "--scheme", "int8") == 2
    line = one_error_line(capsys, r"evil\x0aname\x1b[31m\x0d\x07")
    assert "\x1b" not in line and "\r" not in line
    assert listing(tmp_path) == ["c.safetensors"]
    for argv in [("inspect", src), ("inspect", src, "--json"), ("report", src, "--scheme", "int8",
                                                                   "--exclude", "evil")]:
        assert run(*argv) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert run("quantize", src, "-o", tmp_path / "q.safetensors", "--scheme", "int8", "-n") == 0
    assert "\x1b" not in capsys.readouterr().out


# -- PyTorch checkpoints: refused, never unpickled -----------------------------------------------
class _Boom:
    """Unpickling this touches a file: the proof that nothing was unpickled is its absence."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _torch_zip(path, marker):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": _Boom(str(marker))}, protocol=2))
        z.writestr("archive/version", "3\n")
        z.writestr("archive/data/0", bytes(16))


@pytest.mark.parametrize("name, kind", [("model.pt", "zip"), ("pytorch_model.bin", "zip"),
                                        ("old.pt", "pickle"), ("weights.pth", "pickle"),
                                        ("model.safetensors", "pickle"), ("m.npz", "zip")])
def test_pytorch_checkpoints_are_refused_with_a_way_out(tmp_path, capsys, name, kind):
    src, marker = tmp_path / name, tmp_path / "unpickled"
    if kind == "zip":
        _torch_zip(src, marker)
    else:
        src.write_bytes(pickle.dumps({"w": _Boom(str(marker))}, protocol=2))
    assert_refused(tmp_path, capsys, src, str(src), "PyTorch checkpoint",
                   "safetensors.torch.save_file")
    assert not marker.exists()


def _safetensors_with_header(path, header_len):
    """A safetensors file (written by the safetensors library) whose header is exactly
    ``header_len`` bytes, padded by a metadata string."""
    from safetensors.numpy import save_file

    w = np.arange(32, dtype=np.float32).reshape(4, 8)

    def written(m):
        save_file({"w": w}, str(path), metadata={"pad": "x" * m})
        return int.from_bytes(path.read_bytes()[:8], "little")

    lo, hi = 0, header_len
    while lo < hi:  # the least padding that reaches header_len (the length grows with it)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if written(mid) < header_len else (lo, mid)
    assert written(lo) == header_len
    return w


@pytest.mark.parametrize("header_len", [0x280, 0x380, 0x480, 0x580, 0x4B50, 0x10280])
def test_safetensors_whose_length_looks_like_another_format(tmp_path, capsys, header_len):
    """A safetensors file starts with its header's length, so its first bytes can be a
    pickle's (0x80 0x02..0x05: headers of 640, 896, 1152, 1408 bytes) or a zip's "PK" (19,280):
    it is still read as safetensors, as the library reads it, and quantizes and inspects."""
    from safetensors.numpy import load_file

    src = tmp_path / "m.safetensors"
    w = _safetensors_with_header(src, header_len)
    assert src.read_bytes()[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK")
    assert np.array_equal(load_file(str(src))["w"], w)
    assert np.array_equal(bq.load(src)["w"], w)
    assert run("inspect", src) == 0
    out = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "int8") == 0
    capsys.readouterr()
    assert np.array_equal(bq.load(out)["w"].to_bytes(), bq.quantize(w, "int8").to_bytes())


def test_folder_with_only_pytorch_weights(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    _torch_zip(model / "pytorch_model.bin", tmp_path / "unpickled")
    (model / "config.json").write_text("{}")
    assert run("quantize", model, "-o", tmp_path / "out", "--scheme", "int8") == 2
    one_error_line(capsys, str(model), "holds no .safetensors file", "PyTorch")
    assert not (tmp_path / "out").exists() and not (tmp_path / "unpickled").exists()


# -- numpy files ---------------------------------------------------------------------------------
def _npy(header: str, data: bytes) -> bytes:
    h = header.encode("latin1")
    h += b" " * (-(len(h) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + data


@pytest.mark.parametrize("shape, words", [
    ("(1099511627776,)", "header claims"),           # 2^40 float32 over 16 bytes
    ("(1048576, 1048576)", "header claims"),
    ("(-1, 4)", "out of range"),
    ("(4, -4)", "out of range"),
    ("(18446744073709551616,)", "out of range"),
])
def test_npy_header_lies(tmp_path, capsys, shape, words):
    src = tmp_path / "w.npy"
    src.write_bytes(_npy("{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape,
                         bytes(16)))
    assert_refused(tmp_path, capsys, src, str(src), words)


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_npz_member_claiming_2_40_elements(tmp_path, capsys, compression):
    src = tmp_path / "m.npz"
    with zipfile.ZipFile(src, "w", compression) as z:
        z.writestr("w.npy", _npy("{'descr': '<f4', 'fortran_order': False, "
                                 "'shape': (1099511627776,), }", bytes(16)))
    assert_refused(tmp_path, capsys, src, f"{src}: w:", "header claims")


def test_npy_of_python_objects(tmp_path, capsys):
    src = tmp_path / "o.npy"
    src.write_bytes(_npy("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
                         pickle.dumps(None)))
    assert_refused(tmp_path, capsys, src, "Python objects")


def test_npy_header_nested_deeply(tmp_path, capsys):
    src = tmp_path / "n.npy"
    src.write_bytes(_npy("{'descr': '<f4', 'fortran_order': False, 'shape': "
                         + "(" * 3000 + ")" * 3000 + ", }", b""))
    assert_refused(tmp_path, capsys, src, str(src))


# -- arguments -----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, words", [
    (["demo", "--scale", "0"], "--scale: must be from 1 to 16, got 0"),
    (["demo", "--scale", "-1"], "--scale"),
    (["demo", "--repeat", "0"], "--repeat: must be at least 1"),
    (["demo", "--seed", "-1"], "--seed: must be at least 0"),
    (["demo", "--seed", "x"], "expected an integer"),
    (["quantize", "a", "--scheme", "int8"], "the following arguments are required: -o"),
    (["quantize", "a", "-o", "b", "--scheme", "int8", "--jobs", "0"], "--jobs"),
    (["quantize", "a", "-o", "b", "--scheme", "int8", "--threads", "-2"], "--threads"),
    (["quantize", "a", "-o", "b", "--scheme", "int8", "--min-rank", "-1"], "--min-rank"),
    (["inspect"], "required"),
    (["bench"], "invalid choice: 'bench'"),
])
def test_argument_errors_are_one_line(capsys, argv, words):
    assert main(argv) == 2
    one_error_line(capsys, words)


def test_argument_errors_in_a_subprocess_have_no_usage_block(tmp_path):
    res = subprocess.run([sys.executable, "-m", "blockquant", "demo", "--scale", "0"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("blockquant: error: demo: ")


# -- outputs ------------------------------------------------------------------------------------
@pytest.fixture
def small(tmp_path):
    src = tmp_path / "m.safetensors"
    save_file({"w": np.random.default_rng(0).normal(size=(8, 64)).astype(np.float32),
               "b": np.ones(64, np.float32)}, str(src))
    return src


def test_trailing_slash_means_a_new_folder(tmp_path, small, capsys):
    assert run("quantize", small, "-o", f"{tmp_path}/newdir/", "--scheme", "int8", "-q") == 0
    assert (tmp_path / "newdir").is_dir()
    assert listing(tmp_path / "newdir") == ["m.safetensors"]
    assert "w.values" in load_file(tmp_path / "newdir" / "m.safetensors")
    assert run("dequantize", tmp_path / "newdir" / "m.safetensors", "-o", f"{tmp_path}/dq/",
               "-q") == 0
    assert listing(tmp_path / "dq") == ["m.safetensors"] and "w" in load_file(
        tmp_path / "dq" / "m.safetensors")
    # into an existing folder: the file goes in it, and an existing file needs --force
    assert run("quantize", small, "-o", tmp_path / "newdir", "--scheme", "int8") == 2
    one_error_line(capsys, "newdir/m.safetensors: already exists")
    assert run("quantize", small, "-o", f"{tmp_path}/newdir/", "--scheme", "int8", "-q",
               "--force") == 0
    # a .npy input and a .bpk output are named after the input
    np.save(tmp_path / "emb.npy", np.ones((4, 32), np.float32))
    assert run("quantize", tmp_path / "emb.npy", "-o", f"{tmp_path}/bp/", "--format",
               "burnpack", "--scheme", "int8", "-q") == 0
    assert listing(tmp_path / "bp") == ["emb.bpk"]


def test_trailing_slash_with_a_missing_parent(tmp_path, small, capsys):
    assert run("quantize", small, "-o", f"{tmp_path}/no/such/", "--scheme", "int8") == 2
    one_error_line(capsys, "no such folder")
    assert listing(tmp_path) == ["m.safetensors"]


@pytest.mark.parametrize("spelling", ["same", "dotdot", "hardlink", "symlink", "into_folder"])
def test_output_that_is_the_input_is_refused_even_with_force(tmp_path, small, capsys, spelling):
    before = small.read_bytes()
    out = {
        "same": small,
        "dotdot": tmp_path / "sub" / ".." / small.name,
        "hardlink": tmp_path / "link.safetensors",
        "symlink": tmp_path / "sym.safetensors",
        "into_folder": f"{tmp_path}/",
    }[spelling]
    (tmp_path / "sub").mkdir()
    if spelling == "hardlink":
        os.link(small, out)
    if spelling == "symlink":
        os.symlink(small, out)
    listed = listing(tmp_path)
    for argv in [("quantize", small, "-o", out, "--scheme", "int8", "--force"),
                 ("dequantize", small, "-o", out, "--force")]:
        assert run(*argv) == 2
        one_error_line(capsys, "is the input file")
        assert small.read_bytes() == before and listing(tmp_path) == listed


def test_252_byte_output_names_work(tmp_path, small):
    for name in ["q" * 240 + ".safetensors", "é" * 120 + ".safetensors", "b" * 248 + ".bpk"]:
        assert len(name.encode()) <= 255
        out = tmp_path / name
        assert run("quantize", small, "-o", out, "--scheme", "int8", "-q") == 0
        assert out.is_file()
        if name.endswith(".safetensors"):
            d = tmp_path / ("d" * 240 + ".safetensors")
            assert run("dequantize", out, "-o", d, "-q", "--force") == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


_SLOW_DRIVER = textwrap.dedent("""
    import sys, time
    import blockquant.checkpoint.commands as c
    real = c.quantize
    def slow(*a, **k):
        sys.stderr.write("started\\n"); sys.stderr.flush()
        # Short sleeps, not one long one: a signal that lands between the write above and the
        # sleep's system call would otherwise wait for the whole sleep (CPython runs handlers
        # only between bytecodes or when a call is interrupted), and the test would time out.
        for _ in range(600):
            time.sleep(0.1)
        return real(*a, **k)
    c.quantize = slow
    from blockquant.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)] + (
    [(signal.SIGHUP, 129)] if hasattr(signal, "SIGHUP") else []))  # a closed terminal
@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_signal_mid_write_leaves_nothing(tmp_path, small, sig, code, what):
    src = small
    if what == "folder":
        src = tmp_path / "model"
        src.mkdir()
        small.rename(src / "model.safetensors")
        (src / "config.json").write_text("{}")
    out = tmp_path / ("q.safetensors" if what == "file" else "out")
    driver = tmp_path / "driver.py"
    driver.write_text(_SLOW_DRIVER)
    before = listing(tmp_path)
    proc = subprocess.Popen([sys.executable, str(driver), "quantize", str(src), "-o", str(out),
                             "--scheme", "int8"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr.readline() == "started\n"
        assert listing(tmp_path) != before  # the temporary file or folder exists now
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == code
    finally:
        proc.kill()
    assert listing(tmp_path) == before
    assert "no output written" in proc.stderr.read()


@pytest.mark.skipif(not hasattr(os, "openpty") or not hasattr(signal, "SIGHUP"),
                    reason="POSIX terminals")
def test_a_closed_terminal_mid_write_leaves_nothing(tmp_path, small):
    """The command's terminal closes (its pty's master end): SIGHUP, and every later write to
    the terminal fails (EIO). Clearing blockquant's own progress bar failed so and replaced the
    hangup with an OSError: exit 1, a traceback, on a terminal no one reads. Now it ends with
    129. (tqdm's bar ignores a failed write by itself.)"""
    out = tmp_path / "q.safetensors"
    driver = tmp_path / "driver.py"
    # The pty becomes the command's controlling terminal, as a shell's is.
    hide_tqdm = "sys.modules['tqdm'] = None\n"
    driver.write_text("import fcntl, sys, termios\nfcntl.ioctl(2, termios.TIOCSCTTY, 0)\n"
                      + hide_tqdm + _SLOW_DRIVER)
    before = listing(tmp_path)
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, str(driver), "quantize", str(small), "-o",
                                 str(out), "--scheme", "int8"], stdin=slave, stdout=slave,
                                stderr=slave, start_new_session=True)
        os.close(slave)
        seen = b""
        while b"started" not in seen:
            seen += os.read(master, 1024)
    finally:
        os.close(master)  # the terminal closes
    try:
        assert proc.wait(timeout=30) == 129
    finally:
        proc.kill()
    assert listing(tmp_path) == before


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
def test_sighup_ignored_as_nohup_does_stays_ignored(tmp_path, small):
    """Under nohup (SIGHUP ignored when the command starts) a hangup must not end the run: the
    command turned every SIGHUP into its clean exit 129, ignored or not."""
    out = tmp_path / "q.safetensors"
    driver = tmp_path / "driver.py"
    driver.write_text("import signal\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
                      + _SLOW_DRIVER)
    proc = subprocess.Popen([sys.executable, str(driver), "quantize", str(small), "-o", str(out),
                             "--scheme", "int8"], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr.readline() == "started\n"
        proc.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.5)  # still at work
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        proc.kill()


# -- dequantize's dtype, by name --------------------------------------------------------------------
@pytest.mark.parametrize("dtype, want", [
    ("float16", "float16"), ("float32", "float32"), ("float64", "float64"),
    ("bfloat16", "bfloat16"), ("f2", "float16"), ("half", "float16"), ("single", "float32"),
    ("double", "float64"), ("<f4", "float32"), (np.float16, "float16"),
    (np.dtype("float64"), "float64"),
])
def test_dequantize_takes_dtype_names(dtype, want):
    qt = bq.quantize(np.linspace(-1, 1, 64, dtype=np.float32), "int8")
    assert qt.dequantize(dtype).dtype.name == want
    assert bq.dequantize(qt, dtype).dtype.name == want


def test_bfloat16_by_name_without_ml_dtypes_imported_first():
    code = textwrap.dedent("""
        import sys, numpy as np, blockquant as bq
        assert "ml_dtypes" not in sys.modules
        x = bq.quantize(np.ones(32, np.float32), "int8").dequantize(dtype="bfloat16")
        print(x.dtype.name, float(x.astype(np.float32)[0]))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["bfloat16", "1.0"]


def test_file_dequantize_takes_dtype_names(tmp_path, small):
    q = tmp_path / "q.safetensors"
    bq.quantize_file(small, q, "int8")
    for dtype, st in [("half", np.float16), (np.float64, np.float64), ("bfloat16", None)]:
        d = tmp_path / "d.safetensors"
        bq.dequantize_file(q, d, dtype=dtype, force=True)
        raw = d.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8: 8 + n])
        assert header["w"]["dtype"] == {np.float16: "F16", np.float64: "F64", None: "BF16"}[st]
    with pytest.raises(bq.QuantError, match="--dtype: expected one of"):
        bq.dequantize_file(q, tmp_path / "e.safetensors", dtype="int8")


def test_error_output_survives_an_ascii_stdout(tmp_path):
    src = tmp_path / "u.safetensors"
    save_file({"weight_é_中": np.ones((4, 32), np.float32)}, str(src))
    res = subprocess.run([sys.executable, "-m", "blockquant", "inspect", str(src)],
                         capture_output=True, timeout=60, check=False,
                         env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert res.returncode == 0, res.stderr
    assert b"weight_" in res.stdout


def test_no_temp_file_after_a_failed_write(tmp_path, capsys):
    src = tmp_path / "m.safetensors"
    bad = np.ones((4, 32), np.float32)
    bad[1, 1] = np.inf
    save_file({"a": np.ones((64, 64), np.float32), "z": bad}, str(src))
    for fmt in ["q.safetensors", "q.bpk"]:
        assert run("quantize", src, "-o", tmp_path / fmt, "--scheme", "int8") == 2
        one_error_line(capsys, f"{src}: z:")
        assert listing(tmp_path) == ["m.safetensors"]


def test_nothing_extra_on_a_pipe(tmp_path, small):
    # nothing extra on a pipe: no bar, no escape codes; the summary only
    res = subprocess.run([sys.executable, "-m", "blockquant", "quantize", str(small), "-o",
                          str(tmp_path / "q.safetensors"), "--scheme", "int8"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and res.stderr == ""
    assert len(res.stdout.strip().splitlines()) == 2  # summary, and why 1 tensor was kept


@pytest.mark.parametrize("scheme", ["q8s/native/block99999999999999999999999:f16",
                                    "q8s/packed_u32_99999999999999999999/tensor", 42, None])
def test_crafted_scheme_in_blockquant_metadata(tmp_path, capsys, scheme):
    src = tmp_path / "m.safetensors"
    meta = {"format": 2, "tensors": {"w": {"scheme": scheme, "shape": [4, 32],
                                           "dtype": "float32", "values": "w.values",
                                           "scales": "w.scales"}}}
    save_file({"w.values": np.zeros((4, 32), np.int8), "w.scales": np.ones(1, np.float32)},
              str(src), metadata={"blockquant": json.dumps(meta)})
    before = listing(tmp_path)
    for argv in [("dequantize", src, "-o", tmp_path / "o.safetensors"), ("inspect", src)]:
        assert run(*argv) == 2
        one_error_line(capsys, f"{src}: w: malformed blockquant metadata")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("entry, words", [
    (b'{"w": {"dtype": "XYZ", "shape": [4], "data_offsets": [0, 4]}}', "unknown dtype 'XYZ'"),
    (b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 0]}}',
     "malformed safetensors header"),
    (b'{"w": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 0]}}', "malformed"),
    (b'{"w": 1}', "malformed safetensors header entry"),
    (b'{"__metadata__": {"a": 1}}', "__metadata__ is not str -> str"),
    (b'\xff\xfe', "malformed safetensors header"),
])
def test_more_crafted_headers(tmp_path, capsys, entry, words):
    src = tmp_path / "h.safetensors"
    write_header(src, entry, bytes(4))
    assert_refused(tmp_path, capsys, src, str(src), words)


def test_encrypted_npz_member(tmp_path, capsys):
    src = tmp_path / "e.npz"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("w.npy", b"x" * 64)
    raw = bytearray(src.read_bytes())
    raw[raw.find(b"PK\x03\x04") + 6] |= 1  # the "encrypted" flag, local and central
    raw[raw.find(b"PK\x01\x02") + 8] |= 1
    src.write_bytes(bytes(raw))
    assert_refused(tmp_path, capsys, src, f"{src}: w:", "encrypted")


def test_dtypes_safetensors_cannot_hold(tmp_path, capsys):
    src = tmp_path / "s.npy"
    np.save(src, np.array(["ab", "cd"]))
    assert run("quantize", src, "-o", tmp_path / "q.safetensors", "--scheme", "int8") == 2
    one_error_line(capsys, f"{src}: s: dtype <U2 cannot be stored in a safetensors file")
    assert listing(tmp_path) == ["s.npy"]


@pytest.mark.parametrize("special", ["/dev/null", "fifo"])
def test_force_never_replaces_a_special_file(tmp_path, small, capsys, special):
    out = Path(special) if special.startswith("/") else tmp_path / special
    if special == "fifo":
        os.mkfifo(out)
    for argv in [("quantize", small, "-o", out, "--scheme", "int8", "--force"),
                 ("quantize", small, "-o", out, "--scheme", "int8", "--force", "--format",
                  "burnpack")]:
        assert run(*argv) == 2
        one_error_line(capsys, "is not a regular file")
    assert not out.is_file()


def test_a_file_name_that_is_not_utf8(tmp_path, capsys):
    src = tmp_path / os.fsdecode(b"w\xff.npy")  # the tensor is named after the file
    np.save(src, np.ones((4, 32), np.float32))
    before = listing(tmp_path)
    for out in [tmp_path / "q.safetensors", f"{tmp_path}/new/"]:
        assert run("quantize", src, "-o", out, "--scheme", "int8") == 2
        line = one_error_line(capsys, r"'w\udcff.values' is not valid Unicode")
        assert ".tmp" not in line  # the output's name, not its temporary folder's
        line.encode("utf-8")
        assert listing(tmp_path) == before
    assert run("inspect", src) == 0
    assert r"w\udcff" in capsys.readouterr().out


# -- found by an adversarial review (safetensors' own rules, burn's Bool, odd offsets) ----------
def _tensor(dtype, shape, offsets):
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


@pytest.mark.parametrize("header, data, words", [
    # A sub-byte dtype's bits fill whole bytes and match the span, as for every other dtype.
    ({"a": _tensor("F4", [2**62], [0, 1])}, bytes(1), "takes 2305843009213693952 bytes"),
    ({"a": _tensor("F6_E2M3", [1000], [0, 3])}, bytes(3), "takes 750 bytes, its offsets span 3"),
    ({"a": _tensor("F4", [3], [0, 2])}, bytes(2), "takes 12 bits, not whole bytes"),
    # The tensors tile the data: no overlap, no hole, nothing after the last.
    ({"a": _tensor("F32", [16], [0, 64]), "b": _tensor("F32", [16], [0, 64])}, bytes(64),
     "overlaps the tensor before it"),
    ({"a": _tensor("F32", [4], [0, 16]), "b": _tensor("F32", [4], [32, 48])}, bytes(48),
     "leaves bytes 16..32 unused"),
    ({"a": _tensor("F32", [4], [0, 16])}, bytes(20), "the tensors end at byte 16 of 20"),
    # Offsets that are wrong in themselves say so, not "truncated file?".
    ({"a": _tensor("F32", [0], [64, 0])}, bytes(64), "data offsets [64, 0] run backwards"),
    ({"a": _tensor("F32", [0], [-64, 0])}, bytes(64), "data offsets [-64, 0] are negative"),
    ({"a": _tensor("F32", [4], [0, 16])}, bytes(8), "reach past the 8 data bytes (truncated"),
])
def test_safetensors_layout_rules(tmp_path, capsys, header, data, words):
    src = tmp_path / "h.safetensors"
    write_header(src, header, data)
    assert_refused(tmp_path, capsys, src, str(src), words)


def test_zero_size_tensors_share_an_offset(tmp_path):
    """Empty tensors take no bytes: several at one offset tile the data (the library's rule)."""
    src = tmp_path / "z.safetensors"
    save_file({"a": np.zeros(0, np.float32), "b": np.zeros((2, 0), np.float32),
               "c": np.ones(4, np.float32)}, str(src))
    assert sorted(bq.load(src)) == ["a", "b", "c"]


def test_bools_burn_cannot_hold_are_refused_before_a_bpk_is_written(tmp_path, capsys):
    """A safetensors BOOL byte of 2 or 255 (numpy reads True) has no burn Bool: refused in one
    line, no .bpk written that blockquant's own reader would then refuse."""
    src = tmp_path / "b.safetensors"
    write_header(src, {"mask": _tensor("BOOL", [4], [0, 4]),
                       "w": _tensor("F32", [32], [4, 132])}, bytes([0, 1, 2, 255]) + bytes(128))
    assert load_file(str(src))["mask"].tolist() == [False, True, True, True]
    before = listing(tmp_path)
    assert run("quantize", src, "-o", tmp_path / "o.bpk", "--scheme", "int8", "-q") == 2
    one_error_line(capsys, str(src), "mask", "bool at index 2 is 2")
    assert listing(tmp_path) == before
    # Bytes of 0 and 1 go through, and read back as the same bools.
    write_header(src, {"mask": _tensor("BOOL", [4], [0, 4]),
                       "w": _tensor("F32", [32], [4, 132])}, bytes([0, 1, 1, 0]) + bytes(128))
    assert run("quantize", src, "-o", tmp_path / "o.bpk", "--scheme", "int8", "-q") == 0
    assert bq.load_burnpack(tmp_path / "o.bpk")["mask"].tolist() == [False, True, True, False]


def test_npy_header_with_an_unclosed_bracket(tmp_path, capsys):
    """numpy retries a header literal_eval rejects through tokenize: TokenError, refused."""
    src = tmp_path / "t.npy"
    src.write_bytes(_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4, }", bytes(16)))
    assert_refused(tmp_path, capsys, src, str(src), "malformed header (TokenError)")
    member = tmp_path / "m.npz"
    with zipfile.ZipFile(member, "w") as z:
        z.writestr("w.npy", src.read_bytes())
    src.unlink()
    assert_refused(tmp_path, capsys, member, f"{member}: w:", "malformed header")


def test_gguf_tensor_at_an_unaligned_offset(tmp_path, capsys):
    """gguf-py hands back a float32 view at an odd offset into the file when a tensor's offset
    is not aligned: the arrays API quantizes it as any other array (a copy), as the same values;
    the file itself is refused, as llama.cpp's loader refuses it (issue 47)."""
    gguf = pytest.importorskip("gguf")
    src = tmp_path / "u.gguf"
    x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_tensor("blk.0.ffn_up.weight", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = gguf.GGUFReader(str(src))
    t = r.tensors[0]
    raw = bytearray(src.read_bytes())
    # Move the data 2 bytes on and patch the tensor's offset (relative to the data start).
    start = t.data_offset
    field = raw.rfind(struct.pack("<Q", start - r.data_offset), 0, r.data_offset)
    assert field > 0
    raw[field:field + 8] = struct.pack("<Q", start - r.data_offset + 2)
    raw[start + 2:start + 2 + x.nbytes] = x.tobytes()
    src.write_bytes(bytes(raw) + bytes(32))
    view = gguf.GGUFReader(str(src)).tensors[0].data
    assert not view.flags.aligned and np.array_equal(view.reshape(x.shape), x)
    for qtype in ("Q8_0", "Q4_0"):
        assert np.array_equal(bq.gguf.quantize(view, qtype), bq.gguf.quantize(x, qtype))
    assert bq.quantize(view, "int8_block32").to_bytes() == bq.quantize(x, "int8_block32").to_bytes()
    out = tmp_path / "o.gguf"
    assert run("quantize", src, "-o", out, "--scheme", "q8_0", "-q") == 2
    one_error_line(capsys, "blk.0.ffn_up.weight", "alignment (32)")
    assert not out.exists()
