"""The attention rule (ortfuse/fusion/rules/attention.py) beyond the shared harness: every lowering
form on both exporters' patterns against stock ORT at ORT_DISABLE_ALL (rtol 1e-4 of max |ref|),
with padded rows, a row with every key masked, and scores in the thousands; which form applies where
(the raw-mask forms need a mask built from a [batch, seq] attention_mask); mask values other than 0
and 1 (exact only with the graph's own additive mask, the static first choice); attention without a
mask; shape errors coming back as ORT errors; and the zoo encoders: the two MiniLM exports fused six
times each, bert_encoder (no mask) four times.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from ortfuse import fuse
from ortfuse.fusion.rules import attention
from ortfuse.kernel_choice import registry

FORMS = ("attention_bias", "attention_mask", "mha_bias", "mha_mask")
RAW_MASK_FORMS = ("attention_mask", "mha_mask")
ORT_ERRORS = (ort_state.Fail, ort_state.InvalidArgument, ort_state.RuntimeException)


def _session(model: onnx.ModelProto, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _stock(model, feeds):
    return _session(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feeds)


def _close(got, ref, rtol=1e-4):
    scale = max(1.0, float(np.max(np.abs(ref))))
    assert np.all(np.isfinite(got)), "non-finite outputs"
    np.testing.assert_allclose(got, ref, rtol=0, atol=rtol * scale)


def _feeds(model: onnx.ModelProto, seed: int = 0, mask_values=(0, 1), full_row_masked: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            mask = rng.choice(np.array(mask_values, np.int64), size=shape)
            mask[:, 0] = 1
            if full_row_masked:
                mask[-1, :] = 0  # every key of the last sequence masked
            feeds[vi.name] = mask
        else:
            feeds[vi.name] = rng.uniform(-3, 3, shape).astype(np.float32)
    return feeds


def _mask_column(model: onnx.ModelProto, transpose: onnx.NodeProto) -> bool:
    """``transpose`` is the attention_bias form's Transpose of the mask, read only by a Shape."""
    readers = [n for n in model.graph.node if transpose.output[0] in n.input]
    perm = next(list(a.ints) for a in transpose.attribute if a.name == "perm")
    return perm == [0, 1, 3, 2] and [n.op_type for n in readers] == ["Shape"]


@pytest.mark.slow
def test_layers_share_one_expanded_mask():
    """The attention_bias form expands a [B, 1, 1, S] mask from the mask alone: ORT (ENABLE_ALL)
    keeps one Expand for all six layers of the TorchScript encoder."""
    from ortfuse import models

    fused, report = fuse(models.make("minilm_encoder"), ["attention"], kernels="lowered:attention_bias")
    assert len(report.fused) == 6
    assert sum(n.op_type == "Expand" for n in fused.graph.node) == 6
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        ort.InferenceSession(fused.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath)
    assert sum(n.op_type == "Expand" for n in optimized.graph.node) == 1
    assert sum(n.op_type == "Attention" for n in optimized.graph.node) == 6


EXAMPLES = {
    "torchscript": lambda: attention._example("torchscript"),
    "dynamo": lambda: attention._example("dynamo"),
    "large_scores": lambda: attention._example("dynamo", weight_scale=4.0),
    "torchscript_large_scores": lambda: attention._example("torchscript", weight_scale=4.0),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_every_form_matches_stock(example, form):
    model = EXAMPLES[example]()
    feeds = _feeds(model)
    ref = _stock(model, feeds)[0]
    fused, report = fuse(model, ["attention"], kernels=f"lowered:{form}")
    assert len(report.fused) == 1, report.reason
    assert not any(n.op_type == "Softmax" for n in fused.graph.node)
    assert not [n for n in fused.graph.node if n.op_type == "Transpose" and not _mask_column(fused, n)]
    ops = {n.op_type for n in fused.graph.node if n.domain == "com.microsoft"}
    assert ops == ({"Attention"} if form.startswith("attention") else {"MultiHeadAttention"})
    _close(_session(fused).run(None, feeds)[0], ref)


def test_large_scores_are_large():
    """The large-score example does reach scores where a softmax without max subtraction overflows."""
    model = EXAMPLES["large_scores"]()
    feeds = _feeds(model)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, None))
    scores = _stock(probe, feeds)[1]
    assert np.abs(scores).max() > 200.0


def test_attention_bias_is_the_static_choice_and_exact_for_any_mask_values():
    """With mask values other than 0 and 1 the graph adds (1 - m) * min; the attention_bias form
    adds that same tensor, the raw-mask forms treat any nonzero as 'keep'."""
    model = EXAMPLES["torchscript"]()
    feeds = _feeds(model, mask_values=(-1, 0, 1, 2), full_row_masked=False)
    ref = _stock(model, feeds)[0]
    fused, report = fuse(model, ["attention"])
    assert report.fused[0].kernel.endswith("com.microsoft:Attention"), report.fused[0].kernel
    assert any(len(n.input) > 5 and n.input[5] for n in fused.graph.node if n.op_type == "Attention")
    _close(_session(fused).run(None, feeds)[0], ref)
    priorities = {f.name: f.priorities[""] for f in attention.LOWERING}
    assert max(priorities, key=priorities.__getitem__) == "attention_bias"


def _float_mask_model() -> onnx.ModelProto:
    """The dynamo example with its additive mask fed directly as a float [B, 1, S, S] input."""
    model = attention._example("dynamo")
    g = model.graph
    keep = [n for n in g.node if n.output[0] not in ("m4", "mf", "inverted", "masked", "bias")]
    del g.node[:]
    g.node.extend(keep)
    del g.input[1]
    g.input.append(onnx.helper.make_tensor_value_info("bias", onnx.TensorProto.FLOAT,
                                                      [attention.B, 1, attention.S, attention.S]))
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("form", FORMS)
def test_raw_mask_forms_need_an_attention_mask(form):
    model = _float_mask_model()
    fused, report = fuse(model, ["attention"], kernels=f"lowered:{form}")
    if form in RAW_MASK_FORMS:
        assert not report.fused
        reasons = " ".join(m.reason for m in report.matches)
        assert "not built from a [batch, seq] attention_mask" in reasons
    else:
        assert len(report.fused) == 1
        feeds = {"x": np.random.default_rng(1).uniform(-3, 3, (attention.B, attention.S, 8)).astype(np.float32),
                 "bias": np.where(np.random.default_rng(2).random((attention.B, 1, attention.S, attention.S)) < 0.3,
                                  np.float32(-1e4), np.float32(0.0)).astype(np.float32)}
        _close(_session(fused).run(None, feeds)[0], _stock(model, feeds)[0])


def test_match_reads_heads_scale_and_mask():
    model = EXAMPLES["dynamo"]()
    fused, report = fuse(model, ["attention"], kernels="lowered:attention_mask")
    node = next(n for n in fused.graph.node if n.op_type == "Attention")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["num_heads"] == attention.H
    assert attrs["scale"] == pytest.approx(1.0 / np.sqrt(attention.D), rel=1e-6)
    assert attrs["mask_filter_value"] == pytest.approx(float(np.finfo(np.float32).min))
    cast = next(n for n in fused.graph.node if n.output[0] == node.input[3])
    assert cast.op_type == "Cast" and cast.input[0] == "attention_mask"


def _unmasked_model(style: str) -> onnx.ModelProto:
    """The example with its padding mask cut out of the graph: Softmax of the scaled scores."""
    model = attention._example(style)
    g = model.graph
    for n in g.node:
        if n.op_type == "Softmax":
            n.input[0] = "scores"
    keep = [n for n in g.node if n.output[0] not in ("m4", "mf", "inverted", "masked", "bias", "biased")]
    del g.node[:]
    g.node.extend(keep)
    del g.input[1]
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
@pytest.mark.parametrize("form", FORMS)
def test_attention_without_mask(style, form):
    """Without a mask the bias forms run ORT's ops with no mask input (rtol 1e-4 of stock
    ORT_DISABLE_ALL); the raw-mask forms have no mask to read and say so."""
    model = _unmasked_model(style)
    fused, report = fuse(model, ["attention"], kernels=f"lowered:{form}")
    if form in RAW_MASK_FORMS:
        assert not report.fused
        assert any("has no mask" in m.reason for m in report.matches), [m.reason for m in report.matches]
        return
    assert len(report.fused) == 1, report.reason
    op = next(n for n in fused.graph.node if n.domain == "com.microsoft")
    assert len(op.input) == (3 if form == "attention_bias" else 4)  # x, W, b (or q, k, v, b): no mask
    assert not any(n.op_type in ("Softmax", "Transpose") for n in fused.graph.node)
    assert not any(t.name.endswith("no_mask") for t in fused.graph.initializer)
    feeds = {"x": np.random.default_rng(4).uniform(-3, 3, (attention.B, attention.S, 8)).astype(np.float32)}
    _close(_session(fused).run(None, feeds)[0], _stock(model, feeds)[0])


def test_attention_without_mask_reference_matches_stock():
    """The reference op of a match without a mask (its zero [1, 1, 1, 1] M) equals the graph."""
    model = _unmasked_model("dynamo")
    fused, report = fuse(model, ["attention"])
    match = report.fused[0]
    assert match.kernel.endswith("com.microsoft:Attention"), match.kernel
    ix_inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.random.default_rng(5).uniform(-3, 3, (attention.B, attention.S, 8)).astype(np.float32)
    w = np.concatenate([ix_inits[f"w{n}"] for n in "qkv"], axis=1)
    b = np.concatenate([ix_inits[f"b{n}"] for n in "qkv"])
    got = attention.reference(x, w, b, np.zeros((1, 1, 1, 1), np.float32), num_heads=attention.H,
                              scale=1.0 / np.sqrt(attention.D))
    _close(got, _stock(model, {"x": x})[0])


def test_wrong_mask_shape_is_an_ort_error():
    model = EXAMPLES["torchscript"]()
    fused, _ = fuse(model, ["attention"])
    feeds = _feeds(model)
    feeds["attention_mask"] = feeds["attention_mask"][:, :3]
    with pytest.raises(ORT_ERRORS):
        _stock(model, feeds)
    session = _session(fused)
    with pytest.raises(ORT_ERRORS):
        session.run(None, feeds)
    good = _feeds(model)
    _close(session.run(None, good)[0], _stock(model, good)[0])  # still usable


def test_forms_are_offered_by_the_registry():
    offered = {k.form for k in registry.kernels_for("FusedAttention") if k.path == "lowered"}
    assert set(FORMS) <= offered


# -- the zoo encoders ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def encoders():
    from ortfuse import models

    return {name: models.make(name) for name in ("minilm_encoder", "minilm_encoder_dynamo")}


def _encoder_feeds(batch: int = 2, seq: int = 24) -> dict:
    rng = np.random.default_rng(3)
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq - 5:] = 0
    return {"input_ids": rng.integers(0, 30522, (batch, seq)), "token_type_ids": rng.integers(0, 2, (batch, seq)),
            "attention_mask": mask}


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", ["minilm_encoder", "minilm_encoder_dynamo"])
def test_zoo_encoders_fuse_every_layer(encoders, name, form):
    model = encoders[name]
    fused, report = fuse(model, ["attention"], kernels=f"lowered:{form}")
    assert len(report.fused) == 6, report.reason
    assert not any(n.op_type == "Softmax" for n in fused.graph.node)
    feeds = _encoder_feeds()
    _close(_session(fused).run(None, feeds)[0], _stock(model, feeds)[0])


@pytest.mark.slow
def test_dynamo_encoder_as_exported(encoders):
    """What the dynamo-style encoder holds (opset 18, LayerNormalization op, SDPA's split scale, HF's
    Where mask, value_info with symbolic dims) and what stock ORT leaves of it at ENABLE_ALL."""
    model = encoders["minilm_encoder_dynamo"]
    assert model.opset_import[0].version == 18
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("LayerNormalization") == 13 and ops.count("Softmax") == 6 and ops.count("Erf") == 6
    assert "Where" in ops and "ReduceMean" not in ops
    dims = {d.dim_param for vi in model.graph.value_info for d in vi.type.tensor_type.shape.dim if d.dim_param}
    assert dims == {"batch", "seq"}
    for vi in model.graph.input:
        assert vi.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in vi.type.tensor_type.shape.dim] == ["batch", "seq"]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = ""
    feeds = _encoder_feeds(batch=1, seq=16)
    out = _session(model).run(None, feeds)[0]
    _close(out, _stock(model, feeds)[0])


@pytest.mark.slow
def test_bert_encoder_without_mask_fuses_every_layer():
    """bert_encoder (constant Reshape targets, K^T by one Transpose [0, 2, 3, 1], no mask): each of
    its 4 attentions becomes one maskless com.microsoft:Attention, within rtol 1e-4 of stock."""
    from ortfuse import models

    model = models.make("bert_encoder")
    fused, report = fuse(model, ["attention"])
    assert len(report.fused) == 4, [m.reason for m in report.matches]
    ops = [n for n in fused.graph.node if n.op_type == "Attention"]
    assert len(ops) == 4 and all(len(n.input) == 3 for n in ops)
    assert not any(n.op_type == "Softmax" for n in fused.graph.node)
    x = np.random.default_rng(6).standard_normal((2, 20, 768)).astype(np.float32)
    _close(_session(fused).run(None, {"hidden_states": x})[0], _stock(model, {"hidden_states": x})[0])
