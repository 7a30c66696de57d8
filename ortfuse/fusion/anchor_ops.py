"""Whether any fusion can match a model, read from its serialized bytes alone: no onnx, no parse
(docs/ARCHITECTURE.md §7).

A rule's matcher is tried only at top-level nodes of its anchor's op types (``PatternRule.anchor``;
If/Loop/Scan bodies are not rewritten, ``fusion.apply``). A model none of whose top-level nodes has
such an op type matches no pattern, whatever else it holds: ``fusion="auto"`` then keeps stock ORT
from its creation, and records and tunes nothing. ``ANCHOR_OP_TYPES`` writes the rules' anchors
out, so that this question needs no rule module (they import onnx);
tests/test_anchor_ops.py checks it against the catalogue.

Contract:
- ``top_level_op_types(data)``: the op types of the graph's nodes (any domain), or None when the
  bytes are not a well-formed ``ModelProto`` with exactly one graph;
- ``could_match(op_types, pattern_ids, has_functions)`` is False only when it is certain that no
  pattern of ``pattern_ids`` (None or "auto": all) can match a graph whose top-level nodes have
  ``op_types``: no local functions (a call names a function, not the ops it holds), no node of an
  anchor's op type. An unknown id answers True (the caller matches the parsed model as before);
- ``may_match(data, pattern_ids)`` is ``could_match`` read from the bytes; bytes it cannot read
  answer True.
"""

from __future__ import annotations

from collections.abc import Iterable

from ortfuse.ir import metadata

# pattern id -> the op types its matcher starts from (each rule's ``anchor``)
ANCHOR_OP_TYPES: dict[str, frozenset[str]] = {
    "attention": frozenset({"Softmax"}),
    "conv_add_relu": frozenset({"Conv"}),
    "conv_add": frozenset({"Conv"}),
    "conv_act": frozenset({"Conv"}),
    "gemm_act": frozenset({"Gemm", "MatMul"}),
    "embed_layernorm": frozenset({"Add"}),
    "skip_layernorm": frozenset({"Add"}),
    "add_relu": frozenset({"Add"}),
    "dfl": frozenset({"Transpose"}),
    "hardswish": frozenset({"Add", "HardSigmoid"}),
    "silu": frozenset({"Sigmoid"}),
    "mish": frozenset({"Exp", "Mish", "Softplus"}),
    "eltwise_chain": frozenset({"Abs", "Add", "Ceil", "Clip", "Div", "Erf", "Exp", "Floor", "HardSigmoid",
                                "LeakyRelu", "Log", "Max", "Min", "Mul", "Neg", "Pow", "Reciprocal", "Relu",
                                "Sigmoid", "Softplus", "Sqrt", "Sub", "Tanh"}),
}

_FUNCTIONS_FIELD = 25  # ModelProto.functions
_NODE_FIELD = 1  # GraphProto.node
_OP_TYPE_FIELD = 4  # NodeProto.op_type


def top_level_op_types(data) -> set[str] | None:
    """See the module docstring."""
    span = metadata.graph_span(data)
    if span is None:
        return None
    start, length = span
    try:
        found: set[str] = set()
        for number, node in metadata._fields(data, start, start + length):
            if number != _NODE_FIELD or not isinstance(node, tuple):
                continue
            for field, value in metadata._fields(data, node[0], node[0] + node[1]):
                if field == _OP_TYPE_FIELD and isinstance(value, tuple):
                    found.add(bytes(data[value[0]:value[0] + value[1]]).decode("utf-8"))
        return found
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


def could_match(op_types: set[str], pattern_ids: Iterable[str] | str | None, has_functions: bool) -> bool:
    """See the module docstring."""
    from ortfuse.fusion.catalogue import _requested

    wanted = list(ANCHOR_OP_TYPES) if pattern_ids is None else _requested(pattern_ids)
    if any(p.lower() == "auto" for p in wanted):
        wanted = list(ANCHOR_OP_TYPES)
    if has_functions or any(p not in ANCHOR_OP_TYPES for p in wanted):
        return True
    return any(op_types & ANCHOR_OP_TYPES[p] for p in wanted)


def may_match(data, pattern_ids: Iterable[str] | str | None) -> bool:
    """See the module docstring."""
    try:
        has_functions = any(number == _FUNCTIONS_FIELD for number, _ in metadata._fields(data, 0, len(data)))
    except (ValueError, IndexError):
        return True
    op_types = top_level_op_types(data)
    return op_types is None or could_match(op_types, pattern_ids, has_functions)
