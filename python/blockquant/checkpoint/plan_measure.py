"""What a size-target plan measures (``blockquant plan``, ``quantize --target-bpw``): each
tensor's error and stored size under each candidate scheme, in the output format's own words
(:class:`Candidate`: a blockquant scheme or preset, a ggml type, an MLX mode).

One pass over the model, a shard at a time (in ``--jobs`` processes): each eligible tensor is
read once and quantized with every candidate that can take it, each result dequantized as its
consumer dequantizes it and compared with the tensor (float64 sums; with importance weights,
each column's squared errors times its weight). :mod:`.plan_alloc` then chooses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import QuantError
from .base import CheckpointError, TensorInfo, st_nbytes
from .options import FileOptions
from .readers import open_checkpoint

#: The candidate kinds, by the output format that takes them.
KIND_OF_FORMAT = {"safetensors": "scheme", "burnpack": "scheme", "folder": "scheme",
                  "gguf": "ggml", "mlx": "mlx"}
#: The candidates tried when none are named, per kind: from about 2 to 8 bits a weight.
DEFAULT_CANDIDATES = {
    "scheme": ("int4_block16", "int4_block32", "mxfp4", "nvfp4", "int8_block32"),
    "ggml": ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_0"),
    "mlx": ("affine2:g32", "affine3:g32", "affine4", "affine5", "affine6", "affine8"),
}


@dataclass(frozen=True)
class Candidate:
    """One scheme a tensor may get, as the output format names it (``name``, what a rule
    says), of ``kind`` scheme, ggml or mlx."""

    name: str
    kind: str

    def nbytes(self, shape: tuple[int, ...], dtype: str | None) -> int | None:
        """Stored bytes of a tensor of ``shape`` under this candidate, None when it cannot take
        it."""
        try:
            if self.kind == "ggml":
                from ..gguf import byte_shape

                if len(shape) < 2:
                    return None
                return int(np.prod(byte_shape(shape, self.name)))
            if self.kind == "mlx":
                from .mlx_schemes import resolve_mlx, scheme_for

                ms = resolve_mlx(self.name)
                if scheme_for(ms, dtype, shape)[0] is None:
                    return None
                return sum(st_nbytes(d, s) or 0 for _, d, s in ms.stored(shape, dtype or "F32"))
            from ..presets import resolve

            return int(resolve(self.name).layout(shape).nbytes)
        except (QuantError, ValueError, OverflowError):
            return None

    def roundtrip(self, x: np.ndarray, dtype: str | None, options: FileOptions,
                  weights: np.ndarray | None = None) -> np.ndarray:
        """``x`` quantized and dequantized as the output's consumer reads it back (ggml's
        searched types and a blockquant scheme's ``mse`` search weighted by ``weights`` as
        ``quantize --imatrix`` does)."""
        if self.kind == "ggml":
            from .. import gguf
            from .imatrix import ggml_floor

            w = None if weights is None or not gguf.ggml_type(self.name).takes_weights \
                else ggml_floor(weights)  # as the GGUF writer weighs them
            return gguf.dequantize(gguf.quantize(np.asarray(x, np.float32), self.name,
                                                 weights=w), self.name)
        if self.kind == "mlx":
            from .mlx_codec import dequantize as mlx_dequantize
            from .mlx_folder import layer_tensors
            from .mlx_schemes import resolve_mlx, scheme_for

            ms = resolve_mlx(self.name)
            st = dtype or "F32"
            text, _ = scheme_for(ms, st, x.shape)
            parts = dict(layer_tensors(x, ms, text or "", st, options.calibration == "minmax"))
            from .ct_codec import as_float

            scales = parts["scales"] if ms.mode != "affine" else as_float(st, parts["scales"])
            biases = as_float(st, parts["biases"]) if "biases" in parts else None
            return mlx_dequantize(ms.mode, ms.bits, ms.group,
                                  st if ms.mode == "affine" else "BF16", parts["weight"],
                                  scales, biases)
        from ..presets import resolve
        from ..qtensor import quantize

        scheme = resolve(self.name)
        kwargs = options.quantize_options(scheme)
        searched = kwargs["calibration"] == "mse" and scheme.offset is None
        return quantize(x, scheme, **kwargs,
                        weights=weights if searched else None).dequantize()


def candidates(names: Any, kind: str) -> tuple[Candidate, ...]:
    """The candidates named (a comma-separated text or a list; None: the kind's defaults),
    each checked now: a name the output does not take is a CheckpointError."""
    if names is None:
        names = DEFAULT_CANDIDATES[kind]
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out = []
    for n in names:
        try:
            if kind == "ggml":
                from ..gguf import ggml_type

                ggml_type(n)
            elif kind == "mlx":
                from .mlx_schemes import resolve_mlx

                resolve_mlx(n)
            else:
                from ..presets import resolve

                resolve(n)
        except (QuantError, TypeError) as e:
            raise CheckpointError("--candidates", None, f"{n!r}: {e}") from None
        out.append(Candidate(str(n).strip(), kind))
    if len(out) < 1 or len({c.name.lower() for c in out}) != len(out):
        raise CheckpointError("--candidates", None, "name one or more different candidates")
    return tuple(out)


@dataclass
class TensorMeasure:
    """One tensor's measurements: its signal (sum of w · x², float64), the bytes it holds now,
    and per candidate that can take it (bytes stored, sum of w · (x − x̂)²)."""

    name: str
    shape: tuple[int, ...]
    numel: int
    float_bytes: int
    signal: float = 0.0
    options: dict[str, tuple[int, float]] = field(default_factory=dict)


def eligible(t: TensorInfo, kind: str, options: FileOptions) -> bool:
    """Whether a plan decides ``t``: a floating-point tensor the output would quantize (rank
    at least ``--min-rank``; for GGUF and MLX a 2-D or higher ``*weight``), selected by
    ``--include`` / ``--exclude``."""
    if not (t.is_float or t.dequantized_on_read) or not options.selects(t.name):
        return False
    if kind in ("ggml", "mlx"):
        return len(t.shape) >= 2 and t.name.endswith("weight") and \
            (kind == "ggml" or len(t.shape) == 2)
    return len(t.shape) >= max(options.min_rank, 1)


def _sums(x: np.ndarray, y: np.ndarray | None, w: np.ndarray | None) -> float:
    """sum of w_c · (x − y)² (y None: of w_c · x²) over a 2-D-or-more tensor's columns c, in
    float64 a chunk of rows at a time (the float32 difference is exact to its last bit: its
    square's rounding is far below what a plan compares)."""
    a = np.asarray(x).reshape(-1, x.shape[-1])
    b = None if y is None else np.asarray(y).reshape(a.shape)
    rows = max(1, (1 << 20) // max(a.shape[1], 1))
    total = 0.0
    for i in range(0, a.shape[0], rows):
        d = a[i: i + rows].astype(np.float32)
        if b is not None:
            d = d - b[i: i + rows].astype(np.float32, copy=False)
        d64 = d.astype(np.float64)
        d64 *= d64  # squares summed pairwise by numpy, not by BLAS (whose threads spin)
        total += float(d64.sum() if w is None else d64.sum(axis=0) @ w)
    return total


def _weighted_sums(x: np.ndarray, y: np.ndarray | None, w: np.ndarray) -> float:
    """:func:`_sums` with importance of any shape that broadcasts to x's (per column, or per
    expert and column for a 3-D weight)."""
    if w.ndim == 1:
        return _sums(x, y, w.astype(np.float64))
    d = np.asarray(x, np.float64) - (0.0 if y is None else np.asarray(y, np.float64))
    return float(np.sum(d * d * np.broadcast_to(w, d.shape)))


def _error(x: np.ndarray, y: np.ndarray | None, w: np.ndarray | None) -> float:
    return _sums(x, y, None) if w is None else _weighted_sums(x, y, w)


def _importance(options: FileOptions, src: Path, name: str,
                shape: tuple[int, ...]) -> np.ndarray | None:
    """The tensor's importance from ``--imatrix`` (by its name, then its GGUF name), or None."""
    if options.imatrix is None:
        return None
    from .gguf_names import gguf_names
    from .imatrix import weights_for

    alias = gguf_names(str(src)).get(name)
    w = weights_for(options.imatrix, (name,) if alias is None else (name, alias), shape)
    return None if w is None else np.asarray(w, np.float32)


def measure_file(src: Path, names: list[str], cands: tuple[Candidate, ...],
                 options: FileOptions, progress: Any = None) -> list[TensorMeasure]:
    """Every tensor of ``names`` in the checkpoint ``src``, measured under every candidate
    (module docstring), each weighted by its ``--imatrix`` importance when given. A task of
    :func:`.jobs.run_tasks`."""
    out = []
    with open_checkpoint(src) as ckpt:
        for name in names:
            t = ckpt.info(name)
            x = ckpt.read(name)
            w = _importance(options, src, name, tuple(t.shape))
            m = TensorMeasure(name, tuple(t.shape), int(np.prod(t.shape)), t.nbytes,
                              _error(x, None, w))
            for c in cands:
                nbytes = c.nbytes(tuple(t.shape), t.dtype)
                if nbytes is None:
                    continue
                try:
                    y = c.roundtrip(x, t.dtype, options, w)
                except QuantError as e:
                    raise ckpt.error(name, str(e)) from None
                m.options[c.name] = (nbytes, _error(x, y, w))
                del y
            del x
            out.append(m)
            if progress is not None:
                progress(name, t.nbytes)
    return out


def pattern_list(patterns: Any, what: str) -> tuple[re.Pattern[str], ...]:
    out = []
    for p in patterns or ():
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise CheckpointError(what, None, f"bad regular expression {p!r}: {e}") from None
    return tuple(out)
