"""Whether two tensors are known to have the same shape when ONNX shape inference cannot say (dims
that are unnamed, or come out of a Conv as unknown): a proof from the graph's structure.

A tensor's *shape source* is the tensor reached by walking back through ops whose output has the
batch and spatial dims of one input: elementwise activations, BatchNormalization, an Add/Sub/Mul/Div
with a constant that broadcasts without expanding (each of its dims 1 or the input's own) or with a
per-channel scale made in the graph (spatial dims 1, channels 1 or the input's, the same batch: a
squeeze-excite's x * s) or with an operand known to have the same shape (x * relu6(x + 3), a
residual sum), and a Conv with strides 1 whose pads add up to its dilated kernel less one
on every axis (``same`` padding: out = in). The batch of two tensors is the same when walking back
through the ops that keep dim 0 (those above, any Conv, the pools) reaches one tensor. Two rank-4
tensors with the same shape source and the same known channel count have the same shape:

    x -> Conv(3x3, pads 1) -> BN -> HardSwish -> Conv(1x1) -> a        a, b: the source x,
    x -> b                                                            channels from the filters
"""

from __future__ import annotations

import numpy as np
import onnx

from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.graph import GraphIndex

KEEPS_SHAPE = frozenset({"Relu", "Clip", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh", "LeakyRelu", "Identity",
                         "Elu", "Selu", "Softplus", "Softsign", "Neg", "Abs", "BatchNormalization"})
BINARY = frozenset({"Add", "Sub", "Mul", "Div"})


def same_shape(ix: GraphIndex, a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are known to have the same shape: equal as shape inference gives them
    (every dim the same int or the same name), or rank 4 with equal int channel counts and the same
    shape source (module docstring)."""
    sa, sb = ix.shape(a), ix.shape(b)
    if not sa or not sb or len(sa) != len(sb):
        return False
    if known_equal(sa, sb):
        return True
    if len(sa) != 4 or not isinstance(sa[1], int) or sa[1] != sb[1]:
        return False
    return shape_source(ix, a) == shape_source(ix, b)


def known_equal(a: list | None, b: list | None) -> bool:
    """Equal rank and, dim by dim, the same integer or the same named dimension (never unknown)."""
    if not a or not b or len(a) != len(b):
        return False
    return all(x is not None and x != "" and x == y for x, y in zip(a, b))


def shape_source(ix: GraphIndex, tensor: str) -> str:
    """The shape source of ``tensor`` (module docstring); ``tensor`` itself when its maker keeps no dims.
    Answers are kept on ``ix`` (a chain of residual Adds asks for each branch again)."""
    memo: dict[str, str] = ix.__dict__.setdefault("_shape_sources", {})
    if tensor not in memo:
        memo[tensor] = _walk_back(ix, tensor, lambda node: _shape_step(ix, node), memo)
    return memo[tensor]


def _shape_step(ix: GraphIndex, node: onnx.NodeProto) -> str | None:
    """The input whose batch and spatial dims ``node``'s output has, or None."""
    if node.op_type in KEEPS_SHAPE:
        return node.input[0]
    if node.op_type in BINARY:
        if _broadcasts_in(ix, node):
            return next(i for i in node.input if ix.const(i) is None)
        return _scaled_input(ix, node) or (node.input[0] if _same_operands(ix, node) else None)
    return node.input[0] if node.op_type == "Conv" and _same_padding(ix, node) else None


def _walk_back(ix: GraphIndex, tensor: str, step, memo: dict[str, str] | None = None) -> str:
    """Follow ``step(producer)`` back from ``tensor`` while it names an input (ONNX-domain producers of
    one output for BatchNormalization); the last tensor reached, or a kept answer on the way."""
    start, seen = tensor, set()
    while tensor not in seen:
        seen.add(tensor)
        if memo is not None and tensor in memo and tensor != start:
            return memo[tensor]
        node = ix.producer.get(tensor)
        if node is None or node.domain not in ("", "ai.onnx") or not node.input or (
                node.op_type == "BatchNormalization" and len(node.output) != 1):
            return tensor
        following = step(node)
        if following is None:
            return tensor
        tensor = following
    return tensor


def _same_operands(ix: GraphIndex, node: onnx.NodeProto) -> bool:
    """Two operands made in the graph, known to have the same shape (x * relu6(x + 3), a residual sum)."""
    return (len(node.input) == 2 and all(ix.const(i) is None for i in node.input)
            and same_shape(ix, node.input[0], node.input[1]))


def _broadcasts_in(ix: GraphIndex, node: onnx.NodeProto) -> bool:
    """One dynamic input and one constant whose every dim (aligned right) is 1 or that input's own."""
    dynamic = [i for i in node.input if ix.const(i) is None]
    if len(node.input) != 2 or len(dynamic) != 1:
        return False
    const = ix.const(next(i for i in node.input if i != dynamic[0]))
    shape = ix.shape(dynamic[0])
    if const is None or shape is None or np.ndim(const) > len(shape):
        return False
    return all(c == 1 or c == d for c, d in zip(reversed(np.shape(const)), reversed(shape)))


def _scaled_input(ix: GraphIndex, node: onnx.NodeProto) -> str | None:
    """For x (op) s, both made in the graph, rank 4, s of spatial dims 1 and channels 1 or x's (ints),
    with x's batch (``batch_source``): x, whose shape the output has; None otherwise."""
    if len(node.input) != 2 or any(ix.const(i) is not None for i in node.input):
        return None
    shapes = [ix.shape(i) or [] for i in node.input]
    if any(len(sh) != 4 or not isinstance(sh[1], int) for sh in shapes):
        return None
    for k in (0, 1):
        x, s = node.input[k], node.input[1 - k]
        xs, ss = shapes[k], shapes[1 - k]
        if ss[2:] == [1, 1] and ss[1] in (1, xs[1]) and (ss[0] == 1 or batch_source(ix, s) == batch_source(ix, x)):
            return x
    return None


KEEPS_BATCH = KEEPS_SHAPE | {"Conv", "GlobalAveragePool", "GlobalMaxPool", "MaxPool", "AveragePool"}


def batch_source(ix: GraphIndex, tensor: str) -> str:
    """The tensor reached from ``tensor`` walking back through ops whose output has the batch (dim 0)
    of their first input: ``KEEPS_BATCH``, and an Add/Sub/Mul/Div with a constant of batch 1."""
    def step(node: onnx.NodeProto) -> str | None:
        if node.op_type in KEEPS_BATCH:
            return node.input[0]
        if node.op_type in BINARY and _broadcasts_in(ix, node):
            return next(i for i in node.input if ix.const(i) is None)
        return None
    return _walk_back(ix, tensor, step)


def _same_padding(ix: GraphIndex, conv: onnx.NodeProto) -> bool:
    """Strides 1 and pads[i] + pads[i + n] == dilation[i] * (kernel[i] - 1) on every spatial axis."""
    weight = ix.const(conv.input[1]) if len(conv.input) > 1 else None
    if weight is None or np.ndim(weight) < 3:
        return False
    kernel = list(np.shape(weight)[2:])
    n = len(kernel)
    if attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return False
    strides = list(attr(conv, "strides", [1] * n))
    dilations = list(attr(conv, "dilations", [1] * n))
    pads = list(attr(conv, "pads", [0] * 2 * n))
    return (len(strides) == n and all(s == 1 for s in strides) and len(pads) == 2 * n
            and all(pads[i] + pads[i + n] == dilations[i] * (kernel[i] - 1) for i in range(n)))
