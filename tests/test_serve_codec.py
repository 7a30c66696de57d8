"""``ortfuse serve``'s formats, checks and batching without a Ray instance (ortfuse.serve.signature,
codec, batching, and the ingress and replica classes in this process): a request the model cannot
run is a 4xx with one sentence saying what to send; the outputs that come back are stock ORT's for
the request's own inputs (ORT_DISABLE_ALL, within ``TOL``: fusion=True sums in another order), also
when requests were batched; a replica that dies under a request has it sent again, then a 503 with
a retriable message. The Ray side (replicas, a kill under load, the plan store): test_serve_ray.py."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from ray.exceptions import ActorDiedError

from ortfuse.serve import batching, codec
from ortfuse.serve.ingress import Ingress
from ortfuse.serve.replica import ModelReplica
from ortfuse.serve.signature import RequestError, Signature, TensorSpec, UnsupportedModel

TOL = 1e-4

SIGNATURE = Signature(
    inputs=(TensorSpec("x", "float32", ("batch", 3, 8, "width")), TensorSpec("mask", "int64", ("batch", "width"))),
    outputs=(TensorSpec("y", "float32", ("batch", 4, 6, None)),))


def _feeds(batch=2, width=8, dtype=np.float32):
    rng = np.random.default_rng(batch * 100 + width)
    return {"x": rng.standard_normal((batch, 3, 8, width)).astype(dtype),
            "mask": rng.integers(0, 2, (batch, width)).astype(np.int64)}


def _json_body(feeds: dict, **override) -> bytes:
    inputs = {name: {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.ravel().tolist()}
              for name, a in feeds.items()}
    inputs.update(override)
    return json.dumps({"inputs": inputs}).encode()


def _npz_body(feeds: dict) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **feeds)
    return buffer.getvalue()


def _refused(body: bytes, content_type=codec.JSON, signature=SIGNATURE) -> RequestError:
    with pytest.raises(RequestError) as caught:
        signature.check(codec.decode(body, content_type, signature))
    message = str(caught.value)
    assert "\n" not in message and ": " in message, message  # one sentence: what is wrong, then what to send
    return caught.value


def test_json_and_npz_decode_to_the_arrays_sent():
    feeds = _feeds()
    for body, kind in ((_json_body(feeds), codec.JSON), (_npz_body(feeds), codec.NPZ)):
        got = codec.decode(body, kind + "; charset=utf-8" if kind == codec.JSON else kind, SIGNATURE)
        SIGNATURE.check(got)
        assert got.keys() == feeds.keys()
        for name, array in feeds.items():
            assert got[name].dtype == array.dtype and np.array_equal(got[name], array)


def test_json_short_form_and_defaults_take_the_models_dtype():
    feeds = _feeds(batch=1, width=2)
    nested = {"x": feeds["x"].tolist(), "mask": {"data": feeds["mask"].tolist()}}
    got = codec.decode(json.dumps({"inputs": nested}).encode(), codec.JSON, SIGNATURE)
    SIGNATURE.check(got)
    assert got["x"].dtype == np.float32 and got["mask"].dtype == np.int64
    assert np.allclose(got["x"], feeds["x"]) and np.array_equal(got["mask"], feeds["mask"])


@pytest.mark.parametrize("case, body, status, says", [
    ("unknown name", lambda f: _json_body(f, extra={"data": [1.0]}), 400, "unknown input 'extra'"),
    ("missing input", lambda f: json.dumps({"inputs": {"x": {"data": f["x"].tolist()}}}).encode(), 400,
     "missing input 'mask'"),
    ("other dtype", lambda f: _json_body({**f, "x": f["x"].astype(np.float64)}), 400,
     "'x' is float64 but the model takes float32"),
    ("other rank", lambda f: _json_body({**f, "x": f["x"][0]}), 400, "(rank 3) but the model takes rank 4"),
    ("fixed dim", lambda f: _json_body({**f, "x": np.zeros((2, 4, 8, 8), np.float32)}), 400,
     "has 4 at dim 1 but the model takes 3"),
    ("float data for an int input", lambda f: _json_body(f, mask={"data": [[0.5] * 8] * 2}), 400,
     "int64 but \"data\" holds non-integer numbers"),
    ("bools for a float input", lambda f: _json_body(f, x={"data": [True, False]}), 400, "holds booleans"),
    ("strings", lambda f: _json_body(f, x={"data": ["1", "2"]}), 400, "values that are not numbers"),
    ("ragged lists", lambda f: _json_body(f, x={"data": [[1.0, 2.0], [3.0]]}), 400, "not a rectangular list"),
    ("shape and data disagree", lambda f: _json_body(f, x={"shape": [2, 3, 8, 8], "data": [1.0]}), 400,
     "holds 384 values but \"data\" has 1"),
    ("bad shape", lambda f: _json_body(f, x={"shape": [2, -1], "data": [1.0]}), 400, "not a list of non-negative"),
    ("unknown dtype name", lambda f: _json_body(f, x={"dtype": "complex64", "data": [1.0]}), 400,
     "not a numeric or bool dtype"),
    ("out of range", lambda f: _json_body(f, mask={"dtype": "int64", "data": [2 ** 70]}), 400, "does not fit int64"),
    ("not JSON", lambda f: b"{inputs:", 400, "the body is not JSON"),
    ("no inputs object", lambda f: b"[1, 2]", 400, "has no \"inputs\" object"),
])
def test_a_request_the_model_cannot_run_is_one_sentence(case, body, status, says):
    error = _refused(body(_feeds()))
    assert error.status == status and says in str(error), (case, str(error))


def test_npz_refusals():
    assert "not an .npz file" in str(_refused(b"PK\x03\x04 broken", codec.NPZ))
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    import zipfile

    pickled = io.BytesIO()
    with zipfile.ZipFile(pickled, "w") as archive:
        archive.writestr("x.npy", buffer.getvalue())
    assert "without pickled objects" in str(_refused(pickled.getvalue(), codec.NPZ))
    other = io.BytesIO()
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("notes.txt", b"hello")
    assert "not a .npy array" in str(_refused(other.getvalue(), codec.NPZ))
    wrong = _feeds()
    wrong["x"] = wrong["x"].astype(np.float16)
    assert "'x' is float16 but the model takes float32" in str(_refused(_npz_body(wrong), codec.NPZ))


def test_content_types_and_sizes():
    assert codec.body_limit("application/json; charset=utf-8") == codec.MAX_JSON_BYTES
    for kind in ("text/plain", None):
        with pytest.raises(RequestError) as caught:
            codec.body_limit(kind)
        assert caught.value.status == 415 and "send application/json" in str(caught.value)
    error = codec.too_large(codec.MAX_JSON_BYTES + 1, codec.JSON)
    assert error.status == 413 and "send large tensors as application/x-npz" in str(error)


def test_responses_in_the_format_asked_for():
    outputs = {"y": np.arange(6, dtype=np.float32).reshape(1, 2, 3), "allow_pickle": np.array([np.nan, 1.0])}
    assert codec.response_type(codec.JSON, None) == codec.JSON
    assert codec.response_type(codec.NPZ, "*/*") == codec.NPZ
    assert codec.response_type(codec.JSON, "application/x-npz") == codec.NPZ
    assert codec.response_type(codec.NPZ, "application/json, */*") == codec.JSON
    doc = json.loads(codec.encode(outputs, codec.JSON))["outputs"]
    assert doc["y"] == {"dtype": "float32", "shape": [1, 2, 3], "data": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]}
    assert np.isnan(doc["allow_pickle"]["data"][0])
    with np.load(io.BytesIO(codec.encode(outputs, codec.NPZ)), allow_pickle=False) as npz:
        assert set(npz.files) == {"y", "allow_pickle"} and np.array_equal(npz["y"], outputs["y"])


def test_which_models_batch():
    assert batching.batchable(SIGNATURE)
    fixed = Signature((TensorSpec("x", "float32", (1, 3)),), (TensorSpec("y", "float32", (1, 3)),))
    two_dims = Signature((TensorSpec("a", "float32", ("n", 3)), TensorSpec("b", "float32", ("m", 3))),
                         (TensorSpec("y", "float32", ("n", 3)),))
    fixed_output = Signature((TensorSpec("x", "float32", ("n", 3)),), (TensorSpec("y", "float32", (3,)),))
    assert not any(batching.batchable(s) for s in (fixed, two_dims, fixed_output))


def test_dim_names_are_not_held_to_one_value_across_inputs():
    """As ORT: Paddle exports name unrelated dims '?' alike; a request whose inputs differ in their first
    dim passes the check and is batched with no other request."""
    feeds = {**_feeds(2, 8), "mask": np.zeros((3, 8), np.int64)}
    SIGNATURE.check(feeds)
    assert batching.groups([_feeds(2, 8), feeds, _feeds(1, 8)]) == [[0, 2], [1]]


def test_batch_groups_concat_and_split():
    requests = [_feeds(1, 8), _feeds(2, 8), _feeds(1, 4), _feeds(3, 8)]
    assert batching.groups(requests) == [[0, 1, 3], [2]]
    joined = batching.concat([requests[i] for i in (0, 1, 3)])
    assert joined["x"].shape == (6, 3, 8, 8)
    parts = batching.split([joined["x"], joined["mask"]], [1, 2, 3])
    assert parts is not None and np.array_equal(parts[1][0], requests[1]["x"])
    assert batching.split([np.zeros((5, 2))], [1, 2, 3]) is None  # outputs not of the batch's first dim


def _conv_model(batch_dim="batch") -> onnx.ModelProto:
    """Conv 3->4 (3x3) + Relu, and the mask's sum per row: inputs x [batch, 3, 8, width], mask [batch, width]."""
    rng = np.random.default_rng(0)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], rng.standard_normal(108).astype(np.float32))
    bias = helper.make_tensor("b", TensorProto.FLOAT, [4], rng.standard_normal(4).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("ReduceSum", ["mask"], ["s"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 3, 8, "width"]),
                        helper.make_tensor_value_info("mask", TensorProto.INT64, [batch_dim, "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 4, 6, None]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [])],
        [weight, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _write(tmp_path, model) -> str:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return str(path)


def _stock(path):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def test_a_model_the_formats_cannot_carry_is_one_sentence(tmp_path):
    graph = helper.make_graph([helper.make_node("Identity", ["t"], ["u"])], "g",
                              [helper.make_tensor_value_info("t", TensorProto.STRING, [1])],
                              [helper.make_tensor_value_info("u", TensorProto.STRING, [1])])
    path = _write(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    with pytest.raises(UnsupportedModel, match="input 't' is tensor\\(string\\), which the HTTP formats do not carry"):
        Signature.of_session(_stock(path))


def test_outputs_without_the_batch_dim_run_each_request_alone(tmp_path):
    """The scalar output has no batch dim: the model does not batch, and ``run_batch`` (as
    ``@serve.batch`` calls it) refuses to split such outputs and runs each request on its own."""
    path = _write(tmp_path, _conv_model())
    replica = ModelReplica(path, fusion=True, max_batch=1)
    assert not replica.batches  # s is a scalar
    stock = _stock(path)
    requests = [_feeds(1, 8), _feeds(2, 8), _feeds(1, 4), _feeds(3, 8)]
    replies = replica.run_batch(requests)
    assert [r.meta["batch"] for r in replies] == [1, 1, 1, 1]  # split refused the scalar: one run each
    for feeds, reply in zip(requests, replies):
        for got, want in zip(reply.outputs.values(), stock.run(None, feeds)):
            assert np.max(np.abs(got - want), initial=0.0) <= TOL


def test_run_batch_concatenates_requests_of_equal_shapes(tmp_path):
    model = _conv_model()
    del model.graph.output[1]
    del model.graph.node[2]
    path = _write(tmp_path, model)
    replica = ModelReplica(path, fusion=True, max_batch=1)
    assert batching.batchable(replica.signature)
    stock = _stock(path)
    requests = [_feeds(1, 8), _feeds(2, 8), _feeds(1, 4), _feeds(3, 8)]
    replies = replica.run_batch(requests)
    assert [r.meta["batch"] for r in replies] == [3, 3, 1, 3]
    for feeds, reply in zip(requests, replies):
        assert reply.outputs["y"].shape[0] == feeds["x"].shape[0]
        assert np.max(np.abs(reply.outputs["y"] - stock.run(None, feeds)[0])) <= TOL


class _Method:
    def __init__(self, call):
        self.call = call

    def remote(self, *args):
        return self.call(*args)


class _Handle:
    """A DeploymentHandle stand-in: ``infer``/``describe`` on a replica in this process, with the first
    ``die`` infer calls failing as a replica killed under them does."""

    def __init__(self, replica: ModelReplica, die: int = 0):
        self.replica, self.die, self.calls = replica, die, 0

        async def infer(feeds):
            self.calls += 1
            if self.calls <= self.die:
                raise ActorDiedError()
            return await self.replica.infer(feeds)

        async def describe():
            return self.replica.describe()

        self.infer, self.describe = _Method(infer), _Method(describe)


def _http(ingress: Ingress, method: str, body: bytes = b"", headers: dict | None = None):
    from starlette.requests import Request

    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": "/", "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    return asyncio.run(ingress(Request(scope, receive)))


@pytest.fixture
def conv_replica(tmp_path):
    model = _conv_model()
    del model.graph.output[1]
    del model.graph.node[2]
    path = _write(tmp_path, model)
    return path, ModelReplica(path, fusion=True, max_batch=1)


def test_ingress_runs_checks_and_answers_in_both_formats(conv_replica):
    path, replica = conv_replica
    ingress = Ingress(_Handle(replica))
    feeds = _feeds(2, 8)
    want = _stock(path).run(None, feeds)[0]
    answer = _http(ingress, "POST", _json_body(feeds), {"Content-Type": codec.JSON})
    assert answer.status_code == 200 and answer.headers["x-ortfuse-batch"] == "1"
    out = json.loads(answer.body)["outputs"]["y"]
    assert np.max(np.abs(np.array(out["data"], np.float32).reshape(out["shape"]) - want)) <= TOL
    answer = _http(ingress, "POST", _npz_body(feeds), {"Content-Type": codec.NPZ})
    with np.load(io.BytesIO(answer.body)) as npz:
        assert np.max(np.abs(npz["y"] - want)) <= TOL
    assert answer.headers["x-ortfuse-request"] == "2" and answer.headers["x-ortfuse-fused"] in ("true", "false")
    described = json.loads(_http(ingress, "GET").body)
    assert described["inputs"][0] == {"name": "x", "dtype": "float32", "shape": ["batch", 3, 8, "width"]}
    for method, body, headers, status in (
            ("PUT", b"", {}, 405), ("POST", b"x", {"Content-Type": "text/csv"}, 415),
            ("POST", b"{}", {"Content-Type": codec.JSON, "Content-Length": str(codec.MAX_JSON_BYTES + 1)}, 413),
            ("POST", _json_body({"x": feeds["x"]}), {"Content-Type": codec.JSON}, 400)):
        answer = _http(ingress, method, body, headers)
        error = json.loads(answer.body)
        assert answer.status_code == status and error["retriable"] is False and error["error"], (method, status)
    assert replica.requests == 2  # the refused requests never reached the replica


def test_a_replica_dying_under_a_request_has_it_sent_again_then_503(conv_replica, monkeypatch):
    from ortfuse.serve import ingress as ingress_module

    monkeypatch.setattr(ingress_module, "RETRY_DELAY_S", 0.0)
    path, replica = conv_replica
    feeds = _feeds(1, 8)
    answer = _http(Ingress(_Handle(replica, die=2)), "POST", _json_body(feeds), {"Content-Type": codec.JSON})
    assert answer.status_code == 200 and answer.headers["x-ortfuse-attempts"] == "3"
    out = json.loads(answer.body)["outputs"]["y"]
    want = _stock(path).run(None, feeds)[0]
    assert np.max(np.abs(np.array(out["data"], np.float32).reshape(out["shape"]) - want)) <= TOL
    answer = _http(Ingress(_Handle(replica, die=3)), "POST", _json_body(feeds), {"Content-Type": codec.JSON})
    error = json.loads(answer.body)
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1" and error["retriable"] is True
    assert "no model replica answered in 3 attempts" in error["error"] and "send it again" in error["error"]


def test_the_sizes_served_reach_the_replicas_sessions_and_the_command_checks_them(tmp_path):
    """``ortfuse serve --dim width=16``: each ortfuse replica's session carries the sizes as its
    ``ortfuse.tune_dims`` entry (its layout is timed at them) and answers as stock ORT at any width; a
    malformed size is refused before Ray starts, in one sentence."""
    import argparse

    from ortfuse.cli import serve as serve_command

    path = _write(tmp_path, _conv_model())
    replica = ModelReplica(path, fusion=True, max_batch=1, dims="width=16")
    assert replica.session.get_session_options().get_session_config_entry("ortfuse.tune_dims") == "width=16"
    stock = _stock(path)
    for width in (16, 5):
        feeds = _feeds(2, width)
        reply = asyncio.run(replica.infer(feeds))
        for got, want in zip(reply.outputs.values(), stock.run(None, feeds)):
            assert np.max(np.abs(got - want), initial=0.0) <= TOL
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    checked = serve_command._checked(parser.parse_args([path, "--dim", "width=16", "--dim", "batch=2"]))
    assert checked[2]["dims"] == "width=16,batch=2"
    with pytest.raises(ValueError, match="dim 'width=0' is not NAME=VALUE with a positive integer VALUE"):
        serve_command._checked(parser.parse_args([path, "--dim", "width=0"]))
