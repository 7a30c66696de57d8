"""The installed versions that key ortfuse's caches (plans, tuning decisions, the kernel ranking):
one reader of package metadata (leaf: standard library only)."""

from __future__ import annotations

import functools

# what a cached plan, decision or ranking depends on besides ortfuse's own sources
RUNTIME_DISTS = ("ortfuse", "onnxruntime", "numba", "onnxruntime-extensions")


@functools.lru_cache(maxsize=8)
def installed(dists: tuple[str, ...] = RUNTIME_DISTS) -> dict[str, str]:
    """Version of each distribution in ``dists`` ("" when it is not installed), read once per process."""
    from importlib import metadata

    out = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = ""
    return out
