"""``bench.py --peers PATH``: ggml's own C row kernels, built from a local ggml tree, called
through ctypes on the same arrays as blockquant.

PATH is a ggml checkout (or llama.cpp's, whose ggml is under ggml/), or any folder inside one
such as a build folder. The three files that hold ggml's row kernels are compiled the way a
native ggml build compiles them (see build) into a small shared library in the temp folder,
cached by a hash of the sources and the flags. The CPU backend's ``quantize_row_<t>``
is ggml's ``from_float`` (AVX2 for Q8_0 on x86, the plain-C ``_ref`` rounding for the others),
``quantize_row_<t>_ref`` is what ``ggml_quantize_chunk`` uses for weights, and
``dequantize_row_<t>`` is ggml's ``to_float``. Nothing of ggml is kept in this repository: the
few symbols those files need from the rest of ggml are defined below (SHIM), in our own words.

Two threads: ctypes releases the GIL around a foreign call, so two Python threads each run the
kernel on half of the blocks, as ggml's own thread pool would split the rows.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np

# ggml's block sizes (values per block, bytes per block) for the types timed here.
BLOCKS: Dict[str, Tuple[int, int]] = {
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "MXFP4": (32, 17), "TQ1_0": (256, 54), "TQ2_0": (256, 66),
}

# What the compiled files need from the rest of ggml (ggml.c, ggml-cpu.c): the lookup tables the
# CPU backend fills at start-up, and error/size helpers the row kernels never reach.
SHIM = r"""
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[1 << 8];
float ggml_table_f32_ue4m3[1 << 8];

static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24)
            : e == 31 ? (m ? NAN : INFINITY)
            : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Filled when the library is loaded, as ggml_cpu_init fills them. */
__attribute__((constructor)) static void bench_fill_tables(void) {
    for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = half_to_float((uint16_t)i);
    /* E8M0 code e is 2^(e-127); ggml's table holds half of it. */
    for (int i = 0; i < 256; i++) ggml_table_f32_e8m0_half[i] = ldexpf(1.0f, i - 128);
    /* UE4M3 (bias 7, no sign), also halved; 0x7F (NaN) reads as 0. */
    for (int i = 0; i < 256; i++) {
        int e = (i >> 3) & 15, m = i & 7;
        float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + m / 8.0f, e - 7);
        ggml_table_f32_ue4m3[i] = (i & 0x7F) == 0x7F ? 0.0f : 0.5f * v;
    }
}

void ggml_abort(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ggml abort at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

static void unreachable(const char *what) {
    fprintf(stderr, "bench shim: %s is not available\n", what);
    abort();
}
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; unreachable("ggml_row_size"); return 0; }
size_t ggml_type_size(int type) { (void)type; unreachable("ggml_type_size"); return 0; }
const char *ggml_type_name(int type) { (void)type; unreachable("ggml_type_name"); return 0; }
"""


class PeerError(Exception):
    """The ggml tree could not be found or built (the message says why)."""


def find_sources(path: str) -> Path:
    """The folder holding ggml-quants.c and ggml-cpu/, searched from PATH and its parents."""
    start = Path(path).expanduser().resolve()
    if not start.exists():
        raise PeerError(f"{path}: no such folder")
    for base in [start, *start.parents]:
        for sub in ("", "src", "ggml/src"):
            d = base / sub
            if (d / "ggml-quants.c").is_file() and (d / "ggml-cpu" / "quants.c").is_file():
                return d
    raise PeerError(f"{path}: not in a ggml tree (no src/ggml-quants.c and src/ggml-cpu/quants.c)")


def _arch_file(src: Path) -> Optional[Path]:
    arch = {"x86_64": "x86", "amd64": "x86", "aarch64": "arm", "arm64": "arm"}.get(
        platform.machine().lower())
    f = src / "ggml-cpu" / "arch" / arch / "quants.c" if arch else None
    return f if f is not None and f.is_file() else None


def build(path: str, cc: Optional[str] = None) -> Tuple[Path, str]:
    """Compile (or reuse) the library; returns its path and a one-line description.

    As ggml's own CMake build does: ggml-quants.c (ggml-base: the ``_ref`` quantizers and every
    ``dequantize_row``) with -O3 for the generic target, the CPU backend's files with -O3
    -march=native. (-march=native on ggml-quants.c would let gcc fuse its ``x*id + 8.5f`` into
    one FMA and change a few Q4_0/Q5_0 codes in a million.)"""
    src = find_sources(path)
    cc = cc or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise PeerError("no C compiler (gcc or cc) on PATH")
    base = [src / "ggml-quants.c"]
    cpu = [src / "ggml-cpu" / "quants.c"]
    arch = _arch_file(src)
    if arch is not None:
        cpu.append(arch)
    common = ["-O3", "-fPIC", "-std=gnu11", "-DNDEBUG", "-D_GNU_SOURCE",
              f"-I{src}", f"-I{src.parent / 'include'}", f"-I{src / 'ggml-cpu'}"]
    native = [*common, "-march=native"]
    # v2: ggml-quants.c without -march=native (a library built otherwise is not reused)
    h = hashlib.sha256(" ".join(["v2", cc, *native]).encode() + SHIM.encode())
    for f in base + cpu:
        h.update(f.read_bytes())
    for header in sorted(src.glob("*.h")) + sorted((src / "ggml-cpu").glob("*.h")):
        h.update(header.read_bytes())
    cache = Path(tempfile.gettempdir()) / f"blockquant-bench-ggml-{h.hexdigest()[:16]}"
    lib = cache / "libggml-rows.so"
    rel = ", ".join(str(f.relative_to(src.parent)) for f in base + cpu)
    desc = (f"ggml at {src.parent} ({rel}; {Path(cc).name} -O3, the CPU backend's files "
            "-march=native, as ggml's CMake build)")
    if lib.is_file():
        return lib, desc
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "shim.c").write_text(SHIM)
    tag = os.getpid()
    objects = []
    for f, flags in [(f, common) for f in [*base, cache / "shim.c"]] + [(f, native) for f in cpu]:
        obj = cache / f"{f.parent.name}-{f.stem}.{tag}.o"
        _run([cc, *flags, "-c", str(f), "-o", str(obj)])
        objects.append(str(obj))
    tmp = cache / f"libggml-rows.{tag}.so"
    _run([cc, "-shared", *objects, "-o", str(tmp), "-lm"])
    os.replace(tmp, lib)  # another run building the same library at once gets a whole file
    for obj in objects:
        os.unlink(obj)
    return lib, desc


def _run(cmd) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise PeerError("building ggml failed: " + (res.stderr.strip().splitlines() or ["?"])[-1])


class Kernels:
    """ggml's row functions for one type, bound through ctypes on numpy arrays."""

    def __init__(self, lib: ctypes.CDLL, qtype: str, pool: ThreadPoolExecutor):
        self.qtype, self.pool = qtype, pool
        self.block, self.block_bytes = BLOCKS[qtype]
        t = qtype.lower()
        self.quantize_fn = self._bind(lib, f"quantize_row_{t}")
        self.quantize_ref_fn = self._bind(lib, f"quantize_row_{t}_ref")
        self.dequantize_fn = self._bind(lib, f"dequantize_row_{t}")

    @staticmethod
    def _bind(lib: ctypes.CDLL, name: str):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            fn.restype = None
        return fn

    def _run(self, fn, src: np.ndarray, dst: np.ndarray, src_per_block: int, dst_per_block: int,
             n_blocks: int, threads: int) -> None:
        a, b = src.ctypes.data, dst.ctypes.data
        if threads == 1:
            fn(a, b, n_blocks * self.block)
            return
        half = n_blocks // 2
        job = self.pool.submit(fn, a + half * src_per_block, b + half * dst_per_block,
                               (n_blocks - half) * self.block)
        fn(a, b, half * self.block)
        job.result()

    def _check(self, x: np.ndarray, blocks: np.ndarray) -> int:
        assert x.dtype == np.float32 and x.flags.c_contiguous and blocks.flags.c_contiguous
        assert x.size % self.block == 0 and blocks.nbytes == x.size // self.block * self.block_bytes
        return x.size // self.block

    def quantizer(self, x: np.ndarray, out: np.ndarray, threads: int,
                  ref: bool = False) -> Optional[Callable[[], None]]:
        fn = self.quantize_ref_fn if ref else self.quantize_fn
        if fn is None:
            return None
        n = self._check(x, out)
        return lambda: self._run(fn, x, out, self.block * 4, self.block_bytes, n, threads)

    def dequantizer(self, blocks: np.ndarray, out: np.ndarray,
                    threads: int) -> Optional[Callable[[], None]]:
        if self.dequantize_fn is None:
            return None
        n = self._check(out, blocks)
        return lambda: self._run(self.dequantize_fn, blocks, out, self.block_bytes, self.block * 4,
                                 n, threads)


def load(path: str) -> Tuple[Dict[str, Kernels], str]:
    """Build and load ggml's kernels for every type in BLOCKS that the tree has."""
    lib_path, desc = build(path)
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as e:  # e.g. a symbol of ggml that SHIM does not stand in for (another version)
        raise PeerError(f"loading the ggml build failed: {e}") from None
    pool = ThreadPoolExecutor(max_workers=1)  # the second thread; the caller's is the first
    kernels = {t: Kernels(lib, t, pool) for t in BLOCKS}
    return {t: k for t, k in kernels.items() if k.quantize_fn or k.dequantize_fn}, desc
