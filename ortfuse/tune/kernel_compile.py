"""Compiling the native kernels a fused model needs, in a child process that can be stopped
(docs/ARCHITECTURE.md §7).

numba's compiler runs for seconds to minutes in long C calls a thread cannot be paused in; a live
tuning must not take the cores from served runs meanwhile. ``compile_kernels(fused, on_start=...)``
runs ``python -m ortfuse.tune.kernel_compile MODEL`` (this module, as a ``foundation.child_process``),
which opens an ORT session on the model with ortfuse's ops registered, so numba compiles the kernels
into its cache on disk (the process that asked then loads them from there); ``on_start(process)``
hands the ``subprocess.Popen`` to the caller, which stops it (SIGSTOP) while a served run is in
flight and continues it (SIGCONT) when none is. On a platform without ``SIGSTOP``, or when the child
fails, the kernels are compiled in this process instead (``compile_here``). Never raises: a failure
is left for measuring to report.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from ortfuse.foundation import child_process


def needs_kernels(fused) -> bool:
    """Whether ``fused`` (a model ``fuse`` rewrote) holds ortfuse's ops."""
    from ortfuse.custom_ops.specs import DOMAIN

    return any(n.domain == DOMAIN for n in fused.graph.node)


def compile_here(fused) -> None:
    """Open an ORT session on ``fused`` with ortfuse's ops registered, in this process."""
    import onnxruntime as ort

    from ortfuse.fusion.provenance import native_op_types, reference_op_inputs
    from ortfuse.kernel_choice.op_registration import with_custom_ops

    if not needs_kernels(fused):
        return
    options, why_not = with_custom_ops(None, frozenset(native_op_types(fused)),
                                       python_ops=reference_op_inputs(fused) is not None)
    if not why_not:
        with contextlib.suppress(Exception):
            ort.InferenceSession(fused.SerializeToString(), options, providers=["CPUExecutionProvider"])


def compile_kernels(fused, on_start: Callable[[subprocess.Popen | None], None] = lambda p: None,
                    stopped: Callable[[], bool] = lambda: False, timeout_s: float = 600.0) -> str:
    """The kernels of ``fused`` compiled into numba's disk cache by a child process; returns "" or
    why it fell back to compiling here. ``on_start(process)`` is called with the child once it runs
    and with None once it has ended; ``stopped()`` ends the wait (the child is killed)."""
    if not needs_kernels(fused):
        return ""
    if not child_process.stoppable():
        compile_here(fused)
        return "no SIGSTOP on this platform: compiled in this process"
    with tempfile.TemporaryDirectory(prefix="ortfuse-compile-") as folder:
        path = os.path.join(folder, "fused.onnx")
        with open(path, "wb") as fh:
            fh.write(fused.SerializeToString())
        try:
            child = child_process.start("ortfuse.tune.kernel_compile", [path], folder, subprocess.PIPE)
        except OSError as exc:
            compile_here(fused)
            return f"the compiling process did not start ({exc}): compiled in this process"
        deadline = time.monotonic() + timeout_s
        try:
            child_process.supervise(child, folder, on_start, lambda: stopped() or time.monotonic() >= deadline)
        finally:
            _, err = child.communicate()
    if child.returncode != 0 and not stopped():
        compile_here(fused)
        last = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
        return f"the compiling process failed ({last[0] if last else child.returncode}): compiled in this process"
    return ""


def main(argv: list[str]) -> int:
    import onnx

    child_process.background_priority()  # a process of its own: it holds no lock the server waits for
    compile_here(onnx.load(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
