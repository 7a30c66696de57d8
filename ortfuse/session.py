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
- Fused ops run native kernels where the registry has one for this CPU, else the numpy reference;
  if the native path cannot be registered, the reference is used with one warning.
"""

from __future__ import annotations

import os
import sys

import onnxruntime as _ort

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.report import FusionReport
from ortfuse.runtime.op_registration import REUSED_OPTIONS, warn_native_fallback, with_custom_ops
from ortfuse.runtime.planning import plan_fusion, saved_fused_ops, stepped_aside
from ortfuse.runtime.reference_runs import refuse_missing_inputs, run_guarded, status_message

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
            self.fusion_report = stepped_aside(provider_problem, fusion, stacklevel=3)
        elif isinstance(path_or_bytes, (str, bytes)):
            plan, self.fusion_report = plan_fusion(path_or_bytes, sess_options, fusion, fusion_patterns)
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
                    plan, self.fusion_report = plan_fusion(path_or_bytes, sess_options, fusion, fusion_patterns,
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
            native_ops, self._ortfuse_reference_inputs = saved_fused_ops(source, sess_options)
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
