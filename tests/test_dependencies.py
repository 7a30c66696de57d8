"""Every third-party module the tests import is installed by the README's test command
(``pip install -e '.[test]'``): a module provided by a distribution that ortfuse[test] requires,
directly or through its own requirements, or one the test file asks for with
``pytest.importorskip`` (an optional extra: skipped with the reason where it is absent).

A package left on a developer's machine by hand would otherwise pass here and fail on a fresh one;
``.ci/run`` proves the same end to end in a new virtual environment."""

from __future__ import annotations

import ast
import importlib.metadata as md
import pathlib
import re
import sys

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIRST_PARTY = {"ortfuse"}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> set[str]:
    """What ``pip install -e '.[test]'`` asks for: ortfuse's requirements as installed (its metadata,
    written from pyproject.toml), the ``test`` extra's included."""
    wanted = set()
    for text in md.requires("ortfuse") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": "test"}):
            wanted.add(_name(req.name))
    return wanted


def _closure(names: set[str]) -> set[str]:
    """``names`` and every distribution they require (unconditional requirements and those whose
    markers hold here), as installed."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_name(req.name))
    return seen


def _imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """Top-level module names ``path`` imports anywhere, and those it passes to importorskip."""
    tree = ast.parse(path.read_text())
    imported, optional = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "importorskip" and node.args and isinstance(node.args[0], ast.Constant)):
            optional.add(str(node.args[0].value).split(".")[0])
    return imported, optional


def test_every_module_the_tests_import_is_installed_by_the_test_extra():
    provided = md.packages_distributions()
    # the checkout's own modules: test helpers, tools/ scripts, and source folders put on the path
    local = {p.stem for folder in ("tests", "tools") for p in (ROOT / folder).glob("*.py")}
    local |= {p.parent.name for p in ROOT.glob("*/__init__.py")}
    installed_by_extra = _closure(_declared())
    missing = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        imported, optional = _imports(path)
        for module in sorted(imported - optional - local - FIRST_PARTY - set(sys.stdlib_module_names)):
            dists = {_name(d) for d in provided.get(module, [])}
            if not dists & installed_by_extra:
                missing.append(f"{path.name} imports {module} ({', '.join(sorted(dists)) or 'not installed'})")
    assert not missing, "not installed by pip install -e '.[test]': " + "; ".join(missing)


def test_the_check_sees_a_missing_package(tmp_path):
    """The check above can fail: a module no requirement brings is reported."""
    imported, _ = _imports(_write(tmp_path, "import numpy\nfrom scipy.special import erf\n"))
    assert "scipy" in imported
    assert not {_name(d) for d in md.packages_distributions().get("scipy", [])} & {"numpy"}
    assert "scipy" not in _closure({"numpy"})


def _write(folder: pathlib.Path, text: str) -> pathlib.Path:
    path = folder / "sample.py"
    path.write_text(text)
    return path
