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
    with tempfile.TemporaryDirectory(prefix="ortfuse-compile-") as folder:
        path = os.path.join(folder, "fused.onnx")
        with open(path, "wb") as fh:
            fh.write(fused.SerializeToString())
        ready = os.path.join(folder, "started")
        try:
            child = subprocess.Popen(child_argv("ortfuse.tune.kernel_compile", [path], ready), env=child_env(),
                                     cwd=folder, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        except OSError as exc:
            compile_here(fused)
            return f"the compiling process did not start ({exc}): compiled in this process"
        deadline = time.monotonic() + timeout_s
        try:
            wait_for(child, ready, on_start, lambda: stopped() or time.monotonic() >= deadline)
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


# Run first in a child (``python -c``), before any import of ortfuse or numpy: the death signal
# (Linux's PR_SET_PDEATHSIG, SIGKILL, which also ends a stopped process), then a check that the
# parent that started it still lives (it may have ended before the signal was set), then the file
# that tells the parent it may stop this child from now on, then the module as ``__main__``.
_START = """import ctypes, os, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, 9)
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(70)
open(sys.argv[2], "x").close()
import runpy
sys.argv = sys.argv[3:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def child_argv(module: str, args: list[str], ready: str) -> list[str]:
    """The command that runs ``python -m module args`` as a child of this process that never outlives
    it (``_START``), at idle priority (``idle_argv``), with no working directory on its path
    (``python_argv``; the caller also starts it in a folder of its own). ``ready``: the file the
    child creates once its death signal is set; ``wait_for`` hands the child over only then."""
    from ortfuse.custom_ops.aot.library import python_argv

    return idle_argv([*python_argv(), "-c", _START, str(os.getpid()), ready, module, *args])


def child_env() -> dict[str, str]:
    """This process's environment with the folder that holds ortfuse first on ``PYTHONPATH`` and the
    cache folders made absolute (the child runs in another working directory)."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    for name in ("ORTFUSE_CACHE_DIR", "NUMBA_CACHE_DIR", "ORTFUSE_OPS_LIBRARY"):
        if env.get(name) and env[name].strip().lower() not in ("0", "off", "false", "no"):
            env[name] = os.path.abspath(os.path.expanduser(env[name]))
    return env


def wait_for(child: subprocess.Popen, ready: str, on_start: Callable[[subprocess.Popen | None], None],
             stopped: Callable[[], bool], poll_s: float = POLL_S) -> None:
    """Wait until ``child`` ends or ``stopped()``; ``on_start(child)`` (the caller may stop it from
    then on) once it has created ``ready``: a child stopped before its death signal is set would
    outlive this process."""
    handed = False
    while child.poll() is None and not stopped():
        if not handed and os.path.exists(ready):
            handed = True
            on_start(child)
        time.sleep(poll_s)


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

    background_priority()  # a process of its own: it holds no lock the server waits for
    compile_here(onnx.load(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
