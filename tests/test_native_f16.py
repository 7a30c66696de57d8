"""Float16 native kernels (custom_ops/native/ops/: add_relu.py, hardswish.py, silu.py): add_relu,
hardswish (both spellings) and silu matched in float16 models run as FusedAddReluF16 /
FusedHardSwishF16 / FusedSiLUF16.

Each case is checked twice (the model's inputs are float16; x16 denotes them):
- against the same model run by stock ORT at ORT_DISABLE_ALL, within 4 float16 ulps (rtol 2^-8,
  atol 2^-14; ``pattern_graphs.tolerance``): ORT rounds to float16 after every op of the subgraph,
  the fused kernel once;
- against the exact math in float64 on x16, rounded to float16: within 1 float16 ulp (the kernel's
  float32 math is a few float32 ulps from exact, then one rounding), NaN where the exact math gives NaN.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortfuse
from ortfuse.kernel_choice import registry

from pattern_graphs import CPU, GraphBuilder, epi_hardsigmoid_mul, epi_hardswish_div_mul, epi_silu, tolerance

F16_ULP = 2.0**-10
pytestmark = pytest.mark.skipif(not registry._native_ops(), reason="the native path is unavailable here; float16 "
                                "matches are then left unfused (test_float16_without_native_kernels_stays_unfused)")


def _exact(kind: str, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if kind == "add_relu":
            s = x + y.astype(np.float64)
            return np.where(s > 0, s, np.where(np.isnan(s), s, 0.0))
        if kind == "hardswish":
            return x * np.minimum(np.maximum(x + 3.0, 0.0), 6.0) / 6.0
        return x / (1.0 + np.exp(-x))


def _model(kind: str, shape, other_shape=None, spelling=epi_hardswish_div_mul):
    b = GraphBuilder(dtype=np.float16, opset=17)
    x = b.input("x", shape, low=-8, high=8)
    if kind == "add_relu":
        y = b.input("y", other_shape or shape, low=-8, high=8)
        out = b.op("Relu", [b.op("Add", [x, y], name="add")], name="relu")
    else:
        out, _ = (spelling if kind == "hardswish" else epi_silu)(b, x, "")
    b.output(out)
    return b.build(), b


def _check(kind, model, feeds):
    session = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    fused = {m.pattern_id: m.kernel for m in session.fusion_report.fused}
    assert list(fused) == [kind] and fused[kind].startswith("native"), session.fusion_report.table()
    op_types = {n.op_type for n in ortfuse.fuse(model)[0].graph.node}
    assert op_types == {{"add_relu": "FusedAddReluF16", "hardswish": "FusedHardSwishF16", "silu": "FusedSiLUF16"}[kind]}
    got = session.run(None, feeds)[0]
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=CPU).run(None, feeds)[0]
    assert got.dtype == np.float16 and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    rtol, atol = tolerance(np.float16, 0, 0)
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=rtol, atol=atol, equal_nan=True)
    exact = np.broadcast_to(_exact(kind, *[np.asarray(v) for v in feeds.values()]), got.shape)
    np.testing.assert_allclose(got.astype(np.float64), exact.astype(np.float16).astype(np.float64),
                               rtol=F16_ULP, atol=2.0**-24, equal_nan=True)
    return got, ref


SIZES = [(1,), (17,), (1023,), (1025,), (3, 16385), (2, 3, 5, 7)]


@pytest.mark.parametrize("shape", SIZES, ids=str)
@pytest.mark.parametrize("kind", ["add_relu", "hardswish", "silu"])
def test_float16_kernel_matches_stock_ort_and_the_exact_math(kind, shape):
    model, b = _model(kind, list(shape))
    _check(kind, model, b.feeds())


@pytest.mark.parametrize("spelling", [epi_hardswish_div_mul, epi_hardsigmoid_mul],
                         ids=["add_clip_div_mul", "hardsigmoid_mul"])
def test_float16_hardswish_spellings(spelling):
    model, b = _model("hardswish", [4, 257], spelling=spelling)
    _check("hardswish", model, b.feeds())


@pytest.mark.parametrize("other", [[1], [7], [1, 7], [5, 1], [3, 1, 1], [1, 1, 1]], ids=str)
def test_float16_add_relu_broadcasts(other):
    model, b = _model("add_relu", [3, 5, 7], other_shape=other)
    _check("add_relu", model, b.feeds())


def test_float16_nan_inf_and_extremes_as_stock_ort():
    """NaN and +-Inf, the float16 extremes (65504, subnormals), -0: NaN where ORT gives NaN."""
    special = np.float16([np.nan, np.inf, -np.inf, 65504, -65504, 6e-8, -6e-8, 0.0, -0.0, 3.0, -3.0, 1e-4])
    for kind in ("add_relu", "hardswish", "silu"):
        model, _ = _model(kind, [special.size])
        feeds = {"x": special} | ({"y": special[::-1].copy()} if kind == "add_relu" else {})
        got, ref = _check(kind, model, feeds)
        assert np.array_equal(np.isnan(got), np.isnan(ref)), (kind, got, ref)


@pytest.mark.parametrize("div", [6.0, 3.0, 0.0, -0.0, 1e-40, np.inf, np.nan])
def test_float16_hardswish_divides_where_the_reciprocal_would_differ(div):
    """hardswish.hardswish_span_f16 multiplies by float32(1 / div) only where that is finite and
    non-zero (within a float16 ulp of dividing); for div 0, subnormal, Inf or NaN it divides, which
    equals the float32 reference rounded to float16 bit for bit (0 * (c / 1e-40) is 0, 0 * (c * Inf) NaN)."""
    from ortfuse.custom_ops import reference
    from ortfuse.custom_ops.native.ops.hardswish import hardswish_span_f16

    x16 = np.concatenate([np.linspace(-8, 8, 4001), [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0]]).astype(np.float16)
    y = np.empty(x16.shape, np.uint16)
    hardswish_span_f16(x16.view(np.uint16), y, 0, x16.size, np.float32(3), np.float32(0), np.float32(6),
                       np.float32(div))
    got = y.view(np.float16)
    with np.errstate(all="ignore"):
        ref = reference.hardswish(x16.astype(np.float32), add=3.0, lo=0.0, hi=6.0, div=div).astype(np.float16)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    if np.isfinite(np.float32(1) / np.float32(div)) and np.float32(1) / np.float32(div) != 0:
        apart = np.abs(got.view(np.int16).astype(np.int32) - ref.view(np.int16).astype(np.int32))
        assert apart[~np.isnan(ref)].max() <= 1  # float16 bit patterns (same sign: one ulp)
    else:
        assert np.array_equal(got.view(np.uint16)[~np.isnan(ref)], ref.view(np.uint16)[~np.isnan(ref)])


def test_float16_zero_size_and_non_contiguous_inputs():
    model, _ = _model("add_relu", ["n", 8])
    x = (np.arange(32, dtype=np.float16) - 15).reshape(8, 4).T   # a transposed view, shape (4, 8)
    y = np.float16(np.linspace(-20, 20, 64)).reshape(8, 8)[::2]  # every other row, shape (4, 8)
    assert not x.flags.c_contiguous and not y.flags.c_contiguous
    _check("add_relu", model, {"x": x, "y": y})
    empty = np.zeros((0, 8), np.float16)
    got, _ = _check("add_relu", model, {"x": empty, "y": empty})
    assert got.shape == (0, 8)


def test_float16_shapes_that_do_not_broadcast_raise_like_stock_and_the_session_goes_on():
    model, _ = _model("add_relu", ["n", 5], other_shape=["m", 5])
    fused = ortfuse.InferenceSession(model.SerializeToString(), fusion=True)
    stock = onnxruntime.InferenceSession(model.SerializeToString(), providers=CPU)
    bad = {"x": np.ones((2, 5), np.float16), "y": np.ones((3, 5), np.float16)}
    with pytest.raises(Exception) as stock_error:
        stock.run(None, bad)
    with pytest.raises(stock_error.type,
                       match="FusedAddReluF16: input shapes \\[2,5\\] and \\[3,5\\] do not broadcast"):
        fused.run(None, bad)
    good = {"x": np.float16([[1, -2, 3, -4, 5]]), "y": np.float16([[-1, -1, -1, -1, -1]])}
    np.testing.assert_array_equal(fused.run(None, good)[0], stock.run(None, good)[0])


def test_float16_without_native_kernels_stays_unfused():
    """No reference kernel takes float16: without the native path the match is left to ORT, with the reason."""
    model, _ = _model("silu", [4, 8])
    fused, report = ortfuse.fuse(model, kernels="reference")
    assert not report.applied and fused.graph.node[0].op_type == "Sigmoid"
    reasons = [m.reason for m in report.matches if m.pattern_id == "silu"]
    assert reasons and "dtype float16" in reasons[0], report.table()


def test_saved_float16_fused_model_runs_in_a_fresh_session():
    """A model saved already fused with a float16 op (``ortfuse-annotate --rewrite``) gets its native
    op registered and runs: ORT checks the declared float16 types at load, the kernel at run time."""
    node = helper.make_node("FusedSiLUF16", ["X"], ["Y"], domain="ai.onnx.contrib", pattern_id="silu",
                            replaced_nodes="a,b")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.contrib", 1)])
    session = ortfuse.InferenceSession(model.SerializeToString())
    assert "saved already fused" in session.fusion_report.reason
    x = np.float16([-1, 0, 2])
    got = session.run(None, {"X": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), _exact("silu", x), rtol=F16_ULP)


ISA_PROBE = r"""
import sys
sys.path.insert(0, sys.argv[1])
from ortfuse.kernel_choice import registry
from test_native_f16 import SIZES, _check, _model
for kind in ("add_relu", "hardswish", "silu"):
    for shape in SIZES:
        model, b = _model(kind, list(shape))
        _check(kind, model, b.feeds())
print(registry.native_isa())
"""


@pytest.mark.parametrize("level", ["avx2", "generic"])
def test_float16_kernels_in_every_isa_variant(level):
    """numba compiles for one ISA per process: float16 conversions are F16C / AVX-512 instructions on
    avx2 and up, and library calls on the generic (SSE2) variant; each variant gives the same answers."""
    import os
    import subprocess
    import sys

    from ortfuse.foundation import isa

    if level not in isa.supported_isas():
        pytest.skip(f"this CPU cannot run the {level} variant")
    env = {**os.environ, **isa.numba_env(level), "ORTFUSE_ISA": level}
    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", ISA_PROBE, tests], env=env, capture_output=True, text=True,
                          timeout=900, cwd=os.path.dirname(tests))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == level, proc.stdout[-500:]
