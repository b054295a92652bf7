# Stub of the compiled extension (rust/blockquant-py). Checked against the module by
# `python -m mypy.stubtest blockquant._core` in CI. Only blockquant._native imports it.
from typing import Optional, Sequence, Tuple, final

import numpy as np
import numpy.typing as npt

# PyO3 gives the module an __all__ of its functions, in registration order.
__all__ = [
    "Scheme",
    "Layout",
    "parse_scheme",
    "ValueInfo",
    "ScaleInfo",
    "value_info",
    "scale_info",
    "quantize",
    "check_options",
    "check_call",
    "dequantize",
    "to_bytes",
    "from_bytes",
    "check_parts",
    "round_scale",
    "set_num_threads",
    "get_num_threads",
    "_panic_for_tests",
    "GgmlType",
    "ggml_types",
    "ggml_quantize",
    "ggml_dequantize",
    "affine_quantize",
    "affine_dequantize",
    "affine_to_bytes",
    "affine_from_bytes",
    "check_affine_parts",
]

@final
class Scheme:
    def __new__(
        cls,
        *,
        value: str,
        store: str,
        dim: int,
        mode: str,
        tensor: Optional[str] = None,
        block_size: Optional[Sequence[int]] = None,
        block_dtype: Optional[str] = None,
        codebook: Optional[Sequence[float]] = None,
        offset: Optional[str] = None,
        offset_dtype: Optional[str] = None,
    ) -> Scheme: ...
    @property
    def offset(self) -> Optional[str]: ...
    @property
    def offset_dtype(self) -> Optional[str]: ...
    @property
    def codebook(self) -> Optional[list[float]]: ...
    @property
    def block_size(self) -> Optional[list[int]]: ...
    @property
    def value(self) -> str: ...
    @property
    def store(self) -> str: ...
    @property
    def dim(self) -> int: ...
    @property
    def mode(self) -> str: ...
    @property
    def tensor(self) -> Optional[str]: ...
    @property
    def block_dtype(self) -> Optional[str]: ...
    def layout(self, shape: Sequence[int]) -> Layout: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def parse_scheme(text: str) -> Scheme: ...
@final
class ValueInfo:
    @property
    def name(self) -> str: ...
    @property
    def bits(self) -> int: ...
    @property
    def qmin(self) -> float: ...
    @property
    def qmax(self) -> float: ...
    @property
    def is_float(self) -> bool: ...

@final
class ScaleInfo:
    @property
    def name(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def max(self) -> float: ...
    @property
    def smallest(self) -> float: ...
    @property
    def has_zero(self) -> bool: ...

def value_info() -> list[ValueInfo]: ...
def scale_info() -> list[ScaleInfo]: ...

@final
class Layout:
    @property
    def shape(self) -> list[int]: ...
    @property
    def storage_shape(self) -> list[int]: ...
    @property
    def storage_dtype(self) -> str: ...
    @property
    def scale_grid(self) -> list[int]: ...
    @property
    def stored_scale_grid(self) -> list[int]: ...
    @property
    def n_scales(self) -> int: ...
    @property
    def storage_nbytes(self) -> int: ...
    @property
    def scales_nbytes(self) -> int: ...
    @property
    def offsets_nbytes(self) -> int: ...
    @property
    def nbytes(self) -> int: ...

_Quantized = Tuple[npt.NDArray[np.generic], npt.NDArray[np.float32], Optional[float]]

def check_options(calibration: str, rounding: str, scale_rounding: str) -> None: ...
def check_call(
    scheme: Scheme,
    shape: Sequence[int],
    calibration: str,
    rounding: str,
    scale_rounding: str,
    has_scales: bool,
    has_global: bool,
) -> None: ...
def quantize(
    x: npt.NDArray[np.generic],
    kind: str,
    scheme: Scheme,
    calibration: str,
    rounding: str,
    scale_rounding: str,
    scales: Optional[npt.NDArray[np.float32]] = None,
    global_scale: Optional[float] = None,
    out_values: Optional[npt.NDArray[np.generic]] = None,
    out_scales: Optional[npt.NDArray[np.float32]] = None,
    weights: Optional[npt.NDArray[np.float32]] = None,
) -> _Quantized: ...
def dequantize(
    values: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    global_scale: Optional[float],
    scheme: Scheme,
    shape: Sequence[int],
    dtype: str = "float32",
    out: Optional[npt.NDArray[np.generic]] = None,
) -> npt.NDArray[np.generic]: ...
def to_bytes(
    values: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    global_scale: Optional[float],
    scheme: Scheme,
    shape: Sequence[int],
) -> bytes: ...
def from_bytes(data: bytes, scheme: Scheme, shape: Sequence[int]) -> _Quantized: ...
def check_parts(
    values: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    global_scale: Optional[float],
    scheme: Scheme,
    shape: Sequence[int],
) -> None: ...
def round_scale(
    scales: npt.NDArray[np.float32], dtype: str, mode: str
) -> npt.NDArray[np.float32]: ...
def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def _panic_for_tests() -> None: ...

# llama.cpp's block types (rust/blockquant-py/src/ggml.rs), behind blockquant.gguf.
@final
class GgmlType:
    @property
    def name(self) -> str: ...
    @property
    def id(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def type_size(self) -> int: ...
    @property
    def takes_weights(self) -> bool: ...

def ggml_types() -> list[GgmlType]: ...
def ggml_quantize(
    x: npt.NDArray[np.generic],
    kind: str,
    qtype: str,
    out: Optional[npt.NDArray[np.uint8]] = None,
    weights: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[np.uint8]: ...
def ggml_dequantize(
    blocks: npt.NDArray[np.uint8],
    qtype: str,
    out: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[np.float32]: ...

# Affine schemes (rust/blockquant-py/src/affine.rs): offsets beside values and scales.
_Affine = Tuple[npt.NDArray[np.generic], npt.NDArray[np.float32], npt.NDArray[np.float32]]

def affine_quantize(
    x: npt.NDArray[np.generic],
    kind: str,
    scheme: Scheme,
    calibration: str,
    rounding: str,
    scale_rounding: str,
    bits: int | None = None,
) -> _Affine: ...
def affine_dequantize(
    values: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    offsets: npt.NDArray[np.float32],
    scheme: Scheme,
    shape: Sequence[int],
    dtype: str = "float32",
) -> npt.NDArray[np.generic]: ...
def affine_to_bytes(
    values: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    offsets: npt.NDArray[np.float32],
    scheme: Scheme,
    shape: Sequence[int],
) -> bytes: ...
def affine_from_bytes(data: bytes, scheme: Scheme, shape: Sequence[int]) -> _Affine: ...
def check_affine_parts(
    values: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    offsets: npt.NDArray[np.float32],
    scheme: Scheme,
    shape: Sequence[int],
) -> None: ...
