"""The peers of ``ortfuse bench --peer`` (ortfuse.bench.peers): OpenVINO's CPU plugin runs the same
.onnx file with float32 forced and gives stock ORT's outputs (|peer - ORT_DISABLE_ALL| <= 1e-4 *
max(1, max|ref|): another library's kernels round differently), in the model's output order; an
unknown peer is named in one sentence."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
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


# -- ort-transformers: ORT's own transformer optimizer ----------------------------------------------
def test_ort_transformers_peer_says_how_to_get_sympy(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sympy", None)  # import sympy raises ImportError
    why_not = peers._transformers_optimizer_problem()
    assert "needs sympy" in why_not and peers.SYMPY_HINT in why_not
    with pytest.raises(peers.PeerUnavailable, match="pip install sympy"):
        peers.OrtTransformersSession(b"", threads=1)


def test_ort_transformers_peer_is_named_and_opt_in():
    assert peers.PEERS["ort-transformers"] == "ort_transformers"
    assert "ort_transformers" not in DEFAULT_CONFIGS
    assert peers.available("ort-transformers") == ""  # sympy is part of the test environment


def test_encoder_dims_read_from_the_attention():
    from ortfuse.fusion.rules import attention

    assert peers.encoder_dims(attention._example("dynamo")) == (attention.H, attention.H * attention.D)
    assert peers.encoder_dims(onnx.load_from_string(_conv_bytes())) == (0, 0)


def _conv_bytes() -> bytes:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()



@pytest.mark.slow
def test_ort_transformers_peer_fuses_torchscript_attention_and_keeps_outputs(tmp_path):
    """On the TorchScript-style MiniLM the optimizer fuses Attention (raw 2-D mask) and
    EmbedLayerNormalization; outputs equal stock ORT_DISABLE_ALL for a mask that is not right-padded."""
    from ortfuse import models

    path = str(models.build("minilm_encoder"))
    sess = peers.OrtTransformersSession(path, threads=1)
    assert (sess.num_heads, sess.hidden_size) == (12, 384)
    assert sess.fused_ops.get("Attention") == 6 and sess.fused_ops.get("EmbedLayerNormalization") == 1
    feeds = models.sample_inputs("minilm_encoder", batch=2, dims={"seq": 16})
    feeds["attention_mask"][0, 3] = 0  # a hole, not right padding
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = onnxruntime.InferenceSession(path, so).run(None, feeds)[0]
    got = sess.run(None, feeds)[0]
    assert float(np.abs(got - ref).max()) <= 1e-4 * max(1.0, float(np.abs(ref).max()))


@pytest.mark.parametrize("fails_at", ["creation", "first run"])
def test_a_peer_that_cannot_run_a_model_is_left_out_with_a_note(tmp_path, monkeypatch, fails_at):
    """OpenVINO refuses some real models (silero_vad: a Conv of unknown rank inside If): the bench goes
    on without that peer for that model, says why in the result's notes, and still times the rest."""
    from ortfuse.bench import run

    path = two_output_model(tmp_path / "m.onnx")
    refusal = "Exception from src/core.cpp:84:\nCheck 'false' failed at x.cpp:1:\nModel wasn't fully converted."

    class Refusing:
        def run(self, output_names, feeds):
            raise RuntimeError(refusal)

    made = run.make_session

    def make(name, *args, **kwargs):
        if name == "openvino_f32":
            if fails_at == "creation":
                raise RuntimeError(refusal)
            return Refusing()
        return made(name, *args, **kwargs)

    monkeypatch.setattr(run, "make_session", make)
    doc = run.bench([path], runs=2, repeats=1, warmup=0, memory="off", progress=False,
                    configs=["ort_disable_all", "ort_enable_all", "ort_enable_all_b", "openvino_f32"])
    (res,) = doc["results"]
    assert set(res["configs"]) == {"ort_disable_all", "ort_enable_all", "ort_enable_all_b"}
    assert res["order"] == ["ort_disable_all", "ort_enable_all", "ort_enable_all_b"]
    (note,) = [n for n in res["notes"] if "openvino_f32" in n]
    assert note == "openvino_f32 left out for this model: openvino cannot run it (Model wasn't fully converted.)"
    assert all(len(row["latencies_ms"]) == 1 and len(row["latencies_ms"][0]) == 2 for row in res["configs"].values())


def test_ortfuse_failing_is_never_left_out(tmp_path, monkeypatch):
    from ortfuse.bench import run

    path = two_output_model(tmp_path / "m.onnx")
    made = run.make_session

    def make(name, *args, **kwargs):
        if name == "ortfuse_fused":
            raise RuntimeError("a broken ortfuse session")
        return made(name, *args, **kwargs)

    monkeypatch.setattr(run, "make_session", make)
    with pytest.raises(RuntimeError, match="a broken ortfuse session"):
        run.bench([path], runs=2, repeats=1, warmup=0, memory="off", progress=False,
                  configs=["ort_disable_all", "ort_enable_all", "ortfuse_fused"])
