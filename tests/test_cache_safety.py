"""The cache never serves a stale plan, never runs code it did not build, and keeps models private
(docs/ARCHITECTURE.md §7): every case with real files and, where it matters, real processes."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import ortfuse
from ortfuse.runtime import files, plan_cache

TOL = dict(rtol=1e-4, atol=1e-4)  # fused vs stock ORT, float32


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    # digests remembered at once, as for files older than RACY_S
    monkeypatch.setattr(files, "RACY_S", 0.0, raising=False)


def tiny_cnn(seed: int) -> onnx.ModelProto:
    """Conv 3x3 + SiLU -> Conv 1x1: the weights from ``seed``, the same bytes size for every seed."""
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 3, name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["m1"]),
             helper.make_node("Conv", ["m1", "w2"], ["y"])]
    x, y = (helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 8, 12, 12]) for n in "xy")
    graph = helper.make_graph(nodes, "cnn", [x], [y],
                              [w("w1", 16, 8, 3, 3), w("b1", 16), w("w2", 8, 16, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cnn_feed() -> dict:
    return {"x": np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)}


def stock(path: str) -> np.ndarray:
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, cnn_feed())[0]


def replace_keeping_stat(path: str, write) -> None:
    """Rewrite ``path`` with ``write(path)`` and set its mtime back, as ``cp -p``, ``rsync -t`` and
    reproducible images do: same size, same mtime, other bytes."""
    st = os.stat(path)
    write(path)
    assert os.stat(path).st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300, check=False)


# ------------------------------------------------------------------ 1. plan identity by content

def test_a_replaced_model_of_the_same_size_and_mtime_is_planned_again(tmp_path):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path)
    first = ortfuse.InferenceSession(path, fusion=True)
    assert first.fusion_report.applied
    np.testing.assert_allclose(first.run(None, cnn_feed())[0], stock(path), **TOL)
    replace_keeping_stat(path, lambda p: onnx.save(tiny_cnn(2), p))
    second = ortfuse.InferenceSession(path, fusion=True)
    assert second.fusion_report.applied
    np.testing.assert_allclose(second.run(None, cnn_feed())[0], stock(path), **TOL)
    # a fresh process, which reads the digests remembered on disk, gets the new weights too
    proc = python(f"""
        import numpy as np, ortfuse
        x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)
        np.save({str(tmp_path / 'out.npy')!r}, ortfuse.InferenceSession({path!r}, fusion=True).run(None, {{"x": x}})[0])
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), stock(path), **TOL)


def test_replaced_external_data_is_planned_again(tmp_path):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    first = ortfuse.InferenceSession(path, fusion=True)
    assert first.fusion_report.applied
    np.testing.assert_allclose(first.run(None, cnn_feed())[0], stock(path), **TOL)
    other = tmp_path / "other"
    other.mkdir()
    onnx.save(tiny_cnn(2), str(other / "cnn.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.bin", size_threshold=0)
    assert (other / "cnn.onnx").read_bytes() == pathlib.Path(path).read_bytes()  # only the weights file differs
    replace_keeping_stat(str(tmp_path / "w.bin"), lambda p: pathlib.Path(p).write_bytes((other / "w.bin").read_bytes()))
    second = ortfuse.InferenceSession(path, fusion=True)
    assert second.fusion_report.applied
    np.testing.assert_allclose(second.run(None, cnn_feed())[0], stock(path), **TOL)


def test_a_warm_creation_reads_no_model_bytes(tmp_path, monkeypatch):
    """The digest of a file state is computed once: a second session hashes nothing."""
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path)
    ortfuse.InferenceSession(path, fusion=True)
    monkeypatch.setattr(files, "_digests", {})  # as in a fresh process: only the digests on disk
    hashed = []
    real = files.model_bytes
    monkeypatch.setattr(files, "model_bytes", lambda source: hashed.append(source) or real(source))
    session = ortfuse.InferenceSession(path, fusion=True)
    assert any(n.startswith("plan read from ortfuse's cache") for n in session.fusion_report.notes)
    assert hashed == []


def test_a_plan_made_while_its_model_changed_is_not_stored(tmp_path, monkeypatch):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path)
    cache_key = plan_cache.key(path, None, True, None, None)
    onnx.save(tiny_cnn(2), path)  # between the key and the store, as a deployment writing the file would
    assert plan_cache.store(cache_key, {"report": {}}, b"fused", []) is None
    assert plan_cache.load(cache_key) is None
