"""GGUF files that lie about where their tensors are, 0-d tensors, already-quantized inputs into
other formats, and ggml's own bytes for all-zero Q4_0/Q5_0 blocks.

A crafted file is refused by every command in one line, exit 2, with nothing written; llama.cpp's
loader refuses the same files (a tensor outside the data section, tensors that overlap, an offset
off the file's alignment)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from blockquant import gguf as bg
from blockquant.cli import main

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import GGUFReader, GGUFWriter  # noqa: E402
from gguf import quants as gq  # noqa: E402


def run(*argv) -> int:
    return main([str(a) for a in argv])


def raw_gguf(path: Path, tensors, alignment: int | None = None, data: bytes | None = None) -> Path:
    """A GGUF v3 file built by hand, so that offsets can lie: ``tensors`` is a list of (name,
    dims in ggml order, ggml type, offset). The data section holds ``data`` (zeros for every
    tensor's bytes at its offset when None)."""
    kv = b""
    n_kv = 0
    if alignment is not None:
        key = b"general.alignment"
        kv += struct.pack("<Q", len(key)) + key + struct.pack("<II", 4, alignment)
        n_kv += 1
    infos = b""
    for name, dims, gtype, offset in tensors:
        n = name.encode()
        infos += struct.pack("<Q", len(n)) + n + struct.pack("<I", len(dims))
        infos += b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", int(gtype), offset)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv) + kv + infos
    align = alignment or 32
    head += bytes(-len(head) % align)
    if data is None:
        end = 0
        for _, dims, gtype, offset in tensors:
            if offset < 2**40:
                end = max(end, offset + _nbytes(dims, gtype))
        data = np.random.default_rng(0).standard_normal(-(-end // 4)).astype(np.float32).tobytes()
        data = data[:end]
    path.write_bytes(head + data)
    return path


def _nbytes(dims, gtype) -> int:
    block, size = gguf.GGML_QUANT_SIZES[GT(gtype)]
    return int(np.prod(dims, dtype=np.int64)) // block * size


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def assert_refused_everywhere(tmp_path: Path, capsys, src: Path, *words: str) -> None:
    before = listing(tmp_path)
    for argv in (["inspect", src], ["inspect", src, "--json"],
                 ["report", src, "--scheme", "q8_0"],
                 ["dequantize", src, "-o", tmp_path / "d.safetensors"],
                 ["quantize", src, "-o", tmp_path / "q.gguf", "--scheme", "q8_0"],
                 ["quantize", src, "-o", tmp_path / "q.safetensors", "--scheme", "int8"]):
        assert run(*argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"blockquant: error: {src}"), (argv, err)
        assert "Traceback" not in err
        for w in words:
            assert w in err, (argv, w, err)
        assert listing(tmp_path) == before, argv


ROW = (32, 2)  # ggml order: 2 rows of 32 values, 256 bytes in F32


@pytest.mark.parametrize("offset", [2**64 - 1, 2**64 - 256, 2**64 - 32, 2**63])
def test_an_offset_that_wraps_around_is_refused(tmp_path, capsys, offset):
    src = raw_gguf(tmp_path / "wrap.gguf", [("a.weight", ROW, GT.F32, 0),
                                            ("b.weight", ROW, GT.F32, offset)])
    assert_refused_everywhere(tmp_path, capsys, src, "b.weight", "outside the data section")


def test_a_tensor_that_ends_past_the_data_section_is_refused(tmp_path, capsys):
    src = raw_gguf(tmp_path / "past.gguf", [("a.weight", ROW, GT.F32, 0),
                                            ("b.weight", ROW, GT.F32, 256)],
                   data=bytes(256 + 128))
    assert_refused_everywhere(tmp_path, capsys, src, "b.weight", "outside the data section")


def test_overlapping_tensors_are_refused(tmp_path, capsys):
    src = raw_gguf(tmp_path / "overlap.gguf", [("a.weight", ROW, GT.F32, 0),
                                               ("b.weight", ROW, GT.F32, 128)])
    assert_refused_everywhere(tmp_path, capsys, src, "b.weight", "overlaps", "a.weight")


def test_many_tensors_at_one_offset_under_a_huge_alignment_are_refused(tmp_path, capsys):
    # 64 tensors of 128 bytes all at offset 0, alignment 2^20: copied as they were, each would
    # be padded to 1 MiB in the output (a 65 MiB output from a 1 MiB input).
    tensors = [(f"t{i}.weight", (32, 1), GT.F32, 0) for i in range(64)]
    src = raw_gguf(tmp_path / "bomb.gguf", tensors, alignment=2**20)
    assert_refused_everywhere(tmp_path, capsys, src, "overlaps")


@pytest.mark.parametrize("alignment, offset", [(32, 8), (32, 100), (2**12, 2**11)])
def test_an_offset_off_the_alignment_is_refused(tmp_path, capsys, alignment, offset):
    src = raw_gguf(tmp_path / "odd.gguf", [("a.weight", ROW, GT.F32, 0),
                                           ("b.weight", ROW, GT.F32, offset + 256)],
                   alignment=alignment)
    assert_refused_everywhere(tmp_path, capsys, src, "b.weight", "alignment")


def test_tensors_in_any_order_with_gaps_are_read(tmp_path):
    # gguf-py reads tensors wherever they are (in bounds, aligned, apart): so does blockquant.
    src = raw_gguf(tmp_path / "gaps.gguf", [("a.weight", ROW, GT.F32, 512),
                                            ("b.weight", ROW, GT.F32, 0)])
    out = tmp_path / "q.gguf"
    assert run("quantize", src, "-o", out, "--scheme", "q8_0") == 0
    theirs = {t.name: np.asarray(t.data).reshape(2, 32) for t in GGUFReader(src).tensors}
    ours = {t.name: np.asarray(t.data) for t in GGUFReader(out).tensors}
    assert set(ours) == {"a.weight", "b.weight"}
    for name, x in theirs.items():
        assert ours[name].tobytes() == gq.quantize(x, GT.Q8_0).tobytes(), name


def test_a_0d_tensor_with_min_rank_0_is_kept_and_named(tmp_path, capsys):
    src = raw_gguf(tmp_path / "scalar.gguf", [("a.weight", ROW, GT.F32, 0),
                                              ("s.weight", (), GT.F32, 256)])
    out = tmp_path / "q.gguf"
    assert run("quantize", src, "-o", out, "--scheme", "q8_0", "--min-rank", "0") == 0
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and "s.weight" in cap.out + cap.err
    reader = GGUFReader(out)
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds == {"a.weight": GT.Q8_0, "s.weight": GT.F32}
    for argv in (["inspect", out], ["report", src, "--scheme", "q8_0", "--min-rank", "0"],
                 ["quantize", src, "-o", tmp_path / "q.safetensors", "--scheme", "int8",
                  "--min-rank", "0"]):
        assert run(*argv) == 0, argv
        assert "Traceback" not in capsys.readouterr().err


# --- already-quantized GGUF tensors into other formats ------------------------------------------


@pytest.fixture
def q4_model(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    """A GGUF file whose matrices are Q4_0 (as most GGUF files in the wild are quantized), one
    kept F32 norm, and a Q8_0 embedding."""
    rng = np.random.default_rng(3)
    path = tmp_path / "model-q4_0.gguf"
    w = GGUFWriter(path, "llama")
    want = {}
    for name, shape, gtype in [("token_embd.weight", (8, 64), GT.Q8_0),
                               ("blk.0.attn_norm.weight", (64,), GT.F32),
                               ("blk.0.attn_q.weight", (64, 64), GT.Q4_0),
                               ("blk.0.ffn_down.weight", (32, 64), GT.Q4_0)]:
        x = rng.standard_normal(shape).astype(np.float32)
        if gtype == GT.F32:
            w.add_tensor(name, x)
            want[name] = x
        else:
            q = gq.quantize(x, gtype)
            w.add_tensor(name, q, raw_dtype=gtype)
            want[name] = gq.dequantize(q, gtype).reshape(shape)  # what ggml reads back
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, want


def test_a_quantized_gguf_into_safetensors_needs_allow_requantize_as_into_gguf(
        q4_model, tmp_path, capsys):
    src, _ = q4_model
    for out in (tmp_path / "o.safetensors", tmp_path / "o.gguf"):
        scheme = "nvfp4" if out.suffix == ".safetensors" else "q4_k"
        assert run("quantize", src, "-o", out, "--scheme", scheme) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "already quantized" in err, err
        assert "--allow-requantize" in err and "Q4_0" in err
        assert not out.exists()


def test_a_quantized_gguf_becomes_safetensors_dequantized_on_read(q4_model, tmp_path, capsys):
    src, want = q4_model
    out = tmp_path / "o.safetensors"
    assert run("quantize", src, "-o", out, "--scheme", "nvfp4", "--allow-requantize") == 0
    cap = capsys.readouterr()
    assert "dequantized" in cap.out + cap.err, cap  # the summary says what was done
    import blockquant as bq

    got = bq.load(out)
    # Quantized tensors are requantized from ggml's dequantized values, bit for bit.
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "token_embd.weight"):
        expect = bq.quantize(want[name], "nvfp4")
        assert got[name].to_bytes() == expect.to_bytes(), name
    np.testing.assert_array_equal(got["blk.0.attn_norm.weight"], want["blk.0.attn_norm.weight"])


def test_kept_quantized_gguf_tensors_are_dequantized_into_safetensors(q4_model, tmp_path):
    src, want = q4_model
    out = tmp_path / "o.safetensors"
    # Only the attention matrix is quantized; the Q4_0 FFN and Q8_0 embedding are kept, which a
    # safetensors file can only hold as floats: ggml's dequantized values.
    assert run("quantize", src, "-o", out, "--scheme", "int8", "--allow-requantize",
               "--include", "attn_q") == 0
    import blockquant as bq

    got = bq.load(out)
    for name in ("blk.0.ffn_down.weight", "token_embd.weight"):
        arr = got[name]
        assert isinstance(arr, np.ndarray) and arr.dtype == np.float32
        np.testing.assert_array_equal(arr, want[name])


# --- ggml's bytes for all-zero blocks -----------------------------------------------------------


@pytest.mark.parametrize("gtype, divisor", [("Q4_0", -8.0), ("Q5_0", -16.0)])
def test_all_zero_blocks_store_ggmls_negative_zero_scale(gtype, divisor):
    # ggml's quantize_row_q4_0_ref/q5_0_ref start the block's signed maximum at +0.0f and take
    # d = max / divisor: an all-zero block, whatever its zeros' signs, gets d = -0 (0x8000).
    # gguf-py starts from the first value instead, so a first -0 gives +0 there: ggml is the
    # arbiter of its format's bytes.
    patterns = [np.zeros(32, np.float32), -np.zeros(32, np.float32)]
    first_negative = np.zeros(32, np.float32)
    first_negative[0] = -0.0
    patterns.append(first_negative)
    alternating = np.zeros(32, np.float32)
    alternating[1::2] = -0.0
    patterns.append(alternating)
    x = np.stack(patterns)
    q = bg.quantize(x, gtype)
    d = q.reshape(len(patterns), -1)[:, :2].copy().view(np.uint16)[:, 0]
    assert (np.float32(0.0) / np.float32(divisor)).tobytes() == b"\x00\x00\x00\x80"
    assert list(d) == [0x8000] * len(patterns), [hex(v) for v in d]
    np.testing.assert_array_equal(bg.dequantize(q, gtype).reshape(x.shape), np.zeros_like(x))
    # Everywhere else gguf-py's bytes are ggml's: a nonzero block after the zero ones.
    y = np.concatenate([x, np.random.default_rng(1).standard_normal((3, 32)).astype(np.float32)])
    ours = bg.quantize(y, gtype).reshape(len(y), -1)
    theirs = gq.quantize(y, getattr(GT, gtype)).reshape(len(y), -1)
    assert ours[len(x):].tobytes() == theirs[len(x):].tobytes()
    assert np.array_equal(ours[:, 2:], theirs[:, 2:])  # the codes of the zero blocks agree too

