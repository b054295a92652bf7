"""`bench.py --markdown PATH`: the benchmark's page (docs/benchmarks.md), written whole by the run.

The page is this module's description of the method, then what the run printed, its tables kept
as tables and its checklist as a list, so refreshing the numbers is one command and no table is
pasted by hand.
"""

from __future__ import annotations

import io
import sys
from typing import List

METHOD = """`python benches/bench.py` runs blockquant side by side with what a user would otherwise call, in
one process, on one float32 array (16 Mi standard-normal values; `--size N`). Options: `--json
PATH` keeps every measurement (each repetition's wall and CPU time), `--quick` is a short smoke
run (1 Mi values, 3 repetitions), `--ggml-only` times only ggml's block types, `--only
block32,nvfp4,Q8_0` only the schemes and types whose names contain one of those, `--no-torch` leaves
torch out, `--markdown PATH` writes this page (this text, then the run's tables), and `--peers GGML_TREE` also times ggml's own C kernels, compiled from a local ggml (or
llama.cpp) source tree as ggml's CMake build compiles them (`ggml-quants.c` with `gcc -O3`, the
CPU backend's files with `-O3 -march=native`) into a cached library in the temp folder and called
through ctypes (not in CI; nothing of ggml is kept in this repository).

How it measures, so that a shared, noisy machine still gives ratios worth reading:
- For each scheme, every call below is timed once per repetition, interleaved (the order rotated
  each repetition), and the median of the repetitions (`--repeat`, default 9) is kept. A ratio
  therefore compares calls made moments apart.
- One and two threads (`bq.set_num_threads(1)` / `(2)`, and `torch.set_num_threads` alike) are
  two cells of the same repetitions, the count set before each call, outside the timed region.
  On a VM a 2-thread call may start before the second worker has woken (see [threads.md](threads.md)): its
  repetitions are then bimodal, and the CPU / wall column says which way they went.
- Each cell also records the process's CPU time over its wall time: about 2 when a 2-thread call
  kept both cores busy, about 1 when its second thread idled; below 1 on a 1-thread call means
  the process waited for a core (the machine was busy): the checklist flags a ratio as noisy when
  one of the calls it is made of had less than 0.8 of a core.

The columns, per scheme (the presets, per-tensor int8 with a given scale, E4M3 with scale 1,
and a 128×128-block scheme):

| column | meaning |
|---|---|
| of copyto | throughput relative to `np.copyto` of the same float32 array, timed in the same repetitions (the memory-bandwidth yardstick): copyto's time / the call's time |
| cpu/wall | process CPU time / wall time of that call (median over repetitions) |
| 2T/1T | speed-up of two threads over one |
| vs numpy | times faster than an idiomatic vectorized numpy version of the scheme (`benches/bench_numpy.py`: blocks by reshape, `abs().max()`, a division, `np.rint`/`np.clip` in place, `astype`; ml_dtypes casts for FP8, a `searchsorted` table for FP4, NVFP4's two levels one after the other, the searched presets' candidate scales tried one at a time over all blocks), what a user writes without blockquant; "numpy bytes = bq" is the fraction of its stored bytes equal to blockquant's (its scales round by a plain cast and its ties go to even, so not all) |
| vs ref | times faster than `blockquant.reference`, the bit-exact numpy contract (the first `--ref-repeat` repetitions only: it is slow) |
| output | the timed quantize writes into caller-given arrays (`bq.quantize(x, scheme, out=(values, scales))`), or allocates ("new arrays") with a blockquant that has no `out=`; "new arrays 1T" times the allocating call beside it, whose first-touch page faults show |
| out= / new array | dequantize into a caller-given array (`qt.dequantize(out=...)`) and into a new one |
| torch | `torch.quantize_per_tensor` (qint8; its dequantize allocates) and `.to(torch.float8_e4m3fn)` (dequantized by `copy_` into a preallocated tensor), when torch is installed |
| floor: reads × read | the fastest any quantizer could run on this machine, of copyto: one read of the input (`x.max()`, a SIMD reduction at memory speed) times the reads a quantizer needs, 2 where a statistic of the whole tensor (per-tensor max, absmean, NVFP4's global scale) must be known before the first value is encoded and the tensor is larger than the caches |
| floor: one write | the fastest any dequantize into a float32 array could run, of copyto: one write of that array (libc's `memset` of a nonzero byte, whose large writes bypass the caches as blockquant's do; numpy's `fill` takes a quarter longer); reading the codes (a quarter of those bytes or less) overlaps it |

A second table times small calls: µs per call on 4096 values (200 calls a timed cell), new
arrays and the default pool, as a loop over many small tensors makes them, against the numpy
version and torch. There the fixed cost of a call shows, not the memory: on the 2-core VM a
quantize of such a row takes 8-27 µs (the searched presets the most), a dequantize 7-18 µs;
before small calls ran on the calling thread (Threads), every one paid 50-130 µs of thread
hand-over, and a loop quantizing and dequantizing 400 tensors of 64 Ki values ran 3.9-4.6x
slower (int8_block32 189 against 41 µs a tensor, nvfp4 255 against 64).

ggml's block types (`blockquant.gguf`) get the same treatment against `np.copyto`, gguf-py (on a
1 Mi-value slice, with a bytes-equal check; gguf-py is vectorized numpy, a few memory passes per
call, so "vs gguf-py" is about that number of passes once blockquant runs at the memory's pace:
a Q8_0 dequantize reads 1.06 bytes and writes 4 per value, and at 1.5× np.copyto it is already
near what the memory moves; no kernel can make it 20× a three-pass numpy expression) and, with `--peers`, ggml's `quantize_row_<type>`
(the CPU backend's `from_float`, AVX2 for Q8_0), `quantize_row_q8_0_ref` and
`dequantize_row_<type>` on 1 and 2 threads (two Python threads on half the blocks each). The run
ends with the speed targets of issues 13 and 11 as a checklist (issue 13's "every preset" lines for the presets only: the bare E4M3 cast and the 128×128 blocks are tabled with their own targets), each with its measured ratio
(`[ok]`, `[MISS]`, `[BOUND]` for a missed target that the floors above put out of any
quantizer's (or dequantize's) reach in that run while the call comes within 20% of the floor, with the arithmetic, or not measured; a searched preset's missed line also gives its time in multiples of the same scheme quantized with minmax's scales, the search's own cost, which issue 14 budgets), and, without `--quick`, the peak memory of each quantize
beyond its input and output (measured in a child process from Linux's peak-RSS mark).

Compare ratios within one run, never across runs or machines: on the project's 2-core VM a row
whose code did not change moves by ±20% between runs, and the 2-thread columns are bimodal.
"""


class Tee(io.TextIOBase):
    """Writes to the real stdout and keeps a copy."""

    def __init__(self, out) -> None:
        self.out = out
        self.kept = io.StringIO()

    def write(self, s: str) -> int:
        self.kept.write(s)
        return self.out.write(s)

    def flush(self) -> None:
        self.out.flush()


def to_markdown(printed: str) -> str:
    """The run's output as markdown: tables as they are, checklist lines as list items, other
    lines as paragraphs, a blank line around each table."""
    out: List[str] = []
    for line in printed.splitlines():
        is_row = line.startswith("|")
        if not line.strip():
            out.append("")
        elif is_row:
            if out and out[-1] and not out[-1].startswith("|"):
                out.append("")
            out.append(line)
        elif line.startswith("  ["):
            out.append("- `" + line.strip()[:7].strip() + "` " + line.strip()[7:].strip())
        else:
            if out and out[-1].startswith("|"):
                out.append("")
            out.append(line.strip())
    return "\n".join(out).strip() + "\n"


def write(path: str, printed: str, command: str) -> None:
    page = (
        "# Benchmarks\n\n"
        "<!-- Written by `python benches/bench.py --markdown docs/benchmarks.md`; do not edit by "
        "hand: run it again. -->\n\n"
        "## How it measures\n\n" + METHOD.strip() + "\n\n"
        "## The last run\n\n"
        f"`{command}`\n\n" + to_markdown(printed)
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"wrote {path}", file=sys.stderr)
