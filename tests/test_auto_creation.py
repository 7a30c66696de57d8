"""Creating a ``fusion="auto"`` session with nothing known for its model (default ``background`` mode)
decides that from the serialized bytes alone (``ortfuse.tune.lookup``): no onnx import, no parse, on
the creating thread. Wherever decisions may exist, or the bytes need the parsed path's judgement
(external data, a stale annotation, embedded decisions), the parsed path runs as before; and a
model whose bytes digest differently from its parsed graph still gets its cached decisions, from
the live tuning's lookup, without measuring.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime
import pytest

import ortfuse
from ortfuse.ir import metadata
from ortfuse.runtime import live_tuning, planning
from ortfuse.tune import lookup
from ortfuse.tune import measure as measuring
from ortfuse.tune import tuner as tune

from model_fixtures import annotated, external_weight_not_on_disk, ffn_inputs, ffn_matmul_add_relu
from timing_fixtures import raw_timing

WAIT_S = 120
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(tune.ENV, raising=False)


@pytest.fixture(autouse=True)
def tuning_in_thread(monkeypatch):
    """The live tuning measures in its own thread, where the stated timings below replace the clock
    (a tuning process would not see them; tests/test_tune_process.py runs that path)."""
    monkeypatch.setattr(live_tuning, "IN_CHILD", False)


@pytest.fixture
def winning(monkeypatch):
    """Every fusion, and every match fused as a whole, measured twice as fast as ORT."""
    monkeypatch.setattr(measuring, "_best_of", lambda f, o, n: (0.5, 1.0))
    monkeypatch.setattr(measuring, "_time_pair", lambda f, o, budget: (0.5, 1.0, [0.5] * measuring.REPEATS))
    monkeypatch.setattr(measuring, "_time_with_control", lambda f, o, c, budget: raw_timing(0.5, 1.0))


@pytest.fixture
def parsed(monkeypatch):
    """Counts the parses of a model for fusion (``planning.load_for_fusion``) on the creating thread."""
    import threading

    calls: list[bool] = []
    real = planning.load_for_fusion

    def counting(source, sess_options):
        calls.append(threading.current_thread() is threading.main_thread())
        return real(source, sess_options)

    monkeypatch.setattr(planning, "load_for_fusion", counting)
    return calls


def _serve(session, n: int = live_tuning.SAMPLE_RUNS) -> None:
    for i in range(n):
        session.run(None, ffn_inputs(seed=i))


def _reordered_graph_bytes(model: onnx.ModelProto) -> bytes:
    """``model`` serialized with its graph's fields in descending field-number order (a repeated
    field's entries keep theirs): the same model to any protobuf reader, other bytes than protobuf's
    serializer writes (its raw graph digest differs)."""
    data = model.SerializeToString()
    top = list(metadata._fields(data, 0, len(data)))
    start, length = next(v for n, v in top if n == 7)
    spans, pos = [], start
    while pos < start + length:  # (start, end) of each field of the graph message, in order
        key, after_key = metadata._varint(data, pos)
        size, body = metadata._varint(data, after_key)
        assert key & 7 == 2, "the fixture's graph holds length-delimited fields only"
        spans.append((key >> 3, pos, body + size))
        pos = body + size
    graph = b"".join(data[a:b] for _, a, b in sorted(spans, key=lambda span: -span[0]))
    return data[:start - len(_varint(length))] + _varint(len(graph)) + graph + data[start + length:]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_nothing_known_is_decided_without_parsing_and_the_live_tuning_still_swaps(winning, parsed):
    model = ffn_matmul_add_relu()
    session = ortfuse.InferenceSession(model, fusion="auto")
    assert parsed == [], "the creating thread parsed the model"
    assert planning.DEFERRED_NOTE in session.fusion_report.notes and not session.fusion_report.applied
    assert session.fusion_status == f"serving stock ORT, recording feeds (0/{live_tuning.SAMPLE_RUNS})"
    _serve(session)
    assert session.wait_tuned(WAIT_S) and session.fusion_status.startswith("fused since run"), session.fusion_status
    assert parsed and not any(parsed), "the tuning thread parsed it"
    feeds = ffn_inputs(seed=42)
    np.testing.assert_allclose(session.run(None, feeds)[0], onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0], **TOL)


def test_the_bytes_digest_is_the_parsed_graph_digest_of_a_serialized_model():
    model = ffn_matmul_add_relu()
    assert lookup.graph_digest_of(model.SerializeToString()) == metadata.graph_digest(model)
    assert lookup.graph_digest_of(annotated(model).SerializeToString()) == metadata.graph_digest(model)
    assert lookup.graph_digest_of(b"\xff\xff") is None


def test_decisions_on_disk_take_the_parsed_path_and_start_fused(winning, parsed):
    model = ffn_matmul_add_relu()
    first = ortfuse.InferenceSession(model, fusion="auto")
    _serve(first)
    assert first.wait_tuned(WAIT_S) and first.fusion_report.applied, first.fusion_status
    parsed.clear()
    assert lookup.has_tuning_files(metadata.graph_digest(model))
    planning_cache = os.path.join(os.environ["ORTFUSE_CACHE_DIR"], "plans")
    for name in os.listdir(planning_cache):  # no plan cache: the decisions alone must be found
        os.remove(os.path.join(planning_cache, name))
    second = ortfuse.InferenceSession(model, fusion="auto")
    assert parsed == [True] and second.fusion_report.applied and second.wait_tuned(0)
    assert any("decisions cached" in n for n in second.fusion_report.notes), second.fusion_report.notes


def test_what_needs_the_parsed_path_still_gets_it(parsed, tmp_path):
    """External data (ORT's own options supply it here: stepped aside as before), a stale annotation
    (warned as before), embedded decisions, an ORT-format path: the creating thread parses."""
    model, name, weights = external_weight_not_on_disk()
    so = onnxruntime.SessionOptions()
    so.add_external_initializers([name], [onnxruntime.OrtValue.ortvalue_from_numpy(weights)])
    with pytest.warns(UserWarning, match="external"):
        external = ortfuse.InferenceSession(model.SerializeToString(), so, fusion="auto")
    assert external.fusion_report.stepped_aside and parsed == [True]
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(external.run(None, {"x": x})[0], x @ weights)

    stale = annotated(ffn_matmul_add_relu())
    entry = stale.metadata_props.add()
    entry.key, entry.value = metadata.GRAPH_DIGEST, "0" * 16
    with pytest.warns(UserWarning, match="stale|another graph"):
        ortfuse.InferenceSession(stale.SerializeToString())  # fusion=None: the metadata asks auto
    assert parsed == [True, True]

    embedded = annotated(ffn_matmul_add_relu())
    entry = embedded.metadata_props.add()
    entry.key, entry.value = metadata.AUTO_DECISIONS, "{}"
    ortfuse.InferenceSession(embedded.SerializeToString(), fusion="auto")
    assert parsed == [True, True, True]


def test_bytes_that_digest_otherwise_find_their_decisions_in_the_live_tuning(winning, parsed, monkeypatch):
    model = ffn_matmul_add_relu()
    data = _reordered_graph_bytes(model)
    assert metadata.graph_digest(onnx.load_from_string(data)) == metadata.graph_digest(model)
    assert lookup.graph_digest_of(data) != metadata.graph_digest(model)
    first = ortfuse.InferenceSession(model, fusion="auto")
    _serve(first)
    assert first.wait_tuned(WAIT_S) and first.fusion_report.applied, first.fusion_status
    parsed.clear()
    monkeypatch.setattr(measuring, "whole_plan", lambda *a, **k: pytest.fail("measured despite cached decisions"))
    monkeypatch.setattr(measuring, "measure", lambda *a, **k: pytest.fail("measured despite cached decisions"))
    second = ortfuse.InferenceSession(data, fusion="auto")
    assert parsed == [] and not second.fusion_report.applied  # nothing found from the bytes: stock at once
    _serve(second)
    assert second.wait_tuned(WAIT_S) and second.fusion_status.startswith("fused since run"), second.fusion_status


@pytest.mark.slow
def test_a_fresh_process_creates_auto_without_importing_onnx_or_numba(tmp_path):
    path = tmp_path / "ffn.onnx"
    onnx.save(ffn_matmul_add_relu(), str(path))
    code = ("import sys, ortfuse\n"
            f"s = ortfuse.InferenceSession({str(path)!r}, fusion='auto')\n"
            "print(s.fusion_status, 'onnx' in sys.modules, 'numba' in sys.modules)\n")
    env = {**os.environ, "ORTFUSE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop(tune.ENV, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("recording feeds (0/8) False False"), done.stdout
