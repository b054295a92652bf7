"""burn's ``.bpk`` files as checkpoints: the reader the file commands use, and the streaming
Burnpack output of ``blockquant quantize ... -o model.bpk``.

The format itself (header, CBOR metadata, burn's dtypes and ``QFloat`` schemes) lives in
:mod:`blockquant.burnpack`; this module only adapts it to the commands: plain tensors are
described in safetensors' dtype names, ``QFloat`` tensors are quantized entries whose one part
is the tensor itself (its bytes are burn's ``QuantizedBytes``, which ``QTensor.from_bytes``
reads and checks).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..burnpack import BURN_BLOCK_MAX, BurnpackFile, Planned, save_burnpack
from ..errors import LayoutError, QuantError, SchemeError
from ..presets import described
from ..qtensor import QTensor
from ..scheme import QuantScheme
from .base import Checkpoint, CheckpointError, TensorInfo, os_reason
from .format import Entry

#: burn's plain dtypes in safetensors' names (Flex32 is f32 storage).
_BURN_TO_ST = {
    "F64": "F64", "F32": "F32", "Flex32": "F32", "F16": "F16", "BF16": "BF16",
    "I64": "I64", "I32": "I32", "I16": "I16", "I8": "I8",
    "U64": "U64", "U32": "U32", "U16": "U16", "U8": "U8",
}
_ST_TO_BURN = {st: burn for burn, st in _BURN_TO_ST.items() if burn != "Flex32"}
_ST_TO_BURN["BOOL"] = {"Bool": "Native"}


def is_burnpack_path(path: Any) -> bool:
    return str(path).endswith(".bpk")


class BurnpackCheckpoint(Checkpoint):
    format = "burnpack"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        try:
            self._file = BurnpackFile(path)
        except (LayoutError, SchemeError) as e:
            raise CheckpointError(path, None, _strip_path(str(e), path)) from None
        except OSError as e:
            raise CheckpointError(path, None, os_reason(e)) from None
        self.metadata = dict(self._file.metadata)
        self._schemes: dict[str, QuantScheme] = {}
        for name in self._file.names:
            dtype, shape, nbytes, scheme = self._file.info(name)
            if scheme is not None:
                self._schemes[name] = scheme
                st = None
            elif isinstance(dtype, dict):  # Bool: one byte a value is safetensors' BOOL
                st = "BOOL" if dtype.get("Bool") in ("Native", "U8") else None
            else:
                st = _BURN_TO_ST.get(dtype)
            self.tensors.append(TensorInfo(name, st, shape, nbytes))
        self._index()

    def close(self) -> None:
        self._file.close()

    def entries(self) -> dict[str, Entry]:
        """The ``QFloat`` tensors as quantized entries (burn keeps no original dtype: float32)."""
        return {
            name: Entry(name, scheme, self.info(name).shape, "float32", {"values": name})
            for name, scheme in self._schemes.items()
        }

    def load_qtensor(self, e: Entry) -> QTensor:
        try:
            return QTensor.from_bytes(self._file.raw(e.name), e.scheme, e.shape)
        except QuantError as err:
            raise self.error(e.name, str(err)) from None

    def read(self, name: str) -> np.ndarray:
        t = self.info(name)
        if name in self._schemes:
            raise self.error(name, "is quantized (QFloat): dequantize it first")
        raw = self._file.raw(name)
        if t.dtype == "BF16":  # exactly: a bfloat16 is the top half of a float32
            return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32) \
                .reshape(t.shape)
        try:
            arr = self._file.read(name)
        except LayoutError as e:
            raise self.error(name, _strip_path(str(e), self.path)) from None
        return np.asarray(arr)

    def copy_to(self, name: str, out: BinaryIO) -> None:
        raw = self._file.raw(name)
        if self.info(name).dtype == "BOOL":  # checked as read() checks it, not copied blind
            _check_bools(self, name, raw)
        out.write(raw)

    def raw(self, name: str) -> bytes:
        return self._file.raw(name)


def _strip_path(message: str, path: Any) -> str:
    prefix = f"{path}: "
    return message[len(prefix):] if message.startswith(prefix) else message


def check_block_dims(dst: Any, schemes: Any) -> None:
    """Refuse, when the run is planned, a scheme whose blocks burn cannot record (its block
    dims are u8), saying what to write instead; save_burnpack would refuse it at the tensor."""
    for scheme in schemes:
        if scheme is not None and max(scheme.block_size or (1,)) > BURN_BLOCK_MAX:
            raise CheckpointError(dst, None, f"{described(scheme)} cannot be written to a .bpk "
                                  f"file: burn stores a block's dims as u8 (at most "
                                  f"{BURN_BLOCK_MAX}); write .safetensors instead")


def write_burnpack(
    ckpt: Checkpoint,
    dst: Any,
    plan: list[tuple[TensorInfo, Any]],
    metadata: dict[str, str],
    force: bool,
) -> None:
    """Write ``plan`` — (tensor, a function making its QTensor, with ``.scheme``) or (tensor,
    None) to copy it — to the burn-pack file ``dst``, one tensor in memory at a time. Tensor
    names stay as in the input."""
    tensors: dict[str, Planned] = {}
    for t, make in plan:
        if make is not None:
            tensors[t.name] = Planned(t.shape, make, scheme=make.scheme)
            continue
        burn = _ST_TO_BURN.get(t.read_dtype or "")
        if burn is None:
            raise ckpt.error(t.name, f"dtype {t.dtype_name} has no burn-pack dtype")
        tensors[t.name] = Planned(t.shape, _copier(ckpt, t), burn_dtype=burn,
                                  nbytes=t.read_nbytes)
    try:
        save_burnpack(dst, tensors, metadata, force=force)
    except FileExistsError:
        raise CheckpointError(dst, None, "already exists (--force replaces it)") from None
    except CheckpointError:
        raise
    except QuantError as e:
        raise CheckpointError(dst, None, str(e)) from None
    except OSError as e:
        raise CheckpointError(dst, None, os_reason(e)) from None


def _copier(ckpt: Checkpoint, t: TensorInfo) -> Any:
    name = t.name

    def produce() -> bytes:
        if t.dequantized_on_read:  # another tool's quantized type: its float32 values
            return np.ascontiguousarray(ckpt.read(name), "<f4").tobytes()
        if isinstance(ckpt, BurnpackCheckpoint):
            raw = bytes(ckpt.raw(name))
        else:
            buf = io.BytesIO()
            ckpt.copy_to(name, buf)
            raw = buf.getvalue()
        if t.dtype == "BOOL":
            _check_bools(ckpt, name, raw)
        return raw

    return produce


def _check_bools(ckpt: Checkpoint, name: str, raw: Any) -> None:
    """burn's Bool holds 0 or 1 (blockquant's own reader refuses any other byte); a
    safetensors BOOL may hold any (numpy reads a non-zero byte as True)."""
    stored = np.frombuffer(raw, np.uint8)
    if stored.size and stored.max() > 1:
        i = int(np.argmax(stored > 1))
        raise ckpt.error(name, f"bool at index {i} is {stored[i]}, not 0 or 1 as burn's Bool "
                         "holds")
