"""Profile-guided ``fusion="auto"``: keep a fusion only where it was measured to beat ORT on this
machine (how: ``ortfuse.tune.measure``; the rule: ``ortfuse.tune.decisions``).

Decisions are cached as JSON in ``<cache>/tuning/`` (``ortfuse.foundation.cache_paths``), keyed by the
graph digest, ISA, the ortfuse, onnxruntime and numba versions, the optimization level and thread
count, the patterns and the input shapes measured. ``ortfuse tune MODEL`` fills the cache ahead of
time. ``ORTFUSE_TUNE=off`` makes ``auto`` use cached decisions only (without one, it keeps no fusion).
Besides the exact entry, each measured tuning is also filed under the key without its input shapes
(``tune(any_shapes=True)``): the decisions a session measured on its live feeds are then found by the
next session on the same model and machine, whatever shapes it would tune for.

``tune`` never raises for a model ORT could run: inputs it cannot make, a subgraph that fails, any
error while measuring come back as a ``Tuning`` with no decision and ``failure`` saying why. A tuning
that is not final (``Tuning.cacheable``: a failure, a spent budget) is not cached: the next one tries
again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx

from ortfuse.foundation import isa, source_digest
from ortfuse.foundation.cache_paths import TUNING, cache_dir
from ortfuse.foundation.files import write_atomic
from ortfuse.foundation.messages import one_sentence
from ortfuse.foundation.session_options import DIMS_KEY, PRECISION_OPTION, TUNE_ENV, config_entry, tune_mode
from ortfuse.fusion.catalogue import validate_patterns
from ortfuse.ir import feeds, metadata
from ortfuse.ir.model_args import format_dims, parse_dims
from ortfuse.kernel_choice import ranking, registry
from ortfuse.layout import served_sizes
from ortfuse.tune import lookup, steps
from ortfuse.tune import measure as measuring
from ortfuse.tune.decisions import FORMAT, MARGIN, MODEL_LIMIT, Tuning

ENV = TUNE_ENV
RANK_SHARE = 0.4  # of the tuning budget, for measuring the kernel ranking first (ortfuse.tune.rank_kernels)
WHOLE_PLAN_SHARE = 0.2  # of the tuning budget, timing every match fused as a whole first (measure.whole_plan)


def tuning_enabled() -> bool:
    """False when ``ORTFUSE_TUNE`` is off (off/0/false/no): ``auto`` then only uses cached decisions."""
    return tune_mode(None) != "off"


# --------------------------------------------------------------------------- public entry points


def tune(model: onnx.ModelProto, patterns: Iterable[str] | None = None, sess_options=None, *,
         batch: int = 1, dims: dict[str, int] | None = None, force: bool = False, measure: bool | None = None,
         progress: bool = False, sample: Mapping[str, np.ndarray] | None = None,
         any_shapes: bool = False, budget_s: float | None = None) -> Tuning:
    """Decisions for ``model`` (external data loaded): from the cache, else measured now and cached.

    ``measure=False`` (default: ``tuning_enabled()``) never measures: without a cached entry the
    result holds no decision (``measured`` False), so ``auto`` keeps nothing. ``force`` measures even
    when cached. Random feeds are made at ``feeds.sample_shapes`` (the key holds those shapes):
    ``dims`` and the options' ``ortfuse.tune_dims`` kept as given, ``batch`` and the other dynamic
    dims shrunk until the feeds fit ``feeds.SAMPLE_BUDGET_BYTES``; ``Tuning.sample_note`` says so
    when that changed them (or the dims kept exceed it). ``sample``: representative feeds, measured
    on instead of random ones; the cache key then holds their shapes (``batch`` and ``dims`` are not
    used). ``any_shapes``: when the entry for these shapes is missing, the decisions last measured on
    this model with the same key but other input shapes (live tuning on real feeds files them so).
    ``budget_s``: measuring's time budget (default ``measure.BUDGET_S``). Never raises for a model
    ORT could run (see the module docstring); bad pattern ids are the caller's to fix."""
    ids = validate_patterns(patterns)
    level, threads = _level_and_threads(sess_options)
    precision = registry.resolve_precision(config_entry(sess_options, PRECISION_OPTION) or None)
    declared: list = []
    why_not = ""
    named = {**dims_from_options(sess_options), **(dims or {})}
    batch = int(named.get("batch", batch))
    planned = None
    served = ""  # the sizes measured at, where the options name none (layout.served_sizes)
    if sample is not None:
        shapes = {name: [int(d) for d in np.shape(value)] for name, value in sample.items()}
        if not config_entry(sess_options, DIMS_KEY):
            with contextlib.suppress(feeds.FeedError):
                served = served_sizes.dims_of(feeds.declared_inputs(model), shapes)
    else:
        try:
            declared = feeds.declared_inputs(model)
        except feeds.FeedError as exc:
            why_not = str(exc)
        planned = feeds.sample_shapes(declared, batch, named)  # the feeds are made at these shapes
        shapes = planned.shapes
        if dims and not config_entry(sess_options, DIMS_KEY):  # sizes named by the caller (--dim) are served
            served = format_dims(dims)
    note = planned.note if planned is not None else ""
    key = _cache_key(model, ids, level, threads, shapes, precision)
    path = _cache_path(key)
    if not force and not why_not:
        embedded = _from_metadata(model, key)
        if embedded is not None:
            return _noted(embedded, note)
        cached = _read(path)
        if cached is not None:
            return _noted(cached, note)
    if not force and any_shapes:
        cached = _read(_any_shapes_path(key))
        if cached is not None:
            return cached
    if not (tuning_enabled() if measure is None else measure):
        return _noted(Tuning(key, measured=False), note)
    if why_not:
        return _failed(Tuning(key), why_not)
    start = time.perf_counter()
    budget = measuring.BUDGET_S if budget_s is None else budget_s
    ranked = ""
    with served_sizes.serving(served):  # every plan timed is laid out at the sizes measured on
        try:  # the feeds only now: the key needs shapes only
            feed = dict(sample) if sample is not None else \
                feeds.random_feeds(declared, seed=0, model=model, shapes=shapes)
            won, whole = measuring.whole_plan(model, ids, level, threads, feed, key, precision,
                                              budget_s=max(measuring.MODEL_BUDGET_S, WHOLE_PLAN_SHARE * budget))
            steps.mark("whole plan judged")
            if won is not None:  # every match fused wins: kept as a whole, nothing to measure one by one
                tuning = won
            else:
                verdicts: dict = {}
                if ranking.enabled() and level == _enable_all():  # the alternatives first, in the whole model
                    ranked, verdicts = _rank(model, ids, feed, threads, precision, RANK_SHARE * budget)
                    steps.mark("kernels ranked")
                    key = _cache_key(model, ids, level, threads, shapes, precision)  # the ranking is part of it
                    path = _cache_path(key)
                left = max(budget - (time.perf_counter() - start), 0.25 * budget)
                # every match fused runs and its median pass beat stock ORT without the evidence: a candidate plan
                compared = whole is not None and "failure" not in whole
                by_match_s = max(left - measuring.MODEL_BUDGET_S, 0.2 * left) if compared else left
                tuning = measuring.measure(model, ids, level, threads, feed, key, progress, precision,
                                           budget_s=by_match_s, verdicts=verdicts, check=not compared)
                tuning.whole_plan = whole
                steps.mark("matches measured")
                if compared:
                    # each look as long as the whole-model check's (the measuring above left it that much)
                    tuning = _best_plan(model, ids, level, threads, feed, key, precision, tuning, whole or {},
                                        measuring.MODEL_BUDGET_S)
        except Exception as exc:  # the model runs as stock ORT, and the report says why
            return _noted(_failed(Tuning(key), one_sentence(exc)), note)
    tuning.ranked = ranked
    tuning.sample_note = note
    tuning.served_dims = served
    tuning.seconds = round(time.perf_counter() - start, 2)
    if not tuning.cacheable:  # a failure may pass with other feeds, an unmeasured match may win: not final
        return tuning
    tuning.path = str(path)
    _write(path, tuning)
    if tuning.path:
        _write_any_shapes(key, tuning)
    return tuning


ALL_FUSED, ALL_FUSED_NO_LAYOUT, BY_MATCH = "every match fused", "every match fused without the layout step", \
    "the matches kept one by one"


def _best_plan(model, ids, level, threads, feed, key, precision: str, by_match: Tuning, whole: dict,
               budget_s: float) -> Tuning:
    """The best of the candidate whole-model plans (``measure.compare_plans``, chosen by
    ``plan_choice.choose``): every match fused (what ``fusion=True`` runs), the same without the layout
    step when that step changed it, and the matches ``by_match`` keeps (measured one by one, when
    they are not all of them); the decisions that make the plan chosen, or ``by_match`` keeping
    nothing when no candidate beat stock ORT. ``by_match`` has no whole-model check yet."""
    from ortfuse.fusion.rewrite import fuse

    _, every = fuse(model, ids, precision=precision)
    kept = [d for d in by_match.decisions if d.keep]
    candidates = {}
    if whole.get("paired_ratio", 1.0) <= MODEL_LIMIT:  # a clear loss alone is not timed again (no second chance)
        candidates[ALL_FUSED] = measuring.Candidate()
    if whole.get("layout_step"):
        candidates[ALL_FUSED_NO_LAYOUT] = measuring.Candidate(layout_step=False)
    if kept and len(kept) < len(every.fused):
        candidates[BY_MATCH] = measuring.Candidate(keep=by_match.keep_rule(model))
    choice, left_out, looks = measuring.compare_plans(model, ids, level, threads, feed, candidates, precision,
                                                      budget_s) if candidates else (None, {}, 0)
    steps.mark("candidate plans compared")
    if choice is None:  # none ran: the matches kept one by one, checked alone as before
        if kept:
            by_match.model_check = measuring._check_model(model, ids, by_match, level, threads, feed, precision)
        return by_match
    record = {**choice.as_dict(), "looks": looks, "left_out": left_out}
    if left_out:
        record["summary"] += "; left out: " + "; ".join(f"{k}: {v}" for k, v in left_out.items())
    best = choice.best
    if best in (ALL_FUSED, ALL_FUSED_NO_LAYOUT):
        verdict = choice.verdicts[best]
        why = (f"auto: kept with {best}: that plan ran {verdict.paired_ratio:.3f}x stock ORT pass by pass, the "
               f"best of the candidate plans timed together ({verdict.describe()}; {looks} look(s))")
        tuning = measuring.every_match_kept(model, every, key, {**verdict.as_check(), "looks": looks,
                                                                "fused_ops": len(every.fused)}, why)
        tuning.layout = best == ALL_FUSED
        tuning.whole_plan, tuning.ranked = whole, by_match.ranked
    else:
        tuning = by_match
        if BY_MATCH in choice.verdicts:  # its verdict against stock ORT is its whole-model check
            verdict = choice.verdicts[BY_MATCH]
            tuning.model_check = {**verdict.as_check(), "looks": looks, "fused_ops": len(kept),
                                  "passed": best == BY_MATCH}
        elif kept:  # all kept one by one: the same plan as every match fused, which did not win
            tuning.model_check = {**choice.verdicts[ALL_FUSED].as_check(), "looks": looks,
                                  "fused_ops": len(kept), "passed": False} if ALL_FUSED in choice.verdicts else \
                measuring._check_model(model, ids, by_match, level, threads, feed, precision)
    tuning.choice = record
    tuning.budget_spent, tuning.failure = by_match.budget_spent, by_match.failure
    return tuning


def _rank(model, ids, feed, threads: int, precision: str, budget_s: float) -> tuple[str, dict]:
    """Measure the kernel ranking of ``model``'s classes in the whole model and store it for this
    machine (``ortfuse.tune.rank_kernels``). Returns one line for the report ("" when there was nothing to
    rank) and the verdicts it gives the matches of each timed class (node names -> keep, reason,
    whole-model ms with the kernel ranked first, with the class left to ORT): ``measure`` takes them
    instead of measuring those matches alone. A failure here leaves the static order and no verdict."""
    from ortfuse.tune import rank_kernels

    try:
        results = rank_kernels.rank(model, ids, feed, threads=threads, budget_s=budget_s, precision=precision)
        rank_kernels.store(results, model.graph.name or "model", threads)
    except Exception as exc:
        return f"ranking failed ({one_sentence(exc)}); the static order is used", {}
    verdicts = {}
    for r in results:
        found = r.verdict()
        if found is not None:
            keep, reason = found
            best = r.order[0]
            for names in r.matches:
                verdicts[tuple(names)] = (keep, reason, r.p50_ms.get(best), r.p50_ms.get(ranking.ORT))
    timed = [r for r in results if len(r.p50_ms) > 2]
    changed = [f"{r.key.replace('|', ' ').strip()}: {r.order[0]}" for r in timed if r.order and r.order[0] != r.static]
    if not timed:
        return "", verdicts
    return (f"{len(timed)} class(es) timed in the whole model; "
            + ("; ".join(changed) if changed else "the static choices held")), verdicts


def _enable_all():
    import onnxruntime as ort

    return ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def _noted(tuning: Tuning, note: str) -> Tuning:
    """``tuning`` with the sentence on how its sample shapes were chosen (``feeds.sample_shapes``)."""
    tuning.sample_note = note
    return tuning


def _failed(tuning: Tuning, reason: str) -> Tuning:
    tuning.failure = reason
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


def _cache_key(model, ids, level, threads, shapes: dict[str, list[int]], precision: str = registry.FP32) -> dict:
    return {
        "graph_digest": metadata.graph_digest(model),
        "isa": registry.native_isa(),
        # the CPU by /proc/cpuinfo, the same in every process (cpu_features() is LLVM's view once numba
        # is loaded and /proc/cpuinfo's before: the tuning process and the session spelled it apart)
        "cpu": isa.fingerprint(),
        "isa_override": os.environ.get(isa.ENV_VAR, ""),
        "versions": ranking.versions(),
        # the sources the decisions were measured with (rules, kernels): an edited checkout matches
        # and fuses otherwise, so its old decisions name other matches (as the plan cache keys)
        "code": source_digest.code_digest(),
        "ranking": ranking.digest(),
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
    return cache_root() / f"{lookup.file_prefix(key['graph_digest'])}{digest}.json"


def _any_shapes_path(key: dict) -> Path:
    rest = {k: v for k, v in key.items() if k != "inputs"}
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / f"{lookup.file_prefix(key['graph_digest'])}any-{digest}.json"


def _write_any_shapes(key: dict, tuning: Tuning) -> None:
    """File the decisions also under the key without input shapes."""
    with contextlib.suppress(OSError):  # the exact entry still serves sessions tuned for these shapes
        write_atomic(_any_shapes_path(key), json.dumps(tuning.to_dict(), indent=1))


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
