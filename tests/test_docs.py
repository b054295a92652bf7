"""The docs stay true: the README's quick start runs, every link between the pages lands on a file
and a heading that exist, and the sources cite format.md's sections by names it has."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
pytestmark = pytest.mark.skipif(not (ROOT / "docs").is_dir(), reason="docs/ is not in this tree")


def anchor(heading: str) -> str:
    """The anchor a markdown renderer (GitHub's rule) gives a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^a-z0-9 _-]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    body = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", body, re.M)}


def test_readme_stays_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 200


def test_readme_python_quick_start_runs(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "the README has no Python quick start"
    monkeypatch.chdir(tmp_path)
    code = blocks[0].replace("(4096, 4096)", "(64, 4096)")  # the same calls, a smaller array
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["w_hat"].shape == scope["w"].shape
    assert np.array_equal(scope["same"].dequantize(), scope["w_hat"])
    assert (tmp_path / "model.bpk").is_file()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_land_on_files_and_headings_that_exist(page):
    body = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_sources_cite_format_sections_by_their_names():
    names = {m.group(1) for m in re.finditer(r"^#+ (.+)$", (ROOT / "docs/format.md").read_text(
        encoding="utf-8"), re.M)}
    bad = []
    for root in (ROOT / "python", ROOT / "rust", ROOT / "tests", ROOT / "benches"):
        for path in root.rglob("*"):
            if path.suffix not in (".py", ".rs", ".pyi") or "target" in path.parts:
                continue
            text = path.read_text(encoding="utf-8")
            if re.search("§" + r"\d", text):  # numbered sections: cite by name
                bad.append(f"{path.relative_to(ROOT)}: cites a section by number")
            for cited in re.findall(r'format\.md "([^"]+)"', text):
                if cited not in names:
                    bad.append(f"{path.relative_to(ROOT)}: no section {cited!r}")
    assert not bad, "\n".join(bad)
