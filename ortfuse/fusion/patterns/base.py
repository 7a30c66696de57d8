"""What a pattern returns: a ``Match`` (fuse these nodes into one op) or a ``Reject`` (a candidate
that cannot be fused, with the reason the report shows). ``None`` means "not a candidate here"."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from ortfuse.ir.graph import GraphIndex


@dataclass
class Match:
    pattern_id: str
    op: str  # a custom_ops.specs.SPECS name
    nodes: list[onnx.NodeProto]
    inputs: list[str]
    output: str
    attrs: dict = field(default_factory=dict)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    op_type: str = ""  # set by the rewriter from the kernel the registry selects
    node_name: str = ""  # set by the rewriter: the fused node's name, unique in the graph
    lowered: object = None  # set by the rewriter for a lowered kernel: its ``lowering.Lowered``
    dtype: str = "float32"  # the element type of its tensors: float32, or float16 (elementwise patterns)


@dataclass
class Reject:
    pattern_id: str
    nodes: list[onnx.NodeProto]
    reason: str


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


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default
