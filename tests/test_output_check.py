"""The check a tuned plan passes before a live swap (ortfuse.tune.output_check), and the tuning
process running it beside its own stock ORT session (ortfuse.runtime.tune_process._check), so the
serving process only warms the new session."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ortfuse.runtime import planning, tune_process
from ortfuse.tune import output_check

from model_fixtures import ffn_inputs, ffn_matmul_add_relu


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))


def _same(feed):
    return [feed["x"] * 2.0, np.array([1, 2])]


def test_equal_outputs_pass_and_each_kind_of_difference_is_named():
    feeds = [{"x": np.full((2, 3), v, np.float32)} for v in (1.0, 2.0)]
    names = ["y", "ids"]
    assert output_check.check_plan(_same, _same, feeds, names, bf16=False) == ""
    off = output_check.check_plan(_same, lambda f: [f["x"] * 2.01, np.array([1, 2])], feeds, names, bf16=False)
    assert off.startswith("the fused plan's output 'y' differs from stock ORT's on served feed 1 beyond rtol 0.001")
    shape = output_check.check_plan(_same, lambda f: [(f["x"] * 2.0)[:1], np.array([1, 2])], feeds, names, False)
    assert "output 'y' differs" in shape
    late = output_check.check_plan(_same, lambda f: [f["x"] * 2.0, np.array([1, 2 if f["x"][0, 0] < 2 else 3])],
                                   feeds, names, bf16=False)
    assert "output 'ids' differs from stock ORT's on served feed 2" in late

    def failing(feed):
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : a kernel failed")

    failed = output_check.check_plan(_same, failing, feeds, names, bf16=False)
    assert failed.startswith("the fused plan failed on served feed 1 (") and failed.endswith("kept stock ORT")


def test_tolerance_scales_with_the_outputs_magnitude_and_bf16_is_looser():
    want = [np.array([1000.0, 0.0], np.float32)]
    assert output_check.differing_output(["y"], want, [np.array([1000.0, 0.05], np.float32)], bf16=False) is None
    assert output_check.differing_output(["y"], want, [np.array([1000.0, 0.2], np.float32)], bf16=False) == "y"
    assert output_check.differing_output(["y"], want, [np.array([1000.0, 20.0], np.float32)], bf16=True) is None
    nan = [np.array([np.nan, 1.0], np.float32)]
    assert output_check.differing_output(["y"], nan, [np.array([np.nan, 1.0], np.float32)], bf16=False) is None
    assert output_check.differing_output(["y"], nan, [np.array([0.0, 1.0], np.float32)], bf16=False) == "y"
    assert output_check.differing_output(["s"], [[{"a": 1.0}]], [[{"a": 2.0}]], bf16=False) is None  # not a tensor


def test_the_tuning_process_checks_the_plan_against_its_own_stock_session(tmp_path):
    model = ffn_matmul_add_relu()
    source = model.SerializeToString()
    prepared = planning.prepare(source, None, True, None, mode="off")
    assert prepared.plan is not None
    feeds = [ffn_inputs(seed=i) for i in range(3)]
    for i, feed in enumerate(feeds):  # as tune() hands them over
        np.savez(tmp_path / f"check{i}.npz", **feed)
    read = tune_process._check_feeds(str(tmp_path))
    assert len(read) == 3 and all(np.array_equal(read[i][k], feeds[i][k]) for i in range(3) for k in feeds[i])
    assert tune_process._check(source, None, prepared, read) == ""
    other = onnx.ModelProto()
    other.CopyFrom(model)
    weight = next(t for t in other.graph.initializer if t.dims and len(t.dims) == 2)
    values = onnx.numpy_helper.to_array(weight) * 1.5  # a stock model that computes something else
    weight.CopyFrom(onnx.numpy_helper.from_array(values.astype(np.float32), weight.name))
    why = tune_process._check(other.SerializeToString(), None, prepared, read)
    assert "differs from stock ORT's on served feed 1" in why
