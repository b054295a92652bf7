"""Reading, planning, rewriting and writing an ONNX model.

Which initializers are weights: the float initializers that feed ``MatMul`` or ``Gemm`` (as A
or B; a Gemm's C is a bias and stays) in the main graph and are not also graph inputs (a caller
may override those). The consumer says which axis is K (``transA``/``transB``, the side the
weight is on). Then the checkpoint rules decide, in the same order: ``--include``/``--exclude``,
the first matching ``--rule``, ``--min-rank``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import _fs
from .._fs import fsync_dir, fsync_path, same_file, signals_deferred, temp_sibling
from ..checkpoint.base import CheckpointError
from ..checkpoint.options import FileOptions, compile_rules, matching_rule, rule_scheme
from ..checkpoint.rules import rank_kept
from ..errors import QuantError
from ..scheme import QuantScheme, ScaleDtype
from .lowering import (
    FLOAT_TYPES,
    SUB_BYTE_DTYPES,
    check_matmulnbits,
    check_scheme,
    pack_bits,
)

#: The metadata_props key blockquant records its work under.
META_KEY = "blockquant"
#: Past this many bytes of tensor data, a model is written with ONNX external data (protobuf
#: cannot serialize a message of 2 GiB or more).
EXTERNAL_DATA_BYTES = 1_800_000_000


def error(path: Any, message: str, tensor: str | None = None) -> CheckpointError:
    return CheckpointError(path, tensor, message)


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise CheckpointError("onnx", None, "ONNX models need the onnx package "
                              "(pip install 'blockquant[onnx]')") from None
    return onnx


def load(src: Any, *, data: bool = True) -> Any:
    """The model at ``src``, checked by onnx.checker; anything unreadable is a CheckpointError.
    ``data=False`` leaves external data on disk (inspect needs only the shapes)."""
    onnx = _onnx()
    from onnx.external_data_helper import load_external_data_for_model

    path = Path(src)
    if not path.is_file():
        raise error(src, "no such file" if not path.exists() else "is not a file")
    try:
        raw = path.read_bytes()
        model = onnx.ModelProto.FromString(raw)
        # Checked from the bytes read, not from the file again; by path with external data
        # (its files are checked too) or past protobuf's 2 GiB.
        checked: Any = raw if len(raw) < 2**31 else str(path)
        if data and _has_external_data(model.graph):
            load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
            checked = str(path)
    except MemoryError:
        raise
    except Exception as e:  # DecodeError, missing external data, ...: one line, never a trace
        raise error(src, f"is not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not model.HasField("graph") or not model.opset_import or model.ir_version <= 0:
        raise error(src, "is not an ONNX model (no graph, opset or IR version)")
    if data:
        try:
            onnx.checker.check_model(checked)
        except Exception as e:
            raise error(src, f"does not pass onnx.checker: {type(e).__name__}: {e}") from None
    return model


def _has_external_data(graph: Any) -> bool:
    """Whether a tensor of ``graph`` (initializers, attributes, subgraphs) is stored outside.
    onnx.load walks them all to load each such one, with more work per node: this walk decides
    whether that is needed."""
    from onnx import AttributeProto, TensorProto

    outside = TensorProto.EXTERNAL
    if any(t.data_location == outside for t in graph.initializer):
        return True
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR and a.t.data_location == outside:
                return True
            if a.type == AttributeProto.TENSORS and any(t.data_location == outside
                                                       for t in a.tensors):
                return True
            if a.type == AttributeProto.GRAPH and _has_external_data(a.g):
                return True
            if a.type == AttributeProto.GRAPHS and any(_has_external_data(g) for g in a.graphs):
                return True
    return False


def opset_of(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


#: TensorProto type number -> name, of the float types a weight may have; and their sizes.
_FLOAT_TYPE_NAMES = {1: "FLOAT", 10: "FLOAT16", 16: "BFLOAT16", 11: "DOUBLE"}
_FLOAT_ITEMSIZE = {"FLOAT": 4, "FLOAT16": 2, "BFLOAT16": 2, "DOUBLE": 8}
assert set(_FLOAT_ITEMSIZE) == set(FLOAT_TYPES)


@dataclass
class Use:
    node: Any
    index: int  # which input of the node the weight is
    kaxis: int


@dataclass
class Weight:
    """One initializer that feeds a MatMul or Gemm, and what happens to it."""

    name: str
    onnx_type: str  # FLOAT, FLOAT16, ...
    shape: tuple[int, ...]
    nbytes: int
    uses: list[Use]
    other_uses: int  # uses by other nodes or by subgraphs
    scheme: QuantScheme | None = None
    why: str = ""  # when kept
    form: str = ""  # "qdq" or "matmulnbits" when quantized
    notes: list[str] = field(default_factory=list)

    @property
    def quantized(self) -> bool:
        return self.scheme is not None

    @property
    def kaxis(self) -> int:
        return self.uses[0].kaxis


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _kaxis(node: Any, index: int, rank: int) -> int:
    if node.op_type == "Gemm":
        flip = _attr(node, "transA" if index == 0 else "transB", 0)
        return (1 - index) ^ (1 if flip else 0) if rank == 2 else rank - 1
    if index == 1:
        return max(rank - 2, 0)
    return rank - 1


def subgraph_names(graph: Any) -> set[str]:
    """Every name the nodes of ``graph``'s subgraphs (If, Loop, Scan bodies) read."""
    from onnx import AttributeProto

    names: set[str] = set()
    for node in graph.node:
        for a in node.attribute:
            subs = [a.g] if a.type == AttributeProto.GRAPH else (
                list(a.graphs) if a.type == AttributeProto.GRAPHS else [])
            for g in subs:
                for n in g.node:
                    names.update(n.input)
                names |= subgraph_names(g)
    return names


def find_weights(model: Any, held: dict[str, Any] | None = None) -> list[Weight]:
    """The MatMul/Gemm float initializers of the main graph, in initializer order. ``held``:
    initializers taken out of the graph (:func:`take_initializers`) that count as its own."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    if held:
        inits.update(held)
    uses: dict[str, list[Use]] = {}
    other: dict[str, int] = {}
    for node in g.node:
        is_mm = node.op_type in ("MatMul", "Gemm") and node.domain in ("", "ai.onnx")
        for i, name in enumerate(node.input):
            if name not in inits:
                continue
            if is_mm and i < 2:
                rank = len(inits[name].dims)
                uses.setdefault(name, []).append(Use(node, i, _kaxis(node, i, rank)))
            else:
                other[name] = other.get(name, 0) + 1
    for name in subgraph_names(g):
        if name in inits:
            other[name] = other.get(name, 0) + 1
    out = []
    for name, t in inits.items():
        type_name = _FLOAT_TYPE_NAMES.get(t.data_type)
        if name not in uses or type_name is None:
            continue
        dims = tuple(t.dims)
        nbytes = math.prod(dims) * _FLOAT_ITEMSIZE[type_name]
        out.append(Weight(name, type_name, dims, nbytes, uses[name], other.get(name, 0)))
    return out


def _nbits_reason(w: Weight, scheme: QuantScheme, inits: dict[str, Any]) -> str:
    """Why MatMulNBits cannot replace every use of ``w`` with ``scheme`` ("" when it can)."""
    if w.onnx_type not in ("FLOAT", "FLOAT16"):
        return f"MatMulNBits takes float or float16 activations, not {w.onnx_type}"
    if w.onnx_type == "FLOAT16" and scheme.scale_dtype is ScaleDtype.BF16:
        return ("a float16 model's MatMulNBits takes float16 scales, and BF16 scales are not "
                "all float16 values")
    if len(w.shape) != 2:
        return f"MatMulNBits takes a 2-D weight, this one is {len(w.shape)}-D"
    if w.other_uses:
        return "also read by nodes other than MatMul/Gemm"
    if len({u.kaxis for u in w.uses}) > 1:
        return "read with K on both axes by different consumers"
    for u in w.uses:
        if u.index != 1:
            return f"{u.node.op_type} {u.node.name or u.node.output[0]!r} has it as input A"
        if u.node.op_type == "Gemm":
            if _attr(u.node, "transA", 0) or _attr(u.node, "alpha", 1.0) != 1.0:
                return "a Gemm with transA or alpha != 1"
            if len(u.node.input) > 2 and u.node.input[2]:
                c = inits.get(u.node.input[2])
                n = w.shape[0] if _attr(u.node, "transB", 0) else w.shape[1]
                if c is None or tuple(c.dims) != (n,) or _attr(u.node, "beta", 1.0) != 1.0:
                    return "a Gemm whose C is not a 1-D bias initializer with beta 1"
    return ""


def plan(model: Any, scheme: QuantScheme, options: FileOptions, form: str,
         src: Any, held: dict[str, Any] | None = None) -> list[Weight]:
    """Decide each weight (module docstring). A scheme ONNX cannot hold is an error. ``held``:
    as :func:`find_weights` takes it."""
    weights = find_weights(model, held)
    inputs = {i.name for i in model.graph.input}
    inits = {t.name: t for t in model.graph.initializer}
    rules = compile_rules(options.rules)
    options.check_schemes(scheme)
    options.advise(scheme)
    for w in weights:
        if w.name in inputs:
            w.why = "also a graph input (a caller may override it)"
            continue
        if not options.selects(w.name):
            w.why = "left out by --include/--exclude"
            continue
        chosen = scheme
        rule = matching_rule(rules, w.name)
        if rule is not None:
            picked = rule_scheme(rule)
            if picked is None:
                w.why = f"--rule {rule.text}"
                continue
            chosen = picked
        kept = rank_kept(rule, len(w.shape), options.min_rank)
        if kept is not None:
            w.why = kept[1]
            continue
        try:
            check_scheme(chosen)
            w.form = "qdq"
            if form == "matmulnbits":
                check_matmulnbits(chosen)
                reason = _nbits_reason(w, chosen, inits)
                if reason:
                    w.notes.append(f"written as DequantizeLinear: {reason}")
                else:
                    w.form = "matmulnbits"
        except QuantError as e:
            raise error(src, str(e), w.name) from None
        w.scheme = chosen
    return weights


def new_namer(model: Any) -> Any:
    """A function giving names no tensor or node of the model has yet."""
    g = model.graph
    taken = {t.name for t in g.initializer} | {i.name for i in g.input}
    taken |= {o.name for o in g.output} | {v.name for v in g.value_info}
    for n in g.node:
        taken.update(n.input)
        taken.update(n.output)
    taken |= subgraph_names(g)

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        taken.add(name)
        return name

    return fresh


def read_metadata(model: Any) -> dict[str, Any] | None:
    for p in model.metadata_props:
        if p.key == META_KEY:
            try:
                value = json.loads(p.value)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def check_output(src: Any, dst: Any, force: bool) -> Path:
    if isinstance(dst, str) and dst.endswith(("/", os.sep)):
        raise error(dst, "names a folder; give a file name")
    if same_file(src, dst):
        raise error(dst, "is the input file; write to another name (--force never overwrites "
                    "the input)")
    path = Path(dst)
    if path.exists() and not path.is_file():
        raise error(dst, "is not a regular file; not replacing it")
    if path.exists() and not force:
        raise error(dst, "exists (--force replaces it)")
    if not path.parent.is_dir():
        raise error(dst, f"folder {str(path.parent)!r} does not exist")
    return path


def tensor_bytes(model: Any) -> int:
    """Bytes of the initializers' data, from their types and shapes (reading ``raw_data``
    would copy every tensor just to count it)."""
    return sum(init_bytes(t) for t in model.graph.initializer)


#: Bits of an element of the types numpy's itemsize does not give.
_SUB_BYTE = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}


def init_bytes(t: Any) -> int:
    """Bytes of an initializer's data, from its type and shape (external data not read)."""
    bits = _element_bits(t.data_type)
    if bits is None:  # strings: their own size
        return int(t.ByteSize())
    return (math.prod(t.dims) * bits + 7) // 8


@functools.lru_cache(maxsize=None)
def _element_bits(data_type: int) -> int | None:
    from onnx import TensorProto, helper

    bits = _SUB_BYTE.get(TensorProto.DataType.Name(data_type))
    if bits is not None:
        return bits
    try:
        return 8 * np.dtype(helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except Exception:
        return None


#: The float types whose raw little-endian bytes numpy reads as they are.
_RAW_DTYPES = {"FLOAT": "<f4", "FLOAT16": "<f2", "DOUBLE": "<f8"}


def read_array(t: Any) -> np.ndarray:
    """An initializer's values. Raw bytes (what exporters write) are read with one copy, not
    through numpy_helper's conversions; other encodings go through numpy_helper."""
    from onnx import TensorProto, numpy_helper

    name = TensorProto.DataType.Name(t.data_type)
    dtype: Any = _RAW_DTYPES.get(name)
    if name == "BFLOAT16":
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    if dtype is not None and t.data_location != TensorProto.EXTERNAL and t.HasField("raw_data"):
        return np.frombuffer(t.raw_data, dtype=dtype).reshape(tuple(t.dims))
    return numpy_helper.to_array(t)


def take_initializers(model: Any, names: set[str]) -> dict[str, Any]:
    """Remove the initializers ``names`` from the main graph and return them by name, in
    graph order. Removing by index leaves every other initializer where it is: rebuilding the
    list would copy each one kept."""
    g = model.graph
    found = [(i, t) for i, t in enumerate(g.initializer) if t.name in names]
    for i, _ in reversed(found):
        del g.initializer[i]
    return {t.name: t for _, t in found}


def add_initializer(graph: Any, name: str, arr: np.ndarray) -> None:
    """``arr`` as an initializer of ``graph``, its bytes written once (numpy_helper.from_array
    makes a tensor that ``extend`` then copies; sub-byte types are packed here as ONNX packs
    them: the first element in the low bits, across the whole tensor)."""
    from onnx import helper, numpy_helper

    if sys.byteorder != "little":  # raw data is little-endian: numpy_helper swaps
        graph.initializer.append(numpy_helper.from_array(arr, name))
        return
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        arr = arr.copy(order="C")
    bits = SUB_BYTE_DTYPES.get(arr.dtype.name)
    raw = arr if bits is None else pack_bits(arr.reshape(-1).view(np.uint8), bits)
    graph.initializer.add(name=name, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype),
                          dims=arr.shape, raw_data=raw.tobytes())




def save(model: Any, src: Any, dst: Path, *, force: bool, external: bool | None) -> None:
    """Write ``model`` to ``dst`` whole or not at all: into a hidden folder beside it, checked
    by onnx.checker there, then renamed (the external data file first, so a reader never finds
    the new model without its data). ``external`` None: external data past 1.8 GB."""
    onnx = _onnx()
    if external is None:
        external = tensor_bytes(model) > EXTERNAL_DATA_BYTES
    data_name = dst.name + ".data"
    data_dst = dst.with_name(data_name)
    if external and data_dst.exists() and not (force and data_dst.is_file()):
        raise error(data_dst, "exists (--force replaces it)" if data_dst.is_file()
                    else "is not a regular file; not replacing it")
    tmp = temp_sibling(dst, "tmpdir")
    tmp.mkdir()
    try:
        model_tmp = tmp / dst.name
        if external:
            onnx.save_model(model, str(model_tmp), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=data_name, size_threshold=0)
            written: Any = str(model_tmp)  # checked by path, with its data file
        else:  # onnx.save_model would walk every tensor for external data first
            written = model.SerializeToString()
            model_tmp.write_bytes(written)
        for f in tmp.iterdir():
            fsync_path(f)
        try:
            onnx.checker.check_model(written)
        except Exception as e:  # a bug of blockquant's: say so in one line, write nothing
            raise error(dst, f"the written model fails onnx.checker ({type(e).__name__}: {e}); "
                        "please report this") from None
        del written
        with signals_deferred():  # the data file and the model that names it, together
            try:
                if external:
                    _fs.publish(tmp / data_name, data_dst, force=force, record=False)
                _fs.publish(model_tmp, dst, force=force)
            except FileExistsError:  # made meanwhile: still never clobbered
                raise error(dst, "exists (--force replaces it)") from None
        fsync_dir(dst.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
