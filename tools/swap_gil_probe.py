"""How long ORT holds the GIL while it creates a session, from a model's bytes and from its path: the
question behind the live swap (``ortfuse.runtime.live_tuning``), whose new session is created in the
serving process while other threads serve.

Usage::

    python tools/swap_gil_probe.py [--models pplcnet_classifier,minilm_encoder_dynamo] [--rounds 3]
                                   [--threads 2] [--json benchmarks/results/]

A ticker thread sleeps 0.2 ms at a time and records how late it wakes; while ORT creates a session
(``C.InferenceSession(...)``: the model is read and parsed; ``initialize_session``: graph
optimizations, kernels) in the main thread, the longest of those delays is how long a served run
starting then would have waited for the GIL (plus the scheduler's delay, which the idle baseline
shows). The first round in a process pays one-time costs (ORT's environment, the model file's pages
read from disk); later rounds show the steady state. CPU provider, ``--threads`` intra-op threads,
pool threads not spinning. The JSON file holds every round's figures and the environment.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

TICK_S = 0.0002


class Ticker:
    """A thread recording (wake time, delay) of each of its ``TICK_S`` sleeps."""

    def __init__(self) -> None:
        self.ticks: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(TICK_S)
            now = time.perf_counter()
            self.ticks.append((now, now - last))
            last = now

    def __enter__(self) -> Ticker:
        self._thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.02)
        self._stop.set()
        self._thread.join()

    def longest_ms(self, start: float, end: float) -> float:
        """The longest wait between two ticks that overlapped [start, end]."""
        return 1e3 * max((d for t, d in self.ticks if t > start and t - d < end), default=0.0)


def probe(name: str, rounds: int, threads: int) -> dict:
    from onnxruntime.capi import _pybind_state as C

    import ortfuse.models as zoo
    from ortfuse.foundation.session_options import measuring_options

    path = zoo.resolve(name)
    data = Path(path).read_bytes()
    rows = []
    with Ticker() as ticker:
        idle_from = time.perf_counter()
        time.sleep(0.1)
        idle = statistics.median(d for t, d in ticker.ticks if t > idle_from) * 1e3
        for r in range(rounds):
            for kind, arg, is_path in (("bytes", data, False), ("path", path, True)):
                options = measuring_options("ORT_ENABLE_ALL", threads=threads)
                t0 = time.perf_counter()
                sess = C.InferenceSession(options, arg, is_path, True)
                t1 = time.perf_counter()
                sess.initialize_session(["CPUExecutionProvider"], [{}], set())
                t2 = time.perf_counter()
                del sess
                time.sleep(0.03)
                rows.append({"round": r, "source": kind, "create_ms": round((t1 - t0) * 1e3, 2),
                             "create_longest_wait_ms": round(ticker.longest_ms(t0, t1), 2),
                             "initialize_ms": round((t2 - t1) * 1e3, 2),
                             "initialize_longest_wait_ms": round(ticker.longest_ms(t1, t2), 2)})
    return {"model": name, "model_mb": round(len(data) / 2**20, 2), "idle_tick_ms": round(idle, 3), "rounds": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="pplcnet_classifier,minilm_encoder_dynamo,mlp_gemm_relu_gelu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="", help="result file, or a folder for the default name")
    args = ap.parse_args(argv)
    from ortfuse.bench.environment import environment

    results = []
    for name in [m for m in args.models.split(",") if m]:
        results.append(probe(name, args.rounds, args.threads))
        r = results[-1]
        print(f"{name} ({r['model_mb']} MB; an idle tick takes {r['idle_tick_ms']} ms):")
        for row in r["rounds"]:
            print(f"  round {row['round']} from {row['source']:5s}: create {row['create_ms']:7.1f} ms "
                  f"(longest GIL wait {row['create_longest_wait_ms']:6.1f} ms), initialize {row['initialize_ms']:7.1f} "
                  f"ms (longest wait {row['initialize_longest_wait_ms']:6.1f} ms)")
    if args.json:
        from ortfuse.bench.output import result_file

        names = "+".join(r["model"] for r in results)
        target = Path(result_file(args.json, f"swap_gil_probe-{names}-{_dt.date.today().isoformat()}"))
        target.write_text(json.dumps({"tool": "swap_gil_probe", "settings": vars(args), "results": results,
                                      "environment": environment()}, indent=1))
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
