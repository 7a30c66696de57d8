"""The kernel ranking measured on this machine (docs/ARCHITECTURE.md §5, §8): for a class of matches
(fused op, epilogue, dtype), the candidate kernels in the order they ran the whole model fastest,
``ORT`` among them (the matches left to ORT unfused). ``ortfuse.tune.rank_kernels`` measures it; the
selection of every ``fuse`` reads it, and the registry's static priorities order only what no
measurement covers.

One JSON file per CPU fingerprint in ``<cache>/tuning/`` (``ortfuse.foundation.cache_paths``):
``{"format", "key": {cpu, versions}, "classes": {"<op>|<variant>|<dtype>": {"order": [...], ...}}}``;
a file written for other versions is ignored. ``ORTFUSE_RANKING=off`` ignores the file (the static
table alone). Kernel ids: ``native``, ``reference``, ``lowered:<form>``, ``ort``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from ortfuse.foundation import isa
from ortfuse.foundation.cache_paths import TUNING, cache_dir
from ortfuse.foundation.files import locked, write_atomic
from ortfuse.foundation.versions import installed

FORMAT = 1
ENV = "ORTFUSE_RANKING"
ORT = "ort"  # the kernel id of "leave the match to ORT, unfused"
STATIC = "static"  # a preference: the registry's static order, ignoring the measured ranking (measuring it)


def class_of(op: str, variant: str, dtype: str) -> str:
    """The ranking's key of a class of matches."""
    return f"{op}|{variant}|{dtype}"


def enabled() -> bool:
    return os.environ.get(ENV, "on").strip().lower() not in ("0", "off", "false", "no")


def versions() -> dict[str, str]:
    """The versions a ranking holds for: ortfuse, onnxruntime, numba, onnxruntime-extensions."""
    return dict(installed())


@functools.lru_cache(maxsize=1)
def key() -> dict:
    return {"cpu": isa.fingerprint(), "versions": versions()}


def path() -> Path:
    digest = hashlib.sha256(json.dumps(key(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir(TUNING) / f"ranking-{digest}.json"


def _load() -> dict[str, dict]:
    """The classes of this machine's file, read once per process and cache folder."""
    return _read(str(path()))


@functools.lru_cache(maxsize=8)
def _read(file: str) -> dict[str, dict]:
    try:
        data = json.loads(Path(file).read_text())
    except (OSError, ValueError):
        return {}
    if data.get("format") != FORMAT or data.get("key") != key():
        return {}
    classes = data.get("classes")
    return classes if isinstance(classes, dict) else {}


def reset() -> None:
    """Forget the files read (after writing one; a process that did not write it sees a new
    ranking when it starts again)."""
    _read.cache_clear()


def order(op: str, variant: str, dtype: str) -> tuple[str, ...]:
    """The measured order of kernel ids for the class, best first; () when none was measured here."""
    if not enabled():
        return ()
    entry = _load().get(class_of(op, variant, dtype))
    return tuple(entry.get("order", ())) if isinstance(entry, dict) else ()


def digest() -> str:
    """A digest of the ranking in effect ("" when none): plans made under another ranking are stale."""
    if not enabled():
        return ""
    classes = _load()
    return hashlib.sha256(json.dumps(classes, sort_keys=True).encode()).hexdigest()[:16] if classes else ""


def record(classes: dict[str, dict]) -> Path:
    """Merge measured classes (class key -> {"order": [...], evidence...}) into this machine's file."""
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target):  # read, merge and write as one step: another process's classes are kept
        try:
            current = json.loads(target.read_text())
            if current.get("format") != FORMAT or current.get("key") != key():
                current = {}
        except (OSError, ValueError):
            current = {}
        merged = {**current.get("classes", {}), **classes}
        write_atomic(target, json.dumps({"format": FORMAT, "key": key(), "classes": merged}, indent=1,
                                        sort_keys=True))
    reset()
    return target
