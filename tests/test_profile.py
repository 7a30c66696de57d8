"""``ortfuse profile``: ORT's own profiler on real zoo models, fused and unfused, read back correctly."""

from __future__ import annotations

import json
import pathlib
import re
import statistics

import onnx
import pytest

from ortfuse import cli, models
from ortfuse.ir.feeds import declared_inputs, random_feeds
from ortfuse.profiling.attribution import attribute
from ortfuse.profiling.names import REORDER_OPS, NameMap
from ortfuse.profiling.run import DISABLE_ALL, ENABLE_ALL, FUSED, _nodes, profile
from ortfuse.profiling.trace import Profile, ProfileError, read_trace

RUNS, WARMUP = 3, 1
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _zoo(name: str):
    model = onnx.load(str(models.build(name)))
    return model, random_feeds(declared_inputs(model), batch=1)


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory):
    model, feeds = _zoo("mlp_gemm_relu_gelu")
    traces = tmp_path_factory.mktemp("traces")
    return model, profile(model, feeds, runs=RUNS, warmup=WARMUP, disable_all=True, trace_dir=str(traces))


def _independent_reading(trace: str) -> tuple[float, int]:
    """Reading of a raw trace done here without the parser: (sum over nodes of each node's median
    kernel time per counted run, run count)."""
    events = json.loads(pathlib.Path(trace).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[WARMUP:]
    per_node: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            for i, r in enumerate(runs):
                if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]:
                    per_node.setdefault(e["name"], [0.0] * len(runs))[i] += e["dur"]
    return sum(statistics.median(t) for t in per_node.values()), len(runs) + WARMUP


def test_profile_structure_and_times_add_up(mlp_profile):
    model, r = mlp_profile
    assert set(r.profiles) == {FUSED, ENABLE_ALL, DISABLE_ALL}
    for p in r.profiles.values():
        assert p.runs == RUNS and p.nodes
        assert sum(us for _, us, _ in p.by_op_type()) == pytest.approx(p.node_us, rel=1e-9)
        independent, n_runs = _independent_reading(p.trace)
        assert n_runs == RUNS + WARMUP and p.node_us == pytest.approx(independent, rel=1e-9)
        # kernels run inside model_run. The sum of node medians is not the median of the runs' kernel
        # sums (a shared CPU can stall a different node in each run), so only an upper bound holds.
        assert 0 < p.node_us <= 1.25 * p.run_us
    # stock ORT_DISABLE_ALL runs every original node under its own name
    stock = r.profiles[DISABLE_ALL]
    assert {n.name for n in stock.nodes} == {n.name for n in model.graph.node}
    assert all(n.how == "same name" and n.calls == 1 for n in stock.nodes)


def test_fused_ops_carry_pattern_and_original_nodes(mlp_profile):
    model, r = mlp_profile
    fused = r.profiles[FUSED]
    ops = {n.fused_op for n in fused.nodes if n.fused_op}
    assert len(ops) == 7
    originals = {n.name for n in model.graph.node}
    for n in fused.nodes:
        if n.fused_op:
            # the rewriter names each node it emits for a match <fused_node> or <fused_node>/<k>
            assert n.pattern_id == "gemm_act" and n.name.split("/")[0] == n.fused_op
            assert n.replaced and set(n.replaced) <= originals


def test_savings_match_the_stock_nodes_they_replace(mlp_profile):
    _, r = mlp_profile
    fused, stock = r.profiles[FUSED], r.profiles[DISABLE_ALL]
    att = next(a for a in r.attributions if a.config == DISABLE_ALL)
    (row,) = att.patterns
    assert (row.pattern_id, row.ops, row.mapped) == ("gemm_act", 7, 7)
    replaced = {o for n in fused.nodes if n.fused_op for o in n.replaced}
    assert row.original_us == pytest.approx(sum(n.us for n in stock.nodes if n.name in replaced))
    assert row.fused_us == pytest.approx(sum(n.us for n in fused.nodes if n.fused_op))
    assert row.saving_us == pytest.approx(row.original_us - row.fused_mapped_us)
    split = att.stock_split
    assert split.unmapped_us == 0 and split.left_unfused_us + row.original_us == pytest.approx(stock.node_us)
    # at ENABLE_ALL ORT renames nodes ("fused <Gemm>", "Gelu_token_0"); every fused op is still found
    enable = next(a for a in r.attributions if a.config == ENABLE_ALL)
    assert enable.patterns[0].mapped == 7
    hows = {n.how for n in r.profiles[ENABLE_ALL].nodes}
    assert "ORT fusion (fused <node>)" in hows


def test_nchwc_convs_are_mapped_and_reorders_left_unmapped():
    model, feeds = _zoo("mobilenetv3_block")
    r = profile(model, feeds, runs=2, warmup=1)
    stock = r.profiles[ENABLE_ALL]
    producers = {o: n.name for n in model.graph.node for o in n.output}
    nchwc = [n for n in stock.nodes if n.name.endswith("_nchwc")]
    reorders = [n for n in stock.nodes if n.op_type in REORDER_OPS]
    assert nchwc and reorders  # ORT's NCHWc layout at ENABLE_ALL on this CPU
    for n in nchwc:
        assert n.maps_to == [producers[n.name[: -len("_nchwc")]]]
    assert all(n.maps_to == [] and n.how.startswith("unmapped") for n in reorders)
    att = r.attributions[0]
    assert att.stock_split.unmapped_us >= sum(n.us for n in reorders) * (1 - 1e-9)
    # every fused op shows up in the fused profile, alone or inside a layout op doing several fused
    # ops' work (a squeeze-excite block, when this CPU's timing keeps it), and alone it is found in the
    # stock profile too
    fused_nodes = r.profiles[FUSED].nodes
    alone = {n.fused_op for n in fused_nodes if n.fused_op}
    shared = {f for n in fused_nodes for f in n.spans}
    assert not alone & shared
    assert sum(p.ops for p in att.patterns) == len(alone) + len(shared)
    assert sum(p.shared for p in att.patterns) == len(shared)
    assert all(p.mapped == p.ops - p.shared for p in att.patterns)


def test_a_layout_op_maps_to_the_nodes_it_records_and_its_time_is_not_split():
    from onnx import helper

    from ortfuse.fusion.report import FUSED, MatchRecord
    from ortfuse.layout import replaced_nodes

    rewritten = helper.make_model(helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["p"], name="gap"),
         helper.make_node("FusedConv", ["p"], ["z"], name="fc1"),
         helper.make_node("FusedConv", ["z"], ["s"], name="fc2"),
         helper.make_node("Mul", ["x", "s"], ["y"], name="mul")], "g", [], []))
    # ORT's graph after layout: its NCHWc nodes are named after their outputs; one op replaces them all
    block = helper.make_node("FusedSqueezeExciteBlocked", ["x"], ["y"], name="gap/squeeze_excite")
    replaced = [helper.make_node("Conv", [], [], name=n) for n in ("gap", "z_nchwc", "s_nchwc", "mul")]
    replaced_nodes.record(block, replaced)
    lone = helper.make_node("Conv", ["q"], ["p2"], name="z_nchwc_token_7")
    loaded = helper.make_model(helper.make_graph([block, lone], "g", [], []))
    names = NameMap(rewritten, loaded)
    assert names.resolve("gap/squeeze_excite", "FusedSqueezeExciteBlocked") == (
        ["fc1", "fc2", "gap", "mul"], "ortfuse layout op (the nodes it replaces)")
    matches = [MatchRecord("conv_act", [n], FUSED, fused_node=n) for n in ("fc1", "fc2")]
    nodes = _nodes({"gap/squeeze_excite": ("FusedSqueezeExciteBlocked", [30.0], 1)}, 1, names, matches)
    assert nodes[0].spans == ["fc1", "fc2"] and nodes[0].fused_op == ""
    fused = Profile(FUSED, 1, 0, 30.0, nodes)
    att = attribute(fused, Profile(ENABLE_ALL, 1, 0, 0.0, []), matches)
    assert [(p.ops, p.mapped, p.shared) for p in att.patterns] == [(2, 0, 2)]
    assert att.fused_split.fused_ops_us == 30.0


def test_read_trace_skips_warmup_and_averages_per_run():
    def run(ts, dur):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}

    def node(name, ts, dur, op="Relu"):
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}

    events = [run(0, 100), node("a", 10, 90), run(200, 50), node("a", 210, 20), node("b", 230, 10, "Add"),
              run(300, 40), node("a", 305, 10), {"cat": "Node", "name": "a_fence_before", "ts": 301, "dur": 5}]
    totals, counted, run_us = read_trace(events, warmup=1)
    assert counted == 2 and run_us == 45
    assert totals == {"a": ("Relu", [20.0, 10.0], 2), "b": ("Add", [10.0, 0.0], 1)}
    with pytest.raises(ProfileError):
        read_trace(events, warmup=3)


def test_cli_writes_traces_summary_and_a_png(capsys, tmp_path):
    out_dir = tmp_path / "prof"
    code = cli.main(["profile", "mlp_gemm_relu_gelu", "--runs", "2", "--top", "3", "--out-dir", str(out_dir)])
    out = capsys.readouterr().out
    assert code == 0
    assert sorted(p.name for p in out_dir.iterdir()) == ["fused.json", "ort_enable_all.json", "profile.json",
                                                         "profile.png"]
    png = (out_dir / "profile.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(str(out_dir / "profile.png")).shape[0] > 100
    assert json.loads((out_dir / "fused.json").read_text())  # ORT's raw trace, a JSON list of events
    summary = json.loads((out_dir / "profile.json").read_text())
    assert set(summary["profiles"]) == {"fused", "ort_enable_all"}
    assert "saving per pattern against stock ORT_ENABLE_ALL" in out
    assert re.search(r"^gemm_act\s+7\s+7/7\s", out, re.MULTILINE)


def test_cli_unreadable_model_exits_2(capsys, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"junk")
    assert cli.main(["profile", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ortfuse profile: cannot read") and err.count("\n") == 1


def test_readme_profile_example_runs(capsys):
    """The README's profile section shows real output; its command runs and prints the same sections."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Where the time goes: `ortfuse profile`", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```text\n(.*?)```", section, re.DOTALL).group(1)
    command = block.splitlines()[0]
    assert command.startswith("$ ortfuse profile ")
    assert cli.main(command[2:].split()[1:]) == 0
    out = capsys.readouterr().out
    headings = [ln for ln in block.splitlines()[1:] if re.match(r"^(configuration|time per op|hottest|saving)", ln)]
    assert headings and all(h.split("(")[0].split("  ")[0].strip() in out for h in headings)


def test_the_fused_session_is_planned_at_the_profiled_sizes():
    """A model declaring its height and width dynamic: the fused session gets the feeds' sizes in
    ``ortfuse.tune_dims``, as ``ortfuse bench`` plans its sessions (the layout step times its native
    convs there; without them it leaves them to ORT and the profile would show another plan than
    the one served). A model of static shape gets no entry."""
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    from ortfuse.foundation.session_options import DIMS_KEY
    from ortfuse.profiling.run import _served

    def model(dims):
        w = numpy_helper.from_array(np.ones((8, 3, 3, 3), np.float32), "w")
        graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    feeds = {"x": np.zeros((1, 3, 32, 48), np.float32)}
    so = _served(onnxruntime.SessionOptions(), model(["n", 3, "height", "width"]), feeds)
    assert dict(kv.split("=") for kv in so.get_session_config_entry(DIMS_KEY).split(",")) == \
        {"n": "1", "height": "32", "width": "48"}
    static = _served(onnxruntime.SessionOptions(), model([1, 3, 32, 48]), feeds)
    with pytest.raises(RuntimeError, match="does not have configuration"):
        static.get_session_config_entry(DIMS_KEY)
