"""``blockquant.dask.quantize``: a dask array quantized chunk by chunk, lazily, into a
:class:`DaskQTensor` whose values and scales are dask arrays; the same bits as
``blockquant.quantize`` on the whole array, whatever the chunking.

Each chunk is quantized by the numpy API on its own. That gives the whole tensor's slice when
the chunks fall on block and word boundaries (:mod:`._grid`; a chunking that does not is
rechunked, with a :class:`ChunkAlignmentWarning`) and when nothing depends on the rest of the
tensor. What does, a per-tensor scale or a two-level scheme's g, is reduced from the whole array
first (:mod:`._whole`, one pass when ``quantize`` is called) and handed to every chunk as the
numpy API's ``scales=`` or ``global_scale=``.
"""

from __future__ import annotations

import functools
import math
import operator
import warnings
from typing import Any, Optional, Tuple, Union

import numpy as np

from ..errors import QuantError
from ..options import weights_refusal
from ..presets import resolve
from ..qtensor import (
    QTensor,
    _call_checked,
    _global_scale,
    _kind,
    _options_checked,
    _output_dtype_name,
    _quantize,
    mse_advice,
)
from ..scheme import QuantScheme
from . import _whole
from ._grid import ChunkAlignmentError, Chunks, Geometry, origins, regular, regular_size

__all__ = ["ChunkAlignmentWarning", "DaskQTensor", "quantize", "dequantize"]


class ChunkAlignmentWarning(UserWarning):
    """``quantize`` rechunked an array whose chunks cut blocks or packed words."""


def _dask() -> Any:
    try:
        import dask.array as da
    except ImportError:
        raise ImportError("blockquant.dask needs dask: pip install 'blockquant[dask]'") from None
    return da


def _graph(name: str, layer: dict, deps: list) -> Any:
    from dask.highlevelgraph import HighLevelGraph

    return HighLevelGraph.from_collections(name, layer, dependencies=deps)


class DaskQTensor:
    """A quantized tensor held as dask arrays: ``values`` (the storage, in its stored shape),
    ``scales`` (the grid), ``offsets`` (affine schemes), and ``global_scale``, a float known
    when it was made. ``chunks`` is the input's chunking, on block and word boundaries: chunk
    ``i`` of the input is the slice ``i`` of the values and scales."""

    __slots__ = ("_values", "_scales", "_offsets", "_global", "_scheme", "_shape", "_chunks",
                 "_geometry")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("DaskQTensor is made by blockquant.dask.quantize or from_zarr")

    @classmethod
    def _new(cls, values: Any, scales: Any, offsets: Any, global_scale: Optional[float],
             scheme: QuantScheme, shape: Tuple[int, ...], chunks: Chunks) -> "DaskQTensor":
        self = object.__new__(cls)
        self._values, self._scales, self._offsets = values, scales, offsets
        self._global = None if global_scale is None else float(global_scale)
        self._scheme, self._shape, self._chunks = scheme, tuple(shape), tuple(chunks)
        self._geometry = Geometry.of(scheme, self._shape) if self._shape else None
        return self

    # The parts are read-only, as a QTensor's: a new tensor comes from quantize or rechunk.
    @property
    def values(self) -> Any:
        """The value storage (as ``QTensor.values``), a dask array."""
        return self._values

    @property
    def scales(self) -> Any:
        """The scales in the grid (as ``QTensor.scales``), a dask array of float32."""
        return self._scales

    @property
    def offsets(self) -> Any:
        """An affine scheme's offsets in the grid, a dask array; None for any other scheme."""
        return self._offsets

    @property
    def global_scale(self) -> Optional[float]:
        """A two-level scheme's per-tensor scale g, else None."""
        return self._global

    @property
    def scheme(self) -> QuantScheme:
        return self._scheme

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def chunks(self) -> Chunks:
        """The input's chunking (after alignment): chunk ``i`` of each part belongs to it."""
        return self._chunks

    @property
    def numblocks(self) -> Tuple[int, ...]:
        return tuple(len(c) for c in self.chunks)

    @property
    def nbytes(self) -> int:
        """Bytes of burn's layout of the whole tensor (``scheme.layout(shape).nbytes``)."""
        return int(self.scheme.layout(self.shape).nbytes)

    def __repr__(self) -> str:
        g = "" if self.global_scale is None else f", global_scale={self.global_scale!r}"
        return (f"DaskQTensor(shape={self.shape}, scheme={self.scheme!r}, "
                f"chunks={tuple(max(c) if c else 0 for c in self.chunks)}, "
                f"numblocks={self.numblocks}{g})")

    # -- reading ---------------------------------------------------------------------------------
    def compute(self, **kwargs: Any) -> QTensor:
        """The whole tensor in memory, as ``blockquant.quantize`` would have made it."""
        import dask

        parts = [self.values, self.scales] + ([self.offsets] if self.offsets is not None else [])
        got = dask.compute(*parts, **kwargs)
        return QTensor.from_parts(got[0], got[1], self.scheme, self.shape, self.global_scale,
                                  got[2] if len(got) > 2 else None)

    def dequantize(self, dtype: Any = None) -> Any:
        """The floats, as a dask array chunked as the input was: each chunk is
        ``QTensor.from_parts(...).dequantize(dtype)`` of its parts (float32 by default; float16,
        bfloat16, float64 on request)."""
        da = _dask()
        name_of = _output_dtype_name(np.float32 if dtype is None else dtype)
        out_dtype = _numpy_dtype(name_of)
        if not self.shape:
            return da.from_array(self.compute().dequantize(name_of), chunks=())
        name = "bq-dequantize-" + _token(self, name_of)
        layer = {}
        for index in np.ndindex(*self.numblocks):
            fn = functools.partial(_dequantize_block, scheme=self.scheme,
                                   shape=self._chunk_shape(index), g=self.global_scale,
                                   dtype=name_of)
            layer[(name, *index)] = (fn, *self._part_keys(index))
        graph = _graph(name, layer, self._parts())
        return da.Array(graph, name, chunks=self.chunks, dtype=out_dtype,
                        meta=np.empty((0,) * len(self.shape), out_dtype))

    def to_bytes_blocks(self) -> Any:
        """burn's bytes of each chunk as a tensor of its own shape (its values, its block scales
        or the shared per-tensor scale, g, its offsets): a dask array of ``bytes`` objects, one
        element per chunk (shape ``numblocks``). ``QTensor.from_bytes(blob, scheme,
        chunk_shape)`` reads one back."""
        da = _dask()
        if not self.shape:
            return da.from_array(np.array([self.compute().to_bytes()], dtype=object), chunks=1)
        name = "bq-bytes-" + _token(self)
        layer = {}
        for index in np.ndindex(*self.numblocks):
            fn = functools.partial(_bytes_block, scheme=self.scheme,
                                   shape=self._chunk_shape(index), g=self.global_scale,
                                   rank=len(self.numblocks))
            layer[(name, *index)] = (fn, *self._part_keys(index))
        graph = _graph(name, layer, self._parts())
        return da.Array(graph, name, chunks=tuple((1,) * n for n in self.numblocks),
                        dtype=object, meta=np.empty((0,) * len(self.shape), object))

    def rechunk(self, chunks: Any) -> "DaskQTensor":
        """The same tensor over another chunking of the input (one size per axis, or dask's
        chunk tuples), which must fall on block and word boundaries (else
        :class:`ChunkAlignmentError`): the parts' dask arrays rechunked to match."""
        da = _dask()
        if not self.shape:
            return self
        normal = da.core.normalize_chunks(chunks, self.shape, dtype=np.float32)
        geo = self._geometry
        assert geo is not None
        bad = geo.misaligned(normal)
        if bad:
            raise ChunkAlignmentError(f"chunks {normal} cut blocks or packed words of "
                                      f"{self.scheme!r} on axes {bad}")
        values = self.values.rechunk(geo.storage_chunks(normal))
        scales = self.scales if geo.block is None else self.scales.rechunk(geo.grid_chunks(normal))
        offsets = None if self.offsets is None else self.offsets.rechunk(geo.grid_chunks(normal))
        return DaskQTensor._new(values, scales, offsets, self.global_scale, self.scheme,
                                self.shape, normal)

    def regular_chunks(self) -> Tuple[int, ...]:
        """One chunk size per axis (zarr's grid) close to the current chunking."""
        return regular_size(self.chunks)

    def is_regular(self) -> bool:
        return regular(self.chunks)

    # -- the graph's pieces ----------------------------------------------------------------------
    def _chunk_shape(self, index: Tuple[int, ...]) -> Tuple[int, ...]:
        return tuple(self.chunks[ax][i] for ax, i in enumerate(index))

    def _parts(self) -> list:
        return [a for a in (self.values, self.scales, self.offsets) if a is not None]

    def _part_keys(self, index: Tuple[int, ...]) -> tuple:
        geo = self._geometry
        assert geo is not None
        v = (self.values.name, *geo.storage_index(index))
        s = (self.scales.name, 0) if geo.block is None else (self.scales.name, *index)
        if self.offsets is None:
            return v, s
        o = (self.offsets.name, 0) if geo.block is None else (self.offsets.name, *index)
        return v, s, o


def _token(*parts: Any) -> str:
    from dask.base import tokenize

    return str(tokenize(*[p if not isinstance(p, DaskQTensor) else
                          (p.values.name, p.scales.name, None if p.offsets is None
                           else p.offsets.name, p.global_scale, str(p.scheme)) for p in parts]))


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _chunk_qtensor(values: np.ndarray, scales: np.ndarray, offsets: Optional[np.ndarray], *,
                   scheme: QuantScheme, shape: Tuple[int, ...], g: Optional[float]) -> QTensor:
    return QTensor.from_parts(values, scales, scheme, shape, g, offsets)


def _dequantize_block(values: np.ndarray, scales: np.ndarray, offsets: Any = None, *,
                      scheme: QuantScheme, shape: Tuple[int, ...], g: Optional[float],
                      dtype: str) -> np.ndarray:
    return _chunk_qtensor(values, scales, offsets, scheme=scheme, shape=shape,
                          g=g).dequantize(dtype)


def _bytes_block(values: np.ndarray, scales: np.ndarray, offsets: Any = None, *,
                 scheme: QuantScheme, shape: Tuple[int, ...], g: Optional[float],
                 rank: int) -> np.ndarray:
    blob = _chunk_qtensor(values, scales, offsets, scheme=scheme, shape=shape, g=g).to_bytes()
    out = np.empty((1,) * rank, dtype=object)
    out[(0,) * rank] = blob
    return out


def _quantize_block(x: Any, w: Any = None, s: Any = None, *, scheme: QuantScheme, options: tuple,
                    scale: Optional[float], g: Optional[float], origin: Tuple[int, ...],
                    shape: Tuple[int, ...]) -> tuple:
    """One chunk through the numpy API: (values, scales, offsets)."""
    cal, rnd, srnd = options
    try:
        qt = _quantize(x, scheme, calibration=cal, rounding=rnd, scale_rounding=srnd,
                       scales=s if s is not None else scale, global_scale=g, weights=w)
    except QuantError as e:
        raise _whole.in_whole_tensor(e, np.shape(x), origin, shape) from None
    return qt.values, qt.scales, qt.offsets


def quantize(
    x: Any,
    scheme: Union[QuantScheme, str],
    *,
    calibration: Optional[str] = None,
    rounding: Optional[str] = None,
    scale_rounding: Optional[str] = None,
    scales: Any = None,
    global_scale: Optional[float] = None,
    weights: Any = None,
    rechunk: bool = True,
) -> DaskQTensor:
    """Quantize the dask array ``x`` as ``blockquant.quantize`` would quantize ``x.compute()``,
    bit for bit, one task per chunk. The options are the numpy API's; ``scales`` (the grid) and
    ``weights`` (broadcastable to ``x``) may be numpy or dask arrays.

    Chunks that cut a block or a packed word are rechunked (a :class:`ChunkAlignmentWarning`
    says how), or with ``rechunk=False`` refused (:class:`ChunkAlignmentError`). A per-tensor
    scale or a two-level scheme's g is computed from the whole array now, in one pass of dask
    tasks; the values stay lazy. A per-tensor scale searched by ``mse``, and an affine
    per-tensor scheme, need the whole tensor in one search: they take one chunk only
    (``QuantError`` otherwise)."""
    da = _dask()
    scheme = resolve(scheme)
    advice = mse_advice(scheme, calibration)
    if advice is not None:
        warnings.warn(advice, RuntimeWarning, stacklevel=2)
    if not isinstance(x, da.Array):
        raise TypeError(f"blockquant.dask.quantize takes a dask array, got {type(x).__name__} "
                        "(blockquant.quantize takes numpy arrays)")
    if _kind(x.dtype) is None:
        raise TypeError("x must be a float16, bfloat16, float32 or float64 array, got dtype "
                        f"{x.dtype}")
    options = scheme.options.resolve(calibration, rounding, scale_rounding)  # type: ignore[arg-type]
    cal, rnd, srnd = options
    _options_checked(cal, rnd, srnd)
    if any(math.isnan(c) for cs in x.chunks for c in cs):
        raise ChunkAlignmentError("x has unknown chunk sizes (x.compute_chunk_sizes() first)")
    shape = tuple(int(d) for d in x.shape)
    _call_checked(scheme._handle, shape, cal, rnd, srnd, scales is not None,
                  global_scale is not None)
    g = None if global_scale is None else _global_scale(global_scale)
    if weights is not None:
        refusal = weights_refusal(cal, scales is not None)
        if refusal is not None:
            raise QuantError(refusal)
    if x.size == 0 or x.ndim == 0:  # nothing to split: the numpy API, on the one chunk
        sc = scales.compute() if isinstance(scales, da.Array) else scales
        w = weights.compute() if isinstance(weights, da.Array) else weights
        qt = _quantize(x.compute(), scheme, calibration=cal, rounding=rnd, scale_rounding=srnd,
                       scales=sc, global_scale=g, weights=w)
        return _from_qtensor(qt)
    geo = Geometry.of(scheme, shape)
    x = _aligned(x, geo, scheme, rechunk)
    nchunks = int(np.prod(x.numblocks))
    w_arr = None
    if weights is not None:
        w_arr = da.broadcast_to(da.asarray(weights), shape).rechunk(x.chunks)
    s_arr, scale = None, None
    if scales is not None:
        if geo.block is None:
            scale = _one_scale(scales)
        else:
            grid = tuple(scheme.layout(shape).scale_grid)
            s_arr = da.asarray(scales)
            if s_arr.shape != grid:
                from ..errors import ScaleError

                raise ScaleError(f"scales for {scheme!r} on shape {shape} have the grid shape "
                                 f"{grid}, got {s_arr.shape}")
            s_arr = s_arr.rechunk(geo.grid_chunks(x.chunks))
    elif geo.block is None and (nchunks > 1 or (scheme.offset is None and cal != "mse")):
        if scheme.offset is not None or cal == "mse":
            what = "an affine per-tensor scheme's scale and offset" if scheme.offset is not None \
                else "a per-tensor scale searched by mse"
            raise QuantError(f"{what} come from one search over the whole tensor: give x one "
                             f"chunk (x.rechunk(-1)), or use a block scheme, or calibration "
                             f"minmax or absmean ({nchunks} chunks here)")
        stats = _whole.reduce_chunks(x, "sum" if cal == "absmean" else "max")
        alpha = _whole.absmean_amplitude(stats) if cal == "absmean" else stats.maxabs
        scale = float(_whole.proxy(scheme, alpha, len(shape), rnd, srnd).scales[0])
    if scheme.is_two_level and g is None:
        if cal == "absmean":
            assert geo.block is not None
            alpha = _whole.reduce_chunks(x, "alpha", geo.block).alpha_max
        else:  # minmax, and mse, whose g comes from the minmax raw scales
            alpha = _whole.reduce_chunks(x, "max").maxabs
        g = _whole.proxy(scheme, alpha, len(shape), rnd, srnd).global_scale
    return _build(x, w_arr, s_arr, scale, g, scheme, options, geo)


def _one_scale(scales: Any) -> float:
    """A per-tensor scheme's one explicit scale, as a float (checked again by the core)."""
    a = np.asarray(scales.compute() if hasattr(scales, "compute") else scales)
    if a.size != 1:
        from ..errors import ScaleError

        raise ScaleError(f"a per-tensor scheme takes one scale, got shape {a.shape}")
    return a.reshape(-1)[0]  # type: ignore[no-any-return]


def _aligned(x: Any, geo: Geometry, scheme: QuantScheme, rechunk: bool) -> Any:
    bad = geo.misaligned(x.chunks)
    if not bad:
        return x
    target = geo.aligned(x.chunks)
    steps = {ax: geo.step(ax) for ax in bad}
    if not rechunk:
        raise ChunkAlignmentError(
            f"chunks {tuple(max(c) for c in x.chunks)} of a {x.shape} array cut blocks or "
            f"packed words of {scheme!r}: along axes {bad} every chunk but the last must be a "
            f"multiple of {[steps[a] for a in bad]} (rechunk=True rechunks)")
    warnings.warn(
        f"chunks {tuple(max(c) for c in x.chunks)} of a {x.shape} array cut blocks or packed "
        f"words of {scheme}: rechunked axes {bad} to {[target[a] for a in bad]} (multiples of "
        f"{[steps[a] for a in bad]})", ChunkAlignmentWarning, stacklevel=3)
    return x.rechunk(target)


def _build(x: Any, w: Any, s: Any, scale: Optional[float], g: Optional[float],
           scheme: QuantScheme, options: tuple, geo: Geometry) -> DaskQTensor:
    """The graph: one task per chunk (its values, scales, offsets), and the parts' arrays."""
    da = _dask()
    from dask.highlevelgraph import HighLevelGraph

    shape = tuple(int(d) for d in x.shape)
    token = _token(x.name, None if w is None else w.name, None if s is None else s.name, scale,
                   g, str(scheme), scheme.codebook, options)
    pname = "bq-quantize-" + token
    starts = origins(x.chunks)
    layer = {}
    for index in np.ndindex(*x.numblocks):
        origin = tuple(starts[ax][i] for ax, i in enumerate(index))
        fn = functools.partial(_quantize_block, scheme=scheme, options=options, scale=scale,
                               g=g, origin=origin, shape=shape)
        layer[(pname, *index)] = (fn, (x.name, *index),
                                  None if w is None else (w.name, *index),
                                  None if s is None else (s.name, *index))
    deps = [a for a in (x, w, s) if a is not None]
    parts = HighLevelGraph.from_collections(pname, layer, dependencies=deps)

    def part(kind: int, prefix: str, chunks: Chunks, dtype: np.dtype, index_of: Any) -> Any:
        name = f"{prefix}-{token}"
        sub = {(name, *index_of(index)): (operator.getitem, (pname, *index), kind)
               for index in np.ndindex(*x.numblocks)}
        layers = {**parts.layers, name: sub}
        graph = HighLevelGraph(layers, {**parts.dependencies, name: {pname}})
        return da.Array(graph, name, chunks=chunks, dtype=dtype,
                        meta=np.empty((0,) * len(chunks), dtype))

    layout = scheme.layout(shape)
    values = part(0, "bq-values", geo.storage_chunks(x.chunks), layout.storage_dtype,
                  geo.storage_index)
    offsets = None
    if scale is not None:  # per tensor, known already: the same for every chunk
        scales = da.from_array(np.array([scale], dtype=np.float32), chunks=1)
    else:  # the chunks' own (per tensor: the one chunk's own search, mse or affine)
        grid = geo.grid_chunks(x.chunks)
        index_of = (lambda i: i) if geo.block is not None else (lambda i: (0,))
        scales = part(1, "bq-scales", grid, np.dtype(np.float32), index_of)
        if scheme.offset is not None:
            odtype = np.dtype(np.uint8 if scheme.offset.kind == "zero" else np.float32)
            offsets = part(2, "bq-offsets", grid, odtype, index_of)
    return DaskQTensor._new(values, scales, offsets, g, scheme, shape, x.chunks)


def _from_qtensor(qt: QTensor) -> DaskQTensor:
    """A tensor quantized in memory (an empty or 0-d one), as one chunk of each part."""
    da = _dask()

    def one(a: Optional[np.ndarray]) -> Any:
        return None if a is None else da.from_array(np.array(a), chunks=a.shape)

    return DaskQTensor._new(one(qt.values), one(qt.scales), one(qt.offsets), qt.global_scale,
                            qt.scheme, qt.shape, tuple((d,) for d in qt.shape))


def dequantize(qt: DaskQTensor, dtype: Any = None) -> Any:
    """``qt.dequantize(dtype)``: a dask array of the floats."""
    if not isinstance(qt, DaskQTensor):
        raise TypeError(f"blockquant.dask.dequantize takes a DaskQTensor, got "
                        f"{type(qt).__name__}")
    return qt.dequantize(dtype)
