"""The timing protocol every ortfuse measurement follows (docs/ARCHITECTURE.md §8): interleaved single
runs, repeats, per-repeat ratios. Standard library only: the tuner, ``ortfuse bench`` and the tools/
scripts import it, and it can be tested without ORT.

Timing a block of runs of one session and then a block of another does not give comparable numbers on
a shared machine: identical sessions come out far apart (`ortfuse bench` with its A/A control shows
how far on the machine at hand). What this module does instead:

- single runs interleaved across configurations, each pass in the opposite order of the previous one
  (``A B C`` then ``C B A``: for two configurations the classic ``A B B A``), so that every
  configuration runs as often early as late in a round and drifts of the machine cancel;
- with three or more configurations, successive rounds in the orders of a Williams design, so that
  every configuration runs in every slot and right after every other one equally often (a slow or
  thread-hungry neighbour, or running twice in a row at the ends of a round, biases a latency);
- warm-up passes first (not timed), in the same interleaved order;
- the whole comparison repeated ``repeats`` times, a median per configuration per repeat, and each
  ratio the median over repeats of ``p50(config) / p50(baseline)``;
- an A/A control (a second, independent copy of the baseline) measured the same way in the same run,
  whose ratio to the baseline is the noise floor of that very run.

``measure`` takes plain callables, so the protocol is the same whatever runs inside them.

With ``block`` > 1 each slot of a pass is a block instead of a single run: an idle ``settle_s``, one
untimed run, then ``block`` timed runs back to back. That measures sessions with ORT's default
thread spinning, as users run them: the settle lets the previous configuration's pool threads stop
spinning (they spin for tens of milliseconds after a run and would take a core from the next
session), the untimed run wakes this one's, and the timed runs find them as a serving loop does.
Single runs with spinning off instead pay a wake-up of the pool on every parallel op, which costs a
graph of many small ops more than one of few (``ortfuse bench --block 20 --spinning on`` beside the
default shows the difference on the machine at hand).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence


def _williams_row(n: int) -> list[int]:
    """0, 1, n-1, 2, n-2, ...: adding k (mod n) for k = 0..n-1 gives n paths in which every pair of
    distinct items is adjacent exactly twice and every item is first once and last once."""
    row, lo, hi = [0], 1, n - 1
    while len(row) < n:
        row.append(lo)
        lo += 1
        if len(row) < n:
            row.append(hi)
            hi -= 1
    return row


def round_orders(configs: Sequence[str], rotate: bool = True) -> list[list[str]]:
    """The forward orders of ``len(configs)`` consecutive rounds; the first is ``configs`` itself.

    Two things besides the slot bias out a configuration's latency on these machines: the slot it runs
    in (the ends of a round run twice in a row) and which configuration ran just before it (a slow
    or thread-hungry one leaves pool threads or a cold cache behind). A plain rotation moves the slots
    but keeps the neighbours: the control would always follow the same configurations and the
    baseline others. So the orders are the rows of a Williams design (a Latin square balanced for
    neighbours) relabelled so that row 0 is ``configs``: over these rounds every configuration runs in
    every slot once and next to every other configuration equally often (in both directions, since
    each round also runs reversed). With two configurations the plain ``A B B A`` already is balanced.
    """
    names = list(configs)
    n = len(names)
    if not rotate or n <= 2:
        return [names]
    row0 = _williams_row(n)
    slot_of = {v: i for i, v in enumerate(row0)}  # relabel so that round 0 is the given order
    return [[names[slot_of[(v + k) % n]] for v in row0] for k in range(n)]


def interleave(configs: Sequence[str], runs: int, rotate: bool = True) -> list[list[str]]:
    """The passes of one repeat: ``runs`` passes, alternately in order and in reverse order.

    Every configuration appears exactly once per pass, so ``runs`` passes give ``runs`` single runs of
    each configuration. Two consecutive passes form one round ``A B .. Z Z .. B A`` (``A B B A`` for two
    configurations); an odd ``runs`` ends with one forward pass. With ``rotate`` (the default) round
    ``k`` uses ``round_orders(configs)[k % n]`` instead of ``configs``: ``2 * n`` passes then balance
    every configuration's slots and neighbours. The first round is always ``A B .. Z Z .. B A``.
    """
    if runs < 0:
        raise ValueError(f"runs must be >= 0, got {runs}")
    names = list(configs)
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique, got {names}")
    orders = round_orders(names, rotate) if names else [names]
    passes = []
    for i in range(runs):
        order = orders[(i // 2) % len(orders)]
        passes.append(list(order) if i % 2 == 0 else order[::-1])
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
    time_run: Callable[[Callable[[], object]], float] | None = None,
    block: int = 1,
    settle_s: float = 0.0,
) -> dict[str, list[list[float]]]:
    """Time single calls of each runner with the interleaved protocol; return milliseconds.

    The result maps each configuration to ``repeats`` lists of ``runs`` latencies (ms), in the order
    they were measured. Each repeat starts with ``warmup`` untimed passes. ``gap_s`` is an idle
    sleep before every single run (timed or not), the same for all configurations. Python's garbage
    collector is paused while timing so that a collection never lands inside one configuration's run.
    ``rotate``: see ``interleave``.
    ``on_pass`` is called after every pass (progress bars). ``time_run(fn) -> ms`` times one timed
    run instead of ``clock`` around ``fn()`` (live tuning: a timing no served run overlapped).
    ``block``, ``settle_s``: each slot a block (module docstring; ``settle_s`` is used only with
    ``block`` > 1); a repeat's list then holds ``runs * block`` latencies, a block's runs in a row.
    """
    if repeats < 1 or runs < 1 or block < 1:
        raise ValueError(f"runs, repeats and block must be >= 1, got runs={runs}, repeats={repeats}, block={block}")
    names = list(runners)
    settle = settle_s if block > 1 else 0.0
    out: dict[str, list[list[float]]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for repeat in range(repeats):
            for order in interleave(names, warmup, rotate):
                for name in order:
                    for i in range(block + (block > 1)):
                        _settle(settle if i == 0 else 0.0, gap_s)
                        runners[name]()
                if on_pass:
                    on_pass()
            lat: dict[str, list[float]] = {name: [] for name in names}
            for order in interleave(names, runs, rotate):
                for name in order:
                    fn = runners[name]
                    if block > 1:
                        _settle(settle, gap_s)
                        fn()  # wakes the session's pool threads: not timed
                    for _run in range(block):
                        _settle(0.0, gap_s)
                        if time_run is not None:
                            lat[name].append(time_run(fn))
                            continue
                        t0 = clock()
                        fn()
                        t1 = clock()
                        lat[name].append((t1 - t0) / 1e6)
                if on_pass:
                    on_pass()
            for name in names:
                out[name].append(lat[name])
            if repeat < repeats - 1:
                gc.collect()  # between repeats, outside any timed run
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def _settle(settle_s: float, gap_s: float) -> None:
    if settle_s or gap_s:
        time.sleep(settle_s + gap_s)


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


def sign_threshold(n: int, alpha: float) -> int:
    """The fewest wins out of ``n`` paired passes whose chance under a fair coin is at most ``alpha``
    (a one-sided sign test); ``n + 1`` when even ``n`` of ``n`` is not that unlikely."""
    tail = 0.0
    for k in range(n, -1, -1):
        tail += math.comb(n, k) / 2.0**n
        if tail > alpha:
            return k + 1
    return 0
