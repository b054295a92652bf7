"""llama.cpp's named mixes: its file types (``llama_ftype``, the names llama-quantize takes:
``Q4_K_M``, ``Q5_K_S``, ``IQ4_XS``, ``Q8_0`` ...) and the ggml type each tensor of a GGUF model
gets under one, as llama.cpp's ``llama-quant.cpp`` chooses it: its rules read as facts and
written here anew.

A mix starts from its file type's default type (Q4_K for Q4_K_M) and changes it per tensor:

- by role, told from the GGUF name: the output head, the token embeddings, attention V (and the
  fused QKV, and MLA's KV-B), attention K and output, FFN down;
- by position: some mixes give more bits to FFN down and attention V in the first and last
  eighths of the layers and in every third layer between (``use_more_bits``), or to the first
  few layers only; positions count the tensors of a role in llama.cpp's order (the layer
  number, then the name), as llama.cpp's counters do;
- by the model, read from its GGUF metadata: grouped-query attention (heads per KV head, at
  least 4), eight experts, Falcon, the 80-layer GQA llama (the "70B" rule), and whether the
  output head is tied to the token embeddings (no ``output.weight``: the token embeddings then
  get the output head's type);
- then the fallback: a tensor whose rows (``ne[0]``, numpy's last axis) are not whole blocks
  of its type gets a type whose blocks fit (Q2_K, Q3_K, TQ1_0 and TQ2_0: Q4_0; Q4_K: Q5_0; Q5_K:
  Q5_1; Q6_K: Q8_0; IQ4_XS: IQ4_NL), and F16 when even that one's 32-value blocks do not fit.
  A type with no fallback (Q8_0, Q4_0, NVFP4 ... on rows that are not whole blocks) makes
  llama-quantize refuse the file; blockquant keeps such a tensor as it is instead.

Overrides, in llama.cpp's order: ``--token-embedding-type`` and ``--output-tensor-type`` win
over everything (no fallback: a type whose blocks do not fit the rows keeps the tensor); then the
first matching ``--rule`` / ``--tensor-type`` (skipping the mix's rules for that tensor, and its
counters, as llama.cpp does; the fallback still applies); then the mix, unless ``--pure``.

The mixes blockquant makes are those whose types it writes; the IQ1/IQ2/IQ3 mixes are refused
with the reason. Q2_K_S needs an importance matrix (``--imatrix``), as llama-quantize says.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import gguf as bg
from .base import CheckpointError
from .options import Rule, compile_rules, matching_rule

__all__ = ["FileType", "FILE_TYPES", "ModelFacts", "Mix", "MixOptions", "Choice", "file_type",
           "fallback", "choose_types", "resolve_mix", "category"]


@dataclass(frozen=True)
class FileType:
    """One of llama.cpp's file types: llama-quantize's name, the number ``general.file_type``
    holds, its default ggml type, and why blockquant cannot make it (empty when it can)."""

    name: str
    id: int
    default: str
    missing: str = ""


_NO_IQ = "blockquant has no quantizer for ggml's IQ1/IQ2/IQ3 types"
#: llama-quantize's names, in its order; the ids are gguf-py's ``LlamaFileType``.
_TABLE = (
    ("Q4_0", 2, "Q4_0"), ("Q4_1", 3, "Q4_1"), ("MXFP4_MOE", 38, "MXFP4"), ("NVFP4", 39, "NVFP4"),
    ("Q5_0", 8, "Q5_0"), ("Q5_1", 9, "Q5_1"), ("IQ2_XXS", 19, "IQ2_XXS", _NO_IQ),
    ("IQ2_XS", 20, "IQ2_XS", _NO_IQ), ("IQ2_S", 28, "IQ2_XS", _NO_IQ),
    ("IQ2_M", 29, "IQ2_S", _NO_IQ), ("IQ1_S", 24, "IQ1_S", _NO_IQ), ("IQ1_M", 31, "IQ1_M", _NO_IQ),
    ("TQ1_0", 36, "TQ1_0"), ("TQ2_0", 37, "TQ2_0"), ("Q2_K", 10, "Q2_K"),
    ("Q2_K_S", 21, "Q2_K"),
    ("IQ3_XXS", 23, "IQ3_XXS", _NO_IQ), ("IQ3_S", 26, "IQ3_S", _NO_IQ),
    ("IQ3_M", 27, "IQ3_S", _NO_IQ), ("IQ3_XS", 22, "IQ3_S", _NO_IQ),
    ("Q3_K_S", 11, "Q3_K"), ("Q3_K_M", 12, "Q3_K"), ("Q3_K_L", 13, "Q3_K"),
    ("IQ4_NL", 25, "IQ4_NL"), ("IQ4_XS", 30, "IQ4_XS"), ("Q4_K_S", 14, "Q4_K"),
    ("Q4_K_M", 15, "Q4_K"), ("Q5_K_S", 16, "Q5_K"), ("Q5_K_M", 17, "Q5_K"), ("Q6_K", 18, "Q6_K"),
    ("Q8_0", 7, "Q8_0"), ("F16", 1, "F16"), ("BF16", 32, "BF16"), ("F32", 0, "F32"),
)
#: Every file type by llama-quantize's name.
FILE_TYPES: dict[str, FileType] = {row[0]: FileType(*row) for row in _TABLE}
#: llama-quantize's short names of the _M mixes.
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
#: ``general.file_type`` of a file of one ggml type that names no file type (``--pure``):
#: what llama.cpp's loader guesses for a file mostly of that type.
_SINGLE_TYPE_IDS = {"MXFP4": 38}


def file_type(text: Any) -> FileType | None:
    """The file type llama-quantize's name ``text`` names (any case, its aliases too), or
    None."""
    upper = str(text).upper()
    return FILE_TYPES.get(ALIASES.get(upper, upper))


# --- the fallback for rows that are not whole blocks ----------------------------------------

#: The type llama.cpp falls back to, for each type that has one.
_FALLBACK = {
    **dict.fromkeys(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                     "IQ4_XS"), "IQ4_NL"),
    **dict.fromkeys(("Q2_K", "Q3_K", "TQ1_0", "TQ2_0"), "Q4_0"),
    "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
}


def _fits(qtype: str, ne0: int) -> bool:
    return ne0 % bg.TYPES[qtype].block_size == 0


def fallback(qtype: str, ne0: int) -> str | None:
    """The type a tensor of rows of ``ne0`` values gets when ``qtype`` is chosen for it:
    ``qtype`` itself when its blocks fit, else llama.cpp's fallback (F16 when that one does not
    fit either); None when ``qtype`` has no fallback (llama-quantize refuses the file)."""
    if _fits(qtype, ne0):
        return qtype
    other = _FALLBACK.get(qtype)
    if other is None:
        return None
    return other if _fits(other, ne0) else "F16"


# --- the model, from its metadata ---------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """What llama.cpp's rules read of a model: its architecture, layer count (the FFN
    counters' total), heads and KV heads of the first layer, experts, and whether it is the
    80-layer GQA llama (llama.cpp's "70B" type)."""

    arch: str = ""
    n_layer: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        return self.arch == "llama" and self.n_layer == 80 and self.n_head != self.n_head_kv

    @classmethod
    def from_metadata(cls, value: Callable[[str], Any], names: Sequence[str]) -> ModelFacts:
        """From a GGUF file's keys (``value(key)``: its value, a list for an array, None when
        absent); a missing layer count is taken from the ``blk.N.`` names."""
        arch = str(value("general.architecture") or "")

        def number(key: str) -> int:
            v = value(f"{arch}.{key}")
            if isinstance(v, (list, tuple)):  # per-layer counts: the first layer's, as llama.cpp
                v = v[0] if v else 0
            try:
                return int(v or 0)
            except (TypeError, ValueError):
                return 0

        n_layer = number("block_count")
        if not n_layer:
            n_layer = 1 + max((layer_of(n) for n in names), default=-1)
        n_head = number("attention.head_count")
        n_head_kv = number("attention.head_count_kv") if value(
            f"{arch}.attention.head_count_kv") is not None else n_head
        return cls(arch, n_layer, n_head, n_head_kv, number("expert_count"))


_LAYER = re.compile(r"blk\.[ \t\n\r\f\v]*([+-]?\d+)")


def layer_of(name: str) -> int:
    """The layer number of a ``blk.N.`` name as llama.cpp reads it (sscanf), else -1."""
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def llama_order(names: Sequence[str]) -> list[str]:
    """``names`` in llama.cpp's order of a model's weights: by layer (other tensors first),
    then by name."""
    return sorted(names, key=lambda n: (layer_of(n), n.encode("utf-8")))


# --- roles -----------------------------------------------------------------------------------------

TOKEN_EMBD, OUTPUT, ATTN_V, ATTN_K, ATTN_Q, ATTN_OUTPUT = (
    "token_embd", "output", "attn_v", "attn_k", "attn_q", "attn_output")
FFN_UP, FFN_GATE, FFN_DOWN, OTHER = "ffn_up", "ffn_gate", "ffn_down", "other"
#: Name parts and the role they give, tried in order (the fused QKV and MLA's KV-B count as
#: attention V: llama.cpp's attention-V rules catch them before any rule of their own).
_ROLES = (("attn_qkv.weight", ATTN_V), ("attn_kv_b.weight", ATTN_V), ("attn_v.weight", ATTN_V),
          ("attn_k.weight", ATTN_K), ("attn_q.weight", ATTN_Q),
          ("attn_output.weight", ATTN_OUTPUT), ("ffn_up", FFN_UP), ("ffn_gate", FFN_GATE),
          ("ffn_down", FFN_DOWN))


def category(name: str) -> str:
    """A tensor's role in llama.cpp's rules, from its GGUF name."""
    if name == "output.weight":
        return OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return TOKEN_EMBD
    return next((role for part, role in _ROLES if part in name), OTHER)


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's layers that get more bits: the first and last eighths, and every third
    layer between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# --- a mix, as asked for -------------------------------------------------------------------------


@dataclass(frozen=True)
class Mix:
    """What a GGUF output is asked to be: a file type (a ggml type naming none is a file of
    that one type, ``pure``), the per-tensor rules (``--rule`` / ``--tensor-type``: ggml types
    or keep), the output head's and token embeddings' types, and whether an importance matrix
    is given (some mixes choose differently with one)."""

    ftype: FileType
    pure: bool = False
    rules: tuple[Rule, ...] = ()
    output_type: str | None = None
    token_embd_type: str | None = None
    has_imatrix: bool = False

    @property
    def name(self) -> str:
        return self.ftype.name + (" (--pure)" if self.pure and self.ftype.name in FILE_TYPES
                                  else "")

    def rule_for(self, name: str) -> Rule | None:
        return matching_rule(self.rules, name)


@dataclass(frozen=True)
class MixOptions:
    """llama-quantize's options of a GGUF output, as the command and the API take them:
    ``pure`` (one type for every tensor), ``tensor_types`` (``PATTERN=TYPE`` texts, a regular
    expression searched in the name, lowercased as llama-quantize does), the output head's and
    the token embeddings' types."""

    pure: bool = False
    tensor_types: tuple[str, ...] = ()
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None

    def given(self) -> list[str]:
        """The options given, as the command spells them."""
        return [flag for flag, on in (
            ("--pure", self.pure), ("--tensor-type", self.tensor_types),
            ("--output-tensor-type", self.output_tensor_type is not None),
            ("--token-embedding-type", self.token_embedding_type is not None)) if on]

    def rules(self) -> tuple[tuple[str, str], ...]:
        """``tensor_types`` as (pattern, type) rules, split at the first ``=`` and the pattern
        lowercased, as llama-quantize reads them."""
        out = []
        for text in self.tensor_types:
            pattern, eq, qtype = str(text).partition("=")
            if not eq or not pattern or not qtype:
                raise CheckpointError("--tensor-type", None, f"{text!r} is not TENSOR=TYPE "
                                      "(a regular expression and a ggml type)")
            out.append((pattern.lower(), _ggml_name(qtype, "--tensor-type").lower()))
        return tuple(out)


def _ggml_name(text: Any, what: str) -> str:
    t = bg.TYPES.get(str(text).upper())
    if t is None:
        raise CheckpointError(what, None, f"{text!r} is not a ggml type blockquant writes "
                              f"({', '.join(n.lower() for n in bg.TYPES)})")
    return t.name


def resolve_mix(scheme: Any, *, pure: bool = False, rules: Sequence[Any] = (),
                output_type: Any = None, token_embd_type: Any = None,
                has_imatrix: bool = False) -> Mix:
    """The mix ``--scheme`` names (llama-quantize's file type names first, then a ggml type,
    which is a file of that one type), with the overrides checked; a CheckpointError naming
    the option otherwise. ``rules``: (regex, scheme) pairs, ``--rule``'s first, then
    ``--tensor-type``'s (:meth:`MixOptions.rules`)."""
    ft = file_type(scheme)
    if ft is None:
        t = bg.TYPES.get(str(scheme).upper())
        if t is None or t.name not in _SINGLE_TYPE_IDS:
            raise CheckpointError("--scheme", None, f"GGUF takes one of llama.cpp's file types "
                                  f"({', '.join(n for n, f in FILE_TYPES.items() if not f.missing)})"
                                  f" or a ggml type ({', '.join(n.lower() for n in bg.TYPES)}), "
                                  f"got {str(scheme)!r}")
        ft, pure = FileType(t.name, _SINGLE_TYPE_IDS[t.name], t.name), True
    elif ft.missing:
        raise CheckpointError("--scheme", None, f"{ft.name}: {ft.missing}")
    elif ft.name == "Q2_K_S" and not has_imatrix:
        raise CheckpointError("--scheme", None, "Q2_K_S is made with an importance matrix "
                              "(--imatrix FILE, llama-imatrix's), as llama-quantize requires; "
                              "Q2_K is the mix without one")
    compiled = compile_rules(tuple(rules))
    for r in compiled:
        if not r.keeps and (r.foreign is None or r.foreign.upper() not in bg.TYPES):
            raise CheckpointError("--rule", None, f"{r.text!r}: a GGUF output takes ggml types "
                                  f"({', '.join(n.lower() for n in bg.TYPES)}) or keep")
    return Mix(ft, pure, compiled,
               None if output_type is None else _ggml_name(output_type, "--output-tensor-type"),
               None if token_embd_type is None else _ggml_name(token_embd_type,
                                                               "--token-embedding-type"),
               has_imatrix)


# --- choosing the types ------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """A tensor's type under a mix (None: kept by a ``keep`` rule) and how it was chosen, in a
    few words (empty: the file type's default); ``fits`` is False when the type's blocks do not
    fit its rows and there is no fallback."""

    type: str | None
    how: str = ""
    fits: bool = True


@dataclass
class _Counters:
    n_attn_v: int = 0
    i_attn_v: int = 0
    i_ffn_down: int = 0
    tied: bool = True


@dataclass
class _Chooser:
    mix: Mix
    facts: ModelFacts
    where: Any
    c: _Counters = field(default_factory=_Counters)

    def layer(self, i: int, name: str) -> tuple[int, int]:
        n = self.facts.n_layer
        if max(1, self.facts.n_expert) > 1:  # experts: the layer from the name, as llama.cpp
            i = layer_of(name)
            if not _LAYER.match(name):
                raise CheckpointError(self.where, name, "a mixture-of-experts FFN tensor whose name "
                                      "has no layer number (blk.N.)")
            if not 0 <= i < n:
                raise CheckpointError(self.where, name, f"layer {i} is not below the model's "
                                      f"{n} layers")
        return i, n

    def mix_type(self, name: str, shape: tuple[int, ...], role: str) -> tuple[str, str]:
        """llama.cpp's choice for one tensor (the mix's own rules), and why in words."""
        f, new = self.mix.ftype.name, self.mix.ftype.default
        facts, c = self.facts, self.c
        falcon = facts.arch == "falcon"
        if role == OUTPUT or (c.tied and role == TOKEN_EMBD):
            if self.mix.output_type is not None:
                return self.mix.output_type, "--output-tensor-type (tied embeddings)"
            why = "output head" if role == OUTPUT else "token embeddings tied to the output"
            if f == "MXFP4_MOE" or falcon or not _fits(new, shape[-1]):
                return "Q8_0", why
            return (new, "") if new == "Q8_0" else ("Q6_K", why)
        if f == "MXFP4_MOE":  # experts (3-D, several) MXFP4, the rest Q8_0
            bailing = facts.arch == "bailingmoe3"
            expert = len(shape) >= 3 and shape[-3] > 1 and (
                not bailing or role in (FFN_UP, FFN_GATE, FFN_DOWN))
            return ("MXFP4", "experts") if expert else ("Q8_0", "not an expert tensor")
        if role == TOKEN_EMBD:
            return ("Q4_K", "token embeddings") if f in ("TQ1_0", "TQ2_0") else (new, "")
        if role == ATTN_V:
            i, n = c.i_attn_v, c.n_attn_v
            c.i_attn_v += 1
            why = f"attention V {i} of {n}"
            gqa = facts.n_gqa
            if f == "Q2_K":
                new = "Q4_K" if gqa >= 4 else "Q3_K"
            elif f == "Q2_K_S" and gqa >= 4:
                new = "Q4_K"
            elif f in ("IQ4_NL", "IQ4_XS") and gqa >= 4:
                new = "Q5_K"
            elif f == "Q3_K_M":
                new = "Q5_K" if i < 2 else "Q4_K"
            elif f == "Q3_K_L":
                new = "Q5_K"
            elif f in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
                new = "Q6_K"
            elif f == "Q4_K_S" and i < 4:
                new = "Q5_K"
            if facts.is_70b and new in ("Q3_K", "Q4_K"):
                new, why = "Q5_K", why + ", 70B GQA"
            if facts.n_expert == 8:
                new, why = "Q8_0", why + ", 8 experts"
            return new, why
        if role == ATTN_K:
            return ("Q8_0", "attention K, 8 experts") if facts.n_expert == 8 else (new, "")
        if role == FFN_DOWN:
            i, n = self.layer(c.i_ffn_down, name)
            c.i_ffn_down += 1
            more = use_more_bits(i, n)
            if f == "Q2_K":
                new = "Q3_K"
            elif f == "Q2_K_S":
                new = "Q4_K" if i < n // 8 else new
            elif f == "Q3_K_M":
                new = "Q5_K" if i < n // 16 else ("Q4_K" if not falcon or more else "Q3_K")
            elif f == "Q3_K_L":
                new = "Q4_K" if falcon else "Q5_K"
            elif f == "Q4_K_M":
                if falcon:
                    new = "Q6_K" if i < n // 16 else ("Q5_K" if more else "Q4_K")
                elif more:
                    new = "Q6_K"
            elif f in ("IQ4_NL", "IQ4_XS") and i < n // 8 and not self.mix.has_imatrix:
                new = "Q5_K"
            elif f == "Q5_K_M" and more:
                new = "Q6_K"
            elif f == "Q4_K_S" and not falcon and i < n // 8:
                new = "Q5_K"
            elif f in ("Q4_0", "Q5_0") and self.mix.has_imatrix and i < n // 8:
                new = "Q4_1" if f == "Q4_0" else "Q5_1"
            return new, f"FFN down, layer {i} of {n}"
        if role == ATTN_OUTPUT:
            if not falcon and facts.n_expert == 8:
                if f in ("Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS"):
                    new = "Q5_K"
            elif not falcon:
                new = {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(f, new)
            elif f == "Q3_K_L":
                new = "Q4_K"
            return new, "attention output"
        return new, ""


def choose_types(tensors: Sequence[tuple[str, tuple[int, ...]]], quantizable: set[str],
                 mix: Mix, facts: ModelFacts, where: Any = "GGUF") -> dict[str, Choice]:
    """The type of each tensor in ``quantizable`` (names; ``tensors`` are every tensor of the
    model, with numpy shapes) under ``mix``, in llama.cpp's order and by its rules. ``where``
    names the file in errors."""
    shapes = dict(tensors)
    chooser = _Chooser(mix, facts, where)
    names = [n for n, _ in tensors]
    chooser.c.n_attn_v = sum(category(n) == ATTN_V for n in names)
    chooser.c.tied = "output.weight" not in shapes
    quantized_default = not bg.TYPES[mix.ftype.default].is_float
    out: dict[str, Choice] = {}
    for name in llama_order([n for n in names if n in quantizable]):
        shape = shapes[name]
        role = category(name)
        if mix.token_embd_type is not None and role == TOKEN_EMBD:
            out[name] = _given(mix.token_embd_type, "--token-embedding-type", shape)
            continue
        if mix.output_type is not None and role == OUTPUT:
            out[name] = _given(mix.output_type, "--output-tensor-type", shape)
            continue
        new, how = mix.ftype.default, ""
        rule = mix.rule_for(name)
        if rule is not None:
            if rule.keeps:
                out[name] = Choice(None, f"--rule {rule.text}")
                continue
            new, how = _ggml_name(rule.foreign, "--rule"), f"--rule {rule.text}"
        elif quantized_default and not mix.pure:
            new, how = chooser.mix_type(name, shape, role)
            if new == mix.ftype.default:
                how = ""
        got = fallback(new, shape[-1] if shape else 0)
        if got is None:
            out[name] = Choice(new, how, fits=False)
        elif got != new:
            out[name] = Choice(got, (f"{how}; " if how else "") +
                               f"{new} does not fit rows of {shape[-1]}: fallback")
        else:
            out[name] = Choice(new, how)
    return out


def mix_of(scheme: Any, options: MixOptions, rules: Sequence[Any] = (),
           has_imatrix: bool = False) -> Mix:
    """The mix of ``--scheme`` with llama-quantize's ``options`` and blockquant's ``--rule``
    lines (tried first; then ``--tensor-type``'s, the first match winning)."""
    return resolve_mix(scheme, pure=options.pure, rules=(*rules, *options.rules()),
                       output_type=options.output_tensor_type,
                       token_embd_type=options.token_embedding_type, has_imatrix=has_imatrix)


def _given(qtype: str, flag: str, shape: tuple[int, ...]) -> Choice:
    return Choice(qtype, flag, fits=bool(shape) and _fits(qtype, shape[-1]))
