"""blockquant.dask beyond one process: the parts stored in a zarr group and read back bit for
bit, stores that are not blockquant's refused; a LocalCluster of worker processes gives the same
bits; and an array larger than the memory its process may use is quantized into zarr from many
chunks, under that limit, bit for bit the numpy API's on the whole array."""

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

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
zarr = pytest.importorskip("zarr", minversion="3")
bqd = pytest.importorskip("blockquant.dask")

ROOT = Path(__file__).resolve().parents[1]
#: Where the blockquant under test lives (the checkout's python/, or an installed wheel's
#: site-packages): child processes import the same one.
PACKAGE_ROOT = Path(bq.__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


def _same(a: bq.QTensor, b: bq.QTensor) -> None:
    assert a.to_bytes() == b.to_bytes()
    assert a.global_scale == b.global_scale


@pytest.mark.parametrize("text", ["nvfp4", "int4_block32", "bitnet", "int4_asym_block128",
                                  "int4_affine_block64", "q4s/packed_u32_1/block16x8:f16"])
@pytest.mark.parametrize("chunks", [(16, 128), ((32, 16, 16), (128, 256, 128, 128))])
def test_parts_round_trip_through_zarr(tmp_path, text, chunks):
    x = np.random.default_rng(8).standard_normal((64, 640)).astype(np.float32)
    want = bq.quantize(x, text)
    q = bqd.quantize(da.from_array(x, chunks=chunks), text)
    bqd.to_zarr(q, tmp_path / "q.zarr")
    back = bqd.from_zarr(tmp_path / "q.zarr")
    assert back.scheme == want.scheme and back.shape == x.shape
    _same(back.compute(), want)
    assert np.array_equal(back.dequantize().compute(), want.dequantize())
    attrs = json.loads((tmp_path / "q.zarr" / "zarr.json").read_text())["attributes"]
    assert attrs["blockquant"]["format"] == "blockquant-parts"
    assert attrs["blockquant"]["scheme"] == str(want.scheme)
    assert attrs["blockquant"]["global_scale"] == want.global_scale
    # a chunk of the input is a chunk of each part: zarr's grid is the tensor's, regular
    values = zarr.open_array(tmp_path / "q.zarr" / "values")
    assert values.chunks == tuple(c[0] for c in back.values.chunks)


def test_parts_in_a_group_path_and_compute_false(tmp_path):
    x = np.random.default_rng(9).standard_normal((32, 64)).astype(np.float32)
    q = bqd.quantize(da.from_array(x, chunks=(8, 32)), "nvfp4")
    done = bqd.to_zarr(q, tmp_path / "s.zarr", path="layers/0", compute=False)
    with pytest.raises(bqd.StoreError, match="no blockquant tensor"):
        bqd.from_zarr(tmp_path / "s.zarr", path="layers/0")  # not written yet: no attribute
    done.compute()
    _same(bqd.from_zarr(tmp_path / "s.zarr", path="layers/0").compute(), bq.quantize(x, "nvfp4"))
    with pytest.raises(Exception, match="exists|contains"):
        bqd.to_zarr(q, tmp_path / "s.zarr", path="layers/0")  # no overwrite unless asked
    bqd.to_zarr(q, tmp_path / "s.zarr", path="layers/0", overwrite=True)


def test_stores_that_are_not_blockquants_are_refused(tmp_path):
    with pytest.raises(bqd.StoreError, match="no zarr group"):
        bqd.from_zarr(tmp_path / "missing.zarr")
    plain = zarr.create_array(tmp_path / "plain.zarr", shape=(8, 32), dtype="float32")
    plain[...] = 1
    with pytest.raises(bqd.StoreError):
        bqd.from_zarr(tmp_path / "plain.zarr")
    zarr.open_group(tmp_path / "group.zarr", mode="w").attrs["other"] = 1
    with pytest.raises(bqd.StoreError, match="written by another codec or program"):
        bqd.from_zarr(tmp_path / "group.zarr")
    assert issubclass(bqd.StoreError, bq.LayoutError)


@pytest.mark.parametrize("change", ["version", "scheme", "shape", "global_scale", "values",
                                    "drop_scales", "chunks"])
def test_a_store_whose_parts_disagree_with_its_attribute_is_refused(tmp_path, change):
    x = np.random.default_rng(10).standard_normal((32, 64)).astype(np.float32)
    bqd.to_zarr(bqd.quantize(da.from_array(x, chunks=(8, 32)), "nvfp4"), tmp_path / "q.zarr")
    group = zarr.open_group(tmp_path / "q.zarr", mode="a")
    attrs = dict(group.attrs["blockquant"])
    if change == "version":
        attrs["version"] = 2
    elif change == "scheme":
        attrs["scheme"] = "int4_block32"  # a preset name, not a scheme text
    elif change == "shape":
        attrs["shape"] = [32, 65]
    elif change == "global_scale":
        attrs["global_scale"] = None
    elif change == "chunks":
        attrs["chunks"] = [8, 20]  # cuts blocks of 16
    elif change == "values":
        del group["values"]
        group.create_array("values", shape=(32, 64), dtype="uint8")
    else:
        del group["scales"]
    group.attrs["blockquant"] = attrs
    with pytest.raises(bqd.StoreError):
        bqd.from_zarr(tmp_path / "q.zarr")


def test_a_local_cluster_of_processes_gives_the_same_bits(tmp_path):
    distributed = pytest.importorskip("distributed")
    x = np.random.default_rng(11).standard_normal((256, 1024)).astype(np.float32)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        dx = da.from_array(x, chunks=(64, 256))
        for text in ("nvfp4", "bitnet", "int4_block16"):
            q = bqd.quantize(dx, text)
            _same(q.compute(), bq.quantize(x, text))
        bqd.to_zarr(bqd.quantize(dx, "nvfp4"), tmp_path / "q.zarr")
    _same(bqd.from_zarr(tmp_path / "q.zarr").compute(), bq.quantize(x, "nvfp4"))


#: The array of the memory-limited run: 512 MiB of float32 from 64 chunks, each generated from
#: its own seed, so the test can make it again whole.
_ROWS, _COLS, _CHUNK_ROWS = 8192, 16384, 128


def _generated(i: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + i)
    return (rng.standard_normal((_CHUNK_ROWS, _COLS)) * (1 + i % 7)).astype(np.float32)


def test_an_array_larger_than_the_processs_memory_limit(tmp_path):
    """The child may hold far less than the array (RLIMIT_AS: its address space after
    importing, plus 224 MiB, against 512 MiB of data): it quantizes chunk by chunk into zarr.
    Here, without the limit, the whole array through the numpy API gives the same bits."""
    resource = pytest.importorskip("resource")
    del resource
    code = textwrap.dedent(f"""
        import resource, sys
        import numpy as np, dask, dask.array as da, zarr
        import blockquant.dask as bqd
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_dask_store import _generated, _ROWS, _COLS, _CHUNK_ROWS

        def make(block_info=None):
            return _generated(block_info[None]["chunk-location"][0])

        x = da.map_blocks(make, dtype=np.float32,
                          chunks=((_CHUNK_ROWS,) * (_ROWS // _CHUNK_ROWS), (_COLS,)))
        with open("/proc/self/status") as f:
            vm = [int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize")][0]
        limit = vm + (224 << 20)
        assert limit - vm < x.nbytes // 2
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            np.ones(x.nbytes // 4, np.float32)  # the array itself would not fit
        except MemoryError:
            pass
        else:
            raise SystemExit("the limit did not bite")
        with dask.config.set(scheduler="synchronous"):
            q = bqd.quantize(x, "nvfp4")
            bqd.to_zarr(q, sys.argv[1])
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE_ROOT),
                                                        os.environ.get("PYTHONPATH", "")]),
           # glibc reserves address space for a malloc arena per thread: one will do
           "BLOCKQUANT_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1"}
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q.zarr")],
                         capture_output=True, env=env, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == b"ok", run.stderr.decode()[-3000:]
    whole = np.concatenate([_generated(i) for i in range(_ROWS // _CHUNK_ROWS)])
    want = bq.quantize(whole, "nvfp4")
    del whole
    _same(bqd.from_zarr(tmp_path / "q.zarr").compute(), want)
