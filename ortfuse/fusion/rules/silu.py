"""silu: x * Sigmoid(x), as one FusedSiLU (float32 or float16)."""

from __future__ import annotations

import onnx
from onnx import helper

from ortfuse.custom_ops import reference
from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.checks import checked_elementwise
from ortfuse.fusion.rulekit.contract import Example, NativeKernel, PatternRule
from ortfuse.fusion.rulekit.epilogues import match_silu
from ortfuse.fusion.rulekit.examples import model
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "silu"


# Sigmoid(x) -> Mul(x)   ->   FusedSiLU(x)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    epi = match_silu(ix, anchor.input[0])
    if epi is None or epi.nodes[0] is not anchor:
        return None
    return checked_elementwise(ix, Match(ID, "FusedSiLU", epi.nodes, [anchor.input[0]], epi.output), anchor.input[0])


# FusedSiLU(X) = x * sigmoid(x)
SPEC = OpSpec("FusedSiLU", ID, ("X",), {}, lambda x, **_: reference.silu(x))
NATIVE = (NativeKernel("FusedSiLU"), NativeKernel("FusedSiLU", "FusedSiLUF16", dtype="float16"))


def _sigmoid_mul(times: str = "x", sigmoid_is_output: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid"),
             helper.make_node("Mul", [times, "s"], ["y"], name="mul")]
    return model(nodes, {"x": [5, 6], "z": [5, 6]} if times == "z" else {"x": [5, 6]},
                 ["y", "s"] if sigmoid_is_output else ["y"])


RULE = PatternRule(
    anchor="Sigmoid",
    id=ID, order=60, matcher=match, specs=(SPEC,), native=NATIVE,
    examples=(
        Example("x_times_sigmoid_x", _sigmoid_mul),
        Example("sigmoid_is_a_graph_output", lambda: _sigmoid_mul(sigmoid_is_output=True),
                reason="intermediate tensor 's' is a graph output"),
        Example("times_another_tensor", lambda: _sigmoid_mul(times="z"), reason=""),
    ),
)
