"""A :class:`DaskQTensor`'s parts in a zarr group, and back: ``values``, ``scales`` (and
``offsets``) as zarr arrays chunked as the tensor is (a chunk of the input is a chunk of each
part), and a ``blockquant`` attribute holding the scheme text, the shape, the input's chunk
size and the per-tensor scale g. The attribute is written last: a store whose writing was cut
short has none, and reads as no tensor.

The parts are stored as they are (burn's storage and float32 scales); reading them back gives
the same tensor bit for bit. docs/dask.md "The parts in zarr" describes the group for other
readers. (To store floats that read back dequantized, use the zarr codec,
:mod:`blockquant.zarr_codec`.)
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..errors import LayoutError, QuantError
from ..scheme import QuantScheme
from ._array import DaskQTensor, _dask
from ._grid import Geometry

__all__ = ["StoreError", "from_zarr", "to_zarr"]

#: The attribute's ``format`` and ``version``: a reader refuses any other.
FORMAT = "blockquant-parts"
VERSION = 1
ATTR = "blockquant"


class StoreError(LayoutError):
    """A zarr group that holds no blockquant tensor (written by another program or codec, or
    never finished), or whose parts do not fit the scheme and shape it names."""


def _zarr() -> Any:
    try:
        import zarr
    except ImportError:
        raise ImportError("storing in zarr needs zarr: pip install 'blockquant[zarr]'") from None
    return zarr


def to_zarr(qt: DaskQTensor, store: Any, path: Optional[str] = None, *, overwrite: bool = False,
            compute: bool = True, **create: Any) -> Any:
    """Write ``qt``'s parts into a new zarr group at ``store`` (a path, URL or zarr store;
    ``path`` inside it). An existing group is an error unless ``overwrite``. The tensor is
    rechunked to a regular chunking first if it has none (zarr's grid). ``create`` goes to
    ``zarr.Group.create_array`` (``compressors=``, say). With ``compute=False``, a
    ``dask.delayed`` that writes everything when computed."""
    if not isinstance(qt, DaskQTensor):
        raise TypeError(f"to_zarr takes a DaskQTensor, got {type(qt).__name__}")
    zarr = _zarr()
    da = _dask()
    if qt.shape and not qt.is_regular():
        qt = qt.rechunk(qt.regular_chunks())
    root = zarr.open_group(store, path=path, mode="w" if overwrite else "w-")
    names = ["values", "scales"] + (["offsets"] if qt.offsets is not None else [])
    sources = [getattr(qt, n) for n in names]
    targets = []
    for name, arr in zip(names, sources):
        chunk = tuple(max(c[0], 1) for c in arr.chunks) if arr.ndim else ()
        targets.append(root.create_array(name, shape=arr.shape, chunks=chunk, dtype=arr.dtype,
                                         fill_value=0, **create))
    attrs = {
        "format": FORMAT,
        "version": VERSION,
        "scheme": str(qt.scheme),
        "shape": list(qt.shape),
        "chunks": [max(c[0], 1) for c in qt.chunks] if qt.shape else [],
        "global_scale": qt.global_scale,
        "parts": names,
    }
    stored = da.store(sources, targets, lock=False, compute=False)
    import dask

    done = dask.delayed(_mark_done)(stored, root, attrs)
    if compute:
        done.compute()
        return None
    return done


def _mark_done(_: Any, root: Any, attrs: dict) -> None:
    root.attrs[ATTR] = attrs


def from_zarr(store: Any, path: Optional[str] = None) -> DaskQTensor:
    """The tensor :func:`to_zarr` wrote at ``store`` (``path`` inside it), lazily: its parts as
    dask arrays read from zarr. A group with no blockquant tensor in it, or parts that do not
    fit its scheme and shape, is a :class:`StoreError`."""
    zarr = _zarr()
    da = _dask()
    where = f"{store}" + (f"/{path}" if path else "")
    try:
        root = zarr.open_group(store, path=path, mode="r")
    except Exception as e:  # no group there: an array, nothing, an unreadable store
        raise StoreError(f"{where}: no zarr group of a blockquant tensor ({type(e).__name__}: "
                         f"{e})") from None
    attrs = root.attrs.get(ATTR)
    if not isinstance(attrs, dict) or attrs.get("format") != FORMAT:
        raise StoreError(f"{where}: holds no blockquant tensor (no {ATTR!r} attribute of "
                         f"format {FORMAT!r}): written by another codec or program, or its "
                         "writing was cut short")
    if attrs.get("version") != VERSION:
        raise StoreError(f"{where}: a blockquant store of version {attrs.get('version')!r}; "
                         f"this blockquant reads version {VERSION}")
    scheme, shape, chunks, g = _read_attrs(attrs, where)
    layout = scheme.layout(shape)
    want = {"values": (tuple(layout.storage_shape), layout.storage_dtype),
            "scales": (tuple(layout.scale_grid), np.dtype(np.float32))}
    if scheme.offset is not None:
        odtype = np.uint8 if scheme.offset.kind == "zero" else np.float32
        want["offsets"] = (tuple(layout.scale_grid), np.dtype(odtype))
    parts = {}
    for name, (pshape, dtype) in want.items():
        try:
            arr = root[name]
        except KeyError:
            raise StoreError(f"{where}: no {name!r} array beside the attribute") from None
        if tuple(arr.shape) != pshape or np.dtype(arr.dtype) != dtype:
            raise StoreError(f"{where}/{name}: {scheme} on shape {shape} stores {dtype} "
                             f"{pshape}, found {np.dtype(arr.dtype)} {tuple(arr.shape)}")
        parts[name] = arr
    if not shape:
        normal: tuple = ()
        got = {n: da.from_array(a[...], chunks=a.shape) for n, a in parts.items()}
    else:
        normal = da.core.normalize_chunks(tuple(chunks), shape, dtype=np.float32)
        geo = Geometry.of(scheme, shape)
        if geo.misaligned(normal):
            raise StoreError(f"{where}: chunks {tuple(chunks)} cut blocks or packed words of "
                             f"{scheme}")
        grid = geo.grid_chunks(normal)
        got = {"values": da.from_zarr(parts["values"], chunks=geo.storage_chunks(normal))}
        for name in ("scales", "offsets"):
            if name in parts:
                got[name] = da.from_zarr(parts[name], chunks=grid)
    return DaskQTensor._new(got["values"], got["scales"], got.get("offsets"), g, scheme,
                            shape, normal)


def _sizes(v: Any) -> bool:
    return isinstance(v, list) and all(type(d) is int and d >= 0 for d in v)


def _read_attrs(attrs: dict, where: str) -> tuple:
    try:
        scheme = QuantScheme.parse(attrs["scheme"])
    except (KeyError, TypeError, QuantError) as e:
        raise StoreError(f"{where}: the attribute's scheme is unreadable ({e})") from None
    shape, chunks, g = attrs.get("shape"), attrs.get("chunks"), attrs.get("global_scale")
    if not _sizes(shape) or not _sizes(chunks) or len(chunks) != len(shape):
        raise StoreError(f"{where}: the attribute's shape {shape!r} or chunks {chunks!r} are "
                         "not lists of sizes of one length")
    if scheme.is_two_level != (g is not None) or (g is not None and (
            isinstance(g, bool) or not isinstance(g, (int, float)) or not np.isfinite(g)
            or g < 0)):
        raise StoreError(f"{where}: global_scale {g!r} does not go with {scheme}")
    if any(c == 0 for c, d in zip(chunks, shape) if d):
        raise StoreError(f"{where}: a chunk size of 0 on a non-empty axis")
    return scheme, tuple(shape), tuple(chunks), g
