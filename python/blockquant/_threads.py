"""The kernels' thread bound, for the modules that run work (the worker processes of
:mod:`.checkpoint.jobs`, the GGUF requantizer): the gateway's ``get_num_threads`` and
``set_num_threads``, and a bound held for the length of a block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ._native import get_num_threads, set_num_threads

__all__ = ["bounded", "get_num_threads", "set_num_threads"]


@contextmanager
def bounded(threads: int | None) -> Iterator[None]:
    """``threads`` kernel threads within the block (None: the bound as it is), the bound
    before it put back after."""
    if not threads:
        yield
        return
    before = get_num_threads()
    set_num_threads(threads)
    try:
        yield
    finally:
        set_num_threads(before)
