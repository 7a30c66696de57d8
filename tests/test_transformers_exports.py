"""Real exporter output: transformers' own BertModel (2 layers, hidden 384, 12 heads of 32) as torch's
TorchScript (opset 14) and dynamo (opset 18) exporters write it, committed under tests/fixtures/
(tests/fixtures/README.md: the command, torch and transformers versions). No torch needed here.

For each export: the fusion report (every attention, layernorm, Gelu and GEMM candidate fused,
none rejected), what ORT runs of the fused model at ORT_ENABLE_ALL (com.microsoft:Attention per
layer, no Softmax; no more NCHWc reorders than stock, the layout guarantee of
tests/test_layout_guarantee.py), and the outputs of ``fusion=True`` against stock ORT at
ORT_DISABLE_ALL within 1e-4 of max |ref| at several batch and sequence sizes, with padded keys and
one sequence whose every key is masked. Then the export mutated where a rule must refuse it: the
split-heads target reading the batch from the sequence axis (a different Reshape), and a head size
that does not divide the hidden size (ORT's Reshape fails; so does the fused session).
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import ortfuse
from ortfuse import fuse
from ortfuse.fusion.report import FUSED
from ortfuse.kernel_choice import registry

import weightless_fixtures
from pattern_graphs import CPU, run_stock

FIXTURES = Path(__file__).parent / "fixtures"
EXPORTS = {"torchscript": "bert-L2-random-torchscript-opset14.onnx", "dynamo": "bert-L2-random-dynamo-opset18.onnx"}
LAYERS, VOCAB, MAX_POSITION, HIDDEN = 2, 1000, 128, 384
# per layer: attention, its two residual LayerNorms, the FFN's MatMul + Add + Gelu; one embedding LayerNorm
EXPECTED = {"attention": LAYERS, "skip_layernorm": 2 * LAYERS, "gemm_act": LAYERS, "embed_layernorm": 1}
SIZES = [(1, 1), (1, 7), (3, 20), (2, MAX_POSITION)]  # (batch, sequence)
ORT_ERRORS = (ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.RuntimeException,
              ort.capi.onnxruntime_pybind11_state.InvalidArgument)


@pytest.fixture(scope="module", params=list(EXPORTS))
def export(request) -> tuple[str, onnx.ModelProto]:
    return request.param, weightless_fixtures.load(FIXTURES / EXPORTS[request.param])


def _feeds(batch: int, seq: int, seed: int = 0, all_masked: bool = False) -> dict[str, np.ndarray]:
    """Token ids in the vocabulary; the first sequence's last keys padded; ``all_masked``: the last
    sequence's every key masked (an empty sequence, a row of -inf where the mask is -inf)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq - seq // 3:] = 0
    if all_masked:
        mask[-1, :] = 0
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)), "attention_mask": mask,
            "token_type_ids": rng.integers(0, 2, (batch, seq))}


def _close(got: np.ndarray, ref: np.ndarray, rtol: float = 1e-4) -> None:
    assert np.isfinite(ref).all() and np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=0, atol=rtol * max(1.0, float(np.abs(ref).max())))


def _optimized_ops(tmp_path: Path, label: str, make_session) -> collections.Counter:
    """Op census (``domain:op_type``) of the graph ORT optimizes at ORT_ENABLE_ALL, as ORT saves it."""
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / f"{label}.onnx")
    make_session(so)
    return collections.Counter(f"{n.domain}:{n.op_type}" for n in onnx.load(so.optimized_model_filepath).graph.node)


def test_fixtures_say_how_they_were_made(export):
    _, model = export
    assert model.doc_string.startswith("made by: python tools/export_encoder.py --layers 2"), model.doc_string
    assert "torch " in model.doc_string and "transformers " in model.doc_string
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    for vi in model.graph.input:  # dynamic batch and sequence
        assert [d.dim_value for d in vi.type.tensor_type.shape.dim] == [0, 0], vi


def test_every_encoder_pattern_is_fused(export):
    """Attention, the residual and embedding LayerNorms, and the FFN's MatMul + Add + erf-Gelu: every
    candidate of those patterns fused, none rejected."""
    name, model = export
    _, report = fuse(model)
    ours = [m for m in report.matches if m.pattern_id in EXPECTED]
    rejected = [(m.pattern_id, m.reason) for m in ours if m.decision != FUSED]
    assert not rejected, report.table()
    assert collections.Counter(m.pattern_id for m in ours) == EXPECTED, report.table()
    attention = [m for m in ours if m.pattern_id == "attention"]
    # TorchScript writes the mask as Where(m, 0, -inf): the graph's Where(IsNaN(p), 0, p) after the
    # Softmax is kept (after the fused op, one native pass where the native path exists); dynamo
    # writes finfo.min: nothing to keep
    guard = " + ai.onnx.contrib:FusedNanToZero" if "FusedNanToZero" in registry._native_ops() else " + IsNaN + Where"
    ending = "com.microsoft:Attention" + (guard if name == "torchscript" else "")
    assert all(m.kernel.endswith(ending) for m in attention), report.table()


def test_ort_runs_one_attention_op_per_layer_and_keeps_the_layout(export, tmp_path):
    _, model = export
    fused, _ = fuse(model)
    stock = _optimized_ops(tmp_path, "stock", lambda so: ort.InferenceSession(model.SerializeToString(), so,
                                                                               providers=CPU))
    ours = _optimized_ops(tmp_path, "fused", lambda so: ortfuse.InferenceSession(fused.SerializeToString(), so,
                                                                                  providers=CPU))
    assert stock[":Softmax"] == LAYERS, stock  # ORT's own passes fuse no attention of these exports
    assert ours["com.microsoft:Attention"] == LAYERS and ours[":Softmax"] == 0, ours
    reorders = [f"com.microsoft.nchwc:{op}" for op in ("ReorderInput", "ReorderOutput")]
    assert sum(ours[r] for r in reorders) <= sum(stock[r] for r in reorders)


@pytest.mark.parametrize("batch, seq", SIZES)
def test_fused_outputs_match_stock(export, batch, seq):
    _, model = export
    session = ortfuse.InferenceSession(model.SerializeToString(), providers=CPU, fusion=True)
    assert session.fusion_report.counts()["attention"] == LAYERS
    feeds = _feeds(batch, seq)
    _close(session.run(None, feeds)[0], run_stock(model, feeds)[0])


@pytest.mark.parametrize("kernels", ["lowered:attention_bias", "lowered:mha_bias", "lowered-only", "reference"])
def test_a_sequence_with_every_key_masked(export, kernels):
    """Every key of one sequence masked: TorchScript's -inf mask makes its Softmax rows NaN, which
    the graph sets to 0 (attention output 0); dynamo's finfo.min mask gives a uniform row. Each form
    the registry offers without the native core gives stock's outputs, its guard native where the
    native path exists and ORT's IsNaN + Where where only ORT's own ops are wanted (lowered-only)."""
    name, model = export
    fused, report = fuse(model, ["attention"], kernels=kernels)
    assert len(report.fused) == LAYERS, report.table()
    guards = collections.Counter(n.op_type for n in fused.graph.node)
    native = "FusedNanToZero" in registry._native_ops() and kernels.startswith("lowered:")
    if name == "torchscript" and kernels != "reference":
        assert (guards["FusedNanToZero"], guards["IsNaN"]) == ((LAYERS, 0) if native else (0, LAYERS)), guards
    feeds = _feeds(3, 12, seed=1, all_masked=True)
    session = ortfuse.InferenceSession(fused.SerializeToString(), providers=CPU)
    _close(session.run(None, feeds)[0], run_stock(model, feeds)[0])


# -- the exports mutated where the attention rule must refuse ----------------------------------------
def _split_target(model: onnx.ModelProto, layer: int = 0) -> onnx.NodeProto:
    """The Concat building the query's split-heads Reshape target in ``layer``."""
    producer = {o: n for n in model.graph.node for o in n.output}
    weights = {t.name for t in model.graph.initializer}
    queries = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights
               and n.input[1] and producer.get(n.input[0]) is not None]
    readers = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            readers[i].append(n)
    targets = []
    for mm in queries:  # MatMul -> Add -> Reshape(., Concat)
        for add in readers[mm.output[0]]:
            for reshape in readers[add.output[0]]:
                if reshape.op_type == "Reshape" and producer[reshape.input[1]].op_type == "Concat":
                    targets.append(producer[reshape.input[1]])
    return targets[3 * layer]


def test_batch_read_from_the_sequence_axis_is_refused(export):
    """Target [S, S, -1, 32] (the batch's piece replaced by the sequence's): not the fused op's
    [B, S, 12, 32], so that layer's attention is rejected with the reason; the others still fuse."""
    name, original = export
    model = onnx.ModelProto()
    model.CopyFrom(original)
    concat = _split_target(model)
    concat.input[0] = concat.input[1]
    _, report = fuse(model, ["attention"])
    rejected = [m.reason for m in report.matches if m.decision != FUSED]
    assert rejected and all("entry 0 of its target" in r and "is not provably the batch" in r for r in rejected), \
        report.table()
    # dynamo's export shares one target among every layer's Q, K and V: all refused
    assert len(report.fused) == (LAYERS - 1 if name == "torchscript" else 0), report.table()


def test_head_size_not_dividing_the_hidden_size_is_refused(export):
    """Target [B, S, -1, 5] over 384 columns: rejected with the reason; stock ORT's Reshape fails on
    it, and so does the session ortfuse builds."""
    _, original = export
    model = onnx.ModelProto()
    model.CopyFrom(original)
    concat = _split_target(model)
    model.graph.initializer.append(numpy_helper.from_array(np.array([5], np.int64), "head_size_5"))
    concat.input[3] = "head_size_5"
    _, report = fuse(model, ["attention"])
    reasons = [m.reason for m in report.matches if m.decision != FUSED]
    assert any(f"the head size 5 does not divide the projection's {HIDDEN} columns" in r for r in reasons), \
        report.table()
    feeds = _feeds(1, 6)
    with pytest.raises(ORT_ERRORS):
        run_stock(model, feeds)
    with pytest.raises(ORT_ERRORS):
        ortfuse.InferenceSession(model.SerializeToString(), providers=CPU, fusion=True).run(None, feeds)
