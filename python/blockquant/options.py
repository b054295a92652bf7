"""The quantize options and their names, typed so that mypy catches a misspelled one.

The names are parsed by the Rust core (the one list of choices); these ``Literal`` types mirror
it for type checkers, and :class:`QuantOptions` is what a preset carries (format.md "Rules for edge cases": ``bitnet()``
quantizes with absmean without being told).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Optional

import numpy as np

from .errors import QuantError

__all__ = [
    "Calibration", "Rounding", "ScaleRounding", "QuantOptions", "as_bytes", "importance_weights",
    "weights_refusal",
]

#: The most kernel threads a call may have: the core's bound, which ``set_num_threads``, the
#: command line's ``--threads`` and ``BLOCKQUANT_NUM_THREADS`` share.
MAX_THREADS = 1024

#: How the scale of a block is chosen: from max |x|, from mean |x| (BitNet b1.58), or searched
#: among candidates around max |x|'s for the least squared error ("mse", format.md "Searched scales: `mse`").
Calibration = Literal["minmax", "absmean", "mse"]
#: Ties of integer rounding: half away from zero (burn, ggml) or half to even (numpy, ONNX).
Rounding = Literal["half_away", "half_even"]
#: How a raw scale becomes a stored one: the smallest value >= it, the nearest, or the OCP MX
#: rule 2**(floor(log2 amax) - emax) (UE8M0 scales only).
ScaleRounding = Literal["up", "nearest", "mx"]


@dataclass(frozen=True)
class QuantOptions:
    """Options a scheme is meant to be used with; ``None`` leaves the library default
    (minmax, half_away, up). An argument given to ``quantize`` wins over these."""

    calibration: Optional[Calibration] = None
    rounding: Optional[Rounding] = None
    scale_rounding: Optional[ScaleRounding] = None

    def resolve(
        self,
        calibration: Optional[Calibration] = None,
        rounding: Optional[Rounding] = None,
        scale_rounding: Optional[ScaleRounding] = None,
    ) -> tuple[str, str, str]:
        """The options to use: the caller's where given, else these, else the defaults."""
        return (
            calibration if calibration is not None else self.calibration or "minmax",
            rounding if rounding is not None else self.rounding or "half_away",
            scale_rounding if scale_rounding is not None else self.scale_rounding or "up",
        )


def importance_weights(weights: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The ``weights=`` of an mse search, checked (real numbers, finite, >= 0, fitting float32,
    broadcastable to the input) and materialized as a C-contiguous float32 array of ``shape``.
    quantize and blockquant.reference both check them here, so they refuse the same inputs."""
    try:
        raw = np.asarray(weights)
    except (TypeError, ValueError):
        raise TypeError(f"weights must be an array of numbers, got {type(weights).__name__}") from None
    if raw.dtype.kind not in "fiu" and raw.dtype.name != "bfloat16":
        raise TypeError(f"weights must be an array of real numbers, got dtype {raw.dtype}")
    w64 = raw.astype(np.float64)
    flat = w64.ravel()
    bad = np.flatnonzero(~np.isfinite(flat) | (flat < 0))
    if bad.size:
        i = int(bad[0])
        raise QuantError(f"weights must be finite and >= 0, got {flat[i]} at flat index {i}")
    with np.errstate(over="ignore"):
        w32 = w64.astype(np.float32)
    if not np.all(np.isfinite(w32)):
        raise QuantError("weights must fit in float32")
    try:
        full = np.broadcast_to(w32, shape)
    except ValueError:
        raise QuantError(
            f"weights of shape {raw.shape} do not broadcast to the input's shape {shape}"
        ) from None
    return np.ascontiguousarray(full)


def weights_refusal(calibration: str, has_scales: bool) -> Optional[str]:
    """Why ``weights=`` cannot be given with these arguments, or None: they weigh the error
    that calibration ``mse`` searches, so they need it and no explicit scales. quantize and
    blockquant.reference both ask here, so they say the same."""
    if calibration != "mse":
        return (f"weights= needs calibration='mse' (they weigh the error its search "
                f"minimizes); this call's calibration is {calibration!r}")
    if has_scales:
        return ("weights= and scales= do not go together: the weights weigh the error of "
                "calibration='mse''s search for the scales, which scales= replace")
    return None


def as_bytes(data: Any) -> bytes:
    """``from_bytes``' data as bytes: any object with the buffer protocol (bytes, bytearray,
    memoryview, mmap, a numpy array: its raw bytes, in C order), but not one that holds Python
    objects, whose bytes are pointers. quantize's from_bytes and blockquant.reference's both
    take their bytes here, so they accept the same objects."""
    if isinstance(data, bytes):
        return data
    try:
        view = memoryview(data)
    except (TypeError, ValueError):  # no buffer, or numpy's refusal of a dtype (bfloat16's 'E')
        raise TypeError(f"data must be bytes-like (bytes, bytearray, memoryview, a buffer), "
                        f"got {type(data).__name__}") from None
    with view:
        # A numpy array says so itself; another buffer by its struct format, without the
        # field names a structured one carries (":Other:" holds no object).
        dt = getattr(data, "dtype", None)
        if dt.hasobject if isinstance(dt, np.dtype) else "O" in re.sub(r":[^:]*:", "", view.format):
            raise TypeError("data holds Python objects, not bytes")
        return view.tobytes()
