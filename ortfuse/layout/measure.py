"""Timing two forms of one layout rewrite on this machine: a model with ORT's ops and one with
ortfuse's native op, run interleaved at the session's thread count (docs/ARCHITECTURE.md §9).

The native form is chosen when its p50 is below ``margin`` times ORT's in every one of ``REPEATS``
repeats (``ortfuse.bench.protocol``'s interleaved single runs; in a live tuning, timings no served
run overlapped, ``ortfuse.tune.yielding``): the choice is kept for the machine
(``layout.choice_cache``), so it rests on evidence that the machine's noise does not flip from one
process to the next. A shape near the margin stays with ORT. ``python tools/auto_bench.py --models
resnet50_const --passes 3`` shows the plans fresh processes make."""

from __future__ import annotations

import numpy as np

from ortfuse.bench import protocol
from ortfuse.layout import choice_cache
from ortfuse.tune import yielding

RUNS = 6  # timed runs of each form per repeat, after one warm-up pass
REPEATS = 3


def native_faster(stock: bytes, native: bytes, native_ops: frozenset, feeds: dict[str, tuple], threads: int,
                  margin: float, stock_ops: frozenset = frozenset()) -> bool:
    """Whether ``native`` beats ``margin`` times ``stock`` in every repeat (module docstring), read from
    the machine's kept choices when this probe was timed before. Both models are loaded at
    ORT_DISABLE_ALL (they hold ORT's blocked ops already); ``feeds`` names each input's shape
    (float32, seeded normal data); ``stock_ops``: ortfuse's native ops the stock form holds
    (registered on its session too). False when the native ops cannot be registered here."""
    digest = choice_cache.probe_digest(stock, native, sorted(native_ops), sorted(stock_ops), feeds, threads, margin)
    kept = choice_cache.lookup(digest)
    if kept is not None:
        return kept
    ratios = _ratios(stock, native, native_ops, feeds, threads, stock_ops)
    if ratios is None:
        return False
    chosen = max(ratios) < margin
    choice_cache.remember(digest, chosen, ratios)
    return chosen


def _ratios(stock: bytes, native: bytes, native_ops: frozenset, feeds: dict[str, tuple], threads: int,
            stock_ops: frozenset) -> list[float] | None:
    """Each repeat's p50 ratio, native / stock; None when the native ops cannot be registered here."""
    import onnxruntime as ort

    from ortfuse.runtime.op_registration import with_custom_ops
    from ortfuse.runtime.session_options import measuring_options

    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so, why_not = with_custom_ops(measuring_options(level, threads=threads), native_ops, python_ops=False)
    if why_not:
        return None
    stock_so = measuring_options(level, threads=threads)
    if stock_ops:
        stock_so, why_not = with_custom_ops(stock_so, stock_ops, python_ops=False)
        if why_not:
            return None
    cpu = ["CPUExecutionProvider"]
    stock_s = ort.InferenceSession(stock, stock_so, providers=cpu)
    native_s = ort.InferenceSession(native, so, providers=cpu)
    rng = np.random.default_rng(1)
    feed = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in feeds.items()}
    raw = yielding.measure({"stock": lambda: yielding.run_session(stock_s, feed),
                            "native": lambda: yielding.run_session(native_s, feed)}, runs=RUNS, repeats=REPEATS)
    return protocol.ratio_per_repeat(raw["native"], raw["stock"])
