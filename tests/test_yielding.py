"""Tuning runs and timings that yield to served runs (ortfuse.foundation.yielding, ortfuse.tune.kernel_compile,
their use by ortfuse.runtime.live_tuning): a served run aborts the tuning run in flight, which runs
again once the session is idle; a timing a served run overlapped is discarded and taken again; a
tuning that never finds an idle window ends and says so; the kernel-compiling child is stopped
while a run is in flight. Served runs are simulated by the serving side's calls
(``Yielder.served_locked`` under the condition's lock, the in-flight flag), as live tuning makes them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortfuse.foundation import protocol, yielding

WAIT_S = 60


class Serving:
    """The serving side of a session as live tuning keeps it: runs in flight under a condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.inflight = 0
        self.yielder = yielding.Yielder(self.cond, lambda: self.inflight > 0)

    def begin(self) -> None:
        with self.cond:
            self.inflight += 1
            self.yielder.served_locked()

    def end(self) -> None:
        with self.cond:
            self.inflight -= 1
            self.cond.notify_all()


def _long_model(n: int = 300, size: int = 192) -> onnx.ModelProto:
    """A chain of ``n`` MatMuls (hundreds of ms at ORT_DISABLE_ALL): ORT checks the terminate flag
    between them."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((size, size)) / size**0.5).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"t{i}", "w"], [f"t{i + 1}" if i < n - 1 else "y"])
             for i in range(n)]
    graph = helper.make_graph(nodes, "long", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _session(model: onnx.ModelProto):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_a_served_run_aborts_the_tuning_run_which_runs_again_when_idle():
    model = _long_model()
    sess = _session(model)
    x = {"x": np.random.default_rng(1).standard_normal((192, 192)).astype(np.float32)}
    want = sess.run(None, x)[0]
    serving = Serving()
    attempts: list[str] = []
    started = threading.Event()

    def call(options):
        attempts.append("start")
        started.set()
        try:
            out = sess.run(None, x, options)
        except Exception as exc:
            attempts.append(f"failed: {exc}")
            raise
        attempts.append("done")
        return out

    result: list = []
    tuning = threading.Thread(target=lambda: result.append(yielding.Yielder.run(serving.yielder, call)))
    tuning.start()
    assert started.wait(WAIT_S)
    time.sleep(0.01)
    serving.begin()  # a served run starts while the tuning run is in flight
    deadline = time.monotonic() + WAIT_S
    while len(attempts) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert attempts[1].startswith("failed") and "terminate" in attempts[1].lower(), attempts
    time.sleep(0.05)
    assert len(attempts) == 2, "the tuning run started again while a served run was in flight"
    serving.end()
    tuning.join(WAIT_S)
    assert attempts[2:] == ["start", "done"], attempts
    assert serving.yielder.discarded == 1
    np.testing.assert_allclose(result[0][0], want, rtol=1e-5, atol=1e-5)


def test_a_failure_of_the_run_itself_is_raised_not_retried():
    serving = Serving()
    calls = []

    def call(options):
        calls.append(options)
        raise ValueError("bad feed")

    with pytest.raises(ValueError, match="bad feed"):
        serving.yielder.run(call)
    assert len(calls) == 1 and serving.yielder.discarded == 0


def test_a_timing_a_served_run_overlapped_is_discarded_and_taken_again():
    serving = Serving()
    durations = iter([0.08, 0.002])

    def fn():
        took = next(durations)
        if took > 0.05:  # the first attempt: a served run starts and ends meanwhile
            serving.begin()
            time.sleep(took)
            serving.end()
        else:
            time.sleep(took)

    ms = serving.yielder.timed(fn)
    assert ms < 50, f"the disturbed timing ({ms:.1f} ms) was kept"
    assert serving.yielder.discarded == 1


def test_a_timed_run_aborted_by_a_served_run_is_discarded():
    serving = Serving()
    yielding.install(serving.yielder)
    attempts = []

    def call(options):
        attempts.append(options)
        if len(attempts) == 1:
            serving.begin()
            assert options.terminate, "the served run did not abort the tuning run in flight"
            serving.end()
            raise RuntimeError("Exiting due to terminate flag being set to true.")
        return "ok"

    try:
        ms = yielding.timed(lambda: yielding.run(call))
    finally:
        yielding.install(None)
    assert len(attempts) == 2 and ms >= 0
    assert serving.yielder.discarded == 1


def test_measure_with_a_yielder_keeps_the_protocol_order():
    serving = Serving()
    order: list[str] = []
    runners = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    yielding.install(serving.yielder)
    try:
        raw = yielding.measure(runners, runs=4, repeats=2, warmup=1)
    finally:
        yielding.install(None)
    assert {k: [len(r) for r in v] for k, v in raw.items()} == {k: [4, 4] for k in runners}
    one_repeat = protocol.interleave(list(runners), 1) + protocol.interleave(list(runners), 4)
    passes = one_repeat * 2
    assert order == [name for p in passes for name in p]


def test_a_tuning_that_never_finds_an_idle_window_is_starved(monkeypatch):
    monkeypatch.setattr(yielding, "MAX_ATTEMPTS", 5)
    serving = Serving()

    def disturbed():
        serving.begin()
        serving.end()

    with pytest.raises(yielding.Starved, match="5 attempts"):
        serving.yielder.timed(disturbed)
    assert serving.yielder.discarded == 5


def test_without_a_yielder_runs_are_plain():
    assert yielding.current() is None
    assert yielding.run(lambda options: options) is None
    raw = yielding.measure({"a": lambda: None}, runs=2, repeats=1)
    assert [len(r) for r in raw["a"]] == [2]


# ------------------------------------------------------------------ live tuning uses them


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads process states from /proc")
def test_the_compiling_child_is_stopped_while_a_run_is_in_flight(tmp_path, monkeypatch):
    import ortfuse

    from model_fixtures import ffn_matmul_add_relu

    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ORTFUSE_TUNE", raising=False)
    session = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion="auto")
    live = session._ortfuse_live
    served = live.served
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        served.begin()  # a run in flight when the child starts: stopped at once
        live._compiling(child)
        time.sleep(0.2)
        assert _state(child.pid) == "T"
        served.end()
        time.sleep(0.2)
        assert _state(child.pid) in "RS", _state(child.pid)
        served.begin()
        time.sleep(0.2)
        assert _state(child.pid) == "T"
        served.end()
        live._compiling(None)
        served.begin()  # the compile ended: no signal to the old child
        time.sleep(0.2)
        assert _state(child.pid) in "RS"
        served.end()
    finally:
        child.kill()
        child.wait()


def test_stopping_aborts_the_tuning_run_in_flight_and_does_not_run_it_again():
    model = _long_model()
    sess = _session(model)
    x = {"x": np.ones((192, 192), np.float32)}
    stop = threading.Event()
    cond = threading.Condition(threading.RLock())
    yielder = yielding.Yielder(cond, lambda: False, stop.is_set)
    attempts: list[str] = []
    started = threading.Event()

    def call(options):
        attempts.append("start")
        started.set()
        return sess.run(None, x, options)

    errors: list[BaseException] = []

    def tuning() -> None:
        try:
            yielder.run(call)
        except Exception as exc:  # the aborted run's error, raised because the tuning stops
            errors.append(exc)

    thread = threading.Thread(target=tuning)
    thread.start()
    assert started.wait(WAIT_S)
    time.sleep(0.01)
    stop.set()
    with cond:
        yielder.abort_locked()
    thread.join(WAIT_S)
    assert not thread.is_alive() and attempts == ["start"] and len(errors) == 1, (attempts, errors)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_the_tuning_children_run_at_idle_priority_from_their_first_instruction(monkeypatch):
    """A child that lowered its priority only after its imports took cores from served runs
    meanwhile: both children are started through ``idle_argv``."""
    import shutil

    from ortfuse.foundation import child_process
    from ortfuse.runtime import tune_process
    from ortfuse.tune import kernel_compile

    probe = [sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"]
    argv = child_process.idle_argv(probe)
    if shutil.which("chrt") is None:  # the child lowers itself once its imports are done
        assert argv == probe
    else:
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=WAIT_S).stdout
        assert int(out) == os.SCHED_IDLE
    started: list[list[str]] = []

    def refuse(args, **kwargs):
        started.append(list(args))
        raise OSError("refused")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    outcome = tune_process.tune(b"model bytes", None, "auto", None, {"x": np.ones(2, np.float32)}, 1.0, "counts")
    assert "did not start (refused)" in outcome.error
    import ortfuse

    from model_fixtures import ffn_matmul_add_relu

    monkeypatch.setattr(kernel_compile, "compile_here", lambda fused: None)
    fused = ortfuse.fuse(ffn_matmul_add_relu())[0]
    assert kernel_compile.needs_kernels(fused)
    assert "did not start (refused)" in kernel_compile.compile_kernels(fused)
    prefix = child_process.idle_argv([sys.executable])  # the scheduler wrapper first, then Python
    assert len(started) == 2
    for args, module in zip(started, ["ortfuse.runtime.tune_process", "ortfuse.tune.kernel_compile"]):
        assert args[:len(prefix)] == prefix and "-P" in args and module in args, args


def test_a_tuning_process_gives_up_only_after_its_patience(tmp_path, monkeypatch):
    """Disturbed timings in a row end a tuning process's measuring once they are ``MAX_ATTEMPTS``
    and have lasted ``patience_s`` (a stated clock: each reading 0.1 s later), not after
    ``MAX_ATTEMPTS`` alone."""
    monkeypatch.setattr(yielding, "MAX_ATTEMPTS", 3)
    counts = yielding.SharedCounts(str(tmp_path / "counts"), create=True)
    ticks = iter(range(10_000))
    reader = yielding.ProcessYielder(yielding.SharedCounts(counts.path), patience_s=1.0,
                                     clock=lambda: next(ticks) / 10)

    def disturbed():
        counts.served()
        counts.ended()

    with pytest.raises(yielding.Starved, match="no idle window for one timed run in 12 attempts over 1.1 s"):
        reader.timed(disturbed)
    assert reader.discarded == 12
    patient = iter([True] * 7 + [False])  # a clean window after 7 disturbed timings: measured, not starved

    def seven_disturbed():
        if next(patient):
            disturbed()

    assert reader.timed(seven_disturbed) >= 0 and reader.discarded == 19
