"""A scheme on a chunked array: which chunkings keep blocks and packed words whole, and the
chunks of the value storage and of the scale grid that an aligned chunking gives.

A chunk quantized on its own gives the slice of the whole tensor's storage and scales exactly
when every chunk boundary falls on a block boundary (format.md "Blocks and the scale grid") and,
along the packed axis, on a word boundary (format.md "Stores and packing": each line is packed
on its own, so a line cut at a multiple of the values per word packs into whole words). Only
the last chunk of an axis may end inside a block: the tensor's own partial edge block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

from ..errors import LayoutError
from ..scheme import QuantScheme

Chunks = Tuple[Tuple[int, ...], ...]


class ChunkAlignmentError(LayoutError):
    """A chunking whose boundaries cut blocks or packed words, where rechunking was not
    allowed (``rechunk=False``), or chunks that cannot be made to fit."""


@dataclass(frozen=True)
class Geometry:
    """The scheme's grid on a tensor of ``shape`` (rank >= 1)."""

    shape: Tuple[int, ...]
    #: The block, rank-relative made whole: 1 on the axes before it; None per-tensor.
    block: Optional[Tuple[int, ...]]
    #: The axis the store packs along, None for Native; ``per`` values to a word (or byte).
    packed_axis: Optional[int]
    per: int

    @classmethod
    def of(cls, scheme: QuantScheme, shape: Tuple[int, ...]) -> "Geometry":
        scheme.layout(shape)  # SchemeError: a block or packing axis the rank lacks
        rank = len(shape)
        block = None
        if scheme.block is not None:
            size = scheme.block.size
            block = (1,) * (rank - len(size)) + tuple(size)
        axis, per = None, 1
        if scheme.store.is_packed:
            axis = rank - 1 - scheme.store.dim
            # Values per word, as the core lays them out: 64 values along the axis take
            # 64 / per words (per is 1, 2, 4, 8 or 16).
            probe = [1] * rank
            probe[axis] = 64
            per = 64 // scheme.layout(probe).storage_shape[-1]
        return cls(tuple(shape), block, axis, per)

    @property
    def swapped(self) -> bool:
        """Whether the storage holds the packed axis swapped with the last."""
        return self.packed_axis is not None and self.packed_axis != len(self.shape) - 1

    def step(self, axis: int) -> int:
        """What every chunk but the last along ``axis`` must be a multiple of."""
        b = self.block[axis] if self.block is not None else 1
        p = self.per if axis == self.packed_axis else 1
        return b * p // math.gcd(b, p)

    def misaligned(self, chunks: Chunks) -> list[int]:
        """The axes whose chunk boundaries cut a block or a word."""
        return [ax for ax, cs in enumerate(chunks)
                if any(c % self.step(ax) for c in cs[:-1])]

    def aligned(self, chunks: Chunks) -> dict[int, int]:
        """For each misaligned axis, a regular chunk size on block and word boundaries near the
        largest chunk there (at least one step; the whole axis when a step is longer)."""
        out = {}
        for ax in self.misaligned(chunks):
            step, biggest = self.step(ax), max(chunks[ax])
            out[ax] = min(max(step, biggest // step * step), self.shape[ax])
        return out

    def storage_chunks(self, chunks: Chunks) -> Chunks:
        """The chunks of the value storage (its stored shape: the packed axis in words, swapped
        last when it is an outer one) that an aligned ``chunks`` gives."""
        out = [tuple(-(-c // self.per) for c in cs) if ax == self.packed_axis else tuple(cs)
               for ax, cs in enumerate(chunks)]
        if self.swapped:
            a = self.packed_axis
            assert a is not None
            out[a], out[-1] = out[-1], out[a]
        return tuple(out)

    def grid_chunks(self, chunks: Chunks) -> Chunks:
        """The chunks of the scale grid (one chunk of one scale for a per-tensor scheme)."""
        if self.block is None:
            return ((1,),)
        return tuple(tuple(-(-c // b) for c in cs) for cs, b in zip(chunks, self.block))

    def storage_index(self, index: Tuple[int, ...]) -> Tuple[int, ...]:
        """The storage's block index of the input block ``index``."""
        if not self.swapped:
            return index
        a = self.packed_axis
        assert a is not None
        out = list(index)
        out[a], out[-1] = out[-1], out[a]
        return tuple(out)


def regular(chunks: Chunks) -> bool:
    """Whether every chunk but the last along each axis has one size (zarr's chunk grid)."""
    return all(len(set(cs[:-1])) <= 1 and (len(cs) < 2 or cs[-1] <= cs[0]) for cs in chunks)


def regular_size(chunks: Chunks) -> Tuple[int, ...]:
    """One chunk size per axis for a regular chunking near an aligned ``chunks``: its largest
    chunk but the last (a multiple of the step, being aligned), or the whole axis."""
    return tuple(max(cs[:-1]) if len(cs) > 1 else max(cs[0], 1) for cs in chunks)


def origins(chunks: Chunks) -> list[Tuple[int, ...]]:
    """Per axis, where each chunk starts."""
    out = []
    for cs in chunks:
        starts, at = [], 0
        for c in cs:
            starts.append(at)
            at += c
        out.append(tuple(starts))
    return out
