"""``fusion="auto"`` tuned on live traffic (ortfuse.runtime.live_tuning): the session serves stock ORT
at once, records the first served feeds, tunes on them in a background thread and swaps to the
fused plan; runs of every kind, before, during and after the swap, compute what stock ORT computes.

The verdicts do not depend on this machine's timing: the ``winning`` fixture replaces the tuner's
clock (``measure._best_of``, ``measure._time_pair``) with fixed times where every fusion wins, so the
tuning path (cut, capture, outputs check, whole-model check, plan, swap) runs as in production and
only the times are stated. Outputs are compared with stock ORT at ORT_DISABLE_ALL within
``TOL`` (the FFN's GEMMs fused: float32 sums in another order).
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse.foundation.session_options import TUNE_BUDGET_KEY, TUNE_KEY
from ortfuse.runtime import live_tuning
from ortfuse.tune import measure as measuring
from ortfuse.tune import tuner
from ortfuse.tune.decisions import Tuning

from model_fixtures import ffn_inputs, ffn_matmul_add_relu
from timing_fixtures import raw_timing

TOL = dict(rtol=1e-4, atol=1e-4)
WAIT_S = 120  # generous: the machine is shared; a healthy tuning here takes a few seconds


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(tuner.ENV, raising=False)


@pytest.fixture(autouse=True)
def tuning_in_thread(monkeypatch):
    """The live tuning measures in its own thread, where the stated timings below replace the clock
    (a tuning process would not see them; tests/test_tune_process.py runs that path)."""
    monkeypatch.setattr(live_tuning, "IN_CHILD", False)


@pytest.fixture
def winning(monkeypatch):
    """Every fusion measured twice as fast as ORT, in every repeat, whole model included."""
    monkeypatch.setattr(measuring, "_best_of", lambda f, o, n: (0.5, 1.0))
    monkeypatch.setattr(measuring, "_time_pair", lambda f, o, budget: (0.5, 1.0, [0.5] * measuring.REPEATS))
    monkeypatch.setattr(measuring, "_time_with_control", lambda f, o, c, budget: raw_timing(0.5, 1.0))


def _stock(model: onnx.ModelProto):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _feeds(n: int = live_tuning.SAMPLE_RUNS, seq: int = 7) -> list[dict]:
    return [ffn_inputs(batch=2, seq=seq, seed=i) for i in range(n)]


def _check(session, stock, feeds: dict) -> None:
    for got, want in zip(session.run(None, feeds), stock.run(None, feeds)):
        np.testing.assert_allclose(got, want, **TOL)


def _fused(session) -> list[str]:
    return sorted(m.pattern_id for m in session.fusion_report.fused)


# ----------------------------------------------------------------------------------- background


def test_background_serves_stock_then_swaps_to_the_fused_plan(winning):
    model = ffn_matmul_add_relu()
    stock = _stock(model)
    session = ortfuse.InferenceSession(model, fusion="auto")
    assert not session.fusion_report.applied and session._model_bytes == model.SerializeToString()
    assert session.fusion_status == f"serving stock ORT, recording feeds (0/{live_tuning.SAMPLE_RUNS})"
    assert not session.wait_tuned(0) and session.time_to_plan is None  # not before the tuning ended
    first = session._sess
    served_from = time.perf_counter()
    for feeds in _feeds():  # the recorded runs, served by stock ORT
        _check(session, stock, feeds)
    during = 0
    while not session.wait_tuned(0.01) and during < 10_000:  # served while tuning
        _check(session, stock, ffn_inputs(seed=during))
        during += 1
    assert session.wait_tuned(WAIT_S), session.fusion_status
    assert session._sess is not first
    assert _fused(session) == ["add_relu", "gemm_act"], session.fusion_report.table()
    assert session.fusion_status.startswith("fused since run ") and "2 of 2 matches kept" in session.fusion_status
    assert any("tuned on 8 served feeds" in n for n in session.fusion_report.notes)
    events = [event for event, _ in session._ortfuse_live.timeline if not event.startswith("child ")]
    assert events == ["tuning started", "plan prepared", "plan's session built", "plan's outputs checked", "swapped"]
    times = [t for _, t in session._ortfuse_live.timeline]
    assert times == sorted(times)
    # time to the plan: the runs served before the swap took effect, and the seconds since the first of them
    reached = session.time_to_plan
    swapped_at = int(session.fusion_status.split()[3].rstrip(":"))
    assert reached["plan"] == "fused" and reached["served_runs"] == swapped_at - 1 >= live_tuning.SAMPLE_RUNS
    assert 0 < reached["seconds"] <= time.perf_counter() - served_from + 5e-4  # seconds are rounded to 1 ms
    assert any(n.startswith(f"auto: final plan (fused) in effect after {swapped_at - 1} served runs")
               for n in session.fusion_report.notes)
    reached["plan"] = "changed by the caller"
    assert session.time_to_plan["plan"] == "fused"  # a copy
    assert ortfuse.InferenceSession(model, fusion=True).time_to_plan is None  # no live tuning
    for seed in range(3):  # after the swap, other shapes too
        _check(session, stock, ffn_inputs(batch=1 + seed, seq=3 + seed, seed=seed))


@pytest.mark.parametrize("cached", [True, False], ids=["plan-cached", "plan-in-memory"])
def test_the_swap_opens_the_fused_plan_from_a_file(winning, monkeypatch, cached):
    """ORT parses a model handed over as bytes while holding the GIL (tools/swap_gil_probe.py): the
    swap's session is opened from a path, the plan cache's file or a temporary one, never bytes."""
    from onnxruntime.capi import _pybind_state as C

    from ortfuse.runtime import plan_cache

    if not cached:  # the plan cache keeps nothing: the plan stays bytes in memory
        monkeypatch.setattr(plan_cache, "store", lambda *a, **k: None)
    opened: list = []
    real = C.InferenceSession

    def spy(options, source, is_path, *rest):
        if sys._getframe(1).f_code.co_name == "_build":  # the swap's session, not the tuning's own
            opened.append((type(source), is_path))
        return real(options, source, is_path, *rest)

    monkeypatch.setattr(C, "InferenceSession", spy)
    model = ffn_matmul_add_relu()
    stock = _stock(model)
    session = ortfuse.InferenceSession(model, fusion="auto")
    for feeds in _feeds():
        _check(session, stock, feeds)
    assert session.wait_tuned(WAIT_S), session.fusion_status
    assert session.fusion_status.startswith("fused since run "), session.fusion_status
    assert opened == [(str, True)]
    _check(session, stock, ffn_inputs(batch=3, seq=5, seed=11))


def test_second_session_on_the_same_cache_starts_fused(winning):
    model = ffn_matmul_add_relu()
    first = ortfuse.InferenceSession(model, fusion="auto")
    for feeds in _feeds():
        first.run(None, feeds)
    assert first.wait_tuned(WAIT_S) and first.fusion_report.applied, first.fusion_status
    second = ortfuse.InferenceSession(model, fusion="auto")
    assert second.wait_tuned(0), "nothing left to tune"
    assert _fused(second) == _fused(first)
    assert any("plan read from ortfuse's cache" in n for n in second.fusion_report.notes)
    assert second.fusion_status.startswith("fused:")
    _check(second, _stock(model), ffn_inputs())


def test_concurrent_callers_across_the_swap(winning):
    model = ffn_matmul_add_relu()
    stock = _stock(model)
    session = ortfuse.InferenceSession(model, fusion="auto")
    feeds = [ffn_inputs(batch=1 + i % 2, seq=4 + i, seed=i) for i in range(4)]
    want = [stock.run(None, f) for f in feeds]
    errors: list[str] = []
    runs = [0] * len(feeds)

    def worker(i: int) -> None:
        after = 0
        try:
            while after < 20 and runs[i] < 50_000:  # until 20 runs after tuning ended
                got = session.run(None, feeds[i])
                runs[i] += 1
                for g, w in zip(got, want[i]):
                    if not np.allclose(g, w, **TOL):
                        errors.append(f"thread {i} run {runs[i]}: max diff {np.abs(g - w).max()}")
                after += session.wait_tuned(0)
                time.sleep(0.001)  # requests with gaps, as served traffic has: tuning measures in them
        except Exception as exc:  # recorded: the assertion below names it
            errors.append(f"thread {i}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 2)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert session.wait_tuned(0) and session.fusion_report.applied, session.fusion_status
    assert all(r >= 20 for r in runs)


def test_iobinding_made_before_the_swap_keeps_working(winning):
    model = ffn_matmul_add_relu()
    stock = _stock(model)
    session = ortfuse.InferenceSession(model, fusion="auto")
    x = ffn_inputs(seed=42)
    want = stock.run(None, x)[0]
    binding = session.io_binding()
    binding.bind_cpu_input("x", x["x"])
    binding.bind_output("z")
    session.run_with_iobinding(binding)
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], want, **TOL)
    for feeds in _feeds():
        session.run(None, feeds)
    assert session.wait_tuned(WAIT_S) and session.fusion_report.applied, session.fusion_status
    assert binding._session is not session._sess  # bound to the C session it was made on
    session.run_with_iobinding(binding)
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], want, **TOL)
    fresh = session.io_binding()  # made after the swap: the fused plan
    assert fresh._session is session._sess
    fresh.bind_cpu_input("x", x["x"])
    fresh.bind_output("z")
    session.run_with_iobinding(fresh)
    np.testing.assert_allclose(fresh.copy_outputs_to_cpu()[0], want, **TOL)


def test_ortvalues_and_run_async_across_the_swap(winning):
    model = ffn_matmul_add_relu()
    stock = _stock(model)
    session = ortfuse.InferenceSession(model, fusion="auto")
    x = ffn_inputs(seed=7)
    want = stock.run(None, x)[0]
    made_before = session.create_ortvalue_from_shape_and_type(list(x["x"].shape), np.float32, "cpu")
    made_before.update_inplace(x["x"])
    results: list[tuple[str, np.ndarray | None]] = []
    done = threading.Semaphore(0)
    lock = threading.Lock()

    def callback(outputs, user_data, err):
        with lock:
            results.append((err, outputs[-1] if not err else None))
        done.release()

    issued = 0
    for _ in range(live_tuning.SAMPLE_RUNS):  # run_async feeds are recorded too
        session.run_async(None, x, callback, None)
        issued += 1
    while not session.wait_tuned(0.01) and issued < 5_000:
        session.run_async(None, x, callback, None)
        issued += 1
    assert session.wait_tuned(WAIT_S) and session.fusion_report.applied, session.fusion_status
    for _ in range(5):
        session.run_async(None, x, callback, None)
        issued += 1
    for _ in range(issued):
        assert done.acquire(timeout=60), "a run_async callback never came"
    assert [err for err, _ in results] == [""] * issued
    for _, out in results:
        np.testing.assert_allclose(out, want, **TOL)
    out = session.run_with_ort_values(None, {"x": made_before})  # an OrtValue made before the swap
    np.testing.assert_allclose(out[0].numpy(), want, **TOL)


# ----------------------------------------------------------------------------------- modes


def test_sync_mode_tunes_at_creation_and_the_option_wins_over_the_environment(winning, monkeypatch):
    model = ffn_matmul_add_relu()
    so = onnxruntime.SessionOptions()
    so.add_session_config_entry(TUNE_KEY, "sync")
    monkeypatch.setenv(tuner.ENV, "off")
    session = ortfuse.InferenceSession(model, so, fusion="auto")
    assert session.wait_tuned(0) and _fused(session) == ["add_relu", "gemm_act"]
    assert session.fusion_status == "fused: 2 of 2 matches kept"
    _check(session, _stock(model), ffn_inputs())


def test_off_mode_uses_cached_decisions_only(monkeypatch):
    monkeypatch.setenv(tuner.ENV, "off")
    monkeypatch.setattr(measuring, "measure", lambda *a, **k: pytest.fail("measured under ORTFUSE_TUNE=off"))
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    first = session._sess
    for feeds in _feeds(live_tuning.SAMPLE_RUNS + 2):
        session.run(None, feeds)
    assert session.wait_tuned(0) and session._sess is first and not session.fusion_report.applied
    assert session.fusion_status.startswith("stock ORT: fusion='auto': no decisions for this model")


@pytest.mark.parametrize("spelling, mode", [("0", "off"), ("False", "off"), ("no", "off"), ("on", "background"),
                                            ("sync", "sync"), ("", "background")])
def test_mode_spellings(monkeypatch, spelling, mode):
    from ortfuse.foundation.session_options import tune_mode

    monkeypatch.setenv(tuner.ENV, spelling)
    assert tune_mode(None) == mode
    assert tuner.tuning_enabled() is (mode != "off")


def test_tune_with_hands_representative_inputs(winning, monkeypatch):
    monkeypatch.setenv(tuner.ENV, "off")  # nothing measured at creation nor from served runs
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    assert session.wait_tuned(0) and not session.fusion_report.applied
    session.tune_with(_feeds(2, seq=9))
    assert session.wait_tuned(WAIT_S) and _fused(session) == ["add_relu", "gemm_act"], session.fusion_status
    assert tuner.tune(model, measure=False, sample=ffn_inputs(batch=2, seq=9)).from_cache  # keyed by their shapes
    _check(session, _stock(model), ffn_inputs(seq=9))
    with pytest.raises(ValueError, match="fusion='auto'"):
        ortfuse.InferenceSession(model, fusion=True).tune_with(_feeds(1))


# ----------------------------------------------------------------------------------- failures


def _reshape_gather_model() -> onnx.ModelProto:
    """Feeds that random sample inputs cannot make: ``x[batch, n]`` reshaped to the constant shape
    [1, 2, 8] (only n = 16 at batch 1 works) and token types indexing a 2-row table through an Add
    (ids + 1), then Add+Relu (a fusion candidate) on their sum."""
    table = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(2, 8) / 10, "table")
    consts = [table, numpy_helper.from_array(np.array([1, 2, 8], np.int64), "shape"),
              numpy_helper.from_array(np.array(1, np.int64), "one"),
              numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32), "bias")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["xr"], name="reshape"),
             helper.make_node("Add", ["ids", "one"], ["ids1"], name="shift"),
             helper.make_node("Gather", ["table", "ids1"], ["emb"], name="gather"),
             helper.make_node("Add", ["xr", "emb"], ["s"], name="add"),
             helper.make_node("Add", ["s", "bias"], ["sb"], name="add_bias"),
             helper.make_node("Relu", ["sb"], ["y"], name="relu")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"]),
              helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8])
    model = helper.make_model(helper.make_graph(nodes, "reshape_gather", inputs, [out], initializer=consts),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _reshape_gather_feeds(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, 16)).astype(np.float32), "ids": rng.integers(-1, 1, (1, 2))}


@pytest.mark.parametrize("mode", ["sync", "background", "off"])
def test_model_whose_sample_feeds_fail_creates_in_every_mode(winning, monkeypatch, mode):
    monkeypatch.setenv(tuner.ENV, mode)
    model = _reshape_gather_model()
    assert ortfuse.fuse(model)[1].matches, "the model has a fusion candidate"
    stock = _stock(model)
    session = ortfuse.InferenceSession(model, fusion="auto")
    report = session.fusion_report
    assert not report.applied
    if mode == "sync":  # measured at creation on random feeds, which the model refuses
        assert "tuning failed" in report.reason and session.fusion_status.startswith("stock ORT: ")
        assert "tuning failed" in session.fusion_status
    elif mode == "off":
        assert "no decisions" in report.reason
    for seed in range(live_tuning.SAMPLE_RUNS):
        _check(session, stock, _reshape_gather_feeds(seed))
    assert session.wait_tuned(WAIT_S), session.fusion_status
    if mode == "background":  # tuned on the served feeds, which the model takes
        assert session.fusion_report.applied, session.fusion_status
        assert session.fusion_status.startswith("fused since run ")
    _check(session, stock, _reshape_gather_feeds(99))


def test_a_failing_tuning_leaves_stock_ort_and_says_why(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("subgraph exploded")

    monkeypatch.setattr(measuring, "measure", broken)
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    first = session._sess
    for feeds in _feeds():
        session.run(None, feeds)
    assert session.wait_tuned(WAIT_S)
    assert session.fusion_status == "stock ORT: tuning failed: RuntimeError: subgraph exploded"
    assert any("subgraph exploded" in n for n in session.fusion_report.notes)
    assert "subgraph exploded" in session.fusion_report.reason
    assert session._sess is first
    _check(session, _stock(model), ffn_inputs())


def test_the_tuning_stops_when_its_budget_is_spent(winning):
    so = onnxruntime.SessionOptions()
    so.add_session_config_entry(TUNE_BUDGET_KEY, "0.001")
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, so, fusion="auto")
    for feeds in _feeds():
        session.run(None, feeds)
    assert session.wait_tuned(WAIT_S)
    # the work budget (HARD_STOP budgets of tuning work) or, on a loaded machine, the wall-clock one
    work = f"{live_tuning.HARD_STOP * 0.001:g} s"
    wall = f"{live_tuning.WALL_STOP * 0.001:g} s passed"
    assert session.fusion_status.startswith((f"stock ORT: tuning stopped: it worked {work}",
                                             "stock ORT: tuning stopped: served runs (or the machine's other "
                                             f"work) left too little idle time: {wall}")), session.fusion_status
    assert not session.fusion_report.applied
    _check(session, _stock(model), ffn_inputs())


def test_stopping_the_tuning_leaves_no_lock_held(monkeypatch):
    """The gate stops the tuning by raising from the thread's profile hook. Python delivers that raise
    as if the code whose event fired raised there: at a C return inside a Condition's ``__enter__`` the
    lock is taken and the with never releases it. Seen at any event of a with on the session's
    condition, the stop leaves the lock free and lands as the next tuning function begins."""
    from ortfuse.ir import metadata

    monkeypatch.setattr(live_tuning, "CHECK_EVERY", 1)  # the stop is looked for at every event
    session = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion="auto")
    live, served = session._ortfuse_live, session._ortfuse_live.served
    events: list[tuple[str, object]] = []

    def serve_and_work(stop_at: int) -> list[str]:
        gate, count, outcome = live._gate(), [0], []

        def hook(frame, event, arg):
            count[0] += 1
            events.append((event, frame.f_code))
            if count[0] == stop_at:
                live._stop = True
            gate(frame, event, arg)

        def body():
            sys.setprofile(hook)
            try:
                with served.idle:
                    served.idle.wait(0)
                metadata.read_props(onnx.ModelProto())  # a tuning function: where the stop may land
                outcome.append("ran on")
            except live_tuning._Stopped:
                outcome.append("stopped")
            finally:
                sys.setprofile(None)

        live._stop = False
        thread = threading.Thread(target=body)
        thread.start()
        thread.join(WAIT_S)
        return outcome

    assert serve_and_work(stop_at=0) == ["ran on"]
    work = next(i for i, (event, code) in enumerate(events, 1)
                if event == "call" and code is metadata.read_props.__code__)
    assert work > 4, events  # the with's own events come first
    for stop_at in range(1, work + 1):
        events.clear()
        assert serve_and_work(stop_at) == ["stopped"], f"a stop seen at event {stop_at} of {events}"
        assert served.lock.acquire(timeout=5), f"a stop seen at event {stop_at} left the lock held: {events}"
        served.lock.release()
    live._stop = False
    _check(session, _stock(ffn_matmul_add_relu()), ffn_inputs())


def test_stop_points_are_the_tuning_functions_as_they_begin():
    """The gate may raise only at a ``call`` event of a tuning function that is not a generator's
    resumption (``runtime.stop_points``); never at C calls or in another package's code."""
    from ortfuse.ir import metadata
    from ortfuse.runtime import stop_points

    at_stop_point, seen = stop_points.checker(), []

    def generated():
        yield 1

    def hook(frame, event, arg):
        seen.append((frame.f_globals.get("__name__"), frame.f_code.co_name, event, at_stop_point(frame, event)))

    sys.setprofile(hook)
    try:
        metadata.read_props(onnx.ModelProto())
        list(generated())
        threading.Lock().acquire(False)
    finally:
        sys.setprofile(None)
    assert ("ortfuse.ir.metadata", "read_props", "call", True) in seen
    # nothing else: C calls, this test's functions, a generator (its comprehension is read_props's own code)
    assert {(module, event) for module, _, event, fit in seen if fit} == {("ortfuse.ir.metadata", "call")}
    assert ("test_live_tuning", "generated", "call", False) in seen


def test_wait_tuned_times_out_while_tuning_runs(monkeypatch):
    reached, release = threading.Event(), threading.Event()

    def blocking(model, ids, level, threads, sample, key, *args, **kwargs):
        reached.set()
        assert release.wait(WAIT_S)
        return Tuning(key)

    monkeypatch.setattr(measuring, "measure", blocking)
    session = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion="auto")
    for feeds in _feeds():
        session.run(None, feeds)
    assert reached.wait(WAIT_S), "the stubbed measurement was never reached"
    assert session.wait_tuned(0.2) is False
    assert session.fusion_status.startswith("tuning on 8 recorded feeds")
    with pytest.raises(RuntimeError, match="a tuning is running"):
        session.tune_with(_feeds(1))
    release.set()
    assert session.wait_tuned(WAIT_S) is True
    assert session.fusion_status == "stock ORT: no fusion measured faster"
    reached = session.time_to_plan  # the final plan is stock ORT's, in effect from the start
    assert reached["plan"] == "stock" and reached["served_runs"] == live_tuning.SAMPLE_RUNS and reached["seconds"] > 0


def test_recording_is_bounded_by_the_byte_cap(winning, monkeypatch):
    one = sum(a.nbytes for a in ffn_inputs().values())
    monkeypatch.setattr(live_tuning, "SAMPLE_BYTES", int(one * 2.5))  # two feeds fit, not three
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    for feeds in _feeds(2, seq=5):
        session.run(None, feeds)
    assert session.fusion_status == f"serving stock ORT, recording feeds (2/{live_tuning.SAMPLE_RUNS})"
    session.run(None, ffn_inputs(seed=3))  # does not fit: tuning starts on the two recorded
    assert session.wait_tuned(WAIT_S) and session.fusion_report.applied, session.fusion_status
    assert any("tuned on 2 served feeds" in n for n in session.fusion_report.notes)

    monkeypatch.setattr(live_tuning, "SAMPLE_BYTES", one // 2)  # not even one feed fits
    other = ortfuse.InferenceSession(ffn_matmul_add_relu(seed=3), fusion="auto")
    other.run(None, ffn_inputs())
    assert other.wait_tuned(0) and "sample cap" in other.fusion_status and not other.fusion_report.applied


CHILD = """
import sys
sys.path.insert(0, {tests!r})
from ortfuse.tune import measure as measuring
measuring._best_of = lambda f, o, n: (0.5, 1.0)
measuring._time_pair = lambda f, o, budget: (0.5, 1.0, [0.5] * measuring.REPEATS)
from timing_fixtures import raw_timing
measuring._time_with_control = lambda f, o, c, budget: raw_timing(0.5, 1.0)
from ortfuse.runtime import live_tuning
live_tuning.IN_CHILD = False  # the stated timings above hold in this process only
import ortfuse
from model_fixtures import ffn_inputs, ffn_matmul_add_relu
session = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion="auto")
if sys.argv[1] == "tune":
    for seed in range(8):
        session.run(None, ffn_inputs(seed=seed))
    assert session.wait_tuned(120), session.fusion_status
print(session.fusion_status)
"""


@pytest.mark.slow
def test_a_second_process_starts_fused(tmp_path):
    """Decisions and the plan a process tuned on its live feeds are on disk: the next process on
    this machine (same cache) is fused at creation, with nothing left to tune."""
    import os
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=os.path.dirname(__file__)))
    env = {**os.environ, "ORTFUSE_CACHE_DIR": str(tmp_path / "shared")}
    env.pop(tuner.ENV, None)

    def child(arg: str) -> str:
        done = subprocess.run([sys.executable, str(script), arg], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    assert child("tune").startswith("fused since run 9: 2 of 2")
    assert child("create") == "fused: 2 of 2 matches kept"


def test_the_tuning_measures_through_a_yielder_that_served_runs_reach(monkeypatch):
    """The tuner's runs and timings yield to this session's served runs: measuring sees the
    session's yielder installed, and a served run starting reaches it."""
    from ortfuse.foundation import yielding

    seen: list = []

    def spying(model, ids, level, threads, sample, key, *args, **kwargs):
        yielder = yielding.current()
        seen.append(yielder)
        if yielder is not None:
            epoch = yielder.epoch
            served = threading.Thread(target=session.run, args=(None, ffn_inputs(seed=5)))  # a caller's thread
            served.start()
            served.join(WAIT_S)
            seen.append(yielder.epoch - epoch)
        return Tuning(key)

    monkeypatch.setattr(measuring, "measure", spying)
    session = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion="auto")
    for feeds in _feeds():
        session.run(None, feeds)
    assert session.wait_tuned(WAIT_S), session.fusion_status
    assert seen and seen[0] is session._ortfuse_live.served.yielder, seen
    assert seen[1] == 1, "the served run did not reach the tuning's yielder"
    assert yielding.current() is None  # this thread measures plainly


def test_a_starved_tuning_ends_on_stock_ort_and_says_so(monkeypatch):
    from ortfuse.foundation import yielding

    def starved(*args, **kwargs):
        raise yielding.Starved("served runs left no idle window for one timed run in 200 attempts")

    monkeypatch.setattr(measuring, "measure", starved)
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    first = session._sess
    for feeds in _feeds():
        session.run(None, feeds)
    assert session.wait_tuned(WAIT_S)
    assert session.fusion_status.startswith("stock ORT: tuning stopped: served runs left no idle window"), \
        session.fusion_status
    assert session._sess is first and not session.fusion_report.applied
    _check(session, _stock(model), ffn_inputs())


def test_background_creation_leaves_finding_the_matches_to_the_tuning_thread(winning, monkeypatch):
    """With nothing known for the model, creation does not run ``fuse`` on the creating thread (it
    imports and checks what serving need not wait for); the live tuning finds the matches."""
    from ortfuse.fusion import rewrite
    from ortfuse.runtime import planning

    real, callers = rewrite.fuse, []

    def watched(*args, **kwargs):
        callers.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(rewrite, "fuse", watched)
    session = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion="auto")
    assert callers == [], "fuse ran on the creating thread"
    assert planning.DEFERRED_NOTE in session.fusion_report.notes and not session.fusion_report.matches
    assert session.fusion_status == f"serving stock ORT, recording feeds (0/{live_tuning.SAMPLE_RUNS})"
    for feeds in _feeds():
        session.run(None, feeds)
    assert session.wait_tuned(WAIT_S) and _fused(session) == ["add_relu", "gemm_act"], session.fusion_status
    assert callers and not any(callers), "the matches were not looked for on the tuning thread"


def test_a_model_without_matches_ends_on_stock_ort_and_says_so():
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"], name="neg")], "plain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ortfuse.InferenceSession(model, fusion="auto")
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    for _ in range(live_tuning.SAMPLE_RUNS):
        np.testing.assert_array_equal(session.run(None, x)[0], -x["x"])
    assert session.wait_tuned(WAIT_S)
    assert session.fusion_status == "stock ORT: no pattern matches this model", session.fusion_status
    assert not session.fusion_report.applied


SERVING_ONLY = """
import sys
sys.path.insert(0, {tests!r})
import onnxruntime
import ortfuse
from model_fixtures import ffn_inputs, ffn_matmul_add_relu
so = onnxruntime.SessionOptions()
so.add_session_config_entry("ortfuse.tune_budget_s", "2")
session = ortfuse.InferenceSession(ffn_matmul_add_relu(), so, fusion="auto")
for seed in range(8):
    session.run(None, ffn_inputs(seed=seed))
assert session.wait_tuned(240), session.fusion_status
assert "process of its own" in " ".join(session.fusion_report.notes), session.fusion_report.notes
print(sorted(m for m in ("ortfuse.tune.tuner", "ortfuse.tune.measure", "ortfuse.fusion.rewrite") if m in sys.modules))
"""


@pytest.mark.slow
def test_a_tuning_in_its_own_process_imports_nothing_of_the_tuner_here(tmp_path):
    """The serving process imports neither the tuner nor the rewriter while a process of its own
    tunes (their imports hold the GIL for a few hundred ms, which served runs would wait for); the
    serving process only reads the plan that process stored."""
    import os
    import subprocess

    script = tmp_path / "serving.py"
    script.write_text(SERVING_ONLY.format(tests=os.path.dirname(__file__)))
    env = {**os.environ, "ORTFUSE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop(tuner.ENV, None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("broken", ["raises", "missing"])
def test_a_swap_onnxruntime_refuses_leaves_the_session_on_its_plan(winning, monkeypatch, tmp_path, broken):
    """ORT's private ``_bind_session`` raising mid-swap, or absent (an older onnxruntime): the session
    keeps its C session, its model path (ORT re-reads it on set_providers) and its answers."""
    model = ffn_matmul_add_relu()
    path = str(tmp_path / "ffn.onnx")
    onnx.save(model, path)
    stock = _stock(model)
    session = ortfuse.InferenceSession(path, fusion="auto")
    if broken == "raises":
        def refuse(sess):
            session._sess = sess  # part of the binding done, as a failure inside ORT's method would leave it
            raise RuntimeError("bind refused")

        session._bind_session = refuse
    else:
        monkeypatch.delattr(onnxruntime.InferenceSession, "_bind_session")
    first = session._sess
    for feeds in _feeds():
        _check(session, stock, feeds)
    assert session.wait_tuned(WAIT_S), session.fusion_status
    assert session.fusion_status.startswith("stock ORT: "), session.fusion_status
    assert ("bind refused" if broken == "raises" else "_bind_session") in session.fusion_status
    assert session._sess is first and session._model_path == path
    vars(session).pop("_bind_session", None)
    monkeypatch.undo()  # ORT's own set_providers binds its new session with it
    session.set_providers(["CPUExecutionProvider"])  # rebuilt from the model path the session holds
    _check(session, stock, ffn_inputs(batch=3, seq=5, seed=11))


# ----------------------------------------------------------------------------------- hot path


def test_tuned_session_runs_as_ort_runs(winning):
    """Served runs are counted while feeds are recorded and while a tuning runs; once it has ended
    (swapped or not) and no replaced C session waits, a run is ORT's run alone: nothing of the live
    tuning is called (the cost a session that keeps stock ORT would otherwise pay on every run)."""
    model = ffn_matmul_add_relu()
    stock = _stock(model)
    session = ortfuse.InferenceSession(model, fusion="auto")
    assert session._ortfuse_counting is session._ortfuse_live.served  # recording
    for feeds in _feeds():
        _check(session, stock, feeds)
    assert session.wait_tuned(WAIT_S), session.fusion_status
    _check(session, stock, ffn_inputs(seed=99))  # a served run after the swap releases the old C session
    assert session._ortfuse_counting is None, session.fusion_status

    def counted(*args, **kwargs):
        raise AssertionError("a run went through the live tuning after it ended")

    session._ortfuse_live.served.counted = counted  # shadows the method on this instance only
    _check(session, stock, ffn_inputs(seed=100))
    del session._ortfuse_live.served.counted
    session.tune_with(_feeds(2))  # tuning again: runs are counted (and pause it) until it ends
    assert session._ortfuse_counting is session._ortfuse_live.served or session.wait_tuned(0)
    assert session.wait_tuned(WAIT_S), session.fusion_status
    _check(session, stock, ffn_inputs(seed=101))
    assert session._ortfuse_counting is None
