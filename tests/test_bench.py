"""benches/bench.py, the side-by-side benchmark, kept from rotting: a smoke run on a tiny array,
its numpy yardsticks checked to do the same job as blockquant, the --peers tree lookup, and
torch's cells where torch is installed. Speed itself is never asserted here."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import blockquant as bq

BENCHES = Path(__file__).resolve().parents[1] / "benches"
pytestmark = pytest.mark.skipif(not (BENCHES / "bench.py").is_file(),
                                reason="benches/ is not in this tree")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHES))
    try:
        import bench as module

        yield module
    finally:
        sys.path.remove(str(BENCHES))


def test_quick_run_writes_every_table_and_the_json(tmp_path):
    cmd = [sys.executable, str(BENCHES / "bench.py")]
    help_ = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path, check=False)
    assert help_.returncode == 0 and "--quick" in help_.stdout and "--peers" in help_.stdout
    out = tmp_path / "b.json"
    # 16384 values: the smallest size with a whole 128x128 block for the square case.
    res = subprocess.run([*cmd, "--quick", "--size", "16384", "--repeat", "2", "--no-torch",
                          "--json", str(out), "--markdown", str(tmp_path / "b.md")],
                         capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr
    for text in ("of copyto", "cpu/wall", "vs numpy", "nvfp4", "Q8_0", "targets (issues 13 and 11"):
        assert text in res.stdout, text
    results = json.loads(out.read_text())
    assert results["size"] == 16384 and results["repeat"] == 2
    assert len(results["cases"]) == 13 and len(results["ggml"]) == 11
    for case in results["cases"]:
        cells = case["cells"]
        for key in ("copyto", "bq_quantize_1t", "bq_quantize_2t", "bq_dequantize_1t",
                    "bq_dequantize_2t", "numpy_quantize", "numpy_dequantize", "ref_quantize"):
            assert key in cells, (case["name"], key)
        # interleaved repetitions: every fast cell ran in both, the reference in the first only
        assert len(cells["bq_quantize_2t"]["wall_s"]) == 2 and len(cells["ref_quantize"]["wall_s"]) == 1
        assert cells["bq_quantize_2t"]["threads"] == 2 and cells["bq_quantize_1t"]["threads"] == 1
        assert all(c >= 0 for c in cells["bq_quantize_2t"]["cpu_s"])
        assert case["numpy_bytes_equal"] > 0.8
    targets = results["targets"]
    assert any(t["target"].startswith("#13 block-32 int8") for t in targets)
    assert any(t["target"].startswith("#11 Q8_0") for t in targets)
    assert all(t["ok"] in (True, False, None) for t in targets)
    # The docs page the same run wrote: the method, then the printed tables as tables.
    page = (tmp_path / "b.md").read_text(encoding="utf-8")
    assert page.startswith("# Benchmarks") and "## How it measures" in page
    assert "--quick --size 16384" in page
    for text in ("| scheme ", "| ggml type ", "- `[", "of copyto"):
        assert text in page, text
    rows = [line for line in page.splitlines() if line.startswith("|")]
    assert len(rows) > 30 and all(line.rstrip().endswith("|") for line in rows)


def test_numpy_versions_do_the_same_job_as_blockquant(bench):
    """Each idiomatic numpy version stores values laid out as blockquant's, mostly equal, and
    dequantizes to about blockquant's error: a yardstick that does the same work."""
    import bench_numpy

    x = np.random.default_rng(7).standard_normal((4, 4096), dtype=np.float32)
    for case in bench.cases(x.size):
        xs = x.reshape(-1)[: int(np.prod(case.shape))].reshape(case.shape)
        impl = bench_numpy.scheme(case.key, xs.shape)
        assert impl is not None, case.name
        qt = bq.quantize(xs, case.scheme, **case.kw)
        q = impl.quantize(xs, **case.np_kw)
        assert q["values"].dtype == qt.values.dtype and q["values"].shape == qt.values.shape
        assert np.mean(q["values"].view(np.uint8) == qt.values.view(np.uint8)) > 0.8, case.name
        out = np.full(xs.shape, np.nan, np.float32)
        impl.dequantize(q, out)
        err_np = np.sqrt(np.mean((out - xs) ** 2))
        err_bq = np.sqrt(np.mean((qt.dequantize() - xs) ** 2))
        assert err_np <= 1.1 * err_bq, (case.name, err_np, err_bq)


def test_quantize_call_falls_back_or_writes_in_place(bench):
    case = bench.cases(16384)[2]  # int8_block32
    x = np.random.default_rng(1).standard_normal(case.shape, dtype=np.float32)
    call, form = bench.bq_quantizer(x, case)
    assert form in ("new arrays", "out=(values, scales)")
    assert call().to_bytes() == bq.quantize(x, case.scheme).to_bytes()


def test_peers_finds_a_ggml_tree_from_inside_it_and_refuses_other_folders(bench, tmp_path):
    import bench_ggml_c

    src = tmp_path / "llama.cpp" / "ggml" / "src"
    (src / "ggml-cpu").mkdir(parents=True)
    (src / "ggml-quants.c").write_text("")
    (src / "ggml-cpu" / "quants.c").write_text("")
    build = tmp_path / "llama.cpp" / "build" / "bin"
    build.mkdir(parents=True)
    assert bench_ggml_c.find_sources(str(build)) == src.resolve()
    assert bench_ggml_c.find_sources(str(tmp_path / "llama.cpp")) == src.resolve()
    (tmp_path / "other").mkdir()
    with pytest.raises(bench_ggml_c.PeerError, match="not in a ggml tree"):
        bench_ggml_c.find_sources(str(tmp_path / "other"))
    with pytest.raises(bench_ggml_c.PeerError, match="no such folder"):
        bench_ggml_c.find_sources(str(tmp_path / "missing"))


def test_torch_cells_do_the_same_job(bench):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal((2, 4096), dtype=np.float32)
    for case in bench.cases(16384):
        if case.torch not in ("qint8_given", "fp8"):
            continue
        cells = {c.key: c for c in bench.torch_cells(case, x, np.empty_like(x))}
        assert set(cells) == {f"torch_{op}_{t}t" for op in ("quantize", "dequantize") for t in (1, 2)}
        got = cells["torch_quantize_1t"].fn()
        mine = bq.quantize(x, case.scheme, **case.kw).values
        codes = torch.int_repr(got).numpy() if case.torch == "qint8_given" else got.view(torch.uint8).numpy()
        # torch rounds int8 ties to even where blockquant rounds them away: a tie is rare here
        assert np.mean(codes.view(np.uint8) == mine.view(np.uint8)) > 0.999, case.name


def test_targets_read_the_right_cells_and_flag_a_starved_process(bench):
    import bench_report

    def cell(s, cpu_per_wall=1.0, threads=1):
        return dict(median_s=s, cpu_per_wall=cpu_per_wall, threads=threads)

    b32 = dict(name="int8_block32 (Q8S, F16 scales)", bits=8,
               copyto_s=10.0, bq_quantize_1t_s=5.0, bq_quantize_2t_s=3.0,
               bq_quantize_1t_of_copyto=2.0, bq_dequantize_1t_of_copyto=1.4,
               numpy_quantize_s=40.0, numpy_dequantize_s=30.0, bq_dequantize_1t_s=10.0,
               cells=dict(copyto=cell(10.0), bq_quantize_1t=cell(5.0), bq_quantize_2t=cell(3.0, 1.9, 2),
                          numpy_quantize=cell(40.0, 0.3, None)))
    fp4 = dict(name="mxfp4", bits=4, copyto_s=10.0, bq_quantize_1t_s=20.0,
               bq_quantize_1t_of_copyto=0.5, bq_dequantize_1t_of_copyto=1.0,
               cells=dict(copyto=cell(10.0, 0.5), bq_quantize_1t=cell(20.0)))
    q8 = dict(type="Q8_0", bq_quantize_1t_of_copyto=1.5, bq_dequantize_1t_of_copyto=0.9,
              vs_gguf_quantize=25.0, cells={})
    ts = {t["target"]: t for t in bench_report.targets(dict(cases=[b32, fp4], ggml=[q8]))}
    assert ts["#13 block-32 int8 (F16) quantize 1T ≥ 1.4× copyto"]["ok"] is True
    assert ts["#13 block-32 int8 (F16) quantize 2T ≥ 1.7× its 1T"]["measured"] == pytest.approx(5 / 3)
    assert ts["#13 block-32 int8 (F16) quantize 2T ≥ 1.7× its 1T"]["ok"] is False
    assert ts["#13 int8_block32 (Q8S, F16 scales): dequantize into out= 1T ≥ 1.5× copyto"]["ok"] is False
    assert ts["#13 mxfp4: dequantize into out= 1T ≥ 1.0× copyto"]["ok"] is True  # 4-bit: 1.0x
    assert ts["#13 int8_block32 (Q8S, F16 scales): quantize 1T ≥ 10× idiomatic numpy"]["measured"] == 8.0
    assert ts["#13 int8_block32 (Q8S, F16 scales): dequantize 1T ≥ 2.5× idiomatic numpy"]["ok"] is True
    assert ts["#13 mxfp4: quantize 1T ≥ 10× idiomatic numpy"]["ok"] is None  # numpy not timed
    assert "noisy" in ts["#13 mxfp4: quantize 1T ≥ 0.8× copyto"]["note"]  # copyto had half a core
    # only the calls a ratio is made of count: numpy's starved call taints the numpy ratio alone
    assert "note" not in ts["#13 block-32 int8 (F16) quantize 1T ≥ 1.4× copyto"]
    assert "numpy_quantize had 0.30" in ts[
        "#13 int8_block32 (Q8S, F16 scales): quantize 1T ≥ 10× idiomatic numpy"]["note"]
    assert "note" not in ts["#13 int8_block32 (Q8S, F16 scales): dequantize 1T ≥ 2.5× idiomatic numpy"]
    assert ts["#11 Q8_0: quantize 1T ≥ 1.4× copyto"]["ok"] is True
    assert ts["#11 Q8_0: dequantize into out 1T ≥ 1.0× copyto"]["ok"] is False
    assert ts["#11 Q8_0: quantize ≥ 20× gguf-py"]["ok"] is True
    assert ts["#11 Q8_0: dequantize ≥ 20× gguf-py"]["ok"] is None


def test_a_target_past_the_memory_floor_is_marked_bound_not_missed(bench):
    import bench_report

    def case(name, reads, read_s, numpy_s, bq_s):
        return dict(name=name, bits=8, reads=reads, copyto_s=10.0, read_s=read_s,
                    numpy_quantize_s=numpy_s, bq_quantize_1t_s=bq_s,
                    bq_quantize_1t_of_copyto=10.0 / bq_s, cells={})

    ts = {t["target"]: t for t in bench_report.targets(dict(cases=[
        # two reads of 6 ms = 12 ms: numpy's 60 ms / 12 = 5x is all any quantizer could reach
        case("two", 2, 6.0, 60.0, 14.0),
        # one read of 6 ms: 60 / 6 = 10x is reachable, so 14 ms is a plain miss
        case("one", 1, 6.0, 60.0, 14.0),
        # 0.8x copyto needs 12.5 ms; two reads of 7 ms take 14
        case("slow reads", 2, 7.0, 60.0, 16.0),
    ]))}
    two = ts["#13 two: quantize 1T ≥ 10× idiomatic numpy"]
    assert two["ok"] is False and two["bound"] and "2 reads of the input take 1/5.00" in two["note"]
    one = ts["#13 one: quantize 1T ≥ 10× idiomatic numpy"]
    assert one["ok"] is False and "bound" not in one
    assert ts["#13 slow reads: quantize 1T ≥ 0.8× copyto"]["bound"]
    assert "bound" not in ts["#13 two: quantize 1T ≥ 0.8× copyto"]  # 0.71x, floor 0.83x


def test_the_write_floor_writes_the_whole_array_and_nothing_else(bench):
    buf = np.zeros(3 * 4096 + 3, np.float32)
    inner = buf[1:-1]
    bench.writer(inner)()
    assert (inner.view(np.uint8) == 0x3F).all()
    assert buf[0] == 0 and buf[-1] == 0


def test_a_dequantize_past_the_write_floor_is_marked_bound_not_missed(bench):
    import bench_report

    def case(name, write_s, numpy_s, bq_s):
        return dict(name=name, bits=8, copyto_s=6.5, write_s=write_s, numpy_dequantize_s=numpy_s,
                    bq_dequantize_1t_s=bq_s, bq_dequantize_1t_of_copyto=6.5 / bq_s, cells={})

    ts = {t["target"]: t for t in bench_report.targets(dict(cases=[
        # numpy's 7.2 ms is 2.32 writes of 3.1 ms: 2.32x is all any dequantize could reach
        case("at floor", 3.1, 7.2, 3.15),
        # the same floor, but 4 ms is far from it: a plain miss
        case("far", 3.1, 7.2, 4.0),
        # a 2 ms write leaves room for 3.6x: a plain miss
        case("fast write", 2.0, 7.2, 3.15),
    ]))}
    at = ts["#13 at floor: dequantize 1T ≥ 2.5× idiomatic numpy"]
    assert at["ok"] is False and at["bound"] and "one write of the output takes 1/2.32" in at["note"]
    far = ts["#13 far: dequantize 1T ≥ 2.5× idiomatic numpy"]
    assert far["ok"] is False and not far.get("bound") and "far from the floor" in far["note"]
    fast = ts["#13 fast write: dequantize 1T ≥ 2.5× idiomatic numpy"]
    assert fast["ok"] is False and "bound" not in fast


def test_a_two_thread_speedup_past_the_memory_floor_is_marked_bound(bench):
    import bench_report

    def b32(one, two, read=4.5):
        return dict(name="int8_block32 (Q8S, F16 scales)", bits=8, reads=1, copyto_s=9.0,
                    read_s=read, bq_quantize_1t_s=one, bq_quantize_2t_s=two,
                    bq_quantize_1t_of_copyto=9.0 / one, cells={})

    key = "#13 block-32 int8 (F16) quantize 2T ≥ 1.7× its 1T"
    # 1T 5.4 ms against a 4.5 ms read: at most 1.2x to win; 2T at 4.8 ms is near the floor
    t = {x["target"]: x for x in bench_report.targets(dict(cases=[b32(5.4, 4.8)]))}[key]
    assert t["ok"] is False and t["bound"] and "1/1.20" in t["note"]
    # the same 1T, but 2T far from the floor (6.0 ms): a plain miss
    t = {x["target"]: x for x in bench_report.targets(dict(cases=[b32(5.4, 6.0)]))}[key]
    assert t["ok"] is False and "bound" not in t
    # a faster memory (3 ms reads) leaves room for 1.8x: a miss
    t = {x["target"]: x for x in bench_report.targets(dict(cases=[b32(5.4, 5.0, read=3.0)]))}[key]
    assert t["ok"] is False and "bound" not in t
    # a 1T call far from the floor could gain 1.7x: a miss however close 2T comes
    t = {x["target"]: x for x in bench_report.targets(dict(cases=[b32(9.0, 5.4)]))}[key]
    assert t["ok"] is False and "bound" not in t


def test_a_searched_preset_that_misses_says_what_its_search_costs_and_stays_missed(bench):
    import bench_report

    def case(name, bq_s, minmax_s):
        r = dict(name=name, bits=4, reads=2, copyto_s=10.0, read_s=1.0, bq_quantize_1t_s=bq_s,
                 bq_quantize_1t_of_copyto=10.0 / bq_s, cells={})
        if minmax_s is not None:
            r.update(bq_quantize_minmax_1t_s=minmax_s, bq_quantize_minmax_1t_of_copyto=10.0 / minmax_s)
        return r

    ts = {t["target"]: t for t in bench_report.targets(dict(cases=[
        case("searched", 40.0, 16.0), case("searched fast", 10.0, 5.0), case("plain", 40.0, None)]))}
    miss = ts["#13 searched: quantize 1T ≥ 0.8× copyto"]
    assert miss["ok"] is False and not miss.get("bound")
    assert "2.5× the time of the same scheme with minmax's" in miss["note"]
    assert "0.62× copyto" in miss["note"]
    # a met target carries no excuse, and a scheme without a minmax cell no note
    assert "note" not in ts["#13 searched fast: quantize 1T ≥ 0.8× copyto"]
    assert "note" not in ts["#13 plain: quantize 1T ≥ 0.8× copyto"]


def test_the_quality_script_says_in_one_line_what_it_cannot_read(tmp_path):
    np.save(tmp_path / "w.npy", np.ones((4, 4), np.float32))  # no safetensors header
    from safetensors.numpy import save_file

    save_file({"mlp.down_proj.weight": np.ones((8, 32), np.float32)}, str(tmp_path / "m.safetensors"))
    script = str(BENCHES / "quality.py")
    for args, words in [([str(tmp_path / "absent.safetensors")], "No such file"),
                        ([str(tmp_path / "w.npy")], "header length"),
                        ([str(tmp_path / "m.safetensors")], "--pattern REGEX picks others")]:
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert words in proc.stderr and "Traceback" not in proc.stderr
    ok = subprocess.run([sys.executable, script, str(tmp_path / "m.safetensors"), "--pattern",
                         r"down_proj", "--repeat", "1"], capture_output=True, text=True,
                        timeout=300, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "1 tensor, 256 values" in ok.stdout


def test_every_preset_targets_leave_out_rows_that_are_no_preset(bench):
    import bench_report

    def case(name, preset):
        return dict(name=name, bits=8, preset=preset, copyto_s=10.0, bq_quantize_1t_s=20.0,
                    bq_quantize_1t_of_copyto=0.5, bq_dequantize_1t_s=10.0,
                    bq_dequantize_1t_of_copyto=1.0, numpy_quantize_s=40.0,
                    numpy_dequantize_s=10.0, cells={})

    names = [t["target"] for t in bench_report.targets(dict(cases=[
        case("a preset", True), case("no preset", False)]))]
    for op in ("quantize 1T ≥ 0.8× copyto", "quantize 1T ≥ 10× idiomatic numpy",
               "dequantize 1T ≥ 2.5× idiomatic numpy"):
        assert f"#13 a preset: {op}" in names
        assert f"#13 no preset: {op}" not in names
    # dequantize into out= is a target of every 8-bit and 4-bit scheme, preset or not
    assert "#13 no preset: dequantize into out= 1T ≥ 1.5× copyto" in names
    # what bench.py marks: every row but the bare E4M3 cast and the 128×128 blocks
    marked = {c.name: c.preset for c in bench.cases(1 << 16)}
    assert [n for n, p in marked.items() if not p] == ["E4M3 (per-tensor, scale 1)",
                                                      "block[128,128] Q8S F32"]


def test_two_builds_compare_call_for_call(tmp_path):
    # The installed build against itself: every row timed on both sides, the same bytes.
    import blockquant

    package_dir = str(Path(blockquant.__file__).resolve().parents[1])
    md = tmp_path / "builds.md"
    res = subprocess.run([sys.executable, str(BENCHES / "bench_builds.py"), package_dir,
                          package_dir, "--size", "65536", "--repeat", "2", "--only", "block32",
                          "--markdown", str(md)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr
    rows = [line for line in md.read_text().splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 2 * 2 * 2  # int8_block32, int4_block32 × quantize, dequantize × 1T, 2T
    assert all(line.split("|")[-2].strip() == "yes" for line in rows)


def test_onnx_bench_runs_and_reads_back_each_form(tmp_path):
    """benches/bench_onnx.py on a tiny generated model, one round a thread count: a row per
    quantizer, each output read back (the default's SQNR above the minmax row's, which is
    onnxruntime's rule; int8 per tensor the same weights as quantize_dynamic's)."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    res = subprocess.run([sys.executable, str(BENCHES / "bench_onnx.py"), "--width", "128",
                          "--repeat", "1", "--threads", "1,2"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stderr
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in
                                                           line.split("|")[3:-1]]
            for line in res.stdout.splitlines() if line.startswith("| ")}
    default = rows[("blockquant MatMulNBits", "int4_asym_block128 (the default)")]
    minmax = rows[("blockquant MatMulNBits", "u4/native/block128:f32/zero:u8 minmax")]
    qdq = rows[("blockquant DequantizeLinear", "int4_asym_block128 (the default)")]
    assert default[4] == qdq[4]  # the same weights, in either form (SQNR column)
    assert float(default[4]) > float(minmax[4]) + 0.2
    assert rows[("blockquant DequantizeLinear", "int8")][4] == \
        rows[("onnxruntime quantize_dynamic", "int8 per tensor")][4]
    assert all(len(r) == 7 for r in rows.values())  # 2 thread counts + 5 quality columns


def test_bench_dask_quick_run_fills_its_markdown_section(tmp_path):
    """benches/bench_dask.py, smoke-run: every configuration, the same bytes from each, the
    table written into a page's marked section (speed is not asserted)."""
    pytest.importorskip("distributed")
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- bench_dask: begin -->\nold\n<!-- bench_dask: end -->\nafter\n")
    res = subprocess.run([sys.executable, str(BENCHES / "bench_dask.py"), "--quick",
                          "--dir", str(tmp_path / "work"), "--json", str(tmp_path / "d.json"),
                          "--markdown", str(page)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    results = json.loads((tmp_path / "d.json").read_text())
    assert [r["name"] for r in results["rows"]] == [
        "--jobs 1", "--jobs 2", "LocalCluster, 1 worker", "LocalCluster, 2 workers"]
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert "| LocalCluster, 2 workers |" in text
