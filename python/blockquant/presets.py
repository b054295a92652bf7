"""Named schemes for the common formats (format.md "Presets"), and the one place a name becomes a scheme.

A preset is a scheme plus the options it is meant to be used with (format.md "Rules for edge cases"): ``bitnet()``
carries absmean calibration, so ``quantize(x, bitnet())`` uses it unless told otherwise.
:func:`resolve` turns "a preset name or a scheme text" into a scheme; the scheme grammar
(:meth:`QuantScheme.parse`) knows no preset names.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Union

from . import codebooks
from .errors import SchemeError
from .scheme import QuantScheme, QuantStore, QuantValue, ScaleDtype

__all__ = [
    "int8",
    "int8_per_channel",
    "int8_block32",
    "int4_block32",
    "int4_block16",
    "nf4_block16",
    "bq4_block16",
    "mxfp8",
    "mxfp4",
    "nvfp4",
    "bitnet",
    "int4_asym_block128",
    "int4_affine_block64",
    "PRESETS",
    "CALIBRATION",
    "resolve",
    "described",
    "catalog",
]

_V, _S, _D = QuantValue, QuantStore, ScaleDtype


def int8() -> QuantScheme:
    """Int8 with one scale for the whole tensor: the simplest, but one outlier costs every row.

    Q8S, one f32 scale per tensor, one value per byte."""
    return QuantScheme(_V.Q8S, _S.Native).per_tensor(_D.F32)


def int8_per_channel() -> QuantScheme:
    """Int8 weights as most runtimes (PyTorch, ONNX, TensorRT) have them: one scale per row.

    Q8S, one f32 scale per row (output channel). The scheme is ``q8s/native/block65536:f32``: blocks of 65536 along the last axis,
    and a partial edge block is one block, so a row of up to 65536 values has one scale (a
    longer row one per 65536). Rows of different magnitudes (a weight's output channels) each
    get their own scale, where ``int8`` gives the whole tensor one. Burn's blocks hold at most
    255 values a dimension, so it cannot be written as ``.bpk``."""
    # A block, not a per-row level (the scheme has none): 65536 is longer than the rows of the
    # layers in use (hidden sizes to 16384, FFN widths to 53248), so each row is one block.
    return QuantScheme(_V.Q8S, _S.Native).per_block([65536], _D.F32)


def int8_block32() -> QuantScheme:
    """Int8 in GGUF Q8_0's shape, one scale per 32 values: close to lossless.

    Q8S, one f16 scale per 32 values along the last axis."""
    return QuantScheme(_V.Q8S, _S.Native).per_block([32], _D.F16)


def int4_block32() -> QuantScheme:
    """Int4 with one f16 scale per 32 values (GGUF Q4_0's idea), as burn loads it.

    Q4S, one f16 scale per 32 values, eight values per uint32 word (burn's PackedNative
    keeps 4-bit ints one a byte; with rows of whole words these bytes are two codes a byte,
    the first in the low nibble)."""
    return QuantScheme(_V.Q4S, _S.packed_u32(0)).per_block([32], _D.F16)


def int4_block16() -> QuantScheme:
    """The most signal at 4.5 bits per value without a codebook: int4 under NVFP4's scales.

    Issue 14's measurements on real weights. Q4F, one UE4M3 scale per 16 values under one f32 per-tensor scale (NVFP4's scales
    with int4 values, eight values per uint32 word), the block scales searched (``"mse"``) and
    rounded to nearest. Searching costs a few times minmax's time; pass
    ``calibration="minmax"`` for speed."""
    return (
        QuantScheme(_V.Q4F, _S.packed_u32(0))
        .per_block([16], _D.UE4M3)
        .per_tensor(_D.F32)
        .with_options(calibration="mse", scale_rounding="nearest")
    )


def nf4_block16() -> QuantScheme:
    """int4_block16 with QLoRA's NF4 codebook; safetensors output only.

    NF4's codebook (Lookup mode): QLoRA's 16 NormalFloat values, one UE4M3
    scale per 16 under an f32 per-tensor scale, searched (``"mse"``) and rounded to nearest;
    4.5 bits per value. The codebook is not in the bytes, so burn's Burnpack cannot hold it:
    write safetensors."""
    return int4_block16().with_codebook(codebooks.NF4)


def bq4_block16() -> QuantScheme:
    """The most signal at 4.5 bits per value: blockquant's BQ4 codebook; safetensors only.

    int4_block16's scales with blockquant's own codebook :data:`codebooks.BQ4` (Lloyd-Max for normally distributed weights under exactly
    these scales). 22.68 dB on all-MiniLM-L6-v2's FFN weights, against 22.45 for NF4's
    codebook, 21.53 for int4_block16 and ggml Q4_K's 22.42. Safetensors output only (the
    codebook is not in burn's bytes)."""
    return int4_block16().with_codebook(codebooks.BQ4)


def mxfp8() -> QuantScheme:
    """OCP MXFP8 as MX hardware and libraries read it: float8 values.

    E4M3 values, one UE8M0 (power of two) scale per 32, by the OCP MX rule."""
    return (
        QuantScheme(_V.E4M3, _S.Native)
        .per_block([32], _D.UE8M0)
        .with_options(scale_rounding="mx")
    )


def mxfp4() -> QuantScheme:
    """OCP MXFP4 as MX hardware, ggml and other MX producers have it: fp4 values.

    E2M1 values two per byte, one UE8M0 scale per 32, by the OCP MX rule (the scale of ggml's
    MXFP4 and every MX producer)."""
    return (
        QuantScheme(_V.E2M1, _S.packed_native(0))
        .per_block([32], _D.UE8M0)
        .with_options(scale_rounding="mx")
    )


def nvfp4() -> QuantScheme:
    """NVIDIA's NVFP4 (Blackwell's fp4 format): fp4 values, two-level scales.

    E2M1 values two per byte, one UE4M3 scale per 16 under one f32 per-tensor scale."""
    return QuantScheme(_V.E2M1, _S.packed_native(0)).per_block([16], _D.UE4M3).per_tensor(_D.F32)


def bitnet() -> QuantScheme:
    """BitNet b1.58's ternary weights (-1, 0, 1 times one scale), for models trained so.

    Q2S, one f32 scale per tensor, 16 per uint32, absmean calibration."""
    return (
        QuantScheme(_V.Q2S, _S.packed_u32(0))
        .per_tensor(_D.F32)
        .with_options(calibration="absmean")
    )


def int4_asym_block128() -> QuantScheme:
    """Asymmetric int4: a zero point and a scale per 128 values (W4A16_ASYM, AWQ, GPTQ).

    Codes 0..15, one bf16 scale and one zero point per 128 values,
    x = (q − z) · s; the ranges searched (``"mse"``). Safetensors and ONNX output (burn has no
    affine values); blockquant.onnx's default scheme."""
    return (
        QuantScheme.parse("u4/packed_u32_0/block128:bf16/zero:u8")
        .with_options(calibration="mse", rounding="half_even", scale_rounding="nearest")
    )


def int4_affine_block64() -> QuantScheme:
    """Int4 with a scale and a bias per 64 values (MLX's affine mode, ggml Q4_1's idea).

    Codes 0..15, x = q · s + b, both bf16; the ranges searched (``"mse"``). Safetensors output
    only (burn has no affine values)."""
    return (
        QuantScheme.parse("u4/packed_u32_0/block64:bf16/bias:bf16")
        .with_options(calibration="mse", rounding="half_even", scale_rounding="nearest")
    )


PRESETS: Dict[str, Callable[[], QuantScheme]] = {
    "int8": int8,
    "int8_per_channel": int8_per_channel,
    "int8_block32": int8_block32,
    "int4_block32": int4_block32,
    "int4_block16": int4_block16,
    "nf4_block16": nf4_block16,
    "bq4_block16": bq4_block16,
    "mxfp8": mxfp8,
    "mxfp4": mxfp4,
    "nvfp4": nvfp4,
    "bitnet": bitnet,
    "int4_asym_block128": int4_asym_block128,
    "int4_affine_block64": int4_affine_block64,
}

#: The calibration each preset is meant to be used with (what its options say).
CALIBRATION: Dict[str, str] = {
    name: make().options.calibration or "minmax" for name, make in PRESETS.items()
}


def resolve(scheme: Union[QuantScheme, str]) -> QuantScheme:
    """A scheme from a scheme, a preset name (``"nvfp4"``) or a scheme text
    (``"q4s/packed_u32_0/block32:f16"``); anything else is a ``TypeError``, an unknown text a
    :class:`SchemeError`."""
    if isinstance(scheme, QuantScheme):
        return scheme
    if not isinstance(scheme, str):
        raise TypeError(
            "a scheme is a blockquant.QuantScheme, a preset name or a scheme text, "
            f"got {type(scheme).__name__}"
        )
    return _resolve_text(scheme)


# Schemes are immutable, so one object per text serves every call: building one (its core twin
# included) costs more than a small quantize. Bounded, for programs that make up many texts.
@functools.lru_cache(maxsize=256)
def _resolve_text(scheme: str) -> QuantScheme:
    # Preset names in any case (NVFP4, Int8_Block32): no scheme text is one word, so a name
    # without a "/" is never ambiguous. Scheme texts stay canonical (parse and print agree).
    if scheme.lower() in PRESETS:
        return PRESETS[scheme.lower()]()
    if "/" not in scheme:
        raise SchemeError(
            f"unknown scheme {scheme!r}: " + (other_kind(scheme) or (
                f"not a preset ({', '.join(PRESETS)}; blockquant presets lists them) nor "
                "VALUE/STORE/LEVELS such as 'q4s/packed_u32_0/block32:f16'"))
        )
    return QuantScheme.parse(scheme)


#: Each ggml type's nearest preset, for a ggml type named where a blockquant scheme is taken
#: (the bits per value and the kind of values closest; none is the same bytes).
GGML_NEAREST: Dict[str, str] = {
    "F32": "", "F16": "", "BF16": "",
    "Q8_0": "int8_block32", "Q4_0": "int4_block32", "Q4_1": "int4_asym_block128",
    "Q5_0": "int8_block32", "Q5_1": "int8_block32", "MXFP4": "mxfp4", "NVFP4": "nvfp4",
    "TQ1_0": "bitnet", "TQ2_0": "bitnet", "Q2_K": "int4_block16", "Q3_K": "int4_block16",
    "Q4_K": "int4_block16", "Q5_K": "int4_block16", "Q6_K": "int8_block32",
    "IQ4_NL": "nf4_block16", "IQ4_XS": "nf4_block16",
}  # fmt: skip
#: Each preset's nearest ggml type, for a preset named where a GGUF file takes a ggml type.
PRESET_NEAREST_GGML: Dict[str, str] = {
    "int8": "q8_0", "int8_block32": "q8_0", "int4_block32": "q4_0", "int4_block16": "q4_k",
    "nf4_block16": "iq4_nl", "bq4_block16": "iq4_nl", "mxfp8": "q8_0", "mxfp4": "mxfp4",
    "nvfp4": "nvfp4", "bitnet": "tq2_0", "int8_per_channel": "q8_0",
    "int4_asym_block128": "q4_1", "int4_affine_block64": "q4_1",
}  # fmt: skip
#: llama.cpp's file types that are mixes (llama-quantize's names), and their main ggml type.
LLAMA_MIXES: Dict[str, str] = {
    "Q2_K_S": "q2_k", "Q3_K_S": "q3_k", "Q3_K_M": "q3_k", "Q3_K_L": "q3_k", "Q4_K_S": "q4_k",
    "Q4_K_M": "q4_k", "Q5_K_S": "q5_k", "Q5_K_M": "q5_k",
}  # fmt: skip


def other_kind(name: str) -> str:
    """What a one-word scheme name that is no preset names instead (a ggml type, one of
    llama.cpp's mixes), with the preset nearest it; empty when it names neither."""
    upper = name.upper()
    if upper in LLAMA_MIXES:
        return (f"{name} is one of llama.cpp's file types, a mix of ggml types for a .gguf "
                f"output (-o model.gguf --scheme {name}); the nearest preset is "
                + GGML_NEAREST[LLAMA_MIXES[upper].upper()])
    if upper in GGML_NEAREST:
        near = GGML_NEAREST[upper]
        return (f"{name} is one of ggml's types, which GGUF files take (a .gguf output); "
                + (f"the nearest preset is {near}" if near else
                   "a float type: leave the tensors as they are"))
    return ""


def described(scheme: QuantScheme) -> str:
    """``scheme`` for a message: its text, after its preset name when it is one
    (``int8_block32 (q8s/native/block32:f16)``)."""
    name = _PRESET_NAMES.get(str(scheme))
    return f"{name} ({scheme})" if name else str(scheme)


#: Preset name by scheme text (every preset's text differs, codebook included).
_PRESET_NAMES: Dict[str, str] = {str(make()): name for name, make in PRESETS.items()}


#: The tensor shape a preset's bits per value are counted on: a large weight matrix, where the
#: per-tensor scale of a two-level scheme adds almost nothing.
CATALOG_SHAPE = (4096, 4096)


def catalog() -> List[Dict[str, Any]]:
    """Every preset, as ``blockquant presets`` lists it: ``name``, ``scheme`` (its text),
    ``bits_per_value`` (scales included, on a :data:`CATALOG_SHAPE` tensor), the options it
    carries resolved (``calibration``, ``rounding``, ``scale_rounding``) and ``purpose`` (the
    first line of its function's docstring)."""
    out = []
    for name, make in PRESETS.items():
        scheme = make()
        cal, rnd, srnd = scheme.options.resolve()
        numel = CATALOG_SHAPE[0] * CATALOG_SHAPE[1]
        out.append({
            "name": name,
            "scheme": str(scheme),
            "bits_per_value": scheme.layout(CATALOG_SHAPE).nbytes * 8 / numel,
            "calibration": cal,
            "rounding": rnd,
            "scale_rounding": srnd,
            "purpose": (make.__doc__ or "").strip().splitlines()[0],
        })
    return out
