"""Squeeze-and-excitation scales on blocked tensors, rewritten in the graph ORT optimized.

ORT's NCHWc transformer blocks a Mul only when both inputs have the same shape, so the SE scale
``x * s`` (x [N, C, H, W], s [N, C, 1, 1], both from blocked ops) is left plain: ORT reorders both
inputs back to NCHW and the product forward to NCHWc again. Rewrite:

    # ReorderOutput(Xb) -> x, ReorderOutput(Sb) -> s, Mul(x, s) -> y, ReorderInput(y) -> Yb
    #   ->   FusedChannelScaleBlocked(Xb, Sb; block) -> Yb

Consumers of ``y`` other than ReorderInput keep it through one ReorderOutput of the new product;
a ReorderOutput left without consumers is removed (``GraphEdit.commit``). ``shape`` gives a tensor's dims in the graph
before ORT optimized it (the tensors around a reorder keep their original names).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import helper

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.editing import GraphEdit
from ortfuse.ir.links import is_op

NCHWC = "com.microsoft.nchwc"
OP = "FusedChannelScaleBlocked"


def _plain_reorder(node: onnx.NodeProto | None, op_type: str) -> bool:
    return is_op(node, op_type, NCHWC) and not attr(node, "channels_last", 0)


def reorder_count(graph: onnx.GraphProto) -> int:
    return sum(1 for n in graph.node if n.domain == NCHWC and n.op_type in ("ReorderInput", "ReorderOutput"))


def block_channel_scales(graph: onnx.GraphProto, shape: Callable[[str], list | None], block: int) -> int:
    """Rewrite every SE scale Mul between blocked tensors in ``graph`` (in place); returns how many."""
    g = GraphEdit(graph)
    replaced = 0
    for node in graph.node:
        if not (is_op(node, "Mul") and len(node.input) == 2):
            continue
        pair = _scale_pair(node, g, shape)
        if pair is None:
            continue
        x, s, channels = pair
        out = node.output[0]
        blocked = f"{out}/blocked_scale"
        new = [helper.make_node(OP, [x.input[0], s.input[0]], [blocked], name=node.name or out,  # the Mul's place
                                domain=DOMAIN, block=block,
                                doc_string=f"ortfuse layout: {node.name or out} (x * s) on NCHWc blocks of {block}")]
        keep_plain = False
        for c in g.consumers_of(out):
            if _plain_reorder(c, "ReorderInput"):
                g.rewire(c.output[0], blocked)
                keep_plain |= c.output[0] in g.graph_outputs
                if c.output[0] not in g.graph_outputs:
                    g.drop(c)
            else:
                keep_plain = True
        if keep_plain or out in g.graph_outputs:
            new.append(helper.make_node("ReorderOutput", [blocked], [out], domain=NCHWC, channels=channels,
                                        channels_last=0))
        g.replace(node, *new)  # the ReorderOutputs of x and s go too when nothing else reads them
        replaced += 1
    g.commit()
    return replaced


def scale_shapes(node: onnx.NodeProto, shape: Callable[[str], list | None]) -> int:
    """1 when a two-input ``node`` multiplies x [N, C, H, W] (input 0) by s [N, C, 1, 1], 2 when the
    other way round, else 0."""
    if len(node.input) != 2:
        return 0
    sa, sb = (shape(t) for t in node.input)
    if not sa or not sb or len(sa) != 4 or len(sb) != 4:
        return 0
    if sb[2:] == [1, 1] and sa[2:] != [1, 1]:
        return 1
    if sa[2:] == [1, 1] and sb[2:] != [1, 1]:
        return 2
    return 0


def _scale_pair(node, g: GraphEdit, shape) -> tuple[onnx.NodeProto, onnx.NodeProto, int] | None:
    """(reorder of x, reorder of s, channels) when ``node`` multiplies a blocked [N, C, H, W] tensor
    by a blocked [N, C, 1, 1] one, else None."""
    a, b = (g.producer.get(t) for t in node.input)
    if not (_plain_reorder(a, "ReorderOutput") and _plain_reorder(b, "ReorderOutput")):
        return None
    which = scale_shapes(node, shape)
    if not which:
        return None
    x, s = (a, b) if which == 1 else (b, a)
    channels = attr(x, "channels")
    if channels is None or channels != attr(s, "channels"):
        return None
    return x, s, int(channels)
