"""Fusion never breaks ORT's blocked layout: on the convolutional zoo models, the fused model as ORT
optimizes it (ORT_ENABLE_ALL, its NCHWc transformer included) holds no more ``ReorderInput`` /
``ReorderOutput`` nodes than the original model as ORT optimizes it (docs/ARCHITECTURE.md §9).

A fused op ORT cannot run blocked (a custom op) is wrapped by ORT in a reorder pair; a conv epilogue
lowered to ``com.microsoft:FusedConv`` stays inside ORT's blocked conv. The count is read from the
graph ORT saves (``optimized_model_filepath``), so it holds on any CPU: where MLAS has no NCHWc block
(block size 1) both graphs have none. Every conv ORT blocks stays a blocked conv, except those a
fused op computes in full (the 1x1 conv R -> 1 of a YOLOv8 DFL head, inside FusedDFL). Outputs of
the fused model are checked against stock ORT at ORT_DISABLE_ALL (|fused - ref| <= 1e-4 * max(1,
max|ref|): BN folding changes float32 rounding).
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime
import pytest

import ortfuse
from ortfuse import models

NCHWC = "com.microsoft.nchwc"
CONV_INSIDE = {"dfl"}  # patterns whose fused op computes its Conv itself
CNNS = ["mobilenetv3_block", "mobilenetv3_block_const", "pplcnet_classifier", "crnn_recognizer",
        "db_text_detector", "picodet_layout", "yolov8n"]


def _optimized_ops(tmp_path, label: str, make_session) -> collections.Counter:
    """Op census (``domain:op_type``) of the graph ORT optimizes at ORT_ENABLE_ALL, as ORT saves it."""
    out = tmp_path / f"{label}.optimized.onnx"
    so = onnxruntime.SessionOptions()
    so.optimized_model_filepath = str(out)
    make_session(so)
    return collections.Counter(f"{n.domain}:{n.op_type}" for n in onnx.load(str(out)).graph.node)


def _reorders(ops: collections.Counter) -> int:
    return ops[f"{NCHWC}:ReorderInput"] + ops[f"{NCHWC}:ReorderOutput"]


@pytest.mark.parametrize("name", CNNS)
def test_fused_cnn_keeps_orts_blocked_layout(tmp_path, name):
    path = str(models.build(name))
    model = onnx.load(path)
    fused, report = ortfuse.fuse(model)
    assert report.applied, report.table()
    stock = _optimized_ops(tmp_path, "stock", lambda so: onnxruntime.InferenceSession(path, so))
    ours = _optimized_ops(tmp_path, "fused", lambda so: ortfuse.InferenceSession(fused.SerializeToString(), so))
    assert _reorders(ours) <= _reorders(stock), (sorted(stock.items()), sorted(ours.items()), report.table())
    convs = {n.name for n in model.graph.node if n.op_type == "Conv"}
    inside = sum(n in convs for r in report.fused if r.pattern_id in CONV_INSIDE for n in r.nodes)
    assert ours[f"{NCHWC}:Conv"] >= stock[f"{NCHWC}:Conv"] - inside, (sorted(stock.items()), sorted(ours.items()))
    feeds = models.sample_inputs(name)
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = onnxruntime.InferenceSession(path, so).run(None, feeds)
    got = ortfuse.InferenceSession(fused.SerializeToString()).run(None, feeds)
    for g, r in zip(got, ref):
        assert float(np.abs(g - r).max()) <= 1e-4 * max(1.0, float(np.abs(r).max()))


def test_conv_hardswish_becomes_one_blocked_conv_where_orts_own_fusion_leaves_one(tmp_path):
    """Conv -> HardSwish twice, the second Conv without a bias: stock ORT folds only the first
    HardSwish into its blocked conv; lowered to FusedConv(HardSwish), both are blocked convs with
    the activation and no HardSwish is left outside them."""
    rng = np.random.default_rng(0)
    w1 = onnx.numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32), "w1")
    b1 = onnx.numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")
    w2 = onnx.numpy_helper.from_array((rng.standard_normal((16, 16, 1, 1)) * 0.3).astype(np.float32), "w2")
    h = onnx.helper
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("HardSwish", ["c1"], ["h1"]),
             h.make_node("Conv", ["h1", "w2"], ["c2"]), h.make_node("HardSwish", ["c2"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 20, 20])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16, 20, 20])], [w1, b1, w2])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 15)])
    fused, report = ortfuse.fuse(model)
    assert [r.kernel for r in report.fused] == ["lowered to ORT: com.microsoft:FusedConv"] * 2, report.table()
    ours = _optimized_ops(tmp_path, "fused", lambda so: ortfuse.InferenceSession(fused.SerializeToString(), so))
    if ours[f"{NCHWC}:Conv"]:  # this CPU has an NCHWc block: ORT blocks both convs, activation inside
        assert ours[f"{NCHWC}:Conv"] == 2 and not ours[":HardSwish"] and not ours[":HardSigmoid"], ours
    x = rng.standard_normal((1, 8, 20, 20)).astype(np.float32)
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = onnxruntime.InferenceSession(model.SerializeToString(), so).run(None, {"x": x})[0]
    got = ortfuse.InferenceSession(fused.SerializeToString()).run(None, {"x": x})[0]
    assert float(np.abs(got - ref).max()) <= 1e-4 * max(1.0, float(np.abs(ref).max()))


@pytest.mark.slow
@pytest.mark.parametrize("name", CNNS)
def test_the_planned_layout_never_adds_reorders_and_keeps_the_outputs(name):
    """The layout step (what a fused session loads at ORT_ENABLE_ALL) holds at most the reorders ORT
    left in the fused model, and its note names the count before and after; outputs as above."""
    from ortfuse.fusion.provenance import native_op_types
    from ortfuse.kernel_choice.op_registration import with_custom_ops
    from ortfuse.layout import blocked_scale, planner

    model = onnx.load(str(models.build(name)))
    fused, report = ortfuse.fuse(model)
    native = frozenset(native_op_types(fused))
    layout, why_not = planner.plan_layout(model, fused, None, native, report.disabled_ort_optimizers)
    if layout is None:
        assert why_not.startswith("layout: "), why_not
        return
    before, after = (int(v) for v in layout.note.split("reorders ", 1)[1].split(" (")[0].split(" -> "))
    assert after == blocked_scale.reorder_count(layout.model.graph) <= before, layout.note
    feeds = models.sample_inputs(name)
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = onnxruntime.InferenceSession(model.SerializeToString(), so).run(None, feeds)
    so, _ = with_custom_ops(onnxruntime.SessionOptions(), native | layout.native_ops, python_ops=False)
    got = onnxruntime.InferenceSession(layout.model.SerializeToString(), so).run(None, feeds)
    for g, r in zip(got, ref):
        assert float(np.abs(g - r).max()) <= 1e-4 * max(1.0, float(np.abs(r).max()))
