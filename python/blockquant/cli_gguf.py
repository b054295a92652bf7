"""``blockquant quantize`` into a .gguf OUT: what it prints (the dry run's table, the summary
of each tensor's type under llama-quantize's mix)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ._cli_util import _n, _shape, _table
from ._text import printable
from .checkpoint.registry import GGUFRun
from .progress import Progress
from .progress import human_bytes as _human


def quantize_gguf(args: argparse.Namespace, run: GGUFRun) -> int:
    """A .gguf OUT: llama-quantize's mix (or one type with --pure) per tensor."""
    from .checkpoint.gguf_file import KEPT_WORDS
    from .checkpoint.gguf_file import kept_summary as gguf_kept

    decisions, target = run.decisions, run.target
    if args.dry_run:
        rows = [[printable(d.tensor.name), _shape(d.tensor.shape), d.tensor.dtype_name,
                 d.new_type if d.quantized else f"keep: {KEPT_WORDS[d.why]}",
                 printable(d.how) or "-", _human(d.tensor.nbytes),
                 _human(d.bytes_after)] for d in decisions]
        print(printable(f"{args.input} -> {args.output}: dry run, nothing written ({target}, "
                        f"general.file_type {run.mix.ftype.id})"))
        print(_table(rows, ["tensor", "shape", "type", "action", "why", "before", "after"],
                     left=5))
        before = sum(d.tensor.nbytes for d in decisions)
        after = sum(d.bytes_after for d in decisions)
        numel = sum(d.tensor.numel for d in decisions)
        print(f"\n{_gguf_types(decisions)}; tensor data {_human(before)} -> {_human(after)} "
              f"({before / max(after, 1):.2f}x, {8 * after / max(numel, 1):.3f} bits/value)")
        for line in (gguf_kept(decisions, target, run.options.min_rank), _left_out(run)):
            if line:
                print(printable(line))
        return 0
    what = {d.tensor.name: (f"{d.tensor.dtype_name} -> {d.new_type}" if d.quantized
                            else f"{d.tensor.dtype_name} kept: {KEPT_WORDS[d.why]}")
            for d in decisions}
    bar = Progress(run.total_bytes, "quantize", quiet=args.quiet,
                   verbose=args.verbose, describe=lambda file, name: what.get(name, "done"))
    try:
        res = run.run(threads=args.threads, progress=lambda name, n: bar(None, name, n))
    finally:
        bar.close()
    if not args.quiet:
        print(printable(f"{args.output}: {target} (general.file_type {run.mix.ftype.id}), "
                        f"{_gguf_types(res.decisions)}; {_human(res.bytes_in)} of tensor data "
                        f"-> {_human(res.bytes_out)} file "
                        f"({res.bytes_in / max(res.bytes_out, 1):.2f}x) in {res.seconds:.2f} s"))
        for line in (gguf_kept(res.decisions, target, run.options.min_rank), _left_out(run)):
            if line:
                print(printable(line))
    return 0


def _left_out(run: GGUFRun) -> str:
    """The tensors a conversion to GGUF left out: those its architecture has no name for."""
    left = run.convert.left_out if run.convert is not None else []
    if not left:
        return ""
    shown = ", ".join(left[:4]) + (", ..." if len(left) > 4 else "")
    return (f"left out {_n(len(left), 'tensor')} llama.cpp's {run.convert.arch} has no GGUF "
            f"name for (as convert_hf_to_gguf.py): {shown}")


def _gguf_types(decisions: Sequence[Any]) -> str:
    """How many tensors each type got: ``37 of 39 tensors quantized (Q4_K: 20, Q6_K: 17)``."""
    counts: dict[str, int] = {}
    for d in decisions:
        if d.quantized:
            counts[d.new_type] = counts.get(d.new_type, 0) + 1
    n = sum(counts.values())
    types = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    return f"{n} of {_n(len(decisions), 'tensor')} quantized" + (f" ({types})" if types else "")
