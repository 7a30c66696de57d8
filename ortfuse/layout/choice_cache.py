"""The layout step's timed choices, kept per machine (docs/ARCHITECTURE.md §9): whether a native
layout op's probe model beat ORT's form of it on this CPU, so that every process on the machine plans
the same layout and times a probe once.

One JSON file per key in ``<cache>/tuning/`` (``ortfuse.foundation.cache_paths``):
``{"format", "key": {cpu, versions, kernels}, "choices": {"<probe digest>": {"native", "ratios"}}}``.
The key is this CPU's fingerprint, the installed versions (ortfuse, onnxruntime, numba, extensions)
and a digest of the kernels' sources (``ortfuse.custom_ops``): a new kernel, ORT or CPU times its
probes again. A probe's digest covers both probe models, the ops registered for each, the input
shapes, the thread count and the margin. ``ORTFUSE_LAYOUT_CHOICES=off`` neither reads nor writes the
file. Writes merge with the file on disk under a lock (``foundation.files.locked``) and replace it
atomically, so two processes writing at once keep both's entries.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from ortfuse.foundation.cache_paths import TUNING, cache_dir
from ortfuse.foundation.files import locked, write_atomic

FORMAT = 1
ENV = "ORTFUSE_LAYOUT_CHOICES"


def enabled() -> bool:
    return os.environ.get(ENV, "on").strip().lower() not in ("0", "off", "false", "no")


@functools.lru_cache(maxsize=1)
def key() -> dict:
    """What the choices hold for: this CPU, the installed versions, the kernels' sources."""
    from ortfuse.custom_ops.aot.library import source_digest
    from ortfuse.foundation import isa
    from ortfuse.foundation.versions import installed

    return {"cpu": isa.fingerprint(), "versions": dict(installed()), "kernels": source_digest()}


def path() -> Path:
    digest = hashlib.sha256(json.dumps(key(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir(TUNING) / f"layout-{digest}.json"


def probe_digest(*parts: object) -> str:
    """The identity of one probe: sha256 over its parts (bytes as they are, the rest as sorted JSON)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=sorted).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _choices(file: Path) -> dict[str, dict]:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key():
        return {}
    choices = data.get("choices")
    return choices if isinstance(choices, dict) else {}


def lookup(digest: str) -> bool | None:
    """The kept choice for this probe (True: the native form), or None when none is kept."""
    if not enabled():
        return None
    found = _choices(path()).get(digest)
    native = found.get("native") if isinstance(found, dict) else None
    return native if isinstance(native, bool) else None


def remember(digest: str, native: bool, ratios: list[float]) -> None:
    """Keep a timed choice with its per-repeat ratios (native / ORT). Best effort: a read-only or
    full cache folder only costs the next process the timing."""
    if not enabled():
        return
    file = path()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with locked(file):  # read, merge and write as one step: another process's choices are kept
            choices = {**_choices(file), digest: {"native": native, "ratios": [round(r, 4) for r in ratios]}}
            write_atomic(file, json.dumps({"format": FORMAT, "key": key(), "choices": choices}))
    except OSError:
        pass
