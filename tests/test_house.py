"""The shape of the house, read from the sources: no import cycle, no file past the size guide.

Python modules are joined by their imports (``import``/``from`` anywhere in a module, function
bodies and ``TYPE_CHECKING`` blocks included); Rust files by the ``crate::``/``super::``/``self::``
paths they name. Test files and inline ``#[cfg(test)]`` modules are left out: they may reach
anywhere. ``python tests/test_house.py`` prints the graph's cycles and the largest files.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / "python"
RUST_CRATES = sorted(p for p in (ROOT / "rust").iterdir() if (p / "src" / "lib.rs").exists())
# Lines of code (not blank, not only a comment) a source file may hold.
MAX_CODE_LINES = 800


# --- Python ------------------------------------------------------------------------------------


def _py_module_name(path: Path) -> str:
    parts = list(path.relative_to(PYTHON).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_modules() -> dict[str, Path]:
    return {_py_module_name(p): p for p in sorted(PYTHON.rglob("*.py"))}


def _resolve_py(name: str, modules: dict[str, Path]) -> str | None:
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def python_graph() -> dict[str, set[str]]:
    modules = python_modules()
    # Extension modules (a stub beside them) are leaves: importing one ties to nothing here.
    extensions = {_py_module_name(p.with_suffix(".py")) for p in PYTHON.rglob("*.pyi")} - set(modules)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                # `from pkg import sub` names the submodule when there is one.
                targets = [f"{prefix}.{a.name}" for a in node.names] or [prefix]
                targets = [t if t in modules or t in extensions else prefix for t in targets]
            for target in targets:
                if target in extensions:
                    continue
                resolved = _resolve_py(target, modules)
                if resolved is not None and resolved != mod:
                    graph[mod].add(resolved)
    return graph


# --- Rust ----------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""//[^\n]*|/\*.*?\*/|r(\#*)".*?"\1|b?"(?:\\.|[^"\\])*"|b?'(?:\\.|[^'\\\n])'""",
    re.S,
)


def _strip_rust(text: str) -> str:
    """The source with comments, strings and char literals blanked (line breaks kept)."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return _TOKEN.sub(blank, text)


def _drop_inline_tests(code: str) -> str:
    """Blanks each `#[cfg(test)]` item (an inline test module or test-only helper)."""
    out = list(code)
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        i = m.end()
        depth = 0
        while i < len(code):
            c = code[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    i += 1
                    break
            elif c == ";" and depth == 0:
                i += 1
                break
            i += 1
        for j in range(m.start(), i):
            if out[j] != "\n":
                out[j] = " "
    return "".join(out)


def _rust_module_files(crate: Path) -> dict[tuple[str, ...], Path]:
    """Module path -> file, following `mod x;` declarations (and `#[path]`) from lib.rs."""
    files: dict[tuple[str, ...], Path] = {}

    def visit(path: tuple[str, ...], file: Path, dir_of_children: Path) -> None:
        files[path] = file
        code = _drop_inline_tests(_strip_rust(file.read_text(encoding="utf-8")))
        for m in re.finditer(r"(#\[path\s*=\s*\"([^\"]+)\"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", code):
            raw = file.read_text(encoding="utf-8")[m.start() : m.end()]
            explicit = re.search(r'#\[path\s*=\s*"([^"]+)"\]', raw)
            name = m.group(3)
            if explicit:
                child = file.parent / explicit.group(1)
                visit(path + (name,), child, child.parent / child.stem)
                continue
            for child, child_dir in (
                (dir_of_children / f"{name}.rs", dir_of_children / name),
                (dir_of_children / name / "mod.rs", dir_of_children / name),
            ):
                if child.exists():
                    visit(path + (name,), child, child_dir)
                    break

    src = crate / "src"
    visit((), src / "lib.rs", src)
    return files


_PATH = re.compile(r"\b(crate|super|self)((?:\s*::\s*(?:\w+|\{))+)")


def _expand_use(code: str, start: int) -> list[list[str]]:
    """Every path a `use`/path expression starting at `start` names, braces expanded."""
    # Take the text of the path up to its end (`;`, whitespace outside braces, or `(`).
    depth = 0
    i = start
    while i < len(code):
        c = code[i]
        if c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (c in ";(),<>=!&|+*[]" or c.isspace() and not code[i:].lstrip().startswith("::")
                             and not code[:i].rstrip().endswith("::")):
            break
        i += 1
    text = re.sub(r"\s+", "", code[start:i])
    return _expand(text)


def _expand(text: str) -> list[list[str]]:
    if "{" not in text:
        return [[p for p in text.split("::") if p]]
    head, _, rest = text.partition("{")
    inner = rest[: rest.rfind("}")]
    parts, depth, cur = [], 0, ""
    for c in inner:
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += c == "{"
        depth -= c == "}"
        cur += c
    parts.append(cur)
    prefix = [p for p in head.split("::") if p]
    out = []
    for part in parts:
        part = part.strip().split(" as ")[0].strip()
        if part:
            for sub in _expand(part):
                out.append(prefix + sub)
        else:
            out.append(prefix)
    return out


def rust_graph(crate: Path) -> dict[str, set[str]]:
    files = _rust_module_files(crate)
    by_path = {path: file for path, file in files.items()}
    tests = {p for p, f in files.items() if _is_test_file(f)}
    name = {p: str(f.relative_to(ROOT)) for p, f in files.items()}
    graph: dict[str, set[str]] = {name[p]: set() for p in files if p not in tests}
    for mpath, file in files.items():
        if mpath in tests:
            continue
        code = _drop_inline_tests(_strip_rust(file.read_text(encoding="utf-8")))
        children = {p[-1] for p in files if p[:-1] == mpath and p != mpath}
        starts = [m.start() for m in _PATH.finditer(code)]
        if children:
            # A path that starts at a child module (`use legacy::Q4_0;`, `legacy::run(..)`).
            bare = re.compile(r"(?<![\w:])(" + "|".join(sorted(children)) + r")\s*::")
            starts += [m.start() for m in bare.finditer(code)]
        inline = _inline_modules(code)
        for start in starts:
            depth = sum(a < start < b for a, b in inline)
            for segs in _expand_use(code, start):
                if segs and segs[0] in children:
                    segs = ["self"] + segs
                # Inside `mod lanes { ... }` a `super` names this file's own module.
                k = 0
                while k < min(depth, len(segs)) and segs[k] == "super":
                    k += 1
                if k:
                    segs = segs[k:] if segs[k:k + 1] == ["super"] else ["self"] + segs[k:]
                target = _resolve_rust(mpath, segs, by_path)
                if target is not None and target != mpath and target not in tests:
                    graph[name[mpath]].add(name[target])
    return graph


def _inline_modules(code: str) -> list[tuple[int, int]]:
    """The spans (opening brace, closing brace) of the modules written inline in a file
    (``mod lanes { ... }``), comments and strings already stripped."""
    spans = []
    for m in re.finditer(r"\bmod\s+\w+\s*\{", code):
        depth, i = 0, m.end() - 1
        while i < len(code):
            depth += code[i] == "{"
            depth -= code[i] == "}"
            if depth == 0:
                break
            i += 1
        spans.append((m.end() - 1, i))
    return spans


def _resolve_rust(here: tuple[str, ...], segs: list[str], files: dict) -> tuple[str, ...] | None:
    if not segs:
        return None
    path: tuple[str, ...]
    head, rest = segs[0], segs[1:]
    if head == "crate":
        path = ()
    elif head == "self":
        path = here
    else:  # super, possibly repeated
        path = here
        while segs and segs[0] == "super":
            path = path[:-1]
            segs = segs[1:]
        rest = segs
    # The longest module prefix that is a file of its own.
    best = path if path in files else None
    for seg in rest:
        if seg in ("self", "*"):
            break
        path = path + (seg,)
        if path in files:
            best = path
        else:
            break
    return best


def _is_test_file(file: Path) -> bool:
    return file.name == "tests.rs" or file.stem.endswith("_tests")


# --- cycles and sizes ---------------------------------------------------------------------------


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def describe(graph: dict[str, set[str]], comp: list[str]) -> str:
    members = set(comp)
    arrows = [f"  {a} -> {b}" for a in comp for b in sorted(graph[a]) if b in members]
    return f"{len(comp)} files: " + ", ".join(comp) + "\n" + "\n".join(arrows)


def code_lines(path: Path) -> int:
    comment = "//" if path.suffix == ".rs" else "#"
    return sum(
        1
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.strip().startswith(comment)
    )


def source_files() -> list[Path]:
    roots = [PYTHON, ROOT / "tests", ROOT / "benches", ROOT / "rust"]
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.suffix in (".py", ".rs") and "target" not in path.parts:
                found.append(path)
    return sorted(found)


# --- the tests ----------------------------------------------------------------------------------


def test_python_modules_import_without_cycles():
    graph = python_graph()
    assert "blockquant" in graph and graph["blockquant"], "the import graph was not read"
    found = cycles(graph)
    assert not found, "Python import cycles:\n" + "\n".join(describe(graph, c) for c in found)


def test_rust_modules_use_without_cycles():
    for crate in RUST_CRATES:
        graph = rust_graph(crate)
        assert len(graph) > 1 or crate.name != "blockquant-core", "the module tree was not read"
        found = cycles(graph)
        assert not found, f"{crate.name} module cycles:\n" + "\n".join(
            describe(graph, c) for c in found
        )


def test_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_super_inside_an_inline_module_names_its_own_file():
    code = "mod lanes {\n    use super::{Ctx, MAX};\n    fn f() { super::super::g(); }\n}\n"
    (a, b), = _inline_modules(code)
    assert code[a] == "{" and code[b] == "}" and a < code.index("super") < b


def test_rust_paths_are_read_through_braces_and_super():
    segs = _expand("crate::{pack::{Word, encode_run}, simd::x86}")
    assert segs == [["crate", "pack", "Word"], ["crate", "pack", "encode_run"], ["crate", "simd", "x86"]]
    files = {(): 0, ("ggml",): 1, ("ggml", "legacy"): 2}
    assert _resolve_rust(("ggml", "legacy"), ["super", "Block"], files) == ("ggml",)
    assert _resolve_rust(("ggml",), ["self", "legacy", "Q4_0"], files) == ("ggml", "legacy")
    code = _drop_inline_tests(_strip_rust('#[cfg(test)]\nmod tests { use crate::x; "}" }\nuse crate::y;'))
    assert "crate::x" not in code and "crate::y" in code


def test_no_source_file_past_the_size_guide():
    over = [
        f"{p.relative_to(ROOT)}: {n} lines of code"
        for p in source_files()
        if (n := code_lines(p)) > MAX_CODE_LINES
    ]
    assert not over, f"files over {MAX_CODE_LINES} lines of code:\n" + "\n".join(over)


if __name__ == "__main__":
    py = python_graph()
    for comp in cycles(py):
        print("python cycle:", describe(py, comp))
    for crate in RUST_CRATES:
        rg = rust_graph(crate)
        for comp in cycles(rg):
            print(f"{crate.name} cycle:", describe(rg, comp))
    sizes = sorted(((code_lines(p), p) for p in source_files()), reverse=True)[:15]
    for n, p in sizes:
        print(f"{n:6d} {p.relative_to(ROOT)}")
