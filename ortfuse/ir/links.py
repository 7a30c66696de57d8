"""GraphLinks: who writes and who reads each tensor of one graph, and walks along those links.

The one index of producers and readers: the matchers see it through ``GraphIndex``, the passes that
rewrite a graph through ``GraphEdit`` (``ortfuse.ir.editing``), the sample feeds directly. The walks
follow a chain of nodes by op type, as ORT's ``match_parent_path`` does in its transformer tools:

    ix.parent_path(node, [("Add", 0), ("MatMul", None)])   # node.input[0] <- Add <- MatMul (any input)
    ix.child_path(tensor, ["Softmax", ("Conv", 0)])        # tensor -> Softmax -> Conv reading it at input 0

and return the nodes, or None at the first step that does not match.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence
from typing import TypeGuard, TypeVar

import onnx

ONNX_DOMAINS = ("", "ai.onnx")  # the default domain's two spellings

OpTypes = str | Collection[str]  # one op type, or any of several
Domain = str | None  # "" the default ONNX domain ("" or "ai.onnx"), another name exactly, None any domain
_Links = TypeVar("_Links", bound="GraphLinks")


def _subgraph_refs(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads that it does not define itself (its outer-scope references)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(node_inputs_with_subgraphs(node))
        defined.update(node.output)
    used.update(o.name for o in graph.output)
    return used - defined


def node_inputs_with_subgraphs(node: onnx.NodeProto) -> list[str]:
    """The tensors ``node`` reads: its inputs ("" omitted), in order and once per slot, then the outer
    tensors each If/Loop/Scan body attribute reads (once per body)."""
    names = [i for i in node.input if i]
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            names.extend(_subgraph_refs(attr.g))
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for sub in attr.graphs:
                names.extend(_subgraph_refs(sub))
    return names


def is_op(node: onnx.NodeProto | None, op_type: OpTypes, domain: Domain = "") -> TypeGuard[onnx.NodeProto]:
    """``node`` exists, has op type ``op_type`` (or one of them) and lives in ``domain`` (see ``Domain``)."""
    if node is None or not (node.op_type == op_type if isinstance(op_type, str) else node.op_type in op_type):
        return False
    return domain is None or (node.domain in ONNX_DOMAINS if domain == "" else node.domain == domain)


class GraphLinks:
    """The producer and the readers of every tensor of ``graph``'s top level, as the graph was when the
    links were made (build new links after changing the graph, or edit it through ``GraphEdit``).

    - ``producer[t]``: the node writing ``t``; absent for graph inputs, initializers and unwritten names.
    - ``consumers_of(t)``: the nodes reading ``t``, in graph order: a node once per input slot holding
      ``t`` and once per If/Loop/Scan body that reads ``t`` from the outer scope; [] when none.
    - ``graph_outputs``: the names the graph returns; ``initializers``: name -> TensorProto.
    - ``near_miss``: False here; True in the view ``explaining()`` returns.
    """

    near_miss = False

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for out in node.output:
                if out:
                    self.producer[out] = node
            for name in node_inputs_with_subgraphs(node):
                self.consumers.setdefault(name, []).append(node)
        self.initializers = {t.name: t for t in graph.initializer}
        self.graph_outputs = {o.name for o in graph.output}

    def explaining(self: _Links) -> _Links:
        """The near-miss view of these links: the same maps (shared, not copied) with ``near_miss`` set,
        in which ``only_consumer`` returns a tensor's first reader whatever their count. A matcher run
        on it finds the candidate that readers of an intermediate tensor outside it kept from matching,
        so the rewriter can say why (``fusion.match``); every other answer is the index's own."""
        view = self.__dict__.get("_near_miss_view")
        if view is None:
            view = copy.copy(self)
            view.near_miss = True
            view.__dict__["_near_miss_view"] = view
            self.__dict__["_near_miss_view"] = view
        return view

    # --- readers ------------------------------------------------------------------------------
    def consumers_of(self, tensor: str) -> list[onnx.NodeProto]:
        return self.consumers.get(tensor, [])

    def only_consumer(self, tensor: str) -> onnx.NodeProto | None:
        """The single reader of ``tensor`` when it has exactly one and is not a graph output, else None;
        in the near-miss view, its first reader whatever their count (None when it has none)."""
        users = self.consumers_of(tensor)
        if self.near_miss:
            return users[0] if users else None
        if len(users) != 1 or tensor in self.graph_outputs:
            return None
        return users[0]

    def uses(self, tensor: str) -> list[tuple[onnx.NodeProto, int]]:
        """(node, input position) of every input slot that reads ``tensor``, in graph order; the reads of
        If/Loop/Scan bodies have no slot and are not listed."""
        out: list[tuple[onnx.NodeProto, int]] = []
        seen: set[int] = set()
        for node in self.consumers_of(tensor):
            if id(node) not in seen:
                seen.add(id(node))
                out += [(node, i) for i, t in enumerate(node.input) if t == tensor]
        return out

    def other_input(self, node: onnx.NodeProto, tensor: str) -> str | None:
        """For a binary node fed by ``tensor``, the other input name (None if not binary)."""
        ins = list(node.input)
        if len(ins) != 2 or tensor not in ins:
            return None
        return ins[1] if ins[0] == tensor else ins[0]

    # --- walks --------------------------------------------------------------------------------
    def child(self, tensor: str, op_type: OpTypes, domain: Domain = "") -> onnx.NodeProto | None:
        """``only_consumer(tensor)`` when it is an ``op_type`` node of ``domain``, else None."""
        node = self.only_consumer(tensor)
        return node if is_op(node, op_type, domain) else None

    def parent(self, tensor: str, op_type: OpTypes, domain: Domain = "") -> onnx.NodeProto | None:
        """The producer of ``tensor`` when it is an ``op_type`` node of ``domain``, else None."""
        node = self.producer.get(tensor)
        return node if is_op(node, op_type, domain) else None

    def child_path(self, tensor: str, steps: Sequence[OpTypes | tuple[OpTypes, int]],
                   domain: Domain = "") -> list[onnx.NodeProto] | None:
        """Follow single readers from ``tensor``: step k is ``child`` of the tensor so far (first
        ``tensor``, then the previous node's output 0) with the step's op type; a step ``(op_type,
        i)`` also needs that node to read the tensor at input ``i``. The nodes, or None."""
        nodes: list[onnx.NodeProto] = []
        for step in steps:
            op_type, index = step if isinstance(step, tuple) else (step, None)
            node = self.child(tensor, op_type, domain)
            if node is None or (index is not None and (len(node.input) <= index or node.input[index] != tensor)):
                return None
            nodes.append(node)
            tensor = node.output[0]
        return nodes

    def parent_path(self, node: onnx.NodeProto, steps: Sequence[tuple[OpTypes, int | None]],
                    domain: Domain = "") -> list[onnx.NodeProto] | None:
        """ORT's ``match_parent_path``: step k ``(op_type, i)`` is the ``parent`` of input ``i`` of the
        node so far (first ``node``) with that op type; ``i`` None takes the first input whose producer
        has it. The nodes, or None."""
        nodes: list[onnx.NodeProto] = []
        for op_type, index in steps:
            if index is None:
                inputs = list(node.input)
            else:
                inputs = [node.input[index]] if -len(node.input) <= index < len(node.input) else []
            found = next((p for t in inputs if (p := self.parent(t, op_type, domain)) is not None), None)
            if found is None:
                return None
            nodes.append(found)
            node = found
        return nodes
