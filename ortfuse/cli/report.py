"""``ortfuse report MODEL``: what the rewriter would do to a model, as a table or JSON."""

from __future__ import annotations

import sys

from ortfuse.fusion.catalogue import UnknownPatternError
from ortfuse.fusion.rewrite import fuse
from ortfuse.ir import model_args


def add_arguments(p) -> None:
    p.add_argument("model", help="path of the .onnx model")
    p.add_argument("--pattern", action="append", dest="patterns", metavar="ID", help="restrict to these ids")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args) -> int:
    try:
        model = model_args.load(args.model)
    except model_args.ModelArgError as exc:
        print(f"ortfuse report: {exc}.", file=sys.stderr)
        return 2
    try:
        _, report = fuse(model, args.patterns)
    except UnknownPatternError as exc:
        print(f"ortfuse report: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.table())
    return 0
