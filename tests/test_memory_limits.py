"""Allocations sized by the input never abort: under an address-space limit (RLIMIT_AS) every
call that needs more memory than is left raises MemoryError, and the process lives on and works
once memory is back. The command says so in one line, exit 2.

Each case runs in a child process whose limit is set just above what it already uses, so the
call's own output (tens of MiB here) cannot be had."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

resource = pytest.importorskip("resource")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")

CHILD = textwrap.dedent(r"""
    import ctypes, json, resource, sys
    import numpy as np
    import blockquant as bq
    from blockquant import gguf as bg

    def vm_bytes():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    try:  # glibc keeps freed memory in the process: give it back, so the limits are what is left
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        trim = lambda pad: 0

    def limited(call, top=128):
        # The call under limits from a little above what the process uses to past what it
        # needs, so that every allocation inside it is the one to fail at some step: each step
        # must either work or raise MemoryError.
        seen = set()
        steps = (0.25, 0.5, 1, 2, 3, 4, 6, 8, 12, 16, 17, 20, 24, 32, 40, 48, 64, 80, 96, 128,
                 256, 512, 768, 1024)
        for mib in [m for m in steps if m <= top]:
            trim(0)
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + int(mib * 2**20), hard))
            try:
                call()
                seen.add("ok")
            except MemoryError:
                seen.add("MemoryError")
            except BaseException as e:
                seen.add(f"{type(e).__name__}: {e}")
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        return sorted(seen)

    bq.set_num_threads(2)
    n = 16 << 20  # 64 MiB of float32
    x = np.random.default_rng(0).standard_normal((n // 4096, 4096), dtype=np.float32)
    qt = bq.quantize(x, "int8_block32")   # 16 MiB of codes: every output below needs more
    blob = qt.to_bytes()
    g = bg.quantize(x, "Q8_0")
    qt.dequantize(); bg.dequantize(g, "Q8_0")  # the pool's threads are up
    calls = {
        "to_bytes": qt.to_bytes,
        "from_bytes": lambda: bq.QTensor.from_bytes(blob, qt.scheme, x.shape),
        "quantize": lambda: bq.quantize(x, "int8_block32"),
        "dequantize": qt.dequantize,
        "gguf.quantize": lambda: bg.quantize(x, "Q8_0"),
        "gguf.dequantize": lambda: bg.dequantize(g, "Q8_0"),
        # the pure-numpy oracle holds several float64 copies: ~470 MiB at its peak here
        "reference.quantize": lambda: bq.reference.quantize(x, qt.scheme),
    }
    name = sys.argv[1]
    seen = limited(calls[name], top=1024 if name.startswith("reference") else 128)
    # and the process works on, with memory back
    after = "ok" if bq.quantize(x, "int8_block32").to_bytes() == blob else "differs"
    print(json.dumps({"seen": seen, "after": after}))
""")


CALLS = ["to_bytes", "from_bytes", "quantize", "dequantize", "gguf.quantize",
         "gguf.dequantize", "reference.quantize"]


@pytest.mark.parametrize("call", CALLS)
def test_every_input_sized_allocation_fails_as_memory_error_and_the_process_lives(call):
    # Each call in a process of its own: memory another call freed cannot blur the limits.
    res = subprocess.run([sys.executable, "-c", CHILD, call], capture_output=True, text=True,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["after"] == "ok"
    # The call met the limit at some step (MemoryError) and got through once memory sufficed.
    assert result["seen"] == ["MemoryError", "ok"], result


def test_the_command_says_out_of_memory_in_one_line(tmp_path):
    gguf = pytest.importorskip("gguf")
    src = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(src, "llama")
    x = np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32)  # 64 MiB
    w.add_tensor("blk.0.attn_q.weight", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "o.gguf"
    failed = 0
    for mib in range(64, 240, 8):  # past the input's mapping (64 MiB), through the work
        script = textwrap.dedent(f"""
            import resource, sys
            import numpy  # the command's own imports first, then the limit
            import blockquant.cli, gguf
            with open("/proc/self/status") as f:
                vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
            resource.setrlimit(resource.RLIMIT_AS, (vm + ({mib} << 20), resource.RLIM_INFINITY))
            sys.exit(blockquant.cli.main(["quantize", {str(src)!r}, "-o", {str(out)!r},
                                          "--scheme", "q8_0", "--force"]))
        """)
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=300, check=False)
        if res.returncode == 0:
            assert out.is_file()
            out.unlink()
            continue
        failed += 1
        assert res.returncode == 2, (mib, res.returncode, res.stderr[-3000:])
        assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert res.stderr.startswith("blockquant: error: ") and "memory" in res.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"], mib
    assert failed, "no limit was tight enough to fail the command"
