"""Where an output file may go: the checks made before anything is written, and the output file
itself, written atomically by :class:`blockquant._fs.AtomicFile` (its errors as
:class:`CheckpointError`, naming the file)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from .._fs import AtomicFile, same_file
from .base import CheckpointError, os_reason


def check_output(src: Any, dst: Any) -> None:
    """Refuse an output that names a folder (pathlib would drop the trailing slash) or is the
    input itself, whatever its spelling (same inode), even with force."""
    if isinstance(dst, str) and dst.endswith(("/", os.sep)):
        raise CheckpointError(dst, None, "names a folder; give a file name (the blockquant "
                              "command and blockquant.quantize_file write into folders)")
    if same_file(src, dst):
        raise CheckpointError(dst, None, "is the input file; write to another name "
                              "(--force never overwrites the input)")
    if os.path.exists(dst) and not os.path.isfile(dst) and not os.path.isdir(dst):
        # /dev/null, a pipe, a socket: --force would put a file in its place
        raise CheckpointError(dst, None, "is not a regular file; not replacing it")


class OutputFile:
    """An output file of the file commands (safetensors, GGUF): :class:`AtomicFile`, its
    problems as one :class:`CheckpointError` each, naming ``path``. Refused at once: a folder,
    a missing parent folder, an existing file without ``force``."""

    def __init__(self, path: Any, force: bool) -> None:
        self.path = Path(path)
        self.check(self.path, force)
        try:
            self._file = AtomicFile(self.path, force=force)
        except OSError as e:
            raise CheckpointError(self.path, None, f"cannot write: {os_reason(e)}") from None

    @staticmethod
    def check(path: Path, force: bool) -> None:
        if path.is_dir():
            raise CheckpointError(path, None, "is a directory")
        if not path.parent.is_dir():
            raise CheckpointError(path, None, f"no such directory {str(path.parent)!r}")
        if path.exists() and not force:
            raise CheckpointError(path, None, "already exists (--force replaces it)")

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.__exit__(*exc)

    @property
    def open(self) -> bool:
        return self._file.file is not None

    def io(self, fn: Callable[[BinaryIO], Any]) -> Any:
        """``fn(file)``; an ``OSError`` (a full disk) is a CheckpointError naming the output."""
        try:
            return fn(self._file.f)
        except OSError as e:
            raise CheckpointError(self.path, None, f"cannot write: {os_reason(e)}") from None

    def write(self, data: Any) -> None:
        self.io(lambda f: f.write(data))

    def tell(self) -> int:
        return int(self.io(lambda f: f.tell()))

    def commit(self, size: int | None = None) -> None:
        try:
            self._file.commit(size)
        except FileExistsError:  # made meanwhile: still never clobbered
            raise CheckpointError(self.path, None, "already exists (--force replaces it)") \
                from None
        except OSError as e:
            raise CheckpointError(self.path, None, f"cannot write: {os_reason(e)}") from None

    def abort(self) -> None:
        self._file.abort()
