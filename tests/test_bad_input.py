"""Bad input, model side and metadata side: for every fusion value (None, False, True, "auto")
ortfuse raises the exception class stock ORT raises for the same input, with ORT's own message in
it, and leaves the caller's SessionOptions usable. Extends test_session_api_parity.py
(``test_construction_errors_match``: missing file, empty / garbage bytes, a non-model argument) and
test_annotate.py (unknown pattern id, malformed fusion_enabled, stale digest, --disable)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import ortfuse
from ortfuse.ir import metadata

from model_fixtures import annotated, ffn_inputs, ffn_matmul_add_relu

FUSIONS = [None, False, True, "auto"]
ATOL = 1e-5


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _ffn(edit=None, annotate: bool = False) -> onnx.ModelProto:
    """The FFN fixture (MatMul+Add+Relu, MatMul+Add, Add+Relu), edited, optionally annotated."""
    model = ffn_matmul_add_relu()
    if annotate:
        model = annotated(model, patterns="gemm_act,add_relu")
    if edit is not None:
        edit(model)
    return model


def _set(path, value):
    def edit(m):
        obj = m
        for part in path[:-1]:
            obj = obj[part] if isinstance(part, int) else getattr(obj, part)
        setattr(obj, path[-1], value)
    return edit


def _dup_definition(m):
    m.graph.node[1].output[0] = "h0"  # bias1 writes h0, which mm1 defines: no hang


def _cycle(m):
    m.graph.node[0].input[0] = "h2"  # mm1 reads relu1's output


def _dangling(m):
    m.graph.node[0].input[1] = "nonexistent"


def _unknown_op(m):
    m.graph.node[2].op_type = "NoSuchOp"


def _no_opset(m):
    del m.opset_import[:]


def _truncated_initializer(m):
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:10]  # ORT's error, not a ValueError of ours


def _relabelled_initializer(m):
    m.graph.initializer[1].data_type = TensorProto.DOUBLE  # ORT's error, not a ValueError of ours


def _bad_attribute_in_fused_nodes(m):
    m.graph.node[2].attribute.append(helper.make_attribute("alpha", 0.5))  # Relu has no alpha


def _unknown_domain_after_fusable_nodes(m):
    """Fusable nodes, then an op ORT has no kernel for: fusion applies, then ORT fails."""
    m.graph.node.append(helper.make_node("Mystery", ["z"], ["q"], domain="com.unknown"))
    m.graph.output.append(helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", "seq", 16]))
    m.opset_import.append(helper.make_opsetid("com.unknown", 1))


BAD_MODELS = {
    "ir_version_99": _set(["ir_version"], 99),
    "opset_99": lambda m: setattr(m.opset_import[0], "version", 99),
    "opset_1_below_ort": lambda m: setattr(m.opset_import[0], "version", 1),
    "no_opset_import": _no_opset,
    "dangling_input": _dangling,
    "unknown_op": _unknown_op,
    "duplicate_definition": _dup_definition,
    "cycle": _cycle,
    "truncated_initializer": _truncated_initializer,
    "relabelled_initializer": _relabelled_initializer,
    "bad_attribute_in_fused_nodes": _bad_attribute_in_fused_nodes,
    "unknown_domain_after_fusable_nodes": _unknown_domain_after_fusable_nodes,
}


def _bytes_of(kind: str) -> bytes:
    data = ffn_matmul_add_relu().SerializeToString()
    if kind == "truncated":
        return data[: len(data) // 2]
    if kind == "bitflips":
        return bytes(b ^ 0x5A if i % 7 == 0 else b for i, b in enumerate(data))
    if kind == "png":
        return b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    if kind == "text":
        return b"ir_version: 8\ngraph { node { op_type: 'Relu' } }\n"  # protobuf *text* format: not loadable
    raise KeyError(kind)


def _outcome(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", fn(), ""
        except Exception as exc:  # type and message are what is compared
            return "raised", type(exc), str(exc)


def _core(message: str) -> str:
    """ORT's message without its '[ONNXRuntimeError] : N : CODE :' prefix and 'Load model from P failed:'
    (ortfuse may load a fused copy from another path), and without source locations."""
    core = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message.strip())
    core = re.sub(r"^Load model from .*? failed:", "", core)
    return re.sub(r"/onnxruntime_src/\S+:\d+ ", "", core).strip()[:150]


def _assert_same_error(stock, ours, what):
    assert stock[0] == "raised", f"stock ORT accepted {what}: the case does not test what it says"
    assert ours[0] == "raised", f"ortfuse accepted {what}, stock ORT raised {stock[1].__name__}: {stock[2][:200]}"
    assert ours[1] is stock[1], f"{what}: ortfuse raised {ours[1].__name__}: {ours[2][:300]}; " \
                                f"stock {stock[1].__name__}: {stock[2][:300]}"
    assert _core(stock[2]) in ours[2], f"{what}: ORT's message is not in ortfuse's:\n{stock[2][:300]}\n{ours[2][:300]}"


def _assert_options_still_work(so):
    """The options that saw a failed construction run the good model on stock ORT and on ortfuse,
    with the right numbers."""
    good = ffn_matmul_add_relu()
    feeds = ffn_inputs()
    expected = onnxruntime.InferenceSession(good.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(onnxruntime.InferenceSession(good.SerializeToString(), so).run(None, feeds)[0],
                               expected, atol=ATOL, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = ortfuse.InferenceSession(good, so, fusion=True)
    assert ours.fusion_report.applied, ours.fusion_report.table()
    np.testing.assert_allclose(ours.run(None, feeds)[0], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fusion", FUSIONS, ids=str)
@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_invalid_model_raises_like_stock(case, fusion):
    """An invalid model, annotated or not: ORT's exception class and message, options reusable."""
    for annotate in ((False, True) if fusion is None else (False,)):  # metadata matters to fusion=None only
        data = _ffn(BAD_MODELS[case], annotate=annotate).SerializeToString()
        so = onnxruntime.SessionOptions()
        stock = _outcome(lambda d=data: onnxruntime.InferenceSession(d))
        ours = _outcome(lambda d=data, o=so: ortfuse.InferenceSession(d, o, fusion=fusion))
        _assert_same_error(stock, ours, f"{case} (annotated={annotate}, fusion={fusion})")
    if fusion is True:  # the value under which ortfuse registers the most on the options
        _assert_options_still_work(so)


@pytest.mark.parametrize("fusion", FUSIONS, ids=str)
@pytest.mark.parametrize("kind", ["truncated", "bitflips", "png", "text"])
@pytest.mark.parametrize("source", ["bytes", "file"])
def test_unreadable_bytes_raise_like_stock(kind, source, fusion, tmp_path):
    """Truncated or corrupted model bytes and non-ONNX files, given as bytes or as a path."""
    data = _bytes_of(kind)
    arg = data
    if source == "file":
        arg = str(tmp_path / f"{kind}.onnx")
        with open(arg, "wb") as fh:
            fh.write(data)
    stock = _outcome(lambda: onnxruntime.InferenceSession(arg))
    ours = _outcome(lambda: ortfuse.InferenceSession(arg, fusion=fusion))
    _assert_same_error(stock, ours, f"{kind} {source}")


@pytest.mark.parametrize("fusion", FUSIONS, ids=str)
@pytest.mark.parametrize("kind", ["empty_file", "directory", "missing_in_missing_dir"])
def test_bad_paths_raise_like_stock(kind, fusion, tmp_path):
    path = {"empty_file": tmp_path / "empty.onnx", "directory": tmp_path,
            "missing_in_missing_dir": tmp_path / "no" / "such" / "m.onnx"}[kind]
    if kind == "empty_file":
        path.write_bytes(b"")
    stock = _outcome(lambda: onnxruntime.InferenceSession(str(path)))
    ours = _outcome(lambda: ortfuse.InferenceSession(str(path), fusion=fusion))
    _assert_same_error(stock, ours, kind)


@pytest.mark.parametrize("fusion", FUSIONS, ids=str)
@pytest.mark.parametrize("case", ["dangling_input", "unknown_domain_after_fusable_nodes"])
def test_invalid_model_in_a_file_names_the_file_like_stock(case, fusion, tmp_path):
    """A file ORT rejects: ortfuse's message names the file the caller gave, as ORT's does, also when
    ORT failed on the fused copy ortfuse handed it (whose path ORT would name)."""
    path = tmp_path / f"{case}.onnx"
    path.write_bytes(_ffn(BAD_MODELS[case]).SerializeToString())
    stock = _outcome(lambda: onnxruntime.InferenceSession(str(path)))
    ours = _outcome(lambda: ortfuse.InferenceSession(str(path), fusion=fusion))
    _assert_same_error(stock, ours, f"{case} in a file")
    assert f"Load model from {path}" in stock[2]
    if fusion == "auto" and case == "unknown_domain_after_fusable_nodes":
        return  # the auto tuner's own measuring session (from bytes) raises first: ORT's class and text, no path
    assert f"Load model from {path}" in ours[2], ours[2][:300]


# ------------------------------------------------------------------------------------------------
# metadata
# ------------------------------------------------------------------------------------------------
def _with_props(**props) -> onnx.ModelProto:
    model = ffn_matmul_add_relu()
    metadata.write_props(model, props)
    return model


@pytest.mark.parametrize(("props", "message"), [
    ({"fusion_enabled": "true", "fusion_pattern_id": ","}, "names no pattern"),
    ({"fusion_enabled": "true", "fusion_pattern_id": "add_relu,no_such_pattern"}, "known ids are: .*add_relu"),
    ({"fusion_enabled": "yes"}, "fusion_enabled='yes' is not 'true' or 'false'"),
])
@pytest.mark.parametrize("fusion", [None, True, "auto"], ids=str)
def test_malformed_metadata_is_a_clear_error_and_registers_nothing(props, message, fusion, tmp_path, monkeypatch):
    """Malformed fusion metadata is the user's to fix: a ValueError that says what is wrong (and for
    an unknown id, the known ones), raised before anything is registered on the caller's options;
    also by auto with nothing known here (an empty cache), which creates without parsing the model."""
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    so = onnxruntime.SessionOptions()
    with pytest.raises(ValueError, match=message):
        ortfuse.InferenceSession(_with_props(**props), so, fusion=fusion)
    with pytest.raises(RuntimeError):  # ORT raises for a config key that was never set
        so.get_session_config_entry("ortfuse.custom_ops_registered")
    _assert_options_still_work(so)


def test_malformed_metadata_is_ignored_when_fusion_is_off():
    """fusion=False never reads the metadata: the model runs as stock ORT runs it."""
    model = _with_props(fusion_enabled="yes", fusion_pattern_id="no_such_pattern")
    ours = ortfuse.InferenceSession(model, fusion=False)
    stock = onnxruntime.InferenceSession(model.SerializeToString())
    np.testing.assert_array_equal(ours.run(None, ffn_inputs())[0], stock.run(None, ffn_inputs())[0])


@pytest.mark.parametrize(("enabled", "fuses"), [("TRUE", True), (" true ", True), ("False", False), ("false", False)])
def test_fusion_enabled_spelling(enabled, fuses):
    """fusion_enabled is read case- and space-insensitively; false is honoured by fusion=None."""
    model = annotated(ffn_matmul_add_relu(), enabled=enabled, patterns="add_relu")
    session = ortfuse.InferenceSession(model)
    assert session.fusion_report.applied is fuses, session.fusion_report.table()
    if not fuses:
        assert "fusion_enabled=false" in session.fusion_report.reason
        assert session._model_bytes == model.SerializeToString()  # the very bytes ORT would get
    stock = onnxruntime.InferenceSession(model.SerializeToString())
    np.testing.assert_allclose(session.run(None, ffn_inputs())[0], stock.run(None, ffn_inputs())[0], atol=ATOL, rtol=0)


def test_stale_annotation_with_edited_weights_never_applies_the_old_rewrite():
    """Annotate, load (which caches the plan), then change a weight without re-annotating: the digest
    no longer matches, ortfuse warns, matches the graph again, and computes with the *new* weights."""
    model = annotated(ffn_matmul_add_relu(), patterns="gemm_act,add_relu")
    metadata.write_props(model, {metadata.GRAPH_DIGEST: metadata.graph_digest(model)})
    first = ortfuse.InferenceSession(model)
    assert first.fusion_report.applied
    edited = _copy(model)
    w1 = onnx.numpy_helper.to_array(edited.graph.initializer[0]) * -2.0
    edited.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w1.astype(np.float32), "W1"))
    with pytest.warns(UserWarning, match="annotation was written for another graph"):
        second = ortfuse.InferenceSession(edited)
    assert second.fusion_report.applied and any("stale" in n for n in second.fusion_report.notes)
    feeds = ffn_inputs()
    new = onnxruntime.InferenceSession(edited.SerializeToString()).run(None, feeds)[0]
    old = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    assert not np.allclose(new, old, atol=1e-3), "the edit must change the result for this test to mean anything"
    np.testing.assert_allclose(second.run(None, feeds)[0], new, atol=ATOL, rtol=0)
    np.testing.assert_allclose(first.run(None, feeds)[0], old, atol=ATOL, rtol=0)
