"""Quantize dask arrays: ``blockquant.dask.quantize(darr, scheme)`` returns a lazy
:class:`DaskQTensor` whose values and scales are dask arrays, equal bit for bit to what
``blockquant.quantize`` makes of the whole array in memory, whatever the chunking (docs/dask.md).

Needs dask (``pip install 'blockquant[dask]'``); zarr for :func:`to_zarr` and :func:`from_zarr`
(``'blockquant[zarr]'``).
"""

from __future__ import annotations

from ._array import ChunkAlignmentWarning, DaskQTensor, dequantize, quantize
from ._grid import ChunkAlignmentError
from ._store import StoreError, from_zarr, to_zarr

__all__ = [
    "ChunkAlignmentError",
    "ChunkAlignmentWarning",
    "DaskQTensor",
    "StoreError",
    "dequantize",
    "from_zarr",
    "quantize",
    "to_zarr",
]
