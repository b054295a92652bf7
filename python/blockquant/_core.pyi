# Stub of the compiled extension (rust/blockquant-py). Checked against the module by
# `python -m mypy.stubtest blockquant._core` in CI.
from typing import Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

# PyO3 gives the module an __all__ of its functions, in registration order.
__all__ = [
    "quantize",
    "dequantize",
    "to_bytes",
    "from_bytes",
    "check_parts",
    "round_scale",
    "layout_info",
    "set_num_threads",
    "get_num_threads",
    "_panic_for_tests",
]

_SchemeSpec = Tuple[str, str, int, str, Optional[str], Optional[Sequence[int]], Optional[str]]
_Quantized = Tuple[npt.NDArray[np.generic], npt.NDArray[np.float32], Optional[float]]

def quantize(
    x: npt.NDArray[np.generic],
    kind: str,
    scheme: _SchemeSpec,
    calibration: str = "minmax",
    rounding: str = "half_away",
    scale_rounding: str = "up",
    scales: Optional[npt.NDArray[np.float32]] = None,
    global_scale: Optional[float] = None,
) -> _Quantized: ...
def dequantize(
    values: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    global_scale: Optional[float],
    scheme: _SchemeSpec,
    shape: Sequence[int],
    dtype: str = "float32",
) -> npt.NDArray[np.generic]: ...
def to_bytes(
    values: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    global_scale: Optional[float],
    scheme: _SchemeSpec,
    shape: Sequence[int],
) -> bytes: ...
def from_bytes(data: bytes, scheme: _SchemeSpec, shape: Sequence[int]) -> _Quantized: ...
def check_parts(
    values: npt.NDArray[np.generic],
    scales: npt.NDArray[np.float32],
    global_scale: Optional[float],
    scheme: _SchemeSpec,
    shape: Sequence[int],
) -> None: ...
def round_scale(
    scales: npt.NDArray[np.float32], dtype: str, mode: str = "up"
) -> npt.NDArray[np.float32]: ...
def layout_info(
    scheme: _SchemeSpec, shape: Sequence[int]
) -> Tuple[list[int], str, list[int], int]: ...
def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def _panic_for_tests() -> None: ...
