"""Which of several candidate whole-model plans ``fusion="auto"`` keeps, from one timing of all of
them beside stock ORT and its A/A control (docs/ARCHITECTURE.md §7).

The timing (``yielding.measure``: interleaved single runs, every configuration once per pass) holds
each candidate under its name, stock ORT as ``ort`` and a second stock session as ``control``.

Contract of ``choose(raw, candidates, limit)`` (``candidates``: names in order of preference):
- each candidate is judged against stock ORT alone (``judge.judge`` at ``limit``: its own paired
  ratios, sign test and A/A bias); only a candidate that passes may be kept, so the choice is never
  a plan slower than stock ORT, and None when none passes;
- among those that pass, the one with the lowest median paired ratio is the front runner; another
  passed candidate is ``settled`` against it when, pass by pass, the front runner beat it in
  significantly many passes (the same one-sided sign test, ``protocol.sign_threshold`` at
  ``judge.ALPHA``) or the two are within the A/A control's bias of each other (median of their
  per-pass ratio within ``|aa_ratio - 1|`` of 1, over at least ``judge.MIN_PASSES`` passes: a tie, where the candidate
  earlier in ``candidates`` is kept; over fewer passes the bias itself is not known yet);
- ``inconclusive``: a candidate that is not settled against the front runner, or one whose own
  verdict is inconclusive with a median below the front runner's: the caller times another look
  and chooses on the looks pooled (``judge.pooled``), at most ``judge.MAX_LOOKS``; then the front
  runner is kept (every passed candidate beat stock ORT).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ortfuse.foundation import protocol
from ortfuse.tune import judge

Raw = Mapping[str, Sequence[Sequence[float]]]


@dataclass
class Choice:
    """The outcome of ``choose`` (see the module docstring)."""

    best: str | None
    verdicts: dict[str, judge.Verdict]
    versus: dict[str, float] = field(default_factory=dict)  # median per-pass ratio of each passed one / best
    inconclusive: bool = False
    raw: Raw = field(default_factory=dict)  # the timing chosen on (per configuration, repeat and pass, ms)

    def summary(self) -> str:
        parts = []
        for name, v in self.verdicts.items():
            mark = "kept" if name == self.best else "passed" if v.passed else "not faster than stock ORT"
            vs = f", {self.versus[name]:.3f}x the kept plan" if name in self.versus and name != self.best else ""
            parts.append(f"{name} {v.paired_ratio:.3f}x stock ORT pass by pass ({v.wins} of {v.passes} passes "
                         f"faster; {mark}{vs})")
        aa = next(iter(self.verdicts.values())).aa_ratio if self.verdicts else 1.0
        return "; ".join(parts) + f"; two stock sessions {aa:.3f}x"

    def as_dict(self) -> dict:
        return {"best": self.best, "inconclusive": self.inconclusive, "versus": self.versus,
                "verdicts": {k: v.as_check() for k, v in self.verdicts.items()}, "summary": self.summary()}


def per_pass(raw: Raw, a: str, b: str) -> list[float]:
    """``a / b`` of each pass (both timed in the same pass)."""
    return [x / y for rep_a, rep_b in zip(raw[a], raw[b]) for x, y in zip(rep_a, rep_b)]


def choose(raw: Raw, candidates: Sequence[str], limit: float) -> Choice:
    """See the module docstring."""
    verdicts = {c: judge.judge({"fused": raw[c], "ort": raw["ort"], "control": raw["control"]}, limit)
                for c in candidates}
    passed = [c for c in candidates if verdicts[c].passed]
    if not passed:
        pending = any(v.inconclusive for v in verdicts.values())
        return Choice(None, verdicts, inconclusive=pending, raw=raw)
    bias = abs(statistics.median(per_pass(raw, "control", "ort")) - 1)
    front = min(passed, key=lambda c: (verdicts[c].paired_ratio, candidates.index(c)))
    versus = {c: statistics.median(per_pass(raw, c, front)) for c in passed}
    best, inconclusive = front, False
    for c in passed:
        if c == front:
            continue
        ratios = per_pass(raw, front, c)
        beaten = sum(r < 1 for r in ratios) >= protocol.sign_threshold(len(ratios), judge.ALPHA)
        # within the stock sessions' bias, on enough passes for that bias to mean something (fewer: more passes)
        tie = abs(versus[c] - 1) <= bias and len(ratios) >= judge.MIN_PASSES
        if tie and candidates.index(c) < candidates.index(best) and (best == front or abs(versus[best] - 1) <= bias):
            best = c  # within the stock sessions' bias of the front runner: the preferred one
        if not beaten and not tie:
            inconclusive = True
    for c in candidates:
        v = verdicts[c]
        if not v.passed and v.inconclusive and v.paired_ratio < verdicts[front].paired_ratio:
            inconclusive = True
    return Choice(best, verdicts, versus, inconclusive, raw)
