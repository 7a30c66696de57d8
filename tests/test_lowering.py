"""The ``lowered`` kernel path (the rules' lowering forms): each lowering form, forced with
``fuse(kernels="lowered:<form>")``, on odd shapes (strides, asymmetric pads, groups, depthwise,
dilations, batch > 1, 1-D to 4-D GEMM inputs) against the same model run unfused by stock ORT at
ORT_DISABLE_ALL; the rule the registry picks per op and epilogue; the report's label and the
provenance of lowered nodes; a model saved lowered reloads and reports the same.

Tolerance, as in tests/pattern_checks.py: rtol 1e-4, atol 1e-5 times max(1, max|ref|) (BN folded into the
weights and ORT's vectorised erf/tanh in BiasGelu/FastGelu/Gelu round differently from the
unfused ops).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest

import ortfuse
from ortfuse import fuse
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion import catalogue
from ortfuse.fusion.provenance import is_rewritten, native_op_types
from ortfuse.fusion.report import DISABLED, REJECTED
from ortfuse.fusion.rulekit.lowering import LABEL_PREFIX
from ortfuse.kernel_choice import registry

from pattern_graphs import (
    CONV_EPILOGUES,
    GEMM_EPILOGUES,
    GraphBuilder,
    assert_outputs_close,
    bn_params,
    check_group,
    epi_gelu_tanh_pow,
    epi_relu,
    fused_groups,
    node_attrs,
    run_ortfuse,
    run_stock,
)

RTOL, ATOL = 1e-4, 1e-5
MS = "com.microsoft"


def check_lowered(model, feeds, pid: str, form: str, ops: list[str], count: int = 1):
    """Force rule ``form``: ``count`` matches of ``pid`` become exactly ``ops`` each (the report's
    label), with provenance; the outputs are stock ORT's; a graph with no custom op runs on stock ORT."""
    fused, report = fuse(model, [pid], kernels=f"lowered:{form}")
    assert len(report.fused) == count, report.table()
    assert not [m for m in report.matches if m.decision == REJECTED], report.table()
    onnx.checker.check_model(fused)
    groups = fused_groups(fused)
    assert len(groups) == count
    for record in report.fused:
        assert record.kernel == LABEL_PREFIX + " + ".join(ops), report.table()
        check_group(record, groups[(record.pattern_id, tuple(record.nodes))])
    ref = run_stock(model, feeds)
    got, rep = run_ortfuse(fused, feeds)
    assert [m.kernel for m in rep.fused] == [m.kernel for m in report.fused]
    assert_outputs_close(got, ref, RTOL, ATOL, scale_atol=True)
    if not any(n.domain == DOMAIN for n in fused.graph.node):
        assert_outputs_close(run_stock(fused, feeds), ref, RTOL, ATOL, scale_atol=True)
    return fused, report


# =============================================================================================
# convolutions
# =============================================================================================
GEOMETRIES = {  # x shape, out channels, kernel, conv attributes
    "pads_batch2": ([2, 3, 7, 9], 5, (3, 3), {"pads": [1, 0, 1, 2]}),
    "strided_asym": ([1, 4, 11, 8], 6, (3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1]}),
    "grouped_dilated": ([3, 6, 10, 9], 9, (3, 3), {"group": 3, "dilations": [2, 1], "pads": [2, 1, 2, 1]}),
    "depthwise_stride2": ([2, 5, 9, 7], 5, (3, 3), {"group": 5, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "pointwise": ([1, 7, 5, 3], 4, (1, 1), {}),
}


def conv_graph(geometry: str, opset: int = 17) -> tuple[GraphBuilder, str, list[str]]:
    """Conv -> BatchNormalization of ``GEOMETRIES[geometry]``: (builder, output tensor, node names)."""
    shape, m, k, attrs = GEOMETRIES[geometry]
    b = GraphBuilder(opset=opset)
    x = b.input("x", shape, low=-4, high=4)
    group = attrs.get("group", 1)
    t = b.op("Conv", [x, b.init(b.weight((m, shape[1] // group, *k))), b.init(b.weight(m, 0.2))], name="conv", **attrs)
    t = b.op("BatchNormalization", [t, *bn_params(b, m)], name="bn")
    return b, t, ["conv", "bn"]


def _hardswish_hsig(b, t, p, as_node=False):
    """x * HardSigmoid(x; 0.2, 0.5): a HardSwish with Keras' slope (not ai.onnx HardSwish's)."""
    h = b.op("HardSigmoid", [t], name=f"{p}hs_sig", alpha=0.2, beta=0.5)
    return b.op("Mul", [t, h], name=f"{p}hs_mul"), [f"{p}hs_sig", f"{p}hs_mul"]


# (rule, epilogue builder, opset, the ops it must become)
CONV_RULES = [
    ("fusedconv", "relu", 17, [f"{MS}:FusedConv"]),
    ("fusedconv", "clip", 17, [f"{MS}:FusedConv"]),
    ("fusedconv", "clip_asym", 10, [f"{MS}:FusedConv"]),
    ("fusedconv", "hardsigmoid", 13, [f"{MS}:FusedConv"]),
    ("fusedconv", "hardswish_div_mul", 17, [f"{MS}:FusedConv"]),
    ("fusedconv", "hardswish_mul_div", 13, [f"{MS}:FusedConv"]),  # FusedConv's HardSwish needs no opset 14
    ("conv", None, 17, ["Conv"]),
    ("conv_native_epilogue", "hardswish_div_mul", 17, ["Conv", f"{DOMAIN}:FusedHardSwish"]),
    ("conv_native_epilogue", "hardswish_hsig_0.2", 13, ["Conv", f"{DOMAIN}:FusedHardSwish"]),
    ("conv_native_epilogue", "silu", 17, ["Conv", f"{DOMAIN}:FusedSiLU"]),
    ("conv_ort_epilogue", "relu", 17, ["Conv", "Relu"]),
    ("conv_ort_epilogue", "clip", 10, ["Conv", "Clip"]),
    ("conv_ort_epilogue", "clip_asym", 17, ["Conv", "Clip"]),
    ("conv_ort_epilogue", "hardsigmoid", 17, ["Conv", "HardSigmoid"]),
    ("conv_ort_epilogue", "hardswish_div_mul", 17, ["Conv", "HardSwish"]),
    ("conv_ort_epilogue", "hardswish_div_mul", 13, ["Conv", "HardSigmoid", "Mul"]),  # no HardSwish before opset 14
    ("conv_ort_epilogue", "hardswish_hsig_0.2", 17, ["Conv", "HardSigmoid", "Mul"]),  # not HardSwish's slope
    ("conv_ort_epilogue", "silu", 17, ["Conv", "Sigmoid", "Mul"]),
    ("conv_decomposed_epilogue", "hardswish_mul_div", 17, ["Conv", "HardSigmoid", "Mul"]),
]


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("form, epilogue, opset, ops", CONV_RULES,
                         ids=[f"{f}-{e}-opset{o}" for f, e, o, _ in CONV_RULES])
def test_conv_rule_matches_stock(form, epilogue, opset, ops, geometry):
    b, t, names = conv_graph(geometry, opset)
    if epilogue == "hardswish_hsig_0.2":
        t, extra = _hardswish_hsig(b, t, "e_")
    elif epilogue is not None:
        t, extra = CONV_EPILOGUES[epilogue][0](b, t, "e_", as_node=opset >= 13)
    else:
        extra = []
    b.output(t)
    fused, report = check_lowered(b.build(), b.feeds(), "conv_act", form, ops)
    assert sorted(report.fused[0].nodes) == sorted(names + extra)
    conv = next(n for n in fused.graph.node if n.op_type in ("Conv", "FusedConv"))
    want = GEOMETRIES[geometry][3]
    a = node_attrs(conv)
    assert a["group"] == want.get("group", 1) and a["strides"] == want.get("strides", [1, 1])
    assert a["pads"] == want.get("pads", [0, 0, 0, 0]) and a["dilations"] == want.get("dilations", [1, 1])


def test_fusedconv_carries_the_activation_parameters():
    b, t, _ = conv_graph("pads_batch2", 17)
    t, _ = CONV_EPILOGUES["clip_asym"][0](b, t, "e_")
    b.output(t)
    fused, _ = check_lowered(b.build(), b.feeds(), "conv_act", "fusedconv", [f"{MS}:FusedConv"])
    a = node_attrs(next(n for n in fused.graph.node if n.op_type == "FusedConv"))
    assert a["activation"] == "Clip" and a["activation_params"] == pytest.approx([-0.75, 1.25])


def test_fusedconv_takes_only_hardswishs_own_slope():
    """FusedConv's HardSwish has no parameters: x * HardSigmoid(x; 0.2, 0.5) is refused by that form
    with the reason, and the registry's next kernel serves it (outputs equal to stock ORT's)."""
    b, t, _ = conv_graph("pads_batch2", 17)
    t, _ = _hardswish_hsig(b, t, "e_")
    b.output(t)
    fused, report = fuse(b.build(), ["conv_act"], kernels="lowered:fusedconv")
    assert not report.fused and "differs from HardSwish's" in report.table()
    fused, report = fuse(b.build(), ["conv_act"])
    assert len(report.fused) == 1 and "FusedConv" not in report.fused[0].kernel, report.table()
    assert_outputs_close(run_ortfuse(fused, b.feeds())[0], run_stock(b.build(), b.feeds()), RTOL, ATOL, scale_atol=True)


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("form, ops", [("fusedconv_sum", [f"{MS}:FusedConv"]),
                                       ("conv_add_relu", ["Conv", "Add", "Relu"])])
def test_conv_add_relu_rule_matches_stock(form, ops, geometry):
    """relu(bn(conv(x)) + r): FusedConv adds its 4th input Z before the activation."""
    b, t, names = conv_graph(geometry)
    b.outputs = [t]  # learn the conv output shape, which the residual has
    res_shape = [d.dim_value for d in b.build().graph.output[0].type.tensor_type.shape.dim]
    b.outputs = []
    r = b.input("res", res_shape)
    b.output(b.op("Relu", [b.op("Add", [t, r], name="add")], name="relu"))
    fused, report = check_lowered(b.build(), b.feeds(), "conv_add_relu", form, ops)
    assert sorted(report.fused[0].nodes) == sorted(names + ["add", "relu"])
    if form == "fusedconv_sum":
        (node,) = fused.graph.node
        assert list(node.input)[3] == "res" and node_attrs(node)["activation"] == "Relu"


def test_residual_of_unknown_shape_is_not_given_to_fusedconv():
    """FusedConv's Z does not broadcast: a residual whose shape is not known to equal the output's
    is lowered to Conv -> Add -> Relu, which broadcasts like the original (here a [1, M, 1, 1] feed)."""
    b, t, _ = conv_graph("pads_batch2")
    r = b.input("res", ["a", "b", "c", "d"], feed_shape=[1, 5, 1, 1])
    b.output(b.op("Relu", [b.op("Add", [t, r], name="add")], name="relu"))
    model, feeds = b.build(), b.feeds()
    _, report = fuse(model, ["conv_add_relu"], kernels="lowered:fusedconv_sum")
    (record,) = report.matches
    assert record.decision == REJECTED and "Z does not broadcast" in record.reason
    fused, report = fuse(model, ["conv_add_relu"])
    assert report.fused[0].kernel == "lowered to ORT: Conv + Add + Relu"
    assert_outputs_close(run_ortfuse(fused, feeds)[0], run_stock(model, feeds), RTOL, ATOL, scale_atol=True)


# =============================================================================================
# GEMMs
# =============================================================================================
def gemm_graph(core: str, opset: int) -> tuple[GraphBuilder, str, list[str]]:
    b = GraphBuilder(opset=opset)
    if core == "gemm_transB_alpha_beta":
        x = b.input("x", [5, 7])
        t = b.op("Gemm", [x, b.init(b.weight((3, 7))), b.init(b.weight(3))], name="gemm", transB=1, alpha=1.5, beta=0.7)
        return b, t, ["gemm"]
    shape = {"matmul1d": [7], "matmul2d": [5, 7], "matmul3d": [2, 5, 7], "matmul4d_batch3": [3, 2, 1, 7]}[core]
    h = b.op("MatMul", [b.input("x", shape), b.init(b.weight((7, 3)))], name="mm")
    return b, b.op("Add", [h, b.init(b.weight(3))], name="bias"), ["mm", "bias"]


def _relu_gelu_tanh(b, t, p, as_node=False):
    r, n1 = epi_relu(b, t, p, as_node)
    out, n2 = epi_gelu_tanh_pow(b, r, p, as_node)
    return out, n1 + n2


GEMM_RULES = [  # (rule, epilogue, cores, the ops it must become)
    ("fusedgemm", "relu", ["gemm_transB_alpha_beta", "matmul2d"], [f"{MS}:FusedGemm"]),
    ("matmul_biasgelu", "gelu_erf_torch", ["gemm_transB_alpha_beta", "matmul1d", "matmul3d", "matmul4d_batch3"],
     ["MatMul", f"{MS}:BiasGelu"]),
    ("matmul_biasgelu", "gelu_op", ["matmul2d"], ["MatMul", f"{MS}:BiasGelu"]),
    ("matmul_fastgelu", "gelu_tanh_pow", ["gemm_transB_alpha_beta", "matmul3d", "matmul4d_batch3"],
     ["MatMul", f"{MS}:FastGelu"]),
    ("matmul_fastgelu", "gelu_op_tanh", ["matmul2d"], ["MatMul", f"{MS}:FastGelu"]),
    ("matmul_add_act", "relu", ["gemm_transB_alpha_beta", "matmul1d", "matmul3d", "matmul4d_batch3"],
     ["MatMul", "Add", "Relu"]),
    ("matmul_add_act", "gelu_erf_tf", ["matmul2d", "matmul3d"], ["MatMul", "Add", f"{MS}:Gelu"]),
    ("matmul_add_act", "gelu_tanh_cube", ["gemm_transB_alpha_beta", "matmul3d"], ["MatMul", "Add", f"{MS}:FastGelu"]),
    ("matmul_add_act", "relu_gelu_erf", ["matmul2d", "matmul4d_batch3"], ["MatMul", "Add", "Relu", f"{MS}:Gelu"]),
    ("matmul_add_act", "relu_gelu_tanh", ["matmul3d"], ["MatMul", "Add", "Relu", f"{MS}:FastGelu"]),
]
GEMM_CASES = [(form, epi, core, ops) for form, epi, cores, ops in GEMM_RULES for core in cores]


@pytest.mark.parametrize("form, epilogue, core, ops", GEMM_CASES, ids=[f"{f}-{e}-{c}" for f, e, c, _ in GEMM_CASES])
def test_gemm_rule_matches_stock(form, epilogue, core, ops):
    builder = _relu_gelu_tanh if epilogue == "relu_gelu_tanh" else GEMM_EPILOGUES[epilogue][0]
    opset = 20 if epilogue.endswith("_op") or epilogue == "gelu_op_tanh" else 17
    b, t, names = gemm_graph(core, opset)
    out, extra = builder(b, t, "e_", as_node=core == "matmul3d")
    b.output(out)
    _, report = check_lowered(b.build(), b.feeds(), "gemm_act", form, ops)
    assert sorted(report.fused[0].nodes) == sorted(names + extra)


def test_fusedgemm_needs_a_2d_input_and_the_registry_falls_back():
    b, t, _ = gemm_graph("matmul3d", 17)
    b.output(epi_relu(b, t, "e_")[0])
    model, feeds = b.build(), b.feeds()
    _, forced = fuse(model, kernels="lowered:fusedgemm")
    assert "FusedGemm takes a 2-D input" in forced.matches[0].reason and not forced.fused
    fused, report = fuse(model)
    assert report.fused[0].kernel == "lowered to ORT: MatMul + Add + Relu"
    assert_outputs_close(run_ortfuse(fused, feeds)[0], run_stock(model, feeds), RTOL, ATOL)


# =============================================================================================
# the registry's choice
# =============================================================================================
@pytest.fixture
def fresh_registry(monkeypatch):
    registry._native_ops.cache_clear()
    yield monkeypatch
    registry._native_ops.cache_clear()


CHOICES = {  # (op, epilogue) -> (path with the native ops, path without them); lowered:<form>
    ("FusedConvAct", "relu"): ("lowered:fusedconv", "lowered:fusedconv"),
    ("FusedConvAct", "clip"): ("lowered:fusedconv", "lowered:fusedconv"),
    ("FusedConvAct", "hardsigmoid"): ("lowered:fusedconv", "lowered:fusedconv"),
    ("FusedConvAct", ""): ("lowered:conv", "lowered:conv"),
    ("FusedConvAct", "hardswish"): ("lowered:fusedconv", "lowered:fusedconv"),
    ("FusedConvAct", "silu"): ("lowered:conv_ort_epilogue", "lowered:conv_ort_epilogue"),
    ("FusedConvAddAct", "relu"): ("lowered:fusedconv_sum", "lowered:fusedconv_sum"),
    ("FusedGemmAct", "relu"): ("lowered:fusedgemm", "lowered:fusedgemm"),
    ("FusedGemmAct", "gelu"): ("lowered:matmul_add_act", "lowered:matmul_add_act"),
    ("FusedGemmAct", "gelu_tanh"): ("lowered:matmul_add_act", "lowered:matmul_add_act"),
    ("FusedGemmAct", "relu+gelu"): ("lowered:matmul_add_act", "lowered:matmul_add_act"),
    ("FusedAddRelu", ""): ("native", "reference"),
    ("FusedHardSwish", ""): ("native", "reference"),
    ("FusedEltwiseChain1", ""): ("native", "reference"),
}


def _path(sel: registry.Selection) -> str:
    return f"lowered:{sel.kernel.form}" if sel.kernel.path == registry.LOWERED else sel.kernel.path


@pytest.mark.parametrize("native", [True, False], ids=["native", "no_native"])
def test_registry_choice_per_op_and_epilogue(fresh_registry, native):
    """The measured priorities (each rule's lowering forms) as selected: conv and GEMM ops are lowered
    to ORT; a form ending in a native op is offered only where the native path is."""
    if not native:
        fresh_registry.setenv("ORTFUSE_NATIVE", "0")
    for (op, variant), want in CHOICES.items():
        sel = registry.select(op, variant=variant)
        assert _path(sel) == want[0 if native else 1], (op, variant, sel)
        if sel.kernel.path == registry.LOWERED:
            assert sel.label == LABEL_PREFIX + catalogue.LOWERING_FORMS[sel.kernel.form].summary


def test_every_lowering_form_and_epilogue_is_a_kernel_above_the_reference():
    """Each (form, epilogue) a rule declares is one lowered kernel, ranked by the priority the rule
    states for it, above the reference path (priority 0)."""
    declared = {(f.name, v): p for f in catalogue.LOWERING_FORMS.values() for v, p in f.priorities.items()}
    listed = {(k.form, k.variants[0]): k.priority for k in registry.lowered_kernels(native=frozenset(
        op for f in catalogue.LOWERING_FORMS.values() for op in f.native_ops.values()))}
    assert listed == declared
    assert all(p > 0 for p in declared.values())


def test_preferences_restrict_the_paths():
    assert registry.select("FusedConvAct", prefer="reference", variant="relu").kernel.path == "reference"
    assert registry.select("FusedGemmAct", prefer="native", variant="gelu").kernel.path == "native"
    forced = registry.select("FusedGemmAct", prefer="lowered:matmul_biasgelu", variant="gelu")
    assert forced.kernel.form == "matmul_biasgelu"
    miss = registry.select("FusedGemmAct", prefer="lowered:fusedgemm", variant="gelu")
    assert miss.kernel is None and "no FusedGemmAct kernel on path lowered:fusedgemm" in miss.reason
    assert registry.select("FusedConvAct", prefer="native", variant="relu").kernel is None
    with pytest.raises(ValueError, match="unknown kernel preference"):
        registry.select("FusedConvAct", prefer="fast")


def test_reference_preference_still_writes_one_custom_op():
    b, t, _ = conv_graph("pads_batch2")
    b.output(epi_relu(b, t, "e_")[0])
    fused, report = fuse(b.build(), kernels="reference")
    assert [n.op_type for n in fused.graph.node] == ["FusedConvActRef"]
    assert report.fused[0].kernel == registry.REFERENCE_LABEL


# =============================================================================================
# report, provenance, saved models
# =============================================================================================
def mixed_model():
    """Conv+BN+HardSwish with Keras' slope (lowered, with a native epilogue: FusedConv's HardSwish
    has no parameters), then Add+Relu with a second input (native custom op), then a 2-D GEMM + Relu
    (lowered to FusedGemm)."""
    b, t, _ = conv_graph("pads_batch2")
    t, _ = _hardswish_hsig(b, t, "e_")
    flat = b.op("Reshape", [t, b.init(np.array([2, -1], np.int64))], name="flat")
    s = b.op("Relu", [b.op("Add", [flat, b.input("y", [2, 315])], name="add")], name="relu")
    g = b.op("Gemm", [s, b.init(b.weight((315, 6), 0.05)), b.init(b.weight(6))], name="gemm")
    b.output(b.op("Relu", [g], name="gemm_relu"))
    return b.build(), b.feeds()


def test_report_labels_names_and_provenance_of_lowered_groups():
    model, feeds = mixed_model()
    fused, report = fuse(model)
    kernels = {m.pattern_id: m.kernel for m in report.fused}
    assert kernels == {"conv_act": f"lowered to ORT: Conv + {DOMAIN}:FusedHardSwish",
                       "add_relu": f"native numba {registry.native_isa()}",
                       "gemm_act": f"lowered to ORT: {MS}:FusedGemm"}
    groups = fused_groups(fused)
    for record in report.fused:
        check_group(record, groups[(record.pattern_id, tuple(record.nodes))])
    conv_group = groups[next((m.pattern_id, tuple(m.nodes)) for m in report.fused if m.pattern_id == "conv_act")]
    assert [n.op_type for n in conv_group] == ["Conv", "FusedHardSwish"]
    assert conv_group[0].name == conv_group[1].name + "/0"
    assert node_attrs(conv_group[1])["pattern_id"] == "conv_act"
    assert native_op_types(fused) == {"FusedHardSwish", "FusedAddRelu"}
    assert "lowered to ORT: Conv + ai.onnx.contrib:FusedHardSwish" in report.table()
    assert_outputs_close(run_ortfuse(fused, feeds)[0], run_stock(model, feeds), RTOL, ATOL, scale_atol=True)


def test_saved_lowered_model_reloads_and_reports_the_same(tmp_path):
    model, feeds = mixed_model()
    fused, report = fuse(model)
    path = tmp_path / "mixed.fused.onnx"
    onnx.save(fused, str(path))
    loaded = onnx.load(str(path))
    assert is_rewritten(loaded) and not is_rewritten(model)
    again, rep2 = fuse(loaded)
    assert not rep2.applied and "already holds ortfuse fused ops" in rep2.reason
    assert again.SerializeToString() == loaded.SerializeToString()
    sess = ortfuse.InferenceSession(str(path))  # fusion=None: the saved graph runs as it is
    assert sess.fusion_report.applied and "saved already fused" in sess.fusion_report.reason

    def key(r):
        return r.pattern_id, tuple(r.nodes), r.fused_node, r.kernel.split(" avx")[0]

    assert sorted(map(key, sess.fusion_report.fused)) == sorted(
        (r.pattern_id, tuple(r.nodes), r.fused_node, r.kernel.replace(f" {registry.native_isa()}", ""))
        for r in report.fused)
    assert_outputs_close(sess.run(None, feeds), run_stock(model, feeds), RTOL, ATOL, scale_atol=True)


def test_a_graph_lowered_to_ort_ops_only_runs_on_stock_ort_and_is_still_recognised(tmp_path):
    b, t, _ = conv_graph("depthwise_stride2")
    b.output(CONV_EPILOGUES["silu"][0](b, t, "e_")[0])
    model, feeds = b.build(), b.feeds()
    fused, report = fuse(model)
    assert report.fused[0].kernel == "lowered to ORT: Conv + Sigmoid + Mul"
    assert not any(n.domain == DOMAIN for n in fused.graph.node)
    path = tmp_path / "lowered.onnx"
    onnx.save(fused, str(path))
    stock = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert_outputs_close(stock.run(None, feeds), run_stock(model, feeds), RTOL, ATOL, scale_atol=True)
    assert onnx.load(str(path)).metadata_props[-1].key == "ortfuse_rewritten"
    sess = ortfuse.InferenceSession(str(path), fusion=True)
    (record,) = sess.fusion_report.fused
    assert (record.pattern_id, record.kernel, record.fused_node) == (
        "conv_act", "lowered to ORT: Conv + Sigmoid + Mul", report.fused[0].fused_node)
    assert record.nodes == report.fused[0].nodes


def test_keep_rule_sees_the_lowered_label():
    model, _ = mixed_model()
    seen = {}

    def keep(record):
        seen[record.pattern_id] = record.kernel
        return "" if record.pattern_id == "gemm_act" else "test: GEMM only"

    fused, report = fuse(model, keep=keep)
    assert seen["conv_act"] == f"lowered to ORT: Conv + {DOMAIN}:FusedHardSwish"
    assert seen["gemm_act"] == f"lowered to ORT: {MS}:FusedGemm"
    assert [m.pattern_id for m in report.fused] == ["gemm_act"]
    assert {m.pattern_id for m in report.matches if m.decision == DISABLED} == {"conv_act", "add_relu"}
    assert {n.op_type for n in fused.graph.node} >= {"Conv", "BatchNormalization", "HardSigmoid", "FusedGemm"}


# =============================================================================================
# the measurement tool behind the priorities
# =============================================================================================
def test_lowering_bench_times_every_kernel_of_a_group_and_checks_its_outputs(tmp_path):
    """tools/lowering_bench.py on the MLP's three Gemm+Relu matches: each kernel path is timed on the
    real shapes beside the unfused ORT baseline and its A/A copy, after its outputs were compared
    with stock ORT at ORT_DISABLE_ALL."""
    import importlib.util
    import json
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "lowering_bench.py"
    spec = importlib.util.spec_from_file_location("lowering_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "rows.json"
    assert bench.main(["--case", "mlp_gemm_relu_gelu:2", "--runs", "1", "--repeats", "1", "--no-reference",
                       "--only", "FusedGemmAct/relu", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["op"], row["epilogue"], row["count"], row["batch"]) == ("FusedGemmAct", "relu", 3, 2)
    assert set(row["p50_ms"]) == {"ort", "ort_aa", "native", "lowered:fusedgemm", "lowered:matmul_add_act"}
    assert row["labels"]["lowered:fusedgemm"] == [f"lowered to ORT: {MS}:FusedGemm"]
    assert all(ms > 0 for ms in row["p50_ms"].values()) and row["aa"] > 0
    assert all(d <= 1e-4 for d in row["max_abs_diff"].values()), row["max_abs_diff"]
