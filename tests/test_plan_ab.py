"""tools/plan_ab.py: two plans of one model under different ortfuse switches, sessions created
alternately, each output checked against stock ORT (no timing asserted)."""

from __future__ import annotations

import json

import pytest
import tool_modules


def _tool():
    return tool_modules.load("plan_ab")


def test_two_plans_are_made_apart_checked_and_timed_with_their_controls(tmp_path, monkeypatch):
    """The layout step on (A, the default) and off (B) on the zoo's detector: B's report says the step
    is off, A's does not; both outputs as stock ORT_DISABLE_ALL; the result keeps every session's
    raw times (2 sessions per plan x 3 passes x 2 runs) and the A/A and B/B controls."""
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "ab.json"
    args = ["db_text_detector", "--b", "ORTFUSE_LAYOUT=off", "--pairs", "2", "--passes", "3", "--block", "2",
            "--threads", "1", "--json", str(out)]
    assert _tool().main(args) == 0
    doc = json.loads(out.read_text())
    plans = doc["plans"]
    assert plans["B"]["notes"] == ["layout: ORTFUSE_LAYOUT=off"] and plans["A"]["notes"] != plans["B"]["notes"]
    assert plans["A"]["switches"] == {} and plans["B"]["switches"] == {"ORTFUSE_LAYOUT": "off"}
    assert all(p["max_rel_diff"] < 1e-4 for p in plans.values()), plans
    assert sorted(doc["raw_ms"]) == ["A0", "A1", "B0", "B1"] and all(len(v) == 6 for v in doc["raw_ms"].values())
    s = doc["summary"]
    assert s["a_ms"] > 0 and s["b_ms"] > 0 and s["b_over_a"] > 0 and s["A/A"] > 0 and s["B/B"] > 0


@pytest.mark.parametrize("args, text", [
    (["--b", "HOME=/tmp"], "is not NAME=VALUE"),  # a variable plans are not keyed by
    (["--b", "ORTFUSE_LAYOUT"], "is not NAME=VALUE"),
    (["--a", "ORTFUSE_LAYOUT=off", "--b", "ORTFUSE_LAYOUT=off"], "the same switches"),
])
def test_switches_the_plan_cache_does_not_key_or_equal_plans_are_refused(args, text):
    with pytest.raises(SystemExit, match=text):
        _tool().main(["db_text_detector", *args])
