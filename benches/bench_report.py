"""benches/bench.py's tables and the targets checklist (issues 13 and 11), from its results."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

NAN = float("nan")


def print_table(rows: List[List[str]], header: List[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: List[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"

    print("\n".join([fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
                     *map(fmt, rows)]))


def _x(v: Optional[float], fmt: str = "{:.2f}") -> str:
    return "-" if v is None or v != v else fmt.format(v)


def _s(r: Dict, cell: str) -> Optional[float]:
    return r.get(f"{cell}_s")


def _ratio(r: Dict, slow: str, fast: str) -> Optional[float]:
    """How many times faster ``fast`` ran than ``slow`` (None when either is missing)."""
    a, b = _s(r, slow), _s(r, fast)
    return None if a is None or b is None else a / b


def print_cases(cases: List[Dict]) -> None:
    print("quantize: throughput relative to np.copyto on the same array (higher is faster); "
          "cpu/wall = process CPU time / wall time; 2T/1T = speed-up of the second thread; "
          "vs numpy / vs ref = times faster than the idiomatic numpy version / the bit-exact "
          "reference (blockquant on 1 thread); floor = the fastest any quantizer could be, "
          "reads × one read of the input (numpy's max), of copyto")
    print_table([[
        r["name"], _x((_s(r, "copyto") or NAN) * 1e3, "{:.2f}"),
        _x(r.get("bq_quantize_1t_of_copyto")), _x(r.get("bq_quantize_1t_cpu_per_wall"), "{:.1f}"),
        _x(r.get("bq_quantize_2t_of_copyto")), _x(r.get("bq_quantize_2t_cpu_per_wall"), "{:.1f}"),
        _x(_ratio(r, "bq_quantize_1t", "bq_quantize_2t")),
        _x(_ratio(r, "numpy_quantize", "bq_quantize_1t"), "{:.1f}x"),
        _x(_ratio(r, "ref_quantize", "bq_quantize_1t"), "{:.0f}x"),
        _x(r.get("numpy_bytes_equal"), "{:.3f}"), r["quantize_form"],
        _x(r.get("bq_quantize_new_1t_of_copyto")),
        f"{r.get('reads', 1)} × " + _x(r.get("read_of_copyto")) if "read_s" in r else "-",
    ] for r in cases], ["scheme", "copyto ms", "1T of copyto", "cpu/wall", "2T of copyto",
                        "cpu/wall", "2T/1T", "vs numpy", "vs ref", "numpy bytes = bq", "output",
                        "new arrays 1T of copyto", "floor: reads × read of copyto"])
    print("\ndequantize into a caller-given float32 array (out=), and into a new one; floor = "
          "the fastest any dequantize into the array could be, one write of it (libc's memset), "
          "of copyto:")
    print_table([[
        r["name"],
        _x(r.get("bq_dequantize_1t_of_copyto")), _x(r.get("bq_dequantize_1t_cpu_per_wall"), "{:.1f}"),
        _x(r.get("bq_dequantize_2t_of_copyto")), _x(r.get("bq_dequantize_2t_cpu_per_wall"), "{:.1f}"),
        _x(_ratio(r, "bq_dequantize_1t", "bq_dequantize_2t")),
        _x(r.get("bq_dequantize_new_1t_of_copyto")),
        _x(_ratio(r, "numpy_dequantize", "bq_dequantize_1t"), "{:.1f}x"),
        _x(_ratio(r, "ref_dequantize", "bq_dequantize_1t"), "{:.0f}x"),
        _x(r.get("write_of_copyto")),
    ] for r in cases], ["scheme", "out= 1T of copyto", "cpu/wall", "out= 2T of copyto", "cpu/wall",
                        "2T/1T", "new array 1T of copyto", "vs numpy", "vs ref",
                        "floor: one write of copyto"])
    torch_rows = []
    for r in cases:
        for op in ("quantize", "dequantize"):
            if f"torch_{op}_1t_s" not in r:
                continue
            torch_rows.append([
                r["name"], op, _x(r.get(f"torch_{op}_1t_of_copyto")),
                _x(r.get(f"torch_{op}_2t_of_copyto")), _x(r.get(f"torch_{op}_2t_cpu_per_wall"), "{:.1f}"),
                _x(_ratio(r, f"torch_{op}_1t", f"bq_{op}_1t")),
                _x(_ratio(r, f"torch_{op}_2t", f"bq_{op}_2t")),
            ])
    if torch_rows:
        print("\ntorch's CPU kernels (quantize_per_tensor qint8; .to(float8_e4m3fn); dequantize: "
              "qtensor.dequantize() allocates, fp8 copies into a preallocated tensor):")
        print_table(torch_rows, ["scheme", "op", "torch 1T of copyto", "torch 2T of copyto",
                                 "cpu/wall", "blockquant/torch 1T", "blockquant/torch 2T"])


def _target(what: str, value: Optional[float], goal: float, group: Optional[Dict] = None,
            cells: Sequence[str] = ()) -> Dict:
    """One checklist line. ``cells``: the group's calls the ratio is made of, whose CPU time /
    wall time says whether the process had its cores while they ran."""
    ok = None if value is None or value != value else bool(value >= goal)
    t = dict(target=what, goal=goal, measured=value, ok=ok, unit="x")
    starved = _starved(group, cells)
    if ok is not None and starved is not None:
        t["note"] = f"noisy: {starved[0]} had {starved[1]:.2f} of a core"
    return t


def _starved(group: Optional[Dict], keys: Sequence[str]) -> Optional[Tuple[str, float]]:
    """The call among ``keys`` with the least CPU time / wall time, when that is below 0.8: the
    process then waited for a core (a busy machine; even a 1-thread call keeps one core busy)
    and a ratio made from it is not to be trusted."""
    cells = (group or {}).get("cells", {})
    ratios = [(k, cells[k]["cpu_per_wall"]) for k in keys
              if k in cells and cells[k]["cpu_per_wall"] == cells[k]["cpu_per_wall"]]
    worst = min(ratios, key=lambda kv: kv[1], default=None)
    return worst if worst is not None and worst[1] < 0.8 else None


def targets(results: Dict) -> List[Dict]:
    """The issue targets, each with the measured ratio (ok None: not measured in this run)."""
    out: List[Dict] = []
    cases = results.get("cases", [])
    b32 = next((r for r in cases if r["name"].startswith("int8_block32")), None)
    if b32 is not None:
        out.append(_target("#13 block-32 int8 (F16) quantize 1T ≥ 1.4× copyto",
                           b32.get("bq_quantize_1t_of_copyto"), 1.4, b32, ["copyto", "bq_quantize_1t"]))
        out.append(_speedup_beyond_floor(_target(
            "#13 block-32 int8 (F16) quantize 2T ≥ 1.7× its 1T",
            _ratio(b32, "bq_quantize_1t", "bq_quantize_2t"), 1.7, b32,
            ["bq_quantize_1t", "bq_quantize_2t"]), b32))
    # "Every preset's" targets: a row that is no preset (a bare E4M3 cast, 128×128 blocks) has
    # its ratios in the tables, not in these lines.
    presets = [r for r in cases if r.get("preset", True)]
    for r in presets:
        out.append(_searched(_beyond_floor(_target(f"#13 {r['name']}: quantize 1T ≥ 0.8× copyto",
                                                   r.get("bq_quantize_1t_of_copyto"), 0.8, r,
                                                   ["copyto", "bq_quantize_1t"]), r, "copyto"), r))
    for r in cases:
        if r["name"].startswith(("int8 (per-tensor, scale", "E4M3")):  # the two torch targets
            peer = "torch quantize_per_tensor" if "int8" in r["name"] else "torch fp8 cast"
            for t in (1, 2):
                keys = [f"torch_quantize_{t}t", f"bq_quantize_{t}t"]
                out.append(_target(f"#13 {r['name']}: quantize {t}T ≥ {peer} {t}T",
                                   _ratio(r, *keys), 1.0, r, keys))
    for r in cases:
        goal = 1.5 if r["bits"] == 8 else 1.0
        out.append(_target(f"#13 {r['name']}: dequantize into out= 1T ≥ {goal}× copyto",
                           r.get("bq_dequantize_1t_of_copyto"), goal, r,
                           ["copyto", "bq_dequantize_1t"]))
    for r in presets:
        for op, goal in (("quantize", 10.0), ("dequantize", 2.5)):
            keys = [f"numpy_{op}", f"bq_{op}_1t"]
            t = _target(f"#13 {r['name']}: {op} 1T ≥ {goal:g}× idiomatic numpy",
                        _ratio(r, *keys), goal, r, keys)
            if t["ok"] is None and "numpy_quantize" not in r.get("cells", {}):
                t["note"] = "no numpy version of this scheme in benches/bench_numpy.py"
            out.append(_beyond_floor(t, r, "numpy_quantize") if op == "quantize"
                       else _beyond_write(t, r, "numpy_dequantize"))
    for r in results.get("ggml", []):
        goal = 1.4 if r["type"] == "Q8_0" else 0.6
        for op, g in (("quantize", goal), ("dequantize", 1.0)):
            what = "quantize" if op == "quantize" else "dequantize into out"
            out.append(_target(f"#11 {r['type']}: {what} 1T ≥ {g}× copyto",
                               r.get(f"bq_{op}_1t_of_copyto"), g, r, ["copyto", f"bq_{op}_1t"]))
        for op in ("quantize", "dequantize"):
            t = _target(f"#11 {r['type']}: {op} ≥ 20× gguf-py", r.get(f"vs_gguf_{op}"), 20.0,
                        r.get("vs_gguf_cells"), [f"gguf_{op}", f"bq_{op}"])
            if "bit_exact" in r and t["ok"] is None:
                t["note"] = "gguf-py returns its input unchanged: nothing to time"
            out.append(t)
    return out


def _searched(t: Dict, r: Dict) -> Dict:
    """Says, on a missed target of a preset whose scales are searched, what its search costs:
    its time in multiples of the same scheme quantized with minmax's scales (issue 14 budgets a
    search that way), and how fast minmax alone is. The miss stays a miss."""
    one, mm = _s(r, "bq_quantize_1t"), _s(r, "bq_quantize_minmax_1t")
    if t["ok"] is False and None not in (one, mm):
        t["note"] = (f"searched scales: {one / mm:.1f}× the time of the same scheme with "
                     f"minmax's, which runs at {r['bq_quantize_minmax_1t_of_copyto']:.2f}× copyto"
                     + (f"; {t['note']}" if t.get("note") else ""))
    return t


def _beyond_floor(t: Dict, r: Dict, slow: str) -> Dict:
    """Marks a missed quantize target that no quantizer could meet on this machine: the
    input's ``reads`` reads alone (at numpy's max's pace) take longer than ``slow`` (copyto or
    numpy's version) / goal, and the call itself is within 20% of that floor (a call far slower
    than the floor is a miss of its own, however low the floor)."""
    floor = _s(r, "read")
    slow_s = _s(r, slow)
    if t["ok"] is False and floor is not None and slow_s is not None:
        reachable = slow_s / (r.get("reads", 1) * floor)
        if reachable < t["goal"]:
            reads = ("one read of the input takes" if r.get("reads", 1) == 1
                     else f"{r['reads']} reads of the input take")
            near = t["measured"] >= 0.8 * reachable
            t["bound"] = near
            t["note"] = ((f"beyond the floor: {reads} 1/{reachable:.2f} of {slow}'s time"
                          if near else f"the floor ({reads} 1/{reachable:.2f} of {slow}'s "
                          "time) is below the goal too, but this call is far from the floor")
                         + (f"; {t['note']}" if t.get("note") else ""))
    return t


def _beyond_write(t: Dict, r: Dict, slow: str) -> Dict:
    """Marks a missed dequantize target that no dequantize into a float32 array could meet: one
    write of that array alone (libc's memset) takes longer than ``slow`` / goal, and the call
    is within 20% of that write (reading the codes, a quarter of the bytes or less, overlaps
    it)."""
    floor, slow_s = _s(r, "write"), _s(r, slow)
    if t["ok"] is False and floor is not None and slow_s is not None:
        reachable = slow_s / floor
        if reachable < t["goal"]:
            near = t["measured"] >= 0.8 * reachable
            t["bound"] = near
            t["note"] = ((f"beyond the floor: one write of the output takes 1/{reachable:.2f} "
                          f"of {slow}'s time" if near else
                          f"the floor (one write of the output, 1/{reachable:.2f} of {slow}'s "
                          "time) is below the goal too, but this call is far from the floor")
                         + (f"; {t['note']}" if t.get("note") else ""))
    return t


def _speedup_beyond_floor(t: Dict, r: Dict) -> Dict:
    """Marks a missed 2-thread speed-up that the memory forbids: no call is faster than its
    ``reads`` reads of the input, so two threads can gain at most (1-thread time) / (that
    floor); when that is below the goal and the 2-thread call is within 20% of the floor, the
    second thread had nothing left to win."""
    floor, one, two = _s(r, "read"), _s(r, "bq_quantize_1t"), _s(r, "bq_quantize_2t")
    if t["ok"] is False and None not in (floor, one, two):
        floor *= r.get("reads", 1)
        most = one / floor
        if most < t["goal"] and two <= 1.25 * floor:
            t["bound"] = True
            t["note"] = (f"beyond the floor: 1T is already 1/{most:.2f} of the input's reads "
                         f"away from them, 2T at {floor / two:.2f} of their pace"
                         + (f"; {t['note']}" if t.get("note") else ""))
    return t


def print_targets(ts: List[Dict]) -> None:
    met = sum(t["ok"] is True for t in ts)
    bound = sum(bool(t.get("bound")) for t in ts)
    missed = sum(t["ok"] is False for t in ts) - bound
    noisy = sum("noisy" in t.get("note", "") for t in ts)
    print(f"\ntargets (issues 13 and 11; ratios from this run): {met} met, {missed} missed, "
          f"{bound} beyond what the memory allows, {len(ts) - met - missed - bound} not measured; "
          f"{noisy} measured while the process waited for a core (re-run those on a quiet "
          "machine)")
    width = max((len(t["target"]) for t in ts), default=0)
    for t in ts:
        mark = "[BOUND]" if t.get("bound") else {True: "[ok]   ", False: "[MISS] ",
                                                  None: "[ -- ]  "}[t["ok"]]
        value = "not measured" if t["ok"] is None else f"{t['measured']:.2f}{t['unit']}"
        note = f"  ({t['note']})" if t.get("note") else ""
        print(f"  {mark} {t['target'].ljust(width)}  {value}{note}")
