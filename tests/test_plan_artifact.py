"""A tuned plan as one file (``ortfuse tune MODEL --export PLAN``, ``ortfuse.runtime.plan_artifact``):
a fresh process with an empty cache given it serves fused from its first run without tuning; a plan
file with a flipped byte, for other model bytes, another CPU or other versions is refused with its
reason and the session carries on as ``fusion="auto"`` does without it.

Tuning is made cheap and machine-independent by the ``winning`` fixture (every fusion timed twice as
fast as ORT): only the times are stated, the plan is made, checked and exported as in production.
Outputs are compared with stock ORT at ORT_DISABLE_ALL within 1e-4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_live_tuning import winning  # noqa: F401 - the fixture

import ortfuse
from ortfuse.runtime import plan_artifact

from model_fixtures import ffn_inputs, ffn_matmul_add_relu

RECORDING = "serving stock ORT, recording feeds (0/"


@pytest.fixture
def exported(tmp_path, monkeypatch, winning):  # noqa: F811 - the imported fixture
    """(model path, plan path): the FFN tuned and exported with a cache of its own."""
    from ortfuse.cli import main

    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "exporter"))
    path, plan = tmp_path / "ffn.onnx", tmp_path / "ffn.plan"
    onnx.save(ffn_matmul_add_relu(), str(path))
    assert main(["tune", str(path), "--batch", "2", "--export", str(plan)]) == 0
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "replica"))  # the sessions' cache: empty
    return str(path), str(plan)


CHILD = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import onnxruntime
    import ortfuse
    path, feeds = sys.argv[1], {"x": np.random.default_rng(3).standard_normal((2, 5, 16)).astype(np.float32)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = ortfuse.InferenceSession(path, fusion="auto")
        applied, status = session.fusion_report.applied, session.fusion_status
        got = session.run(None, feeds)
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    print(json.dumps({"applied": applied, "status": status, "notes": session.fusion_report.notes,
                      "warnings": [str(w.message) for w in caught if "ortfuse" in str(w.message)],
                      "error": max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))}))
""")


def test_a_fresh_process_given_the_plan_serves_fused_from_its_first_run(exported, tmp_path):
    path, plan = exported
    env = {**os.environ, "ORTFUSE_CACHE_DIR": str(tmp_path / "fresh"), "ORTFUSE_PLAN": plan}
    done = subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["applied"] and out["status"].startswith("fused"), out
    assert out["warnings"] == [] and any("installed in the plan cache" in n for n in out["notes"]), out
    assert out["error"] <= 1e-4
    assert not (tmp_path / "fresh" / "tuning").exists() or not any((tmp_path / "fresh" / "tuning").iterdir())


def test_the_config_entry_names_the_plan_in_process(exported):
    path, plan = exported
    so = ortfuse.SessionOptions()
    so.add_session_config_entry(plan_artifact.PLAN_OPTION, plan)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session = ortfuse.InferenceSession(path, so, fusion="auto")
    assert session.fusion_report.applied and not session._ortfuse_live.recording
    _check_against_stock(session, path)


def _refused(path: str, plan: str, reason: str):
    with pytest.warns(UserWarning, match=reason):
        session = ortfuse.InferenceSession(path, fusion="auto", plan=plan)
    assert not session.fusion_report.applied
    assert session.fusion_status.startswith(RECORDING)  # auto without a plan: stock ORT, tuning on live feeds
    assert any(reason in n for n in session.fusion_report.notes)
    _check_against_stock(session, path)
    return session


def test_a_flipped_byte_is_refused_before_anything_is_read(exported):
    path, plan = exported
    raw = bytearray(Path(plan).read_bytes())
    raw[-100] ^= 0x01  # inside the fused model, the last member
    Path(plan).write_bytes(bytes(raw))
    _refused(path, plan, "integrity digest does not match")


def test_a_plan_for_other_model_bytes_is_refused(exported, tmp_path):
    _, plan = exported
    other = tmp_path / "other.onnx"
    onnx.save(ffn_matmul_add_relu(seed=1), str(other))
    _refused(str(other), plan, "other model bytes")


def _resigned(plan: str, change) -> None:
    """Edit the plan's description and sign it again (as anyone with ortfuse could)."""
    members = plan_artifact.read(plan)
    content = json.loads(members[plan_artifact.PLAN_MEMBER])
    change(content["valid_for"])
    members[plan_artifact.PLAN_MEMBER] = json.dumps(content).encode()
    plan_artifact.write(plan, list(members.items()))


def test_a_plan_from_another_cpu_is_refused_by_the_fingerprint_check(exported):
    path, plan = exported
    _resigned(plan, lambda valid: valid.update(cpu="model name: another CPU | flags: sse2"))
    plan_artifact.read(plan)  # its integrity holds: the refusal below is the fingerprint's
    _refused(path, plan, "another CPU")


def test_a_plan_made_with_other_versions_is_refused(exported):
    path, plan = exported
    _resigned(plan, lambda valid: valid["versions"].update(onnxruntime="0.0.1"))
    _refused(path, plan, "made with onnxruntime 0.0.1")


def test_plan_needs_auto_and_a_missing_file_is_one_sentence(exported, tmp_path):
    path, _ = exported
    with pytest.raises(ValueError, match="fusion='auto' sessions only"):
        ortfuse.InferenceSession(path, fusion=True, plan="x.plan")
    _refused(path, str(tmp_path / "missing.plan"), "cannot be read")
    (tmp_path / "junk.plan").write_bytes(b"PK\x03\x04 not a plan")
    _refused(path, str(tmp_path / "junk.plan"), "not an ortfuse plan")


def _check_against_stock(session, path: str) -> None:
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    stock = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feeds = ffn_inputs(batch=2, seq=5)
    for got, want in zip(session.run(None, feeds), stock.run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
