"""atheris fuzz target: rebuilding quantized tensors from arbitrary bytes never crashes.

Each input is decoded (``decode``) into a scheme, a shape and an operation, then run
(``run_one``):

- ``from_bytes``: ``QTensor.from_bytes`` on the input's tail (often cut or padded to the exact
  length, so the content is explored and not only the length check); on success
  ``to_bytes()`` gives the same bytes back, ``dequantize()`` works, and
  ``blockquant.reference.from_bytes`` agrees on the verdict and the parts;
- ``from_parts``: ``QTensor.from_parts`` with values of a drawn dtype and shape (usually the
  right ones) filled from the input, scales from the input's bits (NaN, negative, anything) or
  rounded to their dtype, and a per-tensor scale or none; on success the bytes round-trip;
- ``core``: the binding (``blockquant._core``) called directly with a raw core scheme (bad
  names, bad block sizes, packing dims past the rank), a raw shape and raw arrays, bypassing the
  Python checks: the core must re-check everything itself.

Only ``blockquant.QuantError`` (and subclasses) and ``TypeError`` may escape (format.md "Errors"); anything
else, an ``InternalError`` (a caught Rust panic) included, is a crash. A Rust abort or segfault
kills the process, which libFuzzer reports as a crash too.

Run it (atheris is a dev tool, not a dependency: ``pip install atheris``)::

    tests/fuzz/run.sh 60              # 60 s, seeded, crashes saved to tests/fuzz/crashes/
    python tests/fuzz/fuzz_bytes.py -max_total_time=60 -artifact_prefix=tests/fuzz/crashes/ DIR

Every file in ``tests/fuzz/crashes/`` is replayed by ``tests/test_fuzz_regressions.py``, along
with the seeds below, so a crash found once stays fixed. Coverage guidance comes from the
Python layers (atheris instruments them); the Rust core is not instrumented, so inside it the
fuzzer is blind and relies on volume and on the seeds.
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Any

import numpy as np

_instrument: Any = contextlib.nullcontext()
if __name__ == "__main__":  # fuzzing: coverage of blockquant's Python code guides atheris
    import atheris

    _instrument = atheris.instrument_imports(include=["blockquant"])
with _instrument:
    import blockquant as bq
    import blockquant.reference as ref
    from blockquant import QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype

ALLOWED = (bq.QuantError, TypeError)
VALUES = [v for v in QuantValue if not v.is_unsigned]
DTYPES = list(ScaleDtype)
HUGE = [2**16 + 1, 2**31, 2**33 + 1, 2**40, 2**62, 2**63, 2**64 - 1]
STORAGE_DTYPES = [None, np.int8, np.uint8, np.uint32, np.int16, np.float32, ">u4"]


class Reader:
    """Reads choices off the input; past its end every byte reads as 0."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        b = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return b

    def pick(self, seq: list) -> Any:
        return seq[self.byte() % len(seq)]

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out


def _dims(r: Reader, huge_ok: bool) -> tuple[int, ...]:
    dims = []
    for _ in range(r.byte() % 5):
        b = r.byte()
        dims.append(r.pick(HUGE) if huge_ok and b >= 248 else b % 9)
    return tuple(dims)


def _scheme(r: Reader) -> QuantScheme:
    """A scheme through the public builders (which may refuse it: SchemeError, TypeError)."""
    s = QuantScheme(r.pick(VALUES))
    kind = r.pick(["native", "packed_u32", "packed_native"])
    s = s.with_store(QuantStore.Native if kind == "native" else QuantStore(kind, r.byte() % 5))
    level = r.byte() % 4
    if level in (1, 3):
        s = s.per_tensor(r.pick(DTYPES))
    if level in (2, 3):
        s = s.per_block([1 + r.byte() % 20 for _ in range(1 + r.byte() % 6)], r.pick(DTYPES))
    if r.byte() == 255:
        if r.byte() % 4 == 0:
            s = s.with_mode(QuantMode.Lookup)  # without a codebook: SchemeError
        else:  # a codebook of 4 or 16 entries (the wrong width, a repeat: SchemeError)
            n = 16 if r.byte() % 2 else 4
            s = s.with_codebook([(r.byte() - 128) / 8 for _ in range(n)])
    return s


def _fill(data: bytes, n: int) -> bytes:
    """``n`` bytes: ``data`` repeated or cut (zeros when there is no data)."""
    if n <= 0:
        return b""
    if not data:
        return bytes(n)
    return (data * (n // len(data) + 1))[:n]


def _check_tensor(qt: bq.QTensor, scheme: QuantScheme) -> None:
    data = qt.to_bytes()
    assert len(data) == qt.nbytes
    assert bq.QTensor.from_bytes(data, scheme, qt.shape).to_bytes() == data
    out = qt.dequantize()
    assert out.shape == qt.shape and out.dtype == np.float32
    repr(qt)


def _run_from_bytes(r: Reader) -> None:
    try:
        scheme = _scheme(r)
    except ALLOWED:
        return
    shape = _dims(r, huge_ok=True)
    tail = r.rest()
    mode = tail[0] % 4 if tail else 0
    data = tail[1:]
    if mode != 0:  # most of the time: exactly the expected length (when there is one)
        try:
            n = scheme.layout(shape).nbytes
        except ALLOWED:
            n = None  # an invalid scheme/shape pair
        if n is not None and n <= 1 << 16:
            data = _fill(data, n)
    # Compared with the reference, whose per-axis index arrays are as long as each dim.
    small = math.prod(max(d, 1) for d in shape) <= 4096
    try:
        qt = bq.QTensor.from_bytes(data, scheme, shape)
    except ALLOWED as e:
        # The reference must reject the same input, with the same class.
        if small:
            try:
                ref.from_bytes(data, scheme, shape)
            except ALLOWED as e_ref:
                assert type(e_ref) is type(e), (e, e_ref)
            else:
                raise AssertionError(f"blockquant raised {e!r}, the reference accepted") from e
        return
    out = qt.to_bytes()
    assert out == data, f"to_bytes() gave {out.hex()} for {data.hex()}"
    if small:
        try:
            want = ref.from_bytes(data, scheme, shape)
        except ALLOWED as e:
            raise AssertionError(f"blockquant accepted, the reference raised {e!r}") from e
        assert want.to_bytes() == data
        np.testing.assert_array_equal(qt.values, want.values)
        with np.errstate(invalid="ignore", over="ignore"):
            np.testing.assert_array_equal(qt.dequantize(), want.dequantize())
    _check_tensor(qt, scheme)


def _parts(r: Reader, storage_shape: list, storage_dtype: str, grid: list):
    dt = r.pick(STORAGE_DTYPES) or storage_dtype
    shape = list(storage_shape)
    how = r.byte() % 8
    if how == 1 and shape:
        shape[r.byte() % len(shape)] += 1
    elif how == 2 and shape:
        shape.pop()
    elif how == 3:
        shape.append(1)
    dt = np.dtype(dt)
    scale_bits = bytes(r.byte() for _ in range(8))
    n = math.prod(shape)
    if n * dt.itemsize > 1 << 20:  # a 0 dim turned into 1 beside huge ones: stay small
        shape, n = list(storage_shape), math.prod(storage_shape)
    values = np.frombuffer(_fill(r.rest()[:4096] or b"\0", n * dt.itemsize), dtype=dt)
    values = values.reshape(shape).copy()
    raw = np.frombuffer(_fill(scale_bits, 4 * math.prod(grid)), np.float32)
    return values, raw.reshape(grid).copy()


def _run_from_parts(r: Reader) -> None:
    try:
        scheme = _scheme(r)
    except ALLOWED:
        return
    shape = _dims(r, huge_ok=False)
    g_kind = r.byte() % 4
    g_bits = bytes(r.byte() for _ in range(4))
    scales_kind = r.byte() % 3
    try:
        lay = scheme.layout(shape)
    except ALLOWED:
        return
    storage_shape, storage_dtype, grid = lay.storage_shape, lay.storage_dtype, lay.scale_grid
    values, scales = _parts(r, storage_shape, storage_dtype, grid)
    if scales_kind:  # representable scales, so the value checks get their turn
        with np.errstate(invalid="ignore", over="ignore"):
            finite = np.nan_to_num(np.abs(scales), posinf=1.0, neginf=1.0)
        scales = bq.round_scale(finite, scheme.scale_dtype)
    g = [None, 1.0, float(np.frombuffer(g_bits, np.float32)[0]), 0.0][g_kind]
    before = (values.tobytes(), scales.tobytes())
    try:
        qt = bq.QTensor.from_parts(values, scales, scheme, shape, global_scale=g)
    except ALLOWED:
        assert (values.tobytes(), scales.tobytes()) == before, "from_parts wrote its arguments"
        return
    assert (values.tobytes(), scales.tobytes()) == before
    _check_tensor(qt, scheme)


def _raw_spec(r: Reader) -> dict:
    """The core scheme's constructor arguments, with nothing checked."""
    names = [v.value for v in VALUES] + ["Q9", ""]
    dnames = [d.value for d in DTYPES] + ["F8", "f32"]
    block = [r.byte() % 40 for _ in range(r.byte() % 8)] if r.byte() % 2 else None
    return dict(
        value=r.pick(names),
        store=r.pick(["native", "packed_u32", "packed_native", "packed"]),
        dim=r.byte() % 6,
        mode=r.pick(["Symmetric", "Symmetric", "Lookup", "Other"]),
        tensor=r.pick([None, *dnames]),
        block_size=block,
        block_dtype=r.pick([None, *dnames]) if block is not None else None,
        codebook=r.pick([None, None, [(r.byte() - 128) / 4 for _ in range(r.pick([4, 16, 3]))]]),
    )


def _run_core(r: Reader) -> None:
    """The binding called directly, behind the Python layer's checks."""
    try:
        spec = bq._core.Scheme(**_raw_spec(r))
    except ALLOWED:
        spec = None
    shape = list(_dims(r, huge_ok=True))
    op = r.byte() % 4
    if spec is None:
        return
    try:
        info = spec.layout(shape)
    except ALLOWED:
        info = None
    if op == 0 or info is None:
        data = r.rest()
        if info is not None and data and data[0] % 2 and info.nbytes <= 1 << 16:
            data = _fill(data[1:], info.nbytes)
        try:
            values, scales, g = bq._core.from_bytes(data, spec, shape)
        except ALLOWED:
            return
        out = bq._core.to_bytes(values, scales, g, spec, shape)
        assert out == data, f"to_bytes gave {out.hex()} for {data.hex()}"
        bq._core.dequantize(values, scales, g, spec, shape)
        return
    storage_shape, storage_dtype, grid = info.storage_shape, info.storage_dtype, info.scale_grid
    if math.prod(storage_shape) > 1 << 16:
        return
    values, scales = _parts(r, storage_shape, storage_dtype, grid)
    g = [None, 1.0, -1.0, float("nan")][r.byte() % 4]
    if r.byte() % 4 == 0:
        values = values[..., ::-1] if values.ndim else values  # not C-contiguous
    fn = [bq._core.check_parts, bq._core.dequantize, bq._core.to_bytes][op - 1]
    try:
        fn(values, scales, g, spec, shape)
    except ALLOWED:
        return


def decode(data: bytes) -> tuple[str, Reader]:
    r = Reader(data)
    return r.pick(["from_bytes", "from_bytes", "from_parts", "core"]), r


def run_one(data: bytes) -> None:
    """One fuzz input: raises (AssertionError, InternalError, ...) only on a real failure."""
    op, r = decode(data)
    with np.errstate(all="ignore"):
        if op == "from_bytes":
            _run_from_bytes(r)
        elif op == "from_parts":
            _run_from_parts(r)
        else:
            _run_core(r)


# A few inputs that reach every operation: the seed corpus, replayed by the regression test.
SEEDS = [
    b"",
    bytes([0, 6, 2, 0, 2, 3, 1, 1, 3, 8, 0, 1]) + bytes(range(64)),  # from_bytes, NVFP4-like
    bytes([1, 1, 0, 3, 2, 1, 16, 1, 2, 3, 40, 1]) + b"\xff" * 40,
    bytes([2, 0, 0, 1, 0, 0, 2, 3, 5, 1, 0, 0, 1, 2]) + bytes(range(200)),  # from_parts
    bytes([2, 5, 2, 1, 2, 4, 1, 9, 1, 3, 0, 1, 0, 1, 1, 1]) + b"\x7f\x80" * 64,
    bytes([3, 0, 0, 0, 0, 0, 0, 0, 1, 3, 0]) + bytes(32),  # core
    bytes([3, 1, 1, 1, 1, 1, 1, 5, 1, 2, 2, 8, 2, 1, 0]) + bytes(range(100)),
    bytes([3, 9, 3, 5, 3, 3, 1, 7, 0, 0, 0, 0, 1, 2, 2, 255, 3]) + b"\x01" * 50,
]


def main() -> None:
    import atheris

    if "--write-seeds" in sys.argv:
        from pathlib import Path

        out = Path(sys.argv[sys.argv.index("--write-seeds") + 1])
        out.mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(SEEDS):
            (out / f"seed-{i}").write_bytes(seed)
        return
    atheris.Setup(sys.argv, run_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
