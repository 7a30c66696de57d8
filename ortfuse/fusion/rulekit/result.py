"""What rule functions return: a matcher a ``Match`` (fuse these nodes into one op) or a ``Reject``
(a candidate that cannot be fused, with the reason the report shows; ``None`` means "not a candidate
here"); a lowering form's build the ``Lowered`` nodes (or the reason, a str, it does not apply)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


@dataclass
class Match:
    pattern_id: str
    op: str  # the name of one of the rule's ``OpSpec``s
    nodes: list[onnx.NodeProto]
    inputs: list[str]
    output: str
    attrs: dict = field(default_factory=dict)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    op_type: str = ""  # set by the rewriter from the kernel the registry selects
    node_name: str = ""  # set by the rewriter: the fused node's name, unique in the graph
    lowered: Lowered | None = None  # set by the rewriter for a lowered kernel: its nodes
    dtype: str = "float32"  # the element type of its tensors: float32, or float16 (elementwise patterns)


@dataclass
class Reject:
    """A candidate not fused, with the reason. ``shorter_may_fit``: the reason is about where the
    whole run ends, so later nodes of it may still anchor a shorter candidate."""

    pattern_id: str
    nodes: list[onnx.NodeProto]
    reason: str
    shorter_may_fit: bool = False


@dataclass
class Lowered:
    """A lowering form's replacement of a match: ``nodes`` in execution order, the last one writing
    the match output, and the constants they read besides the match's own initializers."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)
