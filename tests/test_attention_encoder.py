"""The rest of the encoder around the attention: the skip_layernorm rule's forms against stock ORT at
ORT_DISABLE_ALL (rtol 1e-4 of max |ref|), what ORT makes of each form at ORT_ENABLE_ALL (Sum ->
LayerNormalization is kept as it is, where ORT would turn Add -> LayerNormalization into its slower
SkipLayerNormalization kernel), and the two MiniLM zoo encoders fused with every pattern: which
patterns take which nodes, and the outputs.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortfuse import fuse
from ortfuse.fusion.rules import skip_layernorm

FORMS = ("sum_layernorm", "skiplayernorm")
EXAMPLES = {
    "decomposed_opset14": lambda: skip_layernorm._residual_ln(True),
    "layernormalization_op": lambda: skip_layernorm._residual_ln(False),
    "broadcast_skip": lambda: skip_layernorm._residual_ln(False, skip_shape=(1, 5, 8)),
}


def _session(model, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL, optimized: str = "") -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1
    if optimized:
        so.optimized_model_filepath = optimized
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _close(got, ref, rtol=1e-4):
    np.testing.assert_allclose(got, ref, rtol=0, atol=rtol * max(1.0, float(np.max(np.abs(ref)))))


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    return {vi.name: rng.uniform(-3, 3, [d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
            for vi in model.graph.input}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_forms_match_stock(example, form):
    model = EXAMPLES[example]()
    feeds = _feeds(model)
    ref = _session(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feeds)[0]
    fused, report = fuse(model, ["skip_layernorm"], kernels=f"lowered:{form}")
    assert len(report.fused) == 1, report.reason
    adds = 2 if form == "sum_layernorm" and example.startswith("decomposed") else 0  # eps and beta Adds
    assert [n.op_type for n in fused.graph.node].count("Add") == adds
    _close(_session(fused).run(None, feeds)[0], ref)


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_sum_layernorm_is_what_ort_runs(example, tmp_path):
    """At ORT_ENABLE_ALL the Sum form stays Sum + LayerNormalization (decomposed LN fused by ORT),
    where the original Add -> LayerNormalization op becomes SkipLayerNormalization."""
    model = EXAMPLES[example]()
    fused, _ = fuse(model, ["skip_layernorm"])
    _session(fused, optimized=str(tmp_path / "fused.onnx"))
    ops = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "fused.onnx")).graph.node)
    assert ops["Sum"] == 1 and ops["LayerNormalization"] == 1 and ops["SkipLayerNormalization"] == 0, ops
    if example == "layernormalization_op":
        _session(model, optimized=str(tmp_path / "stock.onnx"))
        stock = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "stock.onnx")).graph.node)
        assert stock["SkipLayerNormalization"] == 1, stock


def test_sum_layernorm_is_the_static_choice():
    priorities = {f.name: f.priorities[""] for f in skip_layernorm.LOWERING}
    assert max(priorities, key=priorities.__getitem__) == "sum_layernorm"


def test_residual_read_elsewhere_is_rejected():
    model = skip_layernorm._residual_ln(False)
    model.graph.output.append(onnx.helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [2, 5, 8]))
    _, report = fuse(model, ["skip_layernorm"])
    assert not report.fused
    assert any("'s' is a graph output" in m.reason for m in report.matches)


# -- the zoo encoders, every pattern ---------------------------------------------------------------
@pytest.fixture(scope="module")
def encoders():
    from ortfuse import models

    return {name: models.make(name) for name in ("minilm_encoder", "minilm_encoder_dynamo")}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm_encoder", "minilm_encoder_dynamo"])
def test_encoders_fuse_attention_gelu_and_residual_layernorms(encoders, name, tmp_path):
    model = encoders[name]
    fused, report = fuse(model)
    taken = collections.Counter(m.pattern_id for m in report.fused)
    assert taken["attention"] == 6 and taken["gemm_act"] == 6, taken
    assert taken["skip_layernorm"] == 12 and taken["embed_layernorm"] == 1, taken
    rng = np.random.default_rng(5)
    mask = np.ones((2, 20), np.int64)
    mask[1, 14:] = 0
    feeds = {"input_ids": rng.integers(0, 30522, (2, 20)), "token_type_ids": rng.integers(0, 2, (2, 20)),
             "attention_mask": mask}
    ref = _session(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feeds)[0]
    import ortfuse

    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    session = ortfuse.InferenceSession(fused.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)[0]
    _close(got, ref)
    ops = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)
    assert ops["Softmax"] == 0 and ops["SkipLayerNormalization"] == 0 and ops["Erf"] == 0, ops
    assert ops["Attention"] == 6 and ops["LayerNormalization"] == 13 and ops["BiasGelu"] == 6, ops
