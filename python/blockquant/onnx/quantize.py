"""quantize_model, report_model and inspect_model: the ONNX counterparts of the file commands."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._threads import get_num_threads, imap_ordered
from .._version import __version__
from ..checkpoint.base import CheckpointError
from ..checkpoint.commands import natural_key
from ..checkpoint.options import FileOptions
from ..errors import SchemeError
from ..metrics import ErrorStats, bits_per_weight
from ..presets import resolve
from ..scheme import QuantScheme
from .lowering import (
    Lowered,
    Quantized,
    check_offset,
    lower_matmulnbits,
    lower_qdq,
    qdq_opset,
    quantize_weight,
)
from .model import (
    META_KEY,
    Weight,
    _onnx,
    add_initializer,
    check_output,
    error,
    init_bytes,
    load,
    new_namer,
    opset_of,
    plan,
    read_array,
    read_metadata,
    save,
    take_initializers,
)

FORMS = ("qdq", "matmulnbits")
#: The scheme of a run that names none: 4-bit codes with a zero point and a bf16 scale per
#: 128 values along K, the ranges searched (the preset's "mse"). onnxruntime's own 4-bit
#: quantizer writes the same shape (block 128, zero points) from each block's min and max; the
#: search gains about 0.45 dB of weight SQNR over it (docs/onnx.md).
DEFAULT_SCHEME = "int4_asym_block128"
FP4_FORMS = ("lookup", "dq")


@dataclass
class OnnxSummary:
    """What quantize_model did: the weights quantized and kept (name -> reason), bytes of the
    input and output files (external data included), seconds, the ai.onnx opset before and
    after, and each weight's plan (:class:`~blockquant.onnx.model.Weight`, with its notes)."""

    quantized: list[str]
    kept: dict[str, str]
    bytes_in: int
    bytes_out: int
    seconds: float
    opset_before: int
    opset_after: int
    weights: list[Weight] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _options(options: FileOptions | None, kw: dict[str, Any]) -> FileOptions:
    if options is not None and kw:
        raise TypeError("give options= or the keyword options, not both")
    return options if options is not None else FileOptions(**kw)


def _check_scheme(scheme: QuantScheme) -> None:
    """A scheme no weight could be written with, refused before the model is read."""
    try:
        check_offset(scheme)
    except SchemeError as e:
        raise CheckpointError("--scheme", None, str(e)) from None


def _check_form(form: str, fp4: str) -> None:
    if form not in FORMS:
        raise error("--onnx-op", f"expected one of {', '.join(FORMS)}, got {form!r}")
    if fp4 not in FP4_FORMS:
        raise error("--onnx-fp4", f"expected one of {', '.join(FP4_FORMS)}, got {fp4!r}")


def _quantize(arr: np.ndarray, w: Weight, options: FileOptions) -> Quantized:
    assert w.scheme is not None
    return quantize_weight(arr, w.kaxis, w.scheme, options.quantize_options(w.scheme), w.form)


def _lay_out(q: Quantized, w: Weight, fp4: str, namer: Any) -> Lowered:
    if w.form == "matmulnbits":
        return lower_matmulnbits(w.name, q, namer, w.onnx_type)
    return lower_qdq(w.name, q, namer, out_type=w.onnx_type, fp4=fp4)


def _searched(w: Weight, options: FileOptions) -> bool:
    """Whether ``w``'s scales are searched (``mse``)."""
    assert w.scheme is not None
    return options.quantize_options(w.scheme)["calibration"] == "mse"


def _lower_all(weights: list[Weight], held: dict[str, Any], options: FileOptions, fp4: str,
               namer: Any, src: Any) -> dict[str, Lowered]:
    """Each weight to quantize, lowered. A search (``mse``; an affine one is tens of times the
    work per value of a plain scale) runs on the kernel threads at once, a weight a thread:
    the core hands a call of fewer than 256 Ki values to no other thread, and a model's
    weights are often that small. (Calls without a search are too short for that to pay.) The names are given here, in order, so the output is the same whatever the threads.
    Each weight is read from ``held`` when it is quantized, and its float copy dropped
    after."""
    todo = [w for w in weights if w.scheme is not None]

    def work(w: Weight) -> Quantized | BaseException:
        try:
            return _quantize(read_array(held.pop(w.name)), w, options)
        except Exception as e:  # raised below, in order, naming the weight
            return e

    lowered: dict[str, Lowered] = {}
    slow = any(_searched(w, options) for w in todo)
    threads = get_num_threads() if len(todo) > 1 and slow else 1
    for w, q in zip(todo, imap_ordered(work, todo, threads)):
        try:
            if isinstance(q, BaseException):
                raise q
            lw = _lay_out(q, w, fp4, namer)
        except Exception as e:
            if isinstance(e, MemoryError):
                raise
            raise error(src, str(e), w.name) from None
        lw.qtensor = None  # the codes a byte each: only a report reads them
        lowered[w.name] = lw
    return lowered


def _needed_opset(weights: list[Weight], fp4: str) -> int:
    return max([qdq_opset(w.scheme, w.shape, w.kaxis, fp4) for w in weights
                if w.scheme is not None and w.form == "qdq"], default=1)


#: Initializers of more elements than this go around onnx's version converter, not through
#: it: it serializes the model and parses its answer, copying each tensor it holds.
_AROUND_CONVERTER = 1024


def _convert(model: Any, held: dict[str, Any], target: int, src: Any) -> Any:
    """``model`` at opset ``target``. The weights to be quantized (``held``, out of the graph
    already) and the other large initializers go through the converter as graph inputs of
    their type and shape, not as data (their consumers read them alike in every opset); the
    large ones are put back after."""
    _onnx()  # installed, or a one-line error
    from onnx import helper, version_converter

    g = model.graph
    inputs = {i.name for i in g.input}
    big = take_initializers(model, {t.name for t in g.initializer if t.name not in inputs
                                    and math.prod(t.dims) > _AROUND_CONVERTER})
    around = {**held, **big}
    n_inputs = len(g.input)
    g.input.extend(helper.make_tensor_value_info(name, t.data_type, list(t.dims))
                   for name, t in around.items())
    try:
        converted = version_converter.convert_version(model, target)
    except Exception as e:
        raise error(src, f"its opset {opset_of(model)} is below the {target} the chosen "
                    f"schemes need, and onnx's version converter failed: "
                    f"{type(e).__name__}: {e}") from None
    finally:
        del g.input[n_inputs:]
    cg = converted.graph
    kept_inputs = [i for i in cg.input if i.name not in around]
    del cg.input[:]
    cg.input.extend(kept_inputs)
    cg.initializer.extend(big.values())
    # The converter stamps the newest IR this onnx knows; older runtimes refuse IRs they do
    # not know, so keep the lowest the opsets allow (_set_opsets raises it as needed).
    converted.ir_version = model.ir_version
    return converted


def _rewrite(model: Any, weights: list[Weight], lowered: dict[str, Lowered]) -> None:
    """Put each weight's lowered form into the graph (in place): its initializers added, the
    nodes that decode it first, and each consumer MatMulNBits replaces changed where it is."""
    from onnx import helper

    g = model.graph
    front: list[Any] = []
    for w in weights:
        lw = lowered.get(w.name)
        if lw is None:
            continue
        for name, arr in lw.initializers.items():
            add_initializer(g, name, arr)
        front += lw.nodes
        if w.form != "matmulnbits":
            continue
        o = lw.onnx
        for u in w.uses:
            node = u.node
            inputs = [node.input[0], o["B"], o["scales"]]
            if o.get("zero_points"):
                inputs.append(o["zero_points"])
            if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
                inputs += [""] * (5 - len(inputs)) + [node.input[2]]  # g_idx absent; bias
            attrs = dict(K=o["K"], N=o["N"], bits=o["bits"], block_size=o["block_size"])
            node.op_type, node.domain = "MatMulNBits", "com.microsoft"
            del node.input[:]
            node.input.extend(inputs)
            del node.attribute[:]
            node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    if front:
        nodes = front + list(g.node)
        del g.node[:]
        g.node.extend(nodes)


def _set_opsets(model: Any, matmulnbits: bool) -> None:
    from onnx import helper

    if matmulnbits and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    std = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    try:
        model.ir_version = max(model.ir_version, helper.find_min_ir_version_for(std))
    except (ValueError, KeyError):  # an opset newer than this onnx knows: leave the IR as it is
        pass


def _metadata(weights: list[Weight], lowered: dict[str, Lowered], options: FileOptions,
              form: str) -> str:
    tensors = {}
    for w in weights:
        lw = lowered.get(w.name)
        if lw is None or w.scheme is None:
            continue
        tensors[w.name] = {"scheme": str(w.scheme), **lw.onnx, "shape": list(w.shape),
                           "dtype": w.onnx_type, "parts": sorted(lw.initializers),
                           **options.quantize_options(w.scheme),
                           "notes": lw.notes + w.notes}
    return json.dumps({"version": __version__, "form": form, "tensors": tensors},
                      sort_keys=True)


def _file_bytes(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def quantize_model(src: Any, dst: Any, scheme: QuantScheme | str | None = None, *,
                   form: str = "qdq", fp4: str = "lookup", external_data: bool | None = None,
                   options: FileOptions | None = None, **kw: Any) -> OnnxSummary:
    """Quantize the MatMul/Gemm weights of the ONNX model ``src`` and write ``dst``.

    ``scheme``: a preset name, a scheme text or a QuantScheme; None: :data:`DEFAULT_SCHEME`.
    ``form``: "qdq" (DequantizeLinear in front of the consumer) or "matmulnbits"
    (onnxruntime's com.microsoft.MatMulNBits; 2-, 4- and 8-bit blocked schemes, affine ones
    with their zero points). ``fp4``: how E2M1 values are decoded ("lookup": INT4 bits and a
    Gather table, which onnxruntime runs; "dq": the standard FLOAT4E2M1 DequantizeLinear of
    opset 23). ``external_data``: write the tensors to
    ``dst + '.data'`` (None: only past 1.8 GB). The checkpoint options (include, exclude,
    rules, min_rank, calibration, rounding, scale_rounding, force) come as ``options`` or as
    keywords. Raises CheckpointError (nothing written) on any problem; a scheme ONNX cannot
    hold is an error naming the reason.
    """
    t0 = time.perf_counter()
    scheme = resolve(DEFAULT_SCHEME if scheme is None else scheme)
    options = _options(options, kw)
    _check_form(form, fp4)
    _check_scheme(scheme)
    dst_path = check_output(src, dst, options.force)
    model = load(src)
    if read_metadata(model) is not None:
        raise error(src, "already holds blockquant-quantized weights")
    before = opset_of(model)
    weights = plan(model, scheme, options, form, src)
    # The weights leave the graph now: each is read once, when lowered, and never copied
    # back (its quantized form replaces it).
    held = take_initializers(model, {w.name for w in weights if w.scheme is not None})
    target = _needed_opset(weights, fp4)
    notes = []
    if target > before:
        order = {w.name: i for i, w in enumerate(weights)}
        model = _convert(model, held, target, src)
        weights = plan(model, scheme, options, form, src, held)  # the converter made new nodes
        weights.sort(key=lambda w: order.get(w.name, len(order)))
        notes.append(f"opset raised from {before} to {target} by onnx's version converter")
    lowered = _lower_all(weights, held, options, fp4, new_namer(model), src)
    _rewrite(model, weights, lowered)
    _set_opsets(model, any(w.form == "matmulnbits" for w in weights if w.scheme))
    entry = model.metadata_props.add()
    entry.key, entry.value = META_KEY, _metadata(weights, lowered, options, form)
    save(model, src, dst_path, force=options.force, external=external_data)
    for lw in lowered.values():
        for n in lw.notes:
            if n not in notes:
                notes.append(n)
    return OnnxSummary(
        quantized=[w.name for w in weights if w.scheme is not None],
        kept={w.name: w.why for w in weights if w.scheme is None},
        bytes_in=_file_bytes(Path(src)), bytes_out=_file_bytes(dst_path),
        seconds=time.perf_counter() - t0, opset_before=before, opset_after=opset_of(model),
        weights=weights, notes=notes)


def report_model(src: Any, scheme: QuantScheme | str | None = None, *, form: str = "qdq",
                 fp4: str = "lookup", options: FileOptions | None = None,
                 **kw: Any) -> dict[str, Any]:
    """Quantize each weight in memory (nothing written) and measure it, in the shape of
    :func:`blockquant.checkpoint.commands.report_file`'s report: SQNR against the original
    weight, max abs error, bytes before (its float initializer) and after (the ONNX
    initializers that replace it), and time. ``scheme`` None: :data:`DEFAULT_SCHEME`."""
    scheme = resolve(DEFAULT_SCHEME if scheme is None else scheme)
    options = _options(options, kw)
    _check_form(form, fp4)
    _check_scheme(scheme)
    model = load(src)
    if read_metadata(model) is not None:
        raise error(src, "already holds blockquant-quantized weights")
    weights = plan(model, scheme, options, form, src)
    namer = new_namer(model)
    inits = {t.name: t for t in model.graph.initializer}
    rows, total = [], ErrorStats()
    for w in weights:
        if w.scheme is None:
            continue
        t0 = time.perf_counter()
        try:
            arr = read_array(inits[w.name])
            lw = _lay_out(_quantize(arr, w, options), w, fp4, namer)
        except Exception as e:
            if isinstance(e, (MemoryError, KeyboardInterrupt)):
                raise
            raise error(src, str(e), w.name) from None
        seconds = time.perf_counter() - t0
        arr = arr.astype(np.float32)
        x = np.moveaxis(arr, w.kaxis, -1) if lw.moved else arr  # as lw.qtensor has it
        assert lw.qtensor is not None
        stats = ErrorStats.between(np.ascontiguousarray(x), lw.qtensor.dequantize())
        total += stats
        rows.append({"name": w.name, "scheme": str(w.scheme), "shape": list(w.shape),
                     "dtype": w.onnx_type, "form": w.form, "sqnr_db": stats.sqnr_db,
                     "max_abs_err": stats.max_abs_err, "bytes_before": w.nbytes,
                     "bytes_after": lw.nbytes,
                     "bits_per_weight": bits_per_weight(lw.nbytes, stats.numel),
                     "seconds": seconds, "notes": lw.notes + w.notes})
    rows.sort(key=lambda r: natural_key(r["name"]))
    before = sum(r["bytes_before"] for r in rows)
    after = sum(r["bytes_after"] for r in rows)
    all_bytes = sum(init_bytes(t) for t in model.graph.initializer)
    kept = [w for w in weights if w.scheme is None]
    return {
        "file": str(src), "format": "onnx", "form": form, "scheme": str(scheme),
        **options.quantize_options(scheme),
        "tensors": rows,
        "overall": {"tensors": len(rows), "numel": total.numel, "sqnr_db": total.sqnr_db,
                    "max_abs_err": total.max_abs_err, "bytes_before": before,
                    "bytes_after": after, "bits_per_weight": bits_per_weight(after, total.numel),
                    "seconds": sum(r["seconds"] for r in rows)},
        "file_total": {"tensors": len(model.graph.initializer),
                       "unquantized": len(model.graph.initializer) - len(rows),
                       "bytes_before": all_bytes, "bytes_after": all_bytes - before + after},
        "kept": [{"name": w.name, "why": w.why, "detail": w.why} for w in kept],
    }


def inspect_model(src: Any) -> dict[str, Any]:
    """What an ONNX model holds, in the shape of :func:`inspect_file`'s answer: one row per
    initializer, a blockquant-quantized weight as one row (its scheme, original shape and dtype,
    and the bytes of the initializers that hold it)."""
    from onnx import TensorProto

    model = load(src, data=False)
    meta = read_metadata(model) or {}
    tensors = meta.get("tensors", {}) if isinstance(meta.get("tensors"), dict) else {}
    inits = {t.name: t for t in model.graph.initializer}
    part_of = {p: name for name, e in tensors.items() for p in e.get("parts", [])
               if p in inits}
    rows = []
    for name, e in tensors.items():
        shape = [int(d) for d in e.get("shape", [])]
        n = int(np.prod(shape, dtype=np.int64))
        rows.append({"name": name, "scheme": e.get("scheme"), "shape": shape,
                     "dtype": f"{e.get('dtype', '?')} -> {e.get('form', '?')} {e.get('type', '')}"
                     .strip(),
                     "bytes": sum(init_bytes(inits[p]) for p in e.get("parts", [])
                                  if p in inits), "numel": n})
    for t in model.graph.initializer:
        if t.name in part_of:
            continue
        n = int(np.prod(t.dims, dtype=np.int64))
        rows.append({"name": t.name, "scheme": None, "shape": list(t.dims),
                     "dtype": TensorProto.DataType.Name(t.data_type),
                     "bytes": init_bytes(t), "numel": n})
    rows.sort(key=lambda r: natural_key(r["name"]))
    for r in rows:
        r["bits_per_value"] = 8.0 * r["bytes"] / r["numel"] if r["numel"] else None
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    return {"file": str(src), "format": "onnx", "file_bytes": _file_bytes(Path(src)),
            "metadata": {"opset": ", ".join(f"{k} {v}" for k, v in opsets.items()),
                         "ir_version": model.ir_version,
                         **({"blockquant_form": meta["form"]} if "form" in meta else {})},
            "tensors": rows}

