"""``blockquant quantize model.onnx -o model.q.onnx --scheme SCHEME``: the command's ONNX branch
(cli.py dispatches here by the .onnx extension; inspect and report reuse its printing)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._text import printable
from ..checkpoint.options import FileOptions
from ..progress import human_bytes
from .model import CheckpointError
from .quantize import quantize_model


def file_options(args: argparse.Namespace) -> FileOptions:
    return FileOptions(include=args.include, exclude=args.exclude, rules=args.rules or (),
                       min_rank=args.min_rank, calibration=args.calibration,
                       rounding=args.rounding, scale_rounding=args.scale_rounding,
                       force=getattr(args, "force", False))


def _refuse_checkpoint_options(args: argparse.Namespace) -> None:
    for flag, given in (("--format", getattr(args, "output_format", None)),
                        ("--allow-requantize", getattr(args, "allow_requantize", False)),
                        ("--strict", getattr(args, "strict", False))):
        if given:
            raise CheckpointError(flag, None, "does not apply to ONNX models")
    if not str(args.output).lower().endswith(".onnx") or \
            not str(args.input).lower().endswith(".onnx"):
        raise CheckpointError(args.output, None, "an ONNX model is quantized into an ONNX model:"
                              " name both IN and OUT .onnx")


def cmd_quantize(args: argparse.Namespace, scheme: Any, table: Any) -> int:
    """Quantize (or with --dry-run, plan) an ONNX model and print a summary."""
    _refuse_checkpoint_options(args)
    options = file_options(args)
    if args.dry_run:
        return _dry_run(args, scheme, options, table)
    res = quantize_model(args.input, args.output, scheme, form=args.onnx_op,
                         fp4=args.onnx_fp4, external_data=args.external_data or None,
                         options=options)
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


def _dry_run(args: argparse.Namespace, scheme: Any, options: FileOptions, table: Any) -> int:
    from .lowering import qdq_opset
    from .model import load, plan

    model = load(args.input)
    weights = plan(model, scheme, options, args.onnx_op, args.input)
    rows = []
    for w in weights:
        if w.scheme is None:
            action = f"keep: {w.why}"
        elif w.form == "matmulnbits":
            action = f"{w.scheme} as MatMulNBits"
        else:
            action = (f"{w.scheme} as DequantizeLinear (opset "
                      f"{qdq_opset(w.scheme, w.shape, w.kaxis, args.onnx_fp4)})")
        rows.append([printable(w.name), "x".join(map(str, w.shape)), w.onnx_type,
                     f"axis {w.kaxis}", printable(action), human_bytes(w.nbytes)])
    print(printable(f"{args.input} -> {args.output}: dry run, nothing written"))
    print(table(rows, ["weight", "shape", "dtype", "K", "action", "before"], left=5))
    return 0
