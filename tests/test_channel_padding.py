"""Channel padding (ortfuse/layout/channel_padding.py, the choice in ortfuse/layout/planner.py): convs
whose channels are not a multiple of the NCHWc block get zero channels up to it. The padded model
against the unpadded one run by stock ORT at ORT_DISABLE_ALL, blocks 8 and 16 on any CPU (the rewrite
is plain ONNX); the components it refuses; and the session with the choice forced both ways.
Tolerance: |got - ref| <= 1e-5 * max(1, max|ref|) (the padded channels add exact zeros; ORT may sum
a conv's channels in another order)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse.layout import channel_padding
from ortfuse.layout.probe import block_size

TOL = 1e-5


def _close(got, ref) -> float:
    return float(np.abs(got - ref).max()) / max(1.0, float(np.abs(ref).max()))


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds)


def _init(name: str, a: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(a.astype(np.float32), name)


def _mobile_block(c: int = 10, cr: int = 3, co: int = 12, seed: int = 0, flatten_reader: bool = True,
                  ir_version: int = 8) -> onnx.ModelProto:
    """Conv(3 -> c) -> BN -> HardSwish -> depthwise Conv(c) -> Relu -> squeeze-excite (GAP -> Conv(c -> cr)
    -> Relu -> Conv(cr -> c) -> HardSigmoid -> Mul) -> Div by a per-channel constant -> Conv(c -> co),
    and optionally a Flatten of the GAP's output summed into the output (a reader outside)."""
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [_init("w0", r(c, 3, 3, 3)), _init("b0", r(c)), _init("scale", r(c) + 2), _init("bias", r(c)),
             _init("mean", r(c)), _init("var", np.abs(r(c)) + 0.5), _init("wd", r(c, 1, 3, 3)), _init("bd", r(c)),
             _init("w1", r(cr, c, 1, 1)), _init("b1", r(cr)), _init("w2", r(c, cr, 1, 1)), _init("b2", r(c)),
             _init("div", np.abs(r(1, c, 1, 1)) + 1), _init("w3", r(co, c, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c0", "scale", "bias", "mean", "var"], ["bn"]),
             helper.make_node("HardSwish", ["bn"], ["hs"]),
             helper.make_node("Conv", ["hs", "wd", "bd"], ["dw"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["dw"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["gap"]),
             helper.make_node("Conv", ["gap", "w1", "b1"], ["sq"]),
             helper.make_node("Relu", ["sq"], ["sqr"]),
             helper.make_node("Conv", ["sqr", "w2", "b2"], ["ex"]),
             helper.make_node("HardSigmoid", ["ex"], ["s"]),
             helper.make_node("Mul", ["r", "s"], ["scaled"]),
             helper.make_node("Div", ["scaled", "div"], ["d"]),
             helper.make_node("Conv", ["d", "w3"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, co, 9, 11])]
    if flatten_reader:
        nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
        outputs.append(helper.make_tensor_value_info("flat", TensorProto.FLOAT, [1, c]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])]
    if ir_version < 4:  # old exporters list every initializer as a graph input too
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    graph = helper.make_graph(nodes, "mobile_block", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ir_version)


def _x(seed: int = 1) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 9, 11)).astype(np.float32)}


def _weight(model: onnx.ModelProto, node_index: int, slot: int = 1) -> np.ndarray:
    name = model.graph.node[node_index].input[slot]
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("c,cr,co", [(10, 3, 12), (5, 2, 7), (16, 4, 8)])
def test_padded_model_computes_the_same(block, c, cr, co):
    model = _mobile_block(c, cr, co)
    padded, result = channel_padding.pad_channels(model, block)
    ref, got = _run(model, _x()), _run(padded, _x())
    assert [a.shape for a in got] == [a.shape for a in ref]
    for a, b in zip(got, ref):
        assert _close(a, b) <= TOL
    want = [n for n in (c, cr) if n % block]
    assert sorted(result.channels) == sorted(want)
    if not want:
        assert padded is model and result.convs == 0
        return
    cp = -(-c // block) * block
    if c % block:
        assert _weight(padded, 0).shape[0] == cp  # the first conv's filters
        assert _weight(padded, 3).shape[0] == cp and helper.get_attribute_value(padded.graph.node[3].attribute[0]) == cp
        assert _weight(padded, 3)[c:].max() == 0 and _weight(padded, 0)[c:].max() == 0
        last = next(n for n in padded.graph.node if n.output[0] == "y")
        w3 = numpy_helper.to_array(next(t for t in padded.graph.initializer if t.name == last.input[1]))
        assert w3.shape == (co, cp, 1, 1) and not w3[:, c:].any()  # zero filters read the padded channels
        assert result.slices == 1  # the Flatten reads the first c channels
        assert any(n.op_type == "Slice" for n in padded.graph.node)


def test_div_pads_its_divisor_with_ones():
    model = _mobile_block(10, 3, 12)
    padded, _ = channel_padding.pad_channels(model, 16)
    div = next(n for n in padded.graph.node if n.op_type == "Div")
    divisor = numpy_helper.to_array(next(t for t in padded.graph.initializer if t.name == div.input[1]))
    assert divisor.shape == (1, 16, 1, 1) and (divisor[0, 10:] == 1).all()


def test_graph_output_is_never_padded():
    model = _mobile_block(10, 8, 12, flatten_reader=False)
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 10, 9, 11]))
    padded, result = channel_padding.pad_channels(model, 16)
    assert "r" not in result.padded  # the caller gets its 10 channels: the Relu reads a slice of the padded dw
    assert result.slices == 1 and "dw" in result.padded
    for a, b in zip(_run(padded, _x()), _run(model, _x())):
        assert a.shape == b.shape and _close(a, b) <= TOL


def test_weights_a_caller_may_feed_are_not_padded():
    """IR 3 lists every initializer as a graph input: a caller may feed other weights, so they are no
    constants (as ORT's optimizers see them) and nothing is padded."""
    model = _mobile_block(10, 3, 12, ir_version=3)
    padded, result = channel_padding.pad_channels(model, 16)
    assert padded is model and not result.convs


def test_tensor_from_an_op_that_cannot_pad_is_left():
    """A component one of whose tensors comes from a Reshape (channels not kept apart) is not padded."""
    model = _mobile_block(10, 3, 12, flatten_reader=False)
    g = model.graph
    g.initializer.append(numpy_helper.from_array(np.array([1, 10, 9, 11], np.int64), "shape"))
    g.node.insert(5, helper.make_node("Reshape", ["r", "shape"], ["r2"]))
    mul = next(n for n in g.node if n.op_type == "Mul")
    mul.input[0] = "r2"
    padded, result = channel_padding.pad_channels(model, 16)
    assert 10 not in result.channels or "r2" not in result.padded
    for a, b in zip(_run(padded, _x()), _run(model, _x())):
        assert _close(a, b) <= TOL


def test_division_by_a_tensor_of_the_graph_is_not_padded():
    """x / s with s made in the graph: s's padded channels hold act(0) (Tanh's 0 here), x / 0 is NaN
    there, and the next conv's zero filters would carry it into every output (0 * NaN): the Div
    reads slices instead."""
    model = _mobile_block(10, 3, 12, flatten_reader=False)
    g = model.graph
    hsig = next(n for n in g.node if n.op_type == "HardSigmoid")
    hsig.op_type, hsig.name = "Tanh", "tanh_scale"  # 0 where its input is 0, nonzero elsewhere
    mul = next(n for n in g.node if n.op_type == "Mul")
    mul.op_type = "Div"
    padded, result = channel_padding.pad_channels(model, 16)
    div = next(n for n in padded.graph.node if n.op_type == "Div")
    assert div.output[0] not in result.padded and result.slices >= 1
    (got,), (ref,) = _run(padded, _x()), _run(model, _x())
    assert np.isfinite(ref).all() and np.isfinite(got).all()
    assert _close(got, ref) <= TOL


@pytest.mark.parametrize("mode", ["on", "off"])
def test_session_pads_only_when_asked_or_measured(monkeypatch, tmp_path, mode):
    if not block_size():
        pytest.skip("ORT has no NCHWc blocked kernels on this CPU (no AVX2): the layout step does not run")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ORTFUSE_CHANNEL_PADDING", mode)
    model = _mobile_block(10, 3, 12, flatten_reader=False)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    session = ortfuse.InferenceSession(str(path), fusion=True, providers=["CPUExecutionProvider"])
    notes = " ".join(session.fusion_report.notes)
    assert ("padded to the block" in notes) == (mode == "on"), notes
    (got,), (ref,) = session.run(None, _x()), _run(model, _x())
    assert _close(got, ref) <= 1e-4  # fused convs and blocked kernels against ORT_DISABLE_ALL


@pytest.mark.parametrize("block", [8, 16])
def test_fused_conv_with_a_sum_input_pads_its_sum_too(block):
    """com.microsoft:FusedConv(X, W, B, Z) (conv_add's lowering): Z has the output's shape, so it is
    padded with it; here Z is the conv's own input (a shortcut)."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("FusedConv", ["a", "w1", "b1", "a"], ["s"], domain="com.microsoft", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["s", "w2"], ["y"])]
    inits = [_init("w0", rng.standard_normal((10, 3, 3, 3))), _init("b0", rng.standard_normal(10)),
             _init("w1", rng.standard_normal((10, 10, 3, 3)) * 0.2), _init("b1", rng.standard_normal(10)),
             _init("w2", rng.standard_normal((12, 10, 1, 1)))]
    graph = helper.make_graph(nodes, "shortcut", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 9, 11])], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    fused_shapes = {"a": [1, 10, 9, 11], "s": [1, 10, 9, 11]}  # what the model before fusion says
    padded, result = channel_padding.pad_channels(model, block, fused_shapes.get)
    assert set(result.padded) == {"a", "s"} and result.convs == 2 and result.slices == 0
    fc = next(n for n in padded.graph.node if n.op_type == "FusedConv")
    assert fc.input[0] == fc.input[3] == "a"
    (got,), (ref,) = _run(padded, _x()), _run(model, _x())
    assert _close(got, ref) <= TOL


# ------------------------------------------------------------------------------------------------
# random chains: every op a component may hold, residual sums, squeeze-excite scales, readers outside
# ------------------------------------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

STEPS = ("conv1x1", "conv3x3", "depthwise", "bn", "relu", "hardsigmoid", "clip", "mul_const", "div_const",
         "add_const", "residual", "se", "maxpool", "flatten_reader", "output_reader", "tanh_div")


@st.composite
def padding_chains(draw):
    """x [1, 3, H, W] -> Conv(3 -> c) -> random steps over channels c (or a new count after a conv)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    c = draw(st.integers(1, 20))
    inits, nodes, outputs, count = [], [], [], [0]

    def name(base):
        count[0] += 1
        return f"{base}{count[0]}"

    def const(shape, positive=False):
        a = rng.standard_normal(shape).astype(np.float32)
        n = name("k")
        inits.append(_init(n, np.abs(a) + 0.5 if positive else a))
        return n

    t = name("t")
    nodes.append(helper.make_node("Conv", ["x", const((c, 3, 3, 3)), const((c,))], [t], pads=[1, 1, 1, 1]))
    for step in draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=8)):
        out = name("t")
        if step in ("conv1x1", "conv3x3"):
            co = draw(st.integers(1, 20))
            k = 1 if step == "conv1x1" else 3
            nodes.append(helper.make_node("Conv", [t, const((co, c, k, k)), const((co,))], [out], pads=[k // 2] * 4))
            c = co
        elif step == "depthwise":
            nodes.append(helper.make_node("Conv", [t, const((c, 1, 3, 3))], [out], group=c, pads=[1, 1, 1, 1]))
        elif step == "bn":
            nodes.append(helper.make_node("BatchNormalization", [t, const((c,)), const((c,)), const((c,)),
                                                                 const((c,), positive=True)], [out]))
        elif step in ("relu", "hardsigmoid"):
            nodes.append(helper.make_node({"relu": "Relu", "hardsigmoid": "HardSigmoid"}[step], [t], [out]))
        elif step == "clip":
            nodes.append(helper.make_node("Clip", [t, const(()), const(())], [out]))
        elif step in ("mul_const", "add_const", "div_const"):
            op = {"mul_const": "Mul", "add_const": "Add", "div_const": "Div"}[step]
            nodes.append(helper.make_node(op, [t, const((1, c, 1, 1), positive=op == "Div")], [out]))
        elif step == "residual":  # x + conv(x), same padding
            mid = name("t")
            nodes.append(helper.make_node("Conv", [t, const((c, c, 3, 3))], [mid], pads=[1, 1, 1, 1]))
            nodes.append(helper.make_node("Add", [mid, t], [out]))
        elif step == "se":  # x * sigmoid(conv(gap(x)))
            g, s = name("t"), name("t")
            nodes.append(helper.make_node("GlobalAveragePool", [t], [g]))
            nodes.append(helper.make_node("Conv", [g, const((c, c, 1, 1)), const((c,))], [s]))
            sig = name("t")
            nodes.append(helper.make_node("Sigmoid", [s], [sig]))
            nodes.append(helper.make_node("Mul", [t, sig], [out]))
        elif step == "tanh_div":  # x / tanh(x): 0 in padded channels if they were padded
            th = name("t")
            nodes.append(helper.make_node("Tanh", [t], [th]))
            nodes.append(helper.make_node("Div", [t, th], [out]))
        elif step == "maxpool":
            nodes.append(helper.make_node("MaxPool", [t], [out], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        elif step == "flatten_reader":
            nodes.append(helper.make_node("ReduceSum", [t], [out], keepdims=1))
            outputs.append(out)
            continue
        elif step == "output_reader":
            outputs.append(t)
            continue
        t = out
    outputs.append(t)
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
                              [onnx.ValueInfoProto(name=o) for o in dict.fromkeys(outputs)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.value_info}
    typed = [inferred[o.name] for o in model.graph.output]  # outputs typed as the checker wants them
    del model.graph.output[:]
    model.graph.output.extend(typed)
    feeds = {"x": rng.standard_normal((1, 3, h, w)).astype(np.float32)}
    return model, feeds, draw(st.sampled_from([4, 8, 16]))


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(padding_chains())
def test_random_chains_pad_without_changing_any_output(case):
    """Every graph output keeps its shape and values (NaN where the original has NaN: x / tanh(x) at
    x = 0 is the model's own), at blocks 4, 8 and 16."""
    model, feeds, block = case
    padded, result = channel_padding.pad_channels(model, block)
    onnx.checker.check_model(padded)
    for got, ref in zip(_run(padded, feeds), _run(model, feeds)):
        assert got.shape == ref.shape
        finite = np.isfinite(ref)
        assert (np.isfinite(got) == finite).all()
        if finite.any():
            assert float(np.abs(got[finite] - ref[finite]).max()) <= 1e-4 * max(1.0, float(np.abs(ref[finite]).max()))
    assert all(c % block for c in result.channels)  # only counts off the block are padded
