"""Matching blocks of the attention rule: the pieces of scaled dot-product attention as torch's
exporters write them (TorchScript at opset 14, dynamo at opset 18), each returning what it read or
None (not this piece), or a str naming why the piece cannot be fused.

- ``projection``: ``x @ W [+ b]`` (Add in either order, or no bias), W a constant [D, D'];
- ``heads``: ``Transpose(Reshape(t, target), [0, 2, 1, 3])`` with the target's last two entries the
  constants (heads, head size), the target a constant or a Concat of run-time dims and constants;
- ``key_transposed``: K^T as Transpose([0, 1, 3, 2]) of the heads, or Transpose([0, 2, 3, 1]) of the
  Reshape;
- ``merge_heads``: ``Reshape(Transpose(t, [0, 2, 1, 3]), target)`` with a rank-3 target ending in
  the hidden size or -1;
- ``padding_mask``: the additive mask built from a [batch, seq] ``attention_mask``:
  ``(1 - Cast(Unsqueeze(m)))`` times a constant (TorchScript), or ``Where(Cast(1 - Cast(Expand(
  Unsqueeze(m)))), c, 1 - ...)`` (Hugging Face's SDPA mask, dynamo);
- ``shape_nodes``: the Shape/Gather/Concat/... nodes computing Reshape targets used only there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.graph import GraphIndex

SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Constant", "Identity"}
INTEGER_OR_BOOL = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}


@dataclass
class Projection:
    x: str
    w: np.ndarray  # [D, D'] float64
    b: np.ndarray  # [D'] float64
    nodes: list[onnx.NodeProto]
    output: str


@dataclass
class Heads:
    proj: Projection
    heads: int
    size: int
    nodes: list[onnx.NodeProto]  # Reshape, Transpose
    target: str  # the Reshape's target tensor


def producer(ix: GraphIndex, tensor: str, op_type: str) -> onnx.NodeProto | None:
    node = ix.producer.get(tensor)
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def scalar(ix: GraphIndex, name: str) -> float | None:
    value = ix.const(name)
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.reshape(-1)[0])


def projection(ix: GraphIndex, tensor: str) -> Projection | None:
    """``tensor`` = x @ W [+ b], W a constant 2-D matrix, b a constant vector of W's columns."""
    nodes: list[onnx.NodeProto] = []
    bias = None
    add = producer(ix, tensor, "Add")
    if add is not None:
        for i in (0, 1):
            mm = producer(ix, add.input[i], "MatMul")
            b = ix.const(add.input[1 - i])
            if mm is not None and b is not None:
                nodes, bias, tensor = [add], b, add.input[i]
                break
        else:
            return None
    mm = producer(ix, tensor, "MatMul")
    if mm is None:
        return None
    w = ix.const(mm.input[1])
    if w is None or w.ndim != 2:
        return None
    n = w.shape[1]
    if bias is None:
        bias = np.zeros(n)
    elif bias.size != n or any(d != 1 for d in bias.shape[:-1]):
        return None
    return Projection(mm.input[0], w.astype(np.float64), bias.astype(np.float64).reshape(n), [mm] + nodes,
                      nodes[-1].output[0] if nodes else mm.output[0])


def target_tail(ix: GraphIndex, target: str, count: int) -> tuple[list[int | None], int] | None:
    """(the last ``count`` entries of a Reshape target, None where computed at run time; the target's
    length), for a constant target or a Concat of 1-element run-time pieces and constants."""
    value = ix.const(target)
    if value is not None:
        flat: list[int | None] = [int(v) for v in value.reshape(-1)]
        return flat[-count:], len(flat)
    concat = producer(ix, target, "Concat")
    if concat is None:
        return None
    entries: list[int | None] = []
    for piece in concat.input:
        part = ix.const(piece)
        if part is not None:
            entries += [int(v) for v in part.reshape(-1)]
            continue
        shape = ix.shape(piece)
        if shape is None or len(shape) != 1 or shape[0] != 1:
            return None  # a run-time piece of unknown length
        entries.append(None)
    return entries[-count:], len(entries)


def heads(ix: GraphIndex, tensor: str, perm: tuple[int, ...] = (0, 2, 1, 3)) -> Heads | str | None:
    """``tensor`` = Transpose(Reshape(projection, [.., .., H, d]), perm)."""
    tr = producer(ix, tensor, "Transpose")
    if tr is None or tuple(attr(tr, "perm", ())) != perm:
        return None
    rs = producer(ix, tr.input[0], "Reshape")
    if rs is None:
        return None
    proj = projection(ix, rs.input[0])
    if proj is None:
        return None
    tail = target_tail(ix, rs.input[1], 2)
    if tail is None or tail[1] != 4 or any(v is None or v <= 0 for v in tail[0]):
        return "the heads' Reshape target does not end in constant (heads, head size)"
    h, d = tail[0]
    assert h is not None and d is not None
    if h * d != proj.w.shape[1]:
        return f"the Reshape to {h} heads of {d} does not split the projection's {proj.w.shape[1]} columns"
    return Heads(proj, h, d, [rs, tr], rs.input[1])


def key_transposed(ix: GraphIndex, tensor: str) -> Heads | str | None:
    """K^T [B, H, d, S]: Transpose([0, 1, 3, 2]) of the heads, or Transpose([0, 2, 3, 1]) of the Reshape."""
    tr = producer(ix, tensor, "Transpose")
    if tr is None:
        return None
    if tuple(attr(tr, "perm", ())) == (0, 1, 3, 2):
        k = heads(ix, tr.input[0])
        if isinstance(k, Heads):
            k.nodes.append(tr)
        return k
    return heads(ix, tensor, perm=(0, 2, 3, 1))


def merge_heads(ix: GraphIndex, tensor: str) -> tuple[list[onnx.NodeProto], str, str] | None:
    """From ``tensor`` [B, H, S, d]: (Transpose, Reshape; output; the Reshape's target) or None."""
    tr = ix.only_consumer(tensor)
    if tr is None or tr.op_type != "Transpose" or tuple(attr(tr, "perm", ())) != (0, 2, 1, 3):
        return None
    # the only Reshape of it; other readers (Shape nodes building the target) go with the match
    reshapes = [n for n in ix.consumers_of(tr.output[0]) if n.op_type == "Reshape" and n.input[0] == tr.output[0]]
    if len(reshapes) != 1 or tr.output[0] in ix.graph_outputs:
        return None
    rs = reshapes[0]
    return [tr, rs], rs.output[0], rs.input[1]


def merged_width_problem(ix: GraphIndex, target: str, hidden: int) -> str:
    tail = target_tail(ix, target, 1)
    if tail is None or tail[1] != 3 or tail[0][0] not in (hidden, -1):
        return f"the heads are not merged back to [batch, seq, {hidden}]"
    return ""


def _unsqueezed_mask(ix: GraphIndex, tensor: str) -> str | None:
    """The [B, S] mask behind Unsqueeze(m, [1, 2]) or Unsqueeze(Unsqueeze(m, 1), 2)."""
    u = producer(ix, tensor, "Unsqueeze")
    if u is None:
        return None
    axes = _axes(ix, u)
    if axes == [1, 2]:
        return u.input[0]
    if axes == [2]:
        inner = producer(ix, u.input[0], "Unsqueeze")
        if inner is not None and _axes(ix, inner) == [1]:
            return inner.input[0]
    return None


def _axes(ix: GraphIndex, node: onnx.NodeProto) -> list[int] | None:
    if len(node.input) > 1:
        value = ix.const(node.input[1])
        return None if value is None else sorted(int(v) for v in value.reshape(-1))
    axes = attr(node, "axes")
    return None if axes is None else sorted(int(v) for v in axes)


def _one_minus_mask(ix: GraphIndex, tensor: str) -> str | None:
    """The [B, S] mask m behind ``1 - Cast(Unsqueeze(m))`` (or with an Expand after the Unsqueeze)."""
    sub = producer(ix, tensor, "Sub")
    if sub is None or scalar(ix, sub.input[0]) != 1.0:
        return None
    cast = producer(ix, sub.input[1], "Cast")
    if cast is None or attr(cast, "to") != onnx.TensorProto.FLOAT:
        return None
    source = cast.input[0]
    expand = producer(ix, source, "Expand")
    if expand is not None:
        source = expand.input[0]
    return _unsqueezed_mask(ix, source)


def padding_mask(ix: GraphIndex, bias: str) -> tuple[str, float] | None:
    """(attention_mask, the value added where it is 0) when the additive mask ``bias`` is built from a
    [batch, seq] integer or bool mask as the exporters write it, else None."""
    found: tuple[str | None, float | None] = (None, None)
    mul = producer(ix, bias, "Mul")
    where = producer(ix, bias, "Where")
    if mul is not None:
        for i in (0, 1):
            c = scalar(ix, mul.input[1 - i])
            if c is not None:
                found = (_one_minus_mask(ix, mul.input[i]), c)
                break
    elif where is not None:
        cond = producer(ix, where.input[0], "Cast")
        c = scalar(ix, where.input[1])
        if cond is not None and attr(cond, "to") == onnx.TensorProto.BOOL and cond.input[0] == where.input[2]:
            found = (_one_minus_mask(ix, where.input[2]), c)
    mask, value = found
    if mask is None or value is None:
        return None
    shape = ix.shape(mask)
    if ix.elem_type(mask) not in INTEGER_OR_BOOL or shape is None or len(shape) != 2:
        return None
    return mask, value


def shape_nodes(ix: GraphIndex, targets: list[str], inside: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes computing the Reshape ``targets`` (Shape, Gather, Concat, ...) whose every output is
    read only by ``inside`` or by each other: they go with the match."""
    members = {id(n) for n in inside}
    found: list[onnx.NodeProto] = []
    frontier = list(targets)
    seen: set[str] = set()
    changed = True
    while changed:
        changed = False
        for tensor in list(frontier):
            if tensor in seen or not tensor:
                continue
            node = ix.producer.get(tensor)
            if node is None or node.op_type not in SHAPE_OPS or id(node) in members:
                continue
            users = [u for o in node.output for u in ix.consumers_of(o)]
            if any(o in ix.graph_outputs for o in node.output) or any(id(u) not in members for u in users):
                continue
            members.add(id(node))
            found.append(node)
            seen.add(tensor)
            frontier += list(node.input)
            changed = True
    return found
