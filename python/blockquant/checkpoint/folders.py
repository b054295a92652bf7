"""Model folders, and where outputs go: the layer the command and :mod:`blockquant.files` call.

A model folder is laid out as Hugging Face writes one: one ``model.safetensors``, or shards
``model-00001-of-00003.safetensors`` with ``model.safetensors.index.json`` (whose
``weight_map`` says which shard holds each tensor), beside ``config.json``, tokenizer files and
so on, possibly in subfolders. Quantizing (or dequantizing) a folder writes a folder of the same
shape: every ``.safetensors`` file is converted under its own name, every index is rewritten so
its ``weight_map`` names the tensors the new shards hold (``NAME.values``, ``NAME.scales``,
...), and every other file is copied unchanged, except weight files in other formats
(``pytorch_model.bin``, ``.h5``, ``.onnx``, ...), which would be the unquantized weights again:
those are left out and listed. Hidden entries (``.git``, ``.cache``) are skipped.

Everything is planned from the headers first (every decision, every ``--strict`` error, the
index checked against the shards), then written into a hidden temporary folder beside the
output and renamed into place at the end: an interrupted or failed run leaves no half folder.
Shards go to ``jobs`` processes at once (:mod:`.jobs`), each with its share of the thread
budget; each reads one tensor at a time, so memory is bounded by the largest tensor per job.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._fs import is_inside, publish_folder, same_file, temp_sibling
from ..scheme import QuantScheme
from .base import NAME_TO_ST, CheckpointError, TensorInfo, os_reason
from .commands import (
    Measured,
    QuantizeSummary,
    _check_not_quantized,
    _entries,
    dequantize_file,
    inspect_file,
    measure_file,
    natural_key,
    report_dict,
    write_quantized,
)
from .ct_read import CONFIG, ct_config, without_quantization, write_config
from .formats import (
    BURNPACK,
    CHOOSABLE,
    FORMATS,
    GGUF,
    ONNX,
    SAFETENSORS,
    names_folder,
    refuse_model_output,
)
from .formats import (
    output_format as decide_output,
)
from .jobs import RunStats, Task, TensorProgress, run_tasks
from .mlx_read import mlx_config
from .options import FileOptions
from .readers import open_checkpoint
from .rules import Decision, plan
from .safetensors import SafetensorsCheckpoint

INDEX_SUFFIX = ".safetensors.index.json"
#: Weights in formats a quantized folder should not carry along (they would be the
#: unquantized model again); left out of the output and listed in the summary.
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".ot", ".onnx",
                 ".onnx_data", ".gguf", ".npz", ".npy", ".bpk", ".pkl")
_MAX_INDEX = 100_000_000  # bytes; as a safetensors header

def _no_progress(file: Any, name: str, nbytes: int) -> None:
    pass


# -- reading a folder ---------------------------------------------------------------------------
@dataclass
class ModelFolder:
    """What a model folder holds, as paths relative to ``root`` (POSIX separators)."""

    root: Path
    checkpoints: list[str]  # .safetensors files, converted
    indexes: dict[str, dict[str, Any]]  # index file -> its parsed JSON
    others: list[str]  # copied unchanged
    skipped: list[str]  # other weight formats and symlinked folders, left out
    folders: list[str]  # subfolders to recreate (empty ones too)

    def path(self, rel: str) -> Path:
        return self.root / rel


def scan_folder(root: Path) -> ModelFolder:
    """List a model folder and check its indexes against its files (nothing else is read)."""
    checkpoints, index_files, others, skipped, folders = [], [], [], [], []
    try:
        for here, dirs, files in os.walk(root, onerror=_raise):
            rel_here = Path(here).relative_to(root)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for d in list(dirs):
                if (Path(here) / d).is_symlink():
                    dirs.remove(d)
                    skipped.append((rel_here / d).as_posix())
                else:
                    folders.append((rel_here / d).as_posix())
            for f in sorted(files):
                rel = (rel_here / f).as_posix()
                if f.startswith("."):
                    continue
                if f.endswith(".safetensors"):
                    checkpoints.append(rel)
                elif f.endswith(INDEX_SUFFIX):
                    index_files.append(rel)
                elif f.lower().endswith(OTHER_WEIGHTS):
                    skipped.append(rel)
                else:
                    others.append(rel)
    except OSError as e:
        raise CheckpointError(e.filename or root, None, os_reason(e)) from None
    if not checkpoints:
        hint = ""
        if any(s.lower().endswith((".bin", ".pt", ".pth", ".ckpt")) for s in skipped):
            from .pytorch import HOW_TO_CONVERT

            hint = f"; it has PyTorch weights, which blockquant does not read: {HOW_TO_CONVERT}"
        raise CheckpointError(root, None, f"holds no .safetensors file{hint}")
    folder = ModelFolder(root, checkpoints, {}, others, skipped, folders)
    for rel in index_files:
        folder.indexes[rel] = _read_index(folder, rel)
    return folder


def _raise(e: OSError) -> None:
    raise e


def refuse_empty(path: Any) -> None:
    """An empty name is refused: Path("") is the current folder, surely not what was meant."""
    if not os.fspath(path):
        raise CheckpointError("''", None, "an empty name is no file or folder")


def _regular(path: Path) -> None:
    """Refuses a file that is not a regular one (itself or where its link points): reading a
    named pipe waits for a writer, and copying a device (a link to /dev/zero) never ends."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise CheckpointError(path, None, os_reason(e)) from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(path, None, "is not a regular file (a pipe, a device or a "
                              "socket); a model folder holds files")


def _read_index(folder: ModelFolder, rel: str) -> dict[str, Any]:
    path = folder.path(rel)
    _regular(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_INDEX + 1)
    except OSError as e:
        raise CheckpointError(path, None, os_reason(e)) from None
    if len(raw) > _MAX_INDEX:
        raise CheckpointError(path, None, f"index larger than {_MAX_INDEX} bytes")
    try:
        index = json.loads(raw.decode("utf-8"))
        bad = _not_unicode(index)
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(path, None, f"malformed index: {e}") from None
    except RecursionError:
        raise CheckpointError(path, None, "malformed index: nested too deeply") from None
    if bad is not None:
        # JSON's \ud800-\udfff escapes parse to lone surrogates, which no UTF-8 file (the
        # index written back) can hold.
        raise CheckpointError(path, None, f"malformed index: {bad!r} is not "
                              "valid Unicode (a lone surrogate)")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not isinstance(index.get("metadata", {}), dict):
        raise CheckpointError(path, None, "malformed index: no weight_map object of tensor "
                              "name -> shard file")
    here = Path(rel).parent
    shards = set(folder.checkpoints)
    for name, shard in weight_map.items():
        ok = (isinstance(shard, str) and shard not in ("", ".", "..")
              and "/" not in shard and "\\" not in shard and "\0" not in shard)
        if not ok or (here / shard).as_posix() not in shards:
            raise CheckpointError(path, name, f"weight_map names shard {shard!r}, which is not a "
                                  ".safetensors file beside the index")
    return index


def _not_unicode(value: Any) -> str | None:
    """The first text in a parsed JSON value (keys included) that UTF-8 cannot encode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value
        return None
    items = value.items() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        for part in item if isinstance(value, dict) else (item,):
            bad = _not_unicode(part)
            if bad is not None:
                return bad
    return None


def _shards_of(rel_index: str, index: dict[str, Any]) -> list[str]:
    here = Path(rel_index).parent
    return sorted({(here / s).as_posix() for s in index["weight_map"].values()})


def _check_index_against_shards(folder: ModelFolder,
                                held: dict[str, frozenset[str]]) -> None:
    """Every tensor an index maps must be in the shard it names (``held``: shard -> names), and
    in no other shard of that index (a reader of the shards could take either; the output index
    can name only one). Checkpoints no index names may share names: a diffusers folder keeps
    ``diffusion_pytorch_model.safetensors`` beside its ``.fp16`` variant."""
    for rel, index in folder.indexes.items():
        first: dict[str, str] = {}
        for shard in _shards_of(rel, index):
            for name in sorted(held[shard]):
                other = first.setdefault(name, shard)
                if other != shard:
                    raise CheckpointError(folder.path(shard), name, f"is in {other!r} too, "
                                          f"another shard of {rel!r}")
    for rel, index in folder.indexes.items():
        here = Path(rel).parent
        for name, shard in index["weight_map"].items():
            if name not in held[(here / shard).as_posix()]:
                raise CheckpointError(folder.path(rel), name,
                                      f"weight_map says {shard!r} holds it, which it does not")


def _write_index(folder: ModelFolder, rel: str, out_root: Path) -> None:
    """The index of the output: the same metadata, ``total_size`` recounted, and a
    ``weight_map`` of the tensors the output shards hold."""
    index = folder.indexes[rel]
    weight_map: dict[str, str] = {}
    total = 0
    for shard in _shards_of(rel, index):
        # the shards as stored (a compressed-tensors output is read as its layers otherwise)
        with SafetensorsCheckpoint(out_root / shard) as ckpt:
            for t in ckpt.tensors:
                weight_map[t.name] = Path(shard).name
                total += t.nbytes
    meta = dict(index.get("metadata") or {})
    meta["total_size"] = total
    out = {**index, "metadata": meta,
           "weight_map": dict(sorted(weight_map.items(), key=lambda kv: natural_key(kv[0])))}
    text = json.dumps(out, indent=2, ensure_ascii=False) + "\n"
    (out_root / rel).write_text(text, encoding="utf-8")


# -- where the output goes ----------------------------------------------------------------------
#: Output names that ask for one checkpoint file.
_FILE_SUFFIXES = tuple(s for f in FORMATS for s in f.suffixes)


class FolderTarget:
    """A folder written as a whole: everything goes into a hidden temporary folder beside
    ``dst``, renamed to ``dst`` by :meth:`commit`; :meth:`abort` (or leaving the ``with`` on an
    exception, SIGTERM included in the command) removes it.

    ``force`` replaces an existing ``dst`` only when it looks like a model folder (empty, or
    holding a checkpoint or an index at its top), never the input or a folder holding it.
    """

    def __init__(self, dst: Path, src: Path, force: bool) -> None:
        self.dst = dst
        self.force = force
        self.check(dst, src, force)
        self.tmp = temp_sibling(dst)
        try:
            os.mkdir(self.tmp)
        except OSError as e:
            raise CheckpointError(dst, None, f"cannot write: {os_reason(e)}") from None

    @staticmethod
    def check(dst: Path, src: Path, force: bool) -> None:
        """``dst`` may be written from ``src``: a CheckpointError saying why not otherwise."""
        if is_inside(src, dst):
            raise CheckpointError(dst, None, f"holds the input {str(src)!r}; write elsewhere "
                                  "(--force never replaces the input)")
        if src.is_dir() and is_inside(dst, src):
            raise CheckpointError(dst, None, "is inside the input folder; write elsewhere")
        if dst.exists() or dst.is_symlink():
            if not dst.is_dir():
                raise CheckpointError(dst, None, "exists and is not a folder")
            if not force:
                raise CheckpointError(dst, None, "already exists (--force replaces it)")
            if not _looks_like_output(dst):
                raise CheckpointError(dst, None, "is a folder holding no checkpoint; --force "
                                      "replaces only a model folder (remove it yourself)")
        if not dst.parent.is_dir():
            raise CheckpointError(dst, None, f"no such folder {str(dst.parent)!r}")

    def __enter__(self) -> FolderTarget:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if self.tmp.exists():
            self.abort()

    def commit(self) -> None:
        try:
            publish_folder(self.tmp, self.dst, force=self.force)
        except FileExistsError:
            self.abort()
            raise CheckpointError(self.dst, None, "already exists (--force replaces it)") from None
        except OSError as e:
            self.abort()
            raise CheckpointError(self.dst, None, f"cannot write: {os_reason(e)}") from None

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def _looks_like_output(folder: Path) -> bool:
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return not names or any(n.endswith((".safetensors", INDEX_SUFFIX, ".bpk")) for n in names)


# -- plans ---------------------------------------------------------------------------------------
@dataclass
class FilePlan:
    """One checkpoint of a run: its input, its output path relative to the output root (the
    output file itself when the output is a file), and its tensors' decisions."""

    src: Path
    rel: str
    decisions: list[Decision]
    names: frozenset[str] = frozenset()  # the input's tensor names

    @property
    def bytes_in(self) -> int:
        return sum(d.tensor.nbytes for d in self.decisions)

    @property
    def bytes_after(self) -> int:
        return sum(d.bytes_after for d in self.decisions)


@dataclass
class FolderSummary(QuantizeSummary):
    """A quantize run over a folder (or a file): the files converted, copied and left out."""

    copied_files: list[str] = field(default_factory=list)
    skipped_files: list[str] = field(default_factory=list)
    stats: RunStats = field(default_factory=RunStats)
    #: Files a resumed run found finished and kept (``--resume``).
    resumed_files: list[str] = field(default_factory=list)


@dataclass
class DequantizeSummary:
    dequantized: int
    copied: int
    bytes_out: int
    seconds: float
    files: int = 1
    copied_files: list[str] = field(default_factory=list)
    skipped_files: list[str] = field(default_factory=list)
    stats: RunStats = field(default_factory=RunStats)


@dataclass
class Plan:
    """What a quantize or dequantize run will do, worked out from headers alone (nothing read
    or written yet): :meth:`run` does it. ``folder`` is None for one file; ``dst`` is the
    output file, or the output folder (``into_folder``)."""

    kind: str  # "quantize" | "dequantize"
    src: Path
    dst: Path
    folder: ModelFolder | None
    files: list[FilePlan]
    scheme: QuantScheme | None
    options: FileOptions
    output_format: str | None = None
    into_folder: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes_in for f in self.files)

    def decisions(self) -> list[tuple[str, Decision]]:
        return [(f.rel, d) for f in self.files for d in f.decisions]

    def run(self, *, jobs: int = 1, threads: int | None = None,
            progress: TensorProgress = _no_progress) -> Any:
        t0 = time.perf_counter()
        stats = RunStats()
        if not self.into_folder:  # one file to one file: the writer is atomic itself
            res = run_tasks([self.task(self.files[0], self.dst)], 1, threads, progress, stats)[0]
            return self.summary([res], [], [], os.path.getsize(self.dst), t0, stats)
        with FolderTarget(self.dst, self.src, self.options.force) as target:
            copied = self.prepare(target.tmp)
            try:
                results = run_tasks([self.task(f, target.tmp / f.rel) for f in self.files],
                                    jobs, threads, progress, stats)
            except CheckpointError as e:  # name the output, not its temporary folder
                raise retarget(e, target.tmp, self.dst) from None
            bytes_out = self.complete(target.tmp)
            target.commit()
        skipped = self.folder.skipped if self.folder else []
        return self.summary(results, copied, skipped, bytes_out, t0, stats)

    def prepare(self, tmp: Path) -> list[str]:
        """A folder output's subfolders made and its other files copied into ``tmp``, before
        the checkpoints are written; the files copied."""
        for sub in self.folder.folders if self.folder else []:
            os.makedirs(tmp / sub, exist_ok=True)
        copied = self.folder.others if self.folder else []
        unquantized = self.kind == "dequantize" and self.folder is not None \
            and (ct_config(self.folder.root) is not None
                 or mlx_config(self.folder.root) is not None)
        for rel in copied:
            if unquantized and rel == CONFIG:  # the model is no longer quantized
                write_config(tmp / rel, without_quantization(self.folder.root))
                continue
            _copy(self.folder.path(rel), tmp / rel)  # type: ignore[union-attr]
        return copied

    def complete(self, tmp: Path) -> int:
        """Once every checkpoint is in ``tmp``: the indexes written, the permissions copied;
        the bytes of the checkpoints written."""
        for rel in (self.folder.indexes if self.folder else {}):
            _write_index(self.folder, rel, tmp)  # type: ignore[arg-type]
        if self.folder is not None:
            # Each file keeps its input's permissions, as cp does: a model kept private
            # (0600) stays so.
            for rel in [*self.folder.others, *self.folder.indexes, *(f.rel for f in self.files)]:
                _same_mode(self.folder.path(rel), tmp / rel)
        return sum(os.path.getsize(tmp / f.rel) for f in self.files)

    def task(self, f: FilePlan, out: Path, *, force: bool | None = None) -> Task:
        """The work of writing ``f`` to ``out``, as a worker process (or a dask worker) runs
        it; ``force`` other than the run's (a resumable run replaces a file it redoes)."""
        opts = self.options if force is None else replace(self.options, force=force)
        if self.kind == "quantize":  # the decisions made here, handed on: not made again
            return Task(f.rel, write_quantized, (f.src, out, f.decisions, opts),
                        {"output_format": self.output_format})
        return Task(f.rel, dequantize_file, (f.src, out, opts),
                    {"require_quantized": self.folder is None})

    def summary(self, results: list[Any], copied: list[str], skipped: list[str],
                 bytes_out: int, t0: float, stats: RunStats) -> Any:
        seconds = time.perf_counter() - t0
        if self.kind == "quantize":
            decisions = [d for r in results for d in r.decisions]
            return FolderSummary(
                [d.tensor.name for d in decisions if d.quantized],
                [d.tensor.name for d in decisions if not d.quantized],
                sum(r.bytes_in for r in results), bytes_out, seconds, decisions,
                len(results), copied, skipped, stats)
        return DequantizeSummary(sum(r[0] for r in results), sum(r[1] for r in results),
                                 bytes_out, seconds, len(results), copied, skipped, stats)


def retarget(e: CheckpointError, tmp: Path, dst: Path) -> CheckpointError:
    """``e`` naming the output ``dst`` rather than the temporary folder it was written in."""
    prefix = str(tmp)
    if not e.path.startswith(prefix):
        return e
    return type(e)(str(dst) + e.path[len(prefix):], e.tensor, e.reason)


def _copy(src: Path, dst: Path) -> None:
    try:
        shutil.copyfile(src, dst)
    except OSError as e:
        raise CheckpointError(e.filename or src, None, os_reason(e)) from None


def _same_mode(src: Path, dst: Path) -> None:
    if os.name != "posix":  # Windows' one bit is read-only: copied, it would stop --force
        return
    try:
        shutil.copymode(src, dst)
    except OSError as e:
        raise CheckpointError(dst, None, f"cannot set its permissions: {os_reason(e)}") from None


def _output_name(src: Path, burnpack: bool) -> str:
    return (src.stem or src.name) + (".bpk" if burnpack else ".safetensors")


def plan_quantize(src: Any, dst: Any, scheme: QuantScheme, options: FileOptions | None = None,
                  *, output_format: str | None = None) -> Plan:
    """Plan ``blockquant quantize SRC -o DST``: SRC a checkpoint file or a model folder, DST a
    file, or a folder (SRC a folder, DST an existing folder, or DST ending in a slash)."""
    return _plan("quantize", src, dst, scheme, options or FileOptions(), output_format)


def plan_dequantize(src: Any, dst: Any, options: FileOptions | None = None) -> Plan:
    return _plan("dequantize", src, dst, None, options or FileOptions(), None)


def _plan(kind: str, src: Any, dst: Any, scheme: QuantScheme | None, options: FileOptions,
          requested: str | None) -> Plan:
    for p in (src, dst):
        refuse_empty(p)
    src_path, dst_path = Path(src), Path(dst)
    if not src_path.exists():
        raise CheckpointError(src, None, "No such file or directory")
    if requested not in (None, *CHOOSABLE):
        raise CheckpointError(dst, None, f"unknown output format {requested!r}")
    if src_path.is_dir():
        if requested == "burnpack":
            raise CheckpointError(dst, None, "a folder is written as .safetensors files, "
                                  "not burn-pack")
        if dst_path.exists() and not dst_path.is_dir():
            raise CheckpointError(dst, None, "exists and is not a folder (a model folder is "
                                  "written to a folder)")
        if not names_folder(dst) and dst_path.suffix in _FILE_SUFFIXES:
            # A new folder called model.bpk or out.safetensors is surely a mistake: the name
            # asks for one file, which a folder's several checkpoints cannot be.
            raise CheckpointError(dst, None, f"names a {dst_path.suffix} file, but a model "
                                  "folder is written to a folder of .safetensors files: name "
                                  "the output without the extension (or end it with /)")
        if same_file(src_path, dst_path):
            raise CheckpointError(dst, None, "is the input folder; write elsewhere "
                                  "(--force never replaces the input)")
        folder = scan_folder(src_path)
        for rel in folder.others:  # to be copied: refused now, before anything is written
            _regular(folder.path(rel))
        files = [_plan_file(kind, folder.path(rel), rel, scheme, options)
                 for rel in folder.checkpoints]
        _check_index_against_shards(folder, {f.rel: f.names for f in files})
        if kind == "dequantize" and not any(d.quantized or d.tensor.dequantized_on_read
                                            for f in files for d in f.decisions):
            raise CheckpointError(src, None, "holds no blockquant-quantized tensor (nothing to "
                                  "dequantize)")
        return Plan(kind, src_path, dst_path, folder, files, scheme, options, SAFETENSORS.name,
                    into_folder=True)
    fmt = decide_output(src, dst, requested) if kind == "quantize" else SAFETENSORS
    if fmt in (GGUF, ONNX):  # not a checkpoint of tensors and their decisions: their own paths
        refuse_model_output(dst, fmt)
    burnpack = fmt == BURNPACK
    into_folder = False
    if names_folder(dst):
        name = _output_name(src_path, burnpack and kind == "quantize")
        if dst_path.is_dir():  # an existing folder: the file goes in it, written atomically
            dst_path = dst_path / name
            if same_file(src_path, dst_path):
                raise CheckpointError(dst_path, None, "is the input file; write to another name "
                                      "(--force never overwrites the input)")
        else:  # a new folder holding the one file, made as a whole
            into_folder = True
    elif same_file(src_path, dst_path):
        raise CheckpointError(dst, None, "is the input file; write to another name "
                              "(--force never overwrites the input)")
    fp = _plan_file(kind, src_path, _output_name(src_path, burnpack and kind == "quantize")
                    if into_folder else dst_path.name, scheme, options)
    return Plan(kind, src_path, dst_path, None, [fp], scheme, options, fmt.name, into_folder)


def _plan_file(kind: str, path: Path, rel: str, scheme: QuantScheme | None,
               options: FileOptions) -> FilePlan:
    with open_checkpoint(path) as ckpt:
        if kind in ("quantize", "report"):
            assert scheme is not None
            _check_not_quantized(ckpt, measuring=kind == "report")
            return FilePlan(path, rel, plan(ckpt, scheme, options), _names(ckpt))
        # dequantize: a "decision" per output tensor: quantized (its scheme) or copied
        entries = _entries(ckpt)
        part_of = {p: e for e in entries.values() for p in e.parts.values()}
        decisions = []
        for t in ckpt.tensors:
            e = part_of.get(t.name)
            if e is None:
                decisions.append(Decision(t, None, why="plain", detail="not quantized"))
            elif t.name == e.parts["values"]:
                nbytes = sum(ckpt.info(p).nbytes for p in e.parts.values())
                info = TensorInfo(e.name, NAME_TO_ST[e.dtype], e.shape, nbytes)
                decisions.append(Decision(info, e.scheme))
        return FilePlan(path, rel, decisions, _names(ckpt))


def _names(ckpt: Any) -> frozenset[str]:
    return frozenset(t.name for t in ckpt.tensors)


# -- inspect and report ---------------------------------------------------------------------------
def inspect_path(src: Any) -> dict[str, Any]:
    """:func:`~.commands.inspect_file` of a file, or of every checkpoint in a folder together
    (each row then names its ``file``)."""
    path = Path(src)
    if not path.is_dir():
        return inspect_file(src)
    folder = scan_folder(path)
    held = {}
    for rel in folder.checkpoints:
        with open_checkpoint(folder.path(rel)) as ckpt:
            held[rel] = _names(ckpt)
    _check_index_against_shards(folder, held)
    infos = [inspect_file(folder.path(rel)) for rel in folder.checkpoints]
    rows = []
    for rel, info in zip(folder.checkpoints, infos):
        rows += [{**r, "file": rel} for r in info["tensors"]]
    rows.sort(key=lambda r: natural_key(r["name"]))
    common = dict(infos[0]["metadata"])
    for info in infos[1:]:
        common = {k: v for k, v in common.items() if info["metadata"].get(k) == v}
    return {
        "file": str(src),
        "format": "folder",
        "file_bytes": sum(i["file_bytes"] for i in infos),
        "metadata": common,
        "files": [{"file": rel, "format": i["format"], "file_bytes": i["file_bytes"],
                   "metadata": i["metadata"]} for rel, i in zip(folder.checkpoints, infos)],
        "tensors": rows,
    }


def plan_report(src: Any, scheme: QuantScheme, options: FileOptions) -> list[FilePlan]:
    path = Path(src)
    if not path.is_dir():
        return [_plan_file("report", path, path.name, scheme, options)]
    folder = scan_folder(path)
    files = [_plan_file("report", folder.path(rel), rel, scheme, options)
             for rel in folder.checkpoints]
    _check_index_against_shards(folder, {f.rel: f.names for f in files})
    return files


def report_path(src: Any, scheme: QuantScheme, options: FileOptions | None = None, *,
                jobs: int = 1, threads: int | None = None,
                progress: TensorProgress = _no_progress) -> dict[str, Any]:
    """:func:`~.commands.report_file` of a file, or of a folder's checkpoints together."""
    options = options or FileOptions()
    files = plan_report(src, scheme, options)  # every --strict error before any work
    tasks = [Task(f.rel, measure_file, (f.src, scheme, options)) for f in files]
    measured: list[Measured] = run_tasks(tasks, jobs, threads, progress)
    return report_dict(str(src), scheme, options, measured)
