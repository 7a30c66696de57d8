"""conv_act and conv_add_relu: one positive case per form each claims to match, a negative case
for every rejection reason, and the regression tests of bugs found in them (``test_bug_*``). What
the checks assert: tests/pattern_checks.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ortfuse import fuse
from ortfuse.kernel_choice import registry

from pattern_checks import (
    Case,
    assert_fused,
    assert_rejected,
    assert_same_outcome_as_stock,
    case,
    conv,
    conv_add_relu_residual_input,
    conv_bn_relu,
    conv_relu,
    reject_reasons,
    spec_attrs,
)
from pattern_graphs import (
    CONV_EPILOGUES,
    GraphBuilder,
    assert_outputs_close,
    bn_params,
    fused_groups,
    node_attrs,
    run_ortfuse,
    run_stock,
)


# =============================================================================================
# conv_act: Conv [-> Add(bias)] [-> BatchNormalization] [-> epilogue] -> FusedConvAct
# =============================================================================================
def conv_nobias_relu_batch2():
    b = GraphBuilder()
    c = conv(b, b.input("x", [2, 3, 5, 7]), 3, 4, bias=False, pads=[1, 1, 1, 1])
    b.output(b.op("Relu", [c], name="relu"))
    return case(b, ("conv_act", ["conv", "relu"]), attrs=[{"pads": "1,1,1,1"}])


def conv_bn_no_epilogue():
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 3, 9, 7]), 3, 6, bias=False)
    b.output(b.op("BatchNormalization", [c, *bn_params(b, 6)], name="bn"))
    return case(b, ("conv_act", ["conv", "bn"]), attrs=[{"activation": ""}], scale_atol=True)


def conv_const_nodes_bias_reshape_add_bn_relu():
    """Exporter style: weights in Constant nodes, the bias as Constant -> Reshape -> Add."""
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 3, 7, 5]), 3, 5, bias=False, as_node=True, pads=[1, 1, 1, 1])
    bias = b.op("Reshape", [b.const_node(b.weight(5)), b.const_node(np.array([1, 5, 1, 1], np.int64))],
                name="bias_reshape")
    a = b.op("Add", [c, bias], name="bias_add")
    n = b.op("BatchNormalization", [a, *bn_params(b, 5, as_node=True)], name="bn")
    b.output(b.op("Relu", [n], name="relu"))
    return case(b, ("conv_act", ["conv", "bias_add", "bn", "relu"]), scale_atol=True)


def conv_bias_add_left_3d_const():
    """Add(bias[M,1,1], conv) with the bias first."""
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 2, 6, 5]), 2, 3, bias=False)
    a = b.op("Add", [b.init(b.weight((3, 1, 1))), c], name="bias_add")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("conv_act", ["conv", "bias_add", "relu"]))


def conv_bn_relu_outputs_kept_as_graph_output_of_last_node():
    """The fused op writes the same tensor name the replaced subgraph wrote."""
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 3, 5, 5]), 3, 2)
    r = b.op("Relu", [c], name="relu", out="y")
    b.output(b.op("Neg", [r], name="after"), r)
    return case(b, ("conv_act", ["conv", "relu"]))


@pytest.mark.parametrize("build", [
    conv_relu, conv_nobias_relu_batch2, conv_bn_relu, conv_bn_no_epilogue, conv_const_nodes_bias_reshape_add_bn_relu,
    conv_bias_add_left_3d_const, conv_bn_relu_outputs_kept_as_graph_output_of_last_node,
], ids=lambda f: f.__name__)
def test_conv_act_forms(build):
    assert_fused(build())


EPILOGUE_OPSETS = [(name, opset) for name, (_, lo, hi, *_rest) in CONV_EPILOGUES.items()
                   for opset in (7, 10, 13, 14, 17) if lo <= opset <= hi
                   and (opset >= 11 or "clip" in name or "hardswish_" in name)
                   and (opset != 14 or name == "hardswish_op")]


@pytest.mark.parametrize("epilogue,opset", EPILOGUE_OPSETS, ids=[f"{e}-opset{o}" for e, o in EPILOGUE_OPSETS])
@pytest.mark.parametrize("with_bn", [False, True], ids=["conv", "conv_bn"])
def test_conv_epilogue(epilogue, opset, with_bn):
    """Every conv epilogue, Clip through attributes (opset 7, 10) and through inputs (13, 17)."""
    builder, _, _, kind, alpha, beta = CONV_EPILOGUES[epilogue]
    b = GraphBuilder(opset=opset)
    t = conv(b, b.input("x", [1, 3, 7, 9], low=-4, high=4), 3, 5, pads=[1, 0, 1, 2])
    nodes = ["conv"]
    if with_bn:
        t = b.op("BatchNormalization", [t, *bn_params(b, 5)], name="bn")
        nodes.append("bn")
    out, names = builder(b, t, "e_", as_node=opset >= 13)
    b.output(out)
    c = case(b, ("conv_act", nodes + names), attrs=[{"activation": kind, "alpha": alpha, "beta": beta}],
             scale_atol=True)
    assert_fused(c)


GEOMETRIES = {
    "grouped": {"cin": 6, "m": 9, "k": (3, 3), "group": 3},
    "depthwise": {"cin": 5, "m": 5, "k": (3, 3), "group": 5, "pads": [1, 1, 1, 1]},
    "depthwise_multiplier2": {"cin": 4, "m": 8, "k": (3, 3), "group": 4},
    "strides_2_1": {"cin": 3, "m": 4, "k": (3, 3), "strides": [2, 1]},
    "asymmetric_pads": {"cin": 3, "m": 4, "k": (3, 2), "pads": [1, 0, 2, 1]},
    "dilations_2_3": {"cin": 3, "m": 4, "k": (3, 3), "dilations": [2, 3]},
    "strides_pads_dilations_grouped": {"cin": 4, "m": 6, "k": (3, 3), "group": 2, "strides": [2, 2],
                                       "pads": [2, 1, 1, 2], "dilations": [2, 1]},
    "pointwise_1x1": {"cin": 7, "m": 3, "k": (1, 1)},
    "kernel_5x1": {"cin": 3, "m": 4, "k": (5, 1), "pads": [2, 0, 2, 0]},
    "auto_pad_valid": {"cin": 3, "m": 4, "k": (3, 3), "auto_pad": "VALID", "strides": [2, 2]},
    "auto_pad_notset_explicit": {"cin": 3, "m": 4, "k": (3, 3), "auto_pad": "NOTSET", "pads": [1, 1, 1, 1]},
}


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_conv_geometry(geometry):
    """Grouped/depthwise convs, strides, pads, dilations, auto_pad=VALID, with BN and Relu."""
    g = dict(GEOMETRIES[geometry])
    b = GraphBuilder()
    cin, m = g.pop("cin"), g.pop("m")
    c = conv(b, b.input("x", [2, cin, 11, 9]), cin, m, **g)
    n = b.op("BatchNormalization", [c, *bn_params(b, m)], name="bn")
    b.output(b.op("Relu", [n], name="relu"))
    c = case(b, ("conv_act", ["conv", "bn", "relu"]), scale_atol=True)
    fused, _ = assert_fused(c)
    (a,) = spec_attrs(c).values()
    assert a["group"] == GEOMETRIES[geometry].get("group", 1)
    if geometry == "auto_pad_valid":
        assert a["pads"] == "0,0,0,0"
    # the default path lowers it to one FusedConv carrying the same geometry
    (lowered,) = fused_groups(fused).values()
    assert [(n.domain, n.op_type) for n in lowered] == [("com.microsoft", "FusedConv")]
    la = node_attrs(lowered[0])
    assert la["group"] == a["group"] and la["pads"] == [int(p) for p in a["pads"].split(",")]
    assert la["strides"] == GEOMETRIES[geometry].get("strides", [1, 1]) and la["activation"] == "Relu"
    assert la["dilations"] == GEOMETRIES[geometry].get("dilations", [1, 1])


def test_opset6_model_is_left_to_ort():
    """Below opset 7 (the oldest ORT guarantees) ortfuse does not rewrite; the model runs as stock."""
    b = GraphBuilder(opset=6)
    c = conv(b, b.input("x", [1, 3, 5, 7]), 3, 4)
    b.output(b.op("Clip", [c], name="clip", min=0.0, max=6.0))
    model = b.build()
    fused, report = fuse(model)
    assert not report.applied and "opset 6 is below 7" in report.reason
    assert fused.SerializeToString() == model.SerializeToString()
    assert_same_outcome_as_stock(Case(model, b.feeds(), []))


def test_conv_clip_min_only():
    """Clip with only a min input (max omitted) after a conv: max is +inf."""
    b = GraphBuilder(opset=13)
    c = conv(b, b.input("x", [1, 3, 5, 7]), 3, 4)
    b.output(b.op("Clip", [c, b.init(np.float32(-0.2))], name="clip"))
    assert_fused(case(b, ("conv_act", ["conv", "clip"]), attrs=[{"activation": "clip", "alpha": -0.2}]))


def test_conv_bn_then_relu_when_bn_output_is_graph_output_fuses_conv_bn_only():
    """The epilogue cannot be taken (its input is a graph output): Conv+BN is fused alone and
    the Relu still reads the BN output, which stays available."""
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 3, 5, 7]), 3, 4)
    n = b.op("BatchNormalization", [c, *bn_params(b, 4)], name="bn")
    b.output(b.op("Relu", [n], name="relu"), n)
    fused, _ = assert_fused(case(b, ("conv_act", ["conv", "bn"]), scale_atol=True))
    assert [n.name for n in fused.graph.node if not n.doc_string.startswith("ortfuse ")] == ["relu"]


# --- conv_act: rejections --------------------------------------------------------------------
def _conv_relu_with(weight_input=False, rank=2, auto_pad=None, dtype=np.float32, opset=17):
    b = GraphBuilder(dtype=dtype, opset=opset)
    x = b.input("x", [1, 3] + [7, 6, 5][:rank])
    k = (3,) * rank
    w = b.input("W", [4, 3, *k]) if weight_input else b.init(b.weight((4, 3, *k)))
    attrs = {"auto_pad": auto_pad} if auto_pad else {}
    c = b.op("Conv", [x, w], name="conv", **attrs)
    b.output(b.op("Relu", [c], name="relu"))
    return case(b)


def test_conv_weight_not_constant_is_rejected():
    assert_rejected(_conv_relu_with(weight_input=True), "conv_act", "Conv weight 'W' is not a constant",
                    nodes=["conv"], others_fused=[])


def test_conv_weight_overridable_initializer_is_rejected():
    """An initializer that is also a graph input can be fed at run time: not a constant."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 5, 5])
    w = b.init(b.weight((2, 3, 3, 3)), name="W")
    b.inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [2, 3, 3, 3]))
    b.output(b.op("Relu", [b.op("Conv", [x, w], name="conv")], name="relu"))
    model = b.build()
    c = Case(model, {"x": b.feeds()["x"]}, [])
    assert_rejected(c, "conv_act", "Conv weight 'W' is not a constant")
    w2 = np.ones((2, 3, 3, 3), np.float32)  # the overriding feed is honoured
    ref = run_stock(model, {**c.feeds, "W": w2})
    got, _ = run_ortfuse(model, {**c.feeds, "W": w2}, fusion=True)
    assert_outputs_close(got, ref)


def test_conv_1d_is_rejected():
    assert_rejected(_conv_relu_with(rank=1), "conv_act", "only 2-D convolutions are fused (weight rank 3)",
                    others_fused=[])


def test_conv_3d_is_rejected():
    assert_rejected(_conv_relu_with(rank=3), "conv_act", "only 2-D convolutions are fused (weight rank 5)",
                    others_fused=[])


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_auto_pad_same_is_rejected(auto_pad):
    assert_rejected(_conv_relu_with(auto_pad=auto_pad), "conv_act", f"Conv auto_pad={auto_pad} is not supported",
                    others_fused=[])


@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=["float16", "float64"])
def test_conv_non_float32_is_rejected(dtype):
    name = np.dtype(dtype).name
    assert_rejected(_conv_relu_with(dtype=dtype), "conv_act", f"no kernel for dtype {name}", others_fused=[])


def test_conv_bias_not_constant_is_rejected():
    b = GraphBuilder()
    x, bias = b.input("x", [1, 3, 5, 5]), b.input("B", [4])
    c = b.op("Conv", [x, b.init(b.weight((4, 3, 3, 3))), bias], name="conv")
    b.output(b.op("Relu", [c], name="relu"))
    assert_rejected(case(b), "conv_act", "Conv bias 'B' is not a constant", others_fused=[])


def test_conv_bn_training_mode_is_not_folded():
    """BN with training outputs is not folded into the weights (Conv+Relu stays unfused)."""
    b = GraphBuilder(opset=14)
    c = conv(b, b.input("x", [2, 3, 5, 5]), 3, 4)
    outs = b.op("BatchNormalization", [c, *bn_params(b, 4)], name="bn", n_out=3, training_mode=1)
    b.output(b.op("Relu", [outs[0]], name="relu"), outs[1])
    c = case(b)
    _, report = fuse(c.model)
    assert not any("bn" in m.nodes for m in report.fused), report.table()
    assert_same_outcome_as_stock(c)


# =============================================================================================
# conv_add_relu: Conv [-> Add(bias)] [-> BN] -> Add(residual) -> Relu -> FusedConvAddAct
# =============================================================================================
def conv_bn_add_relu_identity_shortcut():
    """ResNet basic block tail: relu(bn(conv(x)) + x)."""
    b = GraphBuilder()
    x = b.input("x", [2, 4, 7, 5])
    c = conv(b, x, 4, 4, bias=False, pads=[1, 1, 1, 1])
    n = b.op("BatchNormalization", [c, *bn_params(b, 4)], name="bn")
    a = b.op("Add", [x, n], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("conv_add_relu", ["conv", "bn", "add", "relu"]), scale_atol=True)


def conv_add_relu_residual_from_other_conv():
    """Projection shortcut: relu(conv1(x) + conv2(x)); conv1 takes the Add and Relu, conv2 stays."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 9, 7])
    c1 = conv(b, x, 3, 4, k=(3, 3), strides=[2, 2], pads=[1, 1, 1, 1], name="conv1")
    c2 = conv(b, x, 3, 4, k=(1, 1), strides=[2, 2], name="conv2")
    a = b.op("Add", [c1, c2], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("conv_add_relu", ["conv1", "add", "relu"]))


def conv_bias_reshape_add_residual_relu():
    b = GraphBuilder()
    x, r = b.input("x", [1, 2, 6, 6]), b.input("res", [1, 3, 4, 4])
    c = conv(b, x, 2, 3, bias=False, as_node=True)
    bias = b.op("Reshape", [b.const_node(b.weight(3)), b.const_node(np.array([3, 1, 1], np.int64))], name="bias_shape")
    a0 = b.op("Add", [c, bias], name="bias_add")
    a = b.op("Add", [a0, r], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("conv_add_relu", ["conv", "bias_add", "add", "relu"]))


@pytest.mark.parametrize("build", [
    conv_add_relu_residual_input, conv_bn_add_relu_identity_shortcut, conv_add_relu_residual_from_other_conv,
    conv_bias_reshape_add_residual_relu,
], ids=lambda f: f.__name__)
def test_conv_add_relu_forms(build):
    assert_fused(build())


def test_conv_add_relu_residual_of_different_shape_is_rejected():
    """A residual [1, M, 1, 1] broadcast over the conv output is not this pattern."""
    b = GraphBuilder()
    x, r = b.input("x", [1, 3, 5, 7]), b.input("res", [1, 4, 1, 1])
    c = conv(b, x, 3, 4)
    b.output(b.op("Relu", [b.op("Add", [c, r], name="add")], name="relu"))
    _, report = assert_rejected(case(b), "conv_add_relu",
                                "residual shape [1, 4, 1, 1] differs from the conv output shape [1, 4, 3, 5]",
                                nodes=["conv", "add", "relu"])
    # Add+Relu of two run-time tensors is then add_relu's
    assert [m.pattern_id for m in report.fused] == ["add_relu"]


def test_conv_add_relu_residual_of_other_rank_is_rejected():
    b = GraphBuilder()
    x, r = b.input("x", [1, 3, 5, 7]), b.input("res", [7])
    c = conv(b, x, 3, 4, pads=[1, 1, 1, 1])
    b.output(b.op("Relu", [b.op("Add", [c, r], name="add")], name="relu"))
    assert_rejected(case(b), "conv_add_relu", "residual shape [7] differs")


CONV_PROBLEMS = {  # problem: (dtype, conv rank, weight is a graph input, auto_pad, residual shape, reason)
    "weight_input": (np.float32, 2, True, None, [1, 4, 3, 5], "Conv weight 'W' is not a constant"),
    "conv_1d": (np.float32, 1, False, None, [1, 4, 3], "only 2-D convolutions are fused (weight rank 3)"),
    "auto_pad_same_upper": (np.float32, 2, False, "SAME_UPPER", [1, 4, 5, 7],
                            "Conv auto_pad=SAME_UPPER is not supported"),
    "float16": (np.float16, 2, False, None, [1, 4, 3, 5], "no kernel for dtype float16"),
}


@pytest.mark.parametrize("problem", list(CONV_PROBLEMS))
def test_conv_add_relu_conv_problems_are_reported_by_conv_act(problem):
    """conv_add_relu leaves the Conv's own problems to conv_act, which reports them; the
    Add+Relu of two run-time tensors is then add_relu's (in float16 only with the native float16 kernel)."""
    dtype, rank, weight_input, auto_pad, res_shape, reason = CONV_PROBLEMS[problem]
    b = GraphBuilder(dtype=dtype)
    x, r = b.input("x", [1, 3, 5, 7][: 2 + rank]), b.input("res", res_shape)
    k = [3] * rank
    w = b.input("W", [4, 3, *k]) if weight_input else b.init(b.weight((4, 3, *k)))
    c = b.op("Conv", [x, w], name="conv", **({"auto_pad": auto_pad} if auto_pad else {}))
    b.output(b.op("Relu", [b.op("Add", [c, r], name="add")], name="relu"))
    assert_rejected(case(b), "conv_act", reason, nodes=["conv"],
                    others_fused=["add_relu"] if dtype == np.float32 or registry._native_ops() else [])


# =============================================================================================
# regression tests of bugs found (and fixed)
# =============================================================================================
def test_bug_conv_add_vector_bias_broadcasts_over_width_values():
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 3, 6, 6]), 3, 4, bias=False)  # output [1, 4, 4, 4]: W == M == 4
    a = b.op("Add", [c, b.init(np.arange(4, dtype=np.float32))], name="bias")
    b.output(b.op("Relu", [a], name="relu"))
    assert_same_outcome_as_stock(case(b))


def test_bug_conv_add_vector_bias_broadcasts_over_width_shape():
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 3, 5, 3]), 3, 4, bias=False)  # output [1, 4, 3, 1]
    a = b.op("Add", [c, b.init(np.arange(4, dtype=np.float32))], name="bias")
    b.output(b.op("Relu", [a], name="relu"))
    assert_same_outcome_as_stock(case(b))


def test_bug_batchnorm_spatial0_crashes_fuse():
    b = GraphBuilder(opset=7)
    c = conv(b, b.input("x", [1, 3, 5, 5]), 3, 2)
    params = [b.init(b.rng.uniform(0.5, 1.5, (2, 3, 3))), b.init(b.weight((2, 3, 3))), b.init(b.weight((2, 3, 3))),
              b.init(b.rng.uniform(0.5, 1.5, (2, 3, 3)))]
    b.output(b.op("Relu", [b.op("BatchNormalization", [c, *params], name="bn", spatial=0)], name="relu"))
    assert_same_outcome_as_stock(case(b))


def test_bug_conv_add_relu_alone_gives_no_reason_for_conv_problems():
    b = GraphBuilder()
    x, w, r = b.input("x", [1, 3, 5, 5]), b.input("W", [3, 3, 3, 3]), b.input("res", [1, 3, 5, 5])
    c = b.op("Conv", [x, w], name="conv", pads=[1, 1, 1, 1])
    b.output(b.op("Relu", [b.op("Add", [c, r], name="add")], name="relu"))
    reasons = reject_reasons(b.build(), ["conv_add_relu"])
    assert ("conv_add_relu", "Conv weight 'W' is not a constant") in reasons


# =============================================================================================
# exporter details: fp16-stored weights, Unsqueeze'd biases
# =============================================================================================
def test_conv_weights_stored_float16_with_cast_and_unsqueezed_bias():
    """Weights kept as float16 initializers with Cast(to=float), bias Unsqueeze'd to [M, 1, 1]."""
    b = GraphBuilder(opset=13)
    x = b.input("x", [1, 3, 7, 5])
    b.initializers.append(onnx.numpy_helper.from_array(b.weight((4, 3, 3, 3)).astype(np.float16), "W16"))
    w = b.op("Cast", ["W16"], name="cast_w", to=TensorProto.FLOAT)
    cv = b.op("Conv", [x, w], name="conv")
    bias = b.op("Unsqueeze", [b.init(b.weight(4)), b.init(np.array([1, 2], np.int64))], name="unsq")
    a = b.op("Add", [cv, bias], name="bias_add")
    b.output(b.op("Relu", [a], name="relu"))
    fused, _ = assert_fused(case(b, ("conv_act", ["conv", "bias_add", "relu"])))
    assert not [n for n in fused.graph.node if n.op_type in ("Cast", "Unsqueeze")], "dead constant nodes left"
