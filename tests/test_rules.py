"""Safe defaults and per-tensor rules (issue 12): only tensors of rank >= 2 are quantized
unless asked, a tensor its scheme cannot take is kept and reported (an error with --strict),
``--rule REGEX=SCHEME`` picks a scheme per tensor (first match wins, ``keep`` keeps), and
``--dry-run`` says what would happen without writing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import blockquant as bq
from blockquant.burnpack import load_burnpack
from blockquant.checkpoint import CheckpointError, FileOptions
from blockquant.cli import main


def run(*argv):
    return main([str(a) for a in argv])


def one_error_line(capsys, *words):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blockquant: error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.fixture
def tensors():
    rng = np.random.default_rng(3)
    return {
        "embed.weight": rng.normal(0, 0.05, (64, 32)).astype(np.float32),
        "layer.0.attn.weight": rng.normal(0, 0.02, (32, 64)).astype(np.float32),
        "layer.0.attn.bias": rng.normal(0, 0.1, 64).astype(np.float32),
        "layer.0.norm.weight": np.ones(32, np.float32),
        "lm_head.weight": rng.normal(0, 0.05, (64, 32)).astype(np.float32),
        "step": np.array(3.0, np.float32),
        "ids": np.arange(6, dtype=np.int32),
    }


@pytest.fixture
def src(tmp_path, tensors):
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    return path


def schemes_in(path):
    with bq.checkpoint.open_checkpoint(path) as ckpt:
        meta = json.loads(ckpt.metadata["blockquant"])
    return {name: e["scheme"] for name, e in meta["tensors"].items()}


INT8 = str(bq.presets.int8())
NVFP4 = str(bq.presets.nvfp4())


def test_only_rank_2_and_up_by_default(tmp_path, src, capsys):
    out = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4") == 0
    assert schemes_in(out) == {n: NVFP4 for n in ("embed.weight", "layer.0.attn.weight",
                                                  "lm_head.weight")}
    text = capsys.readouterr().out
    assert "3 of 7 tensors quantized" in text
    assert "left 4 tensors unquantized: 3 of rank below 2 (norms, biases; --min-rank 1" in text
    assert "1 not floating point" in text
    loaded = load_file(out)
    for name in ("layer.0.attn.bias", "layer.0.norm.weight", "step", "ids"):
        assert name in loaded  # kept in their dtype, under their own name


@pytest.mark.parametrize("min_rank, n", [("1", 5), ("0", 6), ("3", 0)])
def test_min_rank(tmp_path, src, min_rank, n):
    out = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "int8", "--min-rank", min_rank, "-q") == 0
    assert len(schemes_in(out)) == n


def test_rules_first_match_wins(tmp_path, src, tensors):
    out = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4", "-q",
               "--rule", r"^(embed|lm_head)\.=int8",
               "--rule", "embed=keep",          # never reached for embed: the first rule won
               "--rule", "head=keep",           # nor for lm_head
               "--rule", "norm=int8_block32@1",  # a rule takes a 1-D tensor when it says @1
               "--rule", "attn.bias=keep") == 0
    assert schemes_in(out) == {
        "embed.weight": INT8, "lm_head.weight": INT8, "layer.0.attn.weight": NVFP4,
        "layer.0.norm.weight": str(bq.presets.int8_block32()),
    }
    got = bq.load(out)
    for name, scheme in schemes_in(out).items():
        assert got[name].to_bytes() == bq.quantize(tensors[name], scheme).to_bytes()
    # the mixed file dequantizes as usual
    assert run("dequantize", out, "-o", tmp_path / "d.safetensors", "-q") == 0


def test_a_regex_may_hold_an_equals_sign(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a=b": np.ones((4, 32), np.float32), "c": np.ones((4, 32), np.float32)},
              str(path))
    assert run("quantize", path, "-o", tmp_path / "q.safetensors", "--scheme", "nvfp4", "-q",
               "--rule", "a=b=int8") == 0
    assert schemes_in(tmp_path / "q.safetensors") == {"a=b": INT8, "c": NVFP4}


def test_include_and_exclude_come_before_rules(tmp_path, src):
    out = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "int8", "-q", "--exclude", "embed",
               "--rule", "embed=nvfp4", "--rule", "ids=int8") == 0
    assert "embed.weight" not in schemes_in(out) and "ids" not in schemes_in(out)


def test_unfit_tensors_are_kept_unless_strict(tmp_path, src, capsys):
    out = tmp_path / "q.safetensors"
    # block 32x32 on a 1-D bias a rule sends there: kept, and counted
    assert run("quantize", src, "-o", out, "--scheme", "e4m3/native/block32x32:ue8m0",
               "--rule", "bias=e4m3/native/block32x32:ue8m0@1") == 0
    text = capsys.readouterr().out
    assert "1 the scheme cannot take (--dry-run says why, --strict makes it an error)" in text
    assert "layer.0.attn.bias" not in schemes_in(out)
    assert run("quantize", src, "-o", tmp_path / "s.safetensors", "--scheme",
               "e4m3/native/block32x32:ue8m0", "--rule", "bias=e4m3/native/block32x32:ue8m0@1",
               "--strict") == 2
    one_error_line(capsys, f"{src}: layer.0.attn.bias: block [32, 32]", "--strict",
                   "--rule 'REGEX=keep'")
    assert not (tmp_path / "s.safetensors").exists()
    # the dry run says why
    assert run("quantize", src, "-o", out, "--scheme", "e4m3/native/block32x32:ue8m0",
               "--rule", "bias=e4m3/native/block32x32:ue8m0@1", "-n") == 0
    assert "keep: e4m3/native/block32x32:ue8m0 does not fit: block [32, 32]" in \
        capsys.readouterr().out


@pytest.mark.parametrize("rule, words", [
    ("embed", "'embed' is not REGEX=SCHEME"),
    ("=int8", "is not REGEX=SCHEME"),
    ("embed=", "is not REGEX=SCHEME"),
    ("(=int8", "bad regular expression '('"),
    ("embed=nvfp5", "unknown scheme 'nvfp5'"),
    ("embed=q4s/nope/block32:f16", "--rule"),
])
def test_bad_rules_are_one_line_errors(tmp_path, src, capsys, rule, words):
    for cmd in ("quantize", "report"):
        argv = [cmd, src, "--scheme", "int8", "--rule", rule]
        if cmd == "quantize":
            argv += ["-o", tmp_path / "q.safetensors"]
        assert run(*argv) == 2
        one_error_line(capsys, "--rule", words)
    assert not (tmp_path / "q.safetensors").exists()


def test_report_follows_the_rules(src, capsys):
    assert run("report", src, "--scheme", "nvfp4", "--json", "--rule", "embed=int8",
               "--rule", "head=keep") == 0
    rep = json.loads(capsys.readouterr().out)
    assert {r["name"]: r["scheme"] for r in rep["tensors"]} == {
        "embed.weight": INT8, "layer.0.attn.weight": NVFP4}
    kept = {k["name"]: k["why"] for k in rep["kept"]}
    assert kept == {"lm_head.weight": "rule", "layer.0.attn.bias": "rank",
                    "layer.0.norm.weight": "rank", "step": "rank", "ids": "dtype"}


def test_burnpack_output_follows_the_rules(tmp_path, src, tensors):
    out = tmp_path / "q.bpk"
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4", "-q", "--rule", "embed=int8") == 0
    got = load_burnpack(out)
    assert got["embed.weight"].scheme == bq.presets.int8()
    assert got["layer.0.attn.weight"].scheme == bq.presets.nvfp4()
    np.testing.assert_array_equal(got["layer.0.norm.weight"], tensors["layer.0.norm.weight"])


def test_dry_run_matches_the_real_run(tmp_path, src, capsys):
    out = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "mxfp4", "--dry-run") == 0
    text = capsys.readouterr().out
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]
    dry = bq.quantize_file(src, out, "mxfp4", dry_run=True)
    real = bq.quantize_file(src, out, "mxfp4")
    assert dry.quantized == real.quantized and dry.copied == real.copied
    data = sum(a.nbytes for a in load_file(out).values())
    assert dry.bytes_out == data  # the expected size is the tensor data written
    assert "3 of 7 tensors would be quantized" in text


def test_rules_in_the_options_value():
    a = FileOptions(rules=["embed=int8", "head=keep"])
    b = FileOptions(rules=[("embed", "int8"), ("head", "keep")])
    c = FileOptions(rules={"embed": "int8", "head": "keep"})
    assert a == b == c and hash(a) == hash(c)
    assert FileOptions(rules=[("embed", bq.presets.nvfp4())]).rules[0][1] == bq.presets.nvfp4()
    with pytest.raises(CheckpointError, match="--rule"):
        FileOptions(rules=["nope"])
    with pytest.raises(TypeError):
        FileOptions(rules=[42])
    with pytest.raises(CheckpointError, match="--min-rank"):
        FileOptions(min_rank=-1)


def test_the_decisions_are_in_the_summary(tmp_path, src):
    res = bq.quantize_file(src, tmp_path / "q.safetensors", "nvfp4", rules={"head": "keep"})
    why = {d.tensor.name: (d.why, d.detail) for d in res.decisions if not d.quantized}
    assert why["lm_head.weight"] == ("rule", "--rule head=keep")
    assert why["layer.0.norm.weight"] == ("rank", "rank 1, below --min-rank 2")
    assert why["ids"] == ("dtype", "int32 is not floating point")
    assert Path(tmp_path / "q.safetensors").is_file()
