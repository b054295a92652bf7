"""The zarr codecs: a zarr array written with blockquant's codec reads back as the numpy API's
dequantized chunks; each stored chunk is burn's bytes of that chunk, as docs/dask.md specifies
them (read back here by blockquant.reference, an independent reader); the JSON is as documented;
zarr and numcodecs find the codecs through the entry points pyproject.toml declares; chunkings
that cut blocks, non-float arrays, NaNs, other codecs' bytes and bad configurations are refused
with typed errors; xarray writes and reads datasets with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import blockquant as bq
import blockquant.reference as ref

zarr = pytest.importorskip("zarr", minversion="3")
numcodecs = pytest.importorskip("numcodecs")
from blockquant.numcodecs_codec import BlockQuant  # noqa: E402
from blockquant.zarr_codec import BlockQuantCodec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: Where the blockquant under test lives (the checkout's python/, or an installed wheel's
#: site-packages): child processes import the same one.
PACKAGE_ROOT = Path(bq.__file__).resolve().parents[1]
SCHEMES = ["nvfp4", "mxfp4", "int4_block32", "int8", "int8_per_channel", "nf4_block16",
           "int4_asym_block128", "q4s/packed_u32_1/block16x8:f16", "bitnet"]
# a chunk shape per scheme on its block and word boundaries (or whole axes)
CHUNKS = {"int8_per_channel": (16, 300), "int4_asym_block128": (16, 128),
          "q4s/packed_u32_1/block16x8:f16": (16, 64)}


def _chunks_of(shape, chunk):
    for i in range(0, shape[0], chunk[0]):
        for j in range(0, shape[1], chunk[1]):
            yield (i // chunk[0], j // chunk[1]), (slice(i, i + chunk[0]), slice(j, j + chunk[1]))


def _padded(x, where, chunk):
    """The chunk as zarr hands it to a codec: the full chunk shape, padded with the fill (0)."""
    part = x[where]
    return np.pad(part, [(0, c - s) for c, s in zip(chunk, part.shape)])


@pytest.mark.parametrize("text", SCHEMES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_v3_chunks_are_burns_bytes_and_read_back_dequantized(tmp_path, text, dtype):
    shape, chunk = (40, 300), CHUNKS.get(text, (16, 64))
    x = (np.random.default_rng(5).standard_normal(shape) * 4).astype(dtype)
    path = tmp_path / "a.zarr"
    z = zarr.create_array(path, shape=shape, chunks=chunk, dtype=dtype, compressors=None,
                          serializer=BlockQuantCodec(scheme=text))
    z[...] = x
    back = zarr.open_array(path)[...]
    assert back.dtype == np.dtype(dtype)
    scheme = bq.presets.resolve(text)
    for (i, j), where in _chunks_of(shape, chunk):
        full = _padded(x, where, chunk)
        stored = (path / "c" / str(i) / str(j)).read_bytes()
        assert stored == bq.quantize(full, scheme).to_bytes()
        # another reader of the documented bytes: the reference's from_bytes and dequantize
        want = ref.dequantize(ref.from_bytes(stored, str(scheme), chunk), dtype)
        got = back[where]
        assert np.array_equal(got.view(f"u{got.itemsize}"),
                              want[: got.shape[0], : got.shape[1]].view(f"u{got.itemsize}"))


def test_v3_metadata_is_the_documented_json(tmp_path):
    z = zarr.create_array(tmp_path / "a.zarr", shape=(8, 32), chunks=(8, 32), dtype="float32",
                          serializer=BlockQuantCodec(scheme="nvfp4"), compressors=None)
    z[...] = 1.0
    meta = json.loads((tmp_path / "a.zarr" / "zarr.json").read_text())
    assert meta["codecs"] == [{"name": "blockquant", "configuration": {
        "version": 1, "scheme": "e2m1/packed_native0/block16:ue4m3+tensor:f32",
        "calibration": "minmax", "rounding": "half_away", "scale_rounding": "up"}}]
    # a preset's options are written out: a reader needs none of them, a writer all
    codec = BlockQuantCodec(scheme="mxfp4")
    assert codec.to_dict()["configuration"]["scale_rounding"] == "mx"
    assert BlockQuantCodec.from_dict(codec.to_dict()) == codec


def test_v3_with_a_compressor_after_it(tmp_path):
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    z = zarr.create_array(tmp_path / "a.zarr", shape=x.shape, chunks=(32, 64), dtype="float32",
                          serializer=BlockQuantCodec(scheme="int4_block32"),
                          compressors=[zarr.codecs.ZstdCodec(level=3)])
    z[...] = x
    back = zarr.open_array(tmp_path / "a.zarr")[...]
    for _, where in _chunks_of(x.shape, (32, 64)):
        assert np.array_equal(back[where], bq.quantize(x[where], "int4_block32").dequantize())


def test_v3_refuses_chunks_off_block_boundaries_and_non_floats(tmp_path):
    from blockquant.dask import ChunkAlignmentError

    with pytest.raises(ChunkAlignmentError, match=r"multiple of \[16\]"):
        zarr.create_array(tmp_path / "a.zarr", shape=(40, 300), chunks=(16, 100),
                          dtype="float32", serializer=BlockQuantCodec(scheme="nvfp4"))
    # packed words too: q4s under packed_u32_1 packs 8 values of axis 0 to a word
    with pytest.raises(ChunkAlignmentError, match=r"along axes \[0\]"):
        zarr.create_array(tmp_path / "b.zarr", shape=(40, 300), chunks=(12, 32),
                          dtype="float32", serializer=BlockQuantCodec(scheme="q4s/packed_u32_1/block4:f16"))
    # a chunk holding the whole axis has the tensor's own partial edge block: fine
    zarr.create_array(tmp_path / "c.zarr", shape=(40, 300), chunks=(16, 300), dtype="float32",
                      serializer=BlockQuantCodec(scheme="nvfp4"))
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        zarr.create_array(tmp_path / "d.zarr", shape=(8, 32), chunks=(8, 32), dtype="int32",
                          serializer=BlockQuantCodec(scheme="nvfp4"))
    with pytest.raises(bq.SchemeError):
        zarr.create_array(tmp_path / "e.zarr", shape=(64,), chunks=(32,), dtype="float32",
                          serializer=BlockQuantCodec(scheme="q8s/native/block4x8:f16"))
    assert not (tmp_path / "a.zarr" / "c").exists()


def test_v3_refuses_nan_and_says_why_a_nan_fill_does_not_pad(tmp_path):
    z = zarr.create_array(tmp_path / "a.zarr", shape=(8, 32), chunks=(8, 32), dtype="float32",
                          serializer=BlockQuantCodec(scheme="nvfp4"))
    x = np.ones((8, 32), np.float32)
    x[3, 7] = np.nan
    with pytest.raises(bq.NonFiniteError, match="flat index 103"):
        z[...] = x
    z = zarr.create_array(tmp_path / "b.zarr", shape=(10, 32), chunks=(8, 32), dtype="float32",
                          serializer=BlockQuantCodec(scheme="nvfp4"), fill_value=np.nan)
    with pytest.raises(bq.NonFiniteError, match="fill value nan"):
        z[...] = np.ones((10, 32), np.float32)


@pytest.mark.parametrize("config, error", [
    ({"version": 2, "scheme": "e2m1/packed_native0/block32:ue8m0"}, bq.LayoutError),
    ({"version": 1, "scheme": "nvfp4"}, bq.SchemeError),  # a preset name is not a scheme text
    ({"version": 1, "scheme": "q4s/native/block1x32:f16"}, bq.SchemeError),
    ({"version": 1, "scheme": 7}, bq.SchemeError),
    ({"version": 1, "scheme": "q8s/native/tensor:f32", "level": 3}, bq.LayoutError),
    ({"version": 1, "scheme": "q8s/native/tensor:f32", "scale_rounding": "mx"}, bq.SchemeError),
    ({"version": 1, "scheme": "q8s/native/tensor:f32", "rounding": "up"}, bq.QuantError),
])
def test_bad_configurations_are_typed_errors_when_read(tmp_path, config, error):
    z = zarr.create_array(tmp_path / "a.zarr", shape=(8, 32), chunks=(8, 32), dtype="float32",
                          serializer=BlockQuantCodec(scheme="q8s/native/tensor:f32"))
    z[...] = 1.0
    meta_path = tmp_path / "a.zarr" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["codecs"] = [{"name": "blockquant", "configuration": config}]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(error):
        zarr.open_array(tmp_path / "a.zarr")[...]
    with pytest.raises(error):
        BlockQuant.from_config({"id": "blockquant", **config})


def test_numcodecs_codec_round_trip_header_and_orders():
    codec = BlockQuant("nvfp4")
    assert codec.get_config() == {"id": "blockquant", "version": 1,
                                  "scheme": "e2m1/packed_native0/block16:ue4m3+tensor:f32",
                                  "calibration": "minmax", "rounding": "half_away",
                                  "scale_rounding": "up"}
    assert numcodecs.get_codec(codec.get_config()).get_config() == codec.get_config()
    x = np.random.default_rng(2).standard_normal((24, 64)).astype(np.float32)
    blob = codec.encode(x)
    burn = bq.quantize(x, "nvfp4").to_bytes()
    # the documented header: BQNC, version 1, dtype 'f', order 'C', rank 2, two uint64 sizes
    assert blob[:8] == b"BQNC\x01fC\x02"
    assert np.frombuffer(blob[8:24], "<u8").tolist() == [24, 64]
    assert blob[24:] == burn
    assert np.array_equal(codec.decode(blob), bq.quantize(x, "nvfp4").dequantize())
    out = np.empty_like(x)
    assert codec.decode(blob, out=out) is out and np.array_equal(out, codec.decode(blob))
    f = np.asfortranarray(x.astype(np.float64))  # a chunk of an order="F" array
    back = codec.decode(codec.encode(f))
    assert back.flags.f_contiguous and back.dtype == np.float64
    assert np.array_equal(back, bq.quantize(f, "nvfp4").dequantize(np.float64))


@pytest.mark.parametrize("data", [b"", b"\x00" * 40, b"BQNC\x02fC\x01" + b"\x08" + b"\0" * 7,
                                  b"BQNC\x01fC\x01" + (8).to_bytes(8, "little") + b"\0" * 3,
                                  b"BQNC\x01iC\x01" + (8).to_bytes(8, "little")])
def test_numcodecs_codec_refuses_other_bytes(data):
    with pytest.raises(bq.LayoutError):
        BlockQuant("int8").decode(data)


@pytest.mark.parametrize("how", ["compressor", "filter"])
def test_zarr_v2_arrays_with_the_numcodecs_codec(tmp_path, how):
    x = np.random.default_rng(3).standard_normal((40, 96)).astype(np.float32)
    kw = ({"compressors": BlockQuant("mxfp4"), "filters": None} if how == "compressor" else
          {"filters": [BlockQuant("mxfp4")], "compressors": numcodecs.Zstd(level=1)})
    z = zarr.create_array(tmp_path / "a.zarr", shape=x.shape, chunks=(16, 32), dtype="float32",
                          zarr_format=2, **kw)
    z[...] = x
    back = zarr.open_array(tmp_path / "a.zarr")[...]
    for _, where in _chunks_of(x.shape, (16, 32)):
        full = _padded(x, where, (16, 32))
        want = bq.quantize(full, "mxfp4").dequantize()
        assert np.array_equal(back[where], want[: back[where].shape[0]])


def _entry_point_dist(tmp_path: Path) -> Path:
    """A distribution's metadata declaring exactly pyproject.toml's entry points, as pip would
    install them, for a child process to find on its path."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"]
    dist = tmp_path / "site" / "blockquant_entry_points-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: blockquant-entry-points\n"
                                   "Version: 0\n")
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items())
                   for group, items in eps.items())
    (dist / "entry_points.txt").write_text(text)
    return dist.parent


def test_zarr_and_numcodecs_find_the_codecs_by_their_entry_points(tmp_path):
    x = np.random.default_rng(4).standard_normal((16, 64)).astype(np.float32)
    z = zarr.create_array(tmp_path / "v3.zarr", shape=x.shape, chunks=(16, 64),
                          dtype="float32", serializer=BlockQuantCodec(scheme="int4_block32"))
    z[...] = x
    site = _entry_point_dist(tmp_path)
    code = textwrap.dedent(f"""
        import sys, numpy as np, zarr, numcodecs
        assert "blockquant.zarr_codec" not in sys.modules
        got = zarr.open_array({str(tmp_path / 'v3.zarr')!r})[...]
        assert "blockquant.zarr_codec" in sys.modules  # loaded by its entry point
        c = numcodecs.get_codec({{"id": "blockquant", "version": 1,
                                  "scheme": "q8s/native/tensor:f32"}})
        assert type(c).__module__ == "blockquant.numcodecs_codec"
        np.save(sys.stdout.buffer, got)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(PACKAGE_ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    import io

    got = np.load(io.BytesIO(run.stdout))
    assert np.array_equal(got, bq.quantize(x, "int4_block32").dequantize())


def test_a_parts_store_is_not_a_codec_store_and_back(tmp_path):
    """blockquant.dask.from_zarr reads only the parts blockquant.dask.to_zarr wrote."""
    bqd = pytest.importorskip("blockquant.dask")
    pytest.importorskip("dask.array")
    z = zarr.create_array(tmp_path / "codec.zarr", shape=(8, 32), chunks=(8, 32),
                          dtype="float32", serializer=BlockQuantCodec(scheme="int8"))
    z[...] = 1.0
    with pytest.raises(bqd.StoreError):
        bqd.from_zarr(tmp_path / "codec.zarr")


xr = pytest.importorskip("xarray")


@pytest.mark.parametrize("backed", ["numpy", "dask"])
def test_xarray_dataset_to_zarr_with_the_codec(tmp_path, backed):
    x = np.random.default_rng(6).standard_normal((64, 256)).astype(np.float32)
    ds = xr.Dataset({"t": (("y", "x"), x), "n": (("y",), np.arange(64.0))})
    if backed == "dask":
        pytest.importorskip("dask.array")
        ds = ds.chunk({"y": 32, "x": 128})
    ds.to_zarr(tmp_path / "d.zarr", zarr_format=3, consolidated=False, encoding={
        "t": {"serializer": BlockQuantCodec(scheme="nvfp4"), "compressors": None,
              "chunks": (32, 128)}})
    back = xr.open_zarr(tmp_path / "d.zarr", consolidated=False)
    got = back.t.values
    for _, where in _chunks_of(x.shape, (32, 128)):
        assert np.array_equal(got[where], bq.quantize(x[where], "nvfp4").dequantize())
    assert np.array_equal(back.n.values, np.arange(64.0))  # other variables as they were
    assert back.t.encoding["serializer"] == BlockQuantCodec(scheme="nvfp4")
