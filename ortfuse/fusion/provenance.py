"""Provenance of fused nodes: how the rewriter names and marks what it writes, and reading it back
from a model saved already fused (docs/ARCHITECTURE.md §3).

Every node the rewriter writes has the doc_string ``ortfuse <pattern_id>: replaces <names>``;
custom-domain nodes also carry the ``pattern_id`` / ``replaced_nodes`` attributes (ORT's own ops
cannot). Of a lowered group, the node writing the match output is named ``fused_node`` and the
others ``<fused_node>/<k>``. A rewritten model carries the metadata key ``ortfuse_rewritten``.
"""

from __future__ import annotations

import re

import onnx

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.catalogue import canonical_id, spec_for_op_type
from ortfuse.fusion.report import FUSED, FusionReport, MatchRecord
from ortfuse.fusion.rulekit.lowering import label_of
from ortfuse.fusion.rulekit.result import Match
from ortfuse.ir import metadata
from ortfuse.ir.graph import GraphIndex
from ortfuse.kernel_choice import registry

PROVENANCE_DOC = re.compile(r"^ortfuse (\S+): replaces (.*)$")


def doc_string(pattern_id: str, names: list[str]) -> str:
    return f"ortfuse {pattern_id}: replaces {','.join(names)}"


def name_match(ix: GraphIndex, m: Match, index: int, names: list[str]) -> None:
    """Name the ``index``-th fused match (``ortfuse_<pattern>_<index>``, unique in the graph) and, for
    a lowered one, its nodes with their provenance."""
    m.node_name = ix.unique_name(f"ortfuse_{m.pattern_id}_{index}")
    if m.lowered is None:
        return
    doc = doc_string(m.pattern_id, names)
    k = 0
    for node in m.lowered.nodes:
        if m.output in node.output:
            node.name = m.node_name
        else:
            node.name = ix.unique_name(f"{m.node_name}/{k}")
            k += 1
        node.doc_string = doc
        if node.domain == DOMAIN:  # a native op inside the group carries the provenance attributes too
            node.attribute.extend([onnx.helper.make_attribute("pattern_id", m.pattern_id),
                                   onnx.helper.make_attribute("replaced_nodes", ",".join(names))])


def native_op_types(model: onnx.ModelProto) -> set[str]:
    """The native fused op types a (fused) model uses, lowered groups included."""
    return {n.op_type for n in model.graph.node
            if n.domain == DOMAIN and spec_for_op_type(n.op_type) and not n.op_type.endswith("Ref")}


def reference_op_inputs(model: onnx.ModelProto) -> frozenset[str] | None:
    """The tensor names read by the model's reference (Python-op) kernels, or None when it has none."""
    ref = [n for n in model.graph.node
           if n.domain == DOMAIN and n.op_type.endswith("Ref") and spec_for_op_type(n.op_type)]
    return frozenset(i for n in ref for i in n.input if i) if ref else None


def is_rewritten(model: onnx.ModelProto) -> bool:
    """True when the model was saved already fused (``ortfuse-annotate --rewrite``): it carries the
    ``ortfuse_rewritten`` metadata key, or (models saved before that key) ortfuse's custom ops."""
    if metadata.read_props(model).get(metadata.REWRITTEN, "").lower() == "true":
        return True
    return any(n.domain == DOMAIN and spec_for_op_type(n.op_type) for n in model.graph.node)


def _provenance(node: onnx.NodeProto) -> tuple[str, str] | None:
    """(pattern id, comma-joined replaced names) of a node the rewriter wrote, else None."""
    if node.domain == DOMAIN and spec_for_op_type(node.op_type):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if "pattern_id" in attrs:
            return attrs["pattern_id"].decode(), attrs.get("replaced_nodes", b"").decode()
    found = PROVENANCE_DOC.match(node.doc_string or "")
    return (found.group(1), found.group(2)) if found else None


def report_of_rewritten(model: onnx.ModelProto) -> FusionReport:
    """The report of a model saved already fused, rebuilt from its nodes' provenance: one record per
    fused op, or per lowered group (the nodes sharing one provenance); a former pattern id is read as
    its current one."""
    report = FusionReport(applied=True)
    groups: dict[tuple[str, str], list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        key = _provenance(node)
        if key is not None:
            groups.setdefault(key, []).append(node)
    for (pid, replaced), nodes in groups.items():
        single = nodes[0]
        if len(nodes) == 1 and single.domain == DOMAIN and spec_for_op_type(single.op_type):
            kernel = registry.REFERENCE_LABEL if single.op_type.endswith("Ref") else "native numba"
            fused_node = single.name
        else:
            kernel = label_of(nodes)
            read = {i for n in nodes for i in n.input}
            fused_node = next((n.name for n in reversed(nodes) if not set(n.output) & read), nodes[-1].name)
        report.matches.append(MatchRecord(canonical_id(pid), replaced.split(","), FUSED, fused_node=fused_node,
                                          kernel=kernel))
    report.patterns = sorted({m.pattern_id for m in report.matches})
    report.reason = f"model was saved already fused ({len(report.matches)} fused op(s))"
    return report
