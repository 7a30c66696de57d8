"""The exporter-shaped CNN detectors of the zoo: db_text_detector, picodet_layout, yolov8n.

Each builds, passes the checker and strict shape inference, runs on stock ORT with ORT_ENABLE_ALL
equal to ORT_DISABLE_ALL, keeps its outputs input-dependent, and has the structures of the network it
imitates (counted op by op). Fused by ortfuse (``fusion=True``) it equals ORT_DISABLE_ALL.
Tolerance: |got - ref| <= 1e-4 + 1e-4 * |ref| elementwise (rtol = atol = 1e-4): box coordinates reach
~1000 pixels, where float32 rounding of ORT's own Conv+BN folding moves them by ~1e-4 absolute.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from test_models_zoo import _attr, _constants, _consumers, _ops, _producers

import ortfuse
from ortfuse import models
from ortfuse.models import layers, picodet, yolov8
from ortfuse.models.builder import GraphBuilder

NAMES = ("db_text_detector", "picodet_layout", "yolov8n")
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def built():
    """The three models, generated once in memory; name -> (serialized bytes, ModelProto)."""
    return {name: (model.SerializeToString(), model) for name in NAMES for model in [models.make(name)]}


def _stock(model: bytes | onnx.ModelProto, level):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 2
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _reference(model: bytes, feeds):
    return _stock(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feeds)


# -- graph helpers (the rest come from test_models_zoo) ---------------------------------------
def _single_uses(uses, node, steps):
    """The chain of ``steps`` nodes after ``node``, each the only consumer of the one before."""
    chain = [node]
    for _ in range(steps):
        (nxt,) = uses[chain[-1].output[0]]
        chain.append(nxt)
    return chain[1:]


def _paddle_hardswish(model):
    """How many HardSwish chains Paddle2ONNX-style (below opset 14) follow a BatchNormalization:
    Add(x, 3) -> Clip(0, 6) -> Mul(x, .) -> Div(6). Every Clip must be one."""
    prod, uses, values = _producers(model), _consumers(model), _constants(model)
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    for clip in clips:
        add = prod[clip.input[0]]
        assert add.op_type == "Add" and values[add.input[1]] == 3.0
        assert (values[clip.input[1]], values[clip.input[2]]) == (0.0, 6.0)
        (mul,) = uses[clip.output[0]]
        assert mul.op_type == "Mul" and list(mul.input) == [add.input[0], clip.output[0]]
        (div,) = uses[mul.output[0]]
        assert div.op_type == "Div" and values[div.input[1]] == 6.0
        assert prod[add.input[0]].op_type == "BatchNormalization"
    return len(clips)


def _resizes(model):
    """Scale factors of every Resize (all nearest, asymmetric, floor: the exporters' Upsample)."""
    values, factors = _constants(model), []
    for r in (n for n in model.graph.node if n.op_type == "Resize"):
        assert (_attr(r, "mode"), _attr(r, "coordinate_transformation_mode"), _attr(r, "nearest_mode")) == (
            b"nearest", b"asymmetric", b"floor")
        scales = values[r.input[2]]
        assert scales[:2].tolist() == [1.0, 1.0] and scales[2] == scales[3]
        factors.append(int(scales[2]))
    return sorted(factors)


# -- validity and numerics -----------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_real_widths_give_a_few_megabytes(name, built):
    # the checker, strict shape inference and the declared shapes: test_models_zoo, for every zoo model
    data, _ = built[name]
    assert 2e6 < len(data) < 20e6


@pytest.mark.parametrize("name", NAMES)
def test_stock_levels_agree_and_outputs_depend_on_the_input(name, built):
    data, _ = built[name]
    feeds = models.sample_inputs(name, batch=1)
    ref = _reference(data, feeds)
    full = _stock(data, ort.GraphOptimizationLevel.ORT_ENABLE_ALL).run(None, feeds)
    other = _reference(data, models.sample_inputs(name, batch=1, seed=1))
    for r, f, o in zip(ref, full, other):
        assert np.isfinite(r).all()
        np.testing.assert_allclose(f, r, **TOL)
        # deep layers neither vanish to their biases nor explode: another input moves every output
        assert np.abs(o - r).std() > 0.01 * r.std()


def test_calibrated_batchnorm_normalizes_the_calibration_input():
    g = GraphBuilder("bn", seed=0)
    x = g.input("x", [1, 4, 6, 6])
    y = layers.conv_bn(g, x, 4, 8, 3, gamma=(1.0, 1.0))
    g.output(y, "y", [1, 8, 6, 6])
    model = g.model()
    layers.calibrate_batchnorm(model, (1, 4, 6, 6), seed=5)
    values = _constants(model)
    (bn,) = (n for n in model.graph.node if n.op_type == "BatchNormalization")
    beta = values[bn.input[2]]
    feed = np.random.default_rng(5).standard_normal((1, 4, 6, 6), dtype=np.float32)
    out = _stock(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, {"x": feed})[0]
    # gamma 1: each channel comes out with mean beta and unit variance (statistics rounded to 10 bits)
    np.testing.assert_allclose(out.mean(axis=(0, 2, 3)), beta, atol=5e-3)
    np.testing.assert_allclose(out.std(axis=(0, 2, 3)), 1.0, rtol=5e-3)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fused_session_matches_stock(name, built, monkeypatch, tmp_path):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))  # its plan cache
    data, _ = built[name]
    feeds = models.sample_inputs(name, batch=2)
    sess = ortfuse.InferenceSession(data, fusion=True)
    assert sess.fusion_report.applied
    for got, ref in zip(sess.run(None, feeds), _reference(data, feeds)):
        np.testing.assert_allclose(got, ref, **TOL)


# -- structure -----------------------------------------------------------------------------------
def test_db_text_detector_structure(built):
    _, model = built["db_text_detector"]
    ops, prod, uses, values = _ops(model), _producers(model), _consumers(model), _constants(model)
    assert ops["Conv"] == 88 and ops["ConvTranspose"] == 2 and ops["BatchNormalization"] == 49
    assert all(prod[n.input[0]].op_type in ("Conv", "ConvTranspose") for n in model.graph.node
               if n.op_type == "BatchNormalization")
    assert all(values[n.input[4]].min() > 0 for n in model.graph.node if n.op_type == "BatchNormalization")
    assert _paddle_hardswish(model) == 20
    # 16 squeeze-excite blocks: 8 in the backbone, one per RSE layer of the neck (x + x * se(x))
    assert ops["GlobalAveragePool"] == ops["HardSigmoid"] == 16
    for gap in (n for n in model.graph.node if n.op_type == "GlobalAveragePool"):
        chain = _single_uses(uses, gap, 5)
        assert [n.op_type for n in chain] == ["Conv", "Relu", "Conv", "HardSigmoid", "Mul"]
        assert gap.input[0] in chain[-1].input and _attr(chain[-2], "alpha") == pytest.approx(0.2)
    rse = [n for n in model.graph.node if n.op_type == "Add" and getattr(prod.get(n.input[1]), "op_type", "") == "Mul"]
    assert len(rse) == 8
    depthwise = [n for n in model.graph.node if n.op_type == "Conv" and _attr(n, "group", 1) > 1]
    assert len(depthwise) == 15 and {tuple(_attr(n, "kernel_shape")) for n in depthwise} == {(3, 3), (5, 5)}
    # FPN: three x2 top-down upsamplings into Adds, then x8, x4, x2 to stride 4 and one Concat of 4
    assert _resizes(model) == [2, 2, 2, 2, 4, 8]
    (cat,) = (n for n in model.graph.node if n.op_type == "Concat")
    assert len(cat.input) == 4 and all(prod[i].op_type in ("Resize", "Add") for i in cat.input)
    # DB head: ConvTranspose 2x2 s2 twice, Sigmoid at full resolution
    for ct in (n for n in model.graph.node if n.op_type == "ConvTranspose"):
        assert _attr(ct, "strides") == [2, 2] and _attr(ct, "kernel_shape") == [2, 2]
    (sig,) = (n for n in model.graph.node if n.op_type == "Sigmoid")
    assert sig.output[0] == "output" and prod[sig.input[0]].op_type == "ConvTranspose"


def test_picodet_layout_structure(built):
    _, model = built["picodet_layout"]
    ops, prod, uses, values = _ops(model), _producers(model), _consumers(model), _constants(model)
    assert len(model.graph.initializer) == 0
    assert all(prod[n.input[1]].op_type == "Constant" for n in model.graph.node if n.op_type == "Conv")
    assert _paddle_hardswish(model) == 94
    assert ops["BatchNormalization"] == 98 and ops["Conv"] == 114
    depthwise = [n for n in model.graph.node if n.op_type == "Conv" and _attr(n, "group", 1) > 1]
    assert len(depthwise) == 13 + 4 + 4 + 4 * 4  # backbone, CSP bottlenecks, stride-2 neck convs, head
    # CSP-PAN: two x2 upsamplings, each concatenated with a lateral level
    assert _resizes(model) == [2, 2]
    for r in (n for n in model.graph.node if n.op_type == "Resize"):
        assert values[r.input[1]].size == 0  # an empty Constant roi, as Paddle2ONNX writes it
        assert [u.op_type for u in uses[r.output[0]]] == ["Concat"]
    # GFL head: Sigmoid class scores; Softmax over 8 distance bins, MatMul with 0..7
    softmaxes = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert len(softmaxes) == 4 and all(_attr(s, "axis") == -1 for s in softmaxes)
    for s in softmaxes:
        (matmul,) = uses[s.output[0]]
        assert matmul.op_type == "MatMul" and values[matmul.input[1]].ravel().tolist() == list(range(8))
    cls = [n for n in model.graph.node if n.op_type == "Sigmoid" and uses[n.output[0]][0].op_type == "Reshape"]
    assert len(cls) == 4 and ops["Sigmoid"] == 12  # 4 class scores, 4 ESE gates, 4 SiLU
    assert picodet.ANCHORS == 100 * 76 + 50 * 38 + 25 * 19 + 13 * 10


def test_yolov8n_structure(built):
    _, model = built["yolov8n"]
    ops, prod, uses, values = _ops(model), _producers(model), _consumers(model), _constants(model)
    assert "BatchNormalization" not in ops  # the torch export folds BN into the Conv bias
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 64 and sum(len(c.input) == 3 for c in convs) == 63  # all but the DFL Conv have a bias
    # SiLU as Sigmoid -> Mul(x, .) after every Conv but the 9 head outputs and the DFL Conv
    silus = 0
    for sig in (n for n in model.graph.node if n.op_type == "Sigmoid"):
        (mul,) = uses[sig.output[0]] if len(uses[sig.output[0]]) == 1 else (None,)
        if mul is not None and mul.op_type == "Mul" and list(mul.input) == [sig.input[0], sig.output[0]]:
            assert prod[sig.input[0]].op_type == "Conv"
            silus += 1
    assert silus == 57 and ops["Sigmoid"] == 58
    # C2f: Split in halves; 6 residual bottlenecks in the backbone, none in the neck
    splits = [n for n in model.graph.node if n.op_type == "Split"]
    c2f = [s for s in splits if prod[s.input[0]].op_type == "Mul"]
    assert len(c2f) == 8 and all(len(s.output) == 2 and _attr(s, "axis") == 1 for s in c2f)
    residual = [n for n in model.graph.node if n.op_type == "Add" and not set(n.input) & set(values)]
    assert len([a for a in residual if prod[a.input[1]].op_type == "Mul"]) == 6
    # SPPF: three chained MaxPool 5x5 s1, Concat of the four
    pools = [n for n in model.graph.node if n.op_type == "MaxPool"]
    assert len(pools) == 3 and all(_attr(p, "kernel_shape") == [5, 5] and _attr(p, "strides") == [1, 1] for p in pools)
    assert prod[pools[1].input[0]] is pools[0] and prod[pools[2].input[0]] is pools[1]
    (sppf_cat,) = uses[pools[2].output[0]]
    assert sppf_cat.op_type == "Concat" and len(sppf_cat.input) == 4
    assert _resizes(model) == [2, 2] and ops["Concat"] == 19
    # DFL: Softmax over 16 bins (axis 1 after the Transpose), 1x1 Conv with weights 0..15
    (softmax,) = (n for n in model.graph.node if n.op_type == "Softmax")
    assert _attr(softmax, "axis") == 1 and prod[softmax.input[0]].op_type == "Transpose"
    (dfl,) = uses[softmax.output[0]]
    assert dfl.op_type == "Conv" and values[dfl.input[1]].ravel().tolist() == list(range(16))
    # box decode with anchor points (cell centres) and strides 8/16/32 over the 2100 anchors
    anchors, strides = yolov8._anchors()
    assert anchors.shape == (1, 2, 2100) and anchors.min() == 0.5 and anchors.max() == 39.5
    assert collections.Counter(strides.ravel().tolist()) == {8.0: 1600, 16.0: 400, 32.0: 100}
    assert {"Sub", "Div"} <= set(ops) and model.graph.output[0].name == "output0"
