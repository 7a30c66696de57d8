"""The rule that judges a timed plan against stock ORT with its A/A control (``ortfuse.tune.judge``), and
the looks the whole plan and the whole-model check take (``measure._timed_verdict``).

Verdicts are driven by stated timings (``timing_fixtures``), never by this machine's clock.
"""

from __future__ import annotations

import math
import random

import numpy as np
import onnxruntime
import pytest

from ortfuse.foundation import protocol
from ortfuse.tune import judge
from ortfuse.tune import measure as measuring
from ortfuse.tune import tuner as tune
from ortfuse.tune.decisions import MODEL_LIMIT

from model_fixtures import ffn_inputs, ffn_matmul_add_relu
from timing_fixtures import raw_from_passes, raw_timing


def _tail(n: int, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2.0**n


@pytest.mark.parametrize("n", [1, 5, 8, 9, 15, 30, 45, 60, 180])
def test_sign_threshold_is_the_fewest_wins_a_fair_coin_reaches_with_at_most_alpha(n):
    k = protocol.sign_threshold(n, judge.ALPHA)
    if k <= n:
        assert _tail(n, k) <= judge.ALPHA < _tail(n, k - 1)
    else:  # not even n of n is that unlikely: no number of wins passes
        assert _tail(n, n) > judge.ALPHA and k == n + 1


def test_a_plan_faster_in_every_pass_passes():
    verdict = judge.judge(raw_timing(0.9, 1.0), MODEL_LIMIT)
    assert verdict.passed and not verdict.inconclusive
    assert verdict.wins == verdict.passes == 5 * measuring.REPEATS
    assert verdict.paired_ratio == pytest.approx(0.9) and verdict.ratio == pytest.approx(0.9)


def test_runs_slowed_by_other_work_move_only_their_passes():
    """A 0.88x plan timed while other work slows a random third of all runs 1.5-4x: each repeat's
    p50 ratio swings, and in one repeat the fused plan took most of the hits (so that repeat's
    median says "slower"); pass by pass it still wins clearly."""
    rng = random.Random(5)
    raw: dict[str, list[list[float]]] = {"fused": [], "ort": [], "control": []}
    for repeat in range(3):
        for name in raw:
            raw[name].append([])
        for _ in range(31):
            times = {"fused": 0.88, "ort": 1.0, "control": 1.0}
            hit = rng.random()
            if repeat == 2 and hit < 0.6:
                times["fused"] *= rng.uniform(1.5, 4.0)
            elif hit < 0.33:
                times[rng.choice(list(times))] *= rng.uniform(1.5, 4.0)
            for name, ms in times.items():
                raw[name][-1].append(ms)
    verdict = judge.judge(raw, MODEL_LIMIT)
    assert max(verdict.ratios) > 1  # the repeats' medians alone could not keep it
    assert verdict.passed and verdict.paired_ratio == pytest.approx(0.88)


def test_a_gain_within_the_bias_of_two_stock_sessions_is_no_evidence():
    biased = judge.judge(raw_timing(0.95, 1.0, noise=0.08), MODEL_LIMIT)
    assert not biased.passed and biased.wins == biased.passes and biased.aa_ratio == pytest.approx(1.08)
    assert judge.judge(raw_timing(0.95, 1.0, noise=0.01), MODEL_LIMIT).passed


@pytest.mark.parametrize("ratio", [1.0, MODEL_LIMIT + 0.005, 1.2])
def test_a_tie_or_a_loss_fails_and_takes_no_other_look(ratio):
    runs = math.ceil(judge.MIN_PASSES / measuring.REPEATS)
    verdict = judge.judge(raw_timing(ratio, 1.0, runs=runs), MODEL_LIMIT)
    assert not verdict.passed and not verdict.inconclusive


def test_few_passes_settle_no_loss_by_their_median_alone():
    """Above the limit in the median pass but faster in every pass, over fewer than ``MIN_PASSES``
    passes: looked at again; slower in every pass: a significant loss however few the passes."""
    few = raw_from_passes([MODEL_LIMIT + 0.005] * (judge.MIN_PASSES - 1))
    assert judge.judge(few, MODEL_LIMIT).inconclusive
    slower = raw_from_passes([1.05] * 9)
    assert not judge.judge(slower, MODEL_LIMIT).inconclusive and not judge.judge(slower, MODEL_LIMIT).passed


def test_a_median_win_without_enough_passes_is_inconclusive_and_pools_looks():
    mixed = raw_from_passes([0.9] * 6 + [1.05] * 3)  # 6 of 9 faster: chance gives that often
    first = judge.judge(mixed, MODEL_LIMIT)
    assert first.inconclusive and not first.passed and first.needed > first.wins == 6
    both = judge.pooled(mixed, raw_from_passes([0.9] * 15))
    assert len(both["fused"]) == 2 and judge.judge(both, MODEL_LIMIT).passed


def _state_looks(monkeypatch, *timings):
    """``_time_with_control`` returns ``timings`` in turn (then the last again); returns the call count."""
    calls = [0]

    def stated(f, o, c, budget):
        calls[0] += 1
        return timings[min(calls[0], len(timings)) - 1]

    monkeypatch.setattr(measuring, "_time_with_control", stated)
    return calls


def test_an_inconclusive_plan_is_timed_again_until_it_passes(monkeypatch):
    calls = _state_looks(monkeypatch, raw_from_passes([0.9] * 6 + [1.05] * 3), raw_from_passes([0.9] * 15))
    verdict, looks = measuring._timed_verdict((None, None, None), 1.0)
    assert verdict.passed and looks == calls[0] == 2 and verdict.passes == 24


def test_an_inconclusive_plan_stops_after_max_looks(monkeypatch):
    calls = _state_looks(monkeypatch, raw_from_passes([0.9, 1.05] * 4 + [0.9]))
    verdict, looks = measuring._timed_verdict((None, None, None), 1.0)
    assert not verdict.passed and verdict.inconclusive and looks == calls[0] == judge.MAX_LOOKS


def test_the_whole_model_check_times_the_kept_plan_against_two_stock_sessions(monkeypatch, tmp_path):
    """``_check_model``: the three runs it times are the fused model and two stock sessions that
    compute what stock ORT does; the check records the A/A figures and the verdict."""
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    seen = []

    def spy(fused_run, ort_run, control_run, budget):
        seen.append([run() for run in (fused_run, ort_run, control_run)])
        return raw_timing(0.95, 1.0, noise=0.08)

    monkeypatch.setattr(measuring, "_time_with_control", spy)
    model, feeds = ffn_matmul_add_relu(), ffn_inputs()
    tuning = tune.Tuning({})
    tuning.decisions = []  # keep_rule of no decision: nothing kept, the check still times the model
    check = measuring._check_model(model, None, tuning, onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, 2, feeds)
    assert len(seen) == check["looks"] == judge.MAX_LOOKS  # a 0.95 within an 8% bias, in every look
    fused, stock, control = seen[0]
    for a, b, c in zip(fused, stock, control):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(b, c)
    assert not check["passed"] and check["aa_ratio"] == pytest.approx(1.08) and check["wins"] == check["passes"]
