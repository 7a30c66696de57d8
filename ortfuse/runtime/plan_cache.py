"""The fusion plan cache: a session created again on the same model with the same request skips
parsing, matching, tuning and serializing, and hands ORT the fused model saved the first time.

Key: the model's content (sha256 of its bytes, and of every external-data file it names, by the
location it names: ``identity``), the fusion request (fusion, patterns, kernels), what the plan
depends on in the session options (optimization level, intra-op threads, ``ortfuse.tune_dims``,
``ortfuse.precision``), the environment (``ORTFUSE_ISA``, ``ORTFUSE_NATIVE``, ``ORTFUSE_TUNE``,
``ORTFUSE_PRECISION``, ``ORTFUSE_LAYOUT``, ``ORTFUSE_WINOGRAD``, ``ORTFUSE_SE_BLOCK``, ``ORTFUSE_CHANNEL_PADDING``,
``ORTFUSE_DEPTHWISE``, ``ORTFUSE_POINTWISE``, numba's target ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``), this CPU, the
onnxruntime / extensions / numba versions, the kernel ranking measured on this machine
(``ortfuse.kernel_choice.ranking``), and a digest of ortfuse's own source files (a changed rewriter never
serves an old plan). The CPU is identified by ``isa.fingerprint`` (no LLVM load), so
a cache hit costs no more memory than stock ORT. A plan is thus used only for the exact bytes it was
made from; the same bytes at another path (a deployment folder, a container) find it. A file's
digest is computed once per file state (``files.content_digest``), so a warm creation reads no
model bytes; a plan is stored only when no file it was made from changed while it was made.
An entry is ``<key>.json`` (the report and what the session needs) and, for an applied plan,
``<key>.onnx`` (the fused model), under ``<cache>/plans/`` (``ortfuse.foundation.cache_paths``). Entries
may name files they depend on (the auto policy's decisions) with the sha256 of their bytes; a changed
or missing dependency makes the entry stale. Writes are atomic (the JSON is written last); the folder
is trimmed to ``MAX_BYTES``, least recently used first, never a plan a live process holds (a
process holds a shared lock on the last ``MAX_HELD`` plan files it handed ORT, ``load``).
Only outcomes that follow from the key alone are stored: never a step-aside.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: plans are trimmed without a check of their use
    fcntl = None  # type: ignore[assignment]

from ortfuse.foundation import isa, source_digest
from ortfuse.foundation.cache_paths import PLANS, cache_dir
from ortfuse.foundation.files import content_digest, file_state, write_atomic
from ortfuse.foundation.session_options import DIMS_KEY, PRECISION_OPTION, config_entry
from ortfuse.ir.metadata import external_locations
from ortfuse.kernel_choice import ranking

FORMAT = 2  # 2: keyed by content, dependencies by digest
MAX_BYTES = 2 * 2**30
PROTOBUF_LIMIT = 2**31 - 1  # a model with more external data than this is left to ORT (planning)
MAX_HELD = 64  # plan files one process holds locked against trimming
# spelled here, not imported from their readers (custom_ops.registration, the tuner, kernel_choice.registry):
# a cache hit imports no kernel, rewrite or onnx code
# NUMBA_CPU_*: the instruction set numba compiles the native kernels for, named in the report's labels
_ENV_KEYS = (isa.ENV_VAR, "ORTFUSE_NATIVE", "ORTFUSE_TUNE", "ORTFUSE_PRECISION", "ORTFUSE_LAYOUT", "ORTFUSE_WINOGRAD",
             "ORTFUSE_SE_BLOCK", "ORTFUSE_DEPTHWISE", "ORTFUSE_POINTWISE", "ORTFUSE_CHANNEL_PADDING", "NUMBA_CPU_NAME",
             "NUMBA_CPU_FEATURES")
_OPTION_ENTRIES = (DIMS_KEY, PRECISION_OPTION)
_made_from: dict[str, list] = {}  # key -> the file states its identity was read from (store checks them)
_held: dict[str, int] = {}  # plan file -> a descriptor holding a shared lock on it for this process's life


def root() -> Path:
    return cache_dir(PLANS)


def identity(source: str | bytes) -> tuple[str, list] | None:
    """The model's identity in the key and the file states it was read from, or None when it cannot
    be had (unreadable, a file changing meanwhile, external-data entries in an unknown form): for
    bytes their sha256; for a path the sha256 of its bytes, and for each external-data file it
    names, that location and the sha256 of the file there (``missing`` when absent). A model
    without external data has the identity of its bytes, wherever it lies."""
    if isinstance(source, bytes):
        return "bytes:" + hashlib.sha256(source).hexdigest(), []
    model = content_digest(source, external_locations)
    if model is None or model.state is None or model.scanned is None:
        return None
    parts = ["bytes:" + model.sha256]
    states: list[tuple[str, tuple[int, ...] | None]] = [(source, model.state)]
    folder = os.path.dirname(os.path.abspath(source))
    paths = [os.path.join(folder, location) for location in model.scanned]
    if sum(state[2] for state in map(file_state, paths) if state is not None) > PROTOBUF_LIMIT:
        return None  # no plan: such a model goes to ORT unchanged (planning), its data is not hashed
    for location, path in zip(model.scanned, paths):
        found = content_digest(path)
        if found is not None and found.state is None:
            return None
        parts.append(f"{location}={found.sha256 if found is not None else 'missing'}")
        states.append((path, found.state if found is not None else None))
    return "|".join(parts), states


def _option_values(sess_options) -> list:
    if sess_options is None:
        return [None]
    values = [str(sess_options.graph_optimization_level), sess_options.intra_op_num_threads]
    return values + [config_entry(sess_options, entry) or None for entry in _OPTION_ENTRIES]


def key(source: str | bytes, sess_options, fusion, fusion_patterns, kernels) -> str | None:
    """The cache key of this request, or None when the model's identity cannot be had."""
    found = identity(source)
    if found is None:
        return None
    cache_key = _key(found[0], sess_options, fusion, fusion_patterns, kernels)
    _made_from[cache_key] = found[1]
    return cache_key


def _key(identity: str, sess_options, fusion, fusion_patterns, kernels) -> str:
    parts = [FORMAT, identity, repr(fusion), repr(fusion_patterns and list(fusion_patterns)), repr(kernels),
             _option_values(sess_options), [os.environ.get(k) for k in _ENV_KEYS],
             isa.fingerprint(), ranking.digest(), source_digest.code_digest()]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def load(cache_key: str | None) -> dict | None:
    """The stored entry (with ``model_path`` set for an applied plan), or None if absent or stale."""
    if cache_key is None:
        return None
    base = root() / cache_key
    try:
        entry = json.loads(base.with_suffix(".json").read_text())
        if entry.get("format") != FORMAT:
            return None
        entry["path"] = str(base.with_suffix(".json"))
        for dep in entry.get("depends", []):
            found = content_digest(dep["path"])
            if found is None or found.sha256 != dep["sha256"]:
                return None
        if entry["applied"]:
            model = base.with_suffix(".onnx")
            if not _hold(model) or model.stat().st_size != entry["model_bytes"]:
                return None
            entry["model_path"] = str(model)
            os.utime(base.with_suffix(".json"))  # recently used: trimmed last
        return entry
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(cache_key: str | None, entry: dict, model_bytes: bytes | None, depends: list[str]) -> str | None:
    """Store an entry; return the path of the stored fused model (None if none was stored). Best
    effort: a read-only or full cache folder only costs the next session the planning time."""
    if cache_key is None or any(file_state(path) != state for path, state in _made_from.get(cache_key, [])):
        return None  # a file the plan was made from changed meanwhile: the plan may be of other bytes
    base = root() / cache_key
    try:
        digests = [content_digest(p) for p in depends]
        if any(d is None or d.state is None for d in digests):
            return None
        entry = {**entry, "format": FORMAT, "applied": model_bytes is not None,
                 "model_bytes": len(model_bytes) if model_bytes is not None else 0,
                 "depends": [{"path": p, "sha256": d.sha256} for p, d in zip(depends, digests) if d is not None]}
        if model_bytes is not None:
            write_atomic(base.with_suffix(".onnx"), model_bytes)
            _hold(base.with_suffix(".onnx"))
        write_atomic(base.with_suffix(".json"), json.dumps(entry))
        _trim(base.parent, keep=base.with_suffix(".json"))
    except OSError:
        return None
    return str(base.with_suffix(".onnx")) if model_bytes is not None else None


def _hold(model: Path) -> bool:
    """Hold a shared lock on the plan file ``model`` for the rest of this process (ORT may read it
    again: ``set_providers``), so that no trim removes it; False when it is gone (trimmed meanwhile)."""
    if fcntl is None or str(model) in _held:
        return model.exists()
    try:
        fd = os.open(model, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_ino != os.stat(model).st_ino:  # trimmed or replaced before the lock
            raise OSError("replaced")
    except OSError:
        os.close(fd)
        return False
    if len(_held) >= MAX_HELD:  # the oldest plan held gives way (a process serving more plans is rare)
        os.close(_held.pop(next(iter(_held))))
    _held[str(model)] = fd
    return True


def _in_use(model: Path) -> contextlib.AbstractContextManager | None:
    """An exclusive lock on the plan file while it is removed, or None when a process holds it."""
    if fcntl is None or not model.exists():
        return contextlib.nullcontext()
    try:
        fd = os.open(model, os.O_RDONLY)
    except OSError:
        return contextlib.nullcontext()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return contextlib.closing(os.fdopen(fd, "rb"))


def _trim(folder: Path, keep: Path) -> None:
    """Delete the least recently used entries until the folder holds at most MAX_BYTES (never ``keep``
    nor a plan file a live process holds)."""
    def size(p: Path) -> int:
        model = p.with_suffix(".onnx")
        return p.stat().st_size + (model.stat().st_size if model.exists() else 0)

    entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    sizes = {p: size(p) for p in entries}
    total = sum(sizes.values())
    for p in entries:
        if total <= MAX_BYTES:
            break
        if p == keep or str(p.with_suffix(".onnx")) in _held:
            continue
        unused = _in_use(p.with_suffix(".onnx"))
        if unused is None:  # a live process serves this plan
            continue
        with unused:
            total -= sizes[p]
            p.unlink(missing_ok=True)
            p.with_suffix(".onnx").unlink(missing_ok=True)
