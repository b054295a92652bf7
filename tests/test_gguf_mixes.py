"""llama.cpp's named mixes on GGUF files: each tensor's type against tables worked out by hand
from llama.cpp's rules (llama-quant.cpp's llama_tensor_get_type, read as prose: which role gets
what in which layers), the fallback for rows that are not whole blocks, general.file_type, the
overrides and their order, and every quantized tensor read back through gguf-py bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from blockquant import gguf as bg
from blockquant.checkpoint.gguf_mixes import ModelFacts, choose_types, fallback, resolve_mix
from blockquant.cli import main

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import GGUFReader, GGUFWriter  # noqa: E402
from gguf import quants as gq  # noqa: E402

LAYERS = 8
ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def llama(path: Path, *, n_kv: int = 8, width: int = 256, ffn: int = 512, tied: bool = False,
          experts: int = 0, layers: int = LAYERS) -> Path:
    """A small llama-shaped GGUF file written by gguf-py: ``width`` is the hidden size (the
    rows of every weight but FFN down, whose rows are ``ffn``)."""
    rng = np.random.default_rng(3)
    w = GGUFWriter(path, "llama")
    w.add_block_count(layers)
    w.add_head_count(8)
    w.add_head_count_kv(n_kv)
    if experts:
        w.add_expert_count(experts)

    def add(name: str, shape: tuple[int, ...]) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    add("token_embd.weight", (64, width))
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (width,))
        for role in ROLES:
            if experts and role.startswith("ffn"):
                shape = (experts, width, ffn) if role == "ffn_down" else (experts, ffn, width)
                add(f"blk.{i}.{role}_exps.weight", shape)
                continue
            rows = {"attn_k": 8 * n_kv, "attn_v": 8 * n_kv, "ffn_gate": ffn, "ffn_up": ffn}
            add(f"blk.{i}.{role}.weight", (width, ffn) if role == "ffn_down" else
                (rows.get(role, width) if role != "attn_q" else width, width))
    add("output_norm.weight", (width,))
    if not tied:
        add("output.weight", (64, width))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def quantize(src: Path, dst: Path, *args: str) -> dict[str, str]:
    assert main(["quantize", str(src), "-o", str(dst), "-q", *args]) == 0
    return {t.name: t.tensor_type.name for t in GGUFReader(dst).tensors}


def file_type(path: Path) -> int:
    return int(GGUFReader(path).fields["general.file_type"].contents())


def expect(default: str, per_layer: dict[str, dict[int, str]], **named: str) -> dict[str, str]:
    """The whole file's types: ``default`` for every weight, ``per_layer[role][i]`` where given,
    the named tensors as given, norms F32."""
    out = {"token_embd.weight": named.get("token_embd", default),
           "output.weight": named.get("output", "Q6_K"), "output_norm.weight": "F32"}
    for i in range(LAYERS):
        out[f"blk.{i}.attn_norm.weight"] = "F32"
        for role in ROLES:
            out[f"blk.{i}.{role}.weight"] = per_layer.get(role, {}).get(i, default)
    return out


# use_more_bits over 8 layers, by hand: the first eighth (layer 0), the last eighth (layer 7),
# and every third layer from the first eighth on (layers 3 and 6).
MORE = {0, 3, 6, 7}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return llama(tmp_path_factory.mktemp("mix") / "llama.gguf")


@pytest.fixture(scope="module")
def gqa(tmp_path_factory) -> Path:  # 8 heads over 2 KV heads: grouped-query attention of 4
    return llama(tmp_path_factory.mktemp("mix") / "gqa.gguf", n_kv=2)


def test_q4_k_m_gives_q6_k_to_v_and_down_in_the_layers_that_get_more_bits(model, tmp_path):
    out = tmp_path / "q4km.gguf"
    got = quantize(model, out, "--scheme", "Q4_K_M")
    six = {i: "Q6_K" for i in MORE}
    assert got == expect("Q4_K", {"attn_v": six, "ffn_down": six})
    assert file_type(out) == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    # q4_k is llama-quantize's alias of Q4_K_M, in any case
    assert quantize(model, tmp_path / "alias.gguf", "--scheme", "q4_k") == got


@pytest.mark.parametrize("name, ftype, default, per_layer, named", [
    # Q3_K_M: attention V Q5_K in its first two, Q4_K after; FFN down Q4_K (none in the
    # first 16th of 8 layers); attention output Q4_K.
    ("Q3_K_M", 12, "Q3_K", {"attn_v": {0: "Q5_K", 1: "Q5_K", **{i: "Q4_K" for i in range(2, 8)}},
                            "ffn_down": dict.fromkeys(range(8), "Q4_K"),
                            "attn_output": dict.fromkeys(range(8), "Q4_K")}, {}),
    # Q3_K_L: V, FFN down and attention output all Q5_K.
    ("Q3_K_L", 13, "Q3_K", {r: dict.fromkeys(range(8), "Q5_K")
                            for r in ("attn_v", "ffn_down", "attn_output")}, {}),
    ("Q3_K_S", 11, "Q3_K", {}, {}),
    # Q4_K_S: V Q5_K in the first four, FFN down Q5_K in the first eighth.
    ("Q4_K_S", 14, "Q4_K", {"attn_v": dict.fromkeys(range(4), "Q5_K"),
                            "ffn_down": {0: "Q5_K"}}, {}),
    ("Q5_K_S", 16, "Q5_K", {}, {}),
    ("Q5_K_M", 17, "Q5_K", {"attn_v": dict.fromkeys(MORE, "Q6_K"),
                            "ffn_down": dict.fromkeys(MORE, "Q6_K")}, {}),
    ("Q6_K", 18, "Q6_K", {}, {}),
    ("Q8_0", 7, "Q8_0", {}, {"output": "Q8_0"}),  # Q8_0's head stays Q8_0
    ("Q4_0", 2, "Q4_0", {}, {}),
    ("Q5_1", 9, "Q5_1", {}, {}),
    # Q2_K without GQA: V Q3_K; FFN down and attention output Q3_K.
    ("Q2_K", 10, "Q2_K", {r: dict.fromkeys(range(8), "Q3_K")
                          for r in ("attn_v", "ffn_down", "attn_output")}, {}),
    # IQ4_NL without GQA and without an importance matrix: FFN down Q5_K in the first eighth.
    ("IQ4_NL", 25, "IQ4_NL", {"ffn_down": {0: "Q5_K"}}, {}),
    # The ternary mixes: token embeddings Q4_K.
    ("TQ2_0", 37, "TQ2_0", {}, {"token_embd": "Q4_K"}),
    ("F16", 1, "F16", {}, {"output": "F16"}),  # a float file type: no mix
])
def test_each_mix_against_its_table(model, tmp_path, name, ftype, default, per_layer, named):
    out = tmp_path / f"{name}.gguf"
    assert quantize(model, out, "--scheme", name.lower()) == expect(default, per_layer, **named)
    assert file_type(out) == ftype


def test_grouped_query_attention_gives_v_more_bits(gqa, tmp_path):
    got = quantize(gqa, tmp_path / "q2k.gguf", "--scheme", "Q2_K")
    assert all(got[f"blk.{i}.attn_v.weight"] == "Q4_K" for i in range(LAYERS))
    got = quantize(gqa, tmp_path / "iq4xs.gguf", "--scheme", "IQ4_XS")
    assert got == expect("IQ4_XS", {"attn_v": dict.fromkeys(range(8), "Q5_K"),
                                    "ffn_down": {0: "Q5_K"}})


def test_tied_embeddings_take_the_output_heads_type(tmp_path):
    src = llama(tmp_path / "tied.gguf", tied=True)
    got = quantize(src, tmp_path / "q.gguf", "--scheme", "Q4_K_M")
    assert got["token_embd.weight"] == "Q6_K" and "output.weight" not in got
    # rows of 384 (MiniLM's width): not whole 256-value super-blocks, so the head is Q8_0
    src = llama(tmp_path / "tied384.gguf", tied=True, width=384, ffn=768)
    got = quantize(src, tmp_path / "q384.gguf", "--scheme", "Q4_K_M")
    assert got["token_embd.weight"] == "Q8_0"


def test_rows_that_are_not_whole_super_blocks_fall_back(tmp_path):
    # Width 384: every weight with rows of 384 falls back; FFN down (rows of 768 = 3 x 256)
    # keeps the K-quants.
    src = llama(tmp_path / "w384.gguf", width=384, ffn=768)
    got = quantize(src, tmp_path / "q.gguf", "--scheme", "Q4_K_M")
    assert got["blk.1.attn_q.weight"] == "Q5_0"  # Q4_K -> Q5_0
    assert got["blk.0.attn_v.weight"] == "Q8_0"  # Q6_K (more bits) -> Q8_0
    assert got["blk.1.ffn_down.weight"] == "Q4_K" and got["blk.0.ffn_down.weight"] == "Q6_K"
    got = quantize(src, tmp_path / "q5.gguf", "--scheme", "Q5_K_S")
    assert got["blk.1.attn_q.weight"] == "Q5_1"  # Q5_K -> Q5_1
    got = quantize(src, tmp_path / "q3.gguf", "--scheme", "Q3_K_S")
    assert got["blk.1.attn_q.weight"] == "Q4_0"  # Q3_K -> Q4_0
    got = quantize(src, tmp_path / "iq.gguf", "--scheme", "IQ4_XS")
    assert got["blk.1.attn_q.weight"] == "IQ4_NL"


@pytest.mark.parametrize("qtype, row, want", [
    ("Q4_K", 384, "Q5_0"), ("Q5_K", 384, "Q5_1"), ("Q6_K", 384, "Q8_0"), ("Q2_K", 96, "Q4_0"),
    ("Q3_K", 160, "Q4_0"), ("TQ1_0", 64, "Q4_0"), ("IQ4_XS", 32, "IQ4_NL"),
    ("Q4_K", 48, "F16"), ("Q6_K", 40, "F16"),  # the fallback's 32 do not fit either
    ("Q4_K", 512, "Q4_K"), ("Q8_0", 64, "Q8_0"),
    ("Q8_0", 48, None), ("Q4_0", 40, None), ("NVFP4", 96, None),  # no fallback: refused there
])
def test_fallback_table(qtype, row, want):
    assert fallback(qtype, row) == want


def test_a_type_without_a_fallback_keeps_the_tensor(tmp_path, capsys):
    src = llama(tmp_path / "w48.gguf", width=48, ffn=96)  # 48: not whole 32-value blocks
    got = quantize(src, tmp_path / "q8.gguf", "--scheme", "Q8_0")
    assert got["blk.0.attn_q.weight"] == "F32" and got["blk.0.ffn_down.weight"] == "Q8_0"
    assert main(["quantize", str(src), "-o", str(tmp_path / "s.gguf"), "--scheme", "Q8_0",
                 "--strict"]) == 2
    assert "no fallback type (--strict)" in capsys.readouterr().err


def test_overrides_win_in_llama_cpps_order(model, tmp_path):
    got = quantize(model, tmp_path / "o.gguf", "--scheme", "Q4_K_M",
                   "--token-embedding-type", "q8_0", "--output-tensor-type", "Q5_K",
                   "--rule", r"blk\.2\.=keep", "--rule", "attn_q=q5_0",
                   "--tensor-type", "ATTN_Q=q8_0",  # after --rule: attn_q is taken already
                   "--tensor-type", "ffn_gate=f16")
    assert got["token_embd.weight"] == "Q8_0" and got["output.weight"] == "Q5_K"
    assert got["blk.2.attn_q.weight"] == "F32" and got["blk.2.attn_v.weight"] == "F32"
    assert got["blk.0.attn_q.weight"] == "Q5_0" and got["blk.0.ffn_gate.weight"] == "F16"
    # A rule, keep included, takes its tensors out of the mix's count (as --tensor-type does
    # in llama.cpp): V of layers 0, 1, 3, ... are counted 0, 1, 2, ..., so the Q6_K of counts
    # 0, 3, 6 fall on layers 0, 4, 7.
    assert [got[f"blk.{i}.attn_v.weight"] for i in (0, 1, 3, 4, 6, 7)] == [
        "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q6_K"]
    # --exclude leaves the tensor alone after the mix has counted it
    got = quantize(model, tmp_path / "x.gguf", "--scheme", "Q4_K_M", "--exclude", r"blk\.2\.")
    assert got["blk.2.attn_v.weight"] == "F32" and got["blk.3.attn_v.weight"] == "Q6_K"


def test_a_manual_type_skips_the_mixes_counter(model, tmp_path):
    # llama.cpp counts the attention-V tensors its mix rules see: one given a type by hand is
    # not counted, so layer 1's V is the first counted (more bits), then layers 4 and 7
    # (counted as 3 and 6 of 8).
    got = quantize(model, tmp_path / "m.gguf", "--scheme", "Q4_K_M",
                   "--tensor-type", r"blk\.0\.attn_v=q8_0")
    v = [got[f"blk.{i}.attn_v.weight"] for i in range(LAYERS)]
    assert v == ["Q8_0", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K"]


def test_a_manual_type_still_falls_back_but_the_output_type_does_not(tmp_path):
    src = llama(tmp_path / "w384.gguf", width=384, ffn=768)
    got = quantize(src, tmp_path / "m.gguf", "--scheme", "Q4_K_M", "--tensor-type",
                   "attn_q=q6_k", "--output-tensor-type", "q4_k")
    assert got["blk.0.attn_q.weight"] == "Q8_0"
    assert got["output.weight"] == "F32"  # Q4_K cannot take rows of 384: kept


def test_pure_gives_every_tensor_the_default_type(model, tmp_path):
    out = tmp_path / "p.gguf"
    got = quantize(model, out, "--scheme", "Q4_K_M", "--pure")
    assert got == expect("Q4_K", {}, output="Q4_K")
    assert file_type(out) == 15


def test_experts_and_the_70b_rule_from_the_metadata():
    names = [("token_embd.weight", (64, 256)), ("output.weight", (64, 256))]
    for i in range(80):
        names += [(f"blk.{i}.attn_v.weight", (32, 256)), (f"blk.{i}.ffn_down.weight", (256, 512))]
    q = {n for n, _ in names}
    big = choose_types(names, q, resolve_mix("Q4_K_M"), ModelFacts("llama", 80, 64, 8))
    # 80 layers of GQA llama: V's Q4_K becomes Q5_K (layer 11 is past the first eighth and
    # not a third layer; layer 0 gets more bits, Q6_K)
    assert big["blk.11.attn_v.weight"].type == "Q5_K"
    assert big["blk.0.attn_v.weight"].type == "Q6_K"
    same_heads = choose_types(names, q, resolve_mix("Q4_K_M"), ModelFacts("llama", 80, 64, 64))
    assert same_heads["blk.11.attn_v.weight"].type == "Q4_K"
    moe = choose_types(names, q, resolve_mix("Q4_K_M"), ModelFacts("llama", 80, 64, 8, 8))
    assert moe["blk.1.attn_v.weight"].type == "Q8_0"


def test_moe_ffn_down_takes_its_layer_from_the_name(tmp_path):
    src = llama(tmp_path / "moe.gguf", experts=4, layers=8)
    got = quantize(src, tmp_path / "q.gguf", "--scheme", "Q4_K_M")
    assert [got[f"blk.{i}.ffn_down_exps.weight"] for i in range(8)] == [
        "Q6_K" if i in MORE else "Q4_K" for i in range(8)]
    got = quantize(src, tmp_path / "m.gguf", "--scheme", "MXFP4_MOE")
    assert got["blk.0.ffn_up_exps.weight"] == "MXFP4" and got["blk.0.attn_q.weight"] == "Q8_0"
    assert got["output.weight"] == "Q8_0"


def test_every_tensor_reads_back_through_gguf_py(model, tmp_path):
    out = tmp_path / "q.gguf"
    quantize(model, out, "--scheme", "Q3_K_M")
    src = {t.name: t for t in GGUFReader(model).tensors}
    for t in GGUFReader(out).tensors:
        x = np.asarray(src[t.name].data, np.float32)
        if t.tensor_type == GT.F32:
            assert np.array_equal(t.data, x)
            continue
        assert np.array_equal(np.asarray(t.data).reshape(-1).view(np.uint8),
                              bg.quantize(x, t.tensor_type.name).reshape(-1).view(np.uint8))
        theirs = np.asarray(gq.dequantize(t.data, t.tensor_type), np.float32)
        assert np.array_equal(theirs.view(np.uint32),
                              bg.dequantize(t.data, t.tensor_type.name).view(np.uint32))


def test_mixes_blockquant_cannot_make_are_refused_with_the_reason(model, tmp_path, capsys):
    for name, says in (("IQ2_XXS", "IQ1/IQ2/IQ3"), ("Q2_K_S", "importance matrix"),
                       ("Q9_K", "llama.cpp's file types")):
        assert main(["quantize", str(model), "-o", str(tmp_path / "x.gguf"), "--scheme",
                     name]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err
    for bad in (["--tensor-type", "attn_q"], ["--tensor-type", "attn_q=q7_0"],
                ["--output-tensor-type", "int8"], ["--rule", "attn_q=int8"]):
        assert main(["quantize", str(model), "-o", str(tmp_path / "x.gguf"), "--scheme",
                     "Q4_K_M", *bad]) == 2
        assert capsys.readouterr().err.startswith("blockquant: error: ")
    assert not (tmp_path / "x.gguf").exists()


def test_dry_run_shows_each_type_and_why(model, tmp_path, capsys):
    assert main(["quantize", str(model), "-o", str(tmp_path / "x.gguf"), "--scheme", "Q4_K_M",
                 "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "Q4_K_M, general.file_type 15" in text
    assert "attention V 0 of 8" in text and "FFN down, layer 7 of 8" in text
    assert "58 of 67 tensors quantized (Q4_K: 49, Q6_K: 9)" in text
    assert not (tmp_path / "x.gguf").exists()


def test_an_expert_tensor_past_the_layer_count_is_one_line(tmp_path, capsys):
    for name, says in (("blk.7.ffn_down_exps.weight", "layer 7 is not below the model's 2"),
                       ("ffn_down_exps.weight", "has no layer number")):
        src = tmp_path / "bad-moe.gguf"
        w = GGUFWriter(src, "llama")
        w.add_block_count(2)
        w.add_expert_count(4)
        w.add_tensor(name, np.zeros((4, 32, 256), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        assert main(["quantize", str(src), "-o", str(tmp_path / "q.gguf"), "--scheme",
                     "Q4_K_M"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{src}: {name}: " in err and says in err
        assert not (tmp_path / "q.gguf").exists()
        src.unlink()
