"""Step 1 of the pipeline: the candidates of one rule, in graph order (docs/ARCHITECTURE.md §1).

Each node of the rule's anchor type (``PatternRule.anchor``) not yet claimed by a decided match
(``ix.claimed``) nor part of this rule's rejected candidates is an anchor for the rule's matcher; a
candidate touching a claimed node is skipped (a higher-priority match took it)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from ortfuse.fusion.rulekit.checks import intermediate_problem
from ortfuse.fusion.rulekit.contract import PatternRule
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex


def candidates(ix: GraphIndex, rule: PatternRule, rejected: set[int]) -> Iterator[Match | Reject]:
    """The rule's Match or Reject at each anchor. ``rejected`` holds the ids of nodes of this rule's
    rejected candidates (the caller adds to it while iterating): they are not anchors again."""
    for node in ix.graph.node:
        if not rule.is_anchor(node) or id(node) in ix.claimed or id(node) in rejected:
            continue
        result = rule.matcher(ix, node)
        if result is None and rule.explains_near_misses:
            result = explain_near_miss(ix, rule, node)
        if result is None or any(id(n) in ix.claimed for n in result.nodes):
            continue
        yield result


def explain_near_miss(ix: GraphIndex, rule: PatternRule, node: onnx.NodeProto) -> Reject | None:
    """The rule's matcher at ``node`` on the near-miss view of the index (``ix.explaining()``: a
    single-reader step follows any reader). A candidate found there was missed only because an
    intermediate tensor is read elsewhere, which becomes its reason; None when there is none."""
    result = rule.matcher(ix.explaining(), node)
    if result is None or any(id(n) in ix.claimed for n in result.nodes):
        return None
    problem = result.reason if isinstance(result, Reject) else intermediate_problem(ix, result.nodes, result.output)
    return Reject(rule.id, result.nodes, problem) if problem else None
