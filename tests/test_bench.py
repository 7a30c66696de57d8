"""``ortfuse bench``: protocol, JSON structure, numbers recomputed from the raw latencies, CLI, plot.

Fast (tiny generated model, a few runs) and free of timing assertions: speed is the bench's output,
never something a unit test can assert on a shared machine.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import statistics
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ortfuse.bench import inputs, output, run, sessions, stats
from ortfuse.cli import bench as cli_bench
from ortfuse.foundation import protocol

RUNS, REPEATS = 3, 2
STOCK = [name for name, cfg in sessions.CONFIGS.items() if cfg.stock]


def _tiny_elementwise_model(path, batch_dim="batch"):
    """y = Relu(x * 2 + 1) - 0.5 on [batch, 8]: exact in float32 whatever ORT's optimizer does."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["m"]),
        helper.make_node("Add", ["m", "one"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Sub", ["r", "half"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 8])],
        [two, one, half],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return _tiny_elementwise_model(tmp_path_factory.mktemp("bench") / "tiny.onnx")


@pytest.fixture(scope="module")
def bench_doc(tiny_model, tmp_path_factory):
    """One bench run (two batches) written to JSON and read back, as a user of --json would see it."""
    doc = run.bench(
        [tiny_model], batches=[1, 4], runs=RUNS, repeats=REPEATS, warmup=1, memory="inprocess", progress=False
    )
    out = tmp_path_factory.mktemp("bench_json") / "out.json"
    output.write_json(doc, str(out))
    return json.loads(out.read_text()), doc


# --------------------------------------------------------------------------- scheduling


def test_interleave_two_configs_is_abba():
    flat = [c for p in protocol.interleave(["A", "B"], 4) for c in p]
    assert flat == list("ABBAABBA")


def test_interleave_odd_runs_ends_with_forward_pass():
    assert protocol.interleave(["A", "B"], 3) == [["A", "B"], ["B", "A"], ["A", "B"]]


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_interleave_rounds_are_order_then_reverse_and_balanced(n):
    names = [chr(ord("A") + i) for i in range(n)]
    passes = protocol.interleave(names, 2 * n)
    assert passes[0] == names and passes[1] == names[::-1]  # first round: A B .. Z Z .. B A
    for forward, backward in zip(passes[::2], passes[1::2]):
        assert backward == forward[::-1]
        assert sorted(forward) == names
    # over n rounds every configuration holds every slot equally often ...
    for slot in range(n):
        assert {c: sum(p[slot] == c for p in passes) for c in names} == dict.fromkeys(names, 2)
    # ... and runs next to every other configuration equally often (within passes)
    pairs = [frozenset(p[i : i + 2]) for p in passes for i in range(n - 1)]
    counts = {frozenset((a, b)): pairs.count(frozenset((a, b))) for a in names for b in names if a < b}
    assert set(counts.values()) == {4}
    plain = protocol.interleave(names, 4, rotate=False)
    assert plain == [names, names[::-1], names, names[::-1]]


def test_measure_follows_the_schedule_and_counts():
    calls = []
    runners = {n: (lambda n=n: calls.append(n)) for n in "ABC"}
    ticks = iter(range(0, 10**9, 1_000_000))  # every clock read advances 1 ms
    raw = protocol.measure(runners, runs=4, repeats=2, warmup=1, clock=lambda: next(ticks))
    assert {n: [len(r) for r in reps] for n, reps in raw.items()} == {n: [4, 4] for n in "ABC"}
    one_repeat = protocol.interleave("ABC", 1) + protocol.interleave("ABC", 4)
    assert calls == [c for p in one_repeat for c in p] * 2
    assert all(x == pytest.approx(1.0) for reps in raw.values() for r in reps for x in r)


def test_measure_in_blocks_settles_wakes_then_times_a_block_per_slot(monkeypatch):
    """block=3: per slot a settle (75 ms here) before one untimed run, then 3 timed runs with only the
    gap before each; warm-up passes the same, untimed; a repeat's list holds runs * block latencies."""
    calls, sleeps = [], []
    runners = {n: (lambda n=n: calls.append(n)) for n in "AB"}
    monkeypatch.setattr(protocol.time, "sleep", sleeps.append)
    ticks = iter(range(0, 10**9, 1_000_000))
    raw = protocol.measure(runners, runs=2, repeats=1, warmup=1, block=3, settle_s=0.075, gap_s=0.001,
                           clock=lambda: next(ticks))
    assert {n: [len(r) for r in reps] for n, reps in raw.items()} == {"A": [6], "B": [6]}
    slots = [c for p in protocol.interleave("AB", 1) + protocol.interleave("AB", 2) for c in p]
    assert calls == [c for c in slots for _ in range(4)]  # the woken run and the 3 timed ones
    assert sleeps == [0.076, 0.001, 0.001, 0.001] * len(slots)
    assert all(x == pytest.approx(1.0) for reps in raw.values() for r in reps for x in r)
    with pytest.raises(ValueError, match="block"):
        protocol.measure(runners, runs=1, repeats=1, block=0)
    sleeps.clear()
    protocol.measure(runners, runs=1, repeats=1, warmup=0, settle_s=0.075)  # single runs: no settle
    assert sleeps == []


def test_ratio_is_median_over_repeats_of_p50_ratios():
    base = [[1.0, 2.0, 3.0], [2.0, 2.0, 2.0], [4.0, 4.0, 5.0]]
    cfg = [[2.0, 2.0, 2.0], [3.0, 3.0, 1.0], [4.0, 6.0, 5.0]]
    assert protocol.ratio_per_repeat(cfg, base) == [1.0, 1.5, 1.25]
    assert protocol.ratio(cfg, base) == 1.25
    assert protocol.percentile([1, 2, 3, 4, 5], 50) == 3
    assert protocol.percentile(list(range(101)), 99) == pytest.approx(np.percentile(range(101), 99))


# --------------------------------------------------------------------------- the bench run and its JSON


def test_json_has_every_config_environment_and_raw_counts(bench_doc):
    data, _ = bench_doc
    assert data["schema"] == "ortfuse.bench/1"
    env = data["environment"]
    for key in ("cpu_model", "logical_cores", "physical_cores", "date", "versions"):
        assert key in env
    for dist in ("onnxruntime", "onnx", "numba", "ortfuse"):
        assert env["versions"][dist]
    assert data["protocol"]["spinning"] is sessions.DEFAULT_SPINNING
    assert [r["batch"] for r in data["results"]] == [1, 4]
    for res in data["results"]:
        assert list(res["configs"]) == list(sessions.DEFAULT_CONFIGS)
        assert res["runs"] == RUNS and res["repeats"] == REPEATS
        for name, row in res["configs"].items():
            lat = row["latencies_ms"]
            assert len(lat) == REPEATS and all(len(rep) == RUNS for rep in lat), name
            assert sum(len(rep) for rep in lat) == RUNS * REPEATS
            assert all(isinstance(x, float) and x > 0 for rep in lat for x in rep)
            assert row["create_s"] > 0
    assert len(data["summary"]) == 2 * len(sessions.DEFAULT_CONFIGS)


def test_statistics_and_ratios_recomputed_from_raw(bench_doc):
    data, _ = bench_doc
    for res in data["results"]:
        cfgs = res["configs"]
        base = cfgs[sessions.BASELINE]["latencies_ms"]
        for row in cfgs.values():
            lat = row["latencies_ms"]
            p50s = [statistics.median(rep) for rep in lat]
            assert row["p50_ms"] == pytest.approx(statistics.median(p50s))
            assert row["p99_ms"] == pytest.approx(np.percentile([x for rep in lat for x in rep], 99))
            assert row["throughput_per_s"] == pytest.approx(res["batch"] / (row["p50_ms"] / 1e3))
            ratios = [statistics.median(c) / statistics.median(b) for c, b in zip(lat, base)]
            assert row["ratio_per_repeat"] == pytest.approx(ratios)
            assert row["ratio"] == pytest.approx(statistics.median(ratios))
        assert cfgs[sessions.BASELINE]["ratio"] == 1.0
        ctrl = [
            statistics.median(c) / statistics.median(b) for c, b in zip(cfgs[sessions.CONTROL]["latencies_ms"], base)
        ]
        assert res["control"]["ratio"] == pytest.approx(statistics.median(ctrl))
        summary = {(s["batch"], s["config"]): s for s in data["summary"]}
        for name, row in cfgs.items():
            assert summary[(res["batch"], name)]["ratio"] == pytest.approx(row["ratio"])
            assert summary[(res["batch"], name)]["aa_control_ratio"] == pytest.approx(res["control"]["ratio"])


def test_outputs_match_reference_and_fusion_columns(bench_doc):
    data, _ = bench_doc
    for res in data["results"]:
        for name in STOCK:
            assert res["configs"][name]["max_abs_diff"] == 0.0, name
            assert res["configs"][name]["fused_ops"] is None
        for name in ("ortfuse_auto", "ortfuse_fused"):
            assert isinstance(res["configs"][name]["fused_ops"], dict)
            assert res["configs"][name]["max_abs_diff"] < 1e-5


def test_table_and_header_text(bench_doc):
    _, doc = bench_doc
    head = output.header(doc)
    first = head.splitlines()[0]
    assert "machine:" in first and "protocol:" in first
    assert "spinning" in head
    text = output.table(doc["results"][0], "inprocess")
    for name in sessions.DEFAULT_CONFIGS:
        assert name in text
    assert "A/A" in text and "1 (baseline)" in text


def test_plot_writes_png(bench_doc, tmp_path):
    pytest.importorskip("matplotlib")
    from ortfuse.bench import plot

    out = tmp_path / "hist.png"
    plot.plot(bench_doc[1], str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_verdict_needs_every_repeat_beyond_the_symmetric_noise_band():
    ctrl = [0.97, 0.99, 1.01]  # identical sessions differed by up to 1/0.97
    assert stats.noise_band(ctrl) == pytest.approx((0.97, 1 / 0.97))
    assert stats.verdict([1.02, 1.025, 1.028], ctrl) == "~ noise"  # inside 1/0.97 = 1.031
    assert stats.verdict([1.04, 1.05, 1.2], ctrl) == "slower"
    assert stats.verdict([0.90, 0.95, 0.96], ctrl) == "faster"
    assert stats.verdict([0.90, 0.95, 1.2], ctrl) == "~ noise"
    assert stats.verdict([0.5], None) == "?"


def test_json_into_a_folder_is_named_after_models_and_date(bench_doc, tmp_path):
    data, doc = bench_doc
    named = output.result_path(doc, str(tmp_path) + "/")
    assert os.path.basename(named) == f"bench-tiny-{doc['environment']['date'][:10]}.json"
    output.write_json(doc, named)
    assert json.loads(pathlib.Path(named).read_text())["summary"] == data["summary"]
    assert output.result_path(doc, str(tmp_path)).endswith(f"bench-tiny-{doc['environment']['date'][:10]}-2.json")
    assert output.result_path(doc, str(tmp_path / "given.json")) == str(tmp_path / "given.json")


def test_the_tuner_and_the_memory_child_import_no_more_of_the_bench_than_they_need():
    """The tuner imports nothing of the bench (the timing protocol it shares with the bench is
    ``ortfuse.foundation.protocol``); the memory child makes its one session without the rest."""
    loaded = "sorted(m for m in sys.modules if m.startswith('ortfuse.bench'))"
    code = (
        f"import sys; import ortfuse.foundation.protocol, ortfuse.tune.tuner; a = {loaded};"
        f"import ortfuse.bench.memory, ortfuse.bench.sessions; b = {loaded};"
        "print(a, b, sep='|')"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120).stdout
    a, b = (ast.literal_eval(part) for part in out.strip().split("|"))
    assert a == []
    assert b == ["ortfuse.bench", "ortfuse.bench.memory", "ortfuse.bench.sessions"]


# --------------------------------------------------------------------------- inputs, diffs, errors


def test_inputs_from_declared_shapes(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "seq"])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x, ids], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    feeds = inputs.inputs_from_declared(str(path), batch=5, seed=3)
    assert feeds["x"].shape == (5, 3, 128) and feeds["x"].dtype == np.float32
    assert feeds["ids"].shape == (2, 128) and feeds["ids"].dtype == np.int64
    again = inputs.inputs_from_declared(str(path), batch=5, seed=3)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)


def test_fixed_batch_file_runs_at_its_own_batch(tmp_path):
    path = _tiny_elementwise_model(tmp_path / "fixed.onnx", batch_dim=2)
    assert inputs.file_batch(path, 64) == 2
    doc = run.bench([path], batches=[1, 64], runs=2, repeats=1, warmup=0, memory="off", progress=False)
    assert [r["batch"] for r in doc["results"]] == [2]
    assert "fixed batch" in doc["results"][0]["notes"][0]


def test_max_abs_diff():
    a = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    assert stats.max_abs_diff([a], [a.copy()]) == 0.0
    assert stats.max_abs_diff([a], [a + 0.5]) == pytest.approx(0.5)
    assert stats.max_abs_diff([a], [np.zeros(2, np.float32)]) == float("inf")
    assert stats.max_abs_diff([np.array([1.0])], [np.array([np.nan])]) == float("inf")


def test_max_rel_diff_is_per_output_relative_to_its_largest_reference_magnitude():
    small, large = np.array([1e-3, -2e-3], np.float32), np.array([100.0, -300.0], np.float32)
    got = [small + np.float32(1e-6), large + np.float32(0.03)]
    assert stats.max_rel_diff(got, [small, large]) == pytest.approx(max(1e-6 / 2e-3, 0.03 / 300), rel=1e-3)
    assert stats.max_rel_diff([np.ones(3)], [np.zeros(3)]) == 1.0  # an all-zero reference: absolute
    assert stats.max_rel_diff([small], [small, large]) == float("inf")
    assert stats.max_rel_diff([small], [small.copy()]) == 0.0


def test_unknown_model_is_a_clear_error():
    with pytest.raises(inputs.BenchError, match="neither an .onnx file nor a zoo model"):
        inputs.resolve_model("no_such_model_xyz")
    with pytest.raises(inputs.BenchError, match="unknown configuration"):
        run.bench(["x.onnx"], configs=["ort_enable_all", "nope"])


def test_baseline_is_added_when_missing(tiny_model):
    doc = run.bench([tiny_model], runs=2, repeats=1, warmup=0, configs=["ortfuse_auto"], memory="off", progress=False)
    res = doc["results"][0]
    assert list(res["configs"]) == ["ort_enable_all", "ortfuse_auto"]
    assert res["control"] is None
    assert res["configs"]["ortfuse_auto"]["max_abs_diff"] == 0.0  # reference session made on the side


# --------------------------------------------------------------------------- CLI


def test_cli_writes_json(tiny_model, tmp_path):
    out = tmp_path / "x.json"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", "ortfuse", "bench", tiny_model, "--runs", "3", "--repeats", "2", "--json", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("ortfuse bench | machine:") and "protocol:" in first
    data = json.loads(out.read_text())
    assert data["protocol"]["quiet_threads"] is True  # re-executed with OpenMP/BLAS spinning off
    res = data["results"][0]
    assert set(res["configs"]) == set(sessions.DEFAULT_CONFIGS)
    for row in res["configs"].values():
        assert sum(len(rep) for rep in row["latencies_ms"]) == 3 * 2
        mem = row["memory"]
        assert "error" not in mem, mem
        assert mem["peak_delta_mb"] >= 0


def test_child_command_line_reproduces_the_arguments():
    import argparse

    parser = argparse.ArgumentParser()
    cli_bench.add_arguments(parser)
    argv = ["m.onnx", "resnet50", "--batch", "1,64", "--runs", "7", "--configs", "ortfuse_auto,ort_enable_all"]
    argv += ["--gap-ms", "2.5", "--json", "o.json", "--plot", "p.png", "--spinning", "on", "--progress", "off",
             "--block", "20", "--settle-ms", "90"]
    args = parser.parse_args(argv)
    again = parser.parse_args(cli_bench._argv(args))
    assert vars(again) == {**vars(args), "quiet_threads": False}


def test_the_former_name_of_the_fusion_true_configuration_is_read_as_its_current_one():
    import argparse

    parser = argparse.ArgumentParser()
    cli_bench.add_arguments(parser)
    assert parser.parse_args(["m.onnx", "--configs", "ortfuse_numba,ort_enable_all"]).configs == [
        "ortfuse_fused", "ort_enable_all"]
    assert run._check_configs(["ortfuse_numba"]) == ["ort_enable_all", "ortfuse_fused"]


def test_cli_bad_model_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ortfuse", "bench", str(tmp_path / "missing.onnx")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "not found" in proc.stderr
