"""blockquant: low-bit tensor quantization for numpy, with a Rust core.

    >>> import numpy as np, blockquant as bq
    >>> qt = bq.quantize(np.linspace(-1, 1, 64, dtype=np.float32), bq.presets.int8_block32())
    >>> qt.values.dtype, qt.scales.shape
    (dtype('int8'), (2,))

The exact semantics are in ``docs/format.md`` (in the repository and the sdist);
``blockquant.reference`` is a pure-numpy implementation of the same functions that the tests
compare against bit for bit.
"""

from __future__ import annotations

from . import codebooks, metrics, presets
from ._native import get_num_threads, set_num_threads
from .burnpack import load_burnpack, save_burnpack
from .errors import (
    InternalError,
    LayoutError,
    MissingGlobalScaleError,
    NonFiniteError,
    QuantError,
    ScaleError,
    SchemeError,
    UnexpectedGlobalScaleError,
    UnsupportedSchemeError,
)
from .files import dequantize_file, load, quantize_file
from .options import QuantOptions
from .qtensor import QTensor, dequantize, quantize, round_scale
from .scheme import BlockScale, Layout, QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype

__all__ = [
    "QuantScheme",
    "QuantValue",
    "QuantStore",
    "QuantMode",
    "ScaleDtype",
    "BlockScale",
    "QuantOptions",
    "Layout",
    "QTensor",
    "quantize",
    "dequantize",
    "round_scale",
    "presets",
    "codebooks",
    "metrics",
    "save_burnpack",
    "load_burnpack",
    "quantize_file",
    "dequantize_file",
    "load",
    "set_num_threads",
    "get_num_threads",
    "QuantError",
    "SchemeError",
    "ScaleError",
    "MissingGlobalScaleError",
    "UnexpectedGlobalScaleError",
    "UnsupportedSchemeError",
    "LayoutError",
    "NonFiniteError",
    "InternalError",
]

__version__ = "0.1.0"


def __getattr__(name: str):  # noqa: ANN202 - module __getattr__
    # `bq.reference` without importing it (and its helpers) on every `import blockquant`.
    if name == "reference":
        import importlib

        # import_module, not `from . import reference`: that would call this __getattr__ again.
        return importlib.import_module(__name__ + ".reference")
    raise AttributeError(f"module 'blockquant' has no attribute {name!r}")
