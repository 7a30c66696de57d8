"""What a fused op is, as ORT sees it: ``OpSpec`` (name, inputs, attributes, numpy reference), the
custom-op domain, and the provenance attributes every fused node carries.

The specs themselves are declared by the fusion rules (``ortfuse.fusion.rules``, one module per
pattern) and collected by ``ortfuse.fusion.catalogue.SPECS``; code of this package that needs them
(the reference Python ops) receives them from its caller.

Every fused node carries two provenance attributes, ``pattern_id`` and ``replaced_nodes``
(comma-separated names of the nodes it replaced). Op types served by the reference (Python-op) path
end in ``Ref``; native kernels use other names, because an op name registered on both paths hangs
onnxruntime-extensions (docs/ARCHITECTURE.md §6).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

DOMAIN = "ai.onnx.contrib"
PROVENANCE_ATTRS = {"pattern_id": str, "replaced_nodes": str}
MAX_CHAIN_OPERANDS = 4  # operands of one FusedEltwiseChain<k> (k = 0..4): one op type per count


@dataclass(frozen=True)
class OpSpec:
    """A fused op: ``inputs`` are float32 tensors, except those named in ``int64_inputs`` (indices);
    ``attrs`` maps attribute name to int/float/str; ``reference(*inputs, **attrs)`` is its numpy
    definition, which every kernel is checked against."""

    name: str
    pattern_id: str
    inputs: tuple[str, ...]
    attrs: dict[str, type] = field(default_factory=dict)
    reference: Callable = None
    int64_inputs: tuple[str, ...] = ()

    @property
    def ref_op_type(self) -> str:
        return self.name + "Ref"

    def all_attrs(self) -> dict[str, type]:
        return {**self.attrs, **PROVENANCE_ATTRS}
