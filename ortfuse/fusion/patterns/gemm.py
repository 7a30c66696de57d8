"""gemm_relu_gelu: Gemm, or MatMul (any rank, constant 2-D weight) [+ bias Add], then an epilogue
of Relu, Gelu (ONNX op, erf or tanh decompositions) or Relu then Gelu.

Gemm's alpha, beta and transB are folded into the weights: W' = alpha * op(B), b' = beta * C.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ortfuse.ir.graph import GraphIndex
from ortfuse.fusion.patterns.activations import Epilogue, match_gelu
from ortfuse.fusion.patterns.base import Match, Reject, attr, float32_problem, intermediate_problem

PATTERN = "gemm_relu_gelu"


def _epilogue(ix: GraphIndex, x: str) -> Epilogue | None:
    """Relu | Gelu | Relu then Gelu, as one Epilogue."""
    relu = ix.only_consumer(x)
    if relu is not None and relu.op_type == "Relu":
        gelu = match_gelu(ix, relu.output[0])
        if gelu is not None:
            return Epilogue("relu+" + gelu.kind, [relu] + gelu.nodes, gelu.output)
        return Epilogue("relu", [relu], relu.output[0])
    return match_gelu(ix, x)


def _core(ix: GraphIndex, node: onnx.NodeProto):
    """(nodes, output, W [K,N], b [N]) or a Reject, or None when the node is not a candidate."""
    if node.op_type == "Gemm":
        w = ix.const(node.input[1])
        if w is None:
            return Reject(PATTERN, [node], f"Gemm weight '{node.input[1]}' is not a constant")
        if attr(node, "transA", 0):
            return Reject(PATTERN, [node], "Gemm transA=1 is not supported")
        w = w.astype(np.float64)
        if attr(node, "transB", 0):
            w = w.T
        w = w * float(attr(node, "alpha", 1.0))
        n = w.shape[1]
        bias = np.zeros(n)
        if len(node.input) > 2 and node.input[2]:
            c = ix.const(node.input[2])
            if c is None:
                return Reject(PATTERN, [node], f"Gemm bias '{node.input[2]}' is not a constant")
            if c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1):
                return Reject(PATTERN, [node], f"Gemm bias of shape {list(c.shape)} is not a per-column bias")
            bias = np.broadcast_to(c.astype(np.float64).reshape(-1), (n,)) * float(attr(node, "beta", 1.0))
        return [node], node.output[0], w, bias
    if node.op_type == "MatMul":
        w = ix.const(node.input[1])
        if w is None or w.ndim != 2:
            return None  # activation x activation MatMul (attention): not this pattern
        n = w.shape[1]
        nodes, out, bias = [node], node.output[0], np.zeros(n)
        add = ix.only_consumer(out)
        if add is not None and add.op_type == "Add":
            b = ix.const(ix.other_input(add, out) or "")
            x_rank = len(ix.shape(node.input[0]) or []) or 2  # MatMul output rank = x's rank (x rank >= 2)
            if b is not None and b.size == n and b.ndim <= x_rank and all(d == 1 for d in b.shape[:-1]):
                nodes, out, bias = nodes + [add], add.output[0], b.astype(np.float64).reshape(n)
        return nodes, out, w.astype(np.float64), bias
    return None


# Gemm | MatMul [-> Add(bias)] -> Relu | Gelu | Relu -> Gelu   ->   FusedGemmAct(X, W', b')
def match_gemm_relu_gelu(ix: GraphIndex, node: onnx.NodeProto) -> Match | Reject | None:
    core = _core(ix, node)
    if core is None or isinstance(core, Reject):
        return core
    nodes, out, w, bias = core
    epilogue = _epilogue(ix, out)
    if epilogue is None:
        return None  # without an epilogue ORT fuses it itself (MatMul+Add -> Gemm)
    nodes = nodes + epilogue.nodes
    problem = float32_problem(ix, node.input[0], epilogue.output) or intermediate_problem(ix, nodes, epilogue.output)
    x_shape = ix.shape(node.input[0])
    k = x_shape[-1] if x_shape else None
    if not problem and isinstance(k, int) and k != w.shape[0]:  # ORT fails such a model at run time, not load
        problem = f"input '{node.input[0]}' is declared with {k} columns but the weight has {w.shape[0]} rows"
    if problem:
        return Reject(PATTERN, nodes, problem)
    base = f"{ix.name_of(node)}_fused"
    inits = [numpy_helper.from_array(w.astype(np.float32), ix.unique_name(f"{base}_W")),
             numpy_helper.from_array(bias.astype(np.float32), ix.unique_name(f"{base}_B"))]
    return Match(PATTERN, "FusedGemmAct", nodes, [node.input[0]] + [t.name for t in inits], epilogue.output,
                 {"activation": epilogue.kind}, inits)
