"""The layout step's timed choices kept per machine (ortfuse/layout/choice_cache.py, measure.py): a
probe is timed once per CPU, versions and kernel sources; the native form is chosen only when it
beats the margin in every repeat; a file of another key, a corrupt file or ORTFUSE_LAYOUT_CHOICES=off
means timing again."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from ortfuse.layout import choice_cache, op_timing, winograd
from ortfuse.layout.probe import block_size

PROBE = (b"stock-model", b"native-model", frozenset({"OpA"}), {"x": (1, 8, 4, 4)}, 2, 0.9)


def _relu_bytes() -> bytes:
    """A one-Relu model on [1, 8]: the smallest model a probe's sessions can open."""
    from onnx import helper

    x, y = (helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 8]) for n in "xy")
    return helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]), ir_version=8,
                             opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(choice_cache.ENV, raising=False)


def _timed(monkeypatch, ratios):
    """Make the probe timing return ``ratios`` and count its calls."""
    calls = []

    def fake(*args):
        calls.append(args)
        return ratios

    monkeypatch.setattr(op_timing, "_ratios", fake)
    return calls


def test_a_probe_is_timed_once_and_its_choice_kept_on_disk(monkeypatch):
    calls = _timed(monkeypatch, [0.80, 0.85, 0.70])
    assert op_timing.native_faster(*PROBE) is True
    assert op_timing.native_faster(*PROBE) is True
    assert len(calls) == 1
    data = json.loads(choice_cache.path().read_text())
    assert data["key"] == choice_cache.key()
    assert [c["ratios"] for c in data["choices"].values()] == [[0.8, 0.85, 0.7]]


def test_native_needs_the_margin_in_every_repeat(monkeypatch):
    _timed(monkeypatch, [0.80, 0.95, 0.70])  # median 0.80, one repeat above 0.9
    assert op_timing.native_faster(*PROBE) is False
    assert [c["native"] for c in json.loads(choice_cache.path().read_text())["choices"].values()] == [False]


def test_another_shape_threads_or_margin_is_another_probe(monkeypatch):
    calls = _timed(monkeypatch, [0.5, 0.5, 0.5])
    stock, native, ops, feeds, threads, margin = PROBE
    op_timing.native_faster(*PROBE)
    op_timing.native_faster(stock, native, ops, {"x": (1, 8, 8, 8)}, threads, margin)
    op_timing.native_faster(stock, native, ops, feeds, threads + 1, margin)
    op_timing.native_faster(stock, native, ops, feeds, threads, 0.8)
    assert len(calls) == 4
    assert len(json.loads(choice_cache.path().read_text())["choices"]) == 4


def test_a_file_of_another_machine_or_a_corrupt_file_is_timed_again(monkeypatch):
    calls = _timed(monkeypatch, [0.5, 0.5, 0.5])
    op_timing.native_faster(*PROBE)
    data = json.loads(choice_cache.path().read_text())
    choice_cache.path().write_text(json.dumps({**data, "key": {**data["key"], "cpu": "another CPU"}}))
    op_timing.native_faster(*PROBE)
    choice_cache.path().write_text("{not json")
    op_timing.native_faster(*PROBE)
    assert len(calls) == 3
    assert json.loads(choice_cache.path().read_text())["key"] == choice_cache.key()


def test_off_neither_reads_nor_writes(monkeypatch):
    calls = _timed(monkeypatch, [0.5, 0.5, 0.5])
    monkeypatch.setenv(choice_cache.ENV, "off")
    assert op_timing.native_faster(*PROBE) and op_timing.native_faster(*PROBE)
    assert len(calls) == 2 and not choice_cache.path().exists()


def test_ops_that_cannot_be_registered_are_not_kept(monkeypatch):
    _timed(monkeypatch, None)
    assert op_timing.native_faster(*PROBE) is False
    assert not choice_cache.path().exists()


def test_a_real_probe_is_timed_in_repeats_and_read_back(monkeypatch):
    """One Winograd conv probe timed for real: its per-repeat ratios kept (all three when it wins, up to
    the first at or above the margin when it loses), the same choice read back."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    b = block_size()
    winograd.measured_faster.cache_clear()
    first = winograd.measured_faster(b, b, 8, 8, "relu", 1.0, b, 1)
    (kept,) = json.loads(choice_cache.path().read_text())["choices"].values()
    ratios = kept["ratios"]
    assert kept["native"] is first and all(r > 0 for r in ratios) and first is (max(ratios) < winograd.MARGIN)
    assert len(ratios) == op_timing.REPEATS if first else ratios[-1] >= winograd.MARGIN > max(ratios[:-1], default=0)
    winograd.measured_faster.cache_clear()
    _timed(monkeypatch, [2.0] * 3 if first else [0.1] * 3)  # timing again would choose the other form
    assert winograd.measured_faster(b, b, 8, 8, "relu", 1.0, b, 1) is first
    winograd.measured_faster.cache_clear()


# ------------------------------------------------------------------------------------------------
# a budgeted repeat ends once a sign test settles the side of the margin
# ------------------------------------------------------------------------------------------------
def _paired(native_ms, stock_ms):
    """Runners whose timed runs take the given milliseconds, pass by pass, and the count of timed runs."""
    timed = {"native": 0, "stock": 0}

    def time_run(fn):
        name = fn()
        series = native_ms if name == "native" else stock_ms
        value = series[timed[name] % len(series)]
        timed[name] += 1
        return value
    return {"native": lambda: "native", "stock": lambda: "stock"}, time_run, timed


@pytest.mark.parametrize("native_ms, settles", [([0.7], True), ([1.2], False)])
def test_a_clear_side_of_the_margin_ends_a_budgeted_repeat_at_the_first_look(native_ms, settles):
    runners, time_run, timed = _paired(native_ms, [1.0])
    ratio = op_timing._budgeted_ratio(runners, 140, time_run, 0.95)
    assert timed == {"native": op_timing.CHUNK, "stock": op_timing.CHUNK}
    assert ratio == pytest.approx(native_ms[0]) and (ratio < 0.95) is settles


def test_a_ratio_near_the_margin_runs_the_whole_budget():
    """Half the passes on each side of the margin: no look settles it, every pass of the budget is timed."""
    runners, time_run, timed = _paired([0.90, 1.00], [1.0])
    ratio = op_timing._budgeted_ratio(runners, 100, time_run, 0.95)
    assert timed == {"native": 100, "stock": 100} and ratio == pytest.approx(0.95)


def test_the_side_is_settled_by_the_sign_test_and_the_p50_together():
    assert op_timing.settled_side([0.7] * 12, [1.0] * 12, 0.95, 0.01 / 12) is True
    assert op_timing.settled_side([1.1] * 12, [1.0] * 12, 0.95, 0.01 / 12) is False
    assert op_timing.settled_side([0.7] * 10, [1.0] * 10, 0.95, 0.01 / 12) is None  # 10 of 10: not unlikely enough
    # 20 of 24 passes below (enough for the sign test), yet the p50 ratio is far above: not settled
    native, stock = [1.0] * 10 + [0.2] * 10 + [1.0] * 4, [1.1] * 10 + [0.3] * 10 + [0.3] * 4
    assert op_timing.settled_side(native, stock, 0.95, 0.01 / 12) is None


def test_a_budgeted_probe_stops_at_its_first_repeat_settled_above_the_margin(monkeypatch):
    """``_ratios`` with a budget: repeats that settle early, the first one above the margin the last."""
    series = iter([[0.5], [1.5]])
    seen = []

    def budgeted(runners, runs, time_run, margin):
        ms = next(series)
        seen.append(runs)
        return ms[0]
    monkeypatch.setattr(op_timing, "_budgeted_ratio", budgeted)
    ratios = op_timing._ratios(_relu_bytes(), _relu_bytes(), frozenset(), {"x": (1, 8)}, 1, frozenset(),
                               budget_s=0.05, margin=0.95)
    assert ratios == [0.5, 1.5] and len(seen) == 2 and all(op_timing.RUNS <= r <= op_timing.MAX_RUNS for r in seen)


# ------------------------------------------------------------------------------------------------
# probes timed cold: a model whose weights outgrow the last-level cache
# ------------------------------------------------------------------------------------------------
def _fake_sysfs(tmp_path, monkeypatch, caches):
    """CPU 0's caches as sysfs lists them: (type, size text) per index."""
    for i, (kind, size) in enumerate(caches):
        index = tmp_path / "sys" / f"index{i}"
        index.mkdir(parents=True)
        (index / "type").write_text(kind + "\n")
        (index / "size").write_text(size + "\n")
    op_timing.last_level_cache_bytes.cache_clear()
    monkeypatch.setattr(op_timing.glob, "glob", lambda pattern: sorted(str(p) for p in (tmp_path / "sys").iterdir()))


@pytest.mark.parametrize("caches, expected", [
    ([("Data", "32K"), ("Instruction", "64K"), ("Unified", "1024K"), ("Unified", "32768K")], 32 * 2**20),
    ([("Data", "48K"), ("Unified", "2M")], 2 * 2**20),
    ([("Instruction", "32K")], 0),
    ([("Unified", "lots")], 0),
])
def test_the_last_level_cache_is_read_from_sysfs(tmp_path, monkeypatch, caches, expected):
    _fake_sysfs(tmp_path, monkeypatch, caches)
    try:
        assert op_timing.last_level_cache_bytes() == expected
    finally:
        op_timing.last_level_cache_bytes.cache_clear()


def _graph(floats: int):
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.zeros(floats, np.float32), "w")
    return helper.make_graph([], "g", [], [], [w])


def test_weights_exceed_cache_compares_initializer_bytes(monkeypatch):
    monkeypatch.setattr(op_timing, "last_level_cache_bytes", lambda: 4000)
    assert op_timing.weights_exceed_cache(_graph(1001)) and not op_timing.weights_exceed_cache(_graph(1000))
    monkeypatch.setattr(op_timing, "last_level_cache_bytes", lambda: 0)  # unknown: probes stay warm
    assert not op_timing.weights_exceed_cache(_graph(10**6))


def test_a_cold_probe_is_another_choice_and_is_timed_cold(monkeypatch):
    calls = []
    def ratios(stock, native, ops, feeds, threads, stock_ops, cold=False, budget_s=None, margin=None):
        calls.append(cold)
        return [0.5, 0.5, 0.5]

    monkeypatch.setattr(op_timing, "_ratios", ratios)
    op_timing.native_faster(*PROBE)
    op_timing.native_faster(*PROBE, cold=True)
    op_timing.native_faster(*PROBE, cold=True)
    assert calls == [False, True]
    assert len(json.loads(choice_cache.path().read_text())["choices"]) == 2


def test_the_flushing_timer_times_the_run_alone():
    ran = []
    timed = op_timing._after_flush(1 << 20)
    ms = timed(lambda: ran.append(1))
    assert ran == [1] and 0 <= ms < 1000


def test_the_planner_times_probes_cold_only_for_weights_beyond_the_cache(monkeypatch):
    """The deciders get ``cold`` from the optimized graph's weights against the last-level cache."""
    from onnx import helper, numpy_helper

    from ortfuse import fuse
    from ortfuse.fusion.provenance import native_op_types
    from ortfuse.layout import planner

    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 12, 12])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16, 12, 12])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fused, report = fuse(model)
    seen = []
    monkeypatch.setattr(winograd, "decider", lambda block, threads, cold=False: seen.append(cold) or (lambda *a: False))
    for llc in (1 << 30, 1000):  # the filter's 9 KiB fit a 1 GiB cache, not a 1000-byte one
        monkeypatch.setattr(op_timing, "last_level_cache_bytes", lambda llc=llc: llc)
        planner.plan_layout(model, fused, None, frozenset(native_op_types(fused)), report.disabled_ort_optimizers)
    assert seen == [False, True]


def test_a_time_budget_sets_the_runs_per_repeat(monkeypatch):
    """``budget_s``: as many timed runs per repeat as fit the budget at the stock form's run time,
    within [RUNS, MAX_RUNS]; without it, RUNS."""
    from ortfuse.foundation import protocol

    seen = []

    def measure(runners, *, runs, repeats, **kw):
        seen.append(runs)
        return {name: [[1.0] * runs for _ in range(repeats)] for name in runners}

    relu = _relu_bytes()
    monkeypatch.setattr(protocol, "measure", measure)
    monkeypatch.setattr(op_timing.yielding, "timed", lambda fn: 2.0)  # every run 2 ms
    for budget in (None, 0.2, 100.0):
        op_timing._ratios(relu, relu, frozenset(), {"x": (1, 8)}, 1, frozenset(), budget_s=budget)
    repeats = op_timing.REPEATS  # without a margin every repeat is timed, each on its own
    assert seen == [op_timing.RUNS] * repeats + [100] * repeats + [op_timing.MAX_RUNS] * repeats


@pytest.mark.parametrize("per_repeat, timed, native", [
    ([0.80, 0.85, 0.70], 3, True),  # below the margin in every repeat: all of them timed
    ([0.80, 0.93, 0.70], 2, False),  # the second repeat settles it: the third is not timed
    ([0.95, 0.50, 0.50], 1, False),  # at the margin in the first
])
def test_a_probe_stops_at_the_first_repeat_not_below_the_margin(monkeypatch, per_repeat, timed, native):
    """The rule needs every repeat below the margin, so the first that is not settles ORT's form and
    the probe times no further repeat (each repeat timed on its own, its ratio recorded)."""
    from ortfuse.foundation import protocol

    calls = []

    def measure(runners, *, runs, repeats, **kw):
        ratio = per_repeat[len(calls)]
        calls.append(repeats)
        return {"stock": [[1.0] * runs], "native": [[ratio] * runs]}

    relu = _relu_bytes()
    monkeypatch.setattr(protocol, "measure", measure)
    assert op_timing.native_faster(relu, relu, frozenset(), {"x": (1, 8)}, 1, 0.9) is native
    assert calls == [1] * timed
    kept = json.loads(choice_cache.path().read_text())["choices"]
    assert [c["ratios"] for c in kept.values()] == [per_repeat[:timed]]
