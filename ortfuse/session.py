"""``ortfuse.InferenceSession``: ORT's session with ``fusion=`` and ``fusion_patterns=`` on top.

Contract:
- The signature is ORT's, plus keyword-only ``fusion`` (None | False | True | "auto") and
  ``fusion_patterns`` (None | list of pattern ids). ``path_or_bytes`` may also be an ``onnx.ModelProto``.
- ``fusion=None`` follows the model's metadata: an annotated model (``fusion_enabled=true``) fuses,
  any other model runs exactly as stock ORT (same bytes or path handed to ORT, same options).
- When fusion applies, the rewritten model is what ORT loads and what ``set_providers`` rebuilds from
  (ORT keeps it in ``_model_bytes``), and ORT transformers that would undo an owned pattern are
  disabled by name on every (re)creation.
- Whenever ortfuse cannot fuse safely (unreadable model, ORT format, external data it cannot load,
  initializers supplied through SessionOptions, an available accelerator provider first, options
  that record node placement or save the optimized model, nothing matched), it steps aside and ORT
  gets the original input: never an error where ORT succeeds. ``fusion_report`` says what happened.
- Fused ops run native kernels where the registry has one for this CPU, else the numpy reference;
  if the native path cannot be registered, the reference is used with one warning.
"""

from __future__ import annotations

import mmap
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnxruntime as _ort

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.catalogue import check_pattern_ids, validate_patterns
from ortfuse.fusion.report import FusionReport
from ortfuse.ir import metadata
from ortfuse.runtime.op_registration import REUSED_OPTIONS, warn_native_fallback, with_custom_ops
from ortfuse.runtime.reference_runs import refuse_missing_inputs, run_guarded, status_message
from ortfuse.runtime.session_options import PRECISION_OPTION, config_entry

if TYPE_CHECKING:
    import onnx

# onnx and the rewriter are imported on first use: a session that only follows metadata (an
# unannotated model) never needs them, and `import ortfuse` stays as cheap as `import onnxruntime`.

_PROTOBUF_LIMIT = 2**31 - 1  # a serialized ModelProto cannot exceed 2 GiB


@dataclass
class _Plan:
    """What to hand to ORT instead of the user's input when fusion applies."""

    source: str | bytes  # the path or bytes ORT loads
    report: FusionReport
    disabled_optimizers: set[str] = field(default_factory=set)
    needs_custom_ops: bool = False
    native_ops: frozenset = frozenset()  # native fused op types the model uses
    reference_inputs: frozenset | None = None  # tensors read by reference (Python-op) kernels; None: none


def _options_forbid_fusion(sess_options) -> str:
    """Session options under which a fused graph would give the caller a different answer than ORT."""
    if config_entry(sess_options, "session.record_ep_graph_assignment_info") == "1":
        return "the session records ORT's node placement, which must describe the original nodes"
    if sess_options is not None and sess_options.optimized_model_filepath:
        return "the optimized model ORT saves (optimized_model_filepath) must load in stock ORT"
    return ""


CPU_PROVIDER = "CPUExecutionProvider"


def _provider_problem(providers, sess_options) -> str:
    """Why fused CPU ops would pull work off an accelerator: the first requested provider that is
    available is not the CPU one (an unavailable one is skipped by ORT, which then runs on CPU)."""
    if sess_options is not None and hasattr(sess_options, "has_providers") and sess_options.has_providers():
        return "the SessionOptions select execution providers by device; fused CPU ops could displace them"
    available = set(_ort.get_available_providers())
    for entry in providers or ():
        name = entry[0] if isinstance(entry, tuple) else entry
        if name in available:
            if name == CPU_PROVIDER:
                return ""
            if name == "AzureExecutionProvider":  # runs remote models only; local nodes stay on CPU
                continue
            return f"the first available provider is {name}; fused CPU ops would pull its nodes onto the CPU"
    return ""


def _valid_fusion_value(fusion) -> bool:
    return fusion is None or fusion is True or fusion is False or fusion == "auto"


def _load_for_fusion(source: str | bytes, sess_options) -> tuple[onnx.ModelProto | None, str]:
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
    try:
        with open(source, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return metadata.scan_props(data)
    except (OSError, ValueError):
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
    try:
        onnx.load_external_data_for_model(model, os.path.dirname(os.path.abspath(source)))
    except Exception:
        return (
            "external initializers are not on disk (supplied through SessionOptions or missing); "
            "ORT loads the model unchanged"
        )
    return ""


def _stepped_aside(reason: str, fusion, stacklevel: int = 4, **fields) -> FusionReport:
    """The report of a model ortfuse leaves to ORT although it could read it; warns when the caller
    asked for fusion explicitly (True or "auto")."""
    if fusion is True or fusion == "auto":
        warnings.warn(f"ortfuse: fusion requested but not applied: {reason}", stacklevel=stacklevel)
    return FusionReport(reason=reason, stepped_aside=True, **fields)


def _plan_fusion(source, sess_options, fusion, fusion_patterns, kernels=None) -> tuple[_Plan | None, FusionReport]:
    """Decide whether and how to fuse; never raises for a model ORT could load, except for bad
    fusion requests (unknown pattern ids, malformed fusion metadata), which are the user's to fix."""
    if fusion is False:
        return None, FusionReport(reason="fusion=False: the model runs as stock ORT runs it")
    check_pattern_ids(fusion_patterns)
    explicit = fusion_patterns
    why_not = _options_forbid_fusion(sess_options)
    if why_not:
        return None, _stepped_aside(why_not, fusion)
    if fusion is None:  # read only the metadata first: an unannotated model is not parsed at all
        props = _scan_props(source)
        if props is not None and metadata.FUSION_ENABLED not in props:
            return None, FusionReport(reason="model has no fusion metadata and fusion=None: stock ORT")
    from ortfuse.runtime import plan_cache

    cache_key = plan_cache.key(source, sess_options, fusion, fusion_patterns, kernels)
    entry = plan_cache.load(cache_key)
    if entry is not None:
        return _plan_from_cache(entry)
    plan, report, depends = _plan_uncached(source, sess_options, fusion, explicit, kernels)
    if depends is not None and not report.stepped_aside:
        entry = {"report": report.to_dict(),
                 "disabled_optimizers": sorted(plan.disabled_optimizers) if plan else [],
                 "needs_custom_ops": bool(plan and plan.needs_custom_ops),
                 "native_ops": sorted(plan.native_ops) if plan else [],
                 "reference_inputs": _sorted_or_none(plan.reference_inputs if plan else None)}
        stored = plan_cache.store(cache_key, entry, plan.source if plan else None, depends)
        if stored:  # ORT reads the fused model from the file: no copy of it stays in Python's memory
            plan.source = stored
    return plan, report


def _plan_from_cache(entry: dict) -> tuple[_Plan | None, FusionReport]:
    report = FusionReport.from_dict(entry["report"])
    report.notes.append(f"plan read from ortfuse's cache ({entry['path']}): same model, request and environment")
    if any(n.startswith(_STALE_NOTE) for n in report.notes):
        _warn_stale(stacklevel=5)
    if not entry["applied"]:
        return None, report
    reference_inputs = entry.get("reference_inputs")
    return _Plan(entry["model_path"], report, set(entry["disabled_optimizers"]), entry["needs_custom_ops"],
                 frozenset(entry["native_ops"]),
                 frozenset(reference_inputs) if reference_inputs is not None else None), report


def _sorted_or_none(names) -> list | None:
    return sorted(names) if names is not None else None


_STALE_NOTE = "stale annotation"


def _warn_stale(stacklevel: int) -> None:
    warnings.warn("ortfuse: the model's fusion annotation was written for another graph "
                  "(ortfuse_graph_digest differs); its patterns are matched again on this graph", stacklevel=stacklevel)


def _plan_uncached(source, sess_options, fusion, explicit, kernels) -> tuple[_Plan | None, FusionReport, list | None]:
    """The plan, its report, and the files it depends on (None: the outcome must not be cached)."""
    from ortfuse.fusion.provenance import is_rewritten, native_op_types, reference_op_inputs, report_of_rewritten
    from ortfuse.fusion.rewrite import fuse

    model, why_not = _load_for_fusion(source, sess_options)
    if model is None:
        # Not warned about: ORT reads the input itself and raises its own error if it cannot.
        return None, FusionReport(reason=why_not, stepped_aside=True, notes=["model not parsed by onnx"]), None
    if is_rewritten(model):  # saved by `ortfuse-annotate --rewrite`: run it as is, with our ops registered
        report = report_of_rewritten(model)
        return _Plan(source, report, needs_custom_ops=True, native_ops=frozenset(native_op_types(model)),
                     reference_inputs=reference_op_inputs(model)), report, None
    request = metadata.parse_request(metadata.read_props(model))
    if fusion is None:
        if not request.annotated:
            return None, FusionReport(reason="model has no fusion metadata and fusion=None: stock ORT"), []
        if not request.enabled:
            return None, FusionReport(reason="model metadata says fusion_enabled=false: stock ORT"), []
    patterns = validate_patterns(explicit if explicit is not None else request.patterns)
    stale = request.digest is not None and request.digest != metadata.graph_digest(model)
    if stale:  # the graph changed after annotation: matching runs on the graph as it is now
        _warn_stale(stacklevel=5)
    why_not = _resolve_external_data(model, source)
    if why_not:
        return None, _stepped_aside(why_not, fusion, stacklevel=5, patterns=list(patterns)), None
    auto = fusion == "auto" or (fusion is not False and request.annotated and request.auto and explicit is None)
    keep = _auto_rule(model, patterns, sess_options) if auto else None
    depends = []  # files whose change makes this plan stale; None: the plan must not be cached
    if keep is not None:
        depends = [keep.tuning.path] if keep.tuning.path else ([] if keep.tuning.measured else None)
    fused, report = fuse(model, patterns, kernels, keep=keep,
                         precision=config_entry(sess_options, PRECISION_OPTION) or None)  # opt-in: kernels.registry
    if keep is not None:
        keep.tuning.annotate(report)
    if stale:
        report.notes.append(f"{_STALE_NOTE}: ortfuse_graph_digest does not match this graph; matched again")
    if not report.applied:
        if auto and report.matches:
            report.reason = "fusion='auto': no fusion was measured to beat ORT on this machine; stock ORT"
        return None, report, depends
    data = fused.SerializeToString()
    if len(data) > _PROTOBUF_LIMIT:
        report = _stepped_aside("the fused model would exceed protobuf's 2 GiB limit; ORT loads the original",
                                fusion, stacklevel=5, patterns=report.patterns, matches=report.matches,
                                notes=report.notes)
        return None, report, None
    needs_custom_ops = any(n.domain == DOMAIN for n in fused.graph.node)
    plan = _Plan(data, report, set(report.disabled_ort_optimizers), needs_custom_ops,
                 frozenset(native_op_types(fused)), reference_op_inputs(fused))
    return plan, report, depends


def _auto_rule(model: onnx.ModelProto, patterns, sess_options):
    """The ``fuse(keep=...)`` rule of ``fusion="auto"``: the tuner's decisions for this model on this
    machine (cached, else measured now unless ``ORTFUSE_TUNE=off``); unmeasured matches stay unfused."""
    from ortfuse.tune import tuner as tune

    tuning = tune.tune(model, patterns, sess_options)
    rule = tuning.keep_rule()
    rule.tuning = tuning
    return rule


class InferenceSession(_ort.InferenceSession):
    """Drop-in for ``onnxruntime.InferenceSession`` that applies ortfuse's fusions.

    ``fusion_report`` (a :class:`~ortfuse.fusion.report.FusionReport`) says what was fused and why not.
    """

    def __init__(
        self,
        path_or_bytes,
        sess_options=None,
        providers=None,
        provider_options=None,
        *,
        fusion=None,
        fusion_patterns=None,
        **kwargs,
    ) -> None:
        if not _valid_fusion_value(fusion):
            raise ValueError(f"fusion must be None, False, True or 'auto', got {fusion!r}.")
        onnx = sys.modules.get("onnx")  # a ModelProto argument means onnx is imported already
        if onnx is not None and isinstance(path_or_bytes, onnx.ModelProto):
            path_or_bytes = path_or_bytes.SerializeToString()
        elif isinstance(path_or_bytes, os.PathLike):
            path_or_bytes = os.fspath(path_or_bytes)
        self.fusion = fusion
        self._ortfuse_disabled_optimizers: set[str] = set()
        # tensors read by reference (Python-op) kernels, None when there are none: runs then need
        # _run_guarded, and with ORT's parallel executor they are shared runs (python_ops.begin_run)
        self._ortfuse_reference_inputs: frozenset | None = None
        source = path_or_bytes
        plan = None
        provider_problem = _provider_problem(providers, sess_options) if fusion is not False else ""
        if provider_problem:
            self.fusion_report = _stepped_aside(provider_problem, fusion, stacklevel=3)
        elif isinstance(path_or_bytes, (str, bytes)):
            plan, self.fusion_report = _plan_fusion(path_or_bytes, sess_options, fusion, fusion_patterns)
        else:  # ORT raises its own TypeError for this input
            self.fusion_report = FusionReport(reason=f"unsupported input type {type(path_or_bytes).__name__}")
        if plan is not None:
            source = plan.source
            self._ortfuse_disabled_optimizers = plan.disabled_optimizers
            if plan.needs_custom_ops:
                sess_options, why_not = with_custom_ops(sess_options, plan.native_ops,
                                                        python_ops=plan.reference_inputs is not None)
                if why_not:  # native path unavailable: the same fusions on kernels that need no native op
                    from ortfuse.kernels.registry import LOWERED_ONLY, NO_NATIVE

                    # options registered before without these ops: rather than the slow reference
                    # kernels, only lowered fusions (ORT's own ops); the other matches stay as ORT runs them
                    reused = why_not.startswith(REUSED_OPTIONS)
                    warn_native_fallback(why_not, reused)
                    plan, self.fusion_report = _plan_fusion(path_or_bytes, sess_options, fusion, fusion_patterns,
                                                            kernels=LOWERED_ONLY if reused else NO_NATIVE)
                    self.fusion_report.notes.append(
                        f"native kernels unavailable ({why_not}); "
                        + ("only fusions lowered to ORT's own ops applied" if reused
                           else "lowered or reference kernels used"))
                    source = plan.source if plan is not None else path_or_bytes
                    if plan is not None and plan.needs_custom_ops:
                        sess_options, _ = with_custom_ops(sess_options, frozenset())
            if plan is not None:
                self._ortfuse_reference_inputs = plan.reference_inputs
        try:
            super().__init__(source, sess_options, providers, provider_options, **kwargs)
        except Exception as exc:
            if plan is not None and isinstance(source, str) and source != path_or_bytes and source in str(exc):
                # ORT names the file it loaded (the fused copy in ortfuse's plan cache): name the caller's
                given = path_or_bytes if isinstance(path_or_bytes, str) else "the model bytes"
                raise type(exc)(str(exc).replace(source, f"{given} (fused by ortfuse into {source})")) from exc
            # fusion=False does not parse the model; one saved already fused still needs our ops.
            if plan is not None or f"{DOMAIN}:Fused" not in str(exc):
                raise
            self.fusion_report = FusionReport(reason="model was saved already fused; its fused ops were registered")
            native_ops, self._ortfuse_reference_inputs = _saved_fused_ops(source, sess_options)
            sess_options = with_custom_ops(sess_options, native_ops, self._ortfuse_reference_inputs is not None)[0]
            super().__init__(source, sess_options, providers, provider_options, **kwargs)
        self._ortfuse_parallel = (self._ortfuse_reference_inputs is not None and sess_options is not None
                                  and sess_options.execution_mode == _ort.ExecutionMode.ORT_PARALLEL)

    # A reference (Python-op) kernel cannot fail a run by itself (an exception there aborts the
    # process, custom_ops/python_ops.py): during a run it stops ORT through the RunOptions, and the
    # error is raised here as ORT raises a failed node's. Sessions without reference kernels run
    # exactly as ORT's (native kernels return ORT error statuses themselves).
    def run(self, output_names, input_feed, run_options=None):
        if getattr(self, "_ortfuse_reference_inputs", None) is None:
            return super().run(output_names, input_feed, run_options)
        if isinstance(input_feed, dict):
            refuse_missing_inputs(input_feed, self._ortfuse_reference_inputs)
        return self._run_guarded(super().run, run_options, output_names, input_feed)

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        if getattr(self, "_ortfuse_reference_inputs", None) is None:
            return super().run_with_ort_values(output_names, input_dict_ort_values, run_options)
        return self._run_guarded(super().run_with_ort_values, run_options, output_names, input_dict_ort_values)

    def run_with_iobinding(self, iobinding, run_options=None):
        if getattr(self, "_ortfuse_reference_inputs", None) is None:
            return super().run_with_iobinding(iobinding, run_options)
        return self._run_guarded(super().run_with_iobinding, run_options, iobinding)

    def run_async(self, output_names, input_feed, callback, user_data, run_options=None):
        """With reference kernels, the run is a shared guarded run (one at a time per process; a
        call waits for the one in flight): a failing reference kernel stops it, and the callback
        gets ``([], user_data, message)`` as for any failed run."""
        if getattr(self, "_ortfuse_reference_inputs", None) is None:
            return super().run_async(output_names, input_feed, callback, user_data, run_options)
        from ortfuse.custom_ops.python_ops import begin_run, end_run

        options = run_options if run_options is not None else _ort.RunOptions()
        run = begin_run(options, shared=True, on_this_thread=False)

        def finish(outputs, data, err):
            end_run(run)
            if run.error is not None:
                callback([], data, status_message(run.exception()))
            else:
                callback(outputs, data, err)

        try:
            return super().run_async(output_names, input_feed, finish, user_data, options)
        except BaseException:  # refused before it started (ORT raises these in the caller's thread)
            end_run(run)
            raise

    def _run_guarded(self, call, run_options, *args):
        return run_guarded(call, run_options, self._ortfuse_parallel, *args)

    def _create_inference_session(self, providers, provider_options, disabled_optimizers=None):
        merged = set(disabled_optimizers or ()) | self._ortfuse_disabled_optimizers
        super()._create_inference_session(providers, provider_options, merged or disabled_optimizers)


def _saved_fused_ops(source, sess_options) -> tuple[frozenset, frozenset | None]:
    """The native fused op types of a model saved already fused (they must be added before the
    library is registered) and the tensors its reference kernels read (None: it has none).
    When onnx cannot read it: no native ops, and every run guarded (which inputs reference kernels
    read is then unknown, so a None feed is left to ORT)."""
    from ortfuse.fusion.provenance import native_op_types, reference_op_inputs

    model, _ = _load_for_fusion(source, sess_options) if isinstance(source, (str, bytes)) else (None, "")
    if model is None:
        return frozenset(), frozenset()
    return frozenset(native_op_types(model)), reference_op_inputs(model)
