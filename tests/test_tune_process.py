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
from ortfuse.runtime import live_tuning, planning, tune_process
from ortfuse.tune import kernel_compile, yielding
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
    if kernel_compile.stoppable():
        assert session.fusion_status == "stock ORT: the tuning process failed (simulated)", session.fusion_status
    assert not session.fusion_report.applied
    np.testing.assert_allclose(session.run(None, ffn_inputs())[0], _stock(model, ffn_inputs())[0], **TOL)


@pytest.mark.slow
@pytest.mark.skipif(not kernel_compile.stoppable(), reason="no SIGSTOP on this platform: the thread tunes")
def test_the_process_tunes_beside_served_runs_and_the_session_swaps_without_parsing(monkeypatch):
    """Real timings, so the verdict may go either way; whichever it is, the status says it, the
    process was stopped for served runs, the serving thread never parsed the model, and every
    output equals stock ORT's."""
    signals: list[str] = []
    real_signal = live_tuning._signal
    monkeypatch.setattr(live_tuning, "_signal",
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
    feeds = ffn_inputs(seed=99)
    np.testing.assert_allclose(session.run(None, feeds)[0], _stock(model, feeds)[0], **TOL)
