"""Stride-2 2x2 ConvTranspose read from NCHWc blocks (the native FusedConvTransposeS2Blocked and
ortfuse/layout/deconv.py). Numerics: against the float64 numpy reference and stock ORT at
ORT_DISABLE_ALL, |got - ref| <= 1e-4 * max(1, max|ref|)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import ortfuse
from ortfuse.custom_ops.kernels.conv_filters import deconv_reference as reference
from ortfuse.custom_ops.kernels.conv_filters import pack_deconv_filter as pack_filter
from ortfuse.custom_ops.native.ops.deconv_s2 import OP, OP2
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.kernel_choice.op_registration import with_custom_ops
from ortfuse.layout import deconv, winograd
from ortfuse.layout.probe import block_size

from model_fixtures import disable_all_outputs

TOL = 1e-4
InvalidArgument = onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument


def _session(block: int, act: str = "", act2: str | None = None):
    """The single op, or the chained one when ``act2`` is given ("" for none)."""
    attrs: dict = {"block": block, **({"activation": act} if act else {}), **({"activation2": act2} if act2 else {})}
    op, names = (OP, ["x", "w", "b"]) if act2 is None else (OP2, ["x", "w", "b", "w2", "b2"])
    graph = helper.make_graph([helper.make_node(op, names, ["y"], domain=DOMAIN, **attrs)], "g",
                              [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    so, why_not = with_custom_ops(onnxruntime.SessionOptions(), frozenset({op}), python_ops=False)
    assert not why_not
    so.intra_op_num_threads = 2
    return onnxruntime.InferenceSession(model.SerializeToString(), so)


def _close(got, ref) -> float:
    return float(np.abs(got - ref).max()) / max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("block, n, cin, cout, h, w", [(8, 1, 24, 24, 20, 30), (8, 2, 16, 1, 5, 7),
                                                       (16, 1, 32, 3, 4, 30), (1, 1, 3, 2, 2, 2), (4, 1, 8, 5, 1, 25)])
@pytest.mark.parametrize("act", ["", "relu"])
def test_kernel_matches_the_reference_and_stock_ort(block, n, cin, cout, h, w, act):
    rng = np.random.default_rng(cin + w)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    wt = (rng.standard_normal((cin, cout, 2, 2)) / np.sqrt(cin)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    xb = np.ascontiguousarray(x.reshape(n, cin // block, block, h, w).transpose(0, 1, 3, 4, 2)).reshape(x.shape)
    y = _session(block, act).run(None, {"x": xb, "w": pack_filter(wt), "b": b})[0]
    assert y.shape == (n, cout, 2 * h, 2 * w)
    ref = reference(x, wt, b)
    assert _close(y, np.maximum(ref, 0) if act else ref) <= TOL
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["t" if act else "y"], strides=[2, 2])]
    nodes += [helper.make_node("Relu", ["t"], ["y"])] if act else []
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(b, "b")])
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    stock = onnxruntime.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                         .SerializeToString(), so).run(None, {"x": x})[0]
    assert _close(y, stock) <= TOL


@pytest.mark.parametrize("block, x_shape, w_shape, b_shape, text", [
    (8, (1, 16, 4, 4), (12, 16), (4,), "Wt the shape"),
    (8, (1, 16, 4, 4), (16, 8), (4,), "Wt the shape"),
    (8, (16, 4, 4), (16, 16), (4,), "X must have rank 4"),
    (8, (1, 12, 4, 4), (16, 12), (4,), "divide X's channels"),
    (0, (1, 16, 4, 4), (16, 16), (4,), "block must be 1 to 64"),
])
def test_kernel_refuses_other_shapes_with_an_ort_error(block, x_shape, w_shape, b_shape, text):
    feeds = {"x": np.ones(x_shape, np.float32), "w": np.ones(w_shape, np.float32), "b": np.ones(b_shape, np.float32)}
    with pytest.raises(InvalidArgument, match=text):
        _session(block).run(None, feeds)
    feeds["w"] = feeds["w"].astype(np.float64)
    with pytest.raises(InvalidArgument, match=r"expected: \(tensor\(float"):
        _session(8).run(None, feeds)


def test_layout_reads_a_stride_2_conv_transpose_from_blocks(tmp_path, monkeypatch):
    """Conv -> ConvTranspose(2x2, s2) -> Relu -> ConvTranspose -> Sigmoid (a DB head): the first
    ConvTranspose with its Relu becomes the native op when told; outputs as stock ORT."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    monkeypatch.setenv(winograd.ENV, "on")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n) for n, s in
             (("w0", (16, 8, 3, 3)), ("w1", (16, 16, 2, 2)), ("b1", (16,)), ("w2", (16, 1, 2, 2)))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "w1", "b1"], ["t1"], strides=[2, 2]),
             helper.make_node("Relu", ["t1"], ["r1"]),
             helper.make_node("ConvTranspose", ["r1", "w2"], ["t2"], strides=[2, 2]),
             helper.make_node("Sigmoid", ["t2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 48, 48])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})[0]
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    assert "1 stride-2 ConvTranspose(s) read from blocks, 1 with the next one folded in" in note, note
    assert _close(sess.run(None, {"x": x})[0], ref) <= TOL


@pytest.mark.parametrize("block, n, cin, cout, cout2, h, w, act, act2", [
    (8, 1, 24, 24, 1, 12, 20, "relu", "sigmoid"), (8, 2, 16, 8, 3, 5, 7, "", "relu"),
    (16, 1, 32, 3, 2, 4, 30, "relu", "")])
def test_chained_kernel_matches_two_conv_transposes(block, n, cin, cout, cout2, h, w, act, act2):
    rng = np.random.default_rng(cin + cout2)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    w1 = (rng.standard_normal((cin, cout, 2, 2)) / np.sqrt(cin)).astype(np.float32)
    w2 = (rng.standard_normal((cout, cout2, 2, 2)) / np.sqrt(cout)).astype(np.float32)
    b1, b2 = rng.standard_normal(cout).astype(np.float32), rng.standard_normal(cout2).astype(np.float32)
    xb = np.ascontiguousarray(x.reshape(n, cin // block, block, h, w).transpose(0, 1, 3, 4, 2)).reshape(x.shape)
    feeds = {"x": xb, "w": pack_filter(w1), "b": b1, "w2": pack_filter(w2), "b2": b2}
    y = _session(block, act, act2).run(None, feeds)[0]
    assert y.shape == (n, cout2, 4 * h, 4 * w)
    mid = reference(x, w1, b1)
    ref = reference(np.maximum(mid, 0) if act else mid, w2, b2)
    ref = np.maximum(ref, 0) if act2 == "relu" else 1 / (1 + np.exp(-ref)) if act2 == "sigmoid" else ref
    assert _close(y, ref) <= TOL
    feeds["w2"] = np.ones((4 * cout2, cout + 1), np.float32)
    with pytest.raises(InvalidArgument, match="W2t must have the shape"):
        _session(block, act, act2).run(None, feeds)


@pytest.mark.parametrize("cout2, act2", [(0, ""), (1, "sigmoid")])
def test_the_decision_times_both_forms(cout2, act2):
    """Both probe models run (a timing needs them to load and agree in shape); the answer is a bool."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    deconv.measured_faster.cache_clear()
    assert isinstance(deconv.measured_faster(block_size(), 8, 6, 6, "relu", cout2, act2, block_size(), 1), bool)
