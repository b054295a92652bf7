"""A model folder quantized on a dask cluster: ``blockquant quantize MODEL -o OUT --scheduler
ADDRESS`` (a running scheduler; the workers see MODEL and OUT's folder at the same paths), or
``--dask`` (a LocalCluster of ``--jobs`` worker processes here).

The run is planned here, once, as any other (:class:`.folders.Plan`); each checkpoint file is
then one task, the same writer the ``--jobs`` processes run
(:func:`.commands.write_quantized`), on whichever worker the scheduler picks: it reads its input
from the shared path and writes its output into the run folder's ``parts/``, published
atomically there and fsynced, and returns the file's size and SHA-256. This client records each
finished file in the manifest (:mod:`.manifest`), then writes the indexes and the other files
and renames the folder into place, as a one-machine run does.

A run cut short (a worker killed, the scheduler or this client stopped) keeps its run folder;
``--resume`` goes on from it, redoing only what the manifest cannot vouch for, and the output is
the same bytes as an uninterrupted run. A run that fails on its input (a tensor its scheme
cannot take, a NaN) removes it: there is nothing to resume. A scheduler that does not answer
within ``--scheduler-timeout`` seconds is an error before anything is written; a local
cluster's workers are ended with the run, however it ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _threads
from ..errors import QuantError
from .base import CheckpointError
from .commands import QuantizeSummary
from .folders import FilePlan, FolderSummary, Plan, retarget
from .jobs import RunStats, Task, TensorProgress, _peak_rss
from .manifest import (
    Manifest,
    RunTarget,
    digest_or_none,
    file_digest,
    fingerprint,
    run_folder,
    sweep,
)

__all__ = ["ClusterSpec", "cluster_from_options", "run_on_cluster", "run_part"]


@dataclass(frozen=True)
class ClusterSpec:
    """Where a run goes: ``address`` a dask scheduler's, or None for a LocalCluster of
    ``workers`` processes here, each with ``threads // workers`` kernel threads (``threads``
    None: every core). ``timeout``: seconds to wait for a scheduler. ``resume``: go on from
    an interrupted run's finished files."""

    address: str | None = None
    workers: int = 1
    threads: int | None = None
    timeout: float = 10.0
    resume: bool = False


def cluster_from_options(scheduler: str | None, local: bool, jobs: int | None,
                         threads: int | None, timeout: float | None,
                         resume: bool) -> ClusterSpec | None:
    """The command's options as a :class:`ClusterSpec` (None: no cluster); options that do
    not go together are a CheckpointError naming one of them."""
    if scheduler is None and not local:
        for flag, given in (("--resume", resume), ("--scheduler-timeout", timeout is not None)):
            if given:
                raise CheckpointError(flag, None, "goes with a run on a dask cluster "
                                      "(--scheduler ADDRESS or --dask)")
        return None
    if scheduler is not None:
        if local:
            raise CheckpointError("--dask", None, "starts a cluster here, --scheduler names a "
                                  "running one: give one of them")
        for flag, given in (("--jobs", jobs), ("--threads", threads)):
            if given is not None:
                raise CheckpointError(flag, None, "the cluster's workers run the files, each "
                                      "bounding its own threads (dask worker --nworkers/"
                                      "--nthreads, BLOCKQUANT_NUM_THREADS)")
    return ClusterSpec(scheduler, jobs or 1, threads, 10.0 if timeout is None else timeout,
                       resume)


def _dask_missing() -> CheckpointError:
    return CheckpointError("--scheduler", None, "runs on dask's distributed scheduler, which is "
                           "not installed: pip install 'blockquant[dask]'")


@contextmanager
def _quiet() -> Iterator[None]:
    """distributed's log lines (a connection refused, a worker restarted) off stderr, where
    the command says what happened in its own line."""
    loggers = [logging.getLogger(n) for n in ("distributed", "tornado", "asyncio")]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, before):
            lg.setLevel(level)


def connect(spec: ClusterSpec) -> tuple[Any, Any]:
    """(client, local cluster or None). A scheduler that does not answer in time, or an
    address that is none, is a CheckpointError naming ``--scheduler``."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise _dask_missing() from None
    if spec.address is None:
        cluster = LocalCluster(n_workers=spec.workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.CRITICAL)
        try:
            return Client(cluster, timeout=spec.timeout, set_as_default=False), cluster
        except BaseException:
            cluster.close()
            raise
    _check_address(spec.address)
    # In a thread of its own, waited for a little past the timeout: distributed waits for the
    # other side's handshake without one, so a server that accepts and says nothing (not a
    # dask scheduler, or a hung one) would hold the command forever.
    got: dict[str, Any] = {}

    def dial() -> None:
        try:
            got["client"] = Client(spec.address, timeout=spec.timeout, set_as_default=False)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            got["error"] = e

    thread = threading.Thread(target=dial, name="blockquant-dask-connect", daemon=True)
    thread.start()
    thread.join(spec.timeout + 1.0)
    error = got.get("error")
    if "client" in got:
        return got["client"], None
    if error is not None and not isinstance(error, (OSError, TimeoutError, ValueError,
                                                    TypeError)):
        raise error
    why = ("it took the connection and said nothing: is it a dask scheduler?" if error is None
           else str(error).splitlines()[0] if str(error) else type(error).__name__)
    raise CheckpointError("--scheduler", None, f"no dask scheduler answered at "
                          f"{spec.address!r} within {spec.timeout:g} s ({why})")


def _check_address(address: str) -> None:
    """A scheduler address dask can dial (``tcp://host:port``, ``host:port``, ``tls://...``);
    checked before a client is made (a client made from a bad one lingers, and its cleanup at
    exit waits 20 seconds and prints a traceback)."""
    from distributed.comm.addressing import normalize_address, parse_address, parse_host_port

    try:
        protocol, location = parse_address(normalize_address(address))
        if protocol in ("tcp", "tls"):
            _, port = parse_host_port(location)
            if not 0 < int(port) < 65536:
                raise ValueError(f"port {port} out of range")
    except (ValueError, TypeError) as e:
        raise CheckpointError("--scheduler", None, f"{address!r} is not a scheduler address "
                              f"such as tcp://host:8786 ({e})") from None


def run_part(task: Task, out: str, threads: int | None) -> dict[str, Any]:
    """On a worker: write one file as ``task`` says (replacing any earlier attempt's), then
    measure it. Its kernels get ``threads`` (None: the worker's cores over its thread slots,
    unless BLOCKQUANT_NUM_THREADS bounds them)."""
    path = Path(out)
    try:
        path.unlink()  # an attempt a killed worker finished but no one recorded
    except FileNotFoundError:
        pass
    if threads is None and "BLOCKQUANT_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // _worker_slots())
    with _threads.bounded(threads):
        result = task.fn(*task.args, progress=lambda name, n: None, **task.kwargs)
    size, digest = file_digest(path)
    return {"result": result, "size": size, "sha256": digest, "rss": _peak_rss()}


def _worker_slots() -> int:
    try:
        from distributed import get_worker

        return max(1, int(get_worker().state.nthreads))
    except (ImportError, ValueError, AttributeError):
        return 1


def check_plan(plan: Any) -> Plan:
    """A run the cluster takes: blockquant's own output (safetensors or burn-pack files) into a
    folder; a CheckpointError naming ``--scheduler`` otherwise."""
    if not isinstance(plan, Plan) or plan.kind != "quantize":
        fmt = getattr(getattr(plan, "format", None), "name", None) or "this output"
        raise CheckpointError("--scheduler", None, f"runs blockquant's own safetensors "
                              f"outputs on a cluster, not {fmt} (drop --scheduler/--dask)")
    if not plan.into_folder:
        raise CheckpointError("--scheduler", None, "runs a model folder's files on a cluster, "
                              "one task each, into an output folder: name a folder (OUT/)")
    return plan


def run_on_cluster(plan: Any, spec: ClusterSpec,
                   progress: TensorProgress = lambda *a: None) -> FolderSummary:
    """``plan`` run on the cluster ``spec`` names (see the module's text)."""
    plan = check_plan(plan)
    t0 = time.perf_counter()
    run = run_folder(plan.dst)
    RunTarget.check(plan.dst, plan.src, plan.options.force)
    if (run.exists() or run.is_symlink()) and not spec.resume:
        raise CheckpointError(plan.dst, None, f"an interrupted run's files are kept in "
                              f"{str(run)!r}: --resume goes on from them (or remove it)")
    keys = {f.rel: fingerprint(plan, f) for f in plan.files}
    with _quiet():
        client, cluster = connect(spec)  # before anything is written
        try:
            return _run(plan, spec, client, keys, progress, t0)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()


def _run(plan: Plan, spec: ClusterSpec, client: Any, keys: dict[str, str],
         progress: TensorProgress, t0: float) -> FolderSummary:
    from distributed import as_completed

    target = RunTarget(plan.dst, plan.src, plan.options.force)
    manifest = Manifest.read(target.run)
    done = set()
    if spec.resume:  # the finished files read back and hashed by the workers, side by side
        done = manifest.finished(target.tmp, keys, lambda paths: client.gather(
            client.map(digest_or_none, paths, pure=False)))
    sweep(target.tmp, done)
    copied = plan.prepare(target.tmp)
    todo = [f for f in plan.files if f.rel not in done]
    threads = None
    if spec.address is None:
        total = spec.threads or _threads.get_num_threads()
        threads = max(1, total // max(1, spec.workers))
    token = uuid.uuid4().hex[:12]
    futures: dict[Any, FilePlan] = {}
    for i, f in enumerate(todo):
        task = plan.task(f, target.tmp / f.rel, force=True)
        futures[client.submit(run_part, task, str(target.tmp / f.rel), threads,
                              key=f"blockquant-{token}-{i}", pure=False)] = f
    results: dict[str, Any] = {}
    rss: list[int] = []
    try:
        for future in as_completed(list(futures), loop=client.loop):
            f = futures[future]
            out = _outcome(future, f, target, plan, done, len(results))
            manifest.record(f.rel, keys[f.rel], out["size"], out["sha256"])
            results[f.rel] = out["result"]
            rss.append(out["rss"])
            for d in f.decisions:
                progress(f.rel, d.tensor.name, d.tensor.nbytes)
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    keep = {f.rel for f in plan.files} | set(copied)
    sweep(target.tmp, keep)  # the temporary files of attempts killed midway
    bytes_out = plan.complete(target.tmp)
    target.commit()
    for f in plan.files:
        if f.rel not in results:  # finished by the interrupted run
            results[f.rel] = _summary_of(f, os.path.getsize(plan.dst / f.rel))
    stats = RunStats(time.perf_counter() - t0, len(client.scheduler_info().get("workers", {}))
                     if spec.address else spec.workers, threads or 0, rss)
    summary = plan.summary([results[f.rel] for f in plan.files], copied,
                           plan.folder.skipped if plan.folder else [], bytes_out, t0, stats)
    summary.resumed_files = sorted(done)
    return summary  # type: ignore[no-any-return]


def _outcome(future: Any, f: FilePlan, target: RunTarget, plan: Plan, done: set[str],
             finished: int) -> dict[str, Any]:
    """A task's result; its failure as the run's error. A file the input makes impossible
    (a CheckpointError or QuantError of the writer) ends the run and its run folder; any other
    failure (a worker killed, the scheduler gone, a full disk) keeps the folder for
    ``--resume`` and says so."""
    try:
        return future.result()  # type: ignore[no-any-return]
    except CheckpointError as e:
        target.discard()
        raise retarget(e, target.tmp, plan.dst) from None
    except QuantError as e:
        target.discard()
        raise CheckpointError(f.src, None, str(e)) from None
    except Exception as e:
        kept = len(done) + finished
        why = str(e).splitlines()[0] if str(e) else ""
        name = type(e).__name__
        what = ("its dask worker died while writing it (killed, or out of memory?)"
                if name == "KilledWorker" else f"{name}: {why}" if why else name)
        raise CheckpointError(f.src, None, f"{what}; {kept} of {len(plan.files)} files were "
                              f"finished, kept in {str(target.run)!r}: --resume goes on from "
                              "them") from None


def _summary_of(f: FilePlan, bytes_out: int) -> QuantizeSummary:
    """The summary of a file a resumed run found finished (its decisions, as planned)."""
    return QuantizeSummary([d.tensor.name for d in f.decisions if d.quantized],
                           [d.tensor.name for d in f.decisions if not d.quantized],
                           sum(d.tensor.nbytes for d in f.decisions), bytes_out, 0.0,
                           list(f.decisions))
