"""Side-by-side benchmark: blockquant against np.copyto, numpy, its reference, torch and ggml.

    python benches/bench.py [--size N] [--repeat R] [--json PATH] [--quick] [--peers GGML_TREE]

It lives beside the package, not in it: the installed package never reaches into a source tree.

Everything runs in one process; read the ratios, not the absolute numbers (the machine is shared
and noisy). For each scheme one group of calls is timed interleaved (every call once per
repetition, the order rotated each time; medians of the repetitions), so a ratio compares calls
made moments apart:
- ``np.copyto`` on the same float32 array: the memory-bandwidth yardstick ("of copyto" is
  throughput relative to it: copyto's time / the call's time);
- blockquant on 1 and 2 threads (set before each call, alternating within the repetitions), with
  the process's CPU time / wall time of each (about 2 when both cores worked);
- an idiomatic vectorized numpy version of the scheme (benches/bench_numpy.py), what a user would
  write without blockquant, and ``blockquant.reference``, the bit-exact numpy contract (slow: in
  the first ``--ref-repeat`` repetitions only);
- torch's CPU kernels where torch has one for the job (per-tensor int8, the FP8 cast);
- for ggml's block types (benches/bench_ggml.py): gguf-py, and with ``--peers`` ggml's own C
  kernels compiled from a local ggml tree (benches/bench_ggml_c.py).
Then the targets of issues 11 and 13 as a checklist with the measured ratios.
Needs numpy and blockquant; ml_dtypes, torch and gguf are used when installed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import bench_ggml
import bench_markdown
import bench_numpy
import bench_report
import numpy as np
from bench_timing import Cell, reset_threads, run_interleaved, use_torch

import blockquant as bq
import blockquant.reference as ref
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype


@dataclass
class Case:
    """One scheme to time. ``key`` names its numpy version; ``kw`` are quantize options (given
    scales); ``bits`` is the width of its values (for the dequantize target); ``reads`` is how
    many times any quantizer must read the input from memory: 2 where a statistic of the whole
    tensor (its max or mean |x|) is needed before the first value can be encoded and the tensor
    is larger than the caches. ``preset``: one of ``blockquant.presets``, which issue 13's
    "every preset" targets (0.8× copyto, 10× and 2.5× numpy) apply to; the other rows are
    timed and tabled the same, their own targets only (torch's, dequantize into out=)."""

    name: str
    key: str
    scheme: QuantScheme
    shape: Tuple[int, ...]
    bits: int
    kw: Dict[str, Any] = field(default_factory=dict)
    np_kw: Dict[str, Any] = field(default_factory=dict)
    torch: Optional[str] = None
    reads: int = 1
    preset: bool = True


def cases(n: int, given_scale: float = 4.5 / 127) -> List[Case]:
    rows = (n // 4096, 4096)
    side = max(128, math.isqrt(n) // 128 * 128)  # whole 128x128 blocks; side² ≤ n unless tiny
    e4m3 = QuantScheme(QuantValue.E4M3, QuantStore.Native).per_tensor(ScaleDtype.F32)
    p = bq.presets
    return [
        Case("int8 (per-tensor, calibrated)", "int8", p.int8(), rows, 8, torch="qint8", reads=2),
        Case("int8 (per-tensor, scale given)", "int8", p.int8(), rows, 8,
             kw=dict(scales=[given_scale]), np_kw=dict(scale=given_scale), torch="qint8_given"),
        Case("int8_block32 (Q8S, F16 scales)", "int8_block32", p.int8_block32(), rows, 8),
        Case("int4_block32 (Q4S, F16, PackedU32)", "int4_block32", p.int4_block32(), rows, 4),
        Case("mxfp8", "mxfp8", p.mxfp8(), rows, 8),
        Case("mxfp4", "mxfp4", p.mxfp4(), rows, 4),
        Case("nvfp4 (two-level)", "nvfp4", p.nvfp4(), rows, 4, reads=2),
        Case("bitnet (Q2S, absmean)", "bitnet", p.bitnet(), rows, 2, reads=2),
        # The presets whose block scales are searched (mse): more signal per bit for several
        # times minmax's time, by design.
        Case("int4_block16 (Q4F, searched)", "int4_block16", p.int4_block16(), rows, 4, reads=2),
        Case("nf4_block16 (searched)", "nf4_block16", p.nf4_block16(), rows, 4, reads=2),
        Case("bq4_block16 (searched)", "bq4_block16", p.bq4_block16(), rows, 4, reads=2),
        Case("E4M3 (per-tensor, scale 1)", "e4m3", e4m3, rows, 8,
             kw=dict(scales=[1.0]), np_kw=dict(scale=1.0), torch="fp8", preset=False),
        Case("block[128,128] Q8S F32", "int8_block128x128",
             QuantScheme(QuantValue.Q8S, QuantStore.Native).per_block([128, 128], ScaleDtype.F32),
             (side, side), 8, preset=False),
    ]


def bq_quantizer(x: np.ndarray, case: Case) -> Tuple[Callable[[], object], str]:
    """blockquant's quantize call for the case: into caller-given arrays
    (``out=(values, scales)``) when this blockquant takes them (checked to write there and give
    the same bytes), else the plain call that allocates its output (blockquant before out=)."""
    fresh = bq.quantize(x, case.scheme, **case.kw)
    out = (np.empty_like(fresh.values), np.empty_like(fresh.scales))
    try:
        got = bq.quantize(x, case.scheme, out=out, **case.kw)  # type: ignore[call-arg]
    except TypeError:
        return (lambda: bq.quantize(x, case.scheme, **case.kw)), "new arrays"
    if not (np.shares_memory(got.values, out[0]) and got.to_bytes() == fresh.to_bytes()):
        raise AssertionError(f"quantize(out=) for {case.name} wrote elsewhere or other bytes")
    return (lambda: bq.quantize(x, case.scheme, out=out, **case.kw)), "out=(values, scales)"


def torch_cells(case: Case, x: np.ndarray, d_out: np.ndarray) -> List[Cell]:
    """torch's CPU kernels for the case (nothing when torch is missing or has none)."""
    torch = use_torch() if case.torch is not None else None
    if torch is None:
        return []
    # torch 2.10+ warns that quantize_per_tensor is deprecated; it is still the kernel to beat.
    warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
    t, t_out = torch.from_numpy(x), torch.from_numpy(d_out)
    if case.torch == "fp8":
        if not hasattr(torch, "float8_e4m3fn"):
            return []
        t8 = t.to(torch.float8_e4m3fn)
        q = lambda: t.to(torch.float8_e4m3fn)  # noqa: E731
        dq = lambda: t_out.copy_(t8)  # noqa: E731 - into a preallocated tensor, as bq's out=
    else:
        scale = case.kw["scales"][0] if "scales" in case.kw else None
        if scale is None:  # what a user writes to calibrate: the tensor's max |x| / 127
            q = lambda: torch.quantize_per_tensor(t, float(t.abs().max()) / 127, 0, torch.qint8)  # noqa: E731
        else:
            q = lambda: torch.quantize_per_tensor(t, scale, 0, torch.qint8)  # noqa: E731
        tq = q()
        dq = tq.dequantize  # torch has no out= for this; it allocates
    return [c for th in (1, 2) for c in (Cell(f"torch_quantize_{th}t", q, th),
                                           Cell(f"torch_dequantize_{th}t", dq, th))]


def writer(a: np.ndarray) -> Callable[[], None]:
    """The fastest plain write of ``a`` at hand: libc's memset, whose large writes bypass the
    caches (non-temporal stores, as blockquant's dequantize makes; numpy's fill took a quarter
    longer), of a nonzero byte (a zero fill may have a shortcut of its own). numpy's fill where
    no libc is found."""
    try:
        memset = ctypes.CDLL(None).memset
    except (OSError, AttributeError, TypeError):
        return lambda: a.fill(1.0)
    memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
    # The array itself in the closure: it lives as long as its writer.
    return lambda: memset(a.ctypes.data, 0x3F, a.nbytes)


def run_case(case: Case, x: np.ndarray, repeat: int, ref_repeat: int, with_torch: bool) -> Dict:
    xs = x.reshape(-1)[: math.prod(case.shape)].reshape(case.shape)
    dst = np.empty_like(xs)
    quantize, form = bq_quantizer(xs, case)
    qt = bq.quantize(xs, case.scheme, **case.kw)
    d_out = np.empty(xs.shape, np.float32)
    # The floors: one read of the input at the machine's pace (numpy's max is a SIMD reduction
    # that runs at memory speed); no quantizer can beat ``reads`` of these. And one write of
    # the float32 output (libc's memset): no dequantize into it can beat that.
    cells = [Cell("copyto", lambda: np.copyto(dst, xs)), Cell("read", lambda: xs.max()),
             Cell("write", writer(d_out))]
    for t in (1, 2):
        cells += [Cell(f"bq_quantize_{t}t", quantize, t),
                  Cell(f"bq_dequantize_{t}t", lambda: qt.dequantize(out=d_out), t)]
    cells.append(Cell("bq_dequantize_new_1t", qt.dequantize, 1))
    if form != "new arrays":  # what quantizing into fresh arrays costs (their page faults)
        cells.append(Cell("bq_quantize_new_1t", lambda: bq.quantize(xs, case.scheme, **case.kw), 1))
    if case.scheme.options.calibration == "mse":
        # The same scheme with minmax's scales, the search's own baseline (issue 14 budgets a
        # search in multiples of it): what the search itself costs on top.
        mm = (np.empty_like(qt.values), np.empty_like(qt.scales))
        cells.append(Cell("bq_quantize_minmax_1t", lambda: bq.quantize(
            xs, case.scheme, calibration="minmax", out=mm, **case.kw), 1))
    r: Dict = dict(name=case.name, scheme=str(case.scheme), shape=list(case.shape), bits=case.bits,
                   quantize_form=form, reads=case.reads, preset=case.preset)
    impl = bench_numpy.scheme(case.key, xs.shape)
    if impl is not None:
        nq = impl.quantize(xs, **case.np_kw)
        np_out = np.empty(xs.shape, np.float32)
        cells += [Cell("numpy_quantize", lambda: impl.quantize(xs, **case.np_kw), warmup=False),
                  Cell("numpy_dequantize", lambda: impl.dequantize(nq, np_out), warmup=False)]
        same = nq["values"].view(np.uint8) == qt.values.view(np.uint8)
        r["numpy_bytes_equal"] = float(np.mean(same))
    if ref_repeat > 0:
        rq = ref.quantize(xs, case.scheme, **case.kw)
        cells += [Cell("ref_quantize", lambda: ref.quantize(xs, case.scheme, **case.kw),
                       rounds=ref_repeat, warmup=False),
                  Cell("ref_dequantize", rq.dequantize, rounds=ref_repeat, warmup=False)]
    if with_torch:
        cells += torch_cells(case, xs, np.empty(xs.shape, np.float32))
    timed = run_interleaved(cells, repeat)
    reset_threads()
    copy_s = timed["copyto"].s
    r["cells"] = {k: c.summary() for k, c in timed.items()}
    for k, c in timed.items():
        r[f"{k}_s"] = c.s
        if k != "copyto":
            r[f"{k}_of_copyto"] = copy_s / c.s
            r[f"{k}_cpu_per_wall"] = c.cpu_per_wall
    return r


#: Values per small call: a row of a hidden layer, a bias, an activation of one token.
SMALL_N = 4096
#: Calls per timed cell in the small-call table (their total is timed, so the clock's
#: resolution and the harness's own cost are spread over them), and repetitions of each.
SMALL_CALLS = 200
SMALL_REPEAT = 9


def small_calls(chosen: List[Case], with_torch: bool) -> List[Dict]:
    """The time of one call on SMALL_N values, in µs, where a call's fixed cost (the Python
    layer, handing the work to threads) outweighs its work: blockquant's quantize and dequantize
    (new arrays, the default pool: what a user writes), against the idiomatic numpy version of
    the same scheme and torch's kernels where there are some."""
    x = np.random.default_rng(1).standard_normal((1, SMALL_N), dtype=np.float32)
    return [_small_case(case, x, with_torch) for case in chosen]


def _many(f: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        for _ in range(SMALL_CALLS):
            f()
    return run


def _small_case(case: Case, x: np.ndarray, with_torch: bool) -> Dict:
    qt = bq.quantize(x, case.scheme, **case.kw)
    cells = [Cell("bq_quantize", _many(lambda: bq.quantize(x, case.scheme, **case.kw))),
             Cell("bq_dequantize", _many(qt.dequantize))]
    impl = bench_numpy.scheme(case.key, x.shape)
    if impl is not None:
        nq = impl.quantize(x, **case.np_kw)
        out = np.empty(x.shape, np.float32)
        cells += [Cell("numpy_quantize", _many(lambda: impl.quantize(x, **case.np_kw))),
                  Cell("numpy_dequantize", _many(lambda: impl.dequantize(nq, out)))]
    if with_torch:  # its one-thread cells, on the default pool like blockquant's
        cells += [Cell(c.key[: -len("_1t")], _many(c.fn))
                  for c in torch_cells(case, x, np.empty(x.shape, np.float32))
                  if c.key.endswith("_1t")]
    timed = run_interleaved(cells, SMALL_REPEAT)
    return dict(name=case.name, **{f"{k}_us": c.s / SMALL_CALLS * 1e6 for k, c in timed.items()})


def print_small_calls(rows: List[Dict]) -> None:
    def us(r: Dict, k: str) -> str:
        v = r.get(f"{k}_us")
        return "-" if v is None else f"{v:.1f}"

    print(f"\nsmall calls: µs per call on {SMALL_N} float32 values (1 x {SMALL_N}), new arrays, "
          "the default pool; numpy = the idiomatic numpy version of the scheme:")
    bench_report.print_table(
        [[r["name"], us(r, "bq_quantize"), us(r, "numpy_quantize"), us(r, "torch_quantize"),
          us(r, "bq_dequantize"), us(r, "numpy_dequantize"), us(r, "torch_dequantize")]
         for r in rows],
        ["scheme", "bq quantize", "numpy quantize", "torch quantize", "bq dequantize",
         "numpy dequantize", "torch dequantize"])


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
case = [c for c in cases({n}) if c.name == {name!r}][0]
# float32 straight from the generator: no float64 temporary.
x = np.random.default_rng(0).standard_normal(case.shape, dtype=np.float32)
bq.quantize(x[:8], case.scheme, **case.kw)  # load everything, warm the pool
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = vm("VmRSS")
qt = bq.quantize(x, case.scheme, **case.kw)
peak = vm("VmHWM")
out = qt.values.nbytes + qt.scales.nbytes
print((peak - base - out) / 2**20)
"""
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        return float(res.stdout.strip())
    except Exception:
        return None


def _chosen(only: Optional[str], name: str) -> bool:
    return not only or any(part.strip().lower() in name.lower() for part in only.split(","))


def _load() -> Optional[List[float]]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--size", type=int, help="elements, rounded down to rows of 4096 (default 16 Mi)")
    p.add_argument("--repeat", type=int, help="repetitions, medians kept (default 9)")
    p.add_argument("--ref-repeat", type=int,
                   help="repetitions of the slow bit-exact reference (default 2; 0 skips it)")
    p.add_argument("--json", metavar="PATH", help="write every measurement there as JSON")
    p.add_argument("--markdown", metavar="PATH",
                   help="write the benchmark's page there (docs/benchmarks.md): the method, then "
                        "this run's tables")
    p.add_argument("--ggml-only", action="store_true",
                   help="only ggml's block types (blockquant.gguf) against copyto, gguf-py, ggml")
    p.add_argument("--peers", metavar="GGML_TREE",
                   help="also time ggml's C kernels, built from this local ggml (or llama.cpp) "
                        "source tree or a folder inside it (needs gcc)")
    p.add_argument("--only", metavar="NAMES",
                   help="comma-separated parts of names: only the schemes and ggml types whose "
                        "name contains one (case-insensitive), e.g. 'block32,nvfp4,Q8_0'")
    p.add_argument("--no-torch", action="store_true", help="leave torch out even if installed")
    p.add_argument("--quick", action="store_true",
                   help="defaults of 1 Mi elements and 3 repetitions, no memory probe (a smoke run)")
    args = p.parse_args(argv)
    # --quick changes the defaults only, so `--quick --size 16384` is a smoke test in seconds.
    size, repeat, ref_repeat = (2**20, 3, 1) if args.quick else (16 * 2**20, 9, 2)
    args.size = size if args.size is None else args.size
    args.repeat = repeat if args.repeat is None else max(1, args.repeat)
    args.ref_repeat = ref_repeat if args.ref_repeat is None else max(0, args.ref_repeat)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if not args.markdown:
        return run(args)
    tee = bench_markdown.Tee(sys.stdout)
    saved, sys.stdout = sys.stdout, tee
    try:
        rc = run(args)
    finally:
        sys.stdout = saved
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    bench_markdown.write(args.markdown, tee.kept.getvalue(), f"python benches/bench.py {argv_text}")
    return rc


def run(args: argparse.Namespace) -> int:
    n = max(4096, args.size - args.size % 4096)
    x = np.random.default_rng(0).standard_normal((n // 4096, 4096), dtype=np.float32)
    torch = None if args.no_torch else use_torch()
    env = dict(blockquant=bq.__version__, machine=platform.machine(), cpus=os.cpu_count(),
               default_threads=bq.get_num_threads(), numpy=np.__version__,
               torch=None if torch is None else torch.__version__)
    print(f"blockquant {bq.__version__} · {platform.machine()} · {os.cpu_count()} cpus "
          f"(default {bq.get_num_threads()} threads) · numpy {np.__version__} · "
          f"torch {env['torch'] or ('left out' if args.no_torch else 'not installed')} · {n:,} float32 ({x.nbytes / 2**20:.0f} MiB) · "
          f"medians of {args.repeat} interleaved repetitions")
    print(f"load average (1, 5, 15 min) at the start: {_load()}: a quiet machine stays well "
          f"below its {os.cpu_count()} cpus\n")
    results: Dict = dict(size=n, repeat=args.repeat, ref_repeat=args.ref_repeat, env=env, cases=[],
                         load_start=_load())

    peers = None
    if args.peers:
        import bench_ggml_c

        try:
            peers, desc = bench_ggml_c.load(args.peers)
            print(f"peers: {desc}\n")
            results["peers"] = desc
        except bench_ggml_c.PeerError as e:
            print(f"peers: skipped: {e}\n")
            results["peers"] = f"skipped: {e}"

    chosen = [c for c in cases(n) if _chosen(args.only, c.name)]
    types = [t for t in bench_ggml.TYPES if _chosen(args.only, t)]
    if not args.ggml_only:
        for case in chosen:
            r = run_case(case, x, args.repeat, args.ref_repeat, torch is not None)
            results["cases"].append(r)
            print(f"  {case.name}: done", file=sys.stderr, flush=True)
        bench_report.print_cases(results["cases"])
        results["small_calls"] = small_calls(chosen, torch is not None)
        print_small_calls(results["small_calls"])

    results["ggml"] = bench_ggml.rows(x, args.repeat, peers, types) if types else []
    if types:
        print("\nggml's block types (blockquant.gguf), into preallocated arrays as np.copyto:")
        bench_report.print_table(bench_ggml.table_rows(results["ggml"]), bench_ggml.HEADER)
    if peers and types:
        print("\nggml's C kernels (--peers) on the same arrays; 2 threads = two Python threads "
              "on half the blocks each; the AVX2 quantize_row_q8_0 (ggml's activation path) rounds "
              "ties to even, so its bytes may differ from _ref's, gguf-py's and blockquant's:")
        bench_report.print_table(bench_ggml.peer_table_rows(results["ggml"]), bench_ggml.PEER_HEADER)

    if not args.quick and not args.ggml_only:
        results["peak_extra_mib"] = {}
        mem = []
        for case in chosen:
            m = peak_extra_memory(case.name, n)
            results["peak_extra_mib"][case.name] = m
            mem.append([case.name, "?" if m is None else f"{m:.1f}"])
        print()
        bench_report.print_table(mem, ["scheme", "peak extra MiB (beyond input + output)"])

    results["load_end"] = _load()
    print(f"\nload average at the end: {results['load_end']}")
    results["targets"] = bench_report.targets(results)
    bench_report.print_targets(results["targets"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
