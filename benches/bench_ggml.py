"""benches/bench.py's section on ggml's block types (blockquant.gguf, issue 11): against
np.copyto, gguf-py (numpy) and, with ``--peers PATH``, ggml's own C kernels.

Per type, one interleaved group on the whole array: np.copyto; blockquant's quantize and
dequantize into preallocated arrays (as copyto writes into one) on 1 and 2 threads; ggml's C
row kernels on 1 and 2 threads when built. A second group on a slice of at most 1 Mi values
times gguf-py against blockquant on one thread (gguf-py's MXFP4 alone would take gigabytes on
the whole array), and checks the bytes are the same.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
from bench_timing import Cell, reset_threads, run_interleaved

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "TQ1_0", "TQ2_0", "F16", "BF16", "F32"]
SLICE = 2**20


def _gguf():
    try:
        import gguf  # type: ignore[import-not-found]
        from gguf import quants  # type: ignore[import-not-found]
    except ImportError:
        return None, None
    return gguf, quants


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        a.view(np.uint8), b.view(np.uint8))


def rows(x: np.ndarray, repeat: int, peers: Optional[Dict] = None,
         types: Optional[List[str]] = None) -> List[Dict]:
    """One dict per type (of ``types``, default all): medians, CPU/wall ratios, ratios to
    copyto, gguf-py and ggml."""
    from blockquant import gguf as bg

    gguf, quants = _gguf()
    small = x[: max(1, min(x.shape[0], SLICE // x.shape[1]))]
    out_rows = []
    for name in TYPES if types is None else types:
        blocks = bg.quantize(x, name)
        q_out, d_out, dst = np.empty_like(blocks), np.empty(x.shape, np.float32), np.empty_like(x)
        cells = [Cell("copyto", lambda: np.copyto(dst, x))]  # noqa: B023 - timed right here
        for t in (1, 2):
            cells += [
                Cell(f"bq_quantize_{t}t", lambda: bg.quantize(x, name, out=q_out), t),  # noqa: B023
                Cell(f"bq_dequantize_{t}t", lambda: bg.dequantize(blocks, name, out=d_out), t),  # noqa: B023
            ]
        kern = (peers or {}).get(name)
        c_bytes: Dict[str, bool] = {}
        if kern is not None:
            c_q, c_d = np.empty_like(blocks), np.empty(x.shape, np.float32)
            for t in (1, 2):
                cells.append(Cell(f"ggml_quantize_{t}t", kern.quantizer(x, c_q, t), t))
                cells.append(Cell(f"ggml_dequantize_{t}t", kern.dequantizer(blocks, c_d, t), t))
            if name == "Q8_0":  # the _ref kernel ggml_quantize_chunk uses, apart from the SIMD one
                cells.append(Cell("ggml_quantize_ref_1t", kern.quantizer(x, c_q, 1, ref=True), 1))
            kern.quantizer(x, c_q, 1)()
            kern.dequantizer(blocks, c_d, 1)()
            c_bytes = dict(ggml_quantize_same_bytes=_same_bytes(c_q, blocks),
                           ggml_dequantize_same_bits=_same_bytes(c_d, bg.dequantize(blocks, name)))
            if name == "Q8_0":
                kern.quantizer(x, c_q, 1, ref=True)()
                c_bytes["ggml_quantize_ref_same_bytes"] = _same_bytes(c_q, blocks)
        timed = run_interleaved(cells, repeat)
        copy_s = timed["copyto"].s
        r: Dict = dict(type=name, copyto_s=copy_s, **c_bytes,
                       cells={k: c.summary() for k, c in timed.items()})
        for k, c in timed.items():
            if k != "copyto":
                r[f"{k}_of_copyto"] = copy_s / c.s
                r[f"{k}_cpu_per_wall"] = c.cpu_per_wall
        if gguf is not None:
            r.update(_vs_gguf(name, small, repeat, gguf, quants))
        out_rows.append(r)
    reset_threads()
    return out_rows


def _vs_gguf(name: str, small: np.ndarray, repeat: int, gguf, quants) -> Dict:
    """gguf-py against blockquant (1 thread) on the slice, interleaved; and bit-exactness."""
    from blockquant import gguf as bg

    qt = gguf.GGMLQuantizationType[name]
    with np.errstate(all="ignore"):
        theirs = quants.quantize(small, qt)
        exact = _same_bytes(theirs, bg.quantize(small, name)) and _same_bytes(
            np.asarray(quants.dequantize(theirs, qt), np.float32), bg.dequantize(theirs, name))
    if np.shares_memory(theirs, small):  # gguf-py hands F32 back as it is: nothing to time
        return dict(bit_exact=exact)
    q_out, d_out = np.empty_like(theirs), np.empty(small.shape, np.float32)
    few = max(1, repeat // 3)

    def gguf_q():
        with np.errstate(all="ignore"):
            quants.quantize(small, qt)

    def gguf_d():
        with np.errstate(all="ignore"):
            quants.dequantize(theirs, qt)

    timed = run_interleaved([
        Cell("gguf_quantize", gguf_q, rounds=few, warmup=False),
        Cell("gguf_dequantize", gguf_d, rounds=few, warmup=False),
        Cell("bq_quantize", lambda: bg.quantize(small, name, out=q_out), 1),
        Cell("bq_dequantize", lambda: bg.dequantize(theirs, name, out=d_out), 1),
    ], repeat)
    return dict(bit_exact=exact, vs_gguf_cells=dict(cells={k: c.summary() for k, c in timed.items()}),
                gguf_quantize_s=timed["gguf_quantize"].s, gguf_dequantize_s=timed["gguf_dequantize"].s,
                vs_gguf_quantize=timed["gguf_quantize"].s / timed["bq_quantize"].s,
                vs_gguf_dequantize=timed["gguf_dequantize"].s / timed["bq_dequantize"].s)


def _f(r: Dict, k: str, fmt: str = "{:.2f}") -> str:
    v = r.get(k)
    return "-" if v is None or v != v else fmt.format(v)


def _yes(v: Optional[bool]) -> str:
    return {True: "yes", False: "NO"}.get(v, "-")  # type: ignore[arg-type]


def table_rows(results: List[Dict]) -> List[List[str]]:
    return [[
        r["type"], _yes(r.get("bit_exact")),
        _f(r, "bq_quantize_1t_of_copyto"), _f(r, "bq_quantize_1t_cpu_per_wall", "{:.1f}"),
        _f(r, "bq_quantize_2t_of_copyto"), _f(r, "bq_quantize_2t_cpu_per_wall", "{:.1f}"),
        _f(r, "bq_dequantize_1t_of_copyto"), _f(r, "bq_dequantize_2t_of_copyto"),
        _f(r, "bq_dequantize_2t_cpu_per_wall", "{:.1f}"),
        _f(r, "vs_gguf_quantize", "{:.0f}x"), _f(r, "vs_gguf_dequantize", "{:.0f}x"),
    ] for r in results]


HEADER = ["ggml type", "bytes = gguf-py", "quant 1T of copyto", "cpu/wall", "quant 2T of copyto",
          "cpu/wall", "dequant 1T of copyto", "dequant 2T of copyto", "cpu/wall",
          "quant vs gguf-py", "dequant vs gguf-py"]


def peer_table_rows(results: List[Dict]) -> List[List[str]]:
    """ggml's C kernels next to blockquant's (only the types that were built)."""
    out = []
    for r in results:
        if "ggml_quantize_1t_of_copyto" not in r:
            continue
        c = r["cells"]
        for op, fn in (("quantize", f"quantize_row_{r['type'].lower()}"),
                       ("dequantize", f"dequantize_row_{r['type'].lower()}")):
            g1, g2 = c[f"ggml_{op}_1t"]["median_s"], c[f"ggml_{op}_2t"]["median_s"]
            b1, b2 = c[f"bq_{op}_1t"]["median_s"], c[f"bq_{op}_2t"]["median_s"]
            same = r["ggml_quantize_same_bytes" if op == "quantize" else "ggml_dequantize_same_bits"]
            out.append([r["type"], fn, _yes(same), _f(r, f"ggml_{op}_1t_of_copyto"),
                        _f(r, f"ggml_{op}_2t_of_copyto"), _f(r, f"ggml_{op}_2t_cpu_per_wall", "{:.1f}"),
                        f"{g1 / b1:.2f}", f"{g2 / b2:.2f}"])
        if "ggml_quantize_ref_1t" in c:
            g1, b1 = c["ggml_quantize_ref_1t"]["median_s"], c["bq_quantize_1t"]["median_s"]
            out.append([r["type"], f"quantize_row_{r['type'].lower()}_ref",
                        _yes(r.get("ggml_quantize_ref_same_bytes")),
                        _f(r, "ggml_quantize_ref_1t_of_copyto"), "-", "-", f"{g1 / b1:.2f}", "-"])
    return out


PEER_HEADER = ["ggml type", "ggml C function", "same as blockquant", "ggml 1T of copyto",
               "ggml 2T of copyto", "cpu/wall", "blockquant/ggml 1T", "blockquant/ggml 2T"]
