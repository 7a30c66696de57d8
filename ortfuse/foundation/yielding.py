"""ORT runs and timings of a tuning that yield to served runs (docs/ARCHITECTURE.md §7).

A live tuning (``ortfuse.runtime.live_tuning``) installs a ``Yielder`` in the threads that measure;
the tuner's ORT runs go through ``run`` and its timings through ``measure``. With no yielder
installed (``ortfuse tune``, ``sync`` mode) they are plain runs and ``protocol.measure``.

Contract, with a yielder installed:
- a tuning run starts only while no served run is in flight, and a served run that starts while a
  tuning run is in flight aborts it (``RunOptions.terminate``, which ORT checks before every node):
  the served run gets the cores back within one node of the tuning model;
- an aborted untimed run (a warm-up, a reference or capture run) is run again once the session is
  idle; a timing that overlapped the start of a served run (aborted or not) is discarded and taken
  again in the same slot of the interleaved order, so every timing ``measure`` returns ran while no
  served run did (``Yielder.discarded`` counts those thrown away);
- a tuning that stops (``stopped()``) has its runs in flight aborted (``abort_locked``), and an
  aborted run is then raised, not run again;
- when one run or timing is disturbed ``MAX_ATTEMPTS`` times in a row (served runs leave no idle
  window as long as the run), ``Starved`` is raised: the tuning ends and says so rather than
  measuring next to served runs. ``Starved`` is a BaseException: no ``except Exception`` on the
  way turns it into a decision;
- ``fast_switching(True)`` lowers the interpreter's GIL switch interval while a tuning runs in this
  process (a served run waiting for the GIL gets it sooner); ``fast_switching(False)`` restores it
  after the last.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping

from ortfuse.foundation import protocol

MAX_ATTEMPTS = 200  # disturbed attempts in a row at one run or timing before the tuning gives up
SWITCH_INTERVAL_S = 0.0005  # sys.setswitchinterval while a tuning runs: a served run waits less for the GIL

_local = threading.local()


class Starved(BaseException):
    """Served runs left no idle window long enough for one tuning run."""


class _Disturbed(Exception):
    """A run inside a timing was aborted by a served run (caught by ``Yielder.timed``)."""


class Yielder:
    """Served-run arrivals of one session, for the tuning that measures beside it.

    ``cond``: the condition whose lock the serving side holds when it counts a run in and calls
    ``served_locked``, and which it notifies when no run is in flight; ``busy()``: whether a run is
    in flight (read under that lock); ``stopped()``: whether the tuning must stop (then waiting ends
    and the caller's next check raises); ``paused(seconds)``: told how long each wait for idleness
    lasted."""

    def __init__(self, cond: threading.Condition, busy: Callable[[], bool], stopped: Callable[[], bool] = lambda: False,
                 paused: Callable[[float], None] = lambda s: None) -> None:
        self._cond, self._busy, self._stopped, self._paused = cond, busy, stopped, paused
        self.epoch = 0  # served runs started so far
        self.discarded = 0  # aborted runs and discarded timings
        self._active: list = []  # RunOptions of the tuning runs in flight

    # --------------------------------------------------------------- the serving side

    def served_locked(self) -> None:
        """A served run starts (the caller holds ``cond``'s lock): abort the tuning runs in flight."""
        self.epoch += 1
        if self._active:
            self.abort_locked()

    def abort_locked(self) -> None:
        """Abort the tuning runs in flight (the caller holds ``cond``'s lock): a served run starts,
        or the tuning is stopped."""
        for options in self._active:
            options.terminate = True

    # --------------------------------------------------------------- the tuning side

    def _enter(self, options) -> int:
        """Wait until no served run is in flight, then register ``options``; returns the epoch."""
        with self._cond:
            if self._busy():
                t0 = time.perf_counter()
                while self._busy() and not self._stopped():
                    self._cond.wait(0.05)
                self._paused(time.perf_counter() - t0)
            if options is not None:
                self._active.append(options)
            return self.epoch

    def _leave(self, options) -> None:
        with self._cond:
            self._active.remove(options)

    def run(self, call: Callable):
        """``call(run_options)`` as a tuning run (see the module docstring)."""
        import onnxruntime as ort

        timing = getattr(_local, "timing", False)
        for _ in range(MAX_ATTEMPTS):
            options = ort.RunOptions()
            epoch = self._enter(options)
            try:
                return call(options)
            except Exception:
                if (self.epoch == epoch and not options.terminate) or self._stopped():
                    raise  # a failure of its own, or the tuning is stopping
                self.discarded += 1
                if timing:
                    raise _Disturbed() from None
            finally:
                self._leave(options)
        raise Starved(f"served runs left no idle window for one tuning run in {MAX_ATTEMPTS} attempts")

    def timed(self, fn: Callable[[], object]) -> float:
        """Milliseconds of one ``fn()`` that no served run overlapped."""
        clock = time.perf_counter_ns
        for _ in range(MAX_ATTEMPTS):
            epoch = self._enter(None)
            _local.timing = True
            try:
                t0 = clock()
                fn()
                t1 = clock()
            except _Disturbed:
                continue
            finally:
                _local.timing = False
            if self.epoch == epoch:
                return (t1 - t0) / 1e6
            self.discarded += 1
        raise Starved(f"served runs left no idle window for one timed run in {MAX_ATTEMPTS} attempts")


class SharedCounts:
    """The serving side's counts shared with a tuning process: served runs started (the epoch) and
    runs in flight, two unsigned 64-bit integers in a file both processes map. The serving process
    writes them (``served``, ``ended``) under its own lock; the tuning process only reads."""

    SIZE = 16

    def __init__(self, path: str, create: bool = False) -> None:
        import mmap

        if create:
            with open(path, "wb") as fh:
                fh.write(bytes(self.SIZE))
        self.path = path
        with open(path, "r+b" if create else "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), self.SIZE, access=mmap.ACCESS_WRITE if create else mmap.ACCESS_READ)
        self._q = memoryview(self._map).cast("Q")  # each field one aligned 8-byte load or store

    def read(self) -> tuple[int, int]:
        """(epoch, runs in flight)."""
        q = self._q
        return q[0], q[1]

    def served(self) -> None:
        q = self._q
        q[0] += 1
        q[1] += 1

    def ended(self) -> None:
        q = self._q
        if q[1]:
            q[1] -= 1


class ProcessYielder:
    """The ``Yielder`` of a tuning in a process of its own (``ortfuse.runtime.tune_process``): the serving
    process stops it (SIGSTOP) while a served run is in flight, so nothing of it runs then; its
    runs wait while a run is in flight, and a timing is kept only when no served run started during
    it (the shared epoch did not change and none is in flight at its end); otherwise it is taken
    again, and disturbed timings in a row raise ``Starved`` once they are ``MAX_ATTEMPTS`` and
    have lasted ``patience_s`` seconds: the idle windows between small models' served runs are
    short, and a loaded machine misses a few hundred of them in a row within a fraction of a second
    (the serving process bounds the whole tuning's wall-clock time besides)."""

    POLL_S = 0.001

    def __init__(self, counts: SharedCounts, patience_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._counts = counts
        self._patience_s, self._clock = patience_s, clock
        self.discarded = 0

    def _idle_epoch(self) -> int:
        while True:
            epoch, inflight = self._counts.read()
            if not inflight:
                return epoch
            time.sleep(self.POLL_S)

    def run(self, call: Callable):
        self._idle_epoch()
        return call(None)

    def timed(self, fn: Callable[[], object]) -> float:
        clock = time.perf_counter_ns
        attempts, since = 0, self._clock()
        while attempts < MAX_ATTEMPTS or self._clock() - since < self._patience_s:
            epoch = self._idle_epoch()
            t0 = clock()
            fn()
            t1 = clock()
            if self._counts.read() == (epoch, 0):
                return (t1 - t0) / 1e6
            self.discarded += 1
            attempts += 1
        raise Starved(f"served runs left no idle window for one timed run in {attempts} attempts "
                      f"over {self._clock() - since:.1f} s")


def install(yielder: Yielder | ProcessYielder | None) -> None:
    """Make ``yielder`` (None: none) the one this thread's tuning runs and timings yield through."""
    _local.yielder = yielder


def current() -> Yielder | ProcessYielder | None:
    return getattr(_local, "yielder", None)


def run(call: Callable):
    """``call(run_options)``: with a yielder installed, a tuning run that yields to served runs;
    else ``call(None)``."""
    yielder = current()
    return call(None) if yielder is None else yielder.run(call)


def run_session(sess, feeds: Mapping):
    """All outputs of ``sess`` (an ORT session) on ``feeds``, as a tuning run (``run``)."""
    return run(lambda options: sess.run(None, feeds, options))


def timed(fn: Callable[[], object]) -> float:
    """Milliseconds of one ``fn()``; with a yielder installed, one that no served run overlapped."""
    yielder = current()
    if yielder is not None:
        return yielder.timed(fn)
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e6


def measure(runners: Mapping[str, Callable[[], object]], *, runs: int, repeats: int,
            warmup: int = 1) -> dict[str, list[list[float]]]:
    """``protocol.measure`` (same orders, same result: ms per repeat per configuration); with a
    yielder installed, every timing is one that no served run overlapped (``Yielder.timed``) and
    the warm-up passes are runs that yield."""
    yielder = current()
    return protocol.measure(runners, runs=runs, repeats=repeats, warmup=warmup,
                            time_run=yielder.timed if yielder is not None else None)


_switching = {"users": 0, "saved": 0.005}
_switching_lock = threading.Lock()


def fast_switching(on: bool) -> None:
    """Lower the GIL switch interval to ``SWITCH_INTERVAL_S`` while at least one tuning runs in this
    process (``on``); restore it after the last (``on`` False)."""
    with _switching_lock:
        if on:
            if _switching["users"] == 0:
                _switching["saved"] = sys.getswitchinterval()
                sys.setswitchinterval(min(SWITCH_INTERVAL_S, _switching["saved"]))
            _switching["users"] += 1
        else:
            _switching["users"] -= 1
            if _switching["users"] == 0:
                sys.setswitchinterval(_switching["saved"])
