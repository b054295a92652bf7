"""The file commands as functions: quantize, dequantize, inspect and report a checkpoint.

Each reads one tensor at a time, checks everything it can before writing anything, and on any
problem raises :class:`CheckpointError` and leaves no output file.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import QuantError
from ..metrics import ErrorStats, bits_per_weight
from ..qtensor import _quantize as quantize
from ..scheme import QuantScheme
from .base import (
    FLOAT_DTYPES,
    NAME_TO_ST,
    Checkpoint,
    CheckpointError,
    TensorInfo,
    numel,
    st_nbytes,
)
from .burnpack_file import BurnpackCheckpoint, is_burnpack_path, write_burnpack
from .format import (
    META_KEY,
    Entry,
    load_qtensor,
    metadata_value,
    part_keys,
    read_entries,
)
from .formats import CHOOSABLE, refuse_model_output
from .formats import output_format as decide_output
from .gguf_file import dequantize_gguf, inspect_gguf
from .gguf_reader import is_gguf
from .imatrix import importance_overall, importance_row
from .layered import layer_count
from .options import FileOptions
from .outputs import check_output
from .readers import open_checkpoint
from .rules import Decision, plan
from .safetensors import HeaderEntry, SafetensorsWriter, float_array

Progress = Callable[[str, int], None]  # (tensor name, input bytes done with it)


def _no_progress(name: str, nbytes: int) -> None:
    pass


def natural_key(name: str) -> list[Any]:
    """Sort key that puts layer.2 before layer.10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _entries(ckpt: Checkpoint) -> dict[str, Entry]:
    """The quantized tensors of a checkpoint: blockquant's safetensors entries, or a burn-pack
    file's ``QFloat`` tensors."""
    if isinstance(ckpt, BurnpackCheckpoint):
        return ckpt.entries()
    return read_entries(ckpt)


def _load(ckpt: Checkpoint, e: Entry) -> Any:
    if isinstance(ckpt, BurnpackCheckpoint):
        return ckpt.load_qtensor(e)
    return load_qtensor(ckpt, e)


def _check_not_quantized(ckpt: Checkpoint, *, measuring: bool = False) -> None:
    """A quantized input is refused; a report (``measuring``) reads a compressed-tensors
    shard's weights dequantized, as it does a GGUF file's."""
    if layer_count(ckpt) and not measuring:
        raise ckpt.error(None, f"is a {ckpt.format} shard, already quantized (blockquant "
                         "dequantize its folder first)")
    if isinstance(ckpt, BurnpackCheckpoint) and ckpt.entries():
        raise ckpt.error(None, "already holds quantized tensors (dequantize it first)")
    if META_KEY in ckpt.metadata:
        raise ckpt.error(
            None, "already holds blockquant-quantized tensors (dequantize it first)"
        )


def _quantize_tensor(ckpt: Checkpoint, t: TensorInfo, scheme: QuantScheme,
                     options: FileOptions) -> Any:
    x = ckpt.read(t.name)
    try:
        return _quantized(ckpt, t.name, x, scheme, options)[0]
    except CheckpointError:
        raise  # names its file already (the importance matrix's)
    except QuantError as e:
        raise ckpt.error(t.name, str(e)) from None


def _quantized(ckpt: Checkpoint, name: str, x: Any, scheme: QuantScheme,
               options: FileOptions) -> tuple[Any, Any]:
    """``x`` quantized, and its importance from ``options.imatrix`` (None without one or an
    entry): calibration mse minimizes the error weighted by it, others do not take it."""
    w = None
    if options.imatrix is not None:
        from .gguf_names import gguf_names
        from .imatrix import weights_for

        alias = gguf_names(str(ckpt.path)).get(name)
        w = weights_for(options.imatrix, (name,) if alias is None else (name, alias),
                        tuple(x.shape))
    kwargs = options.quantize_options(scheme)
    searched = kwargs["calibration"] == "mse" and scheme.offset is None
    return quantize(x, scheme, **kwargs, weights=w if searched else None), w


def _copy_entry(ckpt: Checkpoint, t: TensorInfo) -> HeaderEntry:
    if t.dequantized_on_read:  # written as the float32 values it reads as
        return HeaderEntry(t.name, "F32", t.shape, t.read_nbytes)
    if t.dtype is None:
        raise ckpt.error(t.name, f"dtype {t.dtype_name} cannot be stored in a safetensors file")
    return HeaderEntry(t.name, t.dtype, t.shape, t.nbytes)


def _check_names(ckpt: Checkpoint, layout: list[HeaderEntry], owners: list[str]) -> None:
    seen: dict[str, str] = {}
    for entry, owner in zip(layout, owners):
        if entry.name in seen or entry.name == "__metadata__":
            other = seen.get(entry.name, "the header")
            raise ckpt.error(
                owner,
                f"output name {entry.name!r} is taken twice (by {other!r} and {owner!r}): "
                "rename or --exclude one of them",
            )
        seen[entry.name] = owner


@dataclass
class QuantizeSummary:
    """What a quantize run did: the tensors quantized and copied (names), bytes of tensor
    data read, bytes written, seconds, and each tensor's :class:`~.rules.Decision` (the
    scheme it got, or why it was kept)."""

    quantized: list[str]
    copied: list[str]
    bytes_in: int
    bytes_out: int
    seconds: float
    decisions: list[Decision] = field(default_factory=list)
    files: int = 1


def _summary(decisions: list[Decision], bytes_out: int, t0: float) -> QuantizeSummary:
    return QuantizeSummary(
        [d.tensor.name for d in decisions if d.quantized],
        [d.tensor.name for d in decisions if not d.quantized],
        sum(d.tensor.nbytes for d in decisions),
        bytes_out,
        time.perf_counter() - t0,
        decisions,
    )


def quantize_file(
    src: Any,
    dst: Any,
    scheme: QuantScheme,
    options: FileOptions | None = None,
    *,
    progress: Progress = _no_progress,
    output_format: str | None = None,
) -> QuantizeSummary:
    """Quantize the floating-point tensors of ``src`` that ``options`` selects and write the
    result to ``dst``: blockquant's safetensors layout (:mod:`blockquant.checkpoint.format`),
    or burn's ``.bpk`` (``output_format="burnpack"``, or a ``dst`` ending in ``.bpk``), where
    each quantized tensor is a ``QFloat`` under its own name. One tensor is in memory at a
    time. Raises :class:`CheckpointError` (nothing written) on any problem."""
    options = options or FileOptions()
    if output_format not in (None, *CHOOSABLE):
        raise CheckpointError(dst, None, f"unknown output format {output_format!r}")
    check_output(src, dst)
    fmt = decide_output(src, dst, output_format)
    if not fmt.writes or fmt.name not in CHOOSABLE:
        refuse_model_output(dst, fmt)
    with open_checkpoint(src) as ckpt:
        _check_not_quantized(ckpt)
        decisions = plan(ckpt, scheme, options)  # every decision (and --strict error) first
    options.advise(scheme)
    return write_quantized(src, dst, decisions, options, progress=progress,
                           output_format=fmt.name)


def write_quantized(
    src: Any,
    dst: Any,
    decisions: list[Decision],
    options: FileOptions,
    *,
    progress: Progress = _no_progress,
    output_format: str = "safetensors",
) -> QuantizeSummary:
    """Write ``dst`` (``output_format``: safetensors or burnpack) from ``src`` as planned:
    ``decisions``, one per tensor of ``src`` in file order (:func:`.rules.plan`), made once
    by the caller and handed here (to a worker process, too) rather than made again."""
    t0 = time.perf_counter()
    check_output(src, dst)
    with open_checkpoint(src) as ckpt:
        _check_planned(ckpt, decisions)
        if output_format == "burnpack":
            return _quantize_to_burnpack(ckpt, dst, decisions, options, progress, t0)
        layout: list[HeaderEntry] = []
        owners: list[str] = []
        entries: dict[str, Entry] = {}
        for d in decisions:
            t = d.tensor
            if d.scheme is not None:
                layout += d.parts
                owners += [t.name] * len(d.parts)
                entries[t.name] = Entry(
                    t.name, d.scheme, t.shape, FLOAT_DTYPES[t.read_dtype or ""],
                    {key: p.name for key, p in zip(part_keys(d.scheme), d.parts)},
                    options.quantize_options(d.scheme),
                )
            else:
                layout.append(_copy_entry(ckpt, t))
                owners.append(t.name)
        _check_names(ckpt, layout, owners)
        metadata = dict(ckpt.metadata)
        metadata[META_KEY] = metadata_value(entries)
        with SafetensorsWriter(dst, layout, metadata, force=options.force) as w:
            for d in decisions:
                t = d.tensor
                if d.scheme is not None:
                    blob = memoryview(_quantize_tensor(ckpt, t, d.scheme, options).to_bytes())
                    at = 0
                    for part in d.parts:  # burn's bytes are the parts one after the other
                        w.write(part.name, blob[at: at + part.nbytes])
                        at += part.nbytes
                    del blob
                elif t.dequantized_on_read:
                    w.write(t.name, np.ascontiguousarray(ckpt.read(t.name), "<f4"))
                else:
                    w.write_from(t.name, ckpt, t.name)
                progress(t.name, t.nbytes)
            w.commit()
        bytes_out = os.path.getsize(dst)
    return _summary(decisions, bytes_out, t0)


def _check_planned(ckpt: Checkpoint, decisions: list[Decision]) -> None:
    """The file is still the one planned: the same tensors (names, dtypes, shapes), in order.
    A file replaced between planning and writing is an error, not a wrong output."""
    if [d.tensor for d in decisions] != ckpt.tensors:
        raise ckpt.error(None, "changed since it was read (its tensors are not the ones "
                         "planned); run again")


def _quantize_to_burnpack(
    ckpt: Checkpoint,
    dst: Any,
    decisions: list[Decision],
    options: FileOptions,
    progress: Progress,
    t0: float,
) -> QuantizeSummary:
    plan_: list[tuple[TensorInfo, Any]] = [
        (d.tensor, _quantizer(ckpt, d.tensor, d.scheme, options, progress)
         if d.scheme is not None else None)
        for d in decisions
    ]
    write_burnpack(ckpt, dst, plan_, dict(ckpt.metadata), options.force)
    return _summary(decisions, os.path.getsize(dst), t0)


def _quantizer(
    ckpt: Checkpoint, t: TensorInfo, scheme: QuantScheme, options: FileOptions, progress: Progress
) -> Any:
    """A function that reads and quantizes ``t`` when the writer reaches it."""

    def make() -> Any:
        qt = _quantize_tensor(ckpt, t, scheme, options)
        progress(t.name, t.nbytes)
        return qt

    make.scheme = scheme  # type: ignore[attr-defined]
    return make


def dequantize_file(
    src: Any,
    dst: Any,
    options: FileOptions | None = None,
    *,
    progress: Progress = _no_progress,
    require_quantized: bool = True,
) -> tuple[int, int]:
    """Turn a quantized file back into float tensors (each in its original dtype, or
    ``options.dtype``), copying the other tensors and the metadata (less the ``blockquant``
    key). Returns (tensors dequantized, tensors copied). A file with no quantized tensor is
    an error unless ``require_quantized`` is False (one shard of a folder)."""
    options = options or FileOptions()
    if is_gguf(src):  # llama.cpp's quantized types, dequantized by blockquant.gguf
        return dequantize_gguf(src, dst, options, progress=progress,
                               require_quantized=require_quantized)
    check_output(src, dst)
    if is_burnpack_path(dst):  # a .bpk name holding safetensors would mislead every reader
        raise CheckpointError(
            dst, None, "dequantize writes safetensors: name the output .safetensors"
        )
    with open_checkpoint(src) as ckpt:
        entries = _entries(ckpt)
        if not entries and not layer_count(ckpt) and require_quantized:
            raise ckpt.error(None, "holds no blockquant-quantized tensor (nothing to dequantize)")
        part_of = {p: e.name for e in entries.values() for p in e.parts.values()}
        layout: list[HeaderEntry] = []
        plan: list[tuple[str, str]] = []  # ("deq" | "copy", name), in file order
        for t in ckpt.tensors:
            if t.dequantized_on_read:  # compressed-tensors: in the dtype it dequantizes to
                st = NAME_TO_ST[options.dtype] if options.dtype else (t.dtype or "F32")
                layout.append(HeaderEntry(t.name, st, t.shape, st_nbytes(st, t.shape) or 0))
                plan.append(("read", t.name))
            elif t.name not in part_of:
                layout.append(_copy_entry(ckpt, t))
                plan.append(("copy", t.name))
            elif t.name == entries[part_of[t.name]].parts["values"]:
                e = entries[part_of[t.name]]
                st = NAME_TO_ST[options.dtype or e.dtype]
                layout.append(HeaderEntry(e.name, st, e.shape, st_nbytes(st, e.shape) or 0))
                plan.append(("deq", e.name))
        _check_names(ckpt, layout, [name for _, name in plan])
        metadata = {k: v for k, v in ckpt.metadata.items() if k != META_KEY}
        with SafetensorsWriter(dst, layout, metadata, force=options.force) as w:
            for kind, name in plan:
                if kind == "deq":
                    e = entries[name]
                    w.write(name, _dequantized(_load(ckpt, e), options.dtype or e.dtype))
                    progress(name, sum(ckpt.info(p).nbytes for p in e.parts.values()))
                elif kind == "read":
                    t = ckpt.info(name)
                    dtype = options.dtype or FLOAT_DTYPES[t.dtype or "F32"]
                    w.write(name, float_array(ckpt.read(name), dtype))
                    progress(name, t.nbytes)
                else:
                    w.write_from(name, ckpt, name)
                    progress(name, ckpt.info(name).nbytes)
            w.commit()
    n_deq = sum(1 for k, _ in plan if k in ("deq", "read"))
    return n_deq, len(plan) - n_deq


def _dequantized(qt: Any, dtype: str) -> Any:
    """The tensor in ``dtype`` as the array to write: converted by the core, straight from
    its f32 result (bfloat16 as its U16 bits, which needs ml_dtypes; numpy does it without)."""
    if dtype != "bfloat16":
        return qt.dequantize(dtype)
    try:
        return qt.dequantize(dtype).view(np.uint16)
    except ImportError:
        return float_array(qt.dequantize(), dtype)


def inspect_file(src: Any) -> dict[str, Any]:
    """What a checkpoint holds: per tensor (a quantized one as one row) its scheme (None when
    not quantized), shape, dtype, bytes in the file and bits per value."""
    if is_gguf(src):  # a GGUF tensor's scheme is its ggml type
        return inspect_gguf(src)
    with open_checkpoint(src) as ckpt:
        entries = _entries(ckpt)
        part_of = {p: e.name for e in entries.values() for p in e.parts.values()}
        rows = []
        for t in ckpt.tensors:
            if t.name in part_of:
                e = entries[part_of[t.name]]
                if t.name != e.parts["values"]:
                    continue
                nbytes = sum(ckpt.info(p).nbytes for p in e.parts.values())
                rows.append({"name": e.name, "scheme": str(e.scheme), "shape": list(e.shape),
                             "dtype": e.dtype, "bytes": nbytes, "numel": numel(e.shape)})
            else:
                rows.append({"name": t.name, "scheme": None, "shape": list(t.shape),
                             "dtype": t.dtype_name, "bytes": t.nbytes, "numel": t.numel})
        rows.sort(key=lambda r: natural_key(r["name"]))
        for r in rows:
            r["bits_per_value"] = 8.0 * r["bytes"] / r["numel"] if r["numel"] else None
        return {
            "file": str(src),
            "format": ckpt.format,
            "file_bytes": os.path.getsize(src),
            "metadata": {k: v for k, v in ckpt.metadata.items() if k != META_KEY},
            "tensors": rows,
        }


def report_file(
    src: Any,
    scheme: QuantScheme,
    options: FileOptions | None = None,
    *,
    progress: Progress = _no_progress,
) -> dict[str, Any]:
    """Quantize each selected tensor in memory (nothing written) and measure it: SQNR (dB), max
    abs error, bytes before (in its own dtype) and after (values + scales, burn's layout), and
    quantize time. ``overall`` sums over the quantized tensors; ``file_total`` over every
    tensor; ``kept`` lists the tensors left as they are, with the reason."""
    options = options or FileOptions()
    options.advise(scheme)
    measured = measure_file(src, scheme, options, progress=progress)
    return report_dict(str(src), scheme, options, [measured])


@dataclass
class Measured:
    """One file's measurements, for :func:`report_dict` (a folder's files are summed)."""

    rows: list[dict[str, Any]]
    total: ErrorStats
    decisions: list[Decision]


def measure_file(
    src: Any, scheme: QuantScheme, options: FileOptions, *, progress: Progress = _no_progress
) -> Measured:
    with open_checkpoint(src) as ckpt:
        _check_not_quantized(ckpt, measuring=True)
        decisions = plan(ckpt, scheme, options)  # every --strict error before any work
        rows = []
        total = ErrorStats()
        for d in decisions:
            t = d.tensor
            if d.scheme is None:
                progress(t.name, t.nbytes)
                continue
            x = ckpt.read(t.name)
            t0 = time.perf_counter()
            try:
                qt, w = _quantized(ckpt, t.name, x, d.scheme, options)
            except CheckpointError:
                raise
            except QuantError as e:
                raise ckpt.error(t.name, str(e)) from None
            seconds = time.perf_counter() - t0
            y = qt.dequantize()
            stats = ErrorStats.between(x, y)
            total += stats
            rows.append({"name": t.name, "scheme": str(d.scheme), "shape": list(t.shape),
                         "dtype": t.dtype_name, "sqnr_db": stats.sqnr_db,
                         "max_abs_err": stats.max_abs_err, "bytes_before": t.nbytes,
                         "bytes_after": qt.nbytes,
                         "bits_per_weight": bits_per_weight(qt.nbytes, stats.numel),
                         "seconds": seconds, **importance_row(x, y, w, options.imatrix)})
            del x, y
            progress(t.name, t.nbytes)
    return Measured(rows, total, decisions)


def report_dict(
    src: str, scheme: QuantScheme, options: FileOptions, measured: list[Measured]
) -> dict[str, Any]:
    """The report of one file, or of a folder's files together."""
    rows = sorted((r for m in measured for r in m.rows), key=lambda r: natural_key(r["name"]))
    decisions = [d for m in measured for d in m.decisions]
    total = ErrorStats()
    for m in measured:
        total += m.total
    before = sum(r["bytes_before"] for r in rows)
    after = sum(r["bytes_after"] for r in rows)
    file_bytes = sum(d.tensor.nbytes for d in decisions)
    return {
        "file": src,
        "scheme": str(scheme),
        **options.quantize_options(scheme),
        "tensors": rows,
        "overall": {
            "tensors": len(rows), "numel": total.numel, "sqnr_db": total.sqnr_db,
            "max_abs_err": total.max_abs_err, "bytes_before": before, "bytes_after": after,
            "bits_per_weight": bits_per_weight(after, total.numel),
            "seconds": sum(r["seconds"] for r in rows), **importance_overall(rows),
        },
        "file_total": {
            "tensors": len(decisions), "unquantized": len(decisions) - len(rows),
            "bytes_before": file_bytes,
            "bytes_after": after + file_bytes - before,
        },
        "kept": [{"name": d.tensor.name, "why": d.why, "detail": d.detail}
                 for d in decisions if d.scheme is None],
    }
