"""The ``blockquant`` command (also ``python -m blockquant``): low-bit quantization of checkpoints.

    blockquant quantize IN -o OUT --scheme SCHEME   quantize a checkpoint or a model folder
    blockquant dequantize IN -o OUT                 back to float tensors
    blockquant inspect FILE                         per tensor: scheme, shape, bytes, bits/value
    blockquant report IN --scheme SCHEME            per tensor: SQNR, bits/weight, error, sizes, time
    blockquant presets                              every preset: scheme, bits/value, what it is for
    blockquant demo                                 every preset on built-in generated tensors

A SCHEME is a preset name (nvfp4, mxfp4, int8, ...; ``blockquant presets`` lists them) or a
spelled-out scheme, such as q4s/packed_u32_0/block32:f16. A problem with the input, the
scheme or the output is one line on stderr, ``blockquant: error: FILE: TENSOR: message``, exit
code 2, and no output file.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn, get_args

import numpy as np

from . import _fs, cli_gguf, cli_plan, presets
from ._cli_util import (
    CliError,
    _file_options,
    _fmt_db,
    _int_at_least,
    _jsonable,
    _n,
    _path,
    _seconds,
    _shape,
    _table,
)
from ._text import printable
from ._version import __version__
from .checkpoint.folders import OTHER_WEIGHTS, Plan
from .checkpoint.gguf_mixes import MixOptions
from .checkpoint.registry import (
    GGUFRun,
    OnnxRun,
    QuantizeRequest,
    inspect,
    output_format,
    plan_dequantize,
    plan_quantize,
    plan_report,
)
from .checkpoint.rules import dequantized_summary, kept_summary
from .errors import QuantError
from .metrics import ErrorStats
from .onnx.quantize import DEFAULT_SCHEME as ONNX_DEFAULT_SCHEME
from .options import MAX_THREADS, Calibration, QuantOptions, Rounding, ScaleRounding
from .progress import Progress, ProgressBar
from .progress import human_bytes as _human
from .qtensor import quantize
from .scheme import QuantScheme

__all__ = ["ProgressBar", "demo_tensors", "main", "version"]


def version() -> str:
    """The installed distribution's version; the package's own when run from a source tree
    that was never installed."""
    try:
        return importlib.metadata.version("blockquant")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def demo_tensors(seed: int = 0, scale: int = 1) -> dict[str, np.ndarray]:
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
        scheme = make()  # quantized with the options the preset carries
        nbytes, stats, elapsed = 0, ErrorStats(), 0.0
        for x in tensors.values():
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                qt = quantize(x, scheme)
                best = min(best, time.perf_counter() - t0)
            elapsed += best
            stats += ErrorStats.between(x, qt.dequantize())
            nbytes += qt.nbytes
        rows.append(
            [
                name,
                f"{8 * nbytes / n_total:.3f}",
                f"{stats.sqnr_db:.2f}",
                f"{stats.max_abs_err:.3g}",
                f"{in_bytes / elapsed / 1e9:.2f}",
            ]
        )
    print(_table(rows, ["scheme", "bits/value", "SQNR dB", "max abs err", "quantize GB/s"]))
    print("\nbits/value counts scales; SQNR over all tensors; GB/s of float32 input, best of "
          f"{args.repeat}.")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    rows = presets.catalog()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    defaults = dict(zip(("calibration", "rounding", "scale_rounding"), QuantOptions().resolve()))

    def options(r: dict[str, Any]) -> str:
        return ", ".join(f"{k.replace('_', ' ')} {r[k]}" for k, v in defaults.items()
                         if r[k] != v) or "-"

    print(_table([[r["name"], r["scheme"], f"{r['bits_per_value']:.3f}", options(r),
                   r["purpose"]] for r in rows],
                 ["preset", "scheme", "bits/value", "options", "for"], numbers=[2]))
    h, w = presets.CATALOG_SHAPE
    print(f"\nbits/value on a {h}x{w} tensor, scales included. A preset's options apply unless "
          "--calibration, --rounding or --scale-rounding say otherwise.")
    return 0


def _scheme(text: str) -> QuantScheme:
    try:
        return presets.resolve(text)
    except QuantError as e:
        raise CliError(f"--scheme: {e}") from None


def _progress(plan_: Plan | None, total: int, label: str, args: argparse.Namespace) -> Progress:
    """A bar over the input bytes (on a terminal, not --quiet) and with --verbose a line per
    tensor saying what happened to it."""
    what: dict[tuple[Any, str], str] = {}
    if plan_ is not None and getattr(args, "verbose", False):
        for f in plan_.files:
            for d in f.decisions:
                t = d.tensor
                if plan_.kind == "dequantize":
                    text = f"dequantized from {d.scheme}" if d.quantized else "copied"
                elif d.quantized:
                    text = (f"{_shape(t.shape)} {t.dtype_name} -> {d.scheme} "
                            f"({_human(t.nbytes)} -> {_human(d.bytes_after)})")
                else:
                    text = f"{_shape(t.shape)} {t.dtype_name} kept: {d.detail}"
                what[(f.rel if plan_.folder is not None else None, t.name)] = text
    folder = plan_ is None or plan_.folder is not None

    def describe(file: Any, name: str) -> str:
        return what.get((file, name), "done")

    bar = Progress(total, label, quiet=args.quiet, verbose=getattr(args, "verbose", False),
                   describe=describe if what else None)

    def report(file: Any, name: str, nbytes: int) -> None:
        bar(file if folder else None, name, nbytes)

    report.close = bar.close  # type: ignore[attr-defined]
    return report  # type: ignore[return-value]


def _schemes_used(decisions: Sequence[Any]) -> str:
    counts: dict[str, int] = {}
    for d in decisions:
        if d.quantized:
            counts[d.shown] = counts.get(d.shown, 0) + 1
    if len(counts) == 1:
        return f"with {next(iter(counts))}"
    return f"with {len(counts)} schemes (" + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ")"


def _dry_run(plan_: Plan) -> int:
    rows = []
    folder = plan_.folder is not None
    for f in plan_.files:
        for d in f.decisions:
            t = d.tensor
            action = d.shown if d.quantized else f"keep: {d.detail}"
            row = [printable(t.name), _shape(t.shape), t.dtype_name, printable(action),
                   _human(t.nbytes), _human(d.bytes_after)]
            rows.append([printable(f.rel), *row] if folder else row)
    header = ["tensor", "shape", "dtype", "action", "before", "after"]
    print(f"{printable(str(plan_.src))} -> {printable(str(plan_.dst))}: dry run, nothing written")
    print(_table(rows, ["file", *header] if folder else header, left=5 if folder else 4))
    decisions = [d for _, d in plan_.decisions()]
    before = sum(d.tensor.nbytes for d in decisions)
    after = sum(d.bytes_after for d in decisions)
    n_q = sum(d.quantized for d in decisions)
    print(f"\n{n_q} of {_n(len(decisions), 'tensor')} would be quantized; tensor data "
          f"{_human(before)} -> {_human(after)} ({before / max(after, 1):.2f}x)")
    for line in (kept_summary(decisions, plan_.options.min_rank), _ignore_line(plan_)):
        if line:
            print(line)
    return 0


def _ignore_line(run: Any) -> str:
    """A compressed-tensors run's ``ignore`` list: the Linear layers left in float."""
    ignore = getattr(run, "ignore", None)
    if not ignore:
        return ""
    shown = ", ".join(ignore[:8]) + (f", ... ({len(ignore)} in all)" if len(ignore) > 8 else "")
    return printable(f"ignore (Linear layers kept in float, in config.json): {shown}")


def _files_line(res: Any) -> str:
    parts = []
    if res.files > 1 or res.copied_files:
        parts.append(f"{_n(res.files, 'checkpoint file')}, "
                     f"{_n(len(res.copied_files), 'other file')} copied")
    weights = [s for s in res.skipped_files if s.lower().endswith(OTHER_WEIGHTS)]
    links = [s for s in res.skipped_files if not s.lower().endswith(OTHER_WEIGHTS)]
    for left, what, tail in ((weights, "weight file", " in other formats"),
                             (links, "linked folder", "")):
        if left:
            shown = ", ".join(left[:3]) + (", ..." if len(left) > 3 else "")
            parts.append(f"left out {_n(len(left), what)}{tail} ({shown})")
    return printable("; ".join(parts))


def _request(args: argparse.Namespace) -> QuantizeRequest:
    """The command's arguments as the front door's request; with ``--target-bpw``, the plan
    made first and its rules taken (cli_plan)."""
    scheme, opts = args.scheme, None
    if args.target_bpw is not None:
        fmt = output_format(args.input, args.output, args.output_format).name
        scheme, opts = cli_plan.planned_quantize(args, fmt)
    return QuantizeRequest(args.input, args.output, scheme, opts or _file_options(args),
                           output_format=args.output_format,
                           allow_requantize=args.allow_requantize, onnx_op=args.onnx_op,
                           onnx_fp4=args.onnx_fp4, external_data=args.external_data or None,
                           gguf=_mix_options(args))


def _mix_options(args: argparse.Namespace) -> MixOptions:
    """llama-quantize's options of a GGUF output, as given."""
    return MixOptions(args.pure, tuple(args.tensor_types or ()), args.output_tensor_type,
                      args.token_embedding_type)


def _cluster_of(args: argparse.Namespace) -> Any:
    """The dask cluster a quantize run goes to (``--scheduler``, ``--dask``), or None."""
    if args.scheduler is None and not args.dask and not args.resume \
            and args.scheduler_timeout is None:
        return None  # (dask not imported: a run without it starts as fast as before)
    from .checkpoint.cluster import cluster_from_options

    return cluster_from_options(args.scheduler, args.dask, args.jobs, args.threads,
                        args.scheduler_timeout, args.resume)


def _on_cluster(run: Any, spec: Any, bar: Any) -> Any:
    """``run`` on a dask cluster; interrupted, it says where its finished files wait."""
    from .checkpoint.cluster import run_on_cluster
    from .checkpoint.manifest import run_folder

    try:
        return run_on_cluster(run, spec, progress=bar)
    except KeyboardInterrupt:
        folder = run_folder(run.dst)
        if folder.exists():
            _say(printable(f"blockquant: the files finished so far are kept in {folder}: "
                           "--resume goes on from them"))
        raise


def cmd_quantize(args: argparse.Namespace) -> int:
    cluster = _cluster_of(args)
    run = plan_quantize(_request(args))  # the format decided and the run planned, once
    if cluster is not None and not args.dry_run:
        from .checkpoint.cluster import check_plan

        check_plan(run)
    if isinstance(run, OnnxRun):
        from .onnx.commands import print_dry_run, print_summary

        if args.dry_run:
            return print_dry_run(args, run, _table)
        return print_summary(args, run.run(threads=args.threads))
    if isinstance(run, GGUFRun):
        return cli_gguf.quantize_gguf(args, run)
    if args.dry_run:
        return _dry_run(run)
    bar = _progress(run, run.total_bytes, "quantize", args)
    try:
        if cluster is not None:
            res = _on_cluster(run, cluster, bar)
        else:
            res = run.run(jobs=args.jobs or 1, threads=args.threads, progress=bar)
    finally:
        bar.close()  # type: ignore[attr-defined]
    if not res.quantized:
        print(f"blockquant: warning: {printable(args.input)}: no tensor was quantized; "
              "the output is a copy", file=sys.stderr)
    if not args.quiet:
        n = len(res.quantized) + len(res.copied)
        used = f" {_schemes_used(res.decisions)}" if res.quantized else ""
        # Tensor data against tensor data (as the dry run), then the file(s) as written: the
        # header counts in the file, and with many small tensors it outweighs their data.
        after = sum(d.bytes_after for d in res.decisions)
        print(f"{printable(_written(run))}: {len(res.quantized)} of {_n(n, 'tensor')} "
              f"quantized{used}, tensor data {_human(res.bytes_in)} -> {_human(after)} "
              f"({res.bytes_in / max(after, 1):.2f}x), {_human(res.bytes_out)} written in "
              f"{res.seconds:.2f} s")
        for line in (kept_summary(res.decisions, run.options.min_rank),
                     dequantized_summary(res.decisions), _files_line(res), _ignore_line(run)):
            if line:
                print(line)
        if getattr(res, "resumed_files", None):
            print(f"resumed: {_n(len(res.resumed_files), 'file')} of {res.files} found "
                  "finished (size and SHA-256 as recorded) and kept")
        if args.verbose:
            print(_stats_line(res.stats))
    return 0


def _stats_line(stats: Any) -> str:
    peak = max(stats.peak_rss, default=0)
    return (f"{stats.jobs} job{'s' if stats.jobs > 1 else ''} x {stats.threads_per_job} "
            f"threads, peak memory {_human(peak)} per job, {stats.seconds:.2f} s")


def cmd_dequantize(args: argparse.Namespace) -> int:
    options = _file_options(args)
    plan_ = plan_dequantize(args.input, args.output, options)
    bar = _progress(plan_, plan_.total_bytes, "dequantize", args)
    try:
        res = plan_.run(jobs=args.jobs or 1, threads=args.threads, progress=bar)
    finally:
        bar.close()  # type: ignore[attr-defined]
    if not args.quiet:
        print(f"{printable(_written(plan_))}: {_n(res.dequantized, 'tensor')} dequantized, "
              f"{res.copied} copied, in {res.seconds:.2f} s")
        line = _files_line(res)
        if line:
            print(line)
        if args.verbose:
            print(_stats_line(res.stats))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    info = inspect(args.file)
    if args.json:
        print(json.dumps(_jsonable(info), indent=1))  # ensure_ascii: every name escaped
        return 0
    rows = info["tensors"]
    n_q = sum(1 for r in rows if r["scheme"] is not None)
    meta = ", ".join(f"{k}={v}" for k, v in info["metadata"].items())
    what = info["format"]
    if what == "folder":
        what = f"folder of {_n(len(info['files']), 'checkpoint file')}"
    print(printable(f"{info['file']}: {what}, {_n(len(rows), 'tensor')} ({n_q} quantized), "
                    f"{_human(info['file_bytes'])}" + (f"; metadata: {meta}" if meta else "")))

    def bits(b: float | None) -> str:
        return "-" if b is None else f"{b:.3f}"

    table = [[printable(r["name"]), r["scheme"] or "-", _shape(r["shape"]),
              r["dtype"], _human(r["bytes"]), bits(r["bits_per_value"])] for r in rows]
    numel = sum(r["numel"] for r in rows)
    nbytes = sum(r["bytes"] for r in rows)
    table.append(["total", "", "", "", _human(nbytes),
                  bits(8.0 * nbytes / numel if numel else None)])
    print(_table(table, ["tensor", "scheme", "shape", "dtype", "bytes", "bits/value"], left=4))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    options = _file_options(args)
    run = plan_report(args.input, args.scheme, options, _mix_options(args))
    bar = _progress(None, run.total_bytes, "report", args)
    try:
        rep = run.run(jobs=args.jobs or 1, threads=args.threads, progress=bar)
    finally:
        bar.close()  # type: ignore[attr-defined]
    if args.json:
        print(json.dumps(_jsonable(rep), indent=1))
        return 0

    o, f = rep["overall"], rep["file_total"]
    weighted = "sqnr_imatrix_db" in o

    def row(name: str, shape: str, r: dict[str, Any]) -> list[str]:
        ratio = f"{r['bytes_before'] / r['bytes_after']:.2f}x" if r["bytes_after"] else "-"
        bpw = r.get("bits_per_weight", math.inf)
        w = r.get("sqnr_imatrix_db")
        return [printable(name), shape, _fmt_db(r["sqnr_db"]),
                *([_fmt_db(w) if w is not None else "-"] if weighted else []),
                f"{bpw:.4g}" if math.isfinite(bpw) else "-", f"{r['max_abs_err']:.3g}",
                _human(r["bytes_before"]), _human(r["bytes_after"]), ratio,
                f"{r['seconds'] * 1e3:.1f}"]

    table = [row(r["name"], _shape(r["shape"]), r) for r in rep["tensors"]]
    table.append(row(f"overall ({_n(o['tensors'], 'tensor')})", f"{o['numel']:,} values", o))
    how = ("ggml's types, chosen per tensor as llama-quantize does" if rep.get("format") == "gguf" else
           f"calibration {rep['calibration']}, rounding {rep['rounding']}, scale rounding "
           f"{rep['scale_rounding']}")
    print(printable(f"{rep['file']} with {rep['scheme']} ({how})"))
    print(_table(table, ["tensor", "shape", "SQNR dB", *(["SQNR imatrix"] if weighted else []),
                         "bits/w", "max abs err", "before", "after", "ratio", "ms"], left=2))
    gbs = o["bytes_before"] / o["seconds"] / 1e9 if o["seconds"] else math.inf
    print(f"\nwhole file: {_human(f['bytes_before'])} -> {_human(f['bytes_after'])} "
          f"({f['bytes_before'] / max(f['bytes_after'], 1):.2f}x), {f['unquantized']} of "
          f"{f['tensors']} tensors left as they are; quantize time {o['seconds']:.2f} s "
          f"({gbs:.2f} GB/s of input). Sizes after are values + scales, as written by quantize.")
    return 0


def _written(plan_: Any) -> str:
    """Where a run's output went: the file itself when one file was written into a folder
    (``-o outdir/``), else OUT as given."""
    if plan_.into_folder and plan_.folder is None:
        return str(plan_.dst / plan_.files[0].rel)
    return str(plan_.dst)


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors as the command's other errors: one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog[len("blockquant"):].strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"blockquant: error: {where}{printable(message)} "
                     f"(see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    paragraphs = (__doc__ or "").split("\n\n")
    p = _Parser(
        prog="blockquant",
        description=(paragraphs[0] + "\n\n" + paragraphs[2]).replace("``", "'"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  blockquant quantize model.safetensors -o model.nvfp4.safetensors "
        "--scheme nvfp4\n  blockquant report model.safetensors --scheme mxfp4 "
        "--exclude 'LayerNorm|bias'\n\n'blockquant COMMAND --help' tells more.",
    )
    p.add_argument("--version", action="version", version=f"blockquant {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    scheme_help = ("a preset (" + ", ".join(presets.PRESETS) + "; 'blockquant presets' says "
                   "what each is) or a spelled-out scheme such as q4s/packed_u32_0/block32:f16 "
                   "(4-bit codes, 8 to a uint32 word)")

    def options(c: argparse.ArgumentParser, scheme: str = "required") -> None:
        # --scheme is required but for an ONNX model (a default) and with --target-bpw (a
        # plan): the front door says so.
        if scheme != "none":
            c.add_argument("--scheme", help=f"{scheme_help}; an ONNX model's default: "
                           f"{ONNX_DEFAULT_SCHEME}" + (
                               "; with --target-bpw, the scheme of tensors the plan leaves to "
                               "it (default: the plan's most common)" if scheme == "optional"
                               else ""))
        c.add_argument("--include", metavar="REGEX",
                       help="quantize only floating tensors whose name matches (re.search)")
        c.add_argument("--exclude", metavar="REGEX",
                       help="leave tensors whose name matches as they are")
        # The choices are the option types' (which mirror the core's list).
        c.add_argument("--calibration", choices=get_args(Calibration),
                       help="how a block's scale is chosen: from its max |x| (minmax), its mean "
                       "|x| (absmean), or mse: the least squared error among scales putting max "
                       "|x| at 62/64..66/64 of half the value range (8-bit values), 27/32..37/32 "
                       "(4-bit), 1..3 times (2-bit), or minmax's UE8M0 scale, half or twice it; "
                       "a warning says where that range cannot help (default: the preset's, "
                       "else minmax)")
        c.add_argument("--rounding", choices=get_args(Rounding),
                       help="rounding of int values (default: the preset's, else half_away)")
        c.add_argument("--scale-rounding", choices=get_args(ScaleRounding),
                       help="rounding of scales to their dtype (default: the preset's, else up: "
                       "no clipping)")
        c.add_argument("--rule", action="append", dest="rules", metavar="REGEX=SCHEME[@N]",
                       help="the scheme of the tensors whose name matches REGEX (re.search), "
                       "instead of --scheme, for those of rank >= --min-rank, or >= N with "
                       "@N ('\\.bias$=int8@1'); SCHEME may be 'keep' (whatever the rank); "
                       "repeatable, the first matching rule wins")
        c.add_argument("--rules-file", metavar="FILE", type=_path,
                       help="--rule lines from FILE, one a line ('#' comments), after those "
                       "given here (blockquant plan -o writes one)")
        c.add_argument("--min-rank", type=_int_at_least(0), default=2, metavar="N",
                       help="keep tensors of rank below N, also those a --rule matches unless "
                       "it says @N (default 2: 1-D norms and biases stay as they are)")
        c.add_argument("--strict", action="store_true",
                       help="a tensor its scheme cannot take is an error (default: kept, and "
                       "counted in the summary)")
        c.add_argument("--imatrix", metavar="FILE",
                       help="llama.cpp's importance matrix (imatrix.gguf or the legacy .dat): "
                       "report weighs each tensor's error by it, --calibration mse minimizes the "
                       "weighted error")
        g = c.add_argument_group("GGUF output (llama-quantize's options)")
        g.add_argument("--pure", action="store_true",
                       help="one type for every tensor: --scheme's file type's default type, "
                       "no per-tensor mix (rows that are not whole blocks still fall back)")
        g.add_argument("--tensor-type", action="append", dest="tensor_types",
                       metavar="TENSOR=TYPE",
                       help="the ggml type of the tensors whose name matches TENSOR (a regular "
                       "expression, lowercased); after --rule lines, the first match wins")
        g.add_argument("--output-tensor-type", metavar="TYPE",
                       help="the ggml type of output.weight (and of tied token embeddings)")
        g.add_argument("--token-embedding-type", metavar="TYPE",
                       help="the ggml type of token_embd.weight")
        jobs(c)
        c.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")

    def jobs(c: argparse.ArgumentParser) -> None:
        c.add_argument("-j", "--jobs", type=_int_at_least(1), metavar="N",
                       help="files of a model folder converted at once, in N processes "
                       "(default 1; with --dask, the local cluster's worker processes)")
        c.add_argument("--threads", type=_int_at_least(1, MAX_THREADS), metavar="N",
                       help="kernel threads in all, shared between the jobs (default: every "
                       "core, or BLOCKQUANT_NUM_THREADS)")
        c.add_argument("-v", "--verbose", action="store_true",
                       help="a line per tensor on stderr: what happened to it")

    q = sub.add_parser("quantize", help="quantize a checkpoint or a model folder",
                       description="Quantize each floating-point tensor of rank >= 2 of IN "
                       "(.safetensors, .npz, .npy or burn .bpk) and write OUT: .safetensors, "
                       "or burn's .bpk (by OUT's extension or --format); other tensors are "
                       "copied. IN may be a model folder (one model.safetensors, or shards "
                       "and model.safetensors.index.json): OUT is then a folder of the same "
                       "shape. An OUT ending in / is a folder. A .gguf OUT is "
                       "written as llama-quantize writes one, from a GGUF IN or a safetensors "
                       "file or model folder, --scheme naming one of llama.cpp's file types "
                       "(Q4_K_M, Q5_K_S, Q3_K_L, IQ4_XS, Q8_0, ...: a mix of ggml types per "
                       "tensor) or, with --pure, one type for all (q4_0, q6_k, mxfp4, ...). An ONNX IN "
                       "(.onnx) gets its MatMul/Gemm weights quantized into an ONNX OUT "
                       "(--onnx-op).")
    q.add_argument("input", metavar="IN", type=_path)
    q.add_argument("-o", "--output", metavar="OUT", required=True, type=_path,
                   help="the file or folder to write")
    q.add_argument("-n", "--dry-run", action="store_true",
                   help="list what would happen to each tensor and the sizes; write nothing")
    q.add_argument("--format", choices=["safetensors", "burnpack", "compressed-tensors", "mlx"],
                   dest="output_format",
                   help="OUT's format (default: burnpack for a .bpk name, else safetensors); "
                   "compressed-tensors writes a model folder vLLM and transformers load, with "
                   "--scheme one of its schemes (W4A16, W8A16, W4A16_ASYM, FP8_DYNAMIC, "
                   "FP8_BLOCK, NVFP4A16, MXFP4A16, MXFP8A16...; docs/compressed-tensors.md); "
                   "mlx a model folder mlx-lm loads, with --scheme an MLX mode (affine4, "
                   "affine3:g32, affine8:g128, mxfp4, mxfp8, nvfp4; docs/mlx.md)")
    options(q, scheme="optional")
    cli_plan.add_target_options(q, required=False)
    q.add_argument("-f", "--force", action="store_true", help="replace OUT if it exists")
    q.add_argument("--scheduler", metavar="ADDRESS",
                   help="run a model folder's files on the dask cluster of this scheduler "
                   "(tcp://host:8786), one task each; its workers must see IN and OUT's folder "
                   "at the same paths (docs/dask.md)")
    q.add_argument("--dask", action="store_true",
                   help="the same on a dask LocalCluster of --jobs worker processes here")
    q.add_argument("--resume", action="store_true",
                   help="go on from an interrupted --scheduler/--dask run: files its manifest "
                   "vouches for (same input and options, same size and SHA-256) are kept")
    q.add_argument("--scheduler-timeout", type=_seconds, metavar="SECONDS",
                   help="how long to wait for the scheduler to answer (default 10)")
    q.add_argument("--allow-requantize", action="store_true",
                   help="GGUF: quantize tensors already of another quantized type (dequantized "
                   "first), as llama-quantize --allow-requantize")
    q.add_argument("--onnx-op", choices=["qdq", "matmulnbits"], default="qdq",
                   help="ONNX: DequantizeLinear before each MatMul/Gemm (default), or "
                   "onnxruntime's MatMulNBits (4-bit blocked schemes)")
    q.add_argument("--onnx-fp4", choices=["lookup", "dq"], default="lookup",
                   help="ONNX: E2M1 as INT4 bits decoded by a Gather table, which onnxruntime "
                   "runs (default), or the opset-23 FLOAT4E2M1 DequantizeLinear")
    q.add_argument("--external-data", action="store_true",
                   help="ONNX: tensors in OUT.data beside OUT (default: only past 1.8 GB)")
    q.set_defaults(func=cmd_quantize)

    d = sub.add_parser("dequantize", help="turn a quantized file back into float tensors")
    d.add_argument("input", metavar="IN", type=_path)
    d.add_argument("-o", "--output", metavar="OUT", required=True, type=_path)
    d.add_argument("--dtype", choices=["float32", "float16", "bfloat16", "float64"],
                   help="output dtype (default: each tensor's original dtype)")
    d.add_argument("-f", "--force", action="store_true", help="replace OUT if it exists")
    jobs(d)
    d.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    d.set_defaults(func=cmd_dequantize)

    i = sub.add_parser("inspect", help="what a file holds: scheme, shape, bytes per tensor")
    i.add_argument("file", metavar="FILE", type=_path)
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("report", help="quantize in memory and measure: SQNR, bits/weight, error, size, time")
    r.add_argument("input", metavar="IN", type=_path)
    options(r)
    r.add_argument("--json", action="store_true", help="print JSON (SQNR null when exact)")
    r.set_defaults(func=cmd_report)

    cli_plan.add_parser(sub, options, jobs)

    ps = sub.add_parser("presets", help="list every preset: its scheme, bits per value, the "
                        "options it carries and what it is for")
    ps.add_argument("--json", action="store_true", help="print JSON: a list of presets")
    ps.set_defaults(func=cmd_presets)

    dm = sub.add_parser("demo", help="quantize built-in generated tensors with every preset")
    dm.add_argument("--seed", type=_int_at_least(0), default=0)
    # 16 already generates about 2 GiB of float32 tensors.
    dm.add_argument("--scale", type=_int_at_least(1, 16), default=1,
                    help="tensor size multiplier, 1 to 16")
    dm.add_argument("--repeat", type=_int_at_least(1), default=3,
                    help="timing repeats (best is kept)")
    dm.set_defaults(func=demo)
    return p


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a closed terminal), raised where the program is so that every writer
    cleans up as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated(signum)


#: Signals that end the command as Ctrl-C does: the output left unwritten, the workers ended.
_ENDING_SIGNALS = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse: usage errors (2), --help (0)
        return e.code if isinstance(e.code, int) else 2
    except KeyboardInterrupt:  # Ctrl-C while the arguments are read: nothing started yet
        _say("\nblockquant: interrupted")
        return 130
    try:  # a name that is not printable where stdout's encoding stops is escaped, not fatal
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        pass
    done = _fs.published_mark()  # outputs of earlier calls in this process are not this run's
    previous = {}
    try:
        for sig in _ENDING_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:  # under nohup SIGHUP stays ignored
                previous[sig] = signal.signal(sig, _on_sigterm)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # each once, even where the caller said "always"
            warnings.showwarning = _warning_line
            return int(args.func(args))
    except (CliError, QuantError) as e:
        return _error(str(e))
    except OSError as e:
        if isinstance(e, BrokenPipeError):  # `blockquant inspect ... | head`
            sys.stdout = None  # type: ignore[assignment]
            return 1
        where = f"{e.filename}: " if e.filename else ""
        return _error(f"{where}{e.strerror or e}")
    except MemoryError as e:
        return _error(f"{_input(args)}out of memory" + (f" ({e})" if str(e) else ""))
    except (OverflowError, RecursionError, UnicodeError) as e:
        # Each known case is a CheckpointError already; this keeps the one-line promise for
        # one not found yet.
        return _error(f"{_input(args)}{type(e).__name__}: {e}")
    except _Terminated as e:
        _say(f"\nblockquant: terminated ({_what_was_written(done)})")
        return 128 + e.signum
    except KeyboardInterrupt:
        _say(f"\nblockquant: interrupted ({_what_was_written(done)})")
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _what_was_written(done: int) -> str:
    """What a run ended by a signal left: nothing, or the outputs it had already put in place
    (the signal came after the last rename)."""
    # A file put into a folder output's temporary folder was published there, but the folder
    # is the output: once renamed (or removed), that path is gone.
    written = [p for p in _fs.published_since(done) if os.path.lexists(p)]
    if not written:
        return "no output written"
    return printable(f"{', '.join(map(str, written))} had been written")


def _warning_line(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                  line: Any = None) -> None:
    """A warning (``mse`` on a scheme it cannot help, say) as the command's other lines: one
    line on stderr, the run going on."""
    _say(f"blockquant: warning: {printable(str(message))}")


def _error(message: str) -> int:
    """The one line of a user error (escaped: a crafted name cannot break it), exit code 2."""
    _say(f"blockquant: error: {printable(message)}")
    return 2


def _say(line: str) -> None:
    """``line`` on stderr, if there is one still: after a hangup (a closed terminal) writing
    fails with EIO, and the exit code is then all that is said."""
    try:
        print(line, file=sys.stderr)
    except OSError:
        pass


def _input(args: argparse.Namespace) -> str:
    path = getattr(args, "input", None) or getattr(args, "file", None)
    return f"{path}: " if path else ""


if __name__ == "__main__":
    sys.exit(main())
