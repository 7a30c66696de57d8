"""``fusion="auto"`` on served traffic, per zoo model, against its verdicts (below): a fresh session with
an empty cache tunes in the idle gaps between served requests, ``wait_tuned(300)`` after 30 served
requests, then auto beside stock ORT and ``fusion=True``, and served latency while it tuned.

Usage::

    python tools/auto_bench.py --models db_text_detector[,yolov8n,...|all|public|tiny_ffn|MODEL.onnx]
                               [--dim NAME=N] [--threads 2] [--gap 2x] [--served 30] [--wait 300] [--block 8]
                               [--passes 1] [--runs 20] [--repeats 3] [--alone [--phase 0.25]]
                               [--json benchmarks/results/]

Models: zoo names (``all``: the zoo), the public models (``public``: real trained models,
``ortfuse.models.public``, at their natural shapes) and ``tiny_ffn``, built here (a seeded 3-layer
FFN whose run takes about 0.1 ms: the wrapper's cost per run shows on it), and .onnx files such as
the real exports of ``tools/export_encoder.py`` (feeds made as ``ortfuse bench`` makes them, dynamic
dims named by ``--dim``, e.g. ``--dim sequence=128``; other dynamic dims 128, the batch 1).

One process per model and pass (``--child``), CPU provider, ORT_ENABLE_ALL, ORT's pool threads not
spinning (docs/ARCHITECTURE.md §8; ``--spinning on``: spinning, ORT's default, for every session the
bench serves and times, so the served session's threads spin in the gaps the tuning runs in), a new
empty ``ORTFUSE_CACHE_DIR`` (nothing known: the auto session starts on stock ORT, ``ORTFUSE_TUNE``
unset = background). The machine's ops library is named with ``ORTFUSE_OPS_LIBRARY`` and numba's
cache is the usual one, so the empty cache hides neither (as on a machine where ortfuse is installed
and ran before).

Served traffic: single requests, one at a time, each arriving an idle gap after the previous one
ended, as an online service that is not saturated sees them. A request's latency runs from its
arrival to its end: a serving thread that wakes late (a core taken) counts. ``--gap`` is
milliseconds (``50ms``) or a multiple of stock ORT's p50 on the model (``2x``, the default: the
server is busy about a third of the time). A saturated server leaves tuning no idle time; auto then
stays on stock ORT and says so. The requests cycle through 8 seeded sample feeds of the model's own
shapes (``ortfuse.models``), one after the other across all blocks, so that every session is served
the same feeds (with the default block of 8, every block the 8 in the same order; runs cycling
through feeds are slower than runs repeating one).

Phases:
1. the gap is set from a throwaway stock session's runs; the two stock sessions are created cold,
   as the auto session is: every session's first served runs (a new session's first runs are slower
   on every model) count alike;
   the auto session is created (seconds); a serving thread serves blocks of ``--block`` requests in
   turn: auto, stock, auto, a second stock session (the A/A control), ... While a stock block runs,
   the live tuning is held as during one long served run (its process stopped, its timing in flight
   discarded): stock is served with no tuning going on, in the same minutes, on the same machine
   load, as the auto requests are served with tuning going on between them. After ``--served`` auto
   requests the main thread calls ``wait_tuned(--wait)`` while serving goes on, and records what it
   returned and when; each request is labelled by auto's state when it arrived (``recording``,
   ``tuning``, ``after``). The tuning gets about half the wall-clock time it would get alone.
   ``--alone``: blocks of ``--phase`` seconds instead (``--block`` requests at least): each auto
   block is a serving loop of auto alone, through which the tuning process runs its bursts and
   rests as on a server with nothing else to serve, and stock's blocks alternate with them as
   above. Stock served only before or after the tuning cannot be its reference: a shared machine
   drifts by more than the p50 target from one minute to the next, and blocks that alternate
   through the tuning meet the same drift. With ``--spinning on`` the last block's session's pool
   threads spin on into the next block (``tools/served_turns.py`` serves each session from a
   process of its own, stopped between its turns, for that);
   time to the plan: served runs and seconds from the first served run until the final plan took
   effect (``LiveTuning.time_to_plan``), with the tuning process's CPU seconds;
2. interleaved (``ortfuse.foundation.protocol``: single runs in Williams rounds, ``--repeats`` repeats of
   ``--runs`` passes, no gap; with ``--spinning on`` each slot a block of 20 runs after an idle 120
   ms and one untimed run, as ``ortfuse bench --block``): stock, the A/A stock session, the tuned auto session and a
   ``fusion=True`` session and a second ``fusion=True`` session (the fused A/A control: the same plan
   in another session); each ratio is the median over repeats of p50 / stock p50.

Verdicts: ``tuned`` (wait_tuned returned True); ``auto_vs_stock`` <= 1.02, and
``auto_vs_stock_within_aa``: <= 1.02 or within the A/A control's largest deviation from 1 (the
run's noise floor; a session is another session even on the same plan); ``auto_vs_fusion_true``:
where ``fusion=True`` is faster than stock beyond the A/A control's noise (its slowest repeat below
the A/A's fastest), auto is within the noise of fusion=True (median ratio <= fusion=True's + the
larger of the stock A/A's and the fused A/A's largest deviation from 1: auto serves the plan
fusion=True makes, in another session, and two sessions of one fused plan differ by more than two
stock ones); ``p99_tuning`` and ``p50_tuning``: the p99 (p50) of auto's requests served while it
recorded and tuned <= 1.25 (1.05) x that of the stock blocks' requests served in the same span (both
stock sessions pooled: as many requests as auto's), each
printed beside its A/A ratio (second stock session over the first, each on half as many requests: a
wider noise floor than the figure's). ``--passes N`` repeats the whole run
in N fresh processes; the verdicts are then judged on the medians over passes, each pass's ratio
and A/A shown. The JSON file (``--json``: a folder takes ``auto_bench-<models>-<date>.json``) holds
the raw latencies, every served request (arrival, block, state, ms, the tuning process in the gap
before it: running, stopped or none, and the serving thread's wake-up in ms), the live tuning's
steps on the same clock (``tuning_timeline``: child started / ended, plan prepared, the plan's
session built and checked, swapped), the requests served while tuning counted by the step in
effect when each arrived with those over 1.5x stock's p50 (``slow_by_step``: where the slow ones
fall) and grouped by the tuning process in the gap before them (``by_gap``), settings,
statuses, the auto report's notes, the fusion=True session's (its layout plan) and the environment.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the tool measures the ortfuse of its own checkout, put first on the path (before any PYTHONPATH)
# unless the path already holds it: to compare two trees, run each tree's own tool (``checkout``
# prints which one ran)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from served_requests import (  # noqa: E402
    DURING,
    SLOW,
    by_gap,
    gap_state,
    latency_summary,
    phase,
    slow_by_step,
    tuning_ratios,
)

AUTO_LIMIT = 1.02  # auto's p50 / stock's, beside the A/A control
P99_LIMIT = 1.25  # served p99 while tuning / stock's p99 with the same gap
P50_LIMIT = 1.05  # served p50 while tuning / stock's p50 with the same gap
SPIN_BLOCK = 20  # --spinning on: runs per block of the interleaved phase (after ortfuse bench's settle)


def _gap_s(spec: str, stock_p50_ms: float) -> float:
    text = spec.strip().lower()
    if text.endswith("ms"):
        return float(text[:-2]) / 1e3
    if text.endswith("x"):
        return float(text[:-1]) * stock_p50_ms / 1e3
    raise SystemExit(f"--gap {spec!r}: give milliseconds ('50ms') or a multiple of stock's p50 ('2x')")


def cold_stock_p50_ms(path: str, options, feeds: list[dict]) -> float:
    """Stock ORT's p50 (ms) over 10 runs of a throwaway session made cold, as the served sessions are,
    cycling through ``feeds``: what ``--gap 2x`` multiplies."""
    import onnxruntime as ort

    gauge = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    runs = []
    for i in range(10):
        start = time.perf_counter()
        gauge.run(None, feeds[i % len(feeds)])
        runs.append((time.perf_counter() - start) * 1e3)
    return statistics.median(runs)


# --------------------------------------------------------------------------------------------- child


TINY = "tiny_ffn"  # built here: a model whose run takes about 0.1 ms (the wrapper's cost per run shows)


def tiny_ffn(folder: str, width: int = 448, layers: int = 3) -> str:
    """A seeded FFN stack, x [1, 8, width] -> (MatMul, Add bias, Add x, Relu) x ``layers``: 3-D
    MatMul+Add and two-input Add+Relu, patterns ortfuse matches, in a model of about 0.1 ms; its path."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits += [numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(width)).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"bias{i}"),
                  helper.make_node("Add", [f"a{i}", x], [f"s{i}"], name=f"residual{i}"),
                  helper.make_node("Relu", [f"s{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    shape = [1, 8, width]
    graph = helper.make_graph(nodes, TINY, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], inits)
    path = os.path.join(folder, f"{TINY}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def model_and_feeds(name: str, dims: dict[str, int] | None = None) -> tuple[str, list[dict]]:
    """The model's path and 8 seeded feeds: ``tiny_ffn`` (built here, in the run's cache folder), else
    as ``ortfuse bench`` makes them (``ortfuse.bench.inputs``): a public model fetched into the cache
    at its natural shape, a zoo model, or an .onnx file, with the named dynamic ``dims``."""
    from ortfuse.bench.inputs import make_inputs, resolve_model

    if name == TINY:
        import numpy as np

        path = tiny_ffn(os.environ.get("ORTFUSE_CACHE_DIR") or tempfile.mkdtemp(prefix="ortfuse-auto-bench-"))
        return path, [{"x": np.random.default_rng(i).standard_normal((1, 8, 448)).astype(np.float32)}
                      for i in range(8)]
    src = resolve_model(name, dims=dims)
    return src.path, [make_inputs(src, 1, seed=i, check=i == 0) for i in range(8)]


def label(name: str) -> str:
    """A model's name in result file names: a file's stem, else the name."""
    return Path(name).stem if name.lower().endswith(".onnx") else name


def child(name: str, args) -> dict:
    import onnxruntime as ort

    import ortfuse
    from ortfuse.bench.environment import environment
    from ortfuse.foundation import protocol
    from ortfuse.foundation.session_options import measuring_options
    from ortfuse.ir.model_args import parse_dims

    env_before = environment()
    path, feeds = model_and_feeds(name, parse_dims(args.dim))
    cpu = ["CPUExecutionProvider"]

    def options():
        return measuring_options("ORT_ENABLE_ALL", threads=args.threads, spinning=args.spinning == "on")

    gap = _gap_s(args.gap, cold_stock_p50_ms(path, options(), feeds))
    # every served session is served from its creation: its first, cold runs count as auto's do
    stock = ort.InferenceSession(path, options(), providers=cpu)
    stock_aa = ort.InferenceSession(path, options(), providers=cpu)
    t0 = time.perf_counter()
    auto = ortfuse.InferenceSession(path, options(), providers=cpu, fusion="auto")
    created_s = time.perf_counter() - t0
    live = getattr(auto, "_ortfuse_live", None)  # the live tuning: a stock block holds it, as a served run does
    statuses = [auto.fusion_status]
    stop = threading.Event()
    count = [0]
    reached = threading.Event()
    lat: dict[str, list[float]] = {}
    trace: list[tuple[float, str, str, float, str, float]] = []  # (arrival s, block, state, ms, gap_state, wake ms)

    def state() -> str:
        status = auto.fusion_status
        if status != statuses[-1]:
            statuses.append(status)
        return phase(status)

    def serve_block(block: str, seconds: float = 0.0) -> None:
        """``--block`` requests of ``block``, or more until ``seconds`` have passed (``--alone``)."""
        session = {"auto": auto, "stock": stock, "stock_aa": stock_aa}[block]
        held = live.served if live is not None and block != "auto" else None
        if held is not None:  # the stock blocks see no tuning work: the tuning waits as for a long served run
            held.begin()
        try:
            until, served = time.perf_counter() + seconds, 0
            while served < args.block or time.perf_counter() < until:
                label = state()
                arrival = next_arrival[0]  # the request arrived then: a late wake-up is part of its latency
                time.sleep(max(0.0, arrival - time.perf_counter()))
                woke = time.perf_counter()
                process = gap_state(live.served if live is not None else None)
                session.run(None, feeds[len(trace) % len(feeds)])  # every session the same feeds in turn
                end = time.perf_counter()
                ms = (end - arrival) * 1e3
                lat.setdefault(f"{block}_{label}", []).append(ms)
                trace.append((round(arrival - started, 4), block, label, round(ms, 3), process,
                              round((woke - arrival) * 1e3, 4)))
                count[0] += block == "auto"
                served += 1
                next_arrival[0] = end + gap
        finally:
            if held is not None:
                held.end()

    def serve() -> None:
        cycle, seconds = 0, args.phase if args.alone else 0.0
        while not stop.is_set():
            serve_block("auto", seconds)
            serve_block(("stock", "stock_aa")[cycle % 2], seconds)
            cycle += 1
            if count[0] >= args.served:
                reached.set()
                if auto.wait_tuned(0) and count[0] >= args.served + args.after_served:
                    break

    server = threading.Thread(target=serve, name="served-traffic", daemon=True)
    started = time.perf_counter()  # the clock of the trace and the timeline: the first request arrives now
    next_arrival = [started]
    server.start()
    reached.wait()
    waited_from = time.perf_counter()
    tuned = auto.wait_tuned(args.wait)
    tuned_at_s = time.perf_counter() - started
    waited_s = time.perf_counter() - waited_from
    stop.set()
    server.join(60)
    statuses.append(auto.fusion_status)

    sessions = {"stock": stock, "stock_aa": stock_aa, "auto": auto,
                "fusion_true": ortfuse.InferenceSession(path, options(), providers=cpu, fusion=True),
                "fusion_true_aa": ortfuse.InferenceSession(path, options(), providers=cpu, fusion=True)}
    def runner(session):
        return lambda: session.run(None, feeds[0])

    # with spinning, one session's threads spin into the next one's run: blocks after a settle instead
    # (ortfuse bench --block; docs/ARCHITECTURE.md §8)
    from ortfuse.bench.run import DEFAULT_SETTLE_MS

    blocks = {"block": SPIN_BLOCK, "settle_s": DEFAULT_SETTLE_MS / 1e3} if args.spinning == "on" else {}
    raw = protocol.measure({k: runner(s) for k, s in sessions.items()}, runs=args.runs, repeats=args.repeats, warmup=2,
                           **blocks)
    ratios = {k: protocol.ratio_per_repeat(v, raw["stock"]) for k, v in raw.items() if k != "stock"}
    med = {k: statistics.median(v) for k, v in ratios.items()}
    noise = max(max(abs(x - 1) for x in ratios["stock_aa"]), 0.0)
    fused_noise = max(abs(a / f - 1) for a, f in zip(ratios["fusion_true_aa"], ratios["fusion_true"]))
    true_faster = max(ratios["fusion_true"]) < min(ratios["stock_aa"])
    # served while auto records and tunes, against stock served in the same minutes (blocks or phases)
    during_ratios = tuning_ratios(lat)
    p99_ratio, aa_p99_ratio = during_ratios["p99"], during_ratios["p99_aa"]
    verdicts: dict[str, bool | None] = {
        "tuned": tuned,
        "auto_vs_stock": med["auto"] <= AUTO_LIMIT,
        "auto_vs_stock_within_aa": med["auto"] <= max(AUTO_LIMIT, 1 + noise),
        "fusion_true_faster": true_faster,
        "auto_vs_fusion_true": (med["auto"] <= med["fusion_true"] + max(noise, fused_noise)) if true_faster else None,
        "p99_tuning": (p99_ratio <= P99_LIMIT) if p99_ratio else None,
        "p50_tuning": (during_ratios["p50"] <= P50_LIMIT) if during_ratios["p50"] else None,
    }
    report = auto.fusion_report
    timeline = [(event, round(t - started, 4)) for event, t in getattr(live, "timeline", [])]
    return {
        "model": name, "gap_ms": round(gap * 1e3, 2), "created_s": round(created_s, 3),
        "served_before_wait": args.served, "wait_tuned": tuned, "waited_s": round(waited_s, 2),
        "tuning_ended_after_s": round(tuned_at_s, 2) if tuned else None, "served_total": count[0],
        "statuses": statuses, "fused": len(report.fused), "matches": len(report.matches), "notes": report.notes,
        "fusion_true_notes": sessions["fusion_true"].fusion_report.notes,
        "time_to_plan": auto.time_to_plan,
        "tuning_timeline": timeline,
        "slow_by_step": slow_by_step(trace, timeline, during_ratios["stock_p50_ms"]),
        "by_gap": by_gap(trace),
        "summary": {k: latency_summary(v) for k, v in lat.items()},
        "p99_tuning_over_stock": round(p99_ratio, 3) if p99_ratio else None, "during_tuning": during_ratios,
        "alone": args.alone, "phase_s": args.phase if args.alone else None,
        "p99_aa": round(aa_p99_ratio, 3) if aa_p99_ratio else None, "block": args.block,
        "ratios_per_repeat": {k: [round(x, 4) for x in v] for k, v in ratios.items()},
        "ratios": {k: round(v, 4) for k, v in med.items()}, "aa_noise": round(noise, 4),
        "fused_aa_noise": round(fused_noise, 4),
        "verdicts": verdicts, "latencies_ms": lat, "served_trace": trace, "interleaved_ms": raw,
        "environment": env_before, "load_average_after": os.getloadavg(),
    }


# -------------------------------------------------------------------------------------------- parent


def checkout() -> str:
    """The folder the ortfuse this process measures was imported from."""
    import ortfuse

    return str(Path(ortfuse.__file__).resolve().parents[1])


def child_answered(args, child: Callable[[str, argparse.Namespace], dict]) -> bool:
    """In a ``--child`` process: ``child(args.child, args)`` printed as the RESULT line ``run_child``
    reads, and True; else False."""
    if not args.child:
        return False
    print("RESULT " + json.dumps(child(args.child, args)))
    return True


def machine_caches() -> dict[str, str]:
    """The machine's numba cache and ops library as the environment names them (these variables as
    set, else the ones under the current cache): a run with a new empty ``ORTFUSE_CACHE_DIR`` still
    finds the kernels compiled before, as on a machine where ortfuse ran before."""
    from ortfuse.custom_ops.aot.library import library_path
    from ortfuse.foundation.cache_paths import NUMBA, cache_dir

    found = {"NUMBA_CACHE_DIR": str(cache_dir(NUMBA)), "ORTFUSE_OPS_LIBRARY": str(library_path())}
    return {k: os.environ.get(k, v) for k, v in found.items()}


def serve_each(tool: str, args, script: str, line: Callable[[dict], str]) -> int:
    """A serving tool's run (``tools/served_path.py``, ``tools/continue_paths.py``): ``script --child``
    per model of ``args.models`` in a fresh process (``run_child``), each result printed by ``line``,
    and saved as ``<tool>-<models>-<date>.json`` where ``--json`` says; 1 if any model failed."""
    print(f"ortfuse from {checkout()}", flush=True)
    names = [n for n in args.models.split(",") if n]
    results = []
    for name in names:
        results.append(run_child(name, args, script=script, timeout_s=args.seconds + 600))
        print(line(results[-1]), flush=True)
    if args.json:
        from ortfuse.bench.environment import environment
        from ortfuse.bench.output import save_result

        stem = f"{tool}-{'+'.join(map(label, names))}-{_dt.date.today().isoformat()}"
        doc = {"tool": tool, "ortfuse_from": checkout(), "settings": vars(args), "results": results,
               "environment": environment()}
        print(f"wrote {save_result(doc, args.json, stem, compact=True)}")
    return 0 if all("error" not in r for r in results) else 1


def run_child(name: str, args, script: str = __file__, timeout_s: float | None = None) -> dict:
    """``script --child name`` (this tool's, or another's that serves the same way) in a fresh process
    with a new empty ``ORTFUSE_CACHE_DIR``, the machine's ops library and numba cache; its RESULT line."""
    env = {**os.environ, **machine_caches(), "ORTFUSE_CACHE_DIR": tempfile.mkdtemp(prefix="ortfuse-auto-bench-")}
    env.pop("ORTFUSE_TUNE", None)
    argv = [sys.executable, script, "--child", name, *sys.argv[1:]]
    timeout_s = args.wait + 900 if timeout_s is None else timeout_s
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=timeout_s)
    finally:  # the run's empty cache, filled by this run only (plans, decisions, layout choices)
        shutil.rmtree(env["ORTFUSE_CACHE_DIR"], ignore_errors=True)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        return {"model": name, "error": (done.stderr or done.stdout).strip()[-2000:]}
    return json.loads(line[len("RESULT "):])


def run_passes(names: list[str], passes: int, run: Callable[[str], dict], line: Callable[[dict], str],
               pool: Callable[[str, list[dict]], dict], pool_line: Callable[[dict], str]) -> tuple[list, list]:
    """``run(name)`` ``passes`` times per model, each result printed by ``line`` (a pass that raised is
    reported as an error and the other passes still run); with more than one pass, ``pool`` of the
    model's passes printed by ``pool_line``. The results and the pooled results."""
    results, pools = [], []
    for name in names:
        done = []
        for _ in range(passes):
            try:
                done.append(run(name))
            except Exception as exc:  # a timeout, an unreadable result, a process that ended early
                done.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})
            print(line(done[-1]), flush=True)
        results += done
        if passes > 1:
            pools.append(pool(name, done))
            print(pool_line(pools[-1]), flush=True)
    return results, pools


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']}: FAILED\n{r['error']}"
    v, q, s, d = r["verdicts"], r["ratios"], r["summary"], r["during_tuning"]
    tuning, stock, aa = (s.get(k, {}) for k in ("auto_tuning", "stock_tuning", "stock_aa_tuning"))
    alone = f" (alone, phases of {r.get('phase_s')} s)" if r.get("alone") else ""
    n_during = sum(s.get(f"auto_{k}", {}).get("n", 0) for k in DURING)
    return (f"{r['model']}: created {r['created_s']:.2f} s; gap {r['gap_ms']:.1f} ms; wait_tuned({r['waited_s']:.0f} s "
            f"after {r['served_before_wait']} served) -> {r['wait_tuned']}; final: {r['statuses'][-1]}\n"
            f"  time to plan: {_plan_time(r.get('time_to_plan'))}\n"
            f"  p50 / stock: auto {q['auto']:.3f}, fusion=True {q['fusion_true']:.3f} (second session "
            f"{q.get('fusion_true_aa', 0):.3f}), A/A {q['stock_aa']:.3f} "
            f"(repeats {r['ratios_per_repeat']['stock_aa']})\n"
            f"  served while recording and tuning{alone}: "
            f"auto n={n_during} (tuning {tuning.get('n', 0)}, p99 {tuning.get('p99_ms') or 0:.2f} ms); stock "
            f"n={stock.get('n', 0)}+{aa.get('n', 0)} p99 {stock.get('p99_ms') or 0:.2f} / "
            f"{aa.get('p99_ms') or 0:.2f} ms; "
            f"auto / stock p50 {d['p50']} (A/A {d['p50_aa']}), p99 {d['p99']} (A/A {d['p99_aa']})\n"
            f"  while tuning, by the tuning process in the gap before (p50 ms; serving thread's wake-up p50 ms): "
            + (", ".join(f"{k} n={g['n']} {g['p50_ms']:.3f} (wake {g['wake_p50_ms']:.3f})"
                         for k, g in r.get("by_gap", {}).items()) or "none") + "\n"
            f"  slow (over {SLOW}x stock's p50) by tuning step: "
            + ("; ".join(f"{x['step']} {x['slow']} of {x['served']}" for x in r.get("slow_by_step", []) if x["slow"])
               or "none") + "\n"
            f"  verdicts: {v}")


def _plan_time(t: dict | None) -> str:
    if not t:
        return "not reached"
    return (f"{t['plan']} plan after {t['served_runs']} served runs, {t['seconds']} s after the first "
            f"(tuning {t['tuning_s']} s, of which the tuning process used {t.get('child_cpu_s')} CPU s)")


def pooled(name: str, passes: list[dict]) -> dict:
    """The passes of one model together: medians of the p99 and p50 ratios over passes, each pass's
    A/A beside them, and the verdicts on the medians."""
    ok = [r for r in passes if "error" not in r]
    if not ok:
        return {"model": name, "passes": len(passes), "error": "every pass failed"}

    def med(values: list) -> float | None:
        values = [x for x in values if x is not None]
        return round(statistics.median(values), 4) if values else None

    p99 = med([r["p99_tuning_over_stock"] for r in ok])
    auto = med([r["ratios"]["auto"] for r in ok])
    verdicts: dict[str, bool | None] = {"tuned": all(r["verdicts"]["tuned"] is not False for r in ok)}
    verdicts["p99_tuning"] = p99 <= P99_LIMIT if p99 is not None else None
    p50 = med([r["during_tuning"]["p50"] for r in ok])
    verdicts["p50_tuning"] = p50 <= P50_LIMIT if p50 is not None else None
    plan_s = med([(r.get("time_to_plan") or {}).get("seconds") for r in ok])
    verdicts["auto_vs_stock"] = auto <= AUTO_LIMIT if auto is not None else None
    faster = [r for r in ok if r["verdicts"]["fusion_true_faster"]]
    verdicts["auto_vs_fusion_true"] = (sum(bool(r["verdicts"]["auto_vs_fusion_true"]) for r in faster) * 2 > len(faster)
                                       if faster else None)
    return {"model": name, "passes": len(passes), "failed": len(passes) - len(ok),
            "p99_tuning_over_stock": {"median": p99, "per_pass": [r["p99_tuning_over_stock"] for r in ok],
                                      "aa_per_pass": [r["p99_aa"] for r in ok]},
            "p50_tuning_over_stock": {"median": p50, "per_pass": [r["during_tuning"]["p50"] for r in ok],
                                      "aa_per_pass": [r["during_tuning"]["p50_aa"] for r in ok]},
            "time_to_plan_s": {"median": plan_s, "per_pass": [(r.get("time_to_plan") or {}).get("seconds")
                                                              for r in ok]},
            "auto_over_stock_p50": {"median": auto, "per_pass": [r["ratios"]["auto"] for r in ok],
                                    "aa_per_pass": [r["ratios"]["stock_aa"] for r in ok],
                                    "fusion_true_per_pass": [r["ratios"]["fusion_true"] for r in ok]},
            "verdicts": verdicts}


def _pooled_line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']}: {r['passes']} passes: {r['error']}"
    p, q = r["p99_tuning_over_stock"], r["auto_over_stock_p50"]
    return (f"{r['model']} over {r['passes'] - r['failed']} passes: time to plan {r['time_to_plan_s']['median']} s "
            f"(passes {r['time_to_plan_s']['per_pass']}); p50 while tuning / stock "
            f"{r['p50_tuning_over_stock']['median']} (passes {r['p50_tuning_over_stock']['per_pass']}; A/A "
            f"{r['p50_tuning_over_stock']['aa_per_pass']}); p99 while tuning / stock {p['median']} "
            f"(passes {p['per_pass']}; A/A {p['aa_per_pass']}); auto p50 / stock {q['median']} (passes "
            f"{q['per_pass']}; A/A {q['aa_per_pass']}; fusion=True {q['fusion_true_per_pass']}); "
            f"verdicts {r['verdicts']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="db_text_detector",
                    help="comma-separated zoo or public model names or .onnx files, 'all' (the zoo), 'public'")
    ap.add_argument("--dim", action="append", default=[],
                    help="NAME=N: a dynamic dim of the feeds made for a file (as ortfuse bench --dim)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every session (0: ORT's default)")
    ap.add_argument("--spinning", choices=("on", "off"), default="off",
                    help="ORT's pool threads spinning in every session the bench serves and times (default off)")
    ap.add_argument("--gap", default="2x", help="idle gap after each served request: '50ms', or '2x' stock's p50")
    ap.add_argument("--served", type=int, default=30, help="served requests before wait_tuned is called")
    ap.add_argument("--after-served", type=int, default=10, help="requests served after the tuning ended")
    ap.add_argument("--wait", type=float, default=300.0, help="wait_tuned's timeout (s)")
    ap.add_argument("--block", type=int, default=8, help="served requests per block (auto, stock, auto, stock A/A...)")
    ap.add_argument("--passes", type=int, default=1, help="fresh processes (empty caches) per model")
    ap.add_argument("--alone", action="store_true",
                    help="blocks of --phase seconds: auto served alone through each, stock in the next")
    ap.add_argument("--phase", type=float, default=0.25,
                    help="with --alone, seconds per block (--block requests at least)")
    ap.add_argument("--runs", type=int, default=20, help="interleaved passes per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="", help="result file, or a folder for the default name")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if child_answered(args, child):
        return 0
    print(f"ortfuse from {checkout()}", flush=True)
    from ortfuse.models import NAMES, public

    groups = {"all": list(NAMES), "public": list(public.NAMES)}
    names = [n for m in args.models.split(",") if m for n in groups.get(m, [m])]
    results, pools = run_passes(names, args.passes, lambda name: run_child(name, args), _line, pooled, _pooled_line)
    if args.json:
        from ortfuse.bench.output import save_result

        stem = f"auto_bench-{'+'.join(map(label, names))}-{_dt.date.today().isoformat()}"
        # compact: a served-traffic run keeps every request's latency, thousands per model
        doc = {"tool": "auto_bench", "ortfuse_from": checkout(), "settings": vars(args), "results": results,
               "pooled": pools}
        print(f"wrote {save_result(doc, args.json, stem, compact=True)}")
    targets = ("tuned", "auto_vs_stock", "auto_vs_fusion_true", "p99_tuning", "p50_tuning")
    judged = pools if pools else results
    ok = all("error" not in r and all(r["verdicts"][k] is not False for k in targets) for r in judged)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
