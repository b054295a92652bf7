"""numpy's own files as checkpoints: a ``.npz`` (one tensor per ``.npy`` member) and a lone
``.npy`` (one tensor named after the file). Read only: every command writes safetensors."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .base import NP_TO_ST, Checkpoint, TensorInfo, numel, to_le_bytes


def _npy_header(fp: BinaryIO) -> tuple[np.dtype, tuple[int, ...]]:
    """dtype and shape from a .npy header, without reading the data."""
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
    else:
        raise ValueError(f".npy format version {version} is not supported")
    return np.dtype(dtype), tuple(int(d) for d in shape)


def _info(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> TensorInfo:
    st = NP_TO_ST.get(dtype.newbyteorder("=")) if dtype.kind != "V" else None
    return TensorInfo(name, st, shape, numel(shape) * dtype.itemsize, np_dtype=dtype)


class NpzCheckpoint(Checkpoint):
    format = "npz"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        try:
            self._zip = zipfile.ZipFile(path)
        except zipfile.BadZipFile as e:
            raise self.error(None, f"not a valid .npz file: {e}") from None
        try:
            self._members: dict[str, str] = {}
            for member in self._zip.namelist():
                if not member.endswith(".npy"):
                    raise self.error(member, "not a .npy array inside the .npz")
                name = member[: -len(".npy")]
                try:
                    with self._zip.open(member) as fp:
                        dtype, shape = _npy_header(fp)
                except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
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
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
            raise self.error(name, f"cannot read the array: {e}") from None
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
                dtype, shape = _npy_header(fp)
            except (ValueError, EOFError) as e:
                raise self.error(None, f"malformed .npy file: {e}") from None
        self.tensors = [_info(self._name, dtype, shape)]
        self._index()

    def read(self, name: str) -> np.ndarray:
        try:
            arr = np.load(self.path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise self.error(name, f"cannot read the array: {e}") from None
        return arr.astype(arr.dtype.newbyteorder("="), copy=False)

    def copy_to(self, name: str, out: BinaryIO) -> None:
        out.write(to_le_bytes(self.read(name)))
