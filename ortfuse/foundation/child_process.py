"""Child processes that do a live tuning's heavy work beside served runs (docs/ARCHITECTURE.md §7):
they start clean, run at idle priority, die with their parent, are handed to the caller (who may
stop them with SIGSTOP) only once that is safe, and are killed when the caller stops waiting.

- ``start(module, args, folder, stderr)`` runs ``python -m module args`` (``child_argv``) in
  ``folder``, a folder of the caller's own: its working directory, where it creates ``READY``;
- ``child_argv`` runs the clean-start stub ``_START`` first, before any import of ortfuse or numpy:
  the death signal (Linux's ``PR_SET_PDEATHSIG``, SIGKILL, which also ends a stopped process), then a
  check that the parent that started it still lives (it may have ended before the signal was set),
  then the file ``READY`` that tells the parent it may stop this child from now on, then the module
  as ``__main__``; at ``SCHED_IDLE`` from its first instruction (``idle_argv``), with no working
  directory on its path (``python_argv``);
- ``supervise(child, folder, on_start, stopped)`` waits until the child ends or ``stopped()``,
  handing it to ``on_start`` once ``READY`` exists (a child stopped before its death signal is set
  would outlive this process), then calls ``on_start(None)`` and continues and kills a child still
  running; the caller reaps it (``wait``, ``communicate``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.05
READY = "started"  # the file a child creates in its folder once its death signal is set

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


def stoppable() -> bool:
    """Whether this platform can stop a process and continue it (SIGSTOP, SIGCONT)."""
    return hasattr(signal, "SIGSTOP") and hasattr(signal, "SIGCONT")


def python_argv() -> list[str]:
    """This interpreter, told not to put the working directory (or a script's folder) on the path
    (``-P``, Python 3.11+; before that the caller starts the child in a folder of its own)."""
    return [sys.executable, "-P"] if sys.version_info >= (3, 11) else [sys.executable]


def start(module: str, args: list[str], folder: str, stderr) -> subprocess.Popen:
    """``python -m module args`` as a child of this process (see the module docstring), in ``folder``,
    its output discarded and its errors to ``stderr``; OSError when it cannot be started."""
    return subprocess.Popen(child_argv(module, args, os.path.join(folder, READY)), env=child_env(), cwd=folder,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)


def child_argv(module: str, args: list[str], ready: str) -> list[str]:
    """The command that runs ``python -m module args`` through ``_START`` at idle priority; ``ready``:
    the file the child creates once its death signal is set."""
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


def supervise(child: subprocess.Popen, folder: str, on_start: Callable[[subprocess.Popen | None], None],
              stopped: Callable[[], bool], poll_s: float = POLL_S) -> None:
    """Wait for ``child`` as the module docstring says; whatever ends the wait, ``on_start(None)``
    and a child still running killed."""
    try:
        wait_for(child, os.path.join(folder, READY), on_start, stopped, poll_s)
    finally:
        on_start(None)
        if child.poll() is None:
            with contextlib.suppress(OSError):
                child.send_signal(signal.SIGCONT)
                child.kill()


def wait_for(child: subprocess.Popen, ready: str, on_start: Callable[[subprocess.Popen | None], None],
             stopped: Callable[[], bool], poll_s: float = POLL_S) -> None:
    """Wait until ``child`` ends or ``stopped()``; ``on_start(child)`` (the caller may stop it from
    then on) once it has created ``ready``."""
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
    policies = {lowest_priority(tid) for tid in tasks}
    return policies.pop() if len(policies) == 1 else ""


def lowest_priority(tid: int = 0) -> str:
    """The thread ``tid`` (0: the calling thread) at the lowest CPU priority the OS grants without
    privileges, as ``background_priority``; returns the policy set ("idle", "nice" or "")."""
    for policy, apply in (("idle", lambda: os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))),
                          ("nice", lambda: os.setpriority(os.PRIO_PROCESS, tid, 19))):
        try:
            apply()
        except (AttributeError, OSError):
            continue
        return policy
    return ""
