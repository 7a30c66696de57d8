"""conv_add (ortfuse/fusion/rules/conv_add.py) and the structural shape proof it rests on
(ortfuse/fusion/rulekit/same_shape.py): a residual Add after a conv is fused into ORT's FusedConv
(sum input Z, which does not broadcast) only where the residual is known to have the conv output's
shape, also when the dims have no names. Outputs against stock ORT at ORT_DISABLE_ALL at several
input sizes; tolerance |got - ref| <= 1e-5 * max(1, max|ref|) (BN folded into the filters)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse.fusion.rewrite import fuse
from ortfuse.fusion.rulekit.same_shape import same_shape, shape_source
from ortfuse.ir.graph import GraphIndex

TOL = 1e-5
C = 8


def _w(*shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32)


def _block(stride: int = 1, pads=(1, 1, 1, 1), residual_dims=None, scale_dims=(1, C, 1, 1)) -> onnx.ModelProto:
    """xin [n, C, ?, ?] -> Conv(1x1) -> x -> Conv(3x3) -> BN -> HardSwish -> Mul(const) -> Conv(1x1) -> BN
    -> Add(residual) -> y; the residual is x, or an input r of ``residual_dims``."""
    nodes = [helper.make_node("Conv", ["xin", "w0"], ["x"]),  # a stem: the residual comes from a conv
             helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=list(pads), strides=[stride, stride]),
             helper.make_node("BatchNormalization", ["c1", "s1", "o1", "m1", "v1"], ["n1"]),
             helper.make_node("HardSwish", ["n1"], ["h"]),
             helper.make_node("Mul", ["h", "k"], ["hk"]),
             helper.make_node("Conv", ["hk", "w2"], ["c2"]),
             helper.make_node("BatchNormalization", ["c2", "s2", "o2", "m2", "v2"], ["n2"]),
             helper.make_node("Add", ["n2", "r" if residual_dims else "x"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w0", _w(C, C, 1, 1, seed=12)), ("w1", _w(C, C, 3, 3)), ("b1", _w(C, seed=1)), ("s1", _w(C, seed=2) + 1),
        ("o1", _w(C, seed=3)),
        ("m1", _w(C, seed=4)), ("v1", np.abs(_w(C, seed=5)) + 0.5), ("k", _w(*scale_dims, seed=6) + 1),
        ("w2", _w(C, C, 1, 1, seed=7)), ("s2", _w(C, seed=8) + 1), ("o2", _w(C, seed=9)), ("m2", _w(C, seed=10)),
        ("v2", np.abs(_w(C, seed=11)) + 0.5))]
    inputs = [helper.make_tensor_value_info("xin", TensorProto.FLOAT, ["n", C, "?", "?"])]
    if residual_dims:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, residual_dims))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", C, "?", "?"])]
    graph = helper.make_graph(nodes, "shortcut", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(model: onnx.ModelProto, h: int, w: int) -> dict:
    rng = np.random.default_rng(h * 100 + w)
    feeds = {"xin": rng.standard_normal((2, C, h, w)).astype(np.float32)}
    if any(i.name == "r" for i in model.graph.input):
        feeds["r"] = rng.standard_normal((2, C, 1, w)).astype(np.float32)
    return feeds


def _stock(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds)[0]


def _close(got, ref) -> float:
    return float(np.abs(got - ref).max()) / max(1.0, float(np.abs(ref).max()))


def test_shape_source_walks_through_same_padded_convs_and_channel_constants():
    ix = GraphIndex(_block())
    assert ix.shape("n2")[2] is None or isinstance(ix.shape("n2")[2], str)  # inference alone cannot tell
    assert shape_source(ix, "n2") == "xin" and same_shape(ix, "n2", "x")  # through the 1x1 stem too


@pytest.mark.parametrize("variant", [dict(stride=2, pads=(1, 1, 1, 1)), dict(pads=(0, 0, 0, 0)),
                                     dict(pads=(2, 0, 0, 0)), dict(scale_dims=(1, C, 1, 5))])
def test_no_proof_where_a_step_may_change_the_dims(variant):
    """Stride 2, no padding, pads that do not add up per axis, a constant that could broadcast the
    width: the conv output's shape is not known to be x's."""
    ix = GraphIndex(_block(**variant))
    assert not same_shape(ix, "n2", "x")


def test_pads_split_unevenly_still_keep_the_dims():
    assert same_shape(GraphIndex(_block(pads=(2, 0, 0, 2))), "n2", "x")


@pytest.mark.parametrize("h,w", [(8, 8), (5, 11), (1, 1)])
def test_fused_shortcut_computes_the_same_at_any_size(h, w):
    model = _block()
    fused, report = fuse(model, ["conv_add"])
    assert [m.pattern_id for m in report.matches if m.decision == "fused"] == ["conv_add"], report
    convs = [n for n in fused.graph.node if n.op_type == "FusedConv"]
    assert len(convs) == 1 and len(convs[0].input) == 4 and convs[0].input[3] == "x"
    assert not any(n.op_type == "Add" for n in fused.graph.node)
    feeds = _feeds(model, h, w)
    assert _close(_stock(fused, feeds), _stock(model, feeds)) <= TOL


def test_a_residual_orts_layout_leaves_unblocked_is_left_to_ort():
    """The residual is the graph input: ORT's NCHWc layout would leave a FusedConv reading it unblocked."""
    model = _block()
    g = model.graph
    g.node.remove(g.node[0])
    g.input[0].name = "x"
    _, report = fuse(model, ["conv_add"])
    rejected = [m for m in report.matches if m.pattern_id == "conv_add" and m.decision != "fused"]
    assert rejected and "the graph input 'x'" in rejected[0].reason, report


def test_a_residual_that_may_broadcast_is_left_to_ort():
    model = _block(residual_dims=["n", C, 1, "?"])
    fused, report = fuse(model, ["conv_add"])
    rejected = [m for m in report.matches if m.pattern_id == "conv_add" and m.decision != "fused"]
    assert rejected and "not known to have the conv output's shape" in rejected[0].reason, report
    assert any(n.op_type == "Add" for n in fused.graph.node)
    feeds = _feeds(model, 6, 7)
    assert _close(_stock(fused, feeds), _stock(model, feeds)) <= TOL


@pytest.mark.parametrize("h,w", [(16, 16), (9, 23)])
def test_session_with_layout_keeps_the_outputs(tmp_path, monkeypatch, h, w):
    """fusion=True end to end: the FusedConv with its sum goes through ORT's NCHWc layout and
    ortfuse's layout step where the CPU has blocked kernels."""
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    model = _block()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    session = ortfuse.InferenceSession(str(path), fusion=True, providers=["CPUExecutionProvider"])
    assert any(m.pattern_id == "conv_add" and m.decision == "fused" for m in session.fusion_report.matches)
    feeds = _feeds(model, h, w)
    assert _close(session.run(None, feeds)[0], _stock(model, feeds)) <= 1e-4


def _se_graph(scale_from_stride: int = 1) -> onnx.ModelProto:
    """xin -> Conv(1x1) -> x -> Conv(3x3, pads 1) -> c; h = c * clip(c + 3) (HardSwish as exporters write it);
    s = Sigmoid(Conv(GlobalAveragePool(h))) from h, or from a stride-2 branch; y = h * s; out = Conv(y) + x."""
    nodes = [helper.make_node("Conv", ["xin", "w2"], ["x"]),  # a stem: the residual comes from a conv
             helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "three"], ["c3"]),
             helper.make_node("Clip", ["c3", "zero", "six"], ["r6"]),
             helper.make_node("Mul", ["c", "r6"], ["h"]),
             helper.make_node("Conv", ["h", "w1"], ["hs"], pads=[1, 1, 1, 1], strides=[scale_from_stride] * 2),
             helper.make_node("GlobalAveragePool", ["hs"], ["p"]),
             helper.make_node("Conv", ["p", "w2"], ["q"]),
             helper.make_node("Sigmoid", ["q"], ["s"]),
             helper.make_node("Mul", ["h", "s"], ["y"]),
             helper.make_node("Conv", ["y", "w2"], ["z"]),
             helper.make_node("Add", ["z", "x"], ["out"])]
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w1", _w(C, C, 3, 3)), ("w2", _w(C, C, 1, 1, seed=1)), ("three", np.float32(3.0)),
        ("zero", np.float32(0.0)), ("six", np.float32(6.0)))]
    dims = ["n", C, "?", "?"]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("xin", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, dims)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_squeeze_excite_scale_and_decomposed_hardswish_keep_the_dims():
    ix = GraphIndex(_se_graph())
    assert same_shape(ix, "z", "x")
    # a scale of spatial dims 1 and x's batch keeps x's shape whichever branch made it: the pooled
    # stride-2 branch still has x's batch
    assert same_shape(GraphIndex(_se_graph(scale_from_stride=2)), "z", "x")
    fused, report = fuse(_se_graph(), ["conv_add"])
    assert any(m.pattern_id == "conv_add" and m.decision == "fused" for m in report.matches), report
    for h, w in ((6, 6), (3, 10)):
        feeds = {"xin": np.random.default_rng(h).standard_normal((2, C, h, w)).astype(np.float32)}
        assert _close(_stock(fused, feeds), _stock(_se_graph(), feeds)) <= TOL


def test_a_product_of_tensors_of_different_dims_is_no_proof():
    """h * t with t from a stride-2 conv (not pooled): t may broadcast into h or not, no proof."""
    model = _se_graph()
    g = model.graph
    pool = next(n for n in g.node if n.op_type == "GlobalAveragePool")
    pool.op_type = "Relu"  # s keeps the stride-2 branch's spatial dims
    g.node[5].attribute[1].ints[:] = [2, 2]
    assert not same_shape(GraphIndex(model), "z", "x")
