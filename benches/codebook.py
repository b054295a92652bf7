"""How blockquant's BQ4 codebook was made (``bq.codebooks.BQ4``, text ``lookup:bq4``).

    python benches/codebook.py [--iterations N] [--rows R] [--seed S]

Lloyd-Max iteration for normally distributed weights, under the scales the codebook is used
with: block 16, UE4M3 block scales under an f32 tensor scale, searched (calibration "mse") and
rounded to nearest — the ``bq4_block16`` preset. Each step quantizes the samples with the current
codebook (so each block gets the scale the search picks for that codebook), then moves every
entry to the centroid of the values assigned to it, weighted as the error is (e² in units of
the block's effective scale e, so entry k becomes Σ e·x / Σ e² over its values), and
normalizes the largest magnitude to 1. It starts from NF4, uses only synthetic normal samples (no
model's weights, so it is not fitted to the weights it is measured on), and ends with the entries
rounded to 4 decimals. Prints each step's codebook and the samples' SQNR.
"""

from __future__ import annotations

import argparse

import numpy as np

import blockquant as bq


def step(x: np.ndarray, scheme: bq.QuantScheme) -> np.ndarray:
    qt = bq.quantize(x, scheme)
    idx = qt.values.astype(np.intp)  # Native store: one index per byte
    e = (qt.scales.astype(np.float32) * np.float32(qt.global_scale)).astype(np.float64)
    e = np.repeat(e, 16, axis=-1)[..., : x.shape[-1]]
    num = np.bincount(idx.ravel(), weights=(e * x).ravel(), minlength=16)
    den = np.bincount(idx.ravel(), weights=(e * e).ravel(), minlength=16)
    cb = np.array(scheme.codebook, dtype=np.float64)
    used = den > 0
    cb[used] = num[used] / den[used]
    return cb / np.abs(cb).max()


def sqnr(x: np.ndarray, scheme: bq.QuantScheme) -> float:
    y = bq.quantize(x, scheme).dequantize()
    return float(10 * np.log10((x.astype(np.float64) ** 2).sum() / ((x - y).astype(np.float64) ** 2).sum()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    x = np.random.default_rng(args.seed).standard_normal((args.rows, 1536)).astype(np.float32)
    base = (
        bq.QuantScheme(bq.QuantValue.Q4F, bq.QuantStore.Native)
        .per_block([16], bq.ScaleDtype.UE4M3)
        .per_tensor(bq.ScaleDtype.F32)
        .with_options(calibration="mse", scale_rounding="nearest")
    )
    cb = np.asarray(bq.codebooks.NF4, dtype=np.float64)
    for i in range(args.iterations):
        scheme = base.with_codebook(cb)
        print(f"step {i}: {sqnr(x, scheme):.3f} dB", flush=True)
        cb = step(x, scheme)
    final = np.round(cb, 4)
    print(f"final: {sqnr(x, base.with_codebook(final)):.3f} dB")
    print("(" + ", ".join(f"{v:.4f}" for v in final) + ")")


if __name__ == "__main__":
    main()
