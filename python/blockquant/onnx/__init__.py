"""ONNX models: quantize the weights of MatMul and Gemm for onnxruntime (``blockquant[onnx]``).

    >>> import blockquant.onnx
    >>> blockquant.onnx.quantize_model("model.onnx", "model.q.onnx", "int4_block32")  # doctest: +SKIP
    >>> blockquant.onnx.quantize_model("model.onnx", "model.q4.onnx", form="matmulnbits")  # doctest: +SKIP

Two forms: ``DequantizeLinear`` in front of the consumer (``form="qdq"``, every scheme ONNX can
hold, bit for bit blockquant's dequantize) or onnxruntime's fused ``com.microsoft.MatMulNBits``
(``form="matmulnbits"``, 2-, 4- and 8-bit blocked schemes; affine ones with their zero
points). Without a scheme, :data:`DEFAULT_SCHEME` (``int4_asym_block128``). See
:mod:`blockquant.onnx.lowering` for how each scheme is written and :mod:`blockquant.onnx.model`
for which initializers are weights.
"""

from __future__ import annotations

from .quantize import (
    DEFAULT_SCHEME,
    FORMS,
    OnnxSummary,
    inspect_model,
    quantize_model,
    report_model,
)

__all__ = ["DEFAULT_SCHEME", "FORMS", "OnnxSummary", "inspect_model", "is_onnx_path",
           "quantize_model", "report_model"]


def is_onnx_path(path: object) -> bool:
    """Whether ``path`` names an ONNX model (by its extension, as the CLI dispatches)."""
    return str(path).lower().endswith(".onnx")
