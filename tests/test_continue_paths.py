"""tools/continue_paths.py: its summary on stated latencies (no timing asserted), and a short run on
tiny_ffn in which every path serves requests and the continuer's thread continues the stand-in."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import tool_modules


def test_the_summary_compares_each_path_with_stock_at_the_same_quantile():
    tool = tool_modules.load("continue_paths")
    stock = [100] * 98 + [200, 300]
    slow = [100] * 97 + [500, 600, 700]
    out = tool.summary({"stock": stock, "thread": slow, "thread_counted": [350, 500]})
    assert out["stock"]["p50_over_stock"] == 1.0 and out["stock"]["slow_share"] == 0.0
    assert out["thread"]["n"] == 100 and out["thread"]["p50_over_stock"] == 1.0
    assert out["thread"]["p99_over_stock"] == 600 / 200  # nearest rank, as tools/served_requests.percentile
    assert out["thread"]["slow_share"] == 0.03  # over 4 x stock's p50 (400 us)
    assert out["thread_counted"]["slow_share"] == 0.5
    assert tool.summary({"thread": slow}) == {}  # nothing to compare with


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="the paths stop and continue a process: POSIX signals")
@pytest.mark.parametrize("spinning", ["off", "on"])
def test_a_short_run_serves_every_path_and_keeps_every_latency(tmp_path, spinning):
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(tool_modules.TOOLS / "continue_paths.py"), "--models", "tiny_ffn",
                           "--seconds", "2", "--phase", "0.1", "--spinning", spinning, "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(out.read_text())
    result = document["results"][0]
    assert result["model"] == "tiny_ffn" and document["settings"]["spinning"] == spinning
    lat, summary = result["latencies_us"], result["summary"]
    for path in ("stock", "thread", "serving", "stock_aa"):
        assert summary[path]["n"] == len(lat[path]) > 0 and min(lat[path]) > 0
    for path in ("thread", "serving"):  # each request of a served path took the counted or the resting path
        assert len(lat[path]) == len(lat.get(f"{path}_counted", [])) + len(lat.get(f"{path}_resting", []))
        assert lat.get(f"{path}_counted")
    assert result["continues_sent"] > 0 and result["continue_delay_us"]["p50"] > 0
    assert result["stand_in"] == "model" and set(result["steal_ticks"]) == {"stock", "thread", "serving", "stock_aa"}


@pytest.mark.parametrize("work", ["spin", "stream"])
def test_a_stand_in_without_the_model_runs_its_loop_on_every_thread(work):
    """The program of a stand-in that runs ``work`` once it has run the model: the model's loop is
    replaced, and ``threads`` threads run the work (counted here from the program's threads)."""
    tool = tool_modules.load("continue_paths")
    code = tool.STAND_IN.format(tools="/nowhere", name="tiny_ffn", threads=3, ready="/nowhere/ready")
    program = code[:code.index("while True:")] + tool.THREADED.format(work=tool.WORK[work], threads=3)
    compile(program, "stand-in", "exec")
    body = program[program.index("import threading"):].replace("while True:", "for _ in range(2):")
    started: list = []
    import threading

    real = threading.Thread.start
    try:
        threading.Thread.start = lambda self: (started.append(self), real(self))[-1]
        exec(body, {})
    finally:
        threading.Thread.start = real
    for thread in started:
        thread.join()
    assert len(started) == 2  # and the program's own thread: three
