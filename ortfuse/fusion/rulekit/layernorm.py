"""LayerNorm over the last axis as exporters write it: the LayerNormalization op (opset 17+), or the
decomposition of opset < 17 exports
ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(gamma) -> Add(beta).
``layer_norm`` reads one from the tensor it normalizes; ``lowered_layer_norm`` writes one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ortfuse.fusion.rulekit.checks import attr
from ortfuse.fusion.rulekit.lowering import Context, node
from ortfuse.fusion.rulekit.result import Lowered
from ortfuse.ir.graph import GraphIndex


@dataclass
class LayerNorm:
    nodes: list[onnx.NodeProto]
    output: str
    gamma: np.ndarray
    beta: np.ndarray
    epsilon: float


def _last_axis(ix: GraphIndex, node: onnx.NodeProto, rank: int | None) -> bool:
    """A ReduceMean over the last axis only, keeping it (axes as attribute or, opset 18, input)."""
    if len(node.input) > 1 and node.input[1]:
        value = ix.const(node.input[1])
        axes = None if value is None else [int(v) for v in value.reshape(-1)]
    else:
        axes = attr(node, "axes")
    if axes is None or len(axes) != 1 or not attr(node, "keepdims", 1):
        return False
    return axes[0] == -1 or (rank is not None and axes[0] == rank - 1)


def _scalar(ix: GraphIndex, name: str) -> float | None:
    value = ix.const(name)
    return None if value is None or value.size != 1 else float(value.reshape(-1)[0])


def _vector(ix: GraphIndex, node: onnx.NodeProto, tensor: str) -> np.ndarray | None:
    """The constant 1-D operand of binary ``node`` beside ``tensor``."""
    other = ix.other_input(node, tensor)
    value = None if other is None else ix.const(other)
    return None if value is None or value.ndim != 1 else value


def layer_norm(ix: GraphIndex, x: str) -> LayerNorm | None:
    """The LayerNorm over the last axis of ``x`` whose only reader it is, or None."""
    shape = ix.shape(x)
    rank = len(shape) if shape is not None else None
    users = ix.consumers_of(x)
    if len(users) == 1 and users[0].op_type == "LayerNormalization" and users[0].input[0] == x:
        ln = users[0]
        axis = attr(ln, "axis", -1)
        if not (axis == -1 or (rank is not None and axis == rank - 1)):
            return None
        if any(o and ix.consumers_of(o) for o in ln.output[1:]):
            return None
        gamma = ix.const(ln.input[1])
        beta = ix.const(ln.input[2]) if len(ln.input) > 2 and ln.input[2] else None
        if gamma is None or gamma.ndim != 1 or (beta is not None and beta.shape != gamma.shape):
            return None
        beta = np.zeros_like(gamma) if beta is None else beta
        return LayerNorm([ln], ln.output[0], gamma, beta, float(attr(ln, "epsilon", 1e-5)))
    by_type = {u.op_type: u for u in users}
    if len(users) != 2 or set(by_type) != {"ReduceMean", "Sub"}:
        return None
    mean, sub = by_type["ReduceMean"], by_type["Sub"]
    if not _last_axis(ix, mean, rank) or list(sub.input) != [x, mean.output[0]]:
        return None
    readers = {u.op_type: u for u in ix.consumers_of(sub.output[0])}
    if len(ix.consumers_of(sub.output[0])) != 2 or set(readers) != {"Pow", "Div"}:
        return None
    pow_, div = readers["Pow"], readers["Div"]
    if pow_.input[0] != sub.output[0] or _scalar(ix, pow_.input[1]) != 2.0 or div.input[0] != sub.output[0]:
        return None
    var = ix.child(pow_.output[0], "ReduceMean")
    add = ix.child(var.output[0], "Add") if var is not None and _last_axis(ix, var, rank) else None
    eps = None if add is None else _scalar(ix, ix.other_input(add, var.output[0]) or "")  # type: ignore[union-attr]
    sqrt = ix.child(add.output[0], "Sqrt") if add is not None and eps is not None else None
    if sqrt is None or div.input[1] != sqrt.output[0]:
        return None
    mul = ix.child(div.output[0], "Mul")
    gamma = None if mul is None else _vector(ix, mul, div.output[0])
    shift = ix.child(mul.output[0], "Add") if mul is not None and gamma is not None else None
    beta = None if shift is None else _vector(ix, shift, mul.output[0])  # type: ignore[union-attr]
    if shift is None or beta is None or gamma is None or beta.shape != gamma.shape:
        return None
    assert var is not None and add is not None and eps is not None and mul is not None
    nodes = [mean, sub, pow_, var, add, sqrt, div, mul, shift]
    return LayerNorm(nodes, shift.output[0], gamma, beta, eps)


def lowered_layer_norm(x: str, out: str, gamma: str, beta: str, epsilon: float, ctx: Context) -> Lowered:
    """``out`` = LayerNorm of ``x`` over the last axis: the LayerNormalization op at opset >= 17, else
    the opset < 17 decomposition (which ORT fuses into its LayerNormalization kernel)."""
    if ctx.opset >= 17:
        return Lowered([node("LayerNormalization", [x, gamma, beta], [out], axis=-1, epsilon=epsilon)])
    n = {k: ctx.fresh(k) for k in ("mean", "centred", "squared", "var", "var_eps", "std", "normed", "scaled")}
    two = numpy_helper.from_array(np.array(2.0, np.float32), ctx.fresh("two"))
    eps = numpy_helper.from_array(np.array(epsilon, np.float32), ctx.fresh("epsilon"))
    nodes = [node("ReduceMean", [x], [n["mean"]], axes=[-1]), node("Sub", [x, n["mean"]], [n["centred"]]),
             node("Pow", [n["centred"], two.name], [n["squared"]]),
             node("ReduceMean", [n["squared"]], [n["var"]], axes=[-1]),
             node("Add", [n["var"], eps.name], [n["var_eps"]]), node("Sqrt", [n["var_eps"]], [n["std"]]),
             node("Div", [n["centred"], n["std"]], [n["normed"]]), node("Mul", [n["normed"], gamma], [n["scaled"]]),
             node("Add", [n["scaled"], beta], [out])]
    return Lowered(nodes, [two, eps])
