"""Size-target plans over a model (``blockquant plan MODEL --target-bpw 4.25``): measure every
eligible tensor under every candidate (:mod:`.plan_measure`, a shard a task in ``--jobs``
processes), choose (:mod:`.plan_alloc`), and compare with each candidate alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import CheckpointError
from .folders import scan_folder
from .formats import GGUF, ONNX
from .jobs import RunStats, Task, TensorProgress, run_tasks
from .options import FileOptions
from .plan_alloc import DEFAULT_FLOORS, PlanResult, allocate, rules_text, uniform
from .plan_measure import (
    KIND_OF_FORMAT,
    Candidate,
    TensorMeasure,
    candidates,
    eligible,
    measure_file,
    pattern_list,
)
from .readers import open_checkpoint


@dataclass
class PlanRequest:
    """What to plan: ``src`` (a file or a model folder) for the output format ``fmt``
    (safetensors, burnpack, gguf, mlx) at ``target_bpw`` bits a weight."""

    src: Any
    target_bpw: float
    fmt: str | None = None
    candidates: Any = None
    floors: Any = None  # ["REGEX=BPW", ...]; None: DEFAULT_FLOORS
    keep: Any = ()
    options: FileOptions = field(default_factory=FileOptions)  # --imatrix weighs the errors


def _llama_keeps(gguf_name: str) -> bool:
    """Whether llama-quantize leaves the tensor of this GGUF name alone (position embeddings,
    routers, ...): the GGUF output keeps it whatever a plan says, so a plan leaves it out."""
    from .gguf_file import LEFT_AS_THEY_ARE, LEFT_AS_THEY_ARE_NAMES

    return gguf_name in LEFT_AS_THEY_ARE_NAMES or any(p in gguf_name for p in LEFT_AS_THEY_ARE)


def _floors(given: Any) -> tuple[tuple[re.Pattern[str], float], ...]:
    if given is None:
        return tuple((re.compile(p), f) for p, f in DEFAULT_FLOORS)
    out = []
    for item in given:
        regex, eq, value = str(item).rpartition("=")
        try:
            bpw = float(value)
        except ValueError:
            bpw = -1.0
        if not eq or not regex or not (bpw >= 0):
            raise CheckpointError("--floor", None, f"{item!r} is not REGEX=BITS (the least "
                                  "bits a weight of the tensors it matches)")
        out.append((pattern_list([regex], "--floor")[0], bpw))
    return tuple(out)


@dataclass
class ModelPlan:
    """A measured and chosen plan, with the uniform plans of each candidate beside it."""

    src: Path
    kind: str
    fmt: str
    cands: tuple[Candidate, ...]
    result: PlanResult
    uniform: dict[str, PlanResult]
    stats: RunStats
    # The names the output's rules see, where they are not the input's: a safetensors model
    # written as GGUF takes rules by its GGUF names (blk.0.attn_q.weight).
    rule_names: dict[str, str] = field(default_factory=dict)

    def rules(self) -> str:
        header = [f"blockquant plan of {self.src} for {self.fmt} output: target "
                  f"{self.result.target_bpw:g} bits a weight, candidates "
                  f"{','.join(c.name for c in self.cands)}",
                  f"planned: {self.result.bpw:.4f} bits a weight, SQNR "
                  f"{self.result.sqnr_db:.2f} dB over {len(self.result.choice)} tensors",
                  "quantize with: blockquant quantize MODEL -o OUT --rules-file THIS_FILE ..."]
        return rules_text(self.result, header, self.rule_names)


def plan_model(req: PlanRequest, *, jobs: int = 1, threads: int | None = None,
               progress: TensorProgress = lambda *a: None) -> ModelPlan:
    """Measure and choose (module docstring). Every refusal is a CheckpointError."""
    src = Path(req.src)
    if ONNX.named_by(src):
        raise CheckpointError(src, None, "plans are made for safetensors, Burnpack, GGUF and "
                              "MLX output; an ONNX model takes --scheme and --rule")
    fmt = req.fmt or ("gguf" if GGUF.named_by(src) else "safetensors")
    if fmt not in KIND_OF_FORMAT:
        raise CheckpointError("--format", None, f"plans are made for "
                              f"{', '.join(sorted(KIND_OF_FORMAT))} output, not {fmt}")
    kind = KIND_OF_FORMAT[fmt]
    cands = candidates(req.candidates, kind)
    floors, keep = _floors(req.floors), pattern_list(req.keep, "--keep")
    if src.is_dir():
        folder = scan_folder(src)
        paths = [(folder.path(rel), rel) for rel in folder.checkpoints]
    elif src.is_file():
        paths = [(src, src.name)]
    else:
        raise CheckpointError(src, None, "not found")
    tasks = []
    rule_names: dict[str, str] = {}
    for path, rel in paths:
        mapped: dict[str, str] = {}
        if kind == "ggml" and not GGUF.named_by(path):
            from .gguf_names import gguf_names

            mapped = gguf_names(str(path))  # empty: an architecture GGUF has no names for
            rule_names.update(mapped)
        with open_checkpoint(path) as ckpt:
            names = [t.name for t in ckpt.tensors if eligible(t, kind, req.options)
                     and not (kind == "ggml" and (
                         (mapped and t.name not in mapped)  # the conversion leaves it out
                         or _llama_keeps(mapped.get(t.name, t.name))))]
        if names:
            tasks.append(Task(rel, measure_file, (path, names, cands, req.options)))
    if not tasks:
        raise CheckpointError(src, None, "has no tensor a plan can decide (floating point, "
                              "rank 2 or more)")
    if req.options.imatrix is not None:
        from .imatrix import load

        load(req.options.imatrix)  # a bad file is one error, before any tensor is read
    stats = RunStats()
    measures: list[TensorMeasure] = []
    for part in run_tasks(tasks, jobs, threads, progress, stats):
        measures.extend(part)
    result = allocate(measures, req.target_bpw, floors, keep)
    return ModelPlan(src, kind, fmt, cands, result,
                     {c.name: uniform(measures, c.name) for c in cands}, stats, rule_names)
