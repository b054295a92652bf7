"""Checkpoint files and model folders from Python: what the ``blockquant`` command does, as
functions (``bq.quantize_file``, ``bq.dequantize_file``, ``bq.load``).

    import blockquant as bq
    bq.quantize_file("model/", "model-nvfp4/", "nvfp4", rules={"embed": "int8"})
    tensors = bq.load("model-nvfp4/")
    tensors["model.layers.0.mlp.up_proj.weight"].dequantize()

Every problem with an input, a scheme or an output raises :class:`CheckpointError` (a
:class:`QuantError`) naming the file and the tensor, and writes nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

import numpy as np

from .checkpoint import CheckpointError, FileOptions, open_checkpoint
from .checkpoint.burnpack_file import BurnpackCheckpoint
from .checkpoint.folders import (
    DequantizeSummary,
    FolderSummary,
    Plan,
    refuse_empty,
    scan_folder,
)
from .checkpoint.format import load_qtensor, read_entries
from .checkpoint.gguf_mixes import MixOptions
from .checkpoint.jobs import check_counts
from .checkpoint.registry import QuantizeRequest, plan_dequantize, plan_quantize
from .options import Calibration, Rounding, ScaleRounding
from .progress import Progress
from .qtensor import QTensor
from .scheme import QuantScheme

__all__ = ["DequantizeSummary", "FolderSummary", "dequantize_file", "load", "quantize_file"]

#: progress=: False (nothing), True (a bar on a terminal), or a function called after each
#: tensor with (file, tensor name, input bytes): the output file it goes to, by its path in the
#: output folder (a single file: its name).
ProgressArg = Union[bool, Callable[[Any, str, int], None]]


def quantize_file(
    src: Union[str, os.PathLike[str]],
    dst: Union[str, os.PathLike[str]],
    scheme: Union[QuantScheme, str],
    *,
    rules: Any = None,
    include: str | None = None,
    exclude: str | None = None,
    min_rank: int = 2,
    strict: bool = False,
    calibration: Calibration | None = None,
    rounding: Rounding | None = None,
    scale_rounding: ScaleRounding | None = None,
    force: bool = False,
    output_format: str | None = None,
    allow_requantize: bool = False,
    jobs: int = 1,
    threads: int | None = None,
    dry_run: bool = False,
    progress: ProgressArg = False,
    imatrix: Union[str, os.PathLike[str], None] = None,
    pure: bool = False,
    tensor_types: Any = (),
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
) -> FolderSummary:
    """Quantize the checkpoint file or model folder ``src`` into ``dst``, as
    ``blockquant quantize`` does (docs/cli.md): the tensors of rank >= ``min_rank`` get
    ``scheme`` unless the first matching rule says otherwise; the rest are copied.

    - ``src``: a ``.safetensors``, ``.npz``, ``.npy`` or burn ``.bpk`` file, or a model folder
      (``model.safetensors``, or shards and ``model.safetensors.index.json``).
    - ``dst``: a file (``.safetensors``, or ``.bpk`` for burn), or a folder: always when
      ``src`` is a folder; for a file, when ``dst`` ends in ``/`` or is an existing folder.
      A ``.gguf`` ``dst`` is written as llama-quantize writes one, from a GGUF ``src`` or a
      safetensors file or folder, ``scheme`` one of llama.cpp's file types (``"Q4_K_M"``: a mix
      of ggml types, docs/gguf.md) or a ggml type; an ONNX model goes to an ``.onnx`` ``dst``,
      as the command does (their summaries are
      :class:`blockquant.checkpoint.gguf_file.GGUFSummary` and
      :class:`blockquant.onnx.OnnxSummary`).
    - ``scheme``: a :class:`QuantScheme`, a preset name or a scheme text.
    - ``rules``: per-tensor schemes, the first match (``re.search``) wins: a mapping
      ``{regex: scheme}``, or a list of ``"REGEX=SCHEME"`` strings or (regex, scheme) pairs; a
      scheme may be ``"keep"`` (whatever the rank), and a rule takes tensors of rank
      >= ``min_rank`` unless its scheme text ends in ``@N`` (``{"bias$": "int8@1"}``).
    - ``include`` / ``exclude``: regular expressions choosing the tensors considered at all.
    - ``strict``: a tensor its scheme cannot take is an error, not kept.
    - ``calibration``, ``rounding``, ``scale_rounding``: as for :func:`blockquant.quantize`.
    - ``force``: replace an existing ``dst`` (never the input).
    - ``allow_requantize``: quantize a GGUF ``src``'s already-quantized tensors (Q4_0, ...)
      from their dequantized values; without it such a tensor is an error. The ones kept are
      written as float32 (their dequantized values) into safetensors and burn-pack outputs.
    - ``jobs``, ``threads``: files converted at once (processes), kernel threads in all.
    - ``dry_run``: decide everything and return the summary with the expected sizes; write
      nothing.
    - ``imatrix``: llama.cpp's importance matrix file: calibration ``"mse"`` minimizes the
      error weighted by it (a GGUF ``dst`` refuses it).
    - ``pure``, ``tensor_types`` (``"PATTERN=TYPE"`` texts), ``output_tensor_type``,
      ``token_embedding_type``: llama-quantize's options, for a ``.gguf`` ``dst`` only.

    Returns a summary: ``quantized`` and ``copied`` tensor names, ``decisions`` (each tensor's
    scheme, or why it was kept), ``bytes_in``, ``bytes_out`` and ``seconds``."""
    check_counts(jobs, threads)
    options = FileOptions(include=include, exclude=exclude, calibration=calibration,
                          rounding=rounding, scale_rounding=scale_rounding, force=force,
                          rules=rules, min_rank=min_rank, strict=strict, imatrix=imatrix)
    gguf = MixOptions(pure, (tensor_types,) if isinstance(tensor_types, str) else
                      tuple(tensor_types), output_tensor_type, token_embedding_type)
    run = plan_quantize(QuantizeRequest(src, dst, scheme, options, output_format=output_format,
                                        allow_requantize=allow_requantize, gguf=gguf))
    from .checkpoint.ct_folder import CtRun

    if not isinstance(run, (Plan, CtRun)):  # GGUF or ONNX: their own summaries
        if dry_run:
            raise CheckpointError(dst, None, "dry_run= covers checkpoint and folder outputs; "
                                  "the command's --dry-run shows a GGUF or ONNX plan")
        return run.run(jobs=jobs, threads=threads)  # type: ignore[no-any-return]
    if dry_run:
        decisions = [d for _, d in run.decisions()]
        return FolderSummary(
            [d.tensor.name for d in decisions if d.quantized],
            [d.tensor.name for d in decisions if not d.quantized],
            run.total_bytes, sum(d.bytes_after for d in decisions), 0.0, decisions,
            len(run.files))
    reporter = _reporter(progress, run.total_bytes, "quantize")
    try:
        result: Any = run.run(jobs=jobs, threads=threads, progress=reporter)
        return result
    finally:
        getattr(reporter, "close", lambda: None)()


def dequantize_file(
    src: Union[str, os.PathLike[str]],
    dst: Union[str, os.PathLike[str]],
    *,
    dtype: Any = None,
    force: bool = False,
    jobs: int = 1,
    threads: int | None = None,
    progress: ProgressArg = False,
) -> DequantizeSummary:
    """Turn a file or folder written by :func:`quantize_file` back into float tensors, each in
    its original dtype or ``dtype`` (``"float16"``, ``"bfloat16"``, ``np.float32``, ...).
    Other tensors, files and metadata are copied (less the ``blockquant`` metadata key).
    Returns a summary: ``dequantized`` and ``copied`` counts, ``bytes_out``, ``seconds``."""
    check_counts(jobs, threads)
    plan = plan_dequantize(src, dst, FileOptions(dtype=dtype, force=force))
    reporter = _reporter(progress, plan.total_bytes, "dequantize")
    try:
        result: Any = plan.run(jobs=jobs, threads=threads, progress=reporter)
        return result
    finally:
        getattr(reporter, "close", lambda: None)()


def load(path: Union[str, os.PathLike[str]]) -> dict[str, Union[QTensor, np.ndarray]]:
    """Every tensor of a checkpoint file or model folder, by name: a quantized tensor (of a
    blockquant ``.safetensors`` file, or a burn ``.bpk`` ``QFloat``) as a :class:`QTensor`,
    checked and with its scales decoded; any other as a numpy array. BF16 arrays come back as
    ``ml_dtypes.bfloat16`` when ml_dtypes is installed, else as float32 (exactly).

    Everything is read into memory; a folder's files are read in turn and their names must not
    repeat. ``bq.load(p)[name].dequantize()`` gives the float tensor back."""
    refuse_empty(path)
    p = Path(path)
    if p.is_dir():
        folder = scan_folder(p)
        out: dict[str, Union[QTensor, np.ndarray]] = {}
        for rel in folder.checkpoints:
            for name, value in _load_file(folder.path(rel)).items():
                if name in out:
                    raise CheckpointError(folder.path(rel), name, "is in another file of the "
                                          "folder too")
                out[name] = value
        return out
    return _load_file(p)


def _load_file(path: Path) -> dict[str, Union[QTensor, np.ndarray]]:
    with open_checkpoint(path) as ckpt:
        if isinstance(ckpt, BurnpackCheckpoint):
            entries = ckpt.entries()
            load_one: Callable[[Any], QTensor] = ckpt.load_qtensor
        else:
            entries = read_entries(ckpt)

            def load_one(e: Any) -> QTensor:
                return load_qtensor(ckpt, e)

        part_of = {p: e for e in entries.values() for p in e.parts.values()}
        out: dict[str, Union[QTensor, np.ndarray]] = {}
        for t in ckpt.tensors:
            e = part_of.get(t.name)
            if e is None:
                arr = ckpt.read(t.name)
                out[t.name] = _bfloat16(arr) if t.dtype == "BF16" else arr
            elif t.name == e.parts["values"]:
                out[e.name] = load_one(e)
        return out


def _bfloat16(arr: np.ndarray) -> np.ndarray:
    try:
        import ml_dtypes
    except ImportError:
        return arr
    return arr.astype(ml_dtypes.bfloat16)  # exact: the float32 came from bfloat16 bits


def _reporter(progress: ProgressArg, total: int, label: str) -> Any:
    if callable(progress):
        return progress
    if progress:
        return Progress(total, label)
    return lambda file, name, nbytes: None
