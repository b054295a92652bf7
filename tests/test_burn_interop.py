"""burn loads what blockquant writes: bit for bit, through burn itself (0.22.1 and 0.23.0-pre.1).

Runs the checkers in tests/burn_interop (standalone crates, one pinned to burn 0.22.1, one in
``checker-0.23/`` to burn 0.23.0-pre.1, the same program): each reads a ``.bpk`` file with
burn-store's ``BurnpackStore``, builds every tensor with ``Tensor::from_data`` on the flex CPU
backend, dequantizes, and prints the f32 bit patterns. Build them and point the variables at the
binaries (tests/burn_interop/README.md; ``.ci/run`` does this)::

    export BLOCKQUANT_BURN_CHECKER=.../debug/burn-interop-checker            # burn 0.22.1
    export BLOCKQUANT_BURN_CHECKER_0_23=.../debug/burn-interop-checker-0-23  # burn 0.23.0-pre.1
    pytest tests/test_burn_interop.py

A version whose variable is unset is skipped, or fails when ``BLOCKQUANT_REQUIRE_BURN=1`` (CI
sets it, so the check cannot quietly stop running). Every case has an expected outcome per
version: the schemes a version loads must match ``qt.dequantize()`` exactly; the ones it cannot
load are listed below with the reason and must still fail (reported as xfail), so a burn upgrade
or a layout change that makes one work shows up as a failure to update the list, not as silence.
"""

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest

import blockquant as bq
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype
from blockquant.burnpack import BURN_BLOCK_MAX, save_burnpack

SAMPLES = Path(__file__).parent / "burn_interop" / "samples"
V, D = QuantValue, ScaleDtype
Native, U32, PN = QuantStore.Native, QuantStore.packed_u32, QuantStore.packed_native


@dataclass(frozen=True)
class Refusal:
    """Why a burn version does not reproduce a scheme, and how that shows: ``panic`` is a piece
    of the message burn fails with, or None when burn loads the tensor with other values, or
    ``"any"`` when it does either (a debug build panics on an overflow a release build wraps)."""

    reason: str
    panic: Optional[str]

    def and_(self, more: "Refusal") -> "Refusal":
        return Refusal(f"{self.reason}; {more.reason}", self.panic)


# Both versions. burn-flex ops/qtensor.rs (FlexQTensor::new) in 0.22.1 and 0.23.0-pre.1.
SCALAR = Refusal("burn has no 0-d tensors: Tensor::from_data refuses rank 0", "0-dim tensor")
EMPTY_BLOCKS = Refusal(
    "burn-flex refuses a quantized tensor without scales (FlexQTensor::new), which an empty "
    "tensor under a block level is",
    "at least one scale",
)

# burn 0.22.1: burn-std quantization.rs `split_values_off`, burn-flex ops/qtensor.rs; the
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
RAGGED = Refusal(
    "burn 0.22.1 reads PackedU32 words as one flat run: lines that are not whole words "
    "(blockquant pads each line, as 0.23 does) are misread",
    "any",
)

# burn 0.23.0-pre.1: burn-store's bridge checks the bytes against burn-std's quantized layout
# for the shape before any tensor is built, and that layout has no block grid on rank 0.
SCALAR_BLOCK = Refusal(
    "burn 0.23's quantized layout has no block grid for a 0-d shape: burn-store refuses the "
    "bytes of a block scheme on rank 0 before building a tensor (which rank 0 could not be)",
    "Quantized layout for shape []",
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


def burn_0_23_refusal(scheme: QuantScheme, shape: tuple) -> Optional[Refusal]:
    """Why burn 0.23.0-pre.1 does not reproduce ``scheme`` on ``shape``, or None if it must:
    every value, store, packing axis and scale level loads; only shapes burn has no tensor for
    are refused."""
    if shape == ():
        return SCALAR_BLOCK if scheme.block is not None else SCALAR
    if 0 in shape and scheme.block is not None:
        return EMPTY_BLOCKS
    return None


@dataclass(frozen=True)
class Burn:
    """One burn version the test checks against: its checker binary comes from ``env``."""

    version: str
    env: str
    refusal: Callable[[QuantScheme, tuple], Optional[Refusal]]

    def checker(self) -> str:
        path = os.environ.get(self.env)
        if not path:
            why = (
                f"{self.env} is not set: build the burn {self.version} checker "
                "(tests/burn_interop/README.md) and set it to the binary"
            )
            if os.environ.get("BLOCKQUANT_REQUIRE_BURN") == "1":
                pytest.fail(f"BLOCKQUANT_REQUIRE_BURN=1 but {why}", pytrace=False)
            pytest.skip(why)
        return path


BURNS = {
    b.version: b
    for b in [
        Burn("0.22.1", "BLOCKQUANT_BURN_CHECKER", burn_0_22_refusal),
        Burn("0.23.0-pre.1", "BLOCKQUANT_BURN_CHECKER_0_23", burn_0_23_refusal),
    ]
}


@dataclass(frozen=True)
class Case:
    name: str
    scheme: QuantScheme
    shape: tuple


def cases() -> list:
    out = []

    def add(name, scheme, shape):
        out.append(Case(f"{name}:{scheme}:{'x'.join(map(str, shape)) or 'scalar'}", scheme, shape))

    for value in [v for v in V if not v.is_unsigned]:
        base = QuantScheme(value, Native)
        add("native_no_level", base, (3, 10))
        add("native_tensor_f32", base.per_tensor(D.F32), (3, 10))
        add("u32_whole_words", base.with_store(U32(0)).per_block([8], D.F16), (3, 32))
        add("u32_ragged", base.with_store(U32(0)), (3, 5))
        add("u32_ragged_block", base.with_store(U32(0)).per_block([3], D.BF16), (2, 7))
        add("u32_outer", base.with_store(U32(1)).per_block([2, 1], D.F32), (5, 4))
        add("u32_outer_rank3", base.with_store(U32(2)).per_block([2, 2], D.F16), (5, 3, 2))
        add("packed_native", base.with_store(PN(0)).per_block([4], D.F16), (3, 8))
        add("packed_native_ragged", base.with_store(PN(0)).per_tensor(D.F16), (2, 7))
        add("packed_native_outer", base.with_store(PN(1)), (4, 6))
        add("packed_native_middle", base.with_store(PN(1)).per_block([3, 2], D.BF16), (2, 5, 3))
    for dtype in D:
        q8 = QuantScheme(V.Q8S, Native)
        add("per_tensor", q8.per_tensor(dtype), (4, 6))
        add("block_1d_partial", q8.per_block([5], dtype), (3, 12))
        add("block_2d_partial", QuantScheme(V.Q4F, U32(0)).per_block([2, 3], dtype), (5, 16))
        add("fp8_block_1d_partial", QuantScheme(V.E5M2, Native).per_block([7], dtype), (2, 10))
        add("fp4_block_2d_partial", QuantScheme(V.E2M1, PN(0)).per_block([2, 3], dtype), (3, 8))
        add("outer_block_2d_partial", QuantScheme(V.Q2S, U32(1)).per_block([3, 2], dtype), (7, 5))
    add("block_3d_partial", QuantScheme(V.Q8F, Native).per_block([2, 3, 4], D.BF16), (3, 5, 6))
    add("block_of_one", QuantScheme(V.Q8S, Native).per_block([1], D.F32), (2, 3))
    add("two_level", QuantScheme(V.Q8S, Native).per_block([4], D.UE4M3).per_tensor(D.F32), (3, 10))
    add("two_level_2d", QuantScheme(V.Q4S, U32(0)).per_block([2, 4], D.F16).per_tensor(D.F32),
        (3, 16))  # fmt: skip
    add("two_level_q2", QuantScheme(V.Q2F, U32(0)).per_block([16], D.UE4M3).per_tensor(D.F32),
        (2, 32))  # fmt: skip
    add("two_level_outer", QuantScheme(V.Q4S, U32(1)).per_block([2, 4], D.UE4M3).per_tensor(D.F32),
        (3, 8))  # fmt: skip
    add("two_level_fp4_outer",
        QuantScheme(V.E2M1, PN(1)).per_block([16, 1], D.UE4M3).per_tensor(D.F32), (40, 3))  # fmt: skip
    add("two_level_fp8", QuantScheme(V.E4M3, U32(0)).per_block([8], D.F16).per_tensor(D.F32),
        (3, 20))  # fmt: skip
    add("rank_1", QuantScheme(V.Q4S, U32(0)).per_block([8], D.UE8M0), (40,))
    add("rank_1_packed_native", QuantScheme(V.Q2F, PN(0)).per_block([5], D.F16), (13,))
    add("rank_4", QuantScheme(V.Q8F, Native).per_block([2, 2], D.F16), (2, 3, 4, 5))
    add("rank_4_outer", QuantScheme(V.Q4F, U32(3)).per_block([3, 1, 1, 2], D.F32), (5, 2, 3, 4))
    add("scalar", QuantScheme(V.Q8S, Native), ())
    add("scalar_block", QuantScheme(V.Q8S, Native).per_block([4], D.F16), ())
    add("empty", QuantScheme(V.Q8S, Native), (0, 8))
    add("empty_u32", QuantScheme(V.Q4S, U32(0)).per_tensor(D.F16), (0, 16))
    add("empty_packed_native_outer", QuantScheme(V.E2M1, PN(1)), (0, 4))
    add("empty_block", QuantScheme(V.Q8S, Native).per_block([4], D.F16), (0, 8))
    for name, preset in bq.presets.PRESETS.items():
        if preset().codebook is not None:
            continue  # burn refuses Lookup; its Burnpack has no place for the codebook
        if max(preset().block_size or (1,)) > BURN_BLOCK_MAX:
            continue  # int8_per_channel: burn's block dims are u8, so no .bpk is written
        if preset().offset is not None:
            continue  # burn has no affine values: save_burnpack refuses them
        add(f"preset_{name}", preset(), (4, 64))
        add(f"preset_{name}_partial", preset(), (3, 45))
    return out


CASES = {c.name: c for c in cases()}


def outcomes(expect_refusal: bool) -> list:
    """(version, case) pairs whose expected outcome is a refusal, or a bit-exact load."""
    return [
        pytest.param(v, name, id=f"{v}-{name}")
        for v, burn in BURNS.items()
        for name, case in CASES.items()
        if (burn.refusal(case.scheme, case.shape) is not None) == expect_refusal
    ]


def run_checker(checker: str, path: Path) -> dict:
    proc = subprocess.run([checker, str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the checker refused {path}: {proc.stdout}{proc.stderr}"
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return {line["name"]: line for line in lines}


def data(shape: tuple, seed: int) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(np.float32)
    if x.ndim >= 1 and x.size:
        x.reshape(-1)[: max(1, x.size // 8)] = 0  # a zero block or two: zero scales
    return x


@pytest.fixture(scope="module")
def cases_file(tmp_path_factory):
    """Every case quantized, and one .bpk file holding them all."""
    qts = {
        name: bq.quantize(data(c.shape, i), c.scheme) for i, (name, c) in enumerate(CASES.items())
    }
    path = tmp_path_factory.mktemp("interop") / "cases.bpk"
    save_burnpack(path, qts)
    return qts, path


@pytest.fixture(scope="module")
def burn_results(cases_file):
    """``results(version)``: the cases and what that burn version made of them, run once."""
    qts, path = cases_file
    runs: dict = {}

    def results(version: str):
        if version not in runs:
            runs[version] = run_checker(BURNS[version].checker(), path)
        return qts, runs[version]

    return results


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


@pytest.mark.parametrize("version, name", outcomes(expect_refusal=False))
def test_burn_dequantizes_bit_for_bit(burn_results, version, name):
    qts, burn = burn_results(version)
    assert_same_bits(burn[name], qts[name].dequantize())


@pytest.mark.parametrize("version, name", outcomes(expect_refusal=True))
def test_burn_still_refuses(burn_results, version, name):
    """The known failures, each checked to fail the way its reason says; reported as xfail."""
    qts, burn = burn_results(version)
    case, result = CASES[name], burn[name]
    refusal = BURNS[version].refusal(case.scheme, case.shape)
    if "error" in result:
        assert refusal.panic is not None, f"expected other values, burn failed: {result['error']}"
        assert refusal.panic == "any" or refusal.panic in result["error"], result["error"]
    else:
        assert refusal.panic in (None, "any"), f"expected a panic with {refusal.panic!r}"
        assert values_differ(result, qts[name].dequantize()), (
            f"burn {version} now reproduces this scheme: take it off its known failures"
        )
    pytest.xfail(refusal.reason)


MODULE_CASES = {
    "q8s_block_2d": (QuantScheme(V.Q8S, Native).per_block([2, 3], D.F16), (5, 7)),
    "q4s_two_level": (QuantScheme(V.Q4S, U32(0)).per_block([16], D.UE4M3).per_tensor(D.F32),
                      (3, 32)),
    "int8": (bq.presets.int8(), (4, 4)),
    "nvfp4": (bq.presets.nvfp4(), (3, 40)),
    "q4s_outer": (QuantScheme(V.Q4S, U32(1)).per_block([4, 1], D.F16), (9, 3)),
}  # fmt: skip


@pytest.mark.parametrize(
    "version, name",
    [
        pytest.param(v, n, id=f"{v}-{n}")
        for v, burn in BURNS.items()
        for n, (scheme, shape) in MODULE_CASES.items()
        if burn.refusal(scheme, shape) is None
    ],
)
def test_a_module_parameter_loads_bit_for_bit(tmp_path, version, name):
    checker = BURNS[version].checker()
    scheme, shape = MODULE_CASES[name]
    qt = bq.quantize(data(shape, 7), scheme)
    save_burnpack(tmp_path / "m.bpk", {"weight": qt})
    burn = run_checker(checker, tmp_path / "m.bpk")
    assert_same_bits(burn["weight"], qt.dequantize())
    assert_same_bits(burn["module.weight"], qt.dequantize())


@pytest.mark.parametrize("version", list(BURNS))
def test_plain_tensors_keep_their_bytes(tmp_path, version):
    checker = BURNS[version].checker()
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
    burn = run_checker(checker, tmp_path / "p.bpk")
    for name, a in tensors.items():
        assert "error" not in burn[name], burn[name]["error"]
        raw = a.view(np.uint16) if name == "bfloat16" else a
        want = np.ascontiguousarray(raw, dtype=raw.dtype.newbyteorder("<")).tobytes()
        assert bytes.fromhex(burn[name]["hex"]) == want, name


@pytest.mark.parametrize("version", list(BURNS))
def test_burn_writes_the_committed_samples_and_we_write_the_same(tmp_path, version):
    checker = BURNS[version].checker()
    proc = subprocess.run(
        [checker, "--write-samples", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    for sample in ("sample.bpk", "sample_extras.bpk"):
        assert (tmp_path / sample).read_bytes() == (SAMPLES / sample).read_bytes(), (
            f"burn {version} writes a different {sample}: regenerate tests/burn_interop/samples"
        )
    from test_burnpack import SAMPLE_META, sample_tensors

    save_burnpack(tmp_path / "ours.bpk", sample_tensors(), metadata=SAMPLE_META)
    assert (tmp_path / "ours.bpk").read_bytes() == (tmp_path / "sample.bpk").read_bytes()
