"""The options the file commands share, as one value."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..options import Calibration, Rounding, ScaleRounding
from ..scheme import QuantScheme
from .base import NAME_TO_ST, CheckpointError


def _compile(pattern: str | None, what: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise CheckpointError(what, None, f"bad regular expression {pattern!r}: {e}") from None


@dataclass(frozen=True)
class FileOptions:
    """How :func:`quantize_file`, :func:`report_file` and :func:`dequantize_file` treat a file;
    each reads the fields that concern it. Checked when built: a bad regular expression or
    dtype raises :class:`CheckpointError` naming the command-line option.

    - ``include`` / ``exclude``: regular expressions (``re.search``) on tensor names; only the
      floating-point tensors that match ``include`` (if given) and not ``exclude`` are quantized.
    - ``calibration``, ``rounding``, ``scale_rounding``: passed to :func:`blockquant.quantize`;
      None is the scheme's own (a preset's), else the library default.
    - ``force``: replace an existing output file.
    - ``dtype``: dequantize to float16, bfloat16, float32 or float64 rather than each tensor's
      original dtype.
    """

    include: str | None = None
    exclude: str | None = None
    calibration: Optional[Calibration] = None
    rounding: Optional[Rounding] = None
    scale_rounding: Optional[ScaleRounding] = None
    force: bool = False
    dtype: str | None = None

    def __post_init__(self) -> None:
        _compile(self.include, "--include")
        _compile(self.exclude, "--exclude")
        if self.dtype is not None and self.dtype not in NAME_TO_ST:
            raise CheckpointError("--dtype", None, f"expected one of {', '.join(NAME_TO_ST)}")

    def selects(self, name: str) -> bool:
        """Whether a (floating-point) tensor called ``name`` is to be quantized."""
        # re caches compiled patterns, so compiling again here costs a dict lookup.
        include, exclude = _compile(self.include, "--include"), _compile(self.exclude, "--exclude")
        if include is not None and not include.search(name):
            return False
        return not (exclude is not None and exclude.search(name))

    def quantize_options(self, scheme: QuantScheme) -> dict[str, str]:
        """The options ``scheme`` is quantized with, all of them resolved: they are recorded in
        the file and the report, so a reader never needs to know the defaults."""
        cal, rnd, srnd = scheme.options.resolve(self.calibration, self.rounding,
                                                self.scale_rounding)
        return {"calibration": cal, "rounding": rnd, "scale_rounding": srnd}
