"""1x1 convolution on NCHWc blocks with its epilogue in cache (custom_ops/kernels/pointwise.py, the
native FusedPointwiseConvBlocked, ortfuse/layout/pointwise.py). Numerics: against the float64 numpy
reference and against stock ORT at ORT_DISABLE_ALL, |got - ref| <= 1e-4 * max(1, max|ref|) (float32
sums of up to a few hundred products in another order: about 1e-6 here)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from native_sessions import from_blocked, native_options, one_op_session, to_blocked
from onnx import helper, numpy_helper

import ortfuse
from ortfuse.custom_ops.kernels.pointwise_ref import pack_filter
from ortfuse.fusion.provenance import native_op_types
from ortfuse.layout import planner, pointwise
from ortfuse.layout.probe import block_size

from model_fixtures import disable_all_outputs, fan_in_weights, stock_conv_act

OP = pointwise.OP
TOL = 1e-4
InvalidArgument = onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument


def _close(got, ref) -> float:
    return float(np.abs(got - ref).max()) / max(1.0, float(np.abs(ref).max()))


def _session(block: int, act: str = "", alpha: float | None = None):
    attrs: dict = {"block": block, **({"activation": act} if act else {}), **({"alpha": alpha} if alpha else {})}
    return one_op_session(OP, "xpb", **attrs)


def _data(n, cin, cout, h, w, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    wt = (rng.standard_normal((cout, cin)) / np.sqrt(cin)).astype(np.float32)
    return x, wt, rng.standard_normal(cout).astype(np.float32)


def _reference(x, wt, b, act: str = "", alpha: float = 1.0) -> np.ndarray:
    y = np.einsum("oc,nchw->nohw", wt.astype(np.float64), x.astype(np.float64)) + b[None, :, None, None]
    if act == "relu":
        return np.maximum(y, 0)
    if act == "quick_gelu":
        return y / (1 + np.exp(-alpha * y))
    return y


# positions not a multiple of a tile (14 with 16 lanes, 6 with 8) nor of the tail, one position,
# an odd number of output blocks (a panel of one), batches, fewer tiles than work blocks
SHAPES = [(8, 1, 16, 24, 9, 11), (8, 2, 32, 8, 4, 4), (16, 1, 32, 48, 13, 6), (8, 1, 8, 8, 1, 1),
          (16, 1, 64, 80, 3, 37), (8, 1, 64, 128, 10, 10), (16, 2, 16, 16, 21, 5), (16, 1, 96, 48, 40, 40),
          (16, 3, 48, 16, 1, 3), (8, 1, 24, 40, 7, 7)]


@pytest.mark.parametrize("block, n, cin, cout, h, w", SHAPES)
@pytest.mark.parametrize("act, alpha", [("", None), ("relu", None), ("quick_gelu", 1.0), ("quick_gelu", 1.702)])
def test_kernel_matches_the_float64_reference(block, n, cin, cout, h, w, act, alpha):
    x, wt, b = _data(n, cin, cout, h, w, seed=cin + h)
    feeds = {"x": to_blocked(x, block), "p": pack_filter(wt, block), "b": b}
    y = _session(block, act, alpha).run(None, feeds)[0]
    assert y.shape == (n, cout, h, w)
    assert _close(from_blocked(y, block), _reference(x, wt, b, act, alpha or 1.0)) <= TOL


def test_pack_filter_orders_panels_of_two_blocks():
    """Panel q holds output blocks 2q, 2q+1 as [Cin, 2, block]; an odd last block is a panel of one."""
    block, cin, cout = 8, 16, 24
    wt = np.arange(cout * cin, dtype=np.float32).reshape(cout, cin)
    p = pack_filter(wt, block).reshape(-1)
    first = p[: cin * 2 * block].reshape(cin, 2, block)
    assert np.array_equal(first[3, 1], wt[block:2 * block, 3])
    last = p[cin * 2 * block:].reshape(cin, 1, block)
    assert np.array_equal(last[5, 0], wt[2 * block:, 5])


@pytest.mark.parametrize("act", ["", "relu", "quick_gelu"])
@pytest.mark.parametrize("block", [8, 16])
def test_kernel_matches_stock_ort(act, block):
    x, wt, b = _data(1, 64, 80, 20, 20, seed=3)
    y = _session(block, act, 1.0 if act == "quick_gelu" else None).run(
        None, {"x": to_blocked(x, block), "p": pack_filter(wt, block), "b": b})[0]
    assert _close(from_blocked(y, block), stock_conv_act(x, wt[:, :, None, None], b, act)) <= TOL


@pytest.mark.parametrize("block, x_shape, p_shape, b_shape, text", [
    (8, (1, 16, 4, 4), (16, 8), (16,), "P the shape"),
    (8, (1, 16, 4, 4), (16, 16, 1), (16,), "P the shape"),
    (8, (1, 16, 4, 4), (16, 16), (8,), "B the shape"),
    (8, (16, 4, 4), (16, 16), (16,), "X must have rank 4"),
    (8, (1, 16, 4, 4), (12, 16), (12,), "block must be 8 or 16"),
    (4, (1, 16, 4, 4), (16, 16), (16,), "block must be 8 or 16"),
])
def test_kernel_refuses_other_shapes_with_an_ort_error(block, x_shape, p_shape, b_shape, text):
    feeds = {"x": np.ones(x_shape, np.float32), "p": np.ones(p_shape, np.float32), "b": np.ones(b_shape, np.float32)}
    with pytest.raises(InvalidArgument, match=text):
        _session(block).run(None, feeds)
    feeds["x"] = feeds["x"].astype(np.float64)
    with pytest.raises(InvalidArgument, match=r"expected: \(tensor\(float"):
        _session(8).run(None, feeds)


def _concat_session(block: int, inputs: int, act: str = "quick_gelu"):
    attrs: dict = {"block": block, **({"activation": act, "alpha": 1.0} if act else {})}
    return one_op_session(f"{pointwise.CONCAT_OP}{inputs}", [f"x{i}" for i in range(inputs)] + ["p", "b"], **attrs)


# parts of one block, of several, odd block counts, tails of the 14/6-position tiles, batches
CONCATS = [(8, 1, (8, 16), 24, 5, 7), (16, 2, (16, 32, 16), 48, 9, 11), (16, 1, (32, 16, 16, 48), 32, 1, 3),
           (8, 1, (8,) * 6, 40, 13, 2), (16, 1, (64, 64), 64, 20, 20)]


@pytest.mark.parametrize("block, n, parts, cout, h, w", CONCATS)
@pytest.mark.parametrize("act", ["", "quick_gelu"])
def test_kernel_reads_a_concatenation_where_its_inputs_are(block, n, parts, cout, h, w, act):
    """FusedPointwiseConcatConvBlocked{K} equals the float64 conv of the inputs concatenated."""
    rng = np.random.default_rng(sum(parts) + h)
    xs = [rng.standard_normal((n, c, h, w)).astype(np.float32) for c in parts]
    x, wt, b = _data(n, sum(parts), cout, h, w, seed=len(parts))
    feeds = {f"x{i}": to_blocked(xi, block) for i, xi in enumerate(xs)} | {"p": pack_filter(wt, block), "b": b}
    y = _concat_session(block, len(parts), act).run(None, feeds)[0]
    assert y.shape == (n, cout, h, w)
    assert _close(from_blocked(y, block), _reference(np.concatenate(xs, axis=1), wt, b, act)) <= TOL


@pytest.mark.parametrize("shapes, p_cin, text", [
    ([(1, 8, 4, 4), (1, 8, 4, 5)], 16, "batch, height and width of the first"),
    ([(1, 8, 4, 4), (2, 8, 4, 4)], 16, "batch, height and width of the first"),
    ([(1, 8, 4, 4), (1, 8, 4, 4)], 24, "Cin = X's channels"),
    ([(1, 8, 4, 4), (1, 12, 4, 4)], 20, "divide every channel count"),
    ([(1, 8, 4, 4), (8, 4, 4)], 16, "X must have rank 4"),
])
def test_concat_kernel_refuses_inputs_that_do_not_join(shapes, p_cin, text):
    feeds = {f"x{i}": np.ones(s, np.float32) for i, s in enumerate(shapes)}
    feeds |= {"p": np.ones((16, p_cin), np.float32), "b": np.ones(16, np.float32)}
    with pytest.raises(InvalidArgument, match=text):
        _concat_session(8, 2).run(None, feeds)


def test_the_planner_and_the_kernel_agree_on_the_most_inputs_joined():
    """The layout module names MAX_INPUTS without importing the kernel module (no numba at planning):
    the two must agree, or a plan would ask for an op the library does not have."""
    from ortfuse.custom_ops.native.ops import pointwise_conv

    assert pointwise.MAX_INPUTS == pointwise_conv.MAX_INPUTS and pointwise.CONCAT_OP == pointwise_conv.CONCAT_OP


def test_empty_batch_gives_an_empty_output():
    y = _session(8).run(None, {"x": np.ones((0, 16, 4, 4), np.float32), "p": np.ones((16, 16), np.float32),
                               "b": np.ones(16, np.float32)})[0]
    assert y.shape == (0, 16, 4, 4)


# -- the layout step ----------------------------------------------------------------------------------
def _silu_model(c: int = 32, size: int = 20, shared: bool = False) -> onnx.ModelProto:
    """Conv 1x1 + SiLU (Sigmoid, Mul) -> Conv 1x1 + SiLU -> Concat with the first -> Conv 1x1 (a
    region op between blocked convs, so the layout step runs). ``shared``: the second conv's output
    is also added to the first SiLU's (a second reader: no QuickGelu alone reads it)."""
    w = fan_in_weights(11)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"]),
             helper.make_node("Sigmoid", ["c0"], ["s0"]), helper.make_node("Mul", ["c0", "s0"], ["m0"]),
             helper.make_node("Conv", ["m0", "w1", "b1"], ["c1"]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["m1"])]
    if shared:
        nodes += [helper.make_node("Add", ["m0", "c1"], ["a1"]),
                  helper.make_node("Concat", ["m1", "a1"], ["cat"], axis=1)]
    else:
        nodes.append(helper.make_node("Concat", ["m1", "m0"], ["cat"], axis=1))
    nodes.append(helper.make_node("Conv", ["cat", "w2"], ["y"]))
    io = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 16, size, size]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "g", io[:1], io[1:],
                              [w("w0", c, 16, 1, 1), w("b0", c), w("w1", c, c, 1, 1), w("b1", c),
                               w("w2", 16, 2 * c, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _c2f_model(c: int = 32, shared: bool = False) -> onnx.ModelProto:
    """YOLOv8's C2f join: Conv 1x1 + SiLU -> Split in two halves a, b -> Conv 1x1 + SiLU of b -> m;
    Concat(a, b, m) -> Conv 1x1 + SiLU. ``shared``: the Concat is a graph output too."""
    w = fan_in_weights(13)

    def conv_silu(x: str, k: int) -> list:
        return [helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [f"c{k}"]),
                helper.make_node("Sigmoid", [f"c{k}"], [f"s{k}"]),
                helper.make_node("Mul", [f"c{k}", f"s{k}"], [f"m{k}"])]

    nodes = [*conv_silu("x", 0), helper.make_node("Split", ["m0", "halves"], ["a", "b"], axis=1), *conv_silu("b", 1),
             helper.make_node("Concat", ["a", "b", "m1"], ["cat"], axis=1), *conv_silu("cat", 2)]
    out = [helper.make_tensor_value_info("m2", onnx.TensorProto.FLOAT, [1, c, 20, 20])]
    if shared:
        out.append(helper.make_tensor_value_info("cat", onnx.TensorProto.FLOAT, [1, 3 * c // 2, 20, 20]))
    inits = [w("w0", c, 16, 1, 1), w("b0", c), w("w1", c // 2, c // 2, 1, 1), w("b1", c // 2),
             w("w2", c, 3 * c // 2, 1, 1), w("b2", c),
             numpy_helper.from_array(np.array([c // 2, c // 2], np.int64), "halves")]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 20, 20])
    return helper.make_model(helper.make_graph(nodes, "c2f", [x], out, inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def _needs_blocks():
    if block_size() not in (8, 16):
        pytest.skip(f"ORT has no NCHWc block of 8 or 16 on this CPU (block {block_size()})")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_layout_runs_1x1_convs_with_their_silu_natively_when_told(tmp_path, monkeypatch, mode):
    """ORTFUSE_POINTWISE=on replaces both 1x1 convs whose SiLU ORT makes a QuickGelu, off neither;
    outputs as stock ORT_DISABLE_ALL."""
    _needs_blocks()
    monkeypatch.setenv(pointwise.ENV, mode)
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    model = _silu_model()
    x = np.random.default_rng(1).standard_normal((1, 16, 20, 20)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})[0]
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    assert ("2 1x1 conv(s) with their QuickGelu as " + OP in note) == (mode == "on"), note
    assert _close(sess.run(None, {"x": x})[0], ref) <= TOL


def test_a_conv_output_read_twice_is_left_to_ort(tmp_path, monkeypatch):
    """The second conv's output also feeds an Add: no QuickGelu alone reads it, so only the first
    conv is replaced; outputs as stock."""
    _needs_blocks()
    monkeypatch.setenv(pointwise.ENV, "on")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    model = _silu_model(shared=True)
    x = np.random.default_rng(2).standard_normal((1, 16, 20, 20)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})[0]
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    assert "1 1x1 conv(s) with their QuickGelu as " + OP in note, note
    assert _close(sess.run(None, {"x": x})[0], ref) <= TOL


def test_the_decider_is_asked_per_shape_and_a_refusal_keeps_orts_conv(tmp_path, monkeypatch):
    """measure mode asks decide(cin, cout, h, w, alpha, inputs) once per candidate; refusing the first keeps
    it as ORT's Conv -> QuickGelu (counted as left to ORT); outputs as stock."""
    _needs_blocks()
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    asked = []
    monkeypatch.setattr(pointwise, "decider", lambda block, threads, cold=False:
                        lambda *shape: asked.append(shape) or shape[0] != 16)
    model = _silu_model()
    x = np.random.default_rng(3).standard_normal((1, 16, 20, 20)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})[0]
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    note = str(sess.fusion_report)
    assert sorted(asked) == [(16, 32, 20, 20, 1.0, 1), (32, 32, 20, 20, 1.0, 1)], asked
    assert "1 1x1 conv(s) with their QuickGelu as " + OP + "; 1 left to ORT" in note, note
    assert _close(sess.run(None, {"x": x})[0], ref) <= TOL


@pytest.mark.parametrize("shared", [False, True])
def test_a_concat_only_a_1x1_conv_reads_is_read_where_its_inputs_are(tmp_path, monkeypatch, shared):
    """C2f's join (halves of 16 channels, whole blocks of 8 and 16): with ORTFUSE_POINTWISE=on the
    Concat before the last conv goes, the conv reads its three inputs (FusedPointwiseConcatConvBlocked3);
    a Concat the graph also returns stays, and the conv reads it; outputs as stock."""
    _needs_blocks()
    monkeypatch.setenv(pointwise.ENV, "on")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    model = _c2f_model(shared=shared)
    x = np.random.default_rng(5).standard_normal((1, 16, 20, 20)).astype(np.float32)
    ref = disable_all_outputs(model, {"x": x})
    fused, report = ortfuse.fuse(model)
    layout, why_not = planner.plan_layout(model, fused, None, frozenset(native_op_types(fused)),
                                          report.disabled_ort_optimizers)
    assert layout is not None, why_not
    assert "3 1x1 conv(s) with their QuickGelu as " + OP in layout.note, layout.note
    assert ("1 reading the inputs of the Concat before them" in layout.note) == (not shared), layout.note
    ops = [n.op_type for n in layout.model.graph.node]
    assert (f"{pointwise.CONCAT_OP}3" in ops) == (not shared) and ("Concat" in ops) == shared, ops
    sess = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    assert "1 reading the inputs" in str(sess.fusion_report) or shared, str(sess.fusion_report)
    for got, want in zip(sess.run(None, {"x": x}), ref):
        assert _close(got, want) <= TOL


def test_the_probes_two_forms_agree():
    """The timing probe's ORT form (blocked Conv -> QuickGelu, at this CPU's block) and native form
    compute the same."""
    _needs_blocks()
    block = block_size()
    stock, native = pointwise._pair_models(2 * block, 3 * block, 5, 7, block, 1.0)
    x = {"xb": np.random.default_rng(4).standard_normal((1, 2 * block, 5, 7)).astype(np.float32)}
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    a = onnxruntime.InferenceSession(stock, so).run(None, x)[0]
    nso = native_options({OP})
    nso.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    b = onnxruntime.InferenceSession(native, nso).run(None, x)[0]
    assert _close(b, a) <= TOL


def test_the_concat_probes_two_forms_agree():
    """With three inputs: ORT's Concat -> blocked Conv -> QuickGelu and the native op reading them."""
    _needs_blocks()
    block = block_size()
    stock, native = pointwise._pair_models(5 * block, 2 * block, 6, 3, block, 1.0, inputs=3)
    rng = np.random.default_rng(6)
    x = {f"xb{i}": rng.standard_normal((1, c, 6, 3)).astype(np.float32)
         for i, c in enumerate(pointwise.parts_of(5 * block, 3, block))}
    assert [v.shape[1] for v in x.values()] == [2 * block, 2 * block, block]
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    a = onnxruntime.InferenceSession(stock, so).run(None, x)[0]
    nso = native_options({f"{pointwise.CONCAT_OP}3"})
    nso.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    b = onnxruntime.InferenceSession(native, nso).run(None, x)[0]
    assert _close(b, a) <= TOL
