"""The choice of a size-target plan: per tensor the candidate that minimises the model's total
(importance-weighted) squared error with the total size at or under ``target_bpw`` bits a weight
(:func:`allocate`), and the plan as a rules file ``quantize --rules-file`` takes.

Each unit (a tensor, or a fused set deciding together) keeps only its Pareto candidates (fewer
bits or less error). Two allocations are made and the one with less error kept:

- **exact**: the multiple-choice knapsack solved by dynamic programming over sizes in units of
  their greatest common divisor, when the budget holds at most N of those (N = min(400000,
  2·10^8 / units)); else over sizes rounded up to 1/N of the budget, the budget that rounding
  left over then spent by the Lagrangian steps below;
- **Lagrangian**: the candidates on each unit's lower convex hull of (bits, error); every unit
  starts at its smallest, and the step with the largest error saved per bit added is taken,
  next and next, while it fits (a step that does not fit is passed over for smaller ones).

The first is optimal (up to the rounding of sizes, when they have to be rounded); the second is
optimal at each budget its steps land on. Constraints: fused sets (q/k/v,
gate/up, w1/w3, query/key/value: vLLM runs each as one matrix) share one candidate; ``floors``
(regular expression → least bits a weight: the output head and the token embeddings by default)
take away the candidates below them (leaving the largest if none is above); ``keep`` keeps
tensors in float (counted at their size). Sizes: bits = 8 × stored bytes (codes, scales,
offsets); bits a weight over every tensor the plan decides, those kept in float included.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import CheckpointError
from .ct_folder import fused_key
from .plan_measure import TensorMeasure

#: Default floors: the output head at 6 bits a weight and the token embeddings at 4, as
#: llama.cpp's mixes give them more bits than the rest.
DEFAULT_FLOORS = ((r"(^|\.)(lm_head|output)\.weight$", 6.0),
                  (r"(embed_tokens|token_embd|word_embeddings|wte)\.weight$", 4.0))
KEEP = "keep"


@dataclass
class Unit:
    """Tensors decided together (one, or a fused set): their candidates' summed (bits, error)
    and the convex hull of those; none when the unit stays in float (``fixed_bits``)."""

    names: list[str]
    options: dict[str, tuple[int, float]]
    fixed_bits: int = 0  # the unit is kept in float: its bits
    hull: list[tuple[str, int, float]] = field(default_factory=list)

    @property
    def least_bits(self) -> int:
        return self.hull[0][1] if self.hull else self.fixed_bits


@dataclass
class PlanResult:
    """The chosen candidate of every planned tensor (None: kept in float), with the totals."""

    target_bpw: float
    choice: dict[str, str | None]
    measures: dict[str, TensorMeasure]
    why_kept: dict[str, str]

    @property
    def numel(self) -> int:
        return sum(m.numel for m in self.measures.values())

    def bits_of(self, name: str) -> int:
        c, m = self.choice[name], self.measures[name]
        return 8 * (m.float_bytes if c is None else m.options[c][0])

    def error_of(self, name: str) -> float:
        c = self.choice[name]
        return 0.0 if c is None else self.measures[name].options[c][1]

    @property
    def bpw(self) -> float:
        return sum(self.bits_of(n) for n in self.choice) / max(self.numel, 1)

    @property
    def sqnr_db(self) -> float:
        signal = sum(m.signal for m in self.measures.values())
        noise = sum(self.error_of(n) for n in self.choice)
        return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def _hull(options: dict[str, tuple[int, float]]) -> list[tuple[str, int, float]]:
    """The candidates on the lower convex hull of (bits, error), by bits: each one more bits
    than the last and less error, at a falling price (error saved per bit)."""
    pts = sorted(((b, e, n) for n, (b, e) in options.items()), key=lambda p: (p[0], p[1]))
    frontier: list[tuple[int, float, str]] = []
    for b, e, n in pts:  # Pareto: fewer bits or less error
        if frontier and e >= frontier[-1][1]:
            continue
        if frontier and b == frontier[-1][0]:
            frontier.pop()
        frontier.append((b, e, n))
    hull: list[tuple[int, float, str]] = []
    for p in frontier:
        while len(hull) >= 2:
            (b1, e1, _), (b2, e2, _) = hull[-2], hull[-1]
            # drop the middle point when it lies on or above the line from hull[-2] to p
            if (e1 - e2) * (p[0] - b2) <= (e2 - p[1]) * (b2 - b1):
                hull.pop()
            else:
                break
        hull.append(p)
    return [(n, b, e) for b, e, n in hull]


def units(measures: list[TensorMeasure], floors: tuple[tuple[re.Pattern[str], float], ...],
          keep: tuple[re.Pattern[str], ...]) -> tuple[list[Unit], dict[str, str]]:
    """The units to decide (module docstring) and why each tensor kept in float is kept."""
    why: dict[str, str] = {}
    groups: dict[str, list[TensorMeasure]] = {}
    for m in measures:
        module = m.name[: -len(".weight")] if m.name.endswith(".weight") else m.name
        key = fused_key(module)
        groups.setdefault(key[0] if key else m.name, []).append(m)
    out = []
    for members in groups.values():
        names = [m.name for m in members]
        kept = next((m.name for m in members if any(p.search(m.name) for p in keep)), None)
        shared = set.intersection(*(set(m.options) for m in members))
        floor = max((f for m in members for p, f in floors if p.search(m.name)), default=0.0)
        numel = sum(m.numel for m in members)
        opts = {c: (8 * sum(m.options[c][0] for m in members),
                    sum(m.options[c][1] for m in members)) for c in shared}
        if floor > 0 and opts:
            above = {c: v for c, v in opts.items() if v[0] >= floor * numel}
            opts = above or dict([max(opts.items(), key=lambda kv: kv[1][0])])
        fixed = 8 * sum(m.float_bytes for m in members)
        if kept is not None or not opts:
            reason = f"--keep ({kept})" if kept is not None else "no candidate takes it" + (
                f" with the others of its fused set ({', '.join(names)})" if len(names) > 1
                else "")
            why.update({n: reason for n in names})
            out.append(Unit(names, {}, fixed))
            continue
        u = Unit(names, opts, fixed)
        u.hull = _hull(opts)
        out.append(u)
    return out, why


def allocate(measures: list[TensorMeasure], target_bpw: float,
             floors: tuple[tuple[re.Pattern[str], float], ...] = (),
             keep: tuple[re.Pattern[str], ...] = ()) -> PlanResult:
    """Choose (module docstring). A target below the smallest plan the candidates allow is a
    CheckpointError saying how small that is."""
    if not (isinstance(target_bpw, (int, float)) and math.isfinite(target_bpw)
            and target_bpw > 0):
        raise CheckpointError("--target-bpw", None, f"{target_bpw!r} is not a positive number "
                              "of bits a weight")
    us, why = units(measures, floors, keep)
    numel = sum(m.numel for m in measures)
    budget = target_bpw * numel
    used = sum(u.least_bits for u in us)
    if used > budget + 1e-9:
        raise CheckpointError("--target-bpw", None, f"{target_bpw} bits a weight is below the "
                              f"smallest plan these candidates and floors allow "
                              f"({used / max(numel, 1):.3f})")
    live = [u for u in us if u.hull]
    fixed = sum(u.fixed_bits for u in us if not u.hull)
    lagrange = _lagrangian(live, budget - fixed, {id(u): u.hull[0][0] for u in live})
    exact = _knapsack(live, budget - fixed)
    best = min((p for p in (lagrange, exact) if p is not None),
               key=lambda p: sum(u.options[p[id(u)]][1] for u in live))
    by_name = {m.name: m for m in measures}
    choice: dict[str, str | None] = {}
    for u in us:
        for n in u.names:
            choice[n] = best[id(u)] if u.hull else None
    return PlanResult(float(target_bpw), choice, by_name, why)


def _lagrangian(live: list[Unit], budget: float, start: dict[int, str]) -> dict[int, str]:
    """Each unit from its ``start`` candidate up its convex hull, steps by error saved per bit
    while they fit (module docstring). Returns unit id -> candidate."""
    at: dict[int, str] = dict(start)
    used = sum(u.options[at[id(u)]][0] for u in live)
    heap: list[tuple[float, int, str]] = []
    hulls = {id(u): _hull(u.options) for u in live}

    def push(i: int) -> None:
        u = live[i]
        name = at[id(u)]
        b0, e0 = u.options[name]
        # the hull points above the current choice (which may lie off the hull)
        slopes = [(e0 - e) / (b - b0) for _, b, e in hulls[id(u)] if b > b0 and e < e0]
        if slopes:
            heapq.heappush(heap, (-min(slopes), i, name))

    for i in range(len(live)):
        push(i)
    while heap:
        _, i, name = heapq.heappop(heap)
        u = live[i]
        if at[id(u)] != name:
            continue
        b0, e0 = u.options[name]
        ups = sorted(((e0 - e) / (b - b0), n) for n, (b, e) in u.options.items()
                     if b > b0 and e < e0 and used + b - b0 <= budget + 1e-9)
        if not ups:
            continue
        _, n = ups[-1]
        used += u.options[n][0] - b0
        at[id(u)] = n
        push(i)
    return at


def _knapsack(live: list[Unit], budget: float) -> dict[int, str] | None:
    """The exact multiple-choice knapsack on sizes rounded up to 1/N of the budget, the rest
    of the budget then spent by :func:`_lagrangian`; None when the rounded sizes do not fit."""
    if not live or budget <= 0:
        return None
    cap = int(min(400_000, max(1_000, 2e8 / len(live))))
    # Sizes in units of their greatest common divisor are exact when the budget holds few
    # enough of them; else in 1/cap of the budget, rounded up.
    unit = functools.reduce(math.gcd, (b for u in live for b, _ in u.options.values()), 0)
    if unit > 0 and budget // unit <= cap:
        n, g = int(budget // unit), float(unit)
    else:
        n, g = cap, budget / cap
    dp = np.zeros(n + 1)  # least error with at most k units of size used
    picks = []
    for u in live:
        names = list(u.options)
        cost = [int(math.ceil(u.options[c][0] / g - 1e-9)) for c in names]
        best = np.full(n + 1, np.inf)
        pick = np.zeros(n + 1, np.int8)
        for j, c in enumerate(names):
            k = cost[j]
            if k > n:
                continue
            cand = np.full(n + 1, np.inf)
            cand[k:] = dp[: n + 1 - k] + u.options[c][1]
            better = cand < best
            best[better] = cand[better]
            pick[better] = j
        picks.append((names, cost, pick))
        dp = best
    if not np.isfinite(dp[n]):
        return None
    k = n
    out: dict[int, str] = {}
    for u, (names, cost, pick) in zip(reversed(live), reversed(picks)):
        j = int(pick[k])
        out[id(u)] = names[j]
        k -= cost[j]
    return _lagrangian(live, budget, out)


def uniform(measures: list[TensorMeasure], candidate: str) -> PlanResult:
    """Every tensor at ``candidate`` (those it cannot take in float): the plan a plain
    ``--scheme`` gives, to compare with."""
    choice = {m.name: (candidate if candidate in m.options else None) for m in measures}
    why = {n: f"{candidate} cannot take it" for n, c in choice.items() if c is None}
    return PlanResult(0.0, choice, {m.name: m for m in measures}, why)


def rules_text(result: PlanResult, header: list[str], names: dict[str, str] | None = None
               ) -> str:
    """The plan as a rules file: one ``^NAME$=CHOICE`` line a tensor (``keep`` for float),
    after ``#`` comment lines; ``quantize --rules-file`` reads it. ``names``: the name the
    output's rules see a tensor by, where it is not its own."""
    lines = [f"# {h}" for h in header]
    for name, c in result.choice.items():
        shown = (names or {}).get(name, name)
        lines.append(f"^{re.escape(shown)}$={c if c is not None else KEEP}")
    return "\n".join(lines) + "\n"


def read_rules_file(path: Any) -> list[str]:
    """``REGEX=SCHEME`` lines of a rules file (blank lines and ``#`` comments skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(50_000_001)
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(path, None, f"cannot be read as a rules file ({e})") from None
    if len(text) > 50_000_000:
        raise CheckpointError(path, None, "is over 50 MB: not a rules file")
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise CheckpointError(path, None, f"line {i} is not REGEX=SCHEME: {line[:80]!r}")
        out.append(line)
    return out
