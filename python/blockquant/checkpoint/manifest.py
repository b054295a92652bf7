"""The run folder of a resumable run (``--scheduler``, ``--dask``) and its manifest of finished
files, with no dask in it.

A resumable run writes beside its output, in ``.OUT.blockquant-run/``: ``parts/``, the output
folder being filled (renamed to OUT when it is whole, as :class:`.folders.FolderTarget` does),
and ``manifest.json``, the files finished so far. A file is recorded only once its worker has
written, fsynced and published it and the client has its size and SHA-256; the manifest itself
is replaced atomically (written aside, fsynced, renamed). An interrupted run keeps the folder;
``--resume`` reads the manifest and keeps a finished file only when all of these hold: it was
planned from the same input (the input's size, modification time and first MiB, the same
decisions for each of its tensors, the same options, output format and blockquant version),
and the file is there with the recorded size and SHA-256. Anything else in ``parts/``
(half-written temporary files of a killed worker, a file finished but never recorded) is
removed and redone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._fs import NAME_MAX, fsync_dir
from .._version import __version__
from .base import CheckpointError, os_reason
from .folders import FilePlan, FolderTarget, Plan

FORMAT = "blockquant-run"
VERSION = 1
MANIFEST = "manifest.json"
PARTS = "parts"
#: The input bytes a fingerprint hashes (a safetensors header is within them, nearly always).
_HEAD = 1 << 20
_MAX_MANIFEST = 64 << 20


def run_folder(dst: Path) -> Path:
    """The run folder of the output ``dst``: ``.NAME.blockquant-run`` beside it (NAME cut to
    keep the name within the file-name limit)."""
    suffix = ".blockquant-run"
    room = NAME_MAX - 1 - len(suffix)
    stem = os.fsdecode(os.fsencode(dst.name)[:room])
    return dst.with_name(f".{stem}{suffix}")


def file_digest(path: Path) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 22)
            if not block:
                break
            size += len(block)
            h.update(block)
    return size, h.hexdigest()


def digest_or_none(path: str) -> tuple[int, str] | None:
    """:func:`file_digest`, or None for a file that cannot be read (it is then redone)."""
    try:
        return file_digest(Path(path))
    except OSError:
        return None


def fingerprint(plan: Plan, f: FilePlan) -> str:
    """What an output file is made from, as a hash: the input file (size, modification time,
    first MiB), every tensor's decision with its resolved options, the output format and
    blockquant's version. Equal fingerprints, equal output bytes."""
    try:
        st = os.stat(f.src)
        with open(f.src, "rb") as fh:
            head = hashlib.sha256(fh.read(_HEAD)).hexdigest()
    except OSError as e:
        raise CheckpointError(f.src, None, os_reason(e)) from None
    decisions = []
    for d in f.decisions:
        t = d.tensor
        decisions.append([t.name, t.dtype, list(t.shape), t.nbytes, d.why,
                          None if d.scheme is None else str(d.scheme),
                          None if d.scheme is None else plan.options.quantize_options(d.scheme),
                          [list(p) for p in d.parts]])
    record = {"rel": f.rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "head": head,
              "decisions": decisions, "output_format": plan.output_format,
              "blockquant": __version__}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


class RunTarget(FolderTarget):
    """A :class:`FolderTarget` whose temporary folder is ``RUN/parts`` and outlives a failed or
    interrupted run (so that ``--resume`` goes on from it); renamed to ``dst`` by
    :meth:`commit`, after which the run folder is removed."""

    def __init__(self, dst: Path, src: Path, force: bool) -> None:
        self.dst, self.force = dst, force
        self.check(dst, src, force)
        self.run = run_folder(dst)
        self.tmp = self.run / PARTS
        try:
            os.makedirs(self.tmp, exist_ok=True)
        except OSError as e:
            raise CheckpointError(self.run, None, f"cannot write: {os_reason(e)}") from None

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        pass  # kept: its finished files are what --resume goes on from

    def abort(self) -> None:
        pass  # a failed rename keeps the parts too (FolderTarget.commit calls this)

    def commit(self) -> None:
        super().commit()
        shutil.rmtree(self.run, ignore_errors=True)

    def discard(self) -> None:
        """Remove the run folder (a run whose input cannot be converted: nothing to resume)."""
        shutil.rmtree(self.run, ignore_errors=True)


class Manifest:
    """The files a run has finished: relative path -> (fingerprint, size, SHA-256)."""

    def __init__(self, run: Path) -> None:
        self.path = run / MANIFEST
        self.parts: dict[str, dict[str, Any]] = {}

    @classmethod
    def read(cls, run: Path) -> "Manifest":
        """The run folder's manifest; an unreadable one, or one of another format or
        blockquant version, records nothing (every file is then redone)."""
        m = cls(run)
        try:
            with open(m.path, "rb") as f:
                raw = f.read(_MAX_MANIFEST + 1)
            data = json.loads(raw.decode("utf-8")) if len(raw) <= _MAX_MANIFEST else None
        except (OSError, ValueError, UnicodeDecodeError, RecursionError):
            return m
        if not (isinstance(data, dict) and data.get("format") == FORMAT
                and data.get("version") == VERSION and data.get("blockquant") == __version__
                and isinstance(data.get("parts"), dict)):
            return m
        for rel, entry in data["parts"].items():
            if isinstance(entry, dict) and isinstance(entry.get("fingerprint"), str) \
                    and type(entry.get("size")) is int and isinstance(entry.get("sha256"), str):
                m.parts[rel] = entry
        return m

    def finished(self, parts: Path, planned: dict[str, str],
                 digests: Callable[[list[str]], list[Any]] = lambda paths: [
                     digest_or_none(p) for p in paths]) -> set[str]:
        """The planned files (relative path -> fingerprint) provably finished: recorded with
        the planned fingerprint, and in ``parts`` with the recorded size and SHA-256.
        ``digests`` measures a list of paths ((size, SHA-256), or None for a file it cannot
        read): here, one after the other, or spread over a cluster's workers."""
        candidates = []
        for rel, key in planned.items():
            entry = self.parts.get(rel)
            if entry is None or entry["fingerprint"] != key:
                continue
            path = parts / rel
            try:
                if path.is_symlink() or not path.is_file() or \
                        path.stat().st_size != entry["size"]:
                    continue
            except OSError:
                continue
            candidates.append(rel)
        measured = digests([str(parts / rel) for rel in candidates]) if candidates else []
        done = {rel for rel, got in zip(candidates, measured) if got is not None
                and tuple(got) == (self.parts[rel]["size"], self.parts[rel]["sha256"])}
        self.parts = {rel: self.parts[rel] for rel in done}
        return done

    def record(self, rel: str, key: str, size: int, sha256: str) -> None:
        """Add a finished file and replace the manifest on disk atomically, durably."""
        self.parts[rel] = {"fingerprint": key, "size": size, "sha256": sha256}
        data = {"format": FORMAT, "version": VERSION, "blockquant": __version__,
                "parts": self.parts}
        tmp = self.path.with_name(MANIFEST + ".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            raise CheckpointError(self.path, None, f"cannot write: {os_reason(e)}") from None
        fsync_dir(self.path.parent)


def sweep(parts: Path, keep: set[str]) -> list[str]:
    """Remove every file under ``parts`` not in ``keep`` (relative paths): a killed worker's
    temporary files, files no manifest vouches for. Folders stay. The files removed."""
    removed = []
    for here, _dirs, files in os.walk(parts):
        for name in files:
            path = Path(here) / name
            rel = path.relative_to(parts).as_posix()
            if rel not in keep:
                try:
                    path.unlink()
                    removed.append(rel)
                except FileNotFoundError:
                    pass
    return removed
