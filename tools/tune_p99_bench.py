"""Served-run latency of ``fusion="auto"`` while it tunes on live traffic, against stock ORT.

(Issue #16's targets as a whole, on every zoo model, with realistic idle gaps: ``tools/auto_bench.py``.)

Usage::

    python tools/tune_p99_bench.py [--model mobilenetv3_block] [--threads 0] [--gap-ms 2]
                                   [--baseline-runs 200] [--after-runs 200] [--max-seconds 100]
                                   [--cold-numba] [--json benchmarks/results/]

One process, CPU provider, ORT_ENABLE_ALL, ORT's pool threads not spinning (docs/ARCHITECTURE.md §8).
The model is built with the usual cache; the plan and tuning caches (``ORTFUSE_CACHE_DIR``) are a new
empty folder, so the ``fusion="auto"`` session (``ortfuse.tune=background``, the default) starts on
stock ORT, records its first served feeds, tunes in its background thread and swaps. numba's cache
is the usual one (kernels compiled before are loaded, as on a machine that ran ortfuse before)
unless ``--cold-numba``.

Phases, single requests with ``--gap-ms`` idle between them (a served model is not saturated):
1. ``stock_before``: the stock session alone, ``--baseline-runs`` requests;
2. the auto session alone, as a server with one session serves, until it is tuned (or
   ``--max-seconds``); each latency labelled by its state when the request started: ``recording``,
   ``tuning`` (a request interleaved with another session here would hide the tuning's stalls from
   this one: the tuning pauses only for its own session's runs);
3. the protocol of docs/ARCHITECTURE.md §8 (``ortfuse.bench.protocol``: single runs interleaved in
   Williams rounds, 3 repeats, ``--after-runs`` passes each) over stock, a second stock session (the
   A/A control), the tuned auto session and a ``fusion=True`` session: ``stock_after_swap``,
   ``stock_aa``, ``auto_fused`` (or ``auto_stock`` when nothing was kept), ``fusion_true``;
4. ``stock_after``: the stock session alone again (the baseline's drift over the run).

Prints p50/p99 per label and the ratios the issue's target names: auto's p99 while tuning over the
stock baselines' p99 (before, after), and the p50 ratios of phase 3 to stock (median over repeats,
with each repeat's): auto after the swap, ``fusion=True``, and the A/A control;
time from the first served request to ``wait_tuned``; creation times.
The JSON result (``--json``: a folder takes ``tune_p99_bench-<model>-<date>.json``) holds the raw
latencies, the settings, the status lines and the environment.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _summary(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": _pct(values, 0.5), "p99_ms": _pct(values, 0.99),
            "mean_ms": statistics.fmean(values) if values else None}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenetv3_block", help="zoo model name or .onnx path")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ORT's default)")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="idle time between requests")
    ap.add_argument("--baseline-runs", type=int, default=200)
    ap.add_argument("--after-runs", type=int, default=200, help="rounds after the auto session is tuned")
    ap.add_argument("--max-seconds", type=float, default=100.0, help="stop serving after this long")
    ap.add_argument("--cold-numba", action="store_true", help="an empty numba cache too")
    ap.add_argument("--json", default="", help="result file, or a folder for the default name")
    args = ap.parse_args(argv)

    import ortfuse.models as zoo
    from ortfuse.runtime.cache_paths import NUMBA, cache_dir

    model_path = zoo.resolve(args.model)
    workdir = tempfile.mkdtemp(prefix="ortfuse-tune-p99-")
    if not os.environ.get("NUMBA_CACHE_DIR"):
        os.environ["NUMBA_CACHE_DIR"] = str(Path(workdir) / "numba") if args.cold_numba else str(cache_dir(NUMBA))
    os.environ["ORTFUSE_CACHE_DIR"] = workdir
    os.environ.pop("ORTFUSE_TUNE", None)

    import onnx
    import onnxruntime as ort

    import ortfuse
    from ortfuse.bench import protocol
    from ortfuse.bench.environment import environment
    from ortfuse.ir import feeds as feeding
    from ortfuse.runtime.session_options import measuring_options

    env_before = environment()
    declared = feeding.declared_inputs(model_path)
    graph = onnx.load(model_path, load_external_data=False)
    feeds = [feeding.random_feeds(declared, seed=i, model=graph) for i in range(16)]
    providers = ["CPUExecutionProvider"]

    t0 = time.perf_counter()
    stock = ort.InferenceSession(model_path, measuring_options("ORT_ENABLE_ALL", threads=args.threads),
                                 providers=providers)
    stock_create_s = time.perf_counter() - t0
    gap = args.gap_ms / 1e3

    def timed(session, feed) -> float:
        start = time.perf_counter()
        session.run(None, feed)
        return (time.perf_counter() - start) * 1e3

    for i in range(5):  # warm-up, untimed
        timed(stock, feeds[i % len(feeds)])
    lat: dict[str, list[float]] = {}

    def alone(name: str) -> None:
        lat[name] = []
        for i in range(args.baseline_runs):
            lat[name].append(timed(stock, feeds[i % len(feeds)]))
            time.sleep(gap)

    alone("stock_before")
    t0 = time.perf_counter()
    auto = ortfuse.InferenceSession(model_path, measuring_options("ORT_ENABLE_ALL", threads=args.threads),
                                    providers=providers, fusion="auto")
    auto_create_s = time.perf_counter() - t0
    statuses = [auto.fusion_status]
    started = time.perf_counter()
    tuned_after_s = None
    served = 0
    while not auto.wait_tuned(0) and time.perf_counter() - started < args.max_seconds:
        status = auto.fusion_status
        if status != statuses[-1]:
            statuses.append(status)
        phase = "recording" if status.startswith("serving stock ORT, recording") else "tuning"
        lat.setdefault(f"auto_{phase}", []).append(timed(auto, feeds[served % len(feeds)]))
        served += 1
        time.sleep(gap)
    if auto.wait_tuned(0):
        tuned_after_s = time.perf_counter() - started
    statuses.append(auto.fusion_status)
    after = "fused" if auto.fusion_status.startswith("fused") else "stock"
    phase3: dict[str, list[float]] = {}
    if tuned_after_s is not None:
        options = measuring_options("ORT_ENABLE_ALL", threads=args.threads)
        sessions = {"stock_after_swap": stock, f"auto_{after}": auto,
                    "stock_aa": ort.InferenceSession(model_path, options, providers=providers),
                    "fusion_true": ortfuse.InferenceSession(model_path, measuring_options("ORT_ENABLE_ALL",
                                                            threads=args.threads), providers=providers, fusion=True)}
        raw = protocol.measure({k: (lambda s=s: s.run(None, feeds[0])) for k, s in sessions.items()},
                               runs=max(1, args.after_runs // 3), repeats=3, warmup=1, gap_s=gap)
        for name, per_repeat in raw.items():
            lat[name] = [x for rep in per_repeat for x in rep]
            if name != "stock_after_swap":
                phase3[name] = protocol.ratio_per_repeat(per_repeat, raw["stock_after_swap"])
    alone("stock_after")

    summary = {k: _summary(v) for k, v in lat.items()}
    during = summary.get("auto_tuning", {}).get("p99_ms")
    ratios = {
        "auto_tuning_p99_over_stock_before_p99": _ratio(during, summary["stock_before"]["p99_ms"]),
        "auto_tuning_p99_over_stock_after_p99": _ratio(during, summary["stock_after"]["p99_ms"]),
        "auto_recording_p99_over_stock_before_p99": _ratio(summary.get("auto_recording", {}).get("p99_ms"),
                                                           summary["stock_before"]["p99_ms"]),
    }
    for name, per_repeat in phase3.items():  # interleaved with stock: median over repeats, and each repeat
        ratios[f"{name}_p50_over_stock"] = round(statistics.median(per_repeat), 4)
        ratios[f"{name}_p50_over_stock_per_repeat"] = [round(x, 4) for x in per_repeat]
    result = {
        "tool": "tune_p99_bench", "model": args.model, "settings": vars(args),
        "creation_s": {"stock": round(stock_create_s, 3), "auto": round(auto_create_s, 3)},
        "tuned_after_s": round(tuned_after_s, 2) if tuned_after_s is not None else None,
        "tuned_after_requests": served, "statuses": statuses,
        "fused": [m.pattern_id for m in auto.fusion_report.fused], "matches": len(auto.fusion_report.matches),
        "summary": summary, "ratios": ratios, "latencies_ms": lat,
        "environment": env_before, "load_average_after": environment()["load_average_1_5_15"],
    }
    print(f"model {args.model}: creation stock {stock_create_s:.2f} s, auto {auto_create_s:.2f} s; "
          f"tuned after {result['tuned_after_s']} s ({served} requests); final: {statuses[-1]}")
    for name, s in summary.items():
        p50, p99 = s["p50_ms"], s["p99_ms"]
        print(f"  {name:22s} n={s['n']:5d}  p50 {p50:8.3f} ms  p99 {p99:8.3f} ms  max {max(lat[name]):8.3f} ms"
              if p50 is not None else name)
    for name, value in ratios.items():
        print(f"  {name}: {value}")
    if args.json:
        from ortfuse.bench.output import result_file

        target = Path(result_file(args.json, f"tune_p99_bench-{Path(args.model).stem}-{_dt.date.today().isoformat()}"))
        target.write_text(json.dumps(result, indent=1))
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
