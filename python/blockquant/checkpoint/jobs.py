"""Work on several files at once: each in a worker process with its share of the kernel
threads, progress sent back to the parent, and the first failure ending every worker.

Workers are spawned, not forked: a fresh interpreter inherits no lock or thread pool caught
mid-use, and behaves the same on every platform. Each has a pipe of its own to the parent and
shares no lock with it or with another worker (multiprocessing's Pool shares its task queue's:
an idle worker waits for a task holding it, and killed there, by a signal to the process group
or the out-of-memory killer, it left the pool's `terminate()` waiting forever). So any worker
can die at any moment without hanging anything: the parent sees it (its pipe closes, its
sentinel is ready). One that had taken its task fails the run naming the file; a task sent to
one that died before taking it (each task is acknowledged) goes to another worker.

Workers stay in the command's process group, so job control works on them as on the command
(Ctrl-Z stops them all, `fg` goes on). They ignore Ctrl-C, which the parent handles: it kills
its workers on any error or signal, and tells them to stop when the run is done. A worker whose
parent is gone, killed outright, exits.
"""

from __future__ import annotations

import multiprocessing
import operator
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from .. import _threads
from ..options import MAX_THREADS
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


#: What a worker sends: that it took its task (index), progress (key, tensor, bytes), a result
#: (index, result, peak RSS), an error (index, exception, its traceback's text), or that it
#: could not unpickle the task it was sent (the error's text).
_TOOK, _PROGRESS, _DONE, _FAILED, _UNREADABLE = "took", "progress", "done", "failed", "unreadable"


def _worker(conn: Any, threads: int, parent: int) -> None:
    """A worker process: runs the tasks the parent sends on ``conn`` until told to stop (None)
    or the parent is gone, sending back progress and each task's outcome on the same pipe."""
    # Ctrl-C goes to the whole foreground group: the parent handles it and ends the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent(parent)
    # The worker started with SIGINT, SIGTERM and SIGHUP blocked (`_start_workers`): a SIGTERM
    # sent meanwhile ends it here, by the default action, without a traceback.
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STARTUP_SIGNALS)
    _threads.set_num_threads(threads)
    try:
        while True:
            data = conn.recv_bytes()
            try:
                message = ForkingPickler.loads(data)
            except Exception as e:  # a class this process cannot import, say
                conn.send((_UNREADABLE, f"{type(e).__name__}: {e}"))
                continue
            if message is None:
                return
            index, task = message
            conn.send((_TOOK, index))  # a task this worker dies with is now the file's failure

            def progress(name: str, nbytes: int, key: Any = task.key) -> None:
                conn.send((_PROGRESS, key, name, nbytes))

            try:
                reply: tuple[Any, ...] = (_DONE, index,
                                          task.fn(*task.args, progress=progress, **task.kwargs),
                                          _peak_rss())
            except Exception as e:
                reply = (_FAILED, index, e, traceback.format_exc())
            conn.send_bytes(_portable(reply, task))
    except (EOFError, OSError):  # the parent is gone
        return


def _portable(reply: tuple[Any, ...], task: Task) -> bytes:
    """``reply`` pickled, checked to unpickle (an exception whose ``__init__`` takes other
    arguments than it keeps pickles, then fails in the parent); else the same news in one that
    does: the error's type and text, naming the file."""
    try:
        data = bytes(ForkingPickler.dumps(reply))
        ForkingPickler.loads(data)
        return data
    except Exception as e:
        if reply[0] == _DONE:
            why = f"its result could not be sent back from the worker process ({e})"
        else:
            error = reply[2]
            why = f"{type(error).__name__}: {error}"
        text = reply[3] if reply[0] == _FAILED else traceback.format_exc()
        return bytes(ForkingPickler.dumps((_FAILED, reply[1], CheckpointError(task.key, None, why),
                                           text)))


def _watch_parent(parent: int) -> None:
    """Exit once the parent (pid ``parent``) is gone, killed outright: it ends its workers
    otherwise. A worker waiting for a task sees its pipe close; this ends one at work too,
    rather than let it finish a file no one will keep."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="blockquant-parent-watch", daemon=True).start()


#: Held back while the workers start (see `_start_workers`).
_STARTUP_SIGNALS = {signal.SIGINT, signal.SIGTERM} | (
    {signal.SIGHUP} if hasattr(signal, "SIGHUP") else set())


def _start_tracker() -> None:
    """multiprocessing's resource tracker (every spawned process is handed it), started if it
    is not running, with SIGHUP blocked. It ignores SIGINT and SIGTERM by itself, not SIGHUP;
    started so (the mask is inherited across exec), it outlives a hangup that this process
    survives to clean up after, rather than dying and leaving a new one that knows nothing of
    what it tracked (it printed a traceback for each semaphore released later)."""
    from multiprocessing import resource_tracker

    hup = getattr(signal, "SIGHUP", None)
    if hup is None or not hasattr(signal, "pthread_sigmask"):
        resource_tracker.ensure_running()
        return
    # Blocked in this thread only, for as long as the tracker takes to start: a hangup
    # meanwhile waits, or goes to another thread, and is handled as usual.
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {hup})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@dataclass
class _Worker:
    process: Any
    conn: Any  # the parent's end of the worker's pipe
    task: int | None = None  # the index of the task it was given
    took: bool = False  # whether it said it took that task (else, should it die, another may)


def _start_workers(ctx: Any, jobs: int, threads: int, workers: list[_Worker]) -> list[int]:
    """``jobs`` worker processes, added to ``workers`` as each starts (so that the caller's
    `finally` that ends them sees every one, whatever interrupts this), and the SIGINTs,
    SIGTERMs and SIGHUPs that came while they started, for the caller to raise again once it
    holds them.

    Meanwhile this process only records those signals (a handler that notes them: blocking
    them in this thread alone would not do, the kernel hands a process's signal to any thread
    not blocking it, rayon's or BLAS's, and Python then raises in this one): it cannot die
    halfway through handing a worker its start-up data, which left the worker printing an
    EOFError traceback. The workers start with the signals blocked (the mask is inherited), so
    none dies of a Ctrl-C while it imports (a KeyboardInterrupt traceback) before `_worker`
    has set its signals up. Only in the main thread, where handlers can be set."""

    def start() -> None:
        for _ in range(jobs):
            mine, theirs = ctx.Pipe()
            workers.append(_Worker(ctx.Process(target=_worker, name="blockquant-job",
                                               args=(theirs, threads, os.getpid()),
                                               daemon=True), mine))
            try:
                workers[-1].process.start()
            finally:
                theirs.close()  # the worker's end is the worker's alone: its death closes it

    if not hasattr(signal, "pthread_sigmask") or \
            threading.current_thread() is not threading.main_thread():
        start()
        return []
    caught: list[int] = []
    # An ignored signal (SIGHUP under nohup) stays ignored: a handler, even for a moment,
    # would not be inherited as the ignore is, and the workers would die of it.
    handlers = {sig: signal.signal(sig, lambda n, _frame: caught.append(n))
                for sig in _STARTUP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _STARTUP_SIGNALS)
    try:
        start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a pending one is only noted
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return caught


def _end(workers: Sequence[_Worker], graceful: bool = False) -> None:
    """End every worker: told to stop when the run is done (``graceful``), killed otherwise
    (an error, Ctrl-C, a signal), which also ends one that is stopped (SIGSTOP) or busy in a
    long kernel call. Nothing they share with this process can be left held: each has a pipe
    of its own."""
    try:
        if graceful:
            for w in workers:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
            deadline = time.monotonic() + 10  # for all: one stopped (SIGSTOP) is then killed
            for w in workers:
                if w.process.pid is not None:
                    w.process.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:  # also when a Ctrl-C interrupts the above
        for w in workers:
            if w.process.pid is not None and w.process.exitcode is None:
                w.process.kill()
        for w in workers:
            if w.process.pid is not None:
                w.process.join()
            w.conn.close()


def _run_on(workers: list[_Worker], tasks: Sequence[Task],
            progress: TensorProgress) -> list[tuple[Any, int]]:
    """The tasks' (result, peak RSS) in order, each task sent to the next free worker."""
    out: list[Any] = [None] * len(tasks)
    todo = list(range(len(tasks)))[::-1]
    left = len(tasks)

    def give(w: _Worker) -> None:
        w.task, w.took = (todo.pop() if todo else None), False
        if w.task is not None:
            try:
                w.conn.send((w.task, tasks[w.task]))
            except OSError:  # it has just died: the task waits for another
                todo.append(w.task)
                w.task = None

    for w in workers:
        give(w)
    live = list(workers)
    handed_on: set[int] = set()  # tasks whose first worker died before taking them
    while left:
        waited = {w.conn: w for w in live} | {w.process.sentinel: w for w in live}
        ready = connection.wait(list(waited))
        for w in {id(waited[r]): waited[r] for r in ready}.values():
            ended = w.process.sentinel in ready
            while True:  # what it sent before it ended is still read first
                try:
                    if not w.conn.poll():
                        break
                    message = _recv(w, tasks)
                except (EOFError, OSError):  # its end closed: it has ended, or is ending
                    ended = True
                    break
                # The task's own errors (an OSError too) and the progress callback's go up.
                left -= _receive(w, message, tasks, out, progress)
                if w.task is None and not ended:
                    give(w)
            if not ended:
                continue
            live.remove(w)
            if w.task is not None:
                if w.took or w.task in handed_on:  # a second death: the task's doing, likely
                    _worker_died(w, tasks[w.task])
                handed_on.add(w.task)  # sent, never taken: it waits for another worker
                todo.append(w.task)
            for other in live:  # any idle one takes it
                if other.task is None and todo:
                    give(other)
        if left and not live:  # each died before taking a task: at start-up, most likely
            raise CheckpointError(tasks[todo[-1]].key, None,
                                  "every worker process ended before it could take this file "
                                  "(did they start? any errors of theirs are printed above)")
    return out


def _recv(w: _Worker, tasks: Sequence[Task]) -> tuple[Any, ...]:
    """A worker's next message (EOFError once it has ended). One that does not unpickle here
    (the worker checks, `_portable`) fails the run naming the worker's file, not with a
    traceback."""
    try:
        message: tuple[Any, ...] = w.conn.recv()
    except (EOFError, OSError):
        raise
    except Exception as e:
        raise CheckpointError(_file_of(w, tasks), None, "a message from its worker process could "
                              f"not be read ({type(e).__name__}: {e})") from e
    return message


def _file_of(w: _Worker, tasks: Sequence[Task]) -> Any:
    """The file of the task ``w`` was given, for an error's message."""
    return tasks[w.task].key if w.task is not None else "?"


def _receive(w: _Worker, message: tuple[Any, ...], tasks: Sequence[Task], out: list[Any],
             progress: TensorProgress) -> int:
    """Handle one of a worker's messages; 1 if it finished its task."""
    if message[0] == _TOOK:
        w.took = True
        return 0
    if message[0] == _UNREADABLE:
        raise CheckpointError(_file_of(w, tasks), None,
                              f"its worker process could not take the task ({message[1]})")
    if message[0] == _PROGRESS:
        progress(*message[1:])
        return 0
    if message[0] == _DONE:
        out[message[1]] = message[2:]
        w.task = None
        return 1
    _, _, error, text = message
    error.__cause__ = _RemoteTraceback(text)
    raise error


class _RemoteTraceback(Exception):
    """Where a worker's error came from: its traceback there, as text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\nin the worker process:\n{self.text}"


def _worker_died(w: _Worker, task: Task) -> None:
    """A worker ended with its task unfinished: fail the run, naming the file. A signal may
    have killed it on its way to the whole process group (kill -TERM -PGID, a closed terminal):
    this process then gets it too, in a moment, and ends as that signal says instead."""
    w.process.join(timeout=5)
    code = w.process.exitcode
    if code is not None and code < 0 and -code in _STARTUP_SIGNALS:
        time.sleep(0.5)  # the signal, if it came to this process too, raises here
    if code is None:
        how = "closed its pipe"
    elif code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
        if -code == getattr(signal, "SIGKILL", None):
            how += " (out of memory?)"  # the kernel's out-of-memory killer sends SIGKILL
    else:
        how = f"exited with status {code}"
    raise CheckpointError(task.key, None, f"its worker process {how} before it was done")


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux reports KiB, macOS bytes)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclass
class RunStats:
    """How a run went: wall seconds, processes used, threads each, peak memory of each."""

    seconds: float = 0.0
    jobs: int = 1
    threads_per_job: int = 0
    peak_rss: list[int] = field(default_factory=list)


def check_counts(jobs: Any, threads: Any) -> None:
    """``jobs`` (processes, at least 1) and ``threads`` (kernel threads in all, None for the
    current bound, else 1 to the core's limit) as the command line takes them: anything else is a
    :class:`CheckpointError` naming the option."""
    if not _count_in(jobs, 1, None):
        raise CheckpointError("--jobs", None, f"expected an integer >= 1, got {jobs!r}")
    if threads is not None and not _count_in(threads, 1, MAX_THREADS):
        raise CheckpointError("--threads", None,
                              f"expected an integer from 1 to {MAX_THREADS}, got {threads!r}")


def _count_in(value: Any, lo: int, hi: int | None) -> bool:
    if isinstance(value, bool):
        return False
    try:
        n = operator.index(value)
    except TypeError:
        return False
    return lo <= n and (hi is None or n <= hi)


def run_tasks(tasks: Sequence[Task], jobs: int, threads: int | None,
              progress: TensorProgress, stats: RunStats | None = None) -> list[Any]:
    """Results of ``tasks`` in order. With ``jobs`` > 1 they go to that many worker
    processes (spawned, so no lock or thread pool is inherited mid-use), each bounded to
    ``threads // jobs`` kernel threads (``threads`` default: the current bound, itself the
    cores or ``BLOCKQUANT_NUM_THREADS``). The first failure ends the pool and is raised."""
    check_counts(jobs, threads)
    stats = stats if stats is not None else RunStats()
    t0 = time.perf_counter()
    jobs, threads = operator.index(jobs), None if threads is None else operator.index(threads)
    jobs = max(1, min(jobs, len(tasks)))
    total = threads if threads else _threads.get_num_threads()
    stats.jobs, stats.threads_per_job = jobs, max(1, total // jobs)
    if jobs == 1:
        with _threads.bounded(threads):
            results = []
            for task in tasks:
                def one(name: str, nbytes: int, key: Any = task.key) -> None:
                    progress(key, name, nbytes)

                results.append(task.fn(*task.args, progress=one, **task.kwargs))
        stats.peak_rss = [_peak_rss()]
        stats.seconds = time.perf_counter() - t0
        return results
    ctx = multiprocessing.get_context("spawn")
    _start_tracker()
    workers: list[_Worker] = []
    done = False
    try:
        caught = _start_workers(ctx, jobs, stats.threads_per_job, workers)
        for sig in caught:  # came while the workers started: handled now as it would have been
            signal.raise_signal(sig)
        out = _run_on(workers, tasks, progress)
        done = True
    finally:
        _end(workers, graceful=done)  # killed at once on an error, Ctrl-C or a signal
    stats.peak_rss = [rss for _, rss in out]
    stats.seconds = time.perf_counter() - t0
    return [result for result, _ in out]
