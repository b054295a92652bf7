"""``blockquant quantize model.onnx -o model.q.onnx --scheme SCHEME``: how the command prints an
ONNX run (planned and run by the front door, ``checkpoint.registry``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._text import printable
from ..progress import human_bytes


def print_summary(args: argparse.Namespace, res: Any) -> int:
    """What a quantize run of an ONNX model did, as the command prints it."""
    if not res.quantized:
        print(f"blockquant: warning: {printable(args.input)}: no weight was quantized; the "
              "output is a copy", file=sys.stderr)
    if args.quiet:
        return 0
    forms = {"qdq": "DequantizeLinear", "matmulnbits": "MatMulNBits"}
    used: dict[str, int] = {}
    for w in res.weights:
        if w.scheme is not None:
            key = f"{w.scheme} as {forms[w.form]}"
            used[key] = used.get(key, 0) + 1
    what = "; ".join(f"{k}: {v}" for k, v in used.items())
    opset = (f"opset {res.opset_before}" if res.opset_before == res.opset_after
             else f"opset {res.opset_before} -> {res.opset_after}")
    print(printable(f"{args.output}: {len(res.quantized)} of {len(res.weights)} weights "
                    f"quantized ({what}), {human_bytes(res.bytes_in)} -> "
                    f"{human_bytes(res.bytes_out)} ({res.bytes_in / max(res.bytes_out, 1):.2f}x)"
                    f", {opset}, in {res.seconds:.2f} s"))
    if res.kept:
        print(printable("kept as they are: " + ", ".join(f"{k} ({v})"
                                                         for k, v in res.kept.items())))
    for w in res.weights:
        for note in w.notes:
            print(printable(f"{w.name}: {note}"))
    for note in res.notes:
        print(printable(f"note: {note}"))
    return 0


def print_dry_run(args: argparse.Namespace, run: Any, table: Any) -> int:
    """The planned weights of an ONNX quantize run (nothing written)."""
    from .lowering import qdq_opset

    rows = []
    for w in run.weights():
        if w.scheme is None:
            action = f"keep: {w.why}"
        elif w.form == "matmulnbits":
            action = f"{w.scheme} as MatMulNBits"
        else:
            action = (f"{w.scheme} as DequantizeLinear (opset "
                      f"{qdq_opset(w.scheme, w.shape, w.kaxis, run.fp4)})")
        rows.append([printable(w.name), "x".join(map(str, w.shape)), w.onnx_type,
                     f"axis {w.kaxis}", printable(action), human_bytes(w.nbytes)])
    print(printable(f"{args.input} -> {args.output}: dry run, nothing written"))
    print(table(rows, ["weight", "shape", "dtype", "K", "action", "before"], left=5))
    return 0
