"""conv_add: a Conv (bias Add, BatchNormalization and constant steps folded) whose output is added to
a residual of the same shape, with no activation after the sum (a linear bottleneck's shortcut), as
one FusedConvAdd, lowered to ORT's FusedConv with the residual as its sum input. ORT's NCHWc layout
then runs the sum inside its blocked conv; left as Conv -> Add, it adds the two between reorders when
the dims are unknown."""

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
from ortfuse.fusion.rulekit.same_shape import same_shape
from ortfuse.ir.graph import GraphIndex

ID = "conv_add"


# [Mul/Add(const)...] -> Conv [-> Add(bias)] [-> BatchNormalization] [-> Mul/Add(const)...]
#   -> Add(residual)   ->   FusedConvAdd(X, W', B', residual)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    core = conv_core(ix, anchor, ID)
    if not isinstance(core, ConvCore):
        return core
    add = ix.child(core.output, "Add")
    residual = ix.other_input(add, core.output) if add is not None else None
    if add is None or residual is None or residual == core.output or ix.const(residual) is not None:
        return None
    nodes = core.nodes + [add]
    problem = float32_problem(ix, residual) or intermediate_problem(ix, nodes, add.output[0])
    if not problem and not same_shape(ix, core.output, residual):
        problem = (f"residual '{residual}' is not known to have the conv output's shape "
                   "(FusedConv's sum input does not broadcast)")
    maker = _unblocked_maker(ix, residual) if not problem else None
    if maker:
        problem = (f"residual '{residual}' comes from {maker}, which ORT's NCHWc layout leaves unblocked: "
                   "a FusedConv reading it would stay unblocked too")
    if problem:
        return Reject(ID, nodes, problem)
    inits = folded_weights(ix, core, anchor)
    return Match(ID, "FusedConvAdd", nodes, [core.input] + [w.name for w in inits] + [residual],
                 add.output[0], fused_attrs(core, ""), inits)


# ORT's NCHWc transformer blocks a FusedConv with a sum input only when the sum is blocked already:
# made by a conv, by what it fuses into one (BN, a constant scale or shift, an activation), or by a
# residual sum this rule fuses into a conv in turn (tests/test_conv_add.py checks both sides)
_FOLLOWS_CONV = frozenset({"BatchNormalization", "Relu", "Clip", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh",
                           "LeakyRelu", "Identity", "Add", "Sub", "Mul", "Div"})


def _unblocked_maker(ix: GraphIndex, tensor: str) -> str:
    """"" when ``tensor`` comes from a conv through the ops ``_FOLLOWS_CONV`` names (a binary op with a
    constant, or a sum of two tensors one of which comes from a conv); else what makes it ("Split
    'split'", "the graph input 'x'")."""
    seen: set[str] = set()
    while tensor not in seen:
        seen.add(tensor)
        node = ix.producer.get(tensor)
        if node is None:
            return f"the graph input '{tensor}'"
        if node.op_type == "Conv" and node.domain in ("", "ai.onnx"):
            return ""
        if node.op_type not in _FOLLOWS_CONV or node.domain not in ("", "ai.onnx"):
            return f"{node.op_type} '{ix.name_of(node)}'"
        dynamic = [i for i in node.input if i and ix.const(i) is None]
        if len(dynamic) == 2 and node.op_type == "Add":  # a residual sum: blocked when either side is
            return "" if any(not _unblocked_maker(ix, i) for i in dynamic) else f"Add '{ix.name_of(node)}'"
        if len(dynamic) != 1:
            return f"{node.op_type} '{ix.name_of(node)}'"
        tensor = dynamic[0]
    return f"a cycle at '{tensor}'"


# FusedConvAdd(X, W, B, R; conv attrs, activation "") = conv(X, W) + B + R, R of the output's shape
SPEC = OpSpec("FusedConvAdd", ID, ("X", "W", "B", "R"), CONV_SPEC_ATTRS, residual_reference)


# FusedConvAdd(X, W, B, R)   ->   com.microsoft:FusedConv(X, W, B, Z=R), no activation
def lower_fusedconv_sum(m: Match, ctx: Context) -> Lowered | str:
    """conv(X, W) + B + R as one FusedConv with R as its sum input Z (the matcher proved R's shape)."""
    return Lowered([node("FusedConv", m.inputs[:4], [m.output], domain=MS_DOMAIN, **conv_node_attrs(m))])


LOWERING = (LoweringForm("fusedconv_residual", "FusedConvAdd", "com.microsoft:FusedConv (sum Z)", lower_fusedconv_sum,
                         {"": 30}),)


# ------------------------------------------------------------------------------------------------
# examples
# ------------------------------------------------------------------------------------------------
def _shortcut(residual: str = "x0", dims: tuple = (1, 4, 7, 9), then_relu: bool = False,
              sum_is_output: bool = False) -> onnx.ModelProto:
    """x -> Conv(1x1) -> x0 -> Conv(3x3, pads 1) -> BatchNormalization -> Add(residual) [-> Relu]."""
    c = dims[1]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"], name="stem"),
             helper.make_node("Conv", ["x0", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"], name="bn"),
             helper.make_node("Add", ["n", residual], ["s"], name="add")]
    if then_relu:
        nodes.append(helper.make_node("Relu", ["s"], ["y"], name="relu"))
    inputs = {"x": list(dims), **({"r": [1, c, 1, 9]} if residual == "r" else {})}
    consts = {"w0": weights([c, c, 1, 1], seed=6), "w": weights([c, c, 3, 3]), "b": weights([c], seed=1),
              "scale": weights([c], seed=2) + 1,
              "bias": weights([c], seed=3), "mean": weights([c], seed=4), "var": abs(weights([c], seed=5)) + 0.5}
    out = "y" if then_relu else "s"
    return model(nodes, inputs, [out, "n"] if sum_is_output else [out], consts)


RULE = PatternRule(
    anchor="Conv",  # conv_core starts at a Conv
    id=ID, order=12, matcher=match, specs=(SPEC,), lowering=LOWERING,
    examples=(
        Example("shortcut_static_dims", _shortcut),
        Example("residual_broadcasts", lambda: _shortcut("r"), reason="not known to have the conv output's shape"),
        Example("residual_is_the_graph_input", lambda: _shortcut("x"), reason="comes from the graph input 'x'"),
        Example("bn_output_read_elsewhere", lambda: _shortcut(sum_is_output=True),
                reason="intermediate tensor 'n'"),
    ),
)
