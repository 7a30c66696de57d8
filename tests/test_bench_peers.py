"""The peers of ``ortfuse bench --peer`` (ortfuse.bench.peers): OpenVINO's CPU plugin runs the same
.onnx file with float32 forced and gives stock ORT's outputs (|peer - ORT_DISABLE_ALL| <= 1e-4 *
max(1, max|ref|): another library's kernels round differently), in the model's output order; an
unknown peer is named in one sentence."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import helper, numpy_helper

from ortfuse.bench import peers
from ortfuse.bench.sessions import CONFIGS, DEFAULT_CONFIGS, make_session


def two_output_model(path):
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["a"]),
             helper.make_node("ReduceMean", ["c"], ["b"], axes=[2, 3], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, 9, 9])],
                              [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, ["n", 6, 9, 9]),
                               helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, ["n", 6])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), str(path))
    return str(path)


def test_openvino_peer_runs_the_model_in_orts_output_order_with_f32_forced(tmp_path):
    path = two_output_model(tmp_path / "m.onnx")
    assert peers.available("openvino") == ""
    sess = make_session(peers.PEERS["openvino"], path, threads=1)
    assert "32" in sess.precision
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref_sess = onnxruntime.InferenceSession(path, so)
    for batch in (1, 3):  # a dynamic batch dimension
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 3, 9, 9)).astype(np.float32)}
        got, ref = sess.run(None, feeds), ref_sess.run(None, feeds)
        assert [g.shape for g in got] == [r.shape for r in ref] == [(batch, 6, 9, 9), (batch, 6)]
        for g, r in zip(got, ref):
            assert float(np.abs(g - r).max()) <= 1e-4 * max(1.0, float(np.abs(r).max()))


def test_peers_are_opt_in_configurations():
    assert peers.PEERS["openvino"] in CONFIGS and peers.PEERS["openvino"] not in DEFAULT_CONFIGS
    assert "unknown peer 'tvm'" in peers.available("tvm")
