"""The scheme model (format.md "The scheme"): what a quantized tensor holds and how it is laid out.

Every class here is an immutable value: equal by value, hashable, with a readable repr. Builder
methods return new schemes. The scheme is modelled in one place, the Rust core, and this module is
its face: building a :class:`QuantScheme` builds its core twin (``_native.Scheme``) once, which
checks every rule, and every later call hands that twin to the core as it is. The text form
(:meth:`QuantScheme.parse`, ``str``), the repr, and the facts of each value type and scale dtype
(``QuantValue.bits``, ``ScaleDtype.max``, ...) are the core's too. So an invalid scheme never
exists, and Python keeps only type checks (a ``TypeError`` for an argument of the wrong type).
"""

from __future__ import annotations

import enum
import functools
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional, Sequence, Tuple

import numpy as np

from . import _native
from .errors import LayoutError, QuantError
from .options import QuantOptions

__all__ = [
    "QuantValue",
    "ScaleDtype",
    "QuantMode",
    "QuantStore",
    "BlockScale",
    "QuantScheme",
    "Offset",
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
    #: Unsigned codes [0, 2^bits - 1], read with a per-scale offset, only with an affine
    #: scheme (``QuantScheme.with_offset``; format.md "Affine values (offsets)").
    U8 = "U8"
    U4 = "U4"
    U2 = "U2"

    @property
    def bits(self) -> int:
        return _VALUE_INFO[self].bits

    @property
    def qmin(self) -> float:
        return _VALUE_INFO[self].qmin

    @property
    def qmax(self) -> float:
        return _VALUE_INFO[self].qmax

    @property
    def is_float(self) -> bool:
        return _VALUE_INFO[self].is_float

    @property
    def is_unsigned(self) -> bool:
        """U8, U4, U2: the values of an affine scheme."""
        return not self.is_float and _VALUE_INFO[self].qmin == 0

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__


# The facts are the core's (one table, fetched once): bits, qmin, qmax, is_float.
_VALUE_INFO = {QuantValue(info.name): info for info in _native.value_info()}


class ScaleDtype(enum.Enum):
    """How a scale is stored."""

    F32 = "F32"
    F16 = "F16"
    BF16 = "BF16"
    UE8M0 = "UE8M0"
    UE4M3 = "UE4M3"

    @property
    def nbytes(self) -> int:
        return _SCALE_INFO[self].nbytes

    @property
    def max(self) -> float:
        """The largest finite value the dtype holds."""
        return _SCALE_INFO[self].max

    @property
    def smallest(self) -> float:
        """The smallest value > 0 the dtype holds."""
        return _SCALE_INFO[self].smallest

    @property
    def has_zero(self) -> bool:
        return _SCALE_INFO[self].has_zero

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__


# The core's facts, fetched once: nbytes, max, smallest, has_zero.
_SCALE_INFO = {ScaleDtype(info.name): info for info in _native.scale_info()}


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


@dataclass(frozen=True)
class Offset:
    """An affine scheme's per-scale offset (format.md "Affine values (offsets)"): a zero point
    (``Offset.zero()``: one uint8 per scale, x̂ = (q − z) × s) or a bias (``Offset.bias(dtype)``,
    F32, F16 or BF16: x̂ = q × s + b)."""

    kind: str
    dtype: Optional["ScaleDtype"] = None

    def __post_init__(self) -> None:
        if self.kind not in ("zero", "bias"):
            raise TypeError(f"an offset kind is 'zero' or 'bias', got {self.kind!r}")
        if self.kind == "bias" and not isinstance(self.dtype, ScaleDtype):
            raise TypeError(f"a bias dtype is a ScaleDtype, got {self.dtype!r}")
        if self.kind == "zero" and self.dtype is not None:
            raise TypeError("a zero point is stored as uint8: it takes no dtype")

    @staticmethod
    def zero() -> "Offset":
        return Offset("zero")

    @staticmethod
    def bias(dtype: "ScaleDtype") -> "Offset":
        return Offset("bias", dtype)

    def __repr__(self) -> str:
        return "Zero(U8)" if self.kind == "zero" else f"Bias({self.dtype})"

    __str__ = __repr__


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
    #: The options the scheme is meant to be used with (a preset's; format.md "Rules for edge cases"). Not part of the
    #: scheme's identity: two schemes that store the same way are equal whatever their options.
    options: QuantOptions = field(default=QuantOptions(), compare=False, repr=False)
    #: Lookup mode's codebook: 2^bits distinct finite float32 values (as Python floats), entry k
    #: being what a stored k decodes to; None for Symmetric. Part of the scheme's identity, but
    #: not of its bytes: like burn's lookup table it travels beside them, with the scheme.
    codebook: Optional[Tuple[float, ...]] = None
    #: An affine scheme's offset (unsigned values only), else None.
    offset: Optional[Offset] = None

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
        if self.offset is not None and not isinstance(self.offset, Offset):
            raise TypeError(f"an offset is an Offset, got {self.offset!r}")
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
            offset=None if self.offset is None else self.offset.kind,
            offset_dtype=None if self.offset is None or self.offset.dtype is None
            else self.offset.dtype.value,
        )
        object.__setattr__(self, "_handle", core)
        # The fields' hash, once: the generated one hashes them (enums in Python code) on every
        # call, and each layout lookup (`_layout`'s cache) asks for it.
        object.__setattr__(self, "_hash", hash(
            (self.value, self.store, self.mode, self.tensor, self.block, self.codebook,
             self.offset)
        ))

    def __hash__(self) -> int:
        # Equal schemes have equal identity fields (`options` is not compared), so equal hashes.
        return self._hash  # type: ignore[attr-defined, no-any-return]

    def __reduce__(self) -> Any:
        # The core twin does not pickle; rebuilding it from the fields does.
        return (QuantScheme, (self.value, self.store, self.mode, self.tensor, self.block,
                              self.options, self.codebook, self.offset))

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

    def with_offset(self, offset: Optional[Offset]) -> "QuantScheme":
        """An affine scheme with this offset (``Offset.zero()`` or ``Offset.bias(dtype)``;
        unsigned values only), or None for none."""
        return replace(self, offset=offset)

    @property
    def is_affine(self) -> bool:
        return self.offset is not None

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

    def check_options(self, rounding: str = "half_away", scale_rounding: str = "up") -> None:
        """Raise :class:`SchemeError` when this scheme cannot be quantized with these options,
        whatever the tensor: ``scale_rounding="mx"`` needs UE8M0 scales, and a Lookup scheme
        takes no ``rounding="half_even"``."""
        try:  # the core checks the options before the shape
            _native.check_call(self._handle, _ANY_SHAPE, "minmax", rounding, scale_rounding,
                               False, False)
        except QuantError:
            try:
                _native.check_call(self._handle, _ANY_SHAPE, "minmax", "half_away", "up",
                                   False, False)
            except QuantError:
                return  # the shape was at fault (a packing axis deeper still), not the options
            raise

    def layout(self, shape: Iterable[int]) -> "Layout":
        """This scheme applied to a tensor of ``shape``: storage, scale grid and byte counts.
        Raises :class:`SchemeError` when the tensor cannot take the scheme."""
        return _layout(self, _shape(shape))

    # -- text form ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> QuantScheme:
        """The scheme a spelled-out text names, the form ``str(scheme)`` prints::

            VALUE/STORE/LEVELS[/lookup:CODEBOOK]

            VALUE   q8f q8s q4f q4s q2f q2s e4m3 e5m2 e2m1 u8 u4 u2 (u: with an offset)
            STORE   native | packed_u32_DIM | packed_nativeDIM   (DIM from the last axis)
            LEVELS  tensor                    no level: burn's implicit f32 per-tensor scale
                    tensor:DTYPE              one explicit per-tensor scale
                    blockAxB..:DTYPE          one scale per block (1 to 5 dims, no leading 1)
                    blockAxB..:DTYPE+tensor:f32   two-level (block dtype f16 or ue4m3)
            DTYPE   f32 f16 bf16 ue8m0 ue4m3
            CODEBOOK  nf4 | iq4nl | bq4 | [V,V,...]  (each V the shortest text of its float32,
                      as ``str(numpy.float32(v))`` writes it; a named one by its name)

        An affine scheme (unsigned values) ends in ``/zero:u8`` or ``/bias:DTYPE`` (f32, f16,
        bf16) in place of a lookup part: ``u4/packed_u32_0/block128:bf16/zero:u8``.

        e.g. ``q4s/packed_u32_0/block32:f16``, ``e4m3/native/block32x32:ue8m0``,
        ``e2m1/packed_native0/block16:ue4m3+tensor:f32`` (NVFP4). Only that canonical spelling
        is accepted (lowercase, no spaces, numbers without leading zeros), so
        ``str(QuantScheme.parse(t)) == t`` for every text ``t`` that parses, and
        ``QuantScheme.parse(str(s)) == s`` for every scheme ``s``. The grammar knows no preset
        names: :func:`blockquant.presets.resolve` takes a preset name or a scheme text. A bad
        text raises :class:`SchemeError` quoting the bad part.
        """
        if not isinstance(text, str):
            raise TypeError(f"a scheme text is a str, got {type(text).__name__}")
        core = _native.parse_scheme(text)  # the grammar and its messages are the core's
        block = None
        if core.block_size is not None:
            block = BlockScale(core.block_size, ScaleDtype(core.block_dtype))
        codebook = None if core.codebook is None else tuple(core.codebook)
        offset = None
        if core.offset == "zero":
            offset = Offset.zero()
        elif core.offset == "bias":
            offset = Offset.bias(ScaleDtype(core.offset_dtype))
        return cls(
            QuantValue(core.value),
            QuantStore(core.store, core.dim),
            QuantMode(core.mode),
            None if core.tensor is None else ScaleDtype(core.tensor),
            block,
            codebook=codebook,
            offset=offset,
        )

    def __str__(self) -> str:
        """The canonical text form, which :meth:`parse` reads back (presets print spelled out)."""
        return str(self._handle)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return repr(self._handle)  # type: ignore[attr-defined]


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
    #: Total bytes: ``storage_nbytes + scales_nbytes + offsets_nbytes``.
    nbytes: int
    #: Bytes of an affine scheme's offsets (after the scales); 0 without an offset.
    offsets_nbytes: int = 0


# -- codebooks (Lookup mode) ---------------------------------------------------------------------
#: A shape for :meth:`QuantScheme.check_options`: rank enough for any block and packing axis.
_ANY_SHAPE = (2,) * 8


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
        offsets_nbytes=info.offsets_nbytes,
    )
