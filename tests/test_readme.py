"""The README's Python example runs as written, and its quick start has exactly two commands that
.ci/run repeats."""

from __future__ import annotations

import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_python_example_runs(capsys):
    block = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["sess"].fusion_report.counts() == {"gemm_act": 7}
    assert np.isfinite(scope["outputs"][0]).all() and scope["outputs"][0].shape[0] == 4
    assert "gemm_act" in capsys.readouterr().out


def test_quick_start_has_two_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip() for line in quick.splitlines() if line.startswith("    ")]
    assert len(commands) == 2, commands
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
