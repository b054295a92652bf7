"""No leaks: 10,000 quantize / dequantize / bytes round trips keep the process's memory flat.

Resident memory is read from /proc/self/statm after a warm-up of 1,000 round trips (allocator
pools, the thread pool and numpy's caches settle there), then after 10,000 more. The bound is
generous (20 MiB) against noise; a leak of even one small array per round trip (10,000 × the
2 KiB-4 KiB arrays here) would blow it. Failing calls are in the loop too: error paths build
Python exceptions from Rust and are where leaks like to hide.
"""

from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest

import blockquant as bq

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/statm"
)

SCHEMES = [
    bq.presets.nvfp4(),
    bq.presets.int8_block32(),
    bq.presets.int4_block32(),
    bq.presets.mxfp8(),
    bq.presets.bitnet(),
]


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def round_trip(i: int, xs: list, bad: np.ndarray) -> None:
    x = xs[i % len(xs)]
    s = SCHEMES[i % len(SCHEMES)]
    qt = bq.quantize(x, s)
    y = qt.dequantize()
    data = qt.to_bytes()
    back = bq.QTensor.from_bytes(data, s, x.shape)
    parts = bq.QTensor.from_parts(back.values, back.scales, s, x.shape,
                                  global_scale=back.global_scale)
    assert y.shape == x.shape and parts.nbytes == len(data)
    if i % 10 == 0:  # the error paths
        for call in (
            lambda: bq.quantize(bad, s),
            lambda: bq.QTensor.from_bytes(data[:-1], s, x.shape),
            lambda: bq.QTensor.from_parts(back.values, back.scales * 0 - 1, s, x.shape),
        ):
            try:
                call()
            except bq.QuantError:
                pass
            else:  # pragma: no cover
                raise AssertionError("expected a QuantError")


def test_ten_thousand_round_trips_keep_memory_flat():
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((8, 64)).astype(np.float32),
          rng.standard_normal((4, 32)).astype(np.float16),
          rng.standard_normal(256)]
    bad = xs[0].copy()
    bad[3, 7] = np.nan
    for i in range(1000):
        round_trip(i, xs, bad)
    gc.collect()
    before = rss()
    for i in range(10_000):
        round_trip(i, xs, bad)
    gc.collect()
    growth = rss() - before
    assert growth < 20 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 10,000 round trips"
