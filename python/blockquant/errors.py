"""The exceptions blockquant raises (format.md "Errors").

Every failure the caller can cause is a :class:`QuantError` (a ``ValueError``); an argument of the
wrong type is a ``TypeError``. The Rust core raises these same classes: the binding imports them
from this module, so there is exactly one definition of each.
"""

from __future__ import annotations

__all__ = [
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


class QuantError(ValueError):
    """Base class of every error the caller can cause."""


class SchemeError(QuantError):
    """An invalid scheme, or a scheme that does not fit the tensor it meets."""


class ScaleError(QuantError):
    """Scales of the wrong count or shape, negative, non-finite or not representable."""


class MissingGlobalScaleError(ScaleError):
    """A two-level scheme was given no per-tensor scale."""


class UnexpectedGlobalScaleError(ScaleError):
    """A per-tensor scale was given to a one-level scheme."""


class UnsupportedSchemeError(QuantError, NotImplementedError):
    """A valid scheme with no implementation. Nothing raises it any more (Lookup mode works);
    it stays so that code catching it keeps importing."""


class LayoutError(QuantError):
    """Bytes or storage that do not fit the scheme and shape."""


class NonFiniteError(QuantError):
    """NaN or infinity in the input; the message names the first flat index."""


class InternalError(RuntimeError):
    """A bug in blockquant: a Rust panic caught at the binding. Please report it."""
