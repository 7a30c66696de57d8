"""The shared harness of the fusion rules (ortfuse/fusion/rules/, one module per pattern id): every
example graph each rule module declares, collected through the catalogue, so a new rule module is
run without editing this file.

A matching example is fused exactly ``fuses`` times by ``fuse(model, [rule id])`` with nothing
rejected, each fused group carries its provenance, and the fused model run by
``ortfuse.InferenceSession`` gives the outputs of the unfused model run by stock onnxruntime at
ORT_DISABLE_ALL, within rtol 1e-4 and atol 1e-5 times max(1, max|ref|) (folded BN and Gemm alpha
round differently, as in tests/pattern_checks.py); so does the model fused with the reference kernels (the
rule's ``OpSpec`` references). A near-miss example is not fused: the report rejects it with a
reason containing the expected text ("": no candidate is reported at all), and the model still
gives stock ORT's outputs.

Then the contract the catalogue relies on: module name = id, a ``# before -> after`` comment above
each matcher, today's priority order, declared native op types registered by the native path, and
discovery of a new module (and refusal of one that breaks the contract).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap

import numpy as np
import onnx
import pytest

from ortfuse import fuse
from ortfuse.fusion import catalogue, rules
from ortfuse.fusion.report import REJECTED
from ortfuse.kernel_choice import registry

from pattern_graphs import assert_outputs_close, check_group, fused_groups, run_ortfuse, run_stock

RTOL, ATOL = 1e-4, 1e-5
EXAMPLES = [(rule, example) for rule in catalogue.RULES for example in rule.examples]


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Uniform values in [-3, 3] for every graph input (static shapes, float element types)."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        out[vi.name] = rng.uniform(-3, 3, shape).astype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
    return out


@pytest.mark.parametrize("rule, example", EXAMPLES, ids=[f"{r.id}/{e.name}" for r, e in EXAMPLES])
def test_rule_example(rule, example):
    model = example.build()
    feeds = feeds_for(model)
    ref = run_stock(model, feeds)
    fused, report = fuse(model, [rule.id])
    if example.reason is None:
        assert len(report.fused) == example.fuses and report.applied, report.table()
        assert not [m for m in report.matches if m.decision == REJECTED], report.table()
        groups = fused_groups(fused)
        assert len(groups) == example.fuses, list(groups)
        for record in report.fused:
            check_group(record, groups[(record.pattern_id, tuple(record.nodes))])
        assert_outputs_close(run_ortfuse(fused, feeds)[0], ref, RTOL, ATOL, scale_atol=True)
        by_reference, rep = fuse(model, [rule.id], kernels="reference")
        assert len(rep.fused) == example.fuses, rep.table()
        assert_outputs_close(run_ortfuse(by_reference, feeds)[0], ref, RTOL, ATOL, scale_atol=True)
    else:
        assert not report.fused and not report.applied, report.table()
        reasons = [m.reason for m in report.matches if m.pattern_id == rule.id]
        if example.reason:
            assert any(example.reason in r for r in reasons), report.table()
        else:
            assert reasons == [], report.table()
        assert_outputs_close(run_ortfuse(fused, feeds)[0], ref, RTOL, ATOL)


@pytest.mark.parametrize("rule", catalogue.RULES, ids=[r.id for r in catalogue.RULES])
def test_rule_module_is_named_after_its_id_and_shows_before_and_after(rule):
    module = sys.modules[rule.matcher.__module__]
    assert module.__name__ == f"{rules.__name__}.{rule.id}" and module.RULE is rule
    comment = inspect.getcomments(rule.matcher) or ""
    assert "->" in comment, f"{rule.id}: a '# before -> after' comment goes right above its matcher"


def test_catalogue_keeps_the_priority_order():
    today = ("conv_add_relu", "conv_act", "gemm_act", "add_relu", "hardswish", "silu", "eltwise_chain")
    assert [p for p in catalogue.PATTERN_IDS if p in today] == list(today)
    assert catalogue.PATTERN_IDS[-1] == "eltwise_chain"  # the generic pattern takes what the others leave
    assert list(catalogue.MATCHERS) == list(catalogue.PATTERN_IDS)
    assert {s.pattern_id for s in catalogue.SPECS.values()} == set(catalogue.PATTERN_IDS)


def test_declared_native_op_types_have_native_kernels():
    native = registry._native_ops()
    if not native:
        pytest.skip("the native path is unavailable here")
    declared = {k.name for k in catalogue.NATIVE_KERNELS}
    declared |= {op for form in catalogue.LOWERING_FORMS.values() for op in form.native_ops.values()}
    assert declared <= native, declared - native
    for name in declared:
        assert catalogue.spec_for_op_type(name) is not None, name


TOY_RULE = '''
"""toy_pattern: Neg -> Neg, a test-only rule."""
from onnx import helper

from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.contract import Example, PatternRule
from ortfuse.fusion.rulekit.examples import model
from ortfuse.fusion.rulekit.result import Match


# Neg -> Neg   ->   ToyNegNeg(x)
def match(ix, anchor):
    second = ix.child(anchor.output[0], "Neg")
    if second is None:
        return None
    return Match("{id}", "ToyNegNeg", [anchor, second], [anchor.input[0]], second.output[0])


def _graph():
    return model([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])], {{"x": [2]}}, ["y"])


RULE = PatternRule(id="{id}", order=55, anchor="Neg", matcher=match,
                   specs=(OpSpec("ToyNegNeg", "{id}", ("X",), {{}}, lambda x, **_: x),),
                   examples=(Example("neg_neg", _graph), Example("none", _graph, reason="")))
'''


@pytest.fixture
def extra_rules_dir(tmp_path, monkeypatch):
    """A second folder of rule modules on ``ortfuse.fusion.rules``' path; the catalogue rebuilt."""
    monkeypatch.setattr(rules, "__path__", [*rules.__path__, str(tmp_path)])
    catalogue._tables.cache_clear()
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith(f"{rules.__name__}.toy")]:
        del sys.modules[name]
    monkeypatch.undo()
    catalogue._tables.cache_clear()
    importlib.invalidate_caches()


def test_former_pattern_ids_name_their_renamed_patterns():
    from ortfuse.tune.decisions import Decision

    assert set(catalogue.RENAMED.values()) <= set(catalogue.PATTERN_IDS)
    assert not set(catalogue.RENAMED) & set(catalogue.PATTERN_IDS)  # a former id is no module of its own
    assert catalogue.validate_patterns(["gemm_relu_gelu", "conv_bn_relu", "silu"]) == ("conv_act", "gemm_act", "silu")
    assert catalogue.validate_patterns("conv_bn_relu") == ("conv_act",)
    catalogue.check_pattern_ids("conv_bn_relu,gemm_relu_gelu")  # accepted without importing the rules
    assert catalogue.rule("conv_bn_relu").id == "conv_act"
    assert Decision("gemm_relu_gelu", ["mm"], True, "").pattern_id == "gemm_act"  # cached or embedded before
    example = next(e for e in catalogue.rule("conv_act").examples if e.reason is None)
    _, report = fuse(example.build(), ["conv_bn_relu"])
    assert set(report.counts()) == {"conv_act"}


def test_a_new_rule_module_is_discovered_in_its_order(extra_rules_dir):
    (extra_rules_dir / "toy_pattern.py").write_text(textwrap.dedent(TOY_RULE.format(id="toy_pattern")))
    importlib.invalidate_caches()
    ids = catalogue.PATTERN_IDS
    assert ids.index("hardswish") < ids.index("toy_pattern") < ids.index("silu")
    assert catalogue.SPECS["ToyNegNeg"].pattern_id == "toy_pattern"
    assert catalogue.validate_patterns("toy_pattern,silu") == ("toy_pattern", "silu")
    assert registry.select("ToyNegNeg").kernel.op_type == "ToyNegNegRef"  # the reference path, always


def test_a_rule_module_not_named_after_its_id_is_refused(extra_rules_dir):
    (extra_rules_dir / "toy_misnamed.py").write_text(textwrap.dedent(TOY_RULE.format(id="toy_other")))
    importlib.invalidate_caches()
    with pytest.raises(catalogue.RuleError, match="toy_misnamed must declare RULE = PatternRule"):
        catalogue.validate_patterns(None)


def test_a_matcher_is_tried_at_its_anchors_only_and_explains_on_the_near_miss_view():
    """The match step (fusion/match.py) passes the matcher only the nodes its ``anchor`` admits, and
    asks a None again on ``ix.explaining()``: a Neg -> Neg whose middle tensor has a second reader is
    rejected with that reader named, and the index the rewriter keeps is never put in near-miss mode."""
    from onnx import helper

    from ortfuse.custom_ops.specs import OpSpec
    from ortfuse.fusion.match import candidates
    from ortfuse.fusion.rulekit.contract import Anchor, Example, PatternRule
    from ortfuse.fusion.rulekit.examples import model
    from ortfuse.fusion.rulekit.result import Match
    from ortfuse.ir.graph import GraphIndex

    seen = []

    def match(ix, anchor):
        seen.append((anchor.name, ix.near_miss))
        second = ix.child(anchor.output[0], "Neg")
        return None if second is None else Match("toy", "ToyNegNeg", [anchor, second], [anchor.input[0]],
                                                  second.output[0])

    def graph():
        return model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                      helper.make_node("Neg", ["r"], ["a"], name="first"),
                      helper.make_node("Neg", ["a"], ["y"], name="second"),
                      helper.make_node("Abs", ["a"], ["z"], name="other")], {"x": [2]}, ["y", "z"])

    rule = PatternRule(id="toy", order=99, anchor=Anchor("Neg", onnx_only=True), matcher=match,
                       specs=(OpSpec("ToyNegNeg", "toy", ("X",), {}, lambda x, **_: x),),
                       examples=(Example("m", graph), Example("n", graph, reason="")))
    ix = GraphIndex(graph())
    found = list(candidates(ix, rule, set()))
    assert seen == [("first", False), ("first", True), ("second", False), ("second", True)]
    assert [(r.reason, [n.name for n in r.nodes]) for r in found] == [
        ("intermediate tensor 'a' has another consumer (other)", ["first", "second"])]
    assert not ix.near_miss and ix.only_consumer("a") is None
