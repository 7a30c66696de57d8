"""Profile-guided ``fusion="auto"``: keep a fusion only where it was measured to beat ORT on this machine.

Per legal match found by ``fuse``:
- cut the replaced nodes out into a standalone model, constants as initializers, fed with the very
  tensors they receive in the model (one stock ORT run on sample inputs records them: real shapes,
  real values);
- time stock ORT on that subgraph against ortfuse's replacement of it (``fuse`` of the same pattern),
  both at the caller's optimization level and thread count, single runs interleaved A B B A
  (``bench_measure``), median over repeats; matches with equal pattern, op types, attributes and
  shapes are measured once;
- keep the fusion when ``fused_ms <= (1 - MARGIN) * ort_ms``, it was faster in every repeat, and its
  outputs agree with ORT's.
Then the whole model with the kept fusions is timed against stock ORT the same way; unless its ratio
is at most ``MODEL_LIMIT`` and below 1 in every repeat, nothing is kept (the guarantee: ``auto`` is
never slower than ORT; a fusion that only ties ORT within the noise of this machine is not worth it).

Decisions are cached as JSON in ``<cache>/tuning/``, keyed by the graph digest, ISA, the ortfuse,
onnxruntime and numba versions, the optimization level and thread count, the patterns and the input
shapes measured. ``ortfuse tune MODEL`` fills the cache ahead of time. ``ORTFUSE_TUNE=off`` makes
``auto`` use cached decisions only (without one, it keeps no fusion).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse import bench_measure
from ortfuse.ir import feeds
from ortfuse.ir import metadata
from ortfuse.kernels import registry
from ortfuse.ir.graph import GraphIndex
from ortfuse.fusion.report import FusionReport, MatchRecord
from ortfuse.runtime.session_options import config_entry

MARGIN = 0.05  # a fusion must be at least 5% faster than ORT on its subgraph
MODEL_LIMIT = 0.98  # the whole auto model must win by 2% (median) and in every repeat, else nothing is kept
SUBGRAPH_BUDGET_S = 0.25  # timed wall time per distinct subgraph (both sides together)
MODEL_BUDGET_S = 3.0  # timed wall time of the whole-model check
REPEATS = 3
CLEAR_LOSS = 2.0  # a fused subgraph this many times slower than ORT at first look is not timed further
MIN_RUNS, MAX_RUNS = 3, 60
CHECK_RTOL, CHECK_ATOL = 1e-3, 1e-4  # a fused subgraph whose outputs differ more is not kept
# under the bf16 opt-in (registry.PRECISION_OPTION): bf16 products, |error| <~ 2^-7 sum|x w| (tests/test_amx.py)
BF16_CHECK_RTOL, BF16_CHECK_ATOL = 2.0**-5, 2.0**-6  # atol times max(1, max|ORT output|)
ENV = "ORTFUSE_TUNE"
DIMS_KEY = "ortfuse.tune_dims"  # SessionOptions config entry: "batch=64,seq=128" -> the shapes tuned for
FORMAT = 1


def tuning_enabled() -> bool:
    """False when ``ORTFUSE_TUNE`` is off/0/false: ``auto`` then only uses cached decisions."""
    return os.environ.get(ENV, "on").strip().lower() not in ("0", "off", "false", "no")


@dataclass
class Decision:
    """The measured verdict on one match (identified by pattern id and original node names)."""

    pattern_id: str
    nodes: list[str]
    keep: bool
    reason: str
    fused_ms: float | None = None
    ort_ms: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.fused_ms / self.ort_ms if self.fused_ms and self.ort_ms else None


@dataclass
class Tuning:
    """All decisions for one model on this machine, plus the whole-model check."""

    key: dict
    decisions: list[Decision] = field(default_factory=list)
    model_check: dict | None = None  # {"fused_ms", "ort_ms", "ratio", "passed"}
    seconds: float = 0.0
    path: str = ""
    from_cache: bool = False
    origin: str = ""  # "model metadata" when read from the model (ortfuse-annotate --tune)
    measured: bool = True  # False: nothing was measured nor cached (ORTFUSE_TUNE=off), so nothing is known

    def find(self, pattern_id: str, nodes: Iterable[str]) -> Decision | None:
        wanted = (pattern_id, tuple(nodes))
        return next((d for d in self.decisions if (d.pattern_id, tuple(d.nodes)) == wanted), None)

    def keep_rule(self) -> Callable[[MatchRecord], str]:
        """The ``fuse(keep=...)`` rule: fuse what was measured to win, nothing unmeasured."""
        failed = self.model_check is not None and not self.model_check["passed"]

        def rule(record: MatchRecord) -> str:
            found = self.find(record.pattern_id, record.nodes)
            if found is None:
                return "auto: not measured on this machine (run `ortfuse tune MODEL`)"
            if not found.keep:
                return found.reason
            if failed:
                return (f"auto: the whole model with the kept fusions ran {self.model_check['ratio']:.3f}x stock "
                        f"ORT (limit {MODEL_LIMIT:.2f}), so none is kept")
            return ""

        return rule

    def annotate(self, report: FusionReport) -> None:
        """Write the measured times into the report's records and say where the decisions came from."""
        for record in report.matches:
            found = self.find(record.pattern_id, record.nodes)
            if found is not None:
                record.fused_ms, record.ort_ms = found.fused_ms, found.ort_ms
        origin = "cached" if self.from_cache else f"measured in {self.seconds:.1f} s"
        note = f"auto: decisions {origin} ({self.origin or self.path or 'not cached'})"
        if self.model_check:
            c = self.model_check
            note += (f"; whole model {c['fused_ms']:.3f} ms vs stock ORT {c['ort_ms']:.3f} ms "
                     f"(ratio {c['ratio']:.3f}, {'passed' if c['passed'] else 'failed'})")
        report.notes.append(note)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "key": self.key, "seconds": self.seconds, "model_check": self.model_check,
                "decisions": [dataclasses.asdict(d) for d in self.decisions]}

    @classmethod
    def from_dict(cls, data: dict, path: str = "") -> Tuning:
        return cls(data["key"], [Decision(**d) for d in data["decisions"]], data.get("model_check"),
                   data.get("seconds", 0.0), path, from_cache=True)


# --------------------------------------------------------------------------- public entry points


def tune(model: onnx.ModelProto, patterns: Iterable[str] | None = None, sess_options=None, *,
         batch: int = 1, dims: dict[str, int] | None = None, force: bool = False, measure: bool | None = None,
         progress: bool = False) -> Tuning:
    """Decisions for ``model`` (external data loaded): from the cache, else measured now and cached.

    ``measure=False`` (default: ``tuning_enabled()``) never measures: without a cached entry the
    result holds no decision, so ``auto`` keeps nothing. ``force`` measures even when cached."""
    from ortfuse.fusion.catalogue import validate_patterns

    ids = validate_patterns(patterns)
    level, threads = _level_and_threads(sess_options)
    asked = dims_from_options(sess_options)
    dims = {**asked, **(dims or {})}
    batch = int(dims.get("batch", batch))
    declared = feeds.declared_inputs(model)
    shapes = {name: feeds.concrete_shape(decl, batch, dims) for name, _, decl in declared}
    precision = registry.resolve_precision(config_entry(sess_options, registry.PRECISION_OPTION) or None)
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
    tuning = _measure(model, ids, level, threads, sample, key, progress, precision)
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
    from ortfuse.ir.model_args import parse_dims

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


# --------------------------------------------------------------------------- measuring


def _measure(model, ids, level, threads, sample, key, progress, precision=registry.FP32) -> Tuning:
    from ortfuse.fusion.rewrite import fuse

    _, report = fuse(model, ids, precision=precision)
    candidates = report.fused
    tuning = Tuning(key)
    if not candidates:
        return tuning
    ix = GraphIndex(model, infer_shapes=False)
    by_name = {ix.name_of(n): n for n in ix.graph.node}
    cuts = [_cut(ix, [by_name[n] for n in rec.nodes]) for rec in candidates]
    captured = _capture(model, {t for cut in cuts for t in cut.runtime_inputs + cut.outputs}, sample)
    measured: dict[str, Decision] = {}
    with _progress_bar(len(candidates), progress) as bar:
        for rec, cut in zip(candidates, cuts):
            micro, micro_feeds = cut.model(model, captured)
            signature = cut.signature(micro_feeds)
            if signature not in measured:
                measured[signature] = _measure_subgraph(micro, micro_feeds, rec.pattern_id, level, threads, precision)
            found = measured[signature]
            tuning.decisions.append(dataclasses.replace(found, pattern_id=rec.pattern_id, nodes=list(rec.nodes)))
            bar.update(1)
    if any(d.keep for d in tuning.decisions):
        tuning.model_check = _check_model(model, ids, tuning, level, threads, sample, precision)
    return tuning


@dataclass
class _Cut:
    """The nodes of one match, with what they read from the rest of the graph."""

    nodes: list[onnx.NodeProto]
    runtime_inputs: list[str]
    constants: dict[str, np.ndarray]
    outputs: list[str]

    def model(self, whole: onnx.ModelProto, captured: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, dict]:
        micro_feeds = {t: captured[t] for t in self.runtime_inputs}
        inputs = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                  for t, a in micro_feeds.items()]
        outputs = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(captured[t].dtype),
                                                 captured[t].shape) for t in self.outputs]
        inits = [numpy_helper.from_array(v, name) for name, v in self.constants.items()]
        graph = helper.make_graph(list(self.nodes), "ortfuse_tune_subgraph", inputs, outputs, initializer=inits)
        micro = helper.make_model(graph, opset_imports=list(whole.opset_import))
        micro.ir_version = whole.ir_version
        return micro, micro_feeds

    def signature(self, micro_feeds: dict) -> str:
        h = hashlib.sha256()
        for n in self.nodes:
            h.update(f"{n.domain}:{n.op_type}:{[(a.name, str(helper.get_attribute_value(a))) for a in n.attribute]}"
                     .encode())
        for t in self.runtime_inputs:
            h.update(f"in{micro_feeds[t].shape}{micro_feeds[t].dtype}".encode())
        for v in self.constants.values():
            h.update(f"c{v.shape}{v.dtype}".encode())
        return h.hexdigest()


def _cut(ix: GraphIndex, nodes: list[onnx.NodeProto]) -> _Cut:
    inside = {id(n) for n in nodes}
    produced = {o for n in nodes for o in n.output if o}
    runtime, constants = [], {}
    for n in nodes:
        for t in n.input:
            if not t or t in produced or t in runtime or t in constants:
                continue
            value = ix.const(t)
            if value is None:
                runtime.append(t)
            else:
                constants[t] = value
    outputs = [o for n in nodes for o in n.output if o and (
        o in ix.graph_outputs or any(id(c) not in inside for c in ix.consumers_of(o)))]
    return _Cut(sorted(nodes, key=lambda n: ix.position[id(n)]), runtime, constants, outputs or [nodes[-1].output[0]])


def _capture(model: onnx.ModelProto, tensors: set[str], sample: dict) -> dict[str, np.ndarray]:
    """The values of ``tensors`` when the model runs on ``sample`` (stock ORT, ORT_DISABLE_ALL)."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    wanted = sorted(tensors)
    extra = [t for t in wanted if t not in present and t not in sample]
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in extra)
    so = _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, 0)
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(None, sample)))
    values.update(sample)
    return {t: values[t] for t in wanted}


def _options(level, threads: int, precision: str = registry.FP32):
    from ortfuse.bench import measuring_options

    so = measuring_options(level, threads=threads, spinning=False)
    if precision != registry.FP32:
        so.add_session_config_entry(registry.PRECISION_OPTION, precision)
    return so


def _measure_subgraph(micro: onnx.ModelProto, micro_feeds: dict, pattern_id: str, level, threads,
                      precision: str = registry.FP32) -> Decision:
    import onnxruntime as ort

    import ortfuse

    data = micro.SerializeToString()
    stock = ort.InferenceSession(data, _options(level, threads), providers=["CPUExecutionProvider"])
    fused = ortfuse.InferenceSession(data, _options(level, threads, precision), providers=["CPUExecutionProvider"],
                                     fusion=True, fusion_patterns=[pattern_id])
    if len(fused.fusion_report.fused) != 1:
        return Decision(pattern_id, [], False, "auto: the match does not fuse on its own subgraph "
                                               f"({fused.fusion_report.reason}); left to ORT")
    expected, got = stock.run(None, micro_feeds), fused.run(None, micro_feeds)
    for e, g in zip(expected, got):
        rtol, atol = CHECK_RTOL, CHECK_ATOL
        if precision == registry.BF16:
            finite = np.abs(e[np.isfinite(e)]) if e.size else np.zeros(1)
            rtol, atol = BF16_CHECK_RTOL, BF16_CHECK_ATOL * max(1.0, float(finite.max()) if finite.size else 1.0)
        if e.shape != g.shape or not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
            return Decision(pattern_id, [], False, f"auto: fused output differs from ORT's beyond rtol {rtol:g}, "
                                                   f"atol {atol:g}; left to ORT (run `ortfuse verify`)")
    fused_run, ort_run = (lambda: fused.run(None, micro_feeds)), (lambda: stock.run(None, micro_feeds))
    fused_ms, ort_ms = _best_of(fused_run, ort_run, 3)
    if fused_ms > CLEAR_LOSS * ort_ms:  # far behind: no need to time it precisely
        return Decision(pattern_id, [], False, f"auto: fused {fused_ms:.3f} ms vs ORT {ort_ms:.3f} ms on its subgraph "
                                               f"(best of 3; ratio {fused_ms / ort_ms:.2f})", fused_ms, ort_ms)
    fused_ms, ort_ms, ratios = _time_pair(fused_run, ort_run, SUBGRAPH_BUDGET_S)
    ratio = fused_ms / ort_ms
    if ratio <= 1 - MARGIN and max(ratios) < 1:
        return Decision(pattern_id, [], True, f"auto: fused {ratio:.2f}x ORT on its subgraph", fused_ms, ort_ms)
    why = f"ratio {ratio:.2f} > {1 - MARGIN:.2f}" if ratio > 1 - MARGIN else \
        f"ratio {ratio:.2f}, but {max(ratios):.2f} in one repeat: not faster in every repeat"
    return Decision(pattern_id, [], False, f"auto: fused {fused_ms:.3f} ms vs ORT {ort_ms:.3f} ms on its subgraph "
                                           f"({why})", fused_ms, ort_ms)


def _best_of(fused_run, ort_run, n: int) -> tuple[float, float]:
    """(fused, ORT) fastest of ``n`` alternated single runs after one untimed run each, in ms: a quick
    first look (first runs pay for allocations and thread-pool start-up)."""
    fused_run()
    ort_run()
    best = {"fused": float("inf"), "ort": float("inf")}
    for _ in range(n):
        for name, fn in (("fused", fused_run), ("ort", ort_run)):
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    return best["fused"], best["ort"]


def _time_pair(fused_run, ort_run, budget_s: float) -> tuple[float, float, list[float]]:
    """(fused p50, ORT p50, fused/ORT p50 ratio of each repeat): ms, medians over REPEATS of
    interleaved A B B A single runs."""
    t0 = time.perf_counter()
    fused_run()
    ort_run()
    once = max(time.perf_counter() - t0, 1e-6)
    runs = int(min(MAX_RUNS, max(MIN_RUNS, budget_s / REPEATS / once)))
    raw = bench_measure.measure({"fused": fused_run, "ort": ort_run}, runs=runs, repeats=REPEATS, warmup=1)
    p50 = {k: statistics.median(bench_measure.p50_per_repeat(v)) for k, v in raw.items()}
    return p50["fused"], p50["ort"], bench_measure.ratio_per_repeat(raw["fused"], raw["ort"])


def _check_model(model, ids, tuning: Tuning, level, threads, sample, precision: str = registry.FP32) -> dict:
    import onnxruntime as ort

    import ortfuse
    from ortfuse.fusion.rewrite import fuse

    fused_model, report = fuse(model, ids, keep=tuning.keep_rule(), precision=precision)
    stock = ort.InferenceSession(model.SerializeToString(), _options(level, threads), providers=["CPUExecutionProvider"])
    fused = ortfuse.InferenceSession(fused_model.SerializeToString(), _options(level, threads, precision),
                                     providers=["CPUExecutionProvider"])
    fused_ms, ort_ms, ratios = _time_pair(lambda: fused.run(None, sample), lambda: stock.run(None, sample),
                                          MODEL_BUDGET_S)
    ratio = fused_ms / ort_ms
    return {"fused_ms": fused_ms, "ort_ms": ort_ms, "ratio": ratio, "ratios": ratios,
            "passed": ratio <= MODEL_LIMIT and max(ratios) < 1, "fused_ops": len(report.fused)}


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
    from ortfuse.kernels import isa

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
    from ortfuse.runtime.cache_paths import cache_dir

    return cache_dir() / "tuning"


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
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(tuning.to_dict(), indent=1))
        os.replace(tmp, path)
    except OSError:
        tuning.path = ""  # a read-only cache: the decisions hold for this session only


# --------------------------------------------------------------------------- small helpers


def _ms(x: float | None) -> str:
    return f"{x:.3f}" if x else "-"


def _short(nodes: list[str]) -> str:
    text = ",".join(nodes)
    return text if len(text) <= 40 else text[:37] + "..."


@contextlib.contextmanager
def _progress_bar(total: int, enabled: bool):
    if enabled:
        from tqdm import tqdm

        with tqdm(total=total, desc="measuring fused ops", unit="op") as bar:
            yield bar
    else:
        class _Null:
            def update(self, n):
                pass

        yield _Null()

