"""Depthwise convolution on NCHWc blocks (custom_ops/kernels/depthwise.py, the native
FusedDepthwiseConvBlocked, ortfuse/layout/depthwise.py). Numerics: against the float64 numpy
reference and against stock ORT at ORT_DISABLE_ALL, |got - ref| <= 1e-4 * max(1, max|ref|) (float32
accumulation in another order than the reference's)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from native_sessions import from_blocked, one_op_session, to_blocked
from onnx import helper, numpy_helper

import ortfuse
from ortfuse import models
from ortfuse.custom_ops.kernels.depthwise_ref import depthwise_reference, pack_filter, unpack_filter
from ortfuse.layout import depthwise, winograd
from ortfuse.layout.probe import block_size

from model_fixtures import disable_all_outputs, fan_in_weights

OP = depthwise.OP
TOL = 1e-4
InvalidArgument = onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument


def _close(got, ref) -> float:
    return float(np.abs(got - ref).max()) / max(1.0, float(np.abs(ref).max()))


def _session(block: int, strides=(1, 1), pads=(1, 1, 1, 1), act: str = "", alpha: float | None = None,
             beta: float | None = None, threads: int = 2, **prologue):
    attrs: dict = {"block": block, "strides": list(strides), "pads": list(pads), **({"activation": act} if act else {}),
                   **({"alpha": alpha} if alpha is not None else {}), **({"beta": beta} if beta is not None else {}),
                   **prologue}
    return one_op_session(OP, "xfb", threads, **attrs)






def _data(n, c, h, w, k, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    f = (rng.standard_normal((c, 1, k, k)) / k).astype(np.float32)
    return x, f, rng.standard_normal(c).astype(np.float32)


def _run(block, x, f, b, strides, pads, act="", alpha=None, beta=None, threads=2, **prologue):
    feeds = {"x": to_blocked(x, block), "f": pack_filter(f, block), "b": b}
    return from_blocked(_session(block, strides, pads, act, alpha, beta, threads, **prologue).run(None, feeds)[0],
                        block)


# images wider and narrower than the in-place path needs, fewer outputs in place than one
# register-blocked call takes (25 at stride 2), odd sizes, one pixel, batches
SIZES = [(1, 13, 29), (2, 7, 3), (1, 1, 1), (1, 40, 61), (1, 5, 100), (1, 6, 25)]
GEOMETRY = [(3, (1, 1), (1, 1, 1, 1)), (3, (2, 2), (1, 1, 1, 1)), (3, (2, 1), (1, 1, 1, 1)), (5, (1, 1), (2, 2, 2, 2)),
            (5, (2, 2), (2, 2, 2, 2)), (3, (1, 2), (0, 1, 2, 0)), (5, (3, 1), (4, 0, 1, 3))]


# every size with every geometry whose padded image holds the filter (others have no output pixel)
CASES = [(k, strides, pads, n, h, w) for k, strides, pads in GEOMETRY for n, h, w in SIZES
         if h + pads[0] + pads[2] >= k and w + pads[1] + pads[3] >= k]


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("k, strides, pads, n, h, w", CASES)
def test_kernel_matches_the_float64_reference(block, k, strides, pads, n, h, w):
    x, f, b = _data(n, 2 * block, h, w, k, seed=h * w + k)
    y = _run(block, x, f, b, strides, pads, "hard_swish", 1 / 6, 0.5)
    ref = depthwise_reference(x, f, b, strides, pads, "hard_swish", 1 / 6, 0.5)
    assert y.shape == ref.shape
    assert _close(y, ref) <= TOL


@pytest.mark.parametrize("act, alpha, beta", [("", None, None), ("relu", None, None), ("clip", 0.0, 6.0),
                                               ("clip", -0.5, 0.25), ("hard_sigmoid", 0.2, 0.5),
                                               ("hard_swish", 1 / 6, 0.5), ("quick_gelu", 1.0, None),
                                               ("quick_gelu", 1.702, None), ("sigmoid", None, None)])
@pytest.mark.parametrize("threads", [1, 2])
def test_every_epilogue_matches_the_reference(act, alpha, beta, threads):
    x, f, b = _data(1, 24, 17, 45, 3, seed=5)
    y = _run(8, x, f, b, (1, 1), (1, 1, 1, 1), act, alpha, beta, threads)
    ref = depthwise_reference(x, f, b, (1, 1), (1, 1, 1, 1), act, 1.0 if alpha is None else alpha,
                              0.0 if beta is None else beta)
    assert _close(y, ref) <= TOL


@pytest.mark.parametrize("k, strides, pads, n, h, w", CASES[::2])
@pytest.mark.parametrize("in_scale, in_shift", [(0.75, 0.3), (1.0, -2.5), (-1.5, 0.0)])
def test_the_affine_prologue_pads_with_zeros_of_its_output(k, strides, pads, n, h, w, in_scale, in_shift):
    """in_scale * X + in_shift before the conv, its padding zero (not in_shift): the in-place outputs
    (the filter scaled, the bias per row of taps inside the image), the strips at the borders and a
    narrow image's whole-row strip all match the reference."""
    x, f, b = _data(n, 16, h, w, k, seed=h * w + k)
    y = _run(8, x, f, b, strides, pads, "hard_swish", 1 / 6, 0.5, in_scale=in_scale, in_shift=in_shift)
    ref = depthwise_reference(x, f, b, strides, pads, "hard_swish", 1 / 6, 0.5, in_scale, in_shift)
    assert _close(y, ref) <= TOL
    if in_shift:  # the affine applied after padding (a padding of in_shift) is told apart on the border
        padded = np.pad(x, ((0, 0), (0, 0), pads[::2], pads[1::2]))
        wrong = depthwise_reference(padded, f, b, strides, (0, 0, 0, 0), "hard_swish", 1 / 6, 0.5, in_scale,
                                    in_shift)
        assert _close(y, wrong) > 100 * TOL


@pytest.mark.parametrize("act, alpha, beta", [("", None, None), ("hard_swish", 1 / 6, 0.5), ("clip", -1.0, 2.0),
                                             ("quick_gelu", 1.0, None), ("sigmoid", None, None)])
@pytest.mark.parametrize("out_scale, out_shift", [(0.75, 0.3), (1.0, -2.5), (-1.5, 0.0)])
def test_the_output_map_follows_every_epilogue(act, alpha, beta, out_scale, out_shift):
    """out_scale * act(conv) + out_shift: applied in registers after a clamp-family epilogue and in
    the row pass after an exp one, on the outputs in place and at the borders, both blocks, with the
    prologue too."""
    for k, strides, pads, n, h, w in CASES[::3]:
        x, f, b = _data(n, 16, h, w, k, seed=h * w + k)
        for block in (8, 16):
            y = _run(block, x, f, b, strides, pads, act, alpha, beta, out_scale=out_scale, out_shift=out_shift,
                     in_scale=0.5, in_shift=0.25)
            ref = depthwise_reference(x, f, b, strides, pads, act, 1.0 if alpha is None else alpha,
                                      0.0 if beta is None else beta, 0.5, 0.25, out_scale, out_shift)
            assert _close(y, ref) <= TOL, (k, strides, pads, n, h, w, block)


def test_nan_and_inf_propagate_through_the_epilogue():
    """A NaN input gives NaN outputs where it is read (relu and hard_swish keep it), an inf input
    gives inf through hard_swish's multiplication and 0 through relu of -inf."""
    x, f, b = _data(1, 8, 9, 20, 3, seed=2)
    f = np.abs(f) + 0.1
    x[0, 0, 4, 10] = np.nan
    x[0, 1, 4, 10] = np.inf
    x[0, 2, 4, 10] = -np.inf
    for act, alpha, beta in (("relu", None, None), ("hard_swish", 1 / 6, 0.5)):
        y = _run(8, x, f, b, (1, 1), (1, 1, 1, 1), act, alpha, beta)
        assert np.isnan(y[0, 0, 3:6, 9:12]).all() and not np.isnan(y[0, 0, :2]).any()
        assert np.isposinf(y[0, 1, 3:6, 9:12]).all()
        assert (y[0, 2, 3:6, 9:12] == 0).all() if act == "relu" else np.isnan(y[0, 2, 3:6, 9:12]).all()


def _stock(x, f, b, strides, pads, act: str):
    """Depthwise Conv (+ the activation as ONNX ops) in stock ORT at ORT_DISABLE_ALL, plain layout."""
    c = x.shape[1]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, strides=list(strides), pads=list(pads))]
    if act == "hard_swish":
        nodes.append(helper.make_node("HardSwish", ["c"], ["y"]))
    elif act == "quick_gelu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif act == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    else:
        nodes[0].output[0] = "y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(f, "w"), numpy_helper.from_array(b, "b")])
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnxruntime.InferenceSession(model.SerializeToString(), so).run(None, {"x": x})[0]


@pytest.mark.parametrize("act", ["", "relu", "hard_swish", "quick_gelu"])
@pytest.mark.parametrize("k, strides", [(3, (2, 2)), (5, (1, 1))])
def test_kernel_matches_stock_ort(act, k, strides):
    x, f, b = _data(1, 48, 30, 22, k, seed=3)
    pads = (k // 2,) * 4
    alpha, beta = {"hard_swish": (1 / 6, 0.5), "quick_gelu": (1.0, None)}.get(act, (None, None))
    y = _run(8, x, f, b, strides, pads, act, alpha, beta)
    assert _close(y, _stock(x, f, b, strides, pads, act)) <= TOL


@pytest.mark.parametrize("attrs, x_shape, f_shape, b_shape, text", [
    ({}, (1, 16, 6, 6), (16, 1, 4, 4), (16,), "F the shape"),
    ({}, (1, 16, 6, 6), (8, 1, 3, 3), (16,), "F the shape"),
    ({}, (1, 16, 6, 6), (16, 2, 3, 3), (16,), "F the shape"),
    ({}, (1, 16, 6, 6), (16, 1, 3, 3), (8,), "B the shape"),
    ({}, (16, 6, 6), (16, 1, 3, 3), (16,), "X must have rank 4"),
    ({}, (1, 12, 6, 6), (12, 1, 3, 3), (12,), "block must be 8 or 16"),
    ({"block": 4}, (1, 16, 6, 6), (16, 1, 3, 3), (16,), "block must be 8 or 16"),
    ({"strides": [1, 3]}, (1, 16, 6, 6), (16, 1, 3, 3), (16,), "strides must be"),
    ({"strides": [0, 1]}, (1, 16, 6, 6), (16, 1, 3, 3), (16,), "strides must be"),
    ({"strides": [1]}, (1, 16, 6, 6), (16, 1, 3, 3), (16,), "strides must be"),
    ({"pads": [3, 1, 1, 1]}, (1, 16, 6, 6), (16, 1, 3, 3), (16,), "pads 4 values below K"),
    ({"pads": [0, 0, 0]}, (1, 16, 6, 6), (16, 1, 3, 3), (16,), "pads 4 values below K"),
    ({"pads": [0, 0, 0, 0]}, (1, 16, 2, 6), (16, 1, 3, 3), (16,), "at least K on each side"),
])
def test_kernel_refuses_other_shapes_with_an_ort_error(attrs, x_shape, f_shape, b_shape, text):
    a = {"block": 8, "strides": [1, 1], "pads": [1, 1, 1, 1], **attrs}
    feeds = {"x": np.ones(x_shape, np.float32), "f": np.ones(f_shape, np.float32), "b": np.ones(b_shape, np.float32)}
    with pytest.raises(InvalidArgument, match=text):
        _session(a["block"], a["strides"], a["pads"]).run(None, feeds)


def test_kernel_refuses_other_element_types():
    feeds = {"x": np.ones((1, 8, 4, 4), np.float64), "f": np.ones((8, 1, 3, 3), np.float32),
             "b": np.ones(8, np.float32)}
    with pytest.raises(InvalidArgument, match=r"expected: \(tensor\(float"):
        _session(8).run(None, feeds)


def test_orts_blocked_depthwise_filter_is_the_kernels_layout(tmp_path):
    """ORT's NCHWc depthwise filter (as it saves it) is pack_filter of the model's, value for value,
    and the candidate reads its activation and parameters."""
    block = block_size()
    if block not in (8, 16):
        pytest.skip(f"ORT has no NCHWc block of 8 or 16 on this CPU (block {block})")
    c = 2 * block
    x, f, b = _data(1, c, 9, 9, 5)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w0"], ["a"]),
                               helper.make_node("Conv", ["a", "w", "b"], ["c"], group=c, pads=[2, 2, 2, 2]),
                               helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4)], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.eye(c, dtype=np.float32)[:, :, None, None], "w0"),
                               numpy_helper.from_array(f, "w"), numpy_helper.from_array(b, "b")])
    so = onnxruntime.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    onnxruntime.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                 .SerializeToString(), so)
    opt = onnx.load(so.optimized_model_filepath)
    inits = {t.name: t for t in opt.graph.initializer}
    convs = [n for n in opt.graph.node if n.op_type == "Conv" and n.domain == winograd.NCHWC]
    found = [(n, depthwise._candidate(n, inits, block)) for n in convs]
    hits = [(n, cand) for n, cand in found if cand is not None]
    assert len(hits) == 1  # the 1x1 conv is not a candidate
    node, (k, strides, pads, (act, alpha, beta)) = hits[0]
    assert (k, strides, pads, act) == (5, [1, 1], [2, 2, 2, 2], "hard_sigmoid")
    assert np.allclose([alpha, beta], [0.3, 0.4])
    wb = numpy_helper.to_array(inits[node.input[1]])
    assert np.array_equal(wb, pack_filter(f, block)) and np.array_equal(unpack_filter(wb, block), f)


def _silu_model(c: int = 32, size: int = 20) -> onnx.ModelProto:
    """Conv 1x1 -> depthwise 3x3 + SiLU (Sigmoid, Mul) -> depthwise 5x5 stride 2 + HardSwish -> Conv
    1x1: ORT blocks every conv, folds HardSwish and leaves SiLU as QuickGelu."""
    w = fan_in_weights(7)

    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Conv", ["a", "w1", "b1"], ["c1"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["m1"]),
             helper.make_node("Conv", ["m1", "w2", "b2"], ["c2"], group=c, pads=[2, 2, 2, 2], strides=[2, 2]),
             helper.make_node("HardSwish", ["c2"], ["h2"]),
             helper.make_node("Conv", ["h2", "w3"], ["y"])]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, size, size])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, size // 2, size // 2])
    graph = helper.make_graph(nodes, "g", [x], [y],
                              [w("w0", c, 16, 1, 1), w("w1", c, 1, 3, 3), w("b1", c), w("w2", c, 1, 5, 5), w("b2", c),
                               w("w3", 8, c, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", ["on", "off"])
def test_layout_runs_depthwise_convs_natively_when_told(tmp_path, monkeypatch, mode):
    """ORTFUSE_WINOGRAD=on replaces both depthwise convs (SiLU folded, HardSwish kept from ORT's
    conv), off none; outputs as stock ORT_DISABLE_ALL."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    monkeypatch.setenv(winograd.ENV, mode)
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    model = _silu_model()
    x = np.random.default_rng(1).standard_normal((1, 16, 20, 20)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})[0]
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    if mode == "on":
        assert "2 of 2 depthwise conv(s) native" in note, note
        assert "1 with quick_gelu" in note and "1 with hard_swish" in note, note
    else:
        assert "depthwise conv(s) native" not in note, note
    assert _close(sess.run(None, {"x": x})[0], ref) <= TOL


def _affine_model(c: int = 32, size: int = 20, second_reader: bool = False) -> onnx.ModelProto:
    """Conv 1x1 + HardSwish -> x * a + b (PP-LCNetV3's learnable affine, scalars) -> depthwise 3x3
    (pads 1) + HardSwish -> Conv 1x1; ``second_reader``: the affine's output is also a graph output."""
    w = fan_in_weights(11)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"]), helper.make_node("HardSwish", ["a"], ["h"]),
             helper.make_node("Mul", ["h", "scale"], ["m"]), helper.make_node("Add", ["m", "shift"], ["t"]),
             helper.make_node("Conv", ["t", "w1", "b1"], ["c1"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h1"]), helper.make_node("Conv", ["h1", "w2"], ["y"])]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, size, size])
    outs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, size, size])]
    if second_reader:
        outs.append(helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [1, c, size, size]))
    affine = [numpy_helper.from_array(np.array([v], np.float32), n) for n, v in (("scale", 0.8), ("shift", 0.45))]
    graph = helper.make_graph(nodes, "g", [x], outs, [w("w0", c, 16, 1, 1), w("b0", c), w("w1", c, 1, 3, 3),
                                                      w("b1", c), w("w2", 8, c, 1, 1), *affine])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("second_reader", [False, True])
def test_an_affine_chain_before_a_depthwise_conv_becomes_its_prologue(tmp_path, monkeypatch, second_reader):
    """ORTFUSE_DEPTHWISE=on: the scalar Mul + Add before the depthwise conv runs inside it (the note
    says so, no chain is left before it), unless something else reads the chain's output; outputs as
    stock ORT_DISABLE_ALL, the border included (the padding is of the affine's output)."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    monkeypatch.setenv(depthwise.ENV, "on")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    model = _affine_model(second_reader=second_reader)
    x = np.random.default_rng(3).standard_normal((1, 16, 20, 20)).astype(np.float32)
    refs = disable_all_outputs(model, {"x": x})
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    assert "1 of 1 depthwise conv(s) native" in note, note
    assert ("affine chain before it as its prologue" in note) != second_reader, note
    for got, ref in zip(sess.run(None, {"x": x}), refs):
        assert _close(got, ref) <= TOL


def _output_map_model(consumer: str, c: int = 32, size: int = 20) -> onnx.ModelProto:
    """Conv 1x1 + HardSwish -> depthwise 3x3 (pads 1) + HardSwish -> x * a + b (scalars) -> a
    squeeze-excite block (``consumer`` "se": GlobalAveragePool, two 1x1 convs, HardSigmoid, the scale,
    which ORT runs unblocked: the chain follows a ReorderOutput) or a padded 3x3 conv ("conv": the
    chain stays blocked) -> Conv 1x1."""
    w = fan_in_weights(12)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"]), helper.make_node("HardSwish", ["a"], ["h"]),
             helper.make_node("Conv", ["h", "w1", "b1"], ["c1"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c1"], ["h1"]),
             helper.make_node("Mul", ["h1", "scale"], ["m"]), helper.make_node("Add", ["m", "shift"], ["t"])]
    inits = [w("w0", c, 16, 1, 1), w("b0", c), w("w1", c, 1, 3, 3), w("b1", c), w("w4", 8, c, 1, 1)]
    if consumer == "se":
        nodes += [helper.make_node("GlobalAveragePool", ["t"], ["p"]),
                  helper.make_node("Conv", ["p", "w2", "b2"], ["q"]), helper.make_node("Relu", ["q"], ["r"]),
                  helper.make_node("Conv", ["r", "w3", "b3"], ["u"]),
                  helper.make_node("HardSigmoid", ["u"], ["g"]), helper.make_node("Mul", ["t", "g"], ["e"])]
        inits += [w("w2", c // 4, c, 1, 1), w("b2", c // 4), w("w3", c, c // 4, 1, 1), w("b3", c)]
    else:
        nodes.append(helper.make_node("Conv", ["t", "w2", "b2"], ["e"], pads=[1, 1, 1, 1]))
        inits += [w("w2", c, c, 3, 3), w("b2", c)]
    nodes.append(helper.make_node("Conv", ["e", "w4"], ["y"]))
    affine = [numpy_helper.from_array(np.array([v], np.float32), n) for n, v in (("scale", 1.3), ("shift", -0.2))]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, size, size])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, size, size])
    graph = helper.make_graph(nodes, "g", [x], [y], inits + affine)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("consumer", ["se", "conv"])
def test_an_affine_chain_after_a_depthwise_conv_becomes_its_output_map(tmp_path, monkeypatch, consumer):
    """ORTFUSE_DEPTHWISE=on: the scalar Mul + Add after the depthwise conv's HardSwish runs inside it,
    whether it followed the region's ReorderOutput (a squeeze-excite block after it) or stayed on
    blocks (a padded conv after it); no chain is left in the plan; outputs as stock ORT_DISABLE_ALL."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    monkeypatch.setenv(depthwise.ENV, "on")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    model = _output_map_model(consumer)
    x = np.random.default_rng(4).standard_normal((1, 16, 20, 20)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})[0]
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    assert "1 of 1 depthwise conv(s) native" in note, note
    assert "1 with the affine chain after it as its output map" in note, note
    plans = list((tmp_path / "plans").glob("*.onnx"))  # the plan the session runs, kept in the cache
    assert len(plans) == 1, plans
    ops = [n.op_type for n in onnx.load(str(plans[0])).graph.node]
    assert depthwise.OP in ops and not [op for op in ops if op.startswith(depthwise.CHAIN_PREFIX)], ops
    assert _close(sess.run(None, {"x": x})[0], ref) <= TOL


@pytest.mark.parametrize("program, operands, expected", [
    ([("Mul", ["x", "c0"]), ("Add", ["c1", "x"])], (0.5, 2.0), (0.5, 2.0)),
    ([("Add", ["x", "c0"]), ("Mul", ["c1", "x"])], (1.0, 3.0), (3.0, 3.0)),  # (x + 1) * 3
    ([("Sub", ["x", "c0"])], (0.25, 9.0), (1.0, -0.25)),
    ([("Sub", ["c0", "x"])], (0.25, 9.0), None),  # c - x: not written as the op's prologue
    ([("Mul", ["x", "c0"]), ("Relu", None)], (2.0, 0.0), None),
    ([("Div", ["x", "c0"])], (2.0, 0.0), None),
])
def test_which_chains_are_affine(program, operands, expected):
    import json

    steps = [{"op": op, **({"args": args} if args else {})} for op, args in program]
    inits = {f"k{i}": numpy_helper.from_array(np.array([v], np.float32), f"k{i}") for i, v in enumerate(operands)}
    program = json.dumps(steps)
    node = helper.make_node("FusedEltwiseChain2", ["x", "k0", "k1"], ["y"], domain=depthwise.DOMAIN,
                            program=program, **depthwise.chain_attrs({"program": program}))
    assert depthwise._affine_chain(node, inits) == expected
    inits["k0"] = numpy_helper.from_array(np.ones(4, np.float32), "k0")  # a per-channel operand: not a scalar
    assert depthwise._affine_chain(node, inits) is None


@pytest.mark.parametrize("folds, ops", [
    ((0.7, -0.4, 1.0, 0.0), ["ReorderInput", depthwise.PROBE_CHAIN, "Conv", "ReorderOutput"]),
    ((1.0, 0.0, 1.3, 0.2), ["ReorderInput", "Conv", depthwise.PROBE_CHAIN, "ReorderOutput"]),
    ((0.7, -0.4, 1.3, 0.2), ["ReorderInput", depthwise.PROBE_CHAIN, "Conv", depthwise.PROBE_CHAIN, "ReorderOutput"]),
])
def test_the_fold_probes_time_the_same_math_both_ways(folds, ops):
    """The timing probe of a conv with a prologue, an output map or both: ORT's form holds the affine
    chains before and after ORT's blocked conv, the native form the op with in_scale/in_shift and
    out_scale/out_shift; both give the same outputs."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    from ortfuse.foundation.session_options import measuring_options
    from ortfuse.kernel_choice.op_registration import with_custom_ops

    block = block_size()
    shape = depthwise.Shape(2 * block, 9, 13, 3, (1, 1), (1, 1, 1, 1), "hard_swish", 1 / 6, 0.5, *folds)
    stock, native = depthwise.pair_models(shape, block)
    assert [n.op_type for n in onnx.load_from_string(stock).graph.node] == ops
    x = np.random.default_rng(4).standard_normal((1, shape.c, shape.h, shape.w)).astype(np.float32)
    level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    outs = []
    for model, ops in ((stock, {depthwise.PROBE_CHAIN}), (native, {OP})):
        so, why_not = with_custom_ops(measuring_options(level), frozenset(ops), python_ops=False)
        assert not why_not, why_not
        outs.append(onnxruntime.InferenceSession(model, so).run(None, {"x": x})[0])
    assert _close(outs[1], outs[0]) <= TOL


def test_the_decision_is_measured_and_kept_per_shape(monkeypatch):
    """measure mode times both forms once per shape (cached in the process); off never replaces;
    a decider saying no keeps ORT's conv and counts it."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    depthwise.measured_faster.cache_clear()
    monkeypatch.setenv(winograd.ENV, "measure")
    decide = depthwise.decider(block_size(), 1)
    shape = depthwise.Shape(2 * block_size(), 12, 12, 3, (1, 1), (1, 1, 1, 1), "quick_gelu", 1.0)
    first = decide(shape)
    assert isinstance(first, bool)
    assert decide(shape) == first and depthwise.measured_faster.cache_info().hits == 1
    graph = onnx.load_from_string(_silu_model().SerializeToString()).graph
    monkeypatch.setenv(winograd.ENV, "off")
    assert not depthwise.run_depthwise(graph, {}, 8, lambda s: True).replaced


def test_the_planner_looks_at_depthwise_convs_only(monkeypatch):
    """may_replace: a Conv with group C and a [C, 1, K, K] filter initializer, K 3 or 5."""
    inits = [numpy_helper.from_array(np.zeros(s, np.float32), n)
             for n, s in (("w3", (8, 1, 3, 3)), ("w5", (8, 1, 5, 5)), ("w7", (8, 1, 7, 7)), ("g", (8, 2, 3, 3)))]
    graph = helper.make_graph([], "g", [], [], inits)
    monkeypatch.setenv(winograd.ENV, "measure")
    assert depthwise.may_replace(helper.make_node("Conv", ["x", "w3"], ["y"], group=8), graph)
    assert depthwise.may_replace(helper.make_node("Conv", ["x", "w5"], ["y"], group=8, strides=[2, 2]), graph)
    assert not depthwise.may_replace(helper.make_node("Conv", ["x", "w7"], ["y"], group=8), graph)
    assert not depthwise.may_replace(helper.make_node("Conv", ["x", "g"], ["y"], group=4), graph)
    assert not depthwise.may_replace(helper.make_node("Conv", ["x", "w3"], ["y"]), graph)
    monkeypatch.setenv(winograd.ENV, "off")
    assert not depthwise.may_replace(helper.make_node("Conv", ["x", "w3"], ["y"], group=8), graph)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenetv3_block", "pplcnet_classifier", "picodet_layout", "db_text_detector"])
def test_zoo_models_with_every_depthwise_conv_native_match_stock_ort(tmp_path, monkeypatch, name):
    """The decision forced on for depthwise convs only (Winograd and ConvTranspose measured off):
    every candidate is replaced, and the model's outputs equal stock ORT_DISABLE_ALL's."""
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(depthwise, "decider", lambda block, threads, cold=False: lambda shape: True)
    monkeypatch.setattr(winograd, "decider", lambda block, threads, cold=False: lambda *a: False)
    from ortfuse.layout import deconv
    monkeypatch.setattr(deconv, "decider", lambda block, threads, cold=False: lambda *a: False)
    path = str(models.build(name))
    feeds = models.sample_inputs(name)
    ref = disable_all_outputs(path, feeds)
    sess = ortfuse.InferenceSession(path, fusion=True)
    note = str(sess.fusion_report)
    assert "depthwise conv(s) native" in note and ", 0 left to ORT's" in note, note
    for got, r in zip(sess.run(None, feeds), ref):
        assert _close(got, r) <= TOL
