"""A digest of ortfuse's own Python sources, for cache keys (the plan cache, the ops library).

``tree_digest(bases)`` is sha256 over every ``.py`` file under each folder of ``bases`` (folders in
sorted order; per folder, each file's path relative to it, then its bytes). Reading every byte would
cost every fresh process that time again, so the result is memoised in ``<cache>/sources/``, named by
a digest of the files' relative paths, sizes and modification times (one ``stat`` each): an edited
file changes its mtime, so the name changes and the content is read again. The folder keeps the
newest ``KEEP`` memos. ``python tools/footprint_bench.py`` measures what a fused process pays at
start-up. ``code_digest()``: the digest of ortfuse's whole sources and the runtime versions, which
keys plans and tuning decisions.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from ortfuse.foundation.cache_paths import SOURCES, cache_dir
from ortfuse.foundation.files import keep_newest, write_atomic

KEEP = 32  # memos kept: one per state of the sources (an edited checkout makes a new one per edit)


def _python_files(base: Path) -> list[str]:
    """Relative paths of ``base``'s ``.py`` files, sorted; ``__pycache__`` folders skipped."""
    found: list[str] = []
    for root, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found.extend(os.path.relpath(os.path.join(root, f), base) for f in files if f.endswith(".py"))
    return sorted(found)


def _content_digest(trees: list[tuple[Path, list[str]]]) -> str:
    h = hashlib.sha256()
    for base, names in trees:
        for name in names:
            h.update(name.encode())
            h.update((base / name).read_bytes())
    return h.hexdigest()


def tree_digest(bases: list[Path]) -> str:
    """The content digest of the ``.py`` files under ``bases`` (see the module docstring)."""
    trees = [(base, _python_files(base)) for base in sorted(set(bases))]
    stamp = hashlib.sha256()
    for base, names in trees:
        stamp.update(str(base).encode())
        for name in names:
            st = os.stat(base / name)
            stamp.update(f"{name}:{st.st_size}:{st.st_mtime_ns};".encode())
    memo = cache_dir(SOURCES) / stamp.hexdigest()[:32]
    try:
        known = memo.read_text().strip()
        if len(known) == 64:
            return known
    except OSError:
        pass
    digest = _content_digest(trees)
    try:
        write_atomic(memo, digest)
        keep_newest(memo.parent, KEEP)
    except OSError:  # a read-only cache: the digest is still right, only not remembered
        pass
    return digest



@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over ortfuse's Python sources (``ortfuse/`` and the folder of ``ortfuse.custom_ops``,
    which an editable install keeps apart; found by its import spec, not imported) and the installed
    runtime versions: what a cached plan or tuning decision was made with."""
    import importlib.util

    from ortfuse.foundation.versions import installed

    folders = [Path(__file__).resolve().parents[1]]  # ortfuse/
    spec = importlib.util.find_spec("ortfuse.custom_ops")
    if spec is not None and spec.origin is not None:
        folders.append(Path(spec.origin).resolve().parent)
    h = hashlib.sha256(tree_digest(folders).encode())
    for dist, version in installed(("onnxruntime", "onnxruntime-extensions", "numba", "onnx")).items():
        h.update(f"{dist}={version or 'none'}".encode())
    return h.hexdigest()
