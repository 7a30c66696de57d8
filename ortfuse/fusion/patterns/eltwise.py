"""Elementwise patterns: add_relu, hardswish, silu, and the generic eltwise_chain."""

from __future__ import annotations

import json

import numpy as np
import onnx

from ortfuse.ir.graph import GraphIndex
from ortfuse.fusion.patterns.activations import (
    _clip_bounds,
    hardsigmoid_as_hardswish,
    match_hardswish_decomposed,
    match_silu,
)
from ortfuse.custom_ops import reference
from ortfuse.custom_ops.specs import MAX_CHAIN_OPERANDS
from ortfuse.fusion.patterns.base import Match, Reject, attr, elementwise_dtype, float32_problem, intermediate_problem

UNARY = frozenset(reference.UNARY) | frozenset(reference.PARAM_UNARY)
BINARY = frozenset(reference.BINARY)
MAX_OPERANDS = MAX_CHAIN_OPERANDS


def _checked(ix: GraphIndex, match: Match, *tensors: str) -> Match | Reject:
    """``match`` with its dtype (float32, or float16 where every typed tensor is), or the Reject saying why not."""
    match.dtype, problem = elementwise_dtype(ix, *tensors, match.output)
    problem = problem or intermediate_problem(ix, match.nodes, match.output)
    return Reject(match.pattern_id, match.nodes, problem) if problem else match


# Add(a, b) -> Relu   ->   FusedAddRelu(a, b)        (a and b both computed at run time)
def match_add_relu(ix: GraphIndex, node: onnx.NodeProto) -> Match | Reject | None:
    if node.op_type != "Add" or len(node.input) != 2:
        return None
    relu = ix.only_consumer(node.output[0])
    if relu is None or relu.op_type != "Relu":
        return None
    a, b = node.input
    if ix.const(a) is not None or ix.const(b) is not None:
        return None  # a constant operand makes it an eltwise_chain
    match = Match("add_relu", "FusedAddRelu", [node, relu], [a, b], relu.output[0])
    return _checked(ix, match, a, b)


# Add(x, 3) -> Clip(0, 6) -> Div(6) -> Mul(x)  |  HardSigmoid(x) -> Mul(x)   ->   FusedHardSwish(x)
def match_hardswish(ix: GraphIndex, node: onnx.NodeProto) -> Match | Reject | None:
    if node.op_type == "HardSigmoid":
        x = node.input[0]
        mul = ix.only_consumer(node.output[0])
        if mul is None or mul.op_type != "Mul" or ix.other_input(mul, node.output[0]) != x:
            return None
        params = hardsigmoid_as_hardswish(float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5)))
        if params is None:
            return None  # not a HardSwish; an eltwise_chain may still take it
        return _checked(ix, Match("hardswish", "FusedHardSwish", [node, mul], [x], mul.output[0], params), x)
    if node.op_type != "Add":
        return None
    for x in node.input:
        found = match_hardswish_decomposed(ix, x)
        if found is not None and found[0][0] is node:
            nodes, out, (add, lo, hi, div) = found
            params = {"add": add, "lo": lo, "hi": hi, "div": div}
            return _checked(ix, Match("hardswish", "FusedHardSwish", nodes, [x], out, params), x)
    return None


# Sigmoid(x) -> Mul(x)   ->   FusedSiLU(x)
def match_silu_pattern(ix: GraphIndex, node: onnx.NodeProto) -> Match | Reject | None:
    if node.op_type != "Sigmoid":
        return None
    epi = match_silu(ix, node.input[0])
    if epi is None or epi.nodes[0] is not node:
        return None
    return _checked(ix, Match("silu", "FusedSiLU", epi.nodes, [node.input[0]], epi.output), node.input[0])


def _step(ix: GraphIndex, node: onnx.NodeProto, x: str, operands: list[str]) -> dict | None:
    """The chain step of ``node`` applied to the running value ``x``, or None if not chainable."""
    if node.op_type in UNARY and len([i for i in node.input if i]) >= 1 and node.input[0] == x:
        if node.op_type == "Clip":
            bounds = _clip_bounds(ix, node)
            return None if bounds is None else {"op": "Clip", "min": bounds[0], "max": bounds[1]}
        if node.op_type == "LeakyRelu":
            return {"op": "LeakyRelu", "alpha": float(attr(node, "alpha", 0.01))}
        if node.op_type == "HardSigmoid":
            return {"op": "HardSigmoid", "alpha": float(attr(node, "alpha", 0.2)), "beta": float(attr(node, "beta", 0.5))}
        return {"op": node.op_type} if len(node.input) == 1 else None
    if node.op_type in BINARY and len(node.input) == 2 and x in node.input and node.input[0] != node.input[1]:
        other = ix.other_input(node, x)
        if node.op_type == "Pow" and (other == node.input[0] or ix.const(other) is None):
            return None  # only x ** constant
        if other not in operands:
            if len(operands) == MAX_OPERANDS:
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
def match_eltwise_chain(ix: GraphIndex, node: onnx.NodeProto) -> Match | Reject | None:
    if node.op_type in BINARY:
        dynamic = [i for i in node.input if ix.const(i) is None]
        x = dynamic[0] if dynamic else None
        if len(dynamic) == 2 and ix.shape(node.output[0]) is not None:
            # run the chain on the input that already has the output's shape; the other broadcasts
            x = next((i for i in dynamic if ix.shape(i) == ix.shape(node.output[0])), x)
    else:
        x = node.input[0] if node.input else None
    if not x:
        return None
    operands: list[str] = []
    steps, nodes, cur = [], [], x
    candidate = node
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
    match = Match("eltwise_chain", f"FusedEltwiseChain{len(operands)}", nodes, [x, *operands], cur,
                  {"program": json.dumps(steps, separators=(",", ":"))})
    if problem:
        return Reject("eltwise_chain", nodes, problem)
    return _checked(ix, match, x)
