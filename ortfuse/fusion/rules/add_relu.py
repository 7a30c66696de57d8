"""add_relu: Add of two tensors computed at run time, then Relu, as one FusedAddRelu (float32 or float16)."""

from __future__ import annotations

import onnx
from onnx import helper

from ortfuse.custom_ops import reference
from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.checks import checked_elementwise
from ortfuse.fusion.rulekit.contract import Example, NativeKernel, PatternRule
from ortfuse.fusion.rulekit.examples import model
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "add_relu"


# Add(a, b) -> Relu   ->   FusedAddRelu(a, b)        (a and b both computed at run time)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    relu = ix.child(anchor.output[0], "Relu", domain=None)
    if len(anchor.input) != 2 or relu is None:
        return None
    a, b = anchor.input
    if ix.const(a) is not None or ix.const(b) is not None:
        return None  # a constant operand makes it an eltwise_chain
    return checked_elementwise(ix, Match(ID, "FusedAddRelu", [anchor, relu], [a, b], relu.output[0]), a, b)


# FusedAddRelu(A, B) = relu(A + B), broadcasting
SPEC = OpSpec("FusedAddRelu", ID, ("A", "B"), {}, lambda a, b, **_: reference.add_relu(a, b))
NATIVE = (NativeKernel("FusedAddRelu"), NativeKernel("FusedAddRelu", "FusedAddReluF16", dtype="float16"))


def _add_relu(elem: int = onnx.TensorProto.FLOAT, sum_is_output: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    return model(nodes, {"a": [3, 7], "b": [1, 7]}, ["y", "s"] if sum_is_output else ["y"], elem=elem)


RULE = PatternRule(
    anchor="Add",
    id=ID, order=40, matcher=match, specs=(SPEC,), native=NATIVE, yields_to_ort=True,
    # float32 a + b then max(., 0): one IEEE add and a select, ORT's bits; float16 kernels round differently
    bit_exact=lambda ix, m: m.dtype == "float32",
    examples=(
        Example("add_broadcast_relu", _add_relu),
        Example("float64", lambda: _add_relu(onnx.TensorProto.DOUBLE), reason="no kernel for dtype float64"),
        Example("sum_is_a_graph_output", lambda: _add_relu(sum_is_output=True),
                reason="intermediate tensor 's' is a graph output"),
    ),
)
