"""gemm_act: one positive case per form it claims to match (Gemm, 2-D to 4-D MatMul, every
epilogue), a negative case for every rejection reason, and the regression tests of bugs found in it
(``test_bug_*``). What the checks assert: tests/pattern_checks.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from ortfuse import fuse

from pattern_checks import (
    assert_fused,
    assert_rejected,
    assert_same_outcome_as_stock,
    case,
    matmul3d_add_relu,
)
from pattern_graphs import (
    GEMM_EPILOGUES,
    GraphBuilder,
    epi_gelu_erf_tf,
    epi_gelu_erf_torch,
)


# =============================================================================================
# gemm_act: Gemm | MatMul [-> Add(bias)] -> Relu | Gelu | Relu -> Gelu -> FusedGemmAct
# =============================================================================================
def gemm_transb_alpha_beta_relu():
    b = GraphBuilder()
    x = b.input("x", [5, 7])
    g = b.op("Gemm", [x, b.init(b.weight((6, 7))), b.init(b.weight(6))], name="gemm", transB=1, alpha=0.7, beta=1.3)
    b.output(b.op("Relu", [g], name="relu"))
    return case(b, ("gemm_act", ["gemm", "relu"]), attrs=[{"activation": "relu"}], scale_atol=True)


def gemm_bias_row_1xN_relu():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    g = b.op("Gemm", [x, b.init(b.weight((5, 7))), b.init(b.weight((1, 7)))], name="gemm", beta=0.5)
    b.output(b.op("Relu", [g], name="relu"))
    return case(b, ("gemm_act", ["gemm", "relu"]))


def gemm_bias_scalar_relu():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    g = b.op("Gemm", [x, b.init(b.weight((5, 7))), b.init(np.array([0.25], np.float32))], name="gemm")
    b.output(b.op("Relu", [g], name="relu"))
    return case(b, ("gemm_act", ["gemm", "relu"]))


def gemm_no_bias_relu():
    b = GraphBuilder(opset=13)
    x = b.input("x", [1, 9])
    g = b.op("Gemm", [x, b.init(b.weight((3, 9)))], name="gemm", transB=1, alpha=2.0)
    b.output(b.op("Relu", [g], name="relu"))
    return case(b, ("gemm_act", ["gemm", "relu"]), scale_atol=True)


def gemm_weights_in_constant_nodes_gelu_erf():
    """Gemm + erf-Gelu (ORT leaves Gemm+Gelu unfused), weights in Constant nodes."""
    b = GraphBuilder()
    x = b.input("x", [5, 3])
    g = b.op("Gemm", [x, b.const_node(b.weight((3, 4))), b.const_node(b.weight(4))], name="gemm")
    out, names = epi_gelu_erf_torch(b, g, "", as_node=True)
    b.output(out)
    return case(b, ("gemm_act", ["gemm"] + names), attrs=[{"activation": "gelu"}])


def matmul2d_add_relu():
    b = GraphBuilder()
    x = b.input("x", [5, 7])
    h = b.op("MatMul", [x, b.init(b.weight((7, 3)))], name="mm")
    a = b.op("Add", [h, b.init(b.weight(3))], name="bias")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("gemm_act", ["mm", "bias", "relu"]))


def matmul3d_add_bias_1x1xN_relu():
    b = GraphBuilder()
    x = b.input("x", [3, 2, 5])
    h = b.op("MatMul", [x, b.init(b.weight((5, 3)))], name="mm")
    a = b.op("Add", [h, b.init(b.weight((1, 1, 3)))], name="bias")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("gemm_act", ["mm", "bias", "relu"]))


def matmul4d_relu_no_bias():
    b = GraphBuilder()
    x = b.input("x", [2, 3, 1, 5])
    h = b.op("MatMul", [x, b.init(b.weight((5, 7)))], name="mm")
    b.output(b.op("Relu", [h], name="relu"))
    return case(b, ("gemm_act", ["mm", "relu"]))


def matmul_relu_no_bias():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    h = b.op("MatMul", [x, b.init(b.weight((5, 7)))], name="mm")
    b.output(b.op("Relu", [h], name="relu"))
    return case(b, ("gemm_act", ["mm", "relu"]))


def matmul_add_relu_then_gelu_op():
    b = GraphBuilder(opset=20)
    x = b.input("x", [2, 3, 5])
    h = b.op("MatMul", [x, b.init(b.weight((5, 7)))], name="mm")
    a = b.op("Add", [h, b.init(b.weight(7))], name="bias")
    out, names = GEMM_EPILOGUES["relu_gelu_op"][0](b, a, "")
    b.output(out)
    return case(b, ("gemm_act", ["mm", "bias"] + names), attrs=[{"activation": "relu+gelu"}])


def matmul_constant_node_weight_relu():
    b = GraphBuilder()
    x = b.input("x", [4, 3])
    h = b.op("MatMul", [x, b.const_node(b.weight((3, 5)))], name="mm")
    a = b.op("Add", [h, b.const_node(b.weight(5))], name="bias")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("gemm_act", ["mm", "bias", "relu"]))


@pytest.mark.parametrize("build", [
    gemm_transb_alpha_beta_relu, gemm_bias_row_1xN_relu, gemm_bias_scalar_relu, gemm_no_bias_relu,
    gemm_weights_in_constant_nodes_gelu_erf, matmul2d_add_relu, matmul3d_add_relu, matmul3d_add_bias_1x1xN_relu,
    matmul4d_relu_no_bias, matmul_relu_no_bias, matmul_add_relu_then_gelu_op, matmul_constant_node_weight_relu,
], ids=lambda f: f.__name__)
def test_gemm_act_forms(build):
    assert_fused(build())


GEMM_CORES = ["gemm_transB", "matmul2d_add", "matmul3d_add"]


@pytest.mark.parametrize("epilogue", list(GEMM_EPILOGUES))
@pytest.mark.parametrize("core", GEMM_CORES)
def test_gemm_epilogue(core, epilogue):
    """Every Gelu spelling (ONNX op with approximate none/tanh at opset 20, erf orders, tanh with
    Pow or x*x*x) and Relu, Relu then Gelu, behind Gemm and 2-D/3-D MatMul+Add."""
    builder, lo, _, kind, _, _ = GEMM_EPILOGUES[epilogue]
    b = GraphBuilder(opset=max(17, lo))
    if core == "gemm_transB":
        x = b.input("x", [5, 7])
        t = b.op("Gemm", [x, b.init(b.weight((3, 7))), b.init(b.weight(3))], name="gemm", transB=1, alpha=1.5)
        nodes = ["gemm"]
    else:
        x = b.input("x", [5, 7] if core == "matmul2d_add" else [2, 5, 7])
        h = b.op("MatMul", [x, b.init(b.weight((7, 3)))], name="mm")
        t = b.op("Add", [h, b.init(b.weight(3))], name="bias")
        nodes = ["mm", "bias"]
    out, names = builder(b, t, "e_", as_node=core == "matmul3d_add")
    b.output(out)
    assert_fused(case(b, ("gemm_act", nodes + names), attrs=[{"activation": kind}], scale_atol=True))


# --- gemm_act: rejections -------------------------------------------------------------------
def _gemm_relu(weight_input=False, bias="vec", dtype=np.float32, **attrs):
    b = GraphBuilder(dtype=dtype)
    x = b.input("x", [5, 7] if not attrs.get("transA") else [7, 5])
    w = b.input("W", [7, 3]) if weight_input else b.init(b.weight((7, 3)))
    c = {"vec": lambda: b.init(b.weight(3)), "MN": lambda: b.init(b.weight((5, 3))),
         "input": lambda: b.input("C", [3])}[bias]()
    g = b.op("Gemm", [x, w, c], name="gemm", **attrs)
    b.output(b.op("Relu", [g], name="relu"))
    return case(b)


def test_gemm_transa_is_rejected():
    assert_rejected(_gemm_relu(transA=1), "gemm_act", "Gemm transA=1 is not supported", others_fused=[])


def test_gemm_weight_not_constant_is_rejected():
    assert_rejected(_gemm_relu(weight_input=True), "gemm_act", "Gemm weight 'W' is not a constant",
                    others_fused=[])


def test_gemm_bias_of_shape_MN_is_rejected():
    assert_rejected(_gemm_relu(bias="MN"), "gemm_act", "Gemm bias of shape [5, 3] is not a per-column bias",
                    others_fused=[])


def test_gemm_bias_not_constant_is_rejected():
    assert_rejected(_gemm_relu(bias="input"), "gemm_act", "Gemm bias 'C' is not a constant", others_fused=[])


@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=["float16", "float64"])
def test_gemm_non_float32_is_rejected(dtype):
    assert_rejected(_gemm_relu(dtype=dtype), "gemm_act", f"no kernel for dtype {np.dtype(dtype).name}",
                    others_fused=[])


@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=["float16", "float64"])
def test_matmul_gelu_non_float32_is_rejected(dtype):
    b = GraphBuilder(dtype=dtype, opset=20)
    h = b.op("MatMul", [b.input("x", [2, 3, 5]), b.init(b.weight((5, 4)))], name="mm")
    a = b.op("Add", [h, b.init(b.weight(4))], name="bias")
    b.output(b.op("Gelu", [a], name="gelu"))
    assert_rejected(case(b), "gemm_act", f"no kernel for dtype {np.dtype(dtype).name}",
                    nodes=["mm", "bias", "gelu"], others_fused=[])


def _matmul_gelu_with_x(use, epilogue=epi_gelu_erf_torch):
    """MatMul+Add+decomposed Gelu whose input (the bias Add's output) is also used elsewhere."""
    b = GraphBuilder()
    h = b.op("MatMul", [b.input("x", [3, 5]), b.init(b.weight((5, 4)))], name="mm")
    a = b.op("Add", [h, b.init(b.weight(4))], name="bias")
    out, names = epilogue(b, a, "")
    b.output(out)
    if use == "graph_output":
        b.output(a)
    else:
        b.output(b.op("Neg", [a], name="other"))
    return case(b), ["mm", "bias"] + names


@pytest.mark.parametrize("epilogue", [epi_gelu_erf_torch, epi_gelu_erf_tf], ids=["torch", "tf"])
def test_gemm_gelu_intermediate_graph_output_is_rejected(epilogue):
    c, nodes = _matmul_gelu_with_x("graph_output", epilogue)
    assert_rejected(c, "gemm_act", "intermediate tensor 'bias_out' is a graph output", nodes=nodes)


@pytest.mark.parametrize("epilogue", [epi_gelu_erf_torch, epi_gelu_erf_tf], ids=["torch", "tf"])
def test_gemm_gelu_intermediate_other_consumer_is_rejected(epilogue):
    c, nodes = _matmul_gelu_with_x("consumer", epilogue)
    assert_rejected(c, "gemm_act", "intermediate tensor 'bias_out' has another consumer (other)", nodes=nodes)


def test_gemm_gelu_tf_half_x_with_other_consumer_is_rejected():
    """TF order: the separate Mul(x, 0.5) is inside the match; its output used elsewhere."""
    b = GraphBuilder()
    g = b.op("Gemm", [b.input("x", [3, 5]), b.init(b.weight((5, 4))), b.init(b.weight(4))], name="gemm")
    out, names = epi_gelu_erf_tf(b, g, "")
    b.output(out, b.op("Neg", ["g_halfx_out"], name="other"))
    assert_rejected(case(b), "gemm_act", "intermediate tensor 'g_halfx_out' has another consumer (other)",
                    nodes=["gemm"] + names)


def test_matmul_activation_by_activation_is_not_a_candidate():
    """Attention-style MatMul of two run-time tensors: not this pattern, no report entry."""
    b = GraphBuilder()
    h = b.op("MatMul", [b.input("q", [2, 3, 5]), b.input("k", [2, 5, 3])], name="mm")
    b.output(b.op("Relu", [h], name="relu"))
    c = case(b)
    _, report = fuse(c.model)
    assert not [m for m in report.matches if m.pattern_id == "gemm_act"]
    assert_same_outcome_as_stock(c)


def test_matmul_add_without_epilogue_is_left_to_ort():
    b = GraphBuilder()
    h = b.op("MatMul", [b.input("x", [3, 5]), b.init(b.weight((5, 4)))], name="mm")
    b.output(b.op("Add", [h, b.init(b.weight(4))], name="bias"))
    _, report = fuse(b.build())
    assert not report.matches and not report.applied


# =============================================================================================
# regression tests of bugs found (and fixed)
# =============================================================================================
def test_bug_matmul_bias_of_higher_rank_changes_output_rank():
    b = GraphBuilder()
    h = b.op("MatMul", [b.input("x", [3, 5]), b.init(b.weight((5, 4)))], name="mm")
    a = b.op("Add", [h, b.init(b.weight((1, 1, 4)))], name="bias")
    b.output(b.op("Relu", [a], name="relu"))
    assert_same_outcome_as_stock(case(b))
