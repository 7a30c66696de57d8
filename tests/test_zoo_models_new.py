"""The exporter-shaped zoo models: pplcnet_classifier, crnn_recognizer, minilm_encoder.

Each builds, passes the checker and strict shape inference, runs on stock ORT with ORT_ENABLE_ALL
equal to ORT_DISABLE_ALL, and fused by ortfuse (``fusion=True``) equal to ORT_DISABLE_ALL.
Tolerance: |got - ref| <= 1e-4 + 1e-4 * |ref| elementwise (rtol = atol = 1e-4); pplcnet's logits
reach |33|, where ORT's own folding of BN into the Conv moves float32 rounding by ~1e-5.
The feeds are built here (valid token ids, a padded attention mask), not by ``sample_inputs``.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from test_models_zoo import _attr, _constants, _consumers, _dims, _ops, _producers

import ortfuse
from ortfuse import models
from ortfuse.models import crnn, minilm, pplcnet, registry

NEW = ("pplcnet_classifier", "crnn_recognizer", "minilm_encoder")
OPSETS = {"pplcnet_classifier": pplcnet.OPSET, "crnn_recognizer": crnn.OPSET, "minilm_encoder": minilm.OPSET}
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Build the three models once into a temporary cache; name -> (path, ModelProto)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ORTFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("zoo_new")))
    try:
        yield {name: (str(path), onnx.load(path)) for name in NEW for path in [models.build(name)]}
    finally:
        mp.undo()


def _session(model_or_path, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    source = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) else model_or_path
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def _feeds(name: str, batch: int = 2, width: int = 320, seq: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "pplcnet_classifier":
        return {"input": rng.standard_normal((batch, 3, 224, 224), dtype=np.float32)}
    if name == "crnn_recognizer":
        return {"input": rng.standard_normal((batch, 3, crnn.HEIGHT, width), dtype=np.float32)}
    mask = np.ones((batch, seq), np.int64)
    mask[-1, seq * 3 // 4 :] = 0  # the last row is padded
    return {
        "input_ids": rng.integers(0, minilm.VOCAB, (batch, seq)),
        "token_type_ids": rng.integers(0, minilm.TOKEN_TYPES, (batch, seq)),
        "attention_mask": mask,
    }


# -- every model -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_checker_shapes_opset_and_input_types(name, built):
    _, model = built[name]
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSETS[name])]
    spec = registry.get(name)
    assert {i.name: _dims(i) for i in model.graph.input} == spec.inputs
    assert {o.name: _dims(o) for o in inferred.graph.output} == spec.outputs
    for vi in model.graph.input:
        assert vi.type.tensor_type.elem_type == spec.dtypes.get(vi.name, onnx.TensorProto.FLOAT)
    assert model.graph.name == name and models.describe(name) in model.doc_string


@pytest.mark.parametrize("name", NEW)
def test_generation_is_deterministic(name, built):
    path, _ = built[name]
    with open(path, "rb") as f:
        assert models.make(name).SerializeToString() == f.read()


@pytest.mark.parametrize("name", NEW)
def test_stock_ort_enable_all_agrees_with_disable_all(name, built):
    path, _ = built[name]
    feeds = _feeds(name)
    (ref,) = _session(path).run(None, feeds)
    (opt,) = _session(path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL).run(None, feeds)
    np.testing.assert_allclose(opt, ref, **TOL)
    assert np.isfinite(ref).all()
    # the output depends on the input: the two batch rows differ clearly
    spread = float(np.abs(ref[0] - ref[1]).mean())
    assert spread > 0.05 * float(np.abs(ref).mean()), spread


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "minilm_encoder" else n for n in NEW])
def test_ortfuse_fusion_true_matches_stock_disable_all(name, built):
    path, _ = built[name]
    widths = (320, 100) if name == "crnn_recognizer" else (320,)
    sess = ortfuse.InferenceSession(path, fusion=True)
    assert sess.fusion_report.applied, sess.fusion_report.table()
    for width in widths:
        feeds = _feeds(name, width=width)
        (ref,) = _session(path).run(None, feeds)
        (got,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, ref, **TOL, err_msg=f"width {width}")


# -- pplcnet_classifier ----------------------------------------------------------------------------
def test_pplcnet_structure(built):
    _, model = built["pplcnet_classifier"]
    ops, prod, uses, values = _ops(model), _producers(model), _consumers(model), _constants(model)
    # HardSwish is the op: 27 Conv+BN+HardSwish and the last 1x1 Conv; no decomposed form
    assert ops["HardSwish"] == 28 and "Clip" not in ops
    assert ops["BatchNormalization"] == 27 and ops["Conv"] == 32
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    for bn in bns:
        conv = prod[bn.input[0]]
        assert conv.op_type == "Conv" and len(conv.input) == 2, "bias-free Conv before BN"
        assert [u.op_type for u in uses[bn.output[0]]] == ["HardSwish"]
    depthwise = [n for n in model.graph.node if n.op_type == "Conv" and _attr(n, "group", 1) > 1]
    assert len(depthwise) == len(pplcnet.BLOCKS) == 13
    assert collections.Counter(_attr(n, "kernel_shape")[0] for n in depthwise) == {3: 6, 5: 7}
    for conv in depthwise:
        assert values[conv.input[1]].shape[:2] == (_attr(conv, "group"), 1)
    # squeeze-excite in the last two blocks
    se = [n for n in model.graph.node if n.op_type == "GlobalAveragePool" and "/se/" in n.name]
    assert len(se) == 2
    for gap in se:
        chain, t = [], gap.output[0]
        for _ in range(5):
            (node,) = uses[t]
            chain.append(node.op_type)
            t = node.output[0]
        assert chain == ["Conv", "Relu", "Conv", "HardSigmoid", "Mul"] and gap.input[0] in node.input
    # head: GlobalAveragePool -> Conv 1280 -> HardSwish -> Flatten -> Gemm [1280, 1000]
    (gemm,) = [n for n in model.graph.node if n.op_type == "Gemm"]
    chain = [gemm]
    while chain[-1].op_type != "GlobalAveragePool":
        chain.append(prod[chain[-1].input[0]])
    assert [n.op_type for n in reversed(chain)] == ["GlobalAveragePool", "Conv", "HardSwish", "Flatten", "Gemm"]
    assert values[gemm.input[1]].shape == (1280, 1000) and _attr(gemm, "transB", 0) == 0
    params = sum(math.prod(t.dims) for t in model.graph.initializer)
    assert 2.9e6 < params < 3.1e6  # PP-LCNet x1.0: 2.96M parameters plus BN running stats


# -- crnn_recognizer -------------------------------------------------------------------------------
def test_crnn_structure(built):
    _, model = built["crnn_recognizer"]
    ops, prod, uses, values = _ops(model), _producers(model), _consumers(model), _constants(model)
    assert "HardSwish" not in ops  # opset 11 has no HardSwish op
    # HardSwish as HardSigmoid(1/6, 0.5) -> Mul(x): every depthwise and pointwise conv of the blocks
    swish = [
        n
        for n in model.graph.node
        if n.op_type == "HardSigmoid"
        and [u.op_type for u in uses[n.output[0]]] == ["Mul"]
        and n.input[0] in uses[n.output[0]][0].input
    ]
    assert len(swish) == 2 * len(crnn.BLOCKS)
    # and as Add(3) -> Clip(0, 6) -> Div(6) -> Mul(x): stem, neck conv, mixer
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    assert len(clips) == 3
    for clip in clips:
        assert prod[clip.input[0]].op_type == "Add" and values[clip.input[2]] == 6.0
    # strides (2, 1) halve the height only
    strides = [tuple(_attr(n, "strides")) for n in model.graph.node if n.op_type == "Conv" and _attr(n, "strides")]
    assert strides.count((2, 1)) == 3 and strides.count((2, 2)) == 1
    # every Reshape target is built at run time: Concat of Shape -> Gather -> Unsqueeze pieces
    reshapes = [n for n in model.graph.node if n.op_type == "Reshape"]
    assert len(reshapes) == 3
    sources = []
    for reshape in reshapes:
        concat = prod[reshape.input[1]]
        assert concat.op_type == "Concat"
        shapes = set()
        for piece in concat.input:
            if piece in values:
                continue
            unsqueeze = prod[piece]
            gather = prod[unsqueeze.input[0]]
            shape = prod[gather.input[0]]
            assert (unsqueeze.op_type, gather.op_type, shape.op_type) == ("Unsqueeze", "Gather", "Shape")
            shapes.add(shape.input[0])
        (source,) = shapes
        sources.append((source, reshape.input[0]))
    # the neck's Reshape to [0, H, W', C] takes its dims from a tensor other than the one it reshapes
    assert sum(source != data for source, data in sources) == 1
    (softmax,) = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert _attr(softmax, "axis") == 2 and softmax.output[0] == "output"


def test_crnn_runs_at_any_width(built):
    path, _ = built["crnn_recognizer"]
    sess = _session(path)
    for width, steps in ((320, 80), (100, 25), (33, 8)):
        (y,) = sess.run(None, _feeds("crnn_recognizer", width=width))
        assert y.shape == (2, steps, crnn.CLASSES)
        np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)
        assert float(y.max(axis=-1).mean()) > 3.0 / crnn.CLASSES  # not a uniform distribution


def test_crnn_reshape_targets_frozen_at_one_width_fail_at_another(built):
    """What a tool that bakes the sample width into the graph gets: the model with every Reshape target
    replaced by its value at width 320 still runs at 320 and fails at 100, where the original runs."""
    path, model = built["crnn_recognizer"]
    targets = [n.input[1] for n in model.graph.node if n.op_type == "Reshape"]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in targets)
    feeds = _feeds("crnn_recognizer", width=320)
    out, *values = _session(probe).run(None, feeds)
    assert [v.tolist() for v in values] == [[2, 128, -1], [0, 1, 80, 128], [2, 128, 80]]
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    frozen.graph.initializer.extend(numpy_helper.from_array(v, t) for t, v in zip(targets, values))
    kept = [n for n in frozen.graph.node if not set(n.output) & set(targets)]
    del frozen.graph.node[:]
    frozen.graph.node.extend(kept)
    frozen_sess = _session(frozen)
    np.testing.assert_array_equal(frozen_sess.run(None, feeds)[0], out)
    narrow = _feeds("crnn_recognizer", width=100)
    with pytest.raises(Exception, match=r"Input shape:\{2,25,128\}, requested shape:\{2,1,80,128\}"):
        frozen_sess.run(None, narrow)
    assert _session(path).run(None, narrow)[0].shape == (2, 25, crnn.CLASSES)


# -- minilm_encoder --------------------------------------------------------------------------------
def test_minilm_structure(built):
    _, model = built["minilm_encoder"]
    ops, prod, uses, values = _ops(model), _producers(model), _consumers(model), _constants(model)
    assert "LayerNormalization" not in ops and "Gelu" not in ops and "Attention" not in ops
    assert ops["Erf"] == 6 and ops["Softmax"] == 6 and ops["MatMul"] == 6 * 8
    assert ops["ReduceMean"] == 2 * 13 and ops["Sqrt"] == 13 and ops["Reshape"] == 6 * 4
    gathers = {n.input[0]: n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in values}
    tables = {name: values[name].shape for name in gathers}
    assert tables == {
        "embeddings.word_embeddings.weight": (30522, 384),
        "embeddings.token_type_embeddings.weight": (2, 384),
        "embeddings.position_embeddings.weight": (512, 384),
    }
    assert gathers["embeddings.word_embeddings.weight"].input[1] == "input_ids"
    assert gathers["embeddings.token_type_embeddings.weight"].input[1] == "token_type_ids"
    # positions: Slice(position_ids[1, 512], [0], Unsqueeze(Gather(Shape(input_ids), 1)), axes [1])
    (slice_,) = [n for n in model.graph.node if n.op_type == "Slice"]
    assert gathers["embeddings.position_embeddings.weight"].input[1] == slice_.output[0]
    assert values[slice_.input[0]].tolist() == [list(range(512))]
    gather = prod[prod[slice_.input[2]].input[0]]
    assert prod[gather.input[0]].input[0] == "input_ids" and values[gather.input[1]] == 1
    # mask: Unsqueeze -> Unsqueeze -> Cast(float) -> Sub(1, .) -> Mul(finfo.min), added to every layer's scores
    chain, t = [], "attention_mask"
    for _ in range(5):
        (node,) = uses[t]
        chain.append(node)
        t = node.output[0]
    assert [n.op_type for n in chain] == ["Unsqueeze", "Unsqueeze", "Cast", "Sub", "Mul"]
    assert values[chain[3].input[0]] == 1.0 and values[chain[4].input[1]] == np.finfo(np.float32).min
    mask_adds = uses[chain[-1].output[0]]
    assert len(mask_adds) == 6 and all(prod[a.input[0]].op_type == "Div" for a in mask_adds)
    assert all(values[prod[a.input[0]].input[1]] == pytest.approx(math.sqrt(32)) for a in mask_adds)
    # Linear as Add(bias, MatMul(x, W)), the exporter's operand order
    for matmul in (n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in values):
        (add,) = uses[matmul.output[0]]
        assert add.op_type == "Add" and list(add.input) == [add.input[0], matmul.output[0]]
        assert add.input[0] in values


def test_minilm_token_type_out_of_range_fails_on_stock_ort(built):
    path, _ = built["minilm_encoder"]
    feeds = _feeds("minilm_encoder")
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        sess = _session(path, level)
        (y,) = sess.run(None, feeds)
        assert y.shape == (2, 64, 384) and np.isfinite(y).all()
        bad = dict(feeds, token_type_ids=np.full_like(feeds["token_type_ids"], 5))
        with pytest.raises(Exception, match="out of data bounds"):
            sess.run(None, bad)


def test_minilm_attention_mask_hides_padding(built):
    """Changing the ids at masked positions leaves the unmasked positions' outputs unchanged."""
    path, _ = built["minilm_encoder"]
    sess = _session(path)
    feeds = _feeds("minilm_encoder")
    (y,) = sess.run(None, feeds)
    ids = feeds["input_ids"].copy()
    padded = feeds["attention_mask"][-1] == 0
    ids[-1, padded] = (ids[-1, padded] + 1000) % minilm.VOCAB
    (z,) = sess.run(None, dict(feeds, input_ids=ids))
    np.testing.assert_allclose(z[-1, ~padded], y[-1, ~padded], rtol=1e-5, atol=1e-5)
    assert np.abs(z[-1, padded] - y[-1, padded]).max() > 0.1
    np.testing.assert_array_equal(z[0], y[0])
