"""Progress (issue 12): a bar with an ETA on a terminal (tqdm's when installed, else our own),
a line per tensor with --verbose, and nothing extra on a pipe."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

import blockquant.progress as progress_mod
from blockquant.cli import main
from blockquant.progress import Progress, ProgressBar


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones((8, 64), np.float32), "b\x1b[2J": np.ones(64, np.float32)},
              str(path))
    return path


def test_own_bar_shows_an_eta(monkeypatch):
    ticks = [0.0, 10.0, 10.0, 40.0]  # start; first tensor and its drawing; the second
    monkeypatch.setattr(progress_mod.time, "perf_counter",
                        lambda: ticks.pop(0) if len(ticks) > 1 else ticks[0])
    tty = Tty()
    bar = ProgressBar(100, "quantize", stream=tty)
    bar("a", 25)  # a quarter in 10 s: 30 s to go
    assert "ETA 00:30" in tty.getvalue() and " 25%" in tty.getvalue()
    bar("b", 75)
    bar.close()
    assert "100%" in tty.getvalue()


@pytest.mark.parametrize("use_tqdm", [True, False])
def test_bar_on_a_terminal_only(use_tqdm):
    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        p = Progress(100, "quantize", stream=stream, use_tqdm=use_tqdm)
        p(None, "a", 60)
        p(None, "b", 40)
        p.close()
    assert pipe.getvalue() == ""
    assert "\r" in tty.getvalue() and "quantize" in tty.getvalue()


def test_quiet_draws_nothing_even_on_a_terminal():
    tty = Tty()
    p = Progress(10, "quantize", stream=tty, quiet=True)
    p(None, "a", 10)
    p.close()
    assert tty.getvalue() == ""


@pytest.mark.parametrize("stream", [io.StringIO(), Tty()])
def test_verbose_lines(stream):
    p = Progress(10, "quantize", stream=stream, verbose=True,
                 describe=lambda file, name: f"did {name}", use_tqdm=False)
    p("shard-1.safetensors", "x\ny", 10)
    p.close()
    lines = [ln.split("\r")[-1] for ln in stream.getvalue().split("\n")]
    assert r"shard-1.safetensors: x\x0ay: did x\x0ay" in lines


def test_cli_verbose_on_a_pipe(tmp_path, src):
    res = subprocess.run([sys.executable, "-m", "blockquant", "quantize", str(src), "-o",
                          str(tmp_path / "q.safetensors"), "--scheme", "int8", "-v"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert "\r" not in res.stderr and "\x1b" not in res.stderr
    lines = res.stderr.splitlines()
    assert any(ln.startswith("w: 8x64 float32 -> q8s/native/tensor:f32") for ln in lines), lines
    assert any(ln.startswith(r"b\x1b[2J: 64 float32 kept: rank 1") for ln in lines), lines
    assert "peak memory" in res.stdout


def test_cli_summary_only_on_a_pipe(tmp_path, src, capsys):
    assert main(["quantize", str(src), "-o", str(tmp_path / "q.safetensors"), "--scheme",
                 "int8"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and out.out.count("\n") == 2
