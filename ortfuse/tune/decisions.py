"""The ``fusion="auto"`` decisions of one model on one machine: the verdict on each match, the
whole-model check, and the ``fuse(keep=...)`` rule they make (docs/ARCHITECTURE.md §8)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ortfuse.fusion.report import FusionReport, MatchRecord

MARGIN = 0.05  # a fusion must be at least 5% faster than ORT on its subgraph
MODEL_LIMIT = 0.98  # the whole auto model must win by 2% (median) and in every repeat, else nothing is kept
FORMAT = 1  # of the JSON form (cache files, model metadata)


@dataclass
class Decision:
    """The measured verdict on one match (identified by pattern id and original node names)."""

    pattern_id: str
    nodes: list[str]
    keep: bool
    reason: str
    fused_ms: float | None = None
    ort_ms: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.fused_ms / self.ort_ms if self.fused_ms and self.ort_ms else None


@dataclass
class Tuning:
    """All decisions for one model on this machine, plus the whole-model check."""

    key: dict
    decisions: list[Decision] = field(default_factory=list)
    model_check: dict | None = None  # {"fused_ms", "ort_ms", "ratio", "passed"}
    seconds: float = 0.0
    path: str = ""
    from_cache: bool = False
    origin: str = ""  # "model metadata" when read from the model (ortfuse-annotate --tune)
    measured: bool = True  # False: nothing was measured nor cached (ORTFUSE_TUNE=off), so nothing is known

    def find(self, pattern_id: str, nodes: Iterable[str]) -> Decision | None:
        wanted = (pattern_id, tuple(nodes))
        return next((d for d in self.decisions if (d.pattern_id, tuple(d.nodes)) == wanted), None)

    def keep_rule(self) -> Callable[[MatchRecord], str]:
        """The ``fuse(keep=...)`` rule: fuse what was measured to win, nothing unmeasured."""
        failed = self.model_check is not None and not self.model_check["passed"]

        def rule(record: MatchRecord) -> str:
            found = self.find(record.pattern_id, record.nodes)
            if found is None:
                return "auto: not measured on this machine (run `ortfuse tune MODEL`)"
            if not found.keep:
                return found.reason
            if failed:
                return (f"auto: the whole model with the kept fusions ran {self.model_check['ratio']:.3f}x stock "
                        f"ORT (limit {MODEL_LIMIT:.2f}), so none is kept")
            return ""

        return rule

    def annotate(self, report: FusionReport) -> None:
        """Write the measured times into the report's records and say where the decisions came from."""
        for record in report.matches:
            found = self.find(record.pattern_id, record.nodes)
            if found is not None:
                record.fused_ms, record.ort_ms = found.fused_ms, found.ort_ms
        origin = "cached" if self.from_cache else f"measured in {self.seconds:.1f} s"
        note = f"auto: decisions {origin} ({self.origin or self.path or 'not cached'})"
        if self.model_check:
            c = self.model_check
            note += (f"; whole model {c['fused_ms']:.3f} ms vs stock ORT {c['ort_ms']:.3f} ms "
                     f"(ratio {c['ratio']:.3f}, {'passed' if c['passed'] else 'failed'})")
        report.notes.append(note)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "key": self.key, "seconds": self.seconds, "model_check": self.model_check,
                "decisions": [dataclasses.asdict(d) for d in self.decisions]}

    @classmethod
    def from_dict(cls, data: dict, path: str = "") -> Tuning:
        return cls(data["key"], [Decision(**d) for d in data["decisions"]], data.get("model_check"),
                   data.get("seconds", 0.0), path, from_cache=True)
