"""ortfuse-annotate and the metadata contract: metadata-only annotation leaves the graph untouched
and still runs on stock ORT; --rewrite saves a fused graph that ortfuse loads; reports are JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime
import pytest

import ortfuse
from ortfuse.cli.annotate import main as annotate_main
from ortfuse.ir import metadata

from model_fixtures import ffn_inputs, ffn_matmul_add_relu


@pytest.fixture
def ffn_path(tmp_path):
    path = tmp_path / "ffn.onnx"
    onnx.save(ffn_matmul_add_relu(), str(path))
    return path


def _stock(path, feeds):
    return onnxruntime.InferenceSession(str(path)).run(None, feeds)[0]


def test_metadata_only_annotation_keeps_graph_and_runs_on_stock_ort(ffn_path, tmp_path):
    out = tmp_path / "annotated.onnx"
    # the former id, as the project's examples spell it, names the renamed pattern; the current id is written
    assert annotate_main([str(ffn_path), "--pattern", "gemm_relu_gelu", "-o", str(out)]) == 0
    before, after = onnx.load(str(ffn_path)), onnx.load(str(out))
    assert after.graph == before.graph
    props = metadata.read_props(after)
    assert props["fusion_enabled"] == "true" and props["fusion_pattern_id"] == "gemm_act"
    assert props["ortfuse_graph_digest"] == metadata.graph_digest(before)
    assert props["ortfuse_version"] == ortfuse.ortfuse_version
    meta = onnxruntime.InferenceSession(str(out)).get_modelmeta().custom_metadata_map
    assert meta["fusion_pattern_id"] == "gemm_act"
    feeds = ffn_inputs()
    session = ortfuse.InferenceSession(str(out))  # fusion=None follows the metadata
    assert session.fusion_report.counts() == {"gemm_act": 1}
    np.testing.assert_allclose(session.run(None, feeds)[0], _stock(ffn_path, feeds), rtol=1e-5, atol=1e-5)


def test_rewrite_round_trip(ffn_path, tmp_path):
    out, report = tmp_path / "fused.onnx", tmp_path / "report.json"
    assert annotate_main([str(ffn_path), "--all", "--rewrite", "-o", str(out), "--report", str(report)]) == 0
    fused = onnx.load(str(out))
    assert any(n.domain == "ai.onnx.contrib" for n in fused.graph.node)
    data = json.loads(report.read_text())
    assert {m["pattern_id"] for m in data["matches"] if m["decision"] == "fused"} == {"gemm_act", "add_relu"}
    with pytest.raises(Exception, match="ai.onnx.contrib:FusedAddRelu"):
        onnxruntime.InferenceSession(str(out))  # stock ORT cannot run a rewritten model ...
    session = ortfuse.InferenceSession(str(out))  # ... ortfuse can, and reports the provenance
    assert session.fusion_report.counts() == {"gemm_act": 1, "add_relu": 1}
    assert ["mm1", "bias1", "relu1"] in [m.nodes for m in session.fusion_report.matches]
    feeds = ffn_inputs()
    np.testing.assert_allclose(session.run(None, feeds)[0], _stock(ffn_path, feeds), rtol=1e-5, atol=1e-5)


def test_a_model_annotated_with_a_former_pattern_id_fuses_that_pattern(ffn_path, tmp_path):
    model = onnx.load(str(ffn_path))
    metadata.write_props(model, {metadata.FUSION_ENABLED: "true", metadata.FUSION_PATTERN_ID: "gemm_relu_gelu",
                                 metadata.GRAPH_DIGEST: metadata.graph_digest(model)})
    out = tmp_path / "old.onnx"
    onnx.save(model, str(out))
    feeds = ffn_inputs()
    session = ortfuse.InferenceSession(str(out))  # annotated before the rename: fusion=None follows it
    assert session.fusion_report.counts() == {"gemm_act": 1}
    np.testing.assert_allclose(session.run(None, feeds)[0], _stock(ffn_path, feeds), rtol=1e-5, atol=1e-5)
    named = ortfuse.InferenceSession(str(ffn_path), fusion=True, fusion_patterns=["gemm_relu_gelu"])
    assert named.fusion_report.counts() == {"gemm_act": 1}


def test_disable_writes_false_and_is_honoured(ffn_path):
    assert annotate_main([str(ffn_path), "--disable"]) == 0
    session = ortfuse.InferenceSession(str(ffn_path))
    assert not session.fusion_report.applied and "fusion_enabled=false" in session.fusion_report.reason


def test_unknown_pattern_is_a_clear_error(ffn_path, capsys):
    assert annotate_main([str(ffn_path), "--pattern", "gemm_relu_gleu"]) == 2
    err = capsys.readouterr().err
    assert "unknown fusion pattern id(s) 'gemm_relu_gleu'" in err and "conv_act" in err


def test_unreadable_model_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert annotate_main([str(bad), "--all"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_unknown_pattern_in_metadata_lists_known_ids():
    model = ffn_matmul_add_relu()
    metadata.write_props(model, {"fusion_enabled": "true", "fusion_pattern_id": "nope"})
    with pytest.raises(ValueError, match="known ids are"):
        ortfuse.InferenceSession(model)


def test_malformed_fusion_enabled_is_a_clear_error():
    model = ffn_matmul_add_relu()
    metadata.write_props(model, {"fusion_enabled": "maybe"})
    with pytest.raises(ValueError, match="fusion_enabled='maybe' is not 'true' or 'false'"):
        ortfuse.InferenceSession(model)


def test_console_scripts_and_report_command(ffn_path):
    out = subprocess.run([sys.executable, "-m", "ortfuse", "report", str(ffn_path), "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["applied"] is True
    table = subprocess.run(["ortfuse-annotate", str(ffn_path), "--pattern", "add_relu"],
                           capture_output=True, text=True, check=True).stdout
    assert "add_relu" in table and "wrote" in table


def test_stale_annotation_warns_and_is_matched_again(ffn_path, tmp_path):
    """An annotated model whose graph was edited afterwards: warn, match the graph as it is now."""
    assert annotate_main([str(ffn_path), "--pattern", "add_relu"]) == 0
    model = onnx.load(str(ffn_path))
    relu = next(n for n in model.graph.node if n.name == "relu_out")
    relu.op_type = "Sigmoid"  # the residual Add no longer ends in Relu
    edited = tmp_path / "edited.onnx"
    onnx.save(model, str(edited))
    with pytest.warns(UserWarning, match="annotation was written for another graph"):
        session = ortfuse.InferenceSession(str(edited))
    assert session.fusion_report.counts() == {}
    assert any("stale annotation" in n for n in session.fusion_report.notes)
    feeds = ffn_inputs()
    np.testing.assert_allclose(session.run(None, feeds)[0], _stock(edited, feeds), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("content", [None, b"", b"not a model"])
def test_report_command_bad_model_is_one_clear_line(tmp_path, content):
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    result = subprocess.run([sys.executable, "-m", "ortfuse", "report", str(path)], capture_output=True, text=True)
    if content == b"":  # an empty file parses as an empty ModelProto: nothing to fuse, no crash
        assert result.returncode == 0 and "imports no ai.onnx opset" in result.stdout
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("ortfuse report: cannot read")
