"""The embed_layernorm rule (ortfuse/fusion/rules/embed_layernorm.py) and its native FusedEmbedLayerNorm
(custom_ops/native/ops/embed_layernorm.py).

Numerics: the kernel against the rule's reference (float32 sum, float64 LayerNorm) and every fused
model against the unfused one run by stock ORT at ORT_DISABLE_ALL, within 1e-5 * max(1, max |ref|)
(absolute; i.e. 1e-5 relative to the output's scale). Gather's contract, both forms: negative ids in
[-V, -1] count from the end of their table exactly as ORT's Gather takes them; an id outside
[-V, V-1], a sequence longer than the position table and id shapes that do not broadcast are ORT
errors (exceptions of onnxruntime's own types), after which the session still runs. Bad element
types, ranks and table shapes fed to the op are ORT errors naming what was expected."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from native_sessions import native_options
from onnx import TensorProto, helper

from ortfuse import fuse
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.provenance import native_op_types
from ortfuse.fusion.rules import embed_layernorm

OP = "FusedEmbedLayerNorm"
EPS = 1e-12
VOCAB = 30522  # the zoo encoders' word table
ORT_ERRORS = tuple(getattr(ort.capi.onnxruntime_pybind11_state, n) for n in ("Fail", "InvalidArgument",
                                                                             "RuntimeException"))
INVALID = ort.capi.onnxruntime_pybind11_state.InvalidArgument


def _close(got, ref):
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max(initial=0.0))))


def _op_session(ids_type: int = TensorProto.INT64, table_type: int = TensorProto.FLOAT) -> ort.InferenceSession:
    """One FusedEmbedLayerNorm node, inputs of any shape: ids of element type ``ids_type``, tables and
    vectors of ``table_type``."""
    types = [ids_type, ids_type] + [table_type] * 5
    node = helper.make_node(OP, list(embed_layernorm.INPUTS), ["y"], domain=DOMAIN, epsilon=EPS)
    graph = helper.make_graph([node], "embed", [helper.make_tensor_value_info(n, t, None) for n, t in
                                                zip(embed_layernorm.INPUTS, types)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    return ort.InferenceSession(model.SerializeToString(), native_options({OP}))


@pytest.fixture(scope="module")
def kernel():
    return _op_session()


def _tables(rng, vocab: int, types: int, positions: int, d: int) -> dict[str, np.ndarray]:
    return {"Word": rng.uniform(-1, 1, (vocab, d)).astype(np.float32),
            "Types": rng.uniform(-1, 1, (types, d)).astype(np.float32),
            "Positions": rng.uniform(-1, 1, (positions, d)).astype(np.float32),
            "Gamma": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            "Beta": (0.1 * rng.standard_normal(d)).astype(np.float32)}


# (ids shape, type ids shape, position rows, hidden): odd hidden sizes, rows over several work blocks
# (16K floats each), ids and type ids broadcasting as Add broadcasts their Gathers, one position row.
CASES = [((2, 5), (2, 5), 6, 8), ((1, 128), (1, 128), 512, 384), ((3, 70), (3, 70), 70, 37), ((1, 1), (1, 1), 1, 1),
         ((8, 100), (8, 100), 128, 100), ((4, 9), (1, 9), 9, 16), ((1, 9), (4, 9), 12, 16), ((4, 1), (4, 7), 3, 5),
         ((4, 7), (4, 1), 7, 24), ((2, 0), (2, 0), 4, 8)]


@pytest.mark.parametrize("ids_shape, tids_shape, npos, d", CASES)
def test_kernel_matches_the_reference(kernel, ids_shape, tids_shape, npos, d):
    rng = np.random.default_rng(sum(ids_shape) * 100 + d)
    vocab, types = 50, 3
    feeds = {"Ids": rng.integers(-vocab, vocab, ids_shape), "TypeIds": rng.integers(-types, types, tids_shape),
             **_tables(rng, vocab, types, npos, d)}
    got = kernel.run(None, feeds)[0]
    _close(got, embed_layernorm.reference(*feeds.values(), epsilon=EPS))


def test_a_constant_row_gives_beta(kernel):
    """Variance 0: the output row is Beta (epsilon keeps the division finite)."""
    feeds = _tables(np.random.default_rng(1), 4, 2, 3, 16)
    for name in ("Word", "Types", "Positions"):
        feeds[name][:] = 1.0
    got = kernel.run(None, {"Ids": np.array([[0, -1, 3]]), "TypeIds": np.array([[1, 0, -2]]), **feeds})[0]
    np.testing.assert_array_equal(got, np.broadcast_to(feeds["Beta"], got.shape))


def test_nan_and_inf_rows_stay_in_their_rows(kernel):
    feeds = _tables(np.random.default_rng(2), 4, 2, 3, 8)
    feeds["Word"][1, 3] = np.nan
    feeds["Word"][2, 0] = np.inf
    got = kernel.run(None, {"Ids": np.array([[0, 1, 2]]), "TypeIds": np.zeros((1, 3), np.int64), **feeds})[0]
    assert np.isfinite(got[0, 0]).all() and np.isnan(got[0, 1]).all() and not np.isfinite(got[0, 2]).any()


@pytest.mark.parametrize("which, value", [("Ids", 50), ("Ids", -51), ("TypeIds", 3), ("TypeIds", -4),
                                          ("Ids", np.iinfo(np.int64).min)])
def test_an_id_outside_its_table_is_an_ort_error(kernel, which, value):
    rng = np.random.default_rng(3)
    feeds = {"Ids": rng.integers(0, 50, (2, 6)), "TypeIds": rng.integers(0, 3, (2, 6)), **_tables(rng, 50, 3, 8, 8)}
    feeds[which][1, 4] = value
    with pytest.raises(INVALID, match="out of data bounds"):
        kernel.run(None, feeds)
    feeds[which][1, 4] = -1  # the session stays usable
    _close(kernel.run(None, feeds)[0], embed_layernorm.reference(*feeds.values(), epsilon=EPS))


@pytest.mark.parametrize("change, message", [
    ({"Ids": np.zeros(6, np.int64)}, "must be int64 tensors of rank 2"),
    ({"TypeIds": np.zeros((1, 2, 3), np.int64)}, "must be int64 tensors of rank 2"),
    ({"Word": np.zeros((5, 7), np.float32)}, "one hidden size"),
    ({"Positions": np.zeros(8, np.float32)}, "one hidden size"),
    ({"Gamma": np.zeros(9, np.float32)}, "one hidden size"),
    ({"Beta": np.zeros((1, 8), np.float32)}, "one hidden size"),
    ({"TypeIds": np.zeros((3, 3), np.int64)}, "do not broadcast"),  # batch 2 against 3
    ({"Ids": np.zeros((2, 9), np.int64), "TypeIds": np.zeros((2, 9), np.int64)}, "do not broadcast"),  # 9 > 8 rows
])
def test_bad_inputs_are_ort_errors(kernel, change, message):
    rng = np.random.default_rng(4)
    feeds = {"Ids": rng.integers(0, 5, (2, 3)), "TypeIds": rng.integers(0, 3, (2, 3)), **_tables(rng, 5, 3, 8, 8)}
    with pytest.raises(INVALID, match=message):
        kernel.run(None, {**feeds, **change})
    assert kernel.run(None, feeds)[0].shape == (2, 3, 8)


@pytest.mark.parametrize("ids_type, table_type, message", [
    (TensorProto.INT32, TensorProto.FLOAT, "got ONNX element type 6"),
    (TensorProto.FLOAT, TensorProto.FLOAT, "got ONNX element type 1"),
    (TensorProto.INT64, TensorProto.DOUBLE, "must be float32"),
])
def test_other_element_types_are_ort_errors(ids_type, table_type, message):
    session = _op_session(ids_type, table_type)
    ids = np.zeros((1, 3), onnx.helper.tensor_dtype_to_np_dtype(ids_type))
    tables = {k: v.astype(onnx.helper.tensor_dtype_to_np_dtype(table_type))
              for k, v in _tables(np.random.default_rng(5), 4, 2, 3, 8).items()}
    with pytest.raises(INVALID, match=message):
        session.run(None, {"Ids": ids, "TypeIds": ids, **tables})


# -- the rule on the zoo encoders --------------------------------------------------------------------
def _stock(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so)


@pytest.fixture(scope="module")
def encoders():
    """Per zoo encoder: (stock session, {kernel: fused session}), fused with embed_layernorm only."""
    from ortfuse import models

    out = {}
    for name in ("minilm_encoder", "minilm_encoder_dynamo"):
        model = models.make(name)
        sessions = {}
        for kernels in ("native", "lowered"):
            fused, report = fuse(model, ["embed_layernorm"], kernels=kernels)
            assert len(report.fused) == 1 and report.fused[0].pattern_id == "embed_layernorm", report.table()
            ops = native_op_types(fused)
            assert (OP in ops) == (kernels == "native"), report.table()
            outputs = {o for n in fused.graph.node for o in n.output}
            assert "/embeddings/Slice_output_0" not in outputs  # the position chain went with the match
            so = native_options(ops) if ops else ort.SessionOptions()
            sessions[kernels] = ort.InferenceSession(fused.SerializeToString(), so)
        out[name] = (_stock(model), sessions)
    return out


def _feeds(ids, type_ids=None):
    ids = np.asarray(ids, np.int64)
    return {"input_ids": ids, "token_type_ids": np.zeros_like(ids) if type_ids is None else np.asarray(type_ids),
            "attention_mask": np.ones_like(ids)}


ENCODERS = ["minilm_encoder", "minilm_encoder_dynamo"]
KERNELS = ["native", "lowered"]


@pytest.mark.slow
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("name", ENCODERS)
def test_zoo_encoders_match_stock_with_negative_ids(encoders, name, kernels):
    stock, fused = encoders[name]
    rng = np.random.default_rng(6)
    ids = rng.integers(-VOCAB, VOCAB, (2, 37))
    ids[0, :4] = [-1, -VOCAB, VOCAB - 1, 0]
    feeds = _feeds(ids, rng.integers(-2, 2, (2, 37)))
    _close(fused[kernels].run(None, feeds)[0], stock.run(None, feeds)[0])


@pytest.mark.slow
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("name", ENCODERS)
def test_zoo_encoders_fail_where_stock_fails(encoders, name, kernels):
    stock, fused = encoders[name]
    bad = [_feeds([[1, VOCAB, 3]]), _feeds([[1, -VOCAB - 1, 3]]), _feeds([[1, 2, 3]], [[0, 2, 0]]),
           _feeds(np.ones((1, 513)))]  # the last: a sequence longer than the 512 positions
    for feeds in bad:
        for session in (stock, fused[kernels]):
            with pytest.raises(ORT_ERRORS):
                session.run(None, feeds)
    with pytest.raises(INVALID, match="out of data bounds"):  # the message of ORT's Gather
        fused[kernels].run(None, bad[0])
    feeds = _feeds([[5, -5, 7]])
    _close(fused[kernels].run(None, feeds)[0], stock.run(None, feeds)[0])  # and runs on


@pytest.mark.slow
@pytest.mark.parametrize("name", ENCODERS)
@pytest.mark.parametrize("batch, seq", [(1, 128), (8, 33)])
def test_zoo_encoders_at_batch_and_length(encoders, name, batch, seq):
    stock, fused = encoders[name]
    rng = np.random.default_rng(batch + seq)
    feeds = _feeds(rng.integers(0, VOCAB, (batch, seq)), rng.integers(0, 2, (batch, seq)))
    _close(fused["native"].run(None, feeds)[0], stock.run(None, feeds)[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ENCODERS)
def test_every_pattern_leaves_the_embeddings_to_this_rule(name):
    from ortfuse import models

    _, report = fuse(models.make(name))
    taken = collections.Counter(m.pattern_id for m in report.fused)
    assert taken["embed_layernorm"] == 1 and taken["skip_layernorm"] == 12, taken


def test_a_sum_read_elsewhere_is_rejected_with_the_reason():
    model = embed_layernorm._embeddings(17)
    model.graph.output.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 5, 8]))
    _, report = fuse(model, ["embed_layernorm"])
    assert not report.fused
    assert any("'e' is a graph output" in m.reason for m in report.matches), report.table()


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("opset, dynamo, position_ids", [
    (18, True, None), (14, False, None),
    (17, True, np.array([[5, 4, 3, 2, 1, -6]])),  # folded: Positions = position[position_ids]
    (17, True, np.array([[0, 1, 2, 3, 4]])),  # fewer ids than rows: Positions = the first 5 rows
    (17, True, np.array([[-2]])),  # one position row, broadcast over the sequence
])
def test_rule_examples_match_stock(kernels, opset, dynamo, position_ids):
    model = embed_layernorm._embeddings(opset, dynamo=dynamo, position_ids=position_ids)
    fused, report = fuse(model, ["embed_layernorm"], kernels=kernels)
    assert len(report.fused) == 1, report.table()
    ops = native_op_types(fused)
    session = ort.InferenceSession(fused.SerializeToString(), native_options(ops) if ops else ort.SessionOptions())
    feeds = {"ids": np.array([[0, -1, 10, -11, 4], [3, 3, -5, 7, 9]]), "tids": np.array([[0, 1, 2, -1, -3]] * 2)}
    _close(session.run(None, feeds)[0], _stock(model).run(None, feeds)[0])
