"""``ortfuse profile --peer openvino``: OpenVINO's CPU plugin in the profile's rounds, its per-layer counters
read back and its layers mapped to the ONNX nodes they do."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import onnx
import pytest

from ortfuse import cli, models
from ortfuse.ir.feeds import declared_inputs, random_feeds
from ortfuse.ir.graph import GraphIndex
from ortfuse.profiling.openvino_counters import LayerTime, map_layers
from ortfuse.profiling.run import profile
from ortfuse.profiling.trace import ProfileError

RUNS, WARMUP, THREADS = 3, 1, 1
MODEL = "mobilenetv3_block"  # convs with BatchNorm, HardSwish, a squeeze-excite: OpenVINO fuses post-ops


@pytest.fixture(scope="module")
def peer_profile():
    model = onnx.load(str(models.build(MODEL)))
    feeds = random_feeds(declared_inputs(model), batch=1)
    return model, profile(model, feeds, runs=RUNS, warmup=WARMUP, threads=THREADS, peer="openvino")


def test_counters_are_openvinos_layers_with_times(peer_profile):
    import openvino as ov

    model, r = peer_profile
    p = r.peer
    assert p is not None and p.layers
    assert p.threads == THREADS and p.precision == "f32"
    assert len(p.wall_runs_us) == RUNS and p.wall_us > 0 and p.counters_wall_us > 0
    # the layer types and kernels are OpenVINO's own: a separate compile of the same configuration,
    # read here without the module, executes the same kinds of layer (its layer names carry counters)
    from ortfuse.bench.peers import openvino_config

    core = ov.Core()
    request = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                 openvino_config(THREADS, perf_count=True)).create_infer_request()
    request.infer(random_feeds(declared_inputs(model), batch=1))
    executed = {(i.node_type, i.exec_type) for i in request.get_profiling_info()
                if i.status == ov.ProfilingInfo.Status.EXECUTED}
    assert {(n.layer_type, n.exec_type) for n in p.layers} == executed
    types = {n.layer_type for n in p.layers}
    assert "Convolution" in types and "Conv" not in types
    assert all(n.exec_type and n.exec_type != "undef" for n in p.layers if n.layer_type == "Convolution")
    assert sum(us for _, us, _ in p.by_layer_type()) == pytest.approx(p.layer_us, rel=1e-9)
    assert sum(us for _, us, _ in p.by_exec_type()) == pytest.approx(p.layer_us, rel=1e-9)
    assert p.layer_us > 0 and p.layers == sorted(p.layers, key=lambda n: -n.us)


def test_layers_map_to_nodes_of_the_model(peer_profile):
    model, r = peer_profile
    p = r.peer
    ix = GraphIndex(model, infer_shapes=False)
    kind = {ix.name_of(n): n.op_type for n in model.graph.node}
    covered = [c for n in p.layers for c in n.covers]
    assert covered and len(covered) == len(set(covered))  # each ONNX node in one layer at most
    assert set(covered) <= set(kind) and "Constant" not in {kind[c] for c in covered}
    assert set(p.uncovered).isdisjoint(covered)
    assert len(covered) + len(p.uncovered) == sum(1 for k in kind.values() if k != "Constant")
    # every conv of the model is done by one of OpenVINO's convolution layers, its post-ops with it
    conv_layers = {n.name: n for n in p.layers if n.layer_type in ("Convolution", "GroupConvolution")}
    owner = {c: n.name for n in p.layers for c in n.covers}
    convs = [name for name, k in kind.items() if k == "Conv"]
    assert convs and all(owner.get(c) in conv_layers for c in convs)
    assert any(len(n.covers) > 2 for n in conv_layers.values())
    for n in p.layers:
        assert set(n.by_position) <= set(n.covers)


def test_fusions_set_openvino_layers_beside_ortfuse_fused_ops(peer_profile):
    _, r = peer_profile
    p = r.peer
    layers = {n.name: n for n in p.layers}
    assert p.fusions
    patterns = {s.pattern_id for a in r.attributions for s in a.patterns}
    for f in p.fusions:
        assert f.count == len(f.layers) and f.ortfuse_kernels >= 1
        for name in f.layers:
            assert layers[name].layer_type == f.layer_type and len(layers[name].covers) >= 2
            assert len(layers[name].covers) == len(f.onnx_ops.split("+"))
        assert f.us == pytest.approx(sum(layers[name].us for name in f.layers))
        named = {part.split("(")[0].removeprefix("one ").removesuffix(" op") for part in f.ortfuse.split(" + ")
                 if not part.startswith("ORT ")}
        assert named <= patterns


class _Out:
    def __init__(self, names, targets=()):
        self._names, self._targets = set(names), list(targets)

    def get_names(self):
        return self._names

    def get_target_inputs(self):
        return [SimpleNamespace(get_node=lambda t=t: t) for t in self._targets]


class _Op:
    def __init__(self, kind, name, tensors=(), consumers=()):
        self.kind, self.name = kind, name
        self._out = _Out(tensors, consumers)

    def get_type_name(self):
        return self.kind

    def get_friendly_name(self):
        return self.name

    def outputs(self):
        return [self._out]


def test_names_resolve_through_tensors_and_made_names_by_position():
    """A conv whose name survived, then Add+Clip+Mul+Div that OpenVINO replaced by one op of a made
    name (HSwish_9) fused into the conv's layer; a MatMul merged into a layer named after its Add."""
    from onnx import helper

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "three"], ["a"], name="add"),
             helper.make_node("Clip", ["a"], ["k"], name="clip"),
             helper.make_node("Mul", ["c", "k"], ["m"], name="mul"),
             helper.make_node("Div", ["m", "six"], ["h"], name="div"),
             helper.make_node("MatMul", ["h", "wm"], ["mm"], name="matmul"),
             helper.make_node("Add", ["mm", "b"], ["y"], name="bias")]
    model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    bias = _Op("Add", "bias", ["y"])
    inner = _Op("Multiply", "Multiply_3", [], [bias])  # an inner op of a decomposition: no ONNX tensor
    read = SimpleNamespace(get_ordered_ops=lambda: [
        _Op("Parameter", "x", ["x"]), _Op("Convolution", "conv", ["c"]), _Op("Add", "add", ["a"]),
        _Op("Clamp", "clip", ["k"]), _Op("Multiply", "mul", ["m"]), _Op("Divide", "div", ["h"]),
        _Op("MatMul", "matmul", ["mm"]), inner, bias])
    layers = [LayerTime("Multiply_7", "Convolution", "brgconv", 5.0, ["conv", "HSwish_9"]),
              LayerTime("bias", "FullyConnected", "gemm", 2.0, ["bias", "Multiply_3"]),
              LayerTime("reorder", "Reorder", "jit", 1.0, [])]
    uncovered, unresolved = map_layers(layers, read, model)
    assert layers[0].covers == ["conv", "add", "clip", "mul", "div"]
    assert layers[0].by_position == ["add", "clip", "mul", "div"] and layers[0].made_names == ["HSwish_9"]
    assert layers[1].covers == ["matmul", "bias"] and layers[1].by_position == ["matmul"]
    assert layers[2].covers == [] and uncovered == [] and unresolved == ["HSwish_9"]


def test_cli_writes_json_with_the_peer_and_text_names_its_numbers(capsys, tmp_path):
    args = ["profile", MODEL, "--runs", "2", "--top", "3", "--threads", str(THREADS), "--peer", "openvino"]
    results, charts = tmp_path / "results", tmp_path / "charts"
    assert cli.main(args + ["--json", f"{results}/", "--out-dir", str(charts)]) == 0
    out = capsys.readouterr().out
    assert (charts / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # OpenVINO's column drawn too
    assert json.loads((charts / "profile.json").read_text())["peer"]["layers"]
    (written,) = results.iterdir()  # named as benchmarks/results/ names result files
    assert written.name.startswith(f"profile-{MODEL}-20") and f"wrote {written}" in out
    data = json.loads(written.read_text())
    peer = data["peer"]
    assert data["threads"] == THREADS and peer["threads"] == THREADS
    assert data["environment"]["versions"]["openvino"] != "not installed" and data["environment"]["cpu_model"]
    assert peer["wall_us"] > 0 and len(peer["wall_runs_us"]) == 2 and peer["counters_wall_us"] > 0
    assert peer["layers"] and {"name", "layer_type", "exec_type", "us", "covers"} <= set(peer["layers"][0])
    assert peer["fusions"] and {"layer_type", "onnx_ops", "ortfuse", "count"} <= set(peer["fusions"][0])
    assert "OpenVINO f32, counters off" in out and "OpenVINO f32, PERF_COUNT on" in out
    assert "need not add up to its wall time" in out and "OpenVINO f32 (layer types)" in out
    assert "layers doing several ONNX nodes" in out


def test_missing_openvino_is_one_sentence(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    assert cli.main(["profile", "mlp_gemm_relu_gelu", "--runs", "1", "--peer", "openvino"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install -e '.[peers]'" in err and err.startswith("ortfuse profile: ")
    model = onnx.load(str(models.build("mlp_gemm_relu_gelu")))
    with pytest.raises(ProfileError, match=r"pip install -e '\.\[peers\]'"):
        profile(model, random_feeds(declared_inputs(model), batch=1), runs=1, peer="openvino")
