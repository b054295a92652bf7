"""Replays the fuzz target's inputs (tests/fuzz/fuzz_bytes.py) without atheris.

- every input in tests/fuzz/crashes/ (a crash found once stays fixed: libFuzzer writes crashing
  inputs there when run through tests/fuzz/run.sh; keep them in git);
- the target's seed corpus, which reaches every operation it has;
- a fixed pseudo-random corpus, so the replay is never empty and every run covers the same
  ground.

``run_one`` raises only on a real failure: an exception other than QuantError/TypeError (an
InternalError from a caught Rust panic included), a from_bytes that does not give the same
bytes back, or a disagreement with blockquant.reference.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

pytest.importorskip("ml_dtypes")

FUZZ_DIR = Path(__file__).resolve().parent / "fuzz"
_spec = importlib.util.spec_from_file_location("fuzz_bytes", FUZZ_DIR / "fuzz_bytes.py")
fuzz_bytes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz_bytes)

CRASHES = sorted(
    p for p in (FUZZ_DIR / "crashes").glob("*") if p.is_file() and not p.name.endswith(".md")
)


def test_saved_crash_inputs():
    for path in CRASHES:
        try:
            fuzz_bytes.run_one(path.read_bytes())
        except BaseException as e:
            raise AssertionError(f"tests/fuzz/crashes/{path.name} fails again: {e!r}") from e


@pytest.mark.parametrize("index", range(len(fuzz_bytes.SEEDS)))
def test_seed_corpus(index):
    fuzz_bytes.run_one(fuzz_bytes.SEEDS[index])


def test_fixed_random_corpus():
    rnd = random.Random(20240605)
    ops = set()
    for _ in range(1500):
        data = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 160)))
        ops.add(fuzz_bytes.decode(data)[0])
        fuzz_bytes.run_one(data)
    assert ops == {"from_bytes", "from_parts", "core"}
