"""Blocked regions (ortfuse.layout.regions): the native FusedEltwiseChainBlocked kernel on NCHWc data
with per-channel operands, and the rewrite that runs elementwise ops, channel Split/Concat, nearest
Resize, global pools and squeeze-excite scales on ORT's blocked tensors. Numerics: the blocked chain
kernel equals the plain chain kernel bit for bit (the same float32 steps); whole models against
stock ORT at ORT_DISABLE_ALL within 1e-4 * max(1, max|ref|) (BN folding changes float32 rounding)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime
import pytest
from native_sessions import one_op_session, to_blocked
from onnx import helper, numpy_helper

from ortfuse import fuse, models
from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import node_attrs
from ortfuse.fusion.provenance import native_op_types
from ortfuse.kernel_choice.op_registration import with_custom_ops
from ortfuse.layout import blocked_scale, planner, regions, winograd
from ortfuse.layout.probe import block_size

PROGRAM = ('[{"op":"Mul","args":["x","c0"]},{"op":"Add","args":["c1","x"]},{"op":"HardSigmoid","alpha":0.2,'
           '"beta":0.5},{"op":"Sub","args":["c2","x"]},{"op":"Sigmoid"}]')


def _chain_session(op: str, block: int | None):
    attrs = node_attrs({"program": PROGRAM}) | ({"block": block} if block else {})
    return one_op_session(op, ["x", "c0", "c1", "c2"], **attrs)


@pytest.mark.parametrize("block, n, c, h, w, scale_shape", [
    (8, 2, 24, 5, 7, "n"), (16, 1, 32, 19, 23, "1"), (8, 1, 16, 40, 40, "c"), (4, 3, 12, 2, 9, "n"),
    (1, 2, 3, 4, 4, "1"),
])
def test_blocked_chain_equals_the_plain_chain_on_blocked_data(block, n, c, h, w, scale_shape):
    """Per-channel operand ([N, C, 1, 1], [1, C, 1, 1] or [C, 1, 1]), a full operand, a scalar; groups
    longer than one chunk (40 x 40 x 8) and shorter ones with a tail."""
    rng = np.random.default_rng(c * 7 + h)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    s = rng.standard_normal({"n": (n, c, 1, 1), "1": (1, c, 1, 1), "c": (c, 1, 1)}[scale_shape]).astype(np.float32)
    full = rng.standard_normal((n, c, h, w)).astype(np.float32)
    k = np.array([0.25], np.float32)
    plain = _chain_session("FusedEltwiseChain3", None).run(None, {"x": x, "c0": s, "c1": full, "c2": k})[0]
    got = _chain_session("FusedEltwiseChainBlocked3", block).run(
        None, {"x": to_blocked(x, block), "c0": s, "c1": to_blocked(full, block), "c2": k})[0]
    assert got.shape == (n, c, h, w)
    assert np.array_equal(got, to_blocked(plain, block))


@pytest.mark.parametrize("x_shape, s_shape, text", [
    ((1, 12, 2, 2), (1, 12, 1, 1), "channels a multiple of the attribute block"),
    ((1, 16, 2, 2), (1, 16, 2, 1), "one value per channel"),
    ((1, 16, 2, 2), (16, 1), "one value per channel"),
    ((16, 2, 2), (16, 1, 1), "X must have rank 4"),
])
def test_blocked_chain_refuses_other_shapes_with_an_ort_error(x_shape, s_shape, text):
    sess = _chain_session("FusedEltwiseChainBlocked3", 8)
    feeds = {"x": np.ones(x_shape, np.float32), "c0": np.ones(s_shape, np.float32),
             "c1": np.ones(x_shape, np.float32), "c2": np.ones(1, np.float32)}
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match=text):
        sess.run(None, feeds)


# a multiple of both NCHWc blocks (8 with AVX2, 16 with AVX-512): ORT reorders the graph input for the
# first conv (one of fewer channels than a block reads the plain input)
IN_CHANNELS = 16


def region_model(channels: int = 32, extra_output: bool = False) -> onnx.ModelProto:
    """Conv -> squeeze-excite with a residual (x * s + x) -> channel Split -> Conv with a residual Add
    -> Concat -> nearest Resize x2 -> Conv: every op between the convs is layout-agnostic.
    ``extra_output``: the residual Add's output is a graph output too."""
    rng = np.random.default_rng(11)
    half = channels // 2

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    inits = [w("w0", channels, IN_CHANNELS, 3, 3), w("b0", channels), w("wf", channels, channels, 1, 1),
             w("bf", channels), w("w1", half, half, 3, 3), w("w2", 16, 2 * channels - half, 1, 1),
             numpy_helper.from_array(np.array([half, channels - half], np.int64), "split"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("GlobalAveragePool", ["r0"], ["p"], name="gap"),
             helper.make_node("Conv", ["p", "wf", "bf"], ["f"], name="fc"),
             helper.make_node("HardSigmoid", ["f"], ["s"], name="gate", alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["r0", "s"], ["m"], name="scale"),
             helper.make_node("Add", ["m", "r0"], ["se"], name="se_residual"),
             helper.make_node("Split", ["se", "split"], ["a", "b"], name="split", axis=1),
             helper.make_node("Conv", ["b", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["b", "c1"], ["bc"], name="residual"),
             helper.make_node("Concat", ["se", "bc"], ["cat"], name="cat", axis=1),
             helper.make_node("Resize", ["cat", "", "scales"], ["up"], name="up", mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Conv", ["up", "w2"], ["y"], name="project")]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", IN_CHANNELS, 10, 10])
    outputs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 16, 20, 20])]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("bc", onnx.TensorProto.FLOAT, ["n", half, 10, 10]))
    return helper.make_model(helper.make_graph(nodes, "regions", [x], outputs, inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def _reference(model, feeds):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), so).run(None, feeds)


def _close(got, ref):
    return all(float(np.abs(g - r).max()) <= 1e-4 * max(1.0, float(np.abs(r).max())) for g, r in zip(got, ref))


def _planned(model):
    fused, report = fuse(model)
    native = frozenset(native_op_types(fused))
    layout, why_not = planner.plan_layout(model, fused, None, native, report.disabled_ort_optimizers)
    return layout, why_not, native


def _run(layout, native, feeds, reloaded=None):
    """Outputs of the planned model in an ORT_ENABLE_ALL session; ``reloaded``: a path where ORT saves
    the graph it makes of it."""
    so, _ = with_custom_ops(onnxruntime.SessionOptions(), native | layout.native_ops, python_ops=False)
    if reloaded:
        so.optimized_model_filepath = str(reloaded)
    return onnxruntime.InferenceSession(layout.model.SerializeToString(), so).run(None, feeds)


def _feeds(batch):
    return {"x": np.random.default_rng(batch).standard_normal((batch, IN_CHANNELS, 10, 10)).astype(np.float32)}


needs_nchwc = pytest.mark.skipif(block_size() == 0, reason="ORT has no NCHWc kernels on this CPU")


@needs_nchwc
def test_a_region_between_convs_runs_on_blocks_and_keeps_the_outputs(tmp_path):
    """Channels a multiple of the block (32 = 16 + 16 on AVX2's 8 and AVX-512's 16): the chain, the
    Split, the Add, the Concat and the Resize run blocked and only the graph's edges keep reorders.
    ORT optimizing the planned graph again changes nothing (the session loads it at ORT_ENABLE_ALL)."""
    model = region_model(32)
    layout, why_not, native = _planned(model)
    assert layout is not None, why_not
    graph = layout.model.graph
    ops = {(n.domain, n.op_type) for n in graph.node}
    assert (regions.NCHWC, "Upsample") in ops and ("", "Resize") not in ops, sorted(ops)
    assert any(op.startswith(regions.BLOCKED_CHAIN) for _, op in ops), sorted(ops)
    assert layout.native_ops & {f"{regions.BLOCKED_CHAIN}{k}" for k in range(5)}
    producer = {o: n for n in graph.node for o in n.output}
    for n in graph.node:  # no Split, Concat or Add reads a reorder any more
        if n.op_type in ("Split", "Concat", "Add"):
            assert not any(producer.get(t) is not None and producer[t].op_type == "ReorderOutput" for t in n.input), n
    before, after = (int(v) for v in layout.note.split("reorders ", 1)[1].split(" (")[0].split(" -> "))
    assert after == blocked_scale.reorder_count(graph) < before
    assert "region(s) of ops run blocked" in layout.note and "graph input" in layout.note, layout.note
    for batch in (1, 2):
        assert _close(_run(layout, native, _feeds(batch), tmp_path / "again.onnx"), _reference(model, _feeds(batch)))
    again = onnx.load(str(tmp_path / "again.onnx")).graph
    assert sorted(n.op_type for n in again.node) == sorted(n.op_type for n in graph.node)


@needs_nchwc
def test_a_region_output_the_graph_also_returns_keeps_a_reorder_for_it():
    model = region_model(32, extra_output=True)
    layout, why_not, native = _planned(model)
    assert layout is not None, why_not
    producer = {o: n for n in layout.model.graph.node for o in n.output}
    assert producer["bc"].op_type == "ReorderOutput", producer["bc"]
    assert "graph output" in layout.note, layout.note
    assert _close(_run(layout, native, _feeds(2)), _reference(model, _feeds(2)))


@needs_nchwc
def test_channels_off_the_block_keep_their_reorders_and_the_outputs():
    """20 channels split 10 + 10: no part is a multiple of the block (8 or 16), ORT pads them, so the
    Split, the chain and what follows stay plain; the outputs are unchanged."""
    model = region_model(20)
    layout, why_not, native = _planned(model)
    if layout is None:
        assert why_not.startswith("layout: "), why_not
        return
    ops = {n.op_type for n in layout.model.graph.node}
    assert not any(op.startswith(regions.BLOCKED_CHAIN) for op in ops) and "Split" in ops, sorted(ops)
    assert _close(_run(layout, native, _feeds(2)), _reference(model, _feeds(2)))


def lcnet_model(channels: int = 32) -> onnx.ModelProto:
    """PP-LCNetV3's squeeze-excite after a learnable affine and the SVTR neck's Reshape of computed
    shape, as the PP-OCRv4 recognizer has them: Conv+HardSwish -> x * k + b (ortfuse's native chain,
    so ORT's transformer leaves the pool and the scale after it plain) -> GlobalAveragePool ->
    Conv+Relu -> Conv -> HardSigmoid -> Mul(x, s) -> Conv; its output reshaped to its own shape through
    Compress(Shape) (shape inference loses even the rank) -> Conv+HardSwish -> x * k + b -> Concat with
    the SE's output -> Conv."""
    rng = np.random.default_rng(5)
    reduced = channels // 4

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    def affine(x, tag):
        return [helper.make_node("Conv", [x, f"w{tag}"], [f"c{tag}"], name=f"conv{tag}", pads=[1, 1, 1, 1]),
                helper.make_node("HardSwish", [f"c{tag}"], [f"h{tag}"], name=f"hswish{tag}"),
                helper.make_node("Mul", [f"h{tag}", "k"], [f"m{tag}"], name=f"scale{tag}"),
                helper.make_node("Add", [f"m{tag}", "b"], [f"a{tag}"], name=f"bias{tag}")]

    inits = [w("w0", channels, IN_CHANNELS, 3, 3), w("w1", reduced, channels, 1, 1), w("w2", channels, reduced, 1, 1),
             w("w3", channels, channels, 3, 3), w("w4", channels, channels, 3, 3), w("w5", 16, 2 * channels, 1, 1),
             numpy_helper.from_array(np.array(0.9, np.float32), "k"),
             numpy_helper.from_array(np.array(0.1, np.float32), "b"),
             numpy_helper.from_array(np.ones(4, bool), "every")]
    nodes = [*affine("x", "0"),
             helper.make_node("GlobalAveragePool", ["a0"], ["p"], name="gap"),
             helper.make_node("Conv", ["p", "w1"], ["f1"], name="fc1"),
             helper.make_node("Relu", ["f1"], ["r1"], name="fc1_relu"),
             helper.make_node("Conv", ["r1", "w2"], ["f2"], name="fc2"),
             helper.make_node("HardSigmoid", ["f2"], ["s"], name="gate", alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["a0", "s"], ["se"], name="se_scale"),
             helper.make_node("Conv", ["se", "w3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["c3"], ["dims"], name="dims"),
             helper.make_node("Compress", ["dims", "every"], ["target"], name="target", axis=0),
             helper.make_node("Reshape", ["c3", "target"], ["r3"], name="reshape"),
             *affine("r3", "4"),
             helper.make_node("Concat", ["se", "a4"], ["cat"], name="cat", axis=1),
             helper.make_node("Conv", ["cat", "w5"], ["y"], name="project")]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", IN_CHANNELS, 10, 10])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 16, 10, 10])
    return helper.make_model(helper.make_graph(nodes, "lcnet", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


@needs_nchwc
def test_an_se_after_a_native_chain_and_a_concat_of_lost_dims_run_on_blocks(monkeypatch):
    """ORT's transformer blocks a GlobalAveragePool only when a blocked op wrote its input: after
    ortfuse's chain it left the pool, the SE scale and their reorders plain. The regions run the
    chain, the pool (ORT's blocked one), the scale (FusedChannelScaleBlocked) and the Concat of a
    tensor whose dims shape inference lost (known by its reorder's channel count) on blocks."""
    monkeypatch.setenv("ORTFUSE_SE_BLOCK", "off")  # keep ORT's SE form: the test is about the regions
    model = lcnet_model()
    assert planner.GraphIndex(model).shape("c4") is None  # the premise: dims lost after the Reshape
    layout, why_not, native = _planned(model)
    assert layout is not None, why_not
    graph = layout.model.graph
    ops = {(n.domain, n.op_type) for n in graph.node}
    assert (regions.NCHWC, "GlobalAveragePool") in ops and ("", "GlobalAveragePool") not in ops, sorted(ops)
    assert blocked_scale.OP in layout.native_ops and ("", "Mul") not in ops, sorted(ops)
    producer = {o: n for n in graph.node for o in n.output}
    cat = next(n for n in graph.node if n.op_type == "Concat")
    assert not any(producer[t].op_type == "ReorderOutput" for t in cat.input), [producer[t] for t in cat.input]
    assert "2 FusedEltwiseChain" in layout.note and "1 Concat" in layout.note, layout.note
    for batch in (1, 2):
        assert _close(_run(layout, native, _feeds(batch)), _reference(model, _feeds(batch)))


@needs_nchwc
@pytest.mark.parametrize("name", ["db_text_detector", "yolov8n"])
def test_zoo_regions_remove_reorders_and_keep_the_outputs(name):
    """The detector's SE-residual chains, FPN Resizes and Concat, and YOLOv8n's C2f Split/Add/Concat run
    blocked: besides the reorders a tensor whose channels are not a multiple of this CPU's block keeps
    (the note names each such edge: the detector has channel counts of 24 and 40, whole blocks of 8
    but not of 16), at most a quarter of the reorders ORT left stays (where a region meets Reshape,
    ConvTranspose, a conv ORT leaves plain)."""
    model = onnx.load(str(models.build(name)))
    layout, why_not, native = _planned(model)
    assert layout is not None, why_not
    before, after = (int(v) for v in layout.note.split("reorders ", 1)[1].split(" (")[0].split(" -> "))
    misaligned = sum(int(n) for n in re.findall(r"(\d+) at \w+ \(\d+ channels, not a multiple of the block",
                                                 layout.note))
    assert (after - misaligned) * 4 <= before, layout.note
    feeds = models.sample_inputs(name)
    assert _close(_run(layout, native, feeds), _reference(model, feeds))


@needs_nchwc
@pytest.mark.parametrize("winograd_mode", ["off", "on"])
def test_a_failing_region_rewrite_leaves_the_plan_as_it_was_with_the_reason(monkeypatch, winograd_mode):
    """The other layout rewrites do not depend on the regions: with Winograd off nothing is left to
    run blocked and the plan steps aside; with Winograd on (no timing: the measured decision differs
    between CPUs) the Winograd convs stay, and the note says why the regions did not."""
    def broken(graph, shape, block):
        raise RuntimeError("boom")

    monkeypatch.setattr(regions, "run_blocked_regions", broken)
    monkeypatch.setenv(winograd.ENV, winograd_mode)
    model = region_model(32)
    layout, why_not, native = _planned(model)
    if winograd_mode == "off" or block_size() not in (8, 16):  # run_winograd needs blocks of 8 or 16
        assert layout is None and "regions left to ORT (RuntimeError: boom)" in why_not, why_not
        return
    assert layout is not None, why_not
    assert "regions left to ORT (RuntimeError: boom)" in layout.note, layout.note
    ops = {n.op_type for n in layout.model.graph.node}
    assert winograd.OP in ops and not any(op.startswith(regions.BLOCKED_CHAIN) for op in ops), sorted(ops)
    assert _close(_run(layout, native, _feeds(2)), _reference(model, _feeds(2)))


@pytest.mark.parametrize("second", ["x", "y"])
def test_tensors_of_lost_dims_join_only_themselves(second):
    """Dims shape inference lost are each tensor's own symbols: Add(x, x) of a reorder's output runs
    on blocks, Add(x, y) of two such tensors does not (they may differ in H or W and broadcast)."""
    nodes = [helper.make_node("ReorderOutput", ["xb"], ["x"], domain=regions.NCHWC, channels=16, channels_last=0),
             helper.make_node("ReorderOutput", ["yb"], ["y"], domain=regions.NCHWC, channels=16, channels_last=0),
             helper.make_node("Add", ["x", second], ["z"], name="add"),
             helper.make_node("ReorderInput", ["z"], ["zb"], domain=regions.NCHWC),
             helper.make_node("ReorderOutput", ["zb"], ["out"], domain=regions.NCHWC, channels=16, channels_last=0)]
    io = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("xb", "yb", "out")]
    graph = helper.make_graph(nodes, "lost", io[:2], io[2:])
    result = regions.run_blocked_regions(graph, lambda name: None, 8)
    ops = [n.op_type for n in graph.node]
    if second == "x":
        add = next(n for n in graph.node if n.op_type == "Add")
        assert result.regions == 1 and list(add.input) == ["xb", "xb"] and "ReorderInput" not in ops, ops
    else:
        assert result.regions == 0 and ops == ["ReorderOutput"] * 2 + ["Add", "ReorderInput", "ReorderOutput"], ops
