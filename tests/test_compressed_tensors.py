"""compressed-tensors folders (issue 48), without torch: what blockquant writes (names, dtypes,
shapes, config, packing) checked against the format's definition written out here by hand,
every weight read back equal to blockquant's own dequantized values in the format's dtype, the
fused sets and the ignore list, the bad inputs, and reading, inspecting, reporting and
dequantizing such folders. The ``compressed_tensors`` package and transformers judge the same
folders in tests/consumers/test_ct_consumers.py (the CI stage with torch)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import blockquant as bq
from blockquant.checkpoint.ct_codec import pack_columns, unpack_rows
from blockquant.checkpoint.ct_schemes import PRESETS, ct_rule, resolve_ct, searched_rule
from blockquant.checkpoint.safetensors import SafetensorsWriter, float_array
from blockquant.cli import main

ST = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def run(*argv):
    return main([str(a) for a in argv])


def one_error_line(capsys, *words):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blockquant: error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def llama_tensors(rng, hidden=64, inter=128, layers=2, vocab=96, kv=32, odd_down=False):
    """Name -> float32 array of a small llama: embeddings, per layer q/k/v/o, gate/up/down and
    two norms, a final norm and lm_head; heavy-tailed weights as real ones are."""
    t = {"model.embed_tokens.weight": rng.standard_normal((vocab, hidden))}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(hidden)
        for name, shape in (("q_proj", (hidden, hidden)), ("k_proj", (kv, hidden)),
                            ("v_proj", (kv, hidden)), ("o_proj", (hidden, hidden))):
            t[f"{p}.self_attn.{name}.weight"] = rng.standard_t(5, shape) * 0.05
        t[f"{p}.post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(hidden)
        down_in = inter + 8 if odd_down else inter
        t[f"{p}.mlp.gate_proj.weight"] = rng.standard_t(5, (down_in, hidden)) * 0.05
        t[f"{p}.mlp.up_proj.weight"] = rng.standard_t(5, (down_in, hidden)) * 0.05
        t[f"{p}.mlp.down_proj.weight"] = rng.standard_t(5, (hidden, down_in)) * 0.05
    t["model.norm.weight"] = np.ones(hidden)
    t["lm_head.weight"] = rng.standard_normal((vocab, hidden)) * 0.05
    return {k: v.astype(np.float32) for k, v in t.items()}


def write_model(root: Path, tensors: dict, dtype: str = "bfloat16", shards: int = 1,
                config: dict | None = None) -> dict:
    """The tensors as a model folder in ``dtype`` (rounded to it); returns them as float32
    holding exactly the values written."""
    root.mkdir(parents=True)
    names = list(tensors)
    exact = {k: np.asarray(v.astype(NP[dtype]), dtype=np.float32) for k, v in tensors.items()}
    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)] \
        if shards > 1 else ["model.safetensors"]
    weight_map = {}
    for i, fname in enumerate(files):
        part = names[i::shards]
        entries = [(k, ST[dtype], tensors[k].shape, exact[k].size * np.dtype(NP[dtype]).itemsize)
                   for k in part]
        with SafetensorsWriter(root / fname, entries, {"format": "pt"}) as w:
            for k in part:
                w.write(k, float_array(exact[k], dtype))
            w.commit()
        weight_map.update({k: fname for k in part})
    if shards > 1:
        (root / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": 0}, "weight_map": weight_map}))
    cfg = config if config is not None else {"model_type": "llama", "architectures":
                                             ["LlamaForCausalLM"], "torch_dtype": dtype}
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer.json").write_text('{"version": "1.0"}')
    return exact


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(7)
    return tmp_path / "m", write_model(tmp_path / "m", llama_tensors(rng))


def read_raw(path: Path) -> tuple[dict, dict]:
    """A safetensors file's header and each tensor's raw bytes (no library between)."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8: 8 + n])
    header.pop("__metadata__", None)
    raw = {k: data[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]]
           for k, v in header.items()}
    return header, raw


def expected_deq(x: np.ndarray, cs_name: str, dtype: str, minmax: bool,
                 g: float | None = None) -> np.ndarray:
    """blockquant's own quantize-dequantize of ``x`` for that compressed-tensors scheme, in
    the dtype compressed-tensors dequantizes it to."""
    from blockquant.checkpoint.ct_schemes import scheme_for
    cs = resolve_ct(cs_name)
    text, _ = scheme_for(cs, ST[dtype], x.shape)
    rule = ct_rule(cs) if minmax else searched_rule(cs)
    if minmax and cs.family in ("mxfp4", "mxfp8"):
        qt = bq.quantize(x, text, scales=ct_mx_rule(x, 2 if cs.family == "mxfp4" else 8),
                         rounding="half_even")
    else:
        qt = bq.quantize(x, text, global_scale=g, **rule)
    out = qt.dequantize()
    out_dtype = "bfloat16" if cs.family in ("nvfp4", "mxfp4", "mxfp8") else dtype
    return np.asarray(out.astype(NP[out_dtype]), dtype=np.float32)


def ct_mx_rule(x: np.ndarray, emax: int) -> np.ndarray:
    """compressed-tensors' MX scales, by hand: a group's max |x| = m · 2^e (1 <= m < 2) goes to
    2^e, or to 2^(e+1) when m >= 1.75; the scale is that over 2^emax."""
    amax = np.abs(x.astype(np.float64)).reshape(x.shape[0], -1, 32).max(axis=2)
    m, e = np.frexp(amax)  # amax = m · 2^e with 0.5 <= m < 1
    e = e - 1 + (m >= 0.875)
    return (2.0 ** (e - emax)).astype(np.float32)


LINEAR = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
SCHEMES = ["W4A16", "W8A16", "W2A16", "W4A16:G32", "W4A16:CHANNEL", "W8A8", "FP8_DYNAMIC",
           "FP8_BLOCK", "NVFP4A16", "MXFP4A16", "MXFP4", "MXFP8A16", "W4A16_ASYM",
           "W8A16_ASYM:G64", "W2A16_ASYM:CHANNEL"]


@pytest.mark.parametrize("minmax", [False, True], ids=["searched", "minmax"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_weight_reads_back_as_blockquant_dequantizes_it(tmp_path, scheme, dtype, minmax):
    rng = np.random.default_rng(3)
    src = tmp_path / "m"
    exact = write_model(src, llama_tensors(rng, hidden=128, inter=256, layers=1, kv=64), dtype)
    out = tmp_path / "out"
    args = ["quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme", scheme,
            "-q"] + (["--calibration", "minmax"] if minmax else [])
    assert run(*args) == 0
    loaded = bq.load(out)
    header, raw = read_raw(out / "model.safetensors")
    cs = resolve_ct(scheme)
    for lin in LINEAR:
        name = f"model.layers.0.{lin}.weight"
        g = None
        if cs.family == "nvfp4":  # the global scale written is 1/g
            gs = np.frombuffer(raw[name.replace(".weight", ".weight_global_scale")], "<f4")[0]
            g = float(1.0 / gs)
        want = expected_deq(exact[name], scheme, dtype, minmax, g)
        got = np.asarray(loaded[name], dtype=np.float32)
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), name
    for kept in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert np.asarray(loaded[kept], dtype=np.float32).tobytes() == exact[kept].tobytes()
        assert header[kept]["dtype"] == ST[dtype]


def test_the_parameters_are_named_and_shaped_as_the_format_defines(model, tmp_path):
    src, _ = model
    shapes = {"q_proj": (64, 64), "k_proj": (32, 64), "mlp.down_proj": (64, 128)}
    want = {
        "W4A16": {"weight_packed": ("I32", lambda r, c: [r, c // 8]),
                  "weight_scale": ("BF16", lambda r, c: [r, c // 128 or 1]),
                  "weight_shape": ("I64", lambda r, c: [2])},
        "FP8_DYNAMIC": {"weight": ("F8_E4M3", lambda r, c: [r, c]),
                        "weight_scale": ("BF16", lambda r, c: [r, 1])},
        "FP8_BLOCK": {"weight": ("F8_E4M3", lambda r, c: [r, c]),
                      "weight_scale": ("BF16", lambda r, c: [-(-r // 128), -(-c // 128)])},
        "NVFP4A16": {"weight_packed": ("U8", lambda r, c: [r, c // 2]),
                     "weight_scale": ("F8_E4M3", lambda r, c: [r, c // 16]),
                     "weight_global_scale": ("F32", lambda r, c: [1])},
        "MXFP4A16": {"weight_packed": ("U8", lambda r, c: [r, c // 2]),
                     "weight_scale": ("U8", lambda r, c: [r, c // 32])},
        "MXFP8A16": {"weight": ("F8_E4M3", lambda r, c: [r, c]),
                     "weight_scale": ("U8", lambda r, c: [r, c // 32])},
        "W8A8": {"weight": ("I8", lambda r, c: [r, c]),
                 "weight_scale": ("BF16", lambda r, c: [r, 1])},
    }
    for scheme, params in want.items():
        if scheme == "W4A16":  # groups of 128 need 128 input features: the 64-wide ones are
            continue  # ignored, checked below with a wider model
        out = tmp_path / scheme
        assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme",
                   scheme, "-q") == 0
        header, _ = read_raw(out / "model.safetensors")
        for lin, (r, c) in shapes.items():
            module = f"model.layers.0.{'self_attn.' if 'proj' in lin and '.' not in lin else ''}{lin}"
            names = {k.rpartition(".")[2] for k in header if k.rpartition(".")[0] == module}
            assert names == set(params), (scheme, module, names)
            for p, (dt, shape) in params.items():
                assert header[f"{module}.{p}"]["dtype"] == dt, (scheme, p)
                assert header[f"{module}.{p}"]["shape"] == shape(r, c), (scheme, p)


def test_w4a16_packs_q_plus_8_eight_to_a_word_lowest_bits_first(tmp_path):
    rng = np.random.default_rng(1)
    src = tmp_path / "m"
    exact = write_model(src, llama_tensors(rng, hidden=256, inter=256, layers=1), "float32")
    out = tmp_path / "o"
    assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme", "W4A16",
               "--calibration", "minmax", "-q") == 0
    header, raw = read_raw(out / "model.safetensors")
    m = "model.layers.0.mlp.down_proj"
    words = np.frombuffer(raw[f"{m}.weight_packed"], "<u4").reshape(header[f"{m}.weight_packed"]["shape"])
    scale = np.frombuffer(raw[f"{m}.weight_scale"], "<f4").reshape(256, 2)
    shape = np.frombuffer(raw[f"{m}.weight_shape"], "<i8")
    assert shape.tolist() == [256, 256]
    # by hand: nibble k of word j is column 8j + k, stored as q + 8
    q = np.stack([(words >> (4 * k)) & 0xF for k in range(8)], axis=-1).reshape(256, 256)
    q = q.astype(np.int64) - 8
    x = exact[f"{m}.weight"]
    s = np.repeat(scale, 128, axis=1)
    # compressed-tensors' symmetric rule: s = amax / 7.5, q = round_half_even(x / s) in [-8, 7]
    amax = np.abs(x.reshape(256, 2, 128)).max(axis=2)
    assert np.array_equal(scale, (amax / np.float32(7.5)).astype(np.float32))
    assert np.array_equal(q, np.clip(np.rint(x / s), -8, 7))


def test_zero_points_pack_down_the_columns():
    z = np.arange(20 * 3, dtype=np.uint32).reshape(20, 3) % 16
    packed = pack_columns(z, 4)
    assert packed.shape == (3, 3) and packed.dtype == np.int32
    w = packed.view(np.uint32)
    assert int(w[0, 0]) == sum(int(z[k, 0]) << (4 * k) for k in range(8))
    assert int(w[2, 1]) == sum(int(z[16 + k, 1]) << (4 * k) for k in range(4))  # padding 0
    back = unpack_rows(np.ascontiguousarray(packed.T), 4, 20).T
    assert np.array_equal(back, z)
    for bits in (3, 5, 6, 7):  # formats blockquant reads but does not write: straddling words
        vals = np.random.default_rng(bits).integers(0, 1 << bits, (4, 37))
        stream = sum(int(v) << (bits * i) for i, v in enumerate(vals[1]))
        nwords = -(-37 * bits // 32)
        words = np.array([[(stream >> (32 * j)) & 0xFFFFFFFF for j in range(nwords)]] * 4,
                         dtype=np.uint32)
        assert unpack_rows(words.view(np.int32), bits, 37)[1].tolist() == vals[1].tolist()


def test_config_is_the_one_llm_compressor_writes(model, tmp_path):
    src, _ = model
    out = tmp_path / "o"
    assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme",
               "NVFP4A16", "-q") == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["torch_dtype"] == "bfloat16"
    q = cfg["quantization_config"]
    assert q == {
        "config_groups": {"NVFP4A16": {
            "format": "nvfp4-pack-quantized", "input_activations": None,
            "output_activations": None, "targets": ["Linear"],
            "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                        "group_size": 16, "num_bits": 4, "observer": None,
                        "observer_kwargs": {}, "scale_dtype": "torch.float8_e4m3fn",
                        "strategy": "tensor_group", "symmetric": True, "type": "float",
                        "zp_dtype": None}}},
        "format": "nvfp4-pack-quantized", "global_compression_ratio": None,
        "ignore": ["lm_head"], "kv_cache_scheme": None, "quant_method": "compressed-tensors",
        "quantization_status": "compressed", "transform_config": {}, "version": "0.19.0"}
    fp8 = PRESETS["FP8_BLOCK"].weight_args()
    assert (fp8["strategy"], fp8["block_structure"], fp8["type"]) == ("block", [128, 128], "float")
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'


def test_fused_sets_share_one_global_scale_and_one_fate(tmp_path):
    rng = np.random.default_rng(5)
    t = llama_tensors(rng, layers=1)
    t["model.layers.0.self_attn.k_proj.weight"] *= 8  # another amax in the set
    src = tmp_path / "m"
    write_model(src, t)
    out = tmp_path / "o"
    assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme",
               "NVFP4A16", "-q") == 0
    _, raw = read_raw(out / "model.safetensors")
    gs = {k: np.frombuffer(v, "<f4")[0] for k, v in raw.items() if k.endswith("global_scale")}
    p = "model.layers.0"
    qkv = {gs[f"{p}.self_attn.{m}.weight_global_scale"] for m in ("q_proj", "k_proj", "v_proj")}
    assert len(qkv) == 1
    assert gs[f"{p}.mlp.gate_proj.weight_global_scale"] == gs[f"{p}.mlp.up_proj.weight_global_scale"]
    g = 1 / qkv.pop()
    amax = max(np.abs(t[f"{p}.self_attn.{m}.weight"]).max() for m in ("q_proj", "k_proj", "v_proj"))
    assert g == 2.0 ** np.ceil(np.log2(np.float32(amax.astype(ml_dtypes.bfloat16)) / 2688))


def test_a_layer_the_format_cannot_take_is_ignored_with_its_fused_partners(tmp_path, capsys):
    rng = np.random.default_rng(2)
    t = llama_tensors(rng, hidden=128, inter=128, layers=1, kv=64, odd_down=True)
    src = tmp_path / "m"
    write_model(src, t)
    out = tmp_path / "o"
    # gate/up have 128 inputs (fine for groups of 128) but down_proj 136: ignored alone
    assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme",
               "W4A16", "--exclude", "k_proj") == 0
    printed = capsys.readouterr().out
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q["ignore"] == ["lm_head", "model.layers.0.mlp.down_proj",
                           "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.q_proj",
                           "model.layers.0.self_attn.v_proj"]
    assert "ignore" in printed and "down_proj" in printed
    header, _ = read_raw(out / "model.safetensors")
    assert "model.layers.0.self_attn.q_proj.weight" in header  # kept in float with k_proj
    assert "model.layers.0.mlp.up_proj.weight_packed" in header
    assert run("quantize", src, "-o", tmp_path / "s", "--format", "compressed-tensors",
               "--scheme", "W4A16", "--strict") == 2
    one_error_line(capsys, "down_proj", "not a multiple", "--strict")


def test_bad_inputs_are_one_line_and_write_nothing(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "o"
    ct = ["--format", "compressed-tensors"]
    cases = [
        ([src / "model.safetensors", "-o", out, *ct, "--scheme", "W4A16"], ("model folder",)),
        ([src, "-o", out, *ct, "--scheme", "Q4_K_M"], ("W4A16", "Q4_K_M")),
        ([src, "-o", out, *ct, "--scheme", "NVFP4"], ("calibration data", "NVFP4A16")),
        ([src, "-o", out, *ct, "--scheme", "W3A16"], ("W4A16",)),
        ([src, "-o", out, *ct, "--scheme", "FP8_BLOCK:G32"], ("fixed layout",)),
        ([src, "-o", out, *ct, "--scheme", "W4A16:G48"], ("G32, G64, G128",)),
        ([src, "-o", out, *ct, "--scheme", "W4A16", "--rule", "q_proj=keep"], ("--rule",)),
        ([src, "-o", out, *ct, "--scheme", "W4A16", "--calibration", "absmean"],
         ("--calibration",)),
    ]
    for argv, words in cases:
        assert run("quantize", *argv) == 2, argv
        one_error_line(capsys, *words)
    assert not out.exists()
    # only down_proj of this 64-wide model has 128 inputs, and it is left out: nothing to do
    assert run("quantize", src, "-o", out, *ct, "--scheme", "W4A16", "--exclude",
               "down_proj") == 2
    one_error_line(capsys, "no Linear layer W4A16 can take", "not a multiple of")
    # already quantized: its config says so
    q = tmp_path / "q"
    assert run("quantize", src, "-o", q, *ct, "--scheme", "W8A16", "-q") == 0
    assert run("quantize", q, "-o", out, *ct, "--scheme", "W4A16") == 2
    one_error_line(capsys, "already holds a quantization_config", "dequantize")
    assert run("quantize", q, "-o", out, "--scheme", "int8") == 2
    one_error_line(capsys, "compressed-tensors", "dequantize")
    # no config.json
    (src / "config.json").unlink()
    assert run("quantize", src, "-o", out, *ct, "--scheme", "W4A16") == 2
    one_error_line(capsys, "config.json", "not found")
    assert not out.exists()


def test_fused_layers_whose_shapes_disagree_are_refused(tmp_path, capsys):
    rng = np.random.default_rng(4)
    t = llama_tensors(rng, layers=1)
    t["model.layers.0.self_attn.v_proj.weight"] = rng.standard_normal((32, 48)).astype(np.float32)
    src = tmp_path / "m"
    write_model(src, t)
    assert run("quantize", src, "-o", tmp_path / "o", "--format", "compressed-tensors",
               "--scheme", "FP8_DYNAMIC") == 2
    one_error_line(capsys, "v_proj", "input sizes differ")


def test_jobs_and_shards_give_the_same_bytes(tmp_path):
    rng = np.random.default_rng(9)
    t = llama_tensors(rng)
    one, three = tmp_path / "one", tmp_path / "three"
    write_model(one, t)
    write_model(three, t, shards=3)
    outs = []
    for src, jobs in ((one, 1), (three, 1), (three, 2)):
        out = tmp_path / f"o_{src.name}_{jobs}"
        assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme",
                   "NVFP4A16", "--jobs", jobs, "-q") == 0
        outs.append(out)
    merged = []
    for out in outs:
        tensors = {}
        for f in sorted(out.glob("*.safetensors")):
            tensors.update(read_raw(f)[1])
        merged.append(tensors)
    assert merged[0] == merged[1] == merged[2]
    index = json.loads((outs[1] / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(merged[1])


def test_a_folder_is_read_inspected_reported_and_dequantized(model, tmp_path, capsys):
    src, exact = model
    out, deq = tmp_path / "o", tmp_path / "d"
    assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme",
               "W8A16", "-q") == 0
    loaded = bq.load(out)
    assert set(loaded) == set(exact)
    assert loaded["model.layers.0.mlp.up_proj.weight"].dtype == ml_dtypes.bfloat16
    assert run("inspect", out) == 0
    shown = capsys.readouterr().out
    assert "pack-quantized" in shown and "model.layers.0.mlp.up_proj.weight" in shown
    assert run("report", out, "--scheme", "int8") == 0
    capsys.readouterr()
    assert run("dequantize", out, "-o", deq, "-q") == 0
    cfg = json.loads((deq / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"
    back = bq.load(deq)
    for k in exact:
        assert np.asarray(back[k], np.float32).tobytes() == \
            np.asarray(loaded[k], np.float32).tobytes(), k
    # the dequantized folder is a plain model again: it quantizes
    assert run("quantize", deq, "-o", tmp_path / "again", "--format", "compressed-tensors",
               "--scheme", "W4A16:G32", "-q") == 0


def test_searched_scales_beat_the_format_s_own_rule(tmp_path):
    rng = np.random.default_rng(11)
    src = tmp_path / "m"
    exact = write_model(src, llama_tensors(rng, hidden=128, inter=256), "bfloat16")
    for scheme in ("W4A16:G32", "NVFP4A16", "MXFP4A16", "FP8_DYNAMIC"):
        errs = []
        for cal in ("mse", "minmax"):
            out = tmp_path / f"{scheme}_{cal}".replace(":", "_")
            assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme",
                       scheme, "--calibration", cal, "-q") == 0
            loaded = bq.load(out)
            errs.append(sum(float(np.sum((np.asarray(loaded[k], np.float64) - exact[k]) ** 2))
                            for k in exact if "proj" in k))
        assert errs[0] < errs[1], (scheme, errs)


def test_a_crafted_folder_is_an_error_naming_the_tensor(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "o"
    assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme",
               "W8A16", "-q") == 0
    cfg_path = out / "config.json"
    good = json.loads(cfg_path.read_text())
    weights = good["quantization_config"]["config_groups"]["W8A16"]["weights"]
    for key, bad in (("num_bits", 0), ("num_bits", "8"), ("group_size", 0),
                     ("group_size", None), ("strategy", "block"), ("num_bits", 4)):
        cfg = json.loads(json.dumps(good))
        cfg["quantization_config"]["config_groups"]["W8A16"]["weights"] = {**weights, key: bad}
        cfg_path.write_text(json.dumps(cfg))
        with pytest.raises(bq.QuantError, match="weight"):
            bq.load(out)
        assert run("dequantize", out, "-o", tmp_path / "d") == 2
        one_error_line(capsys, "model.layers")
        assert not (tmp_path / "d").exists()
    # a weight_shape that does not fit its packed words
    cfg_path.write_text(json.dumps(good))
    header, raw = read_raw(out / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight_shape"
    data = (out / "model.safetensors").read_bytes()
    at = data.index(raw[name])
    (out / "model.safetensors").write_bytes(data[:at] + np.array([64, 4096], "<i8").tobytes()
                                            + data[at + 16:])
    with pytest.raises(bq.QuantError, match="down_proj"):
        bq.load(out)


def test_asymmetric_zero_points_are_packed_down_the_columns(tmp_path):
    rng = np.random.default_rng(6)
    src = tmp_path / "m"
    exact = write_model(src, llama_tensors(rng, hidden=128, inter=256, layers=1, kv=64),
                        "float32")
    out = tmp_path / "o"
    assert run("quantize", src, "-o", out, "--format", "compressed-tensors", "--scheme",
               "W4A16_ASYM:G32", "--calibration", "minmax", "-q") == 0
    header, raw = read_raw(out / "model.safetensors")
    m = "model.layers.0.self_attn.k_proj"  # 64 x 128: 4 groups of 32 a row
    zp = np.frombuffer(raw[f"{m}.weight_zero_point"], "<u4").reshape(8, 4)  # 64 rows / 8
    z = np.stack([(zp >> (4 * k)) & 0xF for k in range(8)], axis=1).reshape(64, 4)
    words = np.frombuffer(raw[f"{m}.weight_packed"], "<u4").reshape(64, 16)
    q = np.stack([(words >> (4 * k)) & 0xF for k in range(8)], axis=-1).reshape(64, 128)
    s = np.frombuffer(raw[f"{m}.weight_scale"], "<f4").reshape(64, 4)
    x = exact[f"{m}.weight"].reshape(64, 4, 32)
    # compressed-tensors' asymmetric rule, by hand: the range widened to hold 0, 15 steps,
    # z = round(-lo / s), q = clamp(round(x / s) + z, 0, 15), x = (q - z) * s
    lo = np.minimum(x.min(axis=2), 0)
    hi = np.maximum(x.max(axis=2), 0)
    assert np.array_equal(s, ((hi - lo) / np.float32(15)).astype(np.float32))
    assert np.array_equal(z, np.clip(np.rint(-lo / s), 0, 15))
    want = np.clip(np.rint(x / s[:, :, None]) + z[:, :, None], 0, 15).reshape(64, 128)
    assert np.array_equal(q, want)
    got = np.asarray(bq.load(out)[f"{m}.weight"], np.float32).reshape(64, 4, 32)
    diff = q.reshape(64, 4, 32).astype(np.int64) - z[:, :, None].astype(np.int64)
    assert np.array_equal(got, (diff.astype(np.float32) * s[:, :, None]).astype(np.float32))


def test_the_api_writes_it_as_the_command_does(model, tmp_path):
    src, _ = model
    plan = bq.quantize_file(src, tmp_path / "p", "NVFP4A16", output_format="compressed-tensors",
                            dry_run=True)
    assert not (tmp_path / "p").exists() and len(plan.quantized) == 14
    res = bq.quantize_file(src, tmp_path / "api", "nvfp4a16", output_format="compressed-tensors",
                           jobs=2)
    assert sorted(res.quantized) == sorted(plan.quantized)
    assert run("quantize", src, "-o", tmp_path / "cli", "--format", "compressed-tensors",
               "--scheme", "NVFP4A16", "-q") == 0
    for f in ("model.safetensors", "config.json"):
        assert (tmp_path / "api" / f).read_bytes() == (tmp_path / "cli" / f).read_bytes()
