"""The reference execution path: every fused op's numpy reference registered as an
onnxruntime-extensions Python op (``<Name>Ref`` in ``ai.onnx.contrib``).

onnxruntime-extensions' default invocation hook converts every output to a Python list
(``tolist()``); ours returns contiguous numpy arrays, 30-55x faster (DESIGN.md §4). It keeps the
stock behaviour for Python ops that are not ours.

An exception that escapes the hook kills the process: onnxruntime-extensions' Python-op kernel lets
the C++ exception leave ``Compute`` (``terminate called after throwing pybind11::error_already_set``).
So when one of our references fails (a run-time shape that does not broadcast, say) while a run
started by ``ortfuse.InferenceSession`` is active on this thread (``reference_run``), the hook
records the error, sets that run's ``RunOptions.terminate`` (ORT stops before the next node), and
returns an empty output; the session then raises the error. ORT's parallel executor runs nodes on
its inter-op threads, where no run is active: sessions using it take ``shared`` runs, one at a time
per process, which the hook falls back to. (``run_async`` is a guarded run on a thread of ours,
``ortfuse.session``.) Without any such run, the error propagates as before.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from ortfuse.custom_ops.specs import SPECS

_lock = threading.Lock()
_registered = False


def _array_hook(k_id, feed, attributes):
    from onnxruntime_extensions._ocos import Opdef

    op = Opdef._odlist.get(k_id)
    if op is None:
        raise RuntimeError(f"ortfuse: no Python op with id {k_id} is registered.")
    try:
        result = op.body(*feed, **op.cast_attributes(attributes))
    except Exception as exc:
        run = getattr(_local, "run", None) or _shared_run[0]
        if run is None or run.error is not None or op.op_type not in _OUR_OPS:
            raise  # nobody to hand the error to: extensions aborts the process
        run.error = (op.op_type, exc)
        run.options.terminate = True  # ORT stops before the next node
        return (k_id, (0,), np.zeros(0, np.float32))  # our ops have one float output
    outputs = result if isinstance(result, tuple) else (result,)
    flat = []
    for out in outputs:
        arr = np.asarray(out)  # ascontiguousarray would turn a rank-0 result into shape (1,)
        flat.extend((arr.shape, np.ascontiguousarray(arr).reshape(-1)))
    return (k_id, *flat)


_OUR_OPS = frozenset(spec.ref_op_type for spec in SPECS.values())
_local = threading.local()
_shared_run: list = [None]  # the run of a parallel-executor session, see reference_run(shared=True)
_shared_lock = threading.Lock()


class ReferenceRun:
    """One run on this thread: its RunOptions and the first reference-kernel error, if any."""

    def __init__(self, options) -> None:
        self.options = options
        self.error: tuple[str, BaseException] | None = None

    def exception(self) -> Exception:
        """The error as ORT reports a failed node: its ``Fail`` exception."""
        op_type, exc = self.error
        return fail(f"Non-zero status code returned while running {op_type} node (ortfuse reference kernel). "
                    f"Status Message: {type(exc).__name__}: {exc}")


def fail(message: str) -> Exception:
    """ORT's ``Fail`` exception (the class of a failed node) with ORT's message prefix."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    return Fail(f"[ONNXRuntimeError] : 1 : FAIL : {message}")


@contextlib.contextmanager
def reference_run(options, shared: bool = False):
    """Make reference-kernel errors of the run on this thread stop it through ``options.terminate``.

    ``shared``: the run's kernels may run on other threads (ORT's parallel executor); such runs are
    serialised process-wide so that an error on any thread belongs to the one shared run."""
    previous = getattr(_local, "run", None)
    run = _local.run = ReferenceRun(options)
    if shared:
        _shared_lock.acquire()
        _shared_run[0] = run
    try:
        yield run
    finally:
        if shared:
            _shared_run[0] = None
            _shared_lock.release()
        _local.run = previous


def register_python_ops() -> None:
    """Define every fused op's reference as a Python op, once per process (before any session)."""
    global _registered
    with _lock:
        if _registered:
            return
        from onnxruntime_extensions import PyCustomOpDef, onnx_op

        kinds = {int: PyCustomOpDef.dt_int64, float: PyCustomOpDef.dt_float, str: PyCustomOpDef.dt_string}
        for spec in SPECS.values():
            attrs = {name: kinds[t] for name, t in spec.all_attrs().items()}
            body = _without_provenance(spec.reference)
            onnx_op(op_type=spec.ref_op_type, inputs=[PyCustomOpDef.dt_float] * len(spec.inputs),
                    outputs=[PyCustomOpDef.dt_float], attrs=attrs)(body)
        PyCustomOpDef.install_hooker(_array_hook)
        _registered = True


def _without_provenance(fn):
    def body(*inputs, pattern_id="", replaced_nodes="", **attrs):
        return np.asarray(fn(*inputs, **attrs), dtype=np.float32)

    return body
