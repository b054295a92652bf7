"""MLX folders judged by mlx and mlx-lm (issue 49): ``mx.dequantize`` of every layer blockquant
writes equals blockquant's read of it, bit for bit, in every mode and weight dtype; with MLX's
own rule (``--calibration minmax``) the words, scales and biases are ``mx.quantize``'s, byte for
byte; mlx-lm loads a tiny llama blockquant quantized (per-layer entries too) and runs it, its
logits beside those of the model holding blockquant's dequantized weights; blockquant's default
is at least as good as ``mx.quantize`` in every mode; folders mlx-lm itself wrote read back as
``mx.dequantize`` gives them.

mlx (its CPU build from PyPI) and mlx-lm are test-only: ``.ci/consumers install|test mlx DIR``
runs this file in a virtualenv of its own, with ``BLOCKQUANT_REQUIRE_MLX=1`` so that a missing
package fails instead of skipping.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("BLOCKQUANT_REQUIRE_MLX") != "1":
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")

import mlx.core as mx  # noqa: E402
from mlx_lm.utils import load_model, quantize_model, save_config, save_model  # noqa: E402

import blockquant as bq  # noqa: E402
from blockquant.checkpoint.mlx_schemes import resolve_mlx  # noqa: E402
from blockquant.checkpoint.safetensors import SafetensorsWriter, float_array  # noqa: E402
from blockquant.cli import main  # noqa: E402

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
ST = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
MODES = ["affine2", "affine3", "affine4", "affine5", "affine6", "affine8", "affine4:g32",
         "affine4:g128", "affine3:g32", "affine6:g128", "mxfp4", "mxfp8", "nvfp4"]
HIDDEN, INTER, VOCAB, LAYERS = 128, 256, 128, 2


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    return np.array(mx.array(x).astype(DTYPES[dtype]).astype(mx.float32))


def tiny_llama(root: Path, dtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A llama mlx-lm builds (its config) with heavy-tailed weights, written in ``dtype``;
    returns the weights as float32 holding the values written."""
    rng = np.random.default_rng(seed)
    t = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)) * 0.5}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        for name, shape in (("self_attn.q_proj", (HIDDEN, HIDDEN)),
                            ("self_attn.k_proj", (64, HIDDEN)),
                            ("self_attn.v_proj", (64, HIDDEN)),
                            ("self_attn.o_proj", (HIDDEN, HIDDEN)),
                            ("mlp.gate_proj", (INTER, HIDDEN)), ("mlp.up_proj", (INTER, HIDDEN)),
                            ("mlp.down_proj", (HIDDEN, INTER))):
            t[f"{p}.{name}.weight"] = rng.standard_t(5, shape) * 0.05
        t[f"{p}.input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(HIDDEN)
        t[f"{p}.post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(HIDDEN)
    t["model.norm.weight"] = np.ones(HIDDEN)
    t["lm_head.weight"] = rng.standard_t(5, (VOCAB, HIDDEN)) * 0.05
    exact = {k: round_to(v.astype(np.float32), dtype) for k, v in t.items()}
    root.mkdir(parents=True)
    entries = [(k, ST[dtype], v.shape, v.size * (4 if dtype == "float32" else 2))
               for k, v in exact.items()]
    with SafetensorsWriter(root / "model.safetensors", entries, {"format": "pt"}) as w:
        for k, v in exact.items():
            w.write(k, float_array(v, dtype))
        w.commit()
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": dtype,
           "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
           "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 10000.0,
           "tie_word_embeddings": False}
    (root / "config.json").write_text(json.dumps(cfg))
    return exact


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    return {d: (base / d, tiny_llama(base / d, d)) for d in DTYPES}


def quantized(models, tmp_path_factory, mode: str, dtype: str, *extra: str) -> Path:
    out = tmp_path_factory.mktemp("mlx") / "out"
    assert main(["quantize", str(models[dtype][0]), "-o", str(out), "--format", "mlx",
                 "--scheme", mode, "-q", *extra]) == 0
    return out


def mlx_weights(folder: Path) -> dict[str, mx.array]:
    w: dict[str, mx.array] = {}
    for f in sorted(folder.glob("*.safetensors")):
        w.update(mx.load(str(f)))
    return w


def mx_dequantized(folder: Path) -> dict[str, np.ndarray]:
    """Every quantized layer's weight as mx.dequantize gives it (its default dtype)."""
    q = json.loads((folder / "config.json").read_text())["quantization"]
    w = mlx_weights(folder)
    out = {}
    for k in w:
        if k.endswith(".scales"):
            m = k[: -len(".scales")]
            e = q.get(m, q)
            d = mx.dequantize(w[f"{m}.weight"], w[k], w.get(f"{m}.biases"),
                              group_size=e["group_size"], bits=e["bits"], mode=e["mode"])
            out[f"{m}.weight"] = np.array(d.astype(mx.float32))
    return out


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("calibration", ["mse", "minmax"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", MODES)
def test_mx_dequantize_is_blockquants_read_bit_for_bit(models, tmp_path_factory, mode, dtype,
                                                       calibration):
    folder = quantized(models, tmp_path_factory, mode, dtype, "--calibration", calibration)
    theirs = mx_dequantized(folder)
    ours = bq.load(folder)
    assert len(theirs) == 2 + 7 * LAYERS  # every Linear and the embeddings
    for name, d in theirs.items():
        assert np.array_equal(bits(d), bits(ours[name])), name


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", MODES)
def test_mlx_s_own_rule_gives_mx_quantize_s_bytes(models, tmp_path_factory, mode, dtype):
    folder = quantized(models, tmp_path_factory, mode, dtype, "--calibration", "minmax")
    ms = resolve_mlx(mode)
    w = mlx_weights(folder)
    for name, x in models[dtype][1].items():
        if name.endswith("norm.weight"):
            continue
        m = name[: -len(".weight")]
        theirs = mx.quantize(mx.array(x).astype(DTYPES[dtype]), group_size=ms.group,
                             bits=ms.bits, mode=ms.mode)
        ours = [w[f"{m}.weight"], w[f"{m}.scales"]] + ([w[f"{m}.biases"]]
                                                       if ms.mode == "affine" else [])
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype)
            assert np.array_equal(np.array(a.view(mx.uint8) if a.dtype != mx.uint32 else a),
                                  np.array(b.view(mx.uint8) if b.dtype != mx.uint32 else b)), name


def sqnr(x: np.ndarray, y: np.ndarray) -> float:
    x64 = x.astype(np.float64)
    return float(10 * np.log10(np.sum(x64 ** 2) / np.sum((x64 - y) ** 2)))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", MODES)
def test_blockquant_s_default_is_at_least_as_good_as_mx_quantize(models, tmp_path_factory,
                                                                  mode, dtype):
    folder = quantized(models, tmp_path_factory, mode, dtype)
    ms = resolve_mlx(mode)
    ours = bq.load(folder)
    num = err_ours = err_mlx = 0.0
    for name, x in models[dtype][1].items():
        if name.endswith("norm.weight"):
            continue
        r = mx.quantize(mx.array(x).astype(DTYPES[dtype]), group_size=ms.group, bits=ms.bits,
                        mode=ms.mode)
        d = mx.dequantize(*r[:2], r[2] if len(r) > 2 else None, group_size=ms.group,
                          bits=ms.bits, mode=ms.mode)
        theirs = np.array(d.astype(mx.float32)).astype(np.float64)
        x64 = x.astype(np.float64)
        num += np.sum(x64 ** 2)
        err_ours += np.sum((x64 - np.asarray(ours[name], np.float64)) ** 2)
        err_mlx += np.sum((x64 - theirs) ** 2)
    assert 10 * np.log10(num / err_ours) >= 10 * np.log10(num / err_mlx), (mode, dtype)


def logits(folder: Path) -> np.ndarray:
    model, _ = load_model(folder)
    out = model(mx.array([[1, 5, 9, 2, 7, 3]]))
    mx.eval(out)
    return np.array(out.astype(mx.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("mode", ["affine4", "affine3:g32", "affine8:g128", "mxfp4", "mxfp8",
                                  "nvfp4"])
def test_mlx_lm_loads_and_runs_it(models, tmp_path_factory, mode, dtype):
    folder = quantized(models, tmp_path_factory, mode, dtype)
    got = logits(folder)
    assert np.isfinite(got).all()
    # beside the float model holding blockquant's dequantized weights: the same numbers up to
    # the kernels' order of sums
    deq = tmp_path_factory.mktemp("deq") / "m"
    assert main(["dequantize", str(folder), "-o", str(deq), "--dtype", dtype, "-q"]) == 0
    want = logits(deq)
    if dtype == "float32":
        assert np.allclose(got, want, atol=1e-4 * np.abs(want).max(), rtol=1e-4)
    else:  # bfloat16 activations round differently in the quantized and the dense kernels
        g, w = got.ravel().astype(np.float64), want.ravel().astype(np.float64)
        assert g @ w / np.sqrt((g @ g) * (w @ w)) > 0.998


def test_mlx_lm_takes_per_layer_entries(models, tmp_path_factory):
    folder = quantized(models, tmp_path_factory, "affine4", "bfloat16", "--rule",
                       "down_proj=affine8:g32", "--rule", "embed=mxfp8", "--rule",
                       "lm_head=keep")
    model, cfg = load_model(folder)
    layer = model.model.layers[0]
    assert (layer.mlp.down_proj.bits, layer.mlp.down_proj.group_size) == (8, 32)
    assert model.model.embed_tokens.mode == "mxfp8"
    assert not hasattr(model.lm_head, "scales")
    assert np.isfinite(logits(folder)).all()
    theirs, ours = mx_dequantized(folder), bq.load(folder)
    for name, d in theirs.items():
        assert np.array_equal(bits(d), bits(ours[name])), name


@pytest.mark.parametrize("mode", ["affine", "mxfp4", "nvfp4", "mxfp8"])
def test_folders_mlx_lm_wrote_read_back_as_mx_dequantize_gives_them(models, tmp_path, mode):
    src = models["bfloat16"][0]
    model, cfg = load_model(src)

    def predicate(path, module):  # per-layer entries as mlx-lm writes them
        if mode == "affine" and path.endswith("down_proj"):
            return {"group_size": 32, "bits": 6, "mode": "affine"}
        return True

    model, qcfg = quantize_model(model, cfg, None, None, mode=mode, quant_predicate=predicate)
    out = tmp_path / "mlxlm"
    save_model(out, model)
    save_config(qcfg, out / "config.json")
    theirs, ours = mx_dequantized(out), bq.load(out)
    assert theirs
    for name, d in theirs.items():
        assert np.array_equal(bits(d), bits(ours[name])), name


def hard_rows(dtype: str, seed: int) -> np.ndarray:
    """Rows MLX's rule is easy to get wrong on: groups of zeros, exact E2M1 ties, weights so
    small that an nvfp4 scale rounds to 0, magnitudes from 1e-4 to 30, powers of two."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 256)) * rng.choice([1e-4, 1e-3, 0.02, 1.0, 30.0], (16, 1))
    x[0, :64] = 0
    x[1, :32] = 0.25 * rng.integers(-8, 9, 32)
    x[2, :32] = rng.choice([0.75, -0.75, 0.25, -0.25, 1.25, 2.5, 5, -5, 3.5, 6, -0.0], 32)
    x[3, :] = 2.0 ** rng.integers(-20, 5, 256) * rng.choice([-1, 1], 256)
    return round_to(x.astype(np.float32), dtype)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode", MODES)
def test_mlx_codec_is_mx_quantize_and_mx_dequantize(mode, dtype, seed):
    from blockquant.checkpoint.mlx_codec import dequantize, mlx_quantize, pack

    ms = resolve_mlx(mode)
    x = hard_rows(dtype, seed)
    r = mx.quantize(mx.array(x).astype(DTYPES[dtype]), group_size=ms.group, bits=ms.bits,
                    mode=ms.mode)
    q, s, b = mlx_quantize(x, ms.mode, ms.bits, ms.group, ST[dtype])
    assert np.array_equal(np.array(r[0]), pack(q, ms.bits))
    if ms.mode == "affine":
        assert np.array_equal(bits(np.array(r[1].astype(mx.float32))), bits(s))
        assert np.array_equal(bits(np.array(r[2].astype(mx.float32))), bits(b))
        sc, bi = s, b
    else:
        assert np.array_equal(np.array(r[1]), s)
        sc, bi = s, None
    theirs = mx.dequantize(*r[:2], r[2] if len(r) > 2 else None, group_size=ms.group,
                           bits=ms.bits, mode=ms.mode)
    ours = dequantize(ms.mode, ms.bits, ms.group, ST[dtype] if ms.mode == "affine" else "BF16",
                      np.array(r[0]), sc, bi)
    assert np.array_equal(bits(np.array(theirs.astype(mx.float32))), bits(ours))
