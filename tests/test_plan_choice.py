"""The choice among candidate whole-model plans (``ortfuse.tune.plan_choice``) and the tuner's use of
it (``tuner._best_plan``), driven by stated timings (``tests/timing_fixtures.py`` style: ms per
configuration, per repeat, per pass), never by this machine's clock."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

import ortfuse
from ortfuse.tune import judge, plan_choice
from ortfuse.tune import measure as measuring
from ortfuse.tune import tuner as tune
from ortfuse.tune.decisions import MODEL_LIMIT, Decision, Tuning, constants_digester

from model_fixtures import ffn_inputs, ffn_matmul_add_relu

RNG = np.random.default_rng(0)


def stated(ratios: dict[str, float], passes: int = 30, aa: float = 1.0, jitter: float = 0.0, seed: int = 0) -> dict:
    """One repeat of ``passes`` passes: each candidate ``ratios[name]`` times stock ORT (1 ms) in every
    pass, the control ``aa`` times it; ``jitter``: each run times a uniform factor in 1 +- jitter."""
    rng = np.random.default_rng(seed)

    def runs(scale: float) -> list[list[float]]:
        return [[scale * (1 + jitter * (2 * rng.random() - 1)) for _ in range(passes)]]

    raw = {"ort": runs(1.0), "control": runs(aa)}
    raw.update({name: runs(r) for name, r in ratios.items()})
    return raw


def test_the_faster_of_two_plans_faster_than_stock_is_kept():
    choice = plan_choice.choose(stated({"all": 0.85, "some": 0.78}), ["all", "some"], MODEL_LIMIT)
    assert choice.best == "some" and not choice.inconclusive
    assert choice.versus["all"] == pytest.approx(0.85 / 0.78)
    choice = plan_choice.choose(stated({"all": 0.78, "some": 0.85}), ["all", "some"], MODEL_LIMIT)
    assert choice.best == "all"


def test_no_plan_is_kept_when_none_is_faster_than_stock():
    """Faster than each other, both slower than stock ORT: nothing kept (never worse than stock)."""
    choice = plan_choice.choose(stated({"all": 1.10, "some": 1.04}), ["all", "some"], MODEL_LIMIT)
    assert choice.best is None and not choice.verdicts["some"].passed
    # one faster than stock, one slower but "better" by no measure: the faster-than-stock one
    choice = plan_choice.choose(stated({"all": 1.10, "some": 0.9}), ["all", "some"], MODEL_LIMIT)
    assert choice.best == "some"


def test_a_gain_within_the_aa_bias_is_not_a_win():
    """A 1.5% median gain where two stock sessions differ by 3%: no evidence, not kept."""
    choice = plan_choice.choose(stated({"all": 0.985}, aa=1.03), ["all"], MODEL_LIMIT)
    assert choice.best is None


def test_a_tie_within_the_aa_bias_keeps_the_preferred_plan():
    choice = plan_choice.choose(stated({"all": 0.80, "some": 0.795}, aa=1.01), ["all", "some"], MODEL_LIMIT)
    assert choice.best == "all" and not choice.inconclusive
    # over fewer passes than judge.MIN_PASSES the bias is no evidence of a tie: more passes are asked for
    # (runs jittered +-5%: neither plan beats the other in significantly many passes)
    few = plan_choice.choose(stated({"all": 0.80, "some": 0.795}, aa=1.01, passes=judge.MIN_PASSES - 1,
                                    jitter=0.05, seed=4), ["all", "some"], MODEL_LIMIT)
    assert few.inconclusive and few.best is not None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_small_difference_in_noisy_passes_takes_more_looks_and_then_resolves(seed):
    """A 4% gain of one plan over another, every run jittered by +-10%: one look of 12 passes leaves it
    open; the looks pooled (as ``measure.compare_plans`` pools them: 12 passes, then 30 a look, at
    most ``judge.MAX_LOOKS``) settle it for the faster one."""
    names = ["all", "some"]
    first = stated({"all": 0.80, "some": 0.768}, passes=12, jitter=0.10, seed=seed)
    assert plan_choice.choose(first, names, MODEL_LIMIT).inconclusive
    pooled, looks = first, 1
    choice = plan_choice.choose(pooled, names, MODEL_LIMIT)
    while choice.inconclusive and looks < judge.MAX_LOOKS:
        pooled = judge.pooled(pooled, stated({"all": 0.80, "some": 0.768}, passes=30, jitter=0.10,
                                             seed=seed + 100 * looks))
        choice, looks = plan_choice.choose(pooled, names, MODEL_LIMIT), looks + 1
    assert not choice.inconclusive and choice.best == "some" and looks > 1


def _tuner_with(monkeypatch, by_match_keeps: bool, timings: dict[str, float]):
    """The tuner on the FFN model (two matches) with every timing stated: the whole plan alone misses
    the evidence (a 2% median gain within a 5% A/A bias), one match is kept by its own measurement (or none), and the
    candidate plans time as ``timings`` say (ratio to stock ORT; 'ort' and 'control' 1.0)."""
    monkeypatch.setattr(tune.ranking, "enabled", lambda: False)
    from timing_fixtures import raw_timing

    monkeypatch.setattr(measuring, "_time_with_control", lambda f, o, c, budget: raw_timing(0.98, 1.0, noise=0.05))

    def measure(model, ids, level, threads, sample, key, *args, **kwargs):
        assert kwargs.get("check") is False  # the candidates' timing is the whole-model check
        _, report = ortfuse.fuse(model, ids)
        first, digest = report.fused[0], constants_digester(model)
        tuning = Tuning(key)
        tuning.decisions = [Decision(r.pattern_id, list(r.nodes), by_match_keeps and r is first, "stated",
                                     kernel=r.kernel, constants=digest(list(r.nodes))) for r in report.fused]
        return tuning

    monkeypatch.setattr(measuring, "measure", measure)
    seen: list[set] = []

    def time_plans(runs, budget):
        seen.append(set(runs))
        ratios = {k: timings.get(k, 1.0) for k in runs if k not in ("ort", "control")}
        return stated(ratios, passes=30)

    monkeypatch.setattr(measuring, "_time_plans", time_plans)
    return seen


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(tune.ENV, raising=False)


def test_the_tuner_keeps_the_plan_of_the_matches_kept_one_by_one_when_it_is_the_fastest(monkeypatch):
    seen = _tuner_with(monkeypatch, True, {tune.ALL_FUSED: 0.95, tune.BY_MATCH: 0.90})
    tuning = tune.tune(ffn_matmul_add_relu(), force=True)
    assert seen and {tune.ALL_FUSED, tune.BY_MATCH, "ort", "control"} <= seen[0]
    assert [d.keep for d in tuning.decisions].count(True) == 1
    assert tuning.model_check["passed"] and tuning.choice["best"] == tune.BY_MATCH


def test_the_tuner_keeps_every_match_when_that_plan_is_the_fastest(monkeypatch):
    _tuner_with(monkeypatch, True, {tune.ALL_FUSED: 0.85, tune.BY_MATCH: 0.95})
    model = ffn_matmul_add_relu()
    tuning = tune.tune(model, force=True)
    assert all(d.keep for d in tuning.decisions) and len(tuning.decisions) == 2
    assert tuning.model_check["passed"] and tuning.choice["best"] == tune.ALL_FUSED
    session = ortfuse.InferenceSession(model, fusion="auto")  # the cached decisions make the session's plan
    assert sorted(m.pattern_id for m in session.fusion_report.fused) == ["add_relu", "gemm_act"]
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    stock = onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = ffn_inputs(seed=3)
    for got, want in zip(session.run(None, feeds), stock.run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_tuner_keeps_nothing_when_no_candidate_beats_stock(monkeypatch):
    _tuner_with(monkeypatch, True, {tune.ALL_FUSED: 1.02, tune.BY_MATCH: 1.01})
    tuning = tune.tune(ffn_matmul_add_relu(), force=True)
    assert not tuning.model_check["passed"] and tuning.choice["best"] is None
    session = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion="auto")
    assert not session.fusion_report.applied
