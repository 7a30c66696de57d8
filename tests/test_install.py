"""A plain and an editable install carry every package of the source tree (``custom_ops/`` and
``models/`` as ``ortfuse.custom_ops`` and ``ortfuse.models``), the console scripts, and no generic
top-level names. The packages are found by walking the tree, so a new subpackage is checked too."""

import os
import pathlib
import subprocess
import sys
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAPPED = {"ortfuse": "ortfuse", "custom_ops": "ortfuse.custom_ops", "models": "ortfuse.models"}


def source_packages() -> list[str]:
    """Every package (folder with an ``__init__.py``) under the mapped folders, by its installed name."""
    found = []
    for folder, name in MAPPED.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            parts = init.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in parts and all(
                    (ROOT / folder / pathlib.Path(*parts[:i]) / "__init__.py").exists() for i in range(len(parts))):
                found.append(".".join((name, *parts)))
    return found


def _import_all(python: str, env: dict, cwd) -> list[str]:
    """Import every source package with ``python``; the file each was loaded from."""
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    print(importlib.import_module(name).__file__)"
    return subprocess.run([python, "-c", code, *source_packages()], check=True, capture_output=True, text=True,
                          cwd=cwd, env=env).stdout.split()


def test_source_packages_include_the_mapped_ones():
    names = source_packages()
    assert {"ortfuse", "ortfuse.custom_ops", "ortfuse.custom_ops.kernels", "ortfuse.models",
            "ortfuse.fusion.rules", "ortfuse.runtime", "ortfuse.tune", "ortfuse.cli"} <= set(names), names


@pytest.mark.slow
def test_plain_install_into_a_target_folder(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--target", str(target), str(ROOT)],
        check=True, cwd=tmp_path,
    )
    installed = sorted(p.name for p in target.iterdir() if not p.name.endswith((".dist-info", ".egg-info")))
    assert installed == ["bin", "ortfuse"] or installed == ["ortfuse"], installed
    files = _import_all(sys.executable, {**os.environ, "PYTHONPATH": str(target)}, tmp_path)
    assert len(files) == len(source_packages())
    assert all(f.startswith(str(target)) for f in files), files
    assert (target / "bin" / "ortfuse").exists() and (target / "bin" / "ortfuse-annotate").exists()


@pytest.mark.slow
def test_editable_install_in_a_fresh_environment(tmp_path):
    """A virtual environment of its own (the dependencies come from this interpreter's site-packages
    through PYTHONPATH, where .pth files are not run, so this interpreter's ortfuse install is not seen)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(ROOT)],
                   check=True, cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    files = _import_all(python, {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}, tmp_path)
    assert len(files) == len(source_packages())
    assert all(f.startswith(str(ROOT)) for f in files), files  # loaded from the working tree
    assert (venv / "bin" / "ortfuse").exists() and (venv / "bin" / "ortfuse-annotate").exists()
