"""Format 1's packing (blockquant files written before burn's layout), turned into burn's.

Format 1 packed ``word_bits / bits`` fields a word (the first in the low bits) along the packed
axis in place, that axis shrunk. burn's layout (format.md "Stores and packing") packs along the last axis of the tensor
with the packed axis swapped last, and keeps the 4- and 2-bit ints of ``PackedNative`` one a
byte. Only the stored fields move here: the core checks every one when the tensor is rebuilt
(``QTensor.from_bytes``), so nothing read from a file is trusted on the way.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from .scheme import QuantScheme, QuantValue


def format1_storage(words: np.ndarray, scheme: QuantScheme, dims: Tuple[int, ...]) -> np.ndarray:
    """The value storage burn's layout holds for format-1 ``words`` of ``scheme`` on a tensor
    of shape ``dims`` (rank >= 1; ``words`` of the old packed shape)."""
    axis = len(dims) - 1 - scheme.store.dim
    bits = scheme.value.bits
    per = (32 if scheme.store.kind == "packed_u32" else 8) // bits
    if scheme.store.kind == "packed_u32" or scheme.value is QuantValue.E2M1:
        # The same fields a word: packing along ``axis`` in place, then swapping it last, is
        # packing along the last axis of the swapped tensor.
        return np.ascontiguousarray(np.swapaxes(words, axis, -1))
    # PackedNative 4- and 2-bit ints: burn keeps one field a byte.
    w = np.moveaxis(words.astype(np.uint8), axis, -1)
    shifts = np.arange(per, dtype=np.uint8) * np.uint8(bits)
    fields = (w[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    fields = fields.reshape(w.shape[:-1] + (w.shape[-1] * per,))[..., : dims[axis]]
    return np.ascontiguousarray(np.swapaxes(np.moveaxis(fields, -1, axis), axis, -1))
