"""The ``fusion="auto"`` decisions of one model on one machine: the verdict on each match, the
whole-model check, and the ``fuse(keep=...)`` rule they make (docs/ARCHITECTURE.md §8).

A decision records what was measured: the kernel (the report's label: path, ISA, dtype variant,
products; ``MatchRecord.kernel``) and a digest of the constants the match reads (weights, scalars).
It is used only for a match that would now get the same kernel (and, when ``keep_rule`` is given the
model, reads the same constants); otherwise the match is left to ORT with the reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ortfuse.fusion.catalogue import canonical_id
from ortfuse.fusion.report import FUSED, FusionReport, MatchRecord

if TYPE_CHECKING:  # a session created with nothing known imports this module without needing onnx
    import onnx

    from ortfuse.ir.graph import GraphIndex

MARGIN = 0.05  # a fusion must be at least 5% faster than ORT on its subgraph
MODEL_LIMIT = 0.99  # the whole auto model's median pass must be at least 1% faster (tune/judge.py), else not kept
FORMAT = 2  # of the JSON form (cache files, model metadata); 2: decisions name their kernel and constants
KERNEL_CHANGED = "auto: the decision was measured for kernel"  # the start of that reason (annotate reads it)
CONSTANTS_CHANGED = "auto: the decision was measured with other constants"
NOT_MEASURED_BUDGET = "auto: not measured: tuning budget of"  # the start of budget_reason()


@dataclass
class Decision:
    """The measured verdict on one match (identified by pattern id and original node names).

    ``kernel``: the report's label of the kernel measured ("" when none was); ``constants``: the
    digest of the constants the match reads (``constants_digest``)."""

    pattern_id: str
    nodes: list[str]
    keep: bool
    reason: str
    fused_ms: float | None = None
    ort_ms: float | None = None
    kernel: str = ""
    constants: str = ""

    def __post_init__(self) -> None:  # decisions written before a pattern was renamed name its former id
        self.pattern_id = canonical_id(self.pattern_id)

    @property
    def ratio(self) -> float | None:
        return self.fused_ms / self.ort_ms if self.fused_ms and self.ort_ms else None


@dataclass
class Tuning:
    """All decisions for one model on this machine, plus the whole-model check.

    ``failure``: one sentence when the measurement as a whole could not run (the sample run, the
    whole-model check): nothing is then kept. ``budget_spent``: the tuning budget ran out before
    every match was measured. Either makes the tuning not ``cacheable`` as final."""

    key: dict
    decisions: list[Decision] = field(default_factory=list)
    model_check: dict | None = None  # {"fused_ms", "ort_ms", "ratio", "ratios", "passed", "fused_ops"}
    seconds: float = 0.0
    path: str = ""
    from_cache: bool = False
    origin: str = ""  # "model metadata" when read from the model (ortfuse-annotate --tune)
    measured: bool = True  # False: nothing was measured nor cached (ORTFUSE_TUNE=off), so nothing is known
    failure: str | None = None
    budget_spent: bool = False
    ranked: str = ""  # what measuring the kernel ranking first found (tune.rank_kernels), for the report
    whole_plan: dict | None = None  # every match fused, timed first when it did not win (measure.whole_plan)
    # False: the plan is the fused model without the layout step (a candidate plan that won, tune.plan_choice)
    layout: bool = True
    choice: dict | None = None  # the candidate whole-model plans timed against each other (tune.plan_choice)
    # the ortfuse.tune_dims value its plans' layout was timed at when the options named none: the sizes of
    # the feeds it measured on, or those named to it (layout.served_sizes); the plan these decisions give
    # is laid out at them too
    served_dims: str = ""
    # how the sample shapes were chosen when the budget of sample inputs mattered (ir.feeds.sample_shapes;
    # set by the tuner on every call, not cached: the key's shapes are those it chose)
    sample_note: str = ""

    @property
    def cacheable(self) -> bool:
        """True when these decisions are final for their key: nothing failed as a whole and every
        match was measured (a failure may pass with other feeds, an unmeasured match may win)."""
        return self.failure is None and not self.budget_spent

    def find(self, pattern_id: str, nodes: Iterable[str]) -> Decision | None:
        wanted = (pattern_id, tuple(nodes))
        return next((d for d in self.decisions if (d.pattern_id, tuple(d.nodes)) == wanted), None)

    def keep_rule(self, model: onnx.ModelProto | None = None) -> Callable[[MatchRecord], str]:
        """The ``fuse(keep=...)`` rule: fuse what was measured to win with the kernel the match gets
        now (``MatchRecord.kernel``) and, when ``model`` (the model being fused) is given, with the
        constants it reads there (``constants_digester``); nothing unmeasured."""
        check = self.model_check
        failed = check is not None and not check["passed"]
        digester: list[Callable[[list[str]], str]] = []  # made at the first kept match: indexes the graph

        def constants(whole: onnx.ModelProto, nodes: list[str]) -> str:
            if not digester:
                digester.append(constants_digester(whole))
            return digester[0](nodes)

        def rule(record: MatchRecord) -> str:
            found = self.find(record.pattern_id, record.nodes)
            if found is None:
                if self.failure:
                    return f"auto: not measured: {self.failure}"
                return "auto: not measured on this machine (run `ortfuse tune MODEL`)"
            if not found.keep:
                return found.reason
            if found.kernel != record.kernel:
                return (f"{KERNEL_CHANGED} '{found.kernel or 'unrecorded'}', this process would use "
                        f"'{record.kernel}'; not kept (run `ortfuse tune MODEL --force` to measure it)")
            if model is not None and found.constants != constants(model, record.nodes):
                return f"{CONSTANTS_CHANGED}; not kept (run `ortfuse tune MODEL --force`)"
            if failed and check is not None:
                return (f"auto: the whole model with the kept fusions ran {check['ratio']:.3f}x stock "
                        f"ORT (limit {MODEL_LIMIT:.2f}), so none is kept")
            return ""

        return rule

    def annotate(self, report: FusionReport) -> None:
        """Write the measured times into the report's records (only where the record's kernel is the
        one measured) and say where the decisions came from, and what could not be measured."""
        for record in report.matches:
            found = self.find(record.pattern_id, record.nodes)
            if found is None:
                continue
            same = record.kernel == found.kernel if record.decision == FUSED else \
                not record.reason.startswith((KERNEL_CHANGED, CONSTANTS_CHANGED))
            if same:
                record.fused_ms, record.ort_ms = found.fused_ms, found.ort_ms
        origin = "cached" if self.from_cache else f"measured in {self.seconds:.1f} s"
        note = f"auto: decisions {origin} ({self.origin or self.path or 'not cached'})"
        if self.model_check:
            c = self.model_check
            note += (f"; whole model {c['fused_ms']:.3f} ms vs stock ORT {c['ort_ms']:.3f} ms "
                     f"(ratio {c['ratio']:.3f}, {'passed' if c['passed'] else 'failed'}"
                     + (f"; {c['paired_ratio']:.3f}x pass by pass, faster in {c['wins']} of {c['passes']} passes "
                        f"over {c.get('looks', 1)} look(s), two stock sessions {c['aa_ratio']:.3f}x"
                        if "paired_ratio" in c else "") + ")")
        report.notes.append(note)
        w = self.whole_plan
        if w:
            report.notes.append(f"auto: every match fused did not win as a whole ({w['failure']})" if "failure" in w
                                else f"auto: every match fused ran {w['ratio']:.3f}x stock ORT as a whole (repeats "
                                f"{min(w['ratios']):.3f}-{max(w['ratios']):.3f}; {_evidence(w)}); the matches were "
                                "measured by class and alone")
        if self.choice:
            report.notes.append(f"auto: candidate plans timed against each other: {self.choice['summary']}")
        if not self.layout:
            report.notes.append("auto: the plan runs without the layout step (it measured faster so)")
        if self.ranked:
            report.notes.append(f"auto: kernels ranked in the whole model first: {self.ranked}")
        if self.sample_note:
            report.notes.append(f"auto: {self.sample_note}")
        if self.failure:
            report.notes.append(f"auto: tuning failed, nothing kept: {self.failure}")
        if self.budget_spent:
            left = sum(d.reason.startswith(NOT_MEASURED_BUDGET) for d in self.decisions)
            report.notes.append(f"auto: the tuning budget ran out; {left} match(es) not measured, left to ORT")

    def to_dict(self) -> dict:
        return {"format": FORMAT, "key": self.key, "seconds": self.seconds, "model_check": self.model_check,
                "failure": self.failure, "budget_spent": self.budget_spent, "ranked": self.ranked,
                "whole_plan": self.whole_plan, "layout": self.layout, "choice": self.choice,
                "served_dims": self.served_dims, "decisions": [dataclasses.asdict(d) for d in self.decisions]}

    @classmethod
    def from_dict(cls, data: dict, path: str = "") -> Tuning:
        return cls(data["key"], [Decision(**d) for d in data["decisions"]], data.get("model_check"),
                   data.get("seconds", 0.0), path, from_cache=True, failure=data.get("failure"),
                   budget_spent=bool(data.get("budget_spent", False)), ranked=data.get("ranked", ""),
                   whole_plan=data.get("whole_plan"), layout=bool(data.get("layout", True)),
                   choice=data.get("choice"), served_dims=str(data.get("served_dims") or ""))


def budget_reason(budget_s: float) -> str:
    """The reason of a match the tuning budget left unmeasured."""
    return f"{NOT_MEASURED_BUDGET} {budget_s:g} s spent; left to ORT"


SMALL_CONSTANT = 16  # elements: a constant this small (scalar, exponent, bound, shape) is digested by value


def constants_digest(ix: GraphIndex, nodes: list[onnx.NodeProto]) -> str:
    """The digest of the constants (initializers, Constant outputs) ``nodes`` read from the rest of
    the graph, in graph order (whatever the order of ``nodes``): dtype and shape of each, and the
    values of those of at most ``SMALL_CONSTANT`` elements (an exponent or a bound changes the work;
    the values of weights do not, so convs of one shape share one measurement)."""
    produced = {o for n in nodes for o in n.output if o}
    seen: set[str] = set()
    h = hashlib.sha256()
    for n in sorted(nodes, key=lambda n: ix.position[id(n)]):
        for t in n.input:
            if not t or t in produced or t in seen:
                continue
            seen.add(t)
            value = ix.const(t)
            if value is not None:
                a = np.ascontiguousarray(value)
                h.update(f"c{a.shape}{a.dtype}".encode())
                if a.size <= SMALL_CONSTANT:
                    h.update(a.tobytes())
    return h.hexdigest()[:16]


def constants_digester(model: onnx.ModelProto) -> Callable[[list[str]], str]:
    """A function of node names giving ``constants_digest`` of those nodes of ``model`` ("" when one
    is not in it): what ``Decision.constants`` records. The graph is indexed once."""
    from ortfuse.ir.graph import GraphIndex

    ix = GraphIndex(model, infer_shapes=False)
    by_name = {ix.name_of(n): n for n in ix.graph.node}

    def digest(nodes: list[str]) -> str:
        if any(n not in by_name for n in nodes):
            return ""
        return constants_digest(ix, [by_name[n] for n in nodes])

    return digest


def _evidence(check: dict) -> str:
    """What a whole-plan timing showed and the rule it was judged by (``ortfuse.tune.judge``)."""
    noise = check.get("aa_noise", 0.0)
    if "paired_ratio" not in check:  # judged by the repeats' medians
        return (f"two stock sessions differed by up to {noise:.3f}; kept as a whole only at "
                f"{min(MODEL_LIMIT, 1 - noise):.2f} or better and below 1 in every repeat")
    return (f"{check['paired_ratio']:.3f}x pass by pass, faster in {check['wins']} of {check['passes']} passes, "
            f"{check['needed']} needed; two stock sessions {check['aa_ratio']:.3f}x pass by pass, up to {noise:.3f} "
            f"apart by repeat; kept as a whole only at {check.get('limit', MODEL_LIMIT):.2f} or better pass by pass, "
            f"beyond the stock sessions' bias, in significantly many passes, over {check.get('looks', 1)} look(s)")
