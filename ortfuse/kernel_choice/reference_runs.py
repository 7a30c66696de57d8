"""Runs of a model that holds reference (Python-op) kernels: a failing reference kernel stops the run
and its error is raised as ORT raises a failed node's (custom_ops/python_ops.py says why it must)."""

from __future__ import annotations

import re

_ORT_STATUS_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")


def run_guarded(call, run_options, shared: bool, *args):
    """``call(*args, options)`` inside a reference run: ``options`` is ``run_options`` or new
    RunOptions; ``shared`` for ORT's parallel executor (the run is then one at a time per process)."""
    import onnxruntime as ort

    from ortfuse.custom_ops.python_ops import reference_run

    options = run_options if run_options is not None else ort.RunOptions()
    with reference_run(options, shared=shared) as run:
        try:
            result = call(*args, options)
        except Exception:
            if run.error is None:
                raise
    if run.error is not None:
        raise run.exception() from run.error[1]
    return result


def refuse_missing_inputs(input_feed: dict, reference_inputs: frozenset) -> None:
    """An input fed as None makes the node reading it fail (ORT: Fail, "Missing Input"); a reference
    kernel's Python-op wrapper would abort the process instead, so raise ORT's error."""
    from ortfuse.custom_ops.python_ops import fail

    for name, value in input_feed.items():
        if value is None and name in reference_inputs:
            raise fail(f"Missing Input: {name} (fed None to an ortfuse reference kernel)")


def status_message(exc: Exception) -> str:
    """The text ORT hands a ``run_async`` callback for a failed run: the status message, without
    the ``[ONNXRuntimeError] : code : NAME :`` prefix its Python exceptions add."""
    return _ORT_STATUS_PREFIX.sub("", str(exc))
