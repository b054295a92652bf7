"""blockquant.onnx beside onnxruntime's own quantizers on one ONNX model: time and quality.

    python benches/bench_onnx.py [--model model.onnx | --width 544] [--repeat 7] [--threads 1,2]

The model: ``--model``, or one generated here (no download): four MatMul layers, width W ->
4W -> W -> 2W -> W (W=544: 3.55M float32 weights, 14 MB), heavy-tailed weights with a few
outlier columns, as trained projections have. Each quantizer reads the model file and writes
one; its time is the whole call (load, quantize, save), wall and CPU, the median of
``--repeat`` runs made interleaved (every case once per round, the order rotated each round,
so the machine's drifts fall on all alike). Each thread count runs in a process of its own,
held to that many CPUs (``sched_setaffinity``: onnxruntime's quantizers size their pools from
the machine, not from a setting) with blockquant's pool and OMP_NUM_THREADS set to it.

The floor: ``onnx.load`` and blockquant's core on each weight (the default scheme, a
transposed copy as the writer quantizes it), nothing written: what the issue's "within 2x of
reading the tensors and quantizing them" measures against.

Quality: the SQNR of the MatMul weights each output holds (decoded from the file: MatMulNBits
blocks, zero points and scales; DequantizeLinear subgraphs run by onnxruntime; the int8
initializers of quantize_dynamic), against the float weights; and the cosine similarity and
relative error of the model's output (onnxruntime, default optimizations) against the float
model's, on random inputs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

LAYERS = [(1, 4), (4, 1), (1, 2), (2, 1)]  # (in, out) in units of the width
DEFAULT = "int4_asym_block128"


def build(path: Path, width: int, seed: int = 0) -> None:
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


# -- the weights a model file holds ------------------------------------------------------------

def matmul_weights(model: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The float model's 2-D MatMul B initializers, and MatMul output name -> weight name."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    outs = {n.output[0]: n.input[1] for n in model.graph.node
            if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2}
    return {w: numpy_helper.to_array(inits[w]).astype(np.float32) for w in outs.values()}, outs


def _unpack(packed: np.ndarray, bits: int, rows: int) -> np.ndarray:
    per = 8 // bits
    return np.stack([(packed >> (bits * i)) & ((1 << bits) - 1) for i in range(per)],
                    axis=-1).reshape(rows, -1)


def read_weights(path: Path, names: dict[str, str], ref: dict[str, np.ndarray]
                 ) -> dict[str, np.ndarray]:
    """Each weight of ``ref`` as the quantized model at ``path`` holds it (a weight left
    unquantized: the float one)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    arr = {}

    def get(name: str) -> np.ndarray:
        if name not in arr:
            arr[name] = numpy_helper.to_array(inits[name])
        return arr[name]

    out = {}
    for node in model.graph.node:  # MatMulNBits: B, scales and zero points, decoded here
        if node.op_type != "MatMulNBits" or node.output[0] not in names:
            continue
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        k, n, bits, block = a["K"], a["N"], a["bits"], a["block_size"]
        codes = _unpack(get(node.input[1]), bits, n)
        kb = codes.shape[1] // block
        scales = get(node.input[2]).astype(np.float32).reshape(n, kb)
        if len(node.input) > 3 and node.input[3]:
            zp = _unpack(get(node.input[3]), bits, n)[:, :kb]
        else:
            zp = np.full((n, kb), 1 << (bits - 1))
        deq = (codes.reshape(n, kb, block).astype(np.float32) - zp[..., None]) * scales[..., None]
        out[names[node.output[0]]] = deq.reshape(n, -1)[:, :k].T
    produced = {o for node in model.graph.node for o in node.output}
    # blockquant's DequantizeLinear form outputs each weight under its own name: run there.
    out.update(_run_constant_subgraph(model, [w for w in ref if w not in out and w in produced]))
    for w in ref:
        if w in out:
            continue
        if w in inits:  # left as it was
            out[w] = get(w).astype(np.float32)
        else:  # quantize_dynamic: int8, its scale and zero point
            q = get(f"{w}_quantized").astype(np.float32)
            out[w] = (q - get(f"{w}_zero_point").astype(np.float32)) * get(f"{w}_scale")
    return out


def _run_constant_subgraph(model: Any, names: list[str]) -> dict[str, np.ndarray]:
    """``names`` as the nodes that make them compute them (their inputs all initializers)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if not names:
        return {}
    produced = {o: n for n in model.graph.node for o in n.output}
    keep, todo = [], list(names)
    while todo:
        n = produced.get(todo.pop())
        if n is not None and n not in keep:
            keep.append(n)
            todo.extend(n.input)
    order = [n for n in model.graph.node if n in keep]
    g = helper.make_graph(order, "weights", [], [helper.make_tensor_value_info(
        w, TensorProto.FLOAT, None) for w in names], list(model.graph.initializer))
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return {w: v.astype(np.float32) for w, v in zip(names, s.run(names, {}))}


def sqnr(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    sig = sum(float(np.sum(ref[k].astype(np.float64) ** 2)) for k in ref)
    noise = sum(float(np.sum((ref[k].astype(np.float64) - got[k]) ** 2)) for k in ref)
    return 10 * np.log10(sig / noise) if noise else float("inf")


def inputs_for(path: Path, seed: int = 1) -> dict[str, np.ndarray]:
    """Random inputs for the model's graph inputs: symbolic dimensions 16, integers 0."""
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    feed = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) else 16 for d in i.shape]
        dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16}.get(i.type)
        feed[i.name] = (rng.normal(0, 1, shape).astype(dtype) if dtype is not None
                        else np.zeros(shape, dtype=np.int64 if "int64" in i.type else np.int32))
    return feed


def outputs(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([np.asarray(o, np.float64).ravel() for o in s.run(None, feed)])


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


def blockquant(scheme: str | None, form: str = "qdq", **kw: Any) -> Callable[[Path, Path], None]:
    def run(src: Path, dst: Path) -> None:
        from blockquant.onnx import quantize_model

        quantize_model(src, dst, scheme, form=form, force=True, **kw)
    return run


def floor(scheme: str) -> Callable[[Path, Path], None]:
    """onnx.load and the core on each MatMul weight (transposed, as the writer quantizes a
    (K, N) weight), nothing written."""
    def run(src: Path, dst: Path) -> None:
        import onnx
        from onnx import numpy_helper

        import blockquant as bq

        model = onnx.load(str(src))
        inits = {t.name: t for t in model.graph.initializer}
        for n in model.graph.node:
            if n.op_type == "MatMul" and n.input[1] in inits:
                w = numpy_helper.to_array(inits[n.input[1]])
                bq.quantize(np.ascontiguousarray(w.T), scheme)
    return run


#: (who, scheme, the call from a model file to another).
Case = tuple[str, str, Callable[[Path, Path], None]]


def cases(every: bool) -> list[Case]:
    rows: list[Case] = [
        ("read + quantize, nothing written", f"{DEFAULT} (floor)", floor(DEFAULT)),
        ("onnxruntime MatMulNBitsQuantizer", "4-bit block128 + zero points (its default)",
         ort_nbits(128, False)),
        ("blockquant MatMulNBits", f"{DEFAULT} (the default)", blockquant(None, "matmulnbits")),
        ("blockquant MatMulNBits", "u4/native/block128:f32/zero:u8 minmax",
         blockquant("u4/native/block128:f32/zero:u8", "matmulnbits", calibration="minmax")),
        ("blockquant DequantizeLinear", f"{DEFAULT} (the default)", blockquant(None)),
        ("onnxruntime quantize_dynamic", "int8 per tensor", ort_dynamic(False)),
        ("blockquant DequantizeLinear", "int8", blockquant("int8")),
        ("onnxruntime quantize_dynamic", "int8 per channel", ort_dynamic(True)),
        ("blockquant DequantizeLinear", "int8_per_channel", blockquant("int8_per_channel")),
    ]
    if every:
        rows += [
            ("onnxruntime MatMulNBitsQuantizer", "4-bit block32 symmetric", ort_nbits(32, True)),
            ("blockquant MatMulNBits", "q4f/native/block32:f32",
             blockquant("q4f/native/block32:f32", "matmulnbits")),
            ("blockquant MatMulNBits", "q4f/native/block32:f32 mse",
             blockquant("q4f/native/block32:f32", "matmulnbits", calibration="mse")),
            ("onnxruntime MatMulNBitsQuantizer", "4-bit block32 + zero points",
             ort_nbits(32, False)),
            ("blockquant MatMulNBits", "u4/native/block32:f16/zero:u8 mse",
             blockquant("u4/native/block32:f16/zero:u8", "matmulnbits", calibration="mse")),
            ("blockquant DequantizeLinear", "int4_block32", blockquant("int4_block32")),
            ("blockquant DequantizeLinear", "nvfp4", blockquant("nvfp4")),
            ("blockquant DequantizeLinear", "mxfp4", blockquant("mxfp4")),
        ]
    return rows


# -- timing, in a process per thread count -----------------------------------------------------

def time_cases(src: Path, threads: int, repeat: int, every: bool, only: str | None,
               keep: Path | None) -> dict[str, Any]:
    """Each case ``repeat`` times, interleaved; wall and CPU seconds of every call. ``keep``:
    a folder for each case's last output (the quality columns read them)."""
    import onnx  # noqa: F401  (imported before timing: both sides need it, and it is slow)

    import blockquant as bq

    bq.set_num_threads(threads)
    todo = [c for c in cases(every) if not only or only in c[0] + c[1]]
    times: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(todo))}
    skipped = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeat + 1):  # round 0 warms every case up, untimed
            order = list(range(len(todo)))
            order = order[r % len(order):] + order[:r % len(order)]
            for i in order:
                if i in skipped:
                    continue
                dst = (keep if keep is not None and r == repeat else Path(tmp)) / f"case{i}.onnx"
                for f in dst.parent.glob(dst.name + "*"):
                    f.unlink()
                c0, t0 = time.process_time(), time.perf_counter()
                try:
                    todo[i][2](src, dst)
                except ImportError as e:  # onnxruntime 1.2x's MatMulNBits quantizer: onnx_ir
                    skipped[i] = f"{type(e).__name__}: {e} (pip install onnx-ir)"
                    continue
                t1, c1 = time.perf_counter(), time.process_time()
                if r:
                    times[i].append((t1 - t0, c1 - c0))
                time.sleep(0.005)  # idle pool workers settle between calls
    return {"cases": [[who, scheme] for who, scheme, _ in todo],
            "wall": [statistics.median(w for w, _ in times[i]) if times[i] else None
                     for i in range(len(todo))],
            "cpu": [statistics.median(c for _, c in times[i]) if times[i] else None
                    for i in range(len(todo))],
            "skipped": {todo[i][0] + " " + todo[i][1]: why for i, why in skipped.items()}}


def child(args: argparse.Namespace) -> int:
    threads = args.child
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[:threads])
    res = time_cases(args.src, threads, args.repeat, args.all, args.only, args.keep)
    print(json.dumps(res))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="an ONNX model (default: one generated here)")
    p.add_argument("--width", type=int, default=544)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--all", action="store_true", help="more schemes and peers")
    p.add_argument("--only", help="run only the cases whose name or scheme contains this")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--keep", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.INFO)  # onnxruntime's quantizers log a line per node
    if args.child:
        return child(args)
    import onnx
    import onnxruntime as ort

    import blockquant as bq

    with tempfile.TemporaryDirectory() as tmp:
        src = args.model if args.model is not None else Path(tmp) / "model.onnx"
        if args.model is None:
            build(src, args.width)
        ref, names = matmul_weights(onnx.load(str(src)))
        n = sum(w.size for w in ref.values())
        runs = {}
        keep = Path(tmp) / "out"
        keep.mkdir()
        for t in [int(x) for x in args.threads.split(",")]:
            cmd = [sys.executable, __file__, "--child", str(t), "--src", str(src), "--repeat",
                   str(args.repeat), "--keep", str(keep)] + (["--all"] if args.all else []) + \
                (["--only", args.only] if args.only else [])
            env = {**os.environ, "OMP_NUM_THREADS": str(t)}
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if res.returncode:
                sys.exit(f"the {t}-thread run failed:\n{res.stderr}")
            runs[t] = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"  {t} thread(s) timed", file=sys.stderr)
        first = runs[min(runs)]
        for why in first["skipped"].items():
            print(f"  skipped: {why[0]}: {why[1]}", file=sys.stderr)
        feed = inputs_for(src)
        y_ref = outputs(src, feed)
        rows = []
        for i, (who, scheme) in enumerate(first["cases"]):
            if first["wall"][i] is None:
                continue
            out = keep / f"case{i}.onnx"
            quality = ["-"] * 5
            if out.exists():
                got = read_weights(out, names, ref)
                y = outputs(out, feed)
                size = sum(f.stat().st_size for f in keep.glob(out.name + "*"))
                cos = float(y @ y_ref / (np.linalg.norm(y) * np.linalg.norm(y_ref)))
                rel = float(np.linalg.norm(y - y_ref) / np.linalg.norm(y_ref))
                quality = [f"{size / 1e6:.2f}", f"{8 * size / n:.2f}", f"{sqnr(ref, got):.2f}",
                           f"{cos:.6f}", f"{rel:.4f}"]
            timing = []
            for r in runs.values():
                base = next((r["wall"][j] for j, c in enumerate(r["cases"])
                             if "(its default)" in c[1]), None)
                ratio = f" ({r['wall'][i] / base:.1f}x)" if base else ""
                timing.append(f"{r['wall'][i]:.3f} / {r['cpu'][i]:.3f}{ratio}")
            rows.append([who, scheme, *timing, *quality])
    print(f"model: {args.model or f'generated, width {args.width}'}: {len(ref)} MatMul weights, "
          f"{n:,} float32 values; onnxruntime {ort.__version__}, onnx {onnx.__version__}, "
          f"blockquant {bq.__version__}; median of {args.repeat} interleaved runs; time = wall "
          "s / CPU s (x: wall against onnxruntime's MatMulNBits quantizer)\n")
    header = ["quantizer", "scheme", *[f"{t} thread{'s' * (t > 1)}" for t in runs], "file MB",
              "bits/weight", "weight SQNR dB", "output cosine", "output rel err"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(r, widths))) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
