"""The zarr v3 codec: an ``array -> bytes`` codec that stores each chunk quantized in burn's
byte layout and reads it back as the dequantized floats.

    >>> import zarr
    >>> from blockquant.zarr_codec import BlockQuantCodec
    >>> z = zarr.create_array(store, shape=(4096, 4096), chunks=(256, 4096), dtype="float32",
    ...                       serializer=BlockQuantCodec(scheme="nvfp4"), compressors=None)

Its JSON in the array's metadata is ``{"name": "blockquant", "configuration": {"version": 1,
"scheme": "e2m1/packed_native0/block16:ue4m3+tensor:f32", "calibration": "minmax",
"rounding": "half_away", "scale_rounding": "up"}}``; docs/dask.md "The zarr codec" specifies it
and the bytes for other implementations. zarr finds the codec by that name through the
``zarr.codecs`` entry point (pyproject.toml); importing this module registers it too.

Each chunk is quantized as a tensor of its own (a per-tensor scale, or a two-level scheme's g,
is the chunk's). zarr pads an edge chunk to the full chunk shape with the fill value, which must
then be finite (xarray's default for floats is NaN: a chunk it pads is refused, with
:class:`~blockquant.NonFiniteError`, as any NaN). Chunks must fall on block and word boundaries (each chunk size a
multiple of the scheme's step, or the whole axis): the array is refused when it is created
otherwise. Needs zarr 3 (``pip install 'blockquant[zarr]'``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.common import parse_named_configuration
from zarr.registry import register_codec

from ._chunk_codec import NAME, CodecConfig
from .errors import NonFiniteError

if TYPE_CHECKING:
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

__all__ = ["BlockQuantCodec"]


@dataclass(frozen=True)
class BlockQuantCodec(ArrayBytesCodec):
    """Quantize each chunk with ``scheme`` (a preset name, a scheme text or a QuantScheme)
    and the options given (else the preset's, else the defaults); read back dequantized."""

    is_fixed_size = True

    scheme: str
    calibration: str
    rounding: str
    scale_rounding: str

    def __init__(self, *, scheme: Any, calibration: Any = None, rounding: Any = None,
                 scale_rounding: Any = None) -> None:
        config = CodecConfig.make(scheme, calibration, rounding, scale_rounding)
        for name in ("scheme", "calibration", "rounding", "scale_rounding"):
            object.__setattr__(self, name, getattr(config, name))

    @property
    def config(self) -> CodecConfig:
        return CodecConfig(self.scheme, self.calibration, self.rounding, self.scale_rounding)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BlockQuantCodec":
        _, configuration = parse_named_configuration(data, NAME, require_configuration=True)
        config = CodecConfig.from_json(configuration)
        return cls(scheme=config.scheme, calibration=config.calibration,
                   rounding=config.rounding, scale_rounding=config.scale_rounding)

    def to_dict(self) -> dict[str, Any]:
        return {"name": NAME, "configuration": self.config.to_json()}

    def validate(self, *, shape: tuple[int, ...], dtype: Any, chunk_grid: Any) -> None:
        self.config.check_dtype(dtype.to_native_dtype())
        chunk = getattr(chunk_grid, "chunk_shape", None)
        if chunk is not None:
            self.config.check_chunks(shape, chunk)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: "ArraySpec") -> int:
        return self.config.nbytes(chunk_spec.shape)

    async def _encode_single(self, chunk_array: "NDBuffer",
                             chunk_spec: "ArraySpec") -> "Buffer | None":
        data = chunk_array.as_numpy_array()
        try:
            # The kernels release the GIL: chunks quantize in parallel on zarr's threads.
            blob = await asyncio.to_thread(self.config.encode, data)
        except NonFiniteError as e:
            fill = chunk_spec.fill_value
            if _finite(fill):
                raise
            raise NonFiniteError(f"{e}; zarr pads an edge chunk with the array's fill value "
                                 f"{fill}, which no quantized value holds: a finite one "
                                 "(fill_value=0; xarray: _FillValue=0) lets it be "
                                 "quantized") from None
        return chunk_spec.prototype.buffer.from_bytes(blob)

    async def _decode_single(self, chunk_bytes: "Buffer", chunk_spec: "ArraySpec") -> "NDBuffer":
        dtype = self.config.check_dtype(chunk_spec.dtype.to_native_dtype())
        out = await asyncio.to_thread(self.config.decode, chunk_bytes.to_bytes(),
                                      tuple(chunk_spec.shape), dtype)
        return chunk_spec.prototype.nd_buffer.from_numpy_array(out)


def _finite(value: Any) -> bool:
    try:
        return bool(np.isfinite(value))
    except TypeError:
        return True


register_codec(NAME, BlockQuantCodec)
