"""The native FusedSkipLayerNorm (custom_ops/native/ops/skip_layernorm.py): the kernel against the
rule's float64 reference (atol 1e-5 * max(1, max |ref|)) for every skip shape the rule passes
([B, S, D], [1, S, D], [S, D]), hidden sizes off the vector width, rows spread over several work
blocks, and a row of equal values (variance 0); bad shapes as ORT errors; the rule's examples and
both zoo encoders fused with the native kernel against stock ORT at ORT_DISABLE_ALL (atol 1e-4 *
max(1, max |ref|))."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from native_sessions import native_options, one_op_session

from ortfuse import fuse
from ortfuse.fusion.provenance import native_op_types
from ortfuse.fusion.rules import skip_layernorm

OP = "FusedSkipLayerNorm"
EPS = 1e-12


@pytest.fixture(scope="module")
def kernel():
    return one_op_session(OP, ["x", "skip", "gamma", "beta", "bias"], epsilon=EPS)


def _vectors(rng, d):
    return {"gamma": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            "beta": (0.1 * rng.standard_normal(d)).astype(np.float32),
            "bias": (0.1 * rng.standard_normal(d)).astype(np.float32)}


@pytest.mark.parametrize("batch, seq, d", [(2, 5, 8), (1, 128, 384), (3, 70, 37), (1, 1, 1), (2, 300, 100)])
@pytest.mark.parametrize("skip", ["full", "batch1", "rank2"])
def test_kernel_matches_the_reference(kernel, batch, seq, d, skip):
    rng = np.random.default_rng(batch * 1000 + seq + d)
    x = rng.uniform(-3, 3, (batch, seq, d)).astype(np.float32)
    shape = {"full": (batch, seq, d), "batch1": (1, seq, d), "rank2": (seq, d)}[skip]
    feeds = {"x": x, "skip": rng.uniform(-3, 3, shape).astype(np.float32), **_vectors(rng, d)}
    got = kernel.run(None, feeds)[0]
    ref = skip_layernorm.reference(**feeds, epsilon=EPS)
    assert got.shape == x.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def test_a_constant_row_gives_beta(kernel):
    """Variance 0: (t - mean) is 0 and the output is beta (the epsilon keeps the division finite)."""
    rng = np.random.default_rng(1)
    feeds = {"x": np.full((1, 2, 16), 2.0, np.float32), "skip": np.ones((1, 2, 16), np.float32), **_vectors(rng, 16)}
    feeds["bias"] = np.zeros(16, np.float32)
    got = kernel.run(None, feeds)[0]
    np.testing.assert_array_equal(got, np.broadcast_to(feeds["beta"], got.shape))


@pytest.mark.parametrize("x_shape, skip_shape, d", [
    ((2, 5), (2, 5), 5),  # X of rank 2
    ((2, 5, 8), (3, 5, 8), 8),  # skip batch neither 1 nor 2
    ((2, 5, 8), (2, 4, 8), 8),  # skip of another sequence length
    ((2, 5, 8), (5, 8), 7),  # vectors of another hidden size
    ((2, 5, 8), (8,), 8),  # skip of rank 1
])
def test_bad_shapes_are_ort_errors(kernel, x_shape, skip_shape, d):
    feeds = {"x": np.ones(x_shape, np.float32), "skip": np.ones(skip_shape, np.float32),
             **{k: np.ones(d, np.float32) for k in ("gamma", "beta", "bias")}}
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="X must have the shape"):
        kernel.run(None, feeds)
    good = {"x": np.ones((1, 2, 4), np.float32), "skip": np.ones((2, 4), np.float32),
            **{k: np.ones(4, np.float32) for k in ("gamma", "beta", "bias")}}
    assert kernel.run(None, good)[0].shape == (1, 2, 4)  # the session stays usable


def _stock(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so).run(None, feeds)


def _native_session(model, ids):
    fused, report = fuse(model, ids, kernels="native")
    ops = native_op_types(fused)
    assert OP in ops, report.reason
    return fused, report, ort.InferenceSession(fused.SerializeToString(), native_options(ops))


def _close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("decomposed, skip_shape", [(True, (2, 5, 8)), (False, (2, 5, 8)), (False, (1, 5, 8))])
def test_native_kernel_matches_stock_on_the_rule_examples(decomposed, skip_shape):
    model = skip_layernorm._residual_ln(decomposed, skip_shape=skip_shape)
    fused, report, session = _native_session(model, ["skip_layernorm"])
    assert len(report.fused) == 1 and [n.op_type for n in fused.graph.node] == ["MatMul", OP]
    rng = np.random.default_rng(4)
    feeds = {"x": rng.uniform(-3, 3, (2, 5, 8)).astype(np.float32),
             "skip": rng.uniform(-3, 3, skip_shape).astype(np.float32)}
    _close(session.run(None, feeds)[0], _stock(model, feeds)[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm_encoder", "minilm_encoder_dynamo"])
def test_zoo_encoders_with_the_native_kernel(name):
    from ortfuse import models

    model = models.make(name)
    fused, report, session = _native_session(model, ["skip_layernorm"])
    assert sum(m.pattern_id == "skip_layernorm" for m in report.fused) == 13, report.reason
    rng = np.random.default_rng(6)
    mask = np.ones((2, 30), np.int64)
    mask[1, 21:] = 0
    feeds = {"input_ids": rng.integers(0, 30522, (2, 30)), "token_type_ids": rng.integers(0, 2, (2, 30)),
             "attention_mask": mask}
    _close(session.run(None, feeds)[0], _stock(model, feeds)[0])
