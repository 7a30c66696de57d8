"""Step 2 of the pipeline: what makes a rule's Match illegal beyond the rule's own checks
(docs/ARCHITECTURE.md §1): nodes ORT fuses better itself (for generic rules) and scalar outputs."""

from __future__ import annotations

from ortfuse.fusion.rulekit.contract import PatternRule
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex

LEFT_TO_ORT = "left to ORT, which fuses it (LayerNorm)"


def legality(ix: GraphIndex, rule: PatternRule, result: Match | Reject, reserved: set[int]) -> Match | Reject:
    """``result``, or the Reject that replaces it. ``reserved``: ids of the nodes ORT fuses itself
    (``ort_territory.reserved_for_ort``), which a rule that ``yields_to_ort`` leaves alone."""
    if rule.yields_to_ort and any(id(n) in reserved for n in result.nodes):
        return Reject(rule.id, result.nodes, LEFT_TO_ORT)
    if isinstance(result, Match) and ix.shape(result.output) == []:
        # extensions' Python ops return a rank-0 result as [1]
        return Reject(rule.id, result.nodes, f"rank-0 tensor '{result.output}': the fused op path "
                                             "does not keep scalar shapes")
    return result
