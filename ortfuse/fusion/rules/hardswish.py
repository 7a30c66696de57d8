"""hardswish: x * HardSigmoid(x), as exporters write it (Add -> Clip -> Div -> Mul, or HardSigmoid ->
Mul), as one FusedHardSwish (float32 or float16)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ortfuse.custom_ops import reference
from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.checks import attr, checked_elementwise
from ortfuse.fusion.rulekit.contract import Anchor, Example, NativeKernel, PatternRule
from ortfuse.fusion.rulekit.epilogues import hardsigmoid_as_hardswish, match_hardswish_decomposed
from ortfuse.fusion.rulekit.examples import model
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "hardswish"


# Add(x, 3) -> Clip(0, 6) -> Div(6) -> Mul(x)  |  HardSigmoid(x) -> Mul(x)   ->   FusedHardSwish(x)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    if anchor.op_type == "HardSigmoid":
        x = anchor.input[0]
        mul = ix.child(anchor.output[0], "Mul", domain=None)
        if mul is None or ix.other_input(mul, anchor.output[0]) != x:
            return None
        params = hardsigmoid_as_hardswish(float(attr(anchor, "alpha", 0.2)), float(attr(anchor, "beta", 0.5)))
        if params is None:
            return None  # not a HardSwish; an eltwise_chain may still take it
        return checked_elementwise(ix, Match(ID, "FusedHardSwish", [anchor, mul], [x], mul.output[0], params), x)
    for x in anchor.input:  # an Add
        found = match_hardswish_decomposed(ix, x)
        if found is not None and found[0][0] is anchor:
            nodes, out, (add, lo, hi, div) = found
            params = {"add": add, "lo": lo, "hi": hi, "div": div}
            return checked_elementwise(ix, Match(ID, "FusedHardSwish", nodes, [x], out, params), x)
    return None


# FusedHardSwish(X; add, lo, hi, div) = x * clip(x + add, lo, hi) / div   (HardSwish: 3, 0, 6, 6)
SPEC = OpSpec("FusedHardSwish", ID, ("X",), {"add": float, "lo": float, "hi": float, "div": float},
              lambda x, **a: reference.hardswish(x, add=a["add"], lo=a["lo"], hi=a["hi"], div=a["div"]))
NATIVE = (NativeKernel("FusedHardSwish"), NativeKernel("FusedHardSwish", "FusedHardSwishF16", dtype="float16"))


def _decomposed(clip_is_output: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "three"], ["a"], name="add"),
             helper.make_node("Clip", ["a", "zero", "six"], ["c"], name="clip"),
             helper.make_node("Div", ["c", "six"], ["d"], name="div"),
             helper.make_node("Mul", ["x", "d"], ["y"], name="mul")]
    constants = {"three": np.float32(3), "zero": np.float32(0), "six": np.float32(6)}
    return model(nodes, {"x": [2, 3, 5]}, ["y", "c"] if clip_is_output else ["y"], constants)


def _hardsigmoid_mul() -> onnx.ModelProto:
    nodes = [helper.make_node("HardSigmoid", ["x"], ["h"], name="hardsigmoid", alpha=1.0 / 6.0, beta=0.5),
             helper.make_node("Mul", ["h", "x"], ["y"], name="mul")]
    return model(nodes, {"x": [4, 9]}, ["y"])


RULE = PatternRule(
    anchor=Anchor("HardSigmoid", "Add"),
    id=ID, order=50, matcher=match, specs=(SPEC,), native=NATIVE,
    examples=(
        Example("add_clip_div_mul", _decomposed),
        Example("hardsigmoid_mul", _hardsigmoid_mul),
        Example("clip_is_a_graph_output", lambda: _decomposed(clip_is_output=True),
                reason="intermediate tensor 'c' is a graph output"),
    ),
)
