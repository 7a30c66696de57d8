"""The comparison itself: for every model and batch, create each configuration's session, check its
outputs against the reference, measure memory, time all of them with the interleaved protocol, and
return everything as one JSON-able dict (docs/ARCHITECTURE.md §8)."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortfuse.bench.environment import QUIET_THREADS_ENV, environment, load_average, quiet_threads_active
from ortfuse.bench.inputs import BenchError, ModelSource, file_batch, make_inputs, resolve_model, tune_dims, zoo
from ortfuse.bench.memory import measure_in_subprocess
from ortfuse.bench.sessions import (
    BASELINE,
    CONFIGS,
    CONTROL,
    DEFAULT_CONFIGS,
    DEFAULT_SPINNING,
    PEER_RUNTIMES,
    REFERENCE,
    RENAMED_CONFIGS,
    make_session,
)
from ortfuse.bench.stats import max_abs_diff, max_rel_diff, summarize
from ortfuse.foundation import protocol

# Defaults of the timing protocol.
DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 2  # untimed interleaved passes at the start of every repeat
DEFAULT_BUDGET_S = 45.0  # with --runs unset: timed passes per (model, batch) take about this long
MIN_AUTO_RUNS, MAX_AUTO_RUNS = 10, 1000
DEFAULT_GAP_MS = 0.0
# --block: ORT's pool threads spin for 30-60 ms after a run (docs/ARCHITECTURE.md §8); a settle
# twice as long lets them stop before the next configuration's block (the A/A control of
# `ortfuse bench MODEL --block 20 --spinning on` shows whether it does on the machine at hand)
DEFAULT_SETTLE_MS = 120.0
MEMORY_RUNS = 3  # runs of the session in the memory child after creating it
SCHEMA = "ortfuse.bench/1"


@dataclass(frozen=True)
class Schedule:
    """What runs around each timed run: an idle ``gap_ms`` before every run; with ``block`` > 1, each
    slot a block of that many timed runs after an idle ``settle_ms`` and one untimed run
    (``protocol.measure``)."""

    gap_ms: float = DEFAULT_GAP_MS
    block: int = 1
    settle_ms: float = DEFAULT_SETTLE_MS

    def measure_kwargs(self) -> dict:
        return {"gap_s": self.gap_ms / 1e3, "block": self.block, "settle_s": self.settle_ms / 1e3}

    def pass_s(self, medians_ms: list[float]) -> float:
        """Seconds of one pass whose configurations run ``medians_ms`` each, with ~50 us of Python
        between runs."""
        per_slot = self.block + (self.block > 1)
        settle = self.settle_ms / 1e3 if self.block > 1 else 0.0
        return sum(per_slot * (m / 1e3 + self.gap_ms / 1e3 + 50e-6) + settle for m in medians_ms)


def _order_text(configs, block: int = 1) -> str:
    letter = {c: chr(ord("A") + i) for i, c in enumerate(configs)}
    orders = ["".join(letter[c] for c in o) for o in protocol.round_orders(configs)]
    unit = "single runs" if block == 1 else f"blocks of {block} runs (each after an idle settle and one untimed run)"
    text = f"{unit} interleaved, rounds {orders[0]} {orders[0][::-1]}"
    if len(orders) > 1:
        text += (
            f", then {orders[1]} {orders[1][::-1]}, ... ({len(orders)} round orders of a Williams design: "
            "every config in every slot and next to every other equally often)"
        )
    return text


def _protocol(configs, runs, repeats, warmup, spinning, schedule: Schedule, threads, memory, budget_s) -> dict:
    return {
        "configs": list(configs),
        "baseline": BASELINE,
        "control": CONTROL if CONTROL in configs else None,
        "reference": REFERENCE,
        "order": _order_text(configs, schedule.block),
        "rotate": len(configs) > 2,
        "runs": runs if runs else "auto",
        "auto_runs_budget_s": None if runs else budget_s,
        "repeats": repeats,
        "warmup_passes_per_repeat": warmup,
        "ratio": f"median over repeats of p50(config) / p50({BASELINE}) of the same repeat",
        "p50": "median over repeats of each repeat's median latency",
        "p99": "99th percentile of all timed runs of all repeats",
        "spinning": bool(spinning),
        "gap_ms": schedule.gap_ms,
        "block": schedule.block,
        "settle_ms": schedule.settle_ms if schedule.block > 1 else 0.0,
        "intra_op_num_threads": threads or "ORT default",
        "memory": memory,
        "gc": "Python garbage collection paused while timing",
        "quiet_threads": quiet_threads_active(),
        "quiet_threads_env": QUIET_THREADS_ENV if quiet_threads_active() else {},
    }


def bench(
    models: list[str] | None = None,
    *,
    batches: tuple[int, ...] | list[int] = (1,),
    runs: int | None = None,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    configs: tuple[str, ...] | list[str] = DEFAULT_CONFIGS,
    spinning: bool = DEFAULT_SPINNING,
    gap_ms: float = DEFAULT_GAP_MS,
    block: int = 1,
    settle_ms: float = DEFAULT_SETTLE_MS,
    threads: int = 0,
    memory: str = "subprocess",
    seed: int = 0,
    budget_s: float = DEFAULT_BUDGET_S,
    progress: bool | None = None,
    on_start=None,
    on_result=None,
    suite: str | None = None,
    skipped: list[dict] | None = None,
) -> dict:
    """Run the comparison for every model and batch; return everything as a JSON-able dict.

    ``runs=None`` picks the number of timed passes per (model, batch) from a short calibration so
    that timing takes about ``budget_s`` seconds (10 to 1000 passes, whole Williams cycles). ``memory`` is
    "subprocess" (peak RSS growth of each configuration alone in a child process), "inprocess"
    (RSS growth over session creation and its first run in this process: cheap, rougher) or "off".
    ``on_start(doc)`` is called once the environment and protocol are known (before any session),
    ``on_result(result)`` after each (model, batch): the CLI prints as the bench goes. ``suite`` names
    the suite the models come from (``--suite``) and ``skipped`` lists its models that could not be
    fetched (``{"model", "reason"}``); both go into the result. ``block`` > 1 times blocks of runs
    after an idle ``settle_ms`` (``Schedule``).
    """
    configs = _check_configs(configs)
    if memory not in ("subprocess", "inprocess", "off"):
        raise BenchError(f"memory must be subprocess, inprocess or off, got {memory!r}")
    if repeats < 1 or warmup < 0 or block < 1 or settle_ms < 0 or (runs is not None and runs < 1):
        raise BenchError("--runs, --repeats and --block must be >= 1, --warmup and --settle-ms >= 0")
    schedule = Schedule(gap_ms, block, settle_ms)
    if not batches or any(int(b) < 1 for b in batches):
        raise BenchError(f"batches must be positive integers, got {batches!r}")
    if not models:
        models_zoo = zoo()
        if models_zoo is None:
            raise BenchError("no model given and the model zoo (ortfuse.models) is not installed")
        models = [models_zoo.DEFAULT]
    sources = [resolve_model(m) for m in models]  # fail early on a bad name
    started = time.perf_counter()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "environment": environment(),
        "protocol": _protocol(configs, runs, repeats, warmup, spinning, schedule, threads, memory, budget_s),
        "suite": suite,
        "skipped": list(skipped or []),
        "results": [],
    }
    if on_start:
        on_start(doc)
    with tempfile.TemporaryDirectory(prefix="ortfuse-bench-") as tmp:
        for src in sources:
            for result in _bench_model(
                src,
                batches,
                configs,
                runs,
                repeats,
                warmup,
                spinning,
                schedule,
                threads,
                memory,
                seed,
                budget_s,
                progress,
                tmp,
            ):
                doc["results"].append(result)
                if on_result:
                    on_result(result)
    doc["wall_s"] = time.perf_counter() - started
    return doc


def _check_configs(configs) -> list[str]:
    names = [RENAMED_CONFIGS.get(c.strip(), c.strip()) for c in configs if c and c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        raise BenchError(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    if len(set(names)) != len(names):
        raise BenchError(f"configurations listed twice: {names}")
    if BASELINE not in names:  # every ratio is against it
        names.insert(0, BASELINE)
    return names


def _tune_ahead(src: ModelSource, configs, spinning, threads, batch) -> float | None:
    """Fill the auto policy's cache for this batch before any timed creation (``ortfuse tune`` ahead of
    time): the seconds it took, 0 when cached already, None without an auto configuration."""
    if not any(CONFIGS[c].fusion == "auto" for c in configs):
        return None
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = make_session("ortfuse_auto", src.path, spinning=spinning, threads=threads, batch=batch,
                            dims=tune_dims(src))
    cached = ("decisions cached", "plan read from ortfuse's cache")
    return (
        0.0
        if any(n.startswith(c) or c in n for n in sess.fusion_report.notes for c in cached)
        else time.perf_counter() - t0
    )


def _create_all(src: ModelSource, configs, spinning, threads, batch: int = 1) -> tuple[dict, dict]:
    import psutil

    proc = psutil.Process()
    # One untimed stock session first, so that ORT's once-per-process costs (environment, kernel
    # registries, first allocations) are not charged to whichever configuration comes first.
    # Creation in a cold process is measured by the memory child (memory.create_s).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_session(BASELINE, src.path, spinning=spinning, threads=threads)
    tune_s = _tune_ahead(src, configs, spinning, threads, batch)
    sessions: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    for name in configs:
        rss0 = proc.memory_info().rss
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            try:
                sess = make_session(name, src.path, spinning=spinning, threads=threads, batch=batch,
                                    dims=tune_dims(src))
            except Exception as exc:  # noqa: BLE001 - a peer's own errors; ORT's and ortfuse's are raised
                if CONFIGS[name].runtime not in PEER_RUNTIMES:
                    raise
                info[name] = {"left_out": peer_refusal(name, exc)}
                continue
            create_s = time.perf_counter() - t0
        rss1 = proc.memory_info().rss
        report = getattr(sess, "fusion_report", None)
        info[name] = {
            "description": CONFIGS[name].description,
            "create_s": create_s,
            "rss_create_mb": (rss1 - rss0) / 2**20,
            "fused_ops": report.counts() if report is not None else None,
            "fusion_applied": report.applied if report is not None else None,
            "fusion_reason": report.reason if report is not None else None,
            "warnings": [str(w.message) for w in caught],
            "tune_s": tune_s if CONFIGS[name].fusion == "auto" else None,
        }
        sessions[name] = sess
    return sessions, info


def peer_refusal(name: str, exc: BaseException) -> str:
    """The note for peer ``name`` that could not run a model: the first two lines of its error that
    say more than where it was raised."""
    lines = [ln.strip() for ln in str(exc).splitlines()
             if ln.strip() and not ln.strip().startswith(("Exception from", "Check '"))]
    why = " ".join(lines[:2]) if lines else type(exc).__name__
    return f"{name} left out for this model: {CONFIGS[name].runtime} cannot run it ({why})"


def _bench_model(
    src, batches, configs, runs, repeats, warmup, spinning, schedule: Schedule, threads, memory, seed, budget_s,
    progress, tmp
):
    import psutil

    actual = []  # the batches the model runs at, in order, once each
    for asked in batches:
        batch = int(asked) if src.zoo is not None else file_batch(src.path, int(asked))
        if batch not in [b for b, _ in actual]:
            actual.append((batch, int(asked)))
    sessions, info = _create_all(src, configs, spinning, threads, actual[0][0])
    left_out = [info[name]["left_out"] for name in configs if "left_out" in info[name]]
    configs = [name for name in configs if name in sessions]  # a peer that cannot run this model is left out
    ref_sess = sessions.get(REFERENCE) or make_session(REFERENCE, src.path, spinning=spinning, threads=threads)
    seen = set()
    first_batch = True
    for batch, asked in actual:
        notes = list(left_out)
        if batch != asked:
            notes.append(f"{src.label} has a fixed batch dimension {batch}; --batch {asked} does not apply")
        if src.public is not None and src.dims and src.npz is None:
            notes.append(f"{src.label} runs at its natural input shape; --dim does not apply (give other shapes "
                         "with --inputs data.npz)")
        seen.add(batch)
        if not first_batch:  # auto decisions are measured at the batch the model runs at
            for name in configs:
                if CONFIGS[name].fusion == "auto":
                    tune_s = _tune_ahead(src, [name], spinning, threads, batch)
                    t0 = time.perf_counter()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        sessions[name] = make_session(name, src.path, spinning=spinning, threads=threads, batch=batch,
                                                      dims=tune_dims(src))
                    report = sessions[name].fusion_report
                    info[name] = {
                        **info[name],
                        "create_s": time.perf_counter() - t0,
                        "tune_s": tune_s,
                        "fused_ops": report.counts(),
                        "fusion_applied": report.applied,
                        "fusion_reason": report.reason,
                    }
        feeds = make_inputs(src, batch, seed)
        reference = ref_sess.run(None, feeds)
        cfg_rows = {}
        proc = psutil.Process()
        for name in list(configs):
            rss0 = proc.memory_info().rss
            try:
                outs = sessions[name].run(None, feeds)
            except Exception as exc:  # noqa: BLE001 - as at creation: a peer that refuses these inputs
                if CONFIGS[name].runtime not in PEER_RUNTIMES:
                    raise
                notes.append(peer_refusal(name, exc))
                configs = [c for c in configs if c != name]
                continue
            row = dict(info[name])
            row["max_abs_diff"] = max_abs_diff(outs, reference)
            row["max_rel_diff"] = max_rel_diff(outs, reference)
            row["rss_first_run_mb"] = (proc.memory_info().rss - rss0) / 2**20
            cfg_rows[name] = row
        for name in configs:  # creation is charged to the first batch; later ones add their first run
            created = info[name]["rss_create_mb"] if first_batch else 0.0
            cfg_rows[name]["rss_inprocess_mb"] = created + cfg_rows[name]["rss_first_run_mb"]
        first_batch = False
        if memory == "subprocess":
            npz = os.path.join(tmp, f"inputs_{len(seen)}.npz")
            np.savez(npz, **feeds)
            for name in configs:
                spec = {
                    "config": name,
                    "model": src.path,
                    "inputs": npz,
                    "spinning": spinning,
                    "threads": threads,
                    "runs": MEMORY_RUNS,
                    "batch": batch,
                    "dims": tune_dims(src),
                }
                cfg_rows[name]["memory"] = measure_in_subprocess(spec, os.path.join(tmp, "memory_spec.json"))
        runners = {name: _runner(sessions[name], feeds) for name in configs}
        chosen_runs, calibration = runs, None
        if chosen_runs is None:
            calib = protocol.measure(runners, runs=3, repeats=1, warmup=1, **schedule.measure_kwargs())
            pass_s = schedule.pass_s([statistics.median(calib[c][0]) for c in configs])
            chosen_runs = int(min(MAX_AUTO_RUNS, max(MIN_AUTO_RUNS, round(budget_s / (repeats * pass_s)))))
            whole = 2 * len(configs)  # whole Williams cycles: slots and neighbours balanced
            chosen_runs = -(-chosen_runs // whole) * whole
            calibration = {"pass_s": pass_s, "runs": chosen_runs}
        bar = _progress_bar(repeats * (warmup + chosen_runs), f"{src.label} batch {batch}", progress)
        t0 = time.perf_counter()
        try:
            raw = protocol.measure(
                runners,
                runs=chosen_runs,
                repeats=repeats,
                warmup=warmup,
                on_pass=bar.update if bar else None,
                **schedule.measure_kwargs(),
            )
        finally:
            if bar:
                bar.close()
        timing_s = time.perf_counter() - t0
        stats = summarize(raw, batch, BASELINE, CONTROL if CONTROL in configs else None)
        for name in configs:
            cfg_rows[name].update(stats[name])
            cfg_rows[name]["latencies_ms"] = raw[name]
        control = None
        if CONTROL in configs:
            control = {
                "config": CONTROL,
                "ratio": stats[CONTROL]["ratio"],
                "ratio_per_repeat": stats[CONTROL]["ratio_per_repeat"],
            }
        yield {
            "model": src.label,
            "zoo": src.zoo,
            "path": src.path,
            "description": src.description,
            "public": src.public,
            "batch": batch,
            "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()},
            "ortfuse_dims": {"batch": batch, **tune_dims(src)},  # the ortfuse.tune_dims entry of its sessions
            "runs": chosen_runs,
            "repeats": repeats,
            "warmup": warmup,
            "calibration": calibration,
            "timing_s": timing_s,
            "load_average_after": load_average(),
            "order": list(configs),
            "configs": cfg_rows,
            "control": control,
            "notes": notes,
        }


def _runner(sess, feeds):
    run = sess.run

    def call():
        return run(None, feeds)

    return call


def _progress_bar(total: int, desc: str, progress: bool | None):
    if progress is False:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    # progress=None: tqdm decides (shown on a terminal, hidden when stderr is a file or pipe)
    return tqdm(
        total=total, desc=desc, unit="pass", file=sys.stderr, leave=False, disable=None if progress is None else False
    )
