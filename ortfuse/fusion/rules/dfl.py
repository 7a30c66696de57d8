"""dfl: the distribution focal loss decode of YOLOv8-style detect heads (ultralytics ``DFL``), as one
FusedDFL: the box logits viewed as [B, 4, R, A] (R bins per box side, A anchors), Transpose to
[B, R, 4, A], Softmax over the bins (axis 1), and a 1x1 Conv R -> 1 without bias (ultralytics'
weights are the bin values 0..R-1; any constant weights are taken): the expectation of each side's
distance under its softmax.

ORT runs Softmax on an axis other than the last by transposing around its last-axis kernel, and
that Softmax costs more than the detect head's largest convolutions. The native kernel reads the
bins where they are; the lowered form moves them to the last axis once. Left alone, with the
reason: a Softmax before opset 13 (it normalizes over every axis from ``axis`` on), another axis or
permutation, a Conv with a bias, more than one output channel, or any stride, padding, dilation or
group.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.checks import attr, float32_problem, intermediate_problem
from ortfuse.fusion.rulekit.contract import Anchor, Example, LoweringForm, NativeKernel, PatternRule
from ortfuse.fusion.rulekit.examples import model, weights
from ortfuse.fusion.rulekit.lowering import Context, node
from ortfuse.fusion.rulekit.result import Lowered, Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "dfl"
_SWAP = [0, 2, 1, 3]


def _conv_problem(ix: GraphIndex, conv: onnx.NodeProto) -> str:
    """Why ``conv`` is not a plain 1x1 Conv R -> 1 with constant weights and no bias ("" when it is)."""
    w = ix.const(conv.input[1]) if len(conv.input) > 1 else None
    if w is None or w.ndim != 4 or w.shape[0] != 1 or w.shape[2:] != (1, 1):
        return f"the Conv's weights '{conv.input[1]}' are not a constant [1, bins, 1, 1]"
    if len(conv.input) > 2 and conv.input[2]:
        return "the Conv has a bias"
    ones = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0]}
    for name, plain in ones.items():
        if list(attr(conv, name, plain)) != plain:
            return f"the Conv's {name} are {list(attr(conv, name))}, not {plain}"
    if attr(conv, "group", 1) != 1 or attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID", "NOTSET", "VALID"):
        return "the Conv is grouped or padded"
    return ""


# Transpose(X[B, G, R, A], perm 0,2,1,3) -> Softmax(axis 1) -> Conv(W[1, R, 1, 1], 1x1)   ->   FusedDFL(X, W[R])
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    if list(attr(anchor, "perm", [])) != _SWAP:
        return None
    path = ix.child_path(anchor.output[0], ["Softmax", ("Conv", 0)])
    if path is None:
        return None
    softmax, conv = path
    nodes = [anchor, softmax, conv]
    x, out = anchor.input[0], conv.output[0]
    axis = attr(softmax, "axis", -1 if ix.opset >= 13 else 1)
    if ix.opset < 13:
        problem = f"Softmax at opset {ix.opset} normalizes over every axis from {axis} on, not over the bins alone"
    elif axis not in (1, -3):
        problem = f"Softmax over axis {axis}, not over the bins (axis 1 after the Transpose)"
    else:
        problem = _conv_problem(ix, conv)
    shape = ix.shape(x)
    w = ix.const(conv.input[1]) if not problem else None
    if w is not None and shape is not None and isinstance(shape[2], int) and shape[2] != w.shape[1]:
        problem = f"the Conv weighs {w.shape[1]} bins, the Softmax normalizes {shape[2]}"
    problem = problem or float32_problem(ix, x, out) or intermediate_problem(ix, nodes, out)
    if problem or w is None:
        return Reject(ID, nodes, problem)
    bins = numpy_helper.from_array(w.astype(np.float32).reshape(-1), ix.unique_name(f"{ix.name_of(conv)}_bins"))
    return Match(ID, "FusedDFL", nodes, [x, bins.name], out, {}, [bins])


def dfl(x: np.ndarray, w: np.ndarray, **_) -> np.ndarray:
    """Y[b, 0, g, a] = sum_r w[r] softmax_r(x[b, g, :, a]), in float64."""
    x64 = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x64 - x64.max(axis=2, keepdims=True))
        p = e / e.sum(axis=2, keepdims=True)
    return np.einsum("bgra,r->bga", p, np.asarray(w, dtype=np.float64))[:, None].astype(np.float32)


# FusedDFL(X[B, G, R, A], W[R]) = Y[B, 1, G, A]
SPEC = OpSpec("FusedDFL", ID, ("X", "W"), {}, dfl)
NATIVE = (NativeKernel("FusedDFL"),)


# FusedDFL   ->   Transpose(0,1,3,2) -> Softmax(-1) -> MatMul(W[R, 1]) -> Transpose(0,3,1,2)
def lower_last_axis(m: Match, ctx: Context) -> Lowered | str:
    """The bins moved to the last axis, where ORT's Softmax runs its row kernel, and the weighted sum
    as a MatMul with W as one column."""
    w = numpy_helper.to_array(m.initializers[0]) if m.initializers else None
    if w is None:
        return "the bin weights are not a constant of the match"
    column = numpy_helper.from_array(w.astype(np.float32).reshape(-1, 1), ctx.fresh("dfl_bins_column"))
    rows, probs, expect = ctx.fresh("dfl_bins_last"), ctx.fresh("dfl_softmax"), ctx.fresh("dfl_expectation")
    return Lowered([node("Transpose", [m.inputs[0]], [rows], perm=[0, 1, 3, 2]),
                    node("Softmax", [rows], [probs], axis=-1),
                    node("MatMul", [probs, column.name], [expect]),
                    node("Transpose", [expect], [m.output], perm=[0, 3, 1, 2])], [column])


# Priorities: the native kernel (custom_ops/native/ops/dfl.py: one pass per anchor span, the bins
# read where they are) above the lowered form statically; `ortfuse rank MODEL --pattern dfl` orders
# them per machine in the whole model (docs/ARCHITECTURE.md §5).
LOWERING = (LoweringForm("dfl_last_axis", "FusedDFL", "Transpose + Softmax(-1) + MatMul + Transpose",
                         lower_last_axis, {"": 5}),)


# ------------------------------------------------------------------------------------------------
# examples
# ------------------------------------------------------------------------------------------------
def _head(axis: int = 1, bias: bool = False, softmax_out: bool = False, opset: int = 17, bins: int = 16,
          anchors: int = 21) -> onnx.ModelProto:
    """ultralytics' DFL on box logits [1, 4 * bins, anchors]: Reshape -> Transpose -> Softmax -> Conv -> Reshape."""
    consts: dict[str, np.ndarray] = {
        "split": np.array([1, 4, bins, anchors], np.int64), "flat": np.array([1, 4, anchors], np.int64),
        "w": np.arange(bins, dtype=np.float32).reshape(1, bins, 1, 1)}
    conv_in = ["p", "w"]
    if bias:
        consts["b"] = weights([1], seed=4)
        conv_in.append("b")
    nodes = [helper.make_node("Reshape", ["x", "split"], ["v"], name="view"),
             helper.make_node("Transpose", ["v"], ["t"], name="transpose", perm=_SWAP),
             helper.make_node("Softmax", ["t"], ["p"], name="softmax", axis=axis),
             helper.make_node("Conv", conv_in, ["c"], name="conv", kernel_shape=[1, 1]),
             helper.make_node("Reshape", ["c", "flat"], ["y"], name="flatten")]
    return model(nodes, {"x": [1, 4 * bins, anchors]}, ["y", "p"] if softmax_out else ["y"], consts, opset=opset)


RULE = PatternRule(
    anchor=Anchor("Transpose", onnx_only=True),
    id=ID, order=45, matcher=match, specs=(SPEC,), native=NATIVE, lowering=LOWERING,
    examples=(
        Example("ultralytics_dfl", _head),
        Example("negative_axis", lambda: _head(axis=-3)),
        Example("eight_bins_odd_anchors", lambda: _head(bins=8, anchors=37)),
        Example("softmax_over_anchors", lambda: _head(axis=3), reason="Softmax over axis 3, not over the bins"),
        Example("conv_with_bias", lambda: _head(bias=True), reason="the Conv has a bias"),
        Example("opset_12", lambda: _head(opset=12), reason="Softmax at opset 12 normalizes over every axis"),
        Example("softmax_is_a_graph_output", lambda: _head(softmax_out=True),
                reason="intermediate tensor 'p' is a graph output"),
    ),
)
