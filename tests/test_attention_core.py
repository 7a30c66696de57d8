"""The native attention core (custom_ops/native/ops/attention_core.py) and the attention rule's
``native_core`` form: the kernel against a float64 numpy reference (atol 1e-5 * max(1, max |ref|))
over head sizes and sequence lengths off every block, each mask shape the matcher passes (none,
padding [B, 1, 1, S] with the float32 minimum, full [B, H, S, S], [1, 1, S, S]) and scores in the
hundreds; bad shapes as ORT errors; the rule's examples and both zoo encoders fused with the native
form against stock ORT at ORT_DISABLE_ALL (atol 1e-4 * max(1, max |ref|))."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from native_sessions import native_options, one_op_session

from ortfuse import fuse
from ortfuse.fusion.provenance import native_op_types
from ortfuse.fusion.rules import attention
from ortfuse.kernel_choice import registry

OP = attention.CORE_OP


def _core_session(heads: int, scale: float):
    return one_op_session(OP, ["qkv", "b", "m"], num_heads=heads, scale=scale)


def _mask(kind, rng, batch, heads, seq):
    if kind == "none":
        return np.zeros((1, 1, 1, 1), np.float32)
    if kind == "padding":
        keep = rng.random((batch, 1, 1, seq)) < 0.7
        keep[..., 0] = True
        keep[-1] = False  # every key of the last sequence masked: all scores equal, a uniform softmax
        return np.where(keep, 0, np.finfo(np.float32).min).astype(np.float32)
    if kind == "full":
        return rng.standard_normal((batch, heads, seq, seq)).astype(np.float32)
    return rng.standard_normal((1, 1, seq, seq)).astype(np.float32)  # "square"


@pytest.mark.parametrize("batch, seq, heads, size", [(1, 128, 12, 32), (2, 37, 3, 5), (2, 9, 2, 4), (1, 1, 1, 1),
                                                     (3, 70, 2, 24)])
@pytest.mark.parametrize("mask", ["none", "padding", "full", "square"])
def test_kernel_matches_the_reference(batch, seq, heads, size, mask):
    rng = np.random.default_rng(batch * 100 + seq)
    qkv = rng.standard_normal((batch, seq, 3 * heads * size)).astype(np.float32)
    b = rng.standard_normal(3 * heads * size).astype(np.float32)
    m = _mask(mask, rng, batch, heads, seq)
    scale = 1.0 / np.sqrt(size)
    got = _core_session(heads, scale).run(None, {"qkv": qkv, "b": b, "m": m})[0]
    ref = attention.core_reference(qkv, b, m, heads, np.float32(scale))
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def test_large_scores_keep_the_softmax_finite():
    """Scores in the hundreds: exp without the row maximum subtracted would overflow."""
    rng = np.random.default_rng(9)
    qkv = (rng.standard_normal((2, 20, 3 * 2 * 16)) * 8).astype(np.float32)
    b = np.zeros(3 * 2 * 16, np.float32)
    m = np.zeros((1, 1, 1, 1), np.float32)
    ref = attention.core_reference(qkv, b, m, 2, 1.0)
    q0, k0 = qkv[..., :16].astype(np.float64), qkv[..., 32:48].astype(np.float64)  # head 0's Q and K
    assert np.abs(np.einsum("bid,bjd->bij", q0, k0)).max() > 200
    got = _core_session(2, 1.0).run(None, {"qkv": qkv, "b": b, "m": m})[0]
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("qkv_shape, b_shape, m_shape", [
    ((2, 8, 24), (24,), (2, 1, 1, 8, 1)),  # M of rank 5
    ((2, 8, 24, 1), (24,), (1, 1, 1, 1)),  # QKV of rank 4
    ((2, 8, 25), (25,), (1, 1, 1, 1)),  # width not 3 * heads * size
    ((2, 8, 24), (12,), (1, 1, 1, 1)),  # bias of another width
    ((2, 8, 24), (24,), (3, 1, 1, 8)),  # mask batch neither 1 nor 2
    ((2, 8, 24), (24,), (2, 1, 1, 7)),  # mask keys neither 1 nor 8
])
def test_bad_shapes_are_ort_errors(qkv_shape, b_shape, m_shape):
    session = _core_session(2, 0.5)
    feeds = {"qkv": np.ones(qkv_shape, np.float32), "b": np.ones(b_shape, np.float32),
             "m": np.zeros(m_shape, np.float32)}
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="QKV must have the shape"):
        session.run(None, feeds)
    good = {"qkv": np.ones((2, 8, 24), np.float32), "b": np.ones(24, np.float32),
            "m": np.zeros((1, 1, 1, 1), np.float32)}
    assert session.run(None, good)[0].shape == (2, 8, 8)  # the session stays usable


def _stock(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so).run(None, feeds)


def _fused_native(model):
    fused, report = fuse(model, ["attention"], kernels="lowered:native_core")
    ops = native_op_types(fused)
    assert OP in ops, report.reason
    return fused, report, ort.InferenceSession(fused.SerializeToString(), native_options(ops))


def _close(got, ref, rtol=1e-4):
    np.testing.assert_allclose(got, ref, rtol=0, atol=rtol * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
@pytest.mark.parametrize("mask", ["padding", "none"])
def test_native_form_matches_stock_on_the_rule_examples(style, mask):
    model = attention._example(style, mask=mask)
    fused, report, session = _fused_native(model)
    assert len(report.fused) == 1 and not any(n.op_type == "Softmax" for n in fused.graph.node)
    rng = np.random.default_rng(2)
    feeds = {"x": rng.uniform(-3, 3, (attention.B, attention.S, attention.H * attention.D)).astype(np.float32)}
    if mask == "padding":
        keep = rng.integers(0, 2, (attention.B, attention.S)).astype(np.int64)
        keep[:, 0] = 1
        keep[-1, :] = 0
        feeds["attention_mask"] = keep
    _close(session.run(None, feeds)[0], _stock(model, feeds)[0])


def test_native_form_is_offered_only_where_the_native_path_has_it():
    with_core = {k.form for k in registry.lowered_kernels(frozenset({OP})) if k.op == "FusedAttention"}
    without = {k.form for k in registry.lowered_kernels(frozenset()) if k.op == "FusedAttention"}
    assert "native_core" in with_core and "native_core" not in without, (with_core, without)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm_encoder", "minilm_encoder_dynamo"])
def test_zoo_encoders_with_the_native_core(name):
    from ortfuse import models

    model = models.make(name)
    fused, report, session = _fused_native(model)
    assert len(report.fused) == 6, report.reason
    rng = np.random.default_rng(3)
    mask = np.ones((2, 40), np.int64)
    mask[0, 33:] = 0
    feeds = {"input_ids": rng.integers(0, 30522, (2, 40)), "token_type_ids": rng.integers(0, 2, (2, 40)),
             "attention_mask": mask}
    _close(session.run(None, feeds)[0], _stock(model, feeds)[0])
