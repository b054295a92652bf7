"""MLX folders (issue 49), without mlx: MLX's words packed and unpacked by hand, MLX's own rule
on hand-worked groups, what blockquant writes (names, dtypes, shapes, config, per-layer
entries) and what it reads back (MLX's arithmetic, redone here with ml_dtypes from the raw
bytes), the codes against ``blockquant.reference``, bad inputs, and dequantizing, inspecting
and reporting such folders. mlx and mlx-lm judge the same folders in
tests/consumers/test_mlx_consumers.py (the CI stage with mlx)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_compressed_tensors import llama_tensors, one_error_line, read_raw, run, write_model

import blockquant as bq
from blockquant import reference as ref
from blockquant.checkpoint.mlx_codec import mlx_quantize, pack, unpack
from blockquant.checkpoint.mlx_schemes import resolve_mlx, scheme_for, searched_rule

MODES = ["affine2", "affine3", "affine4", "affine5", "affine6", "affine8", "affine4:g32",
         "affine3:g128", "affine6:g32", "mxfp4", "mxfp8", "nvfp4"]
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
LAYERS = ["model.embed_tokens", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
          "model.layers.0.mlp.down_proj", "lm_head"]


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(11)
    src = tmp_path / "m"
    return src, write_model(src, llama_tensors(rng, hidden=128, inter=256, layers=1, kv=64,
                                               vocab=64))


# -- words ----------------------------------------------------------------------------------------
def test_words_hold_the_codes_as_one_little_endian_bit_stream():
    q = np.arange(1, 9, dtype=np.uint8).reshape(1, 8)
    assert pack(q, 4).tolist() == [[0x87654321]]
    # 3 bits: 8 codes in 24 bits, the first lowest; 32 codes fill three words.
    q3 = np.array([[7, 0, 1, 2, 3, 4, 5, 6] * 4], dtype=np.uint8)
    v = sum(int(c) << (3 * k) for k, c in enumerate(q3[0]))
    want = [(v >> (32 * w)) & 0xFFFFFFFF for w in range(3)]
    assert pack(q3, 3).tolist() == [want]
    # 5 and 6 bits straddle words the same way.
    for bits in (5, 6):
        q = (np.arange(32, dtype=np.uint8) * 7 % (1 << bits)).reshape(1, 32)
        v = sum(int(c) << (bits * k) for k, c in enumerate(q[0]))
        assert pack(q, bits).tolist() == [[(v >> (32 * w)) & 0xFFFFFFFF for w in range(bits)]]
    q8 = np.array([[1, 2, 3, 4]], dtype=np.uint8)
    assert pack(q8, 8).tolist() == [[0x04030201]]


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([2, 3, 4, 5, 6, 8]), rows=st.integers(1, 4), n=st.integers(1, 4),
       seed=st.integers(0, 2**32 - 1))
def test_unpack_inverts_pack(bits, rows, n, seed):
    q = np.random.default_rng(seed).integers(0, 1 << bits, (rows, 32 * n), dtype=np.uint8)
    words = pack(q, bits)
    assert words.dtype == np.dtype("<u4") and words.shape == (rows, n * bits)
    assert np.array_equal(unpack(words, bits, 32 * n), q)


# -- MLX's rule, by hand --------------------------------------------------------------------------
def test_mlx_affine_rule_puts_the_larger_end_on_a_code():
    # min dominates: s = (0.5 + 1) / 15 = 0.1, edge = -1, q0 = round(-1 / 0.1) = -10, s = 0.1,
    # b = -1: q = round((x + 1) / 0.1).
    x = np.linspace(-1, 0.5, 32, dtype=np.float32).reshape(1, 32)
    q, s, b = mlx_quantize(x, "affine", 4, 32, "F32")
    assert b[0, 0] == np.float32(-1.0) and s[0, 0] == np.float32(-1.0) / np.float32(-10)
    assert q[0, 0] == 0 and q[0, -1] == 15
    # max dominates: the scale is negative, b = max, the first code is max's.
    x = np.linspace(-0.5, 1, 32, dtype=np.float32).reshape(1, 32)
    q, s, b = mlx_quantize(x, "affine", 4, 32, "F32")
    assert s[0, 0] < 0 and b[0, 0] == np.float32(1.0)
    assert q[0, -1] == 0 and q[0, 0] == 15
    # an all-zero group: s = 1e-7 (its floor) negated, b = 0, codes 0
    q, s, b = mlx_quantize(np.zeros((1, 32), np.float32), "affine", 4, 32, "BF16")
    assert q.max() == 0 and b[0, 0] == 0


def test_mlx_fp_rule_exponent_rounds_up_and_codes_tie_to_the_smaller_magnitude():
    # amax 3 over 6 = 0.5 = 2^-1 exactly: e = -1; amax 3.1: log2(3.1 / 6) > -1, e = 0.
    x = np.zeros((1, 64), np.float32)
    x[0, :32] = [3.0, 0.375, 0.625, -0.05] + [0.0] * 28
    x[0, 32] = 3.1
    q, s, _ = mlx_quantize(x, "mxfp4", 4, 32, "F32")
    assert s.tolist() == [[126, 127]]
    # 3.0 / 0.5 = 6 (code 7); 0.75 ties 0.5 and 1.0: 0.5 (code 1); 1.25 ties 1.0 and 1.5: 1.0
    # (code 2); -0.1 is nearest +0 and -0 alike: +0 (code 0).
    assert q[0, :4].tolist() == [7, 1, 2, 0]
    # nvfp4: the scale is amax / 6 rounded to E4M3 (3 / 6 = 0.5: 0x30), one level
    q, s, _ = mlx_quantize(x[:, :16], "nvfp4", 4, 16, "F32")
    assert s.tolist() == [[0x30]] and q[0, 0] == 7
    # a scale that rounds to E4M3's 0 (amax / 6 below 2^-10): x / 0 is infinite, every table
    # entry is as far, code 0
    tiny = np.full((1, 16), 1e-4, np.float32)
    q, s, _ = mlx_quantize(tiny, "nvfp4", 4, 16, "F32")
    assert s.tolist() == [[0]] and q.max() == 0
    # the exponent is the exact ceiling of log2: one ulp above 2^-12 is 2^-11 (byte 116)
    amax = np.nextafter(np.float32(6 * 2.0**-12), np.float32(1))
    assert amax / np.float32(6) > np.float32(2.0**-12)
    q, s, _ = mlx_quantize(np.full((1, 32), amax, np.float32), "mxfp4", 4, 32, "F32")
    assert s.tolist() == [[116]]


# -- what is written ------------------------------------------------------------------------------
def mlx_dequant_by_hand(header: dict, raw: dict, module: str, mode: str, bits: int,
                        group: int) -> np.ndarray:
    """MLX's dequantization from the raw bytes, with ml_dtypes arithmetic: affine
    T(T(q · s) + b) in the scales' dtype T; fp q · scale in bfloat16 (mx.dequantize's
    default)."""
    words = np.frombuffer(raw[f"{module}.weight"], "<u4").reshape(header[f"{module}.weight"]["shape"])
    cols = words.shape[1] * 32 // bits
    bitstream = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
    q = bitstream.reshape(words.shape[0], cols, bits)
    q = (q * (1 << np.arange(bits))).sum(axis=2)
    st_dtype = header[f"{module}.scales"]["dtype"]
    if mode == "affine":
        t = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32}[st_dtype]
        s = np.frombuffer(raw[f"{module}.scales"], t).reshape(words.shape[0], -1)
        b = np.frombuffer(raw[f"{module}.biases"], t).reshape(words.shape[0], -1)
        prod = q.astype(t) * np.repeat(s, group, axis=1)
        return (prod + np.repeat(b, group, axis=1)).astype(np.float32)
    sb = np.frombuffer(raw[f"{module}.scales"], np.uint8).reshape(words.shape[0], -1)
    if mode == "nvfp4":
        scale = sb.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    else:
        scale = np.ldexp(np.float32(1), sb.astype(np.int32) - 127)
    v = np.array(FP4, np.float32)[q] if mode != "mxfp8" else \
        q.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return (v * np.repeat(scale, group, axis=1)).astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("minmax", [False, True], ids=["searched", "minmax"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("mode", MODES)
def test_every_layer_is_written_as_mlx_lays_it_out_and_reads_back_as_mlx_computes(
        tmp_path, mode, dtype, minmax):
    rng = np.random.default_rng(5)
    src, out = tmp_path / "m", tmp_path / "out"
    exact = write_model(src, llama_tensors(rng, hidden=128, inter=256, layers=1, kv=64,
                                           vocab=64), dtype)
    args = ["quantize", src, "-o", out, "--format", "mlx", "--scheme", mode, "-q"]
    assert run(*(args + (["--calibration", "minmax"] if minmax else []))) == 0
    ms = resolve_mlx(mode)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"] == cfg["quantization_config"] == ms.entry()
    header, raw = read_raw(out / "model.safetensors")
    loaded = bq.load(out)
    st_dtype = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[dtype]
    for module in LAYERS:
        x = exact[f"{module}.weight"]
        rows, cols = x.shape
        assert header[f"{module}.weight"] == {**header[f"{module}.weight"], "dtype": "U32",
                                              "shape": [rows, cols * ms.bits // 32]}
        sd = st_dtype if ms.mode == "affine" else "U8"
        assert header[f"{module}.scales"]["dtype"] == sd
        assert header[f"{module}.scales"]["shape"] == [rows, cols // ms.group]
        assert (f"{module}.biases" in header) == (ms.mode == "affine")
        # the codes: MLX's rule (minmax) or blockquant's reference (searched)
        words = np.frombuffer(raw[f"{module}.weight"], "<u4").reshape(rows, -1)
        codes = unpack(words, ms.bits, cols)
        if minmax:
            want = mlx_quantize(x, ms.mode, ms.bits, ms.group, st_dtype)[0]
        elif ms.mode == "affine":
            text, _ = scheme_for(ms, st_dtype, x.shape)
            want = ref.affine_codes(x, text, ms.bits, **searched_rule(ms))[0]
        else:
            text, _ = scheme_for(ms, st_dtype, x.shape)
            rq = ref.quantize(x, text, **searched_rule(ms))
            want = np.asarray(rq.values).reshape(x.shape)
        assert np.array_equal(codes, want), module
        got = np.asarray(loaded[f"{module}.weight"], np.float32)
        hand = mlx_dequant_by_hand(header, raw, module, ms.mode, ms.bits, ms.group)
        assert got.view(np.uint32).tolist() == hand.view(np.uint32).tolist(), module
    for kept in ("model.norm.weight", "model.layers.0.input_layernorm.weight"):
        assert np.asarray(loaded[kept], np.float32).tobytes() == exact[kept].tobytes()


def test_rules_give_layers_their_own_entries(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "out"
    assert run("quantize", src, "-o", out, "--format", "mlx", "--scheme", "affine4",
               "--rule", r"down_proj=affine8:g32", "--rule", "lm_head=keep", "--rule",
               "embed=mxfp8") == 0
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert q == {"group_size": 64, "bits": 4, "mode": "affine",
                 "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8, "mode": "affine"},
                 "model.embed_tokens": {"group_size": 32, "bits": 8, "mode": "mxfp8"}}
    header, _ = read_raw(out / "model.safetensors")
    assert "lm_head.scales" not in header and header["lm_head.weight"]["dtype"] == "BF16"
    assert "mlx affine8:g32: 1" in capsys.readouterr().out


def test_bad_inputs_are_one_line_and_write_nothing(tmp_path, capsys):
    rng = np.random.default_rng(12)
    src = tmp_path / "m"  # down_proj: 264 input features, a multiple of no MLX group
    write_model(src, llama_tensors(rng, hidden=64, inter=256, layers=1, kv=64, vocab=64,
                                   odd_down=True))
    out = tmp_path / "out"
    cases = [
        (["--scheme", "affine4:g48"], ["takes groups of 32, 64 or 128"]),
        (["--scheme", "affine7"], ["takes 2, 3, 4, 5, 6 or 8 bits"]),
        (["--scheme", "mxfp4:g64"], ["groups of 32"]),
        (["--scheme", "int4"], ["not an MLX mode"]),
        (["--scheme", "affine4", "--rounding", "half_away"], ["--rounding"]),
        (["--scheme", "affine4", "--calibration", "absmean"], ["--calibration"]),
        (["--scheme", "affine4", "--rule", "q_proj=int8"], ["MLX output takes MLX modes"]),
        (["--scheme", "affine4", "--rule", "down_proj=affine4:g32"], ["264 input features",
                                                                      "--rule"]),
        (["--scheme", "affine4"], ["264 input features", "=keep' or --exclude"]),
    ]
    for extra, words in cases:
        assert run("quantize", src, "-o", out, "--format", "mlx", *extra) == 2, extra
        one_error_line(capsys, *words)
        assert not out.exists()
    # a folder already quantized (by MLX or compressed-tensors)
    assert run("quantize", src, "-o", out, "--format", "mlx", "--scheme", "affine4", "--rule",
               "down_proj=keep", "-q") == 0
    for fmt, scheme in (("mlx", "affine8"), ("compressed-tensors", "W4A16")):
        assert run("quantize", out, "-o", tmp_path / "again", "--format", fmt, "--scheme",
                   scheme) == 2
        one_error_line(capsys, "already holds a quantization", "affine")
    # a file, not a folder; a blockquant scheme's rule naming an MLX mode elsewhere
    assert run("quantize", src / "model.safetensors", "-o", tmp_path / "f", "--format", "mlx",
               "--scheme", "affine4") == 2
    one_error_line(capsys, "model folder")
    assert run("quantize", src, "-o", tmp_path / "g", "--scheme", "int8", "--rule",
               "q_proj=affine4") == 2
    one_error_line(capsys, "is an MLX mode", "--format mlx")
    assert not (tmp_path / "again").exists() and not (tmp_path / "g").exists()


def test_a_weight_its_mode_cannot_take_is_named_and_kept_only_when_asked(tmp_path, capsys):
    rng = np.random.default_rng(1)
    t = {"a.weight": rng.standard_normal((8, 48)).astype(np.float32),
         "b.weight": rng.standard_normal((8, 64)).astype(np.float32),
         "n.weight": np.ones(48, np.float32)}
    write_model(tmp_path / "m", t)
    assert run("quantize", tmp_path / "m", "-o", tmp_path / "o", "--format", "mlx",
               "--scheme", "affine4") == 2
    one_error_line(capsys, "a.weight", "48 input features")
    assert run("quantize", tmp_path / "m", "-o", tmp_path / "o", "--format", "mlx",
               "--scheme", "affine4", "--rule", "^a\\.weight$=keep", "-q") == 0
    header, _ = read_raw(tmp_path / "o" / "model.safetensors")
    assert "a.scales" not in header and "b.scales" in header
    assert run("quantize", tmp_path / "m", "-o", tmp_path / "o2", "--format", "mlx",
               "--scheme", "affine4", "--exclude", "^b") == 2
    one_error_line(capsys, "a.weight")
    assert run("quantize", tmp_path / "m", "-o", tmp_path / "o3", "--format", "mlx",
               "--scheme", "affine4", "--exclude", "^[ab]") == 2
    one_error_line(capsys, "has no layer")


def test_non_finite_weights_are_refused_under_both_rules(tmp_path, capsys):
    rng = np.random.default_rng(2)
    t = llama_tensors(rng, hidden=64, inter=64, layers=1, kv=64, vocab=64)
    t["model.layers.0.mlp.up_proj.weight"][3, 5] = np.inf
    write_model(tmp_path / "m", t, "float32")
    for cal in ("minmax", "mse"):
        assert run("quantize", tmp_path / "m", "-o", tmp_path / "o", "--format", "mlx",
                   "--scheme", "affine4", "--calibration", cal) == 2
        one_error_line(capsys, "up_proj")
        assert not (tmp_path / "o").exists()


def test_jobs_and_shards_give_the_same_bytes_and_index(tmp_path):
    rng = np.random.default_rng(4)
    t = llama_tensors(rng, hidden=64, inter=128, layers=2, kv=64, vocab=64)
    write_model(tmp_path / "m", t, shards=3)
    outs = []
    for jobs in (1, 2):
        out = tmp_path / f"o{jobs}"
        assert run("quantize", tmp_path / "m", "-o", out, "--format", "mlx", "--scheme",
                   "affine3:g32", "--jobs", jobs, "-q") == 0
        outs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outs[0] == outs[1]
    index = json.loads(outs[0]["model.safetensors.index.json"])
    assert index["weight_map"]["lm_head.scales"] == index["weight_map"]["lm_head.weight"]
    assert "lm_head.biases" in index["weight_map"]


def test_a_folder_is_read_inspected_reported_and_dequantized(model, tmp_path, capsys):
    src, exact = model
    out = tmp_path / "out"
    assert run("quantize", src, "-o", out, "--format", "mlx", "--scheme", "affine4", "-q") == 0
    loaded = bq.load(out)
    assert set(loaded) == set(exact)
    assert run("inspect", out) == 0
    assert "mlx affine4 (4-bit)" in capsys.readouterr().out
    assert run("report", out, "--scheme", "int8") == 0
    capsys.readouterr()
    deq = tmp_path / "deq"
    assert run("dequantize", out, "-o", deq, "-q") == 0
    cfg = json.loads((deq / "config.json").read_text())
    assert "quantization" not in cfg and "quantization_config" not in cfg
    back = bq.load(deq)
    for k, v in loaded.items():
        assert np.asarray(back[k], np.float32).tobytes() == np.asarray(v, np.float32).tobytes()
    # the dequantized folder quantizes again
    assert run("quantize", deq, "-o", tmp_path / "again", "--format", "mlx", "--scheme",
               "mxfp4", "-q") == 0


def test_a_crafted_folder_is_an_error_naming_the_tensor(model, tmp_path, capsys):
    src, _ = model
    out = tmp_path / "out"
    assert run("quantize", src, "-o", out, "--format", "mlx", "--scheme", "affine4", "-q") == 0
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for bad, words in (({"group_size": 48, "bits": 4}, ["groups of"]),
                       ({"group_size": 64, "bits": 4, "mode": "int"}, ["mode 'int'"]),
                       ({"group_size": 32, "bits": 4}, ["scales"])):
        cfg_path.write_text(json.dumps({**cfg, "quantization": bad}))
        assert run("inspect", out) == 2
        one_error_line(capsys, *words)


def test_searched_scales_beat_mlx_s_own_rule(tmp_path):
    rng = np.random.default_rng(9)
    x = (rng.standard_t(5, (256, 512)) * 0.02).astype(ml_dtypes.bfloat16).astype(np.float32)
    write_model(tmp_path / "m", {"a.weight": x, "n.weight": np.ones(512, np.float32)})

    def sqnr(a, b):
        return 10 * np.log10(np.sum(a.astype(np.float64) ** 2)
                             / np.sum((a.astype(np.float64) - b) ** 2))

    for mode in ("affine4", "affine3", "affine2:g32", "mxfp4", "nvfp4", "mxfp8"):
        got = {}
        for cal in ("minmax", "mse"):
            out = tmp_path / f"{mode}_{cal}".replace(":", "_")
            assert run("quantize", tmp_path / "m", "-o", out, "--format", "mlx", "--scheme",
                       mode, "--calibration", cal, "-q") == 0
            got[cal] = sqnr(x, np.asarray(bq.load(out)["a.weight"], np.float32))
        assert got["mse"] >= got["minmax"], (mode, got)


def test_the_api_writes_it_as_the_command_does(model, tmp_path):
    src, _ = model
    assert run("quantize", src, "-o", tmp_path / "cli", "--format", "mlx", "--scheme",
               "nvfp4", "-q") == 0
    bq.quantize_file(src, tmp_path / "api", "nvfp4", output_format="mlx")
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "api" / name).read_bytes()


@settings(max_examples=40, deadline=None)
@given(bits=st.integers(1, 8), rows=st.integers(1, 3), groups=st.integers(1, 3),
       group=st.sampled_from([8, 32]), off=st.sampled_from(["bias:bf16", "bias:f16", "zero:u8"]),
       cal=st.sampled_from(["minmax", "mse"]), seed=st.integers(0, 2**32 - 1))
def test_narrow_codes_match_the_reference(bits, rows, groups, group, off, cal, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, groups * group)) * rng.choice([1e-3, 1, 50])).astype(np.float32)
    text = f"u8/native/block{group}:bf16/{off}"
    got = bq.qtensor.affine_codes(x, text, bits, calibration=cal)
    want = ref.affine_codes(x, text, bits, calibration=cal)
    assert got[0].max(initial=0) < 1 << bits
    assert got[0].dtype == want[0].dtype == np.uint8
    assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
    # offsets: zero points come as uint8 from the API (as QTensor.offsets), float32 here
    assert np.asarray(got[2], np.float32).tobytes() == want[2].tobytes()


def test_narrow_codes_refuse_what_they_cannot_take():
    x = np.ones((2, 32), np.float32)
    with pytest.raises(bq.SchemeError):
        bq.qtensor.affine_codes(x, "u4/native/block32:bf16/bias:bf16", 3)
    with pytest.raises(bq.SchemeError):
        bq.qtensor.affine_codes(x, "u8/native/block32:bf16/bias:bf16", 9)
    with pytest.raises(bq.SchemeError):
        ref.affine_codes(x, "u8/native/block32:bf16/bias:bf16", 0)
    x[0, 0] = np.nan
    with pytest.raises(bq.NonFiniteError):
        bq.qtensor.affine_codes(x, "u8/native/block32:bf16/bias:bf16", 3)
