"""llama.cpp's mixes written by blockquant beside the same per-tensor types quantized by ggml's
own quantizers: SQNR over every tensor the mix quantizes (and, with an importance matrix, the
importance-weighted SQNR, ggml given the same matrix as llama-quantize gives it).

    python benches/mixes_vs_ggml.py MODEL_FOLDER --ggml libggmlq.so [--mixes Q4_K_M,...]
        [--generated-imatrix]

MODEL_FOLDER is a safetensors model with its config.json (a llama: benches write one, see
bench_plan's docstring). Each mix is written by ``blockquant quantize`` to GGUF; each of its
quantized tensors is compared with the same tensor of an F32 GGUF conversion (the values as
the file lays them out), and quantized to the same type by ggml's ``quantize_<type>``
(ggml-quants.c built as benches/ggml_stubs.c says; ``quant_weights`` NULL without a matrix, as
llama-quantize calls it, else the tensor's importance). A benchmark: nothing asserted.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_plan import generated_imatrix  # benches/bench_plan.py
from gguf import GGUFReader
from quality_gguf import ggml_quantizer  # benches/quality_gguf.py

from blockquant import gguf as bg
from blockquant.checkpoint.imatrix import read_imatrix
from blockquant.cli import main as cli


def sqnr(sig: float, err: float) -> float:
    return 10 * np.log10(sig / err)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--ggml", required=True)
    ap.add_argument("--mixes", default="Q2_K,Q3_K_S,Q3_K_M,Q3_K_L,IQ4_XS,IQ4_NL,Q4_0,Q4_1,"
                    "Q4_K_S,Q4_K_M,Q5_0,Q5_1,Q5_K_S,Q5_K_M,Q6_K,Q8_0")
    ap.add_argument("--generated-imatrix", action="store_true")
    args = ap.parse_args()
    ggml = ggml_quantizer(args.ggml)
    tmp = Path(tempfile.mkdtemp(prefix="mixes_vs_ggml_"))
    try:
        flat = tmp / "f32.gguf"
        assert cli(["quantize", str(args.model), "-o", str(flat), "-q", "--scheme", "F32"]) == 0
        ref = {t.name: np.asarray(t.data, np.float32) for t in GGUFReader(flat).tensors}
        im, imp = [], {}
        if args.generated_imatrix:
            path = generated_imatrix(args.model, tmp / "imatrix.dat")
            im, imp = ["--imatrix", path], {k: v[0] for k, v in read_imatrix(path).values.items()}
        print(f"model {args.model}" + ("; generated importance matrix: SQNR / weighted SQNR"
                                       if im else ""))
        print("| mix | bits/weight | blockquant SQNR dB | ggml SQNR dB | difference |")
        print("|---|---|---|---|---|")
        for mix in args.mixes.split(","):
            out = tmp / f"{mix}.gguf"
            assert cli(["quantize", str(args.model), "-o", str(out), "-q", "--scheme", mix,
                        *im]) == 0
            ours = [0.0, 0.0, 0.0, 0.0]  # signal, error, weighted signal, weighted error
            theirs = [0.0, 0.0, 0.0, 0.0]
            bits = n = 0
            for t in GGUFReader(out).tensors:
                qtype = t.tensor_type.name
                if qtype in ("F32", "F16", "BF16"):
                    continue
                x = ref[t.name].astype(np.float64)
                w = imp.get(t.name)
                wq = np.ones(x.shape[-1]) if w is None else w.astype(np.float64)
                y = bg.dequantize(np.asarray(t.data), qtype).reshape(x.shape)
                g = bg.dequantize(ggml(ref[t.name].reshape(-1, x.shape[-1]), qtype,
                                       w if im else None), qtype).reshape(x.shape)
                for acc, z in ((ours, y), (theirs, g)):
                    d2 = (x - z) ** 2
                    acc[0] += float(np.sum(x * x))
                    acc[1] += float(np.sum(d2))
                    acc[2] += float(np.sum(x * x * wq))
                    acc[3] += float(np.sum(d2 * wq))
                bits += 8 * np.asarray(t.data).nbytes
                n += x.size
            a, b = sqnr(ours[0], ours[1]), sqnr(theirs[0], theirs[1])
            if im:
                aw, bw = sqnr(ours[2], ours[3]), sqnr(theirs[2], theirs[3])
                print(f"| {mix} | {bits / n:.3f} | {a:.2f} / {aw:.2f} | {b:.2f} / {bw:.2f} | "
                      f"{a - b:+.2f} / {aw - bw:+.2f} |", flush=True)
            else:
                print(f"| {mix} | {bits / n:.3f} | {a:.2f} | {b:.2f} | {a - b:+.2f} |", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
