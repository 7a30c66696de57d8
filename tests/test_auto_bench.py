"""tools/auto_bench.py: the served requests while tuning, counted by the tuning step in effect when
each arrived (``slow_by_step``), on a stated trace (no timing asserted); and the checkout whose
ortfuse the tool measures; auto's served requests while it tuned against stock's (``tuning_ratios``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
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


def test_requests_while_tuning_are_grouped_by_the_tuning_process_in_the_gap_before():
    tool = tool_modules.load("auto_bench")
    trace = [(0.1, "auto", "recording", 2.0, "none", 0.1), (0.2, "auto", "tuning", 3.0, "running", 0.2),
             (0.3, "auto", "tuning", 5.0, "running", 0.4), (0.4, "auto", "tuning", 4.0, "stopped", 0.1),
             (0.5, "stock", "tuning", 1.0, "stopped", 0.1), (0.6, "auto", "after", 9.0, "none", 0.1),
             (0.7, "auto", "tuning", 7.0)]  # a row of a trace written before these fields: left out
    groups = tool.by_gap(trace)
    assert groups == {"auto_none": {"n": 1, "p50_ms": 2.0, "wake_p50_ms": 0.1},
                      "auto_running": {"n": 2, "p50_ms": 3.0, "wake_p50_ms": 0.2},  # _pct's p50 of two
                      "auto_stopped": {"n": 1, "p50_ms": 4.0, "wake_p50_ms": 0.1},
                      "stock": {"n": 1, "p50_ms": 1.0, "wake_p50_ms": 0.1}}


def test_the_gap_state_reads_the_serving_side_of_the_live_tuning():
    import types

    tool = tool_modules.load("auto_bench")
    assert tool.gap_state(None) == "none"
    assert tool.gap_state(types.SimpleNamespace(child=None, held=False, inflight=0)) == "none"
    assert tool.gap_state(types.SimpleNamespace(child=object(), held=False, inflight=0)) == "running"
    assert tool.gap_state(types.SimpleNamespace(child=object(), held=True, inflight=0)) == "stopped"
    assert tool.gap_state(types.SimpleNamespace(child=object(), held=False, inflight=1)) == "stopped"


def test_the_tool_measures_the_ortfuse_of_its_own_checkout(tmp_path):
    """A PYTHONPATH that holds another ortfuse does not change which one the tool measures: its own
    checkout comes first (``checkout`` says which ran; to compare two trees, run each tree's tool)."""
    decoy = tmp_path / "ortfuse"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("")
    path = str(tool_modules.TOOLS / "auto_bench.py")
    script = ("import importlib.util\n"
              f"spec = importlib.util.spec_from_file_location('auto_bench', {path!r})\n"
              "tool = importlib.util.module_from_spec(spec); spec.loader.exec_module(tool)\n"
              "print(tool.checkout())\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tool_modules.TOOLS.parent)


def test_tuning_ratios_pool_both_stock_sessions_served_in_the_same_span():
    """Auto's requests while it recorded and tuned over both stock sessions' served in those states,
    pooled (requests after the tuning left out); the A/A is stock_aa over stock."""
    tool = tool_modules.load("auto_bench")
    lat = {"auto_recording": [9.0, 9.0], "auto_tuning": [1.1] * 98, "auto_after": [0.5] * 100,
           "stock_recording": [1.2] * 2, "stock_tuning": [1.0] * 60, "stock_aa_tuning": [1.2] * 50,
           "stock_after": [9.0] * 300}
    ratios = tool.tuning_ratios(lat)
    assert ratios["p50"] == pytest.approx(1.1, abs=1e-3)  # 60 of the 112 stock requests at 1.0 ms
    assert ratios["stock_p50_ms"] == 1.0  # the pooled reference itself (slow_by_step's threshold)
    assert ratios["p50_aa"] == pytest.approx(1.2, abs=1e-3)
    assert ratios["p99"] == pytest.approx(9.0 / 1.2, abs=1e-3)  # auto's slowest, its first cold runs
    assert tool.tuning_ratios({"auto_tuning": [1.0]})["p50"] is None
