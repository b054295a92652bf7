"""The one gateway to the compiled core, ``blockquant._core``: no other module imports it.

Everything that crosses into Rust passes through here, as named objects: a scheme is a
``_core.Scheme`` (a frozen pyclass, validated once when the Python :class:`QuantScheme` is
built, or read from its text by ``parse_scheme``), a layout comes back as a ``_core.Layout`` with
named fields, the facts of value types and scale dtypes as ``_core.ValueInfo`` /
``_core.ScaleInfo``, and option names are parsed by the core, which owns the list of choices.
"""

from __future__ import annotations

import os
import warnings

from . import _core
from ._core import (
    Layout,
    Scheme,
    affine_dequantize,
    affine_from_bytes,
    affine_quantize,
    affine_to_bytes,
    check_affine_parts,
    check_call,
    check_options,
    check_parts,
    dequantize,
    from_bytes,
    get_num_threads,
    ggml_dequantize,
    ggml_quantize,
    ggml_types,
    parse_scheme,
    quantize,
    round_scale,
    scale_info,
    set_num_threads,
    to_bytes,
    value_info,
)
from .options import MAX_THREADS

__all__ = [
    "Layout",
    "affine_dequantize",
    "affine_from_bytes",
    "affine_quantize",
    "affine_to_bytes",
    "check_affine_parts",
    "Scheme",
    "check_call",
    "check_options",
    "check_parts",
    "dequantize",
    "from_bytes",
    "get_num_threads",
    "ggml_dequantize",
    "ggml_quantize",
    "ggml_types",
    "parse_scheme",
    "quantize",
    "round_scale",
    "scale_info",
    "set_num_threads",
    "to_bytes",
    "value_info",
    "panic_for_tests",
]


def panic_for_tests() -> None:
    """Panic inside the core's thread pool (tests prove it surfaces as ``InternalError``)."""
    _core._panic_for_tests()


def _check_thread_variable() -> None:
    """The core reads BLOCKQUANT_NUM_THREADS and ignores a value that is not a positive count;
    say so once, instead of silently running on the default."""
    raw = os.environ.get("BLOCKQUANT_NUM_THREADS")
    if raw is None:
        return
    try:
        ok = 0 < int(raw.strip()) <= MAX_THREADS
    except ValueError:
        ok = False
    if ok or _spawned_worker():
        return
    # Attributed to the environment, not to a line of code: the message is then one line
    # (no source line under it), the same from a script, the command line or a notebook.
    warnings.warn_explicit(
        f"BLOCKQUANT_NUM_THREADS={raw!r} is not a number of threads from 1 to {MAX_THREADS}: "
        "ignored, blockquant uses the default (all cores)",
        RuntimeWarning,
        "<environment>",
        0,
        module="blockquant",
    )


def _spawned_worker() -> bool:
    """Whether this process is a multiprocessing worker being started by spawn (the command's
    --jobs): its parent, with the same environment, has already warned about it."""
    import multiprocessing

    # Set while a spawned child unpickles what it was started with (which imports blockquant),
    # since Python 3.4; absent elsewhere.
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))



def _check_spin_variable() -> None:
    """The core reads BLOCKQUANT_SPIN_MS (how long its workers poll for the next call) and
    ignores a value that is not a whole number of milliseconds from 0 to 1000: say so once."""
    raw = os.environ.get("BLOCKQUANT_SPIN_MS")
    if raw is None:
        return
    try:
        ok = 0 <= int(raw.strip()) <= 1000  # the core's MAX_SPIN_MS
    except ValueError:
        ok = False
    if not ok:
        warnings.warn(
            f"BLOCKQUANT_SPIN_MS={raw!r} is not a number of milliseconds from 0 to 1000: ignored, "
            "blockquant's workers do not poll (the default)",
            RuntimeWarning,
            stacklevel=3,
        )


def _check_pin_variable() -> None:
    """The core reads BLOCKQUANT_PIN_THREADS (0: do not pin the workers to CPUs) and takes any
    other value for the default, on: say so once for a value that is neither 0 nor 1."""
    raw = os.environ.get("BLOCKQUANT_PIN_THREADS")
    if raw is not None and raw.strip() not in ("0", "1"):
        warnings.warn(
            f"BLOCKQUANT_PIN_THREADS={raw!r} is neither 0 nor 1: ignored, blockquant pins its "
            "workers as by default (one to a CPU when they are as many as the CPUs)",
            RuntimeWarning,
            stacklevel=3,
        )


_check_thread_variable()
_check_spin_variable()
_check_pin_variable()
