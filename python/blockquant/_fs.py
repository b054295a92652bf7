"""File-system helpers every writer shares: temporary names beside a target, kept within the
file-name limit, publishing a finished temporary file without clobbering, and "is this the same
file" checks."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

#: The longest file name (in bytes) Linux, macOS and Windows file systems accept.
NAME_MAX = 255


def temp_sibling(path: Path, kind: str = "tmp") -> Path:
    """A fresh hidden name beside ``path``, ``.NAME.XXXXXXXX.KIND``, whose length stays within
    NAME_MAX bytes however long NAME is (a 252-byte target name is legal; its temp name must
    be too). Truncating may cut a multibyte character: the name is bytes to the kernel."""
    suffix = f".{secrets.token_hex(4)}.{kind}"
    room = NAME_MAX - 1 - len(suffix)
    stem = os.fsdecode(os.fsencode(path.name)[:room])
    return path.with_name(f".{stem}{suffix}")


def publish(tmp: Path, path: Path, *, force: bool) -> None:
    """Put the finished (flushed, fsynced, closed) file ``tmp`` at ``path``. With ``force`` a
    rename replaces whatever is there; without, a hard link, which fails if ``path`` exists,
    so an existing file is never clobbered (``FileExistsError``); a file system without hard
    links falls back to a rename after checking. Other ``OSError``s propagate."""
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
        os.unlink(tmp)
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links
        if path.exists():
            raise FileExistsError(path) from None
        os.replace(tmp, path)


def same_file(a: os.PathLike[str] | str, b: os.PathLike[str] | str) -> bool:
    """Whether ``a`` and ``b`` both exist and are the same file (same device and inode: a hard
    link or another spelling of the path counts)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def is_inside(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` is ``outer`` or lies below it (both resolved, symlinks followed)."""
    try:
        inner, outer = inner.resolve(), outer.resolve()
    except (OSError, RuntimeError):
        return False
    return inner == outer or outer in inner.parents
