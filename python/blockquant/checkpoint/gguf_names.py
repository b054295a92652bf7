"""Hugging Face names and GGUF names: the architectures blockquant converts (the ``config.json``
names that llama.cpp's ``convert_hf_to_gguf.py`` knows as the llama family, Qwen2 and BERT),
the config beside a checkpoint, and gguf-py's ``TensorNameMap`` of an architecture."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from .base import CheckpointError

#: Hugging Face's ``architectures`` names this module converts, and their GGUF architecture.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "LlamaModel": "llama",
    "Qwen2ForCausalLM": "qwen2", "Qwen2Model": "qwen2",
    "BertModel": "bert", "BertForMaskedLM": "bert",
}


def read_config(src: Path) -> dict[str, Any]:
    """The ``config.json`` of a model folder, or beside a safetensors file ({} when none)."""
    folder = src if src.is_dir() else src.parent
    path = folder / "config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(path, None, f"not a readable config ({e})") from None
    return config if isinstance(config, dict) else {}


def architecture(config: dict[str, Any]) -> tuple[str, bool]:
    """The GGUF architecture, and whether names and keys are llama.cpp's for it."""
    names = config.get("architectures") or []
    for n in names if isinstance(names, list) else []:
        if n in ARCHITECTURES:
            return ARCHITECTURES[n], True
    model_type = config.get("model_type")
    return (model_type if isinstance(model_type, str) and model_type else "unknown"), False


def tensor_name_map(arch: str, n_blocks: int) -> Any:
    """gguf-py's ``TensorNameMap`` of the GGUF architecture ``arch``."""
    import gguf

    return gguf.get_tensor_name_map(
        next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), n_blocks)


@functools.lru_cache(maxsize=8)
def gguf_names(path: str) -> dict[str, str]:
    """Each tensor of the safetensors file ``path`` by its GGUF name, where ``config.json``
    beside it names an architecture this module knows (an importance matrix is keyed so);
    empty otherwise or when the file cannot be read so."""
    from .safetensors import SafetensorsCheckpoint

    try:
        p = Path(path)
        config = read_config(p)
        arch, known = architecture(config)
        if not known:
            return {}
        blocks = config.get("num_hidden_layers")
        name_map = tensor_name_map(arch, blocks if isinstance(blocks, int) else 0)
        with SafetensorsCheckpoint(p) as ckpt:
            names = [t.name for t in ckpt.tensors]
    except (CheckpointError, OSError, ImportError):  # no gguf-py: no GGUF names
        return {}
    out = {}
    for n in names:
        new = name_map.get_name(n, try_suffixes=(".weight", ".bias"))
        if new is not None and new != n:
            out[n] = new
    return out
