"""Progress of the file commands on stderr: a bar with an ETA when stderr is a terminal, a line
per tensor when asked (``--verbose``), and nothing at all on a pipe otherwise.

The bar is tqdm's when tqdm is installed (``pip install 'blockquant[progress]'``), else
:class:`ProgressBar`, a one-line bar of its own. Both count bytes of input.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from ._text import printable

__all__ = ["ProgressBar", "TensorProgress", "human_bytes"]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _isatty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _eta(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class ProgressBar:
    """A one-line progress bar on stderr, by bytes of input, with the time left; silent unless
    stderr is a terminal (and not ``--quiet``)."""

    def __init__(self, total: int, label: str, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and _isatty(self.stream)
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
        elapsed = time.perf_counter() - self._t0
        eta = f"ETA {_eta(elapsed * (1 - frac) / frac)}" if 0 < frac < 1 else _eta(elapsed)
        text = (f"{self.label} [{'#' * fill}{'.' * (bar_w - fill)}] {frac:4.0%} "
                f"{self.count} tensors {eta} {printable(name)}")
        self.stream.write("\r" + text[: cols - 1].ljust(cols - 1))
        self.stream.flush()

    def write(self, line: str) -> None:
        """A line above the bar."""
        if self.enabled:
            cols = shutil.get_terminal_size((80, 20)).columns
            self.stream.write("\r" + " " * (cols - 1) + "\r")
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            cols = shutil.get_terminal_size((80, 20)).columns
            self.stream.write("\r" + " " * (cols - 1) + "\r")
            self.stream.flush()


class _Tqdm:
    """tqdm's bar behind ProgressBar's interface."""

    def __init__(self, tqdm: Any, total: int, label: str, stream: TextIO) -> None:
        self._tqdm = tqdm
        self.stream = stream
        self.enabled = True
        self.bar = tqdm(total=max(total, 1), desc=label, unit="B", unit_scale=True,
                        unit_divisor=1024, file=stream, leave=False, dynamic_ncols=True)

    def __call__(self, name: str, nbytes: int) -> None:
        self.bar.set_postfix_str(printable(name)[-40:], refresh=False)
        self.bar.update(nbytes)

    def write(self, line: str) -> None:
        self._tqdm.write(line, file=self.stream)

    def close(self) -> None:
        self.bar.close()


#: (file or None, tensor name, bytes of input done) -> None
TensorProgress = Callable[[Any, str, int], None]


class Progress:
    """What the commands report per tensor: ``progress(file, name, nbytes)``. A bar (tqdm's if
    installed) when ``stream`` is a terminal and not ``quiet``; with ``verbose`` a line per
    tensor, ``describe(file, name)`` telling what happened to it."""

    def __init__(self, total: int, label: str, *, quiet: bool = False, verbose: bool = False,
                 describe: Callable[[Any, str], str] | None = None,
                 stream: TextIO | None = None, use_tqdm: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.verbose, self.describe = verbose, describe
        self.count = 0
        self.bar: Any = None
        if not quiet and _isatty(self.stream):
            tqdm = _tqdm() if use_tqdm else None
            self.bar = (_Tqdm(tqdm, total, label, self.stream) if tqdm is not None
                        else ProgressBar(total, label, stream=self.stream))

    def __call__(self, file: Any, name: str, nbytes: int) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar(name, nbytes)
        if self.verbose:
            where = f"{file}: " if file is not None else ""
            what = self.describe(file, name) if self.describe else human_bytes(nbytes)
            line = printable(f"{where}{name}: {what}")
            if self.bar is not None:
                self.bar.write(line)
            else:
                self.stream.write(line + "\n")
                self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            try:
                self.bar.close()
            except OSError:  # the terminal is gone (hung up: EIO): nothing is left to clear
                pass


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm
