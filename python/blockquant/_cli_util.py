"""Small pieces the command-line modules share (:mod:`.cli`, :mod:`.cli_plan`): tables, counts,
argparse types and the one-line user error."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from .checkpoint import FileOptions


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def _table(rows: list[Sequence[str]], header: Sequence[str], left: int = 0,
           numbers: Sequence[int] = ()) -> str:
    """A Markdown table; the first ``left`` columns are left-aligned, the others right-aligned
    (with ``numbers`` given: only the columns of those indices)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        cells = [str(c).ljust(w) if (i not in numbers if numbers else i < left) else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        return "| " + " | ".join(cells) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *[line(r) for r in rows]])


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


def _n(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless one: "1 tensor", "3 tensors"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _path(text: str) -> str:
    """An argparse type: a file or folder name; the empty one (which Path reads as the current
    folder) a one-line usage error."""
    if not text:
        raise argparse.ArgumentTypeError("an empty name is no file or folder")
    return text


def _int_at_least(lo: int, hi: int | None = None) -> Any:
    """An argparse type: an integer in [lo, hi]; anything else a one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"from {lo} to {hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _shape(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) or "()"


def _file_options(args: argparse.Namespace) -> FileOptions:
    """The file options, from whichever of them this command takes (an option not given is
    None: the scheme's own, else the default); ``--rules-file`` lines after the ``--rule``s."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(FileOptions)
             if hasattr(args, f.name)}
    if getattr(args, "rules_file", None):
        from .checkpoint.plan_alloc import read_rules_file

        given["rules"] = [*(given.get("rules") or ()), *read_rules_file(args.rules_file)]
    return FileOptions(**given)
