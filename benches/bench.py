"""Side-by-side benchmark: blockquant vs its pure-numpy reference, peers, and memory bandwidth.

    python benches/bench.py [--size N] [--repeat R] [--json PATH] [--quick]

It lives beside the package, not in it: the installed package never reaches into a source tree.

Everything runs in one process on one machine, so read the ratios, not the absolute numbers (the
machine is shared and noisy). Columns:
- median time of `repeat` runs, input GB/s (float32 bytes read / time);
- speed-up over `blockquant.reference` (pure numpy, same results bit for bit);
- fraction of `np.copyto` throughput on the same array (the memory-bandwidth yardstick).
Peers (torch, ml_dtypes, gguf) are measured when installed. Needs only numpy and blockquant.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

import blockquant as bq
import blockquant.reference as ref
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype


def median_time(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cases(n: int) -> List[Dict]:
    side = math.isqrt(n)  # the square case uses the first side² values
    return [
        dict(name="per-tensor Q8S", scheme=bq.presets.int8(), shape=(n // 4096, 4096)),
        dict(name="block[32] Q8S F16", scheme=bq.presets.int8_block32(), shape=(n // 4096, 4096)),
        dict(name="block[32] Q4S F16 PackedNative", scheme=bq.presets.int4_block32(), shape=(n // 4096, 4096)),
        dict(name="NVFP4 (two-level)", scheme=bq.presets.nvfp4(), shape=(n // 4096, 4096)),
        dict(name="MXFP8", scheme=bq.presets.mxfp8(), shape=(n // 4096, 4096)),
        dict(name="MXFP4", scheme=bq.presets.mxfp4(), shape=(n // 4096, 4096)),
        dict(
            name="block[128,128] Q8S F32",
            scheme=QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([128, 128], ScaleDtype.F32),
            shape=(side, side),
        ),
    ]


def peers(x: np.ndarray, repeat: int, copy_s: float) -> List[Dict]:
    """Other libraries doing the same job, each next to the matching blockquant call."""
    rows = []
    gb = x.nbytes / 1e9
    int8 = bq.presets.int8()
    scale = float(np.abs(x).max() / 127)
    bq_given = median_time(lambda: bq.quantize(x, int8, scales=[scale]), repeat)
    e4m3 = QuantScheme(QuantValue.E4M3, QuantStore.Native).per_tensor(ScaleDtype.F32)
    bq_fp8 = median_time(lambda: bq.quantize(x, e4m3, scales=[1.0]), repeat)
    try:
        import torch

        t = torch.from_numpy(x)
        tq = median_time(lambda: torch.quantize_per_tensor(t, scale, 0, torch.qint8), repeat)
        rows.append(dict(peer="torch.quantize_per_tensor (given scale)", peer_s=tq, bq_s=bq_given))
        if hasattr(torch, "float8_e4m3fn"):
            tf = median_time(lambda: t.to(torch.float8_e4m3fn), repeat)
            rows.append(dict(peer="torch .to(float8_e4m3fn)", peer_s=tf, bq_s=bq_fp8))
    except ImportError:
        pass
    try:
        import ml_dtypes

        mf = median_time(lambda: x.astype(ml_dtypes.float8_e4m3fn), repeat)
        rows.append(dict(peer="ml_dtypes astype(float8_e4m3fn)", peer_s=mf, bq_s=bq_fp8))
        mx = bq.presets.mxfp8()
        rows.append(
            dict(
                peer="ml_dtypes float8 cast vs bq MXFP8 (with scales)",
                peer_s=mf,
                bq_s=median_time(lambda: bq.quantize(x, mx), repeat),
            )
        )
        e2 = QuantScheme(QuantValue.E2M1, QuantStore.Native).per_tensor(ScaleDtype.F32)
        m4 = median_time(lambda: x.astype(ml_dtypes.float4_e2m1fn), repeat)
        rows.append(
            dict(
                peer="ml_dtypes astype(float4_e2m1fn)",
                peer_s=m4,
                bq_s=median_time(lambda: bq.quantize(x, e2, scales=[1.0]), repeat),
            )
        )
    except ImportError:
        pass
    try:
        import gguf  # type: ignore[import-not-found]
        from gguf import quants  # type: ignore[import-not-found]

        flat = x.reshape(-1, 32 * 256)
        g8 = median_time(lambda: quants.quantize(flat, gguf.GGMLQuantizationType.Q8_0), max(1, repeat // 2))
        rows.append(
            dict(
                peer="gguf Q8_0",
                peer_s=g8,
                bq_s=median_time(lambda: bq.quantize(flat, bq.presets.int8_block32()), repeat),
            )
        )
        if hasattr(gguf.GGMLQuantizationType, "MXFP4"):
            g4 = median_time(lambda: quants.quantize(flat, gguf.GGMLQuantizationType.MXFP4), max(1, repeat // 2))
            rows.append(
                dict(
                    peer="gguf MXFP4",
                    peer_s=g4,
                    bq_s=median_time(lambda: bq.quantize(flat, bq.presets.mxfp4()), repeat),
                )
            )
    except Exception:  # gguf missing, or an API that differs from the one used above
        pass
    for r in rows:
        r["peer_gbs"] = gb / r["peer_s"]
        r["bq_gbs"] = gb / r["bq_s"]
        r["bq_speedup"] = r["peer_s"] / r["bq_s"]
        r["bq_of_copyto"] = copy_s / r["bq_s"]
    return rows


GGML_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "TQ1_0", "TQ2_0", "F16", "BF16", "F32"]


def ggml_rows(x: np.ndarray, repeat: int, copy_s: float) -> List[Dict]:
    """blockquant.gguf (ggml's block types) against gguf-py and np.copyto: bit-exactness on a
    slice, quantize and dequantize (into a preallocated array, as copyto writes into one) on 1
    and 2 threads as a fraction of copyto's throughput, and speed over gguf-py (both on a slice
    of at most 1 Mi values, blockquant on its default threads: gguf-py's MXFP4 alone would take
    gigabytes on the whole array)."""
    from blockquant import gguf as bg

    try:
        import gguf  # type: ignore[import-not-found]
        from gguf import quants  # type: ignore[import-not-found]
    except ImportError:
        gguf = None
    rows = []
    small = x[: max(1, min(x.shape[0], 2**20 // x.shape[1]))]
    for name in GGML_TYPES:
        blocks = bg.quantize(x, name)
        q_out = np.empty_like(blocks)
        d_out = np.empty(x.shape, np.float32)
        r: Dict = dict(type=name)
        for threads in (1, 2):
            bq.set_num_threads(threads)
            r[f"quantize_{threads}t_s"] = median_time(
                lambda: bg.quantize(x, name, out=q_out), repeat)  # noqa: B023 - called at once
            r[f"dequantize_{threads}t_s"] = median_time(
                lambda: bg.dequantize(blocks, name, out=d_out), repeat)  # noqa: B023 - called at once
        bq.set_num_threads(0)
        if gguf is not None:
            qt = gguf.GGMLQuantizationType[name]
            with np.errstate(all="ignore"):
                theirs = quants.quantize(small, qt)
                mine = bg.quantize(small, name)
                r["bit_exact"] = bool(
                    theirs.dtype == mine.dtype and np.array_equal(theirs.view(np.uint8), mine.view(np.uint8))
                    and np.array_equal(np.asarray(quants.dequantize(theirs, qt), np.float32).view(np.uint32),
                                       bg.dequantize(theirs, name).view(np.uint32)))
                g_reps = max(1, repeat // 3)
                g_q = median_time(lambda: quants.quantize(small, qt), g_reps)  # noqa: B023 - called at once
                g_d = median_time(lambda: quants.dequantize(theirs, qt), g_reps)  # noqa: B023 - called at once
            s_out = np.empty(small.shape, np.float32)
            s_q = median_time(lambda: bg.quantize(small, name), repeat)  # noqa: B023 - called at once
            s_d = median_time(lambda: bg.dequantize(theirs, name, out=s_out), repeat)  # noqa: B023 - called at once
            r.update(gguf_quantize_s=g_q, gguf_dequantize_s=g_d,
                     vs_gguf_quantize=g_q / s_q, vs_gguf_dequantize=g_d / s_d)
        for k in ("quantize_1t", "quantize_2t", "dequantize_1t", "dequantize_2t"):
            r[f"{k}_of_copyto"] = copy_s / r[f"{k}_s"]
        rows.append(r)
    return rows


def print_ggml(rows: List[Dict]) -> None:
    def f(r: Dict, k: str, fmt: str = "{:.2f}") -> str:
        return fmt.format(r[k]) if k in r else "-"

    print(table(
        [[r["type"], {True: "yes", False: "NO"}.get(r.get("bit_exact"), "-"),
          f(r, "quantize_1t_of_copyto"), f(r, "quantize_2t_of_copyto"),
          f(r, "dequantize_1t_of_copyto"), f(r, "dequantize_2t_of_copyto"),
          f(r, "vs_gguf_quantize", "{:.0f}x"), f(r, "vs_gguf_dequantize", "{:.0f}x")] for r in rows],
        ["ggml type", "bit-exact vs gguf-py", "quant of copyto 1T", "2T", "dequant of copyto 1T",
         "2T", "quant vs gguf-py", "dequant vs gguf-py"],
    ))


def peak_extra_memory(name: str, n: int) -> Optional[float]:
    """Peak resident memory of one quantize call beyond its input and output, in MiB, measured
    in a child process: Linux's peak-RSS mark (VmHWM) is reset just before the call by writing 5
    to /proc/self/clear_refs. (getrusage's ru_maxrss will not do: a child inherits the parent's
    high-water mark.)"""
    code = f"""
import numpy as np, blockquant as bq, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from bench import cases
def vm(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
case = [c for c in cases({n}) if c["name"] == {name!r}][0]
# float32 straight from the generator: no float64 temporary.
x = np.random.default_rng(0).standard_normal(case["shape"], dtype=np.float32)
bq.quantize(x[:8], case["scheme"])  # load everything, warm the pool
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = vm("VmRSS")
qt = bq.quantize(x, case["scheme"])
peak = vm("VmHWM")
out = qt.values.nbytes + qt.scales.nbytes
print((peak - base - out) / 2**20)
"""
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        return float(res.stdout.strip())
    except Exception:
        return None


def table(rows: List[List[str]], header: List[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, rows)])


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, help="elements, rounded down to rows of 4096 (default 16 Mi)")
    p.add_argument("--repeat", type=int, help="timed runs, the median is kept (default 7)")
    p.add_argument("--ref-repeat", type=int, help="repeats of the (slow) numpy reference (default 2)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--ggml-only", action="store_true",
                   help="only the ggml block types (blockquant.gguf) against gguf-py and copyto")
    p.add_argument(
        "--quick", action="store_true",
        help="defaults of 1 Mi elements and few repeats, no memory probe (a smoke run)",
    )
    args = p.parse_args(argv)
    # --quick changes the defaults only, so `--quick --size 8192` is a smoke test in a second.
    size, repeat, ref_repeat = (2**20, 3, 1) if args.quick else (16 * 2**20, 7, 2)
    args.size = size if args.size is None else args.size
    args.repeat = repeat if args.repeat is None else max(1, args.repeat)
    args.ref_repeat = ref_repeat if args.ref_repeat is None else max(1, args.ref_repeat)
    n = max(4096, args.size - args.size % 4096)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n // 4096, 4096), dtype=np.float32)
    gb = x.nbytes / 1e9
    dst = np.empty_like(x)
    copy_s = median_time(lambda: np.copyto(dst, x), args.repeat)
    threads = bq.get_num_threads()
    print(f"blockquant {bq.__version__} · {platform.machine()} · {os.cpu_count()} cpus · "
          f"{threads} threads · numpy {np.__version__} · {n:,} float32 ({x.nbytes / 2**20:.0f} MiB)")
    print(f"np.copyto: {copy_s * 1e3:.2f} ms = {gb / copy_s:.2f} GB/s of input\n")

    results: Dict = dict(size=n, threads=threads, copyto_s=copy_s, copyto_gbs=gb / copy_s, cases=[])
    rows = []
    for case in [] if args.ggml_only else cases(n):
        xs = x.reshape(-1)[: math.prod(case["shape"])].reshape(case["shape"])
        frac = xs.size / x.size  # < 1 only for the square case when n is not a square
        case_gb, case_copy_s = gb * frac, copy_s * frac
        s = case["scheme"]
        cal = "absmean" if s == bq.presets.bitnet() else "minmax"
        bq_q = median_time(lambda: bq.quantize(xs, s, calibration=cal), args.repeat)  # noqa: B023 - called at once
        ref_q = median_time(lambda: ref.quantize(xs, s, calibration=cal), args.ref_repeat, warmup=0)  # noqa: B023 - called at once
        qt = bq.quantize(xs, s)
        rq = ref.quantize(xs, s)
        bq_d = median_time(qt.dequantize, args.repeat)
        ref_d = median_time(rq.dequantize, args.ref_repeat, warmup=0)
        bq.set_num_threads(1)
        one_q = median_time(lambda: bq.quantize(xs, s, calibration=cal), max(3, args.repeat // 2))  # noqa: B023 - called at once
        bq.set_num_threads(0)
        r = dict(
            name=case["name"], scheme=repr(s), shape=list(case["shape"]),
            quantize_s=bq_q, reference_quantize_s=ref_q, dequantize_s=bq_d,
            reference_dequantize_s=ref_d, one_thread_quantize_s=one_q,
        )
        results["cases"].append(r)
        rows.append([
            case["name"],
            f"{bq_q * 1e3:.1f}", f"{case_gb / bq_q:.2f}", f"{ref_q / bq_q:.1f}x",
            f"{case_copy_s / bq_q:.2f}",
            f"{bq_d * 1e3:.1f}", f"{ref_d / bq_d:.1f}x", f"{case_copy_s / bq_d:.2f}",
            f"{one_q / bq_q:.2f}x",
        ])
    if args.ggml_only:
        rows = []
    else:
        print(table(rows, [
            "scheme", "quant ms", "GB/s", "vs numpy ref", "of copyto",
            "dequant ms", "vs numpy ref", "of copyto", f"{threads}T vs 1T",
        ]))
    print("\nggml's block types (blockquant.gguf), into preallocated arrays as np.copyto:")
    results["ggml"] = ggml_rows(x, args.repeat, copy_s)
    print_ggml(results["ggml"])
    if args.ggml_only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)
        return 0

    peer_rows = peers(x, args.repeat, copy_s)
    results["peers"] = peer_rows
    if peer_rows:
        print()
        print(table(
            [[r["peer"], f"{r['peer_gbs']:.2f}", f"{r['bq_gbs']:.2f}", f"{r['bq_speedup']:.2f}x"] for r in peer_rows],
            ["peer", "peer GB/s", "blockquant GB/s", "blockquant speed-up"],
        ))

    if not args.quick:
        mem_rows = []
        results["peak_extra_mib"] = {}
        for case in cases(n):
            m = peak_extra_memory(case["name"], n)
            results["peak_extra_mib"][case["name"]] = m
            mem_rows.append([case["name"], "?" if m is None else f"{m:.1f}"])
        print()
        print(table(mem_rows, ["scheme", "peak extra MiB (beyond input + output)"]))

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
