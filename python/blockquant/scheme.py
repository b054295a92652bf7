"""The scheme model (SPEC §1): what a quantized tensor holds and how it is laid out.

Every class here is an immutable value: equal by value, hashable, with a readable repr. Builder
methods return new schemes. The validity rules live in one place, the Rust core: building a
:class:`QuantScheme` builds its core twin (``_native.Scheme``) once, which checks every rule, and
every later call hands that twin to the core as it is. So an invalid scheme never exists, and
Python keeps only type checks (a ``TypeError`` for an argument of the wrong type).
"""

from __future__ import annotations

import enum
import functools
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional, Sequence, Tuple

import numpy as np

from . import _native, codebooks
from .errors import LayoutError, SchemeError
from .options import QuantOptions

__all__ = [
    "QuantValue",
    "ScaleDtype",
    "QuantMode",
    "QuantStore",
    "BlockScale",
    "QuantScheme",
    "Layout",
]

MAX_BLOCK_DIMS = 5


class QuantValue(enum.Enum):
    """The type of each stored value."""

    Q8F = "Q8F"
    Q8S = "Q8S"
    Q4F = "Q4F"
    Q4S = "Q4S"
    Q2F = "Q2F"
    Q2S = "Q2S"
    E4M3 = "E4M3"
    E5M2 = "E5M2"
    E2M1 = "E2M1"

    @property
    def bits(self) -> int:
        return _VALUE_INFO[self][0]

    @property
    def qmin(self) -> float:
        return _VALUE_INFO[self][1]

    @property
    def qmax(self) -> float:
        return _VALUE_INFO[self][2]

    @property
    def is_float(self) -> bool:
        return self in (QuantValue.E4M3, QuantValue.E5M2, QuantValue.E2M1)

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__


#                 bits  qmin      qmax
_VALUE_INFO = {
    QuantValue.Q8F: (8, -128.0, 127.0),
    QuantValue.Q8S: (8, -127.0, 127.0),
    QuantValue.Q4F: (4, -8.0, 7.0),
    QuantValue.Q4S: (4, -7.0, 7.0),
    QuantValue.Q2F: (2, -2.0, 1.0),
    QuantValue.Q2S: (2, -1.0, 1.0),
    QuantValue.E4M3: (8, -448.0, 448.0),
    QuantValue.E5M2: (8, -57344.0, 57344.0),
    QuantValue.E2M1: (4, -6.0, 6.0),
}


class ScaleDtype(enum.Enum):
    """How a scale is stored."""

    F32 = "F32"
    F16 = "F16"
    BF16 = "BF16"
    UE8M0 = "UE8M0"
    UE4M3 = "UE4M3"

    @property
    def nbytes(self) -> int:
        return _SCALE_INFO[self][0]

    @property
    def max(self) -> float:
        """The largest finite value the dtype holds."""
        return _SCALE_INFO[self][1]

    @property
    def smallest(self) -> float:
        """The smallest value > 0 the dtype holds."""
        return _SCALE_INFO[self][2]

    @property
    def has_zero(self) -> bool:
        return self is not ScaleDtype.UE8M0

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__


_SCALE_INFO = {
    ScaleDtype.F32: (4, float(np.finfo(np.float32).max), float(np.finfo(np.float32).smallest_subnormal)),
    ScaleDtype.F16: (2, 65504.0, 2.0**-24),
    ScaleDtype.BF16: (2, float(np.uint32(0x7F7F0000).view(np.float32)), 2.0**-133),
    ScaleDtype.UE8M0: (1, 2.0**127, 2.0**-127),
    ScaleDtype.UE4M3: (1, 448.0, 2.0**-9),
}


class QuantMode(enum.Enum):
    """How values map back to numbers: Symmetric (a stored integer times the scale) or Lookup (a
    stored index into the scheme's codebook, that entry times the scale)."""

    Symmetric = "Symmetric"
    Lookup = "Lookup"

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__


@dataclass(frozen=True)
class QuantStore:
    """Where values live: one per byte (``Native``), or packed along an axis into uint32 words
    (``packed_u32(dim)``) or bytes (``packed_native(dim)``). ``dim`` counts from the innermost
    axis: 0 is the last axis."""

    kind: str
    dim: int = 0

    # Filled in below the class: the one Native store.
    Native = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise TypeError(f"a store kind is a str, got {type(self.kind).__name__}")
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)):
            raise TypeError(f"a packing dim is an int, got {type(self.dim).__name__}")
        object.__setattr__(self, "dim", int(self.dim))
        # The rules (known kind, dim >= 0, Native has no dim) are the core's.
        _native.Scheme(value="Q8F", store=self.kind, dim=self.dim, mode="Symmetric")

    @staticmethod
    def packed_u32(dim: int = 0) -> "QuantStore":
        return QuantStore("packed_u32", dim)

    @staticmethod
    def packed_native(dim: int = 0) -> "QuantStore":
        return QuantStore("packed_native", dim)

    @property
    def is_packed(self) -> bool:
        return self.kind != "native"

    def __repr__(self) -> str:
        if self.kind == "native":
            return "Native"
        name = "PackedU32" if self.kind == "packed_u32" else "PackedNative"
        return f"{name}({self.dim})"

    __str__ = __repr__


QuantStore.Native = QuantStore("native", 0)  # type: ignore[misc]


def _normalize_block(size: Iterable[int], dtype: ScaleDtype) -> Tuple[int, ...]:
    """The block as the core keeps it (leading 1s dropped); the core checks the rules."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (size,)
    try:
        dims = list(size)
    except TypeError:
        raise TypeError(f"a block size is a sequence of ints, got {type(size).__name__}") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"a block size is a sequence of ints, got an element {d!r}")
    probe = _native.Scheme(
        value="Q8F",
        store="native",
        dim=0,
        mode="Symmetric",
        block_size=[int(d) for d in dims],
        block_dtype=dtype.value,
    )
    return tuple(probe.block_size)


@dataclass(frozen=True, init=False)
class BlockScale:
    """One scale per block of ``size`` elements (rank-relative), stored as ``dtype``."""

    size: Tuple[int, ...]
    dtype: ScaleDtype

    def __init__(self, size: Iterable[int], dtype: ScaleDtype) -> None:
        if not isinstance(dtype, ScaleDtype):
            raise TypeError(f"a block scale dtype is a ScaleDtype, got {dtype!r}")
        object.__setattr__(self, "size", _normalize_block(size, dtype))
        object.__setattr__(self, "dtype", dtype)

    @property
    def num_elements(self) -> int:
        n = 1
        for d in self.size:
            n *= d
        return n

    def __repr__(self) -> str:
        return f"BlockScale([{', '.join(map(str, self.size))}], {self.dtype})"


@dataclass(frozen=True)
class QuantScheme:
    """A quantization scheme: value type, store, mode, and the scale levels.

    With neither level the scheme has one per-tensor F32 scale (burn's rule). With both it is
    two-level: block scales normalized by one f32 per-tensor scale (as NVFP4).
    """

    value: QuantValue = QuantValue.Q8F
    store: QuantStore = QuantStore("packed_u32", 0)
    mode: QuantMode = QuantMode.Symmetric
    tensor: Optional[ScaleDtype] = None
    block: Optional[BlockScale] = None
    #: The options the scheme is meant to be used with (a preset's; SPEC §12). Not part of the
    #: scheme's identity: two schemes that store the same way are equal whatever their options.
    options: QuantOptions = field(default=QuantOptions(), compare=False, repr=False)
    #: Lookup mode's codebook: 2^bits distinct finite float32 values (as Python floats), entry k
    #: being what a stored k decodes to; None for Symmetric. Part of the scheme's identity, but
    #: not of its bytes: like burn's lookup table it travels beside them, with the scheme.
    codebook: Optional[Tuple[float, ...]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.value, QuantValue):
            raise TypeError(f"value is a QuantValue, got {self.value!r}")
        if not isinstance(self.store, QuantStore):
            raise TypeError(f"store is a QuantStore, got {self.store!r}")
        if not isinstance(self.mode, QuantMode):
            raise TypeError(f"mode is a QuantMode, got {self.mode!r}")
        if self.tensor is not None and not isinstance(self.tensor, ScaleDtype):
            raise TypeError(f"a per-tensor scale dtype is a ScaleDtype, got {self.tensor!r}")
        if self.block is not None and not isinstance(self.block, BlockScale):
            raise TypeError(f"a block level is a BlockScale, got {self.block!r}")
        if not isinstance(self.options, QuantOptions):
            raise TypeError(f"options is a QuantOptions, got {self.options!r}")
        if self.codebook is not None:
            object.__setattr__(self, "codebook", _codebook_values(self.codebook))
        # Built and validated once; every core call takes this object as it is.
        core = _native.Scheme(
            value=self.value.value,
            store=self.store.kind,
            dim=self.store.dim,
            mode=self.mode.value,
            tensor=None if self.tensor is None else self.tensor.value,
            block_size=None if self.block is None else list(self.block.size),
            block_dtype=None if self.block is None else self.block.dtype.value,
            codebook=None if self.codebook is None else list(self.codebook),
        )
        object.__setattr__(self, "_handle", core)
        # The fields' hash, once: the generated one hashes them (enums in Python code) on every
        # call, and each layout lookup (`_layout`'s cache) asks for it.
        object.__setattr__(self, "_hash", hash(
            (self.value, self.store, self.mode, self.tensor, self.block, self.codebook)
        ))

    def __hash__(self) -> int:
        # Equal schemes have equal identity fields (`options` is not compared), so equal hashes.
        return self._hash  # type: ignore[attr-defined, no-any-return]

    def __reduce__(self) -> Any:
        # The core twin does not pickle; rebuilding it from the fields does.
        return (QuantScheme, (self.value, self.store, self.mode, self.tensor, self.block,
                              self.options, self.codebook))

    # -- builder ---------------------------------------------------------------------------
    def with_value(self, value: QuantValue) -> "QuantScheme":
        return replace(self, value=value)

    def with_store(self, store: QuantStore) -> "QuantScheme":
        return replace(self, store=store)

    def with_mode(self, mode: QuantMode) -> "QuantScheme":
        """Symmetric drops the codebook; Lookup keeps the one there (without one it is a
        :class:`SchemeError`: use :meth:`with_codebook`)."""
        if mode is QuantMode.Symmetric:
            return replace(self, mode=mode, codebook=None)
        return replace(self, mode=mode)

    def with_codebook(self, values: Sequence[float]) -> "QuantScheme":
        """Lookup mode with this codebook: 2^bits distinct finite values for the value's width
        (16 for Q4F/Q4S, 4 for Q2F/Q2S), in any order (entry k is what a stored k decodes to).
        Values are rounded to float32 (nearest even) and kept so; a rounding that makes two
        entries equal, or overflows, is a :class:`SchemeError`. Named ones: ``bq.codebooks``."""
        return replace(self, mode=QuantMode.Lookup, codebook=_codebook_values(values))

    def per_tensor(self, dtype: ScaleDtype) -> "QuantScheme":
        return replace(self, tensor=dtype)

    def per_block(self, size: Iterable[int], dtype: ScaleDtype) -> "QuantScheme":
        return replace(self, block=BlockScale(size, dtype))

    def with_options(
        self,
        calibration: Optional[str] = None,
        rounding: Optional[str] = None,
        scale_rounding: Optional[str] = None,
    ) -> "QuantScheme":
        """The same scheme, meant to be used with these options (what a preset carries);
        ``quantize`` applies them unless its caller overrides them."""
        opts = QuantOptions(calibration, rounding, scale_rounding)  # type: ignore[arg-type]
        return replace(self, options=opts)

    # -- derived facts -----------------------------------------------------------------------
    @property
    def is_two_level(self) -> bool:
        return self.tensor is not None and self.block is not None

    @property
    def block_size(self) -> Optional[Tuple[int, ...]]:
        return None if self.block is None else self.block.size

    @property
    def scale_dtype(self) -> ScaleDtype:
        """The dtype of the scales stored first: the block scales, or the one per-tensor scale."""
        if self.block is not None:
            return self.block.dtype
        return self.tensor if self.tensor is not None else ScaleDtype.F32

    @property
    def global_dtype(self) -> Optional[ScaleDtype]:
        """The dtype of a two-level scheme's per-tensor scale (always F32), else None."""
        return ScaleDtype.F32 if self.is_two_level else None

    def layout(self, shape: Iterable[int]) -> "Layout":
        """This scheme applied to a tensor of ``shape``: storage, scale grid and byte counts.
        Raises :class:`SchemeError` when the tensor cannot take the scheme."""
        return _layout(self, _shape(shape))

    # -- text form ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> QuantScheme:
        """The scheme a spelled-out text names, the form ``str(scheme)`` prints::

            VALUE/STORE/LEVELS[/lookup:CODEBOOK]

            VALUE   q8f q8s q4f q4s q2f q2s e4m3 e5m2 e2m1
            STORE   native | packed_u32_DIM | packed_nativeDIM   (DIM from the last axis)
            LEVELS  tensor                    no level: burn's implicit f32 per-tensor scale
                    tensor:DTYPE              one explicit per-tensor scale
                    blockAxB..:DTYPE          one scale per block (1 to 5 dims, no leading 1)
                    blockAxB..:DTYPE+tensor:f32   two-level (block dtype f16 or ue4m3)
            DTYPE   f32 f16 bf16 ue8m0 ue4m3
            CODEBOOK  nf4 | iq4nl | bq4 | [V,V,...]  (each V the shortest text of its float32,
                      as ``str(numpy.float32(v))`` writes it; a named one by its name)

        e.g. ``q4s/packed_native0/block32:f16``, ``e4m3/native/block32x32:ue8m0``,
        ``e2m1/packed_native0/block16:ue4m3+tensor:f32`` (NVFP4). Only that canonical spelling
        is accepted (lowercase, no spaces, numbers without leading zeros), so
        ``str(QuantScheme.parse(t)) == t`` for every text ``t`` that parses, and
        ``QuantScheme.parse(str(s)) == s`` for every scheme ``s``. The grammar knows no preset
        names: :func:`blockquant.presets.resolve` takes a preset name or a scheme text. A bad
        text raises :class:`SchemeError` quoting the bad part.
        """
        if not isinstance(text, str):
            raise TypeError(f"a scheme text is a str, got {type(text).__name__}")
        if len(text) > MAX_SCHEME_TEXT:  # the longest real one, a codebook of 16, is ~300
            raise SchemeError(f"a scheme text of {len(text)} characters is too long to be one "
                              f"(at most {MAX_SCHEME_TEXT}): {text[:40]!r}...")
        parts = text.split("/")
        if len(parts) == 1:
            raise SchemeError(
                f"unknown scheme {text!r}: a scheme text is VALUE/STORE/LEVELS such as "
                "'q4s/packed_native0/block32:f16' (preset names: blockquant.presets.resolve)"
            )
        if len(parts) not in (3, 4):
            raise SchemeError(
                f"a scheme is VALUE/STORE/LEVELS[/lookup:CODEBOOK], got {len(parts)} parts "
                f"in {text!r}"
            )
        value = _parse_value(parts[0], text)
        store = _parse_store(parts[1], text)
        tensor, block = _parse_levels(parts[2], text)
        mode = QuantMode.Symmetric
        codebook = None
        if len(parts) == 4:
            codebook = _parse_lookup(parts[3], text)
            mode = QuantMode.Lookup
        try:
            return cls(value, store, mode, tensor, block, codebook=codebook)
        except SchemeError as e:
            raise SchemeError(f"{e} (in {text!r})") from None

    def __str__(self) -> str:
        """The canonical text form, which :meth:`parse` reads back (presets print spelled out)."""
        if self.block is None:
            levels = "tensor" if self.tensor is None else f"tensor:{_DTYPE_TEXT[self.tensor]}"
        else:
            size = "x".join(map(str, self.block.size))
            levels = f"block{size}:{_DTYPE_TEXT[self.block.dtype]}"
            if self.tensor is not None:
                levels += f"+tensor:{_DTYPE_TEXT[self.tensor]}"
        text = f"{_VALUE_TEXT[self.value]}/{_store_text(self.store)}/{levels}"
        if self.codebook is None:
            return text
        return f"{text}/lookup:{_codebook_text(self.codebook)}"

    def __repr__(self) -> str:
        parts = [f"value={self.value}", f"store={self.store}"]
        if self.mode is not QuantMode.Symmetric:
            parts.append(f"mode={self.mode}")
        if self.codebook is not None:
            parts.append(f"codebook={_codebook_text(self.codebook)}")
        if self.block is not None:
            parts.append(f"block={self.block!r}")
        if self.tensor is not None:
            parts.append(f"tensor={self.tensor}")
        return f"QuantScheme({', '.join(parts)})"


@dataclass(frozen=True)
class Layout:
    """A scheme applied to one tensor shape (:meth:`QuantScheme.layout`): what is stored, and
    how many bytes burn's layout (``QTensor.to_bytes``) takes."""

    #: The tensor's shape (a 0-d tensor is laid out as shape ``(1,)``).
    shape: Tuple[int, ...]
    #: Shape of the value storage (``QTensor.values``).
    storage_shape: Tuple[int, ...]
    #: dtype of the value storage: int8, uint8 or uint32.
    storage_dtype: np.dtype
    #: Shape of the scale grid (``QTensor.scales``); ``(1,)`` for one per-tensor scale.
    scale_grid: Tuple[int, ...]
    #: The grid as burn's bytes store it: ``scale_grid``, except for a block scheme packed
    #: along an outer axis, whose scales follow the values' order (that axis swapped last).
    stored_scale_grid: Tuple[int, ...]
    #: How the scales of the grid are stored.
    scale_dtype: ScaleDtype
    #: Number of scales in the grid.
    n_scales: int
    #: Bytes of the value storage.
    storage_nbytes: int
    #: Bytes of the scales: the grid in its dtype, plus 4 for a two-level per-tensor scale.
    scales_nbytes: int
    #: Total bytes: ``storage_nbytes + scales_nbytes``.
    nbytes: int


# -- the text form (QuantScheme.parse / str) ------------------------------------------------------
_VALUE_TEXT = {v: v.value.lower() for v in QuantValue}
_DTYPE_TEXT = {d: d.value.lower() for d in ScaleDtype}
_TEXT_VALUE = {t: v for v, t in _VALUE_TEXT.items()}
_TEXT_DTYPE = {t: d for d, t in _DTYPE_TEXT.items()}
#: Longer than any scheme text: the longest, a custom codebook of 16 entries of the longest
#: float32 text each, is about 300 characters.
MAX_SCHEME_TEXT = 1000
_NUMBER = r"(0|[1-9][0-9]{0,19})"  # canonical: no sign, no leading zeros; 20 digits hold any u64
_LEVELS_HINT = "tensor, tensor:DTYPE, blockN:DTYPE, blockNxM:DTYPE or blockN:DTYPE+tensor:f32"


def _store_text(store: QuantStore) -> str:
    if store.kind == "native":
        return "native"
    # The dim follows the name; an underscore keeps it apart from the 32 of u32.
    return f"packed_u32_{store.dim}" if store.kind == "packed_u32" else f"packed_native{store.dim}"


def _one_of(names: Iterable[str]) -> str:
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1]


def _parse_value(part: str, text: str) -> QuantValue:
    if part not in _TEXT_VALUE:
        raise SchemeError(f"unknown value {part!r} in {text!r}: expected {_one_of(_TEXT_VALUE)}")
    return _TEXT_VALUE[part]


def _parse_store(part: str, text: str) -> QuantStore:
    if part == "native":
        return QuantStore.Native
    m = re.fullmatch(r"packed_u32_" + _NUMBER, part)
    if m:
        return QuantStore.packed_u32(int(m.group(1)))
    m = re.fullmatch(r"packed_native" + _NUMBER, part)
    if m:
        return QuantStore.packed_native(int(m.group(1)))
    raise SchemeError(
        f"unknown store {part!r} in {text!r}: expected native, packed_u32_DIM or "
        "packed_nativeDIM, DIM counting from the last axis (packed_u32_0, packed_native0)"
    )


def _parse_dtype(part: str, text: str) -> ScaleDtype:
    if part not in _TEXT_DTYPE:
        raise SchemeError(
            f"unknown scale dtype {part!r} in {text!r}: expected {_one_of(_TEXT_DTYPE)}"
        )
    return _TEXT_DTYPE[part]


def _parse_block(part: str, text: str) -> BlockScale:
    head, colon, dtype = part.partition(":")
    if not colon:
        raise SchemeError(
            f"block level {part!r} in {text!r} has no scale dtype: write e.g. '{part}:f16'"
        )
    dims = head[len("block"):].split("x")
    if not all(re.fullmatch(_NUMBER, d) for d in dims):
        raise SchemeError(
            f"bad block size {head!r} in {text!r}: expected positive sizes joined by 'x', "
            "e.g. block32 or block16x16"
        )
    size = [int(d) for d in dims]
    if len(size) > 1 and size[0] == 1:
        canon = "block" + "x".join(map(str, BlockScale(size, ScaleDtype.F32).size))
        raise SchemeError(
            f"block size {head!r} in {text!r} has a leading 1: a block is rank-relative, "
            f"write {canon!r}"
        )
    scale_dtype = _parse_dtype(dtype, text)
    try:
        return BlockScale(size, scale_dtype)
    except SchemeError as e:
        raise SchemeError(f"{e} (in {text!r})") from None


def _parse_levels(part: str, text: str) -> tuple[ScaleDtype | None, BlockScale | None]:
    if part == "tensor":
        return None, None
    if part.startswith("tensor:"):
        dtype = part[len("tensor:"):]
        if "+" in dtype:
            raise SchemeError(
                f"levels {part!r} in {text!r}: write the block level first, as "
                "blockN:DTYPE+tensor:f32"
            )
        return _parse_dtype(dtype, text), None
    if part.startswith("block"):
        block_part, plus, tensor_part = part.partition("+")
        block = _parse_block(block_part, text)
        if not plus:
            return None, block
        if not tensor_part.startswith("tensor:"):
            raise SchemeError(
                f"bad second level {tensor_part!r} in {text!r}: a two-level scheme ends with "
                "'+tensor:f32'"
            )
        return _parse_dtype(tensor_part[len("tensor:"):], text), block
    raise SchemeError(f"unknown levels {part!r} in {text!r}: expected {_LEVELS_HINT}")


# -- codebooks (Lookup mode) ---------------------------------------------------------------------
def _codebook_values(values: Any) -> Tuple[float, ...]:
    """A codebook as the scheme keeps it: a tuple of float32 values as Python floats. Only
    types are checked here; the rules (count, finite, distinct) are the core's."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"a codebook is a sequence of numbers, got {type(values).__name__}")
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError):
        raise TypeError("a codebook is a sequence of numbers") from None
    if arr.ndim != 1 or arr.dtype.kind not in "iuf":
        raise TypeError(f"a codebook is a 1-d sequence of real numbers, got {values!r}")
    with np.errstate(over="ignore"):  # an overflow becomes inf, which the core names
        f32 = arr.astype(np.float32)
    return tuple(float(v) for v in f32)


def _codebook_text(codebook: Tuple[float, ...]) -> str:
    name = codebooks.name_of(codebook)
    if name is not None:
        return name
    return "[" + ",".join(str(np.float32(v)) for v in codebook) + "]"


def _parse_lookup(part: str, text: str) -> Tuple[float, ...]:
    names = _one_of(codebooks.NAMED)
    if part == "lookup":
        raise SchemeError(
            f"Lookup mode needs a codebook in {text!r}: write lookup:NAME ({names}) or "
            "lookup:[V,V,...]"
        )
    if not part.startswith("lookup:"):
        raise SchemeError(
            f"unknown mode {part!r} in {text!r}: the only mode written is 'lookup:CODEBOOK' "
            "(symmetric is the default and is not written)"
        )
    body = part[len("lookup:"):]
    if body in codebooks.NAMED:
        return tuple(float(v) for v in codebooks.NAMED[body])
    if not (body.startswith("[") and body.endswith("]")):
        raise SchemeError(
            f"unknown codebook {body!r} in {text!r}: expected {names} or [V,V,...]"
        )
    values = []
    for tok in body[1:-1].split(","):
        try:
            with np.errstate(over="ignore"):
                v = np.float32(float(tok))
        except ValueError:
            raise SchemeError(f"bad codebook entry {tok!r} in {text!r}: not a number") from None
        if str(v) != tok:
            raise SchemeError(
                f"codebook entry {tok!r} in {text!r} is not in canonical form: write {str(v)!r} "
                "(the shortest text of its float32)"
            )
        values.append(float(v))
    name = codebooks.name_of(tuple(values))
    if name is not None:
        raise SchemeError(f"the codebook in {text!r} is the named one {name!r}: write lookup:{name}")
    return tuple(values)


# -- shapes and layouts --------------------------------------------------------------------------
#: The most dimensions a numpy array has (NPY_MAXDIMS: 32 before numpy 2, 64 since).
_MAX_DIMS = 64 if int(np.__version__.split(".")[0]) >= 2 else 32


def _shape(shape: Any) -> Tuple[int, ...]:
    """``shape`` as a tuple of ints, checked: a sequence of ints (``TypeError``), none
    negative, at most numpy's number of dimensions, and few enough elements to fit in memory
    (``LayoutError``)."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {shape!r}") from None
    for d in dims:
        # Not int(d): it would truncate 2.5 and parse "7".
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"shape must be a sequence of ints, got an element {d!r}")
    dims = tuple(int(d) for d in dims)
    if any(d < 0 for d in dims):
        raise LayoutError(f"shape dims must be >= 0, got {dims}")
    if len(dims) > _MAX_DIMS:
        raise LayoutError(f"a shape of {len(dims)} dimensions: numpy arrays have at most "
                          f"{_MAX_DIMS}")
    # numpy refuses arrays whose non-zero dims multiply past its index range, even when another
    # dim is 0: such a shape would make the core allocate an array numpy cannot create.
    n = 4  # bytes of the widest element the core allocates (uint32 words, float32 output)
    for d in dims:
        n *= max(d, 1)
    if n > sys.maxsize:
        raise LayoutError(f"shape {dims} has more elements than fit in memory")
    return dims


# Schemes and layouts are immutable, and quantize(out=...) and from_parts ask for a layout on
# every call: one computed per scheme and shape serves them all (a few microseconds each, most
# of a small call's own time). Equal schemes have equal layouts (the options, which equality
# ignores, do not enter into it). Errors are not cached: they are raised again.
@functools.lru_cache(maxsize=512)
def _layout(scheme: QuantScheme, dims: Tuple[int, ...]) -> Layout:
    info = scheme._handle.layout(list(dims))
    return Layout(
        shape=tuple(info.shape),
        storage_shape=tuple(info.storage_shape),
        storage_dtype=np.dtype(info.storage_dtype),
        scale_grid=tuple(info.scale_grid),
        stored_scale_grid=tuple(info.stored_scale_grid),
        scale_dtype=scheme.scale_dtype,
        n_scales=info.n_scales,
        storage_nbytes=info.storage_nbytes,
        scales_nbytes=info.scales_nbytes,
        nbytes=info.nbytes,
    )
