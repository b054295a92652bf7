"""``blockquant plan``: the per-tensor schemes that give a model the least error at the size
named (``--target-bpw``), printed and written as a rules file; and ``quantize --target-bpw``,
which plans and quantizes with that plan in one command (docs/cli.md "Size targets")."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from ._cli_util import CliError, _file_options, _fmt_db, _jsonable, _path, _shape, _table
from ._fs import publish, temp_sibling
from ._text import printable
from .checkpoint.options import FileOptions, parse_rules
from .checkpoint.plans import ModelPlan, PlanRequest, plan_model


def _bpw(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected bits a weight, got {text!r}") from None
    if not 0 < v <= 64:
        raise argparse.ArgumentTypeError(f"bits a weight from 0 to 64, got {text}")
    return v


def add_target_options(c: argparse.ArgumentParser, required: bool) -> None:
    """The options of a size target, for ``plan`` and ``quantize``."""
    c.add_argument("--target-bpw", type=_bpw, required=required, metavar="BITS",
                   help="the size to plan for, in bits a weight over the tensors planned "
                   "(codes, scales and offsets; those kept in float at their size)")
    c.add_argument("--candidates", metavar="A,B,...",
                   help="the schemes each tensor may get, in the output's words: presets or "
                   "scheme texts (safetensors, burnpack), ggml types (gguf), MLX modes (mlx) "
                   "(default: about 2 to 8 bits a weight of the output's kind)")
    c.add_argument("--floor", action="append", metavar="REGEX=BITS",
                   help="the least bits a weight of the tensors REGEX matches (repeatable; "
                   "default: the output head 6, the token embeddings 4)")
    c.add_argument("--keep", action="append", metavar="REGEX",
                   help="tensors kept in float, counted at their size (repeatable)")


def add_parser(sub: Any, options: Any, jobs: Any) -> None:
    """The ``plan`` subcommand; ``options`` and ``jobs`` add the options the file commands
    share (cli.py's)."""
    p = sub.add_parser("plan", help="choose each tensor's scheme for a size: the least error "
                       "at --target-bpw bits a weight; print it, write it as a rules file")
    p.add_argument("input", metavar="IN", type=_path)
    add_target_options(p, required=True)
    p.add_argument("--format", choices=["safetensors", "burnpack", "gguf", "mlx"],
                   dest="output_format",
                   help="the output the plan is for, whose schemes are the candidates "
                   "(default: gguf for a .gguf IN, else safetensors)")
    p.add_argument("-o", "--output", metavar="RULES", type=_path,
                   help="write the plan as a rules file (quantize --rules-file takes it)")
    p.add_argument("-f", "--force", action="store_true", help="replace RULES if it exists")
    p.add_argument("--json", action="store_true", help="the plan as JSON on stdout")
    options(p, scheme="none")
    p.set_defaults(func=cmd_plan)


def request(args: argparse.Namespace, opts: FileOptions, fmt: str | None = None) -> PlanRequest:
    return PlanRequest(args.input, args.target_bpw, fmt or args.output_format, args.candidates,
                       args.floor, args.keep or (), opts)


def _summary(mp: ModelPlan) -> str:
    r = mp.result
    rows = [["plan", f"{r.bpw:.4f}", _fmt_db(r.sqnr_db),
             str(sum(c is None for c in r.choice.values()))]]
    for name, u in mp.uniform.items():
        rows.append([f"{name} alone", f"{u.bpw:.4f}", _fmt_db(u.sqnr_db),
                     str(sum(c is None for c in u.choice.values()))])
    return _table(rows, ["", "bits/weight", "SQNR dB", "in float"], left=1)


def print_plan(mp: ModelPlan, quiet: bool = False) -> None:
    r = mp.result
    if not quiet:
        rows = []
        for name, c in r.choice.items():
            m = r.measures[name]
            err = r.error_of(name)
            db = "exact" if err == 0 or c is None else \
                f"{10 * math.log10(m.signal / err):.2f}" if m.signal else "-inf"
            rows.append([printable(name), _shape(m.shape), c or f"keep ({r.why_kept[name]})"
                         if name in r.why_kept else (c or "keep"),
                         f"{r.bits_of(name) / max(m.numel, 1):.3f}", db])
        print(_table(rows, ["tensor", "shape", "scheme", "bits/weight", "SQNR dB"], left=3))
        print()
    print(printable(f"{mp.src}: {len(r.choice)} tensors planned for {mp.fmt} output at "
                    f"{r.target_bpw:g} bits a weight: {r.bpw:.4f} bits a weight, SQNR "
                    f"{_fmt_db(r.sqnr_db)} dB"))
    print(_summary(mp))


def cmd_plan(args: argparse.Namespace) -> int:
    mp = plan_model(request(args, _file_options(args)), jobs=args.jobs or 1, threads=args.threads)
    if args.output:
        write_rules(Path(args.output), mp, args.force)
    if args.json:
        r = mp.result
        out = {"src": str(mp.src), "format": mp.fmt, "target_bpw": r.target_bpw,
               "bpw": r.bpw, "sqnr_db": r.sqnr_db,
               "candidates": [c.name for c in mp.cands],
               "tensors": [{"name": n, "scheme": c, "bits": r.bits_of(n),
                            "numel": r.measures[n].numel, "error": r.error_of(n),
                            "signal": r.measures[n].signal,
                            "options": {k: {"bits": 8 * v[0], "error": v[1]}
                                        for k, v in r.measures[n].options.items()}}
                           for n, c in r.choice.items()],
               "uniform": {k: {"bpw": u.bpw, "sqnr_db": u.sqnr_db}
                           for k, u in mp.uniform.items()}}
        json.dump(_jsonable(out), sys.stdout, indent=1)
        print()
        return 0
    print_plan(mp, args.quiet)
    if args.output:
        print(printable(f"rules written to {args.output}: blockquant quantize "
                        f"{args.input} -o OUT --rules-file {args.output} ..."))
    return 0


def write_rules(path: Path, mp: ModelPlan, force: bool) -> None:
    """The rules file, whole or not at all: written beside, flushed, then put in place (an
    existing file only with ``force``)."""
    if path.is_dir():
        raise CliError(f"{path}: is a folder; the plan is written as one rules file")
    tmp = temp_sibling(path)
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(mp.rules())
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path, force=force)
    except FileExistsError:
        raise CliError(f"{path}: exists (-f replaces it)") from None
    except OSError as e:
        raise CliError(f"{path}: cannot write the rules file ({e.strerror or e})") from None
    finally:
        tmp.unlink(missing_ok=True)


def planned_quantize(args: argparse.Namespace, fmt: str) -> tuple[str, FileOptions]:
    """``quantize --target-bpw``: the plan for ``fmt`` output, as (the scheme of tensors it
    leaves: --scheme, else the candidate of most bits; the options with the plan's rules after
    any --rule given)."""
    opts = _file_options(args)
    mp = plan_model(request(args, opts, fmt), jobs=args.jobs or 1, threads=args.threads)
    if not args.quiet:
        print_plan(mp, quiet=not args.verbose)
    lines = [ln for ln in mp.rules().splitlines() if ln and not ln.startswith("#")]
    # The default: the plan's most common choice (MLX's config then lists the fewest layers).
    chosen = [c for c in mp.result.choice.values() if c is not None]
    scheme = args.scheme or (max(chosen, key=chosen.count) if chosen else mp.cands[-1].name)
    from dataclasses import replace

    return scheme, replace(opts, rules=(*opts.rules, *parse_rules(lines)))
