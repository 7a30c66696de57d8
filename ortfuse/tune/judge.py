"""Whether a timed plan beats stock ORT beyond the noise of the same timing (docs/ARCHITECTURE.md §7).

The timing (``yielding.measure``: interleaved passes, every configuration once per pass) runs the
candidate plan (``fused``), stock ORT (``ort``) and a second stock session (``control``, the A/A
control). A tuning child runs at the lowest CPU priority on a shared machine: any other work takes a
core from it mid-run, so a few runs of any configuration come out far slower, by any amount. A
statistic of the whole repeat (its p50) moves with how many of those landed in it; the runs of one
pass, next to each other in time, share the machine's load. So the verdict rests on the passes.

Contract of ``judge(raw, limit)`` (``raw``: ms per configuration, per repeat, per pass, as
``yielding.measure`` returns):
- each pass gives a paired ratio, ``fused / mean(ort, control)`` of that pass, and an A/A ratio,
  ``control / ort``;
- ``passed`` when (1) the candidate beat that mean in at least ``protocol.sign_threshold(n, ALPHA)`` of the n
  passes (a one-sided sign test: a "faster" from chance alone has probability at most ``ALPHA``;
  a run slowed by other work moves one pass, whatever the amount), (2) the median paired ratio is
  at most ``limit`` and (3) that median is further below 1 than the median A/A ratio strays from 1
  (a gain within the bias of two stock sessions is no evidence);
- ``inconclusive`` when not passed although the median paired ratio is at most ``limit``: the
  magnitude is there, the evidence is not yet (the caller times another look and judges the looks
  pooled, ``pooled``, at most ``MAX_LOOKS``; ``ALPHA`` is per look, so that the chance of a win
  from noise over all looks stays at most ``MAX_LOOKS * ALPHA``); a median above ``limit`` is a
  verdict, not worth another look, once the looks hold ``MIN_PASSES`` passes or the candidate lost
  significantly many of them (the same sign test, the other way);
- the report figures are the protocol's (``ortfuse.foundation.protocol``): each configuration's p50 per
  repeat, stock ORT's as the mean of both stock sessions', each repeat's ratio, and the A/A
  control's largest deviation from 1 over the repeats.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ortfuse.foundation import protocol

ALPHA = 0.01  # one look's chance of a sign-test win from noise alone (at most MAX_LOOKS x ALPHA in all)
MAX_LOOKS = 4  # timings of one plan, pooled, before an inconclusive verdict is a loss
# fewer passes never settle a loss by their median alone: a look sized from one disturbed run holds few
# passes, whose median can call a loss for a plan that wins (python tools/auto_bench.py --models resnet50
# tunes beside served traffic, where such looks happen)
MIN_PASSES = 24

Raw = Mapping[str, Sequence[Sequence[float]]]


@dataclass
class Verdict:
    """One plan's timing against stock ORT with its A/A control (see the module docstring)."""

    fused_ms: float
    ort_ms: float
    ratios: list[float]  # each repeat's p50 ratio, fused / stock
    noise: float  # the A/A control's largest per-repeat deviation from 1
    paired_ratio: float  # median over passes of fused / mean(ort, control)
    aa_ratio: float  # median over passes of control / ort
    wins: int  # passes in which the candidate beat the stock mean
    passes: int
    needed: int  # protocol.sign_threshold(passes, ALPHA)
    passed: bool
    inconclusive: bool
    limit: float = field(default=0.0)

    @property
    def ratio(self) -> float:
        return self.fused_ms / self.ort_ms

    def as_check(self) -> dict:
        """The fields a ``Tuning.model_check`` records."""
        return {"fused_ms": self.fused_ms, "ort_ms": self.ort_ms, "ratio": self.ratio, "ratios": self.ratios,
                "aa_noise": self.noise, "paired_ratio": self.paired_ratio, "aa_ratio": self.aa_ratio,
                "wins": self.wins, "passes": self.passes, "needed": self.needed, "limit": self.limit,
                "passed": self.passed}

    def describe(self) -> str:
        """One clause for a report note."""
        return (f"{self.paired_ratio:.3f}x stock ORT pass by pass, faster in {self.wins} of {self.passes} passes "
                f"({self.needed} needed); two stock sessions {self.aa_ratio:.3f}x pass by pass, "
                f"up to {self.noise:.3f} apart by repeat")


def judge(raw: Raw, limit: float) -> Verdict:
    """The verdict on ``raw`` (keys ``fused``, ``ort``, ``control``), see the module docstring."""
    fused, ort, control = raw["fused"], raw["ort"], raw["control"]
    paired, aa = [], []
    for f_rep, o_rep, c_rep in zip(fused, ort, control):
        for f, o, c in zip(f_rep, o_rep, c_rep):
            paired.append(f / ((o + c) / 2))
            aa.append(c / o)
    p50 = {k: protocol.p50_per_repeat(v) for k, v in (("fused", fused), ("ort", ort), ("control", control))}
    stock = [(o + c) / 2 for o, c in zip(p50["ort"], p50["control"])]
    ratios = [f / s for f, s in zip(p50["fused"], stock)]
    noise = max(abs(c / o - 1) for c, o in zip(p50["control"], p50["ort"]))
    n = len(paired)
    wins = sum(p < 1 for p in paired)
    needed = protocol.sign_threshold(n, ALPHA)
    paired_ratio, aa_ratio = statistics.median(paired), statistics.median(aa)
    beyond_bias = paired_ratio <= 1 - abs(aa_ratio - 1)
    passed = wins >= needed and paired_ratio <= limit and beyond_bias
    lost = n - wins >= needed
    inconclusive = not passed and not lost and (paired_ratio <= limit or n < MIN_PASSES)
    return Verdict(statistics.median(p50["fused"]), statistics.median(stock), ratios, noise, paired_ratio, aa_ratio,
                   wins, n, needed, passed, inconclusive, limit)


def pooled(first: Raw, more: Raw) -> dict[str, list[list[float]]]:
    """Two timings of the same configurations as one: the repeats of both."""
    return {k: [list(rep) for rep in first[k]] + [list(rep) for rep in more[k]] for k in first}
