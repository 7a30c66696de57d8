"""FusionReport: every candidate match and what was decided about it, as a table or JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

FUSED = "fused"
REJECTED = "rejected"
DISABLED = "disabled by policy"


@dataclass
class MatchRecord:
    """One candidate match: which pattern, which original nodes, and the decision with its reason."""

    pattern_id: str
    nodes: list[str]
    decision: str
    reason: str = ""
    fused_node: str = ""
    kernel: str = ""
    fused_ms: float | None = None  # measured by the auto policy on this match's subgraph
    ort_ms: float | None = None  # stock ORT on the same subgraph, same run


@dataclass
class FusionReport:
    """What ortfuse did to one model. ``applied`` is False when the model runs exactly as stock ORT."""

    applied: bool = False
    reason: str = ""
    stepped_aside: bool = False  # ortfuse could not even look for matches (unreadable model, external data...)
    patterns: list[str] = field(default_factory=list)
    matches: list[MatchRecord] = field(default_factory=list)
    disabled_ort_optimizers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.matches)

    def __iter__(self):
        return iter(self.matches)

    @property
    def fused(self) -> list[MatchRecord]:
        return [m for m in self.matches if m.decision == FUSED]

    def counts(self) -> dict[str, int]:
        """Number of fused ops per pattern id."""
        out: dict[str, int] = {}
        for m in self.fused:
            out[m.pattern_id] = out.get(m.pattern_id, 0) + 1
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> FusionReport:
        matches = [MatchRecord(**m) for m in data.get("matches", [])]
        return cls(**{**data, "matches": matches})

    def table(self) -> str:
        """A readable table: one row per candidate match."""
        head = f"fusion {'applied' if self.applied else 'not applied'}"
        if self.reason:
            head += f": {self.reason}"
        lines = [head]
        if self.matches:
            rows = [("pattern", "decision", "nodes", "reason / kernel")]
            for m in self.matches:
                detail = m.reason if m.decision != FUSED else (m.kernel or m.fused_node)
                if m.decision == FUSED and m.fused_ms and m.ort_ms:
                    detail += f" ({m.fused_ms:.3f} ms vs ORT {m.ort_ms:.3f} ms)"
                rows.append((m.pattern_id, m.decision, ",".join(m.nodes), detail))
            widths = [min(max(len(r[i]) for r in rows), 60) for i in range(3)]
            for r in rows:
                lines.append("  ".join(c.ljust(w)[: max(w, 1)] for c, w in zip(r[:3], widths)) + "  " + r[3])
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.disabled_ort_optimizers:
            lines.append("ORT optimizers disabled: " + ", ".join(self.disabled_ort_optimizers))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
