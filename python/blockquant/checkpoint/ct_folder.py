"""compressed-tensors output: a model folder vLLM and transformers load
(``blockquant quantize MODEL -o OUT --format compressed-tensors --scheme W4A16``).

Planned from the headers once (:func:`plan_ct`): which weights are Linear layers to quantize,
each one's blockquant scheme (:func:`.ct_schemes.scheme_for`), and which Linear layers stay in
float and go to ``ignore`` (``lm_head``, a layer whose shape the format cannot take, one left
out by ``--exclude``). Fused sets (q/k/v, gate/up, query/key/value: vLLM runs each as one
matrix) get one decision: all quantized or all in ``ignore``; under NVFP4 they share one global
scale. Embeddings and norms are not Linear layers and stay as they are.

Written as every folder output is: into a hidden folder renamed into place at the end, shards in
``--jobs`` processes, other files copied, the index rewritten, ``config.json`` given its
``quantization_config``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import QuantError
from ..presets import resolve
from ..qtensor import quantize
from .base import CheckpointError, TensorInfo, st_nbytes
from .commands import natural_key
from .ct_codec import ct_mx_scales, layer_tensors
from .ct_schemes import (
    CtScheme,
    ct_rule,
    quantization_config,
    resolve_ct,
    scheme_for,
    searched_rule,
)
from .folders import (
    FilePlan,
    _names,
    scan_folder,
)
from .formats import COMPRESSED_TENSORS
from .jobs import Task, run_tasks
from .options import FileOptions
from .readers import open_checkpoint
from .rules import KEPT_DTYPE, KEPT_FORMAT, KEPT_SELECTION, KEPT_UNFIT, Decision
from .safetensors import HeaderEntry, SafetensorsWriter
from .serving import ServingRun, check_rule_options, model_config

#: Modules that are not Linear layers although they hold a 2-D ``weight``.
_EMBEDDING = re.compile(r"(^|\.)(embed\w*|wte|wpe|shared|\w*_embeddings?|embeddings)$")
#: Output heads compressed-tensors' own tools leave in float.
_HEADS = ("lm_head",)
#: Fused sets vLLM loads as one matrix: (pattern, its group of the pattern that names the
#: member, the members).
_FUSED = (
    (re.compile(r"^(?P<p>.+\.(?:attn|attention|self_attn|self_attention))\.(?P<m>[qkv]_proj)$"),
     ("q_proj", "k_proj", "v_proj")),
    (re.compile(r"^(?P<p>.+\.(?:mlp|feed_forward))\.(?P<m>gate_proj|up_proj)$"),
     ("gate_proj", "up_proj")),
    (re.compile(r"^(?P<p>.+)\.(?P<m>w1|w3)$"), ("w1", "w3")),
    (re.compile(r"^(?P<p>.+\.self)\.(?P<m>query|key|value)$"), ("query", "key", "value")),
)


def fused_key(module: str) -> tuple[str, tuple[str, ...]] | None:
    for pattern, members in _FUSED:
        m = pattern.match(module)
        if m:
            return f"{m['p']}.{{{','.join(members)}}}", members
    return None


@dataclass
class CtRun(ServingRun):
    """A compressed-tensors run, planned: the folder's files and each tensor's decision, the
    fused sets, the ``ignore`` list and the options the weights are quantized with."""

    scheme: CtScheme
    ignore: list[str]
    fused: dict[str, list[str]]  # fused set -> its weights' names
    rule: dict[str, str]
    format = COMPRESSED_TENSORS
    _g: dict[str, float] = field(default_factory=dict)

    def quantization_config(self) -> dict[str, Any]:
        return quantization_config(self.scheme, self.ignore)

    def config_out(self) -> dict[str, Any]:
        cfg = dict(self.config)
        cfg["quantization_config"] = self.quantization_config()
        return cfg

    def prepare(self, jobs: int, threads: int | None) -> None:
        if self.scheme.family == "nvfp4":
            self._g = self._global_scales(jobs, threads)

    def shard_task(self, f: FilePlan, out: Path) -> Task:
        return Task(f.rel, write_ct_shard, (f.src, out, _actions(f, self._g), self.scheme,
                                            self.rule, self.options.force))

    def _global_scales(self, jobs: int, threads: int | None) -> dict[str, float]:
        """NVFP4's per-tensor scale g of each weight: 2^ceil(log2(amax / (6 · 448))), the
        largest amax of its fused set's (one g for the set, as vLLM requires). A power of two,
        so that compressed-tensors' s / (1/g) is s · g exactly."""
        tasks = [Task(f.rel, amax_of, (f.src, [d.tensor.name for d in f.decisions
                                                 if d.quantized])) for f in self.files]
        amax: dict[str, float] = {}
        for part in run_tasks(tasks, jobs, threads, lambda *a: None):
            amax.update(part)
        for names in self.fused.values():
            top = max(amax[n] for n in names)
            for n in names:
                amax[n] = top
        return {n: _pow2_global(a) for n, a in amax.items()}


def _pow2_global(amax: float) -> float:
    if not amax > 0:
        return 1.0
    return float(2.0 ** math.ceil(math.log2(amax / (6.0 * 448.0))))


def amax_of(src: Path, names: list[str], progress: Any = None) -> dict[str, float]:
    with open_checkpoint(src) as ckpt:
        return {n: float(np.max(np.abs(ckpt.read(n)), initial=0.0)) for n in names}


#: Per tensor of a shard, in file order: its name, its scheme text (None: copied), NVFP4's
#: global scale, and the header entries of its parameters (planned once, in the Decision).
Action = tuple[str, "str | None", "float | None", "tuple[HeaderEntry, ...]"]


def _actions(f: FilePlan, g: dict[str, float]) -> list[Action]:
    return [(d.tensor.name, str(d.scheme) if d.quantized else None, g.get(d.tensor.name),
             d.parts) for d in f.decisions]


def _param_entries(cs: CtScheme, module: str, t: TensorInfo,
                   grid: tuple[int, ...]) -> tuple[HeaderEntry, ...]:
    """The header entries of one quantized weight's parameters (their shapes from the weight's
    alone, as :func:`.ct_codec.layer_tensors` writes them)."""
    rows, cols = t.shape
    st = t.dtype or "F32"
    out: list[tuple[str, str, tuple[int, ...]]] = []
    if cs.family == "int" and cs.format == "pack-quantized":
        per = 32 // cs.bits
        out += [("weight_packed", "I32", (rows, -(-cols // per))), ("weight_scale", st, grid),
                ("weight_shape", "I64", (2,))]
        if not cs.symmetric:
            out.append(("weight_zero_point", "I32", (-(-rows // per), grid[1])))
    elif cs.family == "int":
        out += [("weight", "I8", (rows, cols)), ("weight_scale", st, grid)]
    elif cs.family in ("fp8", "mxfp8"):
        out += [("weight", "F8_E4M3", (rows, cols)),
                ("weight_scale", st if cs.family == "fp8" else "U8", grid)]
    else:
        out += [("weight_packed", "U8", (rows, cols // 2)),
                ("weight_scale", "F8_E4M3" if cs.family == "nvfp4" else "U8", grid)]
        if cs.family == "nvfp4":
            out.append(("weight_global_scale", "F32", (1,)))
    return tuple(HeaderEntry(f"{module}.{s}", d, shape, st_nbytes(d, shape) or 0)
                 for s, d, shape in out)


def write_ct_shard(src: Path, dst: Path, actions: list[Action], cs: CtScheme,
                   rule: dict[str, str], force: bool, progress: Any = None) -> int:
    """One shard of the output, as planned (``actions``). Returns the bytes of tensor data
    read."""
    bytes_in = 0
    with open_checkpoint(src) as ckpt:
        if [a[0] for a in actions] != [t.name for t in ckpt.tensors]:
            raise ckpt.error(None, "changed since it was read (its tensors are not the ones "
                             "planned); run again")
        layout: list[HeaderEntry] = []
        for (_, text, _, parts), t in zip(actions, ckpt.tensors):
            if text is None:
                layout.append(HeaderEntry(t.name, t.dtype or "F32", t.shape, t.nbytes))
            else:
                layout += parts
        metadata = dict(ckpt.metadata)
        metadata.setdefault("format", "pt")  # transformers wants it
        with SafetensorsWriter(dst, layout, metadata, force=force) as w:
            for (name, text, g, _), t in zip(actions, ckpt.tensors):
                bytes_in += t.nbytes
                if text is None:
                    w.write_from(name, ckpt, name)
                else:
                    try:
                        qt = _quantized(ckpt.read(name), text, g, cs, rule, t.dtype or "F32")
                    except QuantError as e:  # non-finite values: the message names the tensor
                        raise ckpt.error(name, str(e)) from None
                    module = name[: -len(".weight")]
                    for suffix, _d, _s, data in layer_tensors(cs.family, cs.format, cs.bits,
                                                              cs.symmetric, qt, t.dtype or "F32"):
                        w.write(f"{module}.{suffix}", data if isinstance(data, np.ndarray)
                                else bytes(data))
                    del qt
                if progress is not None:
                    progress(name, t.nbytes)
            w.commit()
    return bytes_in


def _quantized(x: np.ndarray, text: str, g: float | None, cs: CtScheme, rule: dict[str, str],
               dtype: str) -> Any:
    """One weight quantized by ``rule``; compressed-tensors' own MX rule (``minmax`` for an MX
    format) is not blockquant's OCP one, so its scales are worked out here and given."""
    if rule["calibration"] == "minmax" and cs.family in ("mxfp4", "mxfp8"):
        scales = ct_mx_scales(x, dtype, 2 if cs.family == "mxfp4" else 8)
        return quantize(x, text, scales=scales, rounding=rule["rounding"])
    return quantize(x, text, global_scale=g, **rule)


# -- planning -------------------------------------------------------------------------------------
@dataclass
class _Layer:
    rel: str
    t: TensorInfo
    module: str
    text: str | None = None
    why: str = ""
    detail: str = ""
    fused: str | None = None
    members: tuple[str, ...] = field(default_factory=tuple)


def plan_ct(src: Any, dst: Any, scheme: Any, options: FileOptions) -> CtRun:
    """Plan a compressed-tensors run from the folder ``src`` (module docstring). Every refusal
    is a CheckpointError, before anything is written."""
    src_path, dst_path = Path(src), Path(dst)
    check_rule_options(options, "compressed-tensors", "format", "its own rule", rules=False)
    cs = resolve_ct(scheme)
    rule = ct_rule(cs) if options.calibration == "minmax" else searched_rule(cs)
    cfg = model_config(src_path, dst_path, "compressed-tensors", "transformers and vLLM read "
                       "the quantization_config from")
    folder = scan_folder(src_path)
    layers: list[_Layer] = []
    files: list[FilePlan] = []
    for rel in folder.checkpoints:
        with open_checkpoint(folder.path(rel)) as ckpt:
            for t in ckpt.tensors:
                layers.append(_layer(rel, t, cs, options))
            files.append(FilePlan(folder.path(rel), rel, [], _names(ckpt)))
    fused = _fuse(layers, options)
    if not any(lay.text is not None for lay in layers):
        unfit = [lay for lay in layers if lay.why == KEPT_UNFIT]
        why = f": {unfit[0].t.name} {unfit[0].detail}" if unfit else ""
        raise CheckpointError(src, None, f"has no Linear layer {cs.name} can take{why}")
    ignore = sorted({lay.module for lay in layers if lay.text is None and lay.why in
                     (KEPT_UNFIT, KEPT_SELECTION, KEPT_FORMAT) and _is_linear(lay)}
                    | set(_HEADS), key=natural_key)
    by_rel: dict[str, list[Decision]] = {f.rel: f.decisions for f in files}
    for lay in layers:
        by_rel[lay.rel].append(_decision(cs, lay))
    return CtRun(src_path, dst_path, folder, files, options, cfg, cs, ignore, fused, rule)


def _is_linear(lay: _Layer) -> bool:
    return lay.t.name.endswith(".weight") and len(lay.t.shape) == 2 \
        and not _EMBEDDING.search(lay.module)


def _layer(rel: str, t: TensorInfo, cs: CtScheme, options: FileOptions) -> _Layer:
    module = t.name[: -len(".weight")] if t.name.endswith(".weight") else t.name
    lay = _Layer(rel, t, module)
    if not t.is_float:
        lay.why, lay.detail = KEPT_DTYPE, f"{t.dtype_name} is not floating point"
    elif not t.name.endswith(".weight") or len(t.shape) != 2:
        lay.why, lay.detail = KEPT_FORMAT, "not a Linear weight (2-D)"
    elif _EMBEDDING.search(module):
        lay.why, lay.detail = KEPT_FORMAT, "an embedding (not a Linear layer)"
    elif module.split(".")[-1] in _HEADS:
        lay.why, lay.detail = KEPT_FORMAT, "the output head (in ignore)"
    elif not options.selects(t.name):
        lay.why, lay.detail = KEPT_SELECTION, "left out by --include/--exclude (in ignore)"
    else:
        text, reason = scheme_for(cs, t.dtype, t.shape)
        if text is None:
            if options.strict:
                raise CheckpointError(t.name, None, f"{cs.name} cannot take it: {reason} "
                                      "(--strict)")
            lay.why, lay.detail = KEPT_UNFIT, f"{reason} (in ignore)"
        lay.text = text
    key = fused_key(module) if _is_linear(lay) else None
    if key is not None:
        lay.fused, lay.members = key
    return lay


def _fuse(layers: list[_Layer], options: FileOptions) -> dict[str, list[str]]:
    """Fused sets decided together: one member kept in float keeps them all; their input
    sizes must agree (vLLM stacks them into one matrix)."""
    sets: dict[str, list[_Layer]] = {}
    for lay in layers:
        if lay.fused is not None:
            sets.setdefault(lay.fused, []).append(lay)
    out: dict[str, list[str]] = {}
    for key, members in sets.items():
        if len({m.t.shape[1] for m in members}) > 1:
            shapes = ", ".join(f"{m.module.rsplit('.', 1)[-1]} {list(m.t.shape)}"
                               for m in members)
            raise CheckpointError(members[0].t.name, None, f"is fused with the others of "
                                  f"{key} in vLLM, but their input sizes differ ({shapes})")
        kept = [m for m in members if m.text is None]
        if kept and len(kept) < len(members):
            for m in members:
                if m.text is not None:
                    m.text, m.why = None, KEPT_UNFIT
                    m.detail = (f"fused with {kept[0].module.rsplit('.', 1)[-1]}, which "
                                f"stays in float ({kept[0].detail}) (in ignore)")
        if not kept:
            out[key] = [m.t.name for m in members]
    return out


def _decision(cs: CtScheme, lay: _Layer) -> Decision:
    if lay.text is None:
        return Decision(lay.t, None, why=lay.why or KEPT_UNFIT, detail=lay.detail)
    scheme = resolve(lay.text)
    grid = tuple(scheme.layout(lay.t.shape).scale_grid)
    return Decision(lay.t, scheme, _param_entries(cs, lay.module, lay.t, grid), label=cs.name)
