"""Every public method and property of ORT's InferenceSession, run on stock ORT and on ortfuse
(fusion off, fusion on, and fusion following an annotated model's metadata); results or raised
exception types must match. Numerics of fused sessions: max abs diff <= 1e-5 against stock."""

from __future__ import annotations

import json
import os
import pathlib
import threading

import numpy as np
import onnxruntime
import pytest

import ortfuse

from model_fixtures import annotated, external_weight_not_on_disk, ffn_inputs, ffn_matmul_add_relu

ATOL = 1e-5
ORTFUSE_METADATA_KEYS = {"fusion_enabled", "fusion_pattern_id", "ortfuse_version", "ortfuse_graph_digest",
                         "ortfuse_rewritten"}
VARIANTS = ["fusion_off", "fusion_on", "fusion_from_metadata"]


def _model_for(variant):
    model = ffn_matmul_add_relu()
    return annotated(model, patterns="gemm_act,add_relu") if variant == "fusion_from_metadata" else model


def _ortfuse_session(variant, model, sess_options=None, **kw):
    fusion = {"fusion_off": False, "fusion_on": True, "fusion_from_metadata": None}[variant]
    return ortfuse.InferenceSession(model.SerializeToString(), sess_options, fusion=fusion, **kw)


def _pair(variant, stock_options=None, ortfuse_options=None, **kw):
    model = _model_for(variant)
    stock = onnxruntime.InferenceSession(model.SerializeToString(), stock_options, **kw)
    ours = _ortfuse_session(variant, model, ortfuse_options, **kw)
    return stock, ours


def _outcome(fn):
    """(\"ok\", value) or (\"raised\", exception type) of calling fn."""
    try:
        return "ok", fn()
    except Exception as exc:  # the type is what is compared
        return "raised", type(exc)


def _meminfo(infos):
    return [(m.name, m.device_id, str(m.mem_type), str(m.allocator_type)) for m in infos]


def _nodearg(args):
    return [(a.name, a.type, list(a.shape)) for a in args]


@pytest.fixture(params=VARIANTS)
def variant(request):
    return request.param


def test_is_a_subclass_with_ort_signature_plus_fusion():
    import inspect

    assert issubclass(ortfuse.InferenceSession, onnxruntime.InferenceSession)
    ours = inspect.signature(ortfuse.InferenceSession.__init__).parameters
    theirs = inspect.signature(onnxruntime.InferenceSession.__init__).parameters
    assert [p for p in ours if p not in ("fusion", "fusion_patterns", "plan")] == list(theirs)
    for name in theirs:
        assert ours[name].kind == theirs[name].kind and ours[name].default == theirs[name].default
    assert ours["fusion"].default is None and ours["fusion_patterns"].default is None and ours["plan"].default is None
    assert ours["plan"].kind == inspect.Parameter.KEYWORD_ONLY


def test_io_metadata_and_providers_match(variant):
    stock, ours = _pair(variant)
    assert _nodearg(ours.get_inputs()) == _nodearg(stock.get_inputs())
    assert _nodearg(ours.get_outputs()) == _nodearg(stock.get_outputs())
    assert _nodearg(ours.get_overridable_initializers()) == _nodearg(stock.get_overridable_initializers())
    assert ours.get_providers() == stock.get_providers()
    assert ours.get_provider_options() == stock.get_provider_options()
    assert _meminfo(ours.get_input_memory_infos()) == _meminfo(stock.get_input_memory_infos())
    assert _meminfo(ours.get_output_memory_infos()) == _meminfo(stock.get_output_memory_infos())
    assert len(ours.get_input_epdevices()) == len(stock.get_input_epdevices())
    assert ours.get_tuning_results() == stock.get_tuning_results()
    assert isinstance(ours._sess, type(stock._sess))


def test_modelmeta_matches(variant):
    stock, ours = _pair(variant)
    a, b = stock.get_modelmeta(), ours.get_modelmeta()
    for field in ("producer_name", "graph_name", "domain", "description", "graph_description", "version"):
        assert getattr(b, field) == getattr(a, field), field
    theirs, mine = a.custom_metadata_map, b.custom_metadata_map
    assert {k: v for k, v in mine.items() if k not in ORTFUSE_METADATA_KEYS} == {
        k: v for k, v in theirs.items() if k not in ORTFUSE_METADATA_KEYS
    }
    assert theirs["owner"] == "tests"


def test_session_options_round_trip(variant):
    def options():
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = 1
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return so

    stock, ours = _pair(variant, options(), options())
    a, b = stock.get_session_options(), ours.get_session_options()
    for attr in ("intra_op_num_threads", "graph_optimization_level", "execution_mode", "enable_profiling"):
        assert getattr(b, attr) == getattr(a, attr), attr
    key = "session.intra_op.allow_spinning"
    assert b.get_session_config_entry(key) == a.get_session_config_entry(key) == "0"


def test_run_matches_and_output_selection(variant):
    stock, ours = _pair(variant)
    feeds = ffn_inputs()
    np.testing.assert_allclose(ours.run(None, feeds)[0], stock.run(None, feeds)[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(ours.run(["z"], feeds)[0], stock.run(["z"], feeds)[0], atol=ATOL, rtol=0)
    ro = onnxruntime.RunOptions()
    ro.log_severity_level = 3
    np.testing.assert_allclose(ours.run(None, feeds, ro)[0], stock.run(None, feeds, ro)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "case",
    [
        "wrong_input_name",
        "missing_input",
        "wrong_dtype",
        "wrong_rank",
        "wrong_static_dim",
        "unknown_output",
        "not_a_dict",
    ],
)
def test_run_errors_match(variant, case):
    stock, ours = _pair(variant)
    x = ffn_inputs()["x"]
    feeds = {
        "wrong_input_name": {"nope": x},
        "missing_input": {},
        "wrong_dtype": {"x": x.astype(np.float64)},
        "wrong_rank": {"x": x[0]},
        "wrong_static_dim": {"x": x[..., :3]},
        "unknown_output": {"x": x},
        "not_a_dict": [x],
    }[case]
    outputs = ["nope"] if case == "unknown_output" else None
    a = _outcome(lambda: stock.run(outputs, feeds))
    b = _outcome(lambda: ours.run(outputs, feeds))
    assert a[0] == "raised", f"stock ORT accepted case {case}; the fixture does not test what it says"
    assert b == a


def test_run_with_ort_values_and_vector(variant):
    stock, ours = _pair(variant)
    x = ffn_inputs()["x"]
    a = stock.run_with_ort_values(None, {"x": onnxruntime.OrtValue.ortvalue_from_numpy(x)})
    b = ours.run_with_ort_values(None, {"x": ortfuse.OrtValue.ortvalue_from_numpy(x)})
    np.testing.assert_allclose(b[0].numpy(), a[0].numpy(), atol=ATOL, rtol=0)


def test_io_binding(variant):
    stock, ours = _pair(variant)
    x = ffn_inputs()["x"]
    results = []
    for sess in (stock, ours):
        binding = sess.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_output("z")
        sess.run_with_iobinding(binding)
        results.append(binding.copy_outputs_to_cpu()[0])
        out = sess.create_ortvalue_from_shape_and_type([2, 5, 16], np.float32, "cpu")
        binding.bind_ortvalue_output("z", out)
        sess.run_with_iobinding(binding)
        results.append(out.numpy())
    np.testing.assert_allclose(results[2], results[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(results[3], results[1], atol=ATOL, rtol=0)


def test_create_ortvalue_from_shape_and_type(variant):
    stock, ours = _pair(variant)
    a = stock.create_ortvalue_from_shape_and_type([3, 4], np.float32, "cpu")
    b = ours.create_ortvalue_from_shape_and_type([3, 4], np.float32, "cpu")
    assert (a.shape(), a.data_type()) == (b.shape(), b.data_type())


def test_run_async(variant):
    stock, ours = _pair(variant)
    feeds = ffn_inputs()
    got = {}

    def run(name, sess):
        done = threading.Event()

        def callback(results, user_data, err):
            got[name] = (results, err)
            done.set()

        sess.run_async(None, feeds, callback, None)
        assert done.wait(30), f"run_async of {name} never called back"

    run("stock", stock)
    run("ours", ours)
    assert got["ours"][1] == got["stock"][1] == ""
    np.testing.assert_allclose(got["ours"][0][0], got["stock"][0][0], atol=ATOL, rtol=0)


def test_profiling(variant, tmp_path):
    def options(prefix):
        so = onnxruntime.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = str(tmp_path / prefix)
        return so

    stock, ours = _pair(variant, options("stock"), options("ours"))
    assert ours.get_profiling_start_time_ns() > 0 and stock.get_profiling_start_time_ns() > 0
    feeds = ffn_inputs()
    stock.run(None, feeds)
    ours.run(None, feeds)
    files = [stock.end_profiling(), ours.end_profiling()]
    events = [json.loads(pathlib.Path(f).read_text()) for f in files]
    assert all(os.path.basename(f).startswith(p) for f, p in zip(files, ("stock", "ours")))
    kinds = [{e.get("cat") for e in ev} for ev in events]
    assert kinds[1] == kinds[0] and "Node" in kinds[0]


def test_set_providers_rebuilds_from_the_model_ort_loaded(variant):
    stock, ours = _pair(variant)
    loaded = ours._model_bytes
    ours.set_providers(["CPUExecutionProvider"])
    stock.set_providers(["CPUExecutionProvider"])
    assert ours._model_bytes == loaded
    assert ours.get_providers() == stock.get_providers() == ["CPUExecutionProvider"]
    feeds = ffn_inputs()
    np.testing.assert_allclose(ours.run(None, feeds)[0], stock.run(None, feeds)[0], atol=ATOL, rtol=0)
    a = _outcome(lambda: stock.set_providers(["NoSuchExecutionProvider"]))
    b = _outcome(lambda: ours.set_providers(["NoSuchExecutionProvider"]))
    assert a[0] == "raised" and b == a


def test_fallback_flags(variant):
    stock, ours = _pair(variant)
    assert ours._enable_fallback == stock._enable_fallback
    stock.disable_fallback()
    ours.disable_fallback()
    assert ours._enable_fallback is stock._enable_fallback is False
    stock.enable_fallback()
    ours.enable_fallback()
    assert ours._enable_fallback is stock._enable_fallback is True


@pytest.mark.parametrize(
    "call",
    [
        ("set_tuning_results", ([],)),
        ("set_ep_dynamic_options", ({"ep.dynamic.workload_type": "Default"},)),
        ("release_captured_graph", (0,)),
        ("get_provider_graph_assignment_info", ()),
    ],
    ids=lambda c: c[0],
)
def test_rarely_used_methods_same_outcome(variant, call):
    stock, ours = _pair(variant)
    name, args = call
    a = _outcome(lambda: getattr(stock, name)(*args))
    b = _outcome(lambda: getattr(ours, name)(*args))
    assert b[0] == a[0]
    if a[0] == "raised":
        assert b[1] is a[1]


def test_graph_assignment_info_when_recorded(variant):
    def options():
        so = onnxruntime.SessionOptions()
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        return so

    stock, ours = _pair(variant, options(), options())
    a = stock.get_provider_graph_assignment_info()
    b = ours.get_provider_graph_assignment_info()
    # recording the placement of nodes makes fusion step aside: the caller asks about the original nodes
    names = lambda info: sorted(n.name for sg in info for n in sg.get_nodes())  # noqa: E731
    assert a and names(b) == names(a) and not ours.fusion_report.applied


@pytest.mark.parametrize("kind", ["path", "pathlike", "bytes"])
def test_model_sources(variant, kind, tmp_path):
    import pathlib

    model = _model_for(variant)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    source = {"path": str(path), "pathlike": pathlib.Path(path), "bytes": model.SerializeToString()}[kind]
    stock = onnxruntime.InferenceSession(source)
    ours = _ortfuse_session(variant, model) if kind == "bytes" else ortfuse.InferenceSession(
        source, fusion={"fusion_off": False, "fusion_on": True, "fusion_from_metadata": None}[variant]
    )
    feeds = ffn_inputs()
    np.testing.assert_allclose(ours.run(None, feeds)[0], stock.run(None, feeds)[0], atol=ATOL, rtol=0)


def test_modelproto_is_accepted_where_ort_needs_bytes(variant):
    model = _model_for(variant)
    with pytest.raises(TypeError):
        onnxruntime.InferenceSession(model)
    ours = ortfuse.InferenceSession(model, fusion={"fusion_off": False, "fusion_on": True}.get(variant))
    stock = onnxruntime.InferenceSession(model.SerializeToString())
    feeds = ffn_inputs()
    np.testing.assert_allclose(ours.run(None, feeds)[0], stock.run(None, feeds)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("source", ["missing_file", "empty_bytes", "garbage_bytes", "int"])
def test_construction_errors_match(variant, source, tmp_path):
    value = {
        "missing_file": str(tmp_path / "absent.onnx"),
        "empty_bytes": b"",
        "garbage_bytes": b"\x08\x07garbage-not-onnx",
        "int": 42,
    }[source]
    fusion = {"fusion_off": False, "fusion_on": True, "fusion_from_metadata": None}[variant]
    a = _outcome(lambda: onnxruntime.InferenceSession(value))
    b = _outcome(lambda: ortfuse.InferenceSession(value, fusion=fusion))
    assert a[0] == "raised" and b == a


def test_invalid_fusion_value_is_a_clear_error():
    with pytest.raises(ValueError, match="fusion must be None, False, True or 'auto'"):
        ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion="yes")


def test_unknown_pattern_id_lists_known_ones():
    with pytest.raises(ValueError, match="known ids are: .*gemm_act"):
        ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion=True, fusion_patterns=["gemm_relu_gleu"])


def test_external_initializers_from_session_options_run_unfused():
    model, name, weights = external_weight_not_on_disk()
    x = np.ones((2, 4), np.float32)

    def options():
        so = onnxruntime.SessionOptions()
        so.add_external_initializers([name], [onnxruntime.OrtValue.ortvalue_from_numpy(weights)])
        return so

    expected = onnxruntime.InferenceSession(model.SerializeToString(), options()).run(None, {"x": x})[0]
    with pytest.warns(UserWarning, match="external"):
        ours = ortfuse.InferenceSession(model.SerializeToString(), options(), fusion=True)
    assert ours.fusion_report.stepped_aside and not ours.fusion_report.applied
    np.testing.assert_array_equal(ours.run(None, {"x": x})[0], expected)
    np.testing.assert_array_equal(expected, x @ weights)


def test_unannotated_model_runs_exactly_as_stock(tmp_path):
    """fusion=None on a model without metadata hands ORT the very same path and options."""
    path = tmp_path / "m.onnx"
    path.write_bytes(ffn_matmul_add_relu().SerializeToString())
    ours = ortfuse.InferenceSession(str(path))
    assert ours._model_path == str(path) and ours._model_bytes is None
    assert not ours.fusion_report.applied
    assert "no fusion metadata" in ours.fusion_report.reason


def test_fusion_disabled_in_metadata_is_honoured():
    model = annotated(ffn_matmul_add_relu(), enabled="false")
    ours = ortfuse.InferenceSession(model)
    assert not ours.fusion_report.applied and "fusion_enabled=false" in ours.fusion_report.reason


def test_fused_variants_really_fuse(variant):
    """The parity above means something only if the fused variants run a rewritten graph."""
    _, ours = _pair(variant)
    if variant == "fusion_off":
        assert not ours.fusion_report.applied
    else:
        assert ours.fusion_report.counts() == {"gemm_act": 1, "add_relu": 1}, ours.fusion_report.table()
        # what ORT loaded (bytes, or the plan cache's file): the GEMM lowered to ORT's own ops
        # (provenance in their doc_string), Add+Relu as the native op
        loaded = ours._model_bytes
        if loaded is None:
            with open(ours._model_path, "rb") as fh:
                loaded = fh.read()
        assert b"FusedAddRelu" in loaded and b"ortfuse gemm_act: replaces mm1,bias1,relu1" in loaded


def test_saving_the_optimized_model_steps_aside(tmp_path):
    """The file ORT writes for optimized_model_filepath must load in stock ORT, so no fused op in it."""
    so = onnxruntime.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ours = ortfuse.InferenceSession(ffn_matmul_add_relu(), so, fusion=True)
    assert not ours.fusion_report.applied and "optimized_model_filepath" in ours.fusion_report.reason
    onnxruntime.InferenceSession(str(tmp_path / "opt.onnx")).run(None, ffn_inputs())


def test_unannotated_model_is_not_parsed(monkeypatch, tmp_path):
    """fusion=None reads the metadata straight from the bytes; the graph is never parsed by onnx."""
    import onnx

    path = tmp_path / "m.onnx"
    path.write_bytes(ffn_matmul_add_relu().SerializeToString())

    def refuse(*args, **kwargs):
        raise AssertionError("onnx parsed an unannotated model")

    monkeypatch.setattr(onnx, "load", refuse)
    monkeypatch.setattr(onnx, "load_from_string", refuse)
    for source in (str(path), path.read_bytes()):
        session = ortfuse.InferenceSession(source)
        assert "no fusion metadata" in session.fusion_report.reason


def test_metadata_scan_equals_onnx_parse():
    from ortfuse.ir import metadata

    model = annotated(ffn_matmul_add_relu(), patterns="add_relu")
    assert metadata.scan_props(model.SerializeToString()) == metadata.read_props(model)
    assert metadata.scan_props(b"\x08\x07garbage-not-onnx") is None
