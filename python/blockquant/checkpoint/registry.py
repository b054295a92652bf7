"""The front door for files: the command and the Python API (``bq.quantize_file``,
``bq.dequantize_file``) both come in here, for quantize, dequantize, inspect and report.

:func:`plan_quantize` decides the output format (:func:`.formats.output_format`, the one place
that does), hands the request to that format's planner, and returns the run it planned, once:
a checkpoint :class:`.folders.Plan` (safetensors, burn-pack, model folders), a
:class:`GGUFRun` (llama-quantize's way) or an :class:`OnnxRun`. Each has
``run(jobs=, threads=, progress=)``; its decisions are what a dry run shows,
and running it writes exactly what was planned (the workers of ``--jobs`` get the plan, they
do not make it again).

A new output format is a :class:`.formats.Format` entry and a planner in :data:`PLANNERS`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Union

from ..errors import QuantError
from ..presets import resolve
from ..scheme import QuantScheme
from .base import CheckpointError
from .folders import Plan
from .folders import plan_quantize as plan_checkpoint
from .formats import (
    BURNPACK,
    COMPRESSED_TENSORS,
    FOLDER,
    GGUF,
    MLX,
    ONNX,
    SAFETENSORS,
    Format,
    check_output_name,
    output_format,
)
from .gguf_mixes import MixOptions
from .options import FileOptions

__all__ = ["Entry", "GGUFRun", "OnnxRun", "QuantizeRequest", "ReportRun", "entries", "inspect",
           "plan_dequantize", "plan_quantize", "plan_report", "resolve_scheme"]


@dataclass(frozen=True)
class QuantizeRequest:
    """Everything a quantize run is asked to do, from the command's arguments or the API's.

    ``scheme``: a :class:`QuantScheme`, a preset name or a scheme text (for a GGUF output one
    of llama.cpp's file types, ``Q4_K_M``, or a ggml type); None only for an ONNX model (its
    default scheme). ``allow_requantize`` and ``gguf`` (llama-quantize's options: ``--pure``,
    ``--tensor-type``, ...): GGUF only. ``onnx_op``, ``onnx_fp4``, ``external_data``: ONNX only
    (see :func:`blockquant.onnx.quantize_model`)."""

    src: Any
    dst: Any
    scheme: Union[QuantScheme, str, None]
    options: FileOptions = FileOptions()
    output_format: str | None = None
    allow_requantize: bool = False
    onnx_op: str = "qdq"
    onnx_fp4: str = "lookup"
    external_data: bool | None = None
    gguf: MixOptions = MixOptions()


def resolve_scheme(scheme: Union[QuantScheme, str]) -> QuantScheme:
    """``scheme`` resolved; an unknown preset or a bad scheme text is a CheckpointError naming
    the option, as every other problem of a run."""
    try:
        return resolve(scheme)
    except QuantError as e:
        raise CheckpointError("--scheme", None, str(e)) from None


def plan_quantize(req: QuantizeRequest) -> Any:
    """The run ``req`` asks for, planned once (nothing written yet)."""
    fmt = output_format(req.src, req.dst, req.output_format)
    if req.scheme is None and fmt != ONNX:
        raise _no_scheme()
    if fmt != GGUF and req.gguf.given():
        raise CheckpointError(req.gguf.given()[0], None, "is llama-quantize's option, for a "
                              ".gguf output only")
    if fmt != GGUF:
        _check_imatrix(req.options)
    return PLANNERS[fmt](req, fmt)


def _check_imatrix(options: FileOptions) -> None:
    """The importance matrix read (and checked) once, before any tensor: a bad file is its own
    error, not the first tensor's."""
    if options.imatrix is not None:
        from .imatrix import load

        load(options.imatrix)


def _no_scheme() -> CheckpointError:
    from ..onnx.quantize import DEFAULT_SCHEME

    return CheckpointError("--scheme", None, "is required: a preset or a scheme text (only an "
                           f"ONNX model has a default, {DEFAULT_SCHEME}; --target-bpw plans "
                           "each tensor's)")


def _onnx_scheme(scheme: Union[QuantScheme, str, None]) -> QuantScheme:
    """An ONNX run's scheme: the one named, else blockquant.onnx's default."""
    from ..onnx.quantize import DEFAULT_SCHEME

    return resolve_scheme(DEFAULT_SCHEME if scheme is None else scheme)


def _plan_checkpoint(req: QuantizeRequest, fmt: Format) -> Plan:
    from .gguf_reader import is_gguf

    options = req.options
    if req.allow_requantize:
        if not is_gguf(req.src):
            raise CheckpointError("--allow-requantize", None, "only a GGUF input holds tensors "
                                  "of another tool's quantized types to requantize")
        options = replace(options, allow_requantize=True)
    scheme = resolve_scheme(req.scheme)
    plan = plan_checkpoint(req.src, req.dst, scheme, options, output_format=req.output_format)
    options.advise(scheme)
    if fmt == BURNPACK:
        from .burnpack_file import check_block_dims

        check_block_dims(req.dst, {d.scheme for _, d in plan.decisions()})
    return plan


# --- GGUF: llama-quantize's way ------------------------------------------------------------------


@dataclass
class GGUFRun:
    """A GGUF output, planned: each tensor's decision, made once from the input's header (a
    GGUF file requantized, or a safetensors checkpoint converted: ``convert``)."""

    src: Any
    dst: Any
    mix: Any  # gguf_mixes.Mix
    decisions: list[Any]
    options: FileOptions
    allow_requantize: bool
    convert: Any = None  # gguf_convert.Conversion of a safetensors input
    format: Format = GGUF

    @property
    def target(self) -> str:
        return str(self.mix.name)

    @property
    def total_bytes(self) -> int:
        return sum(d.tensor.nbytes for d in self.decisions)

    def run(self, *, jobs: int = 1, threads: int | None = None,
            progress: Callable[[str, int], None] | None = None) -> Any:
        from .._threads import bounded

        with bounded(threads):
            if self.convert is not None:
                from .gguf_convert import write_gguf

                return write_gguf(self.convert, self.dst, self.mix, self.options,
                                  progress=progress, decisions=self.decisions)
            from .gguf_file import requantize_gguf

            return requantize_gguf(self.src, self.dst, self.mix, self.options,
                                   allow_requantize=self.allow_requantize, progress=progress,
                                   decisions=self.decisions)


def ggml_type(text: Any) -> Any:
    """The ggml type a ``--scheme`` text names (any case), or None."""
    from ..gguf import TYPES

    return TYPES.get(str(text).upper())


def gguf_options(req: QuantizeRequest) -> tuple[FileOptions, Any]:
    """The file options a GGUF run takes and its mix (:mod:`.gguf_mixes`); blockquant's scheme
    options are refused."""
    from .gguf_mixes import file_type, mix_of

    o = req.options
    for flag, given in (("--calibration", o.calibration), ("--rounding", o.rounding),
                        ("--scale-rounding", o.scale_rounding), ("--format", req.output_format)):
        if given:
            raise CheckpointError(flag, None, "GGUF files take ggml's types, whose rules are fixed")
    if ggml_type(req.scheme) is None and file_type(req.scheme) is None:
        from ..presets import PRESET_NEAREST_GGML

        text = str(req.scheme)
        if text.lower() in PRESET_NEAREST_GGML:
            raise CheckpointError("--scheme", None, f"{text} is a blockquant preset, for "
                                  "safetensors and burn-pack outputs; a GGUF output takes "
                                  "llama.cpp's file types (Q4_K_M ...) or ggml types, the "
                                  f"nearest here {PRESET_NEAREST_GGML[text.lower()]}")
    mix = mix_of(req.scheme, req.gguf, o.rules, has_imatrix=o.imatrix is not None)
    return FileOptions(include=o.include, exclude=o.exclude, min_rank=o.min_rank,
                       strict=o.strict, force=o.force, imatrix=o.imatrix), mix


def not_gguf_reason(path: Any) -> str:
    try:
        if os.path.exists(path) and not os.path.isfile(path):  # a pipe would block the open
            return "not a regular file"
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return e.strerror or type(e).__name__
    return "empty file" if not head else f"it starts with {head!r}, not b'GGUF'"


def _plan_gguf(req: QuantizeRequest, fmt: Format) -> GGUFRun:
    from .gguf_file import GGUFCheckpoint, plan_requantize
    from .gguf_reader import is_gguf, is_gguf_path

    src = req.src
    if not is_gguf(src):
        if is_gguf_path(src) or (os.path.exists(src) and not os.path.isfile(src)
                                 and not os.path.isdir(src)):
            raise CheckpointError(src, None, f"not a GGUF file ({not_gguf_reason(src)})")
        from .gguf_convert import plan_convert

        options, mix = gguf_options(req)
        if req.allow_requantize:
            raise CheckpointError("--allow-requantize", None, "only a GGUF input holds "
                                  "tensors of another tool's quantized types to requantize")
        conversion, decisions = plan_convert(src, mix, options)
        return GGUFRun(src, req.dst, mix, decisions, options, False, conversion)
    options, mix = gguf_options(req)
    with GGUFCheckpoint(Path(src)) as ckpt:
        decisions = plan_requantize(ckpt, mix, options, req.allow_requantize)
    return GGUFRun(src, req.dst, mix, decisions, options, req.allow_requantize)


# --- ONNX models ---------------------------------------------------------------------------------


@dataclass
class OnnxRun:
    """An ONNX model's weights to quantize. The model is read and its weights decided once:
    by :meth:`weights` for a dry run, or by the run itself, which checks the output first and
    decides again only after onnx's version converter has made new nodes."""

    src: Any
    dst: Any
    scheme: QuantScheme
    options: FileOptions
    form: str
    fp4: str
    external_data: bool | None
    format: Format = ONNX

    def weights(self) -> list[Any]:
        from ..onnx.model import load, plan

        return plan(load(self.src), self.scheme, self.options, self.form, self.src)

    def run(self, *, jobs: int = 1, threads: int | None = None, progress: Any = None) -> Any:
        from .._threads import bounded
        from ..onnx.quantize import quantize_model

        with bounded(threads):
            return quantize_model(self.src, self.dst, self.scheme, form=self.form, fp4=self.fp4,
                                  external_data=self.external_data, options=self.options)


def _plan_onnx(req: QuantizeRequest, fmt: Format) -> OnnxRun:
    for flag, given in (("--format", req.output_format),
                        ("--allow-requantize", req.allow_requantize),
                        ("--strict", req.options.strict)):
        if given:
            raise CheckpointError(flag, None, "does not apply to ONNX models")
    if not ONNX.named_by(req.dst) or not ONNX.named_by(req.src):
        raise CheckpointError(req.dst, None, "an ONNX model is quantized into an ONNX model:"
                              " name both IN and OUT .onnx")
    return OnnxRun(req.src, req.dst, _onnx_scheme(req.scheme), req.options, req.onnx_op,
                   req.onnx_fp4, req.external_data)


# --- the other commands: inspect, dequantize, report --------------------------------------------


def inspect(path: Any) -> dict[str, Any]:
    """What ``path`` holds, per tensor (``blockquant inspect``)."""
    if ONNX.named_by(path):
        from ..onnx import inspect_model

        return inspect_model(path)  # type: ignore[no-any-return]
    from .folders import inspect_path

    return inspect_path(path)


def plan_dequantize(src: Any, dst: Any, options: FileOptions) -> Plan:
    """A dequantize run (``blockquant dequantize``), planned once."""
    if ONNX.named_by(src):
        raise CheckpointError(src, None, "an ONNX model's weights are dequantized by its "
                              "DequantizeLinear/MatMulNBits nodes when it runs; blockquant "
                              "dequantize reads safetensors, .bpk and .gguf (inspect and report "
                              "read .onnx)")
    from .folders import plan_dequantize as plan_checkpoint_dequantize

    check_output_name(dst, "safetensors (.safetensors), or a folder of them (OUT ending in /)")
    return plan_checkpoint_dequantize(src, dst, options)


@dataclass
class ReportRun:
    """A report (``blockquant report``): quantize in memory and measure, nothing written.
    ``progress`` takes (file, tensor name, input bytes)."""

    src: Any
    kind: str  # "onnx", "gguf" or "checkpoint"
    scheme: Any
    options: FileOptions
    total_bytes: int = 0

    def run(self, *, jobs: int = 1, threads: int | None = None, progress: Any = None) -> Any:
        from .._threads import bounded

        def each(name: str, n: int) -> None:
            if progress is not None:
                progress(None, name, n)

        if self.kind == "onnx":
            from ..onnx import report_model

            with bounded(threads):
                return report_model(self.src, self.scheme, options=self.options)
        if self.kind == "gguf":
            from .gguf_report import report_gguf

            with bounded(threads):
                return report_gguf(self.src, self.scheme, self.options, progress=each)
        from .folders import report_path

        return report_path(self.src, self.scheme, self.options, jobs=jobs, threads=threads,
                           progress=progress if progress is not None else (lambda *a: None))


def plan_report(src: Any, scheme: Any, options: FileOptions,
                gguf: MixOptions | None = None) -> ReportRun:
    """A report of ``src`` under ``scheme``: for a GGUF file with a ggml type, ggml's rules;
    for an ONNX model its weights; else blockquant's scheme on every checkpoint tensor."""
    from .gguf_reader import is_gguf

    if ONNX.named_by(src):
        return ReportRun(src, "onnx", _onnx_scheme(scheme), options)
    if scheme is None:
        raise _no_scheme()
    from .gguf_mixes import file_type

    gguf = gguf or MixOptions()
    _check_imatrix(options)
    gguf_in = is_gguf(src)
    if gguf_in and (ggml_type(scheme) is not None or file_type(scheme) is not None):
        file_options, mix = gguf_options(QuantizeRequest(src, None, scheme, options, gguf=gguf))
        return ReportRun(src, "gguf", mix, file_options)
    if gguf.given():
        raise CheckpointError(gguf.given()[0], None, "is llama-quantize's option, for a GGUF "
                              "input measured with a ggml type or file type")
    try:
        resolved = resolve_scheme(scheme)
    except CheckpointError as e:
        if not gguf_in:
            raise
        from ..gguf import TYPES  # neither: name both kinds of scheme a GGUF file takes

        raise CheckpointError("--scheme", None, f"{e.reason}; or, for a GGUF file, one of "
                              "llama.cpp's file types (Q4_K_M, Q5_K_S, IQ4_XS, ...) or one of "
                              f"ggml's types ({', '.join(t.lower() for t in TYPES)})") from None
    from .folders import plan_report as plan_checkpoint_report

    # A report measures what requantizing would do: a GGUF file's quantized tensors are taken
    # from their dequantized values, as llama-quantize's report does.
    options = replace(options, allow_requantize=True)
    total = sum(f.bytes_in for f in plan_checkpoint_report(src, resolved, options))
    options.advise(resolved)
    return ReportRun(src, "checkpoint", resolved, options, total)


# --- compressed-tensors folders (vLLM, transformers) -------------------------------------------


def _plan_ct(req: QuantizeRequest, fmt: Format) -> Any:
    from .ct_folder import plan_ct

    if req.allow_requantize:
        raise CheckpointError("--allow-requantize", None, "does not apply to compressed-tensors "
                              "output")
    return plan_ct(req.src, req.dst, req.scheme, req.options)


def _plan_mlx(req: QuantizeRequest, fmt: Format) -> Any:
    from .mlx_folder import plan_mlx

    if req.allow_requantize:
        raise CheckpointError("--allow-requantize", None, "does not apply to MLX output")
    return plan_mlx(req.src, req.dst, req.scheme, req.options)


#: The planner of each output format.
PLANNERS: dict[Format, Callable[[QuantizeRequest, Format], Any]] = {
    SAFETENSORS: _plan_checkpoint,
    BURNPACK: _plan_checkpoint,
    FOLDER: _plan_checkpoint,
    GGUF: _plan_gguf,
    ONNX: _plan_onnx,
    COMPRESSED_TENSORS: _plan_ct,
    MLX: _plan_mlx,
}


@dataclass(frozen=True)
class Entry:
    """One format at the front door, whole: how it is recognised (``format``: extensions,
    magic), what reads it (``reader``: a checkpoint class, None for a model or a folder, which
    their commands read), and what plans a quantize run that writes it (``plan``, None when
    nothing writes it)."""

    format: Format
    reader: Any
    plan: Callable[[QuantizeRequest, Format], Any] | None


def entries() -> dict[str, Entry]:
    """Every format, by name, with its reader and its planner: the one table a new format
    joins (its ``Format``, a reader in :data:`.readers.READERS`, a planner in
    :data:`PLANNERS`)."""
    from .formats import FORMATS
    from .readers import READERS

    return {f.name: Entry(f, READERS.get(f.name), PLANNERS.get(f)) for f in FORMATS}
