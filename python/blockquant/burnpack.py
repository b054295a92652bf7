"""burn's ``.bpk`` files (burn-pack, format version 1), with blockquant tensors as ``QFloat``.

    import numpy as np, blockquant as bq
    from blockquant.burnpack import save_burnpack, load_burnpack

    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    save_burnpack("model.bpk", {"w": bq.quantize(w, bq.presets.int8()), "b": np.zeros(64, np.float32)})
    load_burnpack("model.bpk")["w"].dequantize()

The container, as burn-pack 0.22 writes and reads it (``burn-pack/src/base.rs``, ``writer.rs``):

- a 10-byte little-endian header: magic u32 ``0x4255524E`` ("BURN"), format version u16 (1),
  metadata length u32;
- the metadata, CBOR as serde/ciborium writes it: a map ``{"tensors": {NAME: {"dtype",
  "shape", "data_offsets": [begin, end], "param_id"?}}, "metadata"?: {str: str},
  "scalars"?: {...}}`` (struct fields in declaration order, map keys sorted, ``metadata`` and
  ``scalars`` left out when empty);
- zero padding up to the next multiple of 256 bytes: the data section starts there;
- each tensor's bytes at ``data_offsets``, relative to the data section, every ``begin`` a
  multiple of 256 (zero padding between tensors); the file ends with the last tensor.

A quantized tensor's dtype is ``{"QFloat": scheme}`` with burn's ``QuantScheme`` fields (see
:func:`scheme_to_burn`) and its bytes are :meth:`QTensor.to_bytes` (values, scales, then the f32
per-tensor scale: burn's ``QuantizedBytes``). Plain numpy arrays are stored as burn's plain
dtypes (``F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8`` and ``{"Bool": "Native"}``).

Reading checks everything a crafted file could get wrong and raises :class:`LayoutError` with a
one-line message; no length read from the file is allocated before it is checked against the
file's size. Writing is atomic: a temporary file beside the target, fsynced, then renamed.

``param_id`` is not written and is ignored on reading, as are ``scalars`` (after validation) and
descriptor or top-level keys burn-pack itself would ignore. Only this module's public functions
are a contract; the CBOR helpers handle the subset burn-pack uses and nothing more.
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Mapping, Union

import numpy as np

from ._cbor import MAX_CBOR_DEPTH, decode_cbor, encode_cbor
from ._fs import AtomicFile
from .errors import LayoutError, QuantError, SchemeError
from .qtensor import QTensor
from .scheme import BlockScale, QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype

__all__ = [
    "MAX_CBOR_DEPTH",
    "Planned",
    "BurnpackFile",
    "save_burnpack",
    "load_burnpack",
    "load_burnpack_metadata",
    "scheme_to_burn",
    "scheme_from_burn",
    "encode_cbor",
    "decode_cbor",
]

MAGIC = 0x4255524E
FORMAT_VERSION = 1
HEADER_SIZE = 10
ALIGNMENT = 256
#: burn-pack's own limits (``base.rs``): metadata size and tensor count.
MAX_METADATA_SIZE = 100 * 1024 * 1024
MAX_TENSOR_COUNT = 100_000
#: burn's ``BlockSize`` holds 5 dims of u8 (cubecl-common ``quant/scheme.rs``).
BURN_BLOCK_DIMS = 5
BURN_BLOCK_MAX = 255

Tensor = Union[QTensor, np.ndarray]


# -- schemes and dtypes ----------------------------------------------------------------------------
_STORE_NAMES = {"packed_u32": "PackedU32", "packed_native": "PackedNative"}
_STORE_KINDS = {v: k for k, v in _STORE_NAMES.items()}


def scheme_to_burn(scheme: QuantScheme) -> dict[str, Any]:
    """burn's serialized ``QuantScheme`` for ``scheme``, as its CBOR map (field order kept).

    ``tensor`` and ``block`` stay ``None`` where the scheme has no such level: a scheme with
    neither is burn's implicit f32 per-tensor scale, which burn keeps distinct from an explicit
    ``per_tensor(F32)``. The block size is burn's ``BlockSize {storage: [u8; 5], len}``,
    canonical as ``BlockSize::new`` makes it: leading 1s dropped (so blockquant's ``(1,)`` is
    ``len`` 0), unused entries 1. Raises :class:`SchemeError` for a block dim over 255, which
    burn cannot hold.
    """
    if not isinstance(scheme, QuantScheme):
        raise TypeError(f"a scheme is a QuantScheme, got {type(scheme).__name__}")
    if scheme.offset is not None:
        raise SchemeError(f"burn's Burnpack has no affine values (offsets), got {scheme!r}")
    if scheme.codebook is not None:
        raise SchemeError(
            f"burn's Burnpack has no place for a Lookup scheme's codebook (burn refuses Lookup "
            f"tensors too): save {scheme} as safetensors"
        )
    if scheme.store.kind == "native":
        store: Any = "Native"
    else:
        store = {_STORE_NAMES[scheme.store.kind]: scheme.store.dim}
    block = None
    if scheme.block is not None:
        dims = [d for d in scheme.block.size]
        while dims and dims[0] == 1:
            dims.pop(0)
        if any(d > BURN_BLOCK_MAX for d in dims):
            raise SchemeError(
                f"burn stores block dims as u8 (at most {BURN_BLOCK_MAX}), got {scheme!r}"
            )
        block = {
            "size": {"storage": dims + [1] * (BURN_BLOCK_DIMS - len(dims)), "len": len(dims)},
            "dtype": scheme.block.dtype.value,
        }
    return {
        "value": scheme.value.value,
        "store": store,
        "mode": scheme.mode.value,
        "tensor": None if scheme.tensor is None else scheme.tensor.value,
        "block": block,
    }


def _enum(cls: Any, text: Any, what: str) -> Any:
    if isinstance(text, str):
        try:
            return cls(text)
        except ValueError:
            pass
    raise LayoutError(f"unknown {what} {text!r}")


def _uint(x: Any, what: str, limit: int = 1 << 64) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < limit:
        raise LayoutError(f"{what} is not an integer in [0, {limit}), got {_short(x)}")
    return x


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _struct(obj: Any, fields: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or set(obj) != set(fields):
        raise LayoutError(f"{what} is a map of {', '.join(fields)}, got {_short(obj)}")
    return obj


def scheme_from_burn(obj: Any) -> QuantScheme:
    """The scheme burn's serialized ``QuantScheme`` map describes (the inverse of
    :func:`scheme_to_burn`). Raises :class:`LayoutError` for anything else, including a scheme
    blockquant's rules reject, and :class:`SchemeError` for Lookup mode (no codebook in it)."""
    s = _struct(obj, ("value", "store", "mode", "tensor", "block"), "a QuantScheme")
    value = _enum(QuantValue, s["value"], "QuantValue")
    mode = _enum(QuantMode, s["mode"], "QuantMode")
    if mode is QuantMode.Lookup:
        # burn keeps a lookup table beside the values, not in the file: nothing to decode with.
        raise SchemeError(
            "a Lookup scheme: burn's Burnpack carries no codebook, so its values cannot be read"
        )
    raw_store = s["store"]
    if raw_store == "Native":
        store = QuantStore.Native
    elif (
        isinstance(raw_store, dict)
        and len(raw_store) == 1
        and next(iter(raw_store)) in _STORE_KINDS
    ):
        name, dim = next(iter(raw_store.items()))
        store = QuantStore(_STORE_KINDS[name], _uint(dim, f"the {name} dim", 1 << 63))
    else:
        raise LayoutError(f"unknown QuantStore {_short(raw_store)}")
    tensor = None if s["tensor"] is None else _enum(ScaleDtype, s["tensor"], "ScaleDtype")
    block = None
    if s["block"] is not None:
        b = _struct(s["block"], ("size", "dtype"), "a BlockScale")
        size = _struct(b["size"], ("storage", "len"), "a BlockSize")
        storage, n = size["storage"], _uint(size["len"], "a BlockSize len", BURN_BLOCK_DIMS + 1)
        if not isinstance(storage, list) or len(storage) != BURN_BLOCK_DIMS:
            raise LayoutError(f"a BlockSize storage is {BURN_BLOCK_DIMS} u8, got {_short(storage)}")
        dims = [_uint(d, "a block dim", BURN_BLOCK_MAX + 1) for d in storage]
        if 0 in dims[:n] or any(d != 1 for d in dims[n:]):
            raise LayoutError(f"a BlockSize is {n} dims >= 1 then 1s, got {storage}")
        block = BlockScale(dims[:n] or [1], _enum(ScaleDtype, b["dtype"], "ScaleDtype"))
    try:
        return QuantScheme(value, store, mode, tensor, block)
    except SchemeError as e:
        raise LayoutError(f"not a valid scheme: {e}") from None


#: burn DType name -> numpy dtype of its stored elements (little-endian); BF16 is apart.
_PLAIN_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "Flex32": np.dtype("<f4"),  # f32 storage, f16-like compute: read as float32
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
}
_BOOL_STORES = {"Native": np.dtype("u1"), "U8": np.dtype("u1"), "U32": np.dtype("<u4")}
_WRITTEN_NAMES = {(dt.kind, dt.itemsize): name for name, dt in _PLAIN_DTYPES.items()}
_WRITTEN_NAMES[("f", 4)] = "F32"


def _bfloat16() -> Any:
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(
            "bfloat16 tensors need ml_dtypes: pip install 'blockquant[ml]' (or ml-dtypes)"
        ) from None
    return np.dtype(ml_dtypes.bfloat16)


# -- writing ---------------------------------------------------------------------------------------
class Planned:
    """A tensor whose dtype, shape and size are known before its bytes exist: what a streaming
    writer (the ``blockquant`` command) hands :func:`save_burnpack` so that one tensor at a
    time is in memory. Either ``scheme`` (``produce()`` returns the :class:`QTensor`) or
    ``burn_dtype`` and ``nbytes`` (``produce()`` returns the little-endian bytes as burn stores
    them)."""

    def __init__(
        self,
        shape: tuple[int, ...],
        produce: Any,
        *,
        scheme: QuantScheme | None = None,
        burn_dtype: Any = None,
        nbytes: int | None = None,
    ) -> None:
        self.shape = tuple(shape)
        self.produce = produce
        self.scheme = scheme
        self.burn_dtype = burn_dtype
        self.nbytes = nbytes


class _Entry:
    """One tensor to write: its descriptor and a way to produce its bytes."""

    def __init__(self, name: str, tensor: Any) -> None:
        if not isinstance(name, str):
            raise TypeError(f"tensor names are str, got {type(name).__name__}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise LayoutError(f"tensor name {name!r} is not valid UTF-8") from None
        self.name = name
        self.tensor = tensor
        if isinstance(tensor, Planned):
            self.shape = tensor.shape
            if tensor.scheme is not None:
                self.dtype = {"QFloat": scheme_to_burn(tensor.scheme)}
                self.nbytes = tensor.scheme.layout(self.shape).nbytes
            else:
                self.dtype, self.nbytes = tensor.burn_dtype, int(tensor.nbytes or 0)
        elif isinstance(tensor, QTensor):
            self.dtype: Any = {"QFloat": scheme_to_burn(tensor.scheme)}
            self.shape = tuple(tensor.shape)
            self.nbytes = tensor.scheme.layout(self.shape).nbytes
        elif isinstance(tensor, (np.ndarray, np.generic)):
            self.tensor = tensor = np.asarray(tensor)
            self.shape = tuple(tensor.shape)
            self.dtype, self.stored = _plain_dtype(tensor)
            self.nbytes = tensor.size * self.stored.itemsize
        else:
            raise TypeError(
                f"tensor {name!r} is a blockquant QTensor or a numpy array, "
                f"got {type(tensor).__name__}"
            )

    def data(self) -> memoryview:
        tensor = self.tensor.produce() if isinstance(self.tensor, Planned) else self.tensor
        if isinstance(tensor, QTensor):
            raw = memoryview(tensor.to_bytes())
        elif isinstance(tensor, (bytes, bytearray, memoryview)):
            raw = memoryview(tensor).cast("B")
        else:
            a = np.asarray(tensor).reshape(-1)
            if self.dtype == "BF16":
                a = a.view(np.uint16)
            raw = memoryview(np.ascontiguousarray(a, dtype=self.stored).view(np.uint8))
        if len(raw) != self.nbytes:  # a bug, not a caller error: the planned layout is wrong
            raise AssertionError(f"tensor {self.name!r}: {len(raw)} bytes, planned {self.nbytes}")
        return raw


def _plain_dtype(a: np.ndarray) -> tuple[Any, np.dtype]:
    dt = a.dtype
    if dt.name == "bfloat16":
        return "BF16", np.dtype("<u2")
    if dt.kind == "b":
        return {"Bool": "Native"}, np.dtype("u1")
    name = _WRITTEN_NAMES.get((dt.kind, dt.itemsize))
    if name is None or dt.kind not in "fiu":
        raise TypeError(
            f"burn has no dtype for numpy {dt}: use float64/32/16, bfloat16, (u)int64/32/16/8 "
            "or bool"
        )
    return name, dt.newbyteorder("<")


def _metadata_map(metadata: Mapping[str, str] | None) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata is a mapping of str to str, got {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata maps str to str, got {k!r}: {v!r}")
    return {k: metadata[k] for k in sorted(metadata)}


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def save_burnpack(
    path: Any,
    tensors: Mapping[str, Union[Tensor, Planned]],
    metadata: Mapping[str, str] | None = None,
    *,
    force: bool = False,
) -> None:
    """Write ``tensors`` (name -> :class:`QTensor` or numpy array) to a burn-pack file at
    ``path`` atomically (an existing file only with ``force=True``, as ``quantize_file`` and
    the command). ``metadata`` is burn-pack's string-to-string map.

    Every argument is checked before anything is written: a :class:`QTensor` whose scheme burn
    cannot hold raises :class:`SchemeError`, an array of a dtype burn lacks ``TypeError``. The
    tensors' data sit in the mapping's order; the descriptors are sorted by name, as burn's.
    ``force=False`` refuses to replace an existing file (``FileExistsError``).
    """
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors is a mapping of names to tensors, got {type(tensors).__name__}")
    if len(tensors) > MAX_TENSOR_COUNT:
        raise LayoutError(f"burn-pack holds at most {MAX_TENSOR_COUNT} tensors, got {len(tensors)}")
    entries = [_Entry(name, t) for name, t in tensors.items()]
    offsets, end = [], 0
    for e in entries:
        begin = _align(end)
        end = begin + e.nbytes
        offsets.append((begin, end))
    descriptors = {
        e.name: {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": list(span)}
        for e, span in sorted(zip(entries, offsets), key=lambda pair: pair[0].name)
    }
    top: dict[str, Any] = {"tensors": descriptors}
    meta = _metadata_map(metadata)
    if meta:
        top["metadata"] = meta
    blob = encode_cbor(top)
    if len(blob) > MAX_METADATA_SIZE:
        raise LayoutError(f"metadata of {len(blob)} bytes is over burn-pack's {MAX_METADATA_SIZE}")
    header = struct.pack("<IHI", MAGIC, FORMAT_VERSION, len(blob))
    data_start = _align(HEADER_SIZE + len(blob))

    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
    if not force and target.exists():
        raise FileExistsError(f"{target} exists (force=True replaces it)")
    with AtomicFile(target, force=force) as out:
        f = out.f
        f.write(header)
        f.write(blob)
        f.write(bytes(data_start - HEADER_SIZE - len(blob)))
        at = 0
        for e, (begin, _) in zip(entries, offsets):
            f.write(bytes(begin - at))
            f.write(e.data())
            at = begin + e.nbytes
        out.commit()


# -- reading ---------------------------------------------------------------------------------------
class _Descriptor:
    def __init__(self, name: str, raw: Any) -> None:
        self.name = name
        where = f"tensor {name!r}"
        if not isinstance(raw, dict) or not {"dtype", "shape", "data_offsets"} <= set(raw):
            raise LayoutError(f"{where}: a descriptor is a map of dtype, shape, data_offsets")
        for key in raw:
            if not isinstance(key, str):
                raise LayoutError(f"{where}: descriptor key {key!r} is not text")
        if raw.get("param_id") is not None:
            _uint(raw["param_id"], f"{where}: param_id")
        shape = raw["shape"]
        if not isinstance(shape, list):
            raise LayoutError(f"{where}: shape is a list, got {_short(shape)}")
        self.shape = tuple(_uint(d, f"{where}: a dim", 1 << 63) for d in shape)
        extent = 1
        for d in self.shape:
            extent *= max(d, 1)
        if extent >= 1 << 63:  # numpy and the core index with 63 bits, even around a 0 dim
            raise LayoutError(f"{where}: shape {list(self.shape)} is too large")
        span = raw["data_offsets"]
        if not isinstance(span, list) or len(span) != 2:
            raise LayoutError(f"{where}: data_offsets is [begin, end], got {_short(span)}")
        self.begin, self.end = (_uint(o, f"{where}: an offset") for o in span)
        if self.begin > self.end:
            raise LayoutError(f"{where}: data_offsets [{self.begin}, {self.end}] run backwards")
        if self.begin % ALIGNMENT:
            raise LayoutError(
                f"{where}: data begins at {self.begin}, not a multiple of {ALIGNMENT}"
            )
        self.dtype = raw["dtype"]
        try:
            self.expected = self._expected_nbytes()
        except LayoutError as e:
            raise LayoutError(f"{where}: {e}") from None

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    def _expected_nbytes(self) -> int:
        dtype, numel = self.dtype, 1
        for d in self.shape:
            numel *= d
        if isinstance(dtype, str):
            if dtype == "BF16":
                return numel * 2
            if dtype in _PLAIN_DTYPES:
                return numel * _PLAIN_DTYPES[dtype].itemsize
        elif isinstance(dtype, dict) and len(dtype) == 1:
            ((kind, arg),) = dtype.items()
            if kind == "Bool" and isinstance(arg, str) and arg in _BOOL_STORES:
                return numel * _BOOL_STORES[arg].itemsize
            if kind == "QFloat":
                try:
                    self.scheme = scheme_from_burn(arg)
                except SchemeError as e:
                    raise SchemeError(f"tensor {self.name!r}: {e}") from None
                # A quantized value takes at least 2 bits: a shape that many values cannot fit
                # the data is refused before the layout is worked out for it.
                if numel > 4 * self.nbytes + 4:
                    raise LayoutError(f"{numel} values cannot fit {self.nbytes} bytes")
                try:
                    return self.scheme.layout(self.shape).nbytes
                except (ValueError, OverflowError) as e:  # QuantError is a ValueError
                    raise LayoutError(
                        f"{self.scheme!r} does not fit shape {self.shape}: {e}"
                    ) from None
        raise LayoutError(f"unknown dtype {_short(dtype)}")


def _read_header(f: BinaryIO, size: int, path: Any) -> tuple[dict[str, Any], int]:
    if size < HEADER_SIZE:
        raise LayoutError(f"{path}: truncated header: {size} bytes, a header takes {HEADER_SIZE}")
    magic, version, meta_len = struct.unpack("<IHI", f.read(HEADER_SIZE))
    if magic != MAGIC:
        raise LayoutError(f"{path}: not a burn-pack file (magic {magic:#010x}, want {MAGIC:#010x})")
    if version != FORMAT_VERSION:
        raise LayoutError(
            f"{path}: burn-pack format version {version}, only {FORMAT_VERSION} is read"
        )
    if meta_len > MAX_METADATA_SIZE:
        raise LayoutError(f"{path}: metadata length {meta_len} is over {MAX_METADATA_SIZE}")
    if HEADER_SIZE + meta_len > size:
        raise LayoutError(
            f"{path}: metadata length {meta_len} runs past the end of a {size}-byte file"
        )
    blob = f.read(meta_len)
    if len(blob) != meta_len:
        raise LayoutError(f"{path}: file shrank while being read")
    try:
        top = decode_cbor(blob)
    except LayoutError as e:
        raise LayoutError(f"{path}: metadata: {e}") from None
    if not isinstance(top, dict) or "tensors" not in top:
        raise LayoutError(f"{path}: metadata is not a map with 'tensors'")
    if not all(isinstance(k, str) for k in top):
        raise LayoutError(f"{path}: metadata has a key that is not text")
    return top, _align(HEADER_SIZE + meta_len)


def _string_map(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise LayoutError(f"{what} is a map with text keys")
    return obj


def _is_scalar(obj: Any) -> bool:
    """burn-pack's ``Scalar`` enum: ``{"Int": i64}``, ``{"UInt": u64}``, ``{"Float": f64}`` or
    ``{"Bool": bool}``."""
    if not isinstance(obj, dict) or len(obj) != 1:
        return False
    ((kind, v),) = obj.items()
    if kind == "Bool":
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    if kind == "Int":
        return isinstance(v, int) and -(1 << 63) <= v < 1 << 63
    if kind == "UInt":
        return isinstance(v, int) and 0 <= v < 1 << 64
    return kind == "Float" and isinstance(v, (int, float))


def _parse(f: BinaryIO, path: Any) -> tuple[list[_Descriptor], dict[str, str], int]:
    size = os.fstat(f.fileno()).st_size
    top, data_start = _read_header(f, size, path)
    try:
        tensors = _string_map(top["tensors"], "'tensors'")
        if len(tensors) > MAX_TENSOR_COUNT:
            raise LayoutError(f"{len(tensors)} tensors, burn-pack allows {MAX_TENSOR_COUNT}")
        metadata = _string_map(top.get("metadata", {}), "'metadata'")
        if not all(isinstance(v, str) for v in metadata.values()):
            raise LayoutError("'metadata' maps text to text")
        for name, scalar in _string_map(top.get("scalars", {}), "'scalars'").items():
            if not _is_scalar(scalar):
                raise LayoutError(f"scalar {name!r} is not Int, UInt, Float or Bool")
        descriptors = [_Descriptor(name, tensors[name]) for name in sorted(tensors)]
        spans = sorted((d.begin, d.end, d.name) for d in descriptors if d.end > d.begin)
        for (_, end0, a), (begin1, _, b) in zip(spans, spans[1:]):
            if begin1 < end0:
                raise LayoutError(f"tensors {a!r} and {b!r} overlap")
        for d in descriptors:
            if data_start + d.end > size:
                raise LayoutError(
                    f"tensor {d.name!r}: data [{d.begin}, {d.end}) runs past the end of the "
                    f"{size - data_start}-byte data section"
                )
            if d.nbytes != d.expected:
                raise LayoutError(
                    f"tensor {d.name!r}: {d.nbytes} bytes, its dtype and shape "
                    f"{list(d.shape)} take {d.expected}"
                )
    except LayoutError as e:
        raise LayoutError(f"{path}: {e}") from None
    return descriptors, metadata, data_start


def _build(d: _Descriptor, raw: bytes) -> Tensor:
    if isinstance(d.dtype, dict) and "QFloat" in d.dtype:
        try:  # checks every scale and stored code too (format.md "The byte layout")
            return QTensor.from_bytes(raw, d.scheme, d.shape)
        except QuantError as e:
            raise LayoutError(f"tensor {d.name!r}: {e}") from None
    if isinstance(d.dtype, dict):  # Bool
        stored = np.frombuffer(raw, _BOOL_STORES[d.dtype["Bool"]])
        if stored.size and stored.max() > 1:
            bad = int(np.argmax(stored > 1))
            raise LayoutError(f"tensor {d.name!r}: bool at index {bad} is {stored[bad]}, not 0/1")
        return (stored != 0).reshape(d.shape)
    if d.dtype == "BF16":
        return np.frombuffer(raw, "<u2").astype(np.uint16).view(_bfloat16()).reshape(d.shape)
    stored = _PLAIN_DTYPES[d.dtype]
    return np.frombuffer(raw, stored).astype(stored.newbyteorder("=")).reshape(d.shape)


def load_burnpack(path: Any) -> dict[str, Tensor]:
    """The tensors of the burn-pack file at ``path``, by name (sorted, as burn lists them):
    :class:`QTensor` for ``QFloat`` tensors, numpy arrays for the rest (``Bool`` as bool,
    ``BF16`` as ml_dtypes' bfloat16, ``Flex32`` as float32).

    A file that is not a well-formed burn-pack file, or whose tensors do not match their
    dtype and shape, raises :class:`LayoutError` naming the file and the defect; a Lookup-mode
    tensor raises :class:`SchemeError` naming it (the file has no codebook to read it with).
    """
    with open(path, "rb") as f:
        descriptors, _, data_start = _parse(f, path)
        out: dict[str, Tensor] = {}
        for d in descriptors:
            f.seek(data_start + d.begin)
            raw = f.read(d.nbytes)
            if len(raw) != d.nbytes:
                raise LayoutError(f"{path}: file shrank while being read")
            try:
                out[d.name] = _build(d, raw)
            except LayoutError as e:
                raise LayoutError(f"{path}: {e}") from None
    return out


def load_burnpack_metadata(path: Any) -> dict[str, str]:
    """The string-to-string ``metadata`` map of the burn-pack file at ``path`` (the file is
    validated as by :func:`load_burnpack`, its tensor data is not read)."""
    with open(path, "rb") as f:
        return dict(_parse(f, path)[1])


class BurnpackFile:
    """An open burn-pack file read one tensor at a time (the ``blockquant`` command's reader):
    ``names``, ``info(name)`` -> (burn dtype, shape, nbytes, scheme or None), ``read(name)``.
    Validated on opening as :func:`load_burnpack` validates."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self._f = open(path, "rb")
        try:
            descriptors, self.metadata, self._data_start = _parse(self._f, path)
        except BaseException:
            self._f.close()
            raise
        self._by_name = {d.name: d for d in descriptors}
        # In data order: a command streams them as they sit in the file.
        self.names = [d.name for d in sorted(descriptors, key=lambda d: (d.begin, d.name))]

    def info(self, name: str) -> tuple[Any, tuple[int, ...], int, QuantScheme | None]:
        d = self._by_name[name]
        return d.dtype, d.shape, d.nbytes, getattr(d, "scheme", None)

    def raw(self, name: str) -> bytes:
        d = self._by_name[name]
        self._f.seek(self._data_start + d.begin)
        raw = self._f.read(d.nbytes)
        if len(raw) != d.nbytes:
            raise LayoutError(f"{self.path}: file shrank while being read")
        return raw

    def read(self, name: str) -> Tensor:
        try:
            return _build(self._by_name[name], self.raw(name))
        except LayoutError as e:
            raise LayoutError(f"{self.path}: {e}") from None

    def close(self) -> None:
        self._f.close()
