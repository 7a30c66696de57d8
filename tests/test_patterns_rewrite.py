"""The rewriter across patterns: priorities, the ``patterns`` restriction, unknown ids, the input left
as is, metadata and opset imports, If subgraphs reading outer intermediates, names and provenance,
the report, value_info, the keep rule, shape inference of long vectors. What the checks assert:
tests/pattern_checks.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse import fuse
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.catalogue import PATTERN_IDS, UnknownPatternError
from ortfuse.fusion.report import DISABLED

from pattern_checks import (
    Case,
    assert_fused,
    case,
    chain_mul_add_relu_constants,
    conv,
    conv_add_relu_residual_input,
    conv_bn_relu,
    conv_relu,
    matmul3d_add_relu,
    reject_reasons,
)
from pattern_graphs import (
    GraphBuilder,
    assert_outputs_close,
    bn_params,
    epi_gelu_erf_torch,
    fused_nodes,
    node_attrs,
    run_ortfuse,
    run_stock,
)


# =============================================================================================
# across patterns: priorities, restriction, unknown ids, subgraphs, names
# =============================================================================================
def _mixed_model():
    """silu, add_relu, eltwise_chain, gemm_act and conv_act in one graph."""
    b = GraphBuilder()
    x, y = b.input("x", [3, 5]), b.input("y", [3, 5])
    s = b.op("Mul", [x, b.op("Sigmoid", [x], name="sig")], name="silu_mul")
    r = b.op("Relu", [b.op("Add", [s, y], name="add")], name="add_relu")
    e = b.op("Tanh", [b.op("Mul", [r, b.init(np.float32(0.5))], name="scale")], name="tanh")
    g = b.op("Relu", [b.op("Gemm", [e, b.init(b.weight((5, 4))), b.init(b.weight(4))], name="gemm")], name="gemm_relu")
    img = b.input("img", [1, 2, 5, 5])
    cv = b.op("Relu", [conv(b, img, 2, 3)], name="conv_relu")
    b.output(g, cv)
    return b


MIXED_EXPECTED = {
    "silu": ["sig", "silu_mul"], "add_relu": ["add", "add_relu"], "eltwise_chain": ["scale", "tanh"],
    "gemm_act": ["gemm", "gemm_relu"], "conv_act": ["conv", "conv_relu"],
}
# alone, eltwise_chain also takes the silu and add_relu nodes (x and y become run-time operands)
MIXED_ALONE = {**MIXED_EXPECTED, "eltwise_chain": ["sig", "silu_mul", "add", "add_relu", "scale", "tanh"]}


def test_all_patterns_in_one_graph():
    b = _mixed_model()
    assert_fused(case(b, *MIXED_EXPECTED.items()))


@pytest.mark.parametrize("pattern_id", list(MIXED_EXPECTED))
def test_patterns_argument_restricts_matching(pattern_id):
    b = _mixed_model()
    c = case(b, (pattern_id, MIXED_ALONE[pattern_id]))
    _fused, report = assert_fused(c, patterns=[pattern_id])
    assert report.patterns == [pattern_id]
    assert {m.pattern_id for m in report.matches} == {pattern_id}
    _fused2, report2 = fuse(c.model, pattern_id)  # a comma-separated string works too
    assert [m.nodes for m in report2.fused] == [m.nodes for m in report.fused]


def test_patterns_argument_with_two_ids_and_auto():
    c = case(_mixed_model())
    _, report = fuse(c.model, ["silu", "conv_act"])
    assert sorted(m.pattern_id for m in report.fused) == ["conv_act", "silu"]
    _, report = fuse(c.model, "silu,add_relu")
    assert sorted(m.pattern_id for m in report.fused) == ["add_relu", "silu"]
    _, report = fuse(c.model, "auto")
    assert len(report.fused) == len(MIXED_EXPECTED)
    _, report = fuse(c.model, [])
    assert not report.matches and not report.applied


def test_unknown_pattern_id_raises_listing_known_ids():
    model = _mixed_model().build()
    with pytest.raises(UnknownPatternError) as info:
        fuse(model, ["silu", "swish"])
    message = str(info.value)
    assert "'swish'" in message
    for pid in PATTERN_IDS:
        assert pid in message
    assert isinstance(info.value, ValueError)
    with pytest.raises(UnknownPatternError, match="known ids are: " + ", ".join(PATTERN_IDS)):
        fuse(model, "conv_relu")
    with pytest.raises(UnknownPatternError):
        ortfuse.InferenceSession(model.SerializeToString(), fusion=True, fusion_patterns=["nope"])


def test_fuse_spells_the_pattern_keyword_as_the_session_does():
    """``fusion_patterns=`` on ``fuse()`` as on ``InferenceSession``; ``patterns=``, its former name,
    still works and says it is deprecated."""
    model = _mixed_model().build()
    _, named = fuse(model, fusion_patterns=["silu"])
    with pytest.warns(DeprecationWarning, match="fusion_patterns="):
        _, former = fuse(model, patterns=["silu"])
    assert former.counts() == named.counts() == {"silu": 1}
    with pytest.raises(TypeError, match="not both"):
        fuse(model, fusion_patterns=["silu"], patterns=["silu"])


def test_higher_priority_pattern_claims_shared_nodes():
    """Conv -> Add(residual) -> Relu: conv_add_relu (first in the catalogue) wins over add_relu."""
    _fused, report = assert_fused(conv_add_relu_residual_input())
    assert [m.pattern_id for m in report.matches] == ["conv_add_relu"]


def test_fuse_does_not_modify_its_input_and_is_idempotent():
    c = chain_mul_add_relu_constants()
    before = c.model.SerializeToString()
    fused, _report = fuse(c.model)
    assert c.model.SerializeToString() == before
    again, report2 = fuse(fused)
    assert again.SerializeToString() == fused.SerializeToString()
    assert not report2.applied and "already holds ortfuse fused ops" in report2.reason


@pytest.mark.parametrize("build, domains", [(matmul3d_add_relu, set()), (conv_relu, {"com.microsoft"}),
                                            (chain_mul_add_relu_constants, {DOMAIN})], ids=["ai.onnx", "ms", "contrib"])
def test_fused_model_metadata_and_opset_imports(build, domains):
    """Rewritten models carry the metadata keys and import exactly the extra domains their nodes use."""
    c = build()
    fused, _ = fuse(c.model)
    props = {p.key: p.value for p in fused.metadata_props}
    assert props["fusion_enabled"] == "true"
    assert props["ortfuse_graph_digest"]
    assert props["ortfuse_rewritten"] == "true"
    assert {n.domain for n in fused.graph.node} - {""} == domains
    assert {o.domain for o in fused.opset_import} - {"", "ai.onnx"} == domains


# --- If subgraphs reading outer intermediates ----------------------------------------------------
def _if_node(b: GraphBuilder, cond: str, then_reads: str, else_reads: str, shape, name="if"):
    then_g = helper.make_graph([helper.make_node("Neg", [then_reads], ["then_out"], name="then_neg")], "then", [],
                               [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, shape)])
    else_g = helper.make_graph([helper.make_node("Identity", [else_reads], ["else_out"], name="else_id")], "else", [],
                               [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, shape)])
    return b.op("If", [cond], name=name, then_branch=then_g, else_branch=else_g)


def _assert_if_case(b: GraphBuilder, must_survive: str, expected_fused):
    model = b.build()
    fused, report = fuse(model)
    assert sorted((m.pattern_id, sorted(m.nodes)) for m in report.fused) == sorted(
        (p, sorted(n)) for p, n in expected_fused), report.table()
    onnx.checker.check_model(fused)
    produced = {o for n in fused.graph.node for o in n.output} | {i.name for i in fused.graph.input}
    assert must_survive in produced, f"'{must_survive}' read by the If branch disappeared"
    for cond in (True, False):
        feeds = {**b.feeds(), "cond": np.array(cond)}
        ref = run_stock(model, feeds)
        got, _ = run_ortfuse(fused, feeds)
        assert_outputs_close(got, ref)
        got, _ = run_ortfuse(model, feeds, fusion=True)
        assert_outputs_close(got, ref)


def test_if_branch_reading_silu_intermediate_blocks_the_fusion():
    b = GraphBuilder()
    x, cond = b.input("x", [3, 5]), b.input("cond", [], dtype=np.bool_)
    s = b.op("Sigmoid", [x], name="sig")
    m = b.op("Mul", [x, s], name="mul")
    b.output(_if_node(b, cond, s, m, [3, 5]))
    _assert_if_case(b, s, [])


def test_if_branch_reading_add_relu_intermediate_blocks_the_fusion():
    b = GraphBuilder()
    x, y, cond = b.input("x", [3, 5]), b.input("y", [3, 5]), b.input("cond", [], dtype=np.bool_)
    a = b.op("Add", [x, y], name="add")
    r = b.op("Relu", [a], name="relu")
    b.output(_if_node(b, cond, r, a, [3, 5]))
    _assert_if_case(b, a, [])


def test_if_branch_reading_gelu_input_rejects_gemm_gelu():
    b = GraphBuilder()
    x, cond = b.input("x", [3, 5]), b.input("cond", [], dtype=np.bool_)
    h = b.op("MatMul", [x, b.init(b.weight((5, 4)))], name="mm")
    out, names = epi_gelu_erf_torch(b, h, "")
    b.output(_if_node(b, cond, out, h, [3, 4]))
    model = b.build()
    reasons = reject_reasons(model)
    assert ("gemm_act", "intermediate tensor 'mm_out' has another consumer (if)") in reasons
    _assert_if_case(b, h, [("eltwise_chain", names)])


def test_nested_if_branch_reading_conv_intermediate_blocks_the_fusion():
    b = GraphBuilder()
    x, cond = b.input("x", [1, 3, 5, 5]), b.input("cond", [], dtype=np.bool_)
    c = conv(b, x, 3, 2)
    r = b.op("Relu", [c], name="relu")
    inner_then = helper.make_graph([helper.make_node("Neg", [c], ["in_then"])], "inner_then", [],
                                   [helper.make_tensor_value_info("in_then", TensorProto.FLOAT, [1, 2, 3, 3])])
    inner_else = helper.make_graph([helper.make_node("Identity", [r], ["in_else"])], "inner_else", [],
                                   [helper.make_tensor_value_info("in_else", TensorProto.FLOAT, [1, 2, 3, 3])])
    outer_then = helper.make_graph(
        [helper.make_node("If", [cond], ["nested"], then_branch=inner_then, else_branch=inner_else, name="inner_if")],
        "outer_then", [], [helper.make_tensor_value_info("nested", TensorProto.FLOAT, [1, 2, 3, 3])])
    outer_else = helper.make_graph([helper.make_node("Identity", [r], ["o_else"])], "outer_else", [],
                                   [helper.make_tensor_value_info("o_else", TensorProto.FLOAT, [1, 2, 3, 3])])
    b.output(b.op("If", [cond], name="if", then_branch=outer_then, else_branch=outer_else))
    _assert_if_case(b, c, [])


def test_if_branch_reading_the_fused_output_keeps_the_fusion():
    """A branch may read the pattern's final output: the fused op writes that same tensor."""
    b = GraphBuilder()
    x, cond = b.input("x", [1, 3, 5, 5]), b.input("cond", [], dtype=np.bool_)
    c = conv(b, x, 3, 2)
    n = b.op("BatchNormalization", [c, *bn_params(b, 2)], name="bn")
    r = b.op("Relu", [n], name="relu")
    b.output(_if_node(b, cond, r, r, [1, 2, 3, 3]))
    _assert_if_case(b, r, [("conv_act", ["conv", "bn", "relu"])])


def test_if_branch_reading_a_pattern_input_keeps_the_fusion():
    b = GraphBuilder()
    x, cond = b.input("x", [3, 5]), b.input("cond", [], dtype=np.bool_)
    a = b.op("Abs", [x], name="abs")
    s = b.op("Mul", [a, b.op("Sigmoid", [a], name="sig")], name="mul")
    b.output(_if_node(b, cond, a, s, [3, 5]))
    _assert_if_case(b, a, [("silu", ["sig", "mul"])])


# --- names ------------------------------------------------------------------------------------------
def test_unnamed_nodes_get_synthetic_names_in_the_report():
    b = GraphBuilder()
    x, y = b.input("x", [3, 5]), b.input("y", [3, 5])
    r = b.op("Relu", [b.op("Add", [x, y], name="")], name="")
    s = b.op("Mul", [r, b.op("Sigmoid", [r], name="")], name="")
    b.output(s)
    fused, report = assert_fused(case(b, ("add_relu", ["Add_0", "Relu_1"]), ("silu", ["Sigmoid_2", "Mul_3"])))
    provenance = sorted(node_attrs(n)["replaced_nodes"] for n in fused_nodes(fused))
    assert provenance == ["Add_0,Relu_1", "Sigmoid_2,Mul_3"]
    assert all(m.fused_node for m in report.fused)
    assert len({n.name for n in fused_nodes(fused)}) == 2
    assert "Add_0,Relu_1" in report.table()


def test_unnamed_conv_weights_get_unique_initializer_names():
    b = GraphBuilder()
    x = b.input("x", [1, 2, 7, 7])
    t = b.op("Relu", [conv(b, x, 2, 2, name="", pads=[1, 1, 1, 1])], name="")
    t = b.op("Relu", [conv(b, t, 2, 2, name="", pads=[1, 1, 1, 1])], name="")
    b.output(t)
    fused, _ = assert_fused(case(b, ("conv_act", ["Conv_0", "Relu_1"]), ("conv_act", ["Conv_2", "Relu_3"])))
    names = [t.name for t in fused.graph.initializer]
    assert len(names) == len(set(names))


def test_report_serialises():
    _, report = fuse(conv_bn_relu().model)
    data = report.to_dict()
    assert ortfuse.FusionReport.from_dict(data).to_dict() == data
    assert "conv_act" in report.to_json()


# =============================================================================================
# regression tests of bugs found (and fixed)
# =============================================================================================
def test_bug_synthetic_name_collision_loses_all_fusions():
    """An unnamed node's synthetic name (<op>_<position>) must not collide with a real name."""
    b = GraphBuilder()
    x = b.input("x", [1, 3, 5, 5])
    t = b.op("Relu", [conv(b, x, 3, 3, pads=[1, 1, 1, 1], name="Conv_2")], name="relu")
    t = b.op("Relu", [conv(b, t, 3, 3, pads=[1, 1, 1, 1], name="")], name="relu2")
    b.output(t)
    assert_fused(case(b, ("conv_act", ["Conv_2", "relu"]), ("conv_act", ["Conv_2_1", "relu2"])))


# =============================================================================================
# value_info everywhere (an exporter detail), the keep rule, shape inference of long vectors
# =============================================================================================
def test_model_with_value_info_for_every_tensor():
    """Exporters write value_info for intermediates; the ones of replaced tensors must go."""
    c = conv_bn_relu()
    full = onnx.shape_inference.infer_shapes(c.model)
    assert len(full.graph.value_info) >= 2
    fused, _ = assert_fused(Case(full, c.feeds, c.expected, scale_atol=True))
    produced = {o for n in fused.graph.node for o in n.output}
    assert {vi.name for vi in fused.graph.value_info} <= produced
    onnx.checker.check_model(fused, full_check=True)


def test_keep_rule_leaves_chosen_matches_unfused_and_says_why():
    """fuse(keep=...) sees every legal match by original node names; a refused one stays as ORT runs it."""
    from model_fixtures import ffn_inputs, ffn_matmul_add_relu

    model = ffn_matmul_add_relu()
    _, everything = fuse(model)
    assert len(everything.fused) == 2
    seen = []

    def keep(record):
        seen.append((record.pattern_id, tuple(record.nodes)))
        return "" if "residual" in record.nodes else "test: keep only the residual Add+Relu"

    fused, report = fuse(model, keep=keep)
    assert sorted(seen) == sorted((m.pattern_id, tuple(m.nodes)) for m in everything.fused)
    assert [m.nodes for m in report.fused] == [["residual", "relu_out"]]
    disabled = [m for m in report.matches if m.decision == DISABLED]
    assert [m.reason for m in disabled] == ["test: keep only the residual Add+Relu"]
    kept_ops = {n.name for n in fused.graph.node}
    assert {"mm1", "bias1", "relu1"} <= kept_ops and "residual" not in kept_ops
    inputs = ffn_inputs()
    got, rerun = run_ortfuse(fused, inputs)
    assert [m.nodes for m in rerun.fused] == [["residual", "relu_out"]]  # the saved fused graph, as is
    assert_outputs_close(got, run_stock(model, inputs))


@pytest.mark.parametrize("length", [1 << 16, (1 << 16) + 1])
def test_long_vectors_are_inferred_without_data_propagation(length, monkeypatch):
    """onnx's data propagation keeps each element of a propagated 1-D tensor as a dim (a [16M] input
    through Add took 3.4 GB and 5 s): a model declaring a 1-D tensor longer than
    DATA_PROP_MAX_VECTOR is inferred without it, a shorter one with it; both are fused and match
    stock ORT."""
    import onnxruntime

    from ortfuse.ir import graph

    used = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda model, **kw: used.append(kw.get("data_prop", False)) or real(model, **kw))
    nodes = [helper.make_node("Add", ["A", "B"], ["S"], name="add"),
             helper.make_node("Relu", ["S"], ["Y"], name="relu")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [length]) for n in "AB"],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [length])]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    fused, report = fuse(model, ["add_relu"])
    assert used and set(used) == {length <= graph.DATA_PROP_MAX_VECTOR}, used
    assert report.counts() == {"add_relu": 1}
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(length).astype(np.float32) for n in "AB"}
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    stock = onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want = stock.run(None, feeds)[0]
    got = ortfuse.InferenceSession(model, fusion=True, fusion_patterns=["add_relu"]).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)


def test_a_reshape_to_a_computed_target_of_known_length_keeps_its_rank():
    """paddle2onnx flattens with Reshape(x, Concat(Slice(Shape(x), 0, 2), [-1])): onnx's inference
    leaves that output without a shape (even its rank), and every reader after it; the index seeds
    the rank the target's length says and infers again, so later ops are known to be rank 3 (the
    attention rule needs [batch, seq, hidden]). A target of unknown length seeds nothing."""
    from ortfuse.ir.graph import GraphIndex

    def model(target_op: str):
        inits = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("s0", 0), ("s2", 2), ("m1", -1))]
        inits.append(numpy_helper.from_array(np.ones(3, bool), "every"))
        last = [helper.make_node("Concat", ["lead", "m1"], ["t"], axis=0)] if target_op == "Concat" else \
            [helper.make_node("Concat", ["lead", "m1"], ["t3"], axis=0),
             helper.make_node("Compress", ["t3", "every"], ["t"], axis=0)]
        nodes = [helper.make_node("Shape", ["x"], ["sh"]),
                 helper.make_node("Slice", ["sh", "s0", "s2", "s0"], ["lead"]), *last,
                 helper.make_node("Reshape", ["x", "t"], ["flat"]),
                 helper.make_node("Transpose", ["flat"], ["y"], perm=[0, 2, 1])]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, "?", "w"])
        graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])

    plain = onnx.shape_inference.infer_shapes(model("Concat"), data_prop=True)
    known = {vi.name: vi.type.tensor_type.HasField("shape") for vi in (*plain.graph.value_info, *plain.graph.output)}
    assert known["flat"] is False and known["y"] is False, known  # the premise: onnx alone loses them
    ix = GraphIndex(model("Concat"))
    assert ix.shape("flat") == [None, None, None] and len(ix.shape("y")) == 3
    unknown = GraphIndex(model("Compress"))
    assert unknown.shape("flat") is None and unknown.shape("y") is None
