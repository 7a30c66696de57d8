"""``fusion="auto"`` on served traffic, per zoo model, against issue #16's targets: a fresh session with
an empty cache tunes in the idle gaps between served requests, ``wait_tuned(300)`` after 30 served
requests, then auto beside stock ORT and ``fusion=True``, and served latency while it tuned.

Usage::

    python tools/auto_bench.py --models db_text_detector[,yolov8n,...|all] [--threads 2] [--gap 2x]
                               [--served 30] [--wait 300] [--baseline-runs 60] [--runs 20] [--repeats 3]
                               [--json benchmarks/results/]

One process per model (``--child``), CPU provider, ORT_ENABLE_ALL, ORT's pool threads not spinning
(docs/ARCHITECTURE.md §8), a new empty ``ORTFUSE_CACHE_DIR`` (nothing known: the auto session starts
on stock ORT, ``ORTFUSE_TUNE`` unset = background). The machine's ops library is named with
``ORTFUSE_OPS_LIBRARY`` and numba's cache is the usual one, so the empty cache hides neither (as on a
machine where ortfuse is installed and ran before).

Served traffic: single requests, one at a time, each followed by an idle gap before the next, as an
online service that is not saturated sees them. ``--gap`` is milliseconds (``50ms``) or a multiple
of stock ORT's p50 on the model (``2x``, the default: the server is busy about a third of the time).
A saturated server leaves tuning no idle time; auto then stays on stock ORT and says so. The
requests cycle through 8 seeded sample feeds of the model's own shapes (``ortfuse.models``).

Phases:
1. ``stock_served``: the stock session, ``--baseline-runs`` requests with the gap (p50, p99);
2. the auto session is created (seconds) and served from a serving thread, with the gap; after
   ``--served`` requests the main thread calls ``wait_tuned(--wait)`` while serving goes on, and
   records what it returned and when; each request is labelled by the session's state when it
   started (``recording``, ``tuning``, ``after``);
3. ``stock_served_after``: the stock session again (the baseline's drift over the run);
4. interleaved (``ortfuse.bench.protocol``: single runs in Williams rounds, ``--repeats`` repeats of
   ``--runs`` passes, no gap): stock, a second stock session (the A/A control), the tuned auto
   session and a ``fusion=True`` session; each ratio is the median over repeats of p50 / stock p50.

Verdicts: ``tuned`` (wait_tuned returned True); ``auto_vs_stock`` <= 1.02, and
``auto_vs_stock_within_aa``: <= 1.02 or within the A/A control's largest deviation from 1 (the
run's noise floor; a session is another session even on the same plan); ``auto_vs_fusion_true``:
where ``fusion=True`` is faster than stock beyond the A/A control's noise (its slowest repeat below
the A/A's fastest), auto is within that noise of it (median ratio <= fusion=True's + the A/A's
largest deviation from 1); ``p99_tuning`` <= 1.25 x the
p99 of stock served with the same gap (before and after pooled). The JSON file (``--json``: a folder
takes ``auto_bench-<models>-<date>.json``) holds the raw latencies, settings, statuses, the auto
report's notes and the environment.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

AUTO_LIMIT = 1.02  # auto's p50 / stock's, beside the A/A control
P99_LIMIT = 1.25  # served p99 while tuning / stock's p99 with the same gap


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _summary(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": _pct(values, 0.5), "p99_ms": _pct(values, 0.99),
            "max_ms": max(values) if values else None}


def _gap_s(spec: str, stock_p50_ms: float) -> float:
    text = spec.strip().lower()
    if text.endswith("ms"):
        return float(text[:-2]) / 1e3
    if text.endswith("x"):
        return float(text[:-1]) * stock_p50_ms / 1e3
    raise SystemExit(f"--gap {spec!r}: give milliseconds ('50ms') or a multiple of stock's p50 ('2x')")


# --------------------------------------------------------------------------------------------- child


def child(name: str, args) -> dict:
    import onnxruntime as ort

    import ortfuse
    import ortfuse.models as zoo
    from ortfuse.bench import protocol
    from ortfuse.bench.environment import environment
    from ortfuse.runtime.session_options import measuring_options

    env_before = environment()
    path = zoo.resolve(name)
    feeds = [zoo.sample_inputs(name, seed=i) for i in range(8)]
    cpu = ["CPUExecutionProvider"]

    def options():
        return measuring_options("ORT_ENABLE_ALL", threads=args.threads)

    def timed(session, feed) -> float:
        start = time.perf_counter()
        session.run(None, feed)
        return (time.perf_counter() - start) * 1e3

    stock = ort.InferenceSession(path, options(), providers=cpu)
    warm = [timed(stock, feeds[i % 8]) for i in range(5)]
    gap = _gap_s(args.gap, statistics.median(warm))
    lat: dict[str, list[float]] = {}

    def served_alone(label: str) -> None:
        lat[label] = []
        for i in range(args.baseline_runs):
            lat[label].append(timed(stock, feeds[i % 8]))
            time.sleep(gap)

    served_alone("stock_served")
    t0 = time.perf_counter()
    auto = ortfuse.InferenceSession(path, options(), providers=cpu, fusion="auto")
    created_s = time.perf_counter() - t0
    statuses = [auto.fusion_status]
    stop = threading.Event()
    count = [0]
    reached = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            status = auto.fusion_status
            if status != statuses[-1]:
                statuses.append(status)
            label = ("auto_recording" if status.startswith("serving stock ORT, recording") else
                     "auto_tuning" if status.startswith("tuning") else "auto_after")
            lat.setdefault(label, []).append(timed(auto, feeds[count[0] % 8]))
            count[0] += 1
            if count[0] >= args.served:
                reached.set()
                if auto.wait_tuned(0) and count[0] >= args.served + args.after_served:
                    return
            time.sleep(gap)

    server = threading.Thread(target=serve, name="served-traffic", daemon=True)
    started = time.perf_counter()
    server.start()
    reached.wait()
    waited_from = time.perf_counter()
    tuned = auto.wait_tuned(args.wait)
    tuned_at_s = time.perf_counter() - started
    waited_s = time.perf_counter() - waited_from
    stop.set()
    server.join(60)
    statuses.append(auto.fusion_status)
    served_alone("stock_served_after")

    sessions = {"stock": stock, "stock_aa": ort.InferenceSession(path, options(), providers=cpu), "auto": auto,
                "fusion_true": ortfuse.InferenceSession(path, options(), providers=cpu, fusion=True)}
    def runner(session):
        return lambda: session.run(None, feeds[0])

    raw = protocol.measure({k: runner(s) for k, s in sessions.items()}, runs=args.runs, repeats=args.repeats, warmup=2)
    ratios = {k: protocol.ratio_per_repeat(v, raw["stock"]) for k, v in raw.items() if k != "stock"}
    med = {k: statistics.median(v) for k, v in ratios.items()}
    noise = max(max(abs(x - 1) for x in ratios["stock_aa"]), 0.0)
    true_faster = max(ratios["fusion_true"]) < min(ratios["stock_aa"])
    stock_p99 = _pct(lat["stock_served"] + lat["stock_served_after"], 0.99)
    tuning_p99 = _pct(lat.get("auto_tuning", []), 0.99)
    verdicts = {
        "tuned": tuned,
        "auto_vs_stock": med["auto"] <= AUTO_LIMIT,
        "auto_vs_stock_within_aa": med["auto"] <= max(AUTO_LIMIT, 1 + noise),
        "fusion_true_faster": true_faster,
        "auto_vs_fusion_true": (med["auto"] <= med["fusion_true"] + noise) if true_faster else None,
        "p99_tuning": (tuning_p99 / stock_p99 <= P99_LIMIT) if tuning_p99 and stock_p99 else None,
    }
    report = auto.fusion_report
    return {
        "model": name, "gap_ms": round(gap * 1e3, 2), "created_s": round(created_s, 3),
        "served_before_wait": args.served, "wait_tuned": tuned, "waited_s": round(waited_s, 2),
        "tuning_ended_after_s": round(tuned_at_s, 2) if tuned else None, "served_total": count[0],
        "statuses": statuses, "fused": len(report.fused), "matches": len(report.matches), "notes": report.notes,
        "summary": {k: _summary(v) for k, v in lat.items()},
        "p99_tuning_over_stock": round(tuning_p99 / stock_p99, 3) if tuning_p99 and stock_p99 else None,
        "ratios_per_repeat": {k: [round(x, 4) for x in v] for k, v in ratios.items()},
        "ratios": {k: round(v, 4) for k, v in med.items()}, "aa_noise": round(noise, 4),
        "verdicts": verdicts, "latencies_ms": lat, "interleaved_ms": raw,
        "environment": env_before, "load_average_after": os.getloadavg(),
    }


# -------------------------------------------------------------------------------------------- parent


def run_child(name: str, args) -> dict:
    from ortfuse.custom_ops.aot.library import library_path
    from ortfuse.runtime.cache_paths import NUMBA, cache_dir

    env = {**os.environ, "ORTFUSE_CACHE_DIR": tempfile.mkdtemp(prefix="ortfuse-auto-bench-")}
    env.setdefault("NUMBA_CACHE_DIR", str(cache_dir(NUMBA)))
    env.setdefault("ORTFUSE_OPS_LIBRARY", str(library_path()))
    env.pop("ORTFUSE_TUNE", None)
    argv = [sys.executable, __file__, "--child", name, *sys.argv[1:]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=args.wait + 900)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        return {"model": name, "error": (done.stderr or done.stdout).strip()[-2000:]}
    return json.loads(line[len("RESULT "):])


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']}: FAILED\n{r['error']}"
    v, q, s = r["verdicts"], r["ratios"], r["summary"]
    tuning = s.get("auto_tuning", {})
    return (f"{r['model']}: created {r['created_s']:.2f} s; gap {r['gap_ms']:.1f} ms; wait_tuned({r['waited_s']:.0f} s "
            f"after {r['served_before_wait']} served) -> {r['wait_tuned']}; final: {r['statuses'][-1]}\n"
            f"  p50 / stock: auto {q['auto']:.3f}, fusion=True {q['fusion_true']:.3f}, A/A {q['stock_aa']:.3f} "
            f"(repeats {r['ratios_per_repeat']['stock_aa']})\n"
            f"  served while tuning: n={tuning.get('n', 0)}, p99 {tuning.get('p99_ms') or 0:.2f} ms = "
            f"{r['p99_tuning_over_stock']}x stock's p99 {s['stock_served']['p99_ms']:.2f} / "
            f"{s['stock_served_after']['p99_ms']:.2f} ms (before / after)\n"
            f"  verdicts: {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="db_text_detector", help="comma-separated zoo names, or 'all'")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every session (0: ORT's default)")
    ap.add_argument("--gap", default="2x", help="idle gap after each served request: '50ms', or '2x' stock's p50")
    ap.add_argument("--served", type=int, default=30, help="served requests before wait_tuned is called")
    ap.add_argument("--after-served", type=int, default=10, help="requests served after the tuning ended")
    ap.add_argument("--wait", type=float, default=300.0, help="wait_tuned's timeout (s)")
    ap.add_argument("--baseline-runs", type=int, default=60, help="stock requests with the gap, before and after")
    ap.add_argument("--runs", type=int, default=20, help="interleaved passes per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="", help="result file, or a folder for the default name")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args)))
        return 0
    from ortfuse.models import NAMES

    names = list(NAMES) if args.models == "all" else [m for m in args.models.split(",") if m]
    results = []
    for name in names:
        try:
            results.append(run_child(name, args))
        except Exception as exc:  # a timeout or unreadable result: reported, the other models still run
            results.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})
        print(_line(results[-1]), flush=True)
    if args.json:
        from ortfuse.bench.output import result_file

        target = Path(result_file(args.json, f"auto_bench-{'+'.join(names)}-{_dt.date.today().isoformat()}"))
        target.write_text(json.dumps({"tool": "auto_bench", "settings": vars(args), "results": results}, indent=1))
        print(f"wrote {target}")
    targets = ("tuned", "auto_vs_stock", "auto_vs_fusion_true", "p99_tuning")
    ok = all("error" not in r and all(r["verdicts"][k] is not False for k in targets) for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
