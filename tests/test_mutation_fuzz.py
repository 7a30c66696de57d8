"""Mutated models (tests/mutation_models.py): dropped nodes, wrong attribute types, shape lies in
value_info and graph inputs / outputs, swapped inputs, bad initializers, other opsets, duplicated
names, cycles. Stock ORT and ortfuse(fusion=True) must agree: equal outputs (rtol 1e-4, atol 1e-5
x max(1, max|ref|), against stock ORT at ORT_DISABLE_ALL) or the same exception class; never a crash
or hang, whether run by ``run``, ORT's parallel executor or ``run_async``. Seeded (derandomize, no
database) so CI sees the same cases every run; long campaigns: tools/fuzz_campaign.py, whose crash
fixtures (tests/fixtures/crashes/) are replayed here."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mutation_models import EXECUTIONS, MUTATIONS, HypothesisChooser, base_model, compare, mutate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAMPAIGN = os.path.join(ROOT, "tools", "fuzz_campaign.py")
FIXTURES = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "crashes", "*.onnx")))
EXAMPLES_PER_KIND = 5  # x 20 mutation kinds = 100 cases, spread over the xdist workers
FUZZ = settings(max_examples=EXAMPLES_PER_KIND, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("kind", MUTATIONS)
def test_mutated_models_agree_with_stock_ort(kind):
    """Models mutated with ``kind`` (then, half the time, one more random mutation): the same outcome
    as stock ORT. Each kind is its own test, so every mutation is exercised, seeded."""
    seen = Counter()

    @FUZZ
    @given(st.data())
    def one(data):
        c = HypothesisChooser(data)
        model, feeds, desc = base_model(c)
        model, feeds, what = mutate(c, model, feeds, kind)
        steps = [desc, what]
        if c.choice([False, True]):
            model, feeds, what = mutate(c, model, feeds, c.choice(MUTATIONS))
            steps.append(what)
        execution = c.choice(EXECUTIONS)
        steps.append(f"execution {execution}")
        verdict = compare(model.SerializeToString(), feeds, execution)
        seen[verdict.kind] += 1
        seen["fused"] += verdict.fused
        assert verdict.kind != "mismatch", f"{' | '.join(steps)}: {verdict.detail}"

    one()
    assert sum(seen[k] for k in ("both_ok", "both_raised")) == EXAMPLES_PER_KIND, seen
    # not vacuous: unmutated models run and get fused; dangling inputs make both sides raise
    if kind == "none":
        assert seen["both_ok"] >= 2 and seen["fused"] >= 1, seen
    if kind == "drop_node":
        assert seen["both_raised"] >= 2, seen


def test_campaign_fixtures_replay_cleanly():
    """Every model that once crashed, hung or mismatched in a campaign now gives stock ORT's outcome (one
    subprocess replays them all, so that a regression is a failed test, not a dead test process)."""
    result = subprocess.run([sys.executable, CAMPAIGN, "--replay-file", *FIXTURES], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for path in FIXTURES:
        assert "verdict: both_" in result.stdout and f"[{os.path.basename(path)}]" in result.stdout, path
    verdicts = [line for line in result.stdout.splitlines() if line.startswith("verdict: ")]
    assert len(verdicts) == len(FIXTURES) and all(v.startswith("verdict: both_") for v in verdicts), verdicts


def test_fixture_folder_holds_the_known_regressions():
    """The replay above is not vacuous: the fixtures of the known hangs, crash and mismatch are there."""
    names = {os.path.basename(p) for p in FIXTURES}
    assert {"hang_duplicate_definition.onnx", "hang_self_loop.onnx",
            "crash_reference_kernel_broadcast_error.onnx", "mismatch_hardsigmoid_alpha_inf.onnx"} <= names, names


def test_campaign_catches_a_segfault_and_a_hang(tmp_path):
    """The campaign's isolation is real: a worker that segfaults (SIGSEGV) on case 0 is recorded with
    that case's seed and its model saved as a fixture; a fresh worker takes case 1, which hangs past
    the time limit and is recorded and saved the same way."""
    env = dict(os.environ, ORTFUSE_FUZZ_SELFTEST_SEGFAULT="0", ORTFUSE_FUZZ_SELFTEST_HANG="1",
               ORTFUSE_FUZZ_NO_WARMUP="1")
    summary = tmp_path / "summary.json"
    result = subprocess.run([sys.executable, CAMPAIGN, "--cases", "2", "--seed", "0", "--workers", "1",
                             "--timeout", "3", "--save-dir", str(tmp_path / "crashes"),
                             "--mismatch-dir", str(tmp_path / "mismatches"),
                             "--json", str(summary)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(summary.read_text())
    assert data["cases_tried"] == 2 and data["crashes"] == 1 and data["hangs"] == 1, data
    kinds = {p["seed"]: p["kind"] for p in data["problems"]}
    assert kinds == {0: "crash", 1: "hang"}, kinds
    crash = next(p for p in data["problems"] if p["kind"] == "crash")
    assert "status -11" in crash["detail"], crash["detail"][:500]  # killed by SIGSEGV
    assert sorted(os.listdir(tmp_path / "crashes")) == ["crash_0.npz", "crash_0.onnx", "crash_0.txt",
                                                        "hang_1.npz", "hang_1.onnx", "hang_1.txt"]
    assert "cases tried 2" in result.stdout and "crashes 1, hangs 1" in result.stdout
