"""Bad and odd inputs at run time, fused session against stock ORT: other shapes than at load,
zero-size dims, NaN and Inf, a 64M-float tensor, non-contiguous arrays, OrtValue and IOBinding
inputs, wrong names / dtypes / ranks / containers, shapes a kernel rejects (native op status or
numpy reference). Outputs: shape, dtype and values equal to stock ORT at ORT_DISABLE_ALL within
rtol 1e-5, atol 1e-6 (NaN exactly where ORT gives NaN); errors: the class stock ORT raises at its
default level. Extends test_session_api_parity.py ``test_run_errors_match`` (FFN model only)."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortfuse

from model_fixtures import ffn_matmul_add_relu

RTOL, ATOL = 1e-5, 1e-6


def _model(nodes, inputs, outputs, opset=17, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _const(name, value):
    return helper.make_tensor(name, TensorProto.FLOAT, [], [float(value)])


def add_relu():
    """Add of two run-time tensors with symbolic dims, then Relu -> native FusedAddRelu."""
    return _model([helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["z"])],
                  [("x", ["n", "c"]), ("y", ["c"])], [("z", ["n", "c"])])


def hardswish():
    """x * Clip(x + 3, 0, 6) / 6 -> native FusedHardSwish."""
    nodes = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
             helper.make_node("Div", ["c", "six"], ["d"]), helper.make_node("Mul", ["x", "d"], ["z"])]
    return _model(nodes, [("x", ["n", "c"])], [("z", ["n", "c"])],
                  inits=[_const("three", 3), _const("zero", 0), _const("six", 6)])


def silu():
    """x * Sigmoid(x) -> native FusedSiLU."""
    return _model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["z"])],
                  [("x", ["n", "c", "h"])], [("z", ["n", "c", "h"])])


def chain():
    """Mul(x, y) -> Sigmoid -> Neg -> Abs: a FusedEltwiseChain (numpy reference kernel)."""
    nodes = [helper.make_node("Mul", ["x", "y"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Abs", ["c"], ["z"])]
    return _model(nodes, [("x", ["n", "c"]), ("y", ["c"])], [("z", ["n", "c"])])


MODELS = {"ffn": ffn_matmul_add_relu, "add_relu": add_relu, "hardswish": hardswish, "silu": silu, "chain": chain}
PATTERN = {"ffn": "add_relu", "add_relu": "add_relu", "hardswish": "hardswish", "silu": "silu",
           "chain": "eltwise_chain"}


def _feeds(name, shape, rng, fill=None):
    """Feeds of ``name`` for the leading shape (n, c[, h]); y gets the trailing dim."""
    def arr(s):
        a = rng.standard_normal(s).astype(np.float32) * 4
        if fill is not None and a.size:
            flat = a.reshape(-1)
            flat[: min(flat.size, len(fill))] = np.float32(fill)[: flat.size]
            rng.shuffle(flat)
        return a
    if name == "ffn":
        return {"x": arr((shape[0], shape[1], 16))}
    if name == "silu":
        return {"x": arr(shape if len(shape) == 3 else (*shape, 3))}
    feeds = {"x": arr(shape[:2])}
    if name in ("add_relu", "chain"):
        feeds["y"] = arr(shape[1:2])
    return feeds


@pytest.fixture(scope="module")
def sessions():
    """name -> (stock default, stock ORT_DISABLE_ALL, ortfuse fusion=True), built once."""
    out = {}
    for name, make in MODELS.items():
        data = make().SerializeToString()
        so = onnxruntime.SessionOptions()
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        fused = ortfuse.InferenceSession(data, fusion=True)
        assert PATTERN[name] in fused.fusion_report.counts(), fused.fusion_report.table()
        out[name] = (onnxruntime.InferenceSession(data), onnxruntime.InferenceSession(data, so), fused)
    # the chain on the reference (Python-op) kernel: saved already fused with kernels="reference"
    saved = ortfuse.fuse(MODELS["chain"](), kernels="reference")[0].SerializeToString()
    out["chain_reference"] = (*out["chain"][:2], ortfuse.InferenceSession(saved))
    return out


def _assert_matches(got, ref):
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, g.dtype, r.shape, r.dtype)
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=ATOL, equal_nan=True)
        assert np.array_equal(np.isnan(g), np.isnan(r)), "NaN in other places than ORT's"


# the first is not "the load shape": none is fixed
SHAPES = [(2, 5), (1, 1), (7, 3), (33, 17), (1, 300), (4, 1), (3, 5)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shapes_change_from_run_to_run(sessions, name):
    """One session, many shapes in a row (growing, shrinking, size-1 dims): every run equals ORT."""
    _, ref, fused = sessions[name]
    rng = np.random.default_rng(0)
    for shape in SHAPES + SHAPES[::-1]:
        feeds = _feeds(name, shape, rng)
        _assert_matches(fused.run(None, feeds), ref.run(None, feeds))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)], ids=str)
def test_zero_size_dims(sessions, name, shape):
    """Empty tensors go through fused ops as through ORT's: same (empty) shapes, or the same error."""
    _, ref, fused = sessions[name]
    feeds = _feeds(name, shape, np.random.default_rng(1))
    try:
        expected = ref.run(None, feeds)
    except Exception as exc:
        with pytest.raises(type(exc)):
            fused.run(None, feeds)
        return
    _assert_matches(fused.run(None, feeds), expected)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_nan_and_inf(sessions, name):
    """NaN, +-Inf, signed zeros, huge and denormal values: ORT's results, NaN where ORT gives NaN."""
    _, ref, fused = sessions[name]
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 1e30, -1e30, 1e-40, 88.0, -88.0, 90.0, -104.0]
    rng = np.random.default_rng(2)
    for shape in ((6, 7), (13, 3)):
        feeds = _feeds(name, shape, rng, fill=specials)
        with np.errstate(all="ignore"):
            _assert_matches(fused.run(None, feeds), ref.run(None, feeds))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_non_contiguous_inputs(sessions, name):
    """Transposed, strided, negative-stride and Fortran-order views give the results of their copies."""
    _, ref, fused = sessions[name]
    rng = np.random.default_rng(3)
    base = _feeds(name, (9, 8), rng)
    views = []
    for key, a in base.items():
        big = np.repeat(np.repeat(a, 2, axis=0), 1, axis=-1) if a.ndim > 1 else np.repeat(a, 2)
        views.append({**base, key: big[::2]})                    # strided rows
        views.append({**base, key: a[::-1]})                     # negative stride
        views.append({**base, key: np.asfortranarray(a)})        # Fortran order
        if a.ndim == 2:
            views.append({**base, key: np.ascontiguousarray(a.T).T})  # transposed view of a copy
    assert any(not v.flags.c_contiguous for f in views for v in f.values())
    for feeds in views:
        contiguous = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
        _assert_matches(fused.run(None, feeds), ref.run(None, contiguous))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ortvalue_and_iobinding_inputs(sessions, name):
    """run_with_ort_values and IOBinding (bound inputs, outputs bound by name) give ORT's numbers."""
    _, ref, fused = sessions[name]
    feeds = _feeds(name, (4, 6), np.random.default_rng(4))
    expected = ref.run(None, feeds)
    values = {k: ortfuse.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
    _assert_matches([v.numpy() for v in fused.run_with_ort_values(None, values)], expected)
    binding = fused.io_binding()
    for k, v in feeds.items():
        binding.bind_cpu_input(k, v)
    for out in fused.get_outputs():
        binding.bind_output(out.name)
    fused.run_with_iobinding(binding)
    _assert_matches(binding.copy_outputs_to_cpu(), expected)


def test_64m_floats_through_a_fused_elementwise_op(sessions):
    """A 64M-float (256 MiB) tensor through native FusedAddRelu: bit-identical to ORT's Add+Relu."""
    _, ref, fused = sessions["add_relu"]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8192, 8192), dtype=np.float32)
    y = rng.standard_normal(8192, dtype=np.float32)
    got = fused.run(None, {"x": x, "y": y})[0]
    want = ref.run(None, {"x": x, "y": y})[0]
    assert got.shape == (8192, 8192) and np.array_equal(got, want)
    del got, want, x
    gc.collect()


BAD_FEEDS = {
    "wrong_name": lambda f: {"nope" if k == "x" else k: v for k, v in f.items()},
    "missing": lambda f: {k: v for k, v in f.items() if k != "x"},
    "float64": lambda f: {**f, "x": f["x"].astype(np.float64)},
    "float16": lambda f: {**f, "x": f["x"].astype(np.float16)},
    "int32": lambda f: {**f, "x": f["x"].astype(np.int32)},
    "rank_up": lambda f: {**f, "x": f["x"][None]},
    "rank_down": lambda f: {**f, "x": f["x"][0]},
    "list": lambda f: {**f, "x": f["x"].tolist()},
    "none": lambda f: {**f, "x": None},
    "strings": lambda f: {**f, "x": np.array([["a"]])},
    "not_a_dict": lambda f: list(f.values()),
}


@pytest.mark.parametrize("case", sorted(BAD_FEEDS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_bad_feeds_raise_like_stock(sessions, name, case):
    """Wrong input name, missing input, dtype, rank or container: the class stock ORT raises (or, where
    ORT accepts the feed, e.g. a nested list, the same outputs); the session then still runs."""
    stock, ref, fused = sessions[name]
    good = _feeds(name, (3, 4), np.random.default_rng(6))
    feeds = BAD_FEEDS[case](good)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            expected = stock.run(None, feeds)
        except Exception as exc:
            with pytest.raises(type(exc)):
                fused.run(None, feeds)
        else:
            _assert_matches(fused.run(None, feeds), expected)
    _assert_matches(fused.run(None, good), ref.run(None, good))


@pytest.mark.parametrize("name", ["add_relu", "chain", "chain_reference"])
def test_shapes_that_do_not_broadcast_raise_like_stock(sessions, name):
    """Symbolic dims that disagree at run time reach the fused kernel (native status, or the numpy
    reference, whose error would abort the process unguarded): stock ORT's exception class, then good runs."""
    stock, ref, fused = sessions[name]
    bad = {"x": np.ones((2, 3), np.float32), "y": np.ones(4, np.float32)}
    with pytest.raises(Exception) as theirs:
        stock.run(None, bad)
    for _ in range(3):
        with pytest.raises(type(theirs.value), match="Fused"):
            fused.run(None, bad)
        good = _feeds(name.removesuffix("_reference"), (2, 4), np.random.default_rng(7))
        _assert_matches(fused.run(None, good), ref.run(None, good))


def test_reference_kernel_error_leaves_the_callers_run_options_usable(sessions):
    """The run a reference error stops is stopped through its RunOptions.terminate; ortfuse resets it,
    so the caller's RunOptions run the next input."""
    _, ref, fused = sessions["chain_reference"]
    ro = onnxruntime.RunOptions()
    with pytest.raises(Exception, match="FusedEltwiseChain1Ref"):
        fused.run(None, {"x": np.ones((2, 3), np.float32), "y": np.ones(4, np.float32)}, ro)
    assert ro.terminate is False
    good = _feeds("chain", (2, 4), np.random.default_rng(8))
    _assert_matches(fused.run(None, good, ro), ref.run(None, good))
