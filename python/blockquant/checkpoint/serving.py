"""What the serving formats' folder outputs share (compressed-tensors for vLLM and transformers,
:mod:`.ct_folder`; MLX for mlx-lm, :mod:`.mlx_folder`): a model folder in, a model folder out,
each shard rewritten with its quantized layers in the format's own tensors and ``config.json``
given the format's quantization entry.

:class:`ServingRun` writes one as every folder output is written: into a hidden folder renamed
into place at the end, shards in ``--jobs`` processes, other files copied, indexes rewritten, file
modes kept. A format gives the config it writes (:meth:`ServingRun.config_out`) and the task that
writes one shard (:meth:`ServingRun.shard_task`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .base import CheckpointError
from .ct_read import CONFIG, read_config, write_config
from .folders import (
    FilePlan,
    FolderSummary,
    FolderTarget,
    ModelFolder,
    _copy,
    _same_mode,
    _write_index,
)
from .formats import Format
from .jobs import RunStats, Task, TensorProgress, run_tasks
from .options import FileOptions
from .rules import Decision


@dataclass
class ServingRun:
    """A serving-format run, planned: the folder's files and each tensor's decision."""

    src: Path
    dst: Path
    folder: ModelFolder
    files: list[FilePlan]
    options: FileOptions
    config: dict[str, Any]

    format: ClassVar[Format]  # each format's run names its own
    into_folder: ClassVar[bool] = True

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes_in for f in self.files)

    def decisions(self) -> list[tuple[str, Decision]]:
        return [(f.rel, d) for f in self.files for d in f.decisions]

    def config_out(self) -> dict[str, Any]:
        """config.json as written: the input's, with the format's quantization entry."""
        raise NotImplementedError

    def shard_task(self, f: FilePlan, out: Path) -> Task:
        """The task that writes ``f``'s output shard to ``out``."""
        raise NotImplementedError

    def prepare(self, jobs: int, threads: int | None) -> None:
        """Work done over the whole model before any shard is written (NVFP4's global scales)."""

    def run(self, *, jobs: int = 1, threads: int | None = None,
            progress: TensorProgress = lambda *a: None) -> FolderSummary:
        t0 = time.perf_counter()
        stats = RunStats()
        self.prepare(jobs, threads)
        with FolderTarget(self.dst, self.src, self.options.force) as target:
            for sub in self.folder.folders:
                os.makedirs(target.tmp / sub, exist_ok=True)
            copied = [rel for rel in self.folder.others if rel != CONFIG]
            for rel in copied:
                _copy(self.folder.path(rel), target.tmp / rel)
            write_config(target.tmp / CONFIG, self.config_out())
            tasks = [self.shard_task(f, target.tmp / f.rel) for f in self.files]
            results = run_tasks(tasks, jobs, threads, progress, stats)
            for rel in self.folder.indexes:
                _write_index(self.folder, rel, target.tmp)
            for rel in [*copied, CONFIG, *self.folder.indexes, *(f.rel for f in self.files)]:
                _same_mode(self.folder.path(rel), target.tmp / rel)
            bytes_out = sum(os.path.getsize(target.tmp / f.rel) for f in self.files)
            target.commit()
        decisions = [d for _, d in self.decisions()]
        return FolderSummary(
            [d.tensor.name for d in decisions if d.quantized],
            [d.tensor.name for d in decisions if not d.quantized],
            sum(r for r in results), bytes_out, time.perf_counter() - t0, decisions,
            len(self.files), [*copied, CONFIG], self.folder.skipped, stats)


def model_config(src: Path, dst: Path, what: str, reader: str) -> dict[str, Any]:
    """The config.json of the model folder ``src`` a ``what`` output is planned from, checked:
    ``src`` is a folder with a config.json (``reader`` reads it), not already quantized (a
    ``quantization_config``, or MLX's ``quantization``), and ``dst`` is not a file."""
    if not src.is_dir():
        raise CheckpointError(src, None, f"{what} output is a model folder (config.json "
                              "beside the weights): IN must be one")
    cfg = read_config(src)
    if cfg is None:
        raise CheckpointError(src / CONFIG, None, f"not found: {reader} the model's "
                              "config.json")
    for key in ("quantization_config", "quantization"):  # MLX's is "quantization"
        q = cfg.get(key)
        if isinstance(q, dict):
            method = q.get("quant_method") or q.get("mode") or ("affine" if "bits" in q else "?")
            raise CheckpointError(src / CONFIG, None, f"already holds a {key} ({method}): the "
                                  "model is quantized (blockquant dequantize it first)")
    if dst.exists() and not dst.is_dir():
        raise CheckpointError(dst, None, f"exists and is not a folder ({what} output is a "
                              "folder)")
    return cfg


def check_rule_options(options: FileOptions, name: str, unit: str, own: str,
                       rules: bool) -> None:
    """The options a serving format refuses, one line each: the roundings it fixes (and
    ``--rule`` unless it takes ``rules``), a calibration other than minmax (``own``: its own
    rule) and mse. ``name`` and ``unit`` say whose ("MLX", "mode")."""
    flags = (() if rules else (("--rule", options.rules),)) + (
        ("--rounding", options.rounding), ("--scale-rounding", options.scale_rounding))
    for flag, given in flags:
        if given:
            raise CheckpointError(flag, None, f"{name} fixes each {unit}'s layout and rounding; "
                                  "--calibration minmax gives its own scales, the default "
                                  "searches for better ones")
    if options.calibration not in (None, "minmax", "mse"):
        raise CheckpointError("--calibration", None, f"{name} output takes minmax ({own}) or "
                              "mse (searched scales, the default)")
