"""The layout step (``ortfuse.layout.planner.plan_layout``) run once per fused model in a tuning:
a tuning times a plan as a session runs it (``tune.measure``) and then makes that very plan
(``runtime.planning``); inside ``remembering()`` the second call returns the first one's result
instead of asking ORT to optimize the model again and timing the layout's probes again.

Contract: ``plan_layout(...)`` takes ``plan_layout``'s arguments and returns what it returns.
Inside ``with remembering():`` (in this thread) the last result is kept, keyed by the sha256 of
the fused model's bytes and of the original model's, the optimization level and intra-op threads
of the options, the sizes the layout is timed at (``layout.served_sizes.entry``), the native ops
and the disabled ORT optimizers; it is dropped when the block ends.
Outside such a block every call runs the layout step. Callers must not change the returned
``Layout.model`` (both only serialize it).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator

from ortfuse.layout import served_sizes

_local = threading.local()  # .last: None (not remembering) or a list holding at most one (key, result)


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """Remember the last layout in this thread until the block ends."""
    outer = getattr(_local, "last", None)
    _local.last = []
    try:
        yield
    finally:
        _local.last = outer


def plan_layout(original, fused, sess_options, native_ops: frozenset, disabled_optimizers=(),
                data: bytes | None = None):
    """``ortfuse.layout.planner.plan_layout``, remembered inside ``remembering()`` (module docstring)."""
    from ortfuse.layout.planner import plan_layout as plan

    last = getattr(_local, "last", None)
    if last is None:
        return plan(original, fused, sess_options, native_ops, disabled_optimizers, data)
    data = data if data is not None else fused.SerializeToString()
    level = int(sess_options.graph_optimization_level) if sess_options is not None else -1
    threads = int(sess_options.intra_op_num_threads) if sess_options is not None else 0
    key = (hashlib.sha256(data).hexdigest(), hashlib.sha256(original.SerializeToString()).hexdigest(), level,
           threads, served_sizes.entry(sess_options), tuple(sorted(native_ops)),
           tuple(sorted(disabled_optimizers or ())))
    if last and last[0][0] == key:
        return last[0][1]
    result = plan(original, fused, sess_options, native_ops, disabled_optimizers, data)
    last[:] = [(key, result)]
    return result
