"""Safetensors files and model folders written as GGUF: names as llama.cpp's architectures
have them (gguf-py's TensorNameMap), the hyperparameter keys, llama's query/key rows in ggml's
rotary order (checked against a permutation worked out here, head by head), 1-D tensors as F32,
a named mix per tensor, and every tensor read back through gguf-py as blockquant's values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from blockquant import gguf as bg
from blockquant.cli import main

gguf = pytest.importorskip("gguf")
from gguf import GGUFReader  # noqa: E402
from gguf import quants as gq  # noqa: E402

st = pytest.importorskip("safetensors.numpy")

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB = 256, 4, 2, 512, 2, 32


def llama_folder(root: Path, *, tied: bool = False, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    head = HIDDEN // HEADS
    t = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
              p + "self_attn.k_proj.weight": (KV_HEADS * head, HIDDEN),
              p + "self_attn.v_proj.weight": (KV_HEADS * head, HIDDEN),
              p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
              p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
              p + "mlp.down_proj.weight": (HIDDEN, FFN),
              p + "input_layernorm.weight": (HIDDEN,),
              p + "post_attention_layernorm.weight": (HIDDEN,)}
    if not tied:
        t["lm_head.weight"] = (VOCAB, HIDDEN)
    arrays = {k: (rng.standard_normal(s) * 0.02).astype(dtype) for k, s in t.items()}
    root.mkdir(parents=True, exist_ok=True)
    st.save_file(arrays, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "max_position_embeddings": 2048, "vocab_size": VOCAB,
        "tie_word_embeddings": tied}))
    return arrays


def rotary_rows(x: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's rotary halves to ggml's neighbouring pairs, row by row: within a head of
    d rows, output row 2j is input row j and output row 2j+1 is input row d/2 + j."""
    d = x.shape[0] // heads
    out = np.empty_like(x)
    for h in range(heads):
        for j in range(d // 2):
            out[h * d + 2 * j] = x[h * d + j]
            out[h * d + 2 * j + 1] = x[h * d + d // 2 + j]
    return out


def convert(src: Path, dst: Path, *args: str) -> GGUFReader:
    assert main(["quantize", str(src), "-o", str(dst), "-q", *args]) == 0
    return GGUFReader(dst)


def test_llama_folder_as_gguf(tmp_path):
    arrays = llama_folder(tmp_path / "m")
    r = convert(tmp_path / "m", tmp_path / "m.gguf", "--scheme", "Q8_0")
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert kv["general.architecture"] == "llama"
    assert kv["llama.block_count"] == LAYERS and kv["llama.embedding_length"] == HIDDEN
    assert kv["llama.attention.head_count"] == HEADS
    assert kv["llama.attention.head_count_kv"] == KV_HEADS
    assert kv["llama.feed_forward_length"] == FFN and kv["llama.rope.dimension_count"] == 64
    assert kv["llama.rope.freq_base"] == 500000.0 and kv["general.file_type"] == 7
    assert abs(kv["llama.attention.layer_norm_rms_epsilon"] - 1e-5) < 1e-12
    tensors = {t.name: t for t in r.tensors}
    assert set(tensors) == {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(LAYERS) for n in (
            "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
            "attn_norm", "ffn_norm")}
    assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    # Q and K rows in ggml's rotary order; every other weight as it was.
    for name, gname, heads in (("model.layers.1.self_attn.q_proj.weight", "blk.1.attn_q.weight",
                                HEADS),
                               ("model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight",
                                KV_HEADS),
                               ("model.layers.1.self_attn.v_proj.weight", "blk.1.attn_v.weight",
                                0)):
        x = arrays[name] if not heads else rotary_rows(arrays[name], heads)
        t = tensors[gname]
        assert t.tensor_type.name == "Q8_0"
        want = gq.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        assert np.array_equal(np.asarray(t.data).reshape(-1), want.reshape(-1))


def test_a_named_mix_on_a_folder_reads_back_bit_for_bit(tmp_path):
    arrays = llama_folder(tmp_path / "m", dtype=np.float16)
    r = convert(tmp_path / "m", tmp_path / "m.gguf", "--scheme", "Q4_K_M")
    tensors = {t.name: t for t in r.tensors}
    # two layers: the first eighth of 2 is no layer (2 // 8 = 0), the last eighth from layer
    # 7 * 2 // 8 = 1: layer 1 gets more bits, layer 0 not
    assert tensors["output.weight"].tensor_type.name == "Q6_K"
    assert tensors["blk.0.attn_v.weight"].tensor_type.name == "Q4_K"
    assert tensors["blk.1.attn_v.weight"].tensor_type.name == "Q6_K"
    assert tensors["blk.0.ffn_down.weight"].tensor_type.name == "Q4_K"
    assert tensors["blk.1.ffn_down.weight"].tensor_type.name == "Q6_K"
    assert tensors["blk.0.attn_q.weight"].tensor_type.name == "Q4_K"
    assert int(r.fields["general.file_type"].contents()) == 15
    for t in r.tensors:
        if t.tensor_type.name == "F32":
            continue
        ours = bg.dequantize(t.data, t.tensor_type.name)
        theirs = np.asarray(gq.dequantize(t.data, t.tensor_type), np.float32)
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), t.name
    src = arrays["model.layers.1.mlp.down_proj.weight"]
    got = tensors["blk.1.ffn_down.weight"]
    assert np.array_equal(np.asarray(got.data).reshape(-1),
                          bg.quantize(src, "Q6_K").reshape(-1))


def test_tied_llama_has_no_output_head_and_its_embeddings_take_its_type(tmp_path):
    llama_folder(tmp_path / "m", tied=True)
    r = convert(tmp_path / "m", tmp_path / "m.gguf", "--scheme", "Q4_K_M")
    tensors = {t.name: t.tensor_type.name for t in r.tensors}
    assert "output.weight" not in tensors and tensors["token_embd.weight"] == "Q6_K"


def test_bert_names_and_the_pooler_left_out(tmp_path, capsys):
    rng = np.random.default_rng(0)
    d = 384
    arrays = {"embeddings.word_embeddings.weight": (100, d),
              "embeddings.position_embeddings.weight": (64, d),
              "embeddings.token_type_embeddings.weight": (2, d),
              "embeddings.LayerNorm.weight": (d,), "embeddings.LayerNorm.bias": (d,),
              "encoder.layer.0.attention.self.query.weight": (d, d),
              "encoder.layer.0.attention.self.query.bias": (d,),
              "encoder.layer.0.intermediate.dense.weight": (1536, d),
              "encoder.layer.0.output.dense.weight": (d, 1536),
              "pooler.dense.weight": (d, d)}
    arrays = {k: rng.standard_normal(s).astype(np.float32) for k, s in arrays.items()}
    root = tmp_path / "bert"
    root.mkdir()
    st.save_file(arrays, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({
        "architectures": ["BertModel"], "model_type": "bert", "hidden_size": d,
        "num_hidden_layers": 1, "num_attention_heads": 12, "intermediate_size": 1536,
        "layer_norm_eps": 1e-12, "max_position_embeddings": 64}))
    assert main(["quantize", str(root), "-o", str(tmp_path / "b.gguf"),
                 "--scheme", "Q4_K_M"]) == 0
    out = capsys.readouterr().out
    assert "left out 1 tensor llama.cpp's bert has no GGUF name for" in out
    assert "pooler.dense.weight" in out
    r = GGUFReader(tmp_path / "b.gguf")
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types == {"token_embd.weight": "Q8_0",  # tied to the output head; 384: Q8_0
                     "position_embd.weight": "F32", "token_types.weight": "F32",
                     "token_embd_norm.weight": "F32", "token_embd_norm.bias": "F32",
                     "blk.0.attn_q.weight": "Q5_0", "blk.0.attn_q.bias": "F32",
                     "blk.0.ffn_up.weight": "Q5_0", "blk.0.ffn_down.weight": "Q6_K"}
    assert r.fields["general.architecture"].contents() == "bert"
    assert r.fields["bert.attention.causal"].contents() is False


def test_an_unknown_architecture_keeps_its_names(tmp_path):
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    st.save_file({"enc.w": x, "enc.b": x[0]}, str(tmp_path / "m.safetensors"))
    r = convert(tmp_path / "m.safetensors", tmp_path / "m.gguf", "--scheme", "q8_0", "--pure")
    assert {t.name: t.tensor_type.name for t in r.tensors} == {"enc.b": "F32", "enc.w": "F32"}
    # "enc.w" does not end in "weight": llama-quantize would leave it, and so does blockquant
    st.save_file({"enc.weight": x}, str(tmp_path / "n.safetensors"))
    r = convert(tmp_path / "n.safetensors", tmp_path / "n.gguf", "--scheme", "q8_0", "--pure")
    assert r.tensors[0].tensor_type.name == "Q8_0"
    assert r.fields["general.architecture"].contents() == "unknown"


def test_inputs_that_are_not_safetensors_are_refused(tmp_path, capsys):
    np.savez(tmp_path / "x.npz", a=np.zeros((4, 32), np.float32))
    assert main(["quantize", str(tmp_path / "x.npz"), "-o", str(tmp_path / "x.gguf"),
                 "--scheme", "Q4_K_M"]) == 2
    assert "made from a GGUF file, a safetensors file or a model folder" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def test_qwen2_keeps_its_rows_in_order_and_its_biases_in_f32(tmp_path):
    rng = np.random.default_rng(2)
    q = (rng.standard_normal((256, 256)) * 0.02).astype(np.float32)
    arrays = {"model.embed_tokens.weight": rng.standard_normal((32, 256)).astype(np.float32),
              "model.layers.0.self_attn.q_proj.weight": q,
              "model.layers.0.self_attn.q_proj.bias": np.arange(256, dtype=np.float16)}
    root = tmp_path / "qwen"
    root.mkdir()
    st.save_file(arrays, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "hidden_size": 256, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 4, "rope_theta": 1e6}))
    r = convert(root, tmp_path / "q.gguf", "--scheme", "Q8_0")
    tensors = {t.name: t for t in r.tensors}
    assert r.fields["general.architecture"].contents() == "qwen2"
    assert r.fields["qwen2.rope.freq_base"].contents() == 1e6
    # NEOX rotary: no permutation, the rows as they were
    want = gq.quantize(q, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(-1),
                          want.reshape(-1))
    bias = tensors["blk.0.attn_q.bias"]
    assert bias.tensor_type.name == "F32"
    assert np.array_equal(np.asarray(bias.data), np.arange(256, dtype=np.float32))
