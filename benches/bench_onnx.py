"""blockquant.onnx beside onnxruntime's own quantizers, on one generated model (no download).

    python benches/bench_onnx.py [--width 1024] [--repeat 3] [--threads 2]

The model: four MatMul layers, width W -> 4W -> W -> 2W -> W (W=1024: 12.6M float32 weights,
50 MB), heavy-tailed weights with a few outlier columns. Each quantizer writes a model file;
the table gives the median time of --repeat runs (load, quantize, save), the file size, the
SQNR of the weights it wrote (dequantized from the file, against the float weights) and the
cosine similarity and relative error of the model's output (onnxruntime, default graph
optimizations) against the float model's.

onnxruntime's quantizers: ``quantize_dynamic`` (int8 weights, MatMulInteger, per tensor or per
channel) and ``MatMulNBitsQuantizer`` (4-bit blocks, symmetric or with zero points).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

LAYERS = [(1, 4), (4, 1), (1, 2), (2, 1)]  # (in, out) in units of the width


def build(path: Path, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights, nodes, cur = {}, [], "x"
    for i, (a, b) in enumerate(LAYERS):
        k, n = a * width, b * width
        w = rng.standard_t(5, (k, n)) * (0.5 / np.sqrt(k))
        hot = rng.choice(n, size=max(n // 256, 1), replace=False)
        w[:, hot] *= 8.0  # outlier output channels, as trained LLM projections have
        weights[f"layer{i}.weight"] = w.astype(np.float32)
        nodes.append(helper.make_node("MatMul", [cur, f"layer{i}.weight"], [f"h{i}"]))
        cur = f"h{i}"
        if i < len(LAYERS) - 1:
            nodes.append(helper.make_node("Tanh", [cur], [f"a{i}"]))
            cur = f"a{i}"
    graph = helper.make_graph(
        nodes, "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", width])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, ["b", width])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return weights


# -- reading back the weights each model file holds -----------------------------------------

def _inits(model: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _matmul_outputs(model: Any) -> dict[str, str]:
    """The float model's MatMul output name -> its weight."""
    return {n.output[0]: n.input[1] for n in model.graph.node if n.op_type == "MatMul"}


def weights_matmulnbits(path: Path, names: dict[str, str]) -> dict[str, np.ndarray]:
    import onnx
    from onnx import helper

    model = onnx.load(str(path))
    inits = _inits(model)
    out = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        k, n, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
        packed = inits[node.input[1]]
        per = 8 // bits
        codes = np.stack([(packed >> (bits * i)) & ((1 << bits) - 1) for i in range(per)],
                         axis=-1).reshape(n, -1)
        kb = codes.shape[1] // block
        scales = inits[node.input[2]].astype(np.float32).reshape(n, kb)
        if len(node.input) > 3 and node.input[3]:
            zp = inits[node.input[3]]  # packed like B, one per block, padded to whole bytes
            zc = np.stack([(zp >> (bits * i)) & ((1 << bits) - 1) for i in range(per)],
                          axis=-1).reshape(n, -1)[:, :kb]
        else:
            zc = np.full((n, kb), 1 << (bits - 1))
        deq = (codes.reshape(n, kb, block).astype(np.float32) - zc[..., None]) * scales[..., None]
        out[names[node.output[0]]] = deq.reshape(n, -1)[:, :k].T
    return out


def weights_dynamic(path: Path, names: dict[str, str]) -> dict[str, np.ndarray]:
    import onnx

    inits = _inits(onnx.load(str(path)))
    out = {}
    for w in names.values():
        q = inits[f"{w}_quantized"].astype(np.float32)
        out[w] = (q - inits[f"{w}_zero_point"].astype(np.float32)) * inits[f"{w}_scale"]
    return out


def weights_qdq(path: Path, names: dict[str, str]) -> dict[str, np.ndarray]:
    """blockquant's QDQ form outputs each weight under its own name: onnxruntime computes it."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    for w in names.values():
        model.graph.output.append(helper.make_tensor_value_info(w, TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.zeros((1, s.get_inputs()[0].shape[1]), np.float32)
    return dict(zip(names.values(), s.run(list(names.values()), {"x": x})))


def weights_mixed(path: Path, names: dict[str, str]) -> dict[str, np.ndarray]:
    got = weights_matmulnbits(path, names)
    rest = {o: w for o, w in names.items() if w not in got}
    return {**got, **(weights_qdq(path, rest) if rest else {})}


# -- the quantizers ----------------------------------------------------------------------------

def ort_dynamic(per_channel: bool) -> Callable[[Path, Path], None]:
    def run(src: Path, dst: Path) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(src), str(dst), per_channel=per_channel,
                         weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
    return run


def ort_nbits(block: int, symmetric: bool) -> Callable[[Path, Path], None]:
    def run(src: Path, dst: Path) -> None:
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        q = MatMulNBitsQuantizer(onnx.load(str(src)), block_size=block, is_symmetric=symmetric)
        q.process()
        q.model.save_model_to_file(str(dst), False)
    return run


def blockquant(scheme: str, form: str = "qdq", **kw: Any) -> Callable[[Path, Path], None]:
    def run(src: Path, dst: Path) -> None:
        from blockquant.onnx import quantize_model

        quantize_model(src, dst, scheme, form=form, force=True, **kw)
    return run


def cases(width: int) -> list[tuple[str, str, Callable[[Path, Path], None], Any]]:
    per_channel = f"q8s/native/block{4 * width}:f32"  # a block past every K: one scale a column
    return [
        ("onnxruntime quantize_dynamic", "int8 per tensor", ort_dynamic(False), weights_dynamic),
        ("blockquant (QDQ)", "int8", blockquant("int8"), weights_qdq),
        ("onnxruntime quantize_dynamic", "int8 per channel", ort_dynamic(True), weights_dynamic),
        ("blockquant (QDQ)", per_channel, blockquant(per_channel), weights_qdq),
        ("onnxruntime MatMulNBitsQuantizer", "4-bit block32 symmetric", ort_nbits(32, True),
         weights_matmulnbits),
        ("blockquant (MatMulNBits)", "q4f/native/block32:f32",
         blockquant("q4f/native/block32:f32", "matmulnbits"), weights_matmulnbits),
        ("blockquant (MatMulNBits)", "q4f/native/block32:f32 mse",
         blockquant("q4f/native/block32:f32", "matmulnbits", calibration="mse"),
         weights_matmulnbits),
        ("onnxruntime MatMulNBitsQuantizer", "4-bit block32 + zero points",
         ort_nbits(32, False), weights_matmulnbits),
        ("onnxruntime MatMulNBitsQuantizer", "4-bit block128 symmetric", ort_nbits(128, True),
         weights_matmulnbits),
        ("blockquant (MatMulNBits)", "q4f/native/block128:f32",
         blockquant("q4f/native/block128:f32", "matmulnbits"), weights_matmulnbits),
        ("blockquant (MatMulNBits)", "q4f/native/block128:f32 mse",
         blockquant("q4f/native/block128:f32", "matmulnbits", calibration="mse"),
         weights_matmulnbits),
        ("blockquant (QDQ)", "q4f/native/block32:f32", blockquant("q4f/native/block32:f32"),
         weights_qdq),
        # 5 bits a weight as the block32 f32 rows: half the blocks, f16 scales (QDQ keeps them
        # f16 in the file; MatMulNBits needs scales of the activations' type).
        ("blockquant (QDQ)", "q4f/native/block16:f16", blockquant("q4f/native/block16:f16"),
         weights_qdq),
        ("blockquant (QDQ)", "int4_block32", blockquant("int4_block32"), weights_qdq),
        ("blockquant (QDQ)", "nvfp4", blockquant("nvfp4"), weights_qdq),
        ("blockquant (QDQ)", "mxfp4", blockquant("mxfp4"), weights_qdq),
    ]


def sqnr(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    sig = sum(float(np.sum(ref[k].astype(np.float64) ** 2)) for k in ref)
    noise = sum(float(np.sum((ref[k].astype(np.float64) - got[k]) ** 2)) for k in ref)
    return 10 * np.log10(sig / noise) if noise else float("inf")


def outputs(path: Path, x: np.ndarray, threads: int) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", help="run only the cases whose name or scheme contains this")
    args = p.parse_args(argv)
    import onnx
    import onnxruntime as ort

    import blockquant as bq

    bq.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "model.onnx"
        ref = build(src, args.width)
        names = _matmul_outputs(onnx.load(str(src)))
        x = np.random.default_rng(1).normal(0, 1, (16, args.width)).astype(np.float32)
        y_ref = outputs(src, x, args.threads)
        n = sum(w.size for w in ref.values())
        print(f"model: {len(ref)} MatMul weights, {n:,} float32 values, "
              f"{src.stat().st_size / 1e6:.1f} MB; onnxruntime {ort.__version__}, onnx "
              f"{onnx.__version__}, blockquant {bq.__version__}; {args.threads} threads, "
              f"median of {args.repeat}\n")
        rows = []
        for who, scheme, run, read in cases(args.width):
            if args.only and args.only not in who + scheme:
                continue
            dst = Path(tmp) / "q.onnx"
            times = []
            try:
                for _ in range(args.repeat):
                    for f in Path(tmp).glob("q.onnx*"):
                        f.unlink()
                    t0 = time.perf_counter()
                    run(src, dst)
                    times.append(time.perf_counter() - t0)
            except ImportError as e:  # onnxruntime >= 1.2x's MatMulNBits quantizer needs onnx_ir
                print(f"  skipped: {who} {scheme}: {e} (pip install onnx-ir)", file=sys.stderr)
                continue
            got = read(dst, names)
            y = outputs(dst, x, args.threads)
            cos = float(np.sum(y * y_ref) / (np.linalg.norm(y) * np.linalg.norm(y_ref)))
            rel = float(np.linalg.norm(y - y_ref) / np.linalg.norm(y_ref))
            size = sum(f.stat().st_size for f in Path(tmp).glob("q.onnx*"))
            rows.append([who, scheme, f"{statistics.median(times):.2f}",
                         f"{size / 1e6:.2f}", f"{8 * size / n:.2f}", f"{sqnr(ref, got):.2f}",
                         f"{cos:.6f}", f"{rel:.4f}"])
            print("  done:", who, scheme, file=sys.stderr)
    header = ["quantizer", "scheme", "time s", "file MB", "bits/weight", "weight SQNR dB",
              "output cosine", "output rel err"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(r, widths))) + " |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
