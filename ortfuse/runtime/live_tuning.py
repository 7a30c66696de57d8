"""``fusion="auto"`` tuned on live traffic, then an atomic swap of the session's ORT C session
(docs/ARCHITECTURE.md §7): the tuning driver. The serving side (served runs counted, the swap
itself) is ``ortfuse.runtime.served_runs``.

Contract, in ``background`` mode (``session_options.tune_mode``) when nothing is known yet for the
model on this machine (``planning.Prepared.pending``):
- the session serves at once on stock ORT; the first ``SAMPLE_RUNS`` served feeds (``run``,
  ``run_async``, ``run_with_ort_values``) are copied, at most ``SAMPLE_BYTES`` in all; then a daemon
  thread has them tuned (``tuner.tune(sample=...)``, on the most common shape among them) and the
  fused plan made (``planning.prepare`` with those decisions: the plan cache and the tuning cache are
  filled, so the next session on this machine starts fused) by a process of its own
  (``runtime.tune_process``, ``IN_CHILD``; in the thread itself where processes cannot be stopped;
  this process then imports neither the tuner nor the rewriter: their imports hold the GIL),
  opens a new ORT C session on the plan (from a file, ``files.model_file``: ORT parses bytes holding the
  GIL), checks its outputs against stock ORT's on every recorded feed (``tune.output_check``; the
  tuning process checks them beside its stock session, so this process only warms the new session
  with one run; the thread checks against the serving session), and swaps it in
  (``ServedRuns.swap``: under the lock that counts runs in flight, no run fails or mixes plans);
- tuning yields to serving: the tuning process runs at the lowest CPU priority (a served request that
  wakes while it computes gets a core at once; ``child_process.background_priority``), is stopped
  (SIGSTOP) while a served run is in flight
  and keeps a timing only when no served run overlapped it (``yielding.ProcessYielder``): onnx and
  ORT hold the GIL through long C calls (parsing, shape inference, session creation), which a thread
  of this process would make served runs wait for. In this thread, a served run that starts aborts
  the tuning's ORT runs in flight
  (``RunOptions.terminate``) and the tuning thread pauses at its next Python call until no run is
  in flight; a timing that overlapped a served run is discarded and taken again, so decisions rest
  only on undisturbed timings (``ortfuse.foundation.yielding``; when served runs leave no idle window long
  enough for one run, the tuning ends with stock ORT and says so). The thread runs at the caller's
  priority: a low-priority thread holding the GIL would keep served runs waiting for it. While it
  runs, the interpreter's GIL switch interval is ``yielding.SWITCH_INTERVAL_S`` (a served run waiting for
  the GIL gets it sooner; restored when the last tuning ends). The native kernels the plan needs are
  compiled first, in a child process stopped (SIGSTOP) while a run is in flight
  (``ortfuse.tune.kernel_compile``; numba's compiler runs in long C calls no thread can pause in;
  once per machine, its cache on disk serves later processes). Measuring has a budget
  (config entry ``ortfuse.tune_budget_s``, default ``DEFAULT_BUDGET_S``: matches not reached stay
  unfused) and the whole tuning stops after ``HARD_STOP`` budgets of work (pauses do not count) or
  ``WALL_STOP`` budgets of wall-clock time (pauses count: served runs left too little idle time);
- whatever fails (no sample, tuning, building, a differing or failing output) leaves the session on
  stock ORT, and ``status`` and ``fusion_report`` say why; a plan with reference (Python-op) kernels
  is not swapped in (the guarded runs those need are chosen per session, not per run).
``wait(timeout)`` is True once tuning has ended (or there is nothing to tune). ``tune_with(feeds)``
starts a tuning on given feeds, in any mode. ``timeline``: the tuning's steps and when they happened
(``time.perf_counter()``; ``tools/auto_bench.py`` records them beside served latencies).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping

from ortfuse.foundation import child_process, yielding
from ortfuse.foundation.files import model_file
from ortfuse.foundation.messages import one_sentence
from ortfuse.foundation.session_options import PRECISION_OPTION, TUNE_BUDGET_KEY, config_entry
from ortfuse.fusion.report import FusionReport
from ortfuse.runtime import stop_points
from ortfuse.runtime.recorded_feeds import FeedCopies, copy_feeds, representative, shapes_of
from ortfuse.runtime.served_runs import ServedRuns, Unfit, remove, swap_unsupported
from ortfuse.tune.output_check import check_sessions

SAMPLE_RUNS = 8  # served feeds recorded before tuning starts
SAMPLE_BYTES = 64 << 20  # all recorded feeds together
DEFAULT_BUDGET_S = 30.0  # measuring's budget (tuner.tune(budget_s=)); matches not reached stay unfused
HARD_STOP = 2.0  # the whole tuning (measuring, fusing, building, checking) stops after this many budgets of work
# ... and after this many budgets of wall-clock time, pauses for served runs included (the tuning process
# waits at idle priority and stopped during served runs: a longer wait costs served runs nothing)
WALL_STOP = 8.0
IN_CHILD = True  # measure in a process of its own (runtime.tune_process) where it can be stopped (SIGSTOP)
CHECK_EVERY = 64  # profile events between the tuning thread's clock checks

_live: weakref.WeakSet = weakref.WeakSet()  # tunings with a thread, stopped at interpreter exit


class _Stopped(BaseException):
    """Raised in the tuning thread to stop it (budget spent, session closed, interpreter exiting);
    a BaseException so that no ``except Exception`` on the way turns it into a result."""


def status_of(report: FusionReport) -> str:
    """The short status of a session without live tuning, from its report."""
    if report.applied:
        return f"fused: {len(report.fused)} of {len(report.matches)} matches kept"
    return f"stock ORT: {report.reason}" if report.reason else "stock ORT"


def budget_of(sess_options) -> float:
    text = config_entry(sess_options, TUNE_BUDGET_KEY)
    try:
        return float(text) if text else DEFAULT_BUDGET_S
    except ValueError:
        return DEFAULT_BUDGET_S


class LiveTuning:
    """The live-tuning state of one ``fusion="auto"`` session (see the module docstring)."""

    def __init__(self, session, prepared, source, sess_options, fusion, fusion_patterns, disabled_optimizers) -> None:
        self._session = weakref.ref(session)
        self._source, self._options = source, sess_options  # the caller's input and options
        self._fusion, self._fusion_patterns = fusion, fusion_patterns
        # a deferred report decided from the bytes lists none: the ids are read from the parsed model
        self._patterns: list[str] | None = list(prepared.report.patterns) or None
        self._disabled = set(disabled_optimizers or ())
        self._budget = budget_of(sess_options)
        self._samples: list[dict] = []
        self._sample_bytes = 0
        self._copies = FeedCopies()  # the next recorded feed's arrays, written in the gap before it
        self.recording = bool(prepared.pending)  # served feeds are recorded (read and set under served.lock)
        # a shared plan store's replica that does not hold the key's lease: feeds are recorded, the
        # tuning waits for ``release_start`` (runtime.shared_plans); read and set under served.lock
        self.hold_start = False
        self._start_held = False
        # creation found nothing (maybe from the bytes alone, ortfuse.tune.lookup): look again, parsed, first
        self._deferred = self.recording and not prepared.report.matches
        self._compile_since: float | None = None  # when it started (its time is not the tuning's work)
        self._paused = 0.0
        self._t0 = time.perf_counter()
        self._notes: list[str] = []
        self._checked_in_child = False  # the tuning process checked the plan's outputs on every recorded feed
        self._plan_file = ""  # a plan file the tuning process handed over (tune_process.Outcome.plan_file)
        self._child_cpu_s: float | None = None  # CPU seconds the tuning process used (None: tuned in a thread)
        self.timeline: list[tuple[str, float]] = []  # (event, time.perf_counter()) of the tuning's steps
        # once the tuning ended: its plan ("fused" / "stock"), the served runs before it took effect, the
        # seconds from the first served run to then and the tuning's own seconds (``_plan_reached``)
        self.time_to_plan: dict | None = None
        self._thread: threading.Thread | None = None
        self.running = False  # a tuning was started and has not ended (read and set under served.lock)
        self._done = threading.Event()
        self._stop = False
        self.served = ServedRuns(session, self, lambda: self._stop or self._over_wall(), self._add_pause)
        self._status = self._recording_status() if self.recording else status_of(prepared.report)
        if self.recording:
            prepared.report.notes.append(
                f"auto: serving stock ORT; tuning in the background on the first {SAMPLE_RUNS} served feeds, then "
                "swapping to the faster plan (session.wait_tuned() waits, session.fusion_status tells)")
        else:
            self._done.set()
        # served runs go through ``served.counted`` only while this tuning records, runs or a replaced
        # C session waits; otherwise the session's run is ORT's alone, so a session that keeps stock ORT
        # pays nothing per run (tests/test_live_tuning.py::test_tuned_session_runs_as_ort_runs)
        session._ortfuse_counting = self.served if self.recording else None

    # ------------------------------------------------------------------ recorded feeds

    def record(self, feeds: Mapping) -> None:
        """Record a served run's feeds (``ServedRuns.begin`` calls this while ``recording``); the
        tuning starts once ``SAMPLE_RUNS`` are recorded, or the next would pass ``SAMPLE_BYTES``."""
        copy = self._copies.copy(feeds)
        if copy is None:
            return
        size = sum(a.nbytes for a in copy.values())
        start = more = False
        with self.served.lock:
            if not self.recording:
                return
            if self._sample_bytes + size > SAMPLE_BYTES:  # the cap: tune on what fits, if anything does
                self.recording = False
                if self._samples:
                    self.running = start = True
                else:
                    self._status = (f"stock ORT: the served feeds ({size >> 20} MiB) exceed the "
                                    f"{SAMPLE_BYTES >> 20} MiB sample cap; hand smaller inputs to session.tune_with()")
                    self._done.set()
            else:
                self._samples.append(copy)
                self._sample_bytes += size
                self._status = self._recording_status()
                if len(self._samples) >= SAMPLE_RUNS:
                    self.recording = False
                    self.running = start = True
                else:
                    more = self._sample_bytes + size <= SAMPLE_BYTES
            if start and self.hold_start:
                self.running = start = False
                self._start_held = True
                self._status = "serving stock ORT, waiting for the plan another replica tunes (plan store)"
        if more:  # arrays for the next feed, written once this run has ended
            self._copies.prepare(copy, self.served.wait_idle)
        else:  # recording is over: arrays made ahead, or on their way, are dropped with their maker
            self._copies = FeedCopies()
        if start:
            self._start()

    def release_start(self) -> None:
        """Let this tuning start (now, if its feeds are recorded already): this replica tunes."""
        with self.served.lock:
            self.hold_start = False
            start, self._start_held = self._start_held, False
            if start:
                self.running = True
        if start:
            self._start()

    def adopt(self, prepared) -> None:
        """Swap in ``prepared``, a plan made elsewhere (a plan store's, installed in the plan cache),
        checked on the feeds recorded so far; recording and any held tuning end. On this thread."""
        with self.served.lock:
            if self.running:
                return
            self.recording, self.hold_start, self._start_held, self.running = False, True, False, True
        status = ""
        try:
            session = self._session()
            if session is None:
                raise _Stopped("the session was closed")
            new = None
            if prepared.plan is not None and self._samples:
                new = self._build_and_check(prepared)
            elif prepared.plan is not None:
                new = self._build(session, prepared)
            del session
            status = self._swap(prepared, new)
            self._mark("swapped" if new is not None else "ended on the current plan")
        except (_Stopped, Unfit) as exc:
            status = f"stock ORT: the plan store's plan was not swapped in: {exc}"
        except Exception as exc:  # the session keeps serving the plan it has
            status = f"stock ORT: the plan store's plan was not swapped in: {one_sentence(exc)}"
        finally:
            self._samples, self._sample_bytes = [], 0
            self._ended(status)
        self._release()

    def _ended(self, status: str) -> None:
        self._plan_reached(status)
        self._status = status or self._status
        with self.served.lock:
            self.running = False
        self._done.set()

    def _plan_reached(self, status: str) -> None:
        """Record ``time_to_plan`` (and a report note) when the tuning ends: the served runs before the
        final plan took effect and the seconds from the first served run to then."""
        now, served = time.perf_counter(), self.served
        fused = status.startswith("fused")
        runs = (served.swapped_at - 1) if fused and served.swapped_at else served.runs
        first = served.first_at
        self.time_to_plan = {"plan": "fused" if fused else "stock", "served_runs": runs,
                             "seconds": round(now - first, 3) if first is not None else None,
                             "tuning_s": round(now - self._t0, 3), "child_cpu_s": self._child_cpu_s}
        session = self._session()
        if session is not None and first is not None:
            session.fusion_report.notes.append(
                f"auto: final plan ({self.time_to_plan['plan']}) in effect after {runs} served runs, "
                f"{now - first:.1f} s after the first one (tuning {now - self._t0:.1f} s)")
        del session

    def _release(self) -> None:
        """Replaced C sessions released once idle; served runs no longer counted when nothing needs it."""
        self.served.release_when_idle(lambda: self._stop)
        self.served.detach_if_idle()

    def _recording_status(self) -> str:
        return f"serving stock ORT, recording feeds ({len(self._samples)}/{SAMPLE_RUNS})"

    # ------------------------------------------------------------------ public state

    @property
    def status(self) -> str:
        return self._status

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def tune_with(self, feeds_list: Iterable[Mapping]) -> None:
        """Tune on ``feeds_list`` now, in the background; refused while a tuning runs."""
        copies = [copy_feeds(f) for f in feeds_list]
        if not copies or any(c is None for c in copies):
            raise ValueError("tune_with takes a non-empty list of feeds: dicts of input name to array")
        with self.served.lock:
            if self.running:
                raise RuntimeError("a tuning is running on this session; call wait_tuned() first")
            self._samples = [c for c in copies if c is not None][:SAMPLE_RUNS]
            self.recording = False
            self.running = True
            self._done.clear()
        self.served.attach()
        self._start()

    # ------------------------------------------------------------------ the tuning thread

    def _start(self) -> None:
        self._status = f"tuning on {len(self._samples)} recorded feeds (serving the current plan meanwhile)"
        self._thread = threading.Thread(target=self._main, name="ortfuse-live-tuning", daemon=True)
        _live.add(self)
        self._thread.start()

    def _main(self) -> None:
        self._t0 = time.perf_counter()
        self._mark("tuning started")
        self._paused = 0.0
        status = ""
        yielding.fast_switching(True)
        yielding.install(self.served.yielder)
        try:
            gate = self._gate()
            sys.setprofile(gate)
            try:
                prepared = self._tune(gate)
                self._mark("plan prepared")
                new = self._build_and_check(prepared)
                self._work_check()  # the gate checks every CHECK_EVERY calls: the last stretch too
            finally:
                sys.setprofile(None)
            status = self._swap(prepared, new)
            self._mark("swapped" if new is not None else "ended on the current plan")
        except _Stopped as exc:
            status = f"stock ORT: tuning stopped: {exc}"
        except yielding.Starved as exc:
            status = (f"stock ORT: tuning stopped: {exc} (it measures only while no served run is in flight; "
                      "hand inputs to session.tune_with() at a quiet time, or run `ortfuse tune`)")
        except Unfit as exc:
            status = f"stock ORT: {exc}"
        except Exception as exc:  # the session keeps serving the plan it has
            status = f"stock ORT: tuning failed: {one_sentence(exc)}"
        finally:
            sys.setprofile(None)
            yielding.install(None)
            yielding.fast_switching(False)
            self._samples, self._sample_bytes = [], 0
            if self._plan_file:  # handed over but not swapped in
                remove(self._plan_file)
                self._plan_file = ""
            session = self._session()
            if session is not None and status.startswith("stock ORT: ") and self.served.swapped_at is None:
                why = status[len("stock ORT: "):]
                session.fusion_report.notes.append(f"auto: live tuning: {why}")
                if not session.fusion_report.applied:
                    session.fusion_report.reason = f"fusion='auto': live tuning: {why}; stock ORT"
            del session
            self._ended(status)
        self._release()

    def _mark(self, event: str) -> None:
        self.timeline.append((event, time.perf_counter()))

    def _over_wall(self) -> bool:
        return time.perf_counter() - self._t0 > WALL_STOP * self._budget

    def _starved_check(self) -> None:
        if self._over_wall():
            raise yielding.Starved(f"served runs (or the machine's other work) left too little idle time: "
                                   f"{WALL_STOP * self._budget:g} s passed "
                                   f"({WALL_STOP:g} times ortfuse.tune_budget_s)")

    def _add_pause(self, seconds: float) -> None:
        self._paused += seconds

    def _child_waits(self) -> bool:
        """Polled while the tuning process runs: continues it when served runs held it (it is stopped
        in most gaps after short runs, ``ServedRuns.resume_if_idle``); True when it must be stopped."""
        self.served.resume_if_idle()
        return self._stop or self._over_wall()

    def _compile_waits(self) -> bool:
        self.served.resume_if_idle()
        return self._stop

    def _compiling(self, child) -> None:
        """A child process compiling kernels or tuning starts (stopped at once if a run is in flight) or
        ends (None); its time is not this thread's work."""
        self._mark("child started" if child is not None else "child ended")
        self.served.hold(child)
        now = time.perf_counter()
        if child is None and self._compile_since is not None:  # another process's work, bounded apart
            self._paused += now - self._compile_since
        self._compile_since = now if child is not None else None

    def _gate(self):
        """The tuning thread's profile hook: pause while a run is in flight; every ``CHECK_EVERY``
        calls, at the next stop point (``runtime.stop_points``), stop when the session is gone, the work
        exceeds ``HARD_STOP`` budgets or the wall-clock time ``WALL_STOP`` budgets. Kept to a few
        operations per call: it runs on every Python and C call of the thread."""
        clock, tick = time.perf_counter, [CHECK_EVERY]
        wall = WALL_STOP * self._budget
        served = self.served
        at_stop_point = stop_points.checker()

        def gate(frame, event, arg) -> None:
            if served.inflight:
                start = now = clock()
                with served.lock:
                    while served.inflight and not self._stop and now - self._t0 < wall:
                        served.idle.wait(0.05)
                        now = clock()
                self._paused += clock() - start
                tick[0] = 1  # the wall clock is checked at the next stop point
            tick[0] -= 1
            if tick[0] > 0:
                return
            if not at_stop_point(frame, event):  # raising here could leave a lock held
                tick[0] = 1
                return
            tick[0] = CHECK_EVERY
            if self._stop or self._session() is None:
                raise _Stopped("the session was closed")
            self._work_check()
            self._starved_check()

        return gate

    def _work_check(self) -> None:
        """Stop once the tuning's own work (time not paused for served runs or spent in a compiling
        process) exceeds ``HARD_STOP`` budgets."""
        limit = HARD_STOP * self._budget
        if self._compile_since is None and time.perf_counter() - self._t0 - self._paused > limit:
            raise _Stopped(f"it worked {limit:g} s ({HARD_STOP:g} times ortfuse.tune_budget_s)")

    def _tune(self, gate):
        """The plan tuned on the recorded feeds (its ``plan`` None: stock ORT): measured in a process
        of its own (``IN_CHILD``, ``runtime.tune_process``), else in this thread."""
        sample = representative(self._samples)
        self._checked_in_child = False
        if IN_CHILD and child_process.stoppable():  # nothing of onnx or the rewriter imported here
            return self._tune_in_child(sample)
        from ortfuse.tune import layout_memo

        with layout_memo.remembering():  # the plan timed whole and then made is laid out once
            return self._tune_here(sample)

    def _tune_here(self, sample: dict):
        from ortfuse.runtime import planning
        from ortfuse.tune import kernel_compile, tuner

        model, why_not = planning.load_model(self._source, self._options)
        if model is None:
            raise Unfit(f"tuning failed: {why_not}")
        if self._patterns is None:
            self._patterns = list(planning.requested_patterns(model, self._fusion_patterns))
        fused = self._fuse_all(model)
        why = kernel_compile.compile_kernels(fused, self._compiling, self._compile_waits)
        if why:
            self._notes.append(f"auto: kernels: {why}")
        del fused
        tuning = None
        if self._deferred:  # what the parsed lookup at creation would have found (ortfuse.tune.lookup)
            tuning = tuner.tune(model, self._patterns, self._options, measure=False, any_shapes=True)
        if tuning is None or not tuning.measured or tuning.failure:
            tuning = tuner.tune(model, self._patterns, self._options, sample=sample, measure=True,
                                budget_s=self._budget)
        if tuning.failure:
            raise Unfit(f"tuning failed: {tuning.failure}")
        del model
        prepared = planning.prepare(self._source, self._options, self._fusion, self._fusion_patterns, mode="off",
                                    tuning=tuning)
        prepared.report.notes.append(f"auto: tuned on {len(self._samples)} served feeds "
                                     f"(shapes {shapes_of(sample)}; {self.served.yielder.discarded} runs or timings "
                                     "disturbed by served runs discarded and taken again)")
        prepared.report.notes.extend(self._notes)
        return prepared

    def _tune_in_child(self, sample: dict):
        from ortfuse.runtime import planning, tune_process
        from ortfuse.tune.decisions import Tuning

        folder = tempfile.mkdtemp(prefix="ortfuse-served-")
        try:
            counts = yielding.SharedCounts(os.path.join(folder, "counts"), create=True)
            with self.served.lock:
                self.served.counts = counts
            outcome = tune_process.tune(self._source, self._options, self._fusion, self._fusion_patterns, sample,
                                        self._budget, counts.path, lookup_first=self._deferred,
                                        check_feeds=self._samples,
                                        on_start=self._compiling, stopped=self._child_waits)
        finally:
            with self.served.lock:
                self.served.counts = None
            shutil.rmtree(folder, ignore_errors=True)
        self._plan_file = outcome.plan_file  # removed when the session goes, or at once when not swapped in
        self._child_cpu_s = outcome.cpu_s
        began = next((t for event, t in reversed(self.timeline) if event == "child started"), None)
        if began is not None:  # the child's own steps, on this clock (from just after its interpreter started)
            # this thread may mark "child started" after the child began its record (it was descheduled):
            # a step then lands past "child ended", the timeline's last event, and is placed at it
            ended = self.timeline[-1][1]
            self.timeline[-1:-1] = [(f"child {event}", min(began + s, ended)) for event, s in outcome.steps or ()]
        if self._stop:
            raise _Stopped("the session was closed")
        self._starved_check()
        if outcome.tuning is None:
            raise Unfit(outcome.error)
        if outcome.check_error:
            raise Unfit(outcome.check_error)
        self._checked_in_child = outcome.checked_feeds == len(self._samples)
        tuning = Tuning.from_dict(outcome.tuning, outcome.path)
        tuning.from_cache = outcome.from_cache
        if outcome.stock_report is not None:  # nothing kept: no plan to read, nothing to parse here
            prepared = planning.Prepared(self._source, self._options, FusionReport.from_dict(outcome.stock_report),
                                         auto=True, mode="off")
        elif outcome.handed is not None:  # not cached (decisions not final): the child's plan as it is
            prepared = planning.prepare(self._source, self._options, self._fusion, self._fusion_patterns,
                                        mode="off", handed={**outcome.handed, "model_path": outcome.plan_file})
        else:
            prepared = planning.prepare(self._source, self._options, self._fusion, self._fusion_patterns,
                                        mode="off", tuning=tuning, plan_key=outcome.plan_key)  # the child's plan
        prepared.report.notes.append(f"auto: tuned on {len(self._samples)} served feeds in a process of its own "
                                     f"(shapes {shapes_of(sample)}; {outcome.discarded} timings disturbed by served "
                                     "runs discarded and taken again)")
        return prepared

    def _build_and_check(self, prepared):
        """A C session on the tuned plan, checked on the recorded feeds; None when the plan is stock."""
        if prepared.plan is None:
            return None
        session = self._session()
        if session is None:
            raise _Stopped("the session was closed")
        if prepared.reference_inputs is not None or session._ortfuse_reference_inputs is not None:
            raise Unfit("the faster plan needs reference (Python-op) kernels, which a live swap does not take; "
                         "a new session uses it")
        new = self._build(session, prepared)
        self._mark("plan's session built")
        names = [o.name for o in session._outputs_meta]
        if self._checked_in_child:
            self._warm(new, names)
            self._mark("plan's session warmed")
        else:
            self._check(session._sess, new, names)
            self._mark("plan's outputs checked")
        return new

    def _fuse_all(self, model):
        """The model with every candidate fused (the kernels measuring may need)."""
        from ortfuse.fusion.rewrite import fuse

        return fuse(model, self._patterns, precision=config_entry(self._options, PRECISION_OPTION) or None)[0]

    def _build(self, session, prepared):
        """A new ORT C session on the fused plan, made as ORT's ``_create_inference_session`` makes one."""
        why = swap_unsupported(session)
        if why:
            raise Unfit(why)
        from onnxruntime.capi import _pybind_state as C
        from onnxruntime.capi.onnxruntime_inference_collection import check_and_normalize_provider_args

        names = list(session._sess.get_providers())
        given = session._sess.get_provider_options()
        providers, provider_options = check_and_normalize_provider_args(
            names, [dict(given.get(n, {})) for n in names], C.get_available_providers())
        options = prepared.sess_options if prepared.sess_options is not None else C.get_default_session_options()
        with model_file(prepared.source) as path:
            self.served.wait_gap_start()  # each C call begins a gap: it cannot pause for a served run
            sess = C.InferenceSession(options, path, True, session._read_config_from_model)
            self.served.wait_gap_start()
            sess.initialize_session(providers, provider_options, self._disabled | prepared.disabled_optimizers)
        return sess

    def _check(self, serving, fused, names: list[str]) -> None:
        """The fused C session computes what the serving one does on every recorded feed."""
        why = check_sessions(serving, fused, self._samples, names, self._options)
        if why:
            raise Unfit(why)

    def _warm(self, fused, names: list[str]) -> None:
        """One run of the checked plan's new C session on a recorded feed, yielding to served runs:
        its first run's allocations land here, not on the first served run after the swap."""
        try:
            yielding.run(lambda options: fused.run(names, self._samples[0], options))
        except Exception as exc:
            raise Unfit(f"the fused plan failed on served feed 1 in this process ({one_sentence(exc)}); "
                         "kept stock ORT") from exc

    def _swap(self, prepared, new) -> str:
        """Swap the checked C session ``new`` in (None: stay on stock ORT); the status to show."""
        session = self._session()
        if session is None:
            raise _Stopped("the session was closed")
        if new is None:
            session.fusion_report = prepared.report
            return "stock ORT: no fusion measured faster" if prepared.report.matches else \
                "stock ORT: no pattern matches this model"
        at = self.served.swap(session, prepared, new, self._plan_file)
        self._plan_file = ""  # the session's model path now, removed when the session goes
        report = session.fusion_report
        return f"fused since run {at}: {len(report.fused)} of {len(report.matches)} matches kept"

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the tuning thread (its ORT runs in flight aborted, the thread at its next Python call)
        and wait for it up to ``timeout`` seconds."""
        self._stop = True
        with self.served.lock:
            self.served.yielder.abort_locked()
            self.served.idle.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


@atexit.register
def _stop_all() -> None:
    for tuning in list(_live):
        tuning.stop()
