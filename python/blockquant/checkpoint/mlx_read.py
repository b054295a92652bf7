"""Reading MLX folders (mlx-lm's quantized models, whoever wrote them): a safetensors shard beside a
``config.json`` whose ``quantization`` entry gives MLX's ``group_size`` and ``bits`` is opened as
an :class:`MlxCheckpoint`, which shows each quantized layer (``<layer>.weight`` of uint32 words
beside ``<layer>.scales``) as its float ``weight``, dequantized on read exactly as
``mx.dequantize`` does (:func:`.mlx_codec.dequantize`), and every other tensor as it is.
``bq.load``, ``inspect``, ``report`` and ``dequantize`` read such folders through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .base import CheckpointError, TensorInfo
from .ct_codec import RAW, as_float, raw_array
from .ct_read import read_config
from .layered import LayeredCheckpoint
from .mlx_codec import dequantize
from .mlx_schemes import MlxScheme, entry_scheme


def mlx_config(folder: Path) -> dict[str, Any] | None:
    """The ``quantization`` entry of the MLX model folder ``folder``, or None (no config.json,
    none, or not MLX's: it has ``group_size`` and ``bits``). Never raises for a folder without a
    readable config: a file is then read as the plain safetensors it is."""
    try:
        cfg = read_config(folder)
    except CheckpointError:
        return None
    q = (cfg or {}).get("quantization")
    if isinstance(q, dict) and "group_size" in q and "bits" in q:
        return q
    return None


@dataclass(frozen=True)
class MlxTensorInfo(TensorInfo):
    """A quantized layer's weight as the float tensor it dequantizes to; ``dtype`` is the one
    ``mx.dequantize`` gives it (the scales' for affine, bfloat16 for the fp modes)."""

    scheme: MlxScheme | None = None
    params: tuple[str, ...] = ()

    @property
    def dequantized_on_read(self) -> bool:
        return True

    @property
    def dtype_name(self) -> str:
        assert self.scheme is not None
        return f"mlx {self.scheme.name} ({self.scheme.bits}-bit)"


class MlxCheckpoint(LayeredCheckpoint):
    """One safetensors shard of an MLX folder (module docstring)."""

    format = "mlx"

    def _scheme(self, module: str) -> MlxScheme | None:
        entry = self.qconfig.get(module, self.qconfig)
        if entry is False:
            return None
        try:
            return entry_scheme(entry, f"config.json's quantization entry for {module}"
                                if module in self.qconfig else "config.json's quantization")
        except ValueError as e:
            raise CheckpointError(self.path.parent / "config.json", None, str(e)) from None

    def _build(self) -> None:
        names = self._names = {t.name for t in self.inner.tensors}
        for t in self.inner.tensors:
            if not t.name.endswith(".scales"):
                continue
            module = t.name[: -len(".scales")]
            if f"{module}.weight" not in names:
                continue
            ms = self._scheme(module)
            if ms is None:
                continue
            params = [f"{module}.weight", t.name]
            if ms.mode == "affine":
                params.append(f"{module}.biases")
            info = MlxTensorInfo(f"{module}.weight", *self._shape_and_dtype(module, ms),
                                 sum(self.inner.info(p).nbytes for p in params if p in names),
                                 None, ms, tuple(params))
            self._layers[info.name] = info
        self._place_layers()

    def _shape_and_dtype(self, module: str, ms: MlxScheme) -> tuple[str, tuple[int, ...]]:
        w, s = self.inner.info(f"{module}.weight"), self.inner.info(f"{module}.scales")
        if w.dtype != "U32" or len(w.shape) < 2:
            raise self.error(f"{module}.weight", f"is {w.dtype} {list(w.shape)}; a quantized "
                             "MLX layer's weight is uint32 words, 2-D or more")
        cols = w.shape[-1] * 32 // ms.bits
        if s.shape != (*w.shape[:-1], cols // ms.group) or cols % ms.group:
            raise self.error(f"{module}.scales", f"has shape {list(s.shape)}; {ms.name} on "
                             f"{list(w.shape[:-1]) + [cols]} has {cols // ms.group} a row")
        if ms.mode == "affine":
            b = self.inner.info(f"{module}.biases") if f"{module}.biases" in self._names \
                else None
            if s.dtype not in ("BF16", "F16", "F32"):
                raise self.error(f"{module}.scales", f"is {s.dtype}; affine scales are BF16, "
                                 "F16 or F32")
            if b is None or b.shape != s.shape or b.dtype != s.dtype:
                raise self.error(f"{module}.biases", "is missing or not of the scales' dtype "
                                 "and shape (affine needs both)")
            return s.dtype, (*w.shape[:-1], cols)
        if s.dtype != "U8":
            raise self.error(f"{module}.scales", f"is {s.dtype}; {ms.mode} scales are uint8")
        return "BF16", (*w.shape[:-1], cols)

    def _raw(self, name: str) -> np.ndarray:
        t = self.inner.info(name)
        data = self.inner._read_bytes(name)
        if t.dtype == "U32":
            return np.frombuffer(data, dtype="<u4").reshape(t.shape)
        if t.dtype not in RAW:
            raise self.error(name, f"is {t.dtype}, which MLX does not use here")
        return raw_array(t.dtype or "", t.shape, data)

    def read(self, name: str) -> np.ndarray:
        layer = self._layers.get(name)
        if layer is None:
            return self.inner.read(name)
        ms = layer.scheme
        assert ms is not None
        words = self._raw(layer.params[0])
        scales = self._raw(layer.params[1])
        biases = None
        if ms.mode == "affine":
            st = self.inner.info(layer.params[1]).dtype or "F32"
            scales = as_float(st, scales)
            biases = as_float(st, self._raw(layer.params[2]))
        lead = words.shape[:-1]
        try:
            x = dequantize(ms.mode, ms.bits, ms.group, layer.dtype or "BF16",
                           words.reshape(-1, words.shape[-1]),
                           scales.reshape(-1, scales.shape[-1]),
                           None if biases is None else biases.reshape(-1, biases.shape[-1]))
        except (ValueError, MemoryError) as e:
            raise self.error(name, f"cannot be dequantized as MLX {ms.name}: {e}") from None
        return np.ascontiguousarray(x.reshape(*lead, -1))
