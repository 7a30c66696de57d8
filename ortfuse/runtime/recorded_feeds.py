"""The served feeds a live tuning records (``ortfuse.runtime.live_tuning``): own copies of a run's
inputs, and the one it tunes on (docs/ARCHITECTURE.md §7)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

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


def signature(feed: dict) -> tuple:
    return tuple(sorted((k, v.shape, v.dtype.str) for k, v in feed.items()))


def representative(samples: list[dict]) -> dict:
    """The first feed of the most common shape among ``samples``."""
    counts = Counter(signature(s) for s in samples)
    best = max(counts.values())
    return next(s for s in samples if counts[signature(s)] == best)


def shapes_of(feed: dict) -> str:
    return ", ".join(f"{k}={list(v.shape)}" for k, v in feed.items())
