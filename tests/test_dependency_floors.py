"""The oldest version ortfuse accepts of each dependency it is coupled to is the version tested.

ortfuse calls ORT's private Python APIs (``InferenceSession._bind_session``, ``_sess``; behind the
feature check ``swap_unsupported``) and its custom-op C ABI, registers native ops through
onnxruntime-extensions' ``AddExternalCustomOp``, reads and writes onnx's IR, and builds kernels from
numba's intrinsics. A floor below the version this run installed would accept releases nothing ever
ran against, so for these the floor's major.minor must be the installed one, and a ceiling at the
next minor keeps a fresh ``pip install -e '.[test]'`` (``.ci/run``) on that minor when upstream
releases another: moving to it is a change of pyproject.toml, tested like any other.
"""

from __future__ import annotations

import importlib.metadata as md
import pathlib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[1]
COUPLED = ("onnxruntime", "onnx", "onnxruntime-extensions", "numba")
REINSTALL = "pip install -e '.[test]'"


def _installed() -> dict[str, Requirement]:
    """ortfuse's base requirements as installed (its metadata), by name."""
    reqs = [Requirement(text) for text in md.requires("ortfuse") or []]
    return {r.name: r for r in reqs if r.marker is None}


def _declared() -> dict[str, Requirement]:
    """The base requirements pyproject.toml declares, by name."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {r.name: r for r in map(Requirement, project["dependencies"])}


def test_the_installed_requirements_are_those_pyproject_declares():
    """Otherwise the checks below would read an old install's floors."""
    installed = {name: str(r.specifier) for name, r in _installed().items()}
    declared = {name: str(r.specifier) for name, r in _declared().items()}
    assert installed == declared, f"the installed ortfuse metadata is older than pyproject.toml: run {REINSTALL}"


def test_installed_versions_satisfy_every_requirement():
    for name, req in _installed().items():
        version = md.version(name)
        assert req.specifier.contains(version, prereleases=True), \
            f"{name} {version} is installed, ortfuse requires {req}: run {REINSTALL}"


@pytest.mark.parametrize("name", COUPLED)
def test_the_floor_is_the_tested_version(name):
    req = _installed()[name]
    floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
    assert len(floors) == 1, f"ortfuse requires {req}: one >= floor is expected for {name}"
    floor, tested = floors[0], Version(md.version(name))
    assert (floor.major, floor.minor) == (tested.major, tested.minor), (
        f"ortfuse accepts {name}>={floor} but this run tests {tested}: set the floor in pyproject.toml to "
        f">={tested.major}.{tested.minor}, the version CI installs, and run {REINSTALL}")


@pytest.mark.parametrize("name", COUPLED)
def test_the_ceiling_is_the_next_minor(name):
    req = _installed()[name]
    floor = next(Version(s.version) for s in req.specifier if s.operator == ">=")
    ceilings = [Version(s.version) for s in req.specifier if s.operator == "<"]
    assert ceilings == [Version(f"{floor.major}.{floor.minor + 1}")], (
        f"ortfuse requires {req}: {name} needs the ceiling <{floor.major}.{floor.minor + 1}, so that a fresh "
        "install keeps the tested minor")
