"""Timing two forms of one layout rewrite on this machine: a model with ORT's ops and one with
ortfuse's native op, run interleaved at the session's thread count (docs/ARCHITECTURE.md §9)."""

from __future__ import annotations

import time

import numpy as np

RUNS = 9  # timed runs of each form, after one warm-up


def native_faster(stock: bytes, native: bytes, native_ops: frozenset, feeds: dict[str, tuple], threads: int,
                  margin: float, stock_ops: frozenset = frozenset()) -> bool:
    """Whether ``native``'s median run time is below ``margin`` times ``stock``'s. Both models are
    loaded at ORT_DISABLE_ALL (they hold ORT's blocked ops already); ``feeds`` names each input's
    shape (float32, seeded normal data); ``stock_ops``: ortfuse's native ops the stock form holds
    (registered on its session too). False when the native ops cannot be registered here."""
    import onnxruntime as ort

    from ortfuse.runtime.op_registration import with_custom_ops
    from ortfuse.runtime.session_options import measuring_options

    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so, why_not = with_custom_ops(measuring_options(level, threads=threads), native_ops, python_ops=False)
    if why_not:
        return False
    stock_so = measuring_options(level, threads=threads)
    if stock_ops:
        stock_so, why_not = with_custom_ops(stock_so, stock_ops, python_ops=False)
        if why_not:
            return False
    cpu = ["CPUExecutionProvider"]
    sessions = [ort.InferenceSession(stock, stock_so, providers=cpu), ort.InferenceSession(native, so, providers=cpu)]
    rng = np.random.default_rng(1)
    feed = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in feeds.items()}
    times: list[list[float]] = [[], []]
    for s in sessions:
        s.run(None, feed)
    for _ in range(RUNS):
        for k, s in enumerate(sessions):
            t0 = time.perf_counter()
            s.run(None, feed)
            times[k].append(time.perf_counter() - t0)
    return float(np.median(times[1])) < margin * float(np.median(times[0]))
