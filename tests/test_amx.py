"""The AMX bf16 GEMM (native op FusedGemmActBf16, custom_ops/native/ops/gemm_bf16.py): selected only where the
CPU reports AMX and only under the precision opt-in; its numerics against stock ORT and against a
float64 reference on bf16-rounded inputs.

Selection tests run everywhere (the feature set comes from ``ORTFUSE_ISA``, and whether this process
could run the kernel is simulated). Numerics tests run on two ops: ``emulated``, the op's driver on
the plain-numba model of the tile instructions (OrtfuseGemmActBf16Emulated, any CPU; bit for bit
against the numpy model in tests/test_amx_emulated.py), and ``amx``, the AMX op itself, which runs
only where this CPU has AMX and Linux grants the tile-data permission (elsewhere skipped with the
reason).

Tolerances (derived, per output element, S = sum_k |x_k w_k|, L = 1.13 the largest slope of the
epilogues: gelu' peaks at 1.129, silu' at 1.10, relu' is 1):

* against stock ORT (float32 products): rounding x and w to bf16 (8 significant bits, round to
  nearest even) moves each by at most 2^-8 relatively, so a product by at most (2 * 2^-8 + 2^-16) |x w|;
  both sides then sum K + 1 float32 terms, each sum within (K + 1) 2^-24 (S + |b|) of exact. So
  |ours - ORT| <= L ((2^-7 + 2^-16) S + 2 (K + 1) 2^-24 (S + |b|)) + ACT_ULPS.
* against float64 on the bf16-rounded inputs: the products are exact in float32 (8 x 8 bits), so only
  the float32 summation remains: |ours - ref| <= L (K + 1) 2^-24 (S~ + |b|) + ACT_ULPS.

ACT_ULPS = 2^-20 |y| + 1e-6 covers the epilogue's own rounding (vecmath: a few ulp) on either side.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse.foundation import isa
from ortfuse.fusion.rules.gemm_act import AMX_OP
from ortfuse.kernel_choice import registry
from ortfuse.runtime import plan_cache

import amx_reference

AMX_FEATURES = "amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,avx,fma,sse4.2,sse2"
AVX512_FEATURES = "avx512f,avx512bw,avx512vl,avx512dq,avx2,avx,fma,sse4.2,sse2"
AVX2_FEATURES = "avx2,avx,fma,sse4.2,sse2"
SLOPE = 1.13


def _amx_reason() -> str | None:
    try:
        from ortfuse.custom_ops.native.ops.gemm_bf16 import unavailable_reason

        return unavailable_reason()
    except Exception as exc:  # noqa: BLE001 - numba/ORT missing: the reason is the skip message
        return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------------------------------
# selection (runs everywhere)
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def features(monkeypatch):
    """Set the feature set (``ORTFUSE_ISA``) and simulate a process that can run the AMX kernel."""
    monkeypatch.delenv("ORTFUSE_PRECISION", raising=False)
    monkeypatch.setattr(registry, "_amx_unavailable_reason", lambda: None)

    def use(value: str):
        monkeypatch.setenv("ORTFUSE_ISA", value)
        isa.refresh()

    yield use
    monkeypatch.delenv("ORTFUSE_ISA", raising=False)
    isa.refresh()


def _needs_native():
    if not registry._native_ops():
        pytest.skip("the native path is unavailable in this process")


@pytest.mark.parametrize("variant", ["relu", "gelu", "gelu_tanh", "relu+gelu"])
def test_amx_chosen_with_amx_features_and_the_opt_in(features, variant):
    _needs_native()
    features(AMX_FEATURES)
    sel = registry.select("FusedGemmAct", variant=variant, precision="bf16")
    assert sel.kernel.op_type == AMX_OP and sel.isa == "amx" and sel.kernel.precision == "bf16"
    assert sel.label == "native numba amx (bf16 products)"


def test_amx_never_chosen_without_the_opt_in(features):
    _needs_native()
    features(AMX_FEATURES)
    for prefer in (None, "native"):
        sel = registry.select("FusedGemmAct", variant="relu", prefer=prefer)
        assert sel.kernel.op_type != AMX_OP and sel.kernel.precision == "fp32", prefer
    sel = registry.select("FusedGemmAct", variant="relu", precision="fp32")
    assert sel.kernel.op_type != AMX_OP


def test_environment_opt_in_for_tools(features, monkeypatch):
    _needs_native()
    features(AMX_FEATURES)
    monkeypatch.setenv("ORTFUSE_PRECISION", "bf16")
    assert registry.select("FusedGemmAct", variant="relu", precision=None).kernel.op_type == AMX_OP
    monkeypatch.setenv("ORTFUSE_PRECISION", "fp32")
    assert registry.select("FusedGemmAct", variant="relu", precision=None).kernel.op_type != AMX_OP


@pytest.mark.parametrize("override", [AVX512_FEATURES, AVX2_FEATURES, "amx-tile," + AVX512_FEATURES])  # tiles, no bf16
def test_cpu_without_amx_bf16_gets_the_float32_kernels(features, override):
    _needs_native()
    features(override)
    sel = registry.select("FusedGemmAct", variant="relu", precision="bf16")
    assert sel.kernel.op_type != AMX_OP and sel.kernel.precision == "fp32"
    native = registry.select("FusedGemmAct", variant="relu", prefer="native", precision="bf16")
    if registry.native_isa() in isa.supported_isas():  # the avx512 (or avx2) build of this process
        assert native.kernel.op_type == "FusedGemmAct" and native.isa == registry.native_isa()
    else:
        assert native.kernel is None


def test_refused_permission_falls_back_with_a_warning(features, monkeypatch):
    _needs_native()
    features(AMX_FEATURES)
    monkeypatch.setattr(registry, "_amx_unavailable_reason", lambda: "simulated: Linux refused the permission")
    monkeypatch.setattr(registry, "_amx_warned", [False])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sel = registry.select("FusedGemmAct", variant="relu", precision="bf16")
    assert sel.kernel.op_type != AMX_OP
    assert any("simulated: Linux refused" in str(w.message) for w in caught)


def test_unknown_precision_is_an_error():
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        registry.select("FusedGemmAct", variant="relu", precision="fp8")


def _gemm_model(k: int, n: int, act: str = "relu", x_shape=("m", None), seed: int = 0,
                opset: int = 20) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """X @ W + B then the epilogue ``act`` as ONNX ops (MatMul + Add + Relu / Gelu / Relu + Gelu)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "B"], ["h"], name="bias")]
    last = "h"
    for i, step in enumerate(act.split("+")):
        if step == "relu":
            nodes.append(helper.make_node("Relu", [last], [f"a{i}"], name=f"relu{i}"))
        else:
            nodes.append(helper.make_node("Gelu", [last], [f"a{i}"], name=f"gelu{i}",
                                          approximate="tanh" if step == "gelu_tanh" else "none"))
        last = f"a{i}"
    nodes[-1].output[0] = "Y"
    dims = [d if d is not None else k for d in x_shape]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("X", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [*dims[:-1], n])],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model, w, b


def test_rewriter_emits_the_amx_op_only_under_the_opt_in(features):
    _needs_native()
    features(AMX_FEATURES)
    model, _, _ = _gemm_model(256, 257)
    fused, report = ortfuse.fuse(model, ["gemm_act"], precision="bf16")
    assert [n.op_type for n in fused.graph.node] == [AMX_OP], report.matches
    assert report.matches[0].kernel == "native numba amx (bf16 products)"
    for precision in (None, "fp32"):
        fused, _ = ortfuse.fuse(model, ["gemm_act"], precision=precision)
        assert AMX_OP not in {n.op_type for n in fused.graph.node}
    from ortfuse.fusion.provenance import is_rewritten, native_op_types

    fused, _ = ortfuse.fuse(model, ["gemm_act"], precision="bf16")
    assert native_op_types(fused) == {AMX_OP} and is_rewritten(fused)


def test_small_weights_keep_the_float32_kernels(features):
    """Below AMX_MIN_WEIGHTS (K x N) the AMX kernel's fixed cost loses to ORT: not chosen even opted in."""
    _needs_native()
    features(AMX_FEATURES)
    model, _, _ = _gemm_model(255, 256)
    fused, report = ortfuse.fuse(model, ["gemm_act"], precision="bf16")
    assert AMX_OP not in {n.op_type for n in fused.graph.node} and report.applied

def test_plan_cache_key_depends_on_the_opt_in():
    model, _, _ = _gemm_model(8, 8)
    data = model.SerializeToString()
    plain, opted = ort.SessionOptions(), ort.SessionOptions()
    opted.add_session_config_entry("ortfuse.precision", "bf16")
    assert plan_cache.key(data, plain, True, None, None) != plan_cache.key(data, opted, True, None, None)


# --------------------------------------------------------------------------------------------------
# numerics (AMX CPUs only)
# --------------------------------------------------------------------------------------------------

needs_amx = pytest.mark.skipif(_amx_reason() is not None, reason=f"AMX kernel cannot run here: {_amx_reason()}")
bf16, _act64 = amx_reference.bf16, amx_reference.act64


@pytest.fixture(params=["emulated", pytest.param("amx", marks=needs_amx)])
def op(request):
    """The op under test: FusedGemmActBf16 (AMX tiles), or its driver on the model of the tile
    instructions (OrtfuseGemmActBf16Emulated, added to this process's native ops)."""
    if request.param == "amx":
        return AMX_OP
    _needs_native()
    from ortfuse.custom_ops import registration
    from ortfuse.custom_ops.native.ops import gemm_bf16

    registration.add_native_op(gemm_bf16.EMULATED_OP)
    return gemm_bf16.EMULATED_OP_NAME


def _check_against_bf16_reference(y, x, w, b, act):
    """|y - act(bf16(x) @ bf16(w) + b)| (float64) within the float32-summation bound."""
    k = x.shape[-1]
    xb, wb = bf16(x).astype(np.float64), bf16(w).astype(np.float64)
    ref = _act64(xb @ wb + b, act)
    s = np.abs(xb) @ np.abs(wb) + np.abs(b)
    tol = SLOPE * (k + 1) * 2.0**-24 * s + 2.0**-20 * np.abs(ref) + 1e-6
    assert y.shape == ref.shape
    assert np.all(np.abs(y - ref) <= tol), float(np.max(np.abs(y - ref) - tol))


def _check_against_ort(y, y_ort, x, w, b):
    k = x.shape[-1]
    s = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64))
    tol = (SLOPE * ((2.0**-7 + 2.0**-16) * s + 2 * (k + 1) * 2.0**-24 * (s + np.abs(b)))
           + 2.0**-20 * np.abs(y_ort) + 1e-6)
    assert y.shape == y_ort.shape
    assert np.all(np.abs(y - y_ort) <= tol), float(np.max(np.abs(y - y_ort) - tol))


def _native_session(op, k, n, act, threads=1, seed=0, x_rank=2):
    """A session of one ``op`` node (every epilogue token, not only those patterns produce)."""
    from ortfuse.custom_ops import registration

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    node = helper.make_node(op, ["X", "W", "B"], ["Y"], domain="ai.onnx.contrib", activation=act)
    dims = ["m", k] if x_rank == 2 else ["a", "m", k]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.contrib", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    assert registration.register_native(so, [op]), registration.native_unavailable_reason([op])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]), w, b


SHAPES = [(1, 1, 1), (15, 17, 33), (17, 33, 15), (33, 100, 17), (100, 15, 1000), (1, 1000, 100), (64, 1000, 33),
          (300, 40, 70)]  # the last: three row super-blocks of 128, the third partial


@pytest.mark.parametrize("m, k, n", SHAPES)
@pytest.mark.parametrize("act", ["", "relu", "gelu", "gelu_tanh", "silu", "relu+gelu"])
def test_kernel_matches_float64_on_bf16_inputs(op, m, k, n, act):
    sess, w, b = _native_session(op, k, n, act, threads=2)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    y = sess.run(None, {"X": x})[0]
    _check_against_bf16_reference(y, x, w, b, act)


def test_kernel_is_really_bf16(op):
    """The products are bf16: the error against float32 inputs is far above float32 rounding."""
    sess, w, b = _native_session(op, 1000, 64, "")
    x = np.random.default_rng(2).standard_normal((32, 1000)).astype(np.float32)
    y = sess.run(None, {"X": x})[0]
    exact = x.astype(np.float64) @ w + b
    s = np.abs(x.astype(np.float64)) @ np.abs(w)
    assert np.max(np.abs(y - exact) / s) > 2.0**-14


def test_batched_x_zero_rows_nan_and_inf(op):
    sess, w, b = _native_session(op, 33, 40, "relu", x_rank=3)
    x = np.random.default_rng(3).standard_normal((3, 7, 33)).astype(np.float32)
    x[1, 2, 5] = np.nan
    x[2, 0, 0] = np.inf
    y = sess.run(None, {"X": x})[0]
    assert y.shape == (3, 7, 40)
    assert np.isnan(y[1, 2]).all()
    ref = _act64(bf16(x).astype(np.float64) @ bf16(w).astype(np.float64) + b, "relu")
    assert np.array_equal(np.isnan(y), np.isnan(ref)) and np.array_equal(np.isinf(y), np.isinf(ref))
    finite = np.isfinite(ref).all(axis=-1)
    _check_against_bf16_reference(y[finite], x[finite], w, b, "relu")
    for shape in [(0, 7, 33), (3, 0, 33)]:
        assert sess.run(None, {"X": np.zeros(shape, np.float32)})[0].shape == shape[:-1] + (40,)


def _fused_and_stock(model, op, features, threads=1):
    """A session of the model fused under the bf16 opt-in (an ortfuse session for the AMX op; for the
    emulated one the model as the rewriter fuses it where the CPU reports AMX, its FusedGemmActBf16
    node retyped), and a stock ORT session of the model."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if op == AMX_OP:
        so.add_session_config_entry("ortfuse.precision", "bf16")
        fused = ortfuse.InferenceSession(model.SerializeToString(), so, fusion=True, fusion_patterns=["gemm_act"])
        matches = fused.fusion_report.matches
    else:
        from ortfuse.custom_ops import registration

        features(AMX_FEATURES)
        fused_model, report = ortfuse.fuse(model, ["gemm_act"], precision="bf16")
        matches = report.matches
        for node in fused_model.graph.node:
            if node.op_type == AMX_OP:
                node.op_type = op
        assert registration.register_native(so, [op]), registration.native_unavailable_reason([op])
        fused = ort.InferenceSession(fused_model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert [r.kernel for r in matches] == ["native numba amx (bf16 products)"], matches
    stock_so = ort.SessionOptions()
    stock_so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return fused, ort.InferenceSession(model.SerializeToString(), stock_so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "relu+gelu"])
@pytest.mark.parametrize("m, k, n", [(1, 257, 300), (15, 300, 257), (33, 1000, 100), (100, 66, 1000)])
def test_session_matches_stock_ort(op, features, act, m, k, n):
    model, w, b = _gemm_model(k, n, act)
    fused, stock = _fused_and_stock(model, op, features, threads=2)
    x = np.random.default_rng(4).standard_normal((m, k)).astype(np.float32)
    y, y_ort = fused.run(None, {"X": x})[0], stock.run(None, {"X": x})[0]
    _check_against_ort(y, y_ort, x, w, b)
    _check_against_bf16_reference(y, x, w, b, act)


def test_session_rank3_zero_size_and_plain_session_without_opt_in(op, features):
    model, w, b = _gemm_model(260, 270, "relu", x_shape=("batch", "seq", None))
    fused, stock = _fused_and_stock(model, op, features)
    for shape in [(2, 5, 260), (0, 5, 260), (2, 0, 260)]:
        x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
        y, y_ort = fused.run(None, {"X": x})[0], stock.run(None, {"X": x})[0]
        _check_against_ort(y, y_ort, x, w, b)
    if op == AMX_OP:  # (a session on simulated features would pick kernels for them; see the rewriter tests)
        plain = ortfuse.InferenceSession(model.SerializeToString(), fusion=True, fusion_patterns=["gemm_act"])
        assert all("amx" not in r.kernel for r in plain.fusion_report.matches)


def test_wrong_shape_raises_like_stock_ort_and_the_session_keeps_working(op, features):
    model, w, b = _gemm_model(260, 270, "relu", x_shape=("m", "k"))  # K not declared: the kernel checks it
    fused, _ = _fused_and_stock(model, op, features)
    stock = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    bad = np.ones((3, 259), np.float32)
    with pytest.raises(Exception) as stock_error:
        stock.run(None, {"X": bad})
    with pytest.raises(type(stock_error.value), match="W must have shape"):
        fused.run(None, {"X": bad})
    x = np.random.default_rng(6).standard_normal((3, 260)).astype(np.float32)
    _check_against_ort(fused.run(None, {"X": x})[0], stock.run(None, {"X": x})[0], x, w, b)


def test_concurrent_first_runs_share_one_packing(op):
    """Threads racing on the first compute of one kernel (the packing is published by compare-and-swap)."""
    sess, w, b = _native_session(op, 100, 70, "gelu", threads=1)
    x = np.random.default_rng(7).standard_normal((40, 100)).astype(np.float32)
    results, errors = [], []

    def run():
        try:
            for _ in range(5):
                results.append(sess.run(None, {"X": x})[0])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 20
    for y in results:
        assert np.array_equal(y, results[0])
    _check_against_bf16_reference(results[0], x, w, b, "gelu")


@needs_amx
def test_saved_fused_model_runs_in_a_fresh_process(tmp_path):
    """A model saved with FusedGemmActBf16 and loaded in a new process never reaches the registry's
    permission request: the op's compute asks Linux itself before its first tile instruction (without
    that request the first tile instruction would be a SIGILL)."""
    import subprocess
    import sys

    model, w, b = _gemm_model(257, 300, "relu")
    fused, _ = ortfuse.fuse(model, ["gemm_act"], precision="bf16")
    assert [n.op_type for n in fused.graph.node] == [AMX_OP]
    path = tmp_path / "fused.onnx"
    onnx.save(fused, str(path))
    x = np.random.default_rng(8).standard_normal((5, 257)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = (f"import numpy as np, ortfuse\n"
            f"from ortfuse.custom_ops.kernels import amx\n"
            f"s = ortfuse.InferenceSession({str(path)!r})\n"
            f"y = s.run(None, {{'X': np.load({str(tmp_path / 'x.npy')!r})}})[0]\n"
            f"assert not amx._perm_result, 'the Python-side request ran'\n"
            f"np.save({str(tmp_path / 'y.npy')!r}, y)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    _check_against_bf16_reference(np.load(tmp_path / "y.npy"), x, w, b, "relu")


def test_unknown_precision_option_fails_the_session():
    model, _, _ = _gemm_model(8, 8)
    so = ort.SessionOptions()
    so.add_session_config_entry("ortfuse.precision", "int4")
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        ortfuse.InferenceSession(model.SerializeToString(), so, fusion=True, fusion_patterns=["gemm_act"])
