"""The layout step at the dims a session serves (``ortfuse.tune_dims``): a model that declares its
spatial dims dynamic gets its native convs (Winograd, depthwise) decided at the named sizes, the plan
keeps the dims dynamic and runs at any size, and the rewrites' legality is still proved on the
model's own (dynamic) shapes. Outputs against stock ORT at ORT_DISABLE_ALL,
|got - ref| <= 1e-4 * max(1, max|ref|) (the Winograd transforms round differently, about 1e-5)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

import ortfuse
from ortfuse.foundation.session_options import DIMS_KEY
from ortfuse.ir import feeds
from ortfuse.layout import deconv, depthwise, se_block, served_sizes, winograd
from ortfuse.layout.probe import block_size

from model_fixtures import fan_in_weights

TOL = 1e-4


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))


def _close(got, ref) -> float:
    return float(np.abs(got - ref).max()) / max(1.0, float(np.abs(ref).max()))


def _model(residual: bool = False, c: int = 32) -> onnx.ModelProto:
    """x [1, 16, h, w] -> Conv 1x1 -> a; Conv 3x3 (a) + SiLU -> m [+ a]; depthwise 3x3 (m) -> Concat
    with m -> Conv 1x1: a Winograd candidate and a depthwise one, the spatial dims named h and w."""
    w = fan_in_weights(11)

    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Conv", ["a", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["m1"])]
    last = "m1"
    if residual:
        nodes.append(helper.make_node("Add", ["m1", "a"], ["r1"]))
        last = "r1"
    nodes += [helper.make_node("Conv", [last, "wd", "bd"], ["d"], pads=[1, 1, 1, 1], group=c),
              helper.make_node("Relu", ["d"], ["dr"]),
              helper.make_node("Concat", ["dr", last], ["cat"], axis=1),
              helper.make_node("Conv", ["cat", "w3"], ["y"])]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, "h", "w"])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, "h", "w"])
    graph = helper.make_graph(nodes, "served_dims", [x], [y],
                              [w("w0", c, 16, 1, 1), w("w1", c, c, 3, 3), w("b1", c), w("wd", c, 1, 3, 3),
                               w("bd", c), w("w3", 8, 2 * c, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _asking(monkeypatch) -> dict[str, list]:
    """Deciders that take every candidate and record the sizes they were asked at."""
    asked: dict[str, list] = {"winograd": [], "depthwise": []}
    monkeypatch.setattr(winograd, "decider", lambda block, threads, cold=False:
                        lambda cin, cout, h, w, *rest: asked["winograd"].append((h, w)) or True)
    monkeypatch.setattr(depthwise, "decider", lambda block, threads, cold=False:
                        lambda s: asked["depthwise"].append((s.h, s.w)) or True)
    monkeypatch.setattr(deconv, "decider", lambda block, threads, cold=False: lambda *a: False)
    monkeypatch.setattr(se_block, "decider", lambda block, threads, cold=False: lambda s: False)
    return asked


def _options(dims: str | None):
    so = onnxruntime.SessionOptions()
    if dims is not None:
        so.add_session_config_entry(DIMS_KEY, dims)
    return so


def _stock(model, x):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), so).run(None, {"x": x})[0]


@pytest.fixture
def blocked():
    if block_size() not in (8, 16):
        pytest.skip("ORT has no NCHWc block of 8 or 16 on this CPU")


def test_without_served_dims_the_native_convs_of_a_dynamic_model_are_left_to_ort(monkeypatch, blocked):
    asked = _asking(monkeypatch)
    sess = ortfuse.InferenceSession(_model().SerializeToString(), _options(None), fusion=True)
    note = str(sess.fusion_report)
    assert asked == {"winograd": [], "depthwise": []}, asked
    assert "Winograd" not in note and "0 of 1 depthwise" in note, note
    assert ("blocked conv(s) of unknown size, whose native forms were not timed (the model declares h, w dynamic): "
            f"name the sizes served in the {DIMS_KEY} entry (h=N,w=N) to time them") in note, note


def test_served_dims_decide_the_native_convs_and_the_plan_runs_at_any_size(monkeypatch, blocked):
    """Decided at h=24, w=20 (the depthwise conv after the 3x3 one at the same size); the plan keeps
    h and w dynamic and equals stock ORT at the served size and at two others."""
    asked = _asking(monkeypatch)
    model = _model()
    sess = ortfuse.InferenceSession(model.SerializeToString(), _options("h=24,w=20"), fusion=True)
    note = str(sess.fusion_report)
    assert asked == {"winograd": [(24, 20)], "depthwise": [(24, 20)]}, asked
    assert "1 3x3 conv(s) as Winograd" in note and "1 of 1 depthwise conv(s) native" in note, note
    assert "unknown size" not in note, note
    assert sess.get_inputs()[0].shape == [1, 16, "h", "w"]  # the plan ORT loaded keeps them dynamic
    rng = np.random.default_rng(5)
    for h, w in [(24, 20), (13, 17), (40, 3)]:
        x = rng.standard_normal((1, 16, h, w)).astype(np.float32)
        assert _close(sess.run(None, {"x": x})[0], _stock(model, x)) <= TOL, (h, w)


def test_the_residual_is_folded_only_where_the_models_own_shapes_prove_it(monkeypatch, blocked):
    """The shortcut Add has the conv's dims at the served size, but the model's own dims are unknown:
    the conv runs as Winograd, the Add stays with ORT (a fold proved at one size only could meet
    another size that broadcasts); outputs as stock ORT at another size."""
    asked = _asking(monkeypatch)
    model = _model(residual=True)
    sess = ortfuse.InferenceSession(model.SerializeToString(), _options("h=24,w=20"), fusion=True)
    note = str(sess.fusion_report)
    assert asked["winograd"] == [(24, 20)], asked
    assert winograd.OP in note and winograd.OP_ADD not in note, note
    x = np.random.default_rng(6).standard_normal((1, 16, 9, 30)).astype(np.float32)
    assert _close(sess.run(None, {"x": x})[0], _stock(model, x)) <= TOL


def test_a_malformed_entry_is_named_in_the_report_and_the_plan_is_made_without_it(monkeypatch, blocked):
    asked = _asking(monkeypatch)
    model = _model()
    sess = ortfuse.InferenceSession(model.SerializeToString(), _options("h=0"), fusion=True)
    note = str(sess.fusion_report)
    assert f"the {DIMS_KEY} entry was not used (dim 'h=0' is not NAME=VALUE" in note, note
    assert asked["winograd"] == [], asked
    x = np.random.default_rng(7).standard_normal((1, 16, 12, 12)).astype(np.float32)
    assert _close(sess.run(None, {"x": x})[0], _stock(model, x)) <= TOL


def test_with_named_dims_fixes_the_named_dims_and_the_batch_only():
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, ["n", 3, "h", None]),
                               helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [None, 3, "h", 5])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph)
    fixed = feeds.with_named_dims(model, {"h": 7, "batch": 2})
    assert [dims for _, _, dims in feeds.declared_inputs(fixed)] == [[2, 3, 7, None], [2, 3, 7, 5]]
    assert [dims for _, _, dims in feeds.declared_inputs(model)] == [["n", 3, "h", None], [None, 3, "h", 5]]
    assert [dims for _, _, dims in feeds.declared_inputs(feeds.with_named_dims(model, {"n": 4}))] == \
        [[4, 3, "h", None], [None, 3, "h", 5]]
    assert feeds.with_named_dims(model, {"seq": 9}) is None


def test_dims_of_names_each_dynamic_dim_by_its_size_in_the_feeds():
    declared = [("a", 1, ["n", 3, "h", None]), ("b", 1, [None, 3, "h", "w,odd"]), ("c", 1, [2, "seq"])]
    shapes = {"a": [4, 3, 7, 9], "b": [4, 3, 7, 5], "c": [2, 16]}
    assert served_sizes.dims_of(declared, shapes) == "n=4,h=7,batch=4,seq=16"
    shapes["b"] = [4, 3, 8, 5]  # h fed at two sizes: not named
    assert served_sizes.dims_of(declared, shapes) == "n=4,batch=4,seq=16"
    assert served_sizes.dims_of([("a", 1, [1, 3, 5])], {"a": [1, 3, 5]}) == ""
    assert served_sizes.dims_of(declared, {"a": [4, 3]}) == ""  # a rank ORT would refuse names nothing


def test_auto_lays_out_at_the_sizes_it_was_tuned_on(monkeypatch, blocked):
    """Decisions measured on feeds of h=24, w=20 (a session's recorded traffic, ``tune_with``,
    ``ortfuse tune --inputs``) with options that name no dims: the tuner times its plans laid out at
    those sizes, records them (``Tuning.served_dims``), and a later session that reads the decisions
    lays its plan out at them too; the plan keeps h and w dynamic."""
    from ortfuse.tune import measure as measuring
    from ortfuse.tune import tuner

    from timing_fixtures import raw_timing

    asked = _asking(monkeypatch)
    monkeypatch.setattr(measuring, "_time_with_control", lambda f, o, c, budget: raw_timing(0.5, 1.0))
    monkeypatch.delenv(tuner.ENV, raising=False)
    model = _model()
    x = np.random.default_rng(8).standard_normal((1, 16, 24, 20)).astype(np.float32)
    tuning = tuner.tune(model, force=True, sample={"x": x})
    assert tuning.served_dims == "h=24,w=20" and tuning.model_check["passed"], tuning.to_dict()
    assert asked["winograd"] and set(asked["winograd"]) == {(24, 20)}, asked
    assert tuner.Tuning.from_dict(tuning.to_dict()).served_dims == "h=24,w=20"
    asked["winograd"].clear()
    so = _options(None)
    so.add_session_config_entry("ortfuse.tune", "off")  # the cached decisions only
    sess = ortfuse.InferenceSession(model.SerializeToString(), so, fusion="auto")
    note = str(sess.fusion_report)
    assert "1 3x3 conv(s) as Winograd" in note, note
    assert sess.get_inputs()[0].shape == [1, 16, "h", "w"]
    for h, w in [(24, 20), (11, 31)]:
        x = np.random.default_rng(h).standard_normal((1, 16, h, w)).astype(np.float32)
        assert _close(sess.run(None, {"x": x})[0], _stock(model, x)) <= TOL, (h, w)


def test_dims_named_to_the_tuner_are_the_sizes_its_plans_are_laid_out_at(monkeypatch, blocked):
    """``ortfuse tune MODEL --dim h=24 --dim w=20`` (random feeds at the named sizes): the decisions
    record those sizes and the tuner's plans are laid out at them, as for served feeds."""
    from ortfuse.tune import measure as measuring
    from ortfuse.tune import tuner

    from timing_fixtures import raw_timing

    asked = _asking(monkeypatch)
    monkeypatch.setattr(measuring, "_time_with_control", lambda f, o, c, budget: raw_timing(0.5, 1.0))
    tuning = tuner.tune(_model(), force=True, measure=True, dims={"h": 24, "w": 20})
    assert tuning.served_dims == "h=24,w=20" and set(asked["winograd"]) == {(24, 20)}, (tuning.served_dims, asked)
