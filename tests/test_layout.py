"""The layout rules of docs/ARCHITECTURE.md §2, checked on the checkout: no import cycle (also
through function-local imports), no library or tool module over 600 lines, no citation of a
document outside the repository."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600


def _import_cycles():
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "tools" / "import_cycles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_cycle():
    tool = _import_cycles()
    graph = tool.import_graph(ROOT)
    assert len(graph) > 100  # every package folder was read
    assert tool.cycles(graph) == []


def test_the_cycle_check_finds_a_function_local_cycle(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"ortfuse" = "ortfuse"\n')
    pkg = tmp_path / "ortfuse"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from ortfuse import high\n    return high\n")
    (pkg / "high.py").write_text("from ortfuse import low\n")
    tool = _import_cycles()
    found = tool.cycles(tool.import_graph(tmp_path))
    assert [sorted(members) for members, _ in found] == [["ortfuse.high", "ortfuse.low"]]
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "import_cycles.py"), "--root", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "ortfuse.low" in proc.stdout + proc.stderr


def _sources(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py")) if "__pycache__" not in p.parts]


def test_no_module_over_600_lines():
    files = _sources("ortfuse", "custom_ops", "models", "tools")
    assert len(files) > 100
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_code_cites_only_documents_in_the_repository():
    files = _sources("ortfuse", "custom_ops", "models", "tools", "tests") + [ROOT / "README.md"]
    citing = [str(p.relative_to(ROOT)) for p in files if p != Path(__file__).resolve() and "DESIGN.md" in p.read_text()]
    assert citing == []
    assert (ROOT / "docs" / "ARCHITECTURE.md").is_file()
