"""Where the live tuning's thread may be stopped (docs/ARCHITECTURE.md §7).

The tuning thread's profile hook (``live_tuning.LiveTuning._gate``) stops the tuning by raising, which
Python delivers as if the code whose event fired raised there: at a C call or return inside
threading's Condition (the lock taken, not yet the ``with``'s), in another package's cleanup or a
lock's ``__exit__``, that leaks the lock (the served runs then wait on it for ever) or skips the
cleanup. So the hook raises only at a stop point: as one of the tuning's own functions begins, in
``PACKAGES``, never a generator's resumption; as if that function raised on its first line
(tests/test_live_tuning.py::test_stopping_the_tuning_leaves_no_lock_held).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

PACKAGES = ("ortfuse.fusion.", "ortfuse.tune.", "ortfuse.layout.", "ortfuse.ir.", "ortfuse.kernel_choice.",
            "ortfuse.runtime.planning")
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def checker() -> Callable[[object, str], bool]:
    """``at_stop_point(frame, event)``: whether a profile hook may raise at this event (its answers
    per code object remembered: the hook runs on every call of the thread)."""
    known: dict = {}

    def at_stop_point(frame, event: str) -> bool:
        if event != "call":
            return False
        code = frame.f_code
        fit = known.get(code)
        if fit is None:
            fit = known[code] = (not code.co_flags & _RESUMABLE
                                 and str(frame.f_globals.get("__name__", "")).startswith(PACKAGES))
        return fit

    return at_stop_point
