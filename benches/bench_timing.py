"""The timing harness of benches/bench.py: cells timed interleaved, medians of wall and CPU time.

A *cell* is one call to time (a library, an operation, a thread count). All the cells of a group
run once per repetition, in an order rotated every repetition, so that slow drifts of a shared
machine (another process's build, frequency changes) fall on every cell alike and a ratio between
two cells compares calls made seconds apart, not minutes. One and two threads are two cells of
the same group: the thread count is set before each call, outside the timed region.

For each call the harness records the wall time (perf_counter) and the process's CPU time
(process_time: every thread of the process, so a call that really ran on two cores shows a CPU /
wall ratio near 2, one that left its second thread idle or waiting shows about 1).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import blockquant as bq

_torch = None  # torch, once use_torch() found it: its pool then follows the same thread counts


def use_torch():
    """torch if installed (imported on first use: it takes seconds), else None."""
    global _torch
    if _torch is None:
        try:
            import torch
        except ImportError:
            return None
        _torch = torch
    return _torch


_threads: Optional[int] = None  # what set_threads last set (None: blockquant's default)


def set_threads(n: Optional[int]) -> None:
    """Bound blockquant's pool (and torch's) to n threads; None leaves them as they are.

    blockquant's set_num_threads drops its pool and the next call builds a new one: asking for
    the thread count builds it here, outside the timed call, and an unchanged count is left
    alone so that a pool is not rebuilt for nothing."""
    global _threads
    if n is None or n == _threads:
        return
    bq.set_num_threads(n)
    bq.get_num_threads()
    if _torch is not None:
        _torch.set_num_threads(n)
    _threads = n


@dataclass
class Cell:
    """One timed call. ``rounds`` caps how many repetitions it takes part in (the slow
    bit-exact reference runs in the first few only); ``warmup`` calls it once untimed first."""

    key: str
    fn: Callable[[], object]
    threads: Optional[int] = None
    rounds: Optional[int] = None
    warmup: bool = True
    wall: List[float] = field(default_factory=list)
    cpu: List[float] = field(default_factory=list)

    @property
    def s(self) -> float:
        """Median wall time in seconds (nan if it never ran)."""
        return statistics.median(self.wall) if self.wall else float("nan")

    @property
    def cpu_per_wall(self) -> float:
        """Median over repetitions of CPU time / wall time: about the cores the call kept busy."""
        if not self.wall:
            return float("nan")
        return statistics.median(c / w for c, w in zip(self.cpu, self.wall) if w > 0)

    def summary(self) -> Dict:
        return dict(median_s=self.s, cpu_per_wall=self.cpu_per_wall, threads=self.threads,
                    wall_s=self.wall, cpu_s=self.cpu)


# Idle time after each call, outside the timed region: a pool's workers (rayon's, torch's
# OpenMP) spin a little after their last job before they sleep, and on a 2-core machine that
# spinning would slow the next call and count in its CPU time.
SETTLE_S = 0.002


def _spin_s() -> float:
    """How long blockquant's workers poll after a call (BLOCKQUANT_SPIN_MS, docs/threads.md;
    off by default), waited out after a call of two or more threads like the settle time."""
    try:
        ms = int(os.environ.get("BLOCKQUANT_SPIN_MS", "0"))
    except ValueError:
        ms = 0  # the core ignores such a value too
    return ms / 1000 + SETTLE_S if 0 < ms <= 1000 else SETTLE_S


SPIN_S = _spin_s()


def time_once(cell: Cell) -> None:
    set_threads(cell.threads)
    c0 = time.process_time()
    t0 = time.perf_counter()
    cell.fn()
    t1 = time.perf_counter()
    c1 = time.process_time()
    cell.wall.append(t1 - t0)
    cell.cpu.append(c1 - c0)
    time.sleep(SPIN_S if (cell.threads or 1) > 1 else SETTLE_S)


def run_interleaved(cells: List[Cell], repeat: int) -> Dict[str, Cell]:
    """Time every cell ``repeat`` times (fewer for a cell with ``rounds``), round-robin with the
    order rotated by one each repetition. Returns the cells by key."""
    for cell in cells:
        if cell.warmup:
            set_threads(cell.threads)
            cell.fn()
    # A collection inside a timed call would be charged to whichever cell triggered it; the
    # calls free their arrays by reference counting, so one collection before is enough.
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rep in range(repeat):
            order = cells[rep % len(cells):] + cells[: rep % len(cells)]
            for cell in order:
                if cell.rounds is None or rep < cell.rounds:
                    time_once(cell)
    finally:
        if was_enabled:
            gc.enable()
    return {c.key: c for c in cells}


def reset_threads() -> None:
    """Back to blockquant's default pool (and torch's one thread per core)."""
    global _threads
    bq.set_num_threads(0)
    _threads = None
    if _torch is not None:
        _torch.set_num_threads(os.cpu_count() or 1)
