"""Quality benchmark: SQNR and bits per weight of blockquant's schemes on real weights, minmax
against the searched scales of calibration "mse", and what the search costs.

    python benches/quality.py MODEL.safetensors [--pattern REGEX] [--repeat R] [--threads T]

MODEL is a safetensors file; by default the tensors named like
``encoder.layer.N.output.dense.weight`` are measured (issue 14 uses those of all-MiniLM-L6-v2).
The SQNR is over all of them together (summed signal and noise). Times are medians of `repeat`
quantize calls over all the tensors, in one process: read the ratio mse / minmax, not the
absolute numbers (the machine is shared and noisy). Needs only numpy and blockquant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import struct
import sys
import time
from typing import Callable, List, Optional, Tuple

import numpy as np

import blockquant as bq
from blockquant.metrics import ErrorStats

DEFAULT_PATTERN = r"(^|\.)encoder\.layer\.\d+\.output\.dense\.weight$"


def load_tensors(path: str, pattern: str) -> List[Tuple[str, np.ndarray]]:
    """The float32/float16 tensors of a safetensors file whose names match ``pattern``."""
    dtypes = {"F32": np.float32, "F16": np.float16}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > os.fstat(f.fileno()).st_size - 8:  # before reading that much
            raise ValueError(f"its header length {n} runs past the end of the file")
        header = json.loads(f.read(n))
        out = []
        for name, meta in sorted(header.items()):
            if name == "__metadata__" or not re.search(pattern, name):
                continue
            if meta["dtype"] not in dtypes:
                continue
            a, b = meta["data_offsets"]
            f.seek(8 + n + a)
            data = np.frombuffer(f.read(b - a), dtype=dtypes[meta["dtype"]])
            out.append((name, data.astype(np.float32).reshape(meta["shape"])))
    return out


def median_times(fns: List[Callable[[], object]], repeat: int) -> List[float]:
    """Median wall seconds of each of ``fns``, run in turn within each repetition (the machine
    is shared: interleaving puts its slow spells on both sides of a ratio alike)."""
    for fn in fns:
        fn()  # warm up
    times: List[List[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def schemes() -> List[Tuple[str, bq.QuantScheme]]:
    """Every preset, plus int4 block 32 with Q4F values (issue 14's ggml Q4_0 comparison) and
    the best 4.5-bit scheme without a codebook found so far (Q4F, UE4M3 scales per 16 under an
    f32 tensor scale, scale rounding nearest)."""
    rows = [(name, make()) for name, make in bq.presets.PRESETS.items()]
    rows.append(("q4f block32 f16", bq.QuantScheme.parse("q4f/packed_u32_0/block32:f16")))
    rows.append((
        "q4f b16 ue4m3+f32",
        bq.QuantScheme.parse("q4f/packed_u32_0/block16:ue4m3+tensor:f32")
        .with_options(scale_rounding="nearest"),
    ))
    # Codebooks (Lookup mode) at the same 4.5 bits: ggml's IQ4_NL grid beside the NF4 preset.
    rows.append((
        "iq4nl b16 ue4m3+f32",
        bq.QuantScheme.parse("q4f/packed_u32_0/block16:ue4m3+tensor:f32/lookup:iq4nl")
        .with_options(scale_rounding="nearest"),
    ))
    rows.append((
        "iq4nl b32 f16",
        bq.QuantScheme.parse("q4f/packed_u32_0/block32:f16/lookup:iq4nl")
        .with_options(scale_rounding="nearest"),
    ))
    return rows


def quality(tensors, scheme, calibration: Optional[str]):
    """(SQNR dB, bits per weight) of quantizing every tensor, and the call that does it."""
    def run():
        return [bq.quantize(x, scheme, calibration=calibration) for _, x in tensors]

    stats = ErrorStats()
    nbytes = numel = 0
    for (_, x), qt in zip(tensors, run()):
        stats = stats + ErrorStats.between(x, qt.dequantize())
        nbytes += qt.nbytes
        numel += x.size
    return stats.sqnr_db, 8.0 * nbytes / numel, run


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a .safetensors file")
    p.add_argument("--pattern", default=DEFAULT_PATTERN, help="regex of the tensor names")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="0: blockquant's default")
    args = p.parse_args(argv)
    if args.threads:
        bq.set_num_threads(args.threads)
    try:
        tensors = load_tensors(args.model, args.pattern)
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        print(f"quality.py: {args.model}: not a readable safetensors file "
              f"({getattr(e, 'strerror', None) or e})", file=sys.stderr)
        return 2
    if not tensors:
        print(f"quality.py: no float32/float16 tensor of {args.model} matches {args.pattern!r} "
              "(the default picks BERT's FFN output weights; --pattern REGEX picks others)",
              file=sys.stderr)
        return 2
    numel = sum(x.size for _, x in tensors)
    print(f"{len(tensors)} tensor{'' if len(tensors) == 1 else 's'}, {numel} values, "
          f"{bq.get_num_threads()} threads")
    head = f"{'scheme':<20} {'bits/w':>7} {'own dB':>8} {'mse dB':>8} {'own ms':>8} {'mse ms':>8} {'mse/own':>8}"
    print(head)
    print("-" * len(head))
    for name, scheme in schemes():
        own_db, bpw, own_run = quality(tensors, scheme, None)
        mse_db, _, mse_run = quality(tensors, scheme, "mse")
        own_t, mse_t = median_times([own_run, mse_run], args.repeat)
        print(
            f"{name:<20} {bpw:>7.4f} {own_db:>8.2f} {mse_db:>8.2f} "
            f"{own_t * 1e3:>8.1f} {mse_t * 1e3:>8.1f} {mse_t / own_t:>8.2f}"
        )
    print("own: the scheme's own calibration (minmax; absmean for bitnet); mse: searched scales")
    return 0


if __name__ == "__main__":
    sys.exit(main())
