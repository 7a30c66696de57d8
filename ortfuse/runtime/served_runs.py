"""The serving side of a live tuning (docs/ARCHITECTURE.md §7): served runs counted in flight, the
tuning told of each, and the atomic swap of the session's ORT C session (the tuning driver that
decides what to swap in is ``ortfuse.runtime.live_tuning``).

Contract:
- ``counted(feeds, call, *args)`` runs ``call(*args)`` as a run in flight (``counted_async`` for a
  run that completes on an ORT thread): under one lock it counts the run in (``begin``), tells the
  tuning's yielder (its runs in flight are aborted) and the tuning process's shared counts, and stops
  the tuning's child process (SIGSTOP) when it is the first run in flight; the run's feeds go to the
  tuning while it records them; ``end`` counts it out, has the child continued (SIGCONT) when no run
  is in flight and releases replaced C sessions then (never on an ORT thread). After a short run the
  continue signal is sent by a thread of its own once a core is idle (``_Continuer``): the request's
  path only wakes that thread, and a run that begins before it has sent the signal finds the child
  still stopped and sends none;
- after short runs the child runs in ``BURST`` gaps in a row, then rests, kept stopped, for
  ``(spread - 1) * BURST`` served runs: those runs are counted only in a deque of runs in flight and
  a countdown (``counted``'s resting path), none of the bookkeeping above, and the last of them ends
  the rest; the tuning driver ends a rest in which no run ended for ``HOLD_S`` and none is in
  flight (the session is idle) and continues the child;
- served runs are counted only while the tuning needs them counted (it records feeds or runs) or a
  replaced C session waits for runs in flight: ``attach`` routes the session's runs here
  (``session._ortfuse_counting``), ``detach_if_idle`` gives them back to ORT's run alone. A run that
  read the counter just before holds its C session through its own call, so none is released under it;
- ``swap`` replaces the session's C session under the same lock: a run holds the C session it
  started on until it returns, later runs use the new one; no run fails or mixes plans. If ORT's
  private API refuses, the session keeps its attributes and serves its current plan (``Unfit``);
- an ``IOBinding`` made before a swap stays bound to the C session it was made on
  (``bound_elsewhere``), and OrtValues made by ``create_ortvalue_from_shape_and_type`` before a swap
  are accepted after it (``accept_ortvalues``: CPU memory any of the session's C sessions can read).
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from onnxruntime import OrtValue

from ortfuse.foundation import child_process, yielding
from ortfuse.foundation.messages import one_sentence

RELEASE_WAIT_S = 60.0  # how long the tuning thread waits for idleness to release a replaced C session
# A request in whose path the serving thread stops or continues the tuning process pays for the signal
# (the system call, which wakes or interrupts the process's threads on other cores, and what follows);
# after a served run shorter than SHORT_RUN_S that is a visible share of the request, so the process
# runs in BURST gaps of SPREAD * BURST only (or once the session has been idle HOLD_S) and most
# requests carry no signal. Where a signal takes more than SIGNAL_SHARE of a short run (medians of the last
# SIGNAL_SAMPLES of each), the requests that carry one would exceed the p50 allowed while tuning on
# their own: SPREAD_COSTLY then, a sixth of the requests carry one and the p50 falls among
# those that carry none (python tools/served_path.py --models tiny_ffn: auto_quiet against auto).
# The process's work in a gap costs the short run after it too, by the caches it evicts: with ORT's
# default spinning a served session's pool thread keeps the other core through the gap, so the process
# runs on the serving thread's. Where the short runs after gaps it ran in take more than
# 1 + RAN_GAP_SLOWDOWN times those after gaps it was held in (medians of the last RAN_GAP_SAMPLES of
# each), SPREAD_COSTLY too: at SPREAD those runs are a third of the requests, and their slowdown moves
# the p50 by about a third of it. Without spinning they come out faster, not slower: the process's work
# kept the cores from sleeping (python tools/auto_bench.py --models ppocr_mobile_v2_cls, with and
# without --spinning on: the requests after a short one, grouped by the gap before them). SPREAD_COSTLY
# stays once chosen: the cost is the machine's and the model's, and a comparison of medians near its
# line would otherwise alternate the two spreads (the same command: the share of requests after a gap
# the process ran in)
# The continue signal wakes the stopped process's threads, several times the stop's cost; after a short
# run a thread of its own sends it, in the gap the serving thread waits in rather than in the request
# (python tools/served_path.py --models silero_vad_16k_op15: the requests that carry CONT or CONT?).
# Counting a served run in and out costs a sub-millisecond run a visible share of its time on its own
# (the lock and the bookkeeping above, run cold after the idle gap and after ORT's run): the process
# therefore runs in BURST gaps in a row and rests through the runs that would have been held one at a
# time, and those runs take the resting path only, a deque and a countdown (python tools/auto_bench.py
# --models silero_vad_16k_op15: auto's requests after gaps the process was held in, against stock's at
# the same place in a block)
SHORT_RUN_S = 0.005
BURST = 8
SPREAD = 3
SPREAD_COSTLY = 6
SIGNAL_SHARE = 0.05
SIGNAL_SAMPLES = 16
RAN_GAP_SLOWDOWN = 0.02
RAN_GAP_SAMPLES = 32
RAN_GAP_MIN = 3  # samples on each side before the runs after gaps are compared (one held gap per rest)
HOLD_S = 0.01
GAPS = 8  # the recent gaps between served runs wait_gap_start reads the session's rhythm from


class Unfit(Exception):
    """The tuned plan cannot be swapped in; the message says why."""


class ServedRuns:
    """The served runs of one session with a live tuning beside them (see the module docstring).

    ``tuning`` is what the serving side asks of that tuning: ``recording`` (whether served feeds are
    recorded), ``running`` (whether a tuning runs; both read and set under ``lock``) and
    ``record(feeds)`` (called outside the lock). ``stopped()`` and ``paused(seconds)`` are the
    tuning's, for its ``yielder``."""

    def __init__(self, session, tuning, stopped: Callable[[], bool], paused: Callable[[float], None],
                 defer_continue: bool = True) -> None:
        self._session = weakref.ref(session)
        self._tuning = tuning
        self.lock = threading.RLock()  # re-entered by the tuning's gate when it fires inside the yielder's waits
        self.idle = threading.Condition(self.lock)
        self.inflight = 0
        self.runs = 0
        self.retired: list = []  # replaced C sessions, released when no run is in flight
        self.child = None  # the process compiling kernels or tuning, stopped while a run is in flight
        self.counts: yielding.SharedCounts | None = None  # served runs, as that tuning process reads them
        self.swapped_at: int | None = None  # the served run the last swap took effect from
        self.held = False  # the tuning process is kept stopped in this gap (after a short served run)
        self._began = self._ended = 0.0  # when the served runs in flight began and when they last ended
        self._short_gaps = 0  # gaps after short served runs so far
        self.spread = SPREAD  # the process runs in BURST gaps of spread * BURST after short runs (``spread_for``)
        self._burst = BURST  # gaps after short runs left in this burst, in which the process runs
        self._rest_left = 0  # served runs left in the rest (> 0: resting, the runs take the resting path)
        self._rest_runs = 0  # the rest's length in served runs
        self._rest_seen = (0, 0.0)  # _rest_left when the tuning driver last saw it change, and when
        self._rest_flight: collections.deque = collections.deque()  # the rest's runs in flight, one item each
        self._signal_s: collections.deque[float] = collections.deque(maxlen=SIGNAL_SAMPLES)  # on the serving path
        self._short_s: collections.deque[float] = collections.deque(maxlen=SIGNAL_SAMPLES)  # short runs' durations
        # short runs after a gap after a short run, by whether the process ran in it (``spread_for``)
        self._after_ran: collections.deque[float] = collections.deque(maxlen=RAN_GAP_SAMPLES)
        self._after_held: collections.deque[float] = collections.deque(maxlen=RAN_GAP_SAMPLES)
        # the process ran in the last gap after a short run (None: another gap); unchanged while runs are in flight
        self._gap_ran: bool | None = None
        self._gaps: collections.deque[float] = collections.deque(maxlen=GAPS)  # the last idle gaps (s)
        self.first_at: float | None = None  # time.perf_counter() of the first served run counted
        self._defer_continue = defer_continue  # SIGCONT from a _Continuer (False: from the serving path)
        self._continuer: _Continuer | None = None  # the thread that continues ``child`` (while it lives)
        self.yielder = yielding.Yielder(self.idle, lambda: self.inflight > 0, stopped, paused)
        self._stopped = stopped

    # ------------------------------------------------------------------ counting

    def attach(self) -> None:
        """Served runs are counted (and recorded) from now on."""
        session = self._session()
        if session is not None:
            session._ortfuse_counting = self

    def detach_if_idle(self) -> None:
        """Served runs go straight to ORT again once nothing needs them counted: no recording, no
        tuning, no replaced C session waiting for runs in flight."""
        session = self._session()
        with self.lock:
            if (session is not None and session._ortfuse_counting is self and not self._tuning.recording
                    and not self._tuning.running and not self.retired and self.inflight == 0):
                session._ortfuse_counting = None
        del session

    def begin(self, feeds: Mapping | None = None) -> None:
        """A run starts (``feeds``: its inputs, recorded while recording)."""
        with self.lock:
            self.inflight += 1
            self.runs += 1
            if self.first_at is None:
                self.first_at = time.perf_counter()
            record = self._tuning.recording
            self.yielder.served_locked()
            if self.counts is not None:
                self.counts.served()
            if self.inflight == 1:
                self._began = time.perf_counter()
                if self._ended:
                    self._gaps.append(self._began - self._ended)
                if self.child is not None:
                    if self._continuer is not None and self._continuer.cancel():  # never continued
                        if self._gap_ran:
                            self._gap_ran = False
                    elif not self.held:
                        self._send("SIGSTOP")
        if record and feeds is not None:
            self._tuning.record(feeds)

    def end(self, release: bool = True) -> None:
        """A run ended; ``release``: this thread may release replaced C sessions (never an ORT thread)."""
        retired = None
        with self.lock:
            self.inflight -= 1
            if self.counts is not None:
                self.counts.ended()
            if self.inflight == 0:
                if getattr(self.idle, "_waiters", True):  # CPython's list of waiters: no call when empty
                    self.idle.notify_all()
                self._ended = time.perf_counter()
                if self.child is not None:
                    self._continue_locked(self._ended - self._began)
                if release and self.retired:
                    retired, self.retired = self.retired, []
        del retired  # the replaced C sessions go here, outside the lock
        if release and not self._tuning.running and not self._tuning.recording:
            self.detach_if_idle()

    def counted(self, feeds: Mapping | None, call, *args):
        """``call(*args)`` as a run in flight (``feeds`` recorded while recording). While the process
        rests, the run is only appended to a deque (one C call each way, safe from any thread) and
        counted down; the last run of the rest ends it (``_end_rest``). A rest that ended between the
        check and the append (``resume_if_idle``, which continues the process) sends the run the
        counted way, whose ``begin`` stops the process."""
        if self._rest_left > 0:
            flight = self._rest_flight
            flight.append(None)
            if self._rest_left > 0:  # still resting once in flight: the driver ends a rest only with none in flight
                try:
                    return call(*args)
                finally:
                    flight.pop()
                    self._rest_left -= 1  # a decrement lost to another thread lengthens the rest by a run
                    if self._rest_left <= 0:
                        self._end_rest()
            flight.pop()  # the rest ended meanwhile (the process may run): counted as any run
        self.begin(feeds)
        try:
            return call(*args)
        finally:
            self.end()

    def counted_async(self, feeds: Mapping | None, callback, start):
        """``start(finish)`` starts an async run whose completion calls ``finish``; the run is in
        flight until ``callback`` (the caller's) has returned."""
        self.begin(feeds)

        def finish(outputs, data, err):
            try:
                callback(outputs, data, err)
            finally:
                self.end(release=False)  # an ORT thread: it must not release a C session

        try:
            return start(finish)
        except BaseException:  # refused before it started: nothing in flight
            self.end()
            raise

    def wait_idle(self) -> None:
        """Return once no served run is in flight."""
        with self.lock:
            while self.inflight:
                self.idle.wait(0.05)

    def wait_gap_start(self) -> None:
        """Return as an idle gap begins: when a served run ends with none left in flight, or at once
        when none has been in flight for longer than the last ``GAPS`` gaps between served runs
        (``HOLD_S`` before any): the session is idle beyond its rhythm. The tuning starts there the C
        calls it cannot pause in (the new plan's session), so that a gap, not a served run, holds
        them (``python tools/auto_bench.py --models yolov8n_nudenet --spinning on``: the served runs
        while the plan's session is built). Returns at once once the tuning is stopped."""
        with self.lock:
            seen = self._ended
            while not self._stopped():
                if not self.inflight:
                    quiet = time.perf_counter() - self._ended
                    longest = max(self._gaps, default=HOLD_S)
                    if self._ended != seen or quiet > longest:
                        return
                    self.idle.wait(longest - quiet + 1e-4)
                else:
                    self.idle.wait(0.05)

    def _continue_locked(self, run_s: float) -> None:
        """No served run in flight: continue the tuning process, unless it rests (or a run of the rest
        is still in flight), or the run that just ended (``run_s`` seconds) was short and its burst is
        over, which starts a rest (``held``; ``resume_if_idle``)."""
        short = run_s < SHORT_RUN_S
        if short:
            self._short_gaps += 1
            self._short_s.append(run_s)
            if self._gap_ran is not None:  # the gap before this run
                (self._after_ran if self._gap_ran else self._after_held).append(run_s)
            if self._short_gaps % SIGNAL_SAMPLES == 0 and self.spread != SPREAD_COSTLY:
                self.spread = spread_for(self._signal_s, self._short_s, self._after_ran, self._after_held)
        if self._rest_left > 0 or self._rest_flight:
            self.held = True
        elif short and self._burst <= 0:
            self.held = True
            self._rest_left = self._rest_runs = (self.spread - 1) * BURST
            self._rest_seen = (self._rest_left, self._ended)
        else:
            self.held = False
            if short:
                self._burst -= 1
        self._gap_ran = not self.held if short else None
        if not self.held:
            if short and self._continuer is not None:  # after a long run the signal is a small share of it
                self._continuer.request()
            else:
                self._send("SIGCONT")

    def _end_rest(self, idle: bool = False) -> None:
        """The rest is over (its last run ended, or ``idle``: the tuning driver saw none end for
        ``HOLD_S`` and none in flight): served runs are counted again, a burst begins, and the
        session's idleness counts from now (``idle``: from ``HOLD_S`` ago, so ``resume_if_idle``
        continues the process at once)."""
        with self.lock:
            if self._rest_runs:
                self.runs += self._rest_runs - max(self._rest_left, 0)
                self._rest_left = self._rest_runs = 0
                self._burst = BURST
                if not self.inflight:
                    self._ended = time.perf_counter() - (HOLD_S if idle else 0.0)

    def _send(self, name: str) -> None:
        """Signal the tuning process from the serving path, timed (``spread_for``)."""
        start = time.perf_counter()
        _signal(self.child, name)
        self._signal_s.append(time.perf_counter() - start)

    def resume_if_idle(self) -> None:
        """Continue a held tuning process, or one whose continue the continuer has not sent (it runs
        only when a core is idle), once no served run has been in flight for ``HOLD_S`` (the tuning
        driver calls this while it waits for the process)."""
        with self.lock:
            if self._rest_left > 0:  # runs come uncounted: a rest ends idle when none ended for HOLD_S
                now = time.perf_counter()
                if self._rest_left != self._rest_seen[0]:
                    self._rest_seen = (self._rest_left, now)
                if self._rest_flight or now - self._rest_seen[1] < HOLD_S:
                    return
                self._end_rest(idle=True)
            continuer = self._continuer
            pending = continuer is not None and continuer.cancel()
            if (self.held or pending) and self.child is not None and not self.inflight and not self._rest_flight \
                    and time.perf_counter() - self._ended >= HOLD_S:
                self.held, self._gap_ran = False, None  # a long gap: not one the spread decided
                _signal(self.child, "SIGCONT")
            elif continuer is not None and pending:
                continuer.request()

    def hold(self, child) -> None:
        """``child`` (a ``subprocess.Popen`` of the tuning, or None once it has ended) is stopped
        while a served run is in flight: at once if one is."""
        with self.lock:
            if self._continuer is not None:
                self._continuer.close()
            self.child, self.held, self._gap_ran = child, False, None  # no gap of this process decided yet
            if self._rest_runs:
                self._end_rest()
            self._burst = BURST
            self._continuer = _Continuer(self.lock, child) if child is not None and self._defer_continue else None
            if child is not None and self.inflight:
                _signal(child, "SIGSTOP")

    # ------------------------------------------------------------------ the swap

    def swap(self, session, prepared, new, plan_file: str = "") -> int:
        """Swap the checked C session ``new`` of the plan ``prepared`` into ``session``; returns the
        served run it takes effect from. ``plan_file``: the plan's model file, removed when the
        session goes. ``Unfit`` when onnxruntime refuses it (the session is left as it was)."""
        source = prepared.source
        with self.lock:
            old = session._sess
            kept = dict(vars(session))
            try:  # ORT's private API: a failure leaves the session as it was, serving its plan
                session._bind_session(new)
            except Exception as exc:
                vars(session).update(kept)
                raise Unfit(f"onnxruntime {_ort_version()} did not take the new plan's session "
                            f"({one_sentence(exc)}); kept the current plan") from exc
            session._model_path, session._model_bytes = (source, None) if isinstance(source, str) else (None, source)
            session._sess_options_initial = prepared.sess_options
            session._ortfuse_disabled_optimizers = prepared.disabled_optimizers
            self.retired.append(old)
            session._ortfuse_swapped = True  # OrtValues made before now belong to another C session
            self.swapped_at = self.runs + 1
            prepared.report.notes.append(f"auto: swapped in from served run {self.swapped_at}")
            session.fusion_report = prepared.report
            if plan_file:  # the session's model path from now on (ORT re-reads it on set_providers)
                weakref.finalize(session, remove, plan_file)
            return self.swapped_at

    def release_when_idle(self, stopped: Callable[[], bool]) -> None:
        """Release replaced C sessions from this thread once no run is in flight (served runs' own
        ends release them too); waits at most ``RELEASE_WAIT_S``, or until ``stopped()``."""
        deadline = time.monotonic() + RELEASE_WAIT_S
        retired: list = []
        with self.lock:
            while self.retired and self.inflight and not stopped() and time.monotonic() < deadline:
                self.idle.wait(0.05)
            if not self.inflight:
                retired, self.retired = self.retired, []
        del retired


class _Continuer:
    """Continues a stopped tuning process from a thread of its own: ``request`` (the serving thread,
    under ``lock``) wakes the thread, which sends SIGCONT under ``lock`` once it gets the interpreter
    (as the serving thread waits for its next request) unless ``cancel`` (a run began: the process is
    still stopped and needs no stop signal) or ``close`` came first. The thread runs at the lowest
    CPU priority (SCHED_IDLE, where the platform has it): woken on a busy core it waits for the
    serving thread to let go of it rather than preempting it (the same command as above: the requests
    in whose path the continuer was woken); a request the thread has not carried out within
    ``HOLD_S`` of idleness is carried out by ``resume_if_idle``. Where the OS lets a thread's CPUs be
    set, the thread is kept on the CPU of the serving thread that made the last request (``request``
    reads it; an affinity call only when it changed): it then runs as that thread waits, on the core
    the thread leaves. Free to take the other core, it was woken there at once, woke that core from
    its sleep and left it to the process, and the requests after such gaps had several times as many
    slow ones as with SIGCONT from the serving path: late timer wake-ups and slow runs, none of it
    waiting for the interpreter (``python tools/continue_paths.py --models silero_vad_16k_op15``:
    the thread path's counted requests against the serving path's)."""

    def __init__(self, lock, process) -> None:
        self._lock, self._process = lock, process
        self._pending = self._closed = False
        self._tid = 0  # the thread's native id once it runs (0: not yet, or its CPU is not followed)
        self._cpu = -1  # the only CPU the thread may run on (-1: any)
        self._wake = threading.Lock()
        self._wake.acquire()  # released once per request; only the thread acquires it
        threading.Thread(target=self._loop, name="ortfuse-continue", daemon=True).start()

    def request(self) -> None:
        """Have the process continued (the caller holds ``lock``): a lock released, no system call
        when the thread is already awake."""
        self._pending = True
        if self._tid and _current_cpu is not None:
            self._follow(_current_cpu())
        if self._wake.locked():
            self._wake.release()

    def _follow(self, cpu: int) -> None:
        """Keep the thread on ``cpu`` (the caller's); where the OS refuses, give it every CPU the
        caller may use and stop following."""
        if cpu == self._cpu or cpu < 0:
            return
        try:
            os.sched_setaffinity(self._tid, {cpu})
            self._cpu = cpu
        except OSError:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self._tid, os.sched_getaffinity(0))
            self._tid, self._cpu = 0, -1

    def cancel(self) -> bool:
        """Withdraw a request not yet carried out (the caller holds ``lock``); whether there was one."""
        pending, self._pending = self._pending, False
        return pending

    def close(self) -> None:
        """End the thread (the caller holds ``lock``); a pending request is dropped."""
        self._pending, self._closed = False, True
        if self._wake.locked():
            self._wake.release()

    def _loop(self) -> None:
        child_process.lowest_priority()
        if _current_cpu is not None:
            self._tid = threading.get_native_id()
        while True:
            self._wake.acquire()
            with self._lock:
                if self._closed:
                    return
                if self._pending:
                    self._pending = False
                    _signal(self._process, "SIGCONT")


def spread_for(signal_s: Iterable[float], short_s: Iterable[float], after_ran: Iterable[float] = (),
               after_held: Iterable[float] = ()) -> int:
    """``SPREAD_COSTLY`` when the median signal sent from the serving path takes more than
    ``SIGNAL_SHARE`` of the median short served run, or the median short run after a gap the process
    ran in more than ``1 + RAN_GAP_SLOWDOWN`` times the median one after a gap it was held in (each
    side ``RAN_GAP_MIN`` samples or more); else ``SPREAD`` (also for a comparison with too few)."""
    signals, runs, ran, held = list(signal_s), list(short_s), list(after_ran), list(after_held)
    if signals and runs and statistics.median_high(signals) > SIGNAL_SHARE * statistics.median_high(runs):
        return SPREAD_COSTLY
    if min(len(ran), len(held)) >= RAN_GAP_MIN \
            and statistics.median_high(ran) > (1 + RAN_GAP_SLOWDOWN) * statistics.median_high(held):
        return SPREAD_COSTLY
    return SPREAD


def bound_elsewhere(session, iobinding):
    """The C session an IOBinding made by ``session`` before a swap is bound to, else None."""
    bound, current = getattr(iobinding, "_session", None), session._sess
    if bound is not None and bound is not current and getattr(iobinding, "_ortfuse_owner", None) is session:
        return bound
    return None


def accept_ortvalues(session, values: Iterable[Any]) -> list:
    """The values ORT's ownership check should see: OrtValues made by ``session`` before a swap
    (tagged by ``create_ortvalue_from_shape_and_type``) are CPU memory any of its C sessions can read."""
    return [v for v in values if not isinstance(v, OrtValue) or getattr(v, "_ortfuse_owner", None) is not session]


def swap_unsupported(session) -> str:
    """Why this onnxruntime cannot take a plan swapped into a live session ("" when it can): the swap
    uses ORT's private ``InferenceSession._bind_session``, ``_pybind_state.InferenceSession`` and
    ``check_and_normalize_provider_args``, which an onnxruntime the package accepts may lack."""
    try:
        from onnxruntime.capi import _pybind_state as C
        from onnxruntime.capi.onnxruntime_inference_collection import check_and_normalize_provider_args  # noqa: F401
    except ImportError as exc:
        return f"onnxruntime {_ort_version()} lacks what a live swap needs ({exc}); a new session uses the plan"
    missing = [name for name, found in (("InferenceSession._bind_session", getattr(type(session), "_bind_session",
                                                                                     None)),
                                        ("_pybind_state.InferenceSession", getattr(C, "InferenceSession", None)))
               if not callable(found)]
    if missing:
        return (f"onnxruntime {_ort_version()} has no {', '.join(missing)}, which a live swap needs; a new session "
                "uses the tuned plan")
    return ""


def _ort_version() -> str:
    import onnxruntime

    return getattr(onnxruntime, "__version__", "?")


def remove(path: str) -> None:
    """Remove the file ``path`` if it is there."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _cpu_reader() -> Callable[[], int] | None:
    """libc's ``sched_getcpu`` (the calling thread's CPU, read without a system call where the
    platform has a vDSO or RDPID for it), or None where it or ``os.sched_setaffinity`` is missing.
    Called through ``PyDLL``, which keeps the interpreter: a ``CDLL`` call lets it go and takes it
    back, and another thread waiting for it would run then, in the middle of a request's path."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        import ctypes

        getcpu = ctypes.PyDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    getcpu.restype, getcpu.argtypes = ctypes.c_int, []
    return getcpu if getcpu() >= 0 else None


_current_cpu = _cpu_reader()


def _signal(process, name: str) -> None:
    """Send signal ``name`` to ``process`` (a ``subprocess.Popen``) unless it has been reaped: ``os.kill``
    without ``Popen.send_signal``'s ``waitpid`` first (two per served run; a process that ended and
    was not reaped keeps its pid, and only the tuning driver reaps it). On a request's path, so the
    system call and a lookup only: no import or context manager, whose cold Python shows in the
    signal's time (``python tools/served_path.py``: the signals' durations)."""
    try:
        if process.returncode is None:
            os.kill(process.pid, _SIGNALS[name])
    except (OSError, AttributeError, KeyError):  # reaped meanwhile, or a platform without the signal
        pass


_SIGNALS = {name: getattr(signal, name) for name in ("SIGSTOP", "SIGCONT") if hasattr(signal, name)}
