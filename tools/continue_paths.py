"""What the way the tuning process is continued after a served run costs the requests, apart from the
tuning's own work: a stock session serves requests through ``ServedRuns`` beside a stand-in tuning
process (the same model run in a loop by ORT at the lowest CPU priority, as the tuning process runs
its timings), once per continue path, beside plain stock sessions.

    python tools/continue_paths.py --models silero_vad_16k_op15[,ppocr_mobile_v2_cls,...] [--seconds 40]
                                   [--phase 0.25] [--gap 2x] [--threads 2] [--spinning off|on]
                                   [--stand-in model|spin|stream]
                                   [--json benchmarks/results/]

One process per model (as ``tools/auto_bench.py``, whose models, feeds and gap this takes), CPU
provider, ORT_ENABLE_ALL, pool threads not spinning (``--spinning on``: ORT's default, with an idle
settle after each phase, as ``ortfuse bench --block``'s, in which the last phase's pool threads stop
spinning). The serving loop serves single requests, each an idle gap after the previous one ended,
in rotating phases of ``--phase`` seconds:

- ``stock``: ORT's run, the stand-in process stopped;
- ``thread``: through ``ServedRuns.counted`` holding the stand-in, SIGCONT sent by the continuer's
  thread after a short run (the session's use, ``served_runs._Continuer``);
- ``serving``: the same with SIGCONT sent from the serving path (``defer_continue=False``);
- ``stock_aa``: a second stock session (the A/A control).

Per path: p50, p99 and p99.9 over stock's, and the share of requests over 4 times stock's p50, for all
of its requests and for those that took the counted path (after a gap the process may have run in)
and the resting path; and how long after a run's end the continuer's thread sent its SIGCONT. A
request's latency runs from its arrival to its end. ``--stand-in`` separates the process's CPU time
from its memory traffic: once it has run the model, the stand-in runs the model's loop, a loop that
stays in the core's own cache, or a stream through memory. The machine's steal time (what the host
took from its virtual CPUs) is summed per path. The JSON file (``--json``: a folder takes
``continue_paths-<models>-<date>.json``) keeps every latency (µs) by path and state.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import auto_bench  # noqa: E402
from served_requests import percentile  # noqa: E402

PATHS = ("stock", "thread", "serving", "stock_aa")
SERVED = {"thread": True, "serving": False}  # path -> defer_continue
SLOW = 4.0  # a request over this many times stock's p50 counts as slow
STAND_IN = """import sys, pathlib
sys.path.insert(0, {tools!r})
import auto_bench, onnxruntime as ort
path, feeds = auto_bench.model_and_feeds({name!r})
so = ort.SessionOptions(); so.intra_op_num_threads = {threads}
session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
session.run(None, feeds[0])
pathlib.Path({ready!r}).touch()
while True:
    session.run(None, feeds[0])
"""
# The stand-in's work apart from the model, on as many threads as the model's runs (numpy lets go of the
# interpreter in both): CPU time with next to no memory traffic (a square root over 16 KiB, in the core's
# own cache), or a stream through buffers beyond the last-level cache (memory traffic, every line evicted)
WORK = {"model": "", "spin": "a = np.full(2048, 2.0)\n    while True:\n        np.sqrt(a, out=a)\n",
        "stream": "a = np.ones(1 << 23); b = np.empty_like(a)\n    while True:\n        np.copyto(b, a)\n"}
THREADED = """import threading, numpy as np
def work():
    {work}
for _ in range({threads} - 1):
    threading.Thread(target=work, daemon=True).start()
work()
"""


def _stand_in(name: str, threads: int, folder: str, work: str = "model") -> subprocess.Popen:
    """The stand-in tuning process, stopped once it has run the model (``work``: what it runs then, the
    model's loop or one of ``WORK``)."""
    from ortfuse.foundation import child_process

    ready = os.path.join(folder, "ready")
    code = STAND_IN.format(tools=str(Path(__file__).resolve().parent), name=name, threads=threads, ready=ready)
    if WORK[work]:
        code = code[:code.index("while True:")] + THREADED.format(work=WORK[work], threads=threads)
    process = subprocess.Popen(child_process.idle_argv([sys.executable, "-c", code]))
    deadline = time.monotonic() + 120
    while not os.path.exists(ready):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the stand-in process did not run {name}")
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGSTOP)
    return process


def child(name: str, args) -> dict:
    import tempfile

    import onnxruntime as ort

    from ortfuse.bench.run import DEFAULT_SETTLE_MS
    from ortfuse.foundation.session_options import measuring_options
    from ortfuse.runtime import served_runs

    path, feeds = auto_bench.model_and_feeds(name)
    cpu = ["CPUExecutionProvider"]
    spinning = args.spinning == "on"
    sessions = {p: ort.InferenceSession(path, measuring_options("ORT_ENABLE_ALL", threads=args.threads,
                                                                spinning=spinning), providers=cpu) for p in PATHS}
    for i in range(50):
        for s in sessions.values():
            s.run(None, feeds[i % 8])
    warm = []
    for _ in range(20):
        start = time.perf_counter()
        sessions["stock"].run(None, feeds[0])
        warm.append(time.perf_counter() - start)
    gap = auto_bench._gap_s(args.gap, statistics.median(warm) * 1e3)
    tuning = types.SimpleNamespace(recording=False, running=True, record=lambda feeds: None)
    served = {p: served_runs.ServedRuns(sessions[p], tuning, lambda: False, lambda s: None, defer)
              for p, defer in SERVED.items()}
    delays: list[float] = []
    send = served_runs._signal

    def timed(process, sig: str) -> None:  # the continuer's SIGCONT, after the end of the run before it
        if sig == "SIGCONT" and threading.current_thread().name == "ortfuse-continue":
            delays.append(time.perf_counter() - served["thread"]._ended)
        send(process, sig)

    served_runs._signal = timed
    run = ort.InferenceSession.run
    lat: dict[str, list[int]] = {}
    steal: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="ortfuse-continue-") as folder:
        process = _stand_in(name, args.threads, folder, args.stand_in)
        try:
            next_arrival, n, phase, end_at = time.perf_counter(), 0, 0, time.perf_counter() + args.seconds
            while time.perf_counter() < end_at:
                path_name = PATHS[phase % len(PATHS)]
                phase += 1
                live = served.get(path_name)
                if live is not None:
                    live.hold(process)
                before = _steal_ticks()
                until = time.perf_counter() + args.phase
                while time.perf_counter() < until:
                    time.sleep(max(0.0, next_arrival - time.perf_counter()))
                    arrival, feed = next_arrival, feeds[n % 8]
                    if live is None:
                        state = ""
                        sessions[path_name].run(None, feed)
                    else:
                        state = "_resting" if live._rest_left > 0 else "_counted"
                        live.counted(feed, run, sessions[path_name], None, feed, None)
                    end = time.perf_counter()
                    us = round((end - arrival) * 1e6)
                    lat.setdefault(path_name, []).append(us)
                    if state:
                        lat.setdefault(path_name + state, []).append(us)
                    n, next_arrival = n + 1, end + gap
                steal[path_name] = steal.get(path_name, 0) + _steal_ticks() - before
                if live is not None:
                    live.hold(None)
                    os.kill(process.pid, signal.SIGSTOP)
                if spinning:  # the phase's pool threads spin on and would take a core from the next phase
                    time.sleep(DEFAULT_SETTLE_MS / 1e3)
                    next_arrival = time.perf_counter()
        finally:
            process.kill()
            process.wait()
    return {"model": name, "gap_ms": round(gap * 1e3, 3), "summary": summary(lat),
            "continue_delay_us": {f"p{q}": round(percentile(delays, q / 100) * 1e6, 1) for q in (10, 50, 90)}
            if delays else None, "continues_sent": len(delays), "stand_in": args.stand_in,
            "steal_ticks": steal, "latencies_us": lat}


def _steal_ticks() -> int:
    """The machine's steal time so far (/proc/stat, in USER_HZ ticks: time its virtual CPUs were ready
    but the host ran something else); 0 where there is no such file."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return 0
    return int(fields[8]) if fields[0] == "cpu" and len(fields) > 8 else 0


def summary(lat: dict[str, list[int]]) -> dict:
    """Per path (and path_state): n, p50 / p99 / p99.9 over stock's (the same quantile), and the share
    of requests over ``SLOW`` times stock's p50."""
    stock = lat.get("stock")
    if not stock:
        return {}
    base = {q: percentile(stock, q) for q in (0.5, 0.99, 0.999)}
    out = {}
    for key, values in sorted(lat.items()):
        out[key] = {"n": len(values), "p50_us": percentile(values, 0.5),
                    **{f"p{q * 100:g}_over_stock": round(percentile(values, q) / base[q], 3) for q in base},
                    "slow_share": round(sum(v > SLOW * base[0.5] for v in values) / len(values), 4)}
    return out


def line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']}: {r['error']}"
    rows = [f"  {k}: n={v['n']} p50 {v['p50_us']:.0f} us; over stock p50 {v['p50_over_stock']}, "
            f"p99 {v['p99_over_stock']}, p99.9 {v['p99.9_over_stock']}; over {SLOW:g}x stock's p50: "
            f"{v['slow_share']:.2%}" for k, v in r["summary"].items()]
    delay = r.get("continue_delay_us")
    steal = r.get("steal_ticks")
    rows.append(f"  steal time by path (ticks): {steal}; stand-in: {r.get('stand_in', 'model')}")
    tail = (f"  the continuer's SIGCONT after the run's end: {delay} us ({r['continues_sent']} sent)" if delay
            else "  the continuer sent no SIGCONT")
    return "\n".join([f"{r['model']}: gap {r['gap_ms']} ms", *rows, tail])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="silero_vad_16k_op15", help="comma-separated names, as tools/auto_bench.py")
    ap.add_argument("--seconds", type=float, default=40.0, help="how long the serving loop runs")
    ap.add_argument("--phase", type=float, default=0.25, help="seconds each path serves at a time")
    ap.add_argument("--gap", default="2x", help="idle gap after each request: '50ms', or '2x' stock's p50")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every session and the stand-in")
    ap.add_argument("--spinning", choices=("on", "off"), default="off",
                    help="the sessions' pool threads spin after a run (ORT's default) or sleep at once")
    ap.add_argument("--stand-in", choices=sorted(WORK), default="model",
                    help="what the stand-in process runs: the model's loop (as the tuning's timings), a CPU loop "
                         "with next to no memory traffic, or a stream through buffers beyond the last-level cache")
    ap.add_argument("--json", default="", help="result file, or a folder for the default name")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if auto_bench.child_answered(args, child):
        return 0
    return auto_bench.serve_each("continue_paths", args, __file__, line)


if __name__ == "__main__":
    sys.exit(main())
