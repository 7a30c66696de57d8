"""Which nodes of ORT's optimized graph a layout op replaces, written on the op itself.

A layout op that does the work of several nodes (a squeeze-excite block, a Winograd conv with its
residual Add) carries their names in its ``doc_string``, one line ``replaces: a, b, c``; ``ortfuse
profile`` reads it to map the op's time back to those nodes (docs/ARCHITECTURE.md §9)."""

from __future__ import annotations

from collections.abc import Iterable

import onnx

PREFIX = "replaces: "


def record(node: onnx.NodeProto, replaced: Iterable[onnx.NodeProto]) -> None:
    """Append the names of ``replaced`` (unnamed nodes are left out) to ``node``'s doc string."""
    names = [n.name for n in replaced if n.name]
    if names:
        node.doc_string = "\n".join(filter(None, [node.doc_string, PREFIX + ", ".join(names)]))


def replaced(node: onnx.NodeProto) -> list[str]:
    """The names :func:`record` wrote on ``node``; empty for any other node."""
    for line in node.doc_string.splitlines():
        if line.startswith(PREFIX):
            return [s for s in line[len(PREFIX):].split(", ") if s]
    return []
