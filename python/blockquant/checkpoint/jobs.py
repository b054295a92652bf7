"""Work on several files at once: each in a worker process with its share of the kernel
threads, progress sent back to the parent, and the first failure ending every worker.

Workers are spawned, not forked: a fresh interpreter inherits no lock or thread pool caught
mid-use, and behaves the same on every platform. Each worker is a process group of its own, so
that a signal to the command's group (Ctrl-C, `kill -TERM -PGID`, a closed terminal) reaches the
parent alone, which ends the pool (the command turns SIGTERM and SIGHUP into KeyboardInterrupt).
A worker must not die of such a signal itself: an idle one waits for its next task holding the
task queue's lock, shared with the parent, and would take it to its grave (the parent's
`Pool.terminate()` then waits for it forever). A worker whose parent is gone (killed outright)
exits; one that dies under the parent (the kernel's out-of-memory killer) fails the run, naming
its file, instead of leaving its task waited for.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
import resource
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import CheckpointError

#: (file in the folder, or None for a single file; tensor name; input bytes done)
TensorProgress = Callable[[Any, str, int], None]


@dataclass
class Task:
    """One file's work, run here or in a worker process: ``fn(*args, progress=...)``."""

    key: Any  # the file, as progress reports it
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


_queue: Any = None  # the worker's channel back to the parent (set in each worker)


def _init_worker(q: Any, threads: int, parent: int) -> None:
    global _queue
    _queue = q
    # Out of the parent's process group, before SIGTERM is unblocked: a signal to that group
    # reaches the parent alone, which ends the pool (see the module's docstring). Ctrl-C is
    # the parent's to handle too, should one be sent to this process by its pid.
    if hasattr(os, "setpgid"):
        try:
            os.setpgid(0, 0)
        except OSError:  # not allowed here (a session leader, a sandbox): stay in the group
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(parent)
    # The worker started with SIGINT and SIGTERM blocked (`_start_pool`): a SIGTERM the pool
    # sent meanwhile ends it here, by the default action, without a traceback.
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STARTUP_SIGNALS)
    _threads().set_num_threads(threads)


def _watch_parent(parent: int) -> None:
    """Exit once the parent (pid ``parent``) is gone, killed outright: it ends the pool
    otherwise. Out of its process group, nothing else would end this worker, which waits on a
    queue whose other end its siblings hold open."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="blockquant-parent-watch", daemon=True).start()


#: Held back while the pool starts its workers (see `_start_pool`).
_STARTUP_SIGNALS = {signal.SIGINT, signal.SIGTERM} | (
    {signal.SIGHUP} if hasattr(signal, "SIGHUP") else set())


def _start_tracker() -> None:
    """multiprocessing's resource tracker, started if it is not running, with SIGHUP ignored.
    It ignores SIGINT and SIGTERM by itself, not SIGHUP; started so (an ignored signal stays
    ignored across exec), it outlives a hangup that this process survives to clean up after,
    rather than dying and leaving a new one to print a traceback for each semaphore this
    process then releases. Only in the main thread, where handlers can be set."""
    from multiprocessing import resource_tracker

    hup = getattr(signal, "SIGHUP", None)
    if hup is None or threading.current_thread() is not threading.main_thread():
        resource_tracker.ensure_running()
        return
    before = signal.signal(hup, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(hup, before)


def _start_pool(ctx: Any, jobs: int, q: Any, threads: int) -> tuple[Any, list[int]]:
    """The worker pool, and the SIGINTs and SIGTERMs that came while it started, for the
    caller to raise again once it holds the pool (inside its `finally: pool.terminate()`).

    Meanwhile this process only records those signals (a handler that notes them: blocking
    them in this thread alone would not do, the kernel hands a process's signal to any thread
    not blocking it, rayon's or BLAS's, and Python then raises in this one): it cannot die
    halfway through handing a worker its start-up data, which left the worker printing an
    EOFError traceback. The workers start with both signals blocked (the mask is inherited),
    so none dies of a Ctrl-C while it imports (a KeyboardInterrupt traceback) before
    `_init_worker` has set its signals up. Only in the main thread, where handlers can be set."""
    if not hasattr(signal, "pthread_sigmask") or \
            threading.current_thread() is not threading.main_thread():
        return ctx.Pool(jobs, initializer=_init_worker, initargs=(q, threads, os.getpid())), []
    # The resource tracker runs already (`_start_tracker`): starting it inside the window
    # would unblock both signals in this thread (its own code does), and the workers spawned
    # after it would start unblocked.
    caught: list[int] = []
    handlers = {sig: signal.signal(sig, lambda n, _frame: caught.append(n))
                for sig in _STARTUP_SIGNALS}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _STARTUP_SIGNALS)
    try:
        pool = ctx.Pool(jobs, initializer=_init_worker, initargs=(q, threads, os.getpid()))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a pending one is only noted
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return pool, caught


def _work(task: Task, index: int) -> tuple[Any, int]:
    # First (task index, pid), two items where progress sends three: so that the parent can
    # tell a task whose worker died from one still running.
    _queue.put((index, os.getpid()))

    def progress(name: str, nbytes: int) -> None:
        _queue.put((task.key, name, nbytes))

    result = task.fn(*task.args, progress=progress, **task.kwargs)
    return result, _peak_rss()


def _threads() -> Any:
    """The package, for its thread-pool bound (imported when used: it imports this module)."""
    import blockquant

    return blockquant


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if os.uname().sysname == "Darwin" else peak * 1024


@dataclass
class RunStats:
    """How a run went: wall seconds, processes used, threads each, peak memory of each."""

    seconds: float = 0.0
    jobs: int = 1
    threads_per_job: int = 0
    peak_rss: list[int] = field(default_factory=list)


def run_tasks(tasks: Sequence[Task], jobs: int, threads: int | None,
              progress: TensorProgress, stats: RunStats | None = None) -> list[Any]:
    """Results of ``tasks`` in order. With ``jobs`` > 1 they go to that many worker
    processes (spawned, so no lock or thread pool is inherited mid-use), each bounded to
    ``threads // jobs`` kernel threads (``threads`` default: the current bound, itself the
    cores or ``BLOCKQUANT_NUM_THREADS``). The first failure ends the pool and is raised."""
    stats = stats if stats is not None else RunStats()
    t0 = time.perf_counter()
    jobs = max(1, min(jobs, len(tasks)))
    bq = _threads()
    total = threads if threads else bq.get_num_threads()
    stats.jobs, stats.threads_per_job = jobs, max(1, total // jobs)
    if jobs == 1:
        before = bq.get_num_threads()
        if threads:
            bq.set_num_threads(threads)
        try:
            results = []
            for task in tasks:
                def one(name: str, nbytes: int, key: Any = task.key) -> None:
                    progress(key, name, nbytes)

                results.append(task.fn(*task.args, progress=one, **task.kwargs))
        finally:
            if threads:
                bq.set_num_threads(before)
        stats.peak_rss = [_peak_rss()]
        stats.seconds = time.perf_counter() - t0
        return results
    ctx = multiprocessing.get_context("spawn")
    _start_tracker()  # before the queue, whose locks would start it
    q = ctx.Queue()
    pool, caught = _start_pool(ctx, jobs, q, stats.threads_per_job)
    try:
        for sig in caught:  # came while the pool started: handled now as it would have been
            signal.raise_signal(sig)
        pending = [pool.apply_async(_work, (task, i)) for i, task in enumerate(tasks)]
        workers: dict[int, int] = {}  # task index -> the pid of the worker that took it
        while True:
            _drain(q, progress, workers, timeout=0.05)
            for p in pending:
                if p.ready() and not p.successful():
                    p.get()  # raises the worker's exception
            if all(p.ready() for p in pending):
                break
            _check_workers(tasks, pending, workers)
        out = [p.get() for p in pending]
        _drain(q, progress, workers, timeout=0.1, until_empty=True)
        pool.close()
        pool.join()
    finally:
        pool.terminate()  # kills the workers at once on an error, Ctrl-C or SIGTERM
        q.close()
    stats.peak_rss = [rss for _, rss in out]
    stats.seconds = time.perf_counter() - t0
    return [result for result, _ in out]


def _drain(q: Any, progress: TensorProgress, workers: dict[int, int], timeout: float,
           until_empty: bool = False) -> None:
    try:
        item = q.get(timeout=timeout)
        while True:
            if len(item) == 2:  # a worker took task item[0] (`_work`)
                workers[item[0]] = item[1]
            else:
                progress(*item)
            item = q.get(timeout=timeout) if until_empty else q.get_nowait()
    except queue_mod.Empty:
        pass


def _check_workers(tasks: Sequence[Task], pending: Sequence[Any], workers: dict[int, int]) -> None:
    """Fail the run if a task's worker is gone while its result is not in: the pool would
    wait for that result forever (it replaces the worker, not the task). A dead worker stays
    visible until the pool reaps it, a tenth of a second at most, and the check is a signal 0."""
    for i, pid in workers.items():
        if pending[i].ready():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            if pending[i].ready():  # its result came in just before it ended
                continue
            raise CheckpointError(tasks[i].key, None, "its worker process ended abruptly (killed, "
                                  "or out of memory?) before it was done") from None
        except OSError:  # alive, another user's pid after all: nothing to say
            pass
