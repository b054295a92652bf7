"""burn loads what blockquant writes: bit for bit, through burn 0.22.1 itself.

Runs the checker in tests/burn_interop (a standalone crate pinned to burn 0.22.1): it reads a
``.bpk`` file with burn-store's ``BurnpackStore``, builds every tensor with
``Tensor::from_data`` on the flex CPU backend, dequantizes, and prints the f32 bit patterns.
Build it once and point ``BLOCKQUANT_BURN_CHECKER`` at the binary::

    cd tests/burn_interop && CARGO_TARGET_DIR=/tmp/burn-checker cargo build --release
    export BLOCKQUANT_BURN_CHECKER=/tmp/burn-checker/release/burn-interop-checker
    pytest tests/test_burn_interop.py

Without the variable this module is skipped. Every case has an expected outcome: schemes burn
0.22.1 loads must match ``qt.dequantize()`` exactly; the ones it cannot load are listed below
with the reason and must still fail (``xfail(strict=True)``), so a burn upgrade or a layout change
that makes one work shows up as a failure to update the list, not as silence.
"""

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import blockquant as bq
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype
from blockquant.burnpack import save_burnpack

CHECKER = os.environ.get("BLOCKQUANT_BURN_CHECKER")
if not CHECKER:
    pytest.skip(
        "BLOCKQUANT_BURN_CHECKER is not set: build tests/burn_interop (cargo build --release) "
        "and set it to the burn-interop-checker binary to check files against burn 0.22.1",
        allow_module_level=True,
    )

SAMPLES = Path(__file__).parent / "burn_interop" / "samples"
V, D = QuantValue, ScaleDtype
Native, U32, PN = QuantStore.Native, QuantStore.packed_u32, QuantStore.packed_native


@dataclass(frozen=True)
class Refusal:
    """Why burn 0.22.1 does not reproduce a scheme, and how that shows: ``panic`` is a piece of
    the message burn fails with, or None when burn loads the tensor with other values, or
    ``"any"`` when it does either (a debug build panics on an overflow a release build wraps)."""

    reason: str
    panic: Optional[str]

    def and_(self, more: "Refusal") -> "Refusal":
        return Refusal(f"{self.reason}; {more.reason}", self.panic)


# burn-std 0.22.1 quantization.rs `split_values_off`, burn-flex 0.22.1 ops/qtensor.rs; the
# issue's note /tmp/burn_layout.md has the line references.
FLOAT_CODES = Refusal(
    "burn 0.22.1's flex dequantize multiplies the stored float code as an integer: "
    "E4M3/E5M2/E2M1 are not decoded (0.23 decodes them)",
    None,
)
FLOAT_PACKED = Refusal(
    "burn 0.22.1 cannot unpack float values from PackedU32 (unimplemented!)", "not implemented"
)
PACKED_NATIVE = Refusal(
    "burn 0.22.1 cannot read PackedNative at all (unimplemented!)", "not implemented"
)
OUTER = Refusal(
    "burn 0.22.1 asserts packing along the innermost dim (0.23 reads the packed axis swapped "
    "innermost, as blockquant now writes it: samples/quantized_bytes_0.23.jsonl)",
    "innermost",
)
SCALAR = Refusal("burn has no 0-d tensors: Tensor::from_data refuses rank 0", "0-dim tensor")
EMPTY_BLOCKS = Refusal(
    "burn-flex 0.22.1 refuses a quantized tensor without scales (FlexQTensor::new), which an "
    "empty tensor under a block level is",
    "at least one scale",
)
RAGGED = Refusal(
    "burn 0.22.1 reads PackedU32 words as one flat run: lines that are not whole words "
    "(blockquant pads each line, as 0.23 does) are misread",
    "any",
)


def burn_0_22_refusal(scheme: QuantScheme, shape: tuple) -> Optional[Refusal]:
    """Why burn 0.22.1 does not reproduce ``scheme`` on ``shape``, or None if it must."""
    store, value = scheme.store, scheme.value
    if shape == ():
        return SCALAR
    if 0 in shape and scheme.block is not None:
        return EMPTY_BLOCKS
    if store.kind == "packed_native":
        return PACKED_NATIVE.and_(OUTER) if store.dim > 0 else PACKED_NATIVE
    if store.kind == "packed_u32" and store.dim > 0:
        return OUTER
    if value.is_float:
        return FLOAT_PACKED if store.kind == "packed_u32" else FLOAT_CODES
    per = 32 // value.bits
    if store.kind == "packed_u32" and shape[-1] % per:
        return RAGGED
    return None


@dataclass(frozen=True)
class Case:
    name: str
    scheme: QuantScheme
    shape: tuple

    @property
    def refusal(self) -> Optional[Refusal]:
        return burn_0_22_refusal(self.scheme, self.shape)


def cases() -> list:
    out = []

    def add(name, scheme, shape):
        out.append(Case(f"{name}:{scheme}:{'x'.join(map(str, shape)) or 'scalar'}", scheme, shape))

    for value in V:
        base = QuantScheme(value, Native)
        add("native_no_level", base, (3, 10))
        add("native_tensor_f32", base.per_tensor(D.F32), (3, 10))
        add("u32_whole_words", base.with_store(U32(0)).per_block([8], D.F16), (3, 32))
        add("u32_ragged", base.with_store(U32(0)), (3, 5))
        add("u32_outer", base.with_store(U32(1)).per_block([2, 1], D.F32), (5, 4))
        add("packed_native", base.with_store(PN(0)).per_block([4], D.F16), (3, 8))
        add("packed_native_outer", base.with_store(PN(1)), (4, 6))
    for dtype in D:
        q8 = QuantScheme(V.Q8S, Native)
        add("per_tensor", q8.per_tensor(dtype), (4, 6))
        add("block_1d_partial", q8.per_block([5], dtype), (3, 12))
        add("block_2d_partial", QuantScheme(V.Q4F, U32(0)).per_block([2, 3], dtype), (5, 16))
    add("block_3d_partial", QuantScheme(V.Q8F, Native).per_block([2, 3, 4], D.BF16), (3, 5, 6))
    add("block_of_one", QuantScheme(V.Q8S, Native).per_block([1], D.F32), (2, 3))
    add("two_level", QuantScheme(V.Q8S, Native).per_block([4], D.UE4M3).per_tensor(D.F32), (3, 10))
    add("two_level_2d", QuantScheme(V.Q4S, U32(0)).per_block([2, 4], D.F16).per_tensor(D.F32),
        (3, 16))  # fmt: skip
    add("two_level_q2", QuantScheme(V.Q2F, U32(0)).per_block([16], D.UE4M3).per_tensor(D.F32),
        (2, 32))  # fmt: skip
    add("rank_1", QuantScheme(V.Q4S, U32(0)).per_block([8], D.UE8M0), (40,))
    add("rank_4", QuantScheme(V.Q8F, Native).per_block([2, 2], D.F16), (2, 3, 4, 5))
    add("scalar", QuantScheme(V.Q8S, Native), ())
    add("scalar_block", QuantScheme(V.Q8S, Native).per_block([4], D.F16), ())
    add("empty", QuantScheme(V.Q8S, Native), (0, 8))
    add("empty_u32", QuantScheme(V.Q4S, U32(0)).per_tensor(D.F16), (0, 16))
    add("empty_block", QuantScheme(V.Q8S, Native).per_block([4], D.F16), (0, 8))
    for name, preset in bq.presets.PRESETS.items():
        add(f"preset_{name}", preset(), (4, 64))
    return out


CASES = {c.name: c for c in cases()}


def run_checker(path: Path) -> dict:
    proc = subprocess.run([CHECKER, str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the checker refused {path}: {proc.stdout}{proc.stderr}"
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return {line["name"]: line for line in lines}


def data(shape: tuple, seed: int) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(np.float32)
    if x.ndim >= 1 and x.size:
        x.reshape(-1)[: max(1, x.size // 8)] = 0  # a zero block or two: zero scales
    return x


@pytest.fixture(scope="module")
def burn_results(tmp_path_factory):
    qts = {
        name: bq.quantize(data(c.shape, i), c.scheme) for i, (name, c) in enumerate(CASES.items())
    }
    path = tmp_path_factory.mktemp("interop") / "cases.bpk"
    save_burnpack(path, qts)
    return qts, run_checker(path)


def assert_same_bits(burn: dict, expected: np.ndarray) -> None:
    assert "error" not in burn, f"burn refused it: {burn['error']}"
    assert burn["shape"] == list(expected.shape)
    got = np.array(burn["f32"], dtype=np.uint32)
    want = np.ascontiguousarray(expected, dtype=np.float32).reshape(-1).view(np.uint32)
    mismatched = np.flatnonzero(got != want)
    assert got.shape == want.shape and mismatched.size == 0, (
        f"{mismatched.size} of {want.size} values differ, first at {mismatched[:1]}"
    )


def values_differ(burn: dict, expected: np.ndarray) -> bool:
    got = np.array(burn["f32"], dtype=np.uint32)
    want = np.ascontiguousarray(expected, dtype=np.float32).reshape(-1).view(np.uint32)
    return got.shape != want.shape or bool(np.any(got != want))


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.refusal is None])
def test_burn_dequantizes_bit_for_bit(burn_results, name):
    qts, burn = burn_results
    assert_same_bits(burn[name], qts[name].dequantize())


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.refusal is not None])
def test_burn_0_22_still_refuses(burn_results, name):
    """The known failures, each checked to fail the way its reason says; reported as xfail."""
    qts, burn = burn_results
    refusal, result = CASES[name].refusal, burn[name]
    if "error" in result:
        assert refusal.panic is not None, f"expected other values, burn failed: {result['error']}"
        assert refusal.panic == "any" or refusal.panic in result["error"], result["error"]
    else:
        assert refusal.panic in (None, "any"), f"expected a panic with {refusal.panic!r}"
        assert values_differ(result, qts[name].dequantize()), (
            "burn 0.22.1 now reproduces this scheme: take it off the known failures"
        )
    pytest.xfail(refusal.reason)


MODULE_CASES = {
    "q8s_block_2d": (QuantScheme(V.Q8S, Native).per_block([2, 3], D.F16), (5, 7)),
    "q4s_two_level": (QuantScheme(V.Q4S, U32(0)).per_block([16], D.UE4M3).per_tensor(D.F32),
                      (3, 32)),
    "int8": (bq.presets.int8(), (4, 4)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MODULE_CASES))
def test_a_module_parameter_loads_bit_for_bit(tmp_path, name):
    scheme, shape = MODULE_CASES[name]
    qt = bq.quantize(data(shape, 7), scheme)
    save_burnpack(tmp_path / "m.bpk", {"weight": qt})
    burn = run_checker(tmp_path / "m.bpk")
    assert_same_bits(burn["weight"], qt.dequantize())
    assert_same_bits(burn["module.weight"], qt.dequantize())


def test_plain_tensors_keep_their_bytes(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {
        dt: (rng.standard_normal((3, 4)) * 100).astype(dt)
        for dt in ["float64", "float32", "float16", "int64", "int32", "int16", "int8",
                   "uint64", "uint32", "uint16", "uint8"]
    }  # fmt: skip
    tensors["bool"] = rng.standard_normal(7) > 0
    try:
        import ml_dtypes

        tensors["bfloat16"] = rng.standard_normal(5).astype(ml_dtypes.bfloat16)
    except ImportError:
        pass
    save_burnpack(tmp_path / "p.bpk", tensors)
    burn = run_checker(tmp_path / "p.bpk")
    for name, a in tensors.items():
        assert "error" not in burn[name], burn[name]["error"]
        raw = a.view(np.uint16) if name == "bfloat16" else a
        want = np.ascontiguousarray(raw, dtype=raw.dtype.newbyteorder("<")).tobytes()
        assert bytes.fromhex(burn[name]["hex"]) == want, name


def test_burn_writes_the_committed_samples_and_we_write_the_same(tmp_path):
    proc = subprocess.run(
        [CHECKER, "--write-samples", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    for sample in ("sample.bpk", "sample_extras.bpk"):
        assert (tmp_path / sample).read_bytes() == (SAMPLES / sample).read_bytes(), (
            f"burn writes a different {sample}: regenerate tests/burn_interop/samples"
        )
    from test_burnpack import SAMPLE_META, sample_tensors

    save_burnpack(tmp_path / "ours.bpk", sample_tensors(), metadata=SAMPLE_META)
    assert (tmp_path / "ours.bpk").read_bytes() == (tmp_path / "sample.bpk").read_bytes()
