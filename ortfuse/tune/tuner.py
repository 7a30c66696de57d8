"""Profile-guided ``fusion="auto"``: keep a fusion only where it was measured to beat ORT on this
machine (how: ``ortfuse.tune.measure``; the rule: ``ortfuse.tune.decisions``).

Decisions are cached as JSON in ``<cache>/tuning/`` (``ortfuse.runtime.cache_paths``), keyed by the
graph digest, ISA, the ortfuse, onnxruntime and numba versions, the optimization level and thread
count, the patterns and the input shapes measured. ``ortfuse tune MODEL`` fills the cache ahead of
time. ``ORTFUSE_TUNE=off`` makes ``auto`` use cached decisions only (without one, it keeps no fusion).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

import onnx

from ortfuse.fusion.catalogue import validate_patterns
from ortfuse.ir import feeds, metadata
from ortfuse.ir.model_args import parse_dims
from ortfuse.kernels import isa, registry
from ortfuse.runtime.cache_paths import TUNING, cache_dir
from ortfuse.runtime.files import write_atomic
from ortfuse.runtime.session_options import DIMS_KEY, PRECISION_OPTION, config_entry
from ortfuse.tune import measure as measuring
from ortfuse.tune.decisions import FORMAT, MARGIN, MODEL_LIMIT, Tuning

ENV = "ORTFUSE_TUNE"


def tuning_enabled() -> bool:
    """False when ``ORTFUSE_TUNE`` is off/0/false: ``auto`` then only uses cached decisions."""
    return os.environ.get(ENV, "on").strip().lower() not in ("0", "off", "false", "no")


# --------------------------------------------------------------------------- public entry points


def tune(model: onnx.ModelProto, patterns: Iterable[str] | None = None, sess_options=None, *,
         batch: int = 1, dims: dict[str, int] | None = None, force: bool = False, measure: bool | None = None,
         progress: bool = False) -> Tuning:
    """Decisions for ``model`` (external data loaded): from the cache, else measured now and cached.

    ``measure=False`` (default: ``tuning_enabled()``) never measures: without a cached entry the
    result holds no decision, so ``auto`` keeps nothing. ``force`` measures even when cached."""
    ids = validate_patterns(patterns)
    level, threads = _level_and_threads(sess_options)
    asked = dims_from_options(sess_options)
    dims = {**asked, **(dims or {})}
    batch = int(dims.get("batch", batch))
    declared = feeds.declared_inputs(model)
    shapes = {name: feeds.concrete_shape(decl, batch, dims) for name, _, decl in declared}
    precision = registry.resolve_precision(config_entry(sess_options, PRECISION_OPTION) or None)
    key = _cache_key(model, ids, level, threads, shapes, precision)
    path = _cache_path(key)
    if not force:
        embedded = _from_metadata(model, key)
        if embedded is not None:
            return embedded
        cached = _read(path)
        if cached is not None:
            return cached
    if not (tuning_enabled() if measure is None else measure):
        return Tuning(key, measured=False)
    start = time.perf_counter()
    sample = feeds.random_feeds(declared, batch=batch, dims=dims, seed=0)  # only now: the key needs shapes only
    tuning = measuring.measure(model, ids, level, threads, sample, key, progress, precision)
    tuning.seconds = round(time.perf_counter() - start, 2)
    tuning.path = str(path)
    _write(path, tuning)
    return tuning


def embed(model: onnx.ModelProto, tuning: Tuning) -> None:
    """Write the decisions into the model's metadata (``ortfuse-annotate --tune``): a session on
    this machine class (same key: ISA, versions, options, shapes) then needs no cache and no measuring."""
    metadata.write_props(model, {metadata.AUTO_DECISIONS: json.dumps(tuning.to_dict(), separators=(",", ":"))})


def _from_metadata(model: onnx.ModelProto, key: dict) -> Tuning | None:
    text = metadata.read_props(model).get(metadata.AUTO_DECISIONS)
    if not text:
        return None
    try:
        data = json.loads(text)
        if data.get("format") != FORMAT or data.get("key") != key:
            return None  # written on another machine, version or shape: not valid here
        tuning = Tuning.from_dict(data, path="")
    except (ValueError, KeyError, TypeError):
        return None
    tuning.origin = "model metadata"
    return tuning


def dims_from_options(sess_options) -> dict[str, int]:
    """The ``ortfuse.tune_dims`` config entry of ``sess_options`` ("name=value,..."; ``batch`` is the
    first dim of every input unless an input names a dim "batch")."""
    return parse_dims(config_entry(sess_options, DIMS_KEY))


def table(tuning: Tuning) -> str:
    """One line per decision, then the whole-model check."""
    rows = [("pattern", "nodes", "fused ms", "ORT ms", "ratio", "decision")]
    for d in tuning.decisions:
        rows.append((d.pattern_id, _short(d.nodes), _ms(d.fused_ms), _ms(d.ort_ms),
                     f"{d.ratio:.3f}" if d.ratio else "-", "keep" if d.keep else f"drop: {d.reason}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5] for r in rows]
    c = tuning.model_check
    if c:
        lines.append(f"whole model with kept fusions: {c['fused_ms']:.3f} ms vs stock ORT {c['ort_ms']:.3f} ms, "
                     f"ratio {c['ratio']:.3f} -> {'kept' if c['passed'] else 'nothing kept'} (limit {MODEL_LIMIT:.2f})")
    elif not any(d.keep for d in tuning.decisions):
        lines.append("no fusion won on its subgraph: auto runs the model as stock ORT")
    return "\n".join(lines)


# --------------------------------------------------------------------------- cache


def _level_and_threads(sess_options):
    import onnxruntime as ort

    if sess_options is None:
        return ort.GraphOptimizationLevel.ORT_ENABLE_ALL, 0
    return sess_options.graph_optimization_level, int(sess_options.intra_op_num_threads or 0)


def _versions() -> dict:
    from importlib import metadata as im

    out = {}
    for dist in ("ortfuse", "onnxruntime", "numba", "onnxruntime-extensions"):
        try:
            out[dist] = im.version(dist)
        except im.PackageNotFoundError:
            out[dist] = ""
    return out


def _cache_key(model, ids, level, threads, shapes: dict[str, list[int]], precision: str = registry.FP32) -> dict:
    return {
        "graph_digest": metadata.graph_digest(model),
        "isa": registry.native_isa(),
        "cpu_features": sorted(isa.cpu_features()),
        "versions": _versions(),
        "level": str(level),
        "threads": threads,
        "patterns": list(ids),
        "inputs": shapes,
        "precision": precision,
        "margin": MARGIN,
        "model_limit": MODEL_LIMIT,
    }


def cache_root() -> Path:
    return cache_dir(TUNING)


def _cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / f"{key['graph_digest'][:16]}-{digest}.json"


def _read(path: Path) -> Tuning | None:
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            return None
        return Tuning.from_dict(data, str(path))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: measured again


def _write(path: Path, tuning: Tuning) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(tuning.to_dict(), indent=1))
    except OSError:
        tuning.path = ""  # a read-only cache: the decisions hold for this session only


# --------------------------------------------------------------------------- small helpers


def _ms(x: float | None) -> str:
    return f"{x:.3f}" if x else "-"


def _short(nodes: list[str]) -> str:
    text = ",".join(nodes)
    return text if len(text) <= 40 else text[:37] + "..."
