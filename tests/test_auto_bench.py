"""tools/auto_bench.py: the served requests while tuning, counted by the tuning step in effect when
each arrived (``slow_by_step``), on a stated trace (no timing asserted)."""

from __future__ import annotations

import tool_modules


def test_slow_requests_are_counted_by_the_step_they_arrived_in():
    tool = tool_modules.load("auto_bench")
    timeline = [("tuning started", 1.0), ("child plan made", 2.0), ("swapped", 3.0)]
    trace = [(0.5, "auto", "recording", 10.0), (1.5, "auto", "tuning", 16.0), (1.6, "stock", "tuning", 40.0),
             (2.0, "auto", "tuning", 30.0), (2.5, "auto", "tuning", 14.0), (3.5, "auto", "after", 50.0)]
    rows = {r["step"]: r for r in tool.slow_by_step(trace, timeline, stock_p50_ms=10.0)}
    assert list(rows) == ["recording", "tuning started", "child plan made"]  # stock and after: not counted
    assert (rows["recording"]["served"], rows["recording"]["slow"]) == (1, 0)
    assert (rows["tuning started"]["served"], rows["tuning started"]["slow"]) == (1, 1)  # 16 > 1.5 x 10
    assert (rows["child plan made"]["served"], rows["child plan made"]["slow"]) == (2, 1)
    assert rows["child plan made"]["slow_ms"] == [30.0]
    assert all(r["slow"] == 0 for r in tool.slow_by_step(trace, timeline, None))  # no stock p50: none slow
