"""GraphEdit: one graph rewritten by a pass, its edits recorded and then committed together.

The passes that rewrite a graph (the layout step's, ``ortfuse.layout``) look nodes up on the graph
as it is and record what changes; ``commit`` writes it all at once:

    edit = GraphEdit(graph)
    for node in graph.node:
        relu = edit.child(node.output[0], "Relu")
        ...
        edit.replace(node, fused)      # fused takes node's place
        edit.drop(relu)
    edit.commit()                      # then what only the removed nodes read is pruned
"""

from __future__ import annotations

import collections
import heapq

import onnx

from ortfuse.ir.links import GraphLinks, node_inputs_with_subgraphs


class GraphEdit(GraphLinks):
    """The links of ``graph`` (``GraphLinks``) and the edits recorded against it.

    Contract:

    - Until ``commit``, every lookup (producers, readers, walks, the nodes' own inputs) answers for the
      graph as it was when the GraphEdit was made; recording an edit changes nothing in ``graph``.
    - ``replace(node, *new)``: ``new`` takes ``node``'s place, in that order; ``drop(*nodes)``: they
      leave the graph. A node edited twice is a ValueError (two rewrites claimed it).
    - ``rewire(old, new)``: at commit every node reading ``old`` (new nodes too) reads ``new`` instead.
    - ``add_initializer(*tensors)``: appended to the graph's initializers at commit.
    - ``commit()``: applies the edits in place, then prunes what became unused: a node whose every
      output is no longer read (by a node or an If/Loop/Scan body) nor returned by the graph, and an
      initializer no longer read, when a removed node read it or a rewire moved its readers away;
      and so on, up the producers of what was pruned. Nothing else is removed; graph inputs and
      outputs are never changed. The nodes end in an order where each input is written before it
      is read (an order that already is one is kept). When no such order exists, it raises
      ValueError and ``graph`` is unchanged. A GraphEdit is spent after its commit.
    """

    def __init__(self, graph: onnx.GraphProto) -> None:
        super().__init__(graph)
        self._replaced: dict[int, list[onnx.NodeProto]] = {}  # id(node) -> what takes its place ([] dropped)
        self._rewired: dict[str, str] = {}
        self._new_initializers: list[onnx.TensorProto] = []
        self._committed = False

    # --- recording ----------------------------------------------------------------------------
    def edited(self, node: onnx.NodeProto) -> bool:
        """Whether an edit already replaces or drops ``node``."""
        return id(node) in self._replaced

    def replace(self, node: onnx.NodeProto, *new: onnx.NodeProto) -> None:
        if self.edited(node):
            raise ValueError(f"node '{node.name or node.op_type}' is edited twice")
        self._replaced[id(node)] = list(new)

    def drop(self, *nodes: onnx.NodeProto) -> None:
        for node in nodes:
            self.replace(node)

    def rewire(self, old: str, new: str) -> None:
        self._rewired[old] = new

    def add_initializer(self, *tensors: onnx.TensorProto) -> None:
        self._new_initializers.extend(tensors)

    # --- committing ---------------------------------------------------------------------------
    def commit(self) -> bool:
        """Apply the recorded edits (class docstring); returns whether anything was recorded."""
        if self._committed:
            raise ValueError("this GraphEdit was committed already; index the graph again to edit it more")
        self._committed = True
        if not self._replaced and not self._rewired and not self._new_initializers:
            return False
        nodes: list[onnx.NodeProto] = []
        loose: set[str] = set(self._rewired)  # tensors whose readers went away: candidates for pruning
        for node in self.graph.node:
            new = self._replaced.get(id(node))
            if new is None:
                nodes.append(node)
            else:
                nodes.extend(new)
                loose.update(node_inputs_with_subgraphs(node))
        nodes = [self._rewired_copy(n) for n in nodes]
        initializers = [*self.graph.initializer, *self._new_initializers]
        nodes, initializers = _prune(nodes, initializers, loose, self.graph_outputs)
        order = topological_order(nodes, {i.name for i in self.graph.input} | {t.name for t in initializers})
        del self.graph.node[:]
        self.graph.node.extend(order)
        if len(initializers) != len(self.graph.initializer) or self._new_initializers:
            del self.graph.initializer[:]
            self.graph.initializer.extend(initializers)
        return True

    def _rewired_copy(self, node: onnx.NodeProto) -> onnx.NodeProto:
        """``node`` with its rewired inputs renamed: a copy, so that ``graph`` stays as it was until
        the commit succeeds."""
        if not any(t in self._rewired for t in node.input):
            return node
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [self._rewired.get(t, t) for t in node.input]
        return copy


def _prune(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto], loose: set[str],
           outputs: set[str]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """``nodes`` and ``initializers`` without what became unused, starting from the ``loose`` tensors."""
    readers: collections.Counter = collections.Counter()
    for node in nodes:
        readers.update(node_inputs_with_subgraphs(node))
    writer = {o: node for node in nodes for o in node.output if o}
    init_names = {t.name for t in initializers}
    removed_nodes: set[int] = set()
    removed_inits: set[str] = set()
    todo = list(loose)
    while todo:
        tensor = todo.pop()
        if readers[tensor] or tensor in outputs:
            continue
        dead = writer.get(tensor)
        if dead is not None:
            if id(dead) in removed_nodes or any(readers[o] or o in outputs for o in dead.output if o):
                continue
            removed_nodes.add(id(dead))
            for name in node_inputs_with_subgraphs(dead):
                readers[name] -= 1
                todo.append(name)
        elif tensor in init_names:
            removed_inits.add(tensor)
    return ([n for n in nodes if id(n) not in removed_nodes],
            [t for t in initializers if t.name not in removed_inits])


def topological_order(nodes: list[onnx.NodeProto], sources: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where every input (read by a node or its If/Loop/Scan bodies) is written
    before it is read, the earliest node first among those ready (so an order that already is one is
    kept); ValueError when there is none (a cycle). Names in ``sources`` (graph inputs, initializers)
    are no dependencies."""
    made = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{made[t] for t in node_inputs_with_subgraphs(n) if t in made and t not in sources} for n in nodes]
    users: dict[int, list[int]] = collections.defaultdict(list)
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    waiting = [len(ds) for ds in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise ValueError("the rewritten graph has a cycle")
    return order
