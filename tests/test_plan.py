"""Size-target plans (issue 50): ``blockquant plan MODEL --target-bpw B`` and ``quantize
--target-bpw`` / ``--rules-file``: the allocation against brute force, the measurements against
direct quantize-dequantize, the constraints (fused sets, floors, keep), the rules file as
``quantize`` reads it, every output kind (blockquant schemes, ggml types, MLX modes), and the
bad inputs."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest
from test_compressed_tensors import llama_tensors, one_error_line, run, write_model

import blockquant as bq
from blockquant.checkpoint import CheckpointError
from blockquant.checkpoint.plan_alloc import _hull, allocate, read_rules_file
from blockquant.checkpoint.plan_measure import TensorMeasure
from blockquant.presets import resolve


def tm(name, n, opts, signal=1.0):
    return TensorMeasure(name, (1, n), n, 2 * n, signal, opts)


# -- the allocation ---------------------------------------------------------------------------------
def test_hull_keeps_the_convex_pareto_points_by_hand():
    # (bits, error): b is dominated by c (more bits, more error); d lies above the segment a-e
    opts = {"a": (10, 100.0), "b": (30, 90.0), "c": (20, 60.0), "d": (40, 45.0),
            "e": (50, 10.0)}
    # a (10,100) -> c (20,60): 4/bit; c -> d (40,45): 0.75/bit; d -> e (50,10): 3.5/bit:
    # d is above the line c-e (c -> e saves 50 in 30 bits, 1.67/bit), so d goes.
    assert [n for n, _, _ in _hull(opts)] == ["a", "c", "e"]


@pytest.mark.parametrize("seed", range(40))
def test_allocation_is_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    ms = []
    for i in range(5):
        n = int(rng.integers(1, 6)) * 64
        ms.append(tm(f"t{i}", n, {c: (n * b // 8, float(n * rng.uniform(0.3, 3) * 4.0 ** -b))
                                  for c, b in (("a", 2), ("b", 4), ("c", 5), ("d", 8))}))
    numel = sum(m.numel for m in ms)
    target = float(rng.uniform(2.0, 8.0))
    r = allocate(ms, target)
    best = min(sum(m.options[c][1] for m, c in zip(ms, combo))
               for combo in itertools.product("abcd", repeat=5)
               if sum(8 * m.options[c][0] for m, c in zip(ms, combo)) <= target * numel)
    assert r.bpw <= target
    assert sum(r.error_of(n) for n in r.choice) == pytest.approx(best, rel=1e-12)


def test_fused_sets_share_a_candidate_and_floors_and_keep_hold():
    opts = {"lo": (16, 10.0), "hi": (64, 1.0)}
    ms = [tm("m.layers.0.self_attn.q_proj.weight", 64, dict(opts)),
          tm("m.layers.0.self_attn.k_proj.weight", 64, {"lo": (16, 0.1), "hi": (64, 0.0)}),
          tm("m.layers.0.self_attn.v_proj.weight", 64, dict(opts)),
          tm("m.layers.0.mlp.down_proj.weight", 64, dict(opts)),
          tm("lm_head.weight", 64, dict(opts)), tm("x.weight", 64, dict(opts))]
    floors = ((re.compile(r"lm_head"), 6.0),)
    keep = (re.compile(r"^x\."),)
    r = allocate(ms, 7.0, floors, keep)  # 16 bits for x, 8 for lm_head, 2 to 8 the others
    qkv = {r.choice[m.name] for m in ms[:3]}
    assert len(qkv) == 1
    assert r.choice["lm_head.weight"] == "hi" and r.choice["x.weight"] is None
    assert "--keep" in r.why_kept["x.weight"]
    assert r.bits_of("x.weight") == 8 * 128  # kept: counted at its float size
    assert r.bpw <= 7.0


def test_a_target_below_the_smallest_plan_says_how_small(capsys):
    ms = [tm("a.weight", 64, {"x": (32, 1.0)})]
    with pytest.raises(CheckpointError, match="smallest plan .* allow .4.000"):
        allocate(ms, 3.0)


# -- plans of models --------------------------------------------------------------------------------
@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(21)
    t = llama_tensors(rng, hidden=128, inter=256, layers=2, kv=64, vocab=64)
    t["model.layers.1.mlp.down_proj.weight"] *= 8  # tensors that differ in scale
    return tmp_path / "m", write_model(tmp_path / "m", t, shards=2)


def plan_json(*args) -> dict:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run("plan", *args, "--json") == 0
    return json.loads(buf.getvalue())


def test_measurements_are_the_quantize_dequantize_errors(model):
    src, exact = model
    p = plan_json(src, "--target-bpw", "5", "--candidates", "int4_block32,mxfp4,int8_block32")
    for t in p["tensors"]:
        x = exact[t["name"]]
        for cand, m in t["options"].items():
            y = bq.quantize(x, cand).dequantize()
            d = x.astype(np.float64) - y
            assert m["error"] == pytest.approx(float(np.sum(d * d)), rel=1e-9)
            assert m["bits"] == 8 * resolve(cand).layout(x.shape).nbytes
        assert t["signal"] == pytest.approx(float(np.sum(x.astype(np.float64) ** 2)), rel=1e-9)


def test_the_plan_beats_each_candidate_alone_at_its_size(model):
    src, _ = model
    cands = "int4_block32,mxfp4,int8_block32"
    for target in (4.5, 5.5, 7.0):
        p = plan_json(src, "--target-bpw", str(target), "--candidates", cands, "--floor",
                      "x=0")
        assert p["bpw"] <= target
        for name, u in p["uniform"].items():
            if u["bpw"] <= target:
                assert p["sqnr_db"] >= u["sqnr_db"] - 1e-9, (target, name)
    # at 4.5 the plan mixes: more than one scheme, more signal than int4_block32 alone
    p = plan_json(src, "--target-bpw", "4.5", "--candidates", cands, "--floor", "x=0")
    assert len({t["scheme"] for t in p["tensors"]}) > 1
    assert p["sqnr_db"] > p["uniform"]["int4_block32"]["sqnr_db"]


def test_rules_file_is_what_quantize_takes(model, tmp_path, capsys):
    src, _ = model
    rules = tmp_path / "plan.rules"
    assert run("plan", src, "--target-bpw", "5", "--candidates",
               "int4_block32,mxfp4,int8_block32", "-o", rules) == 0
    lines = read_rules_file(rules)
    assert all(re.fullmatch(r"\^.+\$=(int4_block32|mxfp4|int8_block32|keep)", ln) for ln in lines)
    a, b = tmp_path / "a", tmp_path / "b"
    assert run("quantize", src, "-o", a, "--scheme", "int4_block32", "--rules-file", rules,
               "-q") == 0
    assert run("quantize", src, "-o", b, "--target-bpw", "5", "--candidates",
               "int4_block32,mxfp4,int8_block32", "-q") == 0
    for f in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    planned = dict(ln.split("=") for ln in lines)
    got = bq.load(a)
    for pattern, cand in planned.items():
        name = pattern[1:-1].replace("\\", "")
        assert isinstance(got[name], bq.QTensor)
        assert got[name].scheme == resolve(cand), name
    # an existing rules file needs -f
    assert run("plan", src, "--target-bpw", "5", "-o", rules) == 2
    one_error_line(capsys, "exists")


def test_mlx_and_gguf_candidates(model, tmp_path):
    src, exact = model
    p = plan_json(src, "--target-bpw", "5", "--format", "mlx", "--candidates",
                  "affine3:g32,affine4,affine8")
    assert {t["scheme"] for t in p["tensors"]} <= {"affine3:g32", "affine4", "affine8"}
    out = tmp_path / "mlx"
    assert run("quantize", src, "-o", out, "--format", "mlx", "--target-bpw", "5",
               "--candidates", "affine3:g32,affine4,affine8", "-q") == 0
    q = json.loads((out / "config.json").read_text())["quantization"]
    for t in p["tensors"]:
        module = t["name"][: -len(".weight")]
        mode = {"group_size": q[module]["group_size"], "bits": q[module]["bits"]} if module in q \
            else {"group_size": q["group_size"], "bits": q["bits"]}
        want = {"affine3:g32": (32, 3), "affine4": (64, 4), "affine8": (64, 8)}[t["scheme"]]
        assert (mode["group_size"], mode["bits"]) == want, t["name"]
    # ggml types: the error is ggml's dequantized values' (a model of no architecture GGUF
    # names, so its tensors keep their names)
    src = tmp_path / "custom"
    exact = write_model(src, {k: v for k, v in exact.items()}, config={"model_type": "custom"})
    p = plan_json(src, "--target-bpw", "5", "--format", "gguf", "--candidates", "q4_0,q8_0")
    t = next(t for t in p["tensors"] if t["name"].endswith("up_proj.weight"))
    x = exact[t["name"]]
    y = bq.gguf.dequantize(bq.gguf.quantize(x, "q4_0"), "q4_0")
    assert t["options"]["q4_0"]["error"] == pytest.approx(
        float(np.sum((x.astype(np.float64) - y) ** 2)), rel=1e-9)


def test_jobs_give_the_same_plan(model):
    src, _ = model
    a = plan_json(src, "--target-bpw", "5", "--jobs", "1")
    b = plan_json(src, "--target-bpw", "5", "--jobs", "2")
    assert a["tensors"] == b["tensors"]


def test_bad_inputs_are_one_line(model, tmp_path, capsys):
    src, _ = model
    cases = [
        (["--target-bpw", "5", "--candidates", "int4_block32,nope"], ["--candidates", "nope"]),
        (["--target-bpw", "5", "--candidates", "int4_block32,int4_block32"], ["different"]),
        (["--target-bpw", "5", "--format", "gguf", "--candidates", "int4_block32"],
         ["--candidates"]),
        (["--target-bpw", "5", "--floor", "lm_head"], ["REGEX=BITS"]),
        (["--target-bpw", "5", "--keep", "("], ["bad regular expression"]),
        (["--target-bpw", "1", "--candidates", "int4_block32"], ["smallest plan"]),
        (["--target-bpw", "0"], ["bits a weight"]),
        (["--target-bpw", "5", "--format", "onnx"], ["invalid choice"]),
    ]
    for extra, words in cases:
        assert run("plan", src, *extra) == 2, extra
        one_error_line(capsys, *words)
    bad = tmp_path / "bad.rules"
    bad.write_text("# a comment\nnot a rule\n")
    assert run("quantize", src, "-o", tmp_path / "o", "--scheme", "int8", "--rules-file",
               bad) == 2
    one_error_line(capsys, "line 2")
    assert run("quantize", src, "-o", tmp_path / "o", "--scheme", "int8", "--rules-file",
               tmp_path / "none") == 2
    one_error_line(capsys, "none", "cannot be read as a rules file")
    good = tmp_path / "good.rules"
    good.write_text("q_proj=int8\n")
    assert run("quantize", src, "-o", tmp_path / "o", "--rules-file", good) == 2
    one_error_line(capsys, "--scheme", "is required", "--target-bpw")
    assert not (tmp_path / "o").exists()


def test_an_importance_matrix_weighs_the_errors_and_the_choice(model, tmp_path):
    from test_imatrix import legacy

    src, exact = model
    rng = np.random.default_rng(3)
    entries, importance = [], {}
    for name, x in exact.items():
        if x.ndim == 2 and name.endswith("proj.weight"):
            w = np.exp(rng.normal(0, 1.5, x.shape[1])).astype(np.float32)
            importance[name] = w
            entries.append((name.encode(), 1, w.tolist()))
    path = tmp_path / "imatrix.dat"
    path.write_bytes(legacy(entries))
    cands = "int4_block32,mxfp4,int8_block32"
    p = plan_json(src, "--target-bpw", "5", "--candidates", cands, "--imatrix", path,
                  "--floor", "x=0")
    plain = plan_json(src, "--target-bpw", "5", "--candidates", cands, "--floor", "x=0")
    for t in p["tensors"]:
        x = exact[t["name"]].astype(np.float64)
        w = importance.get(t["name"])
        col = np.ones(x.shape[1]) if w is None else w.astype(np.float64)
        assert t["signal"] == pytest.approx(float(((x * x).sum(axis=0)) @ col), rel=1e-9)
        y = bq.quantize(exact[t["name"]], "mxfp4").dequantize()
        d = x - y
        assert t["options"]["mxfp4"]["error"] == pytest.approx(float((d * d).sum(axis=0) @ col),
                                                               rel=1e-9)
    # weighted errors change what is chosen, and the weighted plan is the better one by them
    assert p["tensors"] != plain["tensors"]
    def weighted_total(plan):
        by = {t["name"]: t for t in p["tensors"]}
        return sum(by[t["name"]]["options"][t["scheme"]]["error"] for t in plan["tensors"])
    assert weighted_total(p) <= weighted_total(plain)


def test_a_gguf_plan_measures_ggml_types_as_quantize_imatrix_writes_them(tmp_path):
    from test_imatrix import legacy

    from blockquant.checkpoint.imatrix import ggml_floor

    rng = np.random.default_rng(9)
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128,
           "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 64, "rope_theta": 10000.0, "tie_word_embeddings": False}
    src = tmp_path / "m"
    exact = write_model(src, llama_tensors(rng, hidden=128, inter=256, layers=1, kv=64,
                                           vocab=64), config=cfg)
    name = "model.layers.0.mlp.down_proj.weight"  # rows of 256: the K-quants fit
    x = exact[name]
    w = np.exp(np.random.default_rng(4).normal(0, 1.5, x.shape[1])).astype(np.float32)
    path = tmp_path / "imatrix.dat"
    path.write_bytes(legacy([(name.encode(), 1, w.tolist())]))
    p = plan_json(src, "--format", "gguf", "--target-bpw", "9", "--candidates", "q4_k,q6_k,q8_0",
                  "--imatrix", path, "--floor", "x=0")
    row = next(t for t in p["tensors"] if t["name"] == name)
    for qtype in ("Q4_K", "Q6_K"):
        y = bq.gguf.dequantize(bq.gguf.quantize(x, qtype, weights=ggml_floor(w)), qtype)
        d = x.astype(np.float64) - y
        assert row["options"][qtype.lower()]["error"] == pytest.approx(
            float((d * d).sum(axis=0) @ w.astype(np.float64)), rel=1e-9)


def test_a_plan_for_gguf_output_from_safetensors_names_the_gguf_tensors(tmp_path):
    from gguf import GGUFReader

    rng = np.random.default_rng(8)
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128,
           "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 64, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}
    src = tmp_path / "m"
    write_model(src, llama_tensors(rng, hidden=128, inter=256, layers=1, kv=64, vocab=64),
                config=cfg)
    out = tmp_path / "m.gguf"
    rules = tmp_path / "plan.rules"
    assert run("plan", src, "--target-bpw", "6", "--format", "gguf", "--candidates",
               "q4_0,q5_0,q8_0", "-o", rules) == 0
    planned = dict(ln.split("=") for ln in read_rules_file(rules))
    assert all(p.startswith(("^blk\\.0\\.", "^output", "^token_embd")) for p in planned)
    assert run("quantize", src, "-o", out, "--target-bpw", "6", "--candidates",
               "q4_0,q5_0,q8_0", "-q") == 0
    types = {t.name: t.tensor_type.name for t in GGUFReader(str(out)).tensors}
    for pattern, cand in planned.items():
        assert types[pattern[1:-1].replace("\\", "")] == cand.upper(), pattern
    assert len(set(planned.values())) > 1
