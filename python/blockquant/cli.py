"""The ``blockquant`` command (also ``python -m blockquant``): low-bit quantization of checkpoints.

    blockquant quantize IN -o OUT --scheme SCHEME   quantize a checkpoint (.safetensors/.npz/.npy)
    blockquant dequantize IN -o OUT                 back to float tensors
    blockquant inspect FILE                         per tensor: scheme, shape, bytes, bits/value
    blockquant report IN --scheme SCHEME            per tensor: SQNR, max error, sizes, time
    blockquant demo                                 every preset on built-in generated tensors

A SCHEME is a preset name (nvfp4, mxfp4, int8, ...) or its spelled-out form, such as
q4s/packed_native0/block32:f16 (see ``blockquant.presets.resolve``). A problem with the input, the
scheme or the output is one line on stderr, ``blockquant: error: FILE: TENSOR: message``, exit
code 2, and no output file.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO, get_args

import numpy as np

from . import __version__, presets
from .checkpoint import (
    FileOptions,
    dequantize_file,
    inspect_file,
    open_checkpoint,
    quantize_file,
    report_file,
)
from .errors import QuantError
from .metrics import ErrorStats
from .options import Calibration, Rounding, ScaleRounding
from .qtensor import quantize
from .scheme import QuantScheme

__all__ = ["demo_tensors", "main", "version"]


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


def _table(rows: list[Sequence[str]], header: Sequence[str], left: int = 0) -> str:
    """A Markdown table; the first ``left`` columns are left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        cells = [str(c).ljust(w) if i < left else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        return "| " + " | ".join(cells) + " |"

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


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


class ProgressBar:
    """A one-line progress bar on stderr, by bytes of input; silent unless stderr is a
    terminal (and not ``--quiet``)."""

    def __init__(self, total: int, label: str, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = not quiet and bool(isatty and isatty())
        self.total, self.label, self.done, self.count = max(total, 1), label, 0, 0
        self._last = 0.0
        self._t0 = time.perf_counter()

    def __call__(self, name: str, nbytes: int) -> None:
        self.done += nbytes
        self.count += 1
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            self._draw(name)

    def _draw(self, name: str) -> None:
        cols = shutil.get_terminal_size((80, 20)).columns
        frac = min(self.done / self.total, 1.0)
        bar_w = max(10, min(30, cols // 4))
        fill = round(frac * bar_w)
        text = (f"{self.label} [{'#' * fill}{'.' * (bar_w - fill)}] {frac:4.0%} "
                f"{self.count} tensors {time.perf_counter() - self._t0:.1f}s {name}")
        self.stream.write("\r" + text[: cols - 1].ljust(cols - 1))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            cols = shutil.get_terminal_size((80, 20)).columns
            self.stream.write("\r" + " " * (cols - 1) + "\r")
            self.stream.flush()


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _fmt_db(x: float) -> str:
    return "exact" if x == math.inf else f"{x:.2f}"


def _jsonable(x: Any) -> Any:
    """inf/NaN (not JSON) become null: an exact tensor's SQNR is null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    return x


def _scheme(text: str) -> QuantScheme:
    try:
        return presets.resolve(text)
    except QuantError as e:
        raise CliError(f"--scheme: {e}") from None


def _file_options(args: argparse.Namespace) -> FileOptions:
    """The file options, from whichever of them this command takes (an option not given is
    None: the scheme's own, else the default)."""
    return FileOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(FileOptions)
                          if hasattr(args, f.name)})


def _progress(path: str, label: str, quiet: bool) -> ProgressBar:
    """A progress bar over the bytes of the checkpoint at ``path`` (read only when shown)."""
    bar = ProgressBar(1, label, quiet)
    if bar.enabled:
        with open_checkpoint(path) as ckpt:
            bar.total = max(1, sum(t.nbytes for t in ckpt.tensors))
    return bar


def cmd_quantize(args: argparse.Namespace) -> int:
    scheme = _scheme(args.scheme)
    options = _file_options(args)
    bar = _progress(args.input, "quantize", args.quiet)
    try:
        res = quantize_file(args.input, args.output, scheme, options, progress=bar,
                            output_format=args.output_format)
    finally:
        bar.close()
    if not res.quantized:
        print(f"blockquant: warning: {args.input}: no floating-point tensor was selected; "
              "the output is a copy", file=sys.stderr)
    if not args.quiet:
        n = len(res.quantized) + len(res.copied)
        print(f"{args.output}: {len(res.quantized)} of {n} tensors quantized with {scheme}, "
              f"{_human(res.bytes_in)} -> {_human(res.bytes_out)} "
              f"({res.bytes_in / max(res.bytes_out, 1):.2f}x) in {res.seconds:.2f} s")
    return 0


def cmd_dequantize(args: argparse.Namespace) -> int:
    options = _file_options(args)
    bar = _progress(args.input, "dequantize", args.quiet)
    t0 = time.perf_counter()
    try:
        n_deq, n_copy = dequantize_file(args.input, args.output, options, progress=bar)
    finally:
        bar.close()
    if not args.quiet:
        print(f"{args.output}: {n_deq} tensors dequantized, {n_copy} copied, "
              f"in {time.perf_counter() - t0:.2f} s")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    info = inspect_file(args.file)
    if args.json:
        print(json.dumps(_jsonable(info), indent=1))
        return 0
    rows = info["tensors"]
    n_q = sum(1 for r in rows if r["scheme"] is not None)
    meta = ", ".join(f"{k}={v}" for k, v in info["metadata"].items())
    print(f"{info['file']}: {info['format']}, {len(rows)} tensors ({n_q} quantized), "
          f"{_human(info['file_bytes'])}" + (f"; metadata: {meta}" if meta else ""))

    def bits(b: float | None) -> str:
        return "-" if b is None else f"{b:.3f}"

    table = [[r["name"], r["scheme"] or "-", "x".join(map(str, r["shape"])) or "()",
              r["dtype"], _human(r["bytes"]), bits(r["bits_per_value"])] for r in rows]
    numel = sum(r["numel"] for r in rows)
    nbytes = sum(r["bytes"] for r in rows)
    table.append(["total", "", "", "", _human(nbytes),
                  bits(8.0 * nbytes / numel if numel else None)])
    print(_table(table, ["tensor", "scheme", "shape", "dtype", "bytes", "bits/value"], left=4))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    scheme = _scheme(args.scheme)
    options = _file_options(args)
    bar = _progress(args.input, "report", args.quiet)
    try:
        rep = report_file(args.input, scheme, options, progress=bar)
    finally:
        bar.close()
    if args.json:
        print(json.dumps(_jsonable(rep), indent=1))
        return 0

    def row(name: str, shape: str, r: dict[str, Any]) -> list[str]:
        ratio = f"{r['bytes_before'] / r['bytes_after']:.2f}x" if r["bytes_after"] else "-"
        return [name, shape, _fmt_db(r["sqnr_db"]), f"{r['max_abs_err']:.3g}",
                _human(r["bytes_before"]), _human(r["bytes_after"]), ratio,
                f"{r['seconds'] * 1e3:.1f}"]

    o, f = rep["overall"], rep["file_total"]
    table = [row(r["name"], "x".join(map(str, r["shape"])) or "()", r) for r in rep["tensors"]]
    table.append(row(f"overall ({o['tensors']} tensors)", f"{o['numel']:,} values", o))
    print(f"{rep['file']} with {rep['scheme']} (calibration {rep['calibration']}, rounding "
          f"{rep['rounding']}, scale rounding {rep['scale_rounding']})")
    print(_table(table, ["tensor", "shape", "SQNR dB", "max abs err", "before", "after",
                         "ratio", "ms"], left=2))
    gbs = o["bytes_before"] / o["seconds"] / 1e9 if o["seconds"] else math.inf
    print(f"\nwhole file: {_human(f['bytes_before'])} -> {_human(f['bytes_after'])} "
          f"({f['bytes_before'] / max(f['bytes_after'], 1):.2f}x), {f['unquantized']} of "
          f"{f['tensors']} tensors left as they are; quantize time {o['seconds']:.2f} s "
          f"({gbs:.2f} GB/s of input). Sizes after are values + scales, as written by quantize.")
    return 0


def _parser() -> argparse.ArgumentParser:
    paragraphs = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(
        prog="blockquant",
        description=(paragraphs[0] + "\n\n" + paragraphs[2]).replace("``", "'"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  blockquant quantize model.safetensors -o model.nvfp4.safetensors "
        "--scheme nvfp4\n  blockquant report model.safetensors --scheme mxfp4 "
        "--exclude 'LayerNorm|bias'\n\n'blockquant COMMAND --help' tells more.",
    )
    p.add_argument("--version", action="version", version=f"blockquant {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    scheme_help = ("a preset (" + ", ".join(presets.PRESETS) + ") or a spelled-out scheme such "
                   "as q4s/packed_native0/block32:f16")

    def options(c: argparse.ArgumentParser) -> None:
        c.add_argument("--scheme", required=True, help=scheme_help)
        c.add_argument("--include", metavar="REGEX",
                       help="quantize only floating tensors whose name matches (re.search)")
        c.add_argument("--exclude", metavar="REGEX",
                       help="leave tensors whose name matches as they are")
        # The choices are the option types' (which mirror the core's list).
        c.add_argument("--calibration", choices=get_args(Calibration),
                       help="block amplitude (default: the preset's, else minmax)")
        c.add_argument("--rounding", choices=get_args(Rounding),
                       help="rounding of int values (default: the preset's, else half_away)")
        c.add_argument("--scale-rounding", choices=get_args(ScaleRounding),
                       help="rounding of scales to their dtype (default: the preset's, else up: "
                       "no clipping)")
        c.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")

    q = sub.add_parser("quantize", help="quantize a checkpoint into a .safetensors or .bpk file",
                       description="Quantize each floating-point tensor of IN (.safetensors, "
                       ".npz, .npy or burn .bpk) and write OUT: .safetensors, or burn's .bpk "
                       "(by OUT's extension or --format); other tensors are copied.")
    q.add_argument("input", metavar="IN")
    q.add_argument("-o", "--output", metavar="OUT", required=True)
    q.add_argument("--format", choices=["safetensors", "burnpack"], dest="output_format",
                   help="OUT's format (default: burnpack for a .bpk name, else safetensors)")
    options(q)
    q.add_argument("-f", "--force", action="store_true", help="replace OUT if it exists")
    q.set_defaults(func=cmd_quantize)

    d = sub.add_parser("dequantize", help="turn a quantized file back into float tensors")
    d.add_argument("input", metavar="IN")
    d.add_argument("-o", "--output", metavar="OUT", required=True)
    d.add_argument("--dtype", choices=["float32", "float16", "bfloat16", "float64"],
                   help="output dtype (default: each tensor's original dtype)")
    d.add_argument("-f", "--force", action="store_true", help="replace OUT if it exists")
    d.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    d.set_defaults(func=cmd_dequantize)

    i = sub.add_parser("inspect", help="what a file holds: scheme, shape, bytes per tensor")
    i.add_argument("file", metavar="FILE")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("report", help="quantize in memory and measure: SQNR, error, size, time")
    r.add_argument("input", metavar="IN")
    options(r)
    r.add_argument("--json", action="store_true", help="print JSON (SQNR null when exact)")
    r.set_defaults(func=cmd_report)

    dm = sub.add_parser("demo", help="quantize built-in generated tensors with every preset")
    dm.add_argument("--seed", type=int, default=0)
    dm.add_argument("--scale", type=int, default=1, help="tensor size multiplier")
    dm.add_argument("--repeat", type=int, default=3, help="timing repeats (best is kept)")
    dm.set_defaults(func=demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors (2), --help (0)
        return e.code if isinstance(e.code, int) else 2
    try:
        return int(args.func(args))
    except (CliError, QuantError) as e:
        print(f"blockquant: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if isinstance(e, BrokenPipeError):  # `blockquant inspect ... | head`
            sys.stdout = None  # type: ignore[assignment]
            return 1
        where = f"{e.filename}: " if e.filename else ""
        print(f"blockquant: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nblockquant: interrupted (no output written)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
