"""``ortfuse bench``: stock onnxruntime against ortfuse, measured so that the ratios mean something.

    ortfuse bench                                   # resnet50 (zoo default) at batch 1
    ortfuse bench mlp_gemm_relu_gelu --batch 1,64
    ortfuse bench model.onnx --runs 100 --repeats 5 --json out.json --plot out.png

All configurations run in one process, each as its own session on the same model and inputs:

    ort_disable_all    stock onnxruntime.InferenceSession, ORT_DISABLE_ALL (numeric reference)
    ort_enable_all     stock onnxruntime.InferenceSession, ORT_ENABLE_ALL (baseline of every ratio)
    ortfuse_auto       ortfuse.InferenceSession(fusion="auto"), ORT_ENABLE_ALL
    ortfuse_numba      ortfuse.InferenceSession(fusion=True), ORT_ENABLE_ALL
    ort_enable_all_b   a second, independent stock ORT_ENABLE_ALL session: the A/A control

Timing follows DESIGN.md §6b (see ``ortfuse.bench_measure``): single runs interleaved A..E E..A,
successive rounds in the orders of a Williams design (every configuration in every slot and next to
every other equally often), warm-up first, the whole comparison repeated (default 5), a median per configuration per repeat, and each ratio the median over repeats of p50(config) / p50(ort_enable_all), printed beside the A/A
control ratio of the same run. ORT's idle worker threads spin and take a core from whichever session
runs next, so by default every session is created with spinning off (the choice and the measurements
behind it are in ``SPINNING_EVIDENCE``); ``--spinning on`` and ``--gap-ms`` change that, for all
sessions alike; OpenMP and OpenBLAS threads (behind ortfuse's kernels) are told not to spin either
(``QUIET_THREADS_ENV``, set by re-running the bench in a child process). Peak memory is measured per
configuration in a child process (``ortfuse.bench_memory``), where it can be attributed to one session.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortfuse import bench_measure

# --------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Config:
    name: str
    runtime: str  # "onnxruntime" (stock) or "ortfuse"
    level: str  # name of an onnxruntime.GraphOptimizationLevel
    fusion: object  # ortfuse's fusion= argument; None for stock sessions
    description: str

    @property
    def stock(self) -> bool:
        return self.runtime == "onnxruntime"


REFERENCE = "ort_disable_all"  # numeric reference for max |diff|
BASELINE = "ort_enable_all"  # denominator of every ratio
CONTROL = "ort_enable_all_b"  # A/A control: identical to BASELINE, measured the same way

CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config(REFERENCE, "onnxruntime", "ORT_DISABLE_ALL", None, "stock onnxruntime, graph optimizations off"),
        Config(BASELINE, "onnxruntime", "ORT_ENABLE_ALL", None, "stock onnxruntime, all graph optimizations"),
        Config("ortfuse_auto", "ortfuse", "ORT_ENABLE_ALL", "auto", 'ortfuse fusion="auto"'),
        # Later: numba kernels forced for every fused op; for now the same as fusion=True.
        Config("ortfuse_numba", "ortfuse", "ORT_ENABLE_ALL", True, "ortfuse fusion=True"),
        Config(CONTROL, "onnxruntime", "ORT_ENABLE_ALL", None, "A/A control: second stock ORT_ENABLE_ALL session"),
    )
}
DEFAULT_CONFIGS: tuple[str, ...] = tuple(CONFIGS)

# Defaults of the timing protocol.
DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 2  # untimed interleaved passes at the start of every repeat
DEFAULT_BUDGET_S = 45.0  # with --runs unset: timed passes per (model, batch) take about this long
MIN_AUTO_RUNS, MAX_AUTO_RUNS = 10, 1000
DEFAULT_SPINNING = False
DEFAULT_GAP_MS = 0.0
MEMORY_RUNS = 3  # runs of the session in the memory child after creating it

# Thread pools outside ORT (numpy's OpenBLAS behind the reference kernels, numba's OpenMP layer behind
# the native ones) also spin after each call and slow whichever session runs next: on resnet50 b=1
# the two runs after an ortfuse_numba run took 41 ms against 30.5 ms for the others. These variables
# make them sleep at once, as ORT's threads do with spinning off. They are read when the libraries load,
# so ``run`` re-executes the bench in a child process that has them (``--quiet-threads off`` does not).
QUIET_THREADS_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "OPENBLAS_THREAD_TIMEOUT": "4"}
_CHILD_FLAG = "ORTFUSE_BENCH_CHILD"


def quiet_threads_active() -> bool:
    return all(os.environ.get(k) == v for k, v in QUIET_THREADS_ENV.items())

# Why spinning is off and the round orders vary (measured 2026-12-02 on this project's shared 2-core VM,
# Intel Xeon with AVX-512, while other sessions' test runs kept the load average at 3-10). Five stock
# sessions in the bench's slots: ORT_DISABLE_ALL + ort_enable_all + two identical copies + the control
# ort_enable_all_b in the last slot, 5 repeats; models from the zoo (mlp = mlp_gemm_relu_gelu). "A/A" is the worst |ratio - 1| of the three copies,
# median over 3 cycles in which the variants alternated (so load changes hit them alike).
SPINNING_EVIDENCE = """\
variant (same for all sessions)  resnet50 b=1, 30 runs               mlp b=1, 200 runs         mlp b=64, 100 runs
                                 A/A median (max)  p50     wall    A/A (max)     wall        A/A (max)      p50    wall
spinning on,  plain rounds       10.7% (17.1%)     128 ms  102 s   1.4% (6.4%)   52 s        12.1% (21.9%)  33 ms  90 s
spinning on,  rotated rounds      2.4% (6.0%)      188 ms  159 s   2.1% (2.9%)   40 s         1.4% (10.5%)  25 ms  72 s
spinning off, plain rounds        2.1% (5.8%)       94 ms   94 s   8.4% (8.7%)   4.5 s        6.9% (7.5%)    8 ms  19 s
spinning off, rotated rounds      0.3% (1.3%)       58 ms   64 s   1.8% (1.9%)   5.4 s        4.7% (5.9%)    7 ms  19 s
single runs, not cycled:
spinning on  + 75 ms idle gap     1.1%              29 ms   99 s   4.9%          202 s       -
spinning off (plain), no gap      1.4%              30 ms   31 s   0.6-1.8%      2 s         -
spinning off + 5-10 ms idle gap   1.1%              60 ms   63 s   2.0%          17 s        -
With spinning on, the four idle sessions' pool threads spin for tens of ms after each of their runs and
take the cores from the session being timed: identical sessions in the middle slots became 4x slower
than spinning-off ones (resnet50 p50 128 ms vs 30 ms) and the session in the last slot, which runs
twice in a row once per round, came out 10-17% faster than its identical twin. With spinning off that
bias moved to the last slot being 4-9% slower on a sub-ms model; rotating each round by one slot
(every configuration in every slot equally often) removed it. An idle gap also calms the threads but
triples the wall time (75 ms x 5 configs per pass) and measures colder, isolated requests.

Neighbours matter as much as slots. With the real five configurations on resnet50 b=1 (ortfuse_numba
then ran numpy reference kernels, ~0.3-1 s per run, and slowed whichever session ran right after it),
spinning off, 10 runs x 5 repeats, three alternating cycles, A/A = ort_enable_all_b / ort_enable_all
(ortfuse_auto, which fell back to stock ORT, as a second A/A):
  plain rounds             A/A 1.100, 1.184, 1.172   ortfuse_auto 0.989, 1.092, 1.182
  rotated by one slot      A/A 1.287, 1.094, 1.169   ortfuse_auto 1.083, 1.044, 1.037 (same neighbours)
  Williams design rounds   A/A 0.976, 0.977, 1.071   ortfuse_auto 0.977, 0.992, 1.026
so the rounds follow a Williams design: every configuration in every slot and next to every other
configuration equally often. That balances the immediate neighbour only; the slowdown after an
ortfuse_numba run lasted two runs (runs 1-2 after it: median 41 ms; later: 30.5 ms), the signature of
numpy's OpenBLAS threads spinning after the reference kernels. With QUIET_THREADS_ENV the runs right
after it were no slower (61-68 ms at every distance, machine busier), and the two stock-equivalent
sessions came out at 1.003 (A/A) and 1.009 (ortfuse_auto) of the baseline. Stock ORT does not use those
libraries: its latency was the same with and without the variables (62-78 ms either way, same minute)."""


def measuring_options(level, *, threads: int = 0, spinning: bool = DEFAULT_SPINNING):
    """SessionOptions for a session that is timed: ``level``, errors-only logging (ORT's warnings
    would break the tables), ``threads`` intra-op threads (0: ORT's default), and ORT's pool threads
    sleeping after a run unless ``spinning`` (see ``SPINNING_EVIDENCE``)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = int(threads)
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


def make_session(config: str | Config, model, *, spinning: bool = DEFAULT_SPINNING, threads: int = 0,
                 batch: int = 1):
    """Create the session of one configuration on ``model`` (a path or bytes), on the CPU provider.
    A ``fusion="auto"`` session is tuned for inputs of ``batch``."""
    import onnxruntime as ort

    cfg = CONFIGS[config] if isinstance(config, str) else config
    so = measuring_options(getattr(ort.GraphOptimizationLevel, cfg.level), threads=threads, spinning=spinning)
    providers = ["CPUExecutionProvider"]
    if cfg.fusion == "auto":
        from ortfuse.tune.tuner import DIMS_KEY

        so.add_session_config_entry(DIMS_KEY, f"batch={int(batch)}")
    if cfg.stock:
        return ort.InferenceSession(model, so, providers=providers)
    import ortfuse

    return ortfuse.InferenceSession(model, so, providers=providers, fusion=cfg.fusion)


# --------------------------------------------------------------------------- models and inputs


@dataclass
class ModelSource:
    label: str  # zoo name or file name as given
    path: str
    zoo: str | None  # zoo name when resolved through ortfuse.models
    description: str = ""


class BenchError(Exception):
    """A usage problem (unknown model, bad option); the CLI prints it and exits with 2."""


def _zoo():
    try:
        from ortfuse import models
    except ImportError:
        return None
    return models


def resolve_model(arg: str) -> ModelSource:
    """A path to an .onnx file, or a zoo name built through ``ortfuse.models.build``."""
    if os.path.isfile(arg):
        return ModelSource(arg, os.path.abspath(arg), None, "")
    zoo = _zoo()
    if zoo is not None and arg in zoo.NAMES:
        return ModelSource(arg, str(zoo.build(arg)), arg, zoo.describe(arg))
    if arg.lower().endswith(".onnx"):
        raise BenchError(f"model file not found: {arg}")
    known = ", ".join(zoo.NAMES) if zoo is not None else "(the model zoo ortfuse.models is not installed)"
    raise BenchError(f"{arg!r} is neither an .onnx file nor a zoo model; zoo models: {known}")


def _declared_inputs(path: str) -> list[tuple[str, int, list]]:
    """(name, onnx elem type, dims) of the graph inputs that are not initializers; dims are int or str/None."""
    from ortfuse.ir import feeds

    try:
        return feeds.declared_inputs(path)
    except feeds.FeedError as exc:
        raise BenchError(f"{path}: {exc}") from None


def file_batch(path: str, batch: int) -> int:
    """The batch a file model actually runs at: ``batch`` unless its first input's first dim is fixed."""
    decl = _declared_inputs(path)
    if decl and decl[0][2] and isinstance(decl[0][2][0], int):
        return decl[0][2][0]
    return batch


def inputs_from_declared(path: str, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs from the model's declared shapes and dtypes (``ortfuse.ir.feeds``: dynamic
    dims are ``batch`` for the first dim, 128 for any other)."""
    from ortfuse.ir import feeds

    try:
        return feeds.random_feeds(_declared_inputs(path), batch=batch, seed=seed)
    except feeds.FeedError as exc:
        raise BenchError(f"{path}: {exc}") from None


def make_inputs(src: ModelSource, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    if src.zoo is not None:
        return _zoo().sample_inputs(src.zoo, batch=batch, seed=seed)
    return inputs_from_declared(src.path, batch, seed)


# --------------------------------------------------------------------------- numbers


def max_abs_diff(outputs, reference) -> float:
    """Largest |a - b| over all outputs (float64); NaN where both are NaN counts as equal, inf for a
    shape mismatch or a NaN on one side only."""
    worst = 0.0
    if len(outputs) != len(reference):
        return float("inf")
    for a, b in zip(outputs, reference):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return float("inf")
        if a.dtype.kind not in "biufc" or b.dtype.kind not in "biufc":
            if not np.array_equal(a, b):
                return float("inf")
            continue
        if a.size == 0:
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        equal = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        with np.errstate(invalid="ignore"):
            d = np.where(equal, 0.0, np.abs(a64 - b64))
        d[np.isnan(d)] = np.inf
        worst = max(worst, float(d.max()))
    return worst


def summarize(raw: dict[str, list[list[float]]], batch: int, baseline: str = BASELINE, control: str | None = CONTROL) -> dict:
    """Per-configuration statistics and ratios, computed only from the raw latencies (ms)."""
    out: dict[str, dict] = {}
    base = raw.get(baseline)
    ctrl_rr = bench_measure.ratio_per_repeat(raw[control], base) if (control in raw and base) else None
    for name, reps in raw.items():
        pooled = [x for rep in reps for x in rep]
        p50s = bench_measure.p50_per_repeat(reps)
        p50 = statistics.median(p50s)
        row = {
            "p50_ms": p50,
            "p50_ms_per_repeat": p50s,
            "p99_ms": bench_measure.percentile(pooled, 99),
            "min_ms": min(pooled),
            "mean_ms": statistics.fmean(pooled),
            "throughput_per_s": batch / (p50 / 1e3),
            "n": len(pooled),
        }
        if base is not None:
            rr = bench_measure.ratio_per_repeat(reps, base)
            row["ratio_per_repeat"] = rr
            row["ratio"] = statistics.median(rr)
            row["verdict"] = _verdict(rr, ctrl_rr) if name not in (baseline, control) else ""
        out[name] = row
    return out


def noise_band(ctrl: list[float]) -> tuple[float, float]:
    """The A/A control's spread made symmetric around 1 (in log scale): identical sessions differed by
    up to that factor in either direction, so only ratios beyond it on every repeat mean something."""
    w = max(abs(math.log(c)) for c in ctrl)
    return math.exp(-w), math.exp(w)


def _verdict(rr: list[float], ctrl: list[float] | None) -> str:
    """ "faster"/"slower" only when every repeat's ratio lies beyond the A/A control's noise band."""
    if not ctrl:
        return "?"
    lo, hi = noise_band(ctrl)
    if max(rr) < lo:
        return "faster"
    if min(rr) > hi:
        return "slower"
    return "~ noise"


# --------------------------------------------------------------------------- environment


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict:
    import psutil

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    import ortfuse

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable,
        "memory_total_mb": psutil.virtual_memory().total / 2**20,
        "load_average_1_5_15": load,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            "ortfuse": ortfuse.__version__,
            "onnxruntime": _version("onnxruntime"),
            "onnx": _version("onnx"),
            "numba": _version("numba"),
            "numpy": _version("numpy"),
            "onnxruntime-extensions": _version("onnxruntime-extensions"),
        },
    }


# --------------------------------------------------------------------------- the bench


def _order_text(configs) -> str:
    letter = {c: chr(ord("A") + i) for i, c in enumerate(configs)}
    orders = ["".join(letter[c] for c in o) for o in bench_measure.round_orders(configs)]
    text = f"single runs interleaved, rounds {orders[0]} {orders[0][::-1]}"
    if len(orders) > 1:
        text += (
            f", then {orders[1]} {orders[1][::-1]}, ... ({len(orders)} round orders of a Williams design: "
            "every config in every slot and next to every other equally often)"
        )
    return text


def _protocol(configs, runs, repeats, warmup, spinning, gap_ms, threads, memory, budget_s) -> dict:
    return {
        "configs": list(configs),
        "baseline": BASELINE,
        "control": CONTROL if CONTROL in configs else None,
        "reference": REFERENCE,
        "order": _order_text(configs),
        "rotate": len(configs) > 2,
        "runs": runs if runs else "auto",
        "auto_runs_budget_s": None if runs else budget_s,
        "repeats": repeats,
        "warmup_passes_per_repeat": warmup,
        "ratio": f"median over repeats of p50(config) / p50({BASELINE}) of the same repeat",
        "p50": "median over repeats of each repeat's median latency",
        "p99": "99th percentile of all timed runs of all repeats",
        "spinning": bool(spinning),
        "gap_ms": gap_ms,
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
    threads: int = 0,
    memory: str = "subprocess",
    seed: int = 0,
    budget_s: float = DEFAULT_BUDGET_S,
    progress: bool | None = None,
    on_start=None,
    on_result=None,
) -> dict:
    """Run the comparison for every model and batch; return everything as a JSON-able dict.

    ``runs=None`` picks the number of timed passes per (model, batch) from a short calibration so
    that timing takes about ``budget_s`` seconds (10 to 1000 passes, whole Williams cycles). ``memory`` is
    "subprocess" (peak RSS growth of each configuration alone in a child process), "inprocess"
    (RSS growth over session creation and its first run in this process: cheap, rougher) or "off".
    ``on_start(doc)`` is called once the environment and protocol are known (before any session),
    ``on_result(result)`` after each (model, batch): the CLI prints as the bench goes.
    """
    configs = _check_configs(configs)
    if memory not in ("subprocess", "inprocess", "off"):
        raise BenchError(f"memory must be subprocess, inprocess or off, got {memory!r}")
    if repeats < 1 or warmup < 0 or (runs is not None and runs < 1):
        raise BenchError("--runs and --repeats must be >= 1 and --warmup >= 0")
    if not batches or any(int(b) < 1 for b in batches):
        raise BenchError(f"batches must be positive integers, got {batches!r}")
    zoo = _zoo()
    if not models:
        if zoo is None:
            raise BenchError("no model given and the model zoo (ortfuse.models) is not installed")
        models = [zoo.DEFAULT]
    sources = [resolve_model(m) for m in models]  # fail early on a bad name
    started = time.perf_counter()
    doc = {
        "schema": "ortfuse.bench/1",
        "environment": environment(),
        "protocol": _protocol(configs, runs, repeats, warmup, spinning, gap_ms, threads, memory, budget_s),
        "results": [],
    }
    if on_start:
        on_start(doc)
    with tempfile.TemporaryDirectory(prefix="ortfuse-bench-") as tmp:
        for src in sources:
            for result in _bench_model(
                src, batches, configs, runs, repeats, warmup, spinning, gap_ms, threads, memory, seed, budget_s, progress, tmp
            ):
                doc["results"].append(result)
                if on_result:
                    on_result(result)
    doc["wall_s"] = time.perf_counter() - started
    return doc


def _check_configs(configs) -> list[str]:
    names = [c.strip() for c in configs if c and c.strip()]
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
        sess = make_session("ortfuse_auto", src.path, spinning=spinning, threads=threads, batch=batch)
    cached = ("decisions cached", "plan read from ortfuse's cache")
    return 0.0 if any(n.startswith(c) or c in n for n in sess.fusion_report.notes for c in cached) \
        else time.perf_counter() - t0


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
    sessions, info = {}, {}
    for name in configs:
        rss0 = proc.memory_info().rss
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            sess = make_session(name, src.path, spinning=spinning, threads=threads, batch=batch)
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


def _bench_model(src, batches, configs, runs, repeats, warmup, spinning, gap_ms, threads, memory, seed, budget_s, progress, tmp):
    import psutil

    actual = []  # the batches the model runs at, in order, once each
    for asked in batches:
        batch = int(asked) if src.zoo is not None else file_batch(src.path, int(asked))
        if batch not in [b for b, _ in actual]:
            actual.append((batch, int(asked)))
    sessions, info = _create_all(src, configs, spinning, threads, actual[0][0])
    ref_sess = sessions.get(REFERENCE) or make_session(REFERENCE, src.path, spinning=spinning, threads=threads)
    seen = set()
    first_batch = True
    for batch, asked in actual:
        notes = []
        if batch != asked:
            notes.append(f"{src.label} has a fixed batch dimension {batch}; --batch {asked} does not apply")
        seen.add(batch)
        if not first_batch:  # auto decisions are measured at the batch the model runs at
            for name in configs:
                if CONFIGS[name].fusion == "auto":
                    tune_s = _tune_ahead(src, [name], spinning, threads, batch)
                    t0 = time.perf_counter()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        sessions[name] = make_session(name, src.path, spinning=spinning, threads=threads, batch=batch)
                    report = sessions[name].fusion_report
                    info[name] = {**info[name], "create_s": time.perf_counter() - t0, "tune_s": tune_s,
                                  "fused_ops": report.counts(), "fusion_applied": report.applied,
                                  "fusion_reason": report.reason}
        feeds = make_inputs(src, batch, seed)
        reference = ref_sess.run(None, feeds)
        cfg_rows = {}
        proc = psutil.Process()
        for name in configs:
            rss0 = proc.memory_info().rss
            outs = sessions[name].run(None, feeds)
            row = dict(info[name])
            row["max_abs_diff"] = max_abs_diff(outs, reference)
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
                spec = {"config": name, "model": src.path, "inputs": npz, "spinning": spinning, "threads": threads,
                        "runs": MEMORY_RUNS, "batch": batch}
                from ortfuse.bench_memory import measure_in_subprocess

                cfg_rows[name]["memory"] = measure_in_subprocess(spec, os.path.join(tmp, "memory_spec.json"))
        runners = {name: _runner(sessions[name], feeds) for name in configs}
        gap_s = gap_ms / 1e3
        chosen_runs, calibration = runs, None
        if chosen_runs is None:
            calib = bench_measure.measure(runners, runs=3, repeats=1, warmup=1, gap_s=gap_s)
            # per pass: each config's median run, its idle gap and ~50 us of Python between runs
            pass_s = sum(statistics.median(calib[c][0]) for c in configs) / 1e3 + len(configs) * (gap_s + 50e-6)
            chosen_runs = int(min(MAX_AUTO_RUNS, max(MIN_AUTO_RUNS, round(budget_s / (repeats * pass_s)))))
            whole = 2 * len(configs)  # whole Williams cycles: slots and neighbours balanced
            chosen_runs = -(-chosen_runs // whole) * whole
            calibration = {"pass_s": pass_s, "runs": chosen_runs}
        bar = _progress_bar(repeats * (warmup + chosen_runs), f"{src.label} batch {batch}", progress)
        t0 = time.perf_counter()
        try:
            raw = bench_measure.measure(
                runners, runs=chosen_runs, repeats=repeats, warmup=warmup, gap_s=gap_s, on_pass=bar.update if bar else None
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
            "batch": batch,
            "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()},
            "runs": chosen_runs,
            "repeats": repeats,
            "warmup": warmup,
            "calibration": calibration,
            "timing_s": timing_s,
            "load_average_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
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
    return tqdm(total=total, desc=desc, unit="pass", file=sys.stderr, leave=False, disable=None if progress is None else False)


# --------------------------------------------------------------------------- output


def header(doc: dict) -> str:
    """First line: machine and protocol; then threads/memory and versions."""
    env, prot = doc["environment"], doc["protocol"]
    load = env.get("load_average_1_5_15")
    machine = (
        f"{env['cpu_model']}, {env['logical_cores']} logical cores ({env['physical_cores']} physical, "
        f"{env['usable_cores']} usable), {platform.system()} {platform.machine()}"
        + (f", load {load[0]:.2f}" if load else "")
    )
    runs = f"{prot['runs']} timed" if prot["runs"] != "auto" else f"auto (~{prot['auto_runs_budget_s']:.0f} s) timed"
    line1 = (
        f"ortfuse bench | machine: {machine} | protocol: {prot['order']}; "
        f"{prot['warmup_passes_per_repeat']} warm-up + {runs} passes per repeat, {prot['repeats']} repeats; "
        f"ratio = median over repeats of p50(config)/p50({BASELINE})"
        + (f", A/A control = {prot['control']}" if prot["control"] else "")
    )
    spin = (
        "ORT spinning off on every session (session.intra_op/inter_op.allow_spinning=0)"
        if not prot["spinning"]
        else "ORT spinning on (default) on every session"
    )
    gap = f"idle gap {prot['gap_ms']:g} ms before every run" if prot["gap_ms"] else "no idle gap"
    mem = {
        "subprocess": "peak MB = RSS high-water mark growth over session creation + 3 runs, each config alone in a child process",
        "inprocess": "peak MB = RSS growth over session creation + first run in the bench process (rough)",
        "off": "memory not measured",
    }[prot["memory"]]
    v = env["versions"]
    others = (
        "OpenMP/OpenBLAS threads told not to spin (" + " ".join(f"{k}={v}" for k, v in QUIET_THREADS_ENV.items()) + ")"
        if prot.get("quiet_threads")
        else "OpenMP/OpenBLAS threads as configured by the environment"
    )
    line2 = (
        f"threads: {spin}, {gap}, intra_op_num_threads={prot['intra_op_num_threads']}; {others}; memory: {mem}"
    )
    line3 = (
        f"versions: ortfuse {v['ortfuse']}, onnxruntime {v['onnxruntime']}, onnx {v['onnx']}, numba {v['numba']}, "
        f"numpy {v['numpy']}, python {env['python']}; {env['date']}"
    )
    lines = [line1, line2, line3]
    if load and env.get("usable_cores") and load[0] > 0.75 * env["usable_cores"]:
        lines.append(
            f"warning: load average {load[0]:.1f} on {env['usable_cores']} cores: other processes compete for the CPU; "
            "absolute latencies are inflated, read ratios against the A/A control"
        )
    return "\n".join(lines)


def _fmt(x, spec: str, none: str = "-") -> str:
    if x is None:
        return none
    if isinstance(x, float) and not np.isfinite(x):
        return "inf"
    return format(x, spec)


def _peak_mb(row: dict, memory: str):
    if memory == "subprocess":
        m = row.get("memory") or {}
        return m.get("peak_delta_mb")
    if memory == "inprocess":
        return row.get("rss_inprocess_mb")
    return None


def _fused(row: dict, name: str) -> str:
    if CONFIGS[name].stock:
        return "-"
    counts = row.get("fused_ops") or {}
    if not counts:
        return "0"
    return ",".join(f"{k}:{v}" for k, v in counts.items())


def _diff(row: dict, name: str) -> str:
    d = row.get("max_abs_diff")
    if name == REFERENCE:
        return "0 (ref)"
    if d is None:
        return "-"
    if not np.isfinite(d):
        return "inf"
    return "0" if d == 0 else f"{d:.2e}"


def table(result: dict, memory: str = "subprocess") -> str:
    """The readable table of one (model, batch) result."""
    ins = ", ".join(f"{k}{v['shape']} {v['dtype']}" for k, v in result["inputs"].items())
    title = f"== {result['model']}" + (f" ({result['description']})" if result.get("description") else "")
    title += f" | batch {result['batch']} | {ins} | {result['runs']} runs x {result['repeats']} repeats"
    ctrl = result.get("control")
    cols = ["config", "p50 ms", "p99 ms", "samples/s", f"p50/{BASELINE} [repeats]", "A/A ctrl", "verdict", "max|diff|", "peak MB", "create s", "fused ops"]
    rows = []
    for name, row in result["configs"].items():
        rr = row.get("ratio_per_repeat") or []
        if name == BASELINE:
            ratio_txt = "1 (baseline)"
        else:
            ratio_txt = f"{row['ratio']:.3f} [{min(rr):.3f}-{max(rr):.3f}]"
        rows.append(
            [
                name,
                _fmt(row["p50_ms"], ".3f"),
                _fmt(row["p99_ms"], ".3f"),
                _fmt(row["throughput_per_s"], ".1f"),
                ratio_txt,
                _fmt(ctrl["ratio"], ".3f") if ctrl else "n/a",
                row.get("verdict") or "",
                _diff(row, name),
                _fmt(_peak_mb(row, memory), ".1f"),
                _fmt(row.get("create_s"), ".3f"),
                _fused(row, name),
            ]
        )
    widths = [max(len(str(r[i])) for r in [cols] + rows) for i in range(len(cols))]
    right = {1, 2, 3, 5, 7, 8, 9}

    def line(cells):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [title, line(cols), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    if ctrl:
        rr = ctrl["ratio_per_repeat"]
        out.append(
            f"A/A control: {CONTROL}/{BASELINE} = {ctrl['ratio']:.3f} (repeats {min(rr):.3f}-{max(rr):.3f}), "
            f"noise band {noise_band(rr)[0]:.3f}-{noise_band(rr)[1]:.3f}: verdict faster/slower only when every "
            f"repeat's ratio lies outside it."
        )
    for name, row in result["configs"].items():
        if not CONFIGS[name].stock and row.get("fusion_reason"):
            state = "applied" if row.get("fusion_applied") else "not applied"
            out.append(f"note: {name}: fusion {state}: {row['fusion_reason']}")
        if row.get("tune_s") is not None:
            tuned = f"measured ahead in {row['tune_s']:.1f} s" if row["tune_s"] else "cached"
            out.append(f"note: {name}: auto decisions {tuned} (`ortfuse tune`); create s is with them cached")
        for w in row.get("warnings") or []:
            out.append(f"note: {name}: warning: {w}")
        mem = row.get("memory") or {}
        if mem.get("error"):
            out.append(f"note: {name}: memory: {mem['error']}")
    for n in result.get("notes") or []:
        out.append(f"note: {n}")
    return "\n".join(out)


def _json_safe(obj):
    """Strict JSON: non-finite floats (an infinite max |diff|) become strings."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    return obj


def summary_rows(doc: dict) -> list[dict]:
    """One flat row per (model, batch, config): the numbers of the printed tables."""
    rows = []
    for res in doc["results"]:
        ctrl = res.get("control")
        for name, row in res["configs"].items():
            rows.append(
                {
                    "model": res["model"],
                    "batch": res["batch"],
                    "config": name,
                    "p50_ms": row["p50_ms"],
                    "p99_ms": row["p99_ms"],
                    "throughput_per_s": row["throughput_per_s"],
                    "ratio": row.get("ratio"),
                    "aa_control_ratio": ctrl["ratio"] if ctrl else None,
                    "verdict": row.get("verdict"),
                    "max_abs_diff": row.get("max_abs_diff"),
                    "peak_mb": _peak_mb(row, doc["protocol"]["memory"]),
                    "create_s": row.get("create_s"),
                    "fused_ops": row.get("fused_ops"),
                }
            )
    return rows


def write_json(doc: dict, path: str) -> None:
    doc = dict(doc)
    doc["summary"] = summary_rows(doc)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(_json_safe(doc), f, indent=1, allow_nan=False)
        f.write("\n")


# --------------------------------------------------------------------------- CLI


def _batches(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch takes comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--batch takes positive integers, got {text!r}")
    return values


def _configs(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    return names


def _on_off(text: str) -> bool:
    t = text.lower()
    if t in ("on", "1", "true", "yes"):
        return True
    if t in ("off", "0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", metavar="MODEL", help="path to an .onnx file or a zoo name (default: the zoo's default, resnet50)")
    parser.add_argument("--batch", type=_batches, default=[1], metavar="B[,B...]", help="batch sizes (default 1)")
    parser.add_argument("--runs", type=int, default=None, metavar="N", help=f"timed interleaved passes per repeat, one run of each config per pass (default: auto, about {DEFAULT_BUDGET_S:.0f} s per model and batch)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, metavar="R", help=f"repeats of the whole comparison (default {DEFAULT_REPEATS})")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="W", help=f"untimed passes at the start of each repeat (default {DEFAULT_WARMUP})")
    parser.add_argument("--configs", type=_configs, default=list(DEFAULT_CONFIGS), metavar="C[,C...]", help=f"configurations, in schedule order (default {','.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--spinning", type=_on_off, default=DEFAULT_SPINNING, metavar="on|off", help="ORT intra-/inter-op thread spinning for every session (default off: see DESIGN 6b)")
    parser.add_argument("--gap-ms", type=float, default=DEFAULT_GAP_MS, metavar="MS", help="idle sleep before every single run, for all configs (default 0)")
    parser.add_argument("--threads", type=int, default=0, metavar="N", help="intra_op_num_threads for every session (default: ORT's choice)")
    parser.add_argument("--memory", choices=("subprocess", "inprocess", "off"), default="subprocess", help="how to measure peak memory (default subprocess)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample inputs (default 0)")
    parser.add_argument("--json", metavar="OUT.json", help="write raw latencies, environment and summary")
    parser.add_argument("--plot", metavar="OUT.png", help="write latency histograms (needs matplotlib)")
    parser.add_argument("--progress", type=_on_off, default=None, metavar="on|off", help="progress bar on stderr (default: when stderr is a terminal)")
    parser.add_argument("--quiet-threads", type=_on_off, default=True, metavar="on|off", help="run the bench in a child process with " + " ".join(f"{k}={v}" for k, v in QUIET_THREADS_ENV.items()) + " so that OpenMP/BLAS threads do not spin (default on)")


def _argv(args: argparse.Namespace) -> list[str]:
    """The command line that reproduces ``args`` (for the re-executed child)."""
    argv = list(args.models) + ["--batch", ",".join(map(str, args.batch))]
    if args.runs is not None:
        argv += ["--runs", str(args.runs)]
    argv += ["--repeats", str(args.repeats), "--warmup", str(args.warmup), "--configs", ",".join(args.configs)]
    argv += ["--spinning", "on" if args.spinning else "off", "--gap-ms", repr(args.gap_ms), "--threads", str(args.threads)]
    argv += ["--memory", args.memory, "--seed", str(args.seed), "--quiet-threads", "off"]
    if args.json:
        argv += ["--json", args.json]
    if args.plot:
        argv += ["--plot", args.plot]
    if args.progress is not None:
        argv += ["--progress", "on" if args.progress else "off"]
    return argv


def _run_in_quiet_child(args: argparse.Namespace) -> int:
    import subprocess

    env = dict(os.environ, **QUIET_THREADS_ENV)
    env[_CHILD_FLAG] = "1"
    proc = subprocess.run([sys.executable, "-m", "ortfuse.bench", *_argv(args)], env=env, check=False)
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    """``python -m ortfuse.bench ...``: the same as ``ortfuse bench ...``."""
    parser = argparse.ArgumentParser(prog="ortfuse bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if getattr(args, "quiet_threads", False) and not quiet_threads_active() and os.environ.get(_CHILD_FLAG) != "1":
        return _run_in_quiet_child(args)
    if args.plot:
        from ortfuse.bench_plot import require_matplotlib

        try:
            require_matplotlib()
        except RuntimeError as exc:
            print(f"ortfuse bench: {exc}", file=sys.stderr)
            return 2
    try:
        doc = bench(
            args.models,
            batches=args.batch,
            runs=args.runs,
            repeats=args.repeats,
            warmup=args.warmup,
            configs=args.configs,
            spinning=args.spinning,
            gap_ms=args.gap_ms,
            threads=args.threads,
            memory=args.memory,
            seed=args.seed,
            progress=args.progress,
            on_start=lambda doc: print(header(doc) + "\n", flush=True),
            on_result=lambda result: print(table(result, args.memory) + "\n", flush=True),
        )
    except BenchError as exc:
        print(f"ortfuse bench: {exc}", file=sys.stderr)
        return 2
    print(f"total wall time {doc['wall_s']:.1f} s")
    if args.json:
        write_json(doc, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        from ortfuse.bench_plot import plot

        plot(doc, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
