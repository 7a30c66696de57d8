"""The timing protocol of ``ortfuse bench`` (DESIGN.md §6b), kept free of ORT so it can be tested alone.

On the shared 2-core machines, timing a block of runs of one session and then a block of another
gives ratios anywhere from 0.74 to 1.25 between *identical* sessions. What works:

- single runs interleaved across configurations, each pass in the opposite order of the previous one
  (``A B C`` then ``C B A``: for two configurations the classic ``A B B A``), so that every
  configuration runs as often early as late in a round and drifts of the machine cancel;
- warm-up passes first (not timed), in the same interleaved order;
- the whole comparison repeated ``repeats`` times, a median per configuration per repeat, and each
  ratio the median over repeats of ``p50(config) / p50(baseline)``;
- an A/A control (a second, independent copy of the baseline) measured the same way in the same run,
  whose ratio to the baseline is the noise floor of that very run.

``measure`` takes plain callables, so the protocol is the same whatever runs inside them.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence


def interleave(configs: Sequence[str], runs: int, rotate: bool = True) -> list[list[str]]:
    """The passes of one repeat: ``runs`` passes, alternately in order and in reverse order.

    Every configuration appears exactly once per pass, so ``runs`` passes give ``runs`` single runs of
    each configuration. Two consecutive passes form one round ``A B .. Z Z .. B A`` (``A B B A`` for two
    configurations); an odd ``runs`` ends with one forward pass.

    The configurations at the two ends of a round run twice in a row (``Z Z``, then ``A A`` into the
    next round), the others never do, and that position alone made an identical session measurably
    slower or faster (see ``ortfuse.bench``). With ``rotate`` (the default), round ``k`` starts at the
    ``k``-th configuration (``B C .. A A .. C B`` for k=1), so over ``len(configs)`` rounds every
    configuration holds every position equally often. The first round is always ``A B .. Z Z .. B A``;
    two configurations are both at the ends already and keep the plain ``A B B A A B B A ...``.
    """
    if runs < 0:
        raise ValueError(f"runs must be >= 0, got {runs}")
    names = list(configs)
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique, got {names}")
    passes = []
    for i in range(runs):
        k = (i // 2) % len(names) if (rotate and len(names) > 2) else 0
        order = names[k:] + names[:k]
        passes.append(order if i % 2 == 0 else order[::-1])
    return passes


def measure(
    runners: Mapping[str, Callable[[], object]],
    *,
    runs: int,
    repeats: int,
    warmup: int = 2,
    gap_s: float = 0.0,
    rotate: bool = True,
    on_pass: Callable[[], None] | None = None,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, list[list[float]]]:
    """Time single calls of each runner with the interleaved protocol; return milliseconds.

    The result maps each configuration to ``repeats`` lists of ``runs`` latencies (ms), in the order
    they were measured. Each repeat starts with ``warmup`` untimed passes. ``gap_s`` is an idle
    sleep before every single run (timed or not), the same for all configurations. Python's garbage
    collector is paused while timing so that a collection never lands inside one configuration's run.
    ``rotate``: see ``interleave``.
    ``on_pass`` is called after every pass (progress bars).
    """
    if repeats < 1 or runs < 1:
        raise ValueError(f"runs and repeats must be >= 1, got runs={runs}, repeats={repeats}")
    names = list(runners)
    out: dict[str, list[list[float]]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            for order in interleave(names, warmup, rotate):
                for name in order:
                    if gap_s:
                        time.sleep(gap_s)
                    runners[name]()
                if on_pass:
                    on_pass()
            lat: dict[str, list[float]] = {name: [] for name in names}
            for order in interleave(names, runs, rotate):
                for name in order:
                    if gap_s:
                        time.sleep(gap_s)
                    fn = runners[name]
                    t0 = clock()
                    fn()
                    t1 = clock()
                    lat[name].append((t1 - t0) / 1e6)
                if on_pass:
                    on_pass()
            for name in names:
                out[name].append(lat[name])
            gc.collect()  # between repeats, outside any timed run
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def p50_per_repeat(latencies: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.median(rep) for rep in latencies]


def ratio_per_repeat(config: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]]) -> list[float]:
    """``p50(config) / p50(baseline)`` for each repeat (both measured in the same interleaved run)."""
    if len(config) != len(baseline):
        raise ValueError("config and baseline must have the same number of repeats")
    return [c / b for c, b in zip(p50_per_repeat(config), p50_per_repeat(baseline))]


def ratio(config: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]]) -> float:
    """The reported ratio: median over repeats of the per-repeat p50 ratio."""
    return statistics.median(ratio_per_repeat(config, baseline))
