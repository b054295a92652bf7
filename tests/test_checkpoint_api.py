"""blockquant.checkpoint as a library: the options value, and the package seams (one reader or
writer per file format, the blockquant format apart from the commands)."""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import blockquant as bq
from blockquant import checkpoint
from blockquant.checkpoint import (
    CheckpointError,
    FileOptions,
    dequantize_file,
    inspect_file,
    quantize_file,
    report_file,
)
from blockquant.checkpoint.format import part_layout

PACKAGE = Path(checkpoint.__file__).parent


def test_options_are_one_frozen_value():
    o = FileOptions(include=r"^layer\.", exclude="bias$")
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.force = True  # type: ignore[misc]
    assert o.selects("layer.0.weight") and not o.selects("layer.0.bias")
    assert not o.selects("embed")
    assert FileOptions().selects("anything")
    assert o == FileOptions(include=r"^layer\.", exclude="bias$") and hash(o) == hash(
        FileOptions(include=r"^layer\.", exclude="bias$"))


@pytest.mark.parametrize("kwargs, where", [
    ({"include": "("}, "--include: bad regular expression '('"),
    ({"exclude": "[a-"}, "--exclude: bad regular expression '[a-'"),
    ({"dtype": "int8"}, "--dtype: expected one of float16, bfloat16, float32, float64"),
])
def test_bad_options_are_refused_when_built(kwargs, where):
    with pytest.raises(CheckpointError) as e:
        FileOptions(**kwargs)
    assert str(e.value).startswith(where)


def test_commands_take_the_options(tmp_path, rng):
    src, q, d = tmp_path / "m.safetensors", tmp_path / "q.safetensors", tmp_path / "d.safetensors"
    w = rng.normal(0, 1, (4, 64)).astype(np.float32)
    save_file({"a.w": w, "b.w": w.copy()}, src)
    opts = FileOptions(exclude="^b", rounding="half_even", scale_rounding="nearest")
    res = quantize_file(src, q, bq.presets.int8_block32(), opts)
    assert res.quantized == ["a.w"] and res.copied == ["b.w"]
    want = bq.quantize(w, bq.presets.int8_block32(), rounding="half_even",
                       scale_rounding="nearest")
    np.testing.assert_array_equal(load_file(q)["a.w.values"], want.values)
    with pytest.raises(CheckpointError, match="already exists"):
        quantize_file(src, q, bq.presets.int8_block32(), opts)
    quantize_file(src, q, bq.presets.int8_block32(), dataclasses.replace(opts, force=True))
    assert dequantize_file(q, d, FileOptions(dtype="float16")) == (1, 1)
    assert load_file(d)["a.w"].dtype == np.float16
    rep = report_file(src, bq.presets.int8_block32(), opts)
    assert [r["name"] for r in rep["tensors"]] == ["a.w"]
    assert (rep["rounding"], rep["scale_rounding"]) == ("half_even", "nearest")
    assert [r["scheme"] for r in inspect_file(q)["tensors"]] == [
        str(bq.presets.int8_block32()), None]


def test_a_presets_options_apply_unless_overridden(tmp_path, rng):
    src, q = tmp_path / "m.npy", tmp_path / "q.safetensors"
    w = rng.normal(0, 1, (4, 64)).astype(np.float32)
    np.save(src, w)
    for opts, cal in [(None, "absmean"), (FileOptions(calibration="minmax"), "minmax")]:
        quantize_file(src, q, bq.presets.bitnet(), opts or FileOptions(force=True))
        entry = json.loads(inspect_meta(q))["tensors"]["m"]
        assert (entry["calibration"], entry["rounding"], entry["scale_rounding"]) == (
            cal, "half_away", "up")  # every option recorded, resolved
        want = bq.quantize(w, bq.presets.bitnet(), calibration=cal)
        np.testing.assert_array_equal(load_file(q)["m.values"], want.values)
        rep = report_file(src, bq.presets.bitnet(), opts)
        assert rep["calibration"] == cal
        q.unlink()


def inspect_meta(path):
    with checkpoint.open_checkpoint(path) as ckpt:
        return ckpt.metadata["blockquant"]


def test_part_layout_matches_burns_bytes():
    for scheme in (bq.presets.nvfp4(), bq.presets.int4_block32(), bq.presets.int8()):
        shape = (3, 48)
        parts = part_layout("w", scheme, shape)
        assert [p.name for p in parts][:2] == ["w.values", "w.scales"]
        qt = bq.quantize(np.ones(shape, np.float32), scheme)
        assert sum(p.nbytes for p in parts) == len(qt.to_bytes()) == qt.nbytes
        assert parts[0].shape == qt.values.shape and parts[1].shape == qt.scales.shape


def test_no_module_here_reaches_past_the_gateway():
    # Only the gateway talks to the compiled core; these go through QuantScheme and QTensor.
    for path in [*PACKAGE.glob("*.py"), PACKAGE.parent / "cli.py", PACKAGE.parent / "metrics.py"]:
        assert not re.search(r"\b_core\b|\b_native\b|_spec\(", path.read_text()), path
