"""Importance weights inside ggml's quantizers: ``blockquant.gguf.quantize(weights=)`` and
``--imatrix`` on a GGUF output (requantizing a GGUF file, converting a safetensors folder), with
llama-quantize's importance-only choices (Q2_K_S, Q4_0's FFN down). The bytes are checked by
gguf-py, which decodes them exactly as blockquant does; the gain is measured by the weighted
error the weights stand for, against the same quantizer without them."""

from __future__ import annotations

import numpy as np
import pytest

import blockquant as bq
from blockquant import gguf as bg
from blockquant.checkpoint.imatrix import ggml_floor, read_imatrix
from blockquant.cli import main
from blockquant.errors import LayoutError, QuantError

gguf = pytest.importorskip("gguf")
from gguf import GGUFReader  # noqa: E402
from gguf import quants as gq  # noqa: E402
from test_gguf_convert import llama_folder  # noqa: E402
from test_gguf_mixes import LAYERS, expect, llama  # noqa: E402
from test_imatrix import imatrix_gguf  # noqa: E402

SEARCHED = [name for name, t in bg.TYPES.items() if t.takes_weights]
RNG = np.random.default_rng(20261208)


def skewed(n: int, rng: np.random.Generator) -> np.ndarray:
    """An importance whose columns are orders of magnitude apart, a few far above the rest."""
    w = np.exp(1.5 * rng.standard_normal(n))
    w[rng.choice(n, max(1, n // 50), replace=False)] *= 100
    return w.astype(np.float32)


def weighted_error(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Σ w·(x − y)² of each row (w broadcast along the rows)."""
    d = x.astype(np.float64) - y
    return np.sum(np.broadcast_to(w, x.shape) * d * d, axis=-1)


def test_the_types_that_take_weights():
    # the searched types and the legacy ones; not those ggml's own quantizers take none for
    assert set(SEARCHED) == {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                             "Q6_K", "IQ4_NL", "IQ4_XS", "NVFP4"} & set(bg.TYPES)


@pytest.mark.parametrize("qtype", SEARCHED)
def test_weights_steer_each_type_and_gguf_py_reads_the_bytes(qtype):
    x = (RNG.standard_t(5, (24, 512)) * 0.02).astype(np.float32)
    w = skewed(512, RNG)
    plain, weighted = bg.quantize(x, qtype), bg.quantize(x, qtype, weights=w)
    assert weighted.shape == plain.shape and weighted.dtype == np.uint8
    y = bg.dequantize(weighted, qtype)
    if qtype in gguf.GGMLQuantizationType.__members__:
        np.testing.assert_array_equal(gq.dequantize(weighted, gguf.GGMLQuantizationType[qtype]), y)
    e_w = weighted_error(x, y, w)
    e_p = weighted_error(x, bg.dequantize(plain, qtype), w)
    # no row is worse by the weighted measure (a block keeps the plain bytes where they are
    # better), and in all the weights pay off by well over a decibel
    assert np.all(e_w <= e_p)
    assert 10 * np.log10(e_p.sum() / e_w.sum()) > 1.0, qtype


def test_types_without_a_search_ignore_the_weights():
    x = RNG.standard_normal((4, 256)).astype(np.float32)
    w = skewed(256, RNG)
    for qtype in ("Q8_0", "MXFP4", "TQ1_0", "TQ2_0", "F16", "BF16", "F32"):
        assert not bg.TYPES[qtype].takes_weights
        a, b = bg.quantize(x, qtype), bg.quantize(x, qtype, weights=w)
        assert a.tobytes() == b.tobytes(), qtype


def test_shapes_of_weights_one_row_per_expert_and_per_row():
    x = RNG.standard_normal((3, 4, 256)).astype(np.float32)  # three experts of four rows
    per_expert = np.stack([skewed(256, RNG) for _ in range(3)])
    got = bg.quantize(x, "Q4_K", weights=per_expert)
    for e in range(3):
        assert got[e].tobytes() == bg.quantize(x[e], "Q4_K", weights=per_expert[e]).tobytes()
    # llama-quantize's 3-D entry as the imatrix reader gives it, (n_mat, 1, ne0)
    assert bg.quantize(x, "Q4_K", weights=per_expert[:, None, :]).tobytes() == got.tobytes()
    # x's own shape: every row its own weights
    rows = np.stack([skewed(256, RNG) for _ in range(12)]).reshape(3, 4, 256)
    each = bg.quantize(x, "IQ4_XS", weights=rows)
    assert each[1, 2].tobytes() == bg.quantize(x[1, 2:3], "IQ4_XS", weights=rows[1, 2]).tobytes()
    # float64 and list weights are float32 to the core
    w = skewed(256, RNG)
    assert bg.quantize(x, "Q4_0", weights=w.astype(np.float64).tolist()).tobytes() == \
        bg.quantize(x, "Q4_0", weights=w).tobytes()


def test_bytes_do_not_depend_on_the_thread_count():
    x = RNG.standard_normal((64, 1024)).astype(np.float32)  # several tasks of the pool
    w = skewed(1024, RNG)
    before = bq.get_num_threads()
    try:
        out = {}
        for n in (1, 2):
            bq.set_num_threads(n)
            out[n] = [bg.quantize(x, q, weights=w).tobytes() for q in ("Q4_K", "Q4_1", "NVFP4")]
        assert out[1] == out[2]
    finally:
        bq.set_num_threads(before)


def test_bfloat16_bits_take_weights_as_their_values_do():
    x = RNG.standard_normal((2, 256)).astype(np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    values = (bits.astype(np.uint32) << 16).view(np.float32)
    w = skewed(256, RNG)
    assert bg.quantize_bits(bits, "bf16", "Q5_K", weights=w).tobytes() == \
        bg.quantize(values, "Q5_K", weights=w).tobytes()


def test_bad_weights_are_one_error_each():
    x = np.ones((4, 64), np.float32)
    w = np.ones(64, np.float32)
    with pytest.raises(LayoutError, match="rows of 64 values"):
        bg.quantize(x, "Q4_0", weights=np.ones(32))
    with pytest.raises(LayoutError, match="rows of 64"):
        bg.quantize(x, "Q4_0", weights=np.float32(1))
    with pytest.raises(QuantError, match="even split of its 4 rows"):
        bg.quantize(x, "Q4_0", weights=np.ones((3, 64)))
    for bad, where in ((-1.0, 7), (np.nan, 7), (np.inf, 7)):
        v = w.copy()
        v[7] = bad
        with pytest.raises(QuantError, match=f"finite and >= 0, got .* at flat index {where}"):
            bg.quantize(x, "Q4_0", weights=v)
    with pytest.raises(QuantError, match="finite"):  # too large for float32
        bg.quantize(x, "Q4_0", weights=np.full(64, 1e300))
    for dtype in (bool, complex, object):
        with pytest.raises(TypeError, match="weights must be a real float array"):
            bg.quantize(x, "Q4_0", weights=np.ones(64, dtype))
    with pytest.raises(LayoutError, match="0-d"):
        bg.quantize(np.float32(1), "Q4_0", weights=w)
    x[1, 3] = np.nan  # the values are checked as without weights
    with pytest.raises(bq.NonFiniteError, match="flat index 67"):
        bg.quantize(x, "Q4_0", weights=w)


# --- the command: --imatrix into a GGUF output -------------------------------------------------


def importance_file(path, names_shapes, rng):
    """An imatrix.gguf with a skewed importance for each (name, row length)."""
    entries, imp = {}, {}
    for name, ne0 in names_shapes:
        imp[name] = skewed(ne0, rng)
        entries[name] = (imp[name][None] * 4, [4.0])
    return imatrix_gguf(path, entries), imp


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory):
    return llama(tmp_path_factory.mktemp("imp") / "gqa.gguf", n_kv=2)


def all_weights(model):
    return [(t.name, int(t.shape[0])) for t in GGUFReader(model).tensors
            if t.name.endswith(".weight") and len(t.shape) > 1]


def test_q2_k_s_takes_an_importance_matrix_and_llama_cpps_types(gqa_model, tmp_path, capsys):
    im, _ = importance_file(tmp_path / "i.gguf", all_weights(gqa_model), RNG)
    out = tmp_path / "q2ks.gguf"
    assert main(["quantize", str(gqa_model), "-o", str(out), "-q", "--scheme", "Q2_K_S",
                 "--imatrix", str(im)]) == 0
    got = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
    # V Q4_K under grouped-query attention of 4, FFN down Q4_K in the first eighth of layers
    assert got == expect("Q2_K", {"attn_v": dict.fromkeys(range(LAYERS), "Q4_K"),
                                  "ffn_down": {0: "Q4_K"}})
    assert int(GGUFReader(out).fields["general.file_type"].contents()) == 21
    # without a matrix, refused as llama-quantize refuses it
    assert main(["quantize", str(gqa_model), "-o", str(tmp_path / "x.gguf"), "--scheme",
                 "Q2_K_S"]) == 2
    assert "Q2_K_S is made with an importance matrix" in capsys.readouterr().err
    # a matrix without an entry for one of its Q2_K tensors: one line, nothing written
    partial = [(n, k) for n, k in all_weights(gqa_model) if n != "blk.3.ffn_up.weight"]
    im2, _ = importance_file(tmp_path / "partial.gguf", partial, RNG)
    assert main(["quantize", str(gqa_model), "-o", str(tmp_path / "x.gguf"), "--scheme",
                 "Q2_K_S", "--imatrix", str(im2)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "blk.3.ffn_up.weight" in err and "importance" in err
    assert not (tmp_path / "x.gguf").exists()


def test_the_written_tensors_are_the_weighted_quantizers_bytes(gqa_model, tmp_path):
    names = all_weights(gqa_model)
    im, _ = importance_file(tmp_path / "i.gguf", names[: len(names) // 2], RNG)
    read = read_imatrix(im).values
    out = tmp_path / "q4km.gguf"
    assert main(["quantize", str(gqa_model), "-o", str(out), "-q", "--scheme", "Q4_K_M",
                 "--imatrix", str(im)]) == 0
    src = {t.name: t for t in GGUFReader(gqa_model).tensors}
    weighted = plain = 0
    for t in GGUFReader(out).tensors:
        qtype = t.tensor_type.name
        if not bg.TYPES[qtype].takes_weights:
            continue
        x = np.asarray(src[t.name].data, np.float32)
        if t.name in read:
            want, weighted = bg.quantize(x, qtype, weights=ggml_floor(read[t.name][0])), weighted + 1
        else:
            want, plain = bg.quantize(x, qtype), plain + 1  # no entry: llama-quantize's plain
        assert bytes(t.data) == want.tobytes(), t.name
    assert weighted and plain


def test_importance_only_choices_of_the_mixes(tmp_path):
    model = llama(tmp_path / "m.gguf")
    im, _ = importance_file(tmp_path / "i.gguf", all_weights(model), RNG)
    for scheme, per_layer in (("Q4_0", {"ffn_down": {0: "Q4_1"}}),  # FFN down's first eighth
                              ("IQ4_NL", {})):  # no Q5_K bump with a matrix
        out = tmp_path / f"{scheme}.gguf"
        assert main(["quantize", str(model), "-o", str(out), "-q", "--scheme", scheme,
                     "--imatrix", str(im)]) == 0
        got = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
        assert got == expect(scheme, per_layer), scheme


def test_a_folder_converted_to_gguf_takes_the_matrix_by_gguf_names(tmp_path):
    arrays = llama_folder(tmp_path / "hf")
    x = arrays["model.layers.0.mlp.down_proj.weight"]
    imp = skewed(x.shape[1], RNG)
    im = imatrix_gguf(tmp_path / "i.gguf", {"blk.0.ffn_down.weight": (imp[None] * 2, [2.0])})
    out = tmp_path / "m.gguf"
    assert main(["quantize", str(tmp_path / "hf"), "-o", str(out), "-q", "--scheme", "Q4_K_M",
                 "--pure", "--imatrix", str(im)]) == 0
    t = {t.name: t for t in GGUFReader(out).tensors}["blk.0.ffn_down.weight"]
    read = read_imatrix(im).values["blk.0.ffn_down.weight"][0]
    assert bytes(t.data) == bg.quantize(x, "Q4_K", weights=ggml_floor(read)).tobytes()
    assert bytes(t.data) != bg.quantize(x, "Q4_K").tobytes()

