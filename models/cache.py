"""The on-disk model cache: ``<cache>/models/<name>.onnx`` plus a ``<name>.onnx.json`` record.

The record holds the file's sha256, size and the recipe digest it was built from; a file
counts as cached only when all three match. Files are written to a temporary name and
moved into place with ``os.replace``, and builds of one name are serialised with a file
lock (``foundation.files.locked``), so parallel processes never read a half-written model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from ortfuse.foundation.cache_paths import MODELS, cache_dir
from ortfuse.foundation.files import locked as locked_file
from ortfuse.foundation.files import write_atomic


def model_path(name: str) -> Path:
    return cache_dir(MODELS) / f"{name}.onnx"


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def is_cached(name: str, recipe: str) -> bool:
    """True when the model file exists and matches its record and ``recipe``."""
    path = model_path(name)
    try:
        record = json.loads(_record_path(path).read_text())
        return (
            record.get("recipe") == recipe
            and record.get("bytes") == path.stat().st_size
            and record.get("sha256") == _sha256(path)
        )
    except (OSError, ValueError):
        return False


def store(name: str, data: bytes, recipe: str) -> Path:
    """Write the model bytes, then their record; returns the model path."""
    path = model_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"name": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "recipe": recipe}
    write_atomic(path, data)
    write_atomic(_record_path(path), json.dumps(record, indent=1) + "\n")
    return path


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """Hold an exclusive lock on ``name``'s build (``foundation.files.locked``)."""
    path = model_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked_file(path):
        yield
