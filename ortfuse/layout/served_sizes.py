"""The input sizes a plan's layout step times its native convs at (docs/ARCHITECTURE.md §9).

Contract: ``entry(sess_options)`` is the ``ortfuse.tune_dims`` entry ("name=value,...") the layout
step reads: the session's own when it sets one, else the one a ``fusion="auto"`` tuning measured
on, made current in this thread by ``with serving(dims):`` (the tuner while it times plans, the
planner while it makes the plan those decisions give), else "". Served feeds name their dims by
the model's own names (``dims_of``), so a plan tuned on live traffic is laid out at that traffic's
sizes, in the process that tuned it and in every later one that reads its decisions.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence

from ortfuse.foundation.session_options import DIMS_KEY, config_entry
from ortfuse.ir.model_args import format_dims

_local = threading.local()


@contextlib.contextmanager
def serving(dims: str) -> Iterator[None]:
    """Make ``dims`` (an ``ortfuse.tune_dims`` value; "" for none) the sizes of this thread's plans
    whose session options name none, until the block ends."""
    outer = getattr(_local, "dims", "")
    _local.dims = dims
    try:
        yield
    finally:
        _local.dims = outer


def entry(sess_options) -> str:
    """The session's ``ortfuse.tune_dims`` entry, else the current ``serving`` dims, else ""."""
    return config_entry(sess_options, DIMS_KEY) or getattr(_local, "dims", "")


def dims_of(declared: Sequence[tuple[str, int, list]], shapes: Mapping[str, Sequence[int]]) -> str:
    """The ``ortfuse.tune_dims`` value naming each dynamic dim ``declared`` names by its size in
    ``shapes`` (``batch`` for an unnamed first dim), "" when none is named. A name the feeds give
    two sizes is left out (exporters write "?" for every unknown dim: naming it would set them all
    to one size), as are names that would not parse back (holding "=" or ",")."""
    sizes_by_name: dict[str, set[int]] = {}
    for name, _, dims in declared:
        sizes = shapes.get(name)
        if sizes is None or len(sizes) != len(dims):
            continue
        for axis, (dim, size) in enumerate(zip(dims, sizes)):
            if isinstance(dim, int):
                continue
            label = dim if dim else "batch" if axis == 0 else None
            if label and label == label.strip() and "=" not in label and "," not in label:
                sizes_by_name.setdefault(label, set()).add(int(size))
    return format_dims({k: v.pop() for k, v in sizes_by_name.items() if len(v) == 1})
