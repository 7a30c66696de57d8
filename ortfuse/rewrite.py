"""``fuse(model, patterns) -> (ModelProto, FusionReport)``: the library entry point of the rewriter.

Pipeline: match (patterns) -> legality (ok | reason) -> rewrite (+ metadata, provenance).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx

from ortfuse.catalogue import validate_patterns
from ortfuse.report import FusionReport


def fuse(model: onnx.ModelProto, patterns: Iterable[str] | str | None = None) -> tuple[onnx.ModelProto, FusionReport]:
    """Return a rewritten copy of ``model`` and the report of every candidate match.

    The input model is never modified. Unknown pattern ids raise ``UnknownPatternError``.
    """
    ids = validate_patterns(patterns)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    report = FusionReport(applied=False, reason="the rewriter has no rules yet", patterns=list(ids))
    return out, report
