"""The README's Python example runs as written and prints the report shown beside it, its quick start
has exactly two commands that .ci/run repeats, and its configuration tables name every environment
variable and config key the code reads."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CODE = ("ortfuse", "custom_ops", "models", "tools", "tests")


def _columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_python_example_runs_and_prints_the_report_shown(capsys):
    """The report block after the example is this run's (the kernel column and the notes aside: the
    kernels follow the machine's ranking, the notes its cache)."""
    match = re.search(r"```python\n(.*?)```\n(.*?)```text\n(.*?)```", README, re.S)
    scope: dict = {}
    exec(compile(match.group(1), "README.md", "exec"), scope)
    assert scope["sess"].fusion_report.counts() == {"gemm_act": 7}
    assert np.isfinite(scope["outputs"][0]).all() and scope["outputs"][0].shape[0] == 4
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("note:")]
    shown = [ln for ln in match.group(3).splitlines() if ln and not ln.startswith("note:")]
    assert printed[0] == shown[0]
    assert [_columns(ln)[:3] for ln in printed[1:]] == [_columns(ln)[:3] for ln in shown[1:]]


def test_quick_start_has_two_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip() for line in quick.splitlines() if line.startswith("    ")]
    assert len(commands) == 2, commands
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def _strings(tree: ast.AST) -> set[str]:
    """Every string constant of a module but the names given to ``logging.getLogger``."""
    loggers = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "getLogger"
               for a in n.args}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in loggers}


CONFIG_CALLS = {"config_entry", "add_session_config_entry", "get_session_config_entry"}


def _config_strings(tree: ast.AST) -> set[str]:
    """Strings used as config keys: bound to a ``*_KEY`` / ``*_OPTION`` name, or passed to a config call."""
    found = set()
    for n in ast.walk(tree):
        values: list = []
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id.endswith(("_KEY", "_OPTION"))
                                             for t in n.targets):
            values = [n.value]
        elif isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) in CONFIG_CALLS:
            values = list(n.args)
        found |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return found


def _used() -> tuple[set[str], set[str]]:
    """(environment variables, ortfuse.* config keys) the code names in its strings: any ORTFUSE_*
    in a string (messages and docstrings included), NUMBA_* that is a whole string (an environment
    key), and a whole string ``ortfuse.<name>`` used as a config key or naming no module."""
    env, keys = set(), set()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            config = _config_strings(tree)
            for text in _strings(tree):
                env.update(re.findall(r"\bORTFUSE_[A-Z0-9_]*[A-Z0-9]\b", text))
                if re.fullmatch(r"NUMBA_[A-Z0-9_]+", text):
                    env.add(text)
                key = re.fullmatch(r"ortfuse\.[a-z_]+", text)
                if key and (text in config or importlib.util.find_spec(text) is None):
                    keys.add(text)
    return env, keys


def test_every_environment_variable_and_config_key_the_code_uses_is_in_the_readme_tables():
    section = README.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    named = set()
    for row in section.splitlines():
        if row.startswith("|"):
            named.update(re.findall(r"`([A-Za-z0-9_.]+)`", row.split("|")[1]))
    env, keys = _used()
    assert {"ORTFUSE_CACHE_DIR", "ORTFUSE_TUNE", "NUMBA_CACHE_DIR"} <= env
    assert {"ortfuse.precision", "ortfuse.tune"} <= keys
    assert sorted(env - named) == [], "environment variables the README's Configuration does not name"
    assert sorted(keys - named) == [], "config keys the README's Configuration does not name"
