"""The blockquant file format: quantized tensors inside a ``.safetensors`` file that read back
without guessing.

Format 2 (format 1 is still read). For each quantized tensor ``NAME``:

- ``NAME.values``: the value storage as it is (format.md "Stores and packing"): I8, U8 or U32, in the storage shape;
- ``NAME.scales``: the stored scales (block scales, or the one per-tensor scale) in the grid's
  shape as burn's bytes order it (``Layout.stored_scale_grid``), encoded in their own dtype so
  the file is as small as the format: F32 and F16 as themselves, BF16 as its U16 bits, UE8M0 and
  UE4M3 as their U8 codes (burn's bytes, format.md "The byte layout");
- ``NAME.global_scale`` (two-level schemes only): the per-tensor scale g, F32, shape ``()``;
- ``NAME.offsets`` (affine schemes only): the zero points (U8) or biases (F32, F16, or BF16 as
  U16 bits) in the scales' shape and order.

The header's ``__metadata__`` keeps the input's own metadata and adds one key, ``blockquant``: a
JSON object ``{"format": 2, "tensors": {NAME: {"scheme", "shape", "dtype", "values", "scales",
"global_scale"?, "offsets"?, "calibration", "rounding", "scale_rounding"}}}`` with the scheme in its text
form (``QuantScheme.parse``), the original shape and dtype (float16, bfloat16, float32, float64).
Every other tensor (not floating point, or left out by include/exclude) is copied unchanged
under its own name. A name used twice in the output (say an input that already has both ``w``
and ``w.values``) is an error, never an overwrite.

Format 1 differs only where blockquant's packing predates burn's layout: PackedNative of 4- and
2-bit ints packed several values a byte, and packing along an outer axis shrank that axis in
place (scales row-major). Such tensors are converted on reading; every other tensor is the same
in both formats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._legacy_packing import format1_storage
from ..errors import QuantError
from ..qtensor import QTensor
from ..scheme import QuantScheme, QuantValue, ScaleDtype
from .base import NAME_TO_ST, NP_TO_ST, ST_DTYPES, Checkpoint
from .safetensors import HeaderEntry

FORMAT_VERSION = 2
#: Every format version this release reads.
READ_VERSIONS = (1, 2)
META_KEY = "blockquant"
PART_KEYS = ("values", "scales", "global_scale")


def part_keys(scheme: QuantScheme) -> tuple[str, ...]:
    """The parts a tensor of ``scheme`` is stored in, in the order of its bytes."""
    if scheme.offset is not None:
        return ("values", "scales", "offsets")
    return PART_KEYS if scheme.is_two_level else PART_KEYS[:2]

#: How each scale dtype's codes are stored in the file.
_SCALE_TO_ST = {
    ScaleDtype.F32: "F32",
    ScaleDtype.F16: "F16",
    ScaleDtype.BF16: "U16",
    ScaleDtype.UE8M0: "U8",
    ScaleDtype.UE4M3: "U8",
}


@dataclass
class Entry:
    """A quantized tensor's metadata entry."""

    name: str
    scheme: QuantScheme
    shape: tuple[int, ...]
    dtype: str  # float16 / bfloat16 / float32 / float64
    parts: dict[str, str]  # "values"/"scales"/"global_scale" -> tensor name
    extra: dict[str, Any] = field(default_factory=dict)  # the options it was quantized with
    version: int = FORMAT_VERSION  # the file's format version

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"scheme": str(self.scheme), "shape": list(self.shape)}
        d["dtype"] = self.dtype
        d.update(self.parts)
        d.update(self.extra)
        return d


def part_layout(name: str, scheme: QuantScheme, shape: tuple[int, ...]) -> list[HeaderEntry]:
    """The output tensors holding ``name`` quantized with ``scheme``, in the order of burn's
    bytes (``QTensor.to_bytes``). Raises SchemeError when the tensor cannot take the scheme."""
    lay = scheme.layout(shape)
    parts = [
        HeaderEntry(f"{name}.values", NP_TO_ST[lay.storage_dtype], lay.storage_shape,
                    lay.storage_nbytes),
        HeaderEntry(f"{name}.scales", _SCALE_TO_ST[lay.scale_dtype], lay.stored_scale_grid,
                    lay.n_scales * lay.scale_dtype.nbytes),
    ]
    if scheme.is_two_level:
        parts.append(HeaderEntry(f"{name}.global_scale", "F32", (), 4))
    if scheme.offset is not None:  # zero points as U8, biases as a scale of their dtype
        off = scheme.offset
        st = "U8" if off.kind == "zero" else _SCALE_TO_ST[off.dtype]
        parts.append(HeaderEntry(f"{name}.offsets", st, lay.stored_scale_grid,
                                 lay.offsets_nbytes))
    assert sum(p.nbytes for p in parts) == lay.nbytes, (name, scheme, shape)
    return parts


def metadata_value(entries: dict[str, Entry]) -> str:
    """The ``blockquant`` metadata value declaring ``entries``."""
    tensors = {name: e.to_json() for name, e in entries.items()}
    return json.dumps({"format": FORMAT_VERSION, "tensors": tensors}, separators=(",", ":"))


def read_entries(ckpt: Checkpoint) -> dict[str, Entry]:
    """The quantized tensors a blockquant file declares (empty for any other file)."""
    raw = ckpt.metadata.get(META_KEY)
    if raw is None:
        return {}
    try:
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise TypeError(f"a JSON object was expected, not {_json_kind(meta)}")
        version = meta["format"]
        tensors = meta["tensors"]
        if not isinstance(tensors, dict):
            raise TypeError(f"'tensors' is {_json_kind(tensors)}, not an object")
    except (ValueError, KeyError, TypeError) as e:
        raise ckpt.error(None, f"malformed blockquant metadata: {_why(e)}") from None
    except RecursionError:
        raise ckpt.error(None, "malformed blockquant metadata: nested too deeply") from None
    if version not in READ_VERSIONS or type(version) is not int:
        raise ckpt.error(
            None,
            f"blockquant format {version!r}: this version reads formats "
            f"{', '.join(map(str, READ_VERSIONS))}",
        )
    out: dict[str, Entry] = {}
    owner: dict[str, str] = {}
    for name, d in tensors.items():
        try:
            if not isinstance(d, dict):
                raise TypeError(f"its entry is {_json_kind(d)}, not an object")
            scheme = QuantScheme.parse(d["scheme"])
            shape = tuple(d["shape"])
            if not all(type(s) is int and 0 <= s < 1 << 63 for s in shape):
                raise ValueError(f"bad shape {d['shape']!r}")
            dtype = d["dtype"]
            if dtype not in NAME_TO_ST:
                raise ValueError(f"bad dtype {dtype!r}")
            keys = part_keys(scheme)
            parts = {k: d[k] for k in keys}
            if not all(isinstance(part, str) for part in parts.values()):
                raise ValueError("tensor parts are named by strings")
        except (QuantError, ValueError, KeyError, TypeError, OverflowError) as e:
            raise ckpt.error(name, f"malformed blockquant metadata: {_why(e)}") from None
        for key, part in parts.items():
            if part not in ckpt:
                raise ckpt.error(name, f"its {key} tensor {part!r} is missing")
            if part in owner:
                raise ckpt.error(name, f"its {key} tensor {part!r} belongs to {owner[part]!r} too")
            owner[part] = name
        extra = {k: v for k, v in d.items() if k not in ("scheme", "shape", "dtype", *keys)}
        out[name] = Entry(name, scheme, shape, dtype, parts, extra, version)
    return out


def _why(e: Exception) -> str:
    """What is wrong with the metadata, in words (a KeyError's text is the bare key)."""
    if isinstance(e, KeyError):
        return f"the key {e.args[0]!r} is missing"
    return str(e)


def _json_kind(v: object) -> str:
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return kinds.get(type(v), type(v).__name__)


def load_qtensor(ckpt: Checkpoint, e: Entry) -> QTensor:
    """Rebuild a quantized tensor from its parts; everything is checked (QTensor.from_parts)."""
    if e.version == 1 and _format1_differs(e.scheme):
        return _load_format1(ckpt, e)
    try:
        expected = part_layout(e.name, e.scheme, e.shape)
    except (QuantError, OverflowError) as err:
        raise ckpt.error(e.name, str(err)) from None
    blob = bytearray()
    for part, want in zip(e.parts.values(), expected):
        t = ckpt.info(part)
        if t.dtype != want.dtype or t.shape != want.shape:
            raise ckpt.error(
                e.name,
                f"{part} is {t.dtype} {list(t.shape)}, {e.scheme} on {list(e.shape)} stores "
                f"{want.dtype} {list(want.shape)}",
            )
        blob += ckpt.read(part).astype(ST_DTYPES[want.dtype][1], copy=False).tobytes()
    try:
        # from_bytes decodes the scale codes (burn's layout is exactly the parts in a row) and
        # checks every value code and scale: it accepts exactly what from_parts accepts (format.md "The byte layout").
        return QTensor.from_bytes(bytes(blob), e.scheme, e.shape)
    except QuantError as err:
        raise ckpt.error(e.name, str(err)) from None


# -- format 1 ----------------------------------------------------------------------------------


def _format1_differs(scheme: QuantScheme) -> bool:
    """Whether format 1 stored ``scheme``'s values differently from burn's layout."""
    st = scheme.store
    if not st.is_packed:
        return False
    sub_byte_native = (
        st.kind == "packed_native" and scheme.value.bits < 8 and scheme.value is not QuantValue.E2M1
    )
    return st.dim > 0 or sub_byte_native


def _load_format1(ckpt: Checkpoint, e: Entry) -> QTensor:
    """A format-1 tensor in the old packing: fields `word_bits / bits` a word along the packed
    axis, that axis shrunk in place; scales row-major. Its fields are moved into burn's layout
    (``format1_storage``), where the core checks them as any other file's."""
    scheme, shape = e.scheme, e.shape
    try:
        lay = scheme.layout(shape)
    except QuantError as err:
        raise ckpt.error(e.name, str(err)) from None
    dims = shape if shape else (1,)
    axis = len(dims) - 1 - scheme.store.dim
    word_bits = 32 if scheme.store.kind == "packed_u32" else 8
    per = word_bits // scheme.value.bits
    old_shape = dims[:axis] + (-(-dims[axis] // per),) + dims[axis + 1 :]
    old_dtype = "U32" if word_bits == 32 else "U8"
    want = {"values": (old_dtype, old_shape),
            "scales": (_SCALE_TO_ST[lay.scale_dtype], lay.scale_grid),
            "global_scale": ("F32", ())}
    arrays = {}
    for key, part in e.parts.items():
        t = ckpt.info(part)
        dtype, pshape = want[key]
        if t.dtype != dtype or t.shape != tuple(pshape):
            raise ckpt.error(
                e.name,
                f"{part} is {t.dtype} {list(t.shape)}, format 1 stores {e.scheme} on "
                f"{list(shape)} as {dtype} {list(pshape)}",
            )
        arrays[key] = ckpt.read(part).astype(ST_DTYPES[dtype][1], copy=False)
    storage = format1_storage(arrays["values"], scheme, dims)
    scales = arrays["scales"]
    if lay.stored_scale_grid != lay.scale_grid:  # burn orders them as the values
        scales = np.swapaxes(scales, axis, -1)
    blob = storage.astype(storage.dtype.newbyteorder("<")).tobytes()
    blob += np.ascontiguousarray(scales).tobytes()
    if "global_scale" in arrays:
        blob += arrays["global_scale"].tobytes()
    try:
        qt = QTensor.from_bytes(blob, scheme, shape)
        return QTensor.from_parts(qt.values, qt.scales, scheme, shape, qt.global_scale)
    except QuantError as err:
        raise ckpt.error(e.name, str(err)) from None
