"""Check ortfuse's imports against the rules of docs/ARCHITECTURE.md §2; exit 1 when one is broken.

    python tools/import_levels.py [--root CHECKOUT] [--graph MODULE] [--levels]

The rules: a module imports only its own level and lower ones (``LEVELS``, the one table of the
levels, low to high), a package's ``__init__`` may also import its own submodules, ``custom_ops``
imports nothing of ortfuse but the foundation, and no modules import each other in a circle.

Builds the module import graph from the sources with ``ast`` (no module is imported): every package
folder of ``[tool.setuptools.package-dir]`` in pyproject.toml (``ortfuse/``, ``custom_ops/`` as
``ortfuse.custom_ops``, ``models/`` as ``ortfuse.models``). Every ``import`` statement counts, also
inside functions (a function-local import still runs, and still makes a cycle at run time); imports
under ``if TYPE_CHECKING:`` count for the levels (a type names a dependency too), not for cycles
(they never run). ``from P import x`` is an edge to the module ``P.x`` when it exists, else to
``P``. The parent packages Python runs before a submodule are not edges. Imports by string
(``importlib.import_module``) are not seen: the discovery of rule and op-family modules goes
downwards by design.

Prints each import of a higher level (``module -> imported``, with both levels), each set of modules
that import each other in a circle (a strongly connected component of the graph) with one such
circle ``a -> b -> ... -> a``, or how many modules and imports were checked. ``--graph MODULE``
prints the internal imports of one module; ``--levels`` prints the level table as §2 shows it.
"""

from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MAPPING = {"ortfuse": "ortfuse", "ortfuse.custom_ops": "custom_ops", "ortfuse.models": "models"}

# The import levels of docs/ARCHITECTURE.md §2, low to high: (level, modules). ``P.*`` is the package
# P and every module under it; any other name is that one module. A module belongs to the longest
# name that covers it; one no name covers has no level, which is an error (give it one here).
LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("foundation.*", "_version")),
    ("custom_ops leaves", ("custom_ops.*",)),  # every custom_ops module a higher level does not name
    ("ir", ("ir.*",)),
    ("models", ("models.*",)),
    ("rules", ("fusion.rulekit.*", "fusion.rules.*", "fusion.catalogue")),
    ("native runtime", ("custom_ops.native.*", "custom_ops.aot", "custom_ops.aot.library",
                        "custom_ops.aot.toolchain")),
    ("native op families", ("custom_ops.native.ops.*",)),
    ("registration", ("custom_ops.registration",)),
    ("ops library build", ("custom_ops.aot.build", "custom_ops.aot.objects", "custom_ops.aot.glue")),
    ("kernel choice", ("kernel_choice.*",)),
    ("fusion pipeline", ("fusion.*",)),
    ("layout", ("layout.*",)),
    ("tune", ("tune.*",)),
    ("runtime", ("runtime.*",)),
    ("session", ("session", "backend", "")),  # "": the package ortfuse itself (its __init__)
    ("bench, profiling", ("bench.*", "profiling.*")),
    ("serve", ("serve.*",)),
    ("cli", ("cli.*", "__main__")),
)
TOP = "ortfuse"
# the package whose modules import nothing of ortfuse but the foundation (docs/ARCHITECTURE.md §2)
SELF_CONTAINED = {"custom_ops": "foundation"}
# imports of a higher level that need a deeper redesign: {(module, imported): why}. None now.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def package_dirs(root: Path) -> dict[str, Path]:
    """{package name: folder} from pyproject's ``[tool.setuptools.package-dir]`` (Python 3.11+ reads
    it; 3.10 has no tomllib and takes DEFAULT_MAPPING, the same folders)."""
    try:
        import tomllib

        with open(root / "pyproject.toml", "rb") as f:
            mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    except (ImportError, OSError, KeyError, ValueError):
        mapping = DEFAULT_MAPPING
    return {name: root / folder for name, folder in mapping.items() if name}


def module_files(root: Path) -> dict[str, Path]:
    """{dotted module name: source file} of every module under the mapped package folders."""
    found: dict[str, Path] = {}
    for package, folder in package_dirs(root).items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if all(p.isidentifier() for p in parts):  # skips __pycache__ copies and scratch files
                found[".".join([package, *parts])] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, type_checking: bool = False):
    """Import nodes of a module; those in ``if TYPE_CHECKING:`` bodies only with ``type_checking``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph(root: Path = ROOT, type_checking: bool = False) -> dict[str, set[str]]:
    """{module: modules of ours it imports} (``type_checking``: imports for type checkers too)."""
    files = module_files(root)
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in _imports(tree, type_checking):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = (_resolve_relative(module, is_package, node.level, node.module) if node.level
                        else node.module or "")
                targets = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in files else base)
            for target in targets:
                # "import a.b.c" names a.b.c; keep the longest prefix that is one of our modules
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def _name(pattern: str) -> str:
    base = pattern.removesuffix(".*")
    return f"{TOP}.{base}" if base else TOP


def level_of(module: str) -> int | None:
    """The index in ``LEVELS`` of the level ``module`` belongs to, or None when no name covers it."""
    best: tuple[int, int] | None = None  # (length of the covering name, level)
    for index, (_, patterns) in enumerate(LEVELS):
        for pattern in patterns:
            name = _name(pattern)
            covers = module == name or (pattern.endswith(".*") and module.startswith(name + "."))
            if covers and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def level_breaks(graph: dict[str, set[str]], files: dict[str, Path] | None = None) -> list[str]:
    """Every break of the level rules in ``graph`` (an ``import_graph(type_checking=True)``), one line
    each: modules without a level, imports of a higher level, imports out of a self-contained package,
    and exceptions in ``KNOWN_UPWARD`` that no longer happen."""
    breaks = [f"{m}: no level (add it to LEVELS in tools/import_levels.py)" for m in sorted(graph)
              if level_of(m) is None]
    seen = set()
    for module in sorted(graph):
        mine = level_of(module)
        for target in sorted(graph[module]):
            theirs = level_of(target)
            own_submodule = target.startswith(module + ".") and (files is None or files[module].name == "__init__.py")
            if mine is None or theirs is None or own_submodule:
                continue
            if theirs > mine:
                if (module, target) in KNOWN_UPWARD:
                    seen.add((module, target))
                    continue
                breaks.append(f"{module} ({LEVELS[mine][0]}) imports {target} ({LEVELS[theirs][0]}), a higher level")
            allowed = SELF_CONTAINED.get(_package(module))
            if allowed and _package(target) != _package(module) and LEVELS[theirs][0] != allowed:
                breaks.append(f"{module} imports {target}: {_package(module)} imports nothing of {TOP} but "
                              f"the {allowed}")
    breaks += [f"{m} -> {t}: listed in KNOWN_UPWARD but no longer imported" for m, t in KNOWN_UPWARD
               if (m, t) not in seen]
    return breaks


def levels_text(width: int = 100) -> str:
    """The level table as docs/ARCHITECTURE.md §2 shows it: one level a line, lowest first."""
    lines = []
    for index, (level, patterns) in enumerate(LEVELS):
        names = ", ".join(p or TOP for p in patterns)
        lines += textwrap.wrap(names, width, initial_indent=f"{index:2}  {level:<19} ", subsequent_indent=" " * 24)
    return "\n".join(lines)


def cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """(members, one cycle a -> ... -> a through them) of every strongly connected component of
    more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = [0]

    def strongconnect(start: str) -> None:  # iterative Tarjan
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return [(c, _cycle_in(graph, set(c))) for c in sorted(components)]


def _cycle_in(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """A shortest cycle through the first member of a strongly connected component (breadth first)."""
    start = min(members)
    parents = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                path = [node]
                while parents[path[-1]] is not None:
                    path.append(parents[path[-1]])
                return [*reversed(path), start]
            if child not in parents:
                parents[child] = node
                queue.append(child)
    return [start, start]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    ap.add_argument("--graph", metavar="MODULE", help="print the internal imports of MODULE and exit")
    ap.add_argument("--levels", action="store_true", help="print the level table as docs/ARCHITECTURE.md §2 shows it")
    args = ap.parse_args(argv)
    if args.levels:
        print(levels_text())
        return 0
    graph = import_graph(args.root)
    if args.graph:
        if args.graph not in graph:
            ap.error(f"unknown module {args.graph}")
        for target in sorted(graph[args.graph]):
            print(target)
        return 0
    breaks = level_breaks(import_graph(args.root, type_checking=True), module_files(args.root))
    for line in breaks:
        print(line)
    found = cycles(graph)
    for members, cycle in found:
        print(f"import cycle among {len(members)} modules: {', '.join(members)}")
        print("  for example " + " -> ".join(cycle))
    if found or breaks:
        print(f"{len(breaks)} break(s) of the import levels, {len(found)} import cycle(s)")
        return 1
    print(f"no import of a higher level and no import cycle among {len(graph)} modules "
          f"({sum(len(v) for v in graph.values())} imports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
