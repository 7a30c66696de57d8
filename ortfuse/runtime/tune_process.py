"""A live tuning's measuring in a process of its own, which the serving process stops while a served
run is in flight (docs/ARCHITECTURE.md §7).

Why a process: measuring parses the model, infers shapes, fuses it and opens dozens of ORT sessions;
onnx and ORT hold the GIL through those C calls (up to tens of milliseconds each), so a tuning
thread delays the served runs of its own process however it yields. A child process holds no lock
the server waits for, and a stopped process (SIGSTOP) takes no core: served runs get the machine.
Between served runs it runs at the lowest CPU priority from its first instruction
(``foundation.child_process``: its interpreter start-up and imports included; it dies with
the serving process, and is stopped only once its death signal is set), so a
request that arrives while it computes wakes the serving thread at once; on a machine busy with other
work it then measures slowly, and may end on stock ORT (``yielding.Starved``, the wall-clock stop).

Contract:
- ``tune(source, sess_options, fusion, fusion_patterns, sample, budget_s, ...)`` runs
  ``python -m ortfuse.runtime.tune_process FOLDER`` (this module) and returns its result: the decisions
  (``Tuning``, measured on ``sample``; first those the parsed lookup finds in the cache when
  ``lookup_first``) after the child has also made the plan they give and stored it in the plan cache,
  so the serving process's ``planning.prepare`` with those decisions reads it without parsing, under
  the key the child stored it under (``plan_key``: the key holds a digest of ortfuse's sources as
  each process read them); when the plan is stock ORT, its report: ``stock_report``; when the plan
  is not cached (its decisions are not final: a spent budget), the plan itself: ``handed`` (its
  entry, ``planning.plan_entry``) and ``plan_file``, the fused model moved to a file the caller
  owns and removes (the serving process must not parse and fuse the model itself);
- with ``check_feeds`` (the served feeds recorded), the child also runs the plan and stock ORT on
  each of them (``tune.output_check.check_plan``, its runs waiting while a served run is in
  flight): ``checked_feeds`` says how many passed, ``check_error`` why the plan is not swapped in.
  The serving process then needs no stock runs of its own beside served ones;
- ``on_start(process)`` hands the child to the caller, which stops it (SIGSTOP) while a served run
  is in flight and continues it (SIGCONT) when none is, and writes its served runs into ``counts``
  (``yielding.SharedCounts``): the child's timings are kept only when no served run overlapped them
  (``yielding.ProcessYielder``); ``on_start(None)`` when the child has ended;
- ``stopped()`` ends the wait and kills the child; the result is then None, as when the child
  fails (the caller says why, with ``error``); never raises for the child's failures;
- the child reads the model (the caller's path, or its bytes written to the folder, so the plan
  cache's identity of the model is the caller's), the session options that key the plan (level,
  intra-op threads, ``ortfuse.tune_dims``, ``ortfuse.precision``) and the feeds, from the folder.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortfuse.foundation import child_process
from ortfuse.foundation.session_options import DIMS_KEY, PRECISION_OPTION, config_entry, sleep_after_runs

POLL_S = 0.02
_OPTION_ENTRIES = (DIMS_KEY, PRECISION_OPTION)


@dataclass
class Outcome:
    """What the child found: the decisions (``to_dict`` form) and where they are cached, or ``error``."""

    tuning: dict | None = None
    path: str = ""
    from_cache: bool = False
    discarded: int = 0
    error: str = ""
    stock_report: dict | None = None  # the report when the plan is stock ORT (nothing to read from the cache)
    plan_key: str | None = None  # the plan cache's key the child stored the plan under
    checked_feeds: int = 0  # recorded feeds on which the plan's outputs equal stock ORT's
    check_error: str = ""  # why the plan's outputs are not stock ORT's ("" when they are)
    handed: dict | None = None  # the entry of a plan the child could not cache (planning.plan_entry)
    plan_file: str = ""  # that plan's fused model, in a file the caller owns
    steps: list | None = None  # (event, seconds since the child's interpreter started) of its steps (tune.steps)
    cpu_s: float = 0.0  # CPU seconds the child used (user and system, its threads included)


def _options_spec(sess_options) -> dict:
    if sess_options is None:
        return {}
    return {"level": int(sess_options.graph_optimization_level), "threads": int(sess_options.intra_op_num_threads),
            "entries": {k: v for k in _OPTION_ENTRIES if (v := config_entry(sess_options, k))}}


WRITE_SLICE = 1 << 18  # bytes per write of a feed to the tuning process's folder


def save_npz(path: str, arrays: Mapping[str, Any]) -> None:
    """``np.savez(path, **arrays)`` (what ``np.load`` reads back the same), each array's data written in
    slices of ``WRITE_SLICE`` bytes: one ``np.savez`` writes an array of megabytes in one C call, which
    the live tuning's gate cannot pause for a served run that starts meanwhile (python
    tools/auto_bench.py --models yolov8n_nudenet --spinning on: the request served as the tuning
    starts); between two slices it can. Arrays of objects are written as ``np.savez`` writes them."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            array = np.asanyarray(value)
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                if array.dtype.hasobject:
                    np.lib.format.write_array(member, array)
                    continue
                array = array if array.flags.c_contiguous else array.copy(order="C")  # keeps a 0-d array 0-d
                np.lib.format.write_array_header_1_0(member, np.lib.format.header_data_from_array_1_0(array))
                data = memoryview(array.reshape(-1).view(np.uint8))
                for start in range(0, len(data), WRITE_SLICE):
                    member.write(data[start:start + WRITE_SLICE])


def _options_from(spec: dict):
    if not spec:
        return None
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel(spec["level"])
    so.intra_op_num_threads = spec["threads"]
    for key, value in spec["entries"].items():
        so.add_session_config_entry(key, value)
    return so


def tune(source: str | bytes, sess_options, fusion, fusion_patterns, sample: Mapping[str, np.ndarray],
         budget_s: float, counts_path: str, *, lookup_first: bool = False, check_feeds: Sequence[Mapping] = (),
         on_start: Callable[[subprocess.Popen | None], None] = lambda p: None,
         stopped: Callable[[], bool] = lambda: False) -> Outcome:
    """See the module docstring."""
    with tempfile.TemporaryDirectory(prefix="ortfuse-tune-") as folder:
        model = os.path.abspath(source) if isinstance(source, str) else source  # the child runs in the folder
        if isinstance(source, bytes):
            model = os.path.join(folder, "model.bytes")
            Path(model).write_bytes(source)
        request = {"source": model, "bytes": isinstance(source, bytes), "options": _options_spec(sess_options),
                   "fusion": fusion, "fusion_patterns": list(fusion_patterns) if fusion_patterns is not None else None,
                   "budget_s": budget_s, "counts": counts_path, "lookup_first": lookup_first}
        Path(folder, "request.json").write_text(json.dumps(request))
        arrays: dict[str, Any] = dict(sample)
        save_npz(os.path.join(folder, "sample.npz"), arrays)
        for i, feed in enumerate(check_feeds):
            save_npz(os.path.join(folder, f"check{i}.npz"), dict(feed))
        errors = Path(folder, "stderr.txt")  # a file, not a pipe: a chatty child never blocks on it
        try:
            with open(errors, "wb") as sink:
                child = child_process.start("ortfuse.runtime.tune_process", [folder], folder, sink)
        except OSError as exc:
            return Outcome(error=f"the tuning process did not start ({exc})")
        try:
            child_process.supervise(child, folder, on_start, stopped, POLL_S)
        finally:
            child.wait()
        result = Path(folder, "result.json")
        if child.returncode != 0 or not result.exists():
            last = errors.read_text(errors="replace").strip().splitlines()[-1:]
            return Outcome(error=f"the tuning process failed ({last[0] if last else child.returncode})")
        outcome = Outcome(**json.loads(result.read_text()))
        if outcome.handed is not None:  # out of the folder before it is removed
            fd, outcome.plan_file = tempfile.mkstemp(prefix="ortfuse-plan-", suffix=".onnx")
            os.close(fd)
            os.replace(os.path.join(folder, "plan.onnx"), outcome.plan_file)
        return outcome


def _child(folder: str) -> Outcome:
    from ortfuse.foundation import yielding
    from ortfuse.runtime import planning
    from ortfuse.tune import steps, tuner

    steps.mark("imported")
    # what is alive now (the modules imported) lives until the process ends: the collections before
    # and between the timings' repeats (foundation.protocol) need not walk it again
    gc.freeze()

    request = json.loads(Path(folder, "request.json").read_text())
    source = Path(request["source"]).read_bytes() if request["bytes"] else request["source"]
    options = _options_from(request["options"])
    with np.load(os.path.join(folder, "sample.npz")) as data:
        sample = {k: data[k] for k in data.files}
    yielder = yielding.ProcessYielder(yielding.SharedCounts(request["counts"]), patience_s=request["budget_s"])
    yielding.install(yielder)
    model, why_not = planning.load_model(source, options)
    if model is None:
        return Outcome(error=f"tuning failed: {why_not}")
    steps.mark("model loaded")
    patterns = planning.requested_patterns(model, request["fusion_patterns"])
    tuning = None
    if request["lookup_first"]:  # what the parsed lookup at creation would have found (ortfuse.tune.lookup)
        tuning = tuner.tune(model, patterns, options, measure=False, any_shapes=True)
    if tuning is None or not tuning.measured or tuning.failure:
        tuning = tuner.tune(model, patterns, options, sample=sample, measure=True, budget_s=request["budget_s"])
    if tuning.failure:
        return Outcome(error=f"tuning failed: {tuning.failure}")
    del model
    steps.mark("decisions")
    # the plan these decisions give, made here and stored in the plan cache for the serving process
    prepared = planning.prepare(source, options, request["fusion"], request["fusion_patterns"], mode="off",
                                tuning=tuning)
    stock = prepared.report.to_dict() if prepared.plan is None else None
    key = planning.plan_key(source, options, request["fusion"], request["fusion_patterns"])
    steps.mark("plan made")
    outcome = Outcome(tuning.to_dict(), tuning.path, tuning.from_cache, yielder.discarded, stock_report=stock,
                      plan_key=key)
    if prepared.plan is not None and isinstance(prepared.plan.source, bytes):  # not stored in the plan cache
        Path(folder, "plan.onnx").write_bytes(prepared.plan.source)
        outcome.handed = planning.plan_entry(prepared.plan, prepared.report)
    feeds = _check_feeds(folder)
    if prepared.plan is not None and feeds:
        outcome.check_error = _check(source, options, prepared, feeds)
        outcome.checked_feeds = 0 if outcome.check_error else len(feeds)
        steps.mark("outputs checked")
    outcome.steps = steps.recorded()
    return outcome


def _check_feeds(folder: str) -> list[dict]:
    feeds: list[dict] = []
    while os.path.exists(path := os.path.join(folder, f"check{len(feeds)}.npz")):
        with np.load(path) as data:
            feeds.append({k: data[k] for k in data.files})
    return feeds


def _check(source, options, prepared, feeds: list[dict]) -> str:
    """``output_check.check_sessions`` of the plan's session against a stock ORT session with the
    same options, each run waiting while a served run is in flight. Neither session's pool threads
    spin after a run (the outputs are the same): threads of this process spinning in the gaps slowed
    the served runs of a session whose own threads spin (``python tools/auto_bench.py --models
    yolov8n_nudenet --spinning on``: the served runs while the plan's outputs are checked)."""
    import onnxruntime as ort

    from ortfuse.tune.output_check import check_sessions

    options = options if options is not None else ort.SessionOptions()
    for so in (options, prepared.sess_options):
        if so is not None:
            sleep_after_runs(so)
    cpu = ["CPUExecutionProvider"]
    stock = ort.InferenceSession(source, options, providers=cpu)
    fused = ort.InferenceSession(prepared.source, prepared.sess_options, providers=cpu,
                                 disabled_optimizers=sorted(prepared.disabled_optimizers) or None)
    return check_sessions(stock, fused, feeds, [o.name for o in stock.get_outputs()], options)


def main(argv: list[str]) -> int:
    from ortfuse.tune import layout_memo, steps

    steps.start()
    child_process.background_priority()
    with layout_memo.remembering():  # the plan timed whole and then made is laid out once
        outcome = _child(argv[0])
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    outcome.cpu_s = round(usage.ru_utime + usage.ru_stime, 3)
    Path(argv[0], "result.json").write_text(json.dumps(outcome.__dict__))
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # the result is on disk: no interpreter teardown (ORT sessions, numba) at idle priority before the
    # serving process, which waits for this process to end, can swap the plan in
    sys.stderr.flush()
    os._exit(code)
