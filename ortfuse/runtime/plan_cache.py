"""The fusion plan cache: a session created again on the same model with the same request skips
parsing, matching, tuning and serializing, and hands ORT the fused model saved the first time.

Key: the model's identity (a path's resolved name, size and mtime; sha256 of bytes), the fusion
request (fusion, patterns, kernels), what the plan depends on in the session options (optimization
level, intra-op threads, ``ortfuse.tune_dims``, ``ortfuse.precision``), the environment
(``ORTFUSE_ISA``, ``ORTFUSE_NATIVE``, ``ORTFUSE_TUNE``, ``ORTFUSE_PRECISION``, ``ORTFUSE_LAYOUT``,
``ORTFUSE_WINOGRAD``, ``ORTFUSE_SE_BLOCK``, ``ORTFUSE_DEPTHWISE``, numba's target ``NUMBA_CPU_NAME`` /
``NUMBA_CPU_FEATURES``), this CPU, the
onnxruntime / extensions / numba versions, the kernel ranking measured on this machine
(``ortfuse.kernels.ranking``), and a digest of ortfuse's own source files (a changed rewriter never
serves an old plan). The CPU is identified by ``isa.fingerprint`` (no LLVM load), so
a cache hit costs no more memory than stock ORT.
An entry is ``<key>.json`` (the report and what the session needs) and, for an applied plan,
``<key>.onnx`` (the fused model), under ``<cache>/plans/`` (``ortfuse.runtime.cache_paths``). Entries
may name files they depend on (the auto policy's decisions) with their mtime; a changed or missing
dependency makes the entry stale. Writes are atomic (the JSON is written last); the folder is trimmed
to ``MAX_BYTES``, oldest entries first.
Only outcomes that follow from the key alone are stored: never a step-aside. A path that misses is
looked up again by its bytes (``content_key``, the key bytes input gets), unless it names external
data; entries found or stored so are linked under both keys (``link``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

from ortfuse.kernels import isa, ranking
from ortfuse.runtime.cache_paths import PLANS, cache_dir
from ortfuse.runtime.files import model_bytes, write_atomic
from ortfuse.runtime.session_options import DIMS_KEY, PRECISION_OPTION, config_entry
from ortfuse.runtime.source_digest import tree_digest
from ortfuse.runtime.versions import installed

FORMAT = 1
MAX_BYTES = 2 * 2**30
# spelled here, not imported from their readers (custom_ops.registration, the tuner, kernels.registry):
# a cache hit imports no kernel, rewrite or onnx code
# NUMBA_CPU_*: the instruction set numba compiles the native kernels for, named in the report's labels
_ENV_KEYS = (isa.ENV_VAR, "ORTFUSE_NATIVE", "ORTFUSE_TUNE", "ORTFUSE_PRECISION", "ORTFUSE_LAYOUT", "ORTFUSE_WINOGRAD",
             "ORTFUSE_SE_BLOCK", "ORTFUSE_DEPTHWISE", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")
_OPTION_ENTRIES = (DIMS_KEY, PRECISION_OPTION)
# an external initializer names its file in a StringStringEntryProto whose key (field 1) is "location"
EXTERNAL_DATA_MARK = b"\x0a\x08location"


def root() -> Path:
    return cache_dir(PLANS)


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """sha256 over ortfuse's Python sources and the installed runtime versions."""
    import ortfuse.custom_ops

    package = Path(__file__).resolve().parents[1]  # ortfuse/
    h = hashlib.sha256(tree_digest([package, Path(ortfuse.custom_ops.__file__).resolve().parent]).encode())
    for dist, version in installed(("onnxruntime", "onnxruntime-extensions", "numba", "onnx")).items():
        h.update(f"{dist}={version or 'none'}".encode())
    return h.hexdigest()


def _source_identity(source: str | bytes) -> str | None:
    if isinstance(source, bytes):
        return "bytes:" + hashlib.sha256(source).hexdigest()
    try:
        st = os.stat(source)
    except OSError:
        return None
    return f"path:{os.path.realpath(source)}:{st.st_size}:{st.st_mtime_ns}"


def _option_values(sess_options) -> list:
    if sess_options is None:
        return [None]
    values = [str(sess_options.graph_optimization_level), sess_options.intra_op_num_threads]
    return values + [config_entry(sess_options, entry) or None for entry in _OPTION_ENTRIES]


def key(source: str | bytes, sess_options, fusion, fusion_patterns, kernels) -> str | None:
    """The cache key of this request, or None when the source cannot be identified cheaply."""
    identity = _source_identity(source)
    return None if identity is None else _key(identity, sess_options, fusion, fusion_patterns, kernels)


def content_key(path: str, sess_options, fusion, fusion_patterns, kernels) -> str | None:
    """The key of this request by the file's bytes, as if they were passed as bytes: a copy of the
    model at another path (a deployment folder, a container's) finds the plan made for the original.
    None when the file cannot be read or names external data (its weights depend on where it lies)."""
    with model_bytes(path) as data:
        if data is None or data.find(EXTERNAL_DATA_MARK) >= 0:
            return None
        identity = "bytes:" + hashlib.sha256(data).hexdigest()
    return _key(identity, sess_options, fusion, fusion_patterns, kernels)


def _key(identity: str, sess_options, fusion, fusion_patterns, kernels) -> str:
    parts = [FORMAT, identity, repr(fusion), repr(fusion_patterns and list(fusion_patterns)), repr(kernels),
             _option_values(sess_options), [os.environ.get(k) for k in _ENV_KEYS],
             isa.fingerprint(), ranking.digest(), _code_digest()]
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
            if os.stat(dep["path"]).st_mtime_ns != dep["mtime_ns"]:
                return None
        if entry["applied"]:
            model = base.with_suffix(".onnx")
            if model.stat().st_size != entry["model_bytes"]:
                return None
            entry["model_path"] = str(model)
            os.utime(base.with_suffix(".json"))  # recently used: trimmed last
        return entry
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(cache_key: str | None, entry: dict, model_bytes: bytes | None, depends: list[str]) -> str | None:
    """Store an entry; return the path of the stored fused model (None if none was stored). Best
    effort: a read-only or full cache folder only costs the next session the planning time."""
    if cache_key is None:
        return None
    base = root() / cache_key
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        entry = {**entry, "format": FORMAT, "applied": model_bytes is not None,
                 "model_bytes": len(model_bytes) if model_bytes is not None else 0,
                 "depends": [{"path": p, "mtime_ns": os.stat(p).st_mtime_ns} for p in depends]}
        if model_bytes is not None:
            write_atomic(base.with_suffix(".onnx"), model_bytes)
        write_atomic(base.with_suffix(".json"), json.dumps(entry))
        _trim(base.parent, keep=base.with_suffix(".json"))
    except OSError:
        return None
    return str(base.with_suffix(".onnx")) if model_bytes is not None else None


def link(stored_key: str | None, other_key: str | None) -> None:
    """Make the entry stored under ``stored_key`` readable under ``other_key`` too (its fused model
    hard-linked, else copied). Best effort, as ``store``."""
    if stored_key is None or other_key is None or stored_key == other_key:
        return
    base, other = root() / stored_key, root() / other_key
    try:
        model = base.with_suffix(".onnx")
        if model.exists():
            tmp = other.with_name(f".{other.name}.{os.getpid()}.onnx.tmp")
            tmp.unlink(missing_ok=True)
            try:
                os.link(model, tmp)
            except OSError:
                shutil.copyfile(model, tmp)
            os.replace(tmp, other.with_suffix(".onnx"))
        write_atomic(other.with_suffix(".json"), base.with_suffix(".json").read_bytes())
    except OSError:
        return


def _trim(folder: Path, keep: Path) -> None:
    """Delete the least recently used entries until the folder holds at most MAX_BYTES (never ``keep``)."""
    def size(p: Path) -> int:
        model = p.with_suffix(".onnx")
        return p.stat().st_size + (model.stat().st_size if model.exists() else 0)

    entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    sizes = {p: size(p) for p in entries}
    total = sum(sizes.values())
    for p in entries:
        if total <= MAX_BYTES:
            break
        if p == keep:
            continue
        total -= sizes[p]
        p.unlink(missing_ok=True)
        p.with_suffix(".onnx").unlink(missing_ok=True)
