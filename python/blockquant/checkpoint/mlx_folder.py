"""MLX output: a model folder mlx-lm loads and runs
(``blockquant quantize MODEL -o OUT --format mlx --scheme affine4``).

Planned from the headers once (:func:`plan_mlx`): every 2-D floating-point ``*.weight`` (MLX's
Linear and Embedding layers; mlx-lm quantizes both) whose input size is a multiple of its
mode's group is quantized, by ``--scheme`` or the first ``--rule REGEX=MODE`` that matches it
(``keep`` keeps it); norms, biases and other tensors stay as they are, which is how mlx-lm tells
them apart (a layer without ``.scales`` stays float). A weight its mode cannot take is an error
naming it, never left in float unasked. A layer whose mode is not the default gets its own entry in
``config.json``'s ``quantization``, keyed by its path, as mlx-lm writes them.

Scales: blockquant's searched ones by default (codes from the stored scale and bias); with
``--calibration minmax``, MLX's own rule (:func:`.mlx_codec.mlx_quantize`), whose bytes are
``mx.quantize``'s. Written as every folder output is (:class:`.serving.ServingRun`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import NonFiniteError, QuantError
from ..presets import resolve
from ..qtensor import affine_codes, quantize
from .base import FLOAT_DTYPES, CheckpointError, TensorInfo, st_nbytes
from .folders import FilePlan, _names, scan_folder
from .formats import MLX
from .jobs import Task
from .mlx_codec import e4m3_encode, mlx_quantize, pack
from .mlx_schemes import MlxScheme, quantization_entry, resolve_mlx, scheme_for, searched_rule
from .options import FileOptions, compile_rules, matching_rule
from .readers import open_checkpoint
from .rules import KEPT_DTYPE, KEPT_FORMAT, KEPT_RULE, KEPT_SELECTION, Decision
from .safetensors import HeaderEntry, SafetensorsWriter, float_array
from .serving import ServingRun, check_rule_options, model_config

#: Per tensor of a shard, in file order: its name, its MLX scheme and blockquant scheme text
#: (None: copied), and the header entries of its tensors (planned once, in the Decision).
Action = tuple[str, "MlxScheme | None", "str | None", "tuple[HeaderEntry, ...]"]


@dataclass
class MlxRun(ServingRun):
    """An MLX run, planned: each tensor's decision, each quantized layer's mode, the rule
    (options) the weights are quantized with."""

    scheme: MlxScheme
    layers: dict[str, MlxScheme]  # module path -> its mode
    modes: dict[str, MlxScheme]  # weight name -> its mode
    minmax: bool
    format = MLX

    def quantization(self) -> dict[str, Any]:
        return quantization_entry(self.scheme, self.layers)

    def config_out(self) -> dict[str, Any]:
        cfg = dict(self.config)
        cfg["quantization"] = self.quantization()
        cfg["quantization_config"] = self.quantization()  # as mlx-lm writes it
        return cfg

    def shard_task(self, f: FilePlan, out: Path) -> Task:
        actions = [(d.tensor.name, self.modes.get(d.tensor.name),
                    str(d.scheme) if d.quantized else None, d.parts) for d in f.decisions]
        return Task(f.rel, write_mlx_shard, (f.src, out, actions, self.minmax,
                                             self.options.force))


def _scale_bytes(scales: np.ndarray, mode: str) -> np.ndarray:
    """A QTensor's stored fp scales as MLX's bytes: E8M0 exponents (e + 127) or E4M3 bits."""
    if mode == "nvfp4":
        return e4m3_encode(scales) & np.uint8(0x7F)
    _, e = np.frexp(scales.astype(np.float32))
    return (e.astype(np.int32) - 1 + 127).astype(np.uint8)


def layer_tensors(x: np.ndarray, ms: MlxScheme, text: str, dtype: str,
                  minmax: bool) -> list[tuple[str, np.ndarray]]:
    """One weight (rows, cols) quantized under ``ms``: its tensors (suffix, array) in MLX's
    layout. ``minmax``: MLX's own rule; else blockquant's ``text`` with the searched scales."""
    if minmax:
        x32 = np.asarray(x, dtype=np.float32)
        q, s, b = mlx_quantize(x32, ms.mode, ms.bits, ms.group, dtype)
    elif ms.mode == "affine":
        q, s, b = affine_codes(x, text, ms.bits, **searched_rule(ms))
    else:
        qt = quantize(x, text, **searched_rule(ms))
        q, s, b = qt.values.reshape(x.shape), _scale_bytes(qt.scales, ms.mode), None
    out = [("weight", pack(q, ms.bits)),
           ("scales", float_array(s, FLOAT_DTYPES[dtype]) if ms.mode == "affine" else s)]
    if b is not None:
        out.append(("biases", float_array(b, FLOAT_DTYPES[dtype])))
    return out


def write_mlx_shard(src: Path, dst: Path, actions: list[Action], minmax: bool, force: bool,
                    progress: Any = None) -> int:
    """One shard of the output, as planned (``actions``). Returns the bytes of tensor data
    read."""
    bytes_in = 0
    with open_checkpoint(src) as ckpt:
        if [a[0] for a in actions] != [t.name for t in ckpt.tensors]:
            raise ckpt.error(None, "changed since it was read (its tensors are not the ones "
                             "planned); run again")
        layout: list[HeaderEntry] = []
        for (_, _, text, parts), t in zip(actions, ckpt.tensors):
            layout += parts if text is not None else [
                HeaderEntry(t.name, t.dtype or "F32", t.shape, t.nbytes)]
        metadata = dict(ckpt.metadata)
        metadata["format"] = "mlx"  # as mlx-lm writes it
        with SafetensorsWriter(dst, layout, metadata, force=force) as w:
            for (name, ms, text, _), t in zip(actions, ckpt.tensors):
                bytes_in += t.nbytes
                if text is None or ms is None:
                    w.write_from(name, ckpt, name)
                else:
                    x = ckpt.read(name)
                    try:
                        if minmax and not np.isfinite(x).all():
                            raise NonFiniteError("holds non-finite values (NaN or infinity): "
                                                 "MLX's rule has no code for them")
                        tensors = layer_tensors(x, ms, text, t.dtype or "F32", minmax)
                    except QuantError as e:
                        raise ckpt.error(name, str(e)) from None
                    del x
                    module = name[: -len(".weight")]
                    for suffix, data in tensors:
                        w.write(f"{module}.{suffix}", data)
                    del tensors
                if progress is not None:
                    progress(name, t.nbytes)
            w.commit()
    return bytes_in


# -- planning -------------------------------------------------------------------------------------
def _entries(ms: MlxScheme, module: str, t: TensorInfo) -> tuple[HeaderEntry, ...]:
    return tuple(HeaderEntry(f"{module}.{s}", d, shape, st_nbytes(d, shape) or 0)
                 for s, d, shape in ms.stored(t.shape, t.dtype or "F32"))


def _decide(t: TensorInfo, default: MlxScheme, options: FileOptions
            ) -> tuple[Decision, MlxScheme | None]:
    if not t.is_float:
        return Decision(t, None, why=KEPT_DTYPE, detail=f"{t.dtype_name} is not floating "
                        "point"), None
    if not t.name.endswith(".weight") or len(t.shape) != 2:
        return Decision(t, None, why=KEPT_FORMAT, detail="not a Linear or Embedding weight "
                        "(2-D): MLX keeps it in float"), None
    if not options.selects(t.name):
        return Decision(t, None, why=KEPT_SELECTION, detail="left out by "
                        "--include/--exclude"), None
    ms = default
    rule = matching_rule(compile_rules(options.rules), t.name)
    if rule is not None:
        if rule.keeps:
            return Decision(t, None, why=KEPT_RULE, detail=f"--rule {rule.text}"), None
        if rule.foreign is None:
            raise CheckpointError("--rule", None, f"{rule.text!r}: MLX output takes MLX "
                                  "modes (affine4, affine8:g32, mxfp4, ...) or keep")
        ms = resolve_mlx(rule.foreign)
    text, reason = scheme_for(ms, t.dtype, t.shape)
    if text is None:  # never left in float unasked: the user names what stays
        how = f"--rule {rule.text} names it" if rule is not None else \
            f"keep it in float with --rule '^{re.escape(t.name)}$=keep' or --exclude"
        raise CheckpointError(t.name, None, f"MLX's {ms.name} cannot take it: {reason} "
                              f"({how})")
    module = t.name[: -len(".weight")]
    return Decision(t, resolve(text), _entries(ms, module, t), label=f"mlx {ms.name}"), ms


def plan_mlx(src: Any, dst: Any, scheme: Any, options: FileOptions) -> MlxRun:
    """Plan an MLX run from the folder ``src`` (module docstring). Every refusal is a
    CheckpointError, before anything is written."""
    src_path, dst_path = Path(src), Path(dst)
    check_rule_options(options, "MLX", "mode", "MLX's own rule", rules=True)
    default = resolve_mlx(scheme)
    cfg = model_config(src_path, dst_path, "MLX", "mlx-lm reads the quantization from")
    folder = scan_folder(src_path)
    files: list[FilePlan] = []
    modes: dict[str, MlxScheme] = {}
    for rel in folder.checkpoints:
        with open_checkpoint(folder.path(rel)) as ckpt:
            decisions = []
            for t in ckpt.tensors:
                d, ms = _decide(t, default, options)
                decisions.append(d)
                if ms is not None:
                    modes[t.name] = ms
            files.append(FilePlan(folder.path(rel), rel, decisions, _names(ckpt)))
    if not modes:
        raise CheckpointError(src, None, f"has no layer MLX's {default.name} can take (2-D "
                              "floating-point weights)")
    layers = {n[: -len(".weight")]: ms for n, ms in modes.items()}
    return MlxRun(src_path, dst_path, folder, files, options, cfg, default, layers, modes,
                  options.calibration == "minmax")
