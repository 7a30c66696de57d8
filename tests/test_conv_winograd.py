"""Winograd F(4x4, 3x3) convolution on NCHWc blocks (custom_ops/kernels/winograd.py, the native
FusedWinogradConvBlocked, ortfuse/layout/winograd.py). Numerics: against the float64 numpy
reference and against stock ORT at ORT_DISABLE_ALL, |got - ref| <= 1e-4 * max(1, max|ref|) (the
Winograd transforms round differently from a direct convolution: measured about 1e-5 here)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from native_sessions import from_blocked, one_op_session, to_blocked
from onnx import helper, numpy_helper

import ortfuse
from ortfuse.custom_ops.kernels.conv_filters import conv3x3_reference as reference
from ortfuse.custom_ops.kernels.conv_filters import transform_filter
from ortfuse.layout import winograd
from ortfuse.layout.probe import block_size

from model_fixtures import disable_all_outputs, fan_in_weights, stock_conv_act

OP = winograd.OP
TOL = 1e-4
InvalidArgument = onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument


def _close(got, ref) -> float:
    return float(np.abs(got - ref).max()) / max(1.0, float(np.abs(ref).max()))


def _session(block: int, act: str = "", alpha: float | None = None, residual: bool = False):
    attrs: dict = {"block": block, **({"activation": act} if act else {}), **({"alpha": alpha} if alpha else {})}
    return one_op_session(winograd.OP_ADD if residual else OP, "xubr" if residual else "xub", **attrs)






def _data(n, cin, cout, h, w, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    wt = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32)
    return x, wt, rng.standard_normal(cout).astype(np.float32)


# border tiles on every side, one tile, images narrower than a tile, batches, channel splits
SHAPES = [(8, 1, 16, 24, 9, 11), (8, 2, 32, 8, 4, 4), (16, 1, 32, 48, 13, 6), (8, 1, 8, 8, 1, 1),
          (8, 1, 64, 64, 3, 37), (8, 1, 64, 128, 10, 10), (8, 2, 16, 16, 21, 5), (8, 1, 96, 24, 40, 40)]


@pytest.mark.parametrize("block, n, cin, cout, h, w", SHAPES)
@pytest.mark.parametrize("act", ["", "relu", "quick_gelu"])
def test_kernel_matches_the_float64_reference(block, n, cin, cout, h, w, act):
    x, wt, b = _data(n, cin, cout, h, w, seed=cin + h)
    alpha = 1.702 if act == "quick_gelu" else None
    y = _session(block, act, alpha).run(None, {"x": to_blocked(x, block), "u": transform_filter(wt), "b": b})[0]
    assert y.shape == (n, cout, h, w)
    ref = reference(x, wt, b)
    if act == "relu":
        ref = np.maximum(ref, 0)
    elif act == "quick_gelu":
        ref = ref / (1 + np.exp(-1.702 * ref))
    assert _close(from_blocked(y, block), ref) <= TOL


@pytest.mark.parametrize("block, n, cin, cout, h, w", [SHAPES[0], SHAPES[2], SHAPES[5]])
@pytest.mark.parametrize("act", ["relu", "quick_gelu"])
def test_residual_is_added_after_the_epilogue(block, n, cin, cout, h, w, act):
    """FusedWinogradConvAddBlocked: act(conv + B) + R, R blocked like Y."""
    x, wt, b = _data(n, cin, cout, h, w, seed=cin + w)
    r = np.random.default_rng(9).standard_normal((n, cout, h, w)).astype(np.float32)
    alpha = 1.0 if act == "quick_gelu" else None
    feeds = {"x": to_blocked(x, block), "u": transform_filter(wt), "b": b, "r": to_blocked(r, block)}
    y = _session(block, act, alpha, residual=True).run(None, feeds)[0]
    ref = reference(x, wt, b)
    ref = np.maximum(ref, 0) if act == "relu" else ref / (1 + np.exp(-ref))
    assert _close(from_blocked(y, block), ref + r) <= TOL


@pytest.mark.parametrize("r_shape", [(1, 16, 4, 5), (1, 8, 4, 4), (2, 16, 4, 4), (16, 4, 4)])
def test_residual_of_another_shape_is_an_ort_error(r_shape):
    feeds = {"x": np.ones((1, 16, 4, 4), np.float32), "u": np.ones((36, 16, 16), np.float32),
             "b": np.ones(16, np.float32), "r": np.ones(r_shape, np.float32)}
    with pytest.raises(InvalidArgument, match="R must have the shape of the output"):
        _session(8, "relu", residual=True).run(None, feeds)


@pytest.mark.parametrize("act", ["", "relu", "quick_gelu"])
def test_kernel_matches_stock_ort(act):
    x, wt, b = _data(1, 64, 80, 20, 20, seed=3)
    y = _session(8, act, 1.0 if act == "quick_gelu" else None).run(
        None, {"x": to_blocked(x, 8), "u": transform_filter(wt), "b": b})[0]
    assert _close(from_blocked(y, 8), stock_conv_act(x, wt, b, act, pads=[1, 1, 1, 1])) <= TOL


@pytest.mark.parametrize("block, x_shape, u_shape, b_shape, text", [
    (8, (1, 16, 4, 4), (36, 8, 16), (16,), "U the shape"),
    (8, (1, 16, 4, 4), (16, 16, 16), (16,), "U the shape"),
    (8, (1, 16, 4, 4), (36, 16, 16), (8,), "B the shape"),
    (8, (16, 4, 4), (36, 16, 16), (16,), "X must have rank 4"),
    (8, (1, 16, 4, 4), (36, 16, 12), (12,), "block must be 8 or 16"),
    (4, (1, 16, 4, 4), (36, 16, 16), (16,), "block must be 8 or 16"),
])
def test_kernel_refuses_other_shapes_with_an_ort_error(block, x_shape, u_shape, b_shape, text):
    feeds = {"x": np.ones(x_shape, np.float32), "u": np.ones(u_shape, np.float32), "b": np.ones(b_shape, np.float32)}
    with pytest.raises(InvalidArgument, match=text):
        _session(block).run(None, feeds)
    feeds["x"] = feeds["x"].astype(np.float64)
    with pytest.raises(InvalidArgument, match=r"expected: \(tensor\(float"):
        _session(8).run(None, feeds)


def test_unblock_filter_reads_orts_blocked_filter(tmp_path):
    """ORT's NCHWc filter (as it saves it) unblocks to the model's filter, value for value."""
    block = block_size()
    if block not in (8, 16):
        pytest.skip(f"ORT has no NCHWc block of 8 or 16 on this CPU (block {block})")
    x, wt, b = _data(1, 2 * block, 3 * block, 6, 6)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w0"], ["x1"]),
                               helper.make_node("Conv", ["x1", "w", "b"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.eye(2 * block, dtype=np.float32)[:, :, None, None], "w0"),
                               numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b")])
    so = onnxruntime.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    onnxruntime.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                 .SerializeToString(), so)
    opt = onnx.load(so.optimized_model_filepath)
    inits = {t.name: t for t in opt.graph.initializer}
    convs = [n for n in opt.graph.node if n.op_type == "Conv" and n.domain == winograd.NCHWC]
    found = [winograd._candidate(n, inits, block) for n in convs]
    assert sum(f is not None for f in found) == 1  # the 1x1 conv is not a candidate
    assert np.array_equal(next(f for f in found if f is not None), wt)


def _silu_model(c: int = 32, size: int = 24) -> onnx.ModelProto:
    """Conv 1x1 -> Conv 3x3 + SiLU (Sigmoid, Mul) -> Conv 3x3 + Relu -> Concat with its input (a
    region op, so the layout step runs)."""
    w = fan_in_weights(7)

    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Conv", ["a", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["m1"]),
             helper.make_node("Conv", ["m1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Concat", ["r2", "m1"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3"], ["y"])]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, size, size])
    graph = helper.make_graph(nodes, "g", [x],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, size, size])],
                              [w("w0", c, 16, 1, 1), w("w1", c, c, 3, 3), w("b1", c), w("w2", c, c, 3, 3), w("b2", c),
                               w("w3", 8, 2 * c, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", ["on", "off"])
def test_layout_runs_3x3_convs_as_winograd_when_told(tmp_path, monkeypatch, mode):
    """ORTFUSE_WINOGRAD=on replaces both 3x3 convs (SiLU and Relu folded), off none; outputs as stock."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    monkeypatch.setenv(winograd.ENV, mode)
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    model = _silu_model()
    x = np.random.default_rng(1).standard_normal((1, 16, 24, 24)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})[0]
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    if mode == "on":
        assert "2 3x3 conv(s) as Winograd" in note and "1 with quick_gelu" in note and "1 with relu" in note, note
    else:
        assert "Winograd" not in note, note
    assert _close(sess.run(None, {"x": x})[0], ref) <= TOL


def _residual_model(c: int = 32, size: int = 20) -> onnx.ModelProto:
    """Conv 1x1 -> a; Conv 3x3 (a) + SiLU -> Add(., a) -> Conv 1x1: a bottleneck with its shortcut."""
    w = fan_in_weights(8)

    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Conv", ["a", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["m1"]),
             helper.make_node("Add", ["m1", "a"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                         [1, 16, size, size])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, size, size])],
                              [w("w0", c, 16, 1, 1), w("w1", c, c, 3, 3), w("b1", c), w("w2", 8, c, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_layout_folds_a_residual_add_after_the_epilogue(tmp_path, monkeypatch):
    """ORTFUSE_WINOGRAD=on: the 3x3 conv, its SiLU and the shortcut Add become one
    FusedWinogradConvAddBlocked; outputs as stock ORT_DISABLE_ALL."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    monkeypatch.setenv(winograd.ENV, "on")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    model = _residual_model()
    x = np.random.default_rng(2).standard_normal((1, 16, 20, 20)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})[0]
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    assert "1 with quick_gelu+add" in note and winograd.OP_ADD in note, note
    assert _close(sess.run(None, {"x": x})[0], ref) <= TOL


def test_a_residual_not_faster_leaves_the_add_to_ort_and_keeps_the_conv(tmp_path, monkeypatch):
    """A decider that refuses the conv with its Add but takes it alone: FusedWinogradConvBlocked,
    the Add left in the graph; outputs as stock."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    asked = []
    monkeypatch.setattr(winograd, "decider",
                        lambda block, threads, cold=False: lambda *a: asked.append(a[-1]) or not a[-1])
    model = _residual_model()
    x = np.random.default_rng(3).standard_normal((1, 16, 20, 20)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})[0]
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    assert asked == [True, False] and "1 with quick_gelu" in note and winograd.OP_ADD not in note, (asked, note)
    assert _close(sess.run(None, {"x": x})[0], ref) <= TOL


def test_spatial_dims_follow_blocked_convs_and_pools():
    """Dims by name where the original graph has them, through strided blocked convs otherwise."""
    nodes = [helper.make_node("ReorderInput", ["x"], ["xb"], domain=winograd.NCHWC),
             helper.make_node("Conv", ["xb", "w"], ["c"], domain=winograd.NCHWC, strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("QuickGelu", ["c"], ["q"], domain="com.microsoft"),
             helper.make_node("GlobalAveragePool", ["q"], ["g"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 15, 20])],
                              [], [numpy_helper.from_array(np.zeros((8, 8, 3, 3), np.float32), "w")])
    dims = winograd.spatial_dims(graph, lambda name: [1, 8, 15, 20] if name == "x" else None)
    assert dims["xb"] == (15, 20) and dims["c"] == (8, 10) and dims["q"] == (8, 10) and dims["g"] == (1, 1)


def test_the_decision_is_measured_and_kept_per_shape(monkeypatch):
    """measure mode times both forms once per shape (cached in the process); off never replaces."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    winograd.measured_faster.cache_clear()
    monkeypatch.setenv(winograd.ENV, "measure")
    decide = winograd.decider(block_size(), 1)
    first = decide(16, 16, 12, 12, "relu", 1.0)
    assert isinstance(first, bool)
    assert decide(16, 16, 12, 12, "relu", 1.0) == first and winograd.measured_faster.cache_info().hits == 1
    monkeypatch.setenv(winograd.ENV, "off")
    graph = onnx.load_from_string(_silu_model().SerializeToString()).graph
    assert not winograd.run_winograd(graph, lambda name: None, 8, lambda *a: True).replaced


def test_the_planner_looks_at_3x3_stride_1_convs_only(monkeypatch):
    """may_replace: a 3x3 stride-1 one-group Conv with a filter initializer, unless the mode is off."""
    w3 = numpy_helper.from_array(np.zeros((8, 8, 3, 3), np.float32), "w3")
    w1 = numpy_helper.from_array(np.zeros((8, 8, 1, 1), np.float32), "w1")
    graph = helper.make_graph([], "g", [], [], [w3, w1])
    monkeypatch.setenv(winograd.ENV, "measure")
    assert winograd.may_replace(helper.make_node("Conv", ["x", "w3"], ["y"], pads=[1, 1, 1, 1]), graph)
    assert not winograd.may_replace(helper.make_node("Conv", ["x", "w1"], ["y"]), graph)
    assert not winograd.may_replace(helper.make_node("Conv", ["x", "w3"], ["y"], strides=[2, 2]), graph)
    assert not winograd.may_replace(helper.make_node("Conv", ["x", "w3"], ["y"], group=8), graph)
    assert not winograd.may_replace(helper.make_node("Conv", ["x", "wx"], ["y"]), graph)
    monkeypatch.setenv(winograd.ENV, "off")
    assert not winograd.may_replace(helper.make_node("Conv", ["x", "w3"], ["y"], pads=[1, 1, 1, 1]), graph)


@pytest.mark.slow
def test_yolov8n_with_every_winograd_conv_native_matches_stock_ort(tmp_path, monkeypatch):
    """The decision forced on for the Winograd convs only: the bottlenecks' conv + SiLU + shortcut
    become FusedWinogradConvAddBlocked, and the outputs equal stock ORT_DISABLE_ALL's."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    from ortfuse import models
    from ortfuse.layout import deconv, depthwise

    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(winograd, "decider", lambda block, threads, cold=False: lambda *a, **k: True)
    monkeypatch.setattr(deconv, "decider", lambda block, threads, cold=False: lambda *a: False)
    monkeypatch.setattr(depthwise, "decider", lambda block, threads, cold=False: lambda shape: False)
    path = str(models.build("yolov8n"))
    feeds = models.sample_inputs("yolov8n")
    ref = disable_all_outputs(path, feeds)
    sess = ortfuse.InferenceSession(path, fusion=True)
    note = str(sess.fusion_report)
    assert "with quick_gelu+add" in note and winograd.OP_ADD in note, note
    for got, r in zip(sess.run(None, feeds), ref):
        assert _close(got, r) <= TOL
