"""Two builds of blockquant side by side, call for call: did a change move any kernel's speed?

    python benches/bench_builds.py BEFORE AFTER [--size N] [--repeat R] [--only NAMES] [--markdown PATH]

BEFORE and AFTER are folders that each hold a ``blockquant`` package with its compiled ``_core``
(a copy of ``python/blockquant`` after a build, say). Each runs in a worker process of its own;
the parent asks them in turn to time one call of the same scheme on the same data (the order
swapped every repetition), so the two builds' calls of a row are made moments apart and a shared,
noisy machine slows both alike. Medians of the repetitions; the ratio is AFTER's speed over
BEFORE's (above 1: faster). The schemes are bench.py's, at 1 and 2 threads, quantize into
``out=`` arrays and dequantize into an ``out=`` array. Both workers check they give the same
bytes, so a refactor that changed a result shows here too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent

WORKER = r"""
import hashlib, json, math, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import blockquant as bq
import bench
n = int(sys.argv[2])
x = np.random.default_rng(0).standard_normal((n // 4096, 4096), dtype=np.float32)
calls = {}
for case in bench.cases(n):
    xs = x.reshape(-1)[: math.prod(case.shape)].reshape(case.shape)
    quantize, _ = bench.bq_quantizer(xs, case)
    qt = bq.quantize(xs, case.scheme, **case.kw)
    out = np.empty(xs.shape, np.float32)
    digest = hashlib.sha256(qt.to_bytes()).hexdigest()
    calls[case.name] = (quantize, (lambda qt=qt, out=out: qt.dequantize(out=out)), digest)
print(json.dumps({"ready": [[k, v[2]] for k, v in calls.items()]}), flush=True)
threads = None
for line in sys.stdin:
    req = json.loads(line)
    if req["threads"] != threads:
        bq.set_num_threads(req["threads"]); bq.get_num_threads(); threads = req["threads"]
    f = calls[req["case"]][0 if req["op"] == "quantize" else 1]
    f()  # warm: caches, page tables, the pool awake
    w0, c0 = time.perf_counter(), time.process_time()
    f()
    w1, c1 = time.perf_counter(), time.process_time()
    print(json.dumps({"wall": w1 - w0, "cpu": c1 - c0}), flush=True)
"""


class Worker:
    def __init__(self, package_dir: str, n: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(HERE))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(Path(package_dir).resolve()), str(n)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=str(HERE))
        ready = json.loads(self.proc.stdout.readline())["ready"]  # type: ignore[union-attr]
        self.digests = dict(ready)

    def time(self, case: str, op: str, threads: int) -> Dict[str, float]:
        self.proc.stdin.write(json.dumps(dict(case=case, op=op, threads=threads)) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=60)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--size", type=int, default=16 * 2**20, help="elements (default 16 Mi)")
    p.add_argument("--repeat", type=int, default=9, help="repetitions, medians kept")
    p.add_argument("--only", metavar="NAMES", help="comma-separated parts of scheme names")
    p.add_argument("--markdown", metavar="PATH", help="also write the table there")
    args = p.parse_args(argv)
    n = max(2**16, args.size - args.size % 4096)
    before, after = Worker(args.before, n), Worker(args.after, n)
    names = [k for k in before.digests
             if not args.only or any(part in k for part in args.only.split(","))]
    rows = []
    started = time.time()
    for name in names:
        same = before.digests[name] == after.digests.get(name)
        for op in ("quantize", "dequantize"):
            for threads in (1, 2):
                t: Dict[str, List[Dict[str, float]]] = {"before": [], "after": []}
                for rep in range(args.repeat):
                    order = [("before", before), ("after", after)]
                    for label, w in order if rep % 2 == 0 else order[::-1]:
                        t[label].append(w.time(name, op, threads))
                b = statistics.median(c["wall"] for c in t["before"])
                a = statistics.median(c["wall"] for c in t["after"])
                cpu = {k: statistics.median(c["cpu"] / c["wall"] for c in v) for k, v in t.items()}
                # CPU time counts only the time the process ran: on a busy machine it is the
                # steadier yardstick of a one-thread call (a preempted call's wall time grows).
                bc = statistics.median(c["cpu"] for c in t["before"])
                ac = statistics.median(c["cpu"] for c in t["after"])
                rows.append([name, op, f"{threads}T", f"{b * 1e3:.2f}", f"{a * 1e3:.2f}",
                             f"{b / a:.2f}", f"{bc / ac:.2f}" if ac > 0 else "-",
                             f"{cpu['before']:.1f} / {cpu['after']:.1f}",
                             "yes" if same else "NO"])
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    before.close()
    after.close()
    header = ["scheme", "op", "threads", "before ms", "after ms", "after speed / before",
              "by CPU time", "cpu/wall before / after", "same bytes"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in [header, *rows]]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    ratios = [float(r[5]) for r in rows]
    summary = (f"{n:,} float32 values, medians of {args.repeat} alternating repetitions, "
               f"{time.time() - started:.0f} s; after/before speed: median "
               f"{statistics.median(ratios):.3f}, min {min(ratios):.2f}, max {max(ratios):.2f}")
    text = "\n".join(lines) + "\n\n" + summary + "\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")
    return 0 if all(r[-1] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
