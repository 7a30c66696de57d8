"""The live tuning measured in a process of its own (ortfuse.runtime.tune_process): the serving process
stops it while a served run is in flight, the child keeps only timings no served run overlapped
(``yielding.ProcessYielder`` over ``yielding.SharedCounts``), makes and caches the plan, and the
session swaps to it without parsing the model itself. Outputs are compared with stock ORT at
ORT_DISABLE_ALL within ``TOL``.
"""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime
import pytest

import ortfuse
from ortfuse.foundation import child_process, yielding
from ortfuse.runtime import live_tuning, planning, served_runs, tune_process
from ortfuse.tune import tuner as tune

from model_fixtures import ffn_inputs, ffn_matmul_add_relu

TOL = dict(rtol=1e-4, atol=1e-4)
WAIT_S = 240  # a fresh interpreter imports onnx, ORT and numba; the machine is shared


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(tune.ENV, raising=False)


def _stock(model, feeds):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_timing_a_served_run_overlapped_is_taken_again(tmp_path):
    counts = yielding.SharedCounts(str(tmp_path / "counts"), create=True)
    reader = yielding.ProcessYielder(yielding.SharedCounts(counts.path))
    assert reader.timed(lambda: None) >= 0 and reader.discarded == 0
    served = iter([True, False])

    def once():  # a served run starts (and ends) during the first attempt only
        if next(served):
            counts.served()
            counts.ended()

    reader.timed(once)
    assert reader.discarded == 1 and counts.read() == (1, 0)


def test_runs_wait_while_a_served_run_is_in_flight(tmp_path):
    counts = yielding.SharedCounts(str(tmp_path / "counts"), create=True)
    reader = yielding.ProcessYielder(yielding.SharedCounts(counts.path))
    counts.served()
    ran = threading.Event()
    worker = threading.Thread(target=lambda: reader.run(lambda options: ran.set()))
    worker.start()
    assert not ran.wait(0.2), "a tuning run started while a served run was in flight"
    counts.ended()
    assert ran.wait(5)
    worker.join(5)


def test_always_disturbed_timings_end_the_tuning(tmp_path, monkeypatch):
    monkeypatch.setattr(yielding, "MAX_ATTEMPTS", 3)
    counts = yielding.SharedCounts(str(tmp_path / "counts"), create=True)
    reader = yielding.ProcessYielder(yielding.SharedCounts(counts.path))

    def disturbed():
        counts.served()
        counts.ended()

    with pytest.raises(yielding.Starved, match="no idle window"):
        reader.timed(disturbed)
    assert reader.discarded == 3


def test_a_failing_tuning_process_leaves_stock_ort_and_says_why(monkeypatch):
    monkeypatch.setattr(tune_process, "tune",
                        lambda *a, **k: tune_process.Outcome(error="the tuning process failed (simulated)"))
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    for i in range(live_tuning.SAMPLE_RUNS):
        session.run(None, ffn_inputs(seed=i))
    assert session.wait_tuned(WAIT_S)
    if child_process.stoppable():
        assert session.fusion_status == "stock ORT: the tuning process failed (simulated)", session.fusion_status
    assert not session.fusion_report.applied
    np.testing.assert_allclose(session.run(None, ffn_inputs())[0], _stock(model, ffn_inputs())[0], **TOL)


@pytest.mark.slow
@pytest.mark.skipif(not child_process.stoppable(), reason="no SIGSTOP on this platform: the thread tunes")
def test_the_process_tunes_beside_served_runs_and_the_session_swaps_without_parsing(monkeypatch):
    """Real timings, so the verdict may go either way; whichever it is, the status says it, the
    process was stopped for served runs, the serving thread never parsed the model, and every
    output equals stock ORT's."""
    signals: list[str] = []
    real_signal = served_runs._signal
    monkeypatch.setattr(served_runs, "_signal",
                        lambda process, name: (signals.append(name), real_signal(process, name)))
    parsed: list = []
    real_load = planning.load_for_fusion
    monkeypatch.setattr(planning, "load_for_fusion", lambda *a: (parsed.append(a), real_load(*a))[1])
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    for i in range(live_tuning.SAMPLE_RUNS):
        session.run(None, ffn_inputs(seed=i))
    served = 0
    while not session.wait_tuned(0.02) and served < 20_000:
        feeds = ffn_inputs(seed=served)
        np.testing.assert_allclose(session.run(None, feeds)[0], _stock(model, feeds)[0], **TOL)
        served += 1
    assert session.wait_tuned(WAIT_S), session.fusion_status
    status = session.fusion_status
    assert status.startswith(("fused since run", "stock ORT: no fusion measured faster")), status
    assert served == 0 or "SIGSTOP" in signals, "the tuning process was not stopped for served runs"
    assert parsed == [], "the serving process parsed the model"
    if status.startswith("fused"):
        assert any("in a process of its own" in n for n in session.fusion_report.notes), session.fusion_report.notes
        events = [event for event, _ in session._ortfuse_live.timeline]
        # the process checked the outputs on every recorded feed; this one only warmed the new session
        assert "plan's session warmed" in events and "plan's outputs checked" not in events, events
    feeds = ffn_inputs(seed=99)
    np.testing.assert_allclose(session.run(None, feeds)[0], _stock(model, feeds)[0], **TOL)


CHILD_TIMINGS = """
import os, sys
sys.path.insert(0, {tests!r})
from ortfuse.tune import measure as measuring
from timing_fixtures import raw_timing
measuring._best_of = lambda f, o, n: (0.5, 1.0)
measuring._time_pair = lambda f, o, budget: (0.5, 1.0, [0.5] * measuring.REPEATS)
measuring._time_with_control = lambda f, o, c, budget: raw_timing(0.5, 1.0)
if os.environ.get("ORTFUSE_TEST_OUTPUTS_DIFFER"):
    from ortfuse.tune import output_check
    output_check.differing_output = lambda names, want, got, bf16: names[0]
if os.environ.get("ORTFUSE_TEST_NOT_FINAL"):  # as when the budget ran out: the plan is not cached
    from ortfuse.tune import decisions
    decisions.Tuning.cacheable = property(lambda self: False)
"""


@pytest.fixture
def child_wins(tmp_path, monkeypatch):
    """Tuning processes started by this test measure every fusion twice as fast as ORT (stated
    timings, installed by a ``sitecustomize`` on their path)."""
    import os

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CHILD_TIMINGS.format(tests=os.path.dirname(__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))


def _served_until_tuned(session, model) -> None:
    for i in range(live_tuning.SAMPLE_RUNS):
        feeds = ffn_inputs(seed=i)
        np.testing.assert_allclose(session.run(None, feeds)[0], _stock(model, feeds)[0], **TOL)
    assert session.wait_tuned(WAIT_S), session.fusion_status


@pytest.mark.slow
@pytest.mark.skipif(not child_process.stoppable(), reason="no SIGSTOP on this platform: the thread tunes")
def test_the_process_checks_the_plan_and_the_serving_process_only_warms_it(child_wins):
    """The tuning process runs the plan beside stock ORT on every recorded feed; the serving process
    builds the new C session, warms it with one run and swaps, with no stock runs of its own."""
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    _served_until_tuned(session, model)
    assert session.fusion_status.startswith("fused since run "), session.fusion_status
    events = [event for event, _ in session._ortfuse_live.timeline]
    assert "plan's session warmed" in events and "plan's outputs checked" not in events, events
    # the process's own steps, on this process's clock, between its start and its end (tune.steps)
    child = events[events.index("child started") + 1:events.index("child ended")]
    assert child[:2] == ["child imported", "child model loaded"] and child[-1] == "child outputs checked", child
    assert {"child whole plan judged", "child decisions", "child plan made"} <= set(child), child
    times = [t for _, t in session._ortfuse_live.timeline]
    assert times == sorted(times)
    reached = session.time_to_plan
    assert reached["plan"] == "fused" and reached["child_cpu_s"] > 0 and reached["seconds"] >= reached["tuning_s"] > 0
    feeds = ffn_inputs(seed=42)
    np.testing.assert_allclose(session.run(None, feeds)[0], _stock(model, feeds)[0], **TOL)


@pytest.mark.slow
@pytest.mark.skipif(not child_process.stoppable(), reason="no SIGSTOP on this platform: the thread tunes")
def test_outputs_the_process_finds_different_keep_stock_ort_and_say_why(child_wins, monkeypatch):
    monkeypatch.setenv("ORTFUSE_TEST_OUTPUTS_DIFFER", "1")
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    _served_until_tuned(session, model)
    status = session.fusion_status
    assert status.startswith("stock ORT: the fused plan's output ") and "on served feed 1" in status, status
    assert not session.fusion_report.applied
    feeds = ffn_inputs(seed=43)
    np.testing.assert_allclose(session.run(None, feeds)[0], _stock(model, feeds)[0], **TOL)


@pytest.mark.slow
@pytest.mark.skipif(not child_process.stoppable(), reason="no SIGSTOP on this platform: the thread tunes")
def test_a_plan_the_process_cannot_cache_is_handed_over_not_made_again_here(child_wins, monkeypatch):
    """Decisions that are not final (a spent budget) are not cached, so the plan is not either: the
    tuning process hands the plan's file over, and the serving process neither parses nor fuses
    the model (that took seconds of the GIL beside served runs); the file goes with the session."""
    import gc
    import os

    monkeypatch.setenv("ORTFUSE_TEST_NOT_FINAL", "1")
    parsed: list = []
    real_load = planning.load_for_fusion
    monkeypatch.setattr(planning, "load_for_fusion", lambda *a: (parsed.append(a), real_load(*a))[1])
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    _served_until_tuned(session, model)
    assert session.fusion_status.startswith("fused since run "), session.fusion_status
    assert parsed == [], "the serving process parsed the model"
    assert any("handed over" in n for n in session.fusion_report.notes), session.fusion_report.notes
    plan_file = session._model_path
    assert plan_file and os.path.exists(plan_file)
    feeds = ffn_inputs(seed=44)
    np.testing.assert_allclose(session.run(None, feeds)[0], _stock(model, feeds)[0], **TOL)
    del session
    gc.collect()
    assert not os.path.exists(plan_file), "the handed-over plan file outlived its session"


@pytest.mark.parametrize("given", ["none", "spinning"])
def test_the_check_runs_on_sessions_whose_threads_do_not_spin(tmp_path, given):
    """The child's check (``tune_process._check``) of a real plan: both sessions it opens sleep after
    a run, whatever the options it was given (none, or spinning set), and the plan passes."""
    model = ffn_matmul_add_relu()
    path = tmp_path / "ffn.onnx"
    path.write_bytes(model.SerializeToString())
    options = None
    if given == "spinning":
        options = onnxruntime.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    prepared = planning.prepare(str(path), options, True, None, mode="off")
    assert prepared.plan is not None
    opened: list = []
    real = onnxruntime.InferenceSession

    class Spy(real):
        def __init__(self, source, sess_options=None, *args, **kwargs):
            opened.append(sess_options.get_session_config_entry("session.intra_op.allow_spinning"))
            super().__init__(source, sess_options, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnxruntime, "InferenceSession", Spy)
        assert tune_process._check(str(path), options, prepared, [ffn_inputs(seed=2)]) == ""
    assert opened == ["0", "0"]


def test_feeds_are_saved_as_np_savez_saves_them_in_slices_a_profile_hook_sees(tmp_path, monkeypatch):
    """``save_npz``: what ``np.load`` reads back equals the arrays (dtypes, shapes, a 0-d array, a
    non-contiguous one, strings, an array of objects); an array's data goes out in writes of
    ``WRITE_SLICE`` bytes, each a call the live tuning's gate (a profile hook) sees, so it can pause
    between two for a served run."""
    import sys

    arrays = {"x": np.random.default_rng(0).standard_normal((3, 50, 41)).astype(np.float32),
              "ids": np.arange(7, dtype=np.int64), "scalar": np.float32(3.5),
              "half": np.ones((2, 6), np.float16)[:, ::2], "flags": np.array([True, False]),
              "text": np.array(["ab", "c"]), "objects": np.array(["a", 1], dtype=object),
              "empty": np.zeros((0, 4), np.float32)}
    monkeypatch.setattr(tune_process, "WRITE_SLICE", 1000)
    writes = []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "write":
            writes.append(frame.f_code.co_filename)
    path = str(tmp_path / "feeds.npz")
    sys.setprofile(hook)
    try:
        tune_process.save_npz(path, arrays)
    finally:
        sys.setprofile(None)
    with np.load(path, allow_pickle=True) as data:
        assert sorted(data.files) == sorted(arrays)
        for name, value in arrays.items():
            expected = np.asarray(value)
            assert data[name].dtype == expected.dtype and data[name].shape == expected.shape, name
            assert np.array_equal(data[name], expected), name
    assert len(writes) >= arrays["x"].nbytes // 1000
