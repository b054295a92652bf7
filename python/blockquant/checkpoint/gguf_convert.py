"""A Hugging Face checkpoint (one safetensors file, or a model folder of shards) written as a
GGUF file, its tensors of ggml types chosen by a named mix (:mod:`.gguf_mixes`) or one type.

Names and keys follow llama.cpp's ``convert_hf_to_gguf.py`` where ``config.json`` names an
architecture this module knows (:data:`.gguf_names.ARCHITECTURES`: the llama family, Qwen2, BERT):

- each tensor is renamed by gguf-py's ``TensorNameMap`` for that architecture
  (``model.layers.3.mlp.down_proj.weight`` -> ``blk.3.ffn_down.weight``); a tensor it has no
  GGUF name for (BERT's pooler, buffers such as ``position_ids``) is left out, and named;
- the architecture's hyperparameters are written under its keys (``llama.block_count``,
  ``llama.attention.head_count_kv``, ``llama.rope.freq_base`` ...);
- llama's query and key projections are permuted as convert_hf_to_gguf permutes them (ggml's
  rotary embedding pairs neighbouring values; Hugging Face's pairs the two halves);
- 1-D tensors (norms, biases) are F32, as convert_hf_to_gguf writes them; other tensors that
  are not quantized keep their dtype (F64 as F32).

No tokenizer is written: llama.cpp's loader needs ``tokenizer.ggml.*`` (convert_hf_to_gguf
reads it with transformers), so llama.cpp loads such a file only once one is added; gguf-py,
ggml and blockquant read every tensor. Any other architecture keeps the checkpoint's names
under ``general.architecture`` = its ``model_type`` (or ``unknown``): a container of ggml
tensors, which llama.cpp does not load.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import gguf as bg
from ..errors import QuantError
from .base import CheckpointError
from .formats import SAFETENSORS, from_content, read_head
from .gguf_file import (
    MAGIC,
    QUANTIZATION_VERSION,
    VERSION,
    GGUFDecision,
    GGUFSummary,
    GGUFTensorInfo,
    _gguf_string,
    _pad_to,
    _tensor_infos,
    _write_array,
    needs_importance,
    plan_tensors,
)
from .gguf_mixes import Mix, ModelFacts
from .gguf_names import architecture, read_config, tensor_name_map
from .options import FileOptions
from .outputs import OutputFile, check_output

#: The config keys of each hyperparameter, first found wins, and its GGUF key (after the
#: architecture's name) and value type: the ones convert_hf_to_gguf writes for these models.
_HPARAMS = (
    (("max_position_embeddings", "n_ctx"), "context_length", "u32"),
    (("hidden_size", "n_embd"), "embedding_length", "u32"),
    (("num_hidden_layers", "n_layer"), "block_count", "u32"),
    (("intermediate_size", "n_inner"), "feed_forward_length", "u32"),
    (("num_attention_heads", "n_head"), "attention.head_count", "u32"),
)
_LLAMA_LIKE = ("llama", "qwen2")
_U32, _I32, _F32, _BOOL, _STRING = 4, 5, 6, 7, 8
#: safetensors dtypes and the ggml type a kept tensor of each is written as.
_KEPT_TYPE = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F32", "I8": "I8",
              "I16": "I16", "I32": "I32", "I64": "I64"}
_PLAIN_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "I16": 2, "I32": 4, "I64": 8}


@dataclass(frozen=True)
class Source:
    """One tensor of the input: its file, its name there and in the output, and how its
    values are rearranged (``permute``: llama's heads for the rotary pairing)."""

    file: Path
    name: str
    gguf_name: str
    shape: tuple[int, ...]
    dtype: str
    permute: int = 0


@dataclass
class Conversion:
    """A checkpoint as it goes into a GGUF file: its key/value pairs (key, GGUF value type,
    value), its tensors, and the ones left out."""

    path: Path
    arch: str
    kv: list[tuple[str, int, Any]]
    sources: list[Source]
    left_out: list[str] = field(default_factory=list)

    def error(self, tensor: str | None, message: str) -> CheckpointError:
        return CheckpointError(self.path, tensor, message)

    def value(self, key: str) -> Any:
        return next((v for k, _, v in self.kv if k == key), None)


def _files(src: Path) -> list[Path]:
    if src.is_dir():
        from .ct_read import ct_config
        from .folders import scan_folder
        from .mlx_read import mlx_config

        if ct_config(src) is not None or mlx_config(src) is not None:
            raise CheckpointError(src, None, "is a quantized model folder (compressed-tensors "
                                  "or MLX): dequantize it first")
        return [src / rel for rel in scan_folder(src).checkpoints]
    head, size = read_head(src)
    if from_content(head, size) is not SAFETENSORS:
        raise CheckpointError(src, None, "GGUF output is made from a GGUF file, a safetensors "
                              "file or a model folder of them")
    return [src]


def _int(config: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        v = config.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32:
            return v
    return None


def _hparams(arch: str, config: dict[str, Any]) -> list[tuple[str, int, Any]]:
    kv: list[tuple[str, int, Any]] = []
    for keys, name, _ in _HPARAMS:
        v = _int(config, keys)
        if v is not None:
            kv.append((f"{arch}.{name}", _U32, v))
    heads = _int(config, ("num_attention_heads",))
    if arch in _LLAMA_LIKE:
        kv_heads = _int(config, ("num_key_value_heads",))
        kv.append((f"{arch}.attention.head_count_kv", _U32, kv_heads or heads or 0))
        eps = config.get("rms_norm_eps")
        if isinstance(eps, (int, float)):
            kv.append((f"{arch}.attention.layer_norm_rms_epsilon", _F32, float(eps)))
        theta = config.get("rope_theta")
        if isinstance(theta, (int, float)):
            kv.append((f"{arch}.rope.freq_base", _F32, float(theta)))
        hidden = _int(config, ("hidden_size",))
        head_dim = _int(config, ("head_dim",)) or (hidden // heads if hidden and heads else 0)
        if head_dim:
            kv.append((f"{arch}.rope.dimension_count", _U32, head_dim))
        vocab = _int(config, ("vocab_size",))
        if vocab:
            kv.append((f"{arch}.vocab_size", _U32, vocab))
    elif arch == "bert":
        eps = config.get("layer_norm_eps")
        if isinstance(eps, (int, float)):
            kv.append((f"{arch}.attention.layer_norm_epsilon", _F32, float(eps)))
        kv.append((f"{arch}.attention.causal", _BOOL, False))
    return kv


def read_conversion(src: Any) -> Conversion:
    """What converting ``src`` writes, from its config and its headers (no tensor is read)."""
    from .safetensors import SafetensorsCheckpoint

    path = Path(src)
    config = read_config(path)
    arch, known = architecture(config)
    files = _files(path)
    kv: list[tuple[str, int, Any]] = [("general.architecture", _STRING, arch),
                                      ("general.name", _STRING, path.resolve().name.removesuffix(
                                          ".safetensors"))]
    if known:
        kv += _hparams(arch, config)
    name_map = None
    n_head = _int(config, ("num_attention_heads",)) or 0
    n_head_kv = _int(config, ("num_key_value_heads",)) or n_head
    if known:
        name_map = tensor_name_map(arch, _int(config, ("num_hidden_layers",)) or 0)
    sources, left_out, seen = [], [], {}
    for f in files:
        with SafetensorsCheckpoint(f) as ckpt:
            for t in ckpt.tensors:
                new = t.name
                if name_map is not None:
                    new = name_map.get_name(t.name, try_suffixes=(".weight", ".bias"))
                    if new is None:
                        left_out.append(t.name)
                        continue
                if new in seen:
                    raise CheckpointError(f, t.name, f"has the GGUF name {new!r} of "
                                          f"{seen[new]!r} too")
                seen[new] = t.name
                permute = 0
                if arch == "llama" and len(t.shape) in (1, 2):
                    if t.name.endswith(("q_proj.weight", "q_proj.bias")):
                        permute = n_head
                    elif t.name.endswith(("k_proj.weight", "k_proj.bias")):
                        permute = n_head_kv
                if permute and t.shape[0] % (2 * permute):
                    raise CheckpointError(f, t.name, f"{t.shape[0]} rows are not {permute} "
                                          "heads of pairs")
                sources.append(Source(f, t.name, new, tuple(t.shape), t.dtype or "", permute))
    return Conversion(path, arch, kv, sources, left_out)


def _info(s: Source) -> GGUFTensorInfo:
    """A source tensor as it stands in the output before quantizing (1-D ones as F32)."""
    kept = "F32" if len(s.shape) <= 1 and s.dtype in ("F16", "BF16", "F64") else \
        _KEPT_TYPE.get(s.dtype)
    if kept is None:
        raise CheckpointError(s.file, s.name, f"dtype {s.dtype} has no ggml type")
    n = 1
    for d in s.shape:
        n *= d
    return GGUFTensorInfo(s.gguf_name, kept if kept in _PLAIN_BYTES else None, s.shape,
                          n * _PLAIN_BYTES[kept], ggml_type=kept)


def plan_convert(src: Any, mix: Mix, options: FileOptions) -> tuple[Conversion, list[Any]]:
    """The conversion of ``src`` and each tensor's decision (:func:`.gguf_file.plan_tensors`),
    from headers alone."""
    conv = read_conversion(src)
    infos = [_info(s) for s in conv.sources]
    facts = ModelFacts.from_metadata(conv.value, [i.name for i in infos])
    return conv, plan_tensors(conv, infos, mix, facts, options, allow_requantize=False)


# --- writing -----------------------------------------------------------------------------------


def _kv_bytes(kv: list[tuple[str, int, Any]]) -> bytes:
    out = bytearray()
    for key, vtype, value in kv:
        out += _gguf_string(key) + struct.pack("<I", vtype)
        if vtype == _STRING:
            out += _gguf_string(value)
        elif vtype == _U32:
            out += struct.pack("<I", value)
        elif vtype == _F32:
            out += struct.pack("<f", value)
        elif vtype == _BOOL:
            out += struct.pack("<?", value)
        else:
            raise AssertionError(vtype)
    return bytes(out)


def permuted(x: np.ndarray, heads: int) -> np.ndarray:
    """llama's query/key rows reordered for ggml's rotary embedding: within each head, the
    first and second halves interleaved (convert_hf_to_gguf's permute)."""
    rows = x.shape[0]
    return np.ascontiguousarray(
        x.reshape(heads, 2, rows // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape))


def _values(ckpt: Any, s: Source) -> np.ndarray:
    x = ckpt.read(s.name)
    if s.permute:
        x = permuted(x, s.permute)
    return x


def _data(ckpt: Any, s: Source, d: GGUFDecision, imatrix: str | None = None,
          required: bool = False) -> np.ndarray:
    x = _values(ckpt, s)
    w = None
    if d.new_type in bg.TYPES and d.quantized:
        from .imatrix import ggml_weights

        # llama-imatrix names the GGUF tensors; a matrix of the source's names works too.
        w = ggml_weights(imatrix, (d.tensor.name, s.name), x.shape, d.new_type, required)
    try:
        if d.new_type in bg.TYPES:  # quantized, or a float type (1-D tensors as F32)
            return bg.quantize(x, d.new_type, weights=w)
        return np.ascontiguousarray(x)  # integers, as they are
    except QuantError as e:
        raise CheckpointError(s.file, s.name, str(e)) from None


def write_gguf(conv: Conversion, dst: Any, mix: Mix, options: FileOptions, *,
               progress: Callable[[str, int], None] | None = None,
               decisions: list[GGUFDecision] | None = None) -> GGUFSummary:
    """Write the conversion ``conv`` to ``dst`` under ``mix`` (the decisions
    :func:`plan_convert` made); ``dst`` appears only when complete."""
    from .safetensors import SafetensorsCheckpoint

    t0 = time.perf_counter()
    check_output(conv.path, dst)
    if decisions is None:
        decisions = plan_convert(conv.path, mix, options)[1]
    kv = conv.kv + [("general.file_type", _U32, mix.ftype.id),
                    ("general.quantization_version", _U32, QUANTIZATION_VERSION)]
    alignment = 32
    infos, offsets, data_size = _tensor_infos(decisions, alignment)
    with ExitStack() as stack, OutputFile(dst, options.force) as out:
        open_files: dict[Path, Any] = {}
        out.write(MAGIC + struct.pack("<IQQ", VERSION, len(decisions), len(kv)))
        out.write(_kv_bytes(kv))
        out.write(infos)
        _pad_to(out, -(-out.tell() // alignment) * alignment)
        base = out.tell()
        for s, d, offset in zip(conv.sources, decisions, offsets):
            if s.file not in open_files:
                open_files[s.file] = stack.enter_context(SafetensorsCheckpoint(s.file))
            _pad_to(out, base + offset)
            data = _data(open_files[s.file], s, d, options.imatrix, needs_importance(mix, d))
            if data.nbytes != d.bytes_after:
                raise CheckpointError(s.file, s.name, f"wrote {data.nbytes} bytes, expected "
                                      f"{d.bytes_after}")
            _write_array(out, data)
            if progress is not None:
                progress(d.tensor.name, d.tensor.nbytes)
        _pad_to(out, base + data_size)
        out.commit()
    return GGUFSummary(decisions, mix.name, sum(s_nbytes(s) for s in conv.sources),
                       os.path.getsize(dst), time.perf_counter() - t0,
                       [d.tensor.name for d in decisions if d.quantized])


def s_nbytes(s: Source) -> int:
    n = 1
    for d in s.shape:
        n *= d
    return n * {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}.get(s.dtype, _PLAIN_BYTES.get(s.dtype, 4))
