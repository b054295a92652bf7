"""``blockquant report`` of a GGUF file under a ggml type or a named mix: each tensor
requantized in memory (nothing written) and measured against the input's values, and, with an
importance matrix, the error weighted by it as llama-quantize's searches weigh it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from .. import gguf as bg
from ..metrics import ErrorStats, bits_per_weight
from .gguf_file import (
    GGUFCheckpoint,
    _tensor_data,
    as_mix,
    needs_importance,
    plan_requantize,
    values,
)
from .imatrix import importance_overall, importance_row, weights_for
from .options import FileOptions


def report_gguf(src: Any, qtype: Any, options: FileOptions | None = None, *,
                progress: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    """Requantize in memory (nothing written) and measure, per tensor requantizing would
    quantize: SQNR against the input's values, max abs error, bytes before and after, time. The
    keys are :func:`~.commands.report_file`'s."""
    options = options or FileOptions()
    mix = as_mix(qtype)
    with GGUFCheckpoint(Path(src)) as ckpt:
        decisions = plan_requantize(ckpt, mix, options, allow_requantize=True)
        rows, total = [], ErrorStats()
        for d in decisions:
            t = d.tensor
            if d.quantized:
                x = values(ckpt.raw(t.name), t, ckpt.path)
                t0 = time.perf_counter()
                blocks = _tensor_data(ckpt, d, options.imatrix, needs_importance(mix, d))
                seconds = time.perf_counter() - t0
                y = bg.dequantize(blocks, d.new_type).reshape(t.shape)
                w = weights_for(options.imatrix, (t.name,), t.shape)
                stats = ErrorStats.between(x, y)
                total += stats
                rows.append({"name": t.name, "scheme": d.new_type, "shape": list(t.shape),
                             "dtype": t.dtype_name, "sqnr_db": stats.sqnr_db,
                             "max_abs_err": stats.max_abs_err, "bytes_before": t.nbytes,
                             "bytes_after": d.bytes_after,
                             "bits_per_weight": bits_per_weight(d.bytes_after, stats.numel),
                             "seconds": seconds, **importance_row(x, y, w, options.imatrix)})
            if progress is not None:
                progress(t.name, t.nbytes)
    before = sum(r["bytes_before"] for r in rows)
    after = sum(r["bytes_after"] for r in rows)
    file_bytes = sum(d.tensor.nbytes for d in decisions)
    return {
        "file": str(src), "format": "gguf", "scheme": mix.name,
        "tensors": rows,
        "overall": {"tensors": len(rows), "numel": total.numel, "sqnr_db": total.sqnr_db,
                    "max_abs_err": total.max_abs_err, "bytes_before": before,
                    "bytes_after": after, "bits_per_weight": bits_per_weight(after, total.numel),
                    "seconds": sum(r["seconds"] for r in rows), **importance_overall(rows)},
        "file_total": {"tensors": len(decisions), "unquantized": len(decisions) - len(rows),
                       "bytes_before": file_bytes, "bytes_after": after + file_bytes - before},
        "kept": [{"name": d.tensor.name, "why": d.why} for d in decisions if not d.quantized],
    }
