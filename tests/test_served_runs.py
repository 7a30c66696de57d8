"""``runtime.served_runs``: when the tuning process runs between served runs. After short served runs
it runs in ``BURST`` gaps in a row, then rests through ``(spread - 1) * BURST`` served runs that take
the resting path (most requests find their caches as stock ORT leaves them, and carry no counting),
after a long run it is continued at once, and a held or resting process is continued once the
session has been idle ``HOLD_S``. Signals are recorded, not sent (but in the tests that send them to a real process);
run durations are stated through the clock. The rules are tested with the continue signal sent from
the serving path (``defer_continue=False``); the thread that sends it in the session's own use has
tests of its own."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
import types

import pytest

from ortfuse.runtime import served_runs


class _Session:
    _ortfuse_counting = None


class _Tuning:
    recording = False
    running = True


def _served(monkeypatch, defer_continue: bool = False):
    signals: list[str] = []
    monkeypatch.setattr(served_runs, "_signal", lambda process, name: signals.append(name))
    clock = [100.0]
    monkeypatch.setattr(served_runs, "time", types.SimpleNamespace(perf_counter=lambda: clock[0],
                                                                   monotonic=time.monotonic))
    session = _Session()
    served = served_runs.ServedRuns(session, _Tuning(), lambda: False, lambda s: None, defer_continue)
    served.hold(object())
    return served, signals, clock, session


def _run(served, clock, seconds: float, gap: float = 0.003) -> None:
    """One served run of ``seconds`` through ``counted`` (the resting path while the process rests)."""

    def call():
        clock[0] += seconds

    served.counted(None, call)
    clock[0] += gap


def _next_rest(served, clock, seconds: float = served_runs.SHORT_RUN_S / 2, gap: float = 0.003) -> int:
    """Short served runs (through a rest under way) until a rest begins; its length in served runs."""
    while served._rest_left > 0:
        _run(served, clock, seconds)
    for _ in range(served_runs.BURST + 1):
        _run(served, clock, seconds, gap)
        if served._rest_left > 0:
            return served._rest_left
    raise AssertionError("no rest began after a burst")


def test_after_short_runs_the_process_runs_in_a_burst_then_rests(monkeypatch):
    served, signals, clock, _ = _served(monkeypatch)
    short, burst, spread = served_runs.SHORT_RUN_S / 2, served_runs.BURST, served_runs.SPREAD
    for _ in range(burst):
        _run(served, clock, short)
    assert signals == ["SIGSTOP", "SIGCONT"] * burst and not served.held  # every gap of the burst
    _run(served, clock, short)  # the burst is over: the process rests
    assert signals[-1] == "SIGSTOP" and served.held and served._rest_left == (spread - 1) * burst
    sent, runs = len(signals), served.runs
    for _ in range((spread - 1) * burst - 1):
        _run(served, clock, short)
    # the resting path: no signal, nothing counted in or out
    assert len(signals) == sent and served._rest_left == 1 and served.runs == runs and not served._rest_flight
    _run(served, clock, short)  # the last run of the rest ends it, its runs added to the count
    assert served._rest_left == 0 and served.runs == runs + (spread - 1) * burst and served.held
    _run(served, clock, short)  # counted again: held in the gap before it, a burst begins after it
    assert signals[sent:] == ["SIGCONT"] and not served.held


def test_costly_signals_spread_the_process_over_more_gaps(monkeypatch):
    """Where a signal from the serving path takes more than ``SIGNAL_SHARE`` of a short run (the
    stated clock: each signal advances it), after ``SIGNAL_SAMPLES`` short gaps the process runs in one
    burst of ``SPREAD_COSTLY`` bursts; cheap signals keep ``SPREAD`` (the stop signal counts in the run after a
    gap the process ran in: below ``RAN_GAP_SLOWDOWN`` of it too)."""
    short = served_runs.SHORT_RUN_S / 10
    for signal_s, spread in ((2 * served_runs.SIGNAL_SHARE * short, served_runs.SPREAD_COSTLY),
                             (served_runs.RAN_GAP_SLOWDOWN * short / 2, served_runs.SPREAD)):
        served, signals, clock, _ = _served(monkeypatch)

        def slow(process, name, signals=signals, clock=clock, signal_s=signal_s):
            signals.append(name)
            clock[0] += signal_s

        monkeypatch.setattr(served_runs, "_signal", slow)
        while served._short_gaps < served_runs.SIGNAL_SAMPLES:
            _run(served, clock, short)
        assert served.spread == spread
        assert _next_rest(served, clock, short) == (spread - 1) * served_runs.BURST


def test_runs_slowed_after_the_gaps_the_process_ran_in_spread_it_over_more_gaps(monkeypatch):
    """Where the short runs after gaps the process ran in take more than ``1 + RAN_GAP_SLOWDOWN`` times
    those after gaps it was held in (its work evicted the serving thread's caches), once each side
    has ``RAN_GAP_MIN`` samples (a held gap before the first counted run after each rest) the process
    runs in one burst of ``SPREAD_COSTLY``; runs as fast after either keep ``SPREAD``. The first run
    after a long one counts on neither side, nor do the runs of a rest."""
    short = served_runs.SHORT_RUN_S / 10
    for slowdown, spread in ((1 + 2 * served_runs.RAN_GAP_SLOWDOWN, served_runs.SPREAD_COSTLY),
                            (1 - served_runs.RAN_GAP_SLOWDOWN, served_runs.SPREAD)):
        served, signals, clock, _ = _served(monkeypatch)
        _run(served, clock, 2 * served_runs.SHORT_RUN_S)  # a long run: the process runs in the gap after it
        ran = []
        while len(served._after_held) < served_runs.RAN_GAP_MIN or served._short_gaps % served_runs.SIGNAL_SAMPLES:
            ran.append(served._gap_ran)
            _run(served, clock, short * slowdown if served._gap_ran else short)
        assert served.spread == spread
        assert ran[0] is None and True in ran and False in ran
        assert served._after_held and served._after_ran
        assert list(served._after_held) == pytest.approx([short] * len(served._after_held))
        assert list(served._after_ran) == pytest.approx([short * slowdown] * len(served._after_ran))


def test_the_costly_spread_stays_once_chosen(monkeypatch):
    """Runs slowed after the process's gaps choose ``SPREAD_COSTLY``; later runs as fast after either
    gap do not bring ``SPREAD`` back (a rule at its line would alternate them)."""
    served, signals, clock, _ = _served(monkeypatch)
    short = served_runs.SHORT_RUN_S / 10
    while served.spread != served_runs.SPREAD_COSTLY and served._short_gaps < 20 * served_runs.SIGNAL_SAMPLES:
        _run(served, clock, short * (1 + 2 * served_runs.RAN_GAP_SLOWDOWN) if served._gap_ran else short)
    assert served.spread == served_runs.SPREAD_COSTLY
    while len(served._after_ran) < served_runs.RAN_GAP_SAMPLES or any(run > 1.001 * short for run in served._after_ran):
        _run(served, clock, short)  # every sample of the slowed side replaced
    assert served_runs.spread_for(served._signal_s, served._short_s, served._after_ran,
                                  served._after_held) == served_runs.SPREAD
    assert served.spread == served_runs.SPREAD_COSTLY
    assert _next_rest(served, clock, short) == (served_runs.SPREAD_COSTLY - 1) * served_runs.BURST


def test_a_gap_resumed_as_idle_counts_on_neither_side(monkeypatch):
    served, signals, clock, _ = _served(monkeypatch)
    _next_rest(served, clock, gap=0.0)
    assert served.held and served._gap_ran is False
    clock[0] += served_runs.HOLD_S
    served.resume_if_idle()
    assert not served.held and served._gap_ran is None and served._rest_left == 0
    ran, held = len(served._after_ran), len(served._after_held)
    _run(served, clock, served_runs.SHORT_RUN_S / 2)
    assert (len(served._after_ran), len(served._after_held)) == (ran, held)


def test_the_spread_rule_compares_medians():
    assert served_runs.spread_for([], [0.001]) == served_runs.SPREAD  # nothing measured yet
    share = served_runs.SIGNAL_SHARE
    assert served_runs.spread_for([0.9 * share * 1e-3] * 5, [1e-3] * 5) == served_runs.SPREAD
    assert served_runs.spread_for([1.1 * share * 1e-3] * 5, [1e-3] * 5) == served_runs.SPREAD_COSTLY
    # one slow signal among cheap ones does not change it
    assert served_runs.spread_for([0.5 * share * 1e-3] * 4 + [1.0], [1e-3] * 5) == served_runs.SPREAD
    # the runs after gaps the process ran in against those after gaps it was held in
    slowdown = served_runs.RAN_GAP_SLOWDOWN
    assert served_runs.spread_for([], [], [1e-3 * (1 + 2 * slowdown)] * 5, [1e-3] * 5) == served_runs.SPREAD_COSTLY
    assert served_runs.spread_for([], [], [1e-3 * (1 + slowdown / 2)] * 5, [1e-3] * 5) == served_runs.SPREAD
    assert served_runs.spread_for([], [], [1.0] * 5, []) == served_runs.SPREAD  # no held gap measured yet
    too_few = served_runs.RAN_GAP_MIN - 1
    assert served_runs.spread_for([], [], [1.0] * 5, [1e-3] * too_few) == served_runs.SPREAD


def test_after_a_long_run_the_process_runs_at_once(monkeypatch):
    served, signals, clock, _ = _served(monkeypatch)
    for _ in range(4):
        _run(served, clock, 2 * served_runs.SHORT_RUN_S)
    assert signals == ["SIGSTOP", "SIGCONT"] * 4 and not served.held


def test_a_resting_process_is_continued_once_the_session_is_idle(monkeypatch):
    served, signals, clock, _ = _served(monkeypatch)
    _next_rest(served, clock, gap=0.0)
    assert served.held and signals[-1] == "SIGSTOP"
    sent = len(signals)
    served.resume_if_idle()
    assert served.held and served._rest_left  # idle for less than HOLD_S
    clock[0] += served_runs.HOLD_S
    served.resume_if_idle()
    assert not served.held and signals[sent:] == ["SIGCONT"] and served._rest_left == 0
    served.begin()  # a run in flight: a held process is never continued
    assert signals[-1] == "SIGSTOP"
    served.held = True
    clock[0] += 1.0
    served.resume_if_idle()
    assert served.held and signals[-1] == "SIGSTOP"
    served.end(release=False)


def test_a_rest_ends_as_idle_only_when_no_run_ended_for_hold_s_and_none_is_in_flight(monkeypatch):
    """Runs of a rest come uncounted: the tuning driver reads the countdown, and a rest ends as idle
    only when it has not moved for ``HOLD_S`` and no run of the rest is in flight (another thread's)."""
    served, signals, clock, _ = _served(monkeypatch)
    _next_rest(served, clock)
    sent = len(signals)
    clock[0] += served_runs.HOLD_S / 2
    _run(served, clock, served_runs.SHORT_RUN_S / 2, gap=0.0)  # a run of the rest
    clock[0] += served_runs.HOLD_S * 0.75
    served.resume_if_idle()  # the countdown moved since its last look: not idle yet
    assert served._rest_left and len(signals) == sent
    served._rest_flight.append(None)  # a run of the rest in flight on another thread
    clock[0] += 1.0
    served.resume_if_idle()
    assert served._rest_left and len(signals) == sent
    served._rest_flight.pop()
    served.resume_if_idle()
    assert not served._rest_left and signals[sent:] == ["SIGCONT"]


def test_a_run_of_the_rest_in_flight_keeps_the_process_held_after_the_rest(monkeypatch):
    """The rest ends with its last run while another thread's run of it is still going: the counted runs
    after it leave the process held until that run has ended too."""
    served, signals, clock, _ = _served(monkeypatch)
    rest = _next_rest(served, clock)
    served._rest_flight.append(None)
    for _ in range(rest + 2):
        _run(served, clock, served_runs.SHORT_RUN_S / 2)
    assert served._rest_left <= 0 and served.held and signals[-1] == "SIGSTOP"
    served._rest_flight.pop()
    _run(served, clock, served_runs.SHORT_RUN_S / 2)
    assert not served.held and signals[-1] == "SIGCONT"


def test_a_run_that_finds_the_rest_ended_as_it_enters_is_counted_and_stops_the_process(monkeypatch):
    """The tuning driver ends an idle rest and continues the process between a run's check of the rest
    and its append to the rest's runs in flight: the run goes the counted way, whose begin stops the
    process, rather than running beside it uncounted."""
    served, signals, clock, _ = _served(monkeypatch)
    _next_rest(served, clock)

    class Racing(collections.deque):
        def append(self, item):
            clock[0] += served_runs.HOLD_S  # idle long enough: the driver ends the rest and continues
            served.resume_if_idle()
            super().append(item)

    served._rest_flight = Racing()
    runs = served.runs
    _run(served, clock, served_runs.SHORT_RUN_S / 2)
    assert signals[-3:-1] == ["SIGCONT", "SIGSTOP"]  # continued by the driver, stopped by the run's begin
    assert served.runs == runs + 1 and not served._rest_flight and served._rest_left == 0


def test_a_new_process_starts_not_held(monkeypatch):
    served, signals, clock, _ = _served(monkeypatch)
    _next_rest(served, clock)
    assert served.held and served._rest_left
    served.hold(None)
    assert not served.held and served._rest_left == 0
    served.hold(object())
    thread = threading.Thread(target=lambda: _run(served, clock, 2 * served_runs.SHORT_RUN_S))
    thread.start()
    thread.join()
    assert signals[-2:] == ["SIGSTOP", "SIGCONT"]


def _waiter(served) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()
    thread = threading.Thread(target=lambda: (served.wait_gap_start(), done.set()), daemon=True)
    thread.start()
    return thread, done


def test_the_build_waits_for_a_gap_to_begin(monkeypatch):
    """``wait_gap_start``: inside a gap no longer than the session's recent gaps (the stated clock
    stands still) it waits for the next served run to end, and returns as that run ends; a session
    idle for longer than its recent gaps needs no wait."""
    served, _, clock, _ = _served(monkeypatch)
    for _ in range(3):
        _run(served, clock, 0.01, gap=0.02)  # served runs 20 ms apart
    clock[0] -= 0.015  # 5 ms into the last gap
    _, done = _waiter(served)
    assert not done.wait(0.2)  # a gap it did not see begin: it waits for the next one
    served.begin()
    assert not done.wait(0.1)  # a run in flight: still waiting
    clock[0] += 0.01
    served.end(release=False)
    assert done.wait(5.0)  # the next gap begins
    clock[0] += 0.019
    _, done = _waiter(served)
    assert not done.wait(0.2)  # 19 ms idle: within the rhythm
    clock[0] += 0.002
    assert done.wait(5.0)  # 21 ms: longer than any recent gap, the session is idle


def test_a_stopped_tuning_does_not_wait_for_a_gap(monkeypatch):
    """Runs in flight without end (a server saturated by several threads): the wait ends once the
    tuning is stopped."""
    stop = threading.Event()
    session = _Session()
    served = served_runs.ServedRuns(session, _Tuning(), stop.is_set, lambda s: None)
    served.begin()
    _, done = _waiter(served)
    assert not done.wait(0.2)
    stop.set()
    assert done.wait(5.0)
    served.end(release=False)


def _wait_status(child, flag: int, seen) -> bool:
    """Whether ``child`` reports the stop (``os.WUNTRACED``) or continue (``os.WCONTINUED``) that
    ``seen(status)`` recognises within 10 s (``waitpid`` without hanging: the signal's effect is
    asynchronous)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pid, status = os.waitpid(child.pid, flag | os.WNOHANG)
        if pid and seen(status):
            return True
        time.sleep(0.01)
    return False


def test_signals_stop_and_continue_a_live_process_and_skip_a_reaped_one(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        served_runs._signal(child, "SIGSTOP")
        assert _wait_status(child, os.WUNTRACED, os.WIFSTOPPED)
        served_runs._signal(child, "SIGCONT")
        assert _wait_status(child, os.WCONTINUED, os.WIFCONTINUED)
        served_runs._signal(child, "NOSUCHSIGNAL")  # a platform without the signal: nothing sent, no error
    finally:
        child.kill()
        child.wait()
    sent: list = []
    monkeypatch.setattr(served_runs.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    served_runs._signal(child, "SIGSTOP")  # reaped: its pid may be another process's now, nothing is sent
    served_runs._signal(None, "SIGSTOP")  # no process: nothing
    assert sent == []


def _until(check, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _to_a_running_gap(served, clock) -> None:
    """A short served run of a burst, after which the process runs."""
    _run(served, clock, served_runs.SHORT_RUN_S / 2)
    assert served._gap_ran is True


def test_after_a_short_run_the_continue_comes_from_a_thread_of_its_own(monkeypatch):
    """With ``defer_continue`` (the session's use) the serving thread sends the stop signal, and the
    continue after a long run; the continue after a short one comes from the continuer's thread."""
    served, signals, clock, _ = _served(monkeypatch, defer_continue=True)
    threads: list[str] = []
    monkeypatch.setattr(served_runs, "_signal",
                        lambda process, name: (signals.append(name), threads.append(threading.current_thread().name)))
    serving = threading.current_thread().name
    for _ in range(2):
        _to_a_running_gap(served, clock)
        assert _until(lambda: signals[-1] == "SIGCONT")
    _run(served, clock, 2 * served_runs.SHORT_RUN_S)
    assert signals == ["SIGSTOP", "SIGCONT"] * 3
    assert threads == [serving, "ortfuse-continue"] * 2 + [serving, serving]


def test_a_run_before_the_continue_finds_the_process_stopped(monkeypatch):
    """A run that begins before the continuer has sent its signal withdraws it: no signal either way,
    and the gap counts as one the process was held in."""
    served, signals, clock, _ = _served(monkeypatch, defer_continue=True)
    with served.lock:  # the continuer cannot act while the serving side holds the lock
        _to_a_running_gap(served, clock)
        assert signals == ["SIGSTOP"] and served._gap_ran is True  # a continue asked for, not sent
        served.begin()
        assert signals == ["SIGSTOP"] and served._gap_ran is False
        clock[0] += served_runs.SHORT_RUN_S / 2
        served.end(release=False)  # a gap of the burst: a continue asked for again
        served.begin()  # and withdrawn
        served.end(release=False)
        served.hold(None)  # the thread ends; nothing pending is sent
    time.sleep(0.05)
    assert signals == ["SIGSTOP"]


def test_a_replaced_process_is_never_continued_by_the_old_thread(monkeypatch):
    served, signals, clock, _ = _served(monkeypatch, defer_continue=True)
    sent_to: list = []
    monkeypatch.setattr(served_runs, "_signal", lambda process, name: sent_to.append((process, name)))
    first = served.child
    with served.lock:
        _to_a_running_gap(served, clock)  # a continue asked for
        second = object()
        served.hold(second)
    _to_a_running_gap(served, clock)
    assert _until(lambda: (second, "SIGCONT") in sent_to)
    time.sleep(0.05)
    assert (first, "SIGCONT") not in sent_to


def test_the_continuer_continues_a_live_process(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        served = served_runs.ServedRuns(_Session(), _Tuning(), lambda: False, lambda s: None)
        served.hold(child)
        served.begin()
        assert _wait_status(child, os.WUNTRACED, os.WIFSTOPPED)
        served.end(release=False)  # a short run of the burst: the continuer continues it
        assert _wait_status(child, os.WCONTINUED, os.WIFCONTINUED)
        served.hold(None)
    finally:
        child.kill()
        child.wait()


def test_a_continue_the_thread_has_not_sent_is_sent_once_the_session_is_idle(monkeypatch):
    """The continuer runs only when a core is idle: on a busy machine the tuning driver's
    ``resume_if_idle`` sends the continue itself after ``HOLD_S`` of idleness, and not before."""
    served, signals, clock, _ = _served(monkeypatch, defer_continue=True)
    with served.lock:  # the continuer cannot act
        _to_a_running_gap(served, clock)  # a continue asked for
        clock[0] -= 0.003  # the gap has just begun
        served.resume_if_idle()
        assert signals == ["SIGSTOP"]  # idle for less than HOLD_S: still the continuer's to send
        clock[0] += served_runs.HOLD_S
        served.resume_if_idle()
        assert signals == ["SIGSTOP", "SIGCONT"]
    time.sleep(0.05)
    assert signals == ["SIGSTOP", "SIGCONT"]  # sent once


_follows_cpus = pytest.mark.skipif(
    served_runs._current_cpu is None,
    reason="this platform has no sched_getcpu or sched_setaffinity: the continuer's CPU is not followed")


@_follows_cpus
def test_the_continuer_is_kept_on_the_cpu_of_the_serving_thread_that_asks_for_a_continue(monkeypatch):
    """Each request from a serving thread on another CPU moves the continuer's thread there; its
    affinity is read back from the OS. The CPU is read without letting go of the interpreter (a
    ``PyDLL`` function), which would let another thread run in the middle of the request's path."""
    import ctypes

    assert served_runs._current_cpu._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    served, signals, clock, _ = _served(monkeypatch, defer_continue=True)
    continuer = served._continuer
    assert _until(lambda: continuer._tid != 0)
    allowed = sorted(os.sched_getaffinity(0))
    try:
        for cpu in allowed[:2] + allowed[:1]:
            os.sched_setaffinity(0, {cpu})  # the serving thread (this one) on ``cpu``
            _to_a_running_gap(served, clock)
            assert os.sched_getaffinity(continuer._tid) == {cpu} and continuer._cpu == cpu
            assert _until(lambda: signals[-1] == "SIGCONT")
    finally:
        os.sched_setaffinity(0, allowed)
        served.hold(None)


@_follows_cpus
def test_a_continuer_the_os_refuses_to_move_gets_every_cpu_and_is_left_there(monkeypatch):
    served, signals, clock, _ = _served(monkeypatch, defer_continue=True)
    continuer = served._continuer
    assert _until(lambda: continuer._tid != 0)
    tid, allowed, setaffinity = continuer._tid, os.sched_getaffinity(0), os.sched_setaffinity
    asked: list = []

    def refusing(pid, cpus):
        asked.append(set(cpus))
        if len(cpus) == 1:
            raise OSError(22, "Invalid argument")
        setaffinity(pid, cpus)

    monkeypatch.setattr(os, "sched_setaffinity", refusing)
    _to_a_running_gap(served, clock)
    assert len(asked) == 2 and len(asked[0]) == 1 and asked[1] == allowed  # one CPU asked for, then every CPU
    assert os.sched_getaffinity(tid) == allowed
    assert continuer._tid == 0 and continuer._cpu == -1
    assert _until(lambda: signals[-1] == "SIGCONT")  # the continue is still sent
    _to_a_running_gap(served, clock)
    assert len(asked) == 2  # not asked again
    served.hold(None)


def test_a_thread_lowered_to_the_lowest_priority_runs_there():
    """``child_process.lowest_priority`` (the continuer's thread calls it first) lowers the calling
    thread only: Linux's SCHED_IDLE, else nice 19."""
    from ortfuse.foundation import child_process

    seen: dict = {}

    def lowered():
        seen["policy"] = child_process.lowest_priority()
        seen["scheduler"] = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
    thread = threading.Thread(target=lowered)
    thread.start()
    thread.join()
    assert seen["policy"] in ("idle", "nice")
    if seen["policy"] == "idle":
        assert seen["scheduler"] == os.SCHED_IDLE
    else:
        assert seen["nice"] == 19
    assert (os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None) == before
