"""mish: x * tanh(softplus(x)) as exporters write it (Softplus -> Tanh -> Mul, Exp -> Add(1) -> Log ->
Tanh -> Mul, or the ONNX Mish op), as one FusedMish (float32 or float16).

Before the generic eltwise_chain, which would otherwise take Softplus -> Tanh -> Mul as a chain whose
Softplus is a scalar libm call per element. The Mish op (opset 18) is fused as well: ORT 1.32 has no
kernel for it and runs its function body, the same three ops (the optimized model ORT writes with
``SessionOptions.optimized_model_filepath`` holds Softplus, Tanh, Mul), at the same speed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.checks import checked_elementwise
from ortfuse.fusion.rulekit.contract import Anchor, Example, NativeKernel, PatternRule
from ortfuse.fusion.rulekit.examples import model
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "mish"


def _softplus(ix: GraphIndex, anchor: onnx.NodeProto) -> tuple[str, list[onnx.NodeProto], str, str | None] | None:
    """(x, nodes, softplus output, c) of Softplus(x) (c None) or Log(Add(Exp(x), c)) (c: Add's other operand)."""
    if anchor.op_type == "Softplus":
        return anchor.input[0], [anchor], anchor.output[0], None
    path = ix.child_path(anchor.output[0], ["Add", "Log"])  # from an Exp
    if path is None:
        return None
    add, log = path
    return anchor.input[0], [anchor, add, log], log.output[0], ix.other_input(add, anchor.output[0]) or ""


def _not_one(ix: GraphIndex, name: str) -> str:
    """Why Add's other operand ``name`` does not make log(e**x + c) a softplus ("" when c is 1)."""
    if ix.is_scalar_const(name, 1.0):
        return ""
    value = ix.const(name)
    if value is not None and value.size == 1 and value.ndim <= 1:
        return f"Add adds {float(value.reshape(-1)[0]):g}, not the constant 1 of softplus = log(exp(x) + 1)"
    return f"Add's operand '{name}' is not the scalar constant 1 of softplus = log(exp(x) + 1)"


# Softplus(x) -> Tanh -> Mul(x)  |  Exp(x) -> Add(1) -> Log -> Tanh -> Mul(x)  |  Mish(x)   ->   FusedMish(x)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    if anchor.op_type == "Mish":
        x = anchor.input[0]
        return checked_elementwise(ix, Match(ID, "FusedMish", [anchor], [x], anchor.output[0]), x)
    found = _softplus(ix, anchor)
    if found is None:
        return None
    x, nodes, softplus, c = found
    path = ix.child_path(softplus, ["Tanh", "Mul"])
    if path is None:
        return None
    tanh, mul = path
    nodes = [*nodes, tanh, mul]
    other = ix.other_input(mul, tanh.output[0])
    if other != x:
        return Reject(ID, nodes, f"Mul multiplies tanh(softplus(x)) by '{other}', not by the softplus input '{x}'")
    problem = _not_one(ix, c) if c is not None else ""
    if problem:
        return Reject(ID, nodes, problem)
    return checked_elementwise(ix, Match(ID, "FusedMish", nodes, [x], mul.output[0]), x)


def mish(x: np.ndarray) -> np.ndarray:
    """x * tanh(softplus(x)) in float32, softplus(x) = log1p(e**x) as logaddexp(0, x) (no overflow);
    mish(-Inf) is NaN (-Inf * 0), as the ops it replaces compute it."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        return (x * np.tanh(np.logaddexp(np.float32(0), x))).astype(np.float32)


# FusedMish(X) = x * tanh(softplus(x))
SPEC = OpSpec("FusedMish", ID, ("X",), {}, lambda x, **_: mish(x))
NATIVE = (NativeKernel("FusedMish"), NativeKernel("FusedMish", "FusedMishF16", dtype="float16"))


def _softplus_tanh_mul(times: str = "x", tanh_is_output: bool = False, tanh_first: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Softplus", ["x"], ["s"], name="softplus"),
             helper.make_node("Tanh", ["s"], ["t"], name="tanh"),
             helper.make_node("Mul", ["t", times] if tanh_first else [times, "t"], ["y"], name="mul")]
    inputs = {"x": [4, 9], "z": [4, 9]} if times == "z" else {"x": [4, 9]}
    return model(nodes, inputs, ["y", "t"] if tanh_is_output else ["y"])


def _exp_add_log(one: float = 1.0, as_node: bool = False, elem: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    const = [helper.make_node("Constant", [], ["one"], name="one", value=helper.make_tensor(
        "one", elem, [], [one]))] if as_node else []
    nodes = [*const, helper.make_node("Exp", ["x"], ["e"], name="exp"),
             helper.make_node("Add", ["one", "e"] if as_node else ["e", "one"], ["a"], name="add"),
             helper.make_node("Log", ["a"], ["l"], name="log"),
             helper.make_node("Tanh", ["l"], ["t"], name="tanh"),
             helper.make_node("Mul", ["t", "x"], ["y"], name="mul")]
    return model(nodes, {"x": [3, 5, 7]}, ["y"], None if as_node else {"one": dtype.type(one)}, elem=elem)


def _mish_op() -> onnx.ModelProto:
    return model([helper.make_node("Mish", ["x"], ["y"], name="mish")], {"x": [2, 33]}, ["y"], opset=18)


RULE = PatternRule(
    anchor=Anchor("Mish", "Softplus", "Exp", onnx_only=True),
    id=ID, order=70, matcher=match, specs=(SPEC,), native=NATIVE,
    examples=(
        Example("softplus_tanh_mul", _softplus_tanh_mul),
        Example("softplus_tanh_mul_tanh_first", lambda: _softplus_tanh_mul(tanh_first=True)),
        Example("exp_add_one_log_tanh_mul", _exp_add_log),
        Example("exp_add_one_as_constant_node", lambda: _exp_add_log(as_node=True)),
        Example("mish_op", _mish_op),
        Example("times_another_tensor", lambda: _softplus_tanh_mul(times="z"),
                reason="Mul multiplies tanh(softplus(x)) by 'z', not by the softplus input 'x'"),
        Example("add_two", lambda: _exp_add_log(2.0), reason="Add adds 2, not the constant 1"),
        Example("tanh_is_a_graph_output", lambda: _softplus_tanh_mul(tanh_is_output=True),
                reason="intermediate tensor 't' is a graph output"),
        # ORT has no float64 Softplus: the float64 near-miss is the spelling ORT runs
        Example("float64", lambda: _exp_add_log(elem=onnx.TensorProto.DOUBLE), reason="no kernel for dtype float64"),
    ),
)
