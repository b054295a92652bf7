"""What a newcomer trips on first (issue 47): finding the presets, a rule that takes the biases
its regular expression happens to match, int8 per channel, what ``mse`` searches and where it
cannot help, and messages that blame the option at fault."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import blockquant as bq
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
    return lines[0]


@pytest.fixture
def bert(tmp_path):
    """A BERT-like attention block: 2-D weights, 1-D biases under the same names, a 0-d
    step."""
    rng = np.random.default_rng(47)
    tensors = {}
    for part in ("query", "key", "value"):
        tensors[f"attention.self.{part}.weight"] = rng.normal(0, 0.02, (32, 32)).astype(np.float32)
        tensors[f"attention.self.{part}.bias"] = rng.normal(0, 0.1, 32).astype(np.float32)
    tensors["step"] = np.array(2.0, np.float32)
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    return path, tensors


def schemes_of(res):
    return {d.tensor.name: str(d.scheme) for d in res.decisions if d.quantized}


MXFP8, INT8, NVFP4 = (str(bq.presets.resolve(n)) for n in ("mxfp8", "int8", "nvfp4"))


# -- a rule overrides the scheme, not --min-rank, unless it says @N ----------------------------


def test_a_rule_leaves_the_biases_it_matches_below_min_rank(tmp_path, bert, capsys):
    src, _ = bert
    out = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4",
               "--rule", r"attention\.self\.(query|key)=mxfp8", "--dry-run") == 0
    text = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if "|" in line}
    for bias in ("query", "key", "value"):
        assert "| keep: rank 1, below --min-rank 2 " in rows[f"attention.self.{bias}.bias"]
    assert "(norms, biases; --min-rank 1 or --rule 'REGEX=SCHEME@1' takes them)" in text
    res = bq.quantize_file(src, out, "nvfp4", rules=[r"attention\.self\.(query|key)=mxfp8"])
    assert schemes_of(res) == {"attention.self.query.weight": MXFP8,
                               "attention.self.key.weight": MXFP8,
                               "attention.self.value.weight": NVFP4}
    why = {d.tensor.name: (d.why, d.detail) for d in res.decisions if not d.quantized}
    assert why["attention.self.key.bias"] == ("rank", "rank 1, below --min-rank 2")


@pytest.mark.parametrize("rules", [
    [r"\.bias$=int8@1", r"attention=mxfp8"],
    [(r"\.bias$", "int8@1"), (r"attention", "mxfp8")],
    {r"\.bias$": "int8@1", "attention": "mxfp8"},
])
def test_a_rule_names_its_own_least_rank_with_at_n(tmp_path, bert, rules):
    src, tensors = bert
    res = bq.quantize_file(src, tmp_path / "q.safetensors", "nvfp4", rules=rules)
    want = {n: ("int8" if n.endswith(".bias") else "mxfp8") for n in tensors if n != "step"}
    assert schemes_of(res) == {n: str(bq.presets.resolve(p)) for n, p in want.items()}
    got = bq.load(tmp_path / "q.safetensors")
    for name, preset in want.items():
        assert got[name].to_bytes() == bq.quantize(tensors[name], preset).to_bytes()


def test_at_n_on_the_command_line_and_at_zero_takes_a_scalar(tmp_path, bert, capsys):
    src, _ = bert
    out = tmp_path / "q.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4", "-q",
               "--rule", r"\.bias$=int8@1", "--rule", "^step$=int8@0") == 0
    res = bq.quantize_file(src, out, "nvfp4", rules=[r"\.bias$=int8@1", "^step$=int8@0"],
                           force=True)
    assert len(res.quantized) == 7 and not res.copied


def test_a_rule_floor_above_min_rank_keeps_by_the_rule(tmp_path, bert):
    src, _ = bert
    res = bq.quantize_file(src, tmp_path / "q.safetensors", "nvfp4", rules=["query=int8@3"],
                           dry_run=True)
    why = {d.tensor.name: (d.why, d.detail) for d in res.decisions if not d.quantized}
    assert why["attention.self.query.weight"] == (
        "rule", "rank 2, below the @3 of --rule query=int8@3")


def test_keep_keeps_whatever_the_rank(tmp_path, bert):
    src, _ = bert
    res = bq.quantize_file(src, tmp_path / "q.safetensors", "nvfp4", rules=["value=keep"],
                           min_rank=1, dry_run=True)
    why = {d.tensor.name: d.why for d in res.decisions if not d.quantized}
    assert why["attention.self.value.weight"] == why["attention.self.value.bias"] == "rule"


@pytest.mark.parametrize("rule, words", [
    ("bias=int8@", "SCHEME@N takes an integer N >= 0"),
    ("bias=int8@x", "got 'int8@x'"),
    ("bias=int8@-1", "SCHEME@N takes an integer"),
    ("bias=@1", "SCHEME@N"),
    ("bias=keep@1", "'keep' keeps whatever the rank"),
])
def test_a_bad_at_n_is_a_rule_error(tmp_path, bert, capsys, rule, words):
    src, _ = bert
    assert run("quantize", src, "-o", tmp_path / "q.safetensors", "--scheme", "int8",
               "--rule", rule) == 2
    one_error_line(capsys, "--rule", words)
    with pytest.raises(CheckpointError, match="--rule"):
        FileOptions(rules=[rule])


def test_at_n_is_part_of_the_rule_text():
    assert FileOptions(rules=["a=int8@1"]) != FileOptions(rules=["a=int8"])
    assert FileOptions(rules=["a=int8@1"]) == FileOptions(rules={"a": "int8@1"})


# -- int8 per channel ------------------------------------------------------------------------


def rows_of_different_scales(shape=(48, 384), seed=0):
    """Weight-like rows: Gaussian, with rare large outliers (as in LLM weights) that set a few
    rows' amplitude far above the others'."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, 0.02, shape)
    w.flat[rng.choice(w.size, size=w.size // 1000, replace=False)] *= 60.0
    return w.astype(np.float32)


def test_int8_per_channel_is_one_f32_scale_per_row():
    x = rows_of_different_scales()
    qt = bq.quantize(x, "int8_per_channel")
    assert str(qt.scheme) == "q8s/native/block65536:f32"
    assert qt.to_bytes() == bq.quantize(x, "q8s/native/block65536:f32").to_bytes()
    assert qt.scales.shape == (48, 1)
    np.testing.assert_array_equal(qt.scales[:, 0],
                                  np.abs(x).max(axis=1).astype(np.float32) / np.float32(127))


def test_int8_per_channel_beats_per_tensor_int8_on_rows_of_different_scales():
    x = rows_of_different_scales()
    per_row = bq.metrics.sqnr_db(x, bq.quantize(x, "int8_per_channel").dequantize())
    per_tensor = bq.metrics.sqnr_db(x, bq.quantize(x, "int8").dequantize())
    assert per_row > per_tensor + 8  # 28 dB against 17 here


def test_int8_per_channel_into_bpk_is_a_one_line_refusal(tmp_path, bert, capsys):
    src, _ = bert
    out = tmp_path / "q.bpk"
    for extra in ([], ["--dry-run"]):
        assert run("quantize", src, "-o", out, "--scheme", "int8_per_channel", *extra) == 2
        one_error_line(capsys, f"{out}: int8_per_channel (q8s/native/block65536:f32) cannot be "
                       "written to a .bpk file", "(at most 255); write .safetensors instead")
    assert not out.exists()
    # a rule's scheme too, and only when a tensor gets it
    assert run("quantize", src, "-o", out, "--scheme", "int8", "--rule",
               "query=int8_per_channel") == 2
    one_error_line(capsys, "int8_per_channel")
    assert run("quantize", src, "-o", out, "-q", "--scheme", "int8", "--rule",
               "nothing-matches=int8_per_channel") == 0


# -- messages --------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", ["quantize", "report"])
def test_an_option_the_scheme_cannot_take_blames_the_option(tmp_path, bert, capsys, cmd):
    src, _ = bert
    argv = [cmd, src, "--scheme", "int8_block32", "--scale-rounding", "mx"]
    if cmd == "quantize":
        argv += ["-o", tmp_path / "q.safetensors"]
    assert run(*argv) == 2
    line = one_error_line(capsys)
    assert line == ("blockquant: error: --scale-rounding: mx needs UE8M0 scales; int8_block32 "
                    "(q8s/native/block32:f16) has F16")


def test_an_option_a_rules_scheme_cannot_take_names_the_rule(tmp_path, bert, capsys):
    src, _ = bert
    # mxfp4 takes mx; the rule's int8 does not, nor does nf4's codebook take half_even
    assert run("quantize", src, "-o", tmp_path / "q.safetensors", "--scheme", "mxfp4",
               "--scale-rounding", "mx", "--rule", "nothing=int8") == 2
    one_error_line(capsys, "--scale-rounding: mx needs UE8M0 scales; --rule nothing=int8's "
                   "scheme int8 (q8s/native/tensor:f32) has F32")
    assert run("report", src, "--scheme", "mxfp4", "--rounding", "half_even",
               "--rule", "query=nf4_block16") == 2
    one_error_line(capsys, "--rounding: half_even does not apply to --rule query=nf4_block16's")


def test_the_api_blames_the_option_too(tmp_path, bert):
    src, _ = bert
    with pytest.raises(CheckpointError) as e:
        bq.quantize_file(src, tmp_path / "q.safetensors", "int8_block32", scale_rounding="mx")
    assert e.value.path == "--scale-rounding" and e.value.tensor is None
    assert "mx needs UE8M0 scales; int8_block32" in str(e.value)
    assert not (tmp_path / "q.safetensors").exists()
    with pytest.raises(CheckpointError, match="^--scale-rounding: "):
        bq.checkpoint.report_file(src, bq.presets.nvfp4(), FileOptions(scale_rounding="mx"))


@pytest.mark.parametrize("impl", [bq, bq.reference], ids=["core", "reference"])
def test_weights_without_mse_say_they_need_mse(impl):
    x = np.ones((2, 32), np.float32)
    with pytest.raises(bq.QuantError, match=r"^weights= needs calibration='mse' .*this call's "
                       r"calibration is 'minmax'$"):
        impl.quantize(x, "int8_block32", weights=np.ones(32))
    with pytest.raises(bq.QuantError, match="calibration is 'absmean'"):
        impl.quantize(x, "bitnet", weights=np.ones(32))
    with pytest.raises(bq.QuantError, match="weights= and scales= do not go together"):
        impl.quantize(x, "int8_block32", calibration="mse", weights=np.ones(32),
                      scales=np.ones((2, 1)))


def test_report_json_lists_the_kept_biases(bert, capsys):
    src, _ = bert
    assert run("report", src, "--scheme", "nvfp4", "--json", "--rule", "query=int8") == 0
    kept = {k["name"]: k["why"] for k in json.loads(capsys.readouterr().out)["kept"]}
    assert kept["attention.self.query.bias"] == "rank"


# -- blockquant presets ------------------------------------------------------------------------


def test_presets_lists_every_preset_with_its_scheme_bits_and_purpose(capsys):
    assert run("presets") == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| ")}
    assert set(rows) == {"preset", *bq.presets.PRESETS}
    for name, make in bq.presets.PRESETS.items():
        scheme, bits, options, purpose = rows[name]
        assert scheme == str(make())
        assert purpose == make.__doc__.splitlines()[0]
        assert float(bits) == pytest.approx(make().layout((4096, 4096)).nbytes * 8 / 4096**2,
                                            abs=5e-4)
    assert rows["bitnet"][2] == "calibration absmean"
    assert rows["int4_block16"][2] == "calibration mse, scale rounding nearest"
    assert rows["mxfp4"][2] == "scale rounding mx" and rows["int8"][2] == "-"
    assert rows["nvfp4"][1] == "4.500" and rows["int8_per_channel"][1] == "8.008"


def test_presets_json_is_the_catalog(capsys):
    assert run("presets", "--json") == 0
    got = json.loads(capsys.readouterr().out)
    assert got == bq.presets.catalog()
    assert [p["name"] for p in got] == list(bq.presets.PRESETS)
    bitnet = next(p for p in got if p["name"] == "bitnet")
    assert bitnet["calibration"] == "absmean" and bitnet["scale_rounding"] == "up"
    assert bitnet["bits_per_value"] == (4096 * 4096 // 16 * 4 + 4) * 8 / 4096**2


def test_every_preset_docstring_opens_with_a_one_line_purpose():
    for make in bq.presets.PRESETS.values():
        first, blank = make.__doc__.splitlines()[:2]
        assert first.endswith(".") and len(first) <= 95 and not blank.strip(), make.__name__


def test_the_command_points_at_blockquant_presets(capsys):
    assert run("--help") == 0
    text = capsys.readouterr().out
    assert "'blockquant presets' lists them" in text and "presets.resolve" not in text
    assert run("quantize", "--help") == 0
    assert "'blockquant presets' says what each is" in " ".join(capsys.readouterr().out.split())


# -- --calibration mse says where it cannot help ----------------------------------------------


def heavy_tailed(shape=(64, 256), seed=2):
    """Weight-like values whose max |x| is many times their mean |x|."""
    return (np.random.default_rng(seed).standard_t(4, shape) * 0.015).astype(np.float32)


def test_mse_on_a_per_tensor_2_bit_scale_warns_and_names_absmean():
    x = heavy_tailed()
    with pytest.warns(RuntimeWarning, match=r"calibration 'mse' cannot help bitnet "
                      r"\(q2s/packed_u32_0/tensor:f32\).*calibration 'absmean' does better"):
        qt = bq.quantize(x, "bitnet", calibration="mse")
    # what the warning is about: the search stays near max |x|, absmean finds the scale
    with np.errstate(all="ignore"):
        mse_db = bq.metrics.sqnr_db(x, qt.dequantize())
    assert bq.metrics.sqnr_db(x, bq.quantize(x, "bitnet").dequantize()) > mse_db + 2
    with pytest.warns(RuntimeWarning, match="cannot help q2f/native/tensor:f32"):
        bq.quantize(x, bq.QuantScheme.parse("q2f/native/tensor:f32").with_options("mse"))


@pytest.mark.parametrize("scheme, calibration", [
    ("int4_block16", None),                   # its own mse: 4-bit values, scales in range
    ("bitnet", None), ("bitnet", "minmax"),   # not mse
    ("q2s/packed_u32_0/block16:f16", "mse"),  # 2-bit per block: max |x| is near the mean
    ("int8", "mse"), ("mxfp4", "mse"),
])
def test_mse_where_it_can_help_says_nothing(scheme, calibration):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bq.quantize(heavy_tailed(), scheme, calibration=calibration)


def test_the_file_functions_warn_once_when_planned(tmp_path):
    src = tmp_path / "w.npz"
    np.savez(src, a=heavy_tailed(seed=1), b=heavy_tailed(seed=2))
    with pytest.warns(RuntimeWarning, match="cannot help bitnet") as caught:
        bq.quantize_file(src, tmp_path / "q.safetensors", "bitnet", calibration="mse")
    assert len(caught) == 1 and caught[0].filename == __file__
    with pytest.warns(RuntimeWarning, match="cannot help bitnet"):
        bq.checkpoint.report_file(src, bq.presets.bitnet(), FileOptions(calibration="mse"))
    with pytest.warns(RuntimeWarning, match="cannot help bitnet"):  # a rule's scheme too
        bq.quantize_file(src, tmp_path / "r.safetensors", "int4_block16", rules=["a=bitnet"],
                         calibration="mse", dry_run=True)


@pytest.mark.parametrize("cmd", ["quantize", "report"])
def test_the_command_warns_in_one_line_and_runs(tmp_path, capsys, cmd):
    src = tmp_path / "w.npz"
    np.savez(src, a=heavy_tailed(seed=1), b=heavy_tailed(seed=2))
    argv = [cmd, src, "--scheme", "bitnet", "--calibration", "mse", "-q"]
    if cmd == "quantize":
        argv += ["-o", tmp_path / "q.safetensors", "-f"]
    assert run(*argv) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "blockquant: warning: calibration 'mse' cannot help bitnet (q2s/packed_u32_0/tensor:f32)")
    assert cmd == "report" or (tmp_path / "q.safetensors").is_file()
    assert run(*argv[:2], "--scheme", "int4_block16", "-q", *argv[7:]) == 0
    assert capsys.readouterr().err == ""
