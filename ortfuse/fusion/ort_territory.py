"""Subgraphs that stock ORT already fuses better than a generic fused op would, so ortfuse's
generic rules (those declaring ``yields_to_ort``) leave them to ORT (docs/ARCHITECTURE.md §9):

- decomposed LayerNorm, ReduceMean(x) -> Sub -> Pow/Mul -> ReduceMean -> Add(eps) -> Sqrt -> Div
  -> Mul(gamma) -> Add(beta), which ORT turns into LayerNormalization, together with the residual
  and bias Adds in front of it, which ORT folds into SkipLayerNormalization.
"""

from __future__ import annotations

import onnx

from ortfuse.ir.graph import GraphIndex

_LAYERNORM_OPS = {"ReduceMean", "Sub", "Pow", "Mul", "Add", "Sqrt", "Div"}
_MAX_DEPTH = 7


def reserved_for_ort(ix: GraphIndex) -> set[int]:
    """ids of the nodes that generic patterns must not claim."""
    reserved: set[int] = set()
    for node in ix.graph.node:
        if node.op_type != "ReduceMean" or id(node) in reserved:
            continue
        x = node.input[0]
        region = _layernorm_region(ix, node, x)
        if region is None:
            continue
        reserved |= region
        reserved |= _skip_adds(ix, x)
    return reserved


def _layernorm_region(ix: GraphIndex, mean: onnx.NodeProto, x: str) -> set[int] | None:
    """The nodes from ReduceMean(x) to the normalising Div and its affine Mul/Add, or None."""
    region = {id(mean)}
    frontier = [mean.output[0]] + [n.output[0] for n in ix.consumers_of(x) if n.op_type == "Sub"]
    region |= {id(n) for n in ix.consumers_of(x) if n.op_type == "Sub"}
    div = None
    for _ in range(_MAX_DEPTH):
        nxt = []
        for tensor in frontier:
            for user in ix.consumers_of(tensor):
                if user.op_type in _LAYERNORM_OPS and id(user) not in region:
                    region.add(id(user))
                    nxt.append(user.output[0])
                    if user.op_type == "Div":
                        div = user
        frontier = nxt
        if div is not None:
            break
    if div is None:
        return None
    tail = div.output[0]
    for op in ("Mul", "Add"):  # gamma, beta
        user = ix.only_consumer(tail)
        if user is None or user.op_type != op or ix.const(ix.other_input(user, tail) or "") is None:
            break
        region.add(id(user))
        tail = user.output[0]
    return region


def _skip_adds(ix: GraphIndex, x: str) -> set[int]:
    """The residual Add producing the LayerNorm input and a bias Add feeding it."""
    out: set[int] = set()
    add = ix.producer.get(x)
    if add is None or add.op_type != "Add":
        return out
    out.add(id(add))
    for name in add.input:
        bias = ix.producer.get(name)
        if bias is not None and bias.op_type == "Add" and any(ix.const(i) is not None for i in bias.input):
            out.add(id(bias))
    return out
