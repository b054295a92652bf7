"""File-system helpers every writer shares: temporary names beside a target, kept within the
file-name limit, :class:`AtomicFile` (the one way a file is written: under a temporary name,
fsynced, published without clobbering), and "is this the same file" checks."""

from __future__ import annotations

import os
import secrets
import signal
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

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


#: The last outputs put in place by this process, and how many there have been: the command
#: says, when a signal ends it, whether its output was written. Recorded within
#: :func:`signals_deferred`, so that no signal falls between the rename and the record.
_published: deque[Path] = deque(maxlen=64)
_published_count = 0


def record_published(path: Path) -> None:
    global _published_count
    _published.append(path)
    _published_count += 1


def published_mark() -> int:
    """A mark to pass to :func:`published_since` later."""
    return _published_count


def published_since(mark: int) -> list[Path]:
    """The outputs put in place since ``mark`` (the last 64 at most)."""
    n = _published_count - mark
    return list(_published)[-n:] if n > 0 else []


_DEFERRED = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP held back until the block is done, then handled as they would
    have been: for the few renames that put an output in place, which a signal must not split
    (an old folder moved aside and the new one not yet in its place). Python runs signal
    handlers in the main thread only, so elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {}
    try:
        for sig in _DEFERRED:
            handler = signal.getsignal(sig)
            if handler in (signal.SIG_IGN, None):  # ignored, or not Python's to change
                continue
            # Recorded before the swap: signal.signal() runs pending handlers once it has
            # installed the new one, and one of them may raise.
            previous[sig] = handler
            signal.signal(sig, lambda signum, _frame: caught.append(signum))
        yield
    finally:
        _restore(previous, caught)


def _restore(previous: dict[int, Any], caught: list[int]) -> None:
    """Puts the handlers back and handles the signals that came meanwhile. A handler that
    raises (Ctrl-C's KeyboardInterrupt) may run inside any of these calls: every handler is
    put back and every held signal handled all the same, and the first exception is raised at
    the end."""
    first: BaseException | None = None
    for sig, handler in previous.items():
        try:
            signal.signal(sig, handler)  # installed even when it then raises
        except BaseException as e:  # noqa: BLE001 - a signal's handler, raised meanwhile
            first = first or e
    for sig in caught:
        try:
            signal.raise_signal(sig)
        except BaseException as e:  # noqa: BLE001
            first = first or e
    if first is not None:
        raise first


def publish(tmp: Path, path: Path, *, force: bool, record: bool = True) -> None:
    """Put the finished (flushed, fsynced, closed) file ``tmp`` at ``path``. With ``force`` a
    rename replaces whatever is there; without, a hard link, which fails if ``path`` exists,
    so an existing file is never clobbered (``FileExistsError``); a file system without hard
    links falls back to a rename after checking. Other ``OSError``s propagate."""
    with signals_deferred():
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
                os.unlink(tmp)
            except FileExistsError:
                raise
            except OSError:  # a filesystem without hard links
                if path.exists():
                    raise FileExistsError(path) from None
                os.replace(tmp, path)
        if record:  # a file that goes with another (ONNX's external data) is not news itself
            record_published(path)


def publish_folder(tmp: Path, path: Path, *, force: bool) -> None:
    """Put the finished folder ``tmp`` at ``path``: renamed there, or, with ``force``, the
    folder (or a link to one) at ``path`` moved aside first and removed after, with no signal
    between the two (it would leave no output, or the old one hidden). Without ``force`` an
    existing ``path`` is a ``FileExistsError``. Other ``OSError``s propagate, ``tmp`` kept."""
    import shutil

    with signals_deferred():
        if path.exists() or path.is_symlink():
            if not force:
                raise FileExistsError(path)
            old = temp_sibling(path, "old")
            os.rename(path, old)
            os.rename(tmp, path)
            if old.is_symlink():  # a link to a folder was replaced, not its target
                old.unlink()
            else:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
        record_published(path)


def fsync_path(path: Path) -> None:
    """Flush a file written by someone else (a library that only takes a name) to the disk."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(folder: Path) -> None:
    """Makes a rename in ``folder`` itself durable; not every platform can open a directory."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicFile:
    """A file written under a fresh hidden name beside ``path`` (:func:`temp_sibling`) and put
    at ``path`` by :meth:`commit`: flushed, fsynced, published (:func:`publish`: never over an
    existing file without ``force``), the folder fsynced. :meth:`abort`, a failed commit, or
    leaving a ``with`` block uncommitted removes the temporary file: ``path`` is whole or
    untouched. Every writer of an output file (safetensors, GGUF, burn-pack) writes through
    this. ``OSError``s propagate, naming ``path`` rather than the temporary name."""

    def __init__(self, path: os.PathLike[str] | str, *, force: bool) -> None:
        self.path = Path(path)
        self.force = force
        self.tmp = temp_sibling(self.path)  # within NAME_MAX whatever the target's name
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            raise type(e)(e.errno, e.strerror, str(self.path)) from None
        self.file: BinaryIO | None = os.fdopen(fd, "wb")

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.abort()

    @property
    def f(self) -> BinaryIO:
        """The open temporary file (an error once committed or aborted)."""
        if self.file is None:
            raise ValueError(f"{self.path}: the output is closed")
        return self.file

    def commit(self, size: int | None = None) -> None:
        """Publish the file (cut to ``size`` bytes first, when given)."""
        f = self.f
        try:
            if size is not None:
                f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
            f.close()
            self.file = None
            publish(self.tmp, self.path, force=self.force)
        except BaseException:
            self.abort()
            raise
        fsync_dir(self.path.parent)

    def abort(self) -> None:
        f, self.file = self.file, None
        try:
            if f is not None:
                f.close()
        finally:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass


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
