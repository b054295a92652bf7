"""What the readers of the serving formats' shards share (compressed-tensors, :mod:`.ct_read`;
MLX, :mod:`.mlx_read`): a safetensors shard whose quantized layers are groups of tensors shown
as one float ``weight`` each, dequantized on read; every other tensor as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Checkpoint, TensorInfo
from .safetensors import SafetensorsCheckpoint


class LayeredCheckpoint(Checkpoint):
    """One shard: :meth:`_build` finds the quantized layers (``self._layers``: weight name ->
    an info whose ``params`` are the stored tensors, the first one where the layer shows), then
    :meth:`_place_layers` lists the tensors."""

    def __init__(self, path: Path, qconfig: dict[str, Any]) -> None:
        super().__init__(path)
        self.inner = SafetensorsCheckpoint(path)
        self.metadata = self.inner.metadata
        self.qconfig = qconfig
        self._layers: dict[str, Any] = {}
        try:
            self._build()
        except BaseException:
            self.inner.close()
            raise

    def _build(self) -> None:
        raise NotImplementedError

    def _place_layers(self) -> None:
        """The shard's tensors in file order: each layer in its first parameter's place, its
        parameters hidden."""
        hidden = {p for layer in self._layers.values() for p in layer.params}
        tensors: list[TensorInfo] = []
        for t in self.inner.tensors:
            if t.name in hidden:
                layer = self._layers.get(t.name.rpartition(".")[0] + ".weight")
                if layer is not None and layer.params[0] == t.name:
                    tensors.append(layer)
                continue
            tensors.append(t)
        self.tensors = tensors
        self._index()

    def close(self) -> None:
        self.inner.close()

    def copy_to(self, name: str, out: Any) -> None:
        if name in self._layers:
            raise self.error(name, "is quantized: read it, its bytes are not a float tensor")
        self.inner.copy_to(name, out)

    def layers(self) -> dict[str, Any]:
        return dict(self._layers)


def layer_count(ckpt: Checkpoint) -> int:
    """Quantized layers of a serving-format shard; 0 for any other checkpoint."""
    return len(ckpt.layers()) if isinstance(ckpt, LayeredCheckpoint) else 0
