"""A plain (non-editable) install carries the mapped subpackages ``ortfuse.custom_ops`` and
``ortfuse.models``, the console scripts, and no generic top-level names."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
    code = (
        "import ortfuse, ortfuse.custom_ops, ortfuse.models, ortfuse.backend, ortfuse.fusion.patterns,"
        " ortfuse.custom_ops.kernels;"
        "print(ortfuse.__file__); print(ortfuse.custom_ops.__file__); print(ortfuse.models.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=tmp_path, env=env).stdout.split()
    assert all(line.startswith(str(target)) for line in out), out
    assert (target / "bin" / "ortfuse").exists() and (target / "bin" / "ortfuse-annotate").exists()
