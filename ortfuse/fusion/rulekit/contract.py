"""The rule contract (docs/ARCHITECTURE.md §4): a module of ``ortfuse.fusion.rules``, named after its
pattern id, declares ``RULE = PatternRule(...)``; ``ortfuse.fusion.catalogue`` derives every table
(ids, matchers, specs, native kernels, lowering forms) from these declarations."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union, cast

from ortfuse.ir.links import ONNX_DOMAINS

if TYPE_CHECKING:
    import onnx

    from ortfuse.custom_ops.specs import OpSpec
    from ortfuse.fusion.rulekit.lowering import Context
    from ortfuse.fusion.rulekit.result import Lowered, Match, Reject
    from ortfuse.ir.graph import GraphIndex

# (graph, anchor node) -> a Match, a Reject with its reason, or None (not a candidate here). Called only
# at nodes its rule's ``anchor`` admits; the graph is the index, or its near-miss view (``ix.near_miss``)
# when the rewriter asks why a None was not a candidate (``fusion.match.explain_near_miss``)
Matcher = Callable[["GraphIndex", "onnx.NodeProto"], Union["Match", "Reject", None]]
# (graph, match) -> True when every kernel of the match computes bit for bit what ORT computes
BitExact = Callable[["GraphIndex", "Match"], bool]


class Anchor:
    """The nodes a rule's matcher is tried at: one of ``op_types``, in the ONNX domain ("" or
    "ai.onnx") when ``onnx_only``, else in any domain. The match step passes no other node to it."""

    def __init__(self, *op_types: str, onnx_only: bool = False) -> None:
        if not op_types:
            raise ValueError("an Anchor names at least one op type")
        self.op_types = frozenset(op_types)
        self.onnx_only = onnx_only

    def admits(self, node: onnx.NodeProto) -> bool:
        return node.op_type in self.op_types and (not self.onnx_only or node.domain in ONNX_DOMAINS)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Anchor) and (self.op_types, self.onnx_only) == (other.op_types, other.onnx_only)

    def __hash__(self) -> int:
        return hash((self.op_types, self.onnx_only))

    def __repr__(self) -> str:
        return f"Anchor({', '.join(map(repr, sorted(self.op_types)))}{', onnx_only=True' if self.onnx_only else ''})"


@dataclass(frozen=True)
class NativeKernel:
    """A native (numba) op type that computes one of the rule's specs: the spec's own name for
    float32, or a variant under another dtype (float16) or numeric contract (bf16 products).

    The registry offers it where the native path has registered ``op_type`` and the CPU reports
    ``cpu_features``; ``misfit(match)`` says why it does not suit one match ("" when it does)."""

    op: str  # the spec it computes
    op_type: str = ""  # the registered op type; "" = ``op``
    dtype: str = "float32"
    precision: str = "fp32"  # "fp32": float32 products; "bf16": bf16 products (only under that opt-in)
    isa: str = ""  # "" = the level numba compiles for in this process; else that level (e.g. "amx")
    cpu_features: tuple[str, ...] = ()
    priority: int = 10  # lowered forms rank against this; the reference path is 0
    misfit: Callable[[Match], str] | None = None

    @property
    def name(self) -> str:
        return self.op_type or self.op


@dataclass(frozen=True)
class LoweringForm:
    """A spec written as operators ORT already has: ``build(match, ctx)`` returns the nodes or the
    reason it does not apply. ``priorities`` maps each epilogue it serves (the match's
    ``activation``; "" = none) to its priority against the other kernels of the spec;
    ``native_ops`` names the native op an epilogue's nodes end in (offered only where it exists).
    ``name`` is unique across rules: ``fuse(kernels="lowered:<name>")`` forces it."""

    name: str
    op: str
    summary: str  # the report's label after "lowered to ORT: "
    build: Callable[[Match, Context], Lowered | str]
    priorities: Mapping[str, int]
    native_ops: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Example:
    """A small graph the shared harness (tests/test_rules.py) runs through ``fuse(model, [rule id])``.

    ``reason`` None: the rule fuses it ``fuses`` times and the fused model gives the outputs of the
    unfused one on stock ORT. A string: a near-miss, not fused; the report rejects it with a reason
    containing that text ("": no candidate is reported at all)."""

    name: str
    build: Callable[[], onnx.ModelProto]
    reason: str | None = None
    fuses: int = 1


@dataclass(frozen=True)
class PatternRule:
    """One fusion pattern. ``order``: priority, lower first (an earlier pattern claims nodes first);
    ``anchor``: the nodes its matcher starts from (an ``Anchor``; a str names one op type, any domain);
    ``matcher`` is tried at every unclaimed anchor in graph order; ``specs``: the fused op(s) its
    matches name (``Match.op``), each with its numpy reference; ``native`` and ``lowering``: the
    kernels beyond the reference that serve them; ``explains_near_misses``: a candidate missed only
    because an intermediate tensor is used elsewhere is reported with that reason;
    ``yields_to_ort``: nodes ORT fuses itself (``ort_territory``) are left to it; ``bit_exact``: whether
    a match's kernels give ORT's exact bits (None: never claimed), which a match whose output decides a
    discontinuous op needs (``fusion.discontinuity``)."""

    id: str
    order: int
    anchor: Anchor | str
    matcher: Matcher
    specs: tuple[OpSpec, ...]
    examples: tuple[Example, ...]
    native: tuple[NativeKernel, ...] = ()
    lowering: tuple[LoweringForm, ...] = ()
    explains_near_misses: bool = True
    yields_to_ort: bool = False
    bit_exact: BitExact | None = None

    def __post_init__(self) -> None:
        if isinstance(self.anchor, str):
            object.__setattr__(self, "anchor", Anchor(self.anchor))
        names = {s.name for s in self.specs}
        wrong = [s.name for s in self.specs if s.pattern_id != self.id]
        wrong += [k.name for k in self.native if k.op not in names]
        wrong += [f.name for f in self.lowering if f.op not in names]
        if not self.specs or wrong:
            raise ValueError(f"rule {self.id}: no spec, or {wrong} name a spec of another pattern")
        if not any(e.reason is None for e in self.examples) or not any(e.reason is not None for e in self.examples):
            raise ValueError(f"rule {self.id}: needs a matching example and a near-miss example")

    def is_anchor(self, node: onnx.NodeProto) -> bool:
        """Whether the matcher is tried at ``node``: ``anchor`` admits it."""
        return cast(Anchor, self.anchor).admits(node)
