"""Node names of an ORT profile resolved to nodes of the graph ORT was given (the original model, or
for the fused configuration the rewritten one the session loaded).

A profiled node is resolved by its exact name, by ORT's naming of its rewrites (``fused <node>``,
``<tensor>_nchwc`` for NCHWc convs, ``<node>/<Name>Fusion/``, ``_token_<k>`` suffixes), or, for stock
ENABLE_ALL, by the producers of the tensors it outputs in ORT's optimized graph (saved by a separate
stock session). An ortfuse layout op stands for the nodes of ORT's graph it replaces. Layout
reorders and anything else stay "unmapped"; nothing is guessed or split.
"""

from __future__ import annotations

import re

from ortfuse.layout import replaced_nodes

REORDER_OPS = {"ReorderInput", "ReorderOutput"}


class NameMap:
    """Maps node names of an ORT profile back to nodes of the original model (see the contract)."""

    _FUSION = re.compile(r"^(.+?)/\w*Fusion/")
    _TOKEN = re.compile(r"_token_\d+$")

    def __init__(self, model, optimized=None) -> None:
        from ortfuse.ir.graph import GraphIndex

        ix = GraphIndex(model, infer_shapes=False)
        self.names = {ix.name_of(n) for n in model.graph.node}
        self.producer = {o: ix.name_of(n) for n in model.graph.node for o in n.output if o}
        # ORT's optimized graph (same node names as its profile): node name -> its output tensors
        self.outputs = {n.name: [o for o in n.output if o] for n in optimized.graph.node} if optimized else {}
        # a layout op names the nodes of ORT's graph it replaces (ortfuse.layout.replaced_nodes)
        self.replaces = {n.name: replaced_nodes.replaced(n) for n in optimized.graph.node} if optimized else {}

    def resolve(self, name: str, op_type: str) -> tuple[list[str], str]:
        if self.replaces.get(name):
            found = {t for r in self.replaces[name] for t in self._resolve(r, "")[0]}
            found |= {self.producer[o] for o in self.outputs.get(name, ()) if o in self.producer}
            if found:
                return sorted(found), "ortfuse layout op (the nodes it replaces)"
        return self._resolve(name, op_type)

    def _resolve(self, name: str, op_type: str) -> tuple[list[str], str]:
        if name in self.names:
            return [name], "same name"
        base = self._TOKEN.sub("", name)
        if base in self.names:
            return [base], "ORT-renamed (_token suffix)"
        if base.startswith("fused ") and base[6:] in self.names:
            return [base[6:]], "ORT fusion (fused <node>)"
        if base.endswith("_nchwc") and base[:-6] in self.producer:
            return [self.producer[base[:-6]]], "ORT NCHWc conv (named after its output)"
        m = self._FUSION.match(base)
        if m and m.group(1) in self.names:
            return [m.group(1)], "ORT fusion (<node>/...Fusion/)"
        if op_type not in REORDER_OPS:
            found = sorted({self.producer[o] for o in self.outputs.get(name, ()) if o in self.producer})
            if found:
                return found, "ORT node producing the original tensor"
        return [], "unmapped" + (" (NCHWc layout reorder)" if op_type in REORDER_OPS else "")
