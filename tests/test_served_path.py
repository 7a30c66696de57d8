"""tools/served_path.py's summaries on stated rows (no timing asserted), and the compact result files it
and tools/auto_bench.py write (``bench.output.save_result``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import tool_modules

from ortfuse.bench import output


def _row(block: str, total: float, pre: float, post: float) -> dict:
    return {"block": block, "total": total, "wake": 0.1, "pre": pre, "c_run": total - 0.1 - pre - post, "post": post}


def test_parts_are_summarised_per_session_with_their_difference_from_stock():
    tool = tool_modules.load("served_path")
    rows = [_row("auto", 0.40, 0.04, 0.03), _row("auto", 0.42, 0.05, 0.02), _row("auto", 0.44, 0.06, 0.04),
            _row("stock", 0.30, 0.02, 0.01), _row("stock", 0.34, 0.02, 0.01),
            _row("stock_aa", 0.33, 0.02, 0.01)]
    s = tool.summary(rows)
    assert (s["auto"]["n"], s["stock"]["n"], s["stock_aa"]["n"]) == (3, 2, 1)
    assert abs(s["auto"]["total"] - 0.42) < 1e-9 and abs(s["stock"]["total"] - 0.32) < 1e-9  # medians
    assert s["auto_minus_stock_us"]["total"] == 100.0 and s["auto_minus_stock_us"]["pre"] == 30.0
    assert s["stock_aa_minus_stock_us"]["total"] == 10.0
    assert "auto_minus_stock_us" not in tool.summary([r for r in rows if r["block"] == "auto"])  # no stock: none


def test_auto_requests_are_also_summarised_by_the_signals_they_carried():
    tool = tool_modules.load("served_path")
    rows = [{**_row("auto", 0.40, 0.04, 0.03), "signals": ""},
            {**_row("auto", 0.50, 0.09, 0.03), "signals": "STOP"},
            {**_row("auto", 0.52, 0.04, 0.10), "signals": "CONT"},
            {**_row("auto", 0.54, 0.04, 0.12), "signals": "CONT"},
            {**_row("stock", 0.30, 0.02, 0.01), "signals": ""}]
    s = tool.summary(rows)
    assert {k: s[k]["n"] for k in ("auto", "auto_quiet", "auto_STOP", "auto_CONT")} == \
        {"auto": 4, "auto_quiet": 1, "auto_STOP": 1, "auto_CONT": 2}
    assert abs(s["auto_CONT"]["total"] - 0.53) < 1e-9 and s["auto_STOP_minus_stock_us"]["pre"] == 70.0
    assert "stock_STOP" not in s and "auto_" not in s  # groups of auto's requests only, none for no signal


def test_signals_are_counted_with_their_p50_and_p90():
    tool = tool_modules.load("served_path")
    sent = [("SIGSTOP", float(us)) for us in range(1, 11)] + [("SIGCONT", 50.0)]
    s = tool.signal_summary(sent)
    assert s["SIGSTOP"] == {"n": 10, "p50_us": 6.0, "p90_us": 9.0}
    assert s["SIGCONT"] == {"n": 1, "p50_us": 50.0, "p90_us": 50.0}
    assert tool.signal_summary([]) == {}


def test_a_compact_result_over_the_limit_is_gzipped(tmp_path, monkeypatch):
    small = output.save_result({"rows": [1, 2]}, str(tmp_path) + "/", "small", compact=True)
    assert small.endswith("small.json") and json.loads(Path(small).read_text()) == {"rows": [1, 2]}
    assert Path(small).read_text() == '{"rows":[1,2]}'  # no indentation
    monkeypatch.setattr(output, "MAX_RESULT_BYTES", 10)
    big = output.save_result({"rows": list(range(50))}, str(tmp_path) + "/", "big", compact=True)
    assert big.endswith("big.json.gz")
    assert json.loads(gzip.decompress(Path(big).read_bytes())) == {"rows": list(range(50))}
    indented = output.save_result({"rows": list(range(50))}, str(tmp_path) + "/", "indented")
    assert indented.endswith("indented.json") and "\n" in Path(indented).read_text()  # not compact: never gzipped
