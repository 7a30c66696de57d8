"""The caller's SessionOptions are never modified (ortfuse.runtime.options_copy): ``ortfuse.SessionOptions``
records what ORT cannot read back, a fused session runs on an exact copy carrying ortfuse's ops, and one
options object serves any number of fused sessions and then a stock ORT session as if ortfuse had never
seen it. ``onnxruntime.SessionOptions`` cannot be copied exactly: ortfuse registers on them, as before,
and says so in the report."""

from __future__ import annotations

import enum

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortfuse
from ortfuse.foundation.session_options import NATIVE_KEY, PYTHON_OPS_KEY, REGISTERED_KEY
from ortfuse.runtime import options_copy

from model_fixtures import ffn_inputs, ffn_matmul_add_relu

OURS = (REGISTERED_KEY, NATIVE_KEY, PYTHON_OPS_KEY)
# the public attributes of ORT 1.32's SessionOptions: a copy that missed one would not be exact
EXPECTED_ATTRIBUTES = {
    "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "enable_profiling", "execution_mode",
    "execution_order", "graph_optimization_level", "inter_op_num_threads", "intra_op_num_threads",
    "log_severity_level", "log_verbosity_level", "logid", "optimized_model_filepath", "profile_file_prefix",
    "use_deterministic_compute", "use_per_session_threads",
}


def _entry(so, key: str) -> str | None:
    try:
        return so.get_session_config_entry(key)
    except RuntimeError:  # ORT raises for a key never set
        return None


def _add_relu_then_silu(dim: str | int = 7) -> tuple[onnx.ModelProto, dict]:
    """relu(x + y) then SiLU: two native ops (FusedAddRelu, FusedSiLU) from one graph."""
    nodes = [helper.make_node("Add", ["x", "y"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["r"], ["g"], name="sig"),
             helper.make_node("Mul", ["r", "g"], ["z"], name="mul")]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, dim]) for n in ("x", "y", "z")]
    model = helper.make_model(helper.make_graph(nodes, "g", vi[:2], vi[2:]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(0)
    return model, {k: rng.standard_normal((3, 7)).astype(np.float32) for k in ("x", "y")}


def _other_value(value):
    """A value of the same type as ``value`` that differs from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int) and not isinstance(value, enum.Enum) and not hasattr(type(value), "__members__"):
        return value + 2
    if isinstance(value, str):
        return value + "x"
    members = list(type(value).__members__.values())  # pybind enums
    return next(m for m in members if m != value)


def test_every_public_attribute_is_copied_and_every_setter_recorded():
    assert set(options_copy.ATTRIBUTES) == EXPECTED_ATTRIBUTES
    assert {"add_session_config_entry", "register_custom_ops_library", "add_initializer",
            "add_free_dimension_override_by_name", "add_free_dimension_override_by_denotation",
            "add_external_initializers", "add_provider", "set_load_cancellation_flag"} <= set(options_copy.RECORDED)
    assert ortfuse.SessionOptions is options_copy.SessionOptions
    assert issubclass(ortfuse.SessionOptions, onnxruntime.SessionOptions)
    so = ortfuse.SessionOptions()
    default = onnxruntime.SessionOptions()
    for name in options_copy.ATTRIBUTES:
        setattr(so, name, _other_value(getattr(default, name)))
    so.add_session_config_entry("session.disable_prepacking", "1")
    so.add_session_config_entry("app.tag", "first")
    so.add_session_config_entry("app.tag", "second")  # ORT keeps the last value
    so.add_free_dimension_override_by_name("seq", 5)
    so.add_free_dimension_override_by_denotation("DATA_BATCH", 2)
    copy = options_copy.copy_of(options_copy.snapshot(so))
    assert copy is not so
    for name in options_copy.ATTRIBUTES:
        assert getattr(copy, name) == getattr(so, name) != getattr(default, name), name
    assert _entry(copy, "session.disable_prepacking") == "1" and _entry(copy, "app.tag") == "second"
    assert options_copy.snapshot(copy) == options_copy.snapshot(so)
    assert options_copy.snapshot(onnxruntime.SessionOptions()) is None  # its settings cannot all be read


def test_one_options_object_for_many_fused_sessions_then_a_stock_session():
    """The settings reach every fused session (they run on copies), each fused session gets the native
    ops its model needs (no 'registered before' fallback), and afterwards the caller's options hold
    exactly what the caller set: a stock ORT session on them behaves as on options ortfuse never saw."""
    so = ortfuse.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("app.tag", "mine")
    so.add_free_dimension_override_by_name("seq", 5)
    before = options_copy.snapshot(so)
    model, feeds = _add_relu_then_silu()
    ffn = ffn_matmul_add_relu()
    sessions = [ortfuse.InferenceSession(model, so, fusion=True, fusion_patterns=["add_relu"]),
                ortfuse.InferenceSession(model, so, fusion=True),  # needs FusedSiLU as well
                ortfuse.InferenceSession(ffn, so, fusion=True),
                ortfuse.InferenceSession(model, so, fusion=True, fusion_patterns=["add_relu"])]
    assert sessions[0].fusion_report.counts() == sessions[3].fusion_report.counts() == {"add_relu": 1}
    assert sessions[1].fusion_report.counts() == {"add_relu": 1, "silu": 1}
    for s in (sessions[0], sessions[1], sessions[3]):
        assert all(r.kernel.startswith("native") for r in s.fusion_report.fused), s.fusion_report.table()
    for s in sessions:
        ran = s.get_session_options()
        assert ran.intra_op_num_threads == 1 and ran.log_severity_level == 3
        assert _entry(ran, "app.tag") == "mine" and _entry(ran, REGISTERED_KEY) == "1"
    assert sessions[0]._sess_options_initial is sessions[3]._sess_options_initial  # one copy per settings and ops
    assert sessions[0]._sess_options_initial is not sessions[1]._sess_options_initial
    assert all(s._sess_options_initial is not so for s in sessions)
    stock = onnxruntime.InferenceSession(model.SerializeToString(), so)
    fresh = onnxruntime.SessionOptions()
    fresh.intra_op_num_threads, fresh.log_severity_level = 1, 3
    fresh.add_session_config_entry("session.intra_op.allow_spinning", "0")
    fresh.add_session_config_entry("app.tag", "mine")
    fresh.add_free_dimension_override_by_name("seq", 5)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), fresh).run(None, feeds)[0]
    np.testing.assert_array_equal(stock.run(None, feeds)[0], expected)
    for s in sessions[:2]:
        np.testing.assert_allclose(s.run(None, feeds)[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sessions[2].run(None, ffn_inputs())[0],
                               onnxruntime.InferenceSession(ffn.SerializeToString()).run(None, ffn_inputs())[0],
                               rtol=1e-5, atol=1e-5)
    assert options_copy.snapshot(so) == before
    assert all(_entry(so, key) is None for key in OURS)
    assert _entry(so, "app.tag") == "mine" and so.intra_op_num_threads == 1


def test_a_dimension_override_reaches_the_fused_session():
    """add_free_dimension_override_by_name is replayed on the copy: ORT then refuses another size, as a
    stock session on the caller's options does."""
    model, feeds = _add_relu_then_silu(dim="n")
    so = ortfuse.SessionOptions()
    so.add_free_dimension_override_by_name("n", 7)
    fused = ortfuse.InferenceSession(model, so, fusion=True)
    stock = onnxruntime.InferenceSession(model.SerializeToString(), so)
    assert fused.fusion_report.counts() == {"add_relu": 1, "silu": 1}
    assert fused.get_inputs()[0].shape == stock.get_inputs()[0].shape == [3, 7]
    wide = {k: np.zeros((3, 8), np.float32) for k in feeds}
    with pytest.raises(Exception) as theirs:
        stock.run(None, wide)
    with pytest.raises(type(theirs.value)):
        fused.run(None, wide)


def test_initializers_supplied_through_options_leave_the_model_to_ort():
    """add_initializer replaces a weight the rewrite would fold: the session steps aside (ORT gets the
    caller's options and model), and computes what stock ORT computes with the supplied weight."""
    ffn = ffn_matmul_add_relu()
    weight = onnxruntime.OrtValue.ortvalue_from_numpy(np.full((16, 24), 0.01, np.float32))
    so = ortfuse.SessionOptions()
    so.add_initializer("W1", weight)
    with pytest.warns(UserWarning, match="initializers"):
        ours = ortfuse.InferenceSession(ffn, so, fusion=True)
    assert ours.fusion_report.stepped_aside and not ours.fusion_report.fused
    plain = onnxruntime.SessionOptions()
    plain.add_initializer("W1", weight)
    expected = onnxruntime.InferenceSession(ffn.SerializeToString(), plain).run(None, ffn_inputs())[0]
    np.testing.assert_array_equal(ours.run(None, ffn_inputs())[0], expected)
    assert all(_entry(so, key) is None for key in OURS)


def test_onnxruntime_options_are_registered_on_as_before_and_the_report_says_so():
    so = onnxruntime.SessionOptions()
    model, _ = _add_relu_then_silu()
    session = ortfuse.InferenceSession(model, so, fusion=True)
    assert session.fusion_report.counts() == {"add_relu": 1, "silu": 1}
    assert _entry(so, REGISTERED_KEY) == "1"
    assert options_copy.PLAIN_OPTIONS_NOTE in session.fusion_report.notes
    unfused = ortfuse.InferenceSession(model, onnxruntime.SessionOptions(), fusion=False)
    assert options_copy.PLAIN_OPTIONS_NOTE not in unfused.fusion_report.notes
