"""The served feeds a live tuning records (``ortfuse.runtime.live_tuning``): own copies of a run's
inputs, and the one it tunes on (docs/ARCHITECTURE.md §7).

``FeedCopies`` takes the copies a served run makes off that run's time where it can: the first
write to memory the process never wrote costs a page fault per page, which on a virtual machine can
cost far more than the copy itself (``python tools/auto_bench.py --models ppocrv4_det --spinning on``
shows the recorded runs beside stock ORT's). After each copy it writes arrays of the same shapes on
a thread of its own once the run has ended (``prepare``), so the next copy of equal shapes only
moves bytes.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np


def copy_feeds(feeds: Mapping) -> dict | None:
    """Own copies of a feed dict's arrays (OrtValues read back to numpy), or None when a value is
    not a plain array."""
    if not isinstance(feeds, Mapping):
        return None
    out = {}
    for name, value in feeds.items():
        if not isinstance(value, np.ndarray) and hasattr(value, "numpy"):
            try:
                value = value.numpy()
            except Exception:
                return None
        array = np.array(value, copy=True)
        if array.dtype == object:
            return None
        out[name] = array
    return out


class FeedCopies:
    """Own copies of served feeds, into arrays written ahead when ``prepare`` was asked for them.

    ``copy(feeds)`` is ``copy_feeds(feeds)``: into the prepared arrays when they match the feeds'
    names, shapes and dtypes (then used once), else into new ones. ``prepare(like, idle)`` starts a
    daemon thread that waits for ``idle()`` to return (the run in flight has ended), then makes and
    writes arrays shaped as ``like``'s for the next copy; at most one such thread runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[str, np.ndarray] | None = None
        self._thread: threading.Thread | None = None

    def copy(self, feeds: Mapping) -> dict | None:
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is None or not isinstance(feeds, Mapping) or set(feeds) != set(ready):
            return copy_feeds(feeds)
        for name, value in feeds.items():
            target = ready[name]
            if not isinstance(value, np.ndarray) or value.shape != target.shape or value.dtype != target.dtype:
                return copy_feeds(feeds)
        for name, value in feeds.items():
            np.copyto(ready[name], value)
        return ready

    def prepare(self, like: Mapping[str, np.ndarray], idle: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._make, args=(dict(like), idle), daemon=True,
                                            name="ortfuse-feed-pages")
        self._thread.start()

    def _make(self, like: dict[str, np.ndarray], idle: Callable[[], None]) -> None:
        idle()
        # zeros_like writes every element: the pages are faulted in now, in the gap, not in the next copy
        arrays = {name: np.zeros_like(array) for name, array in like.items()}
        with self._lock:
            self._ready = arrays


def signature(feed: dict) -> tuple:
    return tuple(sorted((k, v.shape, v.dtype.str) for k, v in feed.items()))


def representative(samples: list[dict]) -> dict:
    """The first feed of the most common shape among ``samples``."""
    counts = Counter(signature(s) for s in samples)
    best = max(counts.values())
    return next(s for s in samples if counts[signature(s)] == best)


def shapes_of(feed: dict) -> str:
    return ", ".join(f"{k}={list(v.shape)}" for k, v in feed.items())
