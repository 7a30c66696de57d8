"""The tuner's first step (``ortfuse.tune.measure.whole_plan``): every legal match fused, in the plan a
session runs, checked and timed against stock ORT as a whole. When it wins, every match is kept with
the kernel it gets and its constants' digest, and nothing is measured one by one; when it loses or
its outputs differ, the matches are measured by class and alone as before, and the report says why.

Verdicts are driven by stated timings (``measure._time_pair``, ``_time_with_control`` replaced), never by this
machine's clock; outputs are compared with stock ORT at ORT_DISABLE_ALL within ``TOL``.
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime
import pytest

import ortfuse
from ortfuse.fusion.report import FUSED
from ortfuse.tune import measure as measuring
from ortfuse.tune import tuner as tune
from ortfuse.tune.decisions import MODEL_LIMIT

from model_fixtures import ffn_inputs, ffn_matmul_add_relu
from timing_fixtures import raw_plans, raw_timing

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(tune.ENV, raising=False)


def _stated(monkeypatch, *pairs, noise: float = 0.0, plans: tuple | None = None):
    """``_time_pair`` and ``_time_with_control`` (the whole plan's looks and the whole-model check)
    return these (fused ms, ORT ms[, each repeat's ratio]) in turn, the latter as a timing whose
    control runs ``1 + noise`` times the first stock session in every pass (``timing_fixtures``);
    without the repeats, each repeat at the median's ratio. ``_time_plans`` (the candidate plans
    compared after an inconclusive whole plan) times every candidate as ``plans``, with the same
    noise; a test that states no ``plans`` fails if the candidates are timed."""
    calls = iter([(p[0], p[1], p[2] if len(p) > 2 else [p[0] / p[1]] * measuring.REPEATS) for p in pairs])
    monkeypatch.setattr(measuring, "_time_pair", lambda f, o, budget: next(calls))
    monkeypatch.setattr(measuring, "_time_with_control", lambda f, o, c, budget: raw_timing(*next(calls), noise=noise))

    def time_plans(runs, budget):
        if plans is None:
            pytest.fail("the candidate plans were timed on this machine's clock: state them (plans=)")
        return raw_plans([n for n in runs if n not in ("ort", "control")], *plans, noise=noise)

    monkeypatch.setattr(measuring, "_time_plans", time_plans)


def _stock(model, feeds):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_a_winning_whole_plan_keeps_every_match_with_its_kernel_and_constants(monkeypatch):
    _stated(monkeypatch, (0.5, 1.0))
    monkeypatch.setattr(measuring, "measure", lambda *a, **k: pytest.fail("measured the matches one by one"))
    monkeypatch.setattr(tune, "_rank", lambda *a, **k: pytest.fail("ranked the kernels after a winning plan"))
    model = ffn_matmul_add_relu()
    tuning = tune.tune(model, force=True)
    _, unconstrained = ortfuse.fuse(model)
    assert {tuple(m.nodes): m.kernel for m in unconstrained.fused} == \
        {tuple(d.nodes): d.kernel for d in tuning.decisions}
    assert all(d.keep and d.constants and "whole plan ran 0.500x" in d.reason for d in tuning.decisions)
    passes = 5 * measuring.REPEATS
    assert all(f"faster in {passes} of {passes} passes" in d.reason and "1 look(s)" in d.reason
               for d in tuning.decisions)
    assert tuning.model_check["passed"] and tuning.model_check["whole_plan"] and tuning.cacheable
    fused, report = ortfuse.fuse(model, keep=tuning.keep_rule(model))
    assert len(report.fused) == len(unconstrained.fused) == 2
    session = ortfuse.InferenceSession(model, fusion="auto")  # the cache: no measuring at creation
    assert session.fusion_report.applied and all(m.decision == FUSED for m in session.fusion_report.matches)
    feeds = ffn_inputs()
    for got, want in zip(session.run(None, feeds), _stock(model, feeds)):
        np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("ratio", [1.0, MODEL_LIMIT + 0.005])
def test_a_losing_whole_plan_falls_back_to_measuring_the_matches(monkeypatch, ratio):
    monkeypatch.setattr(measuring, "_best_of", lambda f, o, n: (1.0, 1.0))
    from ortfuse.tune import judge

    # the whole plan's looks until they hold judge.MIN_PASSES passes, then 2 matches and the check
    looks = math.ceil(judge.MIN_PASSES / (5 * measuring.REPEATS)) if ratio < 1 else 1
    _stated(monkeypatch, *[(ratio, 1.0)] * looks, (0.5, 1.0), (0.5, 1.0), (0.5, 1.0))
    model = ffn_matmul_add_relu()
    tuning = tune.tune(model, force=True)
    assert tuning.whole_plan is not None and tuning.whole_plan["ratio"] == pytest.approx(ratio)
    assert len(tuning.decisions) == 2 and all(d.fused_ms == 0.5 and d.ort_ms == 1.0 for d in tuning.decisions)
    assert tuning.model_check is not None and "whole_plan" not in tuning.model_check
    report = ortfuse.fuse(model, keep=tuning.keep_rule(model))[1]
    tuning.annotate(report)
    assert any(f"every match fused ran {ratio:.3f}x stock ORT as a whole" in n for n in report.notes), report.notes
    assert tune.Tuning.from_dict(tuning.to_dict()).whole_plan == tuning.whole_plan  # cached with the decisions


def test_a_whole_plan_whose_outputs_differ_is_not_kept(monkeypatch):
    monkeypatch.setattr(measuring, "_outputs_agree", lambda expected, got, precision: False)
    monkeypatch.setattr(measuring, "_best_of", lambda f, o, n: (2.5, 1.0))  # the matches lose clearly
    _stated(monkeypatch)  # no timing at all: the plan is refused before it is timed
    tuning = tune.tune(ffn_matmul_add_relu(), force=True)
    assert "outputs differ" in tuning.whole_plan["failure"]
    assert not any(d.keep for d in tuning.decisions) and len(tuning.decisions) == 2


def test_the_whole_plan_is_the_plan_a_session_runs(monkeypatch):
    """The timed plan goes through the layout step at the session's level and disables the ORT
    optimizers the fused report names, as ``runtime.planning`` does for the session."""
    from ortfuse.layout import planner

    seen: list = []
    real_layout = planner.plan_layout

    def spy(original, fused, sess_options, native, disabled=(), data=None):
        seen.append((sess_options.graph_optimization_level, set(disabled)))
        return real_layout(original, fused, sess_options, native, disabled, data)

    monkeypatch.setattr(planner, "plan_layout", spy)
    opened: list = []
    real_runner = measuring._fused_runner

    def runner(fused, sess_options, disabled=(), native=None):
        opened.append(set(disabled))
        return real_runner(fused, sess_options, disabled, native)

    monkeypatch.setattr(measuring, "_fused_runner", runner)
    _stated(monkeypatch, (0.5, 1.0))
    model = ffn_matmul_add_relu()
    tuning = tune.tune(model, force=True)
    assert tuning.model_check["whole_plan"]
    _, report = ortfuse.fuse(model)
    assert seen == [(onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, set(report.disabled_ort_optimizers))]
    assert opened == [set(report.disabled_ort_optimizers)]


MIXED = (0.95, 1.0, [0.9, 0.95, 1.02])  # a win in the median, lost in one repeat's passes: 10 of 15


@pytest.mark.parametrize("second, kept, looks", [
    ((0.9, 1.0), True, 2),  # a look that wins every pass settles it
    ((0.95, 1.0, [0.9, 0.95, 1.01]), True, 4),  # two thirds of the passes won, look after look: significant pooled
    ((0.98, 1.0, [0.9, 0.95, 0.98, 1.01, 1.02]), False, 4),  # three fifths won: never significant
])
def test_a_median_win_without_enough_winning_passes_is_looked_at_again(monkeypatch, second, kept, looks):
    """A first look that wins in the median without enough winning passes is timed again and judged
    on the looks pooled (``ortfuse.tune.judge``), at most ``judge.MAX_LOOKS`` looks; a plan still
    inconclusive then is not kept, and the matches are measured one by one (here: they lose)."""
    from ortfuse.tune import judge

    assert looks <= judge.MAX_LOOKS
    monkeypatch.setattr(measuring, "_best_of", lambda f, o, n: (2.5, 1.0))  # the matches lose clearly
    _stated(monkeypatch, MIXED, *[second] * (looks - 1), (0.5, 1.0), plans=second)
    tuning = tune.tune(ffn_matmul_add_relu(), force=True)
    check = tuning.model_check if kept else tuning.whole_plan
    later = len(second[2]) if len(second) > 2 else measuring.REPEATS
    assert check["looks"] == looks and check["passed"] is kept
    assert check["passes"] == 5 * (len(MIXED[2]) + (looks - 1) * later)
    assert all(d.keep for d in tuning.decisions) is kept and len(tuning.decisions) == 2


@pytest.mark.parametrize("noise, kept", [(0.01, True), (0.08, False)])
def test_a_whole_plan_must_win_beyond_the_stock_sessions_bias(monkeypatch, noise, kept):
    """0.95x stock ORT in every pass is a win when two stock sessions agree within 1% pass by pass,
    and no evidence when they differ by 8%: looked at again (0.95 again, as biased) up to
    ``judge.MAX_LOOKS`` looks, then the matches are measured one by one (here: they lose)."""
    from ortfuse.tune import judge

    monkeypatch.setattr(measuring, "_best_of", lambda f, o, n: (2.5, 1.0))  # the matches lose clearly
    looks = 1 if kept else judge.MAX_LOOKS
    _stated(monkeypatch, *[(0.95, 1.0)] * looks, noise=noise, plans=(0.95, 1.0))
    tuning = tune.tune(ffn_matmul_add_relu(), force=True)
    check = tuning.model_check if kept else tuning.whole_plan
    assert check["whole_plan"] and check["aa_ratio"] == pytest.approx(1 + noise) and check["passed"] is kept
    assert check["looks"] == looks
    assert all(d.keep for d in tuning.decisions) is kept and len(tuning.decisions) == 2
    if not kept:
        report = ortfuse.fuse(ffn_matmul_add_relu(), keep=tuning.keep_rule(ffn_matmul_add_relu()))[1]
        tuning.annotate(report)
        assert any("two stock sessions 1.080x pass by pass" in n and "beyond the stock sessions' bias" in n
                   for n in report.notes), report.notes


def test_the_control_is_a_second_stock_session_timed_in_the_same_rounds(monkeypatch):
    """``_time_with_control``: the three runs interleaved in the same rounds (the protocol's timing,
    stated per-run times), judged pass by pass: ORT's time the mean of both stock sessions'."""
    from ortfuse.tune import judge

    times = {"fused": 0.9, "ort": 1.0, "control": 1.1}
    order: list[str] = []

    def run(name):
        return lambda: order.append(name)

    monkeypatch.setattr(measuring.yielding, "measure", lambda runners, runs, repeats, warmup: {
        k: [[times[k]] * runs for _ in range(repeats)] for k in runners})
    raw = measuring._time_with_control(run("fused"), run("ort"), run("control"), 0.1)
    assert order == ["fused", "ort", "control"]  # each run once before timing, to size the passes
    verdict = judge.judge(raw, MODEL_LIMIT)
    assert verdict.fused_ms == pytest.approx(0.9) and verdict.ort_ms == pytest.approx(1.05)
    assert verdict.ratios == pytest.approx([0.9 / 1.05] * measuring.REPEATS) and verdict.noise == pytest.approx(0.1)
    assert verdict.aa_ratio == pytest.approx(1.1) and verdict.paired_ratio == pytest.approx(0.9 / 1.05)
