"""The scheme model (SPEC §1): what a quantized tensor holds and how it is laid out.

Every class here is an immutable value: equal by value, hashable, with a readable repr. Builder
methods return new schemes, and every validity rule is checked when a scheme is built, so an
invalid scheme never exists. The Rust core re-checks the same rules (it never trusts its input).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Iterable, Optional, Tuple

import numpy as np

from .errors import SchemeError

__all__ = ["QuantValue", "ScaleDtype", "QuantMode", "QuantStore", "BlockScale", "QuantScheme"]

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
    """How values map back to numbers. Lookup is reserved (SPEC §10): it raises at quantize time."""

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
        if self.kind not in ("native", "packed_u32", "packed_native"):
            raise SchemeError(f"unknown store kind {self.kind!r}")
        if isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)):
            raise TypeError(f"a packing dim is an int, got {type(self.dim).__name__}")
        object.__setattr__(self, "dim", int(self.dim))
        if self.dim < 0:
            raise SchemeError(f"a packing dim counts from the innermost axis and is >= 0, got {self.dim}")
        if self.kind == "native" and self.dim != 0:
            raise SchemeError("the Native store has no packing dim")

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


def _normalize_block(size: Iterable[int]) -> Tuple[int, ...]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (size,)
    try:
        dims = list(size)
    except TypeError:
        raise TypeError(f"a block size is a sequence of ints, got {type(size).__name__}") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"a block size is a sequence of ints, got an element {d!r}")
    dims = [int(d) for d in dims]
    if not dims:
        raise SchemeError("a block size has 1 to 5 dimensions, got none")
    if any(d <= 0 for d in dims):
        raise SchemeError(f"block sizes are positive integers, got {dims}")
    # Leading 1s are dropped: a block is rank-relative, missing leading dims are 1.
    while len(dims) > 1 and dims[0] == 1:
        dims.pop(0)
    if len(dims) > MAX_BLOCK_DIMS:
        raise SchemeError(f"a block size has 1 to {MAX_BLOCK_DIMS} dimensions, got {len(dims)}: {dims}")
    return tuple(dims)


@dataclass(frozen=True, init=False)
class BlockScale:
    """One scale per block of ``size`` elements (rank-relative), stored as ``dtype``."""

    size: Tuple[int, ...]
    dtype: ScaleDtype

    def __init__(self, size: Iterable[int], dtype: ScaleDtype) -> None:
        if not isinstance(dtype, ScaleDtype):
            raise TypeError(f"a block scale dtype is a ScaleDtype, got {dtype!r}")
        object.__setattr__(self, "size", _normalize_block(size))
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
        if self.is_two_level:
            if self.tensor is not ScaleDtype.F32:
                raise SchemeError(
                    f"a two-level scheme stores its per-tensor scale as f32, got {self!r}"
                )
            if self.block.dtype not in (ScaleDtype.F16, ScaleDtype.UE4M3):
                raise SchemeError(
                    "a two-level scheme's block scales must be F16 or UE4M3: wider block scales "
                    f"would drive the per-tensor scale subnormal, got {self!r}"
                )

    # -- builder ---------------------------------------------------------------------------
    def with_value(self, value: QuantValue) -> "QuantScheme":
        return replace(self, value=value)

    def with_store(self, store: QuantStore) -> "QuantScheme":
        return replace(self, store=store)

    def with_mode(self, mode: QuantMode) -> "QuantScheme":
        return replace(self, mode=mode)

    def per_tensor(self, dtype: ScaleDtype) -> "QuantScheme":
        return replace(self, tensor=dtype)

    def per_block(self, size: Iterable[int], dtype: ScaleDtype) -> "QuantScheme":
        return replace(self, block=BlockScale(size, dtype))

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

    def _spec(self) -> tuple:
        """The plain tuple the Rust core reads."""
        return (
            self.value.value,
            self.store.kind,
            self.store.dim,
            self.mode.value,
            None if self.tensor is None else self.tensor.value,
            None if self.block is None else self.block.size,
            None if self.block is None else self.block.dtype.value,
        )

    def __repr__(self) -> str:
        parts = [f"value={self.value}", f"store={self.store}"]
        if self.mode is not QuantMode.Symmetric:
            parts.append(f"mode={self.mode}")
        if self.block is not None:
            parts.append(f"block={self.block!r}")
        if self.tensor is not None:
            parts.append(f"tensor={self.tensor}")
        return f"QuantScheme({', '.join(parts)})"
