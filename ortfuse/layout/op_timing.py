"""Timing two forms of one layout rewrite on this machine: a model with ORT's ops and one with
ortfuse's native op, run interleaved at the session's thread count (docs/ARCHITECTURE.md §9).

The native form is chosen when its p50 is below ``margin`` times ORT's in every one of ``REPEATS``
repeats (``ortfuse.foundation.protocol``'s interleaved single runs; in a live tuning, timings no served
run overlapped, ``ortfuse.foundation.yielding``). The repeats run one after the other and the first
that is not below the margin settles ORT's form: a losing probe is not timed on (in a live tuning,
each stretch the tuning process runs in is a gap after which a served run finds its caches evicted).
The choice is kept for the machine (``layout.choice_cache``), so it rests on evidence that the
machine's noise does not flip from one process to the next. A shape near the margin stays with
ORT. ``python tools/auto_bench.py --models resnet50_const --passes 3`` shows the plans fresh
processes make.

A repeat sized by a time budget (whole models: hundreds of passes) is timed in chunks of ``CHUNK``
passes and ends at the first look where a one-sided sign test settles the side of the margin: the
native form below ``margin`` times ORT's in at least ``protocol.sign_threshold(n, ALPHA / looks)`` of
the n passes so far and the p50 ratio below the margin (or the same the other way), ``looks`` being
the most the budget allows, so that a settled side from noise alone stays at most ``ALPHA`` per
repeat. A clear win or loss then takes a few dozen passes instead of the budget; a ratio near the
margin runs the whole budget as before (in a live tuning beside a spinning served session, whose
idle windows fit about one whole-model run each, the budget held most of the time to the plan:
``python tools/auto_bench.py --models ppocr_mobile_v2_cls --spinning on``, its tuning timeline).

A model whose weights outgrow the last-level cache (``weights_exceed_cache``) finds each conv's
filter in memory on every run, not in cache; its probes are timed ``cold``: before each timed run a
buffer half as large again as that cache is written, so both forms read their filters from memory.
A Winograd filter is 4x ORT's (36 taps for 9), so a probe timed warm favours it where the model
would not (``python tools/auto_bench.py --models resnet50_const`` records the plans)."""

from __future__ import annotations

import functools
import glob
import statistics
from collections.abc import Callable

import numpy as np

from ortfuse.foundation import protocol, yielding
from ortfuse.layout import choice_cache

RUNS = 6  # timed runs of each form per repeat, after one warm-up pass
MAX_RUNS = 400  # with a time budget
REPEATS = 3
CHUNK = 12  # passes between looks at a budgeted repeat's evidence (12 of 12 settle it at ALPHA / 12 looks)
ALPHA = 0.01  # a budgeted repeat's chance of a side settled early from noise alone, over all its looks


def native_faster(stock: bytes, native: bytes, native_ops: frozenset, feeds: dict[str, tuple], threads: int,
                  margin: float, stock_ops: frozenset = frozenset(), cold: bool = False,
                  budget_s: float | None = None) -> bool:
    """Whether ``native`` beats ``margin`` times ``stock`` in every repeat (module docstring), read from
    the machine's kept choices when this probe was timed before. Both models are loaded at
    ORT_DISABLE_ALL (they hold ORT's blocked ops already); ``feeds`` names each input's shape
    (float32, seeded normal data); ``stock_ops``: ortfuse's native ops the stock form holds
    (registered on its session too); ``cold``: timed with the caches flushed (module docstring);
    ``budget_s``: timed runs per repeat as many as fit this many seconds of the stock form's run
    (at least ``RUNS``, at most ``MAX_RUNS``; whole models whose runs take a millisecond need more
    than six to settle a 5% margin on a shared machine), else ``RUNS``.
    False when the native ops cannot be registered here."""
    digest = choice_cache.probe_digest(stock, native, sorted(native_ops), sorted(stock_ops), feeds, threads, margin,
                                       *(["cold"] if cold else []), *([f"budget {budget_s}"] if budget_s else []))
    kept = choice_cache.lookup(digest)
    if kept is not None:
        return kept
    ratios = _ratios(stock, native, native_ops, feeds, threads, stock_ops, cold, budget_s, margin)
    if ratios is None:
        return False
    chosen = max(ratios) < margin
    choice_cache.remember(digest, chosen, ratios)
    return chosen


def _ratios(stock: bytes, native: bytes, native_ops: frozenset, feeds: dict[str, tuple], threads: int,
            stock_ops: frozenset, cold: bool = False, budget_s: float | None = None,
            margin: float | None = None) -> list[float] | None:
    """Each repeat's p50 ratio, native / stock, up to ``REPEATS`` of them, ending with the first at or
    above ``margin`` (None: all repeats); None when the native ops cannot be registered here."""
    import onnxruntime as ort

    from ortfuse.foundation.session_options import measuring_options
    from ortfuse.kernel_choice.op_registration import with_custom_ops

    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so, why_not = with_custom_ops(measuring_options(level, threads=threads), native_ops, python_ops=False)
    if why_not:
        return None
    stock_so = measuring_options(level, threads=threads)
    if stock_ops:
        stock_so, why_not = with_custom_ops(stock_so, stock_ops, python_ops=False)
        if why_not:
            return None
    for options in (so, stock_so):  # a probe that fails is left to ORT by the caller: no error line printed
        options.log_severity_level = 4
    cpu = ["CPUExecutionProvider"]
    stock_s = ort.InferenceSession(stock, stock_so, providers=cpu)
    native_s = ort.InferenceSession(native, so, providers=cpu)
    rng = np.random.default_rng(1)
    feed = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in feeds.items()}
    runners = {"stock": lambda: yielding.run_session(stock_s, feed),
               "native": lambda: yielding.run_session(native_s, feed)}
    size = last_level_cache_bytes() if cold else 0
    runs = RUNS
    if budget_s:
        runners["stock"]()  # the first run allocates; the second is the estimate
        once = max(yielding.timed(runners["stock"]) / 1e3, 1e-6)
        runs = int(min(max(budget_s / once, RUNS), MAX_RUNS))
    time_run = _after_flush(size * 3 // 2) if size else yielding.timed
    ratios: list[float] = []
    while len(ratios) < REPEATS and (margin is None or not ratios or ratios[-1] < margin):
        if budget_s and margin is not None:
            ratios.append(_budgeted_ratio(runners, runs, time_run, margin))
            continue
        raw = protocol.measure(runners, runs=runs, repeats=1, warmup=1, time_run=time_run)
        ratios += protocol.ratio_per_repeat(raw["native"], raw["stock"])
    return ratios


def _budgeted_ratio(runners: dict[str, Callable[[], object]], runs: int,
                    time_run: Callable[[Callable[[], object]], float], margin: float) -> float:
    """One repeat's p50 ratio, native / stock, over at most ``runs`` passes timed in chunks of ``CHUNK``,
    ending at the first look that settles the side of ``margin`` (``settled_side``)."""
    native: list[float] = []
    stock: list[float] = []
    looks = -(-runs // CHUNK)
    while len(native) < runs:
        raw = protocol.measure(runners, runs=min(CHUNK, runs - len(native)), repeats=1, warmup=0 if native else 1,
                               time_run=time_run)
        native += raw["native"][0]
        stock += raw["stock"][0]
        if settled_side(native, stock, margin, ALPHA / looks) is not None:
            break
    return statistics.median(native) / statistics.median(stock)


def settled_side(native: list[float], stock: list[float], margin: float, alpha: float) -> bool | None:
    """True when the paired passes (``native[i]`` beside ``stock[i]``) show the native form below
    ``margin`` times the stock one (a one-sided sign test at ``alpha`` and the p50 ratio below the
    margin), False when they show it at or above, None while neither is shown."""
    n = len(native)
    below = sum(a < margin * b for a, b in zip(native, stock))
    needed = protocol.sign_threshold(n, alpha)
    ratio = statistics.median(native) / statistics.median(stock)
    if below >= needed and ratio < margin:
        return True
    if n - below >= needed and ratio >= margin:
        return False
    return None


def _after_flush(nbytes: int) -> Callable[[Callable[[], object]], float]:
    """A ``time_run`` that first writes every line of an ``nbytes`` buffer (untimed), then times the
    run as ``yielding.timed`` does."""
    buffer = np.zeros(max(nbytes // 8, 1))

    def timed(fn: Callable[[], object]) -> float:
        np.add(buffer, 1.0, out=buffer)
        return yielding.timed(fn)
    return timed


@functools.lru_cache(maxsize=1)
def last_level_cache_bytes() -> int:
    """The largest data or unified cache of CPU 0 (Linux sysfs), in bytes; 0 when unknown."""
    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{index}/type") as f:
                kind = f.read().strip()
            with open(f"{index}/size") as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if kind != "Instruction" and digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=0)


def weights_exceed_cache(graph) -> bool:
    """Whether ``graph``'s initializers (an ONNX GraphProto) take more bytes than the last-level cache."""
    from onnx import helper

    llc = last_level_cache_bytes()
    if not llc:
        return False
    total = 0
    for t in graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        total += n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total > llc
