"""``ortfuse models list|build [NAME ...] [--force]`` (also ``python -m ortfuse.models``)."""

from __future__ import annotations

import argparse
import time

from . import NAMES, build, cache, registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``list`` and ``build`` actions to ``parser``."""
    sub = parser.add_subparsers(dest="models_action", metavar="ACTION")
    sub.add_parser("list", help="print each model, whether it is cached, and its description")
    p = sub.add_parser("build", help="build models into the cache and print their paths and sizes")
    p.add_argument("names", nargs="*", metavar="NAME", help=f"models to build (default: all): {', '.join(NAMES)}")
    p.add_argument("--force", action="store_true", help="rebuild even when the cached file is current")
    parser.set_defaults(_models_parser=parser)


def run(args: argparse.Namespace) -> int:
    """Run the chosen action; returns the exit code."""
    if args.models_action == "list":
        return _list()
    if args.models_action == "build":
        unknown = [n for n in args.names if n not in NAMES]
        if unknown:
            args._models_parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
        return _build(args.names or list(NAMES), args.force)
    args._models_parser.print_help()
    return 2


def _list() -> int:
    width = max(map(len, NAMES))
    print(f"cache: {cache.model_path('x').parent}")
    for name in NAMES:
        state = "cached" if cache.is_cached(name, registry.recipe(name)) else "-"
        print(f"{name:<{width}}  {state:<6}  {registry.get(name).description}")
    return 0


def _build(names: list[str], force: bool) -> int:
    for name in names:
        start = time.perf_counter()
        path = build(name, force=force)
        seconds = time.perf_counter() - start
        print(f"{name}  {path}  {path.stat().st_size / 1e6:.1f} MB  {seconds:.2f} s")
    return 0
