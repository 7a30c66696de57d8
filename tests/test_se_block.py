"""Squeeze-and-excitation as one op (custom_ops/native/ops/se_block.py, ortfuse/layout/se_block.py):
the native FusedSqueezeExciteBlocked kernel against its float64 numpy reference, its error statuses,
the rewrite of ORT's blocked SE (GlobalAveragePool -> Conv -> Conv -> channel scale) with the
measured decision forced both ways, and zoo models against stock ORT at ORT_DISABLE_ALL. Tolerance:
|got - ref| <= 1e-4 * max(1, max|ref|) (float32 sums and products against float64; BN folding)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from native_sessions import from_blocked, one_op_session, to_blocked
from onnx import helper

from ortfuse.custom_ops.kernels.squeeze_excite import reference
from ortfuse.custom_ops.native.ops import se_block as native_se
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.kernel_choice.op_registration import with_custom_ops

from model_fixtures import disable_all_outputs

OP, OP_ADD = native_se.OP, native_se.OP_ADD
TOL = 1e-4
InvalidArgument = onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument


def _close(got, ref) -> float:
    return float(np.abs(got - ref).max()) / max(1.0, float(np.abs(ref).max()))


def _session(block: int, add: bool = False, threads: int = 2, **attrs):
    names = ["x", "w1", "b1", "w2", "b2"] + (["a"] if add else [])
    return one_op_session(OP_ADD if add else OP, names, threads, block=block, **attrs)






def _weights(c: int, cr: int, seed: int):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((cr, c)) / np.sqrt(c)).astype(np.float32)
    w2 = (rng.standard_normal((c, max(cr, 1))) / np.sqrt(max(cr, 1)))[:, :cr].astype(np.float32)
    return w1, rng.standard_normal(cr).astype(np.float32), w2, rng.standard_normal(c).astype(np.float32)


def _feeds(x, w1, b1, w2, b2, block, a=None):
    feeds = {"x": to_blocked(x, block), "w1": np.ascontiguousarray(w1.T), "b1": b1, "w2": np.ascontiguousarray(w2.T),
             "b2": b2}
    if a is not None:
        feeds["a"] = to_blocked(a, block)
    return feeds


# blocks 8 and 16 (AVX2, AVX-512), one not dividing the 64-float row (12), block 1; groups longer
# than a work block (96 x 40 x 40), images of one pixel, batches, Cr off the block, tails
SHAPES = [(8, 1, 24, 6, 7, 9), (16, 2, 32, 8, 5, 5), (8, 1, 96, 24, 40, 40), (8, 3, 16, 6, 1, 1),
          (12, 1, 24, 5, 3, 7), (1, 2, 5, 3, 4, 4), (8, 1, 64, 16, 13, 11), (16, 1, 48, 12, 2, 33)]


@pytest.mark.parametrize("block, n, c, cr, h, w", SHAPES)
@pytest.mark.parametrize("act, gate, residual, add", [("relu", "hardsigmoid", 0, False),
                                                      ("hardswish", "sigmoid", 1, False),
                                                      ("silu", "hardsigmoid", 1, True),
                                                      ("", "sigmoid", 0, True),
                                                      ("sigmoid", "hardsigmoid", 0, False)])
def test_kernel_matches_the_float64_reference(block, n, c, cr, h, w, act, gate, residual, add):
    rng = np.random.default_rng(c * 31 + h)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32) + 0.5
    a = rng.standard_normal((n, c, h, w)).astype(np.float32) if add else None
    w1, b1, w2, b2 = _weights(c, cr, seed=c + cr)
    attrs = {"gate": gate, "residual": residual, "alpha": 1 / 6, "beta": 0.5, **({"activation": act} if act else {})}
    y = _session(block, add, **attrs).run(None, _feeds(x, w1, b1, w2, b2, block, a))[0]
    assert y.shape == (n, c, h, w)
    ref = reference(x, w1, b1, w2, b2, act, gate, 1 / 6, 0.5, bool(residual), a)
    assert _close(from_blocked(y, block), ref) <= TOL


def test_kernel_runs_serially_and_on_the_pool_alike():
    """One thread and two threads give the same values bit for bit (each group is summed by one worker)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 64, 30, 30)).astype(np.float32)
    w1, b1, w2, b2 = _weights(64, 16, seed=3)
    feeds = _feeds(x, w1, b1, w2, b2, 8)
    one = _session(8, threads=1, gate="hardsigmoid", activation="relu").run(None, feeds)[0]
    two = _session(8, threads=2, gate="hardsigmoid", activation="relu").run(None, feeds)[0]
    assert np.array_equal(one, two)


def test_kernel_keeps_nan_and_inf_where_the_reference_does():
    """A NaN in one channel's input makes that channel's mean NaN, hence every gate through the FCs:
    the output is NaN wherever the reference's is, and finite elsewhere."""
    x = np.ones((1, 8, 3, 3), np.float32)
    x[0, 2, 1, 1] = np.nan
    w1, b1, w2, b2 = _weights(8, 4, seed=1)
    y = _session(8, gate="sigmoid", activation="relu").run(None, _feeds(x, w1, b1, w2, b2, 8))[0]
    ref = reference(x, w1, b1, w2, b2, "relu", "sigmoid")
    assert np.array_equal(np.isnan(from_blocked(y, 8)), np.isnan(ref))


def test_empty_images_give_an_empty_output():
    w1, b1, w2, b2 = _weights(8, 4, seed=2)
    y = _session(8, gate="sigmoid").run(None, _feeds(np.zeros((0, 8, 3, 3), np.float32), w1, b1, w2, b2, 8))[0]
    assert y.shape == (0, 8, 3, 3)


@pytest.mark.parametrize("change, text", [
    ({"x": np.ones((1, 12, 2, 2), np.float32)}, "W1 the shape [C, Cr]"),
    ({"x": np.ones((1, 12, 2, 2), np.float32), "w1": np.ones((12, 4), np.float32),
      "w2": np.ones((4, 12), np.float32), "b2": np.ones(12, np.float32),
      "a": np.ones((1, 12, 2, 2), np.float32)}, "multiple of the attribute block"),
    ({"x": np.ones((16, 2, 2), np.float32)}, "X must have rank 4"),
    ({"w1": np.ones((16, 5), np.float32)}, "B1 [Cr]"),
    ({"w2": np.ones((16, 4), np.float32)}, "W2 [Cr, C]"),
    ({"b2": np.ones((1, 16), np.float32)}, "B2 [C]"),
    ({"a": np.ones((1, 16, 2, 3), np.float32)}, "A X's shape"),
    ({"x": np.ones((1, 16, 2, 2), np.float64)}, "expected: (tensor(float))"),
])
def test_kernel_refuses_other_shapes_with_an_ort_error(change, text):
    feeds = {"x": np.ones((1, 16, 2, 2), np.float32), "w1": np.ones((16, 4), np.float32),
             "b1": np.ones(4, np.float32), "w2": np.ones((4, 16), np.float32), "b2": np.ones(16, np.float32),
             "a": np.ones((1, 16, 2, 2), np.float32)} | change
    sess = _session(8, add=True, gate="hardsigmoid")
    with pytest.raises((InvalidArgument, onnxruntime.capi.onnxruntime_pybind11_state.Fail), match=re.escape(text)):
        sess.run(None, feeds)


# --- the layout rewrite -------------------------------------------------------------------------

def se_model(c: int = 32, cr: int = 8, act: str = "Relu", gate: str = "HardSigmoid", residual: bool = False,
             hw: int = 12) -> onnx.ModelProto:
    """Conv -> HardSwish -> SE (GlobalAveragePool -> 1x1 Conv -> act -> 1x1 Conv -> gate -> Mul [-> + x])
    -> 1x1 Conv. ``act``: Relu, HardSwish or SiLU (Sigmoid then Mul); ``gate``: HardSigmoid or Sigmoid."""
    from onnx import numpy_helper

    rng = np.random.default_rng(c + cr)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [w("w0", c, 8, 3, 3), w("b0", c), w("w1", cr, c, 1, 1), w("b1", cr), w("w2", c, cr, 1, 1), w("b2", c),
             w("w3", 16, c, 1, 1)]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c0"], ["h0"]),
             helper.make_node("GlobalAveragePool", ["h0"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["f1"])]
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["f1"], ["f1s"]), helper.make_node("Mul", ["f1", "f1s"], ["z"])]
    else:
        nodes.append(helper.make_node(act, ["f1"], ["z"]))
    nodes.append(helper.make_node("Conv", ["z", "w2", "b2"], ["f2"]))
    gate_attrs: dict[str, Any] = {"alpha": 1 / 6, "beta": 0.5} if gate == "HardSigmoid" else {}
    nodes += [helper.make_node(gate, ["f2"], ["s"], **gate_attrs), helper.make_node("Mul", ["h0", "s"], ["m"])]
    if residual:
        nodes.append(helper.make_node("Add", ["m", "h0"], ["se"]))
    nodes.append(helper.make_node("Conv", ["se" if residual else "m", "w3"], ["y"]))
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 8, hw, hw])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 16, hw, hw])
    return helper.make_model(helper.make_graph(nodes, "se", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def _planned(model):
    from ortfuse import fuse
    from ortfuse.fusion.provenance import native_op_types
    from ortfuse.layout import planner

    fused, report = fuse(model)
    native = frozenset(native_op_types(fused))
    layout, why_not = planner.plan_layout(model, fused, None, native, report.disabled_ort_optimizers)
    return layout, why_not, native


def _run(layout, native, feeds):
    so, why_not = with_custom_ops(onnxruntime.SessionOptions(), native | layout.native_ops, python_ops=False)
    assert not why_not
    return onnxruntime.InferenceSession(layout.model.SerializeToString(), so).run(None, feeds)


def _se_ops(layout) -> list[onnx.NodeProto]:
    return [n for n in layout.model.graph.node if n.domain == DOMAIN and n.op_type in (OP, OP_ADD)]


def _forced(monkeypatch, faster: bool):
    """The measured decision forced (the timing differs between CPUs), the switch at its default; no
    channel padding (the SEs keep the channel counts the tests give them)."""
    from ortfuse.layout import se_block

    monkeypatch.delenv(se_block.ENV, raising=False)
    monkeypatch.setenv("ORTFUSE_CHANNEL_PADDING", "off")
    monkeypatch.setattr(se_block, "measured_faster", lambda *args: faster)


def _block_here() -> int:
    from ortfuse.layout.probe import block_size

    return block_size()


needs_nchwc = pytest.mark.skipif(_block_here() == 0, reason="ORT has no NCHWc kernels on this CPU")


@needs_nchwc
@pytest.mark.parametrize("c, cr, act, gate, residual", [
    (32, 8, "Relu", "HardSigmoid", False),
    (48, 16, "HardSwish", "Sigmoid", True),
    (32, 8, "SiLU", "HardSigmoid", True),
    (48, 6, "Relu", "HardSigmoid", False),  # FC1's outputs off the block: ORT reorders them, FC2 may stay plain
    (48, 6, "Relu", "HardSigmoid", True),
])
def test_an_se_measured_faster_runs_as_one_op_and_keeps_the_outputs(monkeypatch, c, cr, act, gate, residual):
    _forced(monkeypatch, faster=True)
    model = se_model(c, cr, act, gate, residual)
    layout, why_not, native = _planned(model)
    assert layout is not None, why_not
    ops = _se_ops(layout)
    assert len(ops) == 1, layout.note
    types = {n.op_type for n in layout.model.graph.node}
    assert "GlobalAveragePool" not in types and "FusedChannelScaleBlocked" not in types, sorted(types)
    assert "1 squeeze-excite block(s) as one op" in layout.note, layout.note
    attrs = {a.name: helper.get_attribute_value(a) for a in ops[0].attribute}
    assert attrs["residual"] == int(residual) and attrs["gate"] == gate.lower().encode()
    assert attrs.get("activation", b"") == {"Relu": b"relu", "HardSwish": b"hardswish", "SiLU": b"silu"}[act]
    for batch in (1, 2):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 8, 12, 12)).astype(np.float32)}
        got, ref = _run(layout, native, feeds), disable_all_outputs(model, feeds)
        assert _close(got[0], ref[0]) <= TOL


@needs_nchwc
def test_an_se_on_channels_off_the_block_stays_with_ort_and_the_note_says_why(monkeypatch):
    """20 channels: ORT pads the convs' channels to the block but leaves the GlobalAveragePool plain,
    behind a ReorderOutput; the SE is not matched and the note names the channel count."""
    _forced(monkeypatch, faster=True)
    model = se_model(20, 8)
    layout, why_not, native = _planned(model)
    if layout is None:
        assert why_not.startswith("layout: "), why_not
        return
    assert not _se_ops(layout), layout.note
    block = _block_here()
    if 20 % block:
        assert f"at GlobalAveragePool (20 channels, not a multiple of the block {block})" in layout.note, layout.note
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)}
    assert _close(_run(layout, native, feeds)[0], disable_all_outputs(model, feeds)[0]) <= TOL


@needs_nchwc
def test_an_se_measured_slower_is_left_to_ort_and_the_note_says_so(monkeypatch):
    _forced(monkeypatch, faster=False)
    model = se_model(32, 8)
    layout, why_not, native = _planned(model)
    assert layout is not None, why_not  # the channel scale still runs blocked
    assert not _se_ops(layout)
    assert "1 squeeze-excite block(s) left to ORT (not faster here)" in layout.note, layout.note
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)}
    assert _close(_run(layout, native, feeds)[0], disable_all_outputs(model, feeds)[0]) <= TOL


@needs_nchwc
def test_the_switch_off_leaves_every_se_to_ort_without_timing(monkeypatch):
    from ortfuse.layout import se_block

    def never(*args):
        raise AssertionError("timed although the switch is off")

    monkeypatch.setattr(se_block, "measured_faster", never)
    monkeypatch.setenv(se_block.ENV, "off")
    layout, why_not, _ = _planned(se_model(32, 8))
    assert layout is not None, why_not
    assert not _se_ops(layout) and "squeeze-excite block(s) left" not in layout.note, layout.note


@needs_nchwc
def test_an_se_whose_pooled_means_are_read_elsewhere_is_not_matched(monkeypatch):
    """The pooled means are a graph output too: the op would drop them, so the SE stays ORT's."""
    _forced(monkeypatch, faster=True)
    model = se_model(32, 8)
    model.graph.output.append(helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, ["n", 32, 1, 1]))
    layout, why_not, native = _planned(model)
    assert layout is not None, why_not
    assert not _se_ops(layout), layout.note
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)}
    got, ref = _run(layout, native, feeds), disable_all_outputs(model, feeds)
    assert all(_close(g, r) <= TOL for g, r in zip(got, ref))


# the channel counts of each zoo model's SE blocks: one runs blocked, and so can become one op, where
# its channels are a multiple of this CPU's NCHWc block
ZOO_SE = {"mobilenetv3_block": [72, 72, 120, 200], "pplcnet_classifier": [256, 512],
          "db_text_detector": [40, 64, 64, 240, 336, 336, 480, 480, 96, 96, 96, 96, 24, 24, 24, 24]}


@needs_nchwc
@pytest.mark.parametrize("name", sorted(ZOO_SE))
@pytest.mark.parametrize("faster", [True, False])
def test_zoo_se_blocks_keep_the_outputs_either_way(monkeypatch, name, faster):
    """Every SE block of the zoo's SE models whose channels fill whole blocks becomes one op when
    measured faster (the detector's neck SEs with their residual and FPN addend, and its SE whose FC2
    ORT left plain, included), none when slower; outputs equal stock ORT's within the tolerance
    either way."""
    from ortfuse import models

    _forced(monkeypatch, faster)
    model = onnx.load(str(models.build(name)))
    layout, why_not, native = _planned(model)
    assert layout is not None, why_not
    blocked = sum(c % _block_here() == 0 for c in ZOO_SE[name])
    assert len(_se_ops(layout)) == (blocked if faster else 0), layout.note
    if not faster and blocked:
        assert f"{blocked} squeeze-excite block(s) left to ORT" in layout.note, layout.note
    feeds = models.sample_inputs(name)
    got, ref = _run(layout, native, feeds), disable_all_outputs(model, feeds)
    assert all(_close(g, r) <= TOL for g, r in zip(got, ref))
