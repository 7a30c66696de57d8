"""Command line: ``ortfuse <command>`` and ``ortfuse-annotate``.

Each subcommand lives in its own module, which provides ``add_arguments(parser)`` and
``run(args) -> int``; this file only wires them together, importing each lazily. What the commands
that run a model share (input arguments and inputs, default patterns) is ``ortfuse.cli.common``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS = {
    "bench": ("ortfuse.cli.bench", "benchmark stock ORT against ortfuse on a model or zoo model"),
    "report": ("ortfuse.cli.report", "show what the rewriter would fuse in a model, and why not"),
    "models": ("ortfuse.models.cli", "list or build the deterministic model zoo"),
    "rank": ("ortfuse.cli.rank", "measure which kernel serves each kind of match fastest here, in the whole model"),
    "tune": ("ortfuse.cli.tune", "measure which fusions beat ORT on this machine (fusion='auto') and cache it"),
    "verify": ("ortfuse.cli.verify",
               "compare fused and stock ORT outputs; on a mismatch, bisect to the fused op to blame"),
    "profile": ("ortfuse.cli.profile", "ORT's profiler on the fused and the unfused model: where the time goes"),
    "ops-library": ("ortfuse.cli.ops_library",
                    "build this machine's native ops library (once) and print its path, for any ORT host"),
    "export": ("ortfuse.cli.export",
               "write a fused model, its ops library and a Triton model repository entry, for any ORT host"),
    "serve": ("ortfuse.cli.serve", "serve a model over HTTP on Ray Serve replicas that share tuned plans"),
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ortfuse", description="ONNX Runtime with operator fusion.")
    parser.add_argument("--version", action="version", version=f"ortfuse {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def _version() -> str:
    from ortfuse._version import __version__ as ortfuse_version

    return ortfuse_version


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    return int(importlib.import_module(args._module).run(args) or 0)


def annotate_main(argv: list[str] | None = None) -> int:
    from ortfuse.cli import annotate

    return int(annotate.main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
