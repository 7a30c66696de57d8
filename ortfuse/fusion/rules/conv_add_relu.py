"""conv_add_relu: a Conv (bias Add and BatchNormalization folded) whose output is added to a
residual computed at run time, then Relu, as one FusedConvAddAct."""

from __future__ import annotations

import onnx
from onnx import helper

from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.checks import float32_problem, intermediate_problem
from ortfuse.fusion.rulekit.contract import Example, LoweringForm, PatternRule
from ortfuse.fusion.rulekit.conv import (
    CONV_SPEC_ATTRS,
    ConvCore,
    conv_core,
    conv_node_attrs,
    folded_weights,
    fused_attrs,
    residual_reference,
)
from ortfuse.fusion.rulekit.examples import model, weights
from ortfuse.fusion.rulekit.lowering import MS_DOMAIN, Context, node
from ortfuse.fusion.rulekit.result import Lowered, Match, Reject
from ortfuse.fusion.rulekit.same_shape import known_equal
from ortfuse.ir.graph import GraphIndex

ID = "conv_add_relu"


# [Mul/Add(const)...] -> Conv [-> Add(bias)] [-> BatchNormalization] [-> Mul/Add(const)...]
#   -> Add(residual) -> Relu   ->   FusedConvAddAct(X, W', B', residual)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    core = conv_core(ix, anchor, ID)
    if not isinstance(core, ConvCore):
        return core  # the Conv itself cannot be fused: the reason is reported once per pattern
    add = ix.only_consumer(core.output)
    if add is None or add.op_type != "Add":
        return None
    residual = ix.other_input(add, core.output)
    relu = ix.only_consumer(add.output[0])
    if residual is None or relu is None or relu.op_type != "Relu" or ix.const(residual) is not None:
        return None
    nodes = core.nodes + [add, relu]
    problem = float32_problem(ix, residual) or intermediate_problem(ix, nodes, relu.output[0])
    conv_shape, res_shape = ix.shape(core.output), ix.shape(residual)
    if not problem and conv_shape and res_shape and _definitely_differ(conv_shape, res_shape):
        problem = f"residual shape {res_shape} differs from the conv output shape {conv_shape}"
    if problem:
        return Reject(ID, nodes, problem)
    inits = folded_weights(ix, core, anchor)
    return Match(ID, "FusedConvAddAct", nodes, [core.input] + [w.name for w in inits] + [residual],
                 relu.output[0], fused_attrs(core, "relu"), inits)


def _definitely_differ(a: list, b: list) -> bool:
    if len(a) != len(b):
        return True
    return any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a, b))


# FusedConvAddAct(X, W, B, R; conv attrs, activation=relu) = relu(conv(X, W) + B + R)
SPEC = OpSpec("FusedConvAddAct", ID, ("X", "W", "B", "R"), CONV_SPEC_ATTRS, residual_reference)


# ------------------------------------------------------------------------------------------------
# lowering forms. com.microsoft:FusedConv(X, W, B, Z) = act(Conv(X, W) + B + Z): the sum comes
# before the activation, and Z must have the output's exact shape (no broadcasting).
# ------------------------------------------------------------------------------------------------
# Conv(+BN folded) -> Add(residual) -> Relu   ->   com.microsoft:FusedConv(X, W', B', Z=residual; Relu)
def lower_fusedconv_sum(m: Match, ctx: Context) -> Lowered | str:
    """relu(conv(X, W) + B + R) as one FusedConv with R as its sum input Z (added before the Relu).
    FusedConv does not broadcast Z, so R's shape must be known to equal the output's."""
    if m.attrs["activation"] != "relu":
        return f"FusedConv with a sum is lowered for relu only, not '{m.attrs['activation']}'"
    res, out = ctx.shape(m.inputs[3]), ctx.shape(m.output)
    if not known_equal(res, out):
        return f"residual shape {res} is not known to equal the output shape {out} (FusedConv's Z does not broadcast)"
    return Lowered([node("FusedConv", m.inputs[:4], [m.output], domain=MS_DOMAIN, activation="Relu",
                         **conv_node_attrs(m))])


# Conv(+BN folded) -> Add(residual) -> Relu   ->   Conv -> Add -> Relu
def lower_conv_add_relu(m: Match, ctx: Context) -> Lowered | str:
    """relu(conv(X, W) + B + R) as Conv, Add (broadcasting as the original Add did), Relu."""
    if m.attrs["activation"] != "relu":
        return f"no Conv -> Add -> '{m.attrs['activation']}' form"
    y, s = ctx.fresh("conv"), ctx.fresh("sum")
    return Lowered([node("Conv", m.inputs[:3], [y], **conv_node_attrs(m)), node("Add", [y, m.inputs[3]], [s]),
                    node("Relu", [s], [m.output])])


# Priorities (`python tools/lowering_bench.py`, resnet50's residual convs): FusedConv with Z and
# Conv + Add + Relu tie; FusedConv is one node, so it ranks first. Conv + Add + Relu remains for
# residuals of unknown shape.
LOWERING = (
    LoweringForm("fusedconv_sum", "FusedConvAddAct", "com.microsoft:FusedConv (sum Z)", lower_fusedconv_sum,
                 {"relu": 30}),
    LoweringForm("conv_add_relu", "FusedConvAddAct", "Conv + Add + Relu", lower_conv_add_relu, {"relu": 25}),
)


# ------------------------------------------------------------------------------------------------
# examples
# ------------------------------------------------------------------------------------------------
def _residual_block(residual_shape: list[int], sum_is_output: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "r"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    return model(nodes, {"x": [1, 3, 7, 9], "r": residual_shape}, ["y", "s"] if sum_is_output else ["y"],
                 {"w": weights([4, 3, 3, 3]), "b": weights([4], seed=1)})


RULE = PatternRule(
    anchor="Conv",  # conv_core starts at a Conv
    id=ID, order=10, matcher=match, specs=(SPEC,), lowering=LOWERING,
    examples=(
        Example("conv_residual_relu", lambda: _residual_block([1, 4, 7, 9])),
        Example("residual_broadcasts", lambda: _residual_block([1, 4, 1, 9]),
                reason="differs from the conv output shape"),
        Example("sum_is_a_graph_output", lambda: _residual_block([1, 4, 7, 9], sum_is_output=True),
                reason="intermediate tensor 's' is a graph output"),
    ),
)
