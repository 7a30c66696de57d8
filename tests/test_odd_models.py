"""Odd but valid models, fused (fusion=True) against stock ORT at ORT_DISABLE_ALL (rtol 1e-4, atol
1e-5 x max(1, max|ref|)): dynamic batch and sequence dims of zoo models, external data files on
disk (and missing), external initializers given through SessionOptions (every fusion value),
If / Loop subgraphs, float16 / float64 / integer graphs, tensors above the native kernels' rank
limit, and every opset from 7 to the newest the installed onnx knows (where stock ORT refuses an
opset, ortfuse raises the same class)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse import models
from ortfuse.fusion.catalogue import PATTERN_IDS

from model_fixtures import (
    annotated,
    external_weight_not_on_disk,
    ffn_inputs,
    ffn_matmul_add_relu,
)
from pattern_graphs import (
    GraphBuilder,
    assert_outputs_close,
    epi_hardswish_div_mul,
    epi_silu,
)

RTOL, ATOL = 1e-4, 1e-5


def _ref_options():
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


def _reference(source, feeds, so=None):
    return onnxruntime.InferenceSession(source, so or _ref_options()).run(None, feeds)


@pytest.mark.parametrize(("name", "patterns", "shapes"), [
    ("bert_encoder", ["gemm_act", "add_relu"], [(1, 8), (3, 5)]),
    ("mlp_gemm_relu_gelu", None, [(1, None), (7, None), (64, None)]),
])
def test_zoo_model_with_dynamic_batch_and_sequence(name, patterns, shapes):
    """One fused session of a zoo model run at several (batch, seq): every run equals stock ORT."""
    path = str(models.build(name))
    fused = ortfuse.InferenceSession(path, fusion=True, fusion_patterns=patterns)
    assert fused.fusion_report.applied, fused.fusion_report.table()
    ref = onnxruntime.InferenceSession(path, _ref_options())
    spec = {i.name: i.shape for i in ref.get_inputs()}
    rng = np.random.default_rng(0)
    for batch, seq in shapes:
        feeds = {}
        for input_name, shape in spec.items():
            dims = [batch if d == "batch" else seq if isinstance(d, str) else d for d in shape]
            feeds[input_name] = rng.standard_normal(dims).astype(np.float32)
        assert_outputs_close(fused.run(None, feeds), ref.run(None, feeds), RTOL, ATOL, scale_atol=True)


def _save_with_external_data(tmp_path, model):
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.weights", size_threshold=0)
    assert (tmp_path / "ext.weights").stat().st_size > 0
    return path


def test_external_data_on_disk_is_fused_and_matches(tmp_path):
    """Weights in an external file beside the model: ortfuse reads them, fuses, and equals ORT."""
    path = _save_with_external_data(tmp_path, ffn_matmul_add_relu())
    fused = ortfuse.InferenceSession(str(path), fusion=True)
    assert fused.fusion_report.applied and not fused.fusion_report.stepped_aside, fused.fusion_report.table()
    feeds = ffn_inputs()
    assert_outputs_close(fused.run(None, feeds), _reference(str(path), feeds), RTOL, ATOL)


def test_external_data_model_given_as_bytes_steps_aside(tmp_path):
    """The same model as bytes: ortfuse cannot locate the external file (ORT resolves it, or refuses,
    by its own rules), so it steps aside with a warning and ORT gives its own outcome."""
    path = _save_with_external_data(tmp_path, ffn_matmul_add_relu())
    data = path.read_bytes()
    try:
        expected = onnxruntime.InferenceSession(data).run(None, ffn_inputs())
    except Exception as exc:  # ORT 1.32 refuses external paths of a model loaded from bytes
        with pytest.warns(UserWarning, match="external data"), pytest.raises(type(exc), match="External data"):
            ortfuse.InferenceSession(data, fusion=True)
        return
    with pytest.warns(UserWarning, match="external data"):
        ours = ortfuse.InferenceSession(data, fusion=True)
    assert_outputs_close(ours.run(None, ffn_inputs()), expected, RTOL, ATOL)


@pytest.mark.parametrize("fusion", [None, False, True, "auto"], ids=str)
def test_missing_external_data_file_raises_like_stock(tmp_path, fusion):
    path = _save_with_external_data(tmp_path, annotated(ffn_matmul_add_relu(), patterns="add_relu"))
    (tmp_path / "ext.weights").unlink()
    with pytest.raises(Exception) as theirs:
        onnxruntime.InferenceSession(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(type(theirs.value)):
            ortfuse.InferenceSession(str(path), fusion=fusion)


@pytest.mark.parametrize("fusion", [None, True, "auto"], ids=str)
def test_external_initializers_from_session_options_every_fusion_value(fusion):
    """Initializers supplied through SessionOptions: never an error where ORT runs, same numbers
    (extends the fusion=True case of test_session_api_parity.py to the annotated and auto paths)."""
    model, name, weights = external_weight_not_on_disk()
    model = annotated(model, patterns="gemm_act")
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3

    def options():
        so = onnxruntime.SessionOptions()
        so.add_external_initializers([name], [onnxruntime.OrtValue.ortvalue_from_numpy(weights)])
        return so

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = ortfuse.InferenceSession(model.SerializeToString(), options(), fusion=fusion)
    assert not ours.fusion_report.applied
    np.testing.assert_array_equal(ours.run(None, {"x": x})[0], x @ weights)


def _if_loop_model():
    """x -> MatMul+Add+Relu (fusable) -> If(cond: Add+Relu branch | Sigmoid*x branch) -> Loop(3 x
    Add+Relu of the carried value and x) -> z; the subgraphs hold patterns too."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32) * 0.5, "W")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "B")
    f = TensorProto.FLOAT
    then_g = helper.make_graph([helper.make_node("Add", ["h", "x"], ["t0"]),
                                helper.make_node("Relu", ["t0"], ["t_out"])],
                               "then", [], [helper.make_tensor_value_info("t_out", f, ["n", 4])])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["h"], ["e0"]),
                                helper.make_node("Mul", ["h", "e0"], ["e_out"])],
                               "else", [], [helper.make_tensor_value_info("e_out", f, ["n", 4])])
    body = helper.make_graph(
        [helper.make_node("Add", ["carried", "x"], ["l0"]), helper.make_node("Relu", ["l0"], ["l1"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("carried", f, ["n", 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("l1", f, ["n", 4])])
    trip = numpy_helper.from_array(np.array(3, np.int64), "trip")
    true = numpy_helper.from_array(np.array(True), "true")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "B"], ["a"], name="bias"),
             helper.make_node("Relu", ["a"], ["h"], name="relu"),
             helper.make_node("If", ["cond"], ["i"], name="if", then_branch=then_g, else_branch=else_g),
             helper.make_node("Loop", ["trip", "true", "i"], ["z"], name="loop", body=body)]
    graph = helper.make_graph(nodes, "ifloop", [helper.make_tensor_value_info("x", f, ["n", 4]),
                                                 helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("z", f, ["n", 4])], initializer=[w, b, trip, true])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_if_and_loop_subgraphs():
    """Top-level patterns are fused, subgraph bodies are left alone, and both branches and the loop
    give ORT's numbers."""
    model = _if_loop_model()
    fused = ortfuse.InferenceSession(model, fusion=True)
    report = fused.fusion_report
    assert report.applied and all(n in {"mm", "bias", "relu"} for m in report.fused for n in m.nodes), report.table()
    data = model.SerializeToString()
    rng = np.random.default_rng(1)
    for cond in (True, False):
        for n in (1, 5):
            feeds = {"x": rng.standard_normal((n, 4)).astype(np.float32), "cond": np.array(cond)}
            assert_outputs_close(fused.run(None, feeds), _reference(data, feeds), RTOL, ATOL)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64], ids=lambda d: np.dtype(d).name)
def test_non_float32_graphs_are_left_to_ort(dtype):
    """Add+Relu, x*Sigmoid(x)-free chains and MatMul+Add+Relu in another dtype: no kernel exists, so
    nothing is fused (each candidate says why) and the results are ORT's, bit for bit. In float16
    only Add+Relu has a (native) kernel: tests/test_native_f16.py; here it is left out."""
    elem = {np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE, np.int32: TensorProto.INT32,
            np.int64: TensorProto.INT64}[dtype]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "B"], ["a"], name="bias"),
             helper.make_node("Relu", ["a"], ["h"], name="relu"),
             helper.make_node("Add", ["h", "y"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["z"], name="relu2")]
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array((rng.standard_normal((4, 3)) * 3).astype(dtype), "W")
    bias = numpy_helper.from_array((rng.standard_normal(3) * 3).astype(dtype), "B")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, ["n", 4]),
                                           helper.make_tensor_value_info("y", elem, ["n", 3])],
                              [helper.make_tensor_value_info("z", elem, ["n", 3])], initializer=[w, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    feeds = {"x": (rng.standard_normal((5, 4)) * 3).astype(dtype), "y": (rng.standard_normal((5, 3)) * 3).astype(dtype)}
    patterns = [p for p in PATTERN_IDS if dtype != np.float16 or p != "add_relu"]
    report = ortfuse.fuse(model, patterns)[1]
    assert not report.applied and report.matches and all(m.reason for m in report.matches), report.table()
    try:
        expected = onnxruntime.InferenceSession(data).run(None, feeds)[0]
    except Exception as exc:  # ORT has no CPU kernel for some ops in some dtypes (Relu int64)
        with pytest.raises(type(exc)):
            ortfuse.InferenceSession(data, fusion=True, fusion_patterns=patterns)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = ortfuse.InferenceSession(data, fusion=True, fusion_patterns=patterns)
    np.testing.assert_array_equal(fused.run(None, feeds)[0], expected)


def test_rank_above_the_native_limit_uses_the_reference_kernel():
    """A rank-14 tensor (native kernels take rank <= 12): stock ORT runs it, so the fusion takes the
    reference kernel instead of failing at run time (it raised 'rank 14, more than the supported 12')."""
    dims = [f"d{i}" for i in range(14)]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    fused = ortfuse.InferenceSession(model, fusion=True)
    [record] = fused.fusion_report.fused
    assert record.kernel.startswith("reference"), fused.fusion_report.table()
    x = np.random.default_rng(3).standard_normal((1,) * 12 + (2, 3)).astype(np.float32)
    assert_outputs_close(fused.run(None, {"x": x}), _reference(model.SerializeToString(), {"x": x}), RTOL, ATOL)


def test_native_rank_limit_mirrors_the_kernels():
    """registry.NATIVE_MAX_RANK (used at rewrite time) is the limit the native kernels enforce."""
    from ortfuse.custom_ops.native.words import MAX_RANK
    from ortfuse.kernel_choice import registry

    assert registry.NATIVE_MAX_RANK == MAX_RANK


def _opset_model(opset: int):
    """Add+Relu of two inputs, HardSwish (Add-Clip-Div-Mul), SiLU and MatMul+Add+Relu, written as
    the given opset allows (Clip bounds as attributes before opset 11)."""
    b = GraphBuilder(opset=opset, seed=opset)
    x, y = b.input("x", [2, 3]), b.input("y", [2, 3])
    t = b.op("Relu", [b.op("Add", [x, y], name="add")], name="add_relu")
    t, _ = epi_hardswish_div_mul(b, t, "hs_")
    t, _ = epi_silu(b, t, "si_")
    t = b.op("MatMul", [t, b.init(b.weight((3, 4)))], name="mm")
    t = b.op("Relu", [b.op("Add", [t, b.init(b.weight(4))], name="bias")], name="relu")
    b.output(t)
    return b.build(check=False), b.feeds()


@pytest.mark.parametrize("opset", range(7, onnx.defs.onnx_opset_version() + 1))
def test_every_opset_from_7_to_the_newest(opset):
    """The same graph at each opset: where stock ORT loads it, ortfuse fuses it and matches; where
    ORT refuses the opset, ortfuse raises the same class."""
    model, feeds = _opset_model(opset)
    data = model.SerializeToString()
    refused = None
    try:
        expected = _reference(data, feeds)
    except Exception as exc:  # noqa: BLE001 - whatever ORT raises, ortfuse must raise the same class
        refused = exc
    if refused is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(type(refused)):
                ortfuse.InferenceSession(data, fusion=True)
        assert opset > 20, f"stock ORT refused opset {opset}: {refused}"  # only opsets newer than ORT knows
        return
    fused = ortfuse.InferenceSession(data, fusion=True)
    assert {"add_relu", "hardswish", "silu", "gemm_act"} <= set(fused.fusion_report.counts()), \
        fused.fusion_report.table()
    assert_outputs_close(fused.run(None, feeds), expected, RTOL, ATOL, scale_atol=True)


SAVED_FUSED_PROBE = r"""
import sys, numpy as np, onnxruntime, ortfuse
sys.path.insert(0, sys.argv[1])
from model_fixtures import ffn_inputs, ffn_matmul_add_relu
fused, report = ortfuse.fuse(ffn_matmul_add_relu(), kernels="native")
assert {m.kernel.split()[0] for m in report.fused} == {"native"}, report.table()
session = ortfuse.InferenceSession(fused, fusion=False)   # the first session of this process
want = onnxruntime.InferenceSession(ffn_matmul_add_relu().SerializeToString()).run(None, ffn_inputs())[0]
np.testing.assert_allclose(session.run(None, ffn_inputs())[0], want, rtol=1e-5, atol=1e-5)
print("ok", session.fusion_report.reason)
"""


def test_model_saved_fused_with_native_ops_loads_with_fusion_off_in_a_fresh_process():
    """fusion=False does not parse the model, so a model saved already fused reaches ORT, fails, and
    is loaded again with ortfuse's ops: its native ops must be among them (with the reference ops
    alone a fresh process fails with 'FusedGemmAct is not a registered function/op')."""
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", SAVED_FUSED_PROBE, tests], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(tests))
    assert proc.returncode == 0 and "ok model was saved already fused" in proc.stdout, proc.stderr[-2000:]
