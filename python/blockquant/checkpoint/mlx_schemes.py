"""MLX's quantization modes, as blockquant writes them (docs/mlx.md).

MLX (``mx.quantize``, ``nn.QuantizedLinear``) and mlx-lm read a quantized layer as three
tensors beside its name: ``<layer>.weight`` (uint32 words of codes), ``<layer>.scales`` and,
for the ``affine`` mode, ``<layer>.biases``; ``config.json``'s ``quantization`` entry gives the
mode, bits and group size of every layer, with entries of their own for the layers that differ
(keyed by the layer's path).

This module is the table: each mode MLX takes (``affine`` at 2, 3, 4, 5, 6 and 8 bits in groups
of 32, 64 or 128; ``mxfp4``, ``mxfp8``, ``nvfp4``), the blockquant scheme one weight gets under
it (:func:`scheme_for`) and the ``quantization`` entry that describes it. The bytes are
:mod:`.mlx_codec`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .base import CheckpointError
from .mlx_codec import DEFAULTS, MODES

#: safetensors dtype of a weight -> blockquant's scale dtype (MLX keeps an affine layer's
#: scales and biases in the weight's dtype).
SCALE_DTYPE = {"BF16": "bf16", "F16": "f16", "F32": "f32"}
_NAME = re.compile(r"^(affine|mxfp4|mxfp8|nvfp4)(\d)?(?::g(\d+))?$")


@dataclass(frozen=True)
class MlxScheme:
    """One MLX quantization: ``mode`` with ``bits`` per code and ``group`` values per scale."""

    mode: str
    bits: int
    group: int

    @property
    def name(self) -> str:
        if self.mode != "affine":
            return self.mode
        base = f"affine{self.bits}"
        return base if self.group == DEFAULTS["affine"][1] else f"{base}:g{self.group}"

    def entry(self) -> dict[str, Any]:
        """config.json's ``quantization`` entry of a layer so quantized."""
        return {"group_size": self.group, "bits": self.bits, "mode": self.mode}

    def stored(self, shape: tuple[int, ...], dtype: str) -> list[tuple[str, str, tuple[int, ...]]]:
        """The tensors a 2-D weight of ``shape`` and safetensors ``dtype`` is stored as:
        (suffix, safetensors dtype, shape) of ``weight``, ``scales`` and, affine, ``biases``."""
        rows, cols = shape
        grid = (rows, cols // self.group)
        out = [("weight", "U32", (rows, cols * self.bits // 32)),
               ("scales", dtype if self.mode == "affine" else "U8", grid)]
        if self.mode == "affine":
            out.append(("biases", dtype, grid))
        return out


def _alternatives(items: tuple[int, ...]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def names() -> str:
    return "affine2..affine8 (not 7) with :g32, :g64 (default) or :g128, mxfp4, mxfp8, nvfp4"


def is_mlx_name(text: str) -> bool:
    """Whether ``text`` names an MLX mode (valid or not in its bits and group)."""
    return _NAME.match(text.strip().lower()) is not None


def resolve_mlx(text: Any) -> MlxScheme:
    """An MLX scheme from its name: ``affine4`` (4 bits in groups of 64, mlx-lm's default),
    ``affine3:g32``, ``affine`` (= ``affine4``), ``mxfp4``, ``mxfp8``, ``nvfp4``; any case."""
    raw = str(text).strip()
    m = _NAME.match(raw.lower())
    if m is None:
        raise CheckpointError("--scheme", None, f"{raw!r} is not an MLX mode: {names()}")
    mode = m[1]
    bits = int(m[2]) if m[2] else DEFAULTS[mode][0]
    group = int(m[3]) if m[3] else DEFAULTS[mode][1]
    took_bits, took_groups = MODES[mode]
    if bits not in took_bits:
        raise CheckpointError("--scheme", None, f"{raw!r}: MLX's {mode} mode takes "
                              f"{_alternatives(took_bits)} bits, not {bits}")
    if group not in took_groups:
        raise CheckpointError("--scheme", None, f"{raw!r}: MLX's {mode} mode takes groups of "
                              f"{_alternatives(took_groups)}, not {group}")
    return MlxScheme(mode, bits, group)


def scheme_for(ms: MlxScheme, dtype: str | None,
               shape: tuple[int, ...]) -> tuple[str | None, str]:
    """The blockquant scheme text one weight of safetensors ``dtype`` and ``shape`` takes under
    ``ms`` (for ``affine``: a U8 scheme whose codes are cut to ``ms.bits``), or (None, why it
    cannot: it then stays in float, as mlx-lm leaves it)."""
    if len(shape) != 2:
        return None, f"rank {len(shape)}: MLX quantizes Linear and Embedding weights (2-D)"
    rows, cols = shape
    if rows == 0 or cols == 0:
        return None, "empty"
    sd = SCALE_DTYPE.get(dtype or "")
    if sd is None:
        return None, f"{dtype} weights (MLX quantizes BF16, F16 and F32 ones)"
    if cols % ms.group:
        return None, f"{cols} input features are not a multiple of {ms.name}'s group of {ms.group}"
    if ms.mode == "affine":
        return f"u8/native/block{ms.group}:{sd}/bias:{sd}", ""
    if ms.mode == "nvfp4":
        return "e2m1/native/block16:ue4m3", ""
    value = "e2m1" if ms.mode == "mxfp4" else "e4m3"
    return f"{value}/native/block32:ue8m0", ""


def searched_rule(ms: MlxScheme) -> dict[str, str]:
    """blockquant's default: searched scales (``mse``), codes from the stored scale (and bias)
    rounded to nearest, ties to even, as MLX rounds; MX exponents by the OCP rule."""
    srnd = "mx" if ms.mode in ("mxfp4", "mxfp8") else "nearest"
    return {"calibration": "mse", "rounding": "half_even", "scale_rounding": srnd}


def quantization_entry(default: MlxScheme, layers: dict[str, MlxScheme]) -> dict[str, Any]:
    """config.json's ``quantization``: the default mode, and an entry for each layer (by path)
    whose mode differs from it."""
    out: dict[str, Any] = default.entry()
    for path, ms in layers.items():
        if ms != default:
            out[path] = ms.entry()
    return out


def entry_scheme(entry: Any, where: str) -> MlxScheme:
    """An MLX scheme from a config ``quantization`` entry (``group_size``, ``bits``, ``mode``);
    ValueError naming ``where`` when it is not one MLX takes."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    mode = entry.get("mode", "affine")
    if mode not in MODES:
        raise ValueError(f"{where}: mode {mode!r} is not one of MLX's ({', '.join(MODES)})")
    bits, group = entry.get("bits"), entry.get("group_size")
    took_bits, took_groups = MODES[mode]
    if type(bits) is not int or bits not in took_bits:
        raise ValueError(f"{where}: {mode} takes {took_bits} bits, not {bits!r}")
    if type(group) is not int or group not in took_groups:
        raise ValueError(f"{where}: {mode} takes groups of {took_groups}, not {group!r}")
    return MlxScheme(mode, bits, group)
