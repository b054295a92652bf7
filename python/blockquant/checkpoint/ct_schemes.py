"""compressed-tensors' weight schemes, as blockquant writes them (docs/compressed-tensors.md).

compressed-tensors is the checkpoint format vLLM and Hugging Face transformers (and mlx-lm)
read for quantized models: each quantized ``Linear`` keeps its name and carries the parameters
its *compression format* defines (``weight_packed``, ``weight_scale``, ``weight_shape``,
``weight_zero_point``, ``weight_global_scale``), and ``config.json`` carries a
``quantization_config`` saying how (``quant_method: compressed-tensors``, ``format``,
``config_groups`` of ``QuantizationArgs``, ``ignore``).

This module is the table: each scheme name the ``compressed-tensors`` package defines as a preset
(``W4A16``, ``FP8_BLOCK``, ``NVFP4A16``...) that needs no calibration data, what it means as a
blockquant scheme for one weight (:func:`scheme_for`), and the ``quantization_config`` that
describes it (:func:`quantization_config`), field for field as the package's own
``QuantizationConfig.model_dump()`` writes it. The bytes are :mod:`.ct_codec`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .base import CheckpointError

QUANT_METHOD = "compressed-tensors"
#: The compression formats (compressed-tensors' ``CompressionFormat`` values) written here.
PACK_QUANTIZED = "pack-quantized"
INT_QUANTIZED = "int-quantized"
FLOAT_QUANTIZED = "float-quantized"
NVFP4_PACK_QUANTIZED = "nvfp4-pack-quantized"
MXFP4_PACK_QUANTIZED = "mxfp4-pack-quantized"
MXFP8_QUANTIZED = "mxfp8-quantized"
#: The compressed-tensors version whose config this writes (its ``version`` entry).
WRITTEN_AS_VERSION = "0.19.0"

#: safetensors dtype of a weight -> blockquant's scale dtype for a scale "in the weight's dtype"
#: (compressed-tensors keeps int and FP8 scales in the dtype of the weight they scale).
SCALE_DTYPE = {"BF16": "bf16", "F16": "f16", "F32": "f32"}


@dataclass(frozen=True)
class CtScheme:
    """One weight scheme of compressed-tensors (its ``QuantizationArgs``, in short).

    ``family``: int, fp8, nvfp4, mxfp4 or mxfp8. ``group``: values per scale along a row
    (None: one per row, ``channel``); ``block``: FP8_BLOCK's [rows, columns]."""

    name: str
    family: str
    bits: int
    format: str
    group: int | None = None
    block: tuple[int, int] | None = None
    symmetric: bool = True
    activations: dict[str, Any] | None = None  # dynamic input activations (no calibration)

    @property
    def strategy(self) -> str:
        if self.family == "nvfp4":
            return "tensor_group"
        if self.block is not None:
            return "block"
        return "group" if self.group is not None else "channel"

    def weight_args(self) -> dict[str, Any]:
        """The ``weights`` entry of a config group, as ``QuantizationArgs.model_dump()``."""
        scale_dtype = {"nvfp4": "torch.float8_e4m3fn", "mxfp4": "torch.uint8",
                       "mxfp8": "torch.uint8"}.get(self.family)
        return _args(num_bits=self.bits, type="int" if self.family == "int" else "float",
                     strategy=self.strategy, group_size=self.group,
                     block_structure=list(self.block) if self.block else None,
                     symmetric=self.symmetric, dynamic=False, scale_dtype=scale_dtype,
                     zp_dtype=None if self.symmetric else "torch.int8")


def _args(*, num_bits: int, type: str, strategy: str, group_size: int | None = None,
          block_structure: list[int] | None = None, symmetric: bool = True,
          dynamic: Any = False, scale_dtype: str | None = None,
          zp_dtype: str | None = None) -> dict[str, Any]:
    return {"actorder": None, "block_structure": block_structure, "dynamic": dynamic,
            "group_size": group_size, "num_bits": num_bits, "observer": None,
            "observer_kwargs": {}, "scale_dtype": scale_dtype, "strategy": strategy,
            "symmetric": symmetric, "type": type, "zp_dtype": zp_dtype}


_TOKEN_INT8 = _args(num_bits=8, type="int", strategy="token", dynamic=True)
_TOKEN_FP8 = _args(num_bits=8, type="float", strategy="token", dynamic=True)
_GROUP128_FP8 = _args(num_bits=8, type="float", strategy="group", group_size=128, dynamic=True)
_MX_FP4 = _args(num_bits=4, type="float", strategy="group", group_size=32, dynamic=True,
                scale_dtype="torch.uint8")
_MX_FP8 = _args(num_bits=8, type="float", strategy="group", group_size=32, dynamic=True,
                scale_dtype="torch.uint8")


def _int(name: str, bits: int, symmetric: bool = True) -> CtScheme:
    return CtScheme(name, "int", bits, PACK_QUANTIZED, group=128, symmetric=symmetric)


#: compressed-tensors' preset schemes that need no calibration data (weights, and at most
#: dynamic activations), by name. W3/W5/W6/W7 pack values across word boundaries, which
#: blockquant's stores do not; NVFP4 (W4A4) and FP8 (static activations) need activation
#: statistics from calibration data, which a model-free run does not have.
PRESETS: dict[str, CtScheme] = {
    s.name: s for s in (
        _int("W2A16", 2), _int("W4A16", 4), _int("W8A16", 8),
        _int("W2A16_ASYM", 2, False), _int("W4A16_ASYM", 4, False),
        _int("W8A16_ASYM", 8, False),
        CtScheme("W8A8", "int", 8, INT_QUANTIZED, activations=_TOKEN_INT8),
        CtScheme("FP8_DYNAMIC", "fp8", 8, FLOAT_QUANTIZED, activations=_TOKEN_FP8),
        CtScheme("FP8_BLOCK", "fp8", 8, FLOAT_QUANTIZED, block=(128, 128),
                 activations=_GROUP128_FP8),
        CtScheme("NVFP4A16", "nvfp4", 4, NVFP4_PACK_QUANTIZED, group=16),
        CtScheme("MXFP4A16", "mxfp4", 4, MXFP4_PACK_QUANTIZED, group=32),
        CtScheme("MXFP4", "mxfp4", 4, MXFP4_PACK_QUANTIZED, group=32, activations=_MX_FP4),
        CtScheme("MXFP8A16", "mxfp8", 8, MXFP8_QUANTIZED, group=32),
        CtScheme("MXFP8", "mxfp8", 8, MXFP8_QUANTIZED, group=32, activations=_MX_FP8),
    )
}
ALIASES = {"INT8": "W8A8", "W4A16_SYM": "W4A16"}
NEEDS_CALIBRATION = {
    "NVFP4": "NVFP4 quantizes activations with static global scales, which need calibration "
             "data; NVFP4A16 is its weight-only form",
    "FP8": "FP8 quantizes activations with a static scale, which needs calibration data; "
           "FP8_DYNAMIC computes it at run time",
    "W4A8": "W4A8 quantizes activations too; W4A16 is its weight-only form",
    "W4A4": "W4A4 quantizes activations too; W4A16 is its weight-only form",
}
GROUP_SIZES = (32, 64, 128)


def resolve_ct(text: Any) -> CtScheme:
    """The compressed-tensors scheme ``text`` names: a preset name (any case), for the int
    weight-only ones optionally with ``:G32``, ``:G64``, ``:G128`` or ``:CHANNEL``
    (``W4A16:G32``). Anything else is a CheckpointError naming ``--scheme``."""
    raw = str(text).strip()
    base, _, modifier = raw.upper().partition(":")
    base = ALIASES.get(base, base)
    if base in NEEDS_CALIBRATION:
        raise CheckpointError("--scheme", None, NEEDS_CALIBRATION[base])
    if base not in PRESETS:
        raise CheckpointError("--scheme", None, f"compressed-tensors output takes one of "
                              f"{', '.join(PRESETS)} (int ones with :G32, :G64, :G128 or "
                              f":CHANNEL), got {raw!r}")
    s = PRESETS[base]
    if not modifier:
        return s
    if s.family != "int" or s.activations is not None:
        raise CheckpointError("--scheme", None, f"{base} has a fixed layout; :G32, :G64, "
                              f":G128 and :CHANNEL are for the W*A16 int schemes")
    if modifier == "CHANNEL":
        return replace(s, name=f"{base}:CHANNEL", group=None)
    if modifier in tuple(f"G{g}" for g in GROUP_SIZES):
        group = int(modifier[1:])
        return replace(s, name=base if group == 128 else f"{base}:{modifier}", group=group)
    raise CheckpointError("--scheme", None, f"{raw!r}: after ':' comes G32, G64, G128 or "
                          "CHANNEL")


def scheme_for(cs: CtScheme, dtype: str | None, shape: tuple[int, ...]) -> tuple[str | None, str]:
    """The blockquant scheme text one weight of safetensors ``dtype`` and ``shape`` takes under
    ``cs``, or (None, why it cannot: it is then kept in float and listed in ``ignore``)."""
    if len(shape) != 2:
        return None, f"rank {len(shape)}: compressed-tensors quantizes Linear weights (2-D)"
    rows, cols = shape
    if rows == 0 or cols == 0:
        return None, "empty"
    sd = SCALE_DTYPE.get(dtype or "")
    if sd is None:
        return None, f"{dtype} weights (compressed-tensors writes BF16, F16 and F32 ones)"
    if cs.group is not None and cols % cs.group:
        return None, (f"{cols} input features are not a multiple of {cs.name}'s group of "
                      f"{cs.group}")
    per_row = f"block{cols}:{sd}"
    if cs.family == "int":
        level = f"block{cs.group}:{sd}" if cs.group is not None else per_row
        if cs.format == INT_QUANTIZED:
            return f"q{cs.bits}f/native/{level}", ""
        if cs.symmetric:
            return f"q{cs.bits}f/packed_u32_0/{level}", ""
        return f"u{cs.bits}/packed_u32_0/{level}/zero:u8", ""
    if cs.family == "fp8":
        level = f"block{cs.block[0]}x{cs.block[1]}:{sd}" if cs.block else per_row
        return f"e4m3/native/{level}", ""
    if cs.family == "nvfp4":
        return "e2m1/packed_native0/block16:ue4m3+tensor:f32", ""
    if cs.family == "mxfp4":
        return "e2m1/packed_native0/block32:ue8m0", ""
    return "e4m3/native/block32:ue8m0", ""


#: The options of compressed-tensors' own rule, per family (``--calibration minmax``): scales
#: cast to their dtype (nearest), ``torch.round`` (half to even), MX scales by the OCP rule.
def ct_rule(cs: CtScheme) -> dict[str, str]:
    if cs.family in ("mxfp4", "mxfp8"):
        return {"calibration": "minmax", "rounding": "half_even", "scale_rounding": "mx"}
    return {"calibration": "minmax", "rounding": "half_even", "scale_rounding": "nearest"}


def searched_rule(cs: CtScheme) -> dict[str, str]:
    """blockquant's default for this format: the searched scales (``mse``), which the file's
    reader dequantizes exactly as the minmax ones; ties of int codes to even, as torch."""
    if cs.family in ("mxfp4", "mxfp8"):
        return {"calibration": "mse", "rounding": "half_even", "scale_rounding": "mx"}
    return {"calibration": "mse", "rounding": "half_even", "scale_rounding": "nearest"}


def quantization_config(cs: CtScheme, ignore: list[str]) -> dict[str, Any]:
    """``config.json``'s ``quantization_config`` for a model whose Linear layers are all
    ``cs`` but those in ``ignore`` (module names): the keys and values llm-compressor's
    ``model_free_ptq`` writes (its one config group named after the scheme)."""
    return {
        "config_groups": {cs.name.partition(":")[0]: {"format": cs.format,
                                      "input_activations": cs.activations,
                                      "output_activations": None,
                                      "targets": ["Linear"],
                                      "weights": cs.weight_args()}},
        "format": cs.format,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "quant_method": QUANT_METHOD,
        "quantization_status": "compressed",
        "transform_config": {},
        "version": WRITTEN_AS_VERSION,
    }
