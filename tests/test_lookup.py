"""Lookup mode (codebooks): the core equals blockquant.reference bit for bit, the reference does
what its definition says (nearest entry, ties to the larger magnitude, +-0 to +a), and the
scheme's codebook rules and text form hold."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import blockquant as bq
import blockquant.reference as ref
from blockquant import _native
from blockquant.scheme import QuantMode, QuantScheme, QuantStore, QuantValue, ScaleDtype

V, S, D = QuantValue, QuantStore, ScaleDtype
RNG = np.random.default_rng(41)

# Unsorted, with and without 0, symmetric and not, entries far apart.
Q4_BOOKS = {
    "nf4": bq.codebooks.NF4,
    "iq4nl": bq.codebooks.IQ4_NL,
    "bq4": bq.codebooks.BQ4,
    "shuffled": np.array([3, -7, 0.5, 6, -0.25, 2, -3, 1, -1, 0.75, 4, -5, 1e-3, -2, 5, 0],
                         np.float32),
    "wide": np.array([2.0**k * (-1) ** k for k in range(-20, 40, 4)] + [0.0], np.float32),
}
Q2_BOOKS = {
    "q2": np.array([0, 0.5, -1, 1], np.float32),
    "q2-no-zero": np.array([1.5, -0.25, 0.25, -3], np.float32),
}
STORES = [S.Native, S.packed_u32(0), S.packed_native(0), S.packed_u32(1), S.packed_native(1)]
LEVELS = {
    "tensor": lambda s: s,
    "tensor-f16": lambda s: s.per_tensor(D.F16),
    "block16-f16": lambda s: s.per_block([16], D.F16),
    "block4x8-bf16": lambda s: s.per_block([4, 8], D.BF16),
    "block32-ue8m0": lambda s: s.per_block([32], D.UE8M0),
    "two-level-ue4m3": lambda s: s.per_block([16], D.UE4M3).per_tensor(D.F32),
    "two-level-f16": lambda s: s.per_block([8], D.F16).per_tensor(D.F32),
    "two-level-f16-32": lambda s: s.per_block([32], D.F16).per_tensor(D.F32),
}


def _same(a, b) -> None:
    assert np.array_equal(np.asarray(a.scales).view(np.uint32), np.asarray(b.scales).view(np.uint32))
    assert a.global_scale == b.global_scale
    assert a.values.dtype == b.values.dtype and np.array_equal(a.values, b.values)
    assert np.array_equal(a.dequantize().view(np.uint32), b.dequantize().view(np.uint32))


def _data(shape) -> np.ndarray:
    x = RNG.standard_t(3, size=shape).astype(np.float32)
    x[0] *= np.float32(1e-3)
    x[1] = 0  # all-zero blocks: the zero rule
    x[2] *= np.float32(300)
    x[3, ::3] = -0.0
    return x


def _scheme(value, store, book, level="tensor"):
    return LEVELS[level](QuantScheme(value, store)).with_codebook(book)


@pytest.mark.parametrize("store", STORES, ids=str)
@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("shape", [(6, 40), (6, 128)], ids=str)
def test_core_equals_reference(store, level, shape):
    """Rows of 40 cut blocks of 16 and 32 (the general path); rows of 128 are whole groups of
    eight blocks of 16 or 32, which the one-pass and two-level kernels take, an all-zero row
    among them (the zero rule: the code of 0 is the entry nearest +0, not field 0)."""
    x = _data(shape)
    for value, books in [(V.Q4F, Q4_BOOKS), (V.Q4S, Q4_BOOKS), (V.Q2S, Q2_BOOKS)]:
        for book in books.values():
            s = _scheme(value, store, book, level)
            for sr in ["up", "nearest"] + (["mx"] if "ue8m0" in level else []):
                for cal in ["minmax", "absmean"]:
                    _same(bq.quantize(x, s, calibration=cal, scale_rounding=sr),
                          ref.quantize(x, s, calibration=cal, scale_rounding=sr))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_do_not_change_the_bits(threads):
    x = RNG.standard_normal((64, 1000)).astype(np.float32)
    s = _scheme(V.Q4F, S.packed_u32(0), bq.codebooks.NF4, "two-level-ue4m3")
    s1 = _scheme(V.Q4S, S.Native, Q4_BOOKS["shuffled"], "block16-f16")
    want = [ref.quantize(x, s), ref.quantize(x, s1)]
    n = bq.get_num_threads()
    try:
        bq.set_num_threads(threads)
        got = [bq.quantize(x, s), bq.quantize(x, s1)]
    finally:
        bq.set_num_threads(n if n != bq.get_num_threads() else 0)
    for g, w in zip(got, want):
        _same(g, w)


def test_explicit_scales_and_global_scale():
    x = _data((4, 32))
    s = _scheme(V.Q4F, S.packed_u32(0), bq.codebooks.IQ4_NL, "block16-f16")
    scales = np.abs(RNG.standard_normal((4, 2))).astype(np.float32) / 50
    scales[1, 0] = 0  # a zero scale: every value takes the entry nearest to +0
    _same(bq.quantize(x, s, scales=scales), ref.quantize(x, s, scales=scales))
    t = _scheme(V.Q4F, S.Native, bq.codebooks.NF4, "two-level-ue4m3")
    for kw in [dict(global_scale=0.01), dict(scales=np.ones((4, 2)), global_scale=0.5)]:
        _same(bq.quantize(x, t, **kw), ref.quantize(x, t, **kw))
    # Whole groups of eight blocks (the two-level kernels), one all zero, under a given g.
    x = _data((4, 256))
    for kw in [dict(global_scale=0.01), dict(global_scale=0.0), dict(global_scale=3e-40)]:
        _same(bq.quantize(x, t, **kw), ref.quantize(x, t, **kw))


# -- what the definition says, on hand-made inputs (expected values written out, not computed) --
def _codes(x, book, value=V.Q2F):
    """Stored fields of ``x`` against a scale of exactly 1 (per-tensor F32, explicit)."""
    s = QuantScheme(value, S.Native).with_codebook(book)
    got = bq.quantize(np.asarray(x, np.float32), s, scales=[1.0])
    want = ref.quantize(np.asarray(x, np.float32), s, scales=[1.0])
    _same(got, want)
    return got.values.tolist()


def test_nearest_entry_and_the_tie_rules():
    book = [0, 0.5, -1, 1]  # sorted: -1 (field 2), 0 (0), 0.5 (1), 1 (3)
    x = [-0.5, 0.25, 0.75, -0.75, -0.25, 0.3, 0.2, 5, -5, 0.0, -0.0]
    # -0.5: between -1 and 0 -> larger magnitude -1; 0.25: between 0 and 0.5 -> 0.5;
    # 0.75 -> 1; -0.75 -> -1 (nearer); -0.25 -> 0; ends clamp; +-0 -> 0.
    assert _codes(x, book) == [2, 1, 3, 2, 0, 1, 0, 3, 2, 0, 0]
    # Just off each midpoint, the nearer entry.
    eps = np.float32(1e-7)
    assert _codes([np.float32(-0.5) + eps, np.float32(0.25) - eps], book) == [0, 0]


def test_plus_minus_a_tie_goes_to_plus_a():
    book = [-0.5, 0.5, -2, 2]  # no zero entry: 0 is halfway between -0.5 and +0.5
    assert _codes([0.0, -0.0, 1.25, -1.25, 1e-30, -1e-30], book) == [1, 1, 3, 2, 1, 0]


def test_a_zero_scale_stores_the_entry_nearest_to_zero():
    s = QuantScheme(V.Q2F, S.Native).per_block([4], D.F16).with_codebook([-0.5, 0.5, -2, 2])
    x = np.array([0, 0, 0, 0, 1, -1, 2, -2], np.float32)  # an all-zero block, then a real one
    qt = bq.quantize(x, s)
    _same(qt, ref.quantize(x, s))
    assert qt.values.tolist() == [1, 1, 1, 1, 1, 0, 3, 2] and qt.scales[0] == 0
    assert qt.dequantize().tolist() == [0, 0, 0, 0, 0.5, -0.5, 2, -2]


def test_scale_is_alpha_over_the_largest_magnitude():
    s = QuantScheme(V.Q4F, S.Native).with_codebook(bq.codebooks.IQ4_NL)  # h = 127
    x = np.array([-254, 226, 2, 0], np.float32)
    qt = bq.quantize(x, s)
    assert qt.scales.tolist() == [2.0]
    assert qt.dequantize().tolist() == [-254, 226, 2, 2]  # 0 -> entry 1 (the nearest to 0)


def test_every_index_decodes_from_bytes():
    s = QuantScheme(V.Q4S, S.packed_u32(0)).per_tensor(D.F32).with_codebook(Q4_BOOKS["shuffled"])
    values = np.array([[0x76543210, 0xFEDCBA98]], np.uint32)
    scale = np.array([2.0], np.float32)
    data = values.tobytes() + scale.tobytes()
    qt = bq.QTensor.from_bytes(data, s, (1, 16))
    want = ref.from_bytes(data, s, (1, 16))
    assert np.array_equal(qt.dequantize(), ref.dequantize(want))
    assert qt.dequantize().tolist() == [(Q4_BOOKS["shuffled"] * 2).tolist()]
    assert qt.to_bytes() == data
    parts = bq.QTensor.from_parts(values, scale, s, (1, 16))
    assert parts.to_bytes() == data


def test_native_storage_is_uint8_indices():
    s = QuantScheme(V.Q4S, S.Native).with_codebook(bq.codebooks.NF4)
    qt = bq.quantize(bq.codebooks.NF4 * np.float32(3), s)  # each entry, scaled
    assert qt.values.dtype == np.uint8 and qt.values.tolist() == list(range(16))
    assert s.layout((16,)).storage_dtype == np.uint8


# -- the scheme value ------------------------------------------------------------------------
def test_codebooks_are_read_only_float32():
    for book in (bq.codebooks.NF4, bq.codebooks.IQ4_NL, bq.codebooks.BQ4):
        assert book.dtype == np.float32 and book.shape == (16,)
        with pytest.raises(ValueError):
            book[0] = 0
    assert bq.codebooks.IQ4_NL.tolist()[:3] == [-127, -104, -83]
    assert bq.codebooks.NF4[7] == 0 and bq.codebooks.NF4[1] == np.float32(-0.6961928009986877)


def test_pickle_and_hash_keep_the_codebook():
    s = _scheme(V.Q2S, S.packed_u32(0), Q2_BOOKS["q2-no-zero"], "block16-f16")
    t = pickle.loads(pickle.dumps(s))
    assert t == s and hash(t) == hash(s) and t.codebook == s.codebook
    assert t.mode is QuantMode.Lookup
    assert s != s.with_codebook(Q2_BOOKS["q2"])
    assert len({s, t, s.with_codebook(Q2_BOOKS["q2"])}) == 2


def test_quantize_round_trips_through_bytes_for_every_store():
    x = _data((5, 19))
    for store in STORES:
        s = _scheme(V.Q4F, store, bq.codebooks.NF4, "two-level-f16")
        qt = bq.quantize(x, s)
        back = bq.QTensor.from_bytes(qt.to_bytes(), s, x.shape)
        _same(back, qt)


# -- files and the command line -----------------------------------------------------------------
CUSTOM = "q2s/packed_u32_0/block16:f16/lookup:[1.5,-0.25,0.25,-3.0]"


def test_safetensors_carries_the_codebook_in_the_scheme_text(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    src, out = tmp_path / "m.safetensors", tmp_path / "q.safetensors"
    w = RNG.standard_normal((8, 48)).astype(np.float32)
    safetensors.save_file({"w": w}, str(src))
    bq.quantize_file(src, out, CUSTOM)
    qt = bq.load(out)["w"]
    s = QuantScheme.parse(CUSTOM)
    assert qt.scheme == s and qt.scheme.codebook == (1.5, -0.25, 0.25, -3.0)
    want = bq.quantize(w, s)
    assert qt.to_bytes() == want.to_bytes()
    assert np.array_equal(qt.dequantize(), want.dequantize())


def test_cli_takes_prints_and_refuses_lookup_schemes(tmp_path, capsys):
    safetensors = pytest.importorskip("safetensors.numpy")
    from blockquant.cli import main

    src = tmp_path / "m.safetensors"
    safetensors.save_file({"w": RNG.standard_normal((8, 64)).astype(np.float32)}, str(src))
    nf4 = "q4f/packed_u32_0/block16:ue4m3+tensor:f32/lookup:nf4"
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(src), "-o", str(out), "--scheme", nf4, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    assert nf4 in capsys.readouterr().out
    bad = [
        (["--scheme", "q4f/native/tensor/lookup"], "needs a codebook"),
        (["--scheme", nf4, "--rounding", "half_even"], "half_even"),
        (["--scheme", CUSTOM.replace("q2s", "q4s")], "16 entries, got 4"),
    ]
    for argv, message in bad:
        dst = tmp_path / "bad.safetensors"
        assert main(["quantize", str(src), "-o", str(dst), *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and not dst.exists()
    bpk = tmp_path / "q.bpk"
    assert main(["quantize", str(src), "-o", str(bpk), "--scheme", nf4]) == 2
    assert "no place for a Lookup" in capsys.readouterr().err and not bpk.exists()


# -- calibration="mse": the codebook's q(u) in the search's error ------------------------------
# Per-tensor 2-bit schemes are among them: bit-exact all the same, whatever the advice.
@pytest.mark.filterwarnings("ignore:calibration 'mse' cannot help:RuntimeWarning")
@pytest.mark.parametrize("level", list(LEVELS))
def test_mse_core_equals_reference(level):
    x = _data((6, 70))
    w = RNG.random((6, 70)).astype(np.float32)
    for value, book in [(V.Q4F, bq.codebooks.NF4), (V.Q4S, bq.codebooks.IQ4_NL),
                        (V.Q4F, Q4_BOOKS["shuffled"]), (V.Q2S, Q2_BOOKS["q2-no-zero"])]:
        for store in [S.Native, S.packed_u32(0)]:
            s = _scheme(value, store, book, level)
            for sr in ["up", "nearest"] + (["mx"] if "ue8m0" in level else []):
                kw = dict(calibration="mse", scale_rounding=sr)
                _same(bq.quantize(x, s, **kw), ref.quantize(x, s, **kw))
            _same(bq.quantize(x, s, calibration="mse", weights=w),
                  ref.quantize(x, s, calibration="mse", weights=w))


def test_mse_searches_with_the_codebook_and_never_loses_to_minmax():
    x = RNG.standard_t(4, size=(64, 128)).astype(np.float32)
    s = _scheme(V.Q4F, S.packed_u32(0), bq.codebooks.NF4, "two-level-ue4m3")
    err = {}
    for cal in ["minmax", "mse"]:
        d = bq.quantize(x, s, calibration=cal, scale_rounding="nearest").dequantize()
        err[cal] = float(((x.astype(np.float64) - d) ** 2).sum())
    # Each block's minmax scale is a candidate, so the searched total is at most minmax's.
    assert err["mse"] <= err["minmax"]
    assert err["mse"] < 0.95 * err["minmax"]


def test_mse_threads_do_not_change_the_bits():
    x = RNG.standard_normal((3, 200_000)).astype(np.float32)  # several chunks per tensor
    s = QuantScheme(V.Q4F, S.Native).with_codebook(bq.codebooks.IQ4_NL)  # per-tensor search
    want = ref.quantize(x, s, calibration="mse")
    n = bq.get_num_threads()
    try:
        for t in (1, 2, 3):
            bq.set_num_threads(t)
            _same(bq.quantize(x, s, calibration="mse"), want)
    finally:
        bq.set_num_threads(n if n != bq.get_num_threads() else 0)


def test_core_names_the_same_codebooks():
    # The core keeps its own copy of the named codebooks (for its messages): the same bits.
    for name, book in bq.codebooks.NAMED.items():
        core = _native.Scheme(value="Q4F", store="native", dim=0, mode="Lookup",
                              codebook=book.tolist())
        assert f"codebook={name}" in repr(core)
        nudged = book.copy()
        nudged[3] = np.nextafter(nudged[3], np.float32(0))
        core = _native.Scheme(value="Q4F", store="native", dim=0, mode="Lookup",
                              codebook=nudged.tolist())
        assert f"codebook={name}" not in repr(core)


def _lloyd_step(x, scheme):
    """One Lloyd-Max step under `scheme`'s own (searched) scales: each entry moves to the
    e²-weighted centroid of the values quantized to it, in units of their block's scale."""
    qt = bq.quantize(x, scheme)
    e = np.repeat(qt.scales.astype(np.float64) * qt.global_scale, 16, axis=-1)
    idx = qt.values.ravel().astype(np.intp)
    num = np.bincount(idx, weights=(e * x).ravel(), minlength=16)
    den = np.bincount(idx, weights=(e * e).ravel(), minlength=16)
    cb = num / den
    return cb / np.abs(cb).max()


def test_bq4_is_the_lloyd_max_grid_its_docs_describe():
    # BQ4 is (to its 4 decimals, within a step of convergence) a fixed point of the Lloyd-Max
    # step on normal data under the bq4_block16 preset's scales, and beats NF4 there.
    x = np.random.default_rng(7).standard_normal((256, 1536)).astype(np.float32)
    base = bq.presets.bq4_block16().with_store(S.Native)
    moved = _lloyd_step(x, base)
    assert np.abs(moved - bq.codebooks.BQ4).max() < 0.01

    def sqnr(scheme):
        y = bq.quantize(x, scheme).dequantize()
        return 10 * np.log10(np.sum(x.astype(np.float64) ** 2) / np.sum((x - y) ** 2.0))

    assert sqnr(base) > sqnr(base.with_codebook(bq.codebooks.NF4)) + 0.3
