"""``fuse(model, fusion_patterns) -> (ModelProto, FusionReport)``: the library entry point, the fusion
pipeline in order (docs/ARCHITECTURE.md §1).

For each requested rule in catalogue priority: its candidates, anchors in graph order, no node
claimed twice (``match``) -> legality beyond the rule's own checks (``legality``) -> the kernel
(``kernel_choice.selection``) -> the keep policy -> naming (``provenance``); then the decided matches are
written into the graph (``apply``), the metadata set, and ``onnx.checker`` run. The input model is
never modified.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

import onnx

from ortfuse.fusion import catalogue
from ortfuse.fusion.apply import apply_matches
from ortfuse.fusion.catalogue import validate_patterns
from ortfuse.fusion.discontinuity import deciding_tensors
from ortfuse.fusion.legality import legality
from ortfuse.fusion.match import candidates
from ortfuse.fusion.ort_territory import reserved_for_ort
from ortfuse.fusion.provenance import is_rewritten, name_match
from ortfuse.fusion.report import DISABLED, FUSED, REJECTED, FusionReport, MatchRecord
from ortfuse.fusion.rulekit.lowering import label_of
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir import metadata
from ortfuse.ir.graph import GraphIndex
from ortfuse.kernel_choice import registry
from ortfuse.kernel_choice.selection import LEFT_TO_ORT, choose_kernel

MIN_OPSET = 7

KeepRule = Callable[[MatchRecord], str]  # a legal match -> "" to fuse it, or the reason to leave it unfused
KernelChoice = Callable[[Match], "str | None"]  # a legal match -> its kernel preference (None: the default order)


_UNSET: object = object()


def fuse(model: onnx.ModelProto, fusion_patterns: Iterable[str] | str | None = None,
         kernels: str | KernelChoice | None = None, keep: KeepRule | None = None,
         precision: str | None = None, *, patterns: object = _UNSET) -> tuple[onnx.ModelProto, FusionReport]:
    """Return a rewritten copy of ``model`` and the report of every candidate match.

    ``fusion_patterns``: the pattern ids to fuse (None: all), spelled as ``InferenceSession``'s
    keyword; ``patterns=`` is its former name, still taken with a DeprecationWarning.

    Each fused op gets the kernel ``registry.select`` picks for this CPU and epilogue: one custom
    node (native or reference), or the ORT nodes of a lowering form. ``kernels`` restricts the
    paths (``"reference"`` forces the numpy reference path; ``"native"``, ``"lowered"`` or
    ``"lowered:<form>"`` likewise; ``"ort"`` leaves matches to ORT); a match with no kernel stays
    unfused, with the reason. A callable gives that preference per match (None: the default order,
    which puts the ranking measured on this machine first, ``ortfuse.kernel_choice.ranking``).
    ``keep`` (the auto policy, ``ortfuse verify``'s bisection) sees each legal match, identified by
    pattern id and original node names, and may leave it unfused: it is then reported as disabled
    by policy with the reason ``keep`` returned, and its nodes are still not matched by another pattern.
    ``precision`` ("fp32" | "bf16"; None: ``$ORTFUSE_PRECISION``, else "fp32") is the opt-in to
    reduced-precision kernels: only "bf16" lets the registry pick one (the AMX GEMM, on AMX CPUs).

    Unknown pattern ids raise ``UnknownPatternError``; a model whose rewrite would fail
    ``onnx.checker`` comes back unchanged with the reason in the report.
    """
    if patterns is not _UNSET:
        if fusion_patterns is not None:
            raise TypeError("fuse() takes fusion_patterns= or its deprecated name patterns=, not both")
        warnings.warn("fuse(patterns=...) is deprecated: use fusion_patterns=, as InferenceSession spells it",
                      DeprecationWarning, stacklevel=2)
        fusion_patterns = patterns  # type: ignore[assignment]
    ids = validate_patterns(fusion_patterns)
    precision = registry.resolve_precision(precision)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    report = FusionReport(patterns=list(ids))
    if is_rewritten(model):
        report.reason = "the model already holds ortfuse fused ops; it is not matched again"
        return out, report
    ix = GraphIndex(out)
    if ix.opset < MIN_OPSET:
        # ORT lacks kernels for some ops below opset 7; fusing them away would run what ORT refuses.
        report.reason = (f"model opset {ix.opset} is below {MIN_OPSET}, the oldest ORT supports; left as ORT runs it"
                         if ix.opset else "the model imports no ai.onnx opset; left as ORT runs it")
        return out, report
    if ix.structure_problem:  # ORT rejects the graph itself; walking it could loop
        report.reason = f"the graph is not a valid DAG ({ix.structure_problem}); left as ORT runs it"
        return out, report
    problem = _checker_problem(model)
    if problem:  # a flaw inside the replaced nodes would vanish: ortfuse would run a model ORT rejects
        report.reason = f"the model fails onnx.checker ({problem}); left as ORT runs it"
        return out, report
    if ix.shape_inference_error:
        report.notes.append(f"ONNX shape inference failed ({ix.shape_inference_error}); shapes unknown")
    matches = _decide(ix, ids, report, kernels, keep, precision)
    if not matches:
        report.reason = "no candidate was fused" if report.matches else "no pattern matched"
        return out, report
    apply_matches(out, ix, matches)
    metadata.write_props(out, {
        metadata.FUSION_ENABLED: "true",
        metadata.FUSION_PATTERN_ID: ",".join(ids),
        metadata.ORTFUSE_VERSION: _version(),
        metadata.GRAPH_DIGEST: metadata.graph_digest(model),
        metadata.REWRITTEN: "true",
    })
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as exc:
        unchanged = onnx.ModelProto()
        unchanged.CopyFrom(model)
        report.reason = f"internal error: the rewritten model failed onnx.checker ({exc}); model left unfused"
        for record in report.fused:
            record.decision, record.reason = REJECTED, "rewrite failed onnx.checker"
        return unchanged, report
    report.applied = True
    report.reason = f"{len(matches)} fused op(s)"
    return out, report


def _decide(ix: GraphIndex, ids: tuple[str, ...], report: FusionReport, kernels: str | KernelChoice | None,
            keep: KeepRule | None, precision: str = registry.FP32) -> list[Match]:
    """Every candidate of the requested rules decided and reported: rejected (with the reason),
    disabled by the keep policy, or fused (claimed, with its kernel and name). Returns the fused."""
    reserved = reserved_for_ort(ix)
    deciding = deciding_tensors(ix)
    matches: list[Match] = []
    for rule in catalogue.RULES:
        if rule.id not in ids:
            continue
        rejected: set[int] = set()  # nodes of this rule's rejected candidates: not anchors again
        for result in candidates(ix, rule, rejected):
            names = [ix.name_of(n) for n in result.nodes]
            result = legality(ix, rule, result, reserved, deciding)
            if isinstance(result, Match):
                prefer = kernels(result) if callable(kernels) else kernels
                selection, lowered = choose_kernel(ix, result, prefer, precision)
                if selection.reason == LEFT_TO_ORT:  # measured: ORT runs these nodes best; no other rule takes them
                    ix.claimed |= {id(n) for n in result.nodes}
                    report.matches.append(MatchRecord(rule.id, names, DISABLED, selection.reason))
                    continue
                if selection.kernel is None:
                    result = Reject(rule.id, result.nodes, selection.reason)
            if isinstance(result, Reject):
                rejected |= {id(n) for n in (result.nodes[:1] if result.shorter_may_fit else result.nodes)}
                report.matches.append(MatchRecord(rule.id, names, REJECTED, result.reason))
                continue
            ix.claimed |= {id(n) for n in result.nodes}  # claimed even if the keep policy leaves it unfused
            result.lowered = lowered
            label = label_of(lowered.nodes) if lowered else selection.label
            why_not = keep(MatchRecord(rule.id, names, FUSED, kernel=label)) if keep else ""
            if why_not:
                report.matches.append(MatchRecord(rule.id, names, DISABLED, why_not))
                continue
            result.op_type = selection.kernel.op_type
            name_match(ix, result, len(matches), names)
            matches.append(result)
            report.matches.append(MatchRecord(rule.id, names, FUSED, fused_node=result.node_name, kernel=label))
    return matches


def _checker_problem(model: onnx.ModelProto) -> str:
    """Why ``onnx.checker`` with strict shape inference rejects ``model`` (ORT's own load checks are
    alike: unknown attributes, wrong attribute types, type or shape clashes), or ""."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # ValidationError, InferenceError, or a protobuf limit
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"
    return ""


def _version() -> str:
    from ortfuse._version import __version__ as ortfuse_version

    return ortfuse_version
