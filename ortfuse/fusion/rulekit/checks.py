"""Legality checks a matcher makes before it returns a ``Match``: no tensor lost by the fusion, the
element types the kernels take, and node attributes read with their defaults."""

from __future__ import annotations

import onnx

from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex


def intermediate_problem(ix: GraphIndex, nodes: list[onnx.NodeProto], output: str) -> str:
    """Why replacing ``nodes`` by one op producing ``output`` would lose a tensor, or "".

    Every other output of the replaced nodes must be consumed only inside the set and must not be
    a graph output."""
    inside = {id(n) for n in nodes}
    for node in nodes:
        for out in node.output:
            if not out or out == output:
                continue
            if out in ix.graph_outputs:
                return f"intermediate tensor '{out}' is a graph output"
            for user in ix.consumers_of(out):
                if id(user) not in inside:
                    return f"intermediate tensor '{out}' has another consumer ({ix.name_of(user)})"
    return ""


def float32_problem(ix: GraphIndex, *tensors: str) -> str:
    """"" if every tensor is float32 (or of unknown type), else the reason naming the dtype."""
    for name in tensors:
        elem = ix.elem_type(name)
        if elem is not None and elem != onnx.TensorProto.FLOAT:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "undefined"
            return f"no kernel for dtype {dtype} (tensor '{name}'); float32 kernels only"
    return ""


def elementwise_dtype(ix: GraphIndex, *tensors: str) -> tuple[str, str]:
    """(dtype, "") when the tensors of known type are all float32 or all float16 (unknown types count
    as float32), else ("", the reason naming the dtype)."""
    known = {name: ix.elem_type(name) for name in tensors if ix.elem_type(name) is not None}
    if known and set(known.values()) == {onnx.TensorProto.FLOAT16}:
        return "float16", ""
    if any(elem != onnx.TensorProto.FLOAT for elem in known.values()):
        name, elem = next((n, e) for n, e in known.items() if e != onnx.TensorProto.FLOAT)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "undefined"
        return "", f"no kernel for dtype {dtype} (tensor '{name}') with these inputs; float32 or float16 kernels only"
    return "float32", ""


def checked_elementwise(ix: GraphIndex, match: Match, *tensors: str) -> Match | Reject:
    """``match`` with its dtype (float32, or float16 where every typed tensor is), or the Reject saying why not."""
    match.dtype, problem = elementwise_dtype(ix, *tensors, match.output)
    problem = problem or intermediate_problem(ix, match.nodes, match.output)
    return Reject(match.pattern_id, match.nodes, problem) if problem else match


def attr(node: onnx.NodeProto, name: str, default=None):
    """The value of the node's attribute ``name``, or ``default`` when it is absent."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default
