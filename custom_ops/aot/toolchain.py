"""The C toolchain that compiles the glue and links the ops library (no numba).

Choice, in order: ``$CC``; a ``cc``, ``gcc`` or ``clang`` on PATH (what a Linux machine that builds
Python packages has); else zig's bundled clang from PyPI (``pip install ziglang``, the ``aot`` extra:
a self-contained C toolchain, no system packages). The link refuses undefined symbols other than
libc's and libm's (``-Wl,--no-undefined``), so a library that links loads (docs/ARCHITECTURE.md §6b).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys


class ToolchainError(RuntimeError):
    """No C toolchain, or compiling/linking failed (the message says which and how to fix it)."""


def compiler() -> list[str]:
    """The C compiler command (argv prefix)."""
    if os.environ.get("CC"):
        return shlex.split(os.environ["CC"])
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    if importlib.util.find_spec("ziglang") is not None:
        return [sys.executable, "-m", "ziglang", "cc"]
    raise ToolchainError("no C compiler found to link the ortfuse ops library: install one (for example "
                         "`apt install gcc`) or `pip install ziglang`, or set CC")


def link_shared(c_source: str, objects: list[str], out_path: str, workdir: str) -> None:
    """Compile ``c_source`` and link it with ``objects`` into the shared library ``out_path``."""
    glue = os.path.join(workdir, "glue.c")
    with open(glue, "w") as f:
        f.write(c_source)
    cmd = compiler() + ["-shared", "-fPIC", "-O2", "-o", out_path, glue, *objects, "-lm",
                        "-Wl,--no-undefined", "-Wl,-z,noexecstack"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"running the C compiler failed: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-8:]
        raise ToolchainError(f"linking the ortfuse ops library failed ({shlex.join(cmd[:1])}): " + " | ".join(tail))
