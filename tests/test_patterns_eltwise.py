"""add_relu, hardswish, silu and eltwise_chain: one positive case per form each claims to match, a
negative case for every rejection reason, and the regression tests of bugs found in them
(``test_bug_*``). What the checks assert: tests/pattern_checks.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import ortfuse
from ortfuse import fuse
from ortfuse.fusion.report import REJECTED
from ortfuse.fusion.rulekit.epilogues import hardsigmoid_as_hardswish
from ortfuse.kernel_choice import registry

from pattern_checks import (
    ATOL,
    RTOL,
    assert_fused,
    assert_rejected,
    assert_same_outcome_as_stock,
    case,
    chain_mul_add_relu_constants,
)
from pattern_graphs import (
    CONV_EPILOGUES,
    GraphBuilder,
    epi_hardswish_div_mul,
    fused_nodes,
    node_attrs,
)

# =============================================================================================
# add_relu: Add(a, b) -> Relu with both operands computed at run time -> FusedAddRelu
# =============================================================================================
ADD_SHAPES = {
    "same_shape": ([3, 5, 7], [3, 5, 7]),
    "trailing_vector": ([2, 3, 4], [4]),
    "both_broadcast": ([2, 1, 4], [2, 3, 1]),
    "left_smaller": ([5], [3, 5]),
    "scalar_tensor": ([3, 7], []),
    "rank4_channel": ([2, 3, 5, 7], [1, 3, 1, 1]),
}


@pytest.mark.parametrize("shapes", list(ADD_SHAPES))
def test_add_relu_broadcasting(shapes):
    sa, sb = ADD_SHAPES[shapes]
    b = GraphBuilder()
    a = b.op("Add", [b.input("a", sa), b.input("b", sb)], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    assert_fused(case(b, ("add_relu", ["add", "relu"])))


def test_add_relu_of_scalars_is_rejected():
    b = GraphBuilder()
    a = b.op("Add", [b.input("a", []), b.input("b", [])], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    assert_rejected(case(b), "add_relu", "rank-0 tensor 'relu_out'", nodes=["add", "relu"])


def test_add_relu_same_tensor_twice():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    b.output(b.op("Relu", [b.op("Add", [x, x], name="add")], name="relu"))
    assert_fused(case(b, ("add_relu", ["add", "relu"])))


def test_add_relu_with_constant_operand_is_an_eltwise_chain():
    b = GraphBuilder()
    a = b.op("Add", [b.input("x", [3, 5]), b.init(b.weight(5))], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    fused, _ = assert_fused(case(b, ("eltwise_chain", ["add", "relu"])))
    native = "FusedEltwiseChain1" in registry._native_ops()  # the native chain kernel, else the reference
    assert fused_nodes(fused)[0].op_type == "FusedEltwiseChain1" + ("" if native else "Ref")


@pytest.mark.parametrize("dtype", [np.float64], ids=["float64"])  # float16: tests/test_native_f16.py
def test_add_relu_non_float32_is_rejected(dtype):
    b = GraphBuilder(dtype=dtype)
    a = b.op("Add", [b.input("a", [3, 5]), b.input("b", [3, 5])], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    assert_rejected(case(b), "add_relu", f"no kernel for dtype {np.dtype(dtype).name} (tensor 'a')",
                    nodes=["add", "relu"], others_fused=[])


def test_add_relu_int64_is_rejected():
    b = GraphBuilder()
    a = b.op("Add", [b.input("a", [3, 5], dtype=np.int64), b.input("b", [3, 5], dtype=np.int64)], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    assert_rejected(case(b), "add_relu", "no kernel for dtype int64", others_fused=[])


# =============================================================================================
# hardswish: HardSigmoid(x) -> Mul(x) | Add->Clip->Div->Mul | Add->Clip->Mul->Div -> FusedHardSwish
# =============================================================================================
def hardsigmoid_mul_pytorch_constants():
    b = GraphBuilder()
    x = b.input("x", [3, 5, 7], low=-5, high=5)
    h = b.op("HardSigmoid", [x], name="hsig", alpha=1.0 / 6.0, beta=0.5)
    b.output(b.op("Mul", [x, h], name="mul"))
    return case(b, ("hardswish", ["hsig", "mul"]))


def hardsigmoid_mul_default_constants_mul_reversed():
    b = GraphBuilder()
    x = b.input("x", [5, 9], low=-5, high=5)
    h = b.op("HardSigmoid", [x], name="hsig")
    b.output(b.op("Mul", [h, x], name="mul"))
    return case(b, ("hardswish", ["hsig", "mul"]))


def hardswish_add_clip_div_mul_opset13_constant_nodes():
    b = GraphBuilder(opset=13)
    x = b.input("x", [2, 3, 5], low=-5, high=5)
    out, names = epi_hardswish_div_mul(b, x, "", as_node=True)
    b.output(out)
    return case(b, ("hardswish", names), attrs=[{"add": 3.0, "lo": 0.0, "hi": 6.0, "div": 6.0}])


def hardswish_add_clip_mul_div_opset13():
    b = GraphBuilder(opset=13)
    x = b.input("x", [2, 3, 5], low=-5, high=5)
    out, names = CONV_EPILOGUES["hardswish_mul_div"][0](b, x, "")
    b.output(out)
    return case(b, ("hardswish", names))


def hardswish_add_clip_div_mul_opset10_clip_attrs():
    b = GraphBuilder(opset=10)
    x = b.input("x", [7, 3], low=-5, high=5)
    out, names = epi_hardswish_div_mul(b, x, "")
    b.output(out)
    return case(b, ("hardswish", names))


def hardswish_add_left_mul_reversed():
    """Add(3, x) and Mul(div, x): operands in the other order."""
    b = GraphBuilder()
    x = b.input("x", [3, 7], low=-5, high=5)
    a = b.op("Add", [b.init(np.float32(3)), x], name="add")
    c = b.op("Clip", [a, b.init(np.float32(0)), b.init(np.float32(6))], name="clip")
    d = b.op("Div", [c, b.init(np.float32(6))], name="div")
    b.output(b.op("Mul", [d, x], name="mul"))
    return case(b, ("hardswish", ["add", "clip", "div", "mul"]))


def hardswish_general_constants():
    """The generic form: x * clip(x + 2, -1, 4) / 5 (not HardSwish, still one fused op)."""
    b = GraphBuilder()
    x = b.input("x", [3, 7], low=-5, high=5)
    a = b.op("Add", [x, b.init(np.float32(2))], name="add")
    c = b.op("Clip", [a, b.init(np.float32(-1)), b.init(np.float32(4))], name="clip")
    d = b.op("Div", [c, b.init(np.float32(5))], name="div")
    b.output(b.op("Mul", [x, d], name="mul"))
    return case(b, ("hardswish", ["add", "clip", "div", "mul"]),
                attrs=[{"add": 2.0, "lo": -1.0, "hi": 4.0, "div": 5.0}])


@pytest.mark.parametrize("build", [
    hardsigmoid_mul_pytorch_constants, hardsigmoid_mul_default_constants_mul_reversed,
    hardswish_add_clip_div_mul_opset13_constant_nodes, hardswish_add_clip_mul_div_opset13,
    hardswish_add_clip_div_mul_opset10_clip_attrs, hardswish_add_left_mul_reversed, hardswish_general_constants,
], ids=lambda f: f.__name__)
def test_hardswish_forms(build):
    assert_fused(build())


@pytest.mark.parametrize("alpha", [np.inf, 1e-39, 3e38, 0.0, -0.2])
def test_hardsigmoid_alpha_without_a_hardswish_form_is_not_a_hardswish(alpha):
    """x * HardSigmoid(x; alpha) becomes FusedHardSwish(add = beta/alpha, hi = div = 1/alpha) only where
    those are finite and 1/alpha normal in float32; alpha = Inf gave 0/0 = NaN where ORT gives x
    (tools/fuzz_campaign.py, case seed 90001617). Such a product may still be an eltwise_chain, and the
    session's outputs are stock ORT's."""
    assert hardsigmoid_as_hardswish(alpha, 0.5) is None
    b = GraphBuilder()
    x = b.input("x", [4, 5], low=-3, high=3)
    b.output(b.op("Mul", [x, b.op("HardSigmoid", [x], name="hsig", alpha=float(alpha), beta=0.5)], name="mul"))
    c = case(b)
    _, report = fuse(c.model, ["hardswish"])
    assert not report.fused, report.table()
    sess = ortfuse.InferenceSession(c.model.SerializeToString(), fusion=True)
    ref = ortfuse.InferenceSession(c.model.SerializeToString(), fusion=False)
    np.testing.assert_allclose(sess.run(None, c.feeds)[0], ref.run(None, c.feeds)[0], rtol=RTOL, atol=ATOL,
                               equal_nan=True)


def test_hardsigmoid_as_hardswish_parameters():
    assert hardsigmoid_as_hardswish(1.0 / 6.0, 0.5) == pytest.approx({"add": 3.0, "lo": 0.0, "hi": 6.0, "div": 6.0})
    assert hardsigmoid_as_hardswish(0.2, 0.5) == pytest.approx({"add": 2.5, "lo": 0.0, "hi": 5.0, "div": 5.0})


@pytest.mark.parametrize("dtype", [np.float64], ids=["float64"])  # float16: tests/test_native_f16.py
def test_hardswish_non_float32_is_rejected(dtype):
    b = GraphBuilder(dtype=dtype)
    x = b.input("x", [3, 5])
    b.output(b.op("Mul", [x, b.op("HardSigmoid", [x], name="hsig")], name="mul"))
    assert_rejected(case(b), "hardswish", f"no kernel for dtype {np.dtype(dtype).name}", nodes=["hsig", "mul"])


@pytest.mark.parametrize("dtype", [np.float64], ids=["float64"])  # float16: tests/test_native_f16.py
def test_hardswish_decomposed_non_float32_is_rejected(dtype):
    b = GraphBuilder(dtype=dtype, opset=13)
    out, names = epi_hardswish_div_mul(b, b.input("x", [3, 5]), "")
    b.output(out)
    assert_rejected(case(b), "hardswish", f"no kernel for dtype {np.dtype(dtype).name}", nodes=names)


# =============================================================================================
# silu: Sigmoid(x) -> Mul(x) -> FusedSiLU
# =============================================================================================
@pytest.mark.parametrize("order", ["x_first", "sigmoid_first"])
@pytest.mark.parametrize("shape", [[7], [3, 5], [2, 3, 5, 7]], ids=str)
def test_silu(order, shape):
    b = GraphBuilder()
    x = b.input("x", shape, low=-6, high=6)
    s = b.op("Sigmoid", [x], name="sig")
    b.output(b.op("Mul", [x, s] if order == "x_first" else [s, x], name="mul"))
    assert_fused(case(b, ("silu", ["sig", "mul"])))


@pytest.mark.parametrize("dtype", [np.float64], ids=["float64"])  # float16: tests/test_native_f16.py
def test_silu_non_float32_is_rejected(dtype):
    b = GraphBuilder(dtype=dtype)
    x = b.input("x", [3, 5])
    b.output(b.op("Mul", [x, b.op("Sigmoid", [x], name="sig")], name="mul"))
    assert_rejected(case(b), "silu", f"no kernel for dtype {np.dtype(dtype).name} (tensor 'x')", nodes=["sig", "mul"])


def test_silu_of_another_tensor_is_not_silu():
    """x * Sigmoid(y): not SiLU; a 2-op eltwise chain with y as a run-time operand."""
    b = GraphBuilder()
    x, y = b.input("x", [3, 5]), b.input("y", [3, 5])
    b.output(b.op("Mul", [x, b.op("Sigmoid", [y], name="sig")], name="mul"))
    assert_fused(case(b, ("eltwise_chain", ["sig", "mul"])))


# =============================================================================================
# eltwise_chain: a run of single-consumer elementwise ops on one value -> FusedEltwiseChain<k>
# =============================================================================================
def chain_per_channel_constants_constant_nodes():
    b = GraphBuilder()
    x = b.input("x", [2, 3, 5, 7])
    m = b.op("Mul", [x, b.const_node(b.weight((3, 1, 1)))], name="scale")
    a = b.op("Add", [m, b.const_node(b.weight((1, 3, 1, 1)))], name="shift")
    b.output(b.op("Tanh", [a], name="tanh"))
    return case(b, ("eltwise_chain", ["scale", "shift", "tanh"]))


def chain_broadcast_dynamic_operand():
    b = GraphBuilder()
    x, y = b.input("x", [2, 3, 5]), b.input("y", [5], low=0.5, high=1.5)
    m = b.op("Mul", [x, y], name="mul")
    a = b.op("Add", [m, b.init(np.float32(0.5))], name="add")
    b.output(b.op("Sigmoid", [a], name="sig"))
    return case(b, ("eltwise_chain", ["mul", "add", "sig"]))


def chain_sub_constant_on_left():
    b = GraphBuilder()
    x = b.input("x", [3, 7])
    s = b.op("Sub", [b.init(np.float32(1.0)), x], name="sub")
    b.output(b.op("Relu", [s], name="relu"))
    return case(b, ("eltwise_chain", ["sub", "relu"]))


def chain_div_constant_on_left():
    b = GraphBuilder()
    x = b.input("x", [3, 7], low=0.5, high=3.0)
    d = b.op("Div", [b.init(b.weight(7) + 2), x], name="div")
    b.output(b.op("Neg", [d], name="neg"))
    return case(b, ("eltwise_chain", ["div", "neg"]))


def chain_sub_div_dynamic_on_left():
    b = GraphBuilder()
    x, y = b.input("x", [3, 5], low=1.0, high=2.0), b.input("y", [3, 5], low=-1.0, high=0.0)
    s = b.op("Sub", [y, x], name="sub")
    d = b.op("Div", [b.init(np.float32(2.5)), s], name="div")
    b.output(b.op("Abs", [d], name="abs"))
    return case(b, ("eltwise_chain", ["sub", "div", "abs"]))


def chain_leaky_relu():
    b = GraphBuilder()
    x = b.input("x", [5, 3])
    m = b.op("Mul", [x, b.init(np.float32(3.0))], name="mul")
    b.output(b.op("LeakyRelu", [m], name="leaky", alpha=0.1))
    return case(b, ("eltwise_chain", ["mul", "leaky"]))


def chain_clip_inputs_opset13():
    b = GraphBuilder(opset=13)
    x = b.input("x", [5, 3])
    a = b.op("Add", [x, b.init(np.float32(0.5))], name="add")
    b.output(b.op("Clip", [a, b.init(np.float32(-1)), b.init(np.float32(1.5))], name="clip"))
    return case(b, ("eltwise_chain", ["add", "clip"]))


def chain_clip_attrs_opset10():
    b = GraphBuilder(opset=10)
    x = b.input("x", [5, 3])
    a = b.op("Add", [x, b.init(np.float32(0.5))], name="add")
    b.output(b.op("Clip", [a], name="clip", min=-1.0, max=1.5))
    return case(b, ("eltwise_chain", ["add", "clip"]))


def chain_clip_max_only_opset13():
    b = GraphBuilder(opset=13)
    x = b.input("x", [5, 3])
    a = b.op("Mul", [x, b.init(np.float32(2))], name="mul")
    b.output(b.op("Clip", [a, "", b.init(np.float32(1.5))], name="clip"))
    return case(b, ("eltwise_chain", ["mul", "clip"]))


def chain_pow_by_constant():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    p = b.op("Pow", [x, b.init(np.float32(3.0))], name="pow")
    a = b.op("Add", [p, b.init(np.float32(1.0))], name="add")
    s = b.op("Pow", [a, b.init(np.float32(2.0))], name="pow2")
    b.output(b.op("Sqrt", [s], name="sqrt"))
    return case(b, ("eltwise_chain", ["pow", "add", "pow2", "sqrt"]))


def chain_long_four_operands():
    """Seven steps, four distinct operands (the maximum), constants and run-time tensors mixed."""
    b = GraphBuilder()
    x, y, z = b.input("x", [2, 3, 5]), b.input("y", [3, 5], low=0.5, high=1.5), b.input("z", [5], low=0.5, high=1.5)
    c0 = b.init(np.float32(0.3))
    t = b.op("Mul", [x, c0], name="s1")
    t = b.op("Add", [t, y], name="s2")
    t = b.op("Max", [t, b.init(b.weight(5))], name="s3")
    t = b.op("Sigmoid", [t], name="s4")
    t = b.op("Div", [t, z], name="s5")
    t = b.op("Sub", [t, c0], name="s6")
    b.output(b.op("Softplus", [t], name="s7"))
    fused = case(b, ("eltwise_chain", [f"s{i}" for i in range(1, 8)]))
    return fused


def chain_unary_mix():
    b = GraphBuilder()
    x = b.input("x", [3, 7])
    t = b.op("Abs", [x], name="abs")
    t = b.op("Neg", [t], name="neg")
    t = b.op("Exp", [t], name="exp")
    t = b.op("Log", [t], name="log")
    t = b.op("Erf", [t], name="erf")
    t = b.op("Reciprocal", [b.op("Add", [t, b.init(np.float32(2))], name="add")], name="recip")
    t = b.op("Min", [t, b.init(np.float32(0.8))], name="min")
    b.output(b.op("HardSigmoid", [t], name="hsig", alpha=0.3, beta=0.4))
    return case(b, ("eltwise_chain", ["abs", "neg", "exp", "log", "erf", "add", "recip", "min", "hsig"]))


def chain_floor_ceil():
    b = GraphBuilder()
    x = b.input("x", [4, 5], low=-9, high=9)
    t = b.op("Mul", [x, b.init(np.float32(0.5))], name="half")
    t = b.op("Floor", [t], name="floor")
    b.output(b.op("Ceil", [b.op("Mul", [t, b.init(np.float32(0.25))], name="quarter")], name="ceil"))
    return case(b, ("eltwise_chain", ["half", "floor", "quarter", "ceil"]))


def chain_ends_at_graph_output():
    """A chain is maximal up to a tensor that is a graph output; the rest is another chain."""
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    m = b.op("Mul", [x, b.init(np.float32(2))], name="mul")
    a = b.op("Add", [m, b.init(np.float32(1))], name="add")
    r = b.op("Relu", [a], name="relu")
    b.output(b.op("Neg", [r], name="neg"), a)
    return case(b, ("eltwise_chain", ["mul", "add"]), ("eltwise_chain", ["relu", "neg"]))


def chain_ends_before_a_shared_tensor():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    m = b.op("Mul", [x, b.init(np.float32(2))], name="mul")
    a = b.op("Add", [m, b.init(np.float32(1))], name="add")
    b.output(b.op("Relu", [a], name="relu"), b.op("Tanh", [a], name="tanh"))
    return case(b, ("eltwise_chain", ["mul", "add"]))


@pytest.mark.parametrize("build", [
    chain_mul_add_relu_constants, chain_per_channel_constants_constant_nodes, chain_broadcast_dynamic_operand,
    chain_sub_constant_on_left, chain_div_constant_on_left, chain_sub_div_dynamic_on_left, chain_leaky_relu,
    chain_clip_inputs_opset13, chain_clip_attrs_opset10, chain_clip_max_only_opset13, chain_pow_by_constant,
    chain_long_four_operands, chain_unary_mix, chain_floor_ceil, chain_ends_at_graph_output,
    chain_ends_before_a_shared_tensor,
], ids=lambda f: f.__name__)
def test_eltwise_chain_forms(build):
    assert_fused(build())


def test_eltwise_chain_program_records_operand_order():
    fused, _ = assert_fused(chain_sub_constant_on_left())
    program = node_attrs(fused_nodes(fused)[0])["program"]
    assert '"args":["c0","x"]' in program


def test_eltwise_chain_fifth_operand_ends_the_chain():
    b = GraphBuilder()
    t = b.input("x", [3, 5])
    for i in range(6):
        t = b.op("Add", [t, b.init(np.float32(i + 0.5))], name=f"a{i}")
    b.output(t)
    c = case(b, ("eltwise_chain", ["a0", "a1", "a2", "a3"]), ("eltwise_chain", ["a4", "a5"]))
    assert_fused(c)


def test_eltwise_chain_operand_that_enlarges_x_is_not_chained():
    """x[5] + y[3, 5] makes the value bigger: the chain on x stops before the Add, and the Add
    starts a chain of its own on y (the input with the output's shape), with x's result as operand."""
    b = GraphBuilder()
    x, y = b.input("x", [5]), b.input("y", [3, 5])
    r = b.op("Exp", [b.op("Neg", [x], name="neg")], name="exp")
    a = b.op("Add", [r, y], name="add")
    b.output(b.op("Tanh", [a], name="tanh"))
    c = case(b, ("eltwise_chain", ["neg", "exp"]), ("eltwise_chain", ["add", "tanh"]))
    fused, _report = assert_fused(c)
    chains = [n for n in fused.graph.node if n.op_type.startswith("FusedEltwiseChain")]
    assert [list(n.input)[0] for n in chains] == ["x", "y"]


def test_eltwise_chain_pow_with_runtime_exponent_ends_the_chain():
    b = GraphBuilder()
    x, e = b.input("x", [3, 5], low=0.5, high=2), b.input("e", [3, 5])
    a = b.op("Abs", [b.op("Neg", [x], name="neg")], name="abs")
    b.output(b.op("Pow", [a, e], name="pow"))
    assert_fused(case(b, ("eltwise_chain", ["neg", "abs"])))


def _layernorm(b: GraphBuilder, x: str, d: int) -> str:
    mean = b.op("ReduceMean", [x], name="mean", axes=[-1])
    sub = b.op("Sub", [x, mean], name="sub")
    sq = b.op("Pow", [sub, b.init(np.float32(2))], name="pow")
    var = b.op("ReduceMean", [sq], name="var", axes=[-1])
    eps = b.op("Add", [var, b.init(np.float32(1e-5))], name="add_eps")
    std = b.op("Sqrt", [eps], name="sqrt")
    norm = b.op("Div", [sub, std], name="div")
    scaled = b.op("Mul", [norm, b.init(b.weight(d) + 1)], name="gamma")
    return b.op("Add", [scaled, b.init(b.weight(d))], name="beta")


def test_eltwise_chain_inside_decomposed_layernorm_is_left_to_ort():
    b = GraphBuilder()
    b.output(_layernorm(b, b.input("x", [2, 3, 8]), 8))
    c = case(b)
    fused, report = assert_rejected(c, "eltwise_chain", "left to ORT", others_fused=[])
    rejected = [sorted(m.nodes) for m in report.matches if m.decision == REJECTED]
    assert sorted(["add_eps", "sqrt"]) in rejected
    assert sorted(["div", "gamma", "beta"]) in rejected
    assert not fused_nodes(fused)


def test_bias_and_skip_adds_before_layernorm_are_left_to_ort():
    """The bias Add and residual Add feeding a LayerNorm are never an elementwise chain: left to ORT
    (SkipLayerNormalization) when only eltwise_chain runs, taken by skip_layernorm when it runs too."""
    b = GraphBuilder()
    x, y = b.input("x", [2, 3, 8]), b.input("y", [2, 3, 8])
    biased = b.op("Add", [x, b.init(b.weight(8))], name="bias")
    skip = b.op("Add", [biased, y], name="skip")
    b.output(_layernorm(b, skip, 8))
    assert_rejected(case(b), "eltwise_chain", "left to ORT", nodes=["bias", "skip"], patterns=["eltwise_chain"],
                    others_fused=[])
    _, report = fuse(case(b).model)
    taken = {m.pattern_id: sorted(m.nodes) for m in report.fused}
    assert "eltwise_chain" not in taken and {"bias", "skip"} <= set(taken.get("skip_layernorm", [])), report.table()


@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=["float16", "float64"])
def test_eltwise_chain_non_float32_is_rejected(dtype):
    b = GraphBuilder(dtype=dtype)
    m = b.op("Mul", [b.input("x", [3, 5]), b.init(np.float32(2))], name="mul")
    b.output(b.op("Tanh", [m], name="tanh"))
    assert_rejected(case(b), "eltwise_chain", f"no kernel for dtype {np.dtype(dtype).name}", nodes=["mul", "tanh"])


def test_eltwise_chain_int64_shape_arithmetic_is_rejected():
    b = GraphBuilder()
    x = b.input("x", [3, 5], dtype=np.int64)
    a = b.op("Add", [x, b.init(np.int64(1))], name="add")
    b.output(b.op("Mul", [a, b.init(np.int64(2))], name="mul"))
    c = case(b)
    c.feeds = {"x": np.arange(15, dtype=np.int64).reshape(3, 5)}
    assert_rejected(c, "eltwise_chain", "no kernel for dtype int64", others_fused=[])


def test_eltwise_chain_pow_with_int_exponent_is_rejected():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    p = b.op("Pow", [x, b.init(np.int64(2))], name="pow")
    b.output(b.op("Neg", [p], name="neg"))
    assert_rejected(case(b), "eltwise_chain", "int64", nodes=["pow", "neg"], others_fused=[])


# =============================================================================================
# regression tests of bugs found (and fixed)
# =============================================================================================
def test_bug_hardswish_constant_of_higher_rank_changes_output_rank():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    a = b.op("Add", [x, b.init(np.full((1, 1, 1), 3.0, np.float32))], name="add")
    c = b.op("Clip", [a, b.init(np.float32(0)), b.init(np.float32(6))], name="clip")
    d = b.op("Div", [c, b.init(np.float32(6))], name="div")
    b.output(b.op("Mul", [x, d], name="mul"))
    assert_same_outcome_as_stock(case(b))


def test_bug_hardsigmoid_alpha_zero_crashes_fuse():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    b.output(b.op("Mul", [x, b.op("HardSigmoid", [x], name="hsig", alpha=0.0, beta=0.4)], name="mul"))
    assert_same_outcome_as_stock(case(b))


def test_bug_hardsigmoid_negative_alpha_wrong_values():
    b = GraphBuilder()
    x = b.input("x", [3, 5])
    b.output(b.op("Mul", [x, b.op("HardSigmoid", [x], name="hsig", alpha=-0.5, beta=0.4)], name="mul"))
    assert_same_outcome_as_stock(case(b))


def test_bug_chain_head_with_broadcast_operand_first_is_missed():
    b = GraphBuilder()
    x, y = b.input("x", [3, 5], low=1.0, high=2.0), b.input("y", [3, 1])
    s = b.op("Sub", [y, x], name="sub")
    d = b.op("Div", [b.init(np.float32(2.5)), s], name="div")
    b.output(b.op("Abs", [d], name="abs"))
    assert_fused(case(b, ("eltwise_chain", ["sub", "div", "abs"])))
