"""Step 2 of the pipeline: what makes a rule's Match illegal beyond the rule's own checks
(docs/ARCHITECTURE.md §1): nodes ORT fuses better itself (for generic rules), scalar outputs, and
outputs that decide a discontinuous op where the kernel is not bit-exact with ORT."""

from __future__ import annotations

from ortfuse.fusion.rulekit.contract import PatternRule
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex

LEFT_TO_ORT = "left to ORT, which fuses it (LayerNorm)"


def legality(ix: GraphIndex, rule: PatternRule, result: Match | Reject, reserved: set[int],
             deciding: dict[str, str]) -> Match | Reject:
    """``result``, or the Reject that replaces it. ``reserved``: ids of the nodes ORT fuses itself
    (``ort_territory.reserved_for_ort``), which a rule that ``yields_to_ort`` leaves alone;
    ``deciding``: the tensors whose exact bits decide a discontinuous op
    (``discontinuity.deciding_tensors``), with that op."""
    if rule.yields_to_ort and any(id(n) in reserved for n in result.nodes):
        return Reject(rule.id, result.nodes, LEFT_TO_ORT)
    if isinstance(result, Match) and ix.shape(result.output) == []:
        # extensions' Python ops return a rank-0 result as [1]
        return Reject(rule.id, result.nodes, f"rank-0 tensor '{result.output}': the fused op path "
                                             "does not keep scalar shapes")
    if isinstance(result, Match) and result.output in deciding and not (rule.bit_exact and rule.bit_exact(ix, result)):
        return Reject(rule.id, result.nodes, f"its output decides {deciding[result.output]}, a discontinuous op, "
                                             "and this kernel is not bit-exact with ORT: left to ORT",
                      shorter_may_fit=True)
    return result
