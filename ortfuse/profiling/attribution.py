"""Each pattern's saving against a stock configuration, and how each profile's time splits.

A fused op is every rewritten node named after it (``<fused_node>`` or ``<fused_node>/<k>``), with
its pattern id and replaced nodes from ``session.fusion_report``. The saving of a pattern: over its
fused ops whose original nodes were found in the stock profile, the stock time of those nodes minus
the fused ops' time (positive: ortfuse is faster). Unmapped time (e.g. NCHWc reorders) is shown per
configuration, outside the savings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortfuse.profiling.trace import Profile


@dataclass
class PatternSaving:
    """Per pattern: fused ops, how many were found in both profiles (mapped), how many run inside a
    layout op shared with other fused ops (shared: never mapped, the op's time is not split), times in
    us per run."""

    pattern_id: str
    ops: int
    mapped: int
    fused_us: float  # every fused op of the pattern
    fused_mapped_us: float  # the mapped ones only
    original_us: float  # stock time of the mapped ops' original nodes
    saving_us: float  # original_us - fused_mapped_us
    shared: int = 0


@dataclass
class Split:
    """How one profile's node time splits: fused ops (fused configuration), nodes that stand for
    original nodes ortfuse left unfused, and unmapped nodes (by op type)."""

    fused_ops_us: float = 0.0
    left_unfused_us: float = 0.0
    unmapped_us: float = 0.0
    unmapped: dict[str, float] = field(default_factory=dict)

    def add_unmapped(self, key: str, us: float) -> None:
        self.unmapped_us += us
        self.unmapped[key] = self.unmapped.get(key, 0.0) + us


@dataclass
class Attribution:
    """Savings per pattern against one stock configuration, and how both profiles' time splits."""

    config: str
    patterns: list[PatternSaving]
    fused_split: Split
    stock_split: Split


def attribute(fused: Profile, stock: Profile, matches: list) -> Attribution:
    """Match the fused ops (``matches``: the report's fused MatchRecords) with the stock nodes
    standing for their original nodes."""
    owner = {orig: m.fused_node for m in matches for orig in m.nodes}
    fused_time: dict[str, float] = {}
    shared: set[str] = set()
    fsplit = Split()
    for node in fused.nodes:
        if node.fused_op:
            fsplit.fused_ops_us += node.us
            fused_time[node.fused_op] = fused_time.get(node.fused_op, 0.0) + node.us
        elif node.spans:
            fsplit.fused_ops_us += node.us
            shared.update(node.spans)
        elif node.maps_to:
            fsplit.left_unfused_us += node.us
        else:
            fsplit.add_unmapped(node.op_type, node.us)
    stock_time: dict[str, float] = {}
    ssplit = Split()
    for node in stock.nodes:
        owners = {owner.get(o) for o in node.maps_to}
        if owners == {None}:
            ssplit.left_unfused_us += node.us
        elif len(owners) == 1 and None not in owners:
            name = str(owners.pop())
            stock_time[name] = stock_time.get(name, 0.0) + node.us
        else:  # no original node found, or several owners: not split by guesswork
            ssplit.add_unmapped(node.op_type if not node.maps_to
                                else f"{node.op_type} (spans a fused op and other nodes)", node.us)
    rows: dict[str, PatternSaving] = {}
    for m in matches:
        row = rows.setdefault(m.pattern_id, PatternSaving(m.pattern_id, 0, 0, 0.0, 0.0, 0.0, 0.0))
        us = fused_time.get(m.fused_node, 0.0)
        row.ops += 1
        row.fused_us += us
        row.shared += m.fused_node in shared
        if m.fused_node in stock_time and m.fused_node in fused_time:  # found in both profiles
            row.mapped += 1
            row.fused_mapped_us += us
            row.original_us += stock_time[m.fused_node]
    for row in rows.values():
        row.saving_us = row.original_us - row.fused_mapped_us
    for split in (fsplit, ssplit):
        split.unmapped = dict(sorted(split.unmapped.items(), key=lambda kv: -kv[1]))
    return Attribution(stock.config, sorted(rows.values(), key=lambda r: -r.fused_us), fsplit, ssplit)
