"""GGUF files (llama.cpp's): read as checkpoints, and requantized into GGUF as llama-quantize
does (its named mixes, :mod:`.gguf_mixes`, or one type with ``--pure``), for the types :mod:`blockquant.gguf` writes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4,
TQ1_0, TQ2_0, F16, BF16, F32 bit for bit as gguf-py quantizes them; Q2_K..Q6_K, IQ4_NL, IQ4_XS
and NVFP4 with blockquant's own quantizers, in ggml's layouts).

Parsing (and checking) a file is gguf-py's ``GGUFReader`` (the optional extra
``blockquant[gguf]``). The output is written here: every key/value pair is copied byte for byte
from the input (``GGUFWriter`` re-encodes values, refuses empty arrays and cannot hold nested
ones), then the tensor infos in the input's order, then each tensor, streamed one at a time,
into a temporary file renamed into place at the end.

What requantizing does, as llama-quantize:

- a tensor is quantized when its name ends in ``weight``, it has at least two dimensions
  (``min_rank``) and it is not one llama-quantize leaves alone (norms, MoE routers, position
  embeddings, small Mamba/RWKV/T5 tensors: :data:`LEFT_AS_THEY_ARE`);
- its type is the mix's choice (:func:`.gguf_mixes.choose_types`: overrides, llama.cpp's rules,
  the fallback for rows that are not whole blocks); a tensor whose type has no fallback and
  whose rows are not whole blocks of it is kept as it is;
- a tensor already of the target type is copied; one of another quantized type is refused
  unless ``allow_requantize`` (it is then dequantized and quantized again);
- ``general.file_type`` and ``general.quantization_version`` are set (kept in place when
  present, appended when not) and ``split.*`` keys are dropped; everything else is unchanged,
  the alignment included.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from .. import gguf as bg
from ..errors import QuantError
from .base import NAME_TO_ST, Checkpoint, CheckpointError, TensorInfo, st_nbytes
from .gguf_mixes import Mix, ModelFacts, choose_types, resolve_mix
from .gguf_reader import _ARRAY, MAGIC, _gguf_py, open_reader
from .options import FileOptions
from .outputs import OutputFile, check_output
from .rules import rank_kept
from .safetensors import HeaderEntry, SafetensorsWriter, float_array

#: The GGUF version written (the current one; version 2 files read the same way).
VERSION = 3

#: Name parts of the weights llama-quantize never quantizes (substrings of the name), and the
#: names it leaves alone whole.
LEFT_AS_THEY_ARE = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
    "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
)
LEFT_AS_THEY_ARE_NAMES = ("position_embd.weight", "token_types.weight")

#: ``GGML_QNT_VERSION``, which llama-quantize writes as ``general.quantization_version``.
QUANTIZATION_VERSION = 2
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
#: The header values gguf-py's reader lists among the fields.
_PSEUDO_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")
#: The GGUF value type (gguf_type) of the values written here (the array type is the reader's).
_UINT32 = 4
#: ggml types numpy holds as they are, and their safetensors names.
_PLAIN = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64",
          "I8": "I8", "I16": "I16", "I32": "I32", "I64": "I64"}
_FLOATS = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class GGUFTensorInfo(TensorInfo):
    """A GGUF tensor: ``shape`` in numpy's order (GGUF stores it reversed), ``ggml_type`` its
    type's name (``dtype`` is safetensors' name when there is one, else None)."""

    ggml_type: str = "F32"

    @property
    def dtype_name(self) -> str:
        return self.ggml_type if self.dtype is None else super().dtype_name

    @property
    def quantized(self) -> bool:
        return self.ggml_type not in _PLAIN

    @property
    def dequantized_on_read(self) -> bool:
        return self.quantized


def _type_name(t: Any) -> str:
    return getattr(t, "name", str(t))


class GGUFCheckpoint(Checkpoint):
    """A GGUF file as a checkpoint: its tensors in file order, its scalar key/value pairs as
    ``metadata`` (as text; arrays, such as the tokenizer's, are left out), and reads of one
    tensor at a time from the memory-mapped file."""

    format = "gguf"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reader = open_reader(path)
        self._raw: dict[str, Any] = {}
        for rt in self.reader.tensors:
            ggml_type = _type_name(rt.tensor_type)
            shape = tuple(int(d) for d in reversed(rt.shape.tolist()))
            self.tensors.append(GGUFTensorInfo(rt.name, _PLAIN.get(ggml_type), shape,
                                               int(rt.data.nbytes), ggml_type=ggml_type))
            self._raw[rt.name] = rt
        self._index()
        for key, value in scalar_metadata(self.reader).items():
            self.metadata[key] = value

    def raw(self, name: str) -> Any:
        """gguf-py's ``ReaderTensor``: ``data`` is the memory-mapped array (quantized types as
        uint8 blocks, BF16 as its bytes)."""
        return self._raw[name]

    def read(self, name: str) -> np.ndarray:
        """The tensor as numbers: F32/F16/F64/integers as they are, BF16 as float32 (exactly),
        a quantized type dequantized to float32."""
        t = self.info(name)
        assert isinstance(t, GGUFTensorInfo)
        return values(self.raw(name), t, self.path)

    def copy_to(self, name: str, out: BinaryIO) -> None:
        flat = self.raw(name).data.reshape(-1).view(np.uint8)
        step = 1 << 24
        for at in range(0, len(flat), step):
            out.write(memoryview(flat[at: at + step]))


def scalar_metadata(reader: Any) -> dict[str, str]:
    """The key/value pairs that are not arrays, as text."""
    out = {}
    for key, f in reader.fields.items():
        if key in _PSEUDO_FIELDS or not f.types or f.types[0] == _ARRAY:
            continue
        try:
            out[key] = str(f.contents())
        except (UnicodeDecodeError, ValueError, IndexError):
            out[key] = "<unreadable>"
    return out


def values(rt: Any, t: GGUFTensorInfo, path: Any) -> np.ndarray:
    """A tensor's values: plain types as they are (native order), BF16 as float32, quantized
    types dequantized to float32 (blockquant's kernels for its types, gguf-py's for others)."""
    data = rt.data
    if t.ggml_type == "BF16":
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
    if not t.quantized:
        return np.array(data)
    if t.ggml_type in bg.TYPES:
        return bg.dequantize(data, t.ggml_type).reshape(t.shape)
    gguf = _gguf_py(path)
    try:
        # Corrupt scales make numpy warn inside gguf-py; the NaN or infinity they give is
        # reported once, by whoever reads the values (quantize's non-finite check).
        with np.errstate(all="ignore"):
            out = gguf.quants.dequantize(data, rt.tensor_type)
        return np.asarray(out, np.float32).reshape(t.shape)
    except NotImplementedError:
        raise CheckpointError(path, t.name, f"gguf-py cannot dequantize {t.ggml_type}") from None


# --- requantizing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFDecision:
    """What requantizing does to one tensor: ``new_type`` (its own when it is kept) and, when it
    is kept, ``why``; ``how`` says why the mix chose that type (empty: the file type's)."""

    tensor: GGUFTensorInfo
    new_type: str
    why: str = ""
    how: str = ""

    @property
    def quantized(self) -> bool:
        return self.new_type != self.tensor.ggml_type

    @property
    def bytes_after(self) -> int:
        if not self.quantized:
            return self.tensor.nbytes
        return int(np.prod(self.tensor.shape[:-1], dtype=np.int64)) * bg.byte_shape(
            self.tensor.shape[-1:], self.new_type)[0]


#: Why a tensor is kept (``GGUFDecision.why``); :data:`KEPT_WORDS` says it in a few words.
KEPT_RANK = "rank"
KEPT_NAME = "name"
KEPT_ROWS = "rows"
KEPT_SAME = "same"
KEPT_SELECTION = "selection"
KEPT_DTYPE = "dtype"
KEPT_RULE = "rule"
KEPT_WORDS = {KEPT_RANK: "rank below --min-rank", KEPT_NAME: "llama-quantize keeps it",
              KEPT_ROWS: "rows not whole blocks", KEPT_SAME: "already that type",
              KEPT_SELECTION: "--include/--exclude", KEPT_DTYPE: "not floating point",
              KEPT_RULE: "--rule keep"}


def as_mix(target: Any) -> Mix:
    """A :class:`~.gguf_mixes.Mix`; a type or file type's name is a file of that one type
    (``llama-quantize --pure``)."""
    return target if isinstance(target, Mix) else resolve_mix(target, pure=True)


def model_facts(ckpt: GGUFCheckpoint) -> ModelFacts:
    """What the mixes' rules read of the model, from its key/value pairs."""
    fields = ckpt.reader.fields

    def value(key: str) -> Any:
        f = fields.get(key)
        if f is None or not f.types:
            return None
        try:
            return f.contents()
        except (UnicodeDecodeError, ValueError, IndexError):
            return None

    return ModelFacts.from_metadata(value, [t.name for t in ckpt.tensors])


def plan_requantize(ckpt: GGUFCheckpoint, target: Any, options: FileOptions,
                    allow_requantize: bool = False) -> list[GGUFDecision]:
    """Each tensor's fate under ``target`` (a :class:`~.gguf_mixes.Mix`, or a type's name:
    that one type), decided from the header alone; a tensor that would need requantizing
    without ``allow_requantize`` (or, with ``options.strict``, one whose type cannot take its
    rows) is a ``CheckpointError`` before anything is written."""
    return plan_tensors(ckpt, [t for t in ckpt.tensors if isinstance(t, GGUFTensorInfo)],
                        as_mix(target), model_facts(ckpt), options, allow_requantize)


def plan_tensors(ckpt: Checkpoint, tensors: list[GGUFTensorInfo], mix: Mix, facts: ModelFacts,
                 options: FileOptions, allow_requantize: bool) -> list[GGUFDecision]:
    """The decisions for ``tensors`` (GGUF names and types, as they go into the output)."""
    early: dict[str, str] = {}
    for t in tensors:
        why = _kept_because(t, mix, options)
        if why:
            early[t.name] = why
    choices = choose_types([(t.name, t.shape) for t in tensors],
                           {t.name for t in tensors if t.name not in early}, mix, facts,
                           ckpt.path)
    out = []
    for t in tensors:
        why = early.get(t.name, "")
        c = choices.get(t.name)
        if c is not None and not why:
            why = _kept_after(t, c.type, c.fits, options)
        if why == KEPT_ROWS and options.strict:
            raise ckpt.error(t.name, f"rows of {(t.shape or (1,))[-1]} values are not whole "
                             f"{c.type if c else ''} blocks, and {c.type if c else 'it'} has no "
                             "fallback type (--strict)")
        if why:
            out.append(GGUFDecision(t, t.ggml_type, why, c.how if c else ""))
            continue
        assert c is not None and c.type is not None
        if t.quantized and not allow_requantize:
            raise ckpt.error(t.name, f"is already quantized ({t.ggml_type}); quantizing it again "
                             "adds error: --allow-requantize does it anyway")
        out.append(GGUFDecision(t, c.type, how=c.how))
    return out


def _kept_because(t: GGUFTensorInfo, mix: Mix, options: FileOptions) -> str:
    """Why llama-quantize (or --min-rank, or a rule's @N) leaves a tensor alone before any type
    is chosen; empty when it does not."""
    name = t.name
    kept = rank_kept(mix.rule_for(name), len(t.shape), options.min_rank)
    if kept is not None:  # first: a norm is kept for its rank, as a bias is
        return KEPT_RANK if kept[0] == "rank" else KEPT_RULE
    if not name.endswith("weight") or name in LEFT_AS_THEY_ARE_NAMES or any(
            part in name for part in LEFT_AS_THEY_ARE):
        return KEPT_NAME
    return ""


def _kept_after(t: GGUFTensorInfo, new_type: str | None, fits: bool,
                options: FileOptions) -> str:
    """Why a tensor the mix gave ``new_type`` is kept all the same; empty when it is not."""
    if new_type is None:
        return KEPT_RULE
    if not options.selects(t.name):
        return KEPT_SELECTION
    if t.ggml_type == new_type:
        return KEPT_SAME
    if not (t.ggml_type in _FLOATS or t.quantized):
        return KEPT_DTYPE
    if not fits or not t.shape:  # a 0-d tensor: one value, no row
        return KEPT_ROWS
    return ""


def kept_summary(decisions: list[GGUFDecision], target: str = "", min_rank: int = 2) -> str:
    """The tensors left as they are and why, as one line (empty when none was)."""
    groups: dict[str, list[str]] = {}
    for d in decisions:
        if not d.quantized:
            groups.setdefault(d.why, []).append(d.tensor.name)
    if not groups:
        return ""
    words = {
        KEPT_RANK: f"of rank below {min_rank} (norms, biases)",
        KEPT_NAME: "that llama-quantize leaves as they are (not named *weight, or a router, "
                   "position embedding, small Mamba/RWKV tensor)",
        KEPT_ROWS: "whose rows are not whole blocks of their type, which has no fallback",
        KEPT_SAME: "already of their type",
        KEPT_RULE: "by --rule keep",
        KEPT_SELECTION: "by --include/--exclude",
        KEPT_DTYPE: "not floating point",
    }
    parts = []
    for why, text in words.items():
        names = groups.get(why, [])
        if names:
            shown = "" if why == KEPT_RANK else (
                ": " + ", ".join(names[:3]) + (", ..." if len(names) > 3 else ""))
            parts.append(f"{len(names)} {text}{shown}")
    n = sum(len(v) for v in groups.values())
    return f"left {n} tensor{'s' if n != 1 else ''} as they are: " + "; ".join(parts)


@dataclass
class GGUFSummary:
    """What a requantize run did: each tensor's decision, bytes of tensor data read, bytes of
    the file written, seconds."""

    decisions: list[GGUFDecision]
    target: str
    bytes_in: int
    bytes_out: int
    seconds: float
    quantized: list[str] = field(default_factory=list)


def requantize_gguf(
    src: Any,
    dst: Any,
    qtype: Any,
    options: FileOptions | None = None,
    *,
    allow_requantize: bool = False,
    progress: Callable[[str, int], None] | None = None,
    decisions: list[GGUFDecision] | None = None,
) -> GGUFSummary:
    """Requantize the GGUF file ``src`` to ``qtype`` (a :class:`~.gguf_mixes.Mix`, or a
    type's name: that one type) into the GGUF file ``dst``, as llama-quantize does (see the
    module's docstring). One tensor is in memory at a time (the
    input is memory-mapped); ``dst`` appears only when complete. Uses ``options.include``,
    ``exclude``, ``min_rank``, ``strict`` and ``force``. Raises ``CheckpointError`` (nothing
    written) on any problem. ``decisions``: the plan :func:`plan_requantize` made (the front
    door plans once); the file must still hold the tensors it was made for."""
    options = options or FileOptions()
    mix = as_mix(qtype)
    t0 = time.perf_counter()
    check_output(src, dst)
    with GGUFCheckpoint(Path(src)) as ckpt:
        reader = ckpt.reader
        split = reader.fields.get("split.count")
        if split is not None and int(split.contents()) > 1:
            raise ckpt.error(None, f"is one of {int(split.contents())} shards of a split model; "
                             "merge them first (llama-gguf-split --merge)")
        if decisions is None:
            decisions = plan_requantize(ckpt, mix, options, allow_requantize)
        elif [d.tensor for d in decisions] != list(ckpt.tensors):
            raise ckpt.error(None, "changed since the run was planned")
        kv = _kv_bytes(reader, mix.ftype.id)
        infos, offsets, data_size = _tensor_infos(decisions, int(reader.alignment))
        with OutputFile(dst, options.force) as out:
            out.write(MAGIC + struct.pack("<IQQ", VERSION, len(decisions), kv.count))
            out.write(kv.data)
            out.write(infos)
            alignment = int(reader.alignment)
            _pad_to(out, -(-out.tell() // alignment) * alignment)
            base = out.tell()
            for d, offset in zip(decisions, offsets):
                _pad_to(out, base + offset)
                data = _tensor_data(ckpt, d, options.imatrix, needs_importance(mix, d))
                if data.nbytes != d.bytes_after:
                    raise ckpt.error(d.tensor.name, f"wrote {data.nbytes} bytes, expected "
                                     f"{d.bytes_after}")
                _write_array(out, data)
                del data
                if progress is not None:
                    progress(d.tensor.name, d.tensor.nbytes)
            _pad_to(out, base + data_size)
            out.commit()
    return GGUFSummary(decisions, mix.name, sum(d.tensor.nbytes for d in decisions),
                       os.path.getsize(dst), time.perf_counter() - t0,
                       [d.tensor.name for d in decisions if d.quantized])


@dataclass
class _KV:
    data: bytes
    count: int


def _kv_bytes(reader: Any, file_type: int) -> _KV:
    """Every key/value pair's bytes as the input has them, in its order, but the two
    llama-quantize sets (in place, or appended) and the split keys it drops."""
    new = {"general.file_type": file_type,
           "general.quantization_version": QUANTIZATION_VERSION}
    parts: list[bytes] = []
    for key, f in reader.fields.items():
        if key in _PSEUDO_FIELDS or key in _SPLIT_KEYS:
            continue
        if key in new:
            parts.append(_uint32_kv(key, new.pop(key)))
            continue
        size = sum(int(p.nbytes) for p in f.parts)
        parts.append(reader.data[f.offset: f.offset + size].tobytes())
    parts += [_uint32_kv(key, value) for key, value in new.items()]
    return _KV(b"".join(parts), len(parts))


def _gguf_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _uint32_kv(key: str, value: int) -> bytes:
    return _gguf_string(key) + struct.pack("<II", _UINT32, value)


def _tensor_infos(decisions: list[GGUFDecision], alignment: int) -> tuple[bytes, list[int], int]:
    """The tensor info section, each tensor's data offset, and the size of the data section."""
    out = bytearray()
    offsets = []
    at = 0
    for d in decisions:
        dims = list(reversed(d.tensor.shape))  # GGUF's order: the row first
        out += _gguf_string(d.tensor.name)
        out += struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, _type_id(d.new_type), at)
        offsets.append(at)
        at += -(-d.bytes_after // alignment) * alignment
    return bytes(out), offsets, at


def _type_id(name: str) -> int:
    if name in bg.TYPES:
        return bg.TYPES[name].id
    import gguf

    return int(gguf.GGMLQuantizationType[name])


def needs_importance(mix: Mix, d: GGUFDecision) -> bool:
    """Whether llama-quantize refuses to make the tensor without an importance matrix entry:
    Q2_K_S's Q2_K tensors, but the token embeddings and the output head."""
    return (mix.ftype.name == "Q2_K_S" and d.new_type == "Q2_K"
            and d.tensor.name not in ("token_embd.weight", "output.weight"))


def _tensor_data(ckpt: GGUFCheckpoint, d: GGUFDecision, imatrix: str | None = None,
                 required: bool = False) -> np.ndarray:
    """The tensor as it goes into the output: the input's bytes when kept, else quantized (its
    columns weighted by ``imatrix``'s entry for it, where the type takes weights)."""
    rt = ckpt.raw(d.tensor.name)
    if not d.quantized:
        return rt.data
    t = d.tensor
    from .imatrix import ggml_weights

    w = ggml_weights(imatrix, (t.name,), t.shape, d.new_type, required)
    try:
        if t.ggml_type == "BF16":
            return bg.quantize_bits(rt.data.view(np.uint16), "bf16", d.new_type, weights=w)
        if t.ggml_type in ("F32", "F16"):
            return bg.quantize(rt.data, d.new_type, weights=w)
        return bg.quantize(values(rt, t, ckpt.path), d.new_type, weights=w)
    except CheckpointError:
        raise  # names the file and the tensor already
    except QuantError as e:
        raise ckpt.error(t.name, str(e)) from None


def _write_array(out: OutputFile, a: np.ndarray) -> None:
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    step = 1 << 24
    for at in range(0, len(flat), step):
        out.write(memoryview(flat[at: at + step]))


def _pad_to(out: OutputFile, offset: int) -> None:
    out.write(b"\0" * (offset - out.tell()))


# --- inspect, dequantize, report ------------------------------------------------------------------


def inspect_gguf(src: Any) -> dict[str, Any]:
    """What a GGUF file holds, in :func:`~.commands.inspect_file`'s form: per tensor its ggml
    type as ``scheme`` (None for F32/F16/BF16 and integers), shape, bytes, bits per value."""
    with GGUFCheckpoint(Path(src)) as ckpt:
        rows = []
        for t in ckpt.tensors:
            assert isinstance(t, GGUFTensorInfo)
            rows.append({"name": t.name, "scheme": t.ggml_type if t.quantized else None,
                         "shape": list(t.shape), "dtype": t.dtype_name, "bytes": t.nbytes,
                         "numel": t.numel,
                         "bits_per_value": 8.0 * t.nbytes / t.numel if t.numel else None})
        return {"file": str(src), "format": "gguf", "file_bytes": os.path.getsize(src),
                "metadata": dict(ckpt.metadata), "tensors": rows}


def dequantize_gguf(src: Any, dst: Any, options: FileOptions | None = None, *,
                    progress: Callable[[str, int], None] | None = None,
                    require_quantized: bool = True) -> tuple[int, int]:
    """A GGUF file as a safetensors file: its quantized tensors dequantized (to float32, or
    ``options.dtype``), the others copied as they are, its scalar key/value pairs as metadata
    (text). Returns (tensors dequantized, tensors copied)."""
    options = options or FileOptions()
    check_output(src, dst)
    with GGUFCheckpoint(Path(src)) as ckpt:
        tensors = [t for t in ckpt.tensors if isinstance(t, GGUFTensorInfo)]
        if require_quantized and not any(t.quantized for t in tensors):
            raise ckpt.error(None, "holds no quantized tensor (nothing to dequantize)")
        dtype = options.dtype or "float32"
        layout = []
        for t in tensors:
            if t.quantized:
                st = NAME_TO_ST[dtype]
                layout.append(HeaderEntry(t.name, st, t.shape, st_nbytes(st, t.shape) or 0))
            else:
                layout.append(HeaderEntry(t.name, _PLAIN[t.ggml_type], t.shape, t.nbytes))
        with SafetensorsWriter(dst, layout, dict(ckpt.metadata), force=options.force) as w:
            for t in tensors:
                if t.quantized:
                    w.write(t.name, float_array(ckpt.read(t.name), dtype))
                else:
                    w.write_from(t.name, ckpt, t.name)
                if progress is not None:
                    progress(t.name, t.nbytes)
            w.commit()
    n = sum(t.quantized for t in tensors)
    return n, len(tensors) - n
