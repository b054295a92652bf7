"""llama.cpp's importance matrices (``llama-imatrix``'s output): per weight, the mean square of
the activations each of its input columns met on a calibration set, which llama-quantize takes
as ``--imatrix`` to weigh each column's error.

Two formats, told apart by the first bytes:

- GGUF (llama.cpp's current one): per weight ``NAME`` an F32 tensor ``NAME.in_sum2`` of
  ``ne0 x n_mat`` sums of squared activations (``n_mat`` > 1 for a 3-D expert tensor, one row
  per expert) and an F32 ``NAME.counts`` of ``n_mat`` token counts; the importance is sum /
  count, and 1 where a count is 0 (an expert no token reached), as llama-quantize reads it.
  ``NAME.in_sum`` (plain sums) and the ``imatrix.*`` keys are read but not needed.
- the legacy ``.dat``: little-endian int32 entry count, then per entry an int32 name length,
  the name, an int32 call count ``ncall``, an int32 value count and that many float32 values
  (sums scaled to ``ncall`` calls); the importance is value / ``ncall`` (as it is when
  ``ncall`` is 0). An optional trailer holds the chunk count and the dataset's name.

Every length and count is checked against the bytes left before anything is read or
allocated; a file that is neither, or is cut short, or holds a NaN, an infinity or a negative
importance, is one :class:`CheckpointError`.
"""

from __future__ import annotations

import functools
import math
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import CheckpointError, os_reason

__all__ = ["ImportanceMatrix", "read_imatrix", "weights_for", "ggml_weights", "ggml_floor",
           "weighted_sums", "sqnr_from", "importance_row", "importance_overall"]

#: The most entries a legacy file may claim (a 400-layer MoE model has a few thousand).
MAX_ENTRIES = 1 << 20


@dataclass(frozen=True)
class ImportanceMatrix:
    """Per weight name, its importance as float32 of shape (n_mat, ne0): one row for a 2-D
    weight, one per expert for a 3-D one. ``legacy``: read from a ``.dat`` file."""

    path: str
    values: dict[str, np.ndarray]
    datasets: tuple[str, ...] = ()
    chunks: int = 0
    legacy: bool = False

    def weights(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """Importance of each value of the tensor ``name`` of numpy ``shape``, broadcastable to
        it (a column's importance along every row); None when the matrix has no entry. An
        entry of another size is a CheckpointError, as llama-quantize refuses it."""
        v = self.values.get(name)
        if v is None:
            return None
        n_mat, ne0 = v.shape
        if not shape or shape[-1] != ne0 or (n_mat > 1 and (len(shape) < 3 or shape[-3] != n_mat)):
            raise CheckpointError(self.path, name, f"importance of {n_mat} x {ne0} values does "
                                  f"not fit the tensor's shape {list(shape)}")
        if n_mat == 1:
            return v[0]
        return v.reshape((n_mat, 1, ne0))


def _bad(path: Any, message: str) -> CheckpointError:
    return CheckpointError(path, None, f"not a valid importance matrix ({message})")


def _check(path: Any, name: str, v: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(v)):
        raise CheckpointError(path, name, "importance holds a NaN or an infinity")
    if np.any(v < 0):
        raise CheckpointError(path, name, "importance holds a negative value (a mean square "
                              "is never negative)")
    return v


def read_imatrix(path: Any) -> ImportanceMatrix:
    """The importance matrix in ``path`` (either format)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise CheckpointError(path, None, os_reason(e)) from None
    if head == b"GGUF":
        return _read_gguf(path)
    return _read_legacy(path)


def _read_legacy(path: Any) -> ImportanceMatrix:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(path, None, os_reason(e)) from None
    at = 0

    def take(n: int, what: str) -> bytes:
        nonlocal at
        if n < 0 or n > len(data) - at:
            raise _bad(path, f"{what} needs {n} bytes, {len(data) - at} are left")
        out = data[at: at + n]
        at += n
        return out

    def i32(what: str) -> int:
        return int(struct.unpack("<i", take(4, what))[0])

    n = i32("the entry count")
    if n < 1 or n > MAX_ENTRIES or 16 * n > len(data) - at:
        raise _bad(path, f"{n} entries in {len(data)} bytes")
    values: dict[str, np.ndarray] = {}
    for i in range(n):
        size = i32(f"entry {i}'s name length")
        raw = take(size, f"entry {i}'s name")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(path, f"entry {i}'s name is not UTF-8") from None
        if not name:
            raise _bad(path, f"entry {i} has no name")
        if name in values:
            raise _bad(path, f"{name!r} is given twice")
        ncall = i32(f"{name}'s call count")
        nval = i32(f"{name}'s value count")
        if nval < 1:
            raise _bad(path, f"{name} has {nval} values")
        v = np.frombuffer(take(4 * nval, f"{name}'s {nval} values"), "<f4").astype(np.float32)
        if ncall > 0:
            v = v / np.float32(ncall)
        values[name] = _check(path, name, v).reshape(1, nval)
    chunks, datasets = 0, ()
    if at < len(data):  # the trailer: chunk count, then the dataset's name
        chunks = i32("the chunk count")
        if at < len(data):
            size = i32("the dataset name's length")
            datasets = (take(size, "the dataset name").decode("utf-8", "replace"),)
    return ImportanceMatrix(os.fspath(path), values, datasets, chunks, legacy=True)


def _read_gguf(path: Any) -> ImportanceMatrix:
    from .gguf_reader import open_reader

    reader = open_reader(path)
    sums: dict[str, Any] = {}
    counts: dict[str, Any] = {}
    for t in reader.tensors:
        for suffix, into in ((".in_sum2", sums), (".counts", counts)):
            if t.name.endswith(suffix) and len(t.name) > len(suffix):
                if t.tensor_type.name != "F32":
                    raise CheckpointError(path, t.name, f"is {t.tensor_type.name}, not F32")
                into[t.name[: -len(suffix)]] = t
    if not sums and not counts:
        raise _bad(path, "a GGUF file with no NAME.in_sum2 / NAME.counts tensors")
    values: dict[str, np.ndarray] = {}
    for name in sorted(set(sums) | set(counts)):
        if name not in sums or name not in counts:
            raise CheckpointError(path, name, "has sums without counts, or counts without sums")
        s = np.asarray(sums[name].data, np.float32)
        c = np.asarray(counts[name].data, np.float32).reshape(-1)
        ne = [int(d) for d in sums[name].shape.tolist()]  # GGUF order: ne0 first
        ne0 = ne[0] if ne else 1
        n_mat = s.size // ne0 if ne0 else 0
        if ne0 < 1 or n_mat * ne0 != s.size or c.size != n_mat:
            raise CheckpointError(path, name, f"{s.size} sums in rows of {ne0} do not match "
                                  f"{c.size} counts")
        _check(path, name, c)
        s = _check(path, name, s.reshape(n_mat, ne0))
        with np.errstate(all="ignore"):
            v = np.where(c[:, None] > 0, s / np.where(c > 0, c, 1)[:, None], np.float32(1))
        values[name] = _check(path, name, v.astype(np.float32))
    fields = reader.fields
    datasets: tuple[str, ...] = ()
    chunks = 0
    try:
        if "imatrix.datasets" in fields:
            datasets = tuple(str(d) for d in fields["imatrix.datasets"].contents())
        if "imatrix.chunk_count" in fields:
            chunks = int(fields["imatrix.chunk_count"].contents())
    except (TypeError, ValueError, UnicodeDecodeError, IndexError):
        pass  # metadata only: the values are what the quantizer reads
    return ImportanceMatrix(os.fspath(path), values, datasets, chunks)


@functools.lru_cache(maxsize=4)
def _cached(path: str, mtime_ns: int, size: int) -> ImportanceMatrix:
    return read_imatrix(path)


def load(path: Any) -> ImportanceMatrix:
    """:func:`read_imatrix`, once per file as it stands (the workers of a run each load it)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise CheckpointError(path, None, os_reason(e)) from None
    return _cached(os.fspath(path), st.st_mtime_ns, st.st_size)


def weights_for(imatrix_path: str | None, names: tuple[str, ...], shape: tuple[int, ...]
                ) -> np.ndarray | None:
    """The importance of a tensor known by any of ``names`` (its own, then its GGUF name), or
    None without a matrix or an entry."""
    if imatrix_path is None:
        return None
    m = load(imatrix_path)
    for n in names:
        w = m.weights(n, shape)
        if w is not None:
            return w
    return None


#: The share of a tensor's mean importance every column's importance is raised by before ggml's
#: searches take it (:func:`ggml_floor`).
GGML_FLOOR = 0.25


def ggml_floor(w: np.ndarray) -> np.ndarray:
    """The weights ggml's searched types take from an importance ``w`` (one row, or one per
    expert): each column's importance plus a quarter of the row's mean. An importance matrix
    is an estimate from a calibration set, and a column it saw little of still carries some
    error into the output; ggml's own quantizers hedge the same way (their weights mix the
    importance with the values' magnitudes). Measured on real weights against ggml's
    quantizers given the same matrix (``benches/quality_imatrix.py``): with the floor both the
    plain and the importance-weighted SQNR come out at least ggml's (but Q4_0's plain SQNR,
    0.05 dB short), where the bare importance gives up to 1.8 dB of plain SQNR for up to
    1 dB more weighted SQNR."""
    w = np.asarray(w, np.float32)
    return w + np.float32(GGML_FLOOR) * w.mean(axis=-1, keepdims=True, dtype=np.float64).astype(
        np.float32)


def ggml_weights(imatrix_path: str | None, names: tuple[str, ...], shape: tuple[int, ...],
                 qtype: str, required: bool = False) -> np.ndarray | None:
    """The weights a tensor takes into ggml's ``qtype`` (``blockquant.gguf.quantize``'s
    ``weights``): its importance, floored (:func:`ggml_floor`), when the type's quantizer takes
    weights, else None (llama-quantize too quantizes a tensor the matrix does not name without
    one). ``required``: a tensor without an entry is an error, as llama-quantize makes
    Q2_K_S's Q2_K tensors only with one."""
    from .. import gguf as bg

    if imatrix_path is None or not bg.TYPES[qtype].takes_weights:
        return None
    w = weights_for(imatrix_path, names, shape)
    if w is None and required:
        raise CheckpointError(imatrix_path, names[0], f"has no importance for the tensor, which "
                              f"{qtype} in this mix takes only with one (as llama-quantize "
                              f"requires); --tensor-type or --rule give it another type")
    return None if w is None else ggml_floor(w)


def weighted_sums(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """(weighted signal, weighted noise): sums of w·x² and w·(x − y)² over ``x``'s values, ``w``
    broadcast along the rows. 10·log10 of their ratio is the importance-weighted SQNR."""
    xf = np.asarray(x, np.float64)
    d = xf - np.asarray(y, np.float64)
    wf = np.broadcast_to(np.asarray(w, np.float64), xf.shape)
    return float(np.sum(wf * xf * xf)), float(np.sum(wf * d * d))


def sqnr_from(signal: float, noise: float) -> float:
    """10·log10(signal / noise); inf when exact, -inf with no signal."""
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def importance_row(x: Any, y: Any, w: Any, imatrix: str | None) -> dict[str, Any]:
    """A report row's importance-weighted SQNR (``sqnr_imatrix_db``) and its two sums, when an
    importance matrix is given (None where it has no entry for the tensor)."""
    if imatrix is None:
        return {}
    if w is None:
        return {"sqnr_imatrix_db": None}
    signal, noise = weighted_sums(x, y, w)
    return {"sqnr_imatrix_db": sqnr_from(signal, noise), "imatrix_signal": signal,
            "imatrix_noise": noise}


def importance_overall(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The importance-weighted SQNR over the rows that have one."""
    if not any("sqnr_imatrix_db" in r for r in rows):
        return {}
    weighted = [r for r in rows if r.get("sqnr_imatrix_db") is not None]
    return {"sqnr_imatrix_db": sqnr_from(sum(r["imatrix_signal"] for r in weighted),
                                         sum(r["imatrix_noise"] for r in weighted))
            if weighted else None, "imatrix_tensors": len(weighted)}
