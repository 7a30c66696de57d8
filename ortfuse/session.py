"""``ortfuse.InferenceSession``: ORT's session with ``fusion=`` and ``fusion_patterns=`` on top.

Contract (planning itself: ``ortfuse.runtime.planning``):
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
- The caller's ``SessionOptions`` are not modified: a fused session runs on a copy carrying ortfuse's
  ops (``ortfuse.runtime.options_copy``); options of ``onnxruntime.SessionOptions`` itself, which
  cannot be copied exactly, get the ops registered on them, and the report says so.
- Fused ops run native kernels where the registry has one for this CPU, else the numpy reference;
  if the native path cannot be registered, the reference is used with one warning.
- ``plan=`` (keyword-only; or the config entry ``ortfuse.plan``, ``$ORTFUSE_PLAN``): a plan file made
  by ``ortfuse tune MODEL --export PLAN`` that a ``fusion="auto"`` session installs and serves fused
  from its first run when it is valid here (``ortfuse.runtime.plan_artifact``); else it warns why.
- ``fusion="auto"`` (argument or metadata) is created wherever stock ORT creates the model; by
  default it serves at once with the best plan known on this machine and tunes on live traffic
  (``ortfuse.runtime.live_tuning``: ``wait_tuned``, ``fusion_status``, ``tune_with``).
"""

from __future__ import annotations

import os
import sys
import warnings

import onnxruntime as _ort

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.catalogue import UnknownPatternError
from ortfuse.fusion.report import FusionReport
from ortfuse.ir.metadata import MetadataError
from ortfuse.kernel_choice.reference_runs import refuse_missing_inputs, run_guarded, status_message
from ortfuse.runtime.live_tuning import LiveTuning, status_of
from ortfuse.runtime.options_copy import with_fused_ops
from ortfuse.runtime.planning import Prepared, prepare, saved_fused_ops, stepped_aside
from ortfuse.runtime.served_runs import accept_ortvalues, bound_elsewhere

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


def _use_plan_file(given, source, sess_options, fusion_patterns):
    """Install the plan file a ``fusion="auto"`` session is given (``plan=``, else the config entry
    or environment variable) into the plan cache when it is valid here (``plan_artifact.use``), else
    the one a shared plan store holds (``shared_plans``); (the note for its report ("" when none is
    given), warned when the file is not used; the session's ``SharedPlan`` when a store is named and
    holds no plan for it yet, else None)."""
    from ortfuse.runtime import plan_artifact, shared_plans  # auto sessions only: import ortfuse stays cheap

    path = plan_artifact.configured(sess_options, given)
    if path is None:
        try:
            store = shared_plans.configured(sess_options)
        except OSError as exc:
            note = f"plan store not used: its folder cannot be made ({exc.strerror}: {exc.filename}); tuned here"
            warnings.warn(f"ortfuse: {note}", stacklevel=3)
            return note, None
        if store is None:
            return "", None
        shared = shared_plans.SharedPlan(store, source, sess_options, fusion_patterns)
        used, note = shared.install_published()
        if note and not used:
            warnings.warn(f"ortfuse: {note}", stacklevel=3)
        return note, None if used else shared
    used, note = plan_artifact.use(path, source, sess_options, fusion_patterns)
    if not used:
        warnings.warn(f"ortfuse: {note}", stacklevel=3)
    return note, None


_ORT_RUN = _ort.InferenceSession.run


class InferenceSession(_ort.InferenceSession):
    """Drop-in for ``onnxruntime.InferenceSession`` that applies ortfuse's fusions.

    ``fusion_report`` (a :class:`~ortfuse.fusion.report.FusionReport`) says what was fused and why not.
    """

    _ortfuse_reference_inputs = None  # set when the plan has reference (Python-op) kernels: guarded runs
    _ortfuse_live = None  # fusion="auto": the session's LiveTuning (status, wait, tune_with)
    _ortfuse_counting = None  # its live tuning's ServedRuns while runs must be counted, else None (ORT's run)
    _ortfuse_swapped = False  # a live tuning swapped another C session in

    def __init__(
        self,
        path_or_bytes,
        sess_options=None,
        providers=None,
        provider_options=None,
        *,
        fusion=None,
        fusion_patterns=None,
        plan=None,
        **kwargs,
    ) -> None:
        if not _valid_fusion_value(fusion):
            raise ValueError(f"fusion must be None, False, True or 'auto', got {fusion!r}.")
        if plan is not None and fusion != "auto":
            raise ValueError(f"plan= is used by fusion='auto' sessions only, got fusion={fusion!r}; "
                             "pass fusion='auto' with it.")
        given_plan = plan  # the name is the plan's below
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
        self._ortfuse_live: LiveTuning | None = None
        source, user_options, prepared, shared = path_or_bytes, sess_options, None, None
        plan = None
        provider_problem = _provider_problem(providers, sess_options) if fusion is not False else ""
        if provider_problem:
            self.fusion_report = stepped_aside(provider_problem, fusion, stacklevel=3)
        elif isinstance(path_or_bytes, (str, bytes)):
            try:
                plan_note, shared = _use_plan_file(given_plan, path_or_bytes, sess_options, fusion_patterns) \
                    if fusion == "auto" else ("", None)
                prepared = prepare(path_or_bytes, sess_options, fusion, fusion_patterns)
                prepared.report.notes += [plan_note] if plan_note else []
            except (UnknownPatternError, MetadataError):
                raise  # a bad fusion request is the caller's to fix
            except Exception as exc:
                if fusion != "auto":
                    raise
                # auto is created wherever stock ORT creates the model: planning's failure leaves it to ORT
                prepared = Prepared(path_or_bytes, sess_options, stepped_aside(
                    f"planning the fusion failed ({type(exc).__name__}: {exc}); stock ORT", fusion, stacklevel=3),
                    auto=True)
            plan, self.fusion_report, source = prepared.plan, prepared.report, prepared.source
            sess_options = prepared.sess_options
            self._ortfuse_disabled_optimizers = prepared.disabled_optimizers
            self._ortfuse_reference_inputs = prepared.reference_inputs
        else:  # ORT raises its own TypeError for this input
            self.fusion_report = FusionReport(reason=f"unsupported input type {type(path_or_bytes).__name__}")
        try:
            super().__init__(source, sess_options, providers, provider_options, **kwargs)
        except Exception as exc:
            if plan is not None and prepared is not None and prepared.auto:
                # auto is created wherever stock ORT creates the model: the original, as ORT loads it
                self.fusion_report = stepped_aside(f"ORT could not create the fused plan ({exc}); stock ORT",
                                                   fusion, stacklevel=3, patterns=self.fusion_report.patterns)
                plan, source, sess_options = None, path_or_bytes, user_options
                self._ortfuse_disabled_optimizers, self._ortfuse_reference_inputs = set(), None
                super().__init__(source, sess_options, providers, provider_options, **kwargs)
            elif plan is not None and isinstance(source, str) and source != path_or_bytes and source in str(exc):
                # ORT names the file it loaded (the fused copy in ortfuse's plan cache): name the caller's
                given = path_or_bytes if isinstance(path_or_bytes, str) else "the model bytes"
                raise type(exc)(str(exc).replace(source, f"{given} (fused by ortfuse into {source})")) from exc
            # fusion=False does not parse the model; one saved already fused still needs our ops.
            elif plan is not None or f"{DOMAIN}:Fused" not in str(exc):
                raise
            else:
                self.fusion_report = FusionReport(reason="model was saved already fused; its fused ops were registered")
                native_ops, self._ortfuse_reference_inputs = saved_fused_ops(source, sess_options)
                sess_options, _, note = with_fused_ops(sess_options, native_ops,
                                                       self._ortfuse_reference_inputs is not None)
                self.fusion_report.notes += [note] if note else []
                super().__init__(source, sess_options, providers, provider_options, **kwargs)
        self._ortfuse_parallel = (self._ortfuse_reference_inputs is not None and sess_options is not None
                                  and sess_options.execution_mode == _ort.ExecutionMode.ORT_PARALLEL)
        if prepared is not None and prepared.auto:
            self._ortfuse_live = LiveTuning(self, prepared, path_or_bytes, user_options, fusion, fusion_patterns,
                                            kwargs.get("disabled_optimizers"))
            if shared is not None and self._ortfuse_live.recording:  # tuned once per plan store
                shared.follow(self, self._ortfuse_live)

    @property
    def fusion_status(self) -> str:
        """One line: what the session runs now and, under ``fusion="auto"``, where tuning stands."""
        live = getattr(self, "_ortfuse_live", None)
        return live.status if live is not None else status_of(self.fusion_report)

    def wait_tuned(self, timeout: float | None = None) -> bool:
        """Block until ``fusion="auto"`` tuning has ended (True; also when there is nothing to tune),
        or ``timeout`` seconds have passed (False)."""
        live = getattr(self, "_ortfuse_live", None)
        return True if live is None else live.wait(timeout)

    @property
    def time_to_plan(self) -> dict | None:
        """Once a ``fusion="auto"`` tuning has ended: the plan it left in effect (``plan``: "fused"
        or "stock"), the runs served before that plan took effect (``served_runs``), the seconds
        from the first served run to then (``seconds``), the tuning's own wall and CPU seconds
        (``tuning_s``, ``child_cpu_s``: its process's). None before, and for other sessions."""
        live = getattr(self, "_ortfuse_live", None)
        reached = live.time_to_plan if live is not None else None
        return dict(reached) if reached is not None else None

    def tune_with(self, feeds_list) -> None:
        """Tune this ``fusion="auto"`` session on ``feeds_list`` (representative input dicts), in the
        background, then swap to the faster plan; ``wait_tuned()`` waits for it."""
        live = getattr(self, "_ortfuse_live", None)
        if live is None:
            raise ValueError("tune_with needs a session with fusion='auto' (argument or model metadata)")
        live.tune_with(feeds_list)

    def io_binding(self):
        binding = super().io_binding()
        binding._ortfuse_owner = self  # after a swap it keeps running on the C session it was made on
        return binding

    def create_ortvalue_from_shape_and_type(self, *args, **kwargs):
        value = super().create_ortvalue_from_shape_and_type(*args, **kwargs)
        value._ortfuse_owner = self  # CPU memory: accepted by the C session swapped in later
        return value

    def _validate_ortvalue_ownership(self, values):
        if not self._ortfuse_swapped:  # every OrtValue was made for this C session: ORT's check as it is
            return super()._validate_ortvalue_ownership(values)
        return super()._validate_ortvalue_ownership(accept_ortvalues(self, values))

    # A reference (Python-op) kernel cannot fail a run by itself (an exception there aborts the
    # process, custom_ops/python_ops.py): during a run it stops ORT through the RunOptions, and the
    # error is raised here as ORT raises a failed node's. Sessions without reference kernels run
    # exactly as ORT's (native kernels return ORT error statuses themselves).
    # Under live tuning every run is counted in flight (tuning pauses meanwhile; a replaced C session
    # is released only when none is) and the first feeds are recorded (ortfuse.runtime.served_runs).
    def run(self, output_names, input_feed, run_options=None):
        live = self._ortfuse_counting
        if live is None:
            if self._ortfuse_reference_inputs is None:  # the hot path: ORT's run and nothing else
                return _ORT_RUN(self, output_names, input_feed, run_options)
            return self._ortfuse_run(output_names, input_feed, run_options)
        if self._ortfuse_reference_inputs is None:
            return live.counted(input_feed, _ORT_RUN, self, output_names, input_feed, run_options)
        return live.counted(input_feed, self._ortfuse_run, output_names, input_feed, run_options)

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        live = self._ortfuse_counting
        if live is None:
            return self._ortfuse_run_with_ort_values(output_names, input_dict_ort_values, run_options)
        return live.counted(input_dict_ort_values, self._ortfuse_run_with_ort_values, output_names,
                            input_dict_ort_values, run_options)

    def run_with_iobinding(self, iobinding, run_options=None):
        live = self._ortfuse_live
        if live is None:
            return self._ortfuse_run_with_iobinding(iobinding, run_options)
        before = bound_elsewhere(self, iobinding)
        counting = self._ortfuse_counting
        if before is not None:  # made before a swap: runs on the C session (plan) it was made on
            if counting is None:
                return before.run_with_iobinding(iobinding._iobinding, run_options)
            return counting.counted(None, before.run_with_iobinding, iobinding._iobinding, run_options)
        if counting is None:
            return self._ortfuse_run_with_iobinding(iobinding, run_options)
        return counting.counted(None, self._ortfuse_run_with_iobinding, iobinding, run_options)

    def run_async(self, output_names, input_feed, callback, user_data, run_options=None):
        """As ORT's; see ``_ortfuse_run_async`` for sessions with reference kernels."""
        live = self._ortfuse_counting
        if live is None:
            return self._ortfuse_run_async(output_names, input_feed, callback, user_data, run_options)
        return live.counted_async(input_feed, callback, lambda finish: self._ortfuse_run_async(
            output_names, input_feed, finish, user_data, run_options))

    def _ortfuse_run(self, output_names, input_feed, run_options=None):
        if getattr(self, "_ortfuse_reference_inputs", None) is None:
            return super().run(output_names, input_feed, run_options)
        if isinstance(input_feed, dict):
            refuse_missing_inputs(input_feed, self._ortfuse_reference_inputs)
        return self._run_guarded(super().run, run_options, output_names, input_feed)

    def _ortfuse_run_with_ort_values(self, output_names, input_dict_ort_values, run_options=None):
        if getattr(self, "_ortfuse_reference_inputs", None) is None:
            return super().run_with_ort_values(output_names, input_dict_ort_values, run_options)
        return self._run_guarded(super().run_with_ort_values, run_options, output_names, input_dict_ort_values)

    def _ortfuse_run_with_iobinding(self, iobinding, run_options=None):
        if getattr(self, "_ortfuse_reference_inputs", None) is None:
            return super().run_with_iobinding(iobinding, run_options)
        return self._run_guarded(super().run_with_iobinding, run_options, iobinding)

    def _ortfuse_run_async(self, output_names, input_feed, callback, user_data, run_options=None):
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
