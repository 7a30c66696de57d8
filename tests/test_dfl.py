"""FusedDFL (custom_ops/native/ops/dfl.py) and its rule (ortfuse/fusion/rules/dfl.py): the native
kernel and the lowered form against ultralytics' DFL head (Reshape -> Transpose -> Softmax -> Conv
-> Reshape) run unfused by stock ORT at ORT_DISABLE_ALL, within |got - ref| <= 1e-4 * max(1,
max|ref|): sizes on and off the kernel's chunk of anchors, a batch, one bin, large logits (the
running maximum), NaN and infinities, and yolov8n's head in the whole model. The rule's matching
and near-miss examples run in tests/test_rules.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from native_sessions import one_op_session

import ortfuse
from ortfuse import fuse, models
from ortfuse.fusion.rules.dfl import _head, dfl

from pattern_graphs import run_stock

RTOL = 1e-4


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    tol = RTOL * max(1.0, float(np.nanmax(np.abs(ref))) if ref.size else 1.0)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), "NaN where the reference has none, or the reverse"
    finite = ~np.isnan(ref)
    diff = float(np.abs(got[finite] - ref[finite]).max()) if finite.any() else 0.0
    assert diff <= tol, f"max abs diff {diff:.3g} > {tol:.3g}"


def _session(model: onnx.ModelProto, kernels: str) -> onnxruntime.InferenceSession:
    fused, report = fuse(model, ["dfl"], kernels=kernels)
    assert [m.pattern_id for m in report.fused] == ["dfl"], report.table()
    ops = {n.op_type for n in fused.graph.node}
    native = kernels == "native"
    assert ("FusedDFL" in ops) == native and ("Softmax" in ops) == (not native), ops
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 2
    return ortfuse.InferenceSession(fused.SerializeToString(), so, fusion=False)


@pytest.mark.parametrize("bins, anchors, scale", [(16, 2100, 3.0), (16, 64, 3.0), (16, 37, 3.0), (8, 513, 2.0),
                                                   (17, 129, 3.0), (1, 70, 3.0), (16, 130, 60.0)])
@pytest.mark.parametrize("kernels", ["native", "lowered:dfl_last_axis"])
def test_fused_head_matches_stock(bins, anchors, scale, kernels):
    model = _head(bins=bins, anchors=anchors)
    x = (np.random.default_rng(bins + anchors).standard_normal((1, 4 * bins, anchors)) * scale).astype(np.float32)
    x[0, 0, :3] += 70.0  # a bin far above the others: exp(x) alone would overflow
    ref = run_stock(model, {"x": x})[0]
    _close(_session(model, kernels).run(None, {"x": x})[0], ref)


def test_native_kernel_on_a_batch_matches_the_reference_and_ort_softmax():
    x = (np.random.default_rng(1).standard_normal((3, 4, 16, 200)) * 4).astype(np.float32)
    w = np.random.default_rng(2).standard_normal(16).astype(np.float32)
    got = one_op_session("FusedDFL", ["x", "w"]).run(None, {"x": x, "w": w})[0]
    _close(got, dfl(x, w))
    probs = np.exp(x - x.max(axis=2, keepdims=True))
    probs /= probs.sum(axis=2, keepdims=True)
    assert got.shape == (3, 1, 4, 200) and abs(float(got[1, 0, 2, 7]) - float(probs[1, 2, :, 7] @ w)) < 1e-4


def test_nan_and_infinities_give_the_outputs_of_stock_ort():
    model = _head(bins=16, anchors=80)
    x = np.random.default_rng(3).standard_normal((1, 64, 80)).astype(np.float32)
    x[0, 5, 3] = np.nan      # side 0, anchor 3
    x[0, 20, 10] = np.inf    # side 1, anchor 10: inf - inf in the softmax
    x[0, 40, 11] = -np.inf   # side 2, anchor 11: a bin of probability 0
    ref = run_stock(model, {"x": x})[0]
    got = _session(model, "native").run(None, {"x": x})[0]
    assert np.isnan(ref[0, 0, 3]) and np.isnan(ref[0, 1, 10]) and np.isfinite(ref[0, 2, 11])
    _close(got, ref)


def test_no_anchors_gives_an_empty_output():
    x = np.zeros((1, 4, 16, 0), np.float32)
    got = one_op_session("FusedDFL", ["x", "w"]).run(None, {"x": x, "w": np.arange(16, dtype=np.float32)})[0]
    assert got.shape == (1, 1, 4, 0)


def test_weights_of_another_length_are_an_error_naming_the_shapes():
    sess = one_op_session("FusedDFL", ["x", "w"])
    with pytest.raises(Exception, match=r"FusedDFL: X must have rank 4 .* W the shape \[bins\]"):
        sess.run(None, {"x": np.zeros((1, 4, 16, 8), np.float32), "w": np.zeros(15, np.float32)})


@pytest.mark.slow
def test_yolov8n_head_is_one_fused_dfl_and_the_model_matches_stock():
    model = onnx.load(models.build("yolov8n"))
    fused, report = fuse(model)
    assert report.counts().get("dfl") == 1, report.table()
    assert not [n for n in fused.graph.node if n.op_type == "Softmax"]
    x = np.random.default_rng(0).uniform(0, 1, (1, 3, 320, 320)).astype(np.float32)
    ref = run_stock(model, {"images": x})[0]
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 2
    got = ortfuse.InferenceSession(model.SerializeToString(), so, fusion=True).run(None, {"images": x})[0]
    _close(got, ref)
