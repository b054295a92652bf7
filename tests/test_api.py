"""The Python surface: inputs, outputs, errors (format.md "Quantizing a value" to "Presets")."""

import numpy as np
import pytest

import blockquant as bq
from blockquant import QuantScheme, QuantStore, QuantValue, ScaleDtype

ml_dtypes = pytest.importorskip("ml_dtypes")

NVFP4 = bq.presets.nvfp4()
INT8B = bq.presets.int8_block32()
SPEC9 = (
    QuantScheme(QuantValue.Q8F, QuantStore.Native)
    .per_block([4], ScaleDtype.UE4M3)
    .per_tensor(ScaleDtype.F32)
)
SPEC9_BYTES = bytes.fromhex("00 19 33 4c 66 7f 80 ff 30 20 00 00 40 40")


def same(a, b):
    return a.to_bytes() == b.to_bytes() and a.shape == b.shape


# -- format.md "The byte layout" ------------------------------------------------------------------------------------


def test_spec_example_bytes():
    qt = bq.QTensor.from_bytes(SPEC9_BYTES, SPEC9, (8,))
    assert qt.values.tolist() == [0, 25, 51, 76, 102, 127, -128, -1]
    assert qt.scales.tolist() == [0.5, 0.125] and qt.global_scale == 3.0
    assert qt.to_bytes() == SPEC9_BYTES
    assert qt.nbytes == 14
    # Values × b_i × g: 25 × 0.5 × 3 = 37.5; -1 × 0.125 × 3 = -0.375.
    assert qt.dequantize()[[1, 7]].tolist() == [37.5, -0.375]


def test_spec_example_through_quantize():
    x = np.array([0.0, 37.5, 76.5, 114.0, 38.25, 47.625, -48.0, -0.375], np.float32)
    qt = bq.quantize(x, SPEC9, scales=[0.5, 0.125], global_scale=3.0)
    assert qt.values.tolist() == [0, 25, 51, 76, 102, 127, -128, -1]
    assert qt.to_bytes() == SPEC9_BYTES


# -- accepted inputs --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float64, "bfloat16", ">f4", ">f8"])
def test_other_float_dtypes_equal_their_float32_cast(rng, dtype):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = (rng.standard_normal((4, 48)) * 3).astype(dt)
    assert same(bq.quantize(x, INT8B), bq.quantize(x.astype(np.float32), INT8B))


def test_non_contiguous_and_readonly_inputs(rng):
    base = rng.standard_normal((16, 64)).astype(np.float32)
    view = base[::2, ::-2]
    assert not view.flags.c_contiguous
    ro = np.ascontiguousarray(view)
    ro.flags.writeable = False
    for x in (view, ro, view.T, np.asfortranarray(ro)):
        assert same(bq.quantize(x, NVFP4), bq.quantize(np.array(x, order="C"), NVFP4))


def test_lists_and_scalars_are_accepted():
    qt = bq.quantize([[1.0, -2.0], [0.5, 0.0]], bq.presets.int8())
    assert qt.shape == (2, 2)
    z = bq.quantize(np.float32(3.0), bq.presets.int8())
    assert z.shape == () and z.dequantize().shape == () and z.dequantize() == 3.0


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 40)])
def test_empty_tensors(shape):
    for scheme in (bq.presets.int8(), INT8B, NVFP4, bq.presets.bitnet()):
        x = np.zeros(shape, np.float32)
        qt = bq.quantize(x, scheme)
        assert qt.dequantize().shape == shape
        assert same(bq.QTensor.from_bytes(qt.to_bytes(), scheme, shape), qt)
    per_tensor = bq.quantize(np.zeros(shape, np.float32), bq.presets.int8())
    assert per_tensor.scales.tolist() == [0.0]


# -- outputs ------------------------------------------------------------------------------------


def test_outputs_are_read_only_and_typed(rng):
    qt = bq.quantize(rng.standard_normal((3, 40)).astype(np.float32), INT8B)
    assert qt.values.dtype == np.int8 and qt.scales.dtype == np.float32
    with pytest.raises(ValueError):
        qt.values[0, 0] = 1
    with pytest.raises(TypeError):
        bq.QTensor()


@pytest.mark.parametrize("dtype", [np.float16, np.float64, "bfloat16"])
def test_dequantize_dtypes_convert_from_float32(rng, dtype):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    qt = bq.quantize(rng.standard_normal(100).astype(np.float32), NVFP4)
    out = bq.dequantize(qt, dtype=dt)
    assert out.dtype == dt
    np.testing.assert_array_equal(out, qt.dequantize().astype(dt))
    with pytest.raises(TypeError):
        qt.dequantize(np.int32)


# -- the rest of the surface (every error case lives in test_bad_input.py's table) --------------


def test_round_scale(rng):
    assert bq.round_scale([3.0, 0.0], ScaleDtype.UE8M0).tolist() == [4.0, 2.0**-127]
    # format.md "Storing a scale: rounding to its dtype": a UE8M0 tie goes up, as ml_dtypes' float8_e8m0fnu cast does.
    assert bq.round_scale([3.0], ScaleDtype.UE8M0, mode="nearest").tolist() == [4.0]
    assert bq.round_scale(1e6, ScaleDtype.F16).tolist() == 65504.0
    with pytest.raises(bq.ScaleError):
        bq.round_scale([-1.0], ScaleDtype.F16)
    x = rng.uniform(0, 100, 1000).astype(np.float32)
    np.testing.assert_array_equal(
        bq.round_scale(x, ScaleDtype.F16, mode="nearest"), x.astype(np.float16).astype(np.float32)
    )


def test_threads_setting():
    n = bq.get_num_threads()
    bq.set_num_threads(1)
    assert bq.get_num_threads() == 1
    bq.set_num_threads(0)
    assert bq.get_num_threads() == n


def test_values_view(rng):
    x = rng.standard_normal((4, 32)).astype(np.float32)
    qt = bq.quantize(x, bq.presets.mxfp8())
    v = qt.values_view()
    assert v.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(v.astype(np.float32) * np.repeat(qt.scales, 32, axis=1), qt.dequantize())
    assert qt.scales_view().dtype == ml_dtypes.float8_e8m0fnu
    np.testing.assert_array_equal(qt.scales_view().astype(np.float32), qt.scales)
    with pytest.raises(bq.LayoutError):
        bq.quantize(x, NVFP4).values_view()


def test_two_level_effective_scale_never_overflows():
    """Q2S two-level near f32::MAX: b × g would overflow; the cap keeps values finite."""
    import blockquant.reference as ref

    f32max = np.finfo(np.float32).max
    s = QuantScheme(QuantValue.Q2S, QuantStore.Native).per_block([2], ScaleDtype.F16).per_tensor(ScaleDtype.F32)
    x = np.array([f32max, -f32max, 1, 0], np.float32)
    qt = bq.quantize(x, s)
    assert np.all(np.isfinite(qt.dequantize()))
    assert qt.dequantize()[:2].tolist() == [f32max, -f32max]
    assert qt.to_bytes() == ref.quantize(x, s).to_bytes()


def test_reference_is_reachable_as_an_attribute():
    import subprocess
    import sys

    code = "import blockquant as bq; print(bq.reference.quantize.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "quantize"


def test_file_formats_load_on_first_use():
    # `import blockquant` leaves the file formats (most of its import time) for later; their
    # functions and modules are still attributes of the package, and `from ... import` works.
    import subprocess
    import sys

    code = """
import sys, blockquant as bq
late = ["blockquant.files", "blockquant.checkpoint", "blockquant.burnpack", "blockquant.gguf"]
print(*[m in sys.modules for m in late])
names = ["load", "quantize_file", "dequantize_file", "save_burnpack", "load_burnpack"]
print(*[getattr(bq, n).__module__ for n in names])
print(bq.gguf.__name__, bq.checkpoint.open_checkpoint.__module__, bq.files.load is bq.load)
from blockquant import load_burnpack
print(load_burnpack is bq.burnpack.load_burnpack, set(bq.__all__) <= set(dir(bq)))
print(hasattr(bq, "no_such_name"), hasattr(bq, "onnx"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "False False False False",
        "blockquant.files blockquant.files blockquant.files blockquant.burnpack blockquant.burnpack",
        "blockquant.gguf blockquant.checkpoint.readers True",
        "True True",
        "False False",
    ]


def test_bad_scales_are_reported_before_bad_data_in_both_implementations():
    import blockquant.reference as ref

    x = np.full(64, np.nan, np.float32)
    for impl in (bq, ref):
        with pytest.raises(bq.ScaleError):
            impl.quantize(x, INT8B, scales=[-1.0, 1.0])
        with pytest.raises(bq.NonFiniteError):
            impl.quantize(x, INT8B, scales=[1.0, 1.0])


def test_shapes_numpy_cannot_hold_are_layout_errors_everywhere():
    scheme = bq.presets.int8()
    too_many = (1,) * 65  # past numpy's 64 dimensions (32 before numpy 2)
    too_big = (2**64,)
    for shape in (too_many, too_big, (2**40, 2**40)):
        with pytest.raises(bq.LayoutError):
            scheme.layout(shape)
        with pytest.raises(bq.LayoutError):
            bq.QTensor.from_bytes(bytes(5), scheme, shape)
        with pytest.raises(bq.LayoutError):
            bq.QTensor.from_parts(np.zeros(1, np.int8), np.ones((), np.float32), scheme, shape)
    assert scheme.layout((2**20, 2**20)).storage_shape == (2**20, 2**20)  # large, but real
