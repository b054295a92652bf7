"""numpy's own files as checkpoints: a ``.npz`` (one tensor per ``.npy`` member) and a lone
``.npy`` (one tensor named after the file). Read only: every command writes safetensors."""

from __future__ import annotations

import os
import tokenize
import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .base import NP_TO_ST, Checkpoint, TensorInfo, numel, to_le_bytes
from .pytorch import refuse_pytorch_zip

MAX_DIM = (1 << 63) - 1
#: deflate expands at most about 1032:1; a member claiming more is lying about its size.
_DEFLATE_RATIO = 1032


def _npy_header(fp: BinaryIO) -> tuple[np.dtype, tuple[int, ...], int]:
    """dtype, shape and the header's length from a .npy header, without reading the data.
    Raises ValueError for anything numpy would not read back without pickle."""
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f".npy format version {version} is not supported")
    except (SyntaxError, RecursionError, MemoryError, TypeError, UnicodeDecodeError,
            tokenize.TokenError) as e:
        # numpy parses the header with ast.literal_eval, and a version 1/2 header it rejects
        # again through tokenize (an unclosed bracket: TokenError): a crafted one fails in many
        # ways.
        raise ValueError(f"malformed header ({type(e).__name__})") from None
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise ValueError("holds Python objects (pickled), which blockquant never loads")
    if not all(0 <= int(d) <= MAX_DIM for d in shape):
        raise ValueError(f"shape {tuple(shape)} has a dimension out of range")
    return dtype, tuple(int(d) for d in shape), fp.tell()


def _check_size(name: str, dtype: np.dtype, shape: tuple[int, ...], data_len: int) -> None:
    """The header's claim against the bytes there are, before numpy allocates the array."""
    need = numel(shape) * dtype.itemsize
    if need != data_len:
        raise ValueError(f"the header claims {list(shape)} {dtype} ({need} bytes), the data "
                         f"holds {data_len} bytes")


def _info(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> TensorInfo:
    st = NP_TO_ST.get(dtype.newbyteorder("=")) if dtype.kind != "V" else None
    return TensorInfo(name, st, shape, numel(shape) * dtype.itemsize, np_dtype=dtype)


class NpzCheckpoint(Checkpoint):
    format = "npz"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, ValueError, EOFError, UnicodeDecodeError) as e:
            raise self.error(None, f"not a valid .npz file: {e}") from None
        try:
            refuse_pytorch_zip(self, self._zip.namelist())
            self._members: dict[str, str] = {}
            for member in self._zip.namelist():
                if not member.endswith(".npy"):
                    raise self.error(member, "not a .npy array inside the .npz")
                name = member[: -len(".npy")]
                info = self._zip.getinfo(member)
                try:
                    if info.compress_type == zipfile.ZIP_STORED and \
                            info.file_size != info.compress_size:
                        raise ValueError("stored member whose sizes disagree")
                    if info.compress_type == zipfile.ZIP_DEFLATED and \
                            info.file_size > _DEFLATE_RATIO * info.compress_size + (1 << 16):
                        raise ValueError(f"claims {info.file_size} bytes from "
                                         f"{info.compress_size} compressed")
                    with self._zip.open(member) as fp:
                        dtype, shape, header_len = _npy_header(fp)
                    _check_size(name, dtype, shape, info.file_size - header_len)
                except (ValueError, OSError, zipfile.BadZipFile, EOFError, RuntimeError,
                        NotImplementedError) as e:
                    raise self.error(name, f"malformed array: {e}") from None
                self._members[name] = member
                self.tensors.append(_info(name, dtype, shape))
            self._index()
        except BaseException:
            self._zip.close()
            raise

    def close(self) -> None:
        self._zip.close()

    def read(self, name: str) -> np.ndarray:
        try:
            with self._zip.open(self._members[name]) as fp:
                arr = np.lib.format.read_array(fp, allow_pickle=False)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError, RuntimeError,
                NotImplementedError) as e:
            raise self.error(name, f"cannot read the array: {e}") from None
        except MemoryError:
            raise self.error(name, f"out of memory reading {self.info(name).nbytes} "
                             "bytes") from None
        return arr.astype(arr.dtype.newbyteorder("="), copy=False)

    def copy_to(self, name: str, out: BinaryIO) -> None:
        out.write(to_le_bytes(self.read(name)))


class NpyCheckpoint(Checkpoint):
    format = "npy"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._name = path.stem or "tensor"
        with open(path, "rb") as fp:
            try:
                dtype, shape, header_len = _npy_header(fp)
                _check_size(self._name, dtype, shape, os.fstat(fp.fileno()).st_size - header_len)
            except (ValueError, EOFError) as e:
                raise self.error(None, f"malformed .npy file: {e}") from None
        self.tensors = [_info(self._name, dtype, shape)]
        self._index()

    def read(self, name: str) -> np.ndarray:
        try:
            arr = np.load(self.path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise self.error(name, f"cannot read the array: {e}") from None
        except MemoryError:
            raise self.error(name, f"out of memory reading {self.info(name).nbytes} "
                             "bytes") from None
        return arr.astype(arr.dtype.newbyteorder("="), copy=False)

    def copy_to(self, name: str, out: BinaryIO) -> None:
        out.write(to_le_bytes(self.read(name)))
