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

import importlib as _importlib
from typing import TYPE_CHECKING, Any

from . import codebooks, metrics, presets
from ._native import get_num_threads, set_num_threads
from ._version import __version__ as __version__
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
from .options import QuantOptions
from .qtensor import QTensor, dequantize, quantize, round_scale
from .scheme import (
    BlockScale,
    Layout,
    Offset,
    QuantMode,
    QuantScheme,
    QuantStore,
    QuantValue,
    ScaleDtype,
)

if TYPE_CHECKING:  # imported on first use (below); type checkers see them here
    from . import burnpack as burnpack
    from . import checkpoint as checkpoint
    from . import files as files
    from . import gguf as gguf
    from . import reference as reference
    from .burnpack import load_burnpack, save_burnpack
    from .files import dequantize_file, load, quantize_file

__all__ = [
    "QuantScheme",
    "QuantValue",
    "QuantStore",
    "Offset",
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


# The file formats (checkpoint, files, burnpack: three quarters of the package's import time,
# about 0.1 s) load on first use, so that `import blockquant` for in-memory quantizing, and the
# command line's start, do not pay for them.
_LAZY = {
    "load_burnpack": "burnpack",
    "save_burnpack": "burnpack",
    "quantize_file": "files",
    "dequantize_file": "files",
    "load": "files",
}
#: Submodules reachable as attributes (`bq.gguf.quantize`) without an import of their own, as
#: they were when the package imported them all.
_SUBMODULES = ("burnpack", "checkpoint", "files", "gguf", "reference")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(_importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif name in _SUBMODULES:
        # import_module, not `from . import x`: that would call this __getattr__ again.
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'blockquant' has no attribute {name!r}")
    globals()[name] = value  # found once; later lookups do not come here
    return value


def __dir__() -> list[str]:
    # Without the names this file imports for itself (typing's, __future__'s feature).
    own = {"annotations", "Any", "TYPE_CHECKING"}
    return sorted((set(globals()) - own) | set(_LAZY) | set(_SUBMODULES))
