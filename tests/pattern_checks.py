"""Checks shared by the test_patterns_*.py modules, and the cases more than one of them uses.

Every pattern of the catalogue has one positive case per form it claims to match and a negative case
for every rejection reason beside it: test_patterns_conv.py (conv_act, conv_add_relu),
test_patterns_gemm.py (gemm_act), test_patterns_eltwise.py (add_relu, hardswish, silu,
eltwise_chain); what crosses patterns is in test_patterns_rewrite.py and test_patterns_edge_cases.py.

Positive cases (``assert_fused``) assert: the report lists exactly the expected fused pattern(s) with
the replaced node names; the fused graph holds, per match, one ``ai.onnx.contrib`` op (with its
provenance attributes) or the ORT nodes the registry lowered it to (named after the fused node,
provenance in their doc_string, labelled by their op types in the report), and none of the replaced
nodes; the fused op's attributes are those expected (read on the reference path, which always writes
the one custom op); ``onnx.checker`` passes; and the fused model run by ``ortfuse.InferenceSession``
(and the original with ``fusion=True``) gives the outputs of the ORIGINAL model run by stock
onnxruntime at ORT_DISABLE_ALL, on odd-sized inputs.

Negative cases (``assert_rejected``) assert the rejection reason in the report and that the model
still runs, unfused for that pattern, with the outputs of stock onnxruntime.

Bugs found in ortfuse are regression tests at the end of each module (``test_bug_*``), each with its repro.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest

import ortfuse
from ortfuse import fuse
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.catalogue import SPECS
from ortfuse.fusion.report import REJECTED

from pattern_graphs import (
    GraphBuilder,
    assert_outputs_close,
    bn_params,
    check_group,
    fused_groups,
    fused_nodes,
    node_attrs,
    run_ortfuse,
    run_stock,
)

RTOL, ATOL = 1e-4, 1e-5
OP_OF_PATTERN = {spec.pattern_id: spec.name for spec in SPECS.values() if not spec.name.startswith("FusedEltwise")}


# =============================================================================================
# checking helpers
# =============================================================================================
@dataclass
class Case:
    """A model, its feeds, and the fusions expected: [(pattern id, [replaced node names])]."""

    model: onnx.ModelProto
    feeds: dict
    expected: list[tuple[str, list[str]]]
    attrs: list[dict] = field(default_factory=list)  # per expected match: attributes the fused op must carry
    scale_atol: bool = False  # folded weights (BN, alpha): atol times max|ref|


def case(b: GraphBuilder, *expected, attrs=(), scale_atol=False, seed=1) -> Case:
    return Case(b.build(), b.feeds(seed), list(expected), list(attrs), scale_atol)


def stock_outcome(model, feeds):
    """(outputs, None) or (None, exception) of the original model on stock ORT."""
    try:
        return run_stock(model, feeds), None
    except Exception as exc:  # noqa: BLE001 - the outcome is compared, not the type
        return None, exc


def assert_fused(c: Case, patterns=None, rtol=RTOL, atol=ATOL) -> tuple[onnx.ModelProto, ortfuse.FusionReport]:
    fused, report = fuse(c.model, patterns)
    got = sorted((m.pattern_id, sorted(m.nodes)) for m in report.fused)
    want = sorted((pid, sorted(nodes)) for pid, nodes in c.expected)
    assert got == want, report.table()
    assert report.applied, report.table()
    assert not [m for m in report.matches if m.decision == REJECTED], report.table()
    onnx.checker.check_model(fused)
    # the graph: per match one fused op, or the ORT nodes it was lowered to, with provenance; no
    # replaced node left
    groups = fused_groups(fused)
    assert sorted((pid, sorted(names)) for pid, names in groups) == want, list(groups)
    records = {(m.pattern_id, tuple(m.nodes)): m for m in report.fused}
    for key, nodes in groups.items():
        check_group(records[key], nodes)
    names = {n.name for n in fused.graph.node}
    for _pid, nodes in c.expected:
        assert not (set(nodes) & names), f"replaced nodes left in the graph: {set(nodes) & names}"
    # the fused op's attributes, read from the single custom node of the reference path
    assert_spec_attrs(c, patterns)
    assert [o.name for o in fused.graph.output] == [o.name for o in c.model.graph.output]
    # numerics against the original model on stock ORT with every optimisation off
    ref = run_stock(c.model, c.feeds)
    got_fused, rep = run_ortfuse(fused, c.feeds)
    assert rep.applied
    assert_outputs_close(got_fused, ref, rtol, atol, c.scale_atol)
    got_session, rep = run_ortfuse(c.model, c.feeds, fusion=True, fusion_patterns=patterns)
    assert sorted((m.pattern_id, sorted(m.nodes)) for m in rep.fused) == want
    assert_outputs_close(got_session, ref, rtol, atol, c.scale_atol)
    if any(m.kernel.startswith("lowered") for m in report.fused):  # the reference kernels stay right too
        ref_fused, _ = fuse(c.model, patterns, kernels="reference")
        assert_outputs_close(run_ortfuse(ref_fused, c.feeds)[0], ref, rtol, atol, c.scale_atol)
    return fused, report


def spec_attrs(c: Case, patterns=None) -> dict[tuple[str, tuple[str, ...]], dict]:
    """(pattern id, sorted replaced names) -> attributes of the fused op, from the model fused with
    the reference kernels (one ``ai.onnx.contrib`` node per match, whatever path the default takes)."""
    fused, _ = fuse(c.model, patterns, kernels="reference")
    by_prov = {}
    for op in fused_nodes(fused):
        a = node_attrs(op)
        assert op.domain == DOMAIN
        assert a["pattern_id"] in OP_OF_PATTERN or a["pattern_id"] == "eltwise_chain"
        if a["pattern_id"] != "eltwise_chain":
            assert op.op_type == OP_OF_PATTERN[a["pattern_id"]] + "Ref", (op.op_type, a["pattern_id"])
        else:
            assert op.op_type.startswith("FusedEltwiseChain")
        by_prov[(a["pattern_id"], tuple(sorted(a["replaced_nodes"].split(","))))] = a
    return by_prov


def assert_spec_attrs(c: Case, patterns=None) -> None:
    by_prov = spec_attrs(c, patterns)
    assert len(by_prov) == len(c.expected)
    for pid, nodes in c.expected:
        assert (pid, tuple(sorted(nodes))) in by_prov
    for (pid, nodes), want_attrs in zip(c.expected, c.attrs):
        a = by_prov[(pid, tuple(sorted(nodes)))]
        for key, value in want_attrs.items():
            if isinstance(value, float):
                assert a[key] == pytest.approx(value, rel=1e-6), (key, a[key], value)
            else:
                assert a[key] == value, (key, a[key], value)


def assert_rejected(c: Case, pattern_id: str, reason: str, nodes=None, patterns=None, others_fused=None):
    """A ``pattern_id`` candidate is rejected with ``reason`` (a substring); the pattern fuses
    nothing; the model runs with stock ORT's outcome. ``others_fused``: the exact fused pattern
    ids expected from other patterns (default: anything)."""
    fused, report = fuse(c.model, patterns)
    records = [m for m in report.matches if m.pattern_id == pattern_id and m.decision == REJECTED]
    assert records, report.table()
    assert any(reason in m.reason for m in records), report.table()
    assert all(m.reason for m in report.matches if m.decision == REJECTED)
    if nodes is not None:
        assert any(sorted(m.nodes) == sorted(nodes) for m in records if reason in m.reason), report.table()
    assert pattern_id not in {m.pattern_id for m in report.fused}, report.table()
    if others_fused is not None:
        assert sorted(m.pattern_id for m in report.fused) == sorted(others_fused), report.table()
    assert "rejected" in report.table() and reason in report.table()
    onnx.checker.check_model(fused)
    assert_same_outcome_as_stock(c, patterns)
    return fused, report


def assert_same_outcome_as_stock(c: Case, patterns=None, rtol=RTOL, atol=ATOL):
    ref, err = stock_outcome(c.model, c.feeds)
    if err is not None:  # e.g. a float64 Conv, which stock ORT has no kernel for: ortfuse fails alike
        with pytest.raises(Exception):  # noqa: B017 - any error, as long as stock ORT failed too
            run_ortfuse(c.model, c.feeds, fusion=True, fusion_patterns=patterns)
        return
    fused, _ = fuse(c.model, patterns)
    got, _ = run_ortfuse(fused, c.feeds)
    assert_outputs_close(got, ref, rtol, atol, scale_atol=True)
    got, _ = run_ortfuse(c.model, c.feeds, fusion=True, fusion_patterns=patterns)
    assert_outputs_close(got, ref, rtol, atol, scale_atol=True)


def reject_reasons(model, patterns=None) -> list[tuple[str, str]]:
    _, report = fuse(model, patterns)
    return [(m.pattern_id, m.reason) for m in report.matches if m.decision == REJECTED]


# =============================================================================================
# cases more than one module uses: the Conv builder and one case each of conv_act,
# conv_add_relu, gemm_act and eltwise_chain
# =============================================================================================
def conv(b: GraphBuilder, x: str, cin: int, m: int, k=(3, 3), group: int = 1, bias: bool = True,
         as_node: bool = False, name: str = "conv", **attrs) -> str:
    w = b.const(b.weight((m, cin // group, *k)), as_node)
    ins = [x, w] + ([b.const(b.weight(m, 0.2), as_node)] if bias else [])
    if group != 1:
        attrs["group"] = group
    return b.op("Conv", ins, name=name, **attrs)


def conv_relu():
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 3, 7, 9]), 3, 5)
    b.output(b.op("Relu", [c], name="relu"))
    return case(b, ("conv_act", ["conv", "relu"]), attrs=[{"activation": "relu", "group": 1}])


def conv_bn_relu():
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 3, 9, 7]), 3, 6, pads=[1, 1, 1, 1])
    n = b.op("BatchNormalization", [c, *bn_params(b, 6)], name="bn", epsilon=1e-3)
    b.output(b.op("Relu", [n], name="relu"))
    return case(b, ("conv_act", ["conv", "bn", "relu"]), attrs=[{"activation": "relu"}], scale_atol=True)


def conv_add_relu_residual_input():
    b = GraphBuilder()
    x, r = b.input("x", [1, 3, 7, 9]), b.input("res", [1, 5, 7, 9])
    c = conv(b, x, 3, 5, pads=[1, 1, 1, 1])
    a = b.op("Add", [c, r], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("conv_add_relu", ["conv", "add", "relu"]), attrs=[{"activation": "relu"}])


def matmul3d_add_relu():
    """Transformer FFN (ORT leaves the Relu unfused)."""
    b = GraphBuilder()
    x = b.input("x", [2, 5, 7])
    h = b.op("MatMul", [x, b.init(b.weight((7, 9)))], name="mm")
    a = b.op("Add", [b.init(b.weight(9)), h], name="bias")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("gemm_act", ["mm", "bias", "relu"]))


def chain_mul_add_relu_constants():
    b = GraphBuilder()
    x = b.input("x", [3, 5, 7])
    m = b.op("Mul", [x, b.init(np.float32(1.7))], name="mul")
    a = b.op("Add", [m, b.init(b.weight(7))], name="add")
    b.output(b.op("Relu", [a], name="relu"))
    return case(b, ("eltwise_chain", ["mul", "add", "relu"]))
