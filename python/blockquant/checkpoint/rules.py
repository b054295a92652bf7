r"""Which tensors of a checkpoint are quantized, and with which scheme.

One decision per tensor, in this order:

1. a tensor that is not floating point is kept;
2. ``--include`` / ``--exclude`` pick the tensors considered; the others are kept;
3. the first ``--rule REGEX=SCHEME`` whose regular expression matches the name (``re.search``)
   picks the scheme, or ``keep`` keeps the tensor whatever its rank; with no rule matching,
   the scheme is ``--scheme``;
4. the tensor is quantized when its rank is at least ``--min-rank`` (2 by default: norms and
   biases stay in their dtype, as llama.cpp and torchao do), or at least N for a rule whose
   scheme ends in ``@N`` (``--rule '\.bias$=int8@1'``): a rule aimed at ``attention.query``
   does not take ``attention.query.bias`` along unless it says so;
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
from .options import FileOptions, Rule, compile_rules, matching_rule, rule_scheme
from .safetensors import HeaderEntry

#: Why a tensor was kept, as the summary groups them.
KEPT_DTYPE, KEPT_SELECTION, KEPT_RULE, KEPT_RANK, KEPT_UNFIT, KEPT_FORMAT = (
    "dtype", "selection", "rule", "rank", "unfit", "format")


@dataclass(frozen=True)
class Decision:
    """What happens to one tensor: quantized with ``scheme`` into ``parts``, or kept (``scheme``
    None) for the reason ``why`` (one of the KEPT_* words), explained in ``detail``."""

    tensor: TensorInfo
    scheme: QuantScheme | None
    parts: tuple[HeaderEntry, ...] = ()
    why: str = ""
    detail: str = ""
    label: str = ""  # what the scheme is called in the output's own words (an MLX mode)

    @property
    def shown(self) -> str:
        """The scheme as summaries name it: the output format's word for it, else its text."""
        return self.label or str(self.scheme)

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
    chosen = scheme
    rule = matching_rule(compile_rules(options.rules), t.name)
    if rule is not None:
        picked = rule_scheme(rule)
        if picked is None:
            return Decision(t, None, why=KEPT_RULE, detail=f"--rule {rule.text}")
        chosen = picked
    kept = rank_kept(rule, len(t.shape), options.min_rank)
    if kept is not None:
        return Decision(t, None, why=kept[0], detail=kept[1])
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


def rank_kept(rule: Rule | None, rank: int, min_rank: int) -> tuple[str, str] | None:
    """(why, detail) when a tensor of ``rank`` is kept for its rank, under the matching
    ``rule`` (None: none matched) and ``--min-rank min_rank``; None when its rank will do."""
    if rule is None or rule.min_rank is None:
        if rank < min_rank:
            return KEPT_RANK, f"rank {rank}, below --min-rank {min_rank}"
        return None
    if rank < rule.min_rank:  # the rule's own floor: counted as the rule's doing
        return KEPT_RULE, f"rank {rank}, below the @{rule.min_rank} of --rule {rule.text}"
    return None


def plan(ckpt: Checkpoint, scheme: QuantScheme, options: FileOptions) -> list[Decision]:
    """One decision per tensor of ``ckpt``, in file order."""
    options.check_schemes(scheme)  # an option that does not fit is the option's error
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
        KEPT_RANK: f"of rank below {min_rank} (norms, biases; --min-rank 1 or --rule "
                   "'REGEX=SCHEME@1' takes them)",
        KEPT_UNFIT: "the scheme cannot take (--dry-run says why, --strict makes it an error)",
        KEPT_RULE: "by --rule",
        KEPT_SELECTION: "by --include/--exclude",
        KEPT_DTYPE: "not floating point",
        KEPT_FORMAT: "the format keeps in float (--dry-run says which and why)",
    }
    parts = [f"{counts[w]} {text}" for w, text in words.items() if counts[w]]
    n = sum(counts.values())
    return f"left {n} tensor{'s' if n != 1 else ''} unquantized: " + ", ".join(parts)
