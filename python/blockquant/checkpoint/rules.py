"""Which tensors of a checkpoint are quantized, and with which scheme.

One decision per tensor, in this order:

1. a tensor that is not floating point is kept;
2. ``--include`` / ``--exclude`` pick the tensors considered; the others are kept;
3. the first ``--rule REGEX=SCHEME`` whose regular expression matches the name (``re.search``)
   decides: its scheme, or ``keep``;
4. with no rule matching, the tensor gets ``--scheme`` when its rank is at least ``--min-rank``
   (2 by default: norms and biases stay in their dtype, as llama.cpp and torchao do);
5. a tensor its scheme cannot take (a 2-D block on a 1-D tensor, a packing axis beyond its rank)
   is kept and reported, or is an error with ``--strict``.

Decisions read the header only, so a whole model folder is planned (and every ``--strict``
error found) before any tensor is read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import QuantError
from ..scheme import QuantScheme
from .base import Checkpoint, TensorInfo
from .format import part_layout
from .options import FileOptions, compile_rules
from .safetensors import HeaderEntry

#: Why a tensor was kept, as the summary groups them.
KEPT_DTYPE, KEPT_SELECTION, KEPT_RULE, KEPT_RANK, KEPT_UNFIT = (
    "dtype", "selection", "rule", "rank", "unfit")


@dataclass(frozen=True)
class Decision:
    """What happens to one tensor: quantized with ``scheme`` into ``parts``, or kept (``scheme``
    None) for the reason ``why`` (one of the KEPT_* words), explained in ``detail``."""

    tensor: TensorInfo
    scheme: QuantScheme | None
    parts: tuple[HeaderEntry, ...] = ()
    why: str = ""
    detail: str = ""

    @property
    def quantized(self) -> bool:
        return self.scheme is not None

    @property
    def bytes_after(self) -> int:
        """Bytes of this tensor's data in the output (a tensor dequantized on read is written
        as float32)."""
        return sum(p.nbytes for p in self.parts) if self.quantized else self.tensor.read_nbytes

    def describe(self) -> str:
        """One phrase: ``-> SCHEME`` or ``kept: WHY``."""
        return f"-> {self.scheme}" if self.scheme is not None else f"kept: {self.detail}"


def decide(ckpt: Checkpoint, t: TensorInfo, scheme: QuantScheme,
           options: FileOptions) -> Decision:
    """The decision for one tensor (module docstring). Raises CheckpointError only with
    ``options.strict``, for a tensor its scheme cannot take."""
    if not (t.is_float or t.dequantized_on_read):
        return Decision(t, None, why=KEPT_DTYPE, detail=f"{t.dtype_name} is not floating point")
    if not options.selects(t.name):
        return Decision(t, None, why=KEPT_SELECTION, detail="left out by --include/--exclude")
    chosen: QuantScheme | None = scheme
    rule = next((r for r in compile_rules(options.rules) if r.pattern.search(t.name)), None)
    if rule is not None:
        if rule.scheme is None:
            return Decision(t, None, why=KEPT_RULE, detail=f"--rule {rule.text}")
        chosen = rule.scheme
    elif len(t.shape) < options.min_rank:
        return Decision(t, None, why=KEPT_RANK,
                        detail=f"rank {len(t.shape)}, below --min-rank {options.min_rank}")
    assert chosen is not None
    try:
        parts = part_layout(t.name, chosen, t.shape)
    except (QuantError, OverflowError) as e:
        if options.strict:
            raise ckpt.error(t.name, f"{e} (--strict; leave it out with --exclude or "
                             "--rule 'REGEX=keep')") from None
        return Decision(t, None, why=KEPT_UNFIT, detail=f"{chosen} does not fit: {e}")
    if t.dequantized_on_read and not options.allow_requantize:
        raise ckpt.error(t.name, f"is already quantized ({t.dtype_name}); quantizing it again "
                         "adds error: --allow-requantize does it anyway")
    return Decision(t, chosen, tuple(parts))


def plan(ckpt: Checkpoint, scheme: QuantScheme, options: FileOptions) -> list[Decision]:
    """One decision per tensor of ``ckpt``, in file order."""
    return [decide(ckpt, t, scheme, options) for t in ckpt.tensors]


def dequantized_summary(decisions: Iterable[Decision]) -> str:
    """Which tensors were another tool's quantized type, read as their dequantized values (one
    phrase, empty when none was)."""
    counts = Counter(d.tensor.dtype_name for d in decisions if d.tensor.dequantized_on_read)
    if not counts:
        return ""
    n = sum(counts.values())
    types = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    return (f"{n} tensor{'s' if n != 1 else ''} of quantized GGUF types ({types}) dequantized "
            "on read, as ggml dequantizes them: requantized from those values, or written as "
            "float32 where kept")


def kept_summary(decisions: Iterable[Decision], min_rank: int = 2) -> str:
    """How many tensors were kept and why, as one phrase (empty when none was kept)."""
    counts = Counter(d.why for d in decisions if not d.quantized)
    if not counts:
        return ""
    words = {
        KEPT_RANK: f"of rank below {min_rank} (norms, biases; --min-rank 1 or a --rule "
                   "takes them)",
        KEPT_UNFIT: "the scheme cannot take (--dry-run says why, --strict makes it an error)",
        KEPT_RULE: "by --rule",
        KEPT_SELECTION: "by --include/--exclude",
        KEPT_DTYPE: "not floating point",
    }
    parts = [f"{counts[w]} {text}" for w, text in words.items() if counts[w]]
    n = sum(counts.values())
    return f"left {n} tensor{'s' if n != 1 else ''} unquantized: " + ", ".join(parts)
