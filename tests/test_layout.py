"""The layout rules of docs/ARCHITECTURE.md §2, checked on the checkout: no import of a higher level
and no import cycle (also through function-local imports; tools/import_levels.py), the level table
of §2 the same as the tool's, no library or tool module over 600 lines, no citation of a document
outside the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tool_modules

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600


def _import_levels():
    return tool_modules.load("import_levels")


def test_no_import_cycle():
    tool = _import_levels()
    graph = tool.import_graph(ROOT)
    assert len(graph) > 100  # every package folder was read
    assert tool.cycles(graph) == []


def test_no_import_of_a_higher_level():
    """Every module has a level and imports none above it (docs/ARCHITECTURE.md §2); the table has
    no known exception (tools/import_levels.py: KNOWN_UPWARD)."""
    tool = _import_levels()
    graph = tool.import_graph(ROOT, type_checking=True)
    assert len(graph) > 100
    assert tool.level_breaks(graph, tool.module_files(ROOT)) == []
    assert tool.KNOWN_UPWARD == {}


def test_the_architecture_doc_states_the_level_table():
    """§2 shows the levels as ``python tools/import_levels.py --levels`` prints them from the one table."""
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = doc[doc.index("## §2 Layout"):doc.index("## §3")]
    table = "\n".join(f"    {line}" for line in _import_levels().levels_text().splitlines())
    assert table in section


def _tree(tmp_path, modules: dict[str, str]) -> Path:
    """A checkout in ``tmp_path`` with the package folders of pyproject and ``modules`` ({path: source})."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"ortfuse" = "ortfuse"\n'
                                             '"ortfuse.custom_ops" = "custom_ops"\n')
    for path, source in {"ortfuse/__init__.py": "", "custom_ops/__init__.py": "", **modules}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
    return tmp_path


def test_the_cycle_check_finds_a_function_local_cycle(tmp_path):
    root = _tree(tmp_path, {"ortfuse/ir/__init__.py": "",
                            "ortfuse/ir/low.py": "def f():\n    from ortfuse.ir import high\n",
                            "ortfuse/ir/high.py": "from ortfuse.ir import low\n"})
    tool = _import_levels()
    found = tool.cycles(tool.import_graph(root))
    assert [sorted(members) for members, _ in found] == [["ortfuse.ir.high", "ortfuse.ir.low"]]
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "import_levels.py"), "--root", str(root)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "ortfuse.ir.low" in proc.stdout + proc.stderr


def test_the_level_check_finds_every_kind_of_break(tmp_path):
    """A function-local import of a higher level, a type-only one, an import out of custom_ops that is
    not the foundation, and a module without a level; a package's ``__init__`` importing its own
    submodule and an import of a lower level pass."""
    root = _tree(tmp_path, {
        "ortfuse/foundation/__init__.py": "",
        "ortfuse/foundation/files.py": "def f():\n    from ortfuse.cli import main\n",
        "ortfuse/ir/__init__.py": ("from typing import TYPE_CHECKING\n"
                                   "if TYPE_CHECKING:\n    from ortfuse.tune import tuner\n"),
        "ortfuse/tune/__init__.py": "from ortfuse.tune import tuner\n",
        "ortfuse/tune/tuner.py": "from ortfuse.foundation import files\n",
        "ortfuse/cli/__init__.py": "", "ortfuse/cli/main.py": "",
        "ortfuse/stray.py": "",
        "custom_ops/native/__init__.py": "from ortfuse.ir import graph\n",
        "ortfuse/ir/graph.py": "",
    })
    tool = _import_levels()
    breaks = tool.level_breaks(tool.import_graph(root, type_checking=True), tool.module_files(root))
    assert breaks == [
        "ortfuse.stray: no level (add it to LEVELS in tools/import_levels.py)",
        "ortfuse.custom_ops.native imports ortfuse.ir.graph: custom_ops imports nothing of ortfuse but the foundation",
        "ortfuse.foundation.files (foundation) imports ortfuse.cli.main (cli), a higher level",
        "ortfuse.ir (ir) imports ortfuse.tune.tuner (tune), a higher level",
    ]
    assert tool.level_breaks(tool.import_graph(root), tool.module_files(root))[-1].startswith("ortfuse.foundation")


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


def test_committed_data_files_stay_under_two_mebibytes():
    """Only small fixtures and result files are committed: every file under tests/fixtures/ and
    benchmarks/results/ is at most 2 MiB (a larger result is written gzipped, a larger fixture
    without its weights: tests/weightless_fixtures.py)."""
    root = Path(__file__).resolve().parents[1]
    limit = 2 << 20
    big = [str(p.relative_to(root)) for folder in ("tests/fixtures", "benchmarks/results")
           for p in (root / folder).rglob("*") if p.is_file() and p.stat().st_size > limit]
    assert not big, f"over 2 MiB: {big}"
