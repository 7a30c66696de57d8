"""The process's pool block and the run-time threading settings kept in it (no numba).

Every native op's record points at one pool block (``words``: spin lock, free list of kernel-state
slots, counters, threading settings): the records made in this process by the JIT path and those of
the ahead-of-time library (``aot.library`` points them here), so one setting and one set of
counters serve both. ``set_threading`` writes the settings that ``threads.run_blocks`` reads on
every run (docs/ARCHITECTURE.md §6).
"""

from __future__ import annotations

import ctypes
import threading

from ortfuse.custom_ops.native.lifetime import immortal
from ortfuse.custom_ops.native.words import (
    P_ALLOC_FAIL,
    P_ALLOCATED,
    P_CREATES,
    P_DESTROYS,
    P_LIVE,
    P_PAR_FOR,
    P_PAR_MIN,
    P_PEAK,
    P_THREADING,
    POOL_WORDS,
    THREADING_MODES,
)

DEFAULT_PARALLEL_MIN = 1 << 16
_lock = threading.RLock()


POOL = immortal((ctypes.c_int64 * POOL_WORDS)())


def set_threading(mode: str | None = None, parallel_min: int | None = None) -> tuple[str, int]:
    """Choose how kernels use threads; takes effect on the next run of any session.

    mode: "ort" (blocks on ORT's intra-op pool via KernelContext_ParallelFor; the default),
    "numba" (numba's parallel layer: only once ``threads.set_threading`` has set it up, which
    imports numba) or "serial". parallel_min: element count from which a kernel splits work
    (negative: never). None keeps the current value (initially $ORTFUSE_THREADING and
    $ORTFUSE_PARALLEL_MIN, else "ort" and DEFAULT_PARALLEL_MIN). Returns the (mode, parallel_min) in force.
    """
    with _lock:
        if mode is not None:
            if mode not in THREADING_MODES:
                raise ValueError(f"threading mode must be one of {sorted(THREADING_MODES)}, got {mode!r}")
            if mode == "numba" and POOL[P_PAR_FOR] == 0:
                raise RuntimeError("numba's threads are not set up in this process: choose the numba mode "
                                   "with ortfuse.custom_ops.native.threads.set_threading")
            POOL[P_THREADING] = THREADING_MODES[mode]
        if parallel_min is not None:
            POOL[P_PAR_MIN] = int(parallel_min)
        names = {v: k for k, v in THREADING_MODES.items()}
        return names[int(POOL[P_THREADING])], int(POOL[P_PAR_MIN])


def threading_settings() -> tuple[str, int]:
    return set_threading()


def slot_stats() -> dict[str, int]:
    """Kernel-state pool counters: live slots, slots ever allocated (= peak live), creates, destroys."""
    return {"live": int(POOL[P_LIVE]), "allocated": int(POOL[P_ALLOCATED]), "peak": int(POOL[P_PEAK]),
            "creates": int(POOL[P_CREATES]), "destroys": int(POOL[P_DESTROYS]),
            "alloc_failures": int(POOL[P_ALLOC_FAIL])}
