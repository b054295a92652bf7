"""Affine values in ONNX models (blockquant.onnx): unsigned codes with a zero point per block,
as DequantizeLinear with a zero-point tensor and as MatMulNBits with its zero_points input,
checked by onnxruntime bit for bit against blockquant's dequantize; the default scheme against
onnxruntime's own 4-bit quantizer; the float bias refused.

The model is tests/test_onnx.py's: MatMul and Gemm weights with K on either axis, a shared
weight, partial blocks, a weight on the A side.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx import (  # noqa: E402
    KAXIS,
    B,
    build,
    dequantized_by_ort,
    expected_weights,
    rel_err,
    runtime_has_opset,
    same_bits,
    session,
    weights,
)

import blockquant as bq  # noqa: E402
from blockquant.checkpoint import CheckpointError  # noqa: E402
from blockquant.cli import main  # noqa: E402
from blockquant.onnx import DEFAULT_SCHEME, inspect_model, quantize_model, report_model  # noqa: E402


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("onnx_affine") / "model.onnx"
    onnx.save_model(build(weights(np.random.default_rng(7))), str(path))
    return path


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(1).normal(0, 1, (B, 64)).astype(np.float32)


#: (scheme, the ai.onnx opset the output needs, ONNX type of codes and zero points).
QDQ_AFFINE = [
    ("u4/native/block32:f32/zero:u8", 21, "UINT4"),      # blocked (partial blocks: K = 80)
    ("int4_asym_block128", 21, "UINT4"),                 # the default: a block past every K
                                                         # here, so per axis; UINT4 is opset 21
    ("u4/native/block16:bf16/zero:u8", 21, "UINT4"),     # BF16 scales, Cast
    ("u8/native/block32:f16/zero:u8", 21, "UINT8"),
    ("u8/native/block128:f32/zero:u8", 17, "UINT8"),     # per axis (opset 13's DequantizeLinear)
    ("u4/native/tensor:f32/zero:u8", 21, "UINT4"),       # one scale and zero point
    ("u2/native/block16:f32/zero:u8", 25, "UINT2"),
]


@pytest.mark.parametrize("calibration", ["minmax", "mse"])
@pytest.mark.parametrize("scheme,opset,codes", QDQ_AFFINE, ids=[s for s, _, _ in QDQ_AFFINE])
def test_qdq_zero_points_dequantize_bit_for_bit(model_path: Path, x: np.ndarray, tmp_path: Path,
                                                scheme: str, opset: int, codes: str,
                                                calibration: str) -> None:
    if opset > 21 and not runtime_has_opset(opset):
        pytest.skip(f"onnxruntime {ort.__version__} does not run opset {opset}")
    out = tmp_path / "q.onnx"
    res = quantize_model(model_path, out, scheme, calibration=calibration)
    assert sorted(res.quantized) == sorted(KAXIS) and res.opset_after == opset
    q = onnx.load(str(out))
    onnx.checker.check_model(q, full_check=True)
    types = {t.name: TensorProto.DataType.Name(t.data_type) for t in q.graph.initializer}
    for name in KAXIS:
        dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear"
                  and n.input[0] == f"{name}_quantized")
        assert len(dq.input) == 3, name  # codes, scales, zero points
        assert types[dq.input[0]] == types[dq.input[2]] == codes, name
    model = onnx.load(str(model_path))
    exp = {}
    for t in model.graph.initializer:
        if t.name in KAXIS:  # blockquant's own dequantize, blocks along K
            k = KAXIS[t.name]
            w = np.ascontiguousarray(np.moveaxis(numpy_helper.to_array(t), k, -1))
            qt = bq.quantize(w, scheme, calibration=calibration)
            exp[t.name] = np.moveaxis(qt.dequantize(), -1, k)
            t.CopyFrom(numpy_helper.from_array(exp[t.name], t.name))
    got = dequantized_by_ort(out, list(KAXIS))
    for name in KAXIS:
        assert same_bits(got[name], exp[name]), name
    ref = session(model).run(None, {"x": x})[0]  # the float model holding those weights
    np.testing.assert_allclose(session(str(out)).run(None, {"x": x})[0], ref, rtol=1e-5,
                               atol=1e-6)


def runtime_runs_bits(bits: int) -> bool:
    """Whether the installed onnxruntime's CPU MatMulNBits takes ``bits`` with zero points."""
    k, n = 32, 2
    node = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=16)
    inits = [numpy_helper.from_array(np.zeros((n, 2, 16 * bits // 8), np.uint8), "b"),
             numpy_helper.from_array(np.ones(n * 2, np.float32), "s"),
             numpy_helper.from_array(np.zeros((n, -(-2 * bits // 8)), np.uint8), "z")]
    g = helper.make_graph([node], "probe", [helper.make_tensor_value_info("a", 1, [1, k])],
                          [helper.make_tensor_value_info("y", 1, [1, n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    try:
        session(m).run(None, {"a": np.ones((1, k), np.float32)})
    except Exception:
        return False
    return True


def kernel_weight(q: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    """The (K, N) weight a MatMulNBits node multiplies by, as onnxruntime's kernel computes
    it: the node alone (B, scales and any zero points), run on the K x K identity."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    parts = [i for i in node.input[1:4] if i]
    inits = {t.name: t for t in q.graph.initializer if t.name in parts}
    one = helper.make_node("MatMulNBits", ["i", *parts], ["o"], domain="com.microsoft", **attrs)
    k, n = attrs["K"], attrs["N"]
    g = helper.make_graph([one], "one", [helper.make_tensor_value_info("i", 1, [k, k])],
                          [helper.make_tensor_value_info("o", 1, [k, n])],
                          [inits[i] for i in parts])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return session(m).run(None, {"i": np.eye(k, dtype=np.float32)})[0]


#: (scheme, bits, whether it has zero points).
MATMULNBITS = [
    ("int4_asym_block128", 4, True),                   # the default: BF16 scales widened to f32
    ("u4/native/block32:f32/zero:u8", 4, True),        # K=80: 3 blocks, an odd count per row
    ("u4/native/block16:f16/zero:u8", 4, True),        # K=80: 5 blocks, a zero-point byte half full
    ("u8/native/block32:f32/zero:u8", 8, True),
    ("u2/native/block16:f32/zero:u8", 2, True),
    ("int8_block32", 8, False),                        # symmetric 8 bits: codes + 128
    ("q2f/native/block64:f32", 2, False),              # symmetric 2 bits: codes + 2
]


@pytest.mark.parametrize("scheme,bits,zero_points", MATMULNBITS,
                         ids=[s for s, _, _ in MATMULNBITS])
def test_matmulnbits_zero_points_match_blockquant(model_path: Path, x: np.ndarray,
                                                  tmp_path: Path, scheme: str, bits: int,
                                                  zero_points: bool) -> None:
    if bits != 4 and not runtime_runs_bits(bits):
        pytest.skip(f"onnxruntime {ort.__version__}'s MatMulNBits does not run {bits} bits")
    out = tmp_path / "q.onnx"
    res = quantize_model(model_path, out, scheme, form="matmulnbits")
    assert [w.form for w in res.weights if w.name != "wa"] == ["matmulnbits"] * 4
    q = onnx.load(str(out))
    onnx.checker.check_model(q, full_check=True)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    exp = expected_weights(model_path, scheme)
    nodes = [n for n in q.graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == 5
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["bits"] == bits
        n_blocks = -(-attrs["K"] // attrs["block_size"])
        assert inits[node.input[1]].shape == (attrs["N"], n_blocks, attrs["block_size"] * bits // 8)
        if zero_points:  # onnxruntime's packed form: (N, ceil(blocks * bits / 8)) uint8
            zp = inits[node.input[3]]
            assert zp.dtype == np.uint8 and zp.shape == (attrs["N"], -(-n_blocks * bits // 8))
        else:
            assert len(node.input) < 4 or not node.input[3]
        name = {"h1": "w1", "h2": "w2", "h3": "ws", "h4": "ws", "h5": "w5"}[node.output[0]]
        w = exp["weights"][name]
        got = kernel_weight(q, node)
        assert np.array_equal(got, w.T if KAXIS[name] == 1 else w), name
    gemm_bias = [n for n in nodes if n.output[0] == "h2"][0]
    assert gemm_bias.input[5] == "b2"  # the Gemm's bias, after zero_points and g_idx
    ref = session(exp["model"]).run(None, {"x": x})[0]
    for optimize in (False, True):
        y = session(str(out), optimize).run(None, {"x": x})[0]
        assert rel_err(y, ref) < 1e-5, optimize


def test_zero_points_are_packed_as_onnxruntime_reads_them(tmp_path: Path) -> None:
    """Hand-made codes and zero points, K = 80 in blocks of 16 (five zero points a row: the
    last byte of each row half full), read back by onnxruntime's kernel alone: the packing
    (first value in the low bits, rows padded to whole bytes) is the operator's."""
    from blockquant.onnx.lowering import pack_bits

    rng = np.random.default_rng(5)
    n, k, block = 3, 80, 16
    codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
    zp = rng.integers(0, 16, (n, k // block)).astype(np.uint8)
    scales = rng.uniform(0.5, 2, (n, k // block)).astype(np.float32)
    packed_zp = pack_bits(zp, 4)
    assert packed_zp.shape == (n, 3) and np.all(packed_zp[:, 2] >> 4 == 0)
    assert packed_zp[0, 0] == zp[0, 0] | (zp[0, 1] << 4)
    node = helper.make_node("MatMulNBits", ["a", "B", "s", "z"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block)
    inits = [numpy_helper.from_array(pack_bits(codes, 4).reshape(n, k // block, block // 2), "B"),
             numpy_helper.from_array(scales.reshape(-1), "s"),
             numpy_helper.from_array(packed_zp, "z")]
    g = helper.make_graph([node], "one", [helper.make_tensor_value_info("a", 1, [k, k])],
                          [helper.make_tensor_value_info("y", 1, [k, n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    got = session(m).run(None, {"a": np.eye(k, dtype=np.float32)})[0]
    z = np.repeat(zp, block, axis=1).astype(np.float32)
    s = np.repeat(scales, block, axis=1)
    assert np.array_equal(got, ((codes.astype(np.float32) - z) * s).T)


@pytest.mark.parametrize("form", ["qdq", "matmulnbits"])
def test_same_bytes_whatever_the_threads(model_path: Path, tmp_path: Path, form: str) -> None:
    """The weights are quantized a weight a thread, and named after, in order: the file is the
    same byte for byte on one thread or three."""
    from blockquant._threads import bounded

    outs = []
    for threads in (1, 3, 2):
        out = tmp_path / f"q{threads}.onnx"
        with bounded(threads):
            quantize_model(model_path, out, form=form)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]


def test_a_forked_child_quantizes_after_a_threaded_run(model_path: Path, tmp_path: Path) -> None:
    """The threads that quantize weights at once are kept for the process; a child forked
    after they ran does not have them and makes its own (it would hang waiting otherwise)."""
    import os
    import subprocess
    import sys
    import textwrap

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    code = textwrap.dedent(f"""
        import os, sys
        import blockquant as bq
        from blockquant.onnx import quantize_model
        bq.set_num_threads(2)
        quantize_model({str(model_path)!r}, {str(tmp_path / "parent.onnx")!r})
        pid = os.fork()
        if pid == 0:
            try:
                quantize_model({str(model_path)!r}, {str(tmp_path / "child.onnx")!r})
                code = 0
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 2)
    """)
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "child.onnx").read_bytes() == (tmp_path / "parent.onnx").read_bytes()


def test_bias_offsets_are_refused_in_one_line(model_path: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.onnx"
    for form in ("qdq", "matmulnbits"):
        with pytest.raises(CheckpointError, match="not a float bias"):
            quantize_model(model_path, out, "int4_affine_block64", form=form)
    with pytest.raises(CheckpointError, match="not a float bias"):
        report_model(model_path, "u8/native/block32:f32/bias:f32")
    # A rule's bias scheme: an error naming the weight it would have been written for.
    with pytest.raises(CheckpointError, match="w1.*not a float bias"):
        quantize_model(model_path, out, "int8", rules=["^w1$=u4/native/block32:f16/bias:f16"])
    assert main(["quantize", str(model_path), "-o", str(out), "--scheme",
                 "int4_affine_block64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a float bias" in err
    assert list(tmp_path.iterdir()) == []


def test_default_scheme_names_no_scheme(model_path: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """No scheme: the ONNX default, the affine 4-bit preset (here as the command says it);
    any other input still needs --scheme."""
    out = tmp_path / "q.onnx"
    res = quantize_model(model_path, out, form="matmulnbits")
    assert DEFAULT_SCHEME == "int4_asym_block128"
    preset = bq.presets.resolve(DEFAULT_SCHEME)
    assert {str(w.scheme) for w in res.weights} == {str(preset)}
    meta = json.loads(next(p.value for p in onnx.load(str(out)).metadata_props
                           if p.key == "blockquant"))
    assert meta["tensors"]["w1"]["calibration"] == "mse"  # the preset's own search
    assert meta["tensors"]["w1"]["type"] == "uint4 with zero points"
    out2 = tmp_path / "cli.onnx"
    assert main(["quantize", str(model_path), "-o", str(out2), "--onnx-op", "matmulnbits"]) == 0
    assert "u4/packed_u32_0/block128:bf16/zero:u8 as MatMulNBits" in capsys.readouterr().out
    assert out.read_bytes() == out2.read_bytes()
    rep = report_model(model_path)
    assert rep["scheme"] == str(preset) and rep["calibration"] == "mse"
    npy = tmp_path / "w.npy"
    np.save(npy, np.ones((4, 32), np.float32))
    assert main(["quantize", str(npy), "-o", str(tmp_path / "o.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "--scheme" in err and "is required" in err and err.count("\n") == 1


def test_float16_model_with_bf16_scales_falls_back_to_dequantizelinear(tmp_path: Path) -> None:
    """A float16 model's MatMulNBits takes float16 scales; BF16 ones (the default's) are not
    all float16 values: those weights are written as DequantizeLinear, and the summary says
    why. They still dequantize bit for bit as blockquant does."""
    w = {k: v.astype(np.float16) for k, v in weights(np.random.default_rng(3)).items()}
    src = tmp_path / "f16.onnx"
    onnx.save_model(build(w, elem=TensorProto.FLOAT16), str(src))
    out = tmp_path / "q.onnx"
    res = quantize_model(src, out, form="matmulnbits")
    assert {w.form for w in res.weights} == {"qdq"}
    assert any("BF16 scales are not all float16 values" in n for w in res.weights
               for n in w.notes)
    q = onnx.load(str(out))
    for n in KAXIS:
        q.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT16, None))
    got = session(q).run(list(KAXIS), {"x": np.zeros((B, 64), np.float16)})
    for name, g in zip(KAXIS, got):
        qt = bq.quantize(np.ascontiguousarray(np.moveaxis(w[name], KAXIS[name], -1)),
                         DEFAULT_SCHEME)
        exp = np.moveaxis(qt.dequantize(np.float16), -1, KAXIS[name])
        assert np.array_equal(g.view(np.uint16), exp.view(np.uint16)), name
    # F16 scales are a float16 model's own: MatMulNBits.
    res = quantize_model(src, tmp_path / "f16s.onnx", "u4/native/block32:f16/zero:u8",
                         form="matmulnbits")
    assert [w.form for w in res.weights if w.name != "wa"] == ["matmulnbits"] * 4


def test_report_and_inspect_count_the_zero_points(model_path: Path, tmp_path: Path) -> None:
    scheme = "u4/native/block32:f32/zero:u8"
    rep = report_model(model_path, scheme)
    rows = {r["name"]: r for r in rep["tensors"]}
    # w1: 64 x 96, K = 64 on axis 0: 2 blocks a column: codes, f32 scales, uint4 zero points.
    assert rows["w1"]["bytes_after"] == 64 * 96 // 2 + 2 * 96 * 4 + 2 * 96 // 2
    w1 = weights(np.random.default_rng(7))["w1"]
    exp = bq.quantize(np.ascontiguousarray(w1.T), scheme).dequantize().T
    sig = np.sum(w1.astype(np.float64) ** 2)
    noise = np.sum((w1 - exp).astype(np.float64) ** 2)
    assert rows["w1"]["sqnr_db"] == pytest.approx(10 * np.log10(sig / noise), rel=1e-6)
    out = tmp_path / "q.onnx"
    quantize_model(model_path, out, scheme)
    info = {r["name"]: r for r in inspect_model(out)["tensors"]}
    assert info["w1"]["bytes"] == rows["w1"]["bytes_after"]
    assert "with zero points" in info["w1"]["dtype"]


# -- beside onnxruntime's own 4-bit quantizer -----------------------------------------------

def _ort_quantizer() -> type:
    try:  # onnxruntime 1.2x's MatMulNBits quantizer imports onnx_ir
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as e:
        pytest.skip(f"onnxruntime's MatMulNBits quantizer does not import: {e}")
    return MatMulNBitsQuantizer


def heavy_tailed_model(path: Path) -> dict[str, np.ndarray]:
    """Two MatMuls with heavy-tailed weights and a few outlier columns (trained projections'
    shape), K = 256 and 320 (a partial block of 128)."""
    rng = np.random.default_rng(11)
    w = {}
    for name, (k, n) in {"a": (256, 320), "b": (320, 192)}.items():
        m = rng.standard_t(5, (k, n)) * (0.5 / np.sqrt(k))
        m[:, rng.choice(n, 2, replace=False)] *= 8
        w[name] = m.astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "a"], ["h"]),
             helper.make_node("MatMul", ["h", "b"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", 1, ["m", 256])],
                          [helper.make_tensor_value_info("y", 1, ["m", 192])],
                          [numpy_helper.from_array(v, k) for k, v in w.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return w


def _weights_by_kernel(path: Path) -> dict[str, np.ndarray]:
    """Each MatMulNBits node's weight by kernel_weight, by the MatMul output it replaced (h:
    weight a, y: weight b)."""
    q = onnx.load(str(path))
    return {{"h": "a", "y": "b"}[n.output[0]]: kernel_weight(q, n) for n in q.graph.node
            if n.op_type == "MatMulNBits"}


def _sqnr(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    sig = sum(np.sum(ref[k].astype(np.float64) ** 2) for k in ref)
    noise = sum(np.sum((ref[k].astype(np.float64) - got[k]) ** 2) for k in ref)
    return float(10 * np.log10(sig / noise))


def test_default_beats_onnxruntimes_quantizer_in_its_own_layout(tmp_path: Path) -> None:
    """onnxruntime's MatMulNBitsQuantizer with its defaults (block 128, zero points) and
    blockquant's default, both read back by onnxruntime's kernel: the same initializer shapes
    and types, and blockquant's weights closer to the float ones. blockquant's minmax range
    is onnxruntime's rule, so its weights are nearly all the same values."""
    quantizer = _ort_quantizer()
    src = tmp_path / "mlp.onnx"
    ref = heavy_tailed_model(src)
    theirs = tmp_path / "ort.onnx"
    qz = quantizer(onnx.load(str(src)), block_size=128, is_symmetric=False)
    qz.process()
    qz.model.save_model_to_file(str(theirs), False)
    ours = tmp_path / "bq.onnx"
    quantize_model(src, ours, form="matmulnbits")
    minmax = tmp_path / "bq_minmax.onnx"
    quantize_model(src, minmax, "u4/native/block128:f32/zero:u8", form="matmulnbits")

    def parts(path: Path) -> list[tuple]:
        q = onnx.load(str(path))
        inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
        # zero points: onnxruntime 1.23's quantizer writes them flat, [N · bytes a row];
        # 1.32's and blockquant's as [N, bytes a row]: the op takes either, so their sizes.
        return [(inits[n.input[1]].shape, inits[n.input[1]].dtype, inits[n.input[3]].size,
                 inits[n.input[3]].dtype, inits[n.input[2]].size)
                for n in q.graph.node if n.op_type == "MatMulNBits"]

    assert parts(ours) == parts(theirs)
    w_theirs, w_ours = _weights_by_kernel(theirs), _weights_by_kernel(ours)
    w_minmax = _weights_by_kernel(minmax)
    for name in ref:
        assert np.mean(w_minmax[name] == w_theirs[name]) > 0.99, name
    assert _sqnr(ref, w_ours) > _sqnr(ref, w_theirs) + 0.2
