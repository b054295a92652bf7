"""ONNX models (blockquant.onnx), checked by onnxruntime: the dequantized weights equal
blockquant's dequantize bit for bit, and the quantized model computes what the float model
computes with blockquant-dequantized weights.

The model is built here with onnx's helpers: a MatMul with a 1-D bias Add, a Gemm with transB
and a bias, a weight shared by two MatMuls, a Gemm without transB, K not a multiple of the
block (partial blocks, MatMulNBits padding), a weight on the A side of a MatMul.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import blockquant as bq  # noqa: E402
from blockquant.checkpoint import CheckpointError  # noqa: E402
from blockquant.cli import main  # noqa: E402
from blockquant.onnx import inspect_model, quantize_model, report_model  # noqa: E402
from blockquant.presets import resolve  # noqa: E402

B = 5  # batch rows of the test input


def weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    w = {
        "w1": rng.normal(0, 0.08, (64, 96)),       # MatMul B: K=64 on axis 0
        "b1": rng.normal(0, 0.1, (96,)),
        "w2": rng.standard_t(4, (80, 96)) * 0.05,  # Gemm transB=1: (N, K), K=96 on axis 1
        "b2": rng.normal(0, 0.1, (80,)),
        "ws": rng.normal(0, 0.1, (80, 80)),        # shared: two MatMuls, K=80 (partial blocks)
        "w5": rng.normal(0, 0.1, (80, 40)),        # Gemm transB=0: K=80 on axis 0
        "b5": rng.normal(0, 0.1, (40,)),
        "wa": rng.normal(0, 0.1, (7, 40)),         # MatMul A side: K=40 on axis 1
    }
    return {k: v.astype(np.float32) for k, v in w.items()}


def build(w: dict[str, np.ndarray], opset: int = 17,
          elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h1b"]),
        helper.make_node("Relu", ["h1b"], ["r1"]),
        helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], transB=1),
        helper.make_node("MatMul", ["h2", "ws"], ["h3"]),
        helper.make_node("Tanh", ["h3"], ["t3"]),
        helper.make_node("MatMul", ["t3", "ws"], ["h4"]),
        helper.make_node("Gemm", ["h4", "w5", "b5"], ["h5"]),
        helper.make_node("Transpose", ["h5"], ["h5t"]),
        helper.make_node("MatMul", ["wa", "h5t"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "test", [helper.make_tensor_value_info("x", elem, [B, 64])],
        [helper.make_tensor_value_info("y", elem, [7, B])],
        [numpy_helper.from_array(v, k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


#: weight -> its K axis (the axis blocks run along), as the consumers read it.
KAXIS = {"w1": 0, "w2": 1, "ws": 0, "w5": 0, "wa": 1}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    onnx.save_model(build(weights(np.random.default_rng(7))), str(path))
    return path


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(1).normal(0, 1, (B, 64)).astype(np.float32)


def session(model: object, optimize: bool = False) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.intra_op_num_threads = 1
    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def expected_weights(path: Path, scheme: str, skip: tuple[str, ...] = ()) -> dict:
    """Each quantized weight as blockquant dequantizes it, quantized here directly (blocks
    along its K axis), and the float model holding those weights."""
    model = onnx.load(str(path))
    out = {}
    for t in model.graph.initializer:
        if t.name in KAXIS and t.name not in skip:
            w = numpy_helper.to_array(t)
            k = KAXIS[t.name]
            qt = bq.quantize(np.ascontiguousarray(np.moveaxis(w, k, -1)), scheme)
            out[t.name] = np.moveaxis(qt.dequantize(), -1, k)
            t.CopyFrom(numpy_helper.from_array(out[t.name], t.name))
    return {"weights": out, "model": model}


def dequantized_by_ort(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    """The weights as the quantized model's own nodes compute them, in onnxruntime: the QDQ
    form's decoding subgraph outputs each weight under its own name."""
    model = onnx.load(str(path))
    for n in names:
        model.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    outs = session(model).run(names, {"x": np.zeros((B, 64), np.float32)})
    return dict(zip(names, outs))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a, np.float32).view(np.uint32),
        np.ascontiguousarray(b, np.float32).view(np.uint32))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


#: Schemes the QDQ form holds: (scheme, the ai.onnx opset the output needs). The fixture
#: model is opset 17, so each raises it to that.
QDQ = [
    ("int8", 17),                            # Q8S per-tensor F32: DequantizeLinear-10
    ("q8f/native/block32:f32", 21),          # blocked
    ("int8_block32", 21),                    # F16 block scales, Cast to f32
    ("q8s/native/block128:f32", 17),         # a block past K: per-axis, one scale a column
    ("int4_block32", 21),                    # Q4S packed in u32 words: INT4 codes
    ("q4f/native/block32:f32", 21),          # the measured case
    ("q4s/native/block64:bf16", 21),
    ("q4f/native/tensor:f16", 21),           # INT4 per-tensor, an F16 scale
    ("q4s/native/block16:ue4m3", 21),        # UE4M3 scales as FLOAT8E4M3FN, Cast
    ("q2s/native/block16:f32", 25),          # INT2: DequantizeLinear-25
    ("bitnet", 25),                          # Q2S per-tensor, absmean
    ("e4m3/native/block32:f32", 21),         # FP8
    ("e5m2/native/tensor:f32", 19),
    ("mxfp8", 21),                           # UE8M0 scales as BF16, Cast
    ("mxfp4", 21),                           # FP4 codes as INT4 bits + Gather table
    ("nvfp4", 21),                           # two-level: Cast(UE4M3) x g, then FP4
    ("e2m1/native/block32:f16+tensor:f32", 21),
    # Lookup: indices as INT4 + a Gather from the codebook
    ("q4f/native/block32:f16/lookup:nf4", 21),
    ("q4s/packed_u32_0/block16:ue4m3+tensor:f32/lookup:iq4nl", 21),
    ("q2s/native/block128:f32/lookup:[1.5,-0.25,0.25,-3.0]", 21),   # per-axis
    ("q4f/native/tensor:f32/lookup:"
     "[3.0,-7.0,0.5,6.0,-0.25,2.0,-3.0,1.0,-1.0,0.75,4.0,-5.0,0.001,-2.0,5.0,0.0]", 21),
]


def runtime_has_opset(opset: int) -> bool:
    """Whether the installed onnxruntime runs a DequantizeLinear of ``opset`` (25, INT2's:
    onnxruntime 1.24 and later; Python 3.10 gets no release past 1.23)."""
    codes = numpy_helper.from_array(np.zeros(4, np.int8), "c")
    dq = helper.make_node("DequantizeLinear", ["c", "s"], ["y"])
    g = helper.make_graph([dq], "probe", [], [helper.make_tensor_value_info("y", 1, [4])],
                          [codes, numpy_helper.from_array(np.float32(1), "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = helper.find_min_ir_version_for(list(m.opset_import))
    try:
        session(m)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("scheme,opset", QDQ, ids=[s for s, _ in QDQ])
def test_qdq_dequantizes_bit_for_bit_and_runs(model_path: Path, x: np.ndarray, tmp_path: Path,
                                              scheme: str, opset: int) -> None:
    if opset > 21 and not runtime_has_opset(opset):
        pytest.skip(f"onnxruntime {ort.__version__} does not run opset {opset}")
    out = tmp_path / "q.onnx"
    res = quantize_model(model_path, out, scheme)
    assert sorted(res.quantized) == sorted(KAXIS) and res.opset_after == opset
    assert set(res.kept) == set()  # b1, b2, b5 are no MatMul/Gemm weights at all
    q = onnx.load(str(out))
    onnx.checker.check_model(q, full_check=True)
    names = {t.name for t in q.graph.initializer}
    assert names.isdisjoint(KAXIS) and {"b1", "b2", "b5"} <= names  # biases untouched
    exp = expected_weights(model_path, scheme)
    got = dequantized_by_ort(out, list(KAXIS))
    for name in KAXIS:
        assert same_bits(got[name], exp["weights"][name]), name
    ref = session(exp["model"]).run(None, {"x": x})[0]
    y = session(str(out)).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    y_opt = session(str(out), optimize=True).run(None, {"x": x})[0]
    assert rel_err(y_opt, ref) < 1e-2  # fused 4-bit kernels quantize activations a little
    assert os.path.getsize(out) < os.path.getsize(model_path)


def test_fp4_standard_dequantizelinear_checked_by_onnx_reference(model_path: Path,
                                                                  tmp_path: Path) -> None:
    """fp4="dq" writes FLOAT4E2M1 codes and the opset-23 DequantizeLinear (onnxruntime 1.32
    has no kernel for it, so onnx's reference evaluator is the oracle)."""
    from onnx.reference import ReferenceEvaluator

    out = tmp_path / "q.onnx"
    res = quantize_model(model_path, out, "nvfp4", fp4="dq")
    assert res.opset_after == 23
    q = onnx.load(str(out))
    types = {TensorProto.DataType.Name(t.data_type) for t in q.graph.initializer}
    assert "FLOAT4E2M1" in types
    exp = expected_weights(model_path, "nvfp4")
    ev = ReferenceEvaluator(q)
    for name in KAXIS:
        # The weight's producer: run the graph up to it by asking for it as an output.
        got = ev.run([name], {"x": np.zeros((B, 64), np.float32)})[0]
        assert same_bits(got, exp["weights"][name]), name


MATMULNBITS = ["int4_block32", "q4f/native/block32:f32", "q4s/native/block16:f16",
               "q4f/native/block128:bf16", "q4s/native/block64:ue8m0",
               "q4s/native/block32:f16+tensor:f32", "q4f/native/block256:f32"]


def matmulnbits_weight(q: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    """The (K, N) weight a MatMulNBits node multiplies by, as onnxruntime computes it: the node
    alone, run on the K x K identity."""
    k, n = (helper.get_attribute_value(a) for a in node.attribute if a.name in ("K", "N"))
    inits = {t.name: t for t in q.graph.initializer}
    single = helper.make_node("MatMulNBits", ["a", node.input[1], node.input[2]], ["y"],
                              domain="com.microsoft",
                              **{a.name: helper.get_attribute_value(a) for a in node.attribute})
    g = helper.make_graph([single], "one", [helper.make_tensor_value_info("a", 1, [k, k])],
                          [helper.make_tensor_value_info("y", 1, [k, n])],
                          [inits[node.input[1]], inits[node.input[2]]])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return session(m).run(None, {"a": np.eye(k, dtype=np.float32)})[0]


@pytest.mark.parametrize("scheme", MATMULNBITS)
def test_matmulnbits_matches_blockquant(model_path: Path, x: np.ndarray, tmp_path: Path,
                                        scheme: str) -> None:
    out = tmp_path / "q.onnx"
    res = quantize_model(model_path, out, scheme, form="matmulnbits")
    # MatMulNBits needs no ai.onnx opset; wa (below) is blocked DequantizeLinear: opset 21.
    assert res.opset_after == 21
    q = onnx.load(str(out))
    onnx.checker.check_model(q, full_check=True)
    ops = [n.op_type for n in q.graph.node]
    # w1, w2 (transB Gemm with bias), ws twice (shared), w5 (Gemm with bias): MatMulNBits;
    # wa sits on the A side, which MatMulNBits cannot take: DequantizeLinear.
    assert ops.count("MatMulNBits") == 5 and "Gemm" not in ops
    assert [w.form for w in res.weights if w.name == "wa"] == ["qdq"]
    exp = expected_weights(model_path, scheme)
    shared = [n for n in q.graph.node if n.op_type == "MatMulNBits" and n.output[0] in
              ("h3", "h4")]
    assert shared[0].input[1:] == shared[1].input[1:]  # one B and one scales for both
    for node in q.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        name = {"h1": "w1", "h2": "w2", "h3": "ws", "h4": "ws", "h5": "w5"}[node.output[0]]
        w = exp["weights"][name]
        w_kn = w.T if KAXIS[name] == 1 else w
        got = matmulnbits_weight(q, node)
        assert np.array_equal(got, w_kn), name  # -0 and +0 alike: a sum of products
    ref = session(exp["model"]).run(None, {"x": x})[0]
    for optimize in (False, True):
        y = session(str(out), optimize).run(None, {"x": x})[0]
        assert rel_err(y, ref) < 1e-5, optimize


def test_inexpressible_schemes_raise_and_write_nothing(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    with pytest.raises(CheckpointError, match="2-D blocks"):
        quantize_model(model_path, out, "q4s/native/block4x8:f32")
    with pytest.raises(CheckpointError, match="takes integer values"):
        quantize_model(model_path, out, "mxfp8", form="matmulnbits")
    with pytest.raises(CheckpointError, match="MatMulNBits takes blocks"):
        quantize_model(model_path, out, "q4s/native/block48:f32", form="matmulnbits")
    with pytest.raises(CheckpointError, match="MatMulNBits takes blocks"):
        quantize_model(model_path, out, "q4s/native/tensor:f32", form="matmulnbits")
    with pytest.raises(CheckpointError, match="MatMulNBits has no codebook"):
        quantize_model(model_path, out, "q4f/native/block32:f16/lookup:nf4", form="matmulnbits")
    assert list(tmp_path.iterdir()) == []


def test_rules_select_and_metadata_says_what(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    res = quantize_model(model_path, out, "int4_block32", exclude="^wa$",
                         rules=["^ws$=int8", "^w5$=keep"])
    assert sorted(res.quantized) == ["w1", "w2", "ws"]
    assert res.kept == {"wa": "left out by --include/--exclude", "w5": "--rule ^w5$=keep"}
    q = onnx.load(str(out))
    meta = json.loads(next(p.value for p in q.metadata_props if p.key == "blockquant"))
    assert meta["tensors"]["ws"]["scheme"] == str(resolve("int8"))
    assert meta["tensors"]["w1"]["layout"] == "blocked (axis 0, block 32)"
    assert meta["tensors"]["w2"]["layout"] == "blocked (axis 1, block 32)"  # transB
    kept = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    orig = weights(np.random.default_rng(7))
    assert np.array_equal(kept["wa"], orig["wa"]) and np.array_equal(kept["w5"], orig["w5"])
    info = inspect_model(out)
    rows = {r["name"]: r for r in info["tensors"]}
    assert rows["w1"]["scheme"] == str(resolve("int4_block32")) and rows["wa"]["scheme"] is None
    assert rows["w1"]["bytes"] == 64 * 96 // 2 + 2 * 96 * 2  # INT4 codes + F16 scales
    with pytest.raises(CheckpointError, match="already holds"):
        quantize_model(out, tmp_path / "again.onnx", "int8")


def test_report_measures_without_writing(model_path: Path, tmp_path: Path) -> None:
    rep = report_model(model_path, "q4f/native/block32:f32")
    rows = {r["name"]: r for r in rep["tensors"]}
    w1 = weights(np.random.default_rng(7))["w1"]
    exp = bq.quantize(np.ascontiguousarray(w1.T), "q4f/native/block32:f32").dequantize().T
    sig, noise = np.sum(w1.astype(np.float64) ** 2), np.sum((w1 - exp).astype(np.float64) ** 2)
    assert rows["w1"]["sqnr_db"] == pytest.approx(10 * np.log10(sig / noise), rel=1e-6)
    assert rows["w1"]["bytes_before"] == w1.nbytes
    assert rows["w1"]["bytes_after"] == 64 * 96 // 2 + 2 * 96 * 4
    assert list(tmp_path.iterdir()) == []


def test_external_data_is_written_and_runs(model_path: Path, x: np.ndarray,
                                           tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    quantize_model(model_path, out, "int4_block32", external_data=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.onnx", "q.onnx.data"]
    onnx.checker.check_model(str(out))
    ref = session(expected_weights(model_path, "int4_block32")["model"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(session(str(out)).run(None, {"x": x})[0], ref, rtol=1e-5,
                               atol=1e-6)
    # An externally stored input is read with its data; the output is written whole.
    out2 = tmp_path / "sub" / "q2.onnx"
    out2.parent.mkdir()
    src = tmp_path / "src.onnx"
    onnx.save_model(onnx.load(str(model_path)), str(src), save_as_external_data=True,
                    location="src.onnx.data", size_threshold=0)
    quantize_model(src, out2, "int8")
    assert [p.name for p in out2.parent.iterdir()] == ["q2.onnx"]


def test_large_initializers_go_around_the_converter_unchanged(tmp_path: Path,
                                                             x: np.ndarray) -> None:
    """Raising the opset sends the large initializers that stay (an embedding table here)
    around onnx's version converter as graph inputs; they come back byte for byte, once."""
    w = weights(np.random.default_rng(7))
    model = build(w)
    emb = np.random.default_rng(2).normal(0, 1, (300, 8)).astype(np.float32)
    ids = np.array([3, 299, 0], np.int64)
    g = model.graph
    g.initializer.extend([numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(ids, "ids")])
    g.node.append(helper.make_node("Gather", ["emb", "ids"], ["e"]))
    g.output.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, [3, 8]))
    src = tmp_path / "emb.onnx"
    onnx.save_model(model, str(src))
    out = tmp_path / "q.onnx"
    res = quantize_model(src, out, "int4_block32")
    assert res.opset_after == 21 and "emb" not in res.quantized
    q = onnx.load(str(out))
    kept = [t for t in q.graph.initializer if t.name == "emb"]
    assert len(kept) == 1 and kept[0].raw_data == numpy_helper.from_array(emb, "emb").raw_data
    assert not {"emb", *KAXIS} & {i.name for i in q.graph.input}
    y, e = session(str(out)).run(None, {"x": x})
    assert np.array_equal(e, emb[ids])
    ref = session(expected_weights(src, "int4_block32")["model"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int2", "uint2", "float4_e2m1fn",
                                   "float8_e4m3fn", "bfloat16", "float16", "int8", "int64"])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 8), ()])
def test_initializers_are_written_as_onnx_writes_them(dtype: str, shape: tuple) -> None:
    """blockquant writes each initializer's raw bytes itself (sub-byte types packed as ONNX
    packs them, odd counts included): the bytes of onnx's numpy_helper.from_array."""
    import ml_dtypes

    from blockquant.onnx.model import add_initializer

    rng = np.random.default_rng(len(shape) * 31 + len(dtype))
    np_dtype = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    if np_dtype.kind in "iu" or dtype in ("int4", "uint4", "int2", "uint2"):
        info = ml_dtypes.iinfo(np_dtype) if dtype[-1] in "24" else np.iinfo(np_dtype)
        arr = rng.integers(int(info.min), int(info.max) + 1, shape).astype(np_dtype)
    else:
        arr = rng.normal(0, 2, shape).astype(np_dtype)
    g = helper.make_graph([], "g", [], [])
    add_initializer(g, "t", arr)
    ref = numpy_helper.from_array(arr, "t")
    got = g.initializer[0]
    assert (got.data_type, list(got.dims)) == (ref.data_type, list(ref.dims))
    assert got.raw_data == ref.raw_data
    back = numpy_helper.to_array(got)
    assert back.dtype == arr.dtype and back.tobytes() == arr.tobytes()


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_pack_bits_puts_the_first_code_lowest(monkeypatch: pytest.MonkeyPatch, bits: int,
                                              byteorder: str) -> None:
    """Codes packed along the last axis, first in the low bits, the last byte padded with
    zeros; the word-at-a-time way (little-endian hosts) and the per-code way alike."""
    import types

    from blockquant.onnx import lowering

    monkeypatch.setattr(lowering, "sys", types.SimpleNamespace(byteorder=byteorder))
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 256, (3, 4, 11)).astype(np.uint8)  # high bits set: ignored
    got = lowering.pack_bits(codes, bits)
    per = 8 // bits
    assert got.shape == (3, 4, -(-11 // per)) and got.dtype == np.uint8
    for idx in np.ndindex(codes.shape):
        byte = got[idx[:-1] + (idx[-1] // per,)]
        shift = bits * (idx[-1] % per)
        assert (byte >> shift) & ((1 << bits) - 1) == codes[idx] & ((1 << bits) - 1), idx
    if 11 % per:  # the last byte's padding
        assert np.all(got[..., -1] >> (bits * (11 % per)) == 0)


def test_float16_model_keeps_its_dtype(tmp_path: Path) -> None:
    w = {k: v.astype(np.float16) for k, v in weights(np.random.default_rng(3)).items()}
    model = build(w, elem=TensorProto.FLOAT16)
    src = tmp_path / "f16.onnx"
    onnx.save_model(model, str(src))
    out = tmp_path / "q.onnx"
    quantize_model(src, out, "int4_block32")
    exp = {}
    for name, k in KAXIS.items():
        qt = bq.quantize(np.ascontiguousarray(np.moveaxis(w[name], k, -1)), "int4_block32")
        exp[name] = np.moveaxis(qt.dequantize(np.float16), -1, k)
    q = onnx.load(str(out))
    for n in KAXIS:
        q.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT16, None))
    got = session(q).run(list(KAXIS), {"x": np.zeros((B, 64), np.float16)})
    for name, g in zip(KAXIS, got):
        assert g.dtype == np.float16 and np.array_equal(g.view(np.uint16),
                                                        exp[name].view(np.uint16)), name


# -- the command line ----------------------------------------------------------------------

def test_cli_quantize_inspect_report(model_path: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(model_path), "-o", str(out), "--scheme", "int4_block32",
                 "--onnx-op", "matmulnbits"]) == 0
    text = capsys.readouterr().out
    assert "5 of 5 weights quantized" in text and "MatMulNBits" in text
    assert main(["inspect", str(out)]) == 0
    assert "int4_block32" not in capsys.readouterr().out  # schemes are spelled out
    assert main(["report", str(model_path), "--scheme", "mxfp4", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["format"] == "onnx" and len(rep["tensors"]) == 5


BAD_FILES = {
    "truncated": lambda good: good[: len(good) // 2],
    "empty": lambda good: b"",
    "text": lambda good: b"not an onnx model at all\n",
    "zeros": lambda good: b"\0" * 100,
    "safetensors_header": lambda good: b"\x08\0\0\0\0\0\0\0{}      ",
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["quantize", "report", "inspect"])
def test_cli_bad_models_one_line_exit_2_nothing_written(model_path: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        kind: str, command: str) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(BAD_FILES[kind](model_path.read_bytes()))
    out = tmp_path / "out.onnx"
    argv = {"quantize": ["quantize", str(bad), "-o", str(out), "--scheme", "int8"],
            "report": ["report", str(bad), "--scheme", "int8"],
            "inspect": ["inspect", str(bad)]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("blockquant: error: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_cli_unsupported_scheme_and_model(model_path: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.onnx"
    for argv in (["--scheme", "q4s/native/block4x8:f32"],
                 ["--scheme", "int8", "--onnx-op", "matmulnbits"]):
        assert main(["quantize", str(model_path), "-o", str(out), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error" in err
    # A model onnx.checker refuses (a node reading a tensor nothing produces).
    m = build(weights(np.random.default_rng(0)))
    m.graph.node[0].input[0] = "nowhere"
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(m.SerializeToString())
    assert main(["quantize", str(bad), "-o", str(out), "--scheme", "int8"]) == 2
    assert "onnx.checker" in capsys.readouterr().err
    assert not out.exists()
    # Existing output without --force.
    out.write_bytes(b"keep")
    assert main(["quantize", str(model_path), "-o", str(out), "--scheme", "int8"]) == 2
    assert out.read_bytes() == b"keep"


def test_cli_dequantize_of_an_onnx_model_says_what_to_do(model_path: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    q = tmp_path / "q.onnx"
    assert main(["quantize", str(model_path), "-o", str(q), "--scheme", "int8", "-q"]) == 0
    capsys.readouterr()
    out = tmp_path / "d.safetensors"
    assert main(["dequantize", str(q), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ONNX model" in err and "DequantizeLinear" in err
    assert not out.exists()
