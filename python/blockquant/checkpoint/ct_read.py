"""Reading compressed-tensors folders (vLLM's and transformers' quantized checkpoints, whoever
wrote them): a safetensors shard beside a ``config.json`` whose ``quantization_config`` says
``quant_method: compressed-tensors`` is opened as a :class:`CompressedTensorsCheckpoint`, which
shows each quantized Linear as its float ``weight``, dequantized on read exactly as the
``compressed_tensors`` package decompresses it (:mod:`.ct_codec`), and every other tensor as it
is. ``bq.load``, ``inspect``, ``report`` and ``dequantize`` read such folders through it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .base import CheckpointError, TensorInfo, os_reason
from .ct_codec import PARAMS, dequantize_layer
from .ct_schemes import QUANT_METHOD
from .layered import LayeredCheckpoint

CONFIG = "config.json"
_MAX_CONFIG = 50_000_000  # bytes


def read_config(folder: Path) -> dict[str, Any] | None:
    """``folder``'s config.json parsed (None when there is none). A config.json that is not a
    JSON object is a CheckpointError naming it."""
    path = folder / CONFIG
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_CONFIG + 1)
    except OSError as e:
        raise CheckpointError(path, None, os_reason(e)) from None
    if len(raw) > _MAX_CONFIG:
        raise CheckpointError(path, None, f"is over {_MAX_CONFIG} bytes: not a model config")
    try:
        cfg = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(path, None, f"is not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(path, None, "is not a JSON object")
    return cfg


def without_quantization(folder: Path) -> dict[str, Any]:
    """``folder``'s config.json less its ``quantization_config`` (and MLX's
    ``quantization``): the config of the model dequantized."""
    cfg = dict(read_config(folder) or {})
    cfg.pop("quantization_config", None)
    cfg.pop("quantization", None)
    return cfg


def write_config(path: Path, cfg: dict[str, Any]) -> None:
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def quantization_of(cfg: dict[str, Any] | None) -> dict[str, Any] | None:
    q = (cfg or {}).get("quantization_config")
    return q if isinstance(q, dict) else None


def ct_config(folder: Path) -> dict[str, Any] | None:
    """The compressed-tensors ``quantization_config`` of the model folder ``folder``, or None
    (no config.json, or another quantization method, or none). Never raises for a folder
    without a readable config: a file is then read as the plain safetensors it is."""
    try:
        q = quantization_of(read_config(folder))
    except CheckpointError:
        return None
    return q if q is not None and q.get("quant_method") == QUANT_METHOD else None


def _matches(name: str, targets: Any) -> bool:
    """compressed-tensors' rule: ``re:PATTERN`` matches from the start of the name
    (``re.match``), anything else by equality; "Linear" names the class every quantized
    module here is."""
    for t in targets if isinstance(targets, list) else []:
        if not isinstance(t, str):
            continue
        if t.startswith("re:"):
            try:
                if re.match(t[3:], name):
                    return True
            except re.error:
                continue
        elif t == name or t == "Linear":
            return True
    return False


@dataclass(frozen=True)
class LayerScheme:
    format: str
    args: dict[str, Any]


def scheme_of(qconfig: dict[str, Any], module: str) -> LayerScheme | None:
    """The weight scheme ``qconfig`` gives the module ``module`` (the first config group whose
    targets match it), None when it is ignored or matched by none."""
    ignore = qconfig.get("ignore") or []
    if any(_matches(module, [t]) for t in ignore if t != "Linear"):
        return None
    groups = qconfig.get("config_groups") or {}
    for group in groups.values() if isinstance(groups, dict) else []:
        if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
            continue
        if _matches(module, group.get("targets")):
            fmt = group.get("format") or qconfig.get("format")
            if not isinstance(fmt, str) or fmt == "mixed-precision":
                return None
            return LayerScheme(fmt, group["weights"])
    return None


@dataclass(frozen=True)
class CtTensorInfo(TensorInfo):
    """A quantized Linear's weight as the float tensor it dequantizes to; ``dtype`` is the
    dtype compressed-tensors gives it (the scales' for int and FP8 formats, bfloat16 for the
    FP4 and MX ones)."""

    scheme: LayerScheme | None = None
    params: tuple[str, ...] = ()

    @property
    def dequantized_on_read(self) -> bool:
        return True

    @property
    def dtype_name(self) -> str:
        assert self.scheme is not None
        bits = self.scheme.args.get("num_bits")
        return f"{self.scheme.format} ({bits}-bit)"


_OUT_DTYPE = {"nvfp4-pack-quantized": "BF16", "mxfp4-pack-quantized": "BF16",
              "mxfp8-quantized": "BF16"}


class CompressedTensorsCheckpoint(LayeredCheckpoint):
    """One safetensors shard of a compressed-tensors folder (module docstring)."""

    format = "compressed-tensors"

    def _build(self) -> None:
        by_module: dict[str, dict[str, TensorInfo]] = {}
        for t in self.inner.tensors:
            module, _, param = t.name.rpartition(".")
            if param in PARAMS:
                by_module.setdefault(module, {})[param] = t
        for module, params in by_module.items():
            scheme = scheme_of(self.qconfig, module)
            quantized = "weight_packed" in params or "weight_scale" in params
            if scheme is None or not quantized:
                continue
            shape, dtype = self._shape_and_dtype(module, params, scheme)
            names = tuple(t.name for t in params.values())
            info = CtTensorInfo(f"{module}.weight", dtype, shape,
                                sum(t.nbytes for t in params.values()), None, scheme, names)
            self._layers[info.name] = info
        self._place_layers()

    def _shape_and_dtype(self, module: str, params: dict[str, TensorInfo],
                         scheme: LayerScheme) -> tuple[tuple[int, ...], str]:
        scale = params.get("weight_scale")
        out = _OUT_DTYPE.get(scheme.format) or (scale.dtype if scale is not None else None)
        if out not in ("BF16", "F16", "F32"):
            raise self.error(f"{module}.weight_scale", f"is {out}; {scheme.format} keeps "
                             "scales in BF16, F16 or F32")
        if "weight_shape" in params:
            raw = self.inner.read(f"{module}.weight_shape").reshape(-1)
            if raw.size != 2 or (raw < 0).any() or (raw > 2**40).any():
                raise self.error(f"{module}.weight_shape", "is not a 2-D shape")
            return (int(raw[0]), int(raw[1])), out
        if "weight_packed" in params:  # FP4: two values a byte
            rows, half = params["weight_packed"].shape
            return (rows, 2 * half), out
        if "weight" in params and len(params["weight"].shape) == 2:
            return params["weight"].shape, out
        raise self.error(f"{module}.weight", f"has no weight of a shape {scheme.format} reads")

    def read(self, name: str) -> np.ndarray:
        layer = self._layers.get(name)
        if layer is None:
            return self.inner.read(name)
        assert layer.scheme is not None
        params = {}
        for p in layer.params:
            t = self.inner.info(p)
            params[p.rpartition(".")[2]] = (t.dtype or "?", t.shape, self.inner._read_bytes(p))
        try:
            x, _ = dequantize_layer(layer.scheme.format, layer.scheme.args, params)
        except (ValueError, KeyError, IndexError, TypeError, ZeroDivisionError,
                OverflowError, MemoryError) as e:
            raise self.error(name, f"cannot be dequantized as {layer.scheme.format}: {e}") \
                from None
        if x.shape != layer.shape:
            raise self.error(name, f"dequantizes to {x.shape}, not its weight_shape "
                             f"{layer.shape}")
        return np.ascontiguousarray(x)
