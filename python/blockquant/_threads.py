"""The kernels' thread bound, for the modules that run work (the worker processes of
:mod:`.checkpoint.jobs`, the GGUF requantizer, the ONNX writer): the gateway's
``get_num_threads`` and ``set_num_threads``, a bound held for the length of a block, and
calls made on several threads at once (:func:`imap_ordered`)."""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from itertools import islice
from typing import TypeVar

from ._native import get_num_threads, set_num_threads

__all__ = ["bounded", "get_num_threads", "imap_ordered", "set_num_threads"]

T = TypeVar("T")
R = TypeVar("R")


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


# One executor for the process, grown as needed and kept: each of its threads becomes a
# one-thread pool of the core's on its first small call, and the core makes at most 64 such
# (docs/threads.md), so threads made afresh for every call would use them up.
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _executor(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < threads:
            if _pool is not None:
                _pool.shutdown(wait=False)  # its running calls finish; it takes no more
            _pool = ThreadPoolExecutor(threads, thread_name_prefix="blockquant")
            _pool_size = threads
        return _pool


def _forget_executor() -> None:
    """In a forked child: the parent's executor threads are not there."""
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_executor)


def imap_ordered(fn: Callable[[T], R], items: Iterable[T], threads: int) -> Iterator[R]:
    """``fn`` of each item, in the items' order, computed on ``threads`` threads at once (the
    core releases the GIL while it works), at most twice that many results waiting; on the
    calling thread, one at a time, for one thread. A call's exception is raised as its result
    comes due; closing the iterator early cancels the calls not started."""
    if threads <= 1:
        yield from map(fn, items)
        return
    ex = _executor(threads)
    it = iter(items)
    pending: deque[Future[R]] = deque(ex.submit(fn, x) for x in islice(it, 2 * threads))
    try:
        while pending:
            result = pending.popleft().result()
            pending.extend(ex.submit(fn, x) for x in islice(it, 1))
            yield result
    finally:
        for f in pending:
            f.cancel()
