"""Model folders on a dask cluster (``--scheduler``, ``--dask``): the output equals a
one-process run byte for byte; a run whose client is killed, or whose worker is killed, leaves
no output and no worker, and ``--resume`` finishes it without redoing the files its manifest
vouches for (and redoes those it cannot: changed, corrupted, half-written); a scheduler that
does not answer, and options that do not go together, are one line and exit code 2, with
nothing written.

The command runs in a child process. A ``sitecustomize`` shim (imported by every Python process
of the test, the cluster's workers too) wraps the file writer to leave a marker when a file is
started and finished, and to wait while a ``hold-FILE`` marker exists: so that a test can kill
a worker, or the client, at a known point."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import blockquant as bq

pytest.importorskip("distributed")
from test_folders import make_model  # noqa: E402

from blockquant.checkpoint.manifest import run_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: Where the blockquant under test lives (the checkout's python/, or an installed wheel's
#: site-packages): child processes import the same one.
PACKAGE_ROOT = Path(bq.__file__).resolve().parents[1]
LINUX = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc")

_SHIM = textwrap.dedent('''
    import functools, os, time
    _MARKS = os.environ.get("BQ_TEST_MARKS")
    if _MARKS:
        import blockquant.checkpoint.commands as _c
        _real = _c.write_quantized

        @functools.wraps(_real)
        def write_quantized(src, dst, *args, **kwargs):
            name = os.path.basename(str(dst))
            open(os.path.join(_MARKS, f"start-{name}-{os.getpid()}"), "w").close()
            while os.path.exists(os.path.join(_MARKS, f"hold-{name}")):
                time.sleep(0.05)
            out = _real(src, dst, *args, **kwargs)
            open(os.path.join(_MARKS, f"done-{name}-{os.getpid()}"), "w").close()
            return out

        _c.write_quantized = write_quantized
''')

SHARDS = [f"model-{k:05d}-of-00004.safetensors" for k in range(1, 5)]


@pytest.fixture
def setup(tmp_path):
    """(model folder, marks folder, environment for the child, the one-process output)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_SHIM)
    marks = tmp_path / "marks"
    marks.mkdir()
    make_model(tmp_path / "model", n_shards=4, rows=256)
    env = {**os.environ, "BQ_TEST_MARKS": str(marks), "BLOCKQUANT_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(shim), str(PACKAGE_ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    reference = tmp_path / "reference"
    done = _command(["quantize", tmp_path / "model", "-o", f"{reference}/", "--scheme", "nvfp4"],
                    {k: v for k, v in env.items() if k != "BQ_TEST_MARKS"})
    assert done.returncode == 0, done.stderr
    return tmp_path / "model", marks, env, reference


def _command(argv, env, **kw):
    return subprocess.run([sys.executable, "-m", "blockquant", *map(str, argv)], env=env,
                          capture_output=True, text=True, timeout=kw.pop("timeout", 180), **kw)


def _start(argv, env):
    return subprocess.Popen([sys.executable, "-m", "blockquant", *map(str, argv)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _marks(marks: Path, kind: str, name: str) -> list[int]:
    return [int(p.name.rsplit("-", 1)[1]) for p in marks.glob(f"{kind}-{name}-*")]


def _wait(cond, proc=None, seconds=90.0):
    deadline = time.monotonic() + seconds
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the command ended early: {proc.communicate()}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _recorded(out: Path) -> set[str]:
    try:
        return set(json.loads((run_folder(out) / "manifest.json").read_text())["parts"])
    except (OSError, ValueError):
        return set()


def _one_error(done, *words):
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith("blockquant: error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# -- an uninterrupted run --------------------------------------------------------------------
def test_a_local_cluster_run_equals_a_one_process_run(setup, tmp_path):
    model, marks, env, reference = setup
    out = tmp_path / "out"
    done = _command(["quantize", model, "-o", out, "--scheme", "nvfp4", "--dask", "--jobs", "2"],
                    env)
    assert done.returncode == 0, done.stderr
    assert _files(out) == _files(reference)
    assert not run_folder(out).exists()
    for name in SHARDS:  # one task per file, each done once
        assert len(_marks(marks, "done", name)) == 1


def test_a_running_scheduler_by_its_address(setup, tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    model, marks, env, reference = setup
    out = tmp_path / "out"
    # the workers' interpreters (started from here) find the shim and the marks
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    monkeypatch.setenv("BQ_TEST_MARKS", str(marks))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        done = _command(["quantize", model, "-o", f"{out}/", "--scheme", "nvfp4",
                         "--scheduler", cluster.scheduler_address], env)
    assert done.returncode == 0, done.stderr
    assert _files(out) == _files(reference)
    pids = {pid for name in SHARDS for pid in _marks(marks, "done", name)}
    assert len(pids) >= 1 and os.getpid() not in pids  # written by the cluster's workers


# -- interrupted runs --------------------------------------------------------------------------
@LINUX
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_client_stopped_midway_is_resumed_without_redoing_finished_files(setup, tmp_path, how):
    model, marks, env, reference = setup
    out = tmp_path / "out"
    for name in SHARDS[2:]:
        (marks / f"hold-{name}").touch()
    argv = ["quantize", model, "-o", out, "--scheme", "nvfp4", "--dask", "--jobs", "1"]
    proc = _start(argv, env)
    try:
        _wait(lambda: _recorded(out) == set(SHARDS[:2]) and _marks(marks, "start", SHARDS[2]),
              proc)
        workers = _descendants(proc.pid)
        assert workers
        os.kill(proc.pid, getattr(signal, how))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    if how == "SIGTERM":
        assert proc.returncode == 128 + signal.SIGTERM
        assert "--resume goes on from them" in err and "Traceback" not in err, err
    _wait(lambda: not any(_alive(p) for p in workers), seconds=30)  # no worker left running
    assert not out.exists()
    parts = run_folder(out) / "parts"
    kept = {name: os.stat(parts / name).st_ino for name in SHARDS[:2]}
    for name in SHARDS[2:]:
        (marks / f"hold-{name}").unlink()
    done = _command([*argv, "--resume"], env)
    assert done.returncode == 0, done.stderr
    assert "resumed: 2 files of 4 found finished" in done.stdout
    assert _files(out) == _files(reference)
    for name in SHARDS[:2]:  # kept as they were: the same files, written once
        assert len(_marks(marks, "start", name)) == 1
        assert os.stat(out / name).st_ino == kept[name]
    assert not run_folder(out).exists()


@LINUX
def test_a_worker_killed_midway_is_retried_and_the_output_is_whole(setup, tmp_path):
    model, marks, env, reference = setup
    out = tmp_path / "out"
    (marks / f"hold-{SHARDS[1]}").touch()
    proc = _start(["quantize", model, "-o", out, "--scheme", "nvfp4", "--dask", "--jobs", "1"],
                  env)
    try:
        _wait(lambda: _marks(marks, "start", SHARDS[1]), proc)
        (victim,) = _marks(marks, "start", SHARDS[1])
        os.kill(victim, signal.SIGKILL)  # the nanny starts another; the task goes to it
        _wait(lambda: len(_marks(marks, "start", SHARDS[1])) == 2, proc)
        (marks / f"hold-{SHARDS[1]}").unlink()
        stdout, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert _files(out) == _files(reference)  # and no temporary file of the killed attempt


@LINUX
def test_a_worker_killed_for_good_fails_the_run_and_resume_finishes_it(setup, tmp_path):
    model, marks, env, reference = setup
    out = tmp_path / "out"
    env = {**env, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}  # one death is fatal
    (marks / f"hold-{SHARDS[1]}").touch()
    argv = ["quantize", model, "-o", out, "--scheme", "nvfp4", "--dask", "--jobs", "1"]
    proc = _start(argv, env)
    try:
        _wait(lambda: _marks(marks, "start", SHARDS[1]) and SHARDS[0] in _recorded(out), proc)
        workers = _descendants(proc.pid)
        # a half-written file of the dying attempt, as a worker killed in a write leaves one
        (run_folder(out) / "parts" / f".{SHARDS[1]}.deadbeef.tmp").write_bytes(b"half")
        os.kill(_marks(marks, "start", SHARDS[1])[0], signal.SIGKILL)
        stdout, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, err)
    # (the file named is one the dead worker held: the one it was writing, or the next,
    # which the scheduler had handed it already)
    line = _one_error(done, "its dask worker died", "1 of 4 files were finished",
                      "--resume goes on from them")
    assert SHARDS[1] in line or SHARDS[2] in line
    _wait(lambda: not any(_alive(p) for p in workers), seconds=30)
    assert not out.exists()
    (marks / f"hold-{SHARDS[1]}").unlink()
    done = _command([*argv, "--resume"], {**env, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES":
                                          "3"})
    assert done.returncode == 0, done.stderr
    assert _files(out) == _files(reference)
    assert len(_marks(marks, "start", SHARDS[0])) == 1


def test_resume_redoes_what_the_manifest_cannot_vouch_for(setup, tmp_path):
    """A finished file changed on disk (same size), a file whose input changed, and a file
    finished but never recorded are redone; the rest is kept."""
    model, marks, env, reference = setup
    out = tmp_path / "out"
    argv = ["quantize", model, "-o", out, "--scheme", "nvfp4", "--dask", "--jobs", "1"]
    (marks / f"hold-{SHARDS[3]}").touch()
    proc = _start(argv, env)
    try:
        _wait(lambda: _recorded(out) == set(SHARDS[:3]), proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    (marks / f"hold-{SHARDS[3]}").unlink()
    parts = run_folder(out) / "parts"
    corrupt = bytearray((parts / SHARDS[0]).read_bytes())
    corrupt[-1] ^= 1
    (parts / SHARDS[0]).write_bytes(bytes(corrupt))
    os.utime(model / SHARDS[1], ns=(1, 1))  # its input changed (as far as anyone can tell)
    manifest = json.loads((run_folder(out) / "manifest.json").read_text())
    del manifest["parts"][SHARDS[2]]  # finished, never recorded
    (run_folder(out) / "manifest.json").write_text(json.dumps(manifest))
    for p in marks.glob("start-*"):
        p.unlink()
    done = _command([*argv, "--resume"], env)
    assert done.returncode == 0, done.stderr
    assert _files(out) == _files(reference)
    assert [bool(_marks(marks, "start", n)) for n in SHARDS] == [True, True, True, True]
    # and a manifest that is not one: everything redone, the same bytes
    out2 = tmp_path / "out2"
    run_folder(out2).mkdir()
    (run_folder(out2) / "manifest.json").write_text("{not json")
    done = _command(["quantize", model, "-o", out2, "--scheme", "nvfp4", "--dask", "--resume"],
                    env)
    assert done.returncode == 0, done.stderr
    assert _files(out2) == _files(reference)


# -- refusals ------------------------------------------------------------------------------------
def test_an_unreachable_scheduler_is_one_line_and_writes_nothing(setup, tmp_path):
    model, _, env, _ = setup
    silent = socket.socket()  # accepts connections and never says a word
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    port = silent.getsockname()[1]
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    closed = free.getsockname()[1]
    free.close()
    try:
        for address in (f"tcp://127.0.0.1:{port}", f"127.0.0.1:{closed}"):
            t0 = time.monotonic()
            done = _command(["quantize", model, "-o", tmp_path / "out", "--scheme", "nvfp4",
                             "--scheduler", address, "--scheduler-timeout", "2"], env)
            assert time.monotonic() - t0 < 30
            _one_error(done, "--scheduler: no dask scheduler answered", "within 2 s")
    finally:
        silent.close()
    done = _command(["quantize", model, "-o", tmp_path / "out", "--scheme", "nvfp4",
                     "--scheduler", "no address"], env)
    _one_error(done, "is not a scheduler address")
    assert sorted(os.listdir(tmp_path)) == ["marks", "model", "reference", "shim"]


@pytest.mark.parametrize("extra, words", [
    (["--resume"], "--resume: goes with a run on a dask cluster"),
    (["--scheduler-timeout", "3"], "--scheduler-timeout: goes with a run on a dask cluster"),
    (["--scheduler", "tcp://127.0.0.1:1", "--dask"], "give one of them"),
    (["--scheduler", "tcp://127.0.0.1:1", "--jobs", "2"], "--jobs: the cluster's workers"),
    (["--scheduler", "tcp://127.0.0.1:1", "--threads", "2"], "--threads: the cluster's workers"),
    (["--dask", "--format", "mlx"], "not mlx"),
    (["--dask", "--scheduler-timeout", "0"], "positive number of seconds"),
])
def test_options_that_do_not_go_together(setup, tmp_path, extra, words):
    model, _, env, _ = setup
    done = _command(["quantize", model, "-o", tmp_path / "out", "--scheme", "nvfp4", *extra], env)
    _one_error(done, words)
    assert not (tmp_path / "out").exists() and not run_folder(tmp_path / "out").exists()


def test_a_file_output_and_a_left_run_folder_are_refused(setup, tmp_path):
    model, _, env, _ = setup
    done = _command(["quantize", model / SHARDS[0], "-o", tmp_path / "x.safetensors",
                     "--scheme", "nvfp4", "--dask"], env)
    _one_error(done, "into an output folder")
    run_folder(tmp_path / "out").mkdir()
    done = _command(["quantize", model, "-o", tmp_path / "out", "--scheme", "nvfp4", "--dask"],
                    env)
    _one_error(done, "an interrupted run's files are kept in", "--resume")


def test_a_file_its_input_makes_impossible_ends_the_run_and_its_folder(setup, tmp_path):
    import numpy as np
    from safetensors.numpy import load_file, save_file

    model, _, env, _ = setup
    tensors = load_file(str(model / SHARDS[2]))
    name = next(n for n, a in tensors.items() if a.ndim == 2 and a.dtype == np.float16)
    tensors[name][3, 5] = np.nan
    save_file(tensors, str(model / SHARDS[2]), metadata={"format": "pt"})
    done = _command(["quantize", model, "-o", tmp_path / "out", "--scheme", "nvfp4", "--dask",
                     "--jobs", "2"], env)
    _one_error(done, SHARDS[2], "non-finite")
    assert not (tmp_path / "out").exists() and not run_folder(tmp_path / "out").exists()


# -- the manifest, without a cluster -------------------------------------------------------------
def test_run_folder_names_stay_within_the_file_name_limit(tmp_path):
    out = tmp_path / ("é" * 126)  # 252 bytes, a legal name
    name = run_folder(out).name
    assert len(os.fsencode(name)) <= 255 and name.startswith(".") \
        and name.endswith(".blockquant-run")
    assert run_folder(tmp_path / "out").name == ".out.blockquant-run"


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format": "blockquant-run", "version": 2}',
                                  '{"format": "other", "version": 1, "parts": {}}',
                                  '{"format": "blockquant-run", "version": 1, '
                                  '"blockquant": "0.0.0", "parts": {}}'])
def test_a_manifest_that_is_not_this_versions_records_nothing(tmp_path, text):
    from blockquant.checkpoint.manifest import Manifest, file_digest

    run = tmp_path / "run"
    (run / "parts").mkdir(parents=True)
    (run / "parts" / "a.safetensors").write_bytes(b"x" * 10)
    good = Manifest(run)
    good.record("a.safetensors", "key", *file_digest(run / "parts" / "a.safetensors"))
    assert Manifest.read(run).finished(run / "parts", {"a.safetensors": "key"}) == \
        {"a.safetensors"}
    assert Manifest.read(run).finished(run / "parts", {"a.safetensors": "other"}) == set()
    (run / "manifest.json").write_text(text)
    assert Manifest.read(run).parts == {}
