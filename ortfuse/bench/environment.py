"""What a bench result records about where it was measured: machine, load, versions, and whether the
thread pools outside ORT were told not to spin."""

from __future__ import annotations

import datetime as _dt
import os
import platform

# Thread pools outside ORT (numpy's OpenBLAS behind the reference kernels, numba's OpenMP layer behind
# the native ones) also spin after each call and slow whichever session runs next. These variables make
# them sleep at once, as ORT's threads do with spinning off. They are read when the libraries load, so
# the CLI re-executes the bench in a child process that has them (``--quiet-threads off`` does not).
# Measure the effect: ``ortfuse bench resnet50 --quiet-threads off`` against the default, reading the
# A/A control and ortfuse_auto ratios (docs/ARCHITECTURE.md §8).
QUIET_THREADS_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "OPENBLAS_THREAD_TIMEOUT": "4"}


def quiet_threads_active() -> bool:
    return all(os.environ.get(k) == v for k, v in QUIET_THREADS_ENV.items())


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the platform has none."""
    try:
        return list(os.getloadavg())
    except (OSError, AttributeError):
        return None


def source_state() -> dict | None:
    """The git commit ortfuse runs from and the files modified against it (a result measured on a
    work tree with changes says so), or None when ortfuse is not run from a git checkout."""
    import subprocess

    import ortfuse

    folder = os.path.dirname(os.path.dirname(os.path.abspath(ortfuse.__file__)))
    try:
        commit = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"git_commit": commit, "modified": [line[3:] for line in status.splitlines() if line.strip()]}


def environment() -> dict:
    """Date, host, CPU (model and the ISA features kernels are chosen by), cores, memory, load average,
    platform and the versions that matter (a peer's too: "not installed" where it is not)."""
    import psutil

    import ortfuse
    from ortfuse.foundation.isa import KNOWN_FEATURES, cpu_model, host_features

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_model": cpu_model(),
        "isa_features": [f for f in KNOWN_FEATURES if f in host_features()],
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable,
        "memory_total_mb": psutil.virtual_memory().total / 2**20,
        "load_average_1_5_15": load_average(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ortfuse_source": source_state(),
        "versions": {
            "ortfuse": ortfuse.ortfuse_version,
            "onnxruntime": _version("onnxruntime"),
            "onnx": _version("onnx"),
            "numba": _version("numba"),
            "numpy": _version("numpy"),
            "onnxruntime-extensions": _version("onnxruntime-extensions"),
            "openvino": _version("openvino"),
        },
    }
