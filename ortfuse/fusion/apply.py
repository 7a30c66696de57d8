"""The last step of the pipeline: the decided matches written into the graph (docs/ARCHITECTURE.md §1).

Each match becomes one fused node, or the ORT nodes of its lowering form, placed where the last
replaced node was; folded weights become new initializers; constants nothing reads any more are
dropped; value_info is kept for fused outputs. Only the top-level graph is rewritten: If/Loop/Scan
bodies are left alone, and outer tensors they read count as used."""

from __future__ import annotations

import onnx

from ortfuse.custom_ops.registration import native_node_attrs
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.catalogue import SPECS
from ortfuse.fusion.provenance import doc_string
from ortfuse.fusion.rulekit.lowering import MS_DOMAIN
from ortfuse.fusion.rulekit.result import Match
from ortfuse.ir.graph import GraphIndex, node_inputs_with_subgraphs


def apply_matches(model: onnx.ModelProto, ix: GraphIndex, matches: list[Match]) -> None:
    """Rewrite ``model`` (whose graph ``ix`` indexes) in place with ``matches``."""
    graph = model.graph
    last = {}
    for m in matches:
        last[id(max(m.nodes, key=lambda n: ix.position[id(n)]))] = m
    replaced = {id(n) for m in matches for n in m.nodes}
    new_nodes = []
    for node in graph.node:
        if id(node) in last:
            m = last[id(node)]
            new_nodes.extend(m.lowered.nodes if m.lowered else [fused_node(ix, m)])
        elif id(node) not in replaced:
            new_nodes.append(node)
    new_inits = [t for m in matches for t in m.initializers + (m.lowered.initializers if m.lowered else [])]
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_inits)
    drop_dead_constants(graph)
    known_vi = {vi.name for vi in graph.value_info} | {o.name for o in graph.output}
    removed = {o for m in matches for n in m.nodes for o in n.output} - {m.output for m in matches}
    keep_vi = [vi for vi in graph.value_info if vi.name not in removed]
    del graph.value_info[:]
    graph.value_info.extend(keep_vi)
    for m in matches:
        vi = ix.value_info(m.output)
        if vi is not None and m.output not in known_vi:
            graph.value_info.append(vi)
    used = {n.domain for n in graph.node}
    for domain in (DOMAIN, MS_DOMAIN):
        if domain in used and not any(o.domain == domain for o in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid(domain, 1))


def fused_node(ix: GraphIndex, m: Match) -> onnx.NodeProto:
    """The one custom node of a match on the native or reference path, with its provenance."""
    spec = SPECS[m.op]
    names = [ix.name_of(n) for n in m.nodes]
    native = bool(m.op_type) and not m.op_type.endswith("Ref")
    attrs = {**m.attrs, **(native_node_attrs(m.op_type, m.attrs) if native else {}),
             "pattern_id": m.pattern_id, "replaced_nodes": ",".join(names)}
    missing = set(spec.all_attrs()) - set(attrs)
    assert not missing, f"{m.op} match lacks attributes {missing}"
    return onnx.helper.make_node(m.op_type or spec.ref_op_type, m.inputs, [m.output], name=m.node_name,
                                 domain=DOMAIN, doc_string=doc_string(m.pattern_id, names), **attrs)


def drop_dead_constants(graph: onnx.GraphProto) -> None:
    """Remove Constant-only chains and initializers that nothing reads any more (repeat to a fixpoint).

    Only constant-computing nodes are removed; graph inputs and outputs are never touched."""
    const_ops = {"Constant", "Reshape", "Identity", "Unsqueeze", "Squeeze", "Cast"}
    while True:
        used = {o.name for o in graph.output}
        for node in graph.node:
            used.update(node_inputs_with_subgraphs(node))
        dead = [n for n in graph.node if n.op_type in const_ops and not any(o in used for o in n.output)
                and (n.op_type == "Constant" or all(_is_constant_input(graph, i) for i in n.input if i))]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    inputs = {i.name for i in graph.input}
    live = [t for t in graph.initializer if t.name in used or t.name in inputs]
    if len(live) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(live)


def _is_constant_input(graph: onnx.GraphProto, name: str) -> bool:
    return any(t.name == name for t in graph.initializer) or any(
        n.op_type == "Constant" and name in n.output for n in graph.node)
