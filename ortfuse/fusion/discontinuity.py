"""Which tensors decide the result of a discontinuous op (docs/ARCHITECTURE.md §4).

Floor, Ceil, Round, a Cast to an integer type, quantization, Mod, Sign and comparisons map an
interval of inputs to one output: a last-bit difference anywhere upstream (a reciprocal multiply for
a Div, a reassociated sum, a fused multiply-add, a polynomial exp) can move a value across a
boundary and change an integer result by one, which a requantization chain then scales into a
large error. So a match whose output reaches such an op is fused only when its kernel computes bit
for bit what ORT computes (``PatternRule.bit_exact``); otherwise it is left to ORT, with the reason.

Reach is transitive through every op whose output depends on its inputs' values, so a float
activation that later feeds a DynamicQuantizeLinear counts, however many ops lie between. Shape and
Size read only their input's shape and stop the walk. ArgMax, ArgMin and TopK are not counted: they
select among values, and a different result needs two candidates within a last bit of each other,
which ORT's own optimisation levels already disagree on as often as a fused kernel would.
"""

from __future__ import annotations

import onnx

from ortfuse.ir.graph import GraphIndex

ROUNDING = frozenset({"Floor", "Ceil", "Round", "Sign", "Mod", "QuantizeLinear", "DynamicQuantizeLinear",
                      "DynamicQuantizeMatMul", "QLinearConv", "QLinearMatMul"})
COMPARISONS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
SHAPE_ONLY = frozenset({"Shape", "Size"})  # the output depends on the input's shape, never its values
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                          onnx.TensorProto.BFLOAT16})


def is_discontinuous(node: onnx.NodeProto, input_type: int | None = None) -> bool:
    """True when ``node`` maps an interval of inputs to one output (see the module docstring).
    ``input_type``: the element type of a Cast's input, if known (an integer widened stays exact)."""
    if node.op_type in ROUNDING or node.op_type in COMPARISONS:
        return True
    if node.op_type in ("Cast", "CastLike") and input_type not in _FLOAT_TYPES and input_type is not None:
        return False
    if node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), onnx.TensorProto.FLOAT)
        return to not in _FLOAT_TYPES
    return node.op_type == "CastLike"  # its target type is a tensor's: counted, to be safe


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            graphs.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(a.graphs)
    return graphs


def _body_decides(graphs: list[onnx.GraphProto]) -> tuple[bool, set[str]]:
    """Whether a subgraph (recursively) holds a discontinuous op, and every name its nodes read."""
    found, names = False, set[str]()
    for g in graphs:
        for n in g.node:
            found = found or is_discontinuous(n)
            names.update(i for i in n.input if i)
            inner_found, inner_names = _body_decides(_subgraphs(n))
            found, names = found or inner_found, names | inner_names
    return found, names


def deciding_tensors(ix: GraphIndex) -> dict[str, str]:
    """Every tensor of the top-level graph whose exact value can decide a discontinuous op's result,
    mapped to that op (``"Floor 'name'"``), for the reason a match is left to ORT."""
    seeds: list[tuple[str, str]] = []
    for node in ix.graph.node:
        label = f"{node.op_type} '{ix.name_of(node)}'"
        if is_discontinuous(node, ix.elem_type(node.input[0]) if node.input else None):
            seeds.extend((i, label) for i in node.input if i)
        graphs = _subgraphs(node)
        if graphs:
            found, names = _body_decides(graphs)
            if found:
                seeds.extend((i, f"a {label} body") for i in [*node.input, *names] if i)
    decided: dict[str, str] = {}
    while seeds:
        tensor, label = seeds.pop()
        if tensor in decided:
            continue
        decided[tensor] = label
        producer = ix.producer.get(tensor)
        if producer is None or producer.op_type in SHAPE_ONLY:
            continue
        seeds.extend((i, label) for i in producer.input if i and i not in decided)
        for g in _subgraphs(producer):
            _, names = _body_decides([g])
            seeds.extend((i, label) for i in names if i not in decided)
    return decided
