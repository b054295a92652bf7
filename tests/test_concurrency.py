"""Threads, the GIL and fork (docs/threads.md).

The binding releases the GIL around every kernel, and kernels run on one bounded rayon pool
(rust/blockquant-core/src/pool.rs) that a forked child rebuilds. Here:

- 8 Python threads quantizing and dequantizing different 1M-element arrays at once (and the
  same array from every thread) give exactly the single-threaded results;
- results do not depend on the pool's size, even when another thread resizes the pool while
  kernels run;
- a child forked after the pool has been used can still quantize, with the same results.

Scenarios that could deadlock run in a subprocess under a timeout, so a deadlock fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import blockquant as bq
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype

N = 1 << 20  # big enough that the kernels run long, with the GIL released
SCHEMES = [
    (bq.presets.nvfp4(), "minmax"),
    (bq.presets.int8_block32(), "minmax"),
    (bq.presets.int4_block32(), "minmax"),
    (bq.presets.mxfp8(), "minmax"),
    (bq.presets.bitnet(), "absmean"),
    (bq.presets.int8(), "minmax"),
    (QuantScheme(QuantValue.Q4F, QuantStore.packed_u32(1)).per_block([4, 8], ScaleDtype.BF16),
     "minmax"),
    (QuantScheme(QuantValue.E5M2, QuantStore.Native).per_block([2, 16], ScaleDtype.F16)
     .per_tensor(ScaleDtype.F32), "absmean"),
]


def digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()


def work(job) -> str:
    x, scheme, calibration = job
    qt = bq.quantize(x, scheme, calibration=calibration)
    back = bq.QTensor.from_bytes(qt.to_bytes(), scheme, x.shape)
    return digest(qt.to_bytes(), back.dequantize().tobytes(), qt.dequantize(np.float16).tobytes())


@pytest.fixture(scope="module")
def jobs():
    rng = np.random.default_rng(99)
    return [
        ((rng.standard_normal((1024, N // 1024)) * 10.0 ** (i - 4)).astype(np.float32), s, c)
        for i, (s, c) in enumerate(SCHEMES)
    ]


@pytest.fixture(autouse=True)
def default_pool():
    yield
    bq.set_num_threads(0)


def test_eight_threads_give_the_single_threaded_results(jobs):
    sequential = [work(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=8) as ex:
        for _ in range(2):
            assert list(ex.map(work, jobs)) == sequential
        # The same input array (and the same schemes) from every thread at once.
        same = [(jobs[0][0], s, c) for _, s, c in jobs]
        assert list(ex.map(work, same)) == [work(j) for j in same]


def test_the_gil_is_released_while_kernels_run():
    """A pure-Python thread keeps counting while the main thread sits in one long kernel call.

    With a long switch interval the interpreter never takes the GIL from a thread by force in
    the few milliseconds a call lasts: had the binding kept the GIL for the call, the counter
    would not move at all during it."""
    import threading

    x = np.random.default_rng(3).standard_normal(1 << 23).astype(np.float32)
    scheme = bq.presets.int8_block32()
    bq.quantize(x[:1024], scheme)  # build the pool first
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.1)
    try:
        best = 0
        for _ in range(3):  # a loaded machine may starve the counter once; not three times
            count = [0]
            started, stop = threading.Event(), threading.Event()

            def counter(count=count, started=started, stop=stop):
                started.set()
                while not stop.is_set():
                    count[0] += 1

            t = threading.Thread(target=counter)
            t.start()
            started.wait()
            before = count[0]
            bq.quantize(x, scheme)
            best = max(best, count[0] - before)
            stop.set()
            t.join()
            if best > 1000:
                break
    finally:
        sys.setswitchinterval(interval)
    assert best > 1000, f"the counter advanced only {best} times during quantize"


def test_results_do_not_depend_on_the_pool_size(jobs):
    want = [work(j) for j in jobs[:4]]
    for n in (1, 2, 3, 0):
        bq.set_num_threads(n)
        assert [work(j) for j in jobs[:4]] == want


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_resizing_the_pool_while_threads_quantize_does_not_deadlock():
    _run("""
        import threading
        from concurrent.futures import ThreadPoolExecutor
        import numpy as np, blockquant as bq

        x = np.random.default_rng(0).standard_normal((512, 2048)).astype(np.float32)
        schemes = [bq.presets.nvfp4(), bq.presets.int8_block32(), bq.presets.bitnet()]
        want = [bq.quantize(x, s).to_bytes() for s in schemes]
        stop = threading.Event()

        def resize():
            n = 0
            while not stop.is_set():
                bq.set_num_threads(n % 4)  # 0 (default), 1, 2, 3
                bq.get_num_threads()
                n += 1

        def job(i):
            s = schemes[i % 3]
            for _ in range(10):
                qt = bq.quantize(x, s)
                assert qt.to_bytes() == want[i % 3]
                qt.dequantize()
            return i

        t = threading.Thread(target=resize)
        t.start()
        try:
            with ThreadPoolExecutor(8) as ex:
                assert sorted(ex.map(job, range(16))) == list(range(16))
        finally:
            stop.set()
            t.join()
        # A panic in the pool, caught, in the middle of it all, leaves the pool usable.
        try:
            bq._core._panic_for_tests()
        except bq.InternalError:
            pass
        assert bq.quantize(x, schemes[0]).to_bytes() == want[0]
    """)


def test_a_forked_child_can_still_quantize():
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    _run("""
        import os
        import numpy as np, blockquant as bq

        x = np.random.default_rng(1).standard_normal((256, 4096)).astype(np.float32)
        s = bq.presets.nvfp4()
        want = bq.quantize(x, s).to_bytes()  # the parent's pool is built and has run
        bq.set_num_threads(2)
        assert bq.quantize(x, bq.presets.int8()).nbytes > 0

        def child(n_threads):
            if n_threads is not None:
                bq.set_num_threads(n_threads)
            ok = bq.quantize(x, s).to_bytes() == want
            ok &= bq.QTensor.from_bytes(want, s, x.shape).dequantize().shape == x.shape
            ok &= bq.get_num_threads() >= 1
            return ok

        for n_threads in (None, 1, 3):
            pid = os.fork()
            if pid == 0:
                try:
                    code = 0 if child(n_threads) else 1
                except BaseException:
                    code = 2
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (n_threads, status)
        # A grandchild: forked from a child that rebuilt its pool.
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                bq.quantize(x, s)
                pid2 = os.fork()
                if pid2 == 0:
                    os._exit(0 if bq.quantize(x, s).to_bytes() == want else 1)
                _, st = os.waitpid(pid2, 0)
                code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        # And the parent still works.
        assert bq.quantize(x, s).to_bytes() == want
    """)


def test_fork_while_other_threads_use_the_pool_lock():
    """A thread that holds the pool's lock at fork() time does not exist in the child; the core
    holds that lock across fork() (pthread_atfork) so the child never inherits it locked."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    _run("""
        import os, threading
        import numpy as np, blockquant as bq

        x = np.random.default_rng(2).standard_normal((64, 256)).astype(np.float32)
        want = bq.quantize(x, bq.presets.int8_block32()).to_bytes()
        stop = threading.Event()

        def churn():
            n = 0
            while not stop.is_set():  # takes and releases the pool lock constantly
                bq.set_num_threads(1 + n % 2)
                bq.get_num_threads()
                n += 1

        threads = [threading.Thread(target=churn) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            for _ in range(30):
                pid = os.fork()
                if pid == 0:
                    ok = bq.quantize(x, bq.presets.int8_block32()).to_bytes() == want
                    os._exit(0 if ok else 1)
                _, status = os.waitpid(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0
        finally:
            stop.set()
            for t in threads:
                t.join()
    """)


def test_a_forked_child_completes_every_call_after_the_parent_made_them():
    """Every parallel loop runs on the one bounded, fork-aware pool: after two-level to_bytes,
    from_bytes and dequantize in the parent (whose scale loop once ran on rayon's global pool,
    which has no threads in a child), the same calls in a forked child finish."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    _run("""
        import os
        import numpy as np, blockquant as bq

        # Large enough that the two-level scale loop splits (over 2 x 64 Ki block scales).
        x = np.random.default_rng(4).standard_normal((2048, 1040)).astype(np.float32)
        calls = []
        for s in (bq.presets.nvfp4(), bq.presets.mxfp4(), bq.presets.int8(),
                  "q4s/packed_u32_1/block8x4:f16"):
            qt = bq.quantize(x, s)
            b = qt.to_bytes()
            back = bq.QTensor.from_bytes(b, s, x.shape)
            y = back.dequantize()
            calls.append((s, b, y))
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                ok = True
                for s, b, y in calls:
                    qt = bq.quantize(x, s)
                    back = bq.QTensor.from_bytes(qt.to_bytes(), s, x.shape)
                    ok &= qt.to_bytes() == b
                    ok &= np.array_equal(back.dequantize(), y)
                    ok &= np.array_equal(bq.QTensor.from_parts(
                        back.values, back.scales, s, x.shape, back.global_scale).dequantize(), y)
                    ok &= bq.round_scale([0.3], bq.ScaleDtype.UE4M3).shape == (1,)
                os._exit(0 if ok else 1)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
    """)


def test_set_num_threads_bounds_every_call():
    """With one thread asked for, no call starts more threads than the pool's one worker."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc")
    _run("""
        import os
        import numpy as np, blockquant as bq

        bq.set_num_threads(1)
        x = np.random.default_rng(5).standard_normal((256, 1024)).astype(np.float32)
        before = len(os.listdir("/proc/self/task"))
        for s in (bq.presets.nvfp4(), bq.presets.int8_block32(), bq.presets.bitnet(),
                  "q8s/packed_u32_1/block4x4:f32"):
            qt = bq.quantize(x, s)
            back = bq.QTensor.from_bytes(qt.to_bytes(), s, x.shape)
            back.dequantize()
            bq.QTensor.from_parts(back.values, back.scales, s, x.shape, back.global_scale)
        bq.round_scale(np.ones(1 << 18, np.float32), bq.ScaleDtype.F16)
        after = len(os.listdir("/proc/self/task"))
        assert after - before <= 1, (before, after)  # the pool's one worker, at most
        assert bq.get_num_threads() == 1
    """)


def test_small_calls_start_no_thread_and_run_alongside_each_other():
    """Calls below the core's inline size (pool.rs, INLINE_BELOW: 256 Ki elements) run on the
    calling thread, so a process that makes only such calls never starts the pool's workers
    (threads named blockquant-N in /proc), and eight Python threads making them at once,
    on schemes with every kind of loop (two-level, searched, per-tensor, strided blocks, ggml),
    get the bytes a serial run got, as do their forked children. A call just above the size
    then starts the pool."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc")
    _run("""
        import os, time
        from concurrent.futures import ThreadPoolExecutor
        import numpy as np, blockquant as bq, blockquant.gguf as gg

        def threads():  # the pool's workers, by the name the core gives them
            names = []
            for t in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{t}/comm") as f:
                        names.append(f.read().strip())
                except FileNotFoundError:  # a thread that just exited
                    pass
            return sum(n.startswith("blockquant-") for n in names)

        rng = np.random.default_rng(6)
        schemes = [bq.presets.nvfp4(), bq.presets.int8_block32(), bq.presets.bitnet(),
                   bq.presets.int4_block16(), bq.presets.int8(), bq.presets.mxfp4(),
                   "q4s/packed_u32_1/block8x4:f16"]
        xs = [rng.standard_normal((64, 512)).astype(np.float32) * 10.0 ** k for k in range(-3, 3)]

        def job(i):
            x, s = xs[i % len(xs)], schemes[i % len(schemes)]
            qt = bq.quantize(x, s)
            back = bq.QTensor.from_bytes(qt.to_bytes(), s, x.shape)
            y = back.dequantize()
            out = np.empty_like(y)
            back.dequantize(out=out)
            assert np.array_equal(out.view(np.uint32), y.view(np.uint32))
            g = gg.quantize(x, "Q4_0")
            return qt.to_bytes() + y.tobytes() + g.tobytes() + gg.dequantize(g, "Q4_0").tobytes()

        want = [job(i) for i in range(len(schemes) * len(xs))]
        with ThreadPoolExecutor(8) as ex:
            for _ in range(3):
                assert list(ex.map(job, range(len(want)))) == want
            during = threads()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if [job(i) for i in range(len(want))] == want else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (during, threads()) == (0, 0)
        bq.quantize(np.ones(1 << 18, np.float32), bq.presets.int8_block32())
        # A worker names itself once it runs, which may be a moment after the call.
        deadline = time.monotonic() + 10
        while threads() < bq.get_num_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert threads() == bq.get_num_threads() >= 1, threads()
    """)


@pytest.mark.parametrize("bad", [-1, -(2**70), 2**70, 1025, 1 << 16])
def test_set_num_threads_refuses_bad_counts_with_a_value_error(bad):
    with pytest.raises(ValueError, match="set_num_threads"):
        bq.set_num_threads(bad)
    with pytest.raises(TypeError):
        bq.set_num_threads(1.5)
    with pytest.raises(TypeError):
        bq.set_num_threads(True)


@pytest.mark.parametrize("value", ["abc", "0", "-3", "", "100000"])
def test_a_bad_thread_variable_is_a_warning_and_the_default(value):
    proc = _run(f"""
        import os, warnings
        os.environ["BLOCKQUANT_NUM_THREADS"] = {value!r}
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import blockquant as bq
        assert any("BLOCKQUANT_NUM_THREADS" in str(x.message) for x in w), [str(x.message) for x in w]
        assert bq.get_num_threads() == (os.cpu_count() or 1) or bq.get_num_threads() >= 1
    """)
    assert proc.returncode == 0


def test_a_caught_panic_prints_nothing():
    proc = _run("""
        import blockquant as bq
        try:
            bq._core._panic_for_tests()
        except bq.InternalError as e:
            assert "please report" in str(e)
    """)
    assert proc.stderr == ""


def test_out_of_memory_is_a_memory_error_and_the_process_lives():
    """Under an address-space limit every allocation, numpy's or the core's, fails as
    MemoryError and the process carries on."""
    pytest.importorskip("resource")
    _run("""
        import resource
        import numpy as np, blockquant as bq

        x = np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32)  # 64 MiB
        qt = bq.quantize(x, bq.presets.int8())
        bq.quantize(x[:1024], bq.presets.nvfp4()).to_bytes()  # the pool and its threads exist
        with open("/proc/self/status") as f:
            vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (4 << 20), resource.RLIM_INFINITY))
        failed = []
        for call in (lambda: qt.dequantize(), lambda: qt.to_bytes(),
                     lambda: bq.quantize(x, bq.presets.int8())):
            try:
                call()
            except MemoryError:
                failed.append(True)
        assert len(failed) == 3, failed  # 64, 16 and 16 MiB do not fit in 4 MiB of headroom
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert bq.quantize(x[:64], bq.presets.int8()).nbytes == 68  # alive and well
    """)


# ---- the workers pinned to CPUs (docs/threads.md; pool.rs) ----

_WORKER_CPUS = """
    import os, time
    def workers():
        # {thread id: (worker index, CPUs it may run on)} for blockquant's live workers.
        got = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = f.read().strip()
                cpus = os.sched_getaffinity(int(tid))
            except OSError:
                continue  # a thread that just ended
            if name.startswith("blockquant-"):
                got[int(tid)] = (int(name.split("-")[1]), cpus)
        return got

    def worker_cpus(threads, replaced, want=None):
        # The CPUs each of the current pool's `threads` workers may run on, by worker index.
        # A replaced pool's workers (thread ids in `replaced`) end on their own time, and a new
        # worker is named before its start handler pins it: wait until the old ones are gone and
        # each index 0..threads-1 is there once (and, given `want`, until it is seen).
        deadline = time.monotonic() + 10
        while True:
            got = workers()
            cpus = [c for _, c in sorted(got.values(), key=lambda t: t[0])]
            settled = not (replaced & got.keys()) and sorted(i for i, _ in got.values()) == list(range(threads))
            if (settled and want in (None, cpus)) or time.monotonic() > deadline:
                return cpus
            time.sleep(0.01)

    def can_pin(cpu):
        # Whether this system lets a thread keep itself to one CPU (a sandbox may refuse, or
        # accept and ignore it): tried on a thread of its own.
        import threading
        ok = []
        def probe():
            try:
                os.sched_setaffinity(0, {cpu})
                ok.append(os.sched_getaffinity(0) == {cpu})
            except OSError:
                ok.append(False)
        t = threading.Thread(target=probe)
        t.start()
        t.join()
        return ok[0]
"""


@pytest.mark.parametrize("pin", [None, "1", "0"])
def test_workers_are_pinned_one_to_a_cpu_when_they_match_the_cpus(pin):
    """As many workers as CPUs: worker i on the i-th CPU alone (unless BLOCKQUANT_PIN_THREADS=0);
    any other count: anywhere the process may run. The calling thread stays unpinned, the
    bytes are the same, and a forked child (its own pool, pinned alike) completes its calls."""
    if not (os.path.isdir("/proc/self/task") and hasattr(os, "sched_getaffinity")):
        pytest.skip("needs Linux")
    setting = "" if pin is None else f"os.environ['BLOCKQUANT_PIN_THREADS'] = {pin!r}"
    _run(_WORKER_CPUS + f"""
    {setting}
    import numpy as np, blockquant as bq
    allowed = sorted(os.sched_getaffinity(0))
    n = len(allowed)
    x = np.random.default_rng(5).standard_normal((1024, 1024)).astype(np.float32)
    bq.set_num_threads(1)
    want = [bq.quantize(x, s).to_bytes() for s in ("int8_block32", "nvfp4")]
    for threads in (n, n + 1, n - 1):
        if threads < 1:
            continue
        replaced = set(workers())
        bq.set_num_threads(threads)
        assert bq.get_num_threads() == threads
        assert [bq.quantize(x, s).to_bytes() for s in ("int8_block32", "nvfp4")] == want
        if threads == 1:
            continue  # a pool of one thread hands large calls to its worker, unpinned
        if threads == n and {pin!r} != "0" and can_pin(allowed[-1]):
            expect = [{{c}} for c in allowed]
        else:
            expect = [set(allowed)] * threads
        cpus = worker_cpus(threads, replaced, expect)
        assert cpus == expect, (threads, allowed, cpus)
        assert sorted(os.sched_getaffinity(0)) == allowed  # the caller: never pinned
        pid = os.fork()
        if pid == 0:
            ok = [bq.quantize(x, s).to_bytes() for s in ("int8_block32", "nvfp4")] == want
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    """, timeout=60)


# ---- the workers' polling after a call (docs/threads.md; pool.rs) ----

@pytest.mark.parametrize("variable, value", [
    *(("BLOCKQUANT_SPIN_MS", v) for v in ["abc", "-1", "1001", "", "2.5"]),
    *(("BLOCKQUANT_PIN_THREADS", v) for v in ["yes", "2", "", "off"]),
])
def test_a_bad_pool_variable_is_a_warning(variable, value):
    """The workers' polling time, or their pinning (above), set to a value the core ignores."""
    _run(f"""
        import os, warnings
        os.environ[{variable!r}] = {value!r}
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import blockquant as bq
        assert any({variable!r} in str(x.message) for x in w), [str(x.message) for x in w]
        import numpy as np
        x = np.ones((512, 1024), np.float32)
        assert bq.quantize(x, "int8").nbytes > 0
    """)


@pytest.mark.parametrize("spin", ["0", "1000"])
def test_spin_time_changes_no_result_and_no_fork(spin):
    """Polling off, or for a second after each call: the same bytes, and a child forked while
    the parent's workers poll completes its calls."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    _run(f"""
        import os
        os.environ["BLOCKQUANT_SPIN_MS"] = {spin!r}
        import numpy as np, blockquant as bq
        x = np.random.default_rng(3).standard_normal((1024, 1024)).astype(np.float32)
        bq.set_num_threads(1)
        want = [bq.quantize(x, s).to_bytes() for s in ("int8_block32", "nvfp4")]
        bq.set_num_threads(2)
        got = [bq.quantize(x, s).to_bytes() for s in ("int8_block32", "nvfp4")]
        assert got == want
        pid = os.fork()  # the workers are polling now (with spin 1000)
        if pid == 0:
            ok = [bq.quantize(x, s).to_bytes() for s in ("int8_block32", "nvfp4")] == want
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    """, timeout=60)


def test_polling_stops_at_its_deadline_and_when_the_pool_is_replaced():
    """Polling workers use CPU time only for their spin time, and a replaced pool's workers
    stop polling (and exit) at once instead of at the deadline."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc")
    _run("""
        import os, threading, time
        os.environ["BLOCKQUANT_SPIN_MS"] = "1000"
        import numpy as np, blockquant as bq
        x = np.random.default_rng(4).standard_normal((2048, 1024)).astype(np.float32)
        bq.set_num_threads(1)
        bq.quantize(x, "int8_block32")
        base = len(os.listdir("/proc/self/task"))
        bq.set_num_threads(2)
        bq.quantize(x, "int8_block32")  # then two workers poll for up to a second
        # They do poll: a polling worker is runnable ("R"), a parked one sleeps ("S"). The
        # state, not CPU time, because a worker that yields between polls gets little CPU time
        # when the machine is busy (CI runs the tests on every core at once).
        me = str(threading.get_native_id())

        def states():
            out = []
            for tid in os.listdir("/proc/self/task"):
                if tid != me:
                    try:
                        with open(f"/proc/self/task/{tid}/stat") as f:
                            out.append(f.read().rsplit(")", 1)[1].split()[0])
                    except OSError:  # the thread exited meanwhile
                        pass
            return out

        # Looked at from 0.2 s to 0.3 s, once rayon's own short idle spin (which any pool does)
        # is long over, and early enough in the polling second to leave the check below room.
        time.sleep(0.2)
        seen = []
        for _ in range(10):
            seen += states()
            if "R" in seen:
                break
            time.sleep(0.01)
        assert "R" in seen, seen
        bq.set_num_threads(1)
        bq.quantize(x, "int8_block32")
        deadline = time.monotonic() + 0.5  # well inside the old workers' second
        while len(os.listdir("/proc/self/task")) > base and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(os.listdir("/proc/self/task")) <= base, (base, os.listdir("/proc/self/task"))
        # The one-thread pool does not poll.
        c0 = time.process_time()
        time.sleep(0.2)
        assert time.process_time() - c0 < 0.05
        # Nor does a pool of two after its deadline.
        bq.set_num_threads(2)
        bq.quantize(x, "int8_block32")
        time.sleep(1.1)
        c0 = time.process_time()
        time.sleep(0.2)
        assert time.process_time() - c0 < 0.05
    """)


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                    reason="fesetround through glibc's libm, on x86-64")
def test_a_callers_rounding_mode_changes_nothing():
    """A thread that set rounding toward -inf (``fesetround``, as a library may) gets the
    same bytes, from a small call (run on that thread) and a large one (on the pool), and its
    mode back. The values' quotients by the scale are exact ties under round to nearest (code
    away from 0) and fall just below under rounding down (one code less)."""
    proc = _run("""
        import ctypes, ctypes.util
        import numpy as np, blockquant as bq
        e = np.float32(0.0371)
        x = np.array([2.8752499, 3.3946497, 2.9494498, 1.3541499], np.float32)
        small, large = np.tile(x, 64), np.tile(x, 2**18)
        want = [bq.quantize(a, "int8", scales=[e]).values.tobytes() for a in (small, large)]
        libm = ctypes.CDLL(ctypes.util.find_library("m"))
        FE_DOWNWARD, FE_TONEAREST = 0x400, 0
        assert libm.fesetround(FE_DOWNWARD) == 0
        # The mode took effect on this thread: numpy's division now rounds the quotient down.
        assert (x / e)[0] < np.float32(77.5), x / e
        got = [bq.quantize(a, "int8", scales=[e]).values.tobytes() for a in (small, large)]
        mode = libm.fegetround()
        libm.fesetround(FE_TONEAREST)
        assert mode == FE_DOWNWARD, mode
        assert [np.frombuffer(w, np.int8)[0] for w in want] == [78, 78]
        assert got == want
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
