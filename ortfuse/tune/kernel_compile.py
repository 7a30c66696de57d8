"""Compiling the native kernels a fused model needs, in a child process that can be stopped
(docs/ARCHITECTURE.md §7).

numba's compiler runs for seconds to minutes in long C calls a thread cannot be paused in; a live
tuning must not take the cores from served runs meanwhile. ``compile_kernels(fused, on_start=...)``
runs ``python -m ortfuse.tune.kernel_compile MODEL`` (this module), which opens an ORT session on the
model with ortfuse's ops registered, so numba compiles the kernels into its cache on disk (the
process that asked then loads them from there); ``on_start(process)`` hands the ``subprocess.Popen``
to the caller, which stops it (SIGSTOP) while a served run is in flight and continues it (SIGCONT)
when none is. On a platform without ``SIGSTOP``, or when the child fails, the kernels are compiled in
this process instead (``compile_here``). Never raises: a failure
is left for measuring to report.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.05


def needs_kernels(fused) -> bool:
    """Whether ``fused`` (a model ``fuse`` rewrote) holds ortfuse's ops."""
    from ortfuse.custom_ops.specs import DOMAIN

    return any(n.domain == DOMAIN for n in fused.graph.node)


def compile_here(fused) -> None:
    """Open an ORT session on ``fused`` with ortfuse's ops registered, in this process."""
    import onnxruntime as ort

    from ortfuse.fusion.provenance import native_op_types, reference_op_inputs
    from ortfuse.runtime.op_registration import with_custom_ops

    if not needs_kernels(fused):
        return
    options, why_not = with_custom_ops(None, frozenset(native_op_types(fused)),
                                       python_ops=reference_op_inputs(fused) is not None)
    if not why_not:
        with contextlib.suppress(Exception):
            ort.InferenceSession(fused.SerializeToString(), options, providers=["CPUExecutionProvider"])


def stoppable() -> bool:
    return hasattr(signal, "SIGSTOP") and hasattr(signal, "SIGCONT")


def compile_kernels(fused, on_start: Callable[[subprocess.Popen | None], None] = lambda p: None,
                    stopped: Callable[[], bool] = lambda: False, timeout_s: float = 600.0) -> str:
    """The kernels of ``fused`` compiled into numba's disk cache by a child process; returns "" or
    why it fell back to compiling here. ``on_start(process)`` is called with the child once it runs
    and with None once it has ended; ``stopped()`` ends the wait (the child is killed)."""
    if not needs_kernels(fused):
        return ""
    if not stoppable():
        compile_here(fused)
        return "no SIGSTOP on this platform: compiled in this process"
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="ortfuse-compile-") as folder:
        path = os.path.join(folder, "fused.onnx")
        with open(path, "wb") as fh:
            fh.write(fused.SerializeToString())
        try:
            child = subprocess.Popen(idle_argv([sys.executable, "-m", "ortfuse.tune.kernel_compile", path]), env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as exc:
            compile_here(fused)
            return f"the compiling process did not start ({exc}): compiled in this process"
        on_start(child)
        deadline = time.monotonic() + timeout_s
        try:
            while child.poll() is None and not stopped() and time.monotonic() < deadline:
                time.sleep(POLL_S)
        finally:
            on_start(None)
            if child.poll() is None:
                with contextlib.suppress(OSError):
                    child.send_signal(signal.SIGCONT)
                    child.kill()
            _, err = child.communicate()
    if child.returncode != 0 and not stopped():
        compile_here(fused)
        last = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
        return f"the compiling process failed ({last[0] if last else child.returncode}): compiled in this process"
    return ""


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent ends (a stopped child must not outlive it)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def idle_argv(argv: list[str]) -> list[str]:
    """``argv`` run at ``SCHED_IDLE`` from its first instruction: through util-linux's ``chrt --idle 0``
    where it exists (Linux), else unchanged (the child then lowers itself with ``background_priority``
    once its imports are done). A child that starts at the caller's priority competes with served
    runs for a core through its interpreter start-up and imports, and a request that arrives meanwhile
    waits for a time slice to wake."""
    if sys.platform.startswith("linux") and hasattr(os, "SCHED_IDLE"):
        chrt = shutil.which("chrt")
        if chrt:
            return [chrt, "--idle", "0", *argv]
    return list(argv)


def background_priority() -> str:
    """Every thread of this process (and those it starts later, which inherit it) at the lowest CPU
    priority the OS grants without privileges: Linux's ``SCHED_IDLE`` (a thread runs only on a core
    no other thread wants, and any waking thread preempts it at once), else nice 19. A served
    request that wakes while this process computes gets a core without waiting for a time slice.
    Returns the policy set ("idle", "nice", or "" when neither could be)."""
    tasks = [0]
    with contextlib.suppress(OSError):
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
    for policy, apply in (("idle", lambda tid: os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))),
                          ("nice", lambda tid: os.setpriority(os.PRIO_PROCESS, tid, 19))):
        try:
            for tid in tasks:
                apply(tid)
        except (AttributeError, OSError):
            continue
        return policy
    return ""


def main(argv: list[str]) -> int:
    import onnx

    die_with_parent()
    background_priority()  # a process of its own: it holds no lock the server waits for
    compile_here(onnx.load(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
