"""``fusion.anchor_ops``: whether any pattern can match a model, from its bytes. Its table is the
rules' anchors; it never says "no match" where ``fuse`` finds one (every rule's fusing examples);
and ``fusion="auto"`` on a model none can match serves stock ORT from its creation, with nothing
recorded, counted or tuned, and outputs bit-identical to stock ORT's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortfuse
from ortfuse.fusion import anchor_ops, catalogue
from ortfuse.fusion.rewrite import fuse


def _if_model(with_functions: bool = False) -> onnx.ModelProto:
    """y = x + 1 or x * 2 by a flag: every op a pattern starts from is inside If's branches."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    then = helper.make_graph([helper.make_node("Add", ["x", "one"], ["a"])], "then", [],
                             [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])], [one])
    other = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["b"])], "else", [],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])], [two])
    nodes = [helper.make_node("Identity", ["flag"], ["f"]),
             helper.make_node("If", ["f"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "if_only", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                                helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if with_functions:
        body = [helper.make_node("Relu", ["i"], ["o"])]
        model.functions.append(helper.make_function("local", "MyRelu", ["i"], ["o"], body,
                                                    [helper.make_opsetid("", 17)]))
    model.ir_version = 8
    return model


def test_the_table_is_the_rules_anchors():
    assert anchor_ops.ANCHOR_OP_TYPES == {r.id: r.anchor.op_types for r in catalogue.RULES}


@pytest.mark.parametrize("rule, example", [(r, e) for r in catalogue.RULES for e in r.examples if e.reason is None],
                         ids=lambda v: getattr(v, "id", getattr(v, "name", "")))
def test_a_model_fuse_matches_is_never_said_unmatchable(rule, example):
    model = example.build()
    _, report = fuse(model, [rule.id])
    assert report.matches, "a fusing example"
    data = model.SerializeToString()
    assert anchor_ops.may_match(data, [rule.id]) and anchor_ops.may_match(data, None)
    assert anchor_ops.top_level_op_types(data) == {n.op_type for n in model.graph.node}


def test_only_top_level_nodes_count_and_every_doubt_answers_maybe():
    model = _if_model()
    data = model.SerializeToString()
    assert anchor_ops.top_level_op_types(data) == {"Identity", "If"}  # Add and Mul are inside the branches
    assert not anchor_ops.may_match(data, None) and not anchor_ops.may_match(data, "auto")
    assert not fuse(model)[1].matches  # what the rewriter finds too
    assert anchor_ops.may_match(_if_model(with_functions=True).SerializeToString(), None)  # a call names a function
    assert anchor_ops.may_match(data, ["no_such_pattern"])
    assert anchor_ops.may_match(data[: len(data) // 2], None)  # truncated bytes
    assert anchor_ops.top_level_op_types(b"\xff\xff") is None
    conv_only = next(e for e in catalogue.rule("conv_act").examples if e.reason is None).build()
    kinds = {n.op_type for n in conv_only.graph.node}
    data = conv_only.SerializeToString()
    assert anchor_ops.may_match(data, ["conv_act"])
    unrelated = [p for p, ops in anchor_ops.ANCHOR_OP_TYPES.items() if not ops & kinds]
    assert unrelated and not anchor_ops.may_match(data, unrelated)
    assert not anchor_ops.may_match(data, ",".join(unrelated))  # the metadata's spelling


def test_auto_on_a_model_nothing_can_match_serves_stock_from_creation(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "if_only.onnx"
    onnx.save(_if_model(), str(path))
    session = ortfuse.InferenceSession(str(path), providers=["CPUExecutionProvider"], fusion="auto")
    assert session.wait_tuned(0) and "nothing to tune" in session.fusion_status
    assert session._ortfuse_counting is None and not session._ortfuse_live.recording
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    stock = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for flag in (True, False):
        feeds = {"x": x, "flag": np.array(flag)}
        for _ in range(10):  # as many runs as recording would take: none is counted
            got = session.run(None, feeds)
        assert np.array_equal(got[0], stock.run(None, feeds)[0])  # tolerance 0: the same ORT graph
    assert session._ortfuse_counting is None and session._ortfuse_live.served.runs == 0


def test_the_parsed_path_asks_the_same_question():
    """``planning._may_match``: the check where the model is parsed already (the bytes said decisions
    may exist here), with the same answers."""
    from ortfuse.runtime.planning import _may_match

    ids = catalogue.validate_patterns(None)
    assert not _may_match(_if_model(), ids) and _may_match(_if_model(with_functions=True), ids)
    conv = next(e for e in catalogue.rule("conv_act").examples if e.reason is None).build()
    assert _may_match(conv, ids) and _may_match(conv, ("conv_act",)) and not _may_match(conv, ("silu",))


@pytest.mark.parametrize("mode", ["sync", "off"])
def test_auto_in_every_tuning_mode_measures_nothing_on_a_model_none_can_match(tmp_path, monkeypatch, mode):
    """``ortfuse.tune`` sync measures at creation and off reads the cache: on a model no pattern can
    match, neither calls the tuner (which would run ORT on inputs made from the declared shapes), and
    the report says why."""
    from ortfuse.foundation.session_options import TUNE_KEY
    from ortfuse.runtime import planning

    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    calls: list = []
    monkeypatch.setattr(planning, "auto_tuning", lambda *args: calls.append(args))
    path = tmp_path / "if_only.onnx"
    onnx.save(_if_model(), str(path))
    so = ort.SessionOptions()
    so.add_session_config_entry(TUNE_KEY, mode)
    session = ortfuse.InferenceSession(str(path), so, providers=["CPUExecutionProvider"], fusion="auto")
    assert calls == [] and session.fusion_report.reason == planning.NO_ANCHOR
    stock = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"x": np.ones((2, 3), np.float32), "flag": np.array(False)}
    assert np.array_equal(session.run(None, feeds)[0], stock.run(None, feeds)[0])  # tolerance 0: ORT's graph
