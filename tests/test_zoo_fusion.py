"""The rewriter on every zoo model: the expected matches, and outputs equal to the same model run
unfused by stock ORT (ORT_DISABLE_ALL). Tolerance: |fused - ref| <= 1e-4 * max(1, max|ref|)
(BN folding and fused bias change float32 rounding; the deepest model, resnet50, stays near 1e-6)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest

import ortfuse
from ortfuse import models

EXPECTED = {
    # 53 Conv+BN groups: 16 close a residual block (conv_add_relu), 37 do not (conv_act).
    "resnet50": {"conv_add_relu": 16, "conv_act": 37},
    "resnet50_const": {"conv_add_relu": 16, "conv_act": 37},
    # every FFN epilogue; each residual Add + decomposed LayerNorm becomes Sum -> LayerNormalization
    # (skip_layernorm), which ORT keeps, instead of the SkipLayerNormalization it would fuse.
    "bert_encoder": {"attention": 4, "gemm_act": 4, "skip_layernorm": 8},
    "mlp_gemm_relu_gelu": {"gemm_act": 7},
}
SLOW = {"resnet50", "resnet50_const", "bert_encoder", "minilm_encoder", "minilm_encoder_dynamo", "picodet_layout",
        "db_text_detector"}


def _reference(model: onnx.ModelProto, feeds):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), so).run(None, feeds)


def _assert_close(got, ref):
    for g, r in zip(got, ref):
        tol = 1e-4 * max(1.0, float(np.abs(r).max()))
        diff = float(np.abs(g - r).max())
        assert diff <= tol, f"max abs diff {diff:.3g} > {tol:.3g}"


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in models.NAMES])
def test_zoo_model_fuses_as_expected_and_matches_stock(name):
    model = onnx.load(models.build(name))
    fused, report = ortfuse.fuse(model)
    onnx.checker.check_model(fused)
    counts = report.counts()
    if name in EXPECTED:
        assert counts == EXPECTED[name], report.table()
    if name.startswith("mobilenetv3_block"):
        # every HardSwish (Add->Clip->Div->Mul) and SiLU (Sigmoid->Mul) is inside a fused op: none
        # of them is left, and the only Sigmoids are those a conv epilogue was lowered to
        hardswish_clips = [n.name for n in model.graph.node if n.op_type == "Clip"]
        sigmoids = [n.name for n in model.graph.node if n.op_type == "Sigmoid"]
        assert hardswish_clips and sigmoids
        replaced = {name for m in report.fused for name in m.nodes}
        assert set(hardswish_clips + sigmoids) <= replaced
        left = {n.op_type for n in fused.graph.node if not n.doc_string.startswith("ortfuse ")}
        assert "Clip" not in left and "Sigmoid" not in left, sorted(left)
        assert counts.get("conv_act", 0) > 0
    assert report.applied and all(r.reason for r in report.matches if r.decision != "fused")
    feeds = models.sample_inputs(name, batch=2)
    ref = _reference(model, feeds)
    _assert_close(ortfuse.InferenceSession(fused).run(None, feeds), ref)
    _assert_close(ortfuse.InferenceSession(model.SerializeToString(), fusion=True).run(None, feeds), ref)


def test_const_weight_variants_fuse_like_initializer_ones():
    a = ortfuse.fuse(models.make("mobilenetv3_block"))[1].counts()
    b = ortfuse.fuse(models.make("mobilenetv3_block_const"))[1].counts()
    assert a == b and a


def test_fused_model_drops_the_weights_it_folded():
    model = models.make("mobilenetv3_block_const")
    fused, _ = ortfuse.fuse(model)
    kept_constants = sum(n.op_type == "Constant" for n in fused.graph.node)
    assert kept_constants < sum(n.op_type == "Constant" for n in model.graph.node)
    assert not any(n.op_type == "BatchNormalization" for n in fused.graph.node)
