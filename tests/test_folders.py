"""Model folders (issue 12): a Hugging Face-style folder in, a folder of the same shape out.

Shards keep their names, the index's weight_map names the new tensors, other files are copied
byte for byte, weights in other formats are left out and listed, the output appears whole or
not at all (errors, Ctrl-C, SIGTERM: tests/test_hostile_inputs.py), ``--jobs`` gives the same
bytes as one job with each job's own thread budget, and ``inspect``/``report``/``dequantize``
take folders too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import blockquant as bq
from blockquant.checkpoint import CheckpointError
from blockquant.checkpoint.jobs import Task, run_tasks
from blockquant.cli import main

INDEX = "model.safetensors.index.json"
OTHER_FILES = {
    "config.json": '{"model_type": "llama", "hidden_size": 64}',
    "tokenizer.json": '{"version": "1.0", "model": {"vocab": {"a": 0}}}',
    "generation_config.json": "{}",
    "1_Pooling/config.json": '{"pooling_mode_mean_tokens": true}',
}


def run(*argv):
    return main([str(a) for a in argv])


def one_error_line(capsys, *words):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blockquant: error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


def make_model(root: Path, n_shards: int = 3, seed: int = 0, rows: int = 32) -> dict:
    """A small llama-like model in ``n_shards`` shards with an index, a config, a tokenizer,
    a subfolder, PyTorch weights and a hidden cache folder. Returns name -> array."""
    rng = np.random.default_rng(seed)
    root.mkdir()
    shards: list[dict] = [{} for _ in range(n_shards)]
    shards[0]["model.embed_tokens.weight"] = rng.normal(0, 0.05, (rows, 64)).astype(np.float32)
    for i in range(n_shards):
        p = f"model.layers.{i}"
        shards[i][f"{p}.self_attn.q_proj.weight"] = rng.normal(0, 0.02, (64, 64)).astype(
            ml_dtypes.bfloat16)
        shards[i][f"{p}.mlp.up_proj.weight"] = rng.normal(0, 0.02, (rows, 64)).astype(np.float16)
        shards[i][f"{p}.input_layernorm.weight"] = np.ones(64, np.float32)
        shards[i][f"{p}.self_attn.q_proj.bias"] = rng.normal(0, 0.1, 64).astype(np.float32)
    shards[-1]["lm_head.weight"] = rng.normal(0, 0.05, (rows, 64)).astype(np.float32)
    shards[-1]["model.rotary.inv_freq"] = np.arange(8, dtype=np.int64)
    weight_map, total = {}, 0
    for k, tensors in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file(tensors, str(root / name), metadata={"format": "pt"})
        for t, arr in tensors.items():
            weight_map[t] = name
            total += arr.nbytes
    (root / INDEX).write_text(json.dumps({"metadata": {"total_size": total},
                                          "weight_map": weight_map}, indent=2))
    for rel, text in OTHER_FILES.items():
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_text(text)
    (root / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really")
    (root / ".cache").mkdir()
    (root / ".cache" / "lock").write_text("x")
    return {k: v for s in shards for k, v in s.items()}


@pytest.fixture
def model(tmp_path):
    tensors = make_model(tmp_path / "model")
    return tmp_path / "model", tensors


def read_index(folder):
    return json.loads((folder / INDEX).read_text())


def shard_names(folder):
    return sorted(p.name for p in folder.glob("*.safetensors"))


# -- quantize a folder ---------------------------------------------------------------------------
def test_sharded_folder_keeps_its_shape(tmp_path, model, capsys):
    src, tensors = model
    out = tmp_path / "out"
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4") == 0
    summary = capsys.readouterr().out
    # same shards, same other files (byte for byte), no PyTorch weights, nothing hidden
    assert shard_names(out) == shard_names(src)
    assert sorted(listing(out)) == sorted(
        [*shard_names(src), INDEX, *OTHER_FILES, "1_Pooling"])
    for rel, text in OTHER_FILES.items():
        assert (out / rel).read_text() == text
    assert "left out 1 weight file in other formats (pytorch_model.bin)" in summary
    assert "3 checkpoint files, 4 other files copied" in summary
    # 2-D float tensors quantized; norms, biases (1-D) and ints kept, and the summary says so
    two_d = sorted(n for n, a in tensors.items() if a.ndim == 2)
    assert f"{len(two_d)} of {len(tensors)} tensors quantized with e2m1" in summary
    assert "left 7 tensors unquantized: 6 of rank below 2" in summary and "1 not floating" in summary
    # the index maps every tensor the shards hold to its shard, and the sizes add up
    index = read_index(out)
    held = {}
    for shard in shard_names(out):
        for name in load_file(out / shard):
            held[name] = shard
    assert index["weight_map"] == held
    assert list(index["weight_map"]) == sorted(held, key=lambda n: [
        int(p) if p.isdigit() else p for p in __import__("re").split(r"(\d+)", n)])
    sizes = sum(a.nbytes for s in shard_names(out) for a in load_file(out / s).values())
    assert index["metadata"]["total_size"] == sizes
    for name in two_d:
        assert f"{name}.values" in held and f"{name}.scales" in held
        assert held[f"{name}.values"] == read_index(src)["weight_map"][name]
        got = bq.load(out / held[f"{name}.values"])[name]
        assert got.to_bytes() == bq.quantize(tensors[name], "nvfp4").to_bytes()
    for name in set(tensors) - set(two_d):
        np.testing.assert_array_equal(load_file(out / held[name])[name], tensors[name])


def test_folder_with_one_model_safetensors(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    save_file({"w": np.ones((8, 32), np.float32)}, str(src / "model.safetensors"))
    (src / "config.json").write_text("{}")
    assert run("quantize", src, "-o", tmp_path / "q", "--scheme", "int8", "-q") == 0
    assert listing(tmp_path / "q") == ["config.json", "model.safetensors"]
    assert run("dequantize", tmp_path / "q", "-o", tmp_path / "d", "-q") == 0
    np.testing.assert_array_equal(load_file(tmp_path / "d" / "model.safetensors")["w"], 1.0)


def test_dequantize_a_folder_back(tmp_path, model):
    src, tensors = model
    q, d = tmp_path / "q", tmp_path / "d"
    assert run("quantize", src, "-o", q, "--scheme", "int8_block32", "-q") == 0
    assert run("dequantize", q, "-o", d, "-q") == 0
    assert read_index(d)["weight_map"] == read_index(src)["weight_map"]
    assert read_index(d)["metadata"]["total_size"] == read_index(src)["metadata"]["total_size"]
    for shard in shard_names(src):
        back = load_file(d / shard)
        assert set(back) == set(load_file(src / shard))
        for name, x in back.items():
            want = tensors[name]
            if want.ndim == 2:
                want = bq.quantize(want, "int8_block32").dequantize(want.dtype)
            assert x.dtype == want.dtype
            np.testing.assert_array_equal(x, want)
    for rel, text in OTHER_FILES.items():
        assert (d / rel).read_text() == text


def test_dequantize_a_shard_with_nothing_quantized(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    save_file({"a": np.ones((4, 32), np.float32)}, str(src / "model-00001-of-00002.safetensors"))
    save_file({"n": np.ones(4, np.float32)}, str(src / "model-00002-of-00002.safetensors"),
              metadata={"keep": "me"})
    assert run("quantize", src, "-o", tmp_path / "q", "--scheme", "int8", "-q") == 0
    assert run("dequantize", tmp_path / "q", "-o", tmp_path / "d", "-q") == 0
    meta = bq.checkpoint.open_checkpoint(tmp_path / "d" / "model-00002-of-00002.safetensors")
    with meta:
        assert meta.metadata == {"keep": "me"}  # the blockquant key is gone


def test_symlinked_files_as_in_the_hub_cache(tmp_path, model):
    src, _ = model
    snap = tmp_path / "snapshot"
    snap.mkdir()
    for p in src.iterdir():
        if p.is_file():
            os.symlink(p, snap / p.name)
    assert run("quantize", snap, "-o", tmp_path / "q", "--scheme", "int8", "-q") == 0
    assert all(not p.is_symlink() for p in (tmp_path / "q").iterdir())
    assert shard_names(tmp_path / "q") == shard_names(src)


# -- jobs ---------------------------------------------------------------------------------------
def test_jobs_give_the_same_bytes(tmp_path, model):
    src, _ = model
    for jobs in ("1", "3"):
        assert run("quantize", src, "-o", tmp_path / f"j{jobs}", "--scheme", "nvfp4", "-q",
                   "--jobs", jobs) == 0
    for rel in listing(tmp_path / "j1"):
        a, b = tmp_path / "j1" / rel, tmp_path / "j3" / rel
        assert a.is_dir() == b.is_dir()
        if a.is_file():
            assert a.read_bytes() == b.read_bytes(), rel
    assert run("dequantize", tmp_path / "j3", "-o", tmp_path / "d3", "-q", "--jobs", "2") == 0
    assert run("dequantize", tmp_path / "j1", "-o", tmp_path / "d1", "-q") == 0
    for shard in shard_names(src):
        assert (tmp_path / "d1" / shard).read_bytes() == (tmp_path / "d3" / shard).read_bytes()


def _threads_now(progress=None):
    return bq.get_num_threads()


@pytest.mark.parametrize("jobs, threads, each", [(2, 5, 2), (3, 2, 1)])
def test_each_job_gets_its_share_of_the_threads(jobs, threads, each):
    tasks = [Task(i, _threads_now, ()) for i in range(jobs)]
    assert run_tasks(tasks, jobs, threads, lambda *a: None) == [each] * jobs


def test_one_job_borrows_the_thread_bound_and_gives_it_back():
    before = bq.get_num_threads()
    assert run_tasks([Task(0, _threads_now, ())], 1, 1, lambda *a: None) == [1]
    assert bq.get_num_threads() == before


def test_a_failing_shard_stops_every_job_and_leaves_nothing(tmp_path, model, capsys):
    src, _ = model
    bad = np.ones((4, 32), np.float32)
    bad[1, 2] = np.nan
    last = src / "model-00003-of-00003.safetensors"
    tensors = load_file(last)
    tensors["zz.weight"] = bad
    save_file(tensors, str(last))
    before = listing(tmp_path)
    for jobs in ("1", "2"):
        assert run("quantize", src, "-o", tmp_path / "out", "--scheme", "int8", "--jobs",
                   jobs) == 2
        one_error_line(capsys, f"{last}: zz.weight:", "non-finite")
        assert listing(tmp_path) == before


def test_an_interrupted_run_leaves_no_half_folder(tmp_path, model):
    src, _ = model
    seen = []

    def interrupt(file, name, nbytes):
        seen.append(name)
        if len(seen) == 5:
            raise KeyboardInterrupt

    before = listing(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        bq.quantize_file(src, tmp_path / "out", "int8", progress=interrupt)
    assert listing(tmp_path) == before


def test_peak_memory_is_bounded_by_the_largest_tensor(tmp_path):
    """16 tensors of 8 MiB in 2 shards (128 MiB): quantizing holds about one at a time."""
    src = tmp_path / "big"
    src.mkdir()
    rng = np.random.default_rng(0)
    for k in range(2):
        save_file({f"l{k}.{i}": rng.standard_normal((1024, 2048), np.float32) for i in range(8)},
                  str(src / f"model-0000{k + 1}-of-00002.safetensors"))
    code = textwrap.dedent(f"""
        import resource, sys, blockquant as bq
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        bq.quantize_file({str(src)!r}, {str(tmp_path / "q")!r}, "int8_block32")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((peak - base) * 1024)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    grew = int(res.stdout)
    assert grew < 48 << 20, f"peak grew by {grew / 2**20:.1f} MiB for 8 MiB tensors"


# -- where the output goes -----------------------------------------------------------------------
def test_existing_output_folder_needs_force(tmp_path, model, capsys):
    src, _ = model
    out = tmp_path / "out"
    assert run("quantize", src, "-o", out, "--scheme", "int8", "-q") == 0
    (out / "stale.txt").write_text("old run")
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4") == 2
    one_error_line(capsys, str(out), "already exists (--force replaces it)")
    assert (out / "stale.txt").exists()
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4", "-q", "--force") == 0
    assert not (out / "stale.txt").exists()  # replaced as a whole
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_force_never_replaces_a_folder_that_is_not_a_model(tmp_path, model, capsys):
    src, _ = model
    precious = tmp_path / "docs"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    assert run("quantize", src, "-o", precious, "--scheme", "int8", "--force") == 2
    one_error_line(capsys, "holding no checkpoint", "remove it yourself")
    assert (precious / "thesis.tex").read_text() == "years of work"


@pytest.mark.parametrize("where", ["same", "inside", "holds_input", "file"])
def test_outputs_that_would_touch_the_input(tmp_path, model, capsys, where):
    src, _ = model
    out = {"same": src, "inside": src / "q", "holds_input": tmp_path,
           "file": tmp_path / "f.safetensors"}[where]
    if where == "file":
        out.write_bytes(b"x")
    before = listing(tmp_path)
    assert run("quantize", src, "-o", out, "--scheme", "int8", "--force") == 2
    one_error_line(capsys, str(out))
    assert listing(tmp_path) == before


@pytest.mark.parametrize("problem, words", [
    ({"weight_map": {"w": "../elsewhere.safetensors"}}, "not a .safetensors file beside"),
    ({"weight_map": {"w": "/etc/passwd"}}, "not a .safetensors file beside"),
    ({"weight_map": {"w": "model-00009-of-00009.safetensors"}}, "not a .safetensors file"),
    ({"weight_map": {"nope": "model-00001-of-00003.safetensors"}}, "nope: weight_map says"),
    ({"weight_map": ["w"]}, "no weight_map object"),
    ({"metadata": {}}, "no weight_map object"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("{not json", "malformed index"),
])
def test_index_problems(tmp_path, model, capsys, problem, words):
    src, _ = model
    (src / INDEX).write_text(problem if isinstance(problem, str) else json.dumps(problem))
    before = listing(tmp_path)
    for argv in [("quantize", src, "-o", tmp_path / "out", "--scheme", "int8"),
                 ("quantize", src, "-o", tmp_path / "out", "--scheme", "int8", "--dry-run"),
                 ("inspect", src), ("report", src, "--scheme", "int8")]:
        assert run(*argv) == 2, argv
        one_error_line(capsys, INDEX, words)
        assert listing(tmp_path) == before


def test_a_folder_without_checkpoints(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert run("inspect", tmp_path / "empty") == 2
    one_error_line(capsys, "holds no .safetensors file")


# -- inspect, report, dry run ------------------------------------------------------------------
def test_inspect_a_folder(tmp_path, model, capsys):
    src, tensors = model
    assert run("quantize", src, "-o", tmp_path / "q", "--scheme", "mxfp4", "-q") == 0
    assert run("inspect", tmp_path / "q") == 0
    out = capsys.readouterr().out
    n_q = sum(a.ndim == 2 for a in tensors.values())
    assert f"folder of 3 checkpoint files, {len(tensors)} tensors ({n_q} quantized)" in out
    assert run("inspect", tmp_path / "q", "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "folder" and len(info["files"]) == 3
    assert {r["name"] for r in info["tensors"]} == set(tensors)
    rows = {r["name"]: r for r in info["tensors"]}
    assert rows["lm_head.weight"]["file"] == "model-00003-of-00003.safetensors"
    assert info["metadata"] == {"format": "pt"}  # what every shard shares, less blockquant's
    assert info["file_bytes"] == sum(os.path.getsize(p) for p in (tmp_path / "q").glob("*.safetensors"))


def test_report_a_folder_sums_its_files(model, capsys):
    src, tensors = model
    reps = []
    for jobs in ("1", "2"):
        assert run("report", src, "--scheme", "nvfp4", "--json", "--jobs", jobs) == 0
        reps.append(json.loads(capsys.readouterr().out))
    assert reps[0]["tensors"] == [dict(r, seconds=r0["seconds"]) for r, r0 in
                                  zip(reps[1]["tensors"], reps[0]["tensors"])]
    rep = reps[0]
    stats = bq.metrics.ErrorStats()
    for x in tensors.values():
        if x.ndim == 2:
            stats += bq.metrics.ErrorStats.between(x, bq.quantize(x, "nvfp4").dequantize())
    assert rep["overall"]["numel"] == stats.numel
    assert rep["overall"]["sqnr_db"] == pytest.approx(stats.sqnr_db, rel=1e-9)
    assert rep["file_total"]["tensors"] == len(tensors)
    assert {k["why"] for k in rep["kept"]} == {"rank", "dtype"}


def test_dry_run_lists_every_tensor_and_writes_nothing(tmp_path, model, capsys):
    src, tensors = model
    before = listing(tmp_path)
    assert run("quantize", src, "-o", tmp_path / "out", "--scheme", "nvfp4", "--dry-run",
               "--rule", "embed_tokens=int8", "--rule", "lm_head=keep") == 0
    out = capsys.readouterr().out
    assert listing(tmp_path) == before
    assert "dry run, nothing written" in out
    for name in tensors:
        assert f"| {name} " in out
    assert "| model-00001-of-00003.safetensors | model.embed_tokens.weight" in out
    assert "q8s/native/tensor:f32" in out and "keep: --rule lm_head=keep" in out
    assert "keep: rank 1, below --min-rank 2" in out
    assert "would be quantized" in out


def _blocked_now(progress):
    """In a worker: the signals its thread has blocked (SIGINT, SIGTERM must be free again)."""
    import signal

    return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_sigmask"), reason="POSIX only")
def test_a_signal_while_the_pool_starts_waits_for_the_pool(monkeypatch):
    """A SIGINT sent to the process (from another thread, as a kernel may deliver it) while
    the workers start is only noted, then raised once the pool is held, so the pool is ended
    by its `finally` and no worker is left half-started; workers end with SIGINT and SIGTERM
    unblocked, and the parent's mask and handlers are as before."""
    import signal
    import threading

    from blockquant.checkpoint import jobs

    real = jobs._start_workers
    noted = []

    def start_with_a_signal(ctx, n, threads, workers):
        class Ctx:
            Pipe = ctx.Pipe

            def Process(self, *a, **kw):  # noqa: N802 (multiprocessing's name)
                process = ctx.Process(*a, **kw)
                start = process.start

                def start_with_a_signal_inside():  # the window the noting covers
                    t = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT))
                    t.start()
                    t.join()
                    del process.start  # the process object is pickled for the child
                    start()

                process.start = start_with_a_signal_inside
                return process

        caught = real(Ctx(), n, threads, workers)
        noted.append((caught, len(workers)))  # reached only if nothing was raised inside
        return caught

    def workers_alive():  # this process's worker children, zombies (not yet joined) included
        found = set()
        for pid in _children(os.getpid()):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if zombie or b"spawn_main" in f.read():
                        found.add(pid)
            except OSError:
                pass
        return found

    has_proc = os.path.exists("/proc/self/stat")
    before = workers_alive() if has_proc else set()
    handler = signal.getsignal(signal.SIGINT)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    monkeypatch.setattr(jobs, "_start_workers", start_with_a_signal)
    with pytest.raises(KeyboardInterrupt):
        run_tasks([Task(0, _threads_now, ()), Task(1, _threads_now, ())], 2, 2, lambda *a: None)
    [(caught, started)] = noted
    assert caught and set(caught) == {signal.SIGINT}  # noted, however many were merged
    assert started == 2
    if has_proc:  # ended and joined by run_tasks' `finally`, the interrupt notwithstanding
        assert workers_alive() - before == set()
    assert signal.getsignal(signal.SIGINT) is handler
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    monkeypatch.undo()
    blocked = run_tasks([Task(0, _blocked_now, ()), Task(1, _blocked_now, ())], 2, 2,
                        lambda *a: None)
    for b in blocked:
        assert int(signal.SIGINT) not in b and int(signal.SIGTERM) not in b


# -- workers that die, and signals to the whole process group ------------------------------------
_JOBS_SCRIPT = textwrap.dedent('''
    import os, signal, sys, time
    from blockquant.checkpoint.jobs import Task, run_tasks

    def fast(progress):
        return 1

    def slow(marker, progress):
        time.sleep(0.2)  # at work a while, its "started" message long sent
        with open(marker + str(os.getpid()), "w") as f:
            f.write(str(os.getpgid(0)))
        time.sleep(60)
        return 2

    def slow_then_done(marker, progress):
        time.sleep(0.2)
        open(marker + str(os.getpid()), "w").close()
        while not os.path.exists(marker + "go"):
            time.sleep(0.05)
        return 3

    def after(seconds, value, progress):
        time.sleep(seconds)
        return value

    def on_term(signum, frame):
        raise KeyboardInterrupt

    if __name__ == "__main__":
        signal.signal(signal.SIGTERM, on_term)
        marker, kind = sys.argv[1], sys.argv[2]
        tasks = {"idle": [Task(0, fast, ()), Task(1, slow, (marker,))],
                 "killed": [Task("a.safetensors", slow, (marker + "a-",)),
                            Task("b.safetensors", slow, (marker + "b-",))],
                 "orphans": [Task(0, slow, (marker,)), Task(1, slow, (marker,))],
                 "idle-killed": [Task(0, fast, ()), Task(1, slow_then_done, (marker,))],
                 "nohup": [Task(0, slow_then_done, (marker,)),
                           Task(1, slow_then_done, (marker,))]}[kind]
        if kind == "nohup":
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            print(run_tasks(tasks, 2, 2, lambda *a: None), flush=True)
        except KeyboardInterrupt:
            print("ended by a signal", flush=True)
            sys.exit(3)
        except Exception as e:
            print(f"{type(e).__name__}: {e}", flush=True)
            sys.exit(4)
''')


def _start_jobs(tmp_path, kind):
    script = tmp_path / "jobs_script.py"
    script.write_text(_JOBS_SCRIPT)
    marker = str(tmp_path / "started-")
    proc = subprocess.Popen([sys.executable, str(script), marker, kind], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, marker


def _wait_for_workers(tmp_path, count, proc):
    import time

    for _ in range(600):
        pids = [int(p.name.split("-")[-1]) for p in tmp_path.glob("started-*")]
        if len(pids) >= count:
            return pids
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the workers did not start")


def _children(pid):
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except OSError:  # not a process, or one that has just ended
            pass
    return found


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie no one reaped yet
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not hasattr(os, "killpg") or not os.path.exists("/proc/self/stat"),
                    reason="POSIX process groups, Linux /proc")
def test_a_sigterm_to_the_process_group_ends_the_run(tmp_path):
    """A SIGTERM to the whole group (kill -TERM -PGID) while one worker is idle: under
    multiprocessing's Pool, the idle one waited for a task holding the task queue's lock, and
    killed there it hung the parent's Pool.terminate() forever. The run ends as the signal says."""
    import signal
    import time

    proc, _ = _start_jobs(tmp_path, "idle")
    try:
        _wait_for_workers(tmp_path, 1, proc)
        time.sleep(0.5)  # the fast task is done: its worker waits for another
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3 and "ended by a signal" in out, (proc.returncode, out, err)
    assert "Traceback" not in err, err


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc")
def test_a_worker_killed_under_the_parent_fails_the_run(tmp_path):
    """A busy worker killed outright (the out-of-memory killer's way) used to leave its task
    waited for forever: the run now fails, naming the task's file."""
    import signal

    proc, _ = _start_jobs(tmp_path, "killed")
    try:
        _wait_for_workers(tmp_path, 2, proc)
        victim = next(tmp_path.glob("started-a-*"))
        os.kill(int(victim.name.split("-")[-1]), signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 4, (proc.returncode, out, err)
    assert out == ("CheckpointError: a.safetensors: its worker process was killed by SIGKILL "
                   "(out of memory?) before it was done\n"), out


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc")
def test_workers_end_when_the_parent_is_killed_outright(tmp_path):
    """A worker at work when its parent is killed by SIGKILL exits rather than finish a file no
    one will keep; the workers are in the command's process group, so that job control (Ctrl-Z,
    fg) and a signal to the group reach them as they reach the command."""
    import time

    proc, _ = _start_jobs(tmp_path, "orphans")
    try:
        pids = _wait_for_workers(tmp_path, 2, proc)
        for p in tmp_path.glob("started-*"):
            assert p.read_text() == str(proc.pid), "a worker is out of the command's group"
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(p) for p in pids), pids
    finally:
        proc.kill()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc")
def test_an_idle_worker_killed_loses_nothing(tmp_path):
    """A worker killed between tasks (it held multiprocessing's task-queue lock there, and the
    run hung) has no task to lose: the others finish the run."""
    import signal
    import time

    proc, marker = _start_jobs(tmp_path, "idle-killed")
    try:
        busy = _wait_for_workers(tmp_path, 1, proc)[0]
        time.sleep(1.0)  # the fast task is done: its worker waits for another
        idle = [pid for pid in _children(proc.pid) if pid != busy and
                b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read()]
        assert len(idle) == 1, idle
        os.kill(idle[0], signal.SIGKILL)
        open(marker + "go", "w").close()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "[1, 3]\n", (proc.returncode, out, err)


def _die_the_first_time(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(9)
    return marker


class _DiesOnceWhenUnpickled:
    """Ends the first worker that unpickles it, before that worker can take its task: as a
    worker killed between tasks, its next one already sent to it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (_die_the_first_time, (self.marker,))


def test_a_worker_dying_between_tasks_hands_its_next_one_on(tmp_path):
    """A worker dies after it was sent its next task and before it took it: the task goes to
    the other worker. It was blamed for a file it never started."""
    marker = str(tmp_path / "died")
    tasks = [Task("a", _takes, (_DiesOnceWhenUnpickled(marker),)), Task("b", _threads_now, ())]
    assert run_tasks(tasks, 2, 2, lambda *a: None) == [1, 1]
    assert os.path.exists(marker)  # a worker did die of it


class _NotRebuilt(Exception):
    """Pickles (args are what it was given), but its __init__ wants two arguments: unpickled
    from its one, it fails."""

    def __init__(self, path, why):
        super().__init__(f"{path}: {why}")


def _raise_not_rebuilt(progress):
    raise _NotRebuilt("x.bin", "the real reason")


def _raise_unpicklable(progress):
    import threading

    e = ValueError("the real reason too")
    e.lock = threading.Lock()
    raise e


def _unpicklable_result(progress):
    import threading

    return threading.Lock()


@pytest.mark.parametrize("fn, message", [
    (_raise_not_rebuilt, "b.safetensors: _NotRebuilt: x.bin: the real reason"),
    (_raise_unpicklable, "b.safetensors: ValueError: the real reason too"),
    (_unpicklable_result, "b.safetensors: its result could not be sent back from the worker "
                          "process"),
])
def test_a_worker_error_or_result_that_cannot_travel_names_the_file(fn, message):
    """An exception or a result that does not survive pickling between the processes: the
    run fails with a CheckpointError naming the file and keeping the error's type and text,
    not with the pickling error (no file named) or the parent's TypeError traceback."""
    tasks = [Task("a.safetensors", _threads_now, ()), Task("b.safetensors", fn, ())]
    with pytest.raises(CheckpointError) as e:
        run_tasks(tasks, 2, 2, lambda *a: None)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.skipif(not hasattr(os, "killpg") or not hasattr(__import__("signal"), "SIGHUP"),
                    reason="POSIX process groups")
def test_a_hangup_to_the_group_under_nohup_finishes_the_run(tmp_path):
    """SIGHUP ignored (nohup), then sent to the whole group: the workers must keep the ignore.
    The parent's start-up handler replaced it for a moment, exec reset that to the default in
    each worker, and a hangup killed them."""
    import signal

    proc, marker = _start_jobs(tmp_path, "nohup")
    try:
        _wait_for_workers(tmp_path, 2, proc)
        os.killpg(proc.pid, signal.SIGHUP)
        time.sleep(0.5)
        open(marker + "go", "w").close()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "[3, 3]\n", (proc.returncode, out, err)


def _raise_disk_full(progress):
    raise OSError(28, "No space left on device", "out/b.safetensors")


def _takes(thing, progress):
    return 1


def _progress_once(progress):
    progress("t", 1)
    return 1


def test_a_worker_oserror_and_a_progress_error_come_up_as_they_are():
    """An OSError from a task (a full disk) or from the progress callback (stderr's reader
    gone) is raised as is, at once, as with one job: it was taken for the worker's pipe
    closing, waited on for 5 s and reported as a dead worker."""
    tasks = [Task("a.safetensors", _threads_now, ()), Task("b.safetensors", _raise_disk_full, ())]
    t0 = time.monotonic()
    with pytest.raises(OSError) as e:
        run_tasks(tasks, 2, 2, lambda *a: None)
    assert e.value.errno == 28 and e.value.filename == "out/b.safetensors"

    def broken(*a):
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        run_tasks([Task(0, _progress_once, ()), Task(1, _progress_once, ())], 2, 2, broken)
    # Each run took 5 s or more before (a wait on a worker taken for dead); the type checks
    # above already fail then: this bound only keeps that wait from coming back unnoticed.
    assert time.monotonic() - t0 < 9  # both runs, the workers' start included


def test_a_task_a_worker_cannot_unpickle_names_the_file(capfd):
    """A task whose arguments a worker cannot unpickle (a class it cannot import): one error
    naming the file; it killed each worker in turn, with a traceback each."""
    import types

    module = types.ModuleType("_only_in_this_process")
    exec("class Thing:\n    pass\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        tasks = [Task("a.safetensors", _threads_now, ()),
                 Task("b.safetensors", _takes, (module.Thing(),))]
        with pytest.raises(CheckpointError, match=r"^b\.safetensors: its worker process could "
                           r"not take the task \(ModuleNotFoundError"):
            run_tasks(tasks, 2, 2, lambda *a: None)
    finally:
        del sys.modules[module.__name__]
    assert "Traceback" not in capfd.readouterr().err


class _ExitsWhenUnpickled:
    def __reduce__(self):
        return (os._exit, (7,))


def test_a_task_that_kills_each_worker_taking_it_fails_naming_the_file():
    """A task whose unpickling ends the worker (as running out of memory on its arguments
    would): handed on once, as any task whose worker died before taking it, then failed on the
    second death, rather than killing every worker in turn."""
    tasks = [Task("a.safetensors", _threads_now, ()),
             Task("b.safetensors", _takes, (_ExitsWhenUnpickled(),))]
    with pytest.raises(CheckpointError, match=r"^b\.safetensors: its worker process exited "
                       r"with status 7 before it was done$"):
        run_tasks(tasks, 2, 2, lambda *a: None)


def test_workers_that_cannot_start_fail_the_run_saying_so(tmp_path):
    """Every worker dies at start-up (here the main module, which spawned workers import, fails
    there): one line saying they ended before taking the file, not a hang."""
    script = tmp_path / "no_start.py"
    script.write_text(textwrap.dedent('''
        import sys
        if __name__ != "__main__":  # a spawned worker importing this module
            raise ImportError("not here")
        from blockquant.checkpoint.jobs import Task, run_tasks

        def fast(progress):
            return 1

        try:
            run_tasks([Task("f1", fast, ()), Task("f2", fast, ())], 2, 2, lambda *a: None)
        except Exception as e:
            print(f"{type(e).__name__}: {e}")
    '''))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.stdout.startswith("CheckpointError: f") and "every worker process ended before " \
        "it could take this file" in res.stdout, (res.stdout, res.stderr)


def test_a_bad_thread_variable_is_one_warning_line_not_one_per_worker(tmp_path, model):
    src, _ = model
    env = {**os.environ, "BLOCKQUANT_NUM_THREADS": "abc"}
    proc = subprocess.run([sys.executable, "-m", "blockquant", "quantize", str(src), "-o",
                           str(tmp_path / "q"), "--scheme", "int8", "-q", "--jobs", "2"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "BLOCKQUANT_NUM_THREADS='abc'" in lines[0], proc.stderr
    assert "RuntimeWarning" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes and devices")
@pytest.mark.parametrize("what", ["device link", "pipe index", "pipe other"])
def test_a_special_file_in_a_folder_is_refused_before_it_is_read(tmp_path, model, capsys, what):
    src, _ = model
    if what == "device link":  # copying it would fill the disk
        (src / "tokenizer.json").unlink(missing_ok=True)
        os.symlink("/dev/zero", src / "tokenizer.json")
        bad = src / "tokenizer.json"
    elif what == "pipe index":  # reading it would wait for a writer
        bad = src / INDEX
        bad.unlink()
        os.mkfifo(bad)
    else:
        bad = src / "notes.txt"
        os.mkfifo(bad)
    reads = [["quantize", src, "-o", tmp_path / "q", "--scheme", "int8"]]
    if what == "pipe index":  # inspect and report read the index, not the other files
        reads += [["inspect", src], ["report", src, "--scheme", "int8"]]
    else:
        assert run("inspect", src) == 0
        capsys.readouterr()
    for argv in reads:
        assert run(*argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{bad}: is not a regular file" in err, err
    assert not (tmp_path / "q").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".q")]


@pytest.mark.parametrize("where", ["metadata", "tensor name", "shard name"])
def test_an_index_with_a_lone_surrogate_is_refused_before_anything_is_converted(
        tmp_path, model, capsys, where):
    src, _ = model
    index = json.loads((src / INDEX).read_text())
    if where == "metadata":
        raw = json.dumps(index)[:-1] + ', "note": "\\udcff"}'
    elif where == "tensor name":
        name, shard = next(iter(index["weight_map"].items()))
        raw = json.dumps(index).replace(json.dumps(name), json.dumps(name)[:-1] + '\\udcff"', 1)
    else:
        shard = next(iter(index["weight_map"].values()))
        os.rename(src / shard, src / os.fsdecode(os.fsencode(shard).replace(b"-", b"\xff", 1)))
        raw = json.dumps(index).replace(shard, shard.replace("-", "\\udcff", 1))
    (src / INDEX).write_text(raw)
    import blockquant.checkpoint.folders as folders

    started = []  # the output folder is made once the plan, which reads the index, is done

    class Target(folders.FolderTarget):
        def __init__(self, *a, **k):
            started.append(a)
            super().__init__(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(folders, "FolderTarget", Target)
        with pytest.raises(CheckpointError, match=r"malformed index: .*\\udcff.* is not valid Unicode"):
            bq.quantize_file(src, tmp_path / "q", "int8")
        assert started == [] and not (tmp_path / "q").exists()
        if where == "metadata":  # the hook sees a run that gets that far
            (src / INDEX).write_text(json.dumps(index))
            bq.quantize_file(src, tmp_path / "ok", "int8")
            assert len(started) == 1
            (src / INDEX).write_text(raw)
    assert run("quantize", src, "-o", tmp_path / "q", "--scheme", "int8") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid Unicode" in err and "UnicodeEncodeError" not in err


def test_a_tensor_in_two_shards_is_refused_by_every_command(tmp_path, model, capsys):
    src, _ = model
    shards = shard_names(src)
    first = load_file(src / shards[0])
    name = sorted(first)[0]
    second = load_file(src / shards[1])
    second[name] = first[name]  # the index still maps it to the first shard only
    save_file(second, str(src / shards[1]))
    for argv in (["quantize", src, "-o", tmp_path / "q", "--scheme", "int8"], ["inspect", src],
                 ["report", src, "--scheme", "int8"]):
        assert run(*argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{name}: is in '{shards[0]}' too, another shard of " \
            f"'{INDEX}'" in err, err
    with pytest.raises(CheckpointError, match="is in another file of the folder too"):
        bq.load(src)
    assert not (tmp_path / "q").exists()


def test_checkpoints_no_index_names_may_share_tensor_names(tmp_path):
    # diffusers: a model and its fp16 variant side by side, each whole, no index
    unet = tmp_path / "diff" / "unet"
    unet.mkdir(parents=True)
    w = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    save_file({"w": w}, str(unet / "diffusion_pytorch_model.safetensors"))
    save_file({"w": w.astype(np.float16)}, str(unet / "diffusion_pytorch_model.fp16.safetensors"))
    assert run("quantize", tmp_path / "diff", "-o", tmp_path / "q", "--scheme", "int8", "-q") == 0
    assert run("inspect", tmp_path / "diff") == 0
    assert sorted(p.name for p in (tmp_path / "q" / "unet").iterdir()) == [
        "diffusion_pytorch_model.fp16.safetensors", "diffusion_pytorch_model.safetensors"]


def test_linked_folders_are_listed_as_such_not_as_weight_files(tmp_path, model, capsys):
    src, _ = model
    os.symlink("..", src / "up")
    os.symlink(".", src / "self")
    assert run("quantize", src, "-o", tmp_path / "q", "--scheme", "int8") == 0
    out = capsys.readouterr().out
    assert "left out 2 linked folders (self, up)" in out
    assert "left out 1 weight file in other formats (pytorch_model.bin)" in out
    assert not (tmp_path / "q" / "up").exists() and not (tmp_path / "q" / "self").exists()


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_each_output_file_keeps_its_inputs_permissions(tmp_path, model):
    src, _ = model
    private = [*shard_names(src), INDEX, "tokenizer.json"]
    for name in private:
        os.chmod(src / name, 0o600)
    os.chmod(src / "config.json", 0o640)
    assert run("quantize", src, "-o", tmp_path / "q", "--scheme", "int8", "-q") == 0
    for name in private:
        assert (tmp_path / "q" / name).stat().st_mode & 0o777 == 0o600, name
    assert (tmp_path / "q" / "config.json").stat().st_mode & 0o777 == 0o640
    assert run("dequantize", tmp_path / "q", "-o", tmp_path / "d", "-q") == 0
    assert (tmp_path / "d" / shard_names(src)[0]).stat().st_mode & 0o777 == 0o600
