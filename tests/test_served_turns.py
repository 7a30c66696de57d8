"""tools/served_turns.py: its groupings on stated requests (no timing asserted), and a short run on
tiny_ffn in which the three processes take turns that never overlap."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import tool_modules


def test_requests_are_grouped_by_their_place_in_the_turn():
    tool = tool_modules.load("served_turns")
    turns = [(10.0, 10.25, 3), (10.3, 10.55, 2)]
    trace = [(10.001, "auto", "tuning", 2.0, "running", 0.1, 1.5),  # 1 ms into its turn
             (10.01, "auto", "tuning", 0.2, "stopped", 0.1, 0.15),
             (10.2, "auto", "after", 0.2, "none", 0.1, 0.15),  # after the tuning: not counted
             (10.302, "stock_aa", "tuning", 0.2, "stopped", 0.1, 0.15),
             (10.4, "stock", "recording", 0.3, "stopped", 0.1, 0.25)]
    out = tool.by_place(trace, turns, stock_p50_ms=0.2)
    assert out["auto_<5ms_running"] == {"n": 1, "p50_ms": 2.0, "c_run_p50_ms": 1.5, "slow_share": 1.0}  # > 4 x 0.2
    assert out["auto_<80ms_stopped"]["n"] == 1 and out["auto_<80ms_stopped"]["slow_share"] == 0.0
    assert out["stock_<5ms"]["n"] == 1 and out["stock_rest"]["n"] == 1  # both stock sessions as "stock"
    assert not any(key.startswith("auto_rest") for key in out)


def test_requests_are_grouped_by_how_long_ago_the_tuning_process_ran():
    tool = tool_modules.load("served_turns")
    row = (0.0, "auto", "tuning", 0.3, "stopped", 0.1, 0.15)  # arrival, session, state, ms, process, wake, C run
    trace = [row,  # before the process first ran
             (0.0, "auto", "tuning", 0.4, "running", 0.1, 0.2), row, row, row,
             (0.0, "stock", "tuning", 0.25, "stopped", 0.05, 0.15),
             (0.0, "stock_aa", "tuning", 0.35, "stopped", 0.1, 0.2),
             (0.0, "auto", "after", 0.2, "none", 0.1, 0.1)]  # after the tuning: not counted
    out = tool.by_distance(trace)
    assert set(out) == {"never", "0", "<=1", "<=2", "<=4", "stock"}
    assert out["0"] == {"n": 1, "p50_ms": 0.4, "c_run_p50_ms": 0.2, "wake_p50_ms": 0.1, "python_p50_ms": 0.1}
    assert out["<=4"]["n"] == 1 and out["<=2"]["n"] == 1 and out["never"]["n"] == 1
    assert out["stock"]["n"] == 2 and out["stock"]["python_p50_ms"] == 0.05  # nearest rank of 0.05 and 0.05


def test_time_to_plan_in_auto_turns_counts_only_their_seconds_before_the_plan():
    tool = tool_modules.load("served_turns")
    turns = [(0.0, 1.0, 5), (2.0, 3.0, 5), (4.0, 5.0, 5)]
    assert tool.plan_turn_seconds(turns, 0.0, 2.5) == 1.5
    assert tool.plan_turn_seconds(turns, 0.0, 10.0) == 3.0
    assert tool.plan_turn_seconds(turns, 0.0, None) is None


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="the turns stop and continue processes: POSIX signals")
def test_a_short_run_serves_every_session_in_turns_that_never_overlap(tmp_path):
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(tool_modules.TOOLS / "served_turns.py"), "--models", "tiny_ffn",
                           "--phase", "0.05", "--wait", "3", "--trace", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: a verdict failed, not the run
    result = json.loads(out.read_text())["results"][0]
    assert "error" not in result, result.get("error")
    turns = result["turn_trace"]
    assert [role for *_, role in turns[:4]] == ["auto", "stock", "auto", "stock_aa"]
    assert all(a[1] <= b[0] for a, b in zip(turns, turns[1:]))  # one process serves at a time
    assert all(n > 0 for _, _, n, _ in turns)
    roles = ("auto", "stock", "stock_aa")
    served = {role: sum(1 for row in result["served_trace"] if row[1] == role) for role in roles}
    assert served == {role: sum(n for *_, n, r in turns if r == role) for role in served}
    assert all(0 < row[6] <= row[3] for row in result["served_trace"])  # the C run within the request
    assert result["clock_origin_s"] > 0  # the trace's times are from it
    assert result["by_gap"]["auto_running"]["n"] > 0  # the tuning process ran in auto's gaps
    assert result["during_tuning"]["p50"] > 0 and set(result["verdicts"]) == {"tuned", "p50_tuning", "p99_tuning"}
