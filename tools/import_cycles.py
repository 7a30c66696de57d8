"""Report import cycles among ortfuse's modules; exit 1 when there is one.

    python tools/import_cycles.py [--root CHECKOUT] [--graph MODULE]

Builds the module import graph from the sources with ``ast`` (no module is imported): every package
folder of ``[tool.setuptools.package-dir]`` in pyproject.toml (``ortfuse/``, ``custom_ops/`` as
``ortfuse.custom_ops``, ``models/`` as ``ortfuse.models``). Every ``import`` statement counts, also
inside functions (a function-local import still makes a cycle at run time); imports under
``if TYPE_CHECKING:`` do not. ``from P import x`` is an edge to the module ``P.x`` when it exists,
else to ``P``. The parent packages Python runs before a submodule are not edges (docs/ARCHITECTURE.md
§2: a package's ``__init__`` may import its own submodules). Imports by string
(``importlib.import_module``) are not seen: the discovery of rule and op-family modules goes
downwards by design.

Prints each set of modules that import each other in a circle (a strongly connected component of
the graph) with one such circle ``a -> b -> ... -> a``, or how many modules and imports were
checked. ``--graph MODULE`` prints the internal imports of one module.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MAPPING = {"ortfuse": "ortfuse", "ortfuse.custom_ops": "custom_ops", "ortfuse.models": "models"}


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


def _imports(tree: ast.AST):
    """Import nodes of a module, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
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


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: modules of ours it imports}."""
    files = module_files(root)
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in _imports(tree):
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
    args = ap.parse_args(argv)
    graph = import_graph(args.root)
    if args.graph:
        if args.graph not in graph:
            ap.error(f"unknown module {args.graph}")
        for target in sorted(graph[args.graph]):
            print(target)
        return 0
    found = cycles(graph)
    for members, cycle in found:
        print(f"import cycle among {len(members)} modules: {', '.join(members)}")
        print("  for example " + " -> ".join(cycle))
    if found:
        print(f"{len(found)} import cycle(s)")
        return 1
    print(f"no import cycle among {len(graph)} modules ({sum(len(v) for v in graph.values())} imports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
