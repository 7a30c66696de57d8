"""The graph index every pass shares (ortfuse/ir/links.py, ortfuse/ir/editing.py): its readers, walks,
near-miss view, and the edits a GraphEdit records and commits, each checked against its contract."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

from ortfuse.ir.editing import GraphEdit
from ortfuse.ir.graph import GraphIndex
from ortfuse.ir.links import GraphLinks, is_op

F = onnx.TensorProto.FLOAT


def _graph(nodes, inputs=("x",), outputs=("y",), inits=()):
    return helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(i, F, [2, 3]) for i in inputs],
        [helper.make_tensor_value_info(o, F, [2, 3]) for o in outputs],
        [numpy_helper.from_array(np.full((2, 3), v, np.float32), n) for n, v in inits])


def _model(graph):
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _names(graph):
    return [n.name for n in graph.node]


def _chain():
    """x -> Relu a -> Neg b -> (Sigmoid c, Tanh d) ; y = Add(c, d); b is also read by Sub(b, b)."""
    return _graph([helper.make_node("Relu", ["x"], ["a"], name="a"),
                   helper.make_node("Neg", ["a"], ["b"], name="b"),
                   helper.make_node("Sigmoid", ["b"], ["c"], name="c"),
                   helper.make_node("Tanh", ["b"], ["d"], name="d"),
                   helper.make_node("Sub", ["b", "b"], ["e"], name="e"),
                   helper.make_node("Add", ["c", "d"], ["y"], name="y")])


# --- GraphLinks -----------------------------------------------------------------------------------

def test_readers_count_each_slot_and_each_body_that_reads_a_tensor():
    then = helper.make_graph([helper.make_node("Identity", ["a"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    graph = _graph([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                    helper.make_node("Mul", ["a", "a"], ["m"], name="square"),
                    helper.make_node("Greater", ["x", "x"], ["cond0"], name="gt"),
                    helper.make_node("ReduceMin", ["cond0"], ["cond"], name="all", keepdims=0),
                    helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then, else_branch=then)])
    links = GraphLinks(graph)
    assert links.producer["a"].name == "relu" and "x" not in links.producer
    assert [n.name for n in links.consumers_of("a")] == ["square", "square", "if", "if"]
    assert links.uses("a") == [(graph.node[1], 0), (graph.node[1], 1)]  # bodies have no input slot
    assert links.only_consumer("a") is None and links.consumers_of("nothing") == []


def test_only_consumer_needs_one_reader_and_no_graph_output():
    links = GraphLinks(_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"]),
                               helper.make_node("Abs", ["y"], ["z"])], outputs=("y", "z")))
    assert links.only_consumer("a").op_type == "Neg"
    assert links.only_consumer("y") is None  # read once, but the graph returns it
    assert links.only_consumer("z") is None


def test_the_near_miss_view_follows_the_first_reader_and_shares_every_table():
    ix = GraphIndex(_model(_chain()))
    view = ix.explaining()
    assert ix.only_consumer("b") is None and not ix.near_miss
    assert view.near_miss and view.only_consumer("b").name == "c"
    assert view.child("b", "Sigmoid").name == "c" and ix.child("b", "Sigmoid") is None
    assert view.explaining() is view and ix.explaining() is view
    ix.claimed.add(1)
    assert view.claimed is ix.claimed and view.producer is ix.producer
    assert view.unique_name("a") == "a_1" and ix.unique_name("a") == "a_2"  # names given out are shared


def test_walks_follow_op_types_domains_and_input_positions():
    graph = _graph([helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
                    helper.make_node("Add", ["w", "mm"], ["s"], name="add"),
                    helper.make_node("Softmax", ["s"], ["p"], name="softmax"),
                    helper.make_node("Gelu", ["p"], ["g"], name="gelu", domain="com.microsoft"),
                    helper.make_node("Relu", ["g"], ["y"], name="relu", domain="ai.onnx")], inits=[("w", 0.5)])
    links = GraphLinks(graph)
    add, softmax, gelu, relu = graph.node[1:]
    assert [n.name for n in links.child_path("mm", [("Add", 1), "Softmax"])] == ["add", "softmax"]
    assert links.child_path("mm", [("Add", 0)]) is None  # mm enters the Add at input 1
    assert links.child("p", "Gelu") is None  # "": the default domain, spelt "" or "ai.onnx"
    assert links.child("p", "Gelu", domain=None) is gelu and links.child("p", "Gelu", "com.microsoft") is gelu
    assert links.child("g", ("Relu", "Clip")) is relu
    assert [n.name for n in links.parent_path(softmax, [("Add", 0), ("MatMul", None)])] == ["add", "mm"]
    assert links.parent_path(softmax, [("Add", 0), ("MatMul", 0)]) is None  # input 0 of the Add is w
    assert [n.name for n in links.parent_path(softmax, [("Add", 0), ("MatMul", -1)])] == ["add", "mm"]
    assert links.parent_path(add, [("MatMul", 2)]) is None  # no input 2
    assert links.parent("w", "MatMul") is None and not is_op(None, "Relu")


# --- GraphEdit ------------------------------------------------------------------------------------

def test_lookups_answer_for_the_graph_as_it_was_until_the_commit():
    graph = _chain()
    before = graph.SerializeToString()
    edit = GraphEdit(graph)
    a, b = graph.node[0], graph.node[1]
    edit.replace(b, helper.make_node("Abs", ["a"], ["b"], name="abs"))
    edit.rewire("a", "x")
    edit.drop(a)
    assert edit.producer["b"] is b and edit.edited(a) and edit.edited(b) and not edit.edited(graph.node[2])
    assert graph.SerializeToString() == before
    assert edit.commit()
    assert _names(graph) == ["abs", "c", "d", "e", "y"] and list(graph.node[0].input) == ["x"]


def test_a_node_edited_twice_is_an_error():
    graph = _chain()
    edit = GraphEdit(graph)
    edit.drop(graph.node[4])
    with pytest.raises(ValueError, match="edited twice"):
        edit.replace(graph.node[4], helper.make_node("Identity", ["b"], ["e"]))


def test_replacements_take_the_place_of_the_node_in_order():
    graph = _chain()
    edit = GraphEdit(graph)
    edit.replace(graph.node[2], helper.make_node("Neg", ["b"], ["n"], name="n1"),
                 helper.make_node("Sigmoid", ["n"], ["c"], name="n2"))
    edit.commit()
    assert _names(graph) == ["a", "b", "n1", "n2", "d", "e", "y"]


def test_the_commit_prunes_only_what_the_edits_left_unread():
    graph = _graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                    helper.make_node("Add", ["r", "w"], ["s"], name="add"),
                    helper.make_node("Mul", ["s", "k"], ["y"], name="mul"),
                    helper.make_node("Neg", ["x"], ["dead"], name="dead_before")],
                   inits=[("w", 1.0), ("k", 2.0), ("unused", 3.0)])
    edit = GraphEdit(graph)
    edit.replace(graph.node[2], helper.make_node("Mul", ["x", "k2"], ["y"], name="new"))
    edit.add_initializer(numpy_helper.from_array(np.full((2, 3), 4.0, np.float32), "k2"))
    edit.commit()
    # the Add and the Relu it alone read go, and w and k with them; what was unread before stays
    assert _names(graph) == ["new", "dead_before"]
    assert sorted(t.name for t in graph.initializer) == ["k2", "unused"]
    assert [i.name for i in graph.input] == ["x"] and [o.name for o in graph.output] == ["y"]


def test_a_node_keeps_its_place_while_one_output_or_a_graph_output_is_read():
    graph = _graph([helper.make_node("Split", ["x"], ["p", "q"], name="split", axis=1, num_outputs=2),
                    helper.make_node("Relu", ["p"], ["y"], name="relu"),
                    helper.make_node("Neg", ["q"], ["z"], name="neg")], outputs=("y", "z"))
    edit = GraphEdit(graph)
    edit.replace(graph.node[2], helper.make_node("Abs", ["x"], ["z"], name="abs"))
    edit.commit()
    assert _names(graph) == ["split", "relu", "abs"]


def test_a_tensor_a_body_reads_is_not_pruned():
    body = helper.make_graph([helper.make_node("Identity", ["w"], ["t"])], "body", [],
                             [helper.make_tensor_value_info("t", F, None)])
    graph = _graph([helper.make_node("Add", ["x", "w"], ["s"], name="add"),
                    helper.make_node("ReduceMin", ["x"], ["m"], name="min", keepdims=0),
                    helper.make_node("Cast", ["m"], ["cond"], name="cast", to=onnx.TensorProto.BOOL),
                    helper.make_node("If", ["cond"], ["y"], name="if", then_branch=body, else_branch=body)],
                   outputs=("s", "y"), inits=[("w", 1.0)])
    edit = GraphEdit(graph)
    edit.replace(graph.node[0], helper.make_node("Relu", ["x"], ["s"], name="relu"))
    edit.commit()
    assert [t.name for t in graph.initializer] == ["w"]


def test_rewiring_reaches_new_nodes_and_leaves_graph_outputs():
    graph = _graph([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                    helper.make_node("Identity", ["a"], ["b"], name="copy"),
                    helper.make_node("Neg", ["b"], ["y"], name="neg")], outputs=("y", "b"))
    edit = GraphEdit(graph)
    edit.rewire("b", "a")
    edit.replace(graph.node[2], helper.make_node("Abs", ["b"], ["y"], name="abs"))
    edit.commit()
    assert _names(graph) == ["relu", "copy", "abs"]  # copy still writes the graph output b
    assert list(graph.node[2].input) == ["a"] and [o.name for o in graph.output] == ["y", "b"]


def test_the_commit_orders_nodes_that_read_before_a_write_and_keeps_an_order_that_is_one():
    graph = _chain()
    edit = GraphEdit(graph)
    edit.replace(graph.node[2], helper.make_node("Sigmoid", ["f"], ["c"], name="c"))  # reads f ...
    edit.replace(graph.node[4], helper.make_node("Exp", ["d"], ["f"], name="f"))  # ... written after d
    edit.commit()
    assert _names(graph) == ["a", "b", "d", "f", "c", "y"]
    edit = GraphEdit(graph)
    edit.replace(graph.node[3], helper.make_node("Exp", ["d"], ["f"], name="f2"))
    edit.commit()
    assert _names(graph) == ["a", "b", "d", "f2", "c", "y"]


def test_a_cycle_is_refused_and_the_graph_is_unchanged():
    graph = _chain()
    before = graph.SerializeToString()
    edit = GraphEdit(graph)
    edit.replace(graph.node[0], helper.make_node("Relu", ["y"], ["a"], name="a"))
    with pytest.raises(ValueError, match="cycle"):
        edit.commit()
    assert graph.SerializeToString() == before


def test_a_commit_with_nothing_recorded_changes_nothing_and_a_second_commit_is_an_error():
    graph = _chain()
    before = graph.SerializeToString()
    edit = GraphEdit(graph)
    assert edit.commit() is False
    assert graph.SerializeToString() == before
    with pytest.raises(ValueError, match="committed already"):
        edit.commit()


def test_an_edited_model_computes_what_the_original_does_on_stock_ort():
    """x -> Identity -> Relu -> Mul(2) -> y, the Identity folded away and the Mul made an Add of the value
    to itself: the same outputs as the original on stock ORT (ORT_DISABLE_ALL), to the bit."""
    original = _model(_graph([helper.make_node("Identity", ["x"], ["a"], name="copy"),
                              helper.make_node("Relu", ["a"], ["r"], name="relu"),
                              helper.make_node("Mul", ["r", "two"], ["y"], name="mul")], inits=[("two", 2.0)]))
    edited = onnx.ModelProto()
    edited.CopyFrom(original)
    edit = GraphEdit(edited.graph)
    copy, _, mul = edited.graph.node
    edit.rewire("a", "x")
    edit.drop(copy)
    edit.replace(mul, helper.make_node("Add", ["r", "r"], ["y"], name="double"))
    edit.commit()
    onnx.checker.check_model(edited, full_check=True)
    assert _names(edited.graph) == ["relu", "double"] and not edited.graph.initializer
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want, got = (onnxruntime.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
                 .run(None, {"x": x})[0] for m in (original, edited))
    np.testing.assert_array_equal(got, want)
