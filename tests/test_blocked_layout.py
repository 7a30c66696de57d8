"""Layout planning (ortfuse.layout): the native FusedChannelScaleBlocked kernel on NCHWc-blocked data,
its error statuses, the rewrite of squeeze-excite scales in the graph ORT optimized, and the plans
that use it. Numerics: the kernel is exact (one float32 product per element, compared bit for bit
with numpy); whole models against stock ORT at ORT_DISABLE_ALL within 1e-4 * max(1, max|ref|)
(BN folding changes float32 rounding)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import ortfuse
from ortfuse import fuse
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.provenance import native_op_types
from ortfuse.kernel_choice.op_registration import with_custom_ops
from ortfuse.layout import blocked_scale, planner
from ortfuse.layout.probe import block_size

OP = blocked_scale.OP


def _op_model(block: int, x_shape, s_shape) -> bytes:
    graph = helper.make_graph([helper.make_node(OP, ["x", "s"], ["y"], domain=DOMAIN, block=block)], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape),
                               helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, s_shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]) \
        .SerializeToString()


def _op_session(block: int, x_shape=None, s_shape=None):
    so, why_not = with_custom_ops(onnxruntime.SessionOptions(), frozenset({OP}), python_ops=False)
    assert not why_not
    return onnxruntime.InferenceSession(_op_model(block, x_shape, s_shape), so)


@pytest.mark.parametrize("block, n, c, h, w", [(8, 2, 24, 5, 7), (16, 1, 32, 9, 9), (8, 1, 8, 1, 1),
                                               (4, 3, 12, 2, 9), (12, 1, 24, 3, 5), (1, 2, 3, 4, 4)])
def test_kernel_scales_each_channel_of_the_blocked_layout(block, n, c, h, w):
    """Blocks that divide the 64-float pattern row (1, 4, 8, 16) and one that does not (12)."""
    rng = np.random.default_rng(block * 100 + c)
    blocked = rng.standard_normal((n, c // block, h, w, block)).astype(np.float32)
    s = rng.standard_normal((n, c, 1, 1)).astype(np.float32)
    y = _op_session(block).run(None, {"x": blocked.reshape(n, c, h, w), "s": s})[0]
    assert y.shape == (n, c, h, w)
    want = blocked * s.reshape(n, c // block, 1, 1, block)
    assert np.array_equal(y.reshape(n, c // block, h, w, block), want)


@pytest.mark.parametrize("x_shape, s_shape, text", [
    ((1, 12, 2, 2), (1, 12, 1, 1), "multiple of the attribute block"),
    ((1, 16, 2, 2), (1, 16, 2, 1), "S the shape [N, C, 1, 1]"),
    ((2, 16, 2, 2), (1, 16, 1, 1), "S the shape [N, C, 1, 1]"),
    ((16, 2, 2), (16, 1, 1), "X must have rank 4"),
])
def test_kernel_refuses_other_shapes_with_an_ort_error(x_shape, s_shape, text):
    sess = _op_session(8)
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match=text.replace("[", r"\[")):
        sess.run(None, {"x": np.ones(x_shape, np.float32), "s": np.ones(s_shape, np.float32)})
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match=r"expected: \(tensor\(float"):
        sess.run(None, {"x": np.ones((1, 8, 2, 2), np.float64), "s": np.ones((1, 8, 1, 1), np.float32)})


def se_model(channels: int = 24) -> onnx.ModelProto:
    """Conv+HardSwish -> squeeze-excite (GlobalAveragePool, Conv+Relu, Conv+HardSigmoid, Mul) -> Conv."""
    rng = np.random.default_rng(5)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [w("w0", channels, 16, 3, 3), w("b0", channels), w("w1", 8, channels, 1, 1), w("b1", 8),
             w("w2", channels, 8, 1, 1), w("b2", channels), w("w3", 16, channels, 1, 1)]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c0"], ["a0"], name="hswish0"),
             helper.make_node("GlobalAveragePool", ["a0"], ["p"], name="gap"),
             helper.make_node("Conv", ["p", "w1", "b1"], ["c1"], name="fc1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="fc2"),
             helper.make_node("HardSigmoid", ["c2"], ["s"], name="gate", alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["a0", "s"], ["m"], name="scale"),
             helper.make_node("Conv", ["m", "w3"], ["y"], name="project")]
    x, y = (helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, ["n", 16, 20, 20]) for t in "xy")
    graph = helper.make_graph(nodes, "se", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def _feeds(batch=2):
    return {"x": np.random.default_rng(batch).standard_normal((batch, 16, 20, 20)).astype(np.float32)}


def _reference(model, feeds):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), so).run(None, feeds)


def _close(got, ref):
    return all(float(np.abs(g - r).max()) <= 1e-4 * max(1.0, float(np.abs(r).max())) for g, r in zip(got, ref))


needs_nchwc = pytest.mark.skipif(block_size() == 0, reason="ORT has no NCHWc kernels on this CPU")


@needs_nchwc
@pytest.mark.parametrize("channels", [24, 20])  # 20: not a multiple of the block, ORT pads the channels
def test_plan_layout_runs_the_se_scale_on_blocks_with_fewer_reorders(channels, monkeypatch):
    """The whole SE as one op is left out (``ORTFUSE_SE_BLOCK=off``; tests/test_se_block.py): the
    channel scale stays as its own blocked op."""
    monkeypatch.setenv("ORTFUSE_SE_BLOCK", "off")
    model = se_model(channels)
    fused, report = fuse(model)
    layout, why_not = planner.plan_layout(model, fused, None, frozenset(native_op_types(fused)),
                                          report.disabled_ort_optimizers)
    assert layout is not None, why_not
    ops = [n.op_type for n in layout.model.graph.node]
    assert ops.count(OP) == 1 and "Mul" not in ops
    assert f"blocks of {block_size()}" in layout.note and "1 squeeze-excite" in layout.note
    before, after = (int(x) for x in layout.note.split("reorders ", 1)[1].split(" (")[0].split(" -> "))
    assert after == blocked_scale.reorder_count(layout.model.graph) < before
    so, _ = with_custom_ops(onnxruntime.SessionOptions(), frozenset(native_op_types(fused)) | layout.native_ops,
                            python_ops=False)
    sess = onnxruntime.InferenceSession(layout.model.SerializeToString(), so)
    for batch in (1, 3):
        assert _close(sess.run(None, _feeds(batch)), _reference(model, _feeds(batch)))


def test_plan_layout_steps_aside_with_the_reason(monkeypatch):
    monkeypatch.setenv("ORTFUSE_WINOGRAD", "off")  # else the plain model's 3x3 conv may run as Winograd
    model = se_model()
    fused, _ = fuse(model)
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    layout, why_not = planner.plan_layout(model, fused, so, frozenset(native_op_types(fused)))
    assert layout is None and "ORT_ENABLE_ALL" in why_not
    plain = onnx.ModelProto()
    plain.CopyFrom(model)
    del plain.graph.node[2:]  # no squeeze-excite: nothing to move onto blocks
    plain.graph.output[0].name = "a0"
    fused_plain, _ = fuse(plain)
    layout, why_not = planner.plan_layout(plain, fused_plain, None, frozenset(native_op_types(fused_plain)))
    assert layout is None and why_not.startswith("layout: ")


@needs_nchwc
def test_a_fused_session_loads_the_blocked_plan_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "se.onnx"
    onnx.save(se_model(), str(path))
    for _ in range(2):  # planned, then read from the plan cache
        sess = ortfuse.InferenceSession(str(path), fusion=True)
        assert any(n.startswith("layout: NCHWc blocks") for n in sess.fusion_report.notes), sess.fusion_report.notes
        assert _close(sess.run(None, _feeds()), _reference(se_model(), _feeds()))
    assert any("plan read from ortfuse's cache" in n for n in sess.fusion_report.notes)
    monkeypatch.setenv(planner.ENV, "off")
    sess = ortfuse.InferenceSession(str(path), fusion=True)
    assert not any(n.startswith("layout: NCHWc") for n in sess.fusion_report.notes)
    assert _close(sess.run(None, _feeds()), _reference(se_model(), _feeds()))


def test_layout_drops_inputs_that_lost_their_initializer():
    """IR < 4 models list initializers as inputs; ORT's optimized graph keeps such an input after
    folding its initializer away, and a caller would have to feed it."""
    from onnx import TensorProto, helper

    from ortfuse.layout.planner import _prune_stray_inputs

    def vi(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1])

    w = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    fused = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [vi("x"), vi("w")], [vi("y")], [w])
    folded = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [vi("x"), vi("w")], [vi("y")])
    assert _prune_stray_inputs(folded, fused) == [] and [i.name for i in folded.input] == ["x"]
    still_read = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [vi("x"), vi("w")], [vi("y")])
    assert _prune_stray_inputs(still_read, fused) == ["w"]  # the plan steps aside
    kept = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [vi("x"), vi("w")], [vi("y")], [w])
    assert _prune_stray_inputs(kept, fused) == [] and [i.name for i in kept.input] == ["x", "w"]
