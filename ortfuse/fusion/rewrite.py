"""``fuse(model, patterns) -> (ModelProto, FusionReport)``: the library entry point of the rewriter.

Pipeline: match every requested pattern on the original graph (patterns in catalogue priority,
anchors in graph order, no node claimed twice) -> legality (each matcher returns a Reject with its
reason) -> kernel (``registry.select``) -> rewrite (one fused node per match, or for a ``lowered``
kernel the few ORT nodes of its ``lowering`` rule, placed where the last replaced node was; folded
weights as new initializers; dead constants dropped; value_info kept for fused outputs) ->
metadata and provenance -> ``onnx.checker``.

Provenance: every node the rewriter writes has the doc_string ``ortfuse <pattern_id>: replaces
<names>``; custom-domain nodes also carry the ``pattern_id`` / ``replaced_nodes`` attributes (ORT's
own ops cannot). Of a lowered group, the node writing the match output is named ``fused_node`` and
the others ``<fused_node>/<k>``. A rewritten model carries the metadata key ``ortfuse_rewritten``.

The input model is never modified. Only the top-level graph is rewritten: If/Loop/Scan bodies are
left alone, and outer tensors they read count as used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import re

import onnx

from ortfuse.kernels import lowering
from ortfuse.ir import metadata
from ortfuse.kernels import registry
from ortfuse.fusion.catalogue import validate_patterns
from ortfuse.custom_ops.registration import native_node_attrs
from ortfuse.custom_ops.specs import DOMAIN, SPECS, spec_for_op_type
from ortfuse.ir.graph import GraphIndex, node_inputs_with_subgraphs
from ortfuse.fusion.ort_territory import reserved_for_ort
from ortfuse.fusion.patterns import MATCHERS
from ortfuse.fusion.patterns.base import Match, Reject, intermediate_problem
from ortfuse.fusion.report import DISABLED, FUSED, REJECTED, FusionReport, MatchRecord

MIN_OPSET = 7
UNEXPLAINED_PATTERNS = {"eltwise_chain"}  # chains simply end at a shared tensor: not a rejection
GENERIC_PATTERNS = {"eltwise_chain", "add_relu"}


PROVENANCE_DOC = re.compile(r"^ortfuse (\S+): replaces (.*)$")


def native_op_types(model: onnx.ModelProto) -> set[str]:
    """The native fused op types a (fused) model uses, lowered groups included."""
    return {n.op_type for n in model.graph.node
            if n.domain == DOMAIN and spec_for_op_type(n.op_type) and not n.op_type.endswith("Ref")}


def reference_op_inputs(model: onnx.ModelProto) -> frozenset[str] | None:
    """The tensor names read by the model's reference (Python-op) kernels, or None when it has none."""
    ref = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type.endswith("Ref") and spec_for_op_type(n.op_type)]
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
    fused op, or per lowered group (the nodes sharing one provenance)."""
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
            kernel = lowering.label_of(nodes)
            read = {i for n in nodes for i in n.input}
            fused_node = next((n.name for n in reversed(nodes) if not set(n.output) & read), nodes[-1].name)
        report.matches.append(MatchRecord(pid, replaced.split(","), FUSED, fused_node=fused_node, kernel=kernel))
    report.patterns = sorted({m.pattern_id for m in report.matches})
    report.reason = f"model was saved already fused ({len(report.matches)} fused op(s))"
    return report


KeepRule = Callable[[MatchRecord], str]  # a legal match -> "" to fuse it, or the reason to leave it unfused


def fuse(model: onnx.ModelProto, patterns: Iterable[str] | str | None = None,
         kernels: str | None = None, keep: KeepRule | None = None,
         precision: str | None = None) -> tuple[onnx.ModelProto, FusionReport]:
    """Return a rewritten copy of ``model`` and the report of every candidate match.

    Each fused op gets the kernel ``registry.select`` picks for this CPU and epilogue: one custom
    node (native or reference), or the ORT nodes of a lowering rule. ``kernels`` restricts the
    paths (``"reference"`` forces the numpy reference path; ``"native"``, ``"lowered"`` or
    ``"lowered:<form>"`` likewise); a match with no kernel stays unfused, with the reason.
    ``keep`` (the auto policy, ``ortfuse verify``'s bisection) sees each legal match, identified by
    pattern id and original node names, and may leave it unfused: it is then reported as disabled
    by policy with the reason ``keep`` returned, and its nodes are still not matched by another pattern.
    ``precision`` ("fp32" | "bf16"; None: ``$ORTFUSE_PRECISION``, else "fp32") is the opt-in to
    reduced-precision kernels: only "bf16" lets the registry pick one (the AMX GEMM, on AMX CPUs).

    Unknown pattern ids raise ``UnknownPatternError``; a model whose rewrite would fail
    ``onnx.checker`` comes back unchanged with the reason in the report.
    """
    ids = validate_patterns(patterns)
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
    matches = _match_all(ix, ids, report, kernels, keep, precision)
    if not matches:
        report.reason = "no candidate was fused" if report.matches else "no pattern matched"
        return out, report
    _apply(out, ix, matches)
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
    from ortfuse import __version__

    return __version__


def _match_all(ix: GraphIndex, ids: tuple[str, ...], report: FusionReport, kernels: str | None,
               keep: KeepRule | None, precision: str = registry.FP32) -> list[Match]:
    claimed: dict[int, str] = {}
    reserved = reserved_for_ort(ix)
    matches: list[Match] = []
    for pid in ids:
        matcher = MATCHERS[pid]
        rejected: set[int] = set()  # nodes of this pattern's rejected candidates: not anchors again
        for node in ix.graph.node:
            if id(node) in claimed or id(node) in rejected:
                continue
            result = matcher(ix, node)
            if result is None and pid not in UNEXPLAINED_PATTERNS:
                result = _explain_near_miss(ix, matcher, node, pid)
            if result is None:
                continue
            names = [ix.name_of(n) for n in result.nodes]
            if any(id(n) in claimed for n in result.nodes):
                continue  # taken by a higher-priority match: not a candidate of its own
            if pid in GENERIC_PATTERNS and any(id(n) in reserved for n in result.nodes):
                report.matches.append(MatchRecord(pid, names, REJECTED, "left to ORT, which fuses it (LayerNorm)"))
                rejected |= {id(n) for n in result.nodes}
                continue
            if isinstance(result, Match) and ix.shape(result.output) == []:
                # extensions' Python ops return a rank-0 result as [1]
                result = Reject(pid, result.nodes, f"rank-0 tensor '{result.output}': the fused op path "
                                                   "does not keep scalar shapes")
            selection, lowered = None, {}
            if isinstance(result, Match):
                selection, lowered = _select(ix, result, kernels, precision)
                if selection.kernel is None:
                    result = Reject(pid, result.nodes, selection.reason)
            if isinstance(result, Reject):
                rejected |= {id(n) for n in result.nodes}
                report.matches.append(MatchRecord(pid, names, REJECTED, result.reason))
                continue
            for n in result.nodes:
                claimed[id(n)] = pid
                ix.claimed.add(id(n))
            result.lowered = lowered.get(selection.kernel)
            label = result.lowered.label if result.lowered else selection.label
            why_not = keep(MatchRecord(pid, names, FUSED, kernel=label)) if keep else ""
            if why_not:
                report.matches.append(MatchRecord(pid, names, DISABLED, why_not))
                continue
            result.op_type = selection.kernel.op_type
            matches.append(result)
            result.node_name = ix.unique_name(f"ortfuse_{pid}_{len(matches) - 1}")
            if result.lowered:
                _name_lowered(ix, result, names)
            record = MatchRecord(pid, names, FUSED, fused_node=result.node_name, kernel=label)
            report.matches.append(record)
    return matches


def _select(ix: GraphIndex, m: Match, prefer: str | None,
            precision: str = registry.FP32) -> tuple[registry.Selection, dict]:
    """The registry's kernel for ``m``; for a lowered kernel, its nodes (``{kernel: Lowered}``)."""
    ctx = lowering.Context(ix.opset, lambda hint: ix.unique_name(f"{m.output}/{hint}"), ix.shape)
    built: dict = {}

    def fits(kernel: registry.Kernel) -> str:
        if kernel.path == registry.NATIVE:  # a native kernel would fail at run time where ORT runs
            rank, name = max(((len(ix.shape(t) or ()), t) for t in [*m.inputs, m.output] if t), default=(0, ""))
            if rank > registry.NATIVE_MAX_RANK:
                return f"native kernels take rank <= {registry.NATIVE_MAX_RANK}, '{name}' has rank {rank}"
            try:
                native_node_attrs(kernel.op_type, m.attrs)
            except ValueError as exc:
                return f"native {kernel.op}: {exc}"
            return registry.amx_misfit(m) if kernel.native_op == registry.AMX_OP else ""
        if kernel.path != registry.LOWERED:
            return ""
        out = lowering.lower(kernel.form, m, ctx)
        if isinstance(out, str):
            return out
        built[kernel] = out
        return ""

    return registry.select(m.op, m.dtype, prefer=prefer, variant=m.attrs.get("activation", ""), fits=fits,
                           precision=precision), built


def _name_lowered(ix: GraphIndex, m: Match, names: list[str]) -> None:
    """Name a lowered group (the node writing the output: ``m.node_name``; the others
    ``<node_name>/<k>``) and write its provenance."""
    doc = f"ortfuse {m.pattern_id}: replaces {','.join(names)}"
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


def _explain_near_miss(ix: GraphIndex, matcher, node: onnx.NodeProto, pid: str) -> Reject | None:
    """Match again letting single-consumer steps follow any consumer; a candidate found that way
    was missed only because an intermediate tensor is used elsewhere, which becomes its reason."""
    ix.relaxed = True
    try:
        result = matcher(ix, node)
    finally:
        ix.relaxed = False
    if result is None or any(id(n) in ix.claimed for n in result.nodes):
        return None
    problem = result.reason if isinstance(result, Reject) else intermediate_problem(ix, result.nodes, result.output)
    return Reject(pid, result.nodes, problem) if problem else None


def _apply(model: onnx.ModelProto, ix: GraphIndex, matches: list[Match]) -> None:
    graph = model.graph
    last = {}
    for m in matches:
        last[id(max(m.nodes, key=lambda n: ix.position[id(n)]))] = m
    replaced = {id(n) for m in matches for n in m.nodes}
    new_nodes = []
    for node in graph.node:
        if id(node) in last:
            m = last[id(node)]
            new_nodes.extend(m.lowered.nodes if m.lowered else [_fused_node(ix, m)])
        elif id(node) not in replaced:
            new_nodes.append(node)
    new_inits = [t for m in matches for t in m.initializers + (m.lowered.initializers if m.lowered else [])]
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_inits)
    _drop_dead_constants(graph)
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
    for domain in (DOMAIN, lowering.MS_DOMAIN):
        if domain in used and not any(o.domain == domain for o in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid(domain, 1))


def _fused_node(ix: GraphIndex, m: Match) -> onnx.NodeProto:
    spec = SPECS[m.op]
    names = ",".join(ix.name_of(n) for n in m.nodes)
    native = bool(m.op_type) and not m.op_type.endswith("Ref")
    attrs = {**m.attrs, **(native_node_attrs(m.op_type, m.attrs) if native else {}),
             "pattern_id": m.pattern_id, "replaced_nodes": names}
    missing = set(spec.all_attrs()) - set(attrs)
    assert not missing, f"{m.op} match lacks attributes {missing}"
    return onnx.helper.make_node(m.op_type or spec.ref_op_type, m.inputs, [m.output], name=m.node_name,
                                 domain=DOMAIN, doc_string=f"ortfuse {m.pattern_id}: replaces {names}", **attrs)


def _drop_dead_constants(graph: onnx.GraphProto) -> None:
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
