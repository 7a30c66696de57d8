"""Where a tuning's time goes: named steps with their time, recorded by the code that does them and
read by whoever reports them (a live tuning's timeline, ``tools/auto_bench.py``).

``start()`` begins a record (the steps before it are dropped), ``mark(event)`` adds one step at
``time.perf_counter()``, ``recorded()`` returns the steps as ``(event, seconds since start())``.
One record per process: a tuning process does one tuning; marks outside a record are ignored.
"""

from __future__ import annotations

import time

_record: list[tuple[str, float]] | None = None
_t0 = 0.0


def start() -> None:
    global _record, _t0
    _record, _t0 = [], time.perf_counter()


def mark(event: str) -> None:
    if _record is not None:
        _record.append((event, time.perf_counter()))


def recorded() -> list[tuple[str, float]]:
    return [(event, round(t - _t0, 3)) for event, t in (_record or [])]
