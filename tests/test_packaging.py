"""Packaging: the metadata that pip, PyPI and the build read, kept consistent with the code.

The first tests need no build: versions, licenses, the abi3 floor, the maturin settings and what
the sdist is told to include. With ``BLOCKQUANT_WHEEL=path/to/wheel`` (set by .ci/test-wheel, which
installs that wheel into a fresh virtualenv and runs this whole suite against it) the wheel's own
tags and contents are checked too, and that the ``blockquant`` under test is the installed one.
"""

import email.parser
import glob
import importlib
import importlib.metadata
import os
import re
import sys
import zipfile
from pathlib import Path

import pytest

import blockquant

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - tomli is in the test extra for 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT_PATH = ROOT / "pyproject.toml"
if not PYPROJECT_PATH.is_file():  # pragma: no cover - tests/ copied away from the source tree
    pytest.skip("not in a source tree: no pyproject.toml", allow_module_level=True)

PYPROJECT = tomllib.loads(PYPROJECT_PATH.read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
MATURIN = PYPROJECT["tool"]["maturin"]
WORKSPACE = tomllib.loads((ROOT / "Cargo.toml").read_text(encoding="utf-8"))
BINDING_MANIFEST = ROOT / MATURIN["manifest-path"]
BINDING = tomllib.loads(BINDING_MANIFEST.read_text(encoding="utf-8"))
LICENSE_FILES = ["LICENSE-MIT", "LICENSE-APACHE"]
REPOSITORY = "https://github.com/blockquant/blockquant"


def _min_python() -> tuple[int, int]:
    m = re.fullmatch(r">=\s*(\d+)\.(\d+)", PROJECT["requires-python"])
    assert m, PROJECT["requires-python"]
    return int(m[1]), int(m[2])


def _numpy_floor() -> str:
    (req,) = [d for d in PROJECT["dependencies"] if re.match(r"numpy\b", d)]
    m = re.fullmatch(r"numpy\s*>=\s*(\d+\.\d+)", req)
    assert m, req
    return m[1]


# -- without a build ---------------------------------------------------------------------------


def test_one_version_everywhere():
    cargo = WORKSPACE["workspace"]["package"]["version"]
    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT  # maturin takes Cargo's
    assert BINDING["package"]["version"] == {"workspace": True}
    assert blockquant.__version__ == cargo
    # the installed distribution (editable or wheel) is this version too, not a stale one
    assert importlib.metadata.version("blockquant") == cargo


def test_license_is_declared_once_and_its_files_exist():
    assert PROJECT["license"] == WORKSPACE["workspace"]["package"]["license"] == "MIT OR Apache-2.0"
    assert BINDING["package"]["license"] == {"workspace": True}
    assert PROJECT["license-files"] == LICENSE_FILES
    for name in LICENSE_FILES:
        assert (ROOT / name).is_file() and (ROOT / name).stat().st_size > 500, name
    # PEP 639: no License :: classifier next to a license expression
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]
    # License-Expression and license-files need maturin >= 1.9.4, editable-profile 1.10
    (backend,) = PYPROJECT["build-system"]["requires"]
    assert re.fullmatch(r"maturin>=1\.([1-9]\d)[\d.]*,<2", backend), backend


def test_abi3_floor_matches_requires_python():
    major, minor = _min_python()
    pyo3 = BINDING["dependencies"]["pyo3"]
    assert f"abi3-py{major}{minor}" in pyo3["features"], pyo3
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    versions = [c.rsplit(" ", 1)[1] for c in PROJECT["classifiers"]
                if re.fullmatch(r"Programming Language :: Python :: \d+\.\d+", c)]
    assert versions and versions[0] == f"{major}.{minor}", versions
    assert sys.version_info[:2] >= (major, minor)


def test_urls():
    urls = PROJECT["urls"]
    assert set(urls) == {"Homepage", "Repository", "Documentation", "Issues"}
    assert urls["Repository"] == REPOSITORY and urls["Issues"] == REPOSITORY + "/issues"
    assert all(u.startswith(REPOSITORY) for u in urls.values())
    assert (ROOT / "docs").is_dir()


def test_maturin_layout():
    assert MATURIN["module-name"] == "blockquant._core"
    # `pip install -e` builds a profile of Cargo.toml's that keeps release optimisation; wheels
    # build the release profile, with whole-program LTO
    profiles = WORKSPACE["profile"]
    assert profiles["release"]["lto"] == "fat"
    editable = profiles[MATURIN["editable-profile"]]
    assert editable["inherits"] == "release" and editable.get("opt-level", 3) == 3
    assert BINDING["lib"]["name"] == "_core" and BINDING["lib"]["crate-type"] == ["cdylib"]
    package = ROOT / MATURIN["python-source"] / "blockquant"
    for name in ["__init__.py", "py.typed", "_core.pyi"]:
        assert (package / name).is_file(), name
    # the release wheel's tag: manylinux2014 (glibc 2.17) or manylinux_2_X with X <= 28
    compat = MATURIN["compatibility"]
    m = re.fullmatch(r"manylinux(2014|_2_(\d+))", compat)
    assert m and (m[1] == "2014" or int(m[2]) <= 28), compat


def test_sdist_includes_match_files():
    # a renamed folder would otherwise drop out of the sdist without a word
    for rule in MATURIN["include"]:
        assert rule["format"] == "sdist", rule  # tests, docs and benches stay out of wheels
        assert glob.glob(str(ROOT / rule["path"]), recursive=True), rule["path"]


# -- with a built wheel (BLOCKQUANT_WHEEL) -------------------------------------------------------

WHEEL = os.environ.get("BLOCKQUANT_WHEEL")
needs_wheel = pytest.mark.skipif(not WHEEL, reason="BLOCKQUANT_WHEEL names no built wheel")


@pytest.fixture(scope="module")
def wheel():
    assert WHEEL and os.path.isfile(WHEEL), WHEEL
    with zipfile.ZipFile(WHEEL) as zf:
        yield zf


def _wheel_tags(path: str):
    m = re.fullmatch(r"blockquant-([^-]+)-([^-]+)-([^-]+)-([^-]+)\.whl", os.path.basename(path))
    assert m, path
    return m[1], m[2], m[3], m[4].split(".")


def _glibc_floor(platforms) -> tuple[int, int]:
    floors = []
    for plat in platforms:
        if plat.startswith("manylinux2014_"):
            floors.append((2, 17))
        elif m := re.match(r"manylinux_(\d+)_(\d+)_", plat):
            floors.append((int(m[1]), int(m[2])))
    assert floors, platforms
    return min(floors)


@needs_wheel
def test_wheel_tags(wheel):
    version, python, abi, platforms = _wheel_tags(WHEEL)
    major, minor = _min_python()
    assert version == blockquant.__version__
    assert (python, abi) == (f"cp{major}{minor}", "abi3")
    assert _glibc_floor(platforms) <= (2, 28), platforms
    dist_info = f"blockquant-{version}.dist-info"
    meta = email.parser.Parser().parsestr(wheel.read(f"{dist_info}/WHEEL").decode())
    assert meta["Root-Is-Purelib"] == "false"
    assert sorted(meta.get_all("Tag")) == sorted(f"{python}-{abi}-{p}" for p in platforms)


@needs_wheel
def test_wheel_extension_links_no_newer_glibc(wheel):
    # The versioned glibc symbols the extension needs are named in its .gnu.version_r section:
    # none may be newer than the wheel's manylinux tag promises (auditwheel checks it in CI too).
    *_, platforms = _wheel_tags(WHEEL)
    so = wheel.read("blockquant/_core.abi3.so")
    assert so[:4] == b"\x7fELF"
    needed = {tuple(map(int, v)) for v in re.findall(rb"GLIBC_(\d+)\.(\d+)", so)}
    assert needed and max(needed) <= _glibc_floor(platforms), sorted(needed)


@needs_wheel
def test_wheel_metadata(wheel):
    version = blockquant.__version__
    dist_info = f"blockquant-{version}.dist-info"
    meta = email.parser.Parser().parsestr(wheel.read(f"{dist_info}/METADATA").decode())
    assert meta["Name"] == "blockquant" and meta["Version"] == version
    assert meta["License-Expression"] == PROJECT["license"]
    assert sorted(meta.get_all("License-File")) == sorted(LICENSE_FILES)
    assert meta["Requires-Python"] == PROJECT["requires-python"]
    assert f"numpy>={_numpy_floor()}" in meta.get_all("Requires-Dist")
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls == PROJECT["urls"]
    entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert re.search(r"^blockquant\s*=\s*blockquant\.cli:main$", entry_points, re.M), entry_points


@needs_wheel
def test_wheel_contents(wheel):
    version = blockquant.__version__
    dist_info = f"blockquant-{version}.dist-info"
    names = wheel.namelist()
    for name in LICENSE_FILES:
        assert wheel.read(f"{dist_info}/licenses/{name}") == (ROOT / name).read_bytes()
    for name in ["py.typed", "_core.pyi", "_core.abi3.so", "__init__.py"]:
        assert f"blockquant/{name}" in names, name
    # exactly the package's Python files: nothing stale, nothing missing
    source = ROOT / MATURIN["python-source"]
    in_source = {p.relative_to(source).as_posix() for p in source.rglob("*.py")}
    assert {n for n in names if n.endswith(".py")} == in_source
    # nothing but the package and its dist-info: no tests, benches, docs, caches, build debris
    assert all(n.startswith(("blockquant/", f"{dist_info}/")) for n in names), names
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo", ".pdb"))]
    record = wheel.read(f"{dist_info}/RECORD").decode()
    recorded = {line.split(",", 1)[0] for line in record.splitlines() if line}
    assert recorded == set(names)


@needs_wheel
def test_the_installed_wheel_is_under_test():
    # run from the source tree, `import blockquant` could find python/blockquant instead
    package = Path(blockquant.__file__).resolve().parent
    assert ROOT not in package.parents, package
    assert (package / "_core.abi3.so").is_file() and (package / "py.typed").is_file()
    core = importlib.import_module("blockquant._core")
    assert Path(core.__file__).resolve().parent == package
    files = importlib.metadata.files("blockquant")
    assert files and any(f.name == "_core.abi3.so" for f in files)
