"""Named codebooks for Lookup mode (``QuantScheme.with_codebook``, text ``.../lookup:NAME``).

A codebook is 2^bits distinct finite float32 values; a stored field k decodes to entry k times
the block's scale. These are read-only float32 arrays::

    >>> import blockquant as bq
    >>> s = bq.presets.int4_block16().with_codebook(bq.codebooks.NF4)
    >>> str(s)
    'q4f/packed_u32_0/block16:ue4m3+tensor:f32/lookup:nf4'
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

__all__ = ["NF4", "IQ4_NL", "BQ4", "NAMED", "name_of"]


def _frozen(values: Tuple[float, ...]) -> np.ndarray:
    a = np.array(values, dtype=np.float32)
    a.flags.writeable = False
    return a


#: QLoRA's NormalFloat4 (Dettmers et al. 2023): the 16 values as bitsandbytes lists them,
#: rounded to float32. Quantiles of a normal distribution, with an exact 0 and ±1 ends.
NF4 = _frozen((
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
))

#: ggml's IQ4_NL values (llama.cpp's ``kvalues_iq4nl``): a non-uniform 4-bit grid tuned on
#: weights, denser near 0.
IQ4_NL = _frozen((
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0,
))

#: blockquant's 4-bit codebook: the Lloyd-Max grid for normally distributed weights under the
#: scales of the ``bq4_block16`` preset (one UE4M3 scale per 16 under an f32 tensor scale,
#: searched, rounded to nearest), started from NF4 and fitted on synthetic normal samples only,
#: entries rounded to 4 decimals; ``benches/codebook.py`` re-derives it. Like NF4 it is lopsided
#: (8 negative entries, 8 non-negative), but its ends are wider apart and it has no exact 0.
BQ4 = _frozen((
    -0.9937, -0.7543, -0.5738, -0.4299, -0.3083, -0.2008, -0.1026, -0.0104,
    0.0791, 0.1694, 0.2635, 0.3654, 0.4805, 0.6194, 0.8036, 1.0,
))

#: The names the scheme text uses (``.../lookup:nf4``), in the order they are documented.
NAMED: Dict[str, np.ndarray] = {"nf4": NF4, "iq4nl": IQ4_NL, "bq4": BQ4}


def name_of(codebook: Tuple[float, ...]) -> Optional[str]:
    """The name of ``codebook`` when it is one of :data:`NAMED` bit for bit, else None."""
    bits = np.array(codebook, dtype=np.float32).view(np.uint32)
    for name, values in NAMED.items():
        if values.shape == bits.shape and np.array_equal(values.view(np.uint32), bits):
            return name
    return None
