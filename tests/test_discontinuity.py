"""Outputs that decide a discontinuous op (Floor, Round, Cast to an integer, quantization,
comparisons) are computed with ORT's exact bits or left to ORT (ortfuse/fusion/discontinuity.py).

Every check compares with stock ORT on the same model at the same optimisation level, bit for bit
(integer outputs, and float outputs downstream of quantization, where one step of an integer moves a
value by a whole quantization step)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse.fusion import discontinuity
from ortfuse.fusion.rewrite import fuse
from ortfuse.ir.graph import GraphIndex

OPSET = 17


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.output}
    for out in m.graph.output:  # outputs with the shapes ONNX infers (the checker wants a shape)
        out.CopyFrom(inferred[out.name])
    onnx.checker.check_model(m)
    return m


def _options(level: ort.GraphOptimizationLevel) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    return so


LEVELS = [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]


def _same_bits(model: onnx.ModelProto, feeds_list, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
    """fusion=True against stock ORT at ``level`` on every feed: integer and bool outputs identical,
    float outputs within 1e-4 of the largest |value| (fused float kernels may differ in the last bits
    where no discontinuous op reads them). Returns the fusion report."""
    data = model.SerializeToString()
    stock = ort.InferenceSession(data, _options(level), providers=["CPUExecutionProvider"])
    fused = ortfuse.InferenceSession(data, _options(level), providers=["CPUExecutionProvider"], fusion=True)
    for feeds in feeds_list:
        for got, ref in zip(fused.run(None, feeds), stock.run(None, feeds)):
            assert got.dtype == ref.dtype and got.shape == ref.shape
            if np.issubdtype(ref.dtype, np.floating):
                np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * max(1.0, float(np.abs(ref).max())))
            else:
                np.testing.assert_array_equal(got, ref)
    return fused.fusion_report


def _with_quantized_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every quantized activation (the integer outputs of (Dynamic)QuantizeLinear) as a
    graph output too, so the check sees each one bit for bit."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(out).graph.value_info}
    for node in out.graph.node:
        if node.op_type in ("DynamicQuantizeLinear", "QuantizeLinear") and node.output[0] in inferred:
            out.graph.output.append(inferred[node.output[0]])
    return out


def _records(report, pattern):
    return [r for r in report.matches if r.pattern_id == pattern]


# -- a requantization chain: x -> Sigmoid -> Mul -> Div -> Add -> Floor -> Cast(int32) ---------------
def _requant_chain(first: str = "Sigmoid") -> onnx.ModelProto:
    nodes = [helper.make_node(first, ["x"], ["s"], name="act"),
             helper.make_node("Mul", ["s", "scale"], ["m"], name="mul"),
             helper.make_node("Div", ["m", "step"], ["d"], name="div"),
             helper.make_node("Add", ["d", "half"], ["a"], name="add"),
             helper.make_node("Floor", ["a"], ["f"], name="floor"),
             helper.make_node("Cast", ["f"], ["q"], to=TensorProto.INT32, name="to_int")]
    inits = [("scale", np.float32(1000.0)), ("step", np.float32(0.37)), ("half", np.float32(0.5))]
    return _model(nodes, [("x", TensorProto.FLOAT, [4, 4096])], [("q", TensorProto.INT32)], inits)


def _feeds(n=3, shape=(4, 4096)):
    rng = np.random.default_rng(7)
    return [{"x": rng.standard_normal(shape).astype(np.float32) * 4} for _ in range(n)]


def test_chain_with_a_transcendental_before_floor_is_left_to_ort_with_the_reason():
    report = _same_bits(_requant_chain("Sigmoid"), _feeds())
    rejected = [r for r in _records(report, "eltwise_chain") if r.decision == "rejected"]
    assert rejected and "Cast 'to_int'" in rejected[0].reason and "not bit-exact" in rejected[0].reason
    assert "act" in rejected[0].nodes


def test_chain_of_exact_steps_before_floor_is_fused_and_bit_exact():
    """The Mul -> Div -> Add -> Floor run after the Sigmoid is exact IEEE float32 work: fused, and the
    integers are ORT's on every element, at both optimisation levels."""
    for level in LEVELS:
        report = _same_bits(_requant_chain("Sigmoid"), _feeds(), level)
        fused = [r for r in _records(report, "eltwise_chain") if r.decision == "fused"]
        assert [r.nodes for r in fused] == [["mul", "div", "add", "floor"]]


def test_exact_values_on_integer_boundaries_stay_exact():
    """Integers times a scale, divided by the same scale: ORT's true division lands on the integer,
    a reciprocal multiply would land one ulp below it and Floor would give integer - 1."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "s"], ["m"], name="mul"),
             helper.make_node("Div", ["m", "s"], ["d"], name="div"),
             helper.make_node("Floor", ["d"], ["f"], name="floor"),
             helper.make_node("Cast", ["f"], ["q"], to=TensorProto.INT64, name="to_int")]
    m = _model(nodes, [("x", TensorProto.FLOAT, [1, 65536])], [("q", TensorProto.INT64)], [("s", np.float32(0.37))])
    x = np.arange(-1000, 64536, dtype=np.float32).reshape(1, -1)
    reciprocal = np.floor((np.maximum(x, 0) * np.float32(0.37)) * (np.float32(1) / np.float32(0.37)))
    exact = np.floor((np.maximum(x, 0) * np.float32(0.37)) / np.float32(0.37))
    assert (reciprocal != exact).any()  # the case can tell the two apart
    report = _same_bits(m, [{"x": x}])
    assert [r.decision for r in _records(report, "eltwise_chain")] == ["fused"]


def test_reach_is_transitive_through_other_ops():
    """A SiLU chain whose value passes a MatMul before a DynamicQuantizeLinear still decides it."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
             helper.make_node("Mul", ["x", "s"], ["silu"], name="silu_mul"),
             helper.make_node("MatMul", ["silu", "w"], ["h"], name="mm"),
             helper.make_node("DynamicQuantizeLinear", ["h"], ["hq", "hs", "hz"], name="dql"),
             helper.make_node("Cast", ["hq"], ["out"], to=TensorProto.INT32, name="widen")]
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    m = _model(nodes, [("x", TensorProto.FLOAT, [8, 64])], [("out", TensorProto.INT32), ("hs", TensorProto.FLOAT)],
               [("w", w)])
    decided = discontinuity.deciding_tensors(GraphIndex(m))
    assert decided["silu"].startswith("DynamicQuantizeLinear") and "x" in decided
    _, report = fuse(m, "auto")
    assert all(r.decision != "fused" for r in report.matches if r.pattern_id == "silu")
    assert any("DynamicQuantizeLinear 'dql'" in r.reason for r in report.matches)
    _same_bits(m, _feeds(2, (8, 64)))


def test_shape_arithmetic_does_not_count_as_deciding_the_data():
    """Floor on a shape computation reads only the data's shape: the data path's chain is fused."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
             helper.make_node("Mul", ["s", "k"], ["y"], name="scale"),
             helper.make_node("Shape", ["x"], ["shp"], name="shape"),
             helper.make_node("Cast", ["shp"], ["shf"], to=TensorProto.FLOAT, name="shape_f"),
             helper.make_node("Div", ["shf", "two"], ["half"], name="halve"),
             helper.make_node("Floor", ["half"], ["fl"], name="floor"),
             helper.make_node("Cast", ["fl"], ["dims"], to=TensorProto.INT64, name="dims"),
             helper.make_node("Reshape", ["y", "flat"], ["out"], name="reshape")]
    m = _model(nodes, [("x", TensorProto.FLOAT, [4, 256])], [("out", TensorProto.FLOAT), ("dims", TensorProto.INT64)],
               [("k", np.full(256, 1.5, np.float32)), ("two", np.float32(2)), ("flat", np.array([-1], np.int64))])
    decided = discontinuity.deciding_tensors(GraphIndex(m))
    assert "shp" in decided and "x" not in decided and "y" not in decided
    _, report = fuse(m, "eltwise_chain")
    assert [r.decision for r in _records(report, "eltwise_chain") if "sig" in r.nodes] == ["fused"]


@pytest.mark.parametrize("op, to", [("Greater", None), ("Round", None), ("Cast", TensorProto.UINT8)])
def test_comparisons_rounding_and_integer_casts_decide(op, to):
    nodes = [helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
             helper.make_node("Mul", ["t", "k"], ["y"], name="mul")]
    if op == "Greater":
        nodes.append(helper.make_node("Greater", ["y", "k"], ["out"], name="cmp"))
        out_type = TensorProto.BOOL
    elif op == "Round":
        nodes.append(helper.make_node("Round", ["y"], ["out"], name="cmp"))
        out_type = TensorProto.FLOAT
    else:
        nodes.append(helper.make_node("Cast", ["y"], ["out"], to=to, name="cmp"))
        out_type = to
    m = _model(nodes, [("x", TensorProto.FLOAT, [2, 4096])], [("out", out_type)], [("k", np.float32(0.3))])
    report = _same_bits(m, _feeds(2, (2, 4096)))
    assert [r.decision for r in _records(report, "eltwise_chain")] == ["rejected"]


def test_float_casts_and_argmax_do_not_decide():
    """Cast to float16 rounds to nearest like any float op; ArgMax selects (see the module docstring)."""
    for node in (helper.make_node("Cast", ["y"], ["out"], to=TensorProto.FLOAT16, name="c"),
                 helper.make_node("ArgMax", ["y"], ["out"], axis=1, name="c")):
        m = _model([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Mul", ["t", "k"], ["y"]), node],
                   [("x", TensorProto.FLOAT, [2, 8])], [("out", TensorProto.UNDEFINED)], [("k", np.float32(0.3))])
        assert "y" not in discontinuity.deciding_tensors(GraphIndex(m))


def test_a_loop_body_with_floor_decides_the_outer_values_it_reads():
    body = helper.make_graph(
        [helper.make_node("Floor", ["y"], ["fy"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("fy", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
             helper.make_node("Mul", ["s", "k"], ["y"], name="mul"),
             helper.make_node("Loop", ["n", "c"], ["scan"], body=body, name="loop")]
    m = _model(nodes, [("x", TensorProto.FLOAT, [4]), ("n", TensorProto.INT64, []), ("c", TensorProto.BOOL, [])],
               [("scan", TensorProto.FLOAT)], [("k", np.float32(3.0))])
    assert discontinuity.deciding_tensors(GraphIndex(m))["y"] == "a Loop 'loop' body"


# -- quantized models written by onnxruntime.quantization ---------------------------------------------
def _float_cnn() -> onnx.ModelProto:
    """Conv+BN, a decomposed HardSwish, a depthwise Conv with SiLU, a residual Add+Relu, pooling, Gemm."""
    rng = np.random.default_rng(3)
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["n1"], name="bn1"),
        helper.make_node("Add", ["n1", "three"], ["h0"], name="hs_add"),
        helper.make_node("Clip", ["h0", "zero", "six"], ["h1"], name="hs_clip"),
        helper.make_node("Div", ["h1", "six"], ["h2"], name="hs_div"),
        helper.make_node("Mul", ["n1", "h2"], ["a1"], name="hs_mul"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=8, name="dw"),
        helper.make_node("Sigmoid", ["c2"], ["sg"], name="sig"),
        helper.make_node("Mul", ["c2", "sg"], ["a2"], name="silu"),
        helper.make_node("Add", ["a2", "a1"], ["r"], name="res_add"),
        helper.make_node("Relu", ["r"], ["a3"], name="res_relu"),
        helper.make_node("GlobalAveragePool", ["a3"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["fl"], name="flat"),
        helper.make_node("Gemm", ["fl", "wf", "bf"], ["y"], transB=1, name="fc"),
    ]
    inits = [("w1", f(8, 3, 3, 3)), ("b1", f(8)), ("g", 1 + f(8)), ("be", f(8)), ("mu", f(8)),
             ("var", np.abs(f(8)) + 0.5), ("three", np.float32(3)), ("zero", np.float32(0)), ("six", np.float32(6)),
             ("w2", f(8, 1, 3, 3)), ("b2", f(8)), ("wf", f(10, 8)), ("bf", f(10))]
    return _model(nodes, [("x", TensorProto.FLOAT, [1, 3, 32, 32])], [("y", TensorProto.FLOAT)], inits)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    folder = tmp_path_factory.mktemp("quantized")
    src = folder / "float.onnx"
    onnx.save(_float_cnn(), src)
    feeds = [{"x": np.random.default_rng(k).standard_normal((1, 3, 32, 32)).astype(np.float32)} for k in range(3)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    out = {"dynamic": folder / "dynamic.onnx", "qdq": folder / "qdq.onnx", "qoperator": folder / "qop.onnx"}
    quantize_dynamic(src, out["dynamic"], weight_type=QuantType.QUInt8, op_types_to_quantize=["Conv", "Gemm"])
    quantize_static(src, out["qdq"], Reader(), quant_format=QuantFormat.QDQ)
    quantize_static(src, out["qoperator"], Reader(), quant_format=QuantFormat.QOperator)
    return {k: onnx.load(v) for k, v in out.items()}, feeds


@pytest.mark.parametrize("kind", ["dynamic", "qdq", "qoperator"])
@pytest.mark.parametrize("level", LEVELS, ids=["disable_all", "enable_all"])
def test_quantized_models_give_orts_exact_bits(quantized, kind, level):
    models, feeds = quantized
    model = _with_quantized_outputs(models[kind])
    ops = {n.op_type for n in model.graph.node}
    assert ops & {"DynamicQuantizeLinear", "QuantizeLinear", "QLinearConv", "ConvInteger"}  # really quantized
    _same_bits(model, feeds, level)


def _requantized_conv() -> onnx.ModelProto:
    """The dynamic-quantization form: DynamicQuantizeLinear -> ConvInteger, then the
    requantization written as Cast -> Mul -> Div -> Floor -> Clip -> Cast(uint8), twice."""
    rng = np.random.default_rng(5)
    nodes, cur = [], "x"
    inits = [("zero_f", np.float32(0)), ("max_f", np.float32(255)), ("step", np.float32(0.05))]
    for k in range(2):
        nodes += [
            helper.make_node("DynamicQuantizeLinear", [cur], [f"q{k}", f"s{k}", f"z{k}"], name=f"dql{k}"),
            helper.make_node("ConvInteger", [f"q{k}", f"w{k}", f"z{k}"], [f"acc{k}"], pads=[1, 1, 1, 1], name=f"ci{k}"),
            helper.make_node("Cast", [f"acc{k}"], [f"accf{k}"], to=TensorProto.FLOAT, name=f"cast{k}"),
            helper.make_node("Mul", [f"accf{k}", f"s{k}"], [f"m{k}"], name=f"scale{k}"),
            helper.make_node("Mul", [f"m{k}", f"ws{k}"], [f"mw{k}"], name=f"wscale{k}"),
            helper.make_node("Div", [f"mw{k}", "step"], [f"d{k}"], name=f"requant{k}"),
            helper.make_node("Floor", [f"d{k}"], [f"fl{k}"], name=f"floor{k}"),
            helper.make_node("Clip", [f"fl{k}", "zero_f", "max_f"], [f"cl{k}"], name=f"clip{k}"),
            helper.make_node("Cast", [f"cl{k}"], [f"u{k}"], to=TensorProto.UINT8, name=f"to_u8_{k}"),
            helper.make_node("Cast", [f"u{k}"], [f"back{k}"], to=TensorProto.FLOAT, name=f"to_f{k}"),
            helper.make_node("Mul", [f"back{k}", "step"], [f"y{k}"], name=f"dequant{k}"),
        ]
        inits += [(f"w{k}", rng.integers(0, 255, (4, 3 if k == 0 else 4, 3, 3), dtype=np.uint8)),
                  (f"ws{k}", np.float32(0.01 * (k + 1)))]
        cur = f"y{k}"
    return _model(nodes, [("x", TensorProto.FLOAT, [1, 3, 16, "w"])],
                  [(cur, TensorProto.FLOAT), ("u1", TensorProto.UINT8)], inits)


@pytest.mark.parametrize("level", LEVELS, ids=["disable_all", "enable_all"])
def test_requantization_chains_give_orts_integers(level):
    rng = np.random.default_rng(11)
    feeds = [{"x": rng.standard_normal((1, 3, 16, w)).astype(np.float32)} for w in (20, 37)]
    report = _same_bits(_requantized_conv(), feeds, level)
    assert any(r.decision == "fused" for r in _records(report, "eltwise_chain"))  # the exact chains still fuse


def _conv_stack_to_int() -> onnx.ModelProto:
    """3x3 convs (what the layout step would run blocked or by Winograd) whose output is rounded."""
    rng = np.random.default_rng(9)
    nodes, cur, inits = [], "x", []
    for k in range(3):
        nodes += [helper.make_node("Conv", [cur, f"w{k}", f"b{k}"], [f"c{k}"], pads=[1, 1, 1, 1], name=f"conv{k}"),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}")]
        inits += [(f"w{k}", (rng.standard_normal((32, 3 if k == 0 else 32, 3, 3)) * 0.2).astype(np.float32)),
                  (f"b{k}", (rng.standard_normal(32) * 0.1).astype(np.float32))]
        cur = f"r{k}"
    nodes += [helper.make_node("Mul", [cur, "scale"], ["m"], name="scale"),
              helper.make_node("Round", ["m"], ["q"], name="round"),
              helper.make_node("Cast", ["q"], ["out"], to=TensorProto.INT32, name="to_int")]
    inits.append(("scale", np.float32(50.0)))
    return _model(nodes, [("x", TensorProto.FLOAT, [1, 3, 56, 56])], [("out", TensorProto.INT32)], inits)


def test_the_layout_step_leaves_convs_that_decide_a_rounding_to_ort():
    feeds = [{"x": np.random.default_rng(k).standard_normal((1, 3, 56, 56)).astype(np.float32)} for k in range(2)]
    report = _same_bits(_conv_stack_to_int(), feeds, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert any(n.startswith("layout:") and "discontinuous" in n for n in report.notes), report.notes
