"""The reference execution path: each fused op's numpy reference registered as an
onnxruntime-extensions Python op (``<Name>Ref`` in ``ai.onnx.contrib``).

onnxruntime-extensions' default invocation hook converts every output to a Python list
(``tolist()``); ours returns contiguous numpy arrays (the faster path, docs/ARCHITECTURE.md §6). It
keeps the stock behaviour for Python ops that are not ours. The specs to register come from the
caller (``ortfuse.fusion.catalogue.SPECS``): this package does not know the fusion rules.

An exception that escapes the hook kills the process: onnxruntime-extensions' Python-op kernel lets
the C++ exception leave ``Compute`` (``terminate called after throwing pybind11::error_already_set``).
So when one of our references fails (a run-time shape that does not broadcast, say) while a run
started by ``ortfuse.InferenceSession`` is active on this thread (``reference_run``), the hook
records the error, sets that run's ``RunOptions.terminate`` (ORT stops before the next node), and
returns an empty output; the session then raises the error. ORT's parallel executor runs nodes on
its inter-op threads and ``run_async`` on an intra-op pool thread, where no run is active on the
thread: such runs are ``shared``, one at a time per process, and the hook falls back to the shared
run. Without any run, the error propagates as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable

import numpy as np

from ortfuse.custom_ops.specs import OpSpec

_lock = threading.Lock()
_hook_installed = False
_OUR_OPS: set[str] = set()  # the ``<Name>Ref`` op types defined by ``register_python_ops``


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


_local = threading.local()
_shared_run: list = [None]  # the run of a parallel-executor session, see reference_run(shared=True)
_shared_lock = threading.Lock()


class ReferenceRun:
    """One run on this thread: its RunOptions and the first reference-kernel error, if any."""

    def __init__(self, options) -> None:
        self.options = options
        self.error: tuple[str, BaseException] | None = None
        self.previous: ReferenceRun | None = None
        self.shared = self.on_this_thread = self.ended = False

    def exception(self) -> Exception:
        """The error as ORT reports a failed node: its ``Fail`` exception."""
        op_type, exc = self.error
        return fail(f"Non-zero status code returned while running {op_type} node (ortfuse reference kernel). "
                    f"Status Message: {type(exc).__name__}: {exc}")


def fail(message: str) -> Exception:
    """ORT's ``Fail`` exception (the class of a failed node) with ORT's message prefix."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    return Fail(f"[ONNXRuntimeError] : 1 : FAIL : {message}")


def begin_run(options, shared: bool = False, on_this_thread: bool = True) -> ReferenceRun:
    """Start a run whose reference-kernel errors stop it through ``options.terminate``.

    ``on_this_thread``: the run's kernels may run on the calling thread (every executor but run_async).
    ``shared``: they may run on other threads (ORT's parallel executor, run_async's pool thread); such
    runs are serialised process-wide so that an error on any thread belongs to the one shared run.
    Every run begun is ended with ``end_run`` (from any thread)."""
    run = ReferenceRun(options)
    if on_this_thread:
        run.previous = getattr(_local, "run", None)
        _local.run = run
    if shared:
        _shared_lock.acquire()
        _shared_run[0] = run
    run.shared, run.on_this_thread = shared, on_this_thread
    return run


def end_run(run: ReferenceRun) -> None:
    """End ``run`` (once; a second call does nothing) and reset its RunOptions' terminate flag."""
    if run.ended:
        return
    run.ended = True
    if run.error is not None:
        run.options.terminate = False  # the caller's RunOptions stay usable
    if run.shared:
        _shared_run[0] = None
        _shared_lock.release()
    if run.on_this_thread:
        _local.run = run.previous


@contextlib.contextmanager
def reference_run(options, shared: bool = False):
    """``begin_run`` .. ``end_run`` around a run made on this thread."""
    run = begin_run(options, shared)
    try:
        yield run
    finally:
        end_run(run)


def register_python_ops(specs: Iterable[OpSpec]) -> None:
    """Define each spec's reference as the Python op ``<Name>Ref`` (once per op type and process,
    before any session that uses it), and install the array-returning hook once."""
    global _hook_installed
    with _lock:
        todo = [spec for spec in specs if spec.ref_op_type not in _OUR_OPS]
        if not todo and _hook_installed:
            return
        from onnxruntime_extensions import PyCustomOpDef, onnx_op

        kinds = {int: PyCustomOpDef.dt_int64, float: PyCustomOpDef.dt_float, str: PyCustomOpDef.dt_string}
        for spec in todo:
            attrs = {name: kinds[t] for name, t in spec.all_attrs().items()}
            body = _without_provenance(spec.reference)
            onnx_op(op_type=spec.ref_op_type, inputs=[PyCustomOpDef.dt_int64 if n in spec.int64_inputs
                                                          else PyCustomOpDef.dt_float for n in spec.inputs],
                    outputs=[PyCustomOpDef.dt_float], attrs=attrs)(body)
            _OUR_OPS.add(spec.ref_op_type)
        if not _hook_installed:
            PyCustomOpDef.install_hooker(_array_hook)
            _hook_installed = True


def _without_provenance(fn):
    def body(*inputs, pattern_id="", replaced_nodes="", **attrs):
        return np.asarray(fn(*inputs, **attrs), dtype=np.float32)

    return body
