"""The installed versions that key ortfuse's caches (plans, tuning decisions, the kernel ranking, the
ops library): one reader of package metadata (leaf: standard library only).

Read from the ``<name>-<version>.dist-info`` folder names on ``sys.path`` (one directory listing
each): a session reads them on every creation, and ``importlib.metadata`` costs tens of ms to import
and scan. A distribution found no such way is asked of ``importlib.metadata``."""

from __future__ import annotations

import functools
import os
import re
import sys

# what a cached plan, decision or ranking depends on besides ortfuse's own sources
RUNTIME_DISTS = ("ortfuse", "onnxruntime", "numba", "onnxruntime-extensions")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@functools.lru_cache(maxsize=1)
def _dist_info_versions() -> dict[str, str]:
    """{normalized name: version} of the first ``.dist-info`` of each name along ``sys.path``."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info") and "-" in name:
                dist, _, version = name[: -len(".dist-info")].partition("-")
                found.setdefault(_normal(dist), version)
    return found


@functools.lru_cache(maxsize=8)
def installed(dists: tuple[str, ...] = RUNTIME_DISTS) -> dict[str, str]:
    """Version of each distribution in ``dists`` ("" when it is not installed), read once per process."""
    cheap = _dist_info_versions()
    out = {}
    for dist in dists:
        version = cheap.get(_normal(dist))
        if version is None:
            from importlib import metadata

            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = ""
        out[dist] = version
    return out
