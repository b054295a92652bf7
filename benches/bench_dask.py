"""Model folders on one machine: ``--jobs 1/2`` against a dask LocalCluster of 1 and 2 worker
processes (``--dask --jobs 1/2``), on a generated bf16 folder of several GiB.

    python benches/bench_dask.py --gib 4 --repeat 3 --markdown docs/dask.md

Each configuration is the command itself in a fresh process (``blockquant quantize DIR -o OUT/
--scheme nvfp4 -q``), so the cluster's start and end are in its time, as a user sees them. The
configurations run interleaved, in an order rotated every repetition, and the table gives the
median wall time and the median CPU time of the command and every process under it (the
cluster's workers included: each is waited for, so its time is the command's). The input is
read from the page cache after the first repetition (the folder fits in memory here): this
measures the work, not the disk. The outputs of all configurations are checked to be the same
bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [("--jobs 1", ["--jobs", "1"]), ("--jobs 2", ["--jobs", "2"]),
           ("LocalCluster, 1 worker", ["--dask", "--jobs", "1"]),
           ("LocalCluster, 2 workers", ["--dask", "--jobs", "2"])]
BEGIN, END = "<!-- bench_dask: begin -->", "<!-- bench_dask: end -->"


def generate(folder: Path, gib: float, shards: int) -> int:
    """A llama-like folder of bf16 weights, ``gib`` GiB in ``shards`` shards (kept between
    runs: a stamp names what it holds). Its bytes of tensor data."""
    import ml_dtypes
    from safetensors.numpy import save_file

    stamp = folder / "bench_dask.json"
    want = {"gib": gib, "shards": shards, "version": 1}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    per_shard = int(gib * 2**30 / shards)
    width = 4096 if per_shard >= 4 * 4096 * 4096 * 2 else 1024
    rows = max(16, per_shard // (4 * width * 2))  # four matrices a shard, 2 bytes a value
    rng = np.random.default_rng(0)
    weight_map, total = {}, 0
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for proj in ("q_proj", "k_proj", "up_proj", "down_proj"):
            w = rng.standard_normal((rows, width), dtype=np.float32) * np.float32(0.02)
            tensors[f"model.layers.{k}.{proj}.weight"] = w.astype(ml_dtypes.bfloat16)
            del w
        tensors[f"model.layers.{k}.norm.weight"] = np.ones(width, ml_dtypes.bfloat16)
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        for t, a in tensors.items():
            weight_map[t] = name
            total += a.nbytes
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (folder / "config.json").write_text('{"model_type": "llama"}')
    stamp.write_text(json.dumps(want))
    return total


def run_once(folder: Path, out: Path, scheme: str, extra: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and everything it waited for)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "blockquant", "quantize", str(folder), "-o", f"{out}/",
           "--scheme", scheme, "-q", *extra]
    env = dict(os.environ)
    if importlib.util.find_spec("blockquant") is None:  # the checkout's, not installed
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def markdown(res: dict) -> str:
    base = res["rows"][0]["wall_s"]
    lines = [
        f"Measured by `python benches/bench_dask.py --gib {res['gib']:g} --repeat "
        f"{res['repeat']}`: {res['input_gib']:.2f} GiB of bf16 weights in {res['shards']} "
        f"shards to `{res['scheme']}`, on {res['machine']}; median of {res['repeat']} "
        "interleaved runs, warm page cache, each run a fresh command; the machine's load "
        f"average (other work on it) {res['load'][0]:.1f} before, {res['load'][1]:.1f} after.",
        "",
        "| configuration | wall s | CPU s | CPU / wall | input GB/s | vs --jobs 1 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(f"| {r['name']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                     f"{r['cpu_s'] / r['wall_s']:.2f} | {r['gb_s']:.2f} | "
                     f"{base / r['wall_s']:.2f}x |")
    lines += ["", f"A LocalCluster costs {res['cluster_overhead_s']:.1f} s of wall time more than "
              "`--jobs 1` for the same work (one worker against one process): its start, the "
              "tasks' round trips, its stop."]
    return "\n".join(lines)


def write_markdown(path: Path, text: str) -> None:
    page = path.read_text(encoding="utf-8")
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} section to fill")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="input size (default 4 GiB)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scheme", default="nvfp4")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where the generated folder is kept (default: a temporary folder)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 16 MiB, one repetition")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path, help="fill this page's bench_dask section")
    args = ap.parse_args()
    if args.quick:
        args.gib, args.shards, args.repeat = 1 / 64, 4, 1
    work = args.dir or Path(os.environ.get("TMPDIR", "/tmp")) / "blockquant-bench-dask"
    folder = work / "model"
    nbytes = generate(folder, args.gib, args.shards)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    walls: dict[str, list[float]] = {name: [] for name, _ in CONFIGS}
    cpus: dict[str, list[float]] = {name: [] for name, _ in CONFIGS}
    digests = set()
    for rep in range(args.repeat):
        order = CONFIGS[rep % len(CONFIGS):] + CONFIGS[:rep % len(CONFIGS)]
        for name, extra in order:
            out = work / "out"
            wall, cpu = run_once(folder, out, args.scheme, extra)
            walls[name].append(wall)
            cpus[name].append(cpu)
            if rep == 0:
                digests.add(digest(out))
            print(f"repetition {rep + 1}: {name}: {wall:.2f} s wall, {cpu:.2f} s CPU",
                  flush=True)
    shutil.rmtree(work / "out", ignore_errors=True)
    if len(digests) != 1:
        raise SystemExit("the configurations wrote different bytes")
    rows = [{"name": name, "wall_s": statistics.median(walls[name]),
             "cpu_s": statistics.median(cpus[name]), "walls": walls[name], "cpus": cpus[name],
             "gb_s": nbytes / statistics.median(walls[name]) / 1e9} for name, _ in CONFIGS]
    one, local = rows[0], rows[2]
    cores = os.cpu_count() or 1
    import dask

    res = {"gib": args.gib, "input_gib": nbytes / 2**30, "shards": args.shards,
           "repeat": args.repeat, "scheme": args.scheme, "rows": rows,
           "cluster_overhead_s": local["wall_s"] - one["wall_s"],
           "load": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else
                    float("nan")],
           "machine": f"{cores} cores, {platform.machine()}, Python "
                      f"{platform.python_version()}, dask {dask.__version__}"}
    text = markdown(res)
    print("\n" + text)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    if args.markdown:
        write_markdown(args.markdown, text)
    if args.dir is None and args.quick:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
