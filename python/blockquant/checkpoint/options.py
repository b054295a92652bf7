"""The options the file commands share, as one value, and the ``--rule REGEX=SCHEME[@N]`` texts
they hold, parsed and checked (which tensor a rule then decides is :mod:`.rules`)."""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from ..errors import QuantError
from ..options import Calibration, Rounding, ScaleRounding
from ..presets import described, resolve
from ..qtensor import mse_advice
from ..scheme import QuantScheme
from .base import NAME_TO_ST, CheckpointError

#: The package's folder (a warning points past its frames).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: The scheme word of a rule that keeps the tensors it matches.
KEEP = "keep"

#: One rule as FileOptions holds it: (regular expression, scheme text (with its ``@N`` if any),
#: QuantScheme or "keep").
RuleSpec = tuple[str, Union[str, QuantScheme]]


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    scheme: QuantScheme | None  # None: keep
    text: str  # as the user wrote it, for messages
    # The rule's own least rank (``SCHEME@N``); None: ``--min-rank``'s. A rule picks a scheme,
    # it does not by itself pull in the biases its regular expression happens to match too.
    min_rank: int | None = None
    # The scheme as an MLX mode's name (``affine8``, ``mxfp4``), which MLX output reads; when
    # it is no blockquant scheme too (``scheme`` None), :func:`rule_scheme` refuses it in other
    # outputs.
    foreign: str | None = None

    @property
    def keeps(self) -> bool:
        return self.scheme is None and self.foreign is None


def rule_scheme(rule: Rule) -> QuantScheme | None:
    """The blockquant scheme ``rule`` picks (None: keep); a rule naming another format's
    scheme is a CheckpointError here, in an output that takes blockquant's."""
    if rule.scheme is None and rule.foreign is not None:
        if _is_ggml_name(rule.foreign):
            raise CheckpointError("--rule", None, f"{rule.text!r}: {rule.foreign} is a ggml "
                                  "type, taken by a .gguf output only")
        raise CheckpointError("--rule", None, f"{rule.text!r}: {rule.foreign} is an MLX mode, "
                              "taken with --format mlx only")
    return rule.scheme


def matching_rule(rules: tuple[Rule, ...], name: str) -> Rule | None:
    """The first rule whose regular expression matches ``name`` (``re.search``), or None."""
    return next((r for r in rules if r.pattern.search(name)), None)


def _split_rank(text: str, scheme: str) -> tuple[str, int | None]:
    """``SCHEME@N`` as (SCHEME, N); no ``@`` is (SCHEME, None). No scheme text or preset name
    holds an ``@``, so the last one is the suffix."""
    base, at, digits = scheme.rpartition("@")
    if not at:
        return scheme, None
    if not (digits.isascii() and digits.isdigit()) or not base:
        raise CheckpointError("--rule", None, f"{text!r}: SCHEME@N takes an integer N >= 0 "
                              f"(the least rank the rule quantizes), got {scheme!r}")
    if base == KEEP:
        raise CheckpointError("--rule", None, f"{text!r}: 'keep' keeps whatever the rank; "
                              "it takes no @N")
    return base, int(digits)


def parse_rules(rules: Any) -> tuple[RuleSpec, ...]:
    """Rules in any of the spellings the API takes, as a tuple of (regex, scheme) pairs:
    ``"REGEX=SCHEME"`` strings (split at the last ``=``: a scheme text has none, a regular
    expression may), (regex, scheme) pairs, or a mapping regex -> scheme (in its order). A
    scheme given as text may end in ``@N``, the least rank the rule quantizes (else
    ``min_rank``'s)."""
    if rules is None:
        return ()
    if isinstance(rules, (str, bytes)):
        rules = [rules]
    items = rules.items() if isinstance(rules, Mapping) else rules
    out: list[RuleSpec] = []
    for item in items:
        if isinstance(item, str):
            regex, eq, scheme = item.rpartition("=")
            if not eq or not regex or not scheme:
                raise CheckpointError("--rule", None, f"{item!r} is not REGEX=SCHEME "
                                      "(SCHEME a preset, a scheme text or 'keep', "
                                      "optionally @N)")
            out.append((regex, scheme))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
            out.append((item[0], item[1]))
        else:
            raise TypeError(f"a rule is 'REGEX=SCHEME' or a (regex, scheme) pair, got {item!r}")
    compile_rules(tuple(out))  # every error now, when the options are built
    return tuple(out)


@functools.lru_cache(maxsize=64)
def compile_rules(rules: tuple[RuleSpec, ...]) -> tuple[Rule, ...]:
    compiled = []
    for regex, scheme in rules:
        text = f"{regex}={scheme}"
        try:
            pattern = re.compile(regex)
        except re.error as e:
            raise CheckpointError("--rule", None,
                                  f"bad regular expression {regex!r} in {text!r}: {e}") from None
        floor = None
        if isinstance(scheme, str):
            scheme, floor = _split_rank(text, scheme)
            if scheme == KEEP:
                compiled.append(Rule(pattern, None, text))
                continue
        # An MLX mode's or a ggml type's name (mxfp4 is both, and a preset too) is kept for MLX
        # and GGUF output to read.
        foreign = scheme if isinstance(scheme, str) and (
            _is_mlx_name(scheme) or _is_ggml_name(scheme)) else None
        try:
            compiled.append(Rule(pattern, resolve(scheme), text, floor, foreign))
        except (QuantError, TypeError, OverflowError) as e:
            if foreign is not None:
                compiled.append(Rule(pattern, None, text, floor, foreign))
                continue
            raise CheckpointError("--rule", None, f"{text!r}: {e}") from None
    return tuple(compiled)


def _is_ggml_name(text: str) -> bool:
    from ..gguf import TYPES

    return text.upper() in TYPES


def _is_mlx_name(text: str) -> bool:
    from .mlx_schemes import is_mlx_name

    return is_mlx_name(text)


def _compile(pattern: str | None, what: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise CheckpointError(what, None, f"bad regular expression {pattern!r}: {e}") from None


def _dtype_name(dtype: Any) -> str | None:
    """A dequantize dtype as its metadata name: float16, bfloat16, float32 or float64, from
    that name, a numpy dtype, a type (``np.float16``, ``ml_dtypes.bfloat16``) or an alias numpy
    knows (``"f2"``, ``"half"``, ``"double"``). bfloat16 works without ml_dtypes."""
    if dtype is None or (isinstance(dtype, str) and dtype in NAME_TO_ST):
        return dtype
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError):
        name = None
    if name not in NAME_TO_ST:
        raise CheckpointError("--dtype", None,
                              f"expected one of {', '.join(NAME_TO_ST)}, got {dtype!r}")
    return name


@dataclass(frozen=True)
class FileOptions:
    """How :func:`quantize_file`, :func:`report_file` and :func:`dequantize_file` treat a file;
    each reads the fields that concern it. Checked when built: a bad regular expression or
    dtype raises :class:`CheckpointError` naming the command-line option.

    - ``include`` / ``exclude``: regular expressions (``re.search``) on tensor names; only the
      floating-point tensors that match ``include`` (if given) and not ``exclude`` are quantized.
    - ``calibration``, ``rounding``, ``scale_rounding``: passed to :func:`blockquant.quantize`;
      None is the scheme's own (a preset's), else the library default.
    - ``rules``: per-tensor schemes, first match wins: ``"REGEX=SCHEME"`` strings,
      (regex, scheme) pairs or a mapping; SCHEME may be ``"keep"``, and a scheme text may end in
      ``@N``, the least rank that rule quantizes (:mod:`.rules`).
    - ``min_rank``: tensors of a lower rank are kept (default 2: norms and biases stay as they
      are), also those a rule matches unless its scheme says ``@N``.
    - ``strict``: a tensor its scheme cannot take is an error instead of being kept.
    - ``force``: replace an existing output file.
    - ``allow_requantize``: quantize tensors another tool quantized (a GGUF file's Q4_0 ...),
      from their dequantized values; without it such a tensor that would be quantized is an
      error, as llama-quantize's ``--allow-requantize``.
    - ``dtype``: dequantize to float16, bfloat16, float32 or float64 rather than each tensor's
      original dtype (a name, a numpy dtype or a type such as ``np.float16``).
    - ``imatrix``: an importance matrix file (llama.cpp's, :mod:`.imatrix`): ``report`` weighs
      each tensor's error by it, and calibration ``mse`` minimizes the weighted error.
    """

    include: str | None = None
    exclude: str | None = None
    calibration: Optional[Calibration] = None
    rounding: Optional[Rounding] = None
    scale_rounding: Optional[ScaleRounding] = None
    force: bool = False
    dtype: str | None = None
    rules: tuple[RuleSpec, ...] = ()
    min_rank: int = 2
    strict: bool = False
    allow_requantize: bool = False
    imatrix: str | None = None

    def __post_init__(self) -> None:
        _compile(self.include, "--include")
        _compile(self.exclude, "--exclude")
        # Normalized in place (frozen: object.__setattr__), so equal options compare equal.
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))
        object.__setattr__(self, "rules", parse_rules(self.rules))
        if self.imatrix is not None:
            object.__setattr__(self, "imatrix", os.fspath(self.imatrix))
        if type(self.min_rank) is not int or self.min_rank < 0:
            raise CheckpointError("--min-rank", None,
                                  f"expected an integer >= 0, got {self.min_rank!r}")

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

    def check_schemes(self, scheme: QuantScheme) -> None:
        """These options against ``scheme`` and every rule's scheme, when a run is planned: a
        misfit (``scale_rounding="mx"`` with F16 scales) is a CheckpointError naming the option,
        not the first tensor it would have failed on."""
        targets = [(described(scheme), scheme)] + [
            (f"--rule {r.text}'s scheme {described(r.scheme)}", r.scheme)
            for r in compile_rules(self.rules) if r.scheme is not None]
        for target, s in targets:
            _, rnd, srnd = s.options.resolve(self.calibration, self.rounding,
                                             self.scale_rounding)
            # One option at a time (the other at its default), so the error names the one
            # at fault.
            for flag, word, args in (("--scale-rounding", srnd, {"scale_rounding": srnd}),
                                     ("--rounding", rnd, {"rounding": rnd})):
                try:
                    s.check_options(**args)
                except QuantError as e:
                    raise CheckpointError(flag, None, _misfit(word, target, s, e)) from None

    def advise(self, scheme: QuantScheme) -> None:
        """A RuntimeWarning, once when a run is planned, for ``scheme`` or a rule's scheme that
        these options quantize with a calibration that cannot help it (``mse`` on one scale
        for a whole tensor of 2-bit values)."""
        schemes = [scheme] + [r.scheme for r in compile_rules(self.rules) if r.scheme is not None]
        # Once each, in order; equal schemes may carry different options (a preset's own).
        for s, _ in dict.fromkeys((s, s.options) for s in schemes):
            advice = mse_advice(s, self.calibration)
            if advice is not None:
                warnings.warn(advice, RuntimeWarning, stacklevel=_outside_the_package())


def _outside_the_package() -> int:
    """The ``stacklevel`` of the first caller outside blockquant: a warning points at the
    line that asked for the run, however many of the package's functions lie between."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    return level


def _misfit(word: str, target: str, scheme: QuantScheme, e: QuantError) -> str:
    """Why option value ``word`` does not fit ``scheme`` (``target``: how to name it)."""
    if word == "mx":
        return f"mx needs UE8M0 scales; {target} has {scheme.scale_dtype.value}"
    if scheme.codebook is not None:
        return (f"{word} does not apply to {target}: a Lookup scheme's values are the nearest "
                "codebook entries")
    return f"{word} does not fit {target}: {e}"
