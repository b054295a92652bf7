"""The ``blockquant`` command (also ``python -m blockquant``).

``blockquant demo`` quantizes a built-in set of generated, weight-like tensors with every preset
and prints a table: scheme, bits per value (scales included), SQNR, max abs error, throughput.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from . import presets
from .qtensor import quantize

__all__ = ["main", "demo_tensors", "sqnr_db"]


def demo_tensors(seed: int = 0, scale: int = 1) -> Dict[str, np.ndarray]:
    """Weight-like float32 tensors, generated (no download): Gaussian projections, heavy-tailed
    MLP weights, an embedding table, a norm vector, and a matrix with rare large outliers."""
    rng = np.random.default_rng(seed)
    d = 512 * scale
    out = {
        "attn.q_proj": rng.normal(0.0, 0.02, (d, d)),
        "mlp.up_proj": rng.standard_t(4, (d, 4 * d)) * 0.015,
        "embed_tokens": rng.normal(0.0, 0.05, (4 * d, d // 2)),
        "norm.weight": 1.0 + rng.normal(0.0, 0.1, (d,)),
    }
    w = rng.normal(0.0, 0.02, (d, 2 * d))
    hot = rng.choice(w.size, size=w.size // 1000, replace=False)
    w.flat[hot] *= 60.0  # outlier features, as in LLM activations/weights
    out["mlp.down_proj_outliers"] = w
    return {k: v.astype(np.float32) for k, v in out.items()}


def sqnr_db(x: np.ndarray, y: np.ndarray) -> float:
    """Signal to quantization-noise ratio in dB (inf when exact)."""
    x64 = x.astype(np.float64)
    noise = float(np.sum((x64 - y.astype(np.float64)) ** 2))
    signal = float(np.sum(x64**2))
    if noise == 0.0:
        return float("inf")
    return 10.0 * np.log10(signal / noise)


def _table(rows: List[Sequence[str]], header: Sequence[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).rjust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *[line(r) for r in rows]])


def demo(args: argparse.Namespace) -> int:
    tensors = demo_tensors(seed=args.seed, scale=args.scale)
    n_total = sum(t.size for t in tensors.values())
    in_bytes = sum(t.nbytes for t in tensors.values())
    print(
        f"blockquant demo: {len(tensors)} generated weight-like tensors, "
        f"{n_total:,} float32 values ({in_bytes / 2**20:.1f} MiB)\n"
    )
    rows = []
    for name, make in presets.PRESETS.items():
        scheme = make()
        cal = presets.CALIBRATION[name]
        nbytes, signal, noise, max_err, elapsed = 0, 0.0, 0.0, 0.0, 0.0
        for x in tensors.values():
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                qt = quantize(x, scheme, calibration=cal)
                best = min(best, time.perf_counter() - t0)
            elapsed += best
            y = qt.dequantize()
            d = x.astype(np.float64) - y
            signal += float(np.sum(x.astype(np.float64) ** 2))
            noise += float(np.sum(d * d))
            max_err = max(max_err, float(np.max(np.abs(d))))
            nbytes += qt.nbytes
        sqnr = float("inf") if noise == 0 else 10 * np.log10(signal / noise)
        rows.append(
            [
                name,
                f"{8 * nbytes / n_total:.3f}",
                f"{sqnr:.2f}",
                f"{max_err:.3g}",
                f"{in_bytes / elapsed / 1e9:.2f}",
            ]
        )
    print(_table(rows, ["scheme", "bits/value", "SQNR dB", "max abs err", "quantize GB/s"]))
    print("\nbits/value counts scales; SQNR over all tensors; GB/s of float32 input, best of "
          f"{args.repeat}.")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="blockquant", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="quantize built-in generated tensors with every preset")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--scale", type=int, default=1, help="tensor size multiplier")
    d.add_argument("--repeat", type=int, default=3, help="timing repeats (best is kept)")
    d.set_defaults(func=demo)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
