"""Sample inputs for tuning stay within a stated budget (ortfuse.ir.feeds.SAMPLE_BUDGET_BYTES): the
dims nobody gave shrink (the batch first, then the others evenly), dims the model fixes or the user
gives are kept, the choice is reported, and the tuning key holds the shapes the feeds were made at.

The models here have no fusion candidate (one Neg), so tuning makes its feeds and returns at once:
what is checked is the memory the feeds take, with a spy on ``feeds.random_feeds`` recording the
arrays every caller got. A model with four dynamic dims at 128 each would take 128**4 floats = 1 GiB.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortfuse
from ortfuse.foundation.session_options import DIMS_KEY, TUNE_KEY
from ortfuse.ir import feeds
from ortfuse.tune import tuner as tune

BUDGET = feeds.SAMPLE_BUDGET_BYTES
FOUR_DYNAMIC = [1, "a", "b", "c", "d"]
FOUR_AT_64 = {"x": [1, 64, 64, 64, 64]}  # 64**4 floats = 64 MiB: the largest common size within the budget


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(tune.ENV, raising=False)


@pytest.fixture
def made(monkeypatch) -> list[dict[str, np.ndarray]]:
    """Every set of sample arrays ``feeds.random_feeds`` returns, in order (the real function runs)."""
    calls: list[dict[str, np.ndarray]] = []
    real = feeds.random_feeds

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(dict(out))
        return out

    monkeypatch.setattr(feeds, "random_feeds", spy)
    return calls


def neg_model(dims: list) -> onnx.ModelProto:
    """y = -x on a float input of ``dims`` (ints fixed, strings dynamic): no fusion candidate."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"], name="neg")], "neg", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _shapes(arrays: dict[str, np.ndarray]) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in arrays.items()}


def _nbytes(arrays: dict[str, np.ndarray]) -> int:
    return sum(v.nbytes for v in arrays.values())


def _stock(path: str, feed: dict) -> list:
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feed)


def _sync_session(path: str, dims: str = ""):
    so = onnxruntime.SessionOptions()
    so.add_session_config_entry(TUNE_KEY, "sync")  # measured while the session is created
    if dims:
        so.add_session_config_entry(DIMS_KEY, dims)
    return ortfuse.InferenceSession(path, so, fusion="auto")


# --------------------------------------------------------------------------- the rule


def test_the_batch_shrinks_first_then_the_other_dims_evenly():
    declared = [("x", TensorProto.FLOAT, ["n", "seq", None]), ("mask", TensorProto.INT64, ["n", "seq"])]
    # 4 rows of x: 4 * (128*128*4 + 128*8) = 266240 bytes; the batch alone brings it within 300 KB
    plan = feeds.sample_shapes(declared, batch=16, budget=300_000)
    assert plan.shapes == {"x": [4, 128, 128], "mask": [4, 128]} and plan.nbytes <= 300_000
    assert plan.chosen == {"batch": 4, "seq": 128, "x[2]": 128}
    # at batch 1 still over 30 KB: seq and the unnamed dim share one cap (seq the same in both inputs)
    plan = feeds.sample_shapes(declared, batch=16, budget=30_000)
    assert plan.chosen == {"batch": 1, "seq": 85, "x[2]": 85}
    assert plan.shapes == {"x": [1, 85, 85], "mask": [1, 85]}
    assert plan.nbytes == 85 * 85 * 4 + 85 * 8 <= 30_000 < 86 * 86 * 4 + 86 * 8  # the largest common size
    assert "batch=1, seq=85, x[2]=85" in plan.note and "the batch shrinks first" in plan.note
    # the feeds are made at the chosen shapes
    assert _shapes(feeds.random_feeds(declared, shapes=plan.shapes)) == plan.shapes


def test_defaults_within_the_budget_are_unchanged_and_unremarked():
    declared = [("ids", TensorProto.INT64, ["batch", "seq"])]
    plan = feeds.sample_shapes(declared)
    assert plan.shapes == {"ids": [1, feeds.DEFAULT_DIM]} and plan.note == ""
    assert plan.shapes["ids"] == feeds.concrete_shape(declared[0][2], 1)


def test_dims_the_user_gives_are_kept_and_said_to_exceed_the_budget():
    declared = [("x", TensorProto.FLOAT, ["n", "a", "b"])]
    plan = feeds.sample_shapes(declared, named={"a": 8192, "b": 4096})
    assert plan.shapes == {"x": [1, 8192, 4096]}  # 128 MiB: the batch is the only dim left to shrink
    assert plan.note.startswith("the dims you gave (a=8192, b=4096) make sample inputs of 128 MiB, over the "
                                "64 MiB budget of sample inputs; they are kept as given")
    pinned = feeds.sample_shapes(declared, named={"batch": 64})  # 64 * 128 * 128 floats = 4 MiB: fits
    assert pinned.shapes == {"x": [64, 128, 128]} and pinned.note == ""
    pinned = feeds.sample_shapes(declared, named={"batch": 2048})  # the other dims shrink around it
    assert pinned.shapes == {"x": [2048, 90, 90]} and pinned.nbytes <= BUDGET < 2048 * 91 * 91 * 4
    assert "a=90, b=90" in pinned.note


# --------------------------------------------------------------------------- the tuner, a session, the commands


def test_sync_auto_session_with_four_dynamic_dims_makes_feeds_within_the_budget(tmp_path, made):
    path = str(tmp_path / "four.onnx")
    onnx.save(neg_model(FOUR_DYNAMIC), path)
    session = _sync_session(path)
    assert [_shapes(m) for m in made] == [FOUR_AT_64]  # not 128**4 floats (1 GiB)
    assert _nbytes(made[0]) <= BUDGET
    notes = session.fusion_report.notes
    assert any(n.startswith("auto: sample inputs shrunk to fit the 64 MiB budget of sample inputs: "
                            "a=64, b=64, c=64, d=64 (") and "would take 1 GiB" in n for n in notes), notes
    # the decisions are cached under the shapes the feeds had
    cached = tune.tune(onnx.load(path), measure=False)
    assert cached.from_cache and cached.key["inputs"] == FOUR_AT_64
    feed = {"x": np.random.default_rng(0).standard_normal((1, 3, 4, 5, 6)).astype(np.float32)}
    np.testing.assert_array_equal(session.run(None, feed)[0], _stock(path, feed)[0])


def test_dims_a_session_names_are_kept_and_their_excess_reported(tmp_path):
    path = str(tmp_path / "four.onnx")
    onnx.save(neg_model(FOUR_DYNAMIC), path)
    so = onnxruntime.SessionOptions()
    so.add_session_config_entry(DIMS_KEY, "a=128,b=128,c=128,d=128")
    tuning = tune.tune(onnx.load(path), sess_options=so, measure=False)  # shapes only: nothing allocated
    assert tuning.key["inputs"] == {"x": [1, 128, 128, 128, 128]}
    assert tuning.sample_note.startswith("the dims you gave (a=128, b=128, c=128, d=128) make sample inputs of "
                                         "1 GiB, over the 64 MiB budget")
    so.add_session_config_entry(DIMS_KEY, "a=128")  # one dim given, the other three shrink around it
    assert tune.tune(onnx.load(path), sess_options=so, measure=False).key["inputs"] == {"x": [1, 128, 50, 50, 50]}


def test_fixed_dims_over_the_budget_run_as_stock_ort_with_the_reason(tmp_path, made):
    dims = [2, 2048, 4100]  # 64.1 MiB of float32, fixed: the model runs on nothing smaller
    path = str(tmp_path / "fixed.onnx")
    onnx.save(neg_model(dims), path)
    session = _sync_session(path)
    assert [_shapes(m) for m in made] == [{"x": dims}]
    report = session.fusion_report
    assert not report.applied
    assert ("auto: the dims the model fixes make sample inputs of 64.1 MiB, over the 64 MiB budget of sample "
            "inputs; they are made at those dims, the least the model runs on") in report.notes, report.notes
    feed = {"x": np.random.default_rng(1).standard_normal(dims).astype(np.float32)}
    np.testing.assert_array_equal(session.run(None, feed)[0], _stock(path, feed)[0])


def test_tune_command_makes_and_reports_feeds_within_the_budget(tmp_path, capsys, made):
    from ortfuse.cli import main

    path = str(tmp_path / "four.onnx")
    onnx.save(neg_model(FOUR_DYNAMIC), path)
    assert main(["tune", path, "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["key"]["inputs"] == FOUR_AT_64
    assert "a=64, b=64, c=64, d=64" in doc["sample_note"] and "would take 1 GiB" in doc["sample_note"]
    assert "note: sample inputs shrunk to fit the 64 MiB budget" in err
    # the stock-ORT check and the tuner each made their feeds at those shapes, within the budget
    assert [_shapes(m) for m in made] == [FOUR_AT_64, FOUR_AT_64]
    assert all(_nbytes(m) <= BUDGET for m in made)
    # a batch asked for is kept: 2 * 64**4 floats is over the budget, so the other dims shrink further
    batched = str(tmp_path / "batched.onnx")
    onnx.save(neg_model(["n", "a", "b", "c", "d"]), batched)
    made.clear()
    assert main(["tune", batched, "--batch", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key"]["inputs"] == {"x": [2, 53, 53, 53, 53]}  # 53**4 < 2**23
    assert [_shapes(m) for m in made] == [{"x": [2, 53, 53, 53, 53]}] * 2


def test_annotate_tune_makes_and_reports_feeds_within_the_budget(tmp_path, capsys, made):
    from ortfuse.cli import annotate_main
    from ortfuse.ir import metadata

    path = str(tmp_path / "four.onnx")
    onnx.save(neg_model(FOUR_DYNAMIC), path)
    assert annotate_main([path, "--all", "--tune"]) == 0
    assert "note: sample inputs shrunk to fit the 64 MiB budget of sample inputs: a=64, b=64, c=64, d=64" \
        in capsys.readouterr().out
    assert [_shapes(m) for m in made] == [FOUR_AT_64]
    written = json.loads(metadata.read_props(onnx.load(path))[metadata.AUTO_DECISIONS])
    assert written["key"]["inputs"] == FOUR_AT_64
