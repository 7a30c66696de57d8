"""Planning a session: whether and how to fuse its model, read from the plan cache or made now
(``fuse`` with the request from arguments or metadata, the auto rule of ``ortfuse.tune``), and when
to step aside so that ORT gets the caller's input unchanged (docs/ARCHITECTURE.md §1, §7).

Contract: ``plan_fusion`` and ``prepare`` never raise for a model ORT could load, except for bad
fusion requests (unknown pattern ids, malformed fusion metadata), which are the user's to fix; a
``Plan`` is what ORT loads instead of the caller's input, None means the input itself. Under
``fusion="auto"`` the tuning mode (``session_options.tune_mode``) says whether decisions are measured
now (``sync``) or only read from the cache (``background``, ``off``); a tuning that fails leaves the
model to ORT and the report says why. ``Prepared.pending``: auto asked, nothing known yet for this
model on this machine, so a live tuning (``ortfuse.runtime.live_tuning``) has something to decide;
in ``background`` mode the matches are then not looked for at creation (the report lists none yet):
the live tuning finds them, off the creating thread.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.foundation.files import model_bytes
from ortfuse.foundation.messages import one_sentence
from ortfuse.foundation.session_options import PRECISION_OPTION, config_entry, tune_mode
from ortfuse.fusion.catalogue import check_pattern_ids, validate_patterns
from ortfuse.fusion.report import FusionReport
from ortfuse.ir import metadata
from ortfuse.kernel_choice.op_registration import REUSED_OPTIONS, warn_native_fallback, with_custom_ops
from ortfuse.runtime.options_copy import supplies_initializers, with_fused_ops

if TYPE_CHECKING:
    import onnx

# onnx and the rewriter are imported on first use: a session that only follows metadata (an
# unannotated model) never needs them, and `import ortfuse` stays as cheap as `import onnxruntime`.

_PROTOBUF_LIMIT = 2**31 - 1  # a serialized ModelProto cannot exceed 2 GiB


@dataclass
class Plan:
    """What to hand to ORT instead of the user's input when fusion applies."""

    source: str | bytes  # the path or bytes ORT loads
    report: FusionReport
    disabled_optimizers: set[str] = field(default_factory=set)
    needs_custom_ops: bool = False
    native_ops: frozenset = frozenset()  # native fused op types the model uses
    reference_inputs: frozenset | None = None  # tensors read by reference (Python-op) kernels; None: none


@dataclass
class Prepared:
    """What a session hands to ORT: the model source, the options (ortfuse's ops registered when the
    plan needs them), the report, and for ``fusion="auto"`` whether a tuning is still to be done."""

    source: str | bytes
    sess_options: object
    report: FusionReport
    plan: Plan | None = None
    auto: bool = False  # fusion="auto" was asked (argument or metadata) and decided by the tuner
    pending: bool = False  # auto, with no decisions known for this model here: live tuning decides
    mode: str = ""  # the tuning mode planning ran under

    @property
    def disabled_optimizers(self) -> set[str]:
        return set(self.plan.disabled_optimizers) if self.plan is not None else set()

    @property
    def reference_inputs(self) -> frozenset | None:
        return self.plan.reference_inputs if self.plan is not None else None


def _options_forbid_fusion(sess_options) -> str:
    """Session options under which a fused graph would give the caller a different answer than ORT."""
    if config_entry(sess_options, "session.record_ep_graph_assignment_info") == "1":
        return "the session records ORT's node placement, which must describe the original nodes"
    if sess_options is not None and sess_options.optimized_model_filepath:
        return "the optimized model ORT saves (optimized_model_filepath) must load in stock ORT"
    if supplies_initializers(sess_options):  # known of ortfuse.SessionOptions only (options_copy)
        return ("initializers supplied through SessionOptions (add_initializer, add_external_initializers) replace "
                "the model's, which the rewrite reads")
    return ""


def load_for_fusion(source: str | bytes, sess_options) -> tuple[onnx.ModelProto | None, str]:
    """Parse the model without its external data; return (model, "") or (None, reason to step aside)."""
    import onnx

    if isinstance(source, str):
        fmt = config_entry(sess_options, "session.load_model_format")
        if source.lower().endswith(".ort") or fmt.upper() == "ORT":
            return None, "ORT-format models are run as stock ORT runs them"
        try:
            return onnx.load(source, load_external_data=False), ""
        except Exception as exc:  # ORT reports unreadable files itself, with its own error type
            return None, f"onnx could not read the model ({type(exc).__name__}); ORT loads it unchanged"
    try:
        return onnx.load_from_string(source), ""
    except Exception as exc:
        return None, f"onnx could not parse the model bytes ({type(exc).__name__}); ORT loads them unchanged"


def _scan_props(source: str | bytes) -> dict[str, str] | None:
    """Model metadata read straight from the serialized bytes (mmap for files), or None."""
    if isinstance(source, bytes):
        return metadata.scan_props(source)
    with model_bytes(source) as data:
        try:
            return metadata.scan_props(data) if data is not None else None
        except ValueError:
            return None


def _has_external_data(model: onnx.ModelProto) -> bool:
    import onnx

    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.external_data_helper._get_all_tensors(model))


def _resolve_external_data(model: onnx.ModelProto, source: str | bytes) -> str:
    """Load external initializers into ``model``; return "" or the reason fusion must step aside."""
    import onnx

    if not _has_external_data(model):
        return ""
    if not isinstance(source, str):
        return "the model bytes refer to external data files, which only ORT can locate"
    folder = os.path.dirname(os.path.abspath(source))
    total = _external_bytes(model, folder) + model.ByteSize()
    if total > _PROTOBUF_LIMIT:  # summed before anything is read: such a model cannot be one message
        return (f"the model with its external data holds {total / 2**30:.1f} GiB, beyond protobuf's 2 GiB limit "
                "for one model; ORT loads it unchanged")
    try:
        onnx.load_external_data_for_model(model, folder)
    except Exception:
        return (
            "external initializers are not on disk (supplied through SessionOptions or missing); "
            "ORT loads the model unchanged"
        )
    return ""


def _external_bytes(model: onnx.ModelProto, folder: str) -> int:
    """The bytes the model's external initializers would add once loaded: each one's ``length``, else
    what its file holds past its ``offset`` (0 for a file that is not there)."""
    import onnx

    total = 0
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        if info.get("length", "").isdigit():
            total += int(info["length"])
            continue
        with contextlib.suppress(OSError, ValueError):
            size = os.path.getsize(os.path.join(folder, info.get("location", "")))
            total += max(0, size - int(info.get("offset", 0)))
    return total


def stepped_aside(reason: str, fusion, stacklevel: int = 4, **fields) -> FusionReport:
    """The report of a model ortfuse leaves to ORT although it could read it; warns when the caller
    asked for fusion explicitly (True or "auto")."""
    if fusion is True or fusion == "auto":
        warnings.warn(f"ortfuse: fusion requested but not applied: {reason}", stacklevel=stacklevel)
    return FusionReport(reason=reason, stepped_aside=True, **fields)


def prepare(source, sess_options, fusion, fusion_patterns, *, mode: str | None = None, tuning=None,
            plan_key: str | None = None, handed: dict | None = None) -> Prepared:
    """The plan for a session, with ortfuse's ops registered on the options when it needs them; when
    the native ops cannot be registered, the same fusions on kernels that need none (warned).
    ``mode``: the tuning mode (default: ``tune_mode(sess_options)``); ``tuning``: decisions to apply
    (a live tuning's) instead of looking them up; ``plan_key``: the plan cache's key to read the
    plan under (a tuning process's, ``plan_key``) instead of this process's key for the request;
    ``handed``: a plan a tuning process made and could not cache (``plan_entry``'s fields and the
    fused model's ``model_path``), used as it is: this process parses nothing."""
    mode = mode or tune_mode(sess_options)
    if handed is not None:
        plan, report = _plan_from_entry({**handed, "applied": True}, "plan made by the tuning process and handed "
                                        "over (not cached: its decisions are not final)")
        used = None
    else:
        plan, report, used = _plan(source, sess_options, fusion, fusion_patterns, None, mode, tuning, plan_key)
    out = Prepared(source, sess_options, report, plan, auto=used is not None or fusion == "auto", mode=mode)
    if plan is not None and plan.needs_custom_ops:
        # ortfuse's ops on a copy of the caller's options (``options_copy``), left unchanged
        options, why_not, note = with_fused_ops(sess_options, plan.native_ops, plan.reference_inputs is not None)
        out.sess_options = options
        if note:
            report.notes.append(note)
        if why_not:
            from ortfuse.kernel_choice.registry import LOWERED_ONLY, NO_NATIVE

            # options registered before without these ops: rather than the slow reference kernels,
            # only lowered fusions (ORT's own ops); the other matches stay as ORT runs them
            reused = why_not.startswith(REUSED_OPTIONS)
            warn_native_fallback(why_not, reused, stacklevel=4)
            plan, report, _ = _plan(source, options, fusion, fusion_patterns,
                                    LOWERED_ONLY if reused else NO_NATIVE, mode, tuning)
            report.notes.append(f"native kernels unavailable ({why_not}); "
                                + ("only fusions lowered to ORT's own ops applied" if reused
                                   else "lowered or reference kernels used"))
            if note:
                report.notes.append(note)
            out.plan, out.report = plan, report
            if plan is not None and plan.needs_custom_ops:
                out.sess_options = with_custom_ops(options, frozenset())[0]
    if out.plan is not None:
        out.source = out.plan.source
    out.pending = (mode == "background" and used is not None and not used.measured
                   and out.plan is None and (bool(report.matches) or DEFERRED_NOTE in report.notes))
    return out


def plan_fusion(source, sess_options, fusion, fusion_patterns, kernels=None) -> tuple[Plan | None, FusionReport]:
    """Decide whether and how to fuse; never raises for a model ORT could load, except for bad
    fusion requests (unknown pattern ids, malformed fusion metadata), which are the user's to fix."""
    plan, report, _ = _plan(source, sess_options, fusion, fusion_patterns, kernels, tune_mode(sess_options), None)
    return plan, report


def plan_key(source, sess_options, fusion, fusion_patterns) -> str | None:
    """The plan cache's key ``prepare`` stores this request's plan under, in this process (it holds
    a digest of ortfuse's sources as this process read them)."""
    from ortfuse.runtime import plan_cache

    return plan_cache.key(source, sess_options, fusion, fusion_patterns, None)


def _plan(source, sess_options, fusion, fusion_patterns, kernels, mode: str, tuning, key: str | None = None):
    """(plan, report, the tuning auto used or None: not auto, or a plan read from the cache)."""
    if fusion is False:
        return None, FusionReport(reason="fusion=False: the model runs as stock ORT runs it"), None
    check_pattern_ids(fusion_patterns)
    explicit = fusion_patterns
    why_not = _options_forbid_fusion(sess_options)
    if why_not:
        return None, stepped_aside(why_not, fusion, stacklevel=5), None
    if fusion is None:  # read only the metadata first: an unannotated model is not parsed at all
        props = _scan_props(source)
        if props is not None and metadata.FUSION_ENABLED not in props:
            return None, FusionReport(reason="model has no fusion metadata and fusion=None: stock ORT"), None
    from ortfuse.runtime import plan_cache

    cache_key = key or plan_cache.key(source, sess_options, fusion, fusion_patterns, kernels)
    entry = plan_cache.load(cache_key)
    if entry is not None:
        return (*_plan_from_cache(entry), None)
    if mode == "background" and tuning is None:
        deferred = _deferred_unparsed(source, sess_options, fusion, explicit)
        if deferred is not None:
            from ortfuse.tune.decisions import Tuning

            return None, deferred, Tuning({}, measured=False)
    plan, report, depends, used = _plan_uncached(source, sess_options, fusion, explicit, kernels, mode, tuning)
    if depends is not None and not report.stepped_aside:
        entry = plan_entry(plan, report)
        stored = plan_cache.store(cache_key, entry, plan.source if plan and isinstance(plan.source, bytes) else None,
                                  depends)
        if stored and plan is not None:  # ORT reads the fused model from that file: no copy stays in memory
            plan.source = stored
    return plan, report, used


def plan_entry(plan: Plan | None, report: FusionReport) -> dict:
    """What a plan cache entry holds besides the fused model (``_plan_from_entry`` reads it back)."""
    return {"report": report.to_dict(),
            "disabled_optimizers": sorted(plan.disabled_optimizers) if plan else [],
            "needs_custom_ops": bool(plan and plan.needs_custom_ops),
            "native_ops": sorted(plan.native_ops) if plan else [],
            "reference_inputs": _sorted_or_none(plan.reference_inputs if plan else None)}


def _plan_from_cache(entry: dict) -> tuple[Plan | None, FusionReport]:
    return _plan_from_entry(entry, f"plan read from ortfuse's cache ({entry['path']}): same model, request and "
                                   "environment")


def _plan_from_entry(entry: dict, note: str) -> tuple[Plan | None, FusionReport]:
    """The plan of ``entry`` (``plan_entry``'s fields, ``applied``, and the fused model's
    ``model_path``), with ``note`` added to its report."""
    report = FusionReport.from_dict(entry["report"])
    report.notes.append(note)
    if any(n.startswith(_STALE_NOTE) for n in report.notes):
        _warn_stale(stacklevel=6)
    if not entry["applied"]:
        return None, report
    reference_inputs = entry.get("reference_inputs")
    return Plan(entry["model_path"], report, set(entry["disabled_optimizers"]), entry["needs_custom_ops"],
                 frozenset(entry["native_ops"]),
                 frozenset(reference_inputs) if reference_inputs is not None else None), report


def _sorted_or_none(names) -> list | None:
    return sorted(names) if names is not None else None


_STALE_NOTE = "stale annotation"


def _warn_stale(stacklevel: int) -> None:
    warnings.warn("ortfuse: the model's fusion annotation was written for another graph "
                  "(ortfuse_graph_digest differs); its patterns are matched again on this graph", stacklevel=stacklevel)


def _plan_uncached(source, sess_options, fusion, explicit, kernels, mode: str, tuning=None):
    """The plan, its report, the files it depends on (None: the outcome must not be cached), and
    the tuning auto used (None: not auto)."""
    from ortfuse.fusion.provenance import is_rewritten, native_op_types, reference_op_inputs, report_of_rewritten
    from ortfuse.fusion.rewrite import fuse

    model, why_not = load_for_fusion(source, sess_options)
    if model is None:
        # Not warned about: ORT reads the input itself and raises its own error if it cannot.
        return None, FusionReport(reason=why_not, stepped_aside=True, notes=["model not parsed by onnx"]), None, None
    if is_rewritten(model):  # saved by `ortfuse-annotate --rewrite`: run it as is, with our ops registered
        report = report_of_rewritten(model)
        return Plan(source, report, needs_custom_ops=True, native_ops=frozenset(native_op_types(model)),
                     reference_inputs=reference_op_inputs(model)), report, None, None
    request = metadata.parse_request(metadata.read_props(model))
    if fusion is None:
        if not request.annotated:
            return None, FusionReport(reason="model has no fusion metadata and fusion=None: stock ORT"), [], None
        if not request.enabled:
            return None, FusionReport(reason="model metadata says fusion_enabled=false: stock ORT"), [], None
    patterns = validate_patterns(explicit if explicit is not None else request.patterns)
    stale = request.digest is not None and request.digest != metadata.graph_digest(model)
    if stale:  # the graph changed after annotation: matching runs on the graph as it is now
        _warn_stale(stacklevel=6)
    why_not = _resolve_external_data(model, source)
    if why_not:
        return None, stepped_aside(why_not, fusion, stacklevel=6, patterns=list(patterns)), None, None
    auto = fusion == "auto" or (fusion is not False and request.annotated and request.auto and explicit is None)
    if auto and tuning is None and not _may_match(model, patterns):  # final in every mode: nothing to measure
        return None, FusionReport(patterns=[], reason=NO_ANCHOR), [], None
    used = None
    if auto:
        used = tuning if tuning is not None else auto_tuning(model, patterns, sess_options, mode)
    # nothing known: the live tuning finds the matches
    if used is not None and _deferred(mode, tuning, used):
        report = FusionReport(patterns=list(patterns), reason=UNKNOWN_YET, notes=[DEFERRED_NOTE])
        return None, report, None, used
    keep = used.keep_rule(model) if used is not None else None
    depends: list | None = []  # files whose change makes this plan stale; None: the plan must not be cached
    failure = (used.failure or "") if used is not None else ""
    if used is not None:
        depends = None if not used.cacheable else [used.path] if used.path else ([] if used.measured else None)
    precision = config_entry(sess_options, PRECISION_OPTION) or None  # opt-in: kernel_choice.registry
    fused, report = fuse(model, patterns, kernels, keep=keep, precision=precision)
    if used is not None:
        used.annotate(report)
    if stale:
        report.notes.append(f"{_STALE_NOTE}: ortfuse_graph_digest does not match this graph; matched again")
    if not report.applied:
        if auto and report.matches:
            report.reason = (f"fusion='auto': tuning failed ({failure}); stock ORT" if failure else
                             UNKNOWN_YET if used is not None and not used.measured else
                             "fusion='auto': no fusion was measured to beat ORT on this machine; stock ORT")
        return None, report, depends, used
    data = fused.SerializeToString()
    if len(data) > _PROTOBUF_LIMIT:
        report = stepped_aside("the fused model would exceed protobuf's 2 GiB limit; ORT loads the original",
                                fusion, stacklevel=6, patterns=report.patterns, matches=report.matches,
                                notes=report.notes)
        return None, report, None, used
    needs_custom_ops = any(n.domain == DOMAIN for n in fused.graph.node)
    native, reference = frozenset(native_op_types(fused)), reference_op_inputs(fused)
    # the layout step needs the native ops (docs/ARCHITECTURE.md §9); auto may have measured the plan faster without
    if reference is None and kernels is None and (used is None or used.layout):
        from ortfuse.layout import served_sizes
        from ortfuse.tune.layout_memo import plan_layout  # a tuning that timed this plan laid it out already

        with served_sizes.serving(used.served_dims if used is not None else ""):  # the sizes it was tuned at
            layout, why_not = plan_layout(model, fused, sess_options, native, report.disabled_ort_optimizers, data)
        if layout is not None:
            data, native, needs_custom_ops = layout.model.SerializeToString(), native | layout.native_ops, True
        report.notes.append(layout.note if layout is not None else why_not)
    plan = Plan(data, report, set(report.disabled_ort_optimizers), needs_custom_ops, native, reference)
    return plan, report, depends, used


UNKNOWN_YET = "fusion='auto': no decisions for this model on this machine yet; stock ORT"
DEFERRED_NOTE = "auto: matches not looked for at creation; the live tuning finds and measures them"
NO_ANCHOR = ("fusion='auto': no node of the model's graph is of an op type a fusion starts from (If, Loop "
             "and Scan bodies are not fused); stock ORT, nothing to tune")


def _deferred(mode: str, tuning, used) -> bool:
    """Background auto with nothing known for the model here: the session is created on stock ORT
    without looking for matches (``fuse`` imports and type-checks what the creating thread need not
    wait for); the live tuning finds them."""
    return mode == "background" and tuning is None and not used.measured and not used.failure


def _may_match(model: onnx.ModelProto, patterns: tuple[str, ...]) -> bool:
    """``fusion.anchor_ops.could_match`` on the parsed model."""
    from ortfuse.fusion.anchor_ops import could_match

    return could_match({n.op_type for n in model.graph.node}, patterns, bool(model.functions))


def _deferred_unparsed(source: str | bytes, sess_options, fusion, explicit) -> FusionReport | None:
    """The deferred report of ``_deferred``'s case decided from the serialized bytes alone, or None
    when that needs the parsed model (``ortfuse.tune.lookup``: decisions may exist here, the bytes
    are not a plain ONNX model, the annotation names another graph, auto was not asked). Without
    this, a fresh process would import onnx and parse the model only to learn that nothing is known.
    A model no pattern can match (``fusion.anchor_ops``) gets its final report instead: stock ORT,
    nothing recorded or tuned."""
    from ortfuse.fusion import anchor_ops
    from ortfuse.tune import lookup

    if isinstance(source, str) and (source.lower().endswith(".ort")
                                    or config_entry(sess_options, "session.load_model_format").upper() == "ORT"):
        return None
    with model_bytes(source) as data:
        if data is None:
            return None
        props = metadata.scan_props(data)
        if props is None:
            return None
        request = metadata.parse_request(props)  # a malformed annotation raises as the parsed path does
        check_pattern_ids(explicit if explicit is not None else request.patterns)  # so does an unknown id
        if fusion is None and not (request.annotated and request.enabled):
            return None
        if not (fusion == "auto" or (fusion is not False and request.annotated and request.auto and explicit is None)):
            return None
        known, digest = lookup.may_know(data, props)
        matchable = known or anchor_ops.may_match(data, explicit if explicit is not None else request.patterns)
    if known or digest is None or (request.digest is not None and request.digest != digest):
        return None
    if not matchable:  # final: nothing to record or tune
        return FusionReport(patterns=[], reason=NO_ANCHOR)
    return FusionReport(patterns=[], reason=UNKNOWN_YET, notes=[DEFERRED_NOTE])


def requested_patterns(model: onnx.ModelProto, explicit) -> tuple[str, ...]:
    """The pattern ids a session on ``model`` considers: ``explicit`` (``fusion_patterns=``), else
    the model's metadata, else all; in catalogue order."""
    request = metadata.parse_request(metadata.read_props(model))
    return validate_patterns(explicit if explicit is not None else request.patterns)


def auto_tuning(model: onnx.ModelProto, patterns, sess_options, mode: str):
    """The tuner's decisions for ``model`` on this machine under ``mode``: ``sync`` measures now when
    none are cached; ``background`` and ``off`` read the cache only (decisions measured for other
    input shapes included). Never raises: a failure is a tuning with ``failure`` set."""
    from ortfuse.tune import tuner as tune
    from ortfuse.tune.decisions import Tuning

    try:
        if mode == "sync":
            return tune.tune(model, patterns, sess_options, measure=True)
        return tune.tune(model, patterns, sess_options, measure=False, any_shapes=True)
    except Exception as exc:  # a bug in tuning must not stop a model ORT runs
        failed = Tuning({}, measured=False)
        failed.failure = one_sentence(exc)
        return failed


def load_model(source: str | bytes, sess_options) -> tuple[onnx.ModelProto | None, str]:
    """The model with its external data, or (None, why it cannot be had)."""
    model, why_not = load_for_fusion(source, sess_options)
    if model is not None:
        why_not = _resolve_external_data(model, source)
    return (None, why_not) if why_not else (model, "")


def saved_fused_ops(source, sess_options) -> tuple[frozenset, frozenset | None]:
    """The native fused op types of a model saved already fused (they must be added before the
    library is registered) and the tensors its reference kernels read (None: it has none).
    When onnx cannot read it: no native ops, and every run guarded (which inputs reference kernels
    read is then unknown, so a None feed is left to ORT)."""
    from ortfuse.fusion.provenance import native_op_types, reference_op_inputs

    model, _ = load_for_fusion(source, sess_options) if isinstance(source, (str, bytes)) else (None, "")
    if model is None:
        return frozenset(), frozenset()
    return frozenset(native_op_types(model)), reference_op_inputs(model)
