"""PyTorch checkpoints (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) are recognized and refused with
a way out, never loaded: they are pickles, and unpickling a file can run any code in it.

``torch.save`` writes a zip holding ``data.pkl`` (PyTorch 1.6 and later, TorchScript too) or,
before that, a bare pickle (protocol 2: it starts with the bytes 0x80 0x02).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .base import CheckpointError

HOW_TO_CONVERT = (
    "convert it to safetensors with PyTorch, then quantize that: "
    "safetensors.torch.save_file(torch.load(FILE, weights_only=True), 'model.safetensors'), "
    "or a transformers model's save_pretrained(DIR, safe_serialization=True)"
)


def pytorch_error(path: Any, kind: str) -> CheckpointError:
    return CheckpointError(path, None, f"a PyTorch checkpoint ({kind}), which blockquant does "
                           f"not read since loading one can run code; {HOW_TO_CONVERT}")


def refuse_pickle(path: Any, magic: bytes) -> None:
    """Refuse a file starting as a pickle of protocol 2 to 5 (PROTO opcode, then the
    protocol). A safetensors file may start so too (its header's length): the caller rules
    safetensors out first; no other format blockquant reads starts with 0x80."""
    if len(magic) >= 2 and magic[0] == 0x80 and 2 <= magic[1] <= 5:
        raise pytorch_error(path, "a pickle")


def refuse_pytorch_zip(ckpt: Any, members: Iterable[str]) -> None:
    """Refuse a zip that holds pickles (``archive/data.pkl``): torch.save's format, not .npz."""
    if any(m.endswith(".pkl") for m in members):
        raise pytorch_error(ckpt.path, "a zip of pickles")
