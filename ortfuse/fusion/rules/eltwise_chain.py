"""eltwise_chain: a maximal run of single-consumer elementwise ops on one value, as one
FusedEltwiseChain<k> (k = its operands) interpreting the run as a program (the generic pattern, last)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper

from ortfuse.custom_ops import reference
from ortfuse.custom_ops.specs import MAX_CHAIN_OPERANDS, OpSpec
from ortfuse.fusion.rulekit.checks import attr, checked_elementwise, float32_problem
from ortfuse.fusion.rulekit.contract import Anchor, Example, NativeKernel, PatternRule
from ortfuse.fusion.rulekit.epilogues import clip_bounds
from ortfuse.fusion.rulekit.examples import model
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "eltwise_chain"
UNARY = frozenset(reference.UNARY) | frozenset(reference.PARAM_UNARY)
BINARY = frozenset(reference.BINARY)
# steps whose native form is one IEEE float32 operation (or a select) per element, as in ORT's kernels:
# no transcendental approximation, no fused multiply-add (HardSigmoid's alpha*x+beta may contract in
# ORT's build), no libm pow; a chain of only these gives ORT's exact bits (tests/test_discontinuity.py)
EXACT_STEPS = frozenset({"Relu", "LeakyRelu", "Clip", "Abs", "Neg", "Floor", "Ceil", "Sqrt", "Reciprocal",
                         "Add", "Sub", "Mul", "Div", "Max", "Min"})


def _step(ix: GraphIndex, node: onnx.NodeProto, x: str, operands: list[str]) -> dict | None:
    """The chain step of ``node`` applied to the running value ``x``, or None if not chainable."""
    if node.op_type in UNARY and len([i for i in node.input if i]) >= 1 and node.input[0] == x:
        if node.op_type == "Clip":
            bounds = clip_bounds(ix, node)
            return None if bounds is None else {"op": "Clip", "min": bounds[0], "max": bounds[1]}
        if node.op_type == "LeakyRelu":
            return {"op": "LeakyRelu", "alpha": float(attr(node, "alpha", 0.01))}
        if node.op_type == "HardSigmoid":
            return {"op": "HardSigmoid", "alpha": float(attr(node, "alpha", 0.2)),
                    "beta": float(attr(node, "beta", 0.5))}
        return {"op": node.op_type} if len(node.input) == 1 else None
    if node.op_type in BINARY and len(node.input) == 2 and x in node.input and node.input[0] != node.input[1]:
        other = ix.other_input(node, x)
        if node.op_type == "Pow" and (other == node.input[0] or ix.const(other) is None):
            return None  # only x ** constant
        if other not in operands:
            if len(operands) == MAX_CHAIN_OPERANDS:
                return None
            operands.append(other)
        ref = f"c{operands.index(other)}"
        return {"op": node.op_type, "args": ["x", ref] if node.input[0] == x else [ref, "x"]}
    return None


def _expands(ix: GraphIndex, x: str, operand: str) -> bool:
    """True when broadcasting ``operand`` is known to enlarge ``x`` (the chain keeps x's shape)."""
    xs, os_ = ix.shape(x), ix.shape(operand)
    if xs is None or os_ is None:
        return False
    if len(os_) > len(xs):
        return True
    return any(isinstance(o, int) and o != 1 and isinstance(d, int) and d != o for o, d in zip(os_[::-1], xs[::-1]))


# a maximal run of single-consumer elementwise ops on one value x (binary ops take a constant or
# broadcast operand)   ->   FusedEltwiseChain<k>(x, c0..c<k-1>)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    if anchor.op_type in BINARY:
        dynamic = [i for i in anchor.input if ix.const(i) is None]
        x = dynamic[0] if dynamic else None
        if len(dynamic) == 2 and ix.shape(anchor.output[0]) is not None:
            # run the chain on the input that already has the output's shape; the other broadcasts
            x = next((i for i in dynamic if ix.shape(i) == ix.shape(anchor.output[0])), x)
    else:
        x = anchor.input[0] if anchor.input else None
    if not x:
        return None
    operands: list[str] = []
    steps, nodes, cur = [], [], x
    candidate = anchor
    while candidate is not None and id(candidate) not in ix.claimed:
        step = _step(ix, candidate, cur, operands)
        if step is None:
            break
        refs = [a for a in step.get("args", []) if a != "x"]
        if refs and _expands(ix, cur, operands[int(refs[0][1:])]):
            break
        steps.append(step)
        nodes.append(candidate)
        cur = candidate.output[0]
        candidate = ix.only_consumer(cur)
    if len(nodes) < 2:
        return None
    used = sorted({int(a[1:]) for s in steps for a in s.get("args", []) if a != "x"})
    operands = operands[: (used[-1] + 1) if used else 0]
    problem = float32_problem(ix, x, cur, *operands)
    for op in operands:
        value = ix.const(op)
        if value is not None and value.dtype != np.float32:
            problem = problem or f"operand '{op}' has dtype {value.dtype}; float32 kernels only"
    m = Match(ID, f"FusedEltwiseChain{len(operands)}", nodes, [x, *operands], cur,
              {"program": json.dumps(steps, separators=(",", ":"))})
    if problem:
        return Reject(ID, nodes, problem)
    return checked_elementwise(ix, m, x)


def bit_exact(ix: GraphIndex, m: Match) -> bool:
    """True when every step of the chain is in EXACT_STEPS."""
    return all(step["op"] in EXACT_STEPS for step in json.loads(str(m.attrs["program"])))


# FusedEltwiseChain<k>(X, C0..C<k-1>; program) = the program's steps applied to X in order
SPECS = tuple(OpSpec(f"FusedEltwiseChain{k}", ID, ("X",) + tuple(f"C{i}" for i in range(k)), {"program": str},
                     lambda x, *ops, **a: reference.eltwise_chain(x, *ops, program=a["program"]))
              for k in range(MAX_CHAIN_OPERANDS + 1))
NATIVE = tuple(NativeKernel(spec.name) for spec in SPECS)


def _chain(elem: int = onnx.TensorProto.FLOAT, ops: tuple[str, ...] = ("Mul", "Add", "Tanh")) -> onnx.ModelProto:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    constants = {"scale": np.linspace(-2, 2, 7).astype(dtype), "shift": np.array([0.25], dtype)}
    nodes, cur = [], "x"
    for k, op in enumerate(ops):
        inputs = [cur, {"Mul": "scale", "Add": "shift"}[op]] if op in ("Mul", "Add") else [cur]
        nodes.append(helper.make_node(op, inputs, [f"t{k}"], name=op.lower()))
        cur = f"t{k}"
    used = {i for n in nodes for i in n.input}
    return model(nodes, {"x": [3, 7]}, [cur], {k: v for k, v in constants.items() if k in used}, elem=elem)


RULE = PatternRule(
    anchor=Anchor(*sorted(UNARY | BINARY)),
    id=ID, order=90, matcher=match, specs=SPECS, native=NATIVE,
    explains_near_misses=False,  # a chain simply ends at a shared tensor: not a rejection
    yields_to_ort=True, bit_exact=bit_exact,
    examples=(
        Example("mul_add_tanh", _chain),
        Example("float64", lambda: _chain(onnx.TensorProto.DOUBLE), reason="no kernel for dtype float64"),
        Example("single_op", lambda: _chain(ops=("Tanh",)), reason=""),
    ),
)
