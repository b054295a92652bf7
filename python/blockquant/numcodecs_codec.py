"""The numcodecs codec, for zarr v2 arrays (zarr 2, or zarr 3's ``zarr_format=2``): a
compressor (or a filter) that stores each chunk quantized and decodes it to the dequantized
floats.

    >>> from blockquant.numcodecs_codec import BlockQuant
    >>> z = zarr.open_array(store, mode="w", shape=(4096, 4096), chunks=(256, 4096),
    ...                     dtype="float32", zarr_format=2, compressor=BlockQuant("nvfp4"))

Its config is ``{"id": "blockquant", "version": 1, "scheme": ..., "calibration": ...,
"rounding": ..., "scale_rounding": ...}``. zarr v2 decodes a chunk from its bytes alone, so the
bytes start with a header naming the chunk's shape, dtype and order before burn's bytes
(docs/dask.md "The zarr codec"). numcodecs finds the codec through the ``numcodecs.codecs``
entry point (pyproject.toml); importing this module registers it too. Needs numcodecs
(``pip install 'blockquant[zarr]'``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ndarray_copy
from numcodecs.registry import register_codec

from ._chunk_codec import NAME, CodecConfig, with_header, without_header

__all__ = ["BlockQuant"]


class BlockQuant(Codec):  # type: ignore[misc]
    """Quantize each chunk with ``scheme`` (a preset name, a scheme text or a QuantScheme)
    and the options given (else the preset's, else the defaults); decode dequantized."""

    codec_id = NAME

    def __init__(self, scheme: Any, calibration: Any = None, rounding: Any = None,
                 scale_rounding: Any = None) -> None:
        self._config = CodecConfig.make(scheme, calibration, rounding, scale_rounding)

    @classmethod
    def from_config(cls, config: dict) -> "BlockQuant":
        conf = CodecConfig.from_json({k: v for k, v in config.items() if k != "id"})
        return cls(conf.scheme, conf.calibration, conf.rounding, conf.scale_rounding)

    def get_config(self) -> dict:
        return {"id": NAME, **self._config.to_json()}

    def encode(self, buf: Any) -> bytes:
        chunk = np.asarray(buf)
        return with_header(self._config, chunk)

    def decode(self, buf: Any, out: Any = None) -> Any:
        arr = without_header(self._config, buf)
        return arr if out is None else ndarray_copy(arr, out)

    def __repr__(self) -> str:
        c = self._config
        return (f"BlockQuant(scheme={c.scheme!r}, calibration={c.calibration!r}, "
                f"rounding={c.rounding!r}, scale_rounding={c.scale_rounding!r})")


register_codec(BlockQuant)
