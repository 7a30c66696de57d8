"""Inputs a model can take (``ortfuse.ir.feeds``) and how every command that makes inputs uses them:
integer inputs drawn inside the tables they index (read from the graph), masks 0/1, floats as before;
``--inputs data.npz`` checked by input name, dtype and rank; ``--dim``; and a model that rejects the
sample inputs ends each command with one sentence and the fix, never a traceback. Stock ORT at
ORT_DISABLE_ALL is the judge of "the model takes them": it runs every sample drawn here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortfuse import cli
from ortfuse.ir import feeds

WIDTH = 4


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _table(name: str, rows: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.arange(rows * WIDTH, dtype=np.float32).reshape(rows, WIDTH), name)


def _stock(model, feeds_):
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds_)


def token_types() -> onnx.ModelProto:
    """ids int32 [batch, seq] -> Cast(int64) -> Unsqueeze -> Gather on a 2-row table (a token-type table)."""
    nodes = [helper.make_node("Cast", ["ids"], ["c"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["c", "axes"], ["u"]),
             helper.make_node("Gather", ["types", "u"], ["y"])]
    return _model(nodes, [("ids", TensorProto.INT32, ["batch", "seq"])],
                  [("y", TensorProto.FLOAT, ["batch", 1, "seq", WIDTH])],
                  [_table("types", 2), numpy_helper.from_array(np.array([1], np.int64), "axes")])


def bert_like() -> onnx.ModelProto:
    """input_ids -> 10-row word table; token_type_ids -> 2-row table; attention_mask -> Cast(float) bias:
    y[batch, seq, WIDTH] = words[ids] + types[tt] + mask * 100."""
    nodes = [helper.make_node("Gather", ["words", "input_ids"], ["w"]),
             helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
             helper.make_node("Add", ["w", "t"], ["s"]),
             helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["mf", "last"], ["mu"]),
             helper.make_node("Mul", ["mu", "hundred"], ["bias"]),
             helper.make_node("Add", ["s", "bias"], ["y"])]
    ints = [(n, TensorProto.INT64, ["batch", "seq"]) for n in ("input_ids", "token_type_ids", "attention_mask")]
    return _model(nodes, ints, [("y", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
                  [_table("words", 10), _table("types", 2), numpy_helper.from_array(np.array([-1], np.int64), "last"),
                   numpy_helper.from_array(np.array(100.0, np.float32), "hundred")])


def fixed_reshape() -> onnx.ModelProto:
    """x float [batch, seq] -> Reshape to [1, 4, 4]: only seq = 16 at batch 1 runs (a derived-shape model)."""
    shape = numpy_helper.from_array(np.array([1, 4, 4], np.int64), "shape")
    return _model([helper.make_node("Reshape", ["x", "shape"], ["y"])], [("x", TensorProto.FLOAT, ["batch", "seq"])],
                  [("y", TensorProto.FLOAT, [1, 4, 4])], [shape])


# --------------------------------------------------------------------------- random_feeds(model=)


def test_ids_feeding_a_two_row_table_through_cast_and_unsqueeze_stay_inside_it():
    model = token_types()
    data = feeds.random_feeds(feeds.declared_inputs(model), batch=3, seed=1, model=model)
    ids = data["ids"]
    assert ids.dtype == np.int32 and ids.shape == (3, feeds.DEFAULT_DIM)
    assert set(np.unique(ids)) == {0, 1}
    (y,) = _stock(model, data)
    np.testing.assert_array_equal(y[:, 0], _table_array(2)[ids])  # ORT took them: the rows they name
    plain = feeds.random_feeds(feeds.declared_inputs(model), batch=3, seed=1)  # without the model: [0, 8)
    assert plain["ids"].max() >= 2
    with pytest.raises(Exception, match="out of data bounds|must be within"):
        _stock(model, plain)


def _table_array(rows: int) -> np.ndarray:
    return numpy_helper.to_array(_table("t", rows))


def test_an_input_indexing_two_tables_takes_the_smaller():
    nodes = [helper.make_node("Gather", ["big", "ids"], ["a"]),
             helper.make_node("Reshape", ["ids", "flat"], ["r"]),
             helper.make_node("Gather", ["small", "r"], ["b"], axis=0)]
    model = _model(nodes, [("ids", TensorProto.INT64, ["batch", 6])],
                   [("a", TensorProto.FLOAT, None), ("b", TensorProto.FLOAT, None)],
                   [_table("big", 7), _table("small", 3), numpy_helper.from_array(np.array([-1], np.int64), "flat")])
    assert feeds.integer_ranges(model) == {"ids": (0, 3, "indexes a table")}
    data = feeds.random_feeds(feeds.declared_inputs(model), batch=50, model=model)
    assert set(np.unique(data["ids"])) == {0, 1, 2}
    _stock(model, data)


def test_a_constant_offset_and_other_indexing_ops_bound_the_range():
    """ids + 2 index a 5-row table -> [0, 3); an EmbedLayerNormalization's segment ids -> its segment table."""
    nodes = [helper.make_node("Add", ["ids", "two"], ["p"]), helper.make_node("Gather", ["t5", "p"], ["y"])]
    model = _model(nodes, [("ids", TensorProto.INT64, [4])], [("y", TensorProto.FLOAT, None)],
                   [_table("t5", 5), numpy_helper.from_array(np.array(2, np.int64), "two")])
    assert feeds.integer_ranges(model)["ids"][:2] == (0, 3)
    _stock(model, feeds.random_feeds(feeds.declared_inputs(model), model=model))
    eln = helper.make_node("EmbedLayerNormalization", ["ids", "seg", "w", "pos", "segt", "gamma", "beta"],
                           ["out", "mask_index"], domain="com.microsoft")
    model = _model([eln], [("ids", TensorProto.INT32, ["batch", "seq"]), ("seg", TensorProto.INT32, ["batch", "seq"])],
                   [("out", TensorProto.FLOAT, None)],
                   [_table("w", 30), _table("pos", 512), _table("segt", 2), _table("gamma", 1), _table("beta", 1)])
    ranges = feeds.integer_ranges(model)
    assert ranges["ids"][:2] == (0, 30) and ranges["seg"][:2] == (0, 2)


def test_masks_are_zero_or_one_and_other_ints_and_floats_keep_their_rules():
    model = bert_like()
    ranges = feeds.integer_ranges(model)
    assert ranges == {"input_ids": (0, 10, "indexes a table"), "token_type_ids": (0, 2, "indexes a table"),
                      "attention_mask": (0, 2, "mask")}
    data = feeds.random_feeds(feeds.declared_inputs(model), batch=2, dims={"seq": 64}, seed=3, model=model)
    assert {k: v.shape for k, v in data.items()} == dict.fromkeys(ranges, (2, 64))
    assert all(v.dtype == np.int64 for v in data.values())
    assert set(np.unique(data["attention_mask"])) == {0, 1}
    assert data["input_ids"].max() == 9 and data["input_ids"].min() == 0
    (y,) = _stock(model, data)
    want = _table_array(10)[data["input_ids"]] + _table_array(2)[data["token_type_ids"]]
    np.testing.assert_allclose(y, want + 100.0 * data["attention_mask"][..., None], rtol=0, atol=0)
    # an int input used for neither (here: a Range limit) keeps [0, 8); floats are the same with or without model=
    nodes = [helper.make_node("Range", ["zero", "n", "one"], ["r"]), helper.make_node("Relu", ["x"], ["z"])]
    model = _model(nodes, [("n", TensorProto.INT64, []), ("x", TensorProto.FLOAT, ["batch", 5])],
                   [("r", TensorProto.INT64, None), ("z", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("zero", 0), ("one", 1))])
    assert feeds.integer_ranges(model) == {"n": (0, 8, "default")}
    declared = feeds.declared_inputs(model)
    with_model = feeds.random_feeds(declared, batch=2, seed=5, model=model)
    np.testing.assert_array_equal(with_model["x"], feeds.random_feeds(declared, batch=2, seed=5)["x"])
    assert with_model["x"].dtype == np.float32 and abs(float(with_model["x"].std()) - 1) < 0.6


def test_zoo_sample_inputs_use_the_same_rules(monkeypatch):
    """models.sample_inputs draws an integer input of a zoo Spec (dtypes) inside its table."""
    from ortfuse import models
    from ortfuse.models import registry

    spec = registry.get("mlp_gemm_relu_gelu")
    model = token_types()
    fake = registry.Spec("token_types", "test", spec.module, lambda: model, {"ids": ("batch", "seq")},
                         {"y": ("batch", 1, "seq", WIDTH)}, dtypes={"ids": TensorProto.INT32})
    monkeypatch.setitem(registry.SPECS, "token_types", fake)
    monkeypatch.setattr(models, "build", lambda name, force=False: _saved(model))
    data = models.sample_inputs("token_types", batch=2, seed=0)
    assert data["ids"].dtype == np.int32 and data["ids"].shape == (2, 128)
    assert set(np.unique(data["ids"])) == {0, 1}


def _saved(model) -> str:
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="ortfuse-test-feeds-"), "m.onnx")
    onnx.save(model, path)
    return path


# --------------------------------------------------------------------------- npz and the commands


@pytest.fixture
def bert_path(tmp_path):
    return _save(bert_like(), tmp_path / "bert_like.onnx")


def _save(model, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def _good(batch=2, seq=5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(0, 10, (batch, seq)), "token_type_ids": rng.integers(0, 2, (batch, seq)),
            "attention_mask": np.ones((batch, seq), np.int64)}


BAD_NPZ = {
    "missing": (lambda d: {k: v for k, v in d.items() if k != "token_type_ids"},
                "no array for model input(s) token_type_ids (expected token_type_ids: int64 [batch, seq]"),
    "dtype": (lambda d: {**d, "input_ids": d["input_ids"].astype(np.int32)},
              "input 'input_ids' is int32 [2, 5], the model expects int64 [batch, seq]"),
    "rank": (lambda d: {**d, "attention_mask": d["attention_mask"][0]},
             "input 'attention_mask' is int64 [5], the model expects int64 [batch, seq]"),
}

# argv after the model of each command: short runs, JSON where the command has it
COMMANDS = {
    "verify": ["--json"],
    "profile": ["--runs", "1", "--warmup", "0", "--json"],
    "tune": ["--json"],
    "bench": ["--runs", "2", "--repeats", "1", "--warmup", "0", "--configs", "ort_enable_all", "--memory", "off",
              "--quiet-threads", "off", "--progress", "off"],
}


def _run(capsys, command, path, *argv) -> tuple[int, str, str]:
    code = cli.main([command, path, *COMMANDS[command], *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _shapes(command, out) -> dict[str, list[int]]:
    """The input shapes a command says it ran on."""
    if command == "bench":
        return {m[0]: [int(d) for d in m[1].split(",")] for m in re.findall(r"(\w+)\[([\d, ]+)\] int64", out)}
    doc = json.loads(out)
    if command == "tune":
        return doc["key"]["inputs"]
    return {k: v["shape"] for k, v in doc["inputs"].items()}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_runs_on_given_inputs_and_on_dims(capsys, tmp_path, bert_path, command):
    npz = tmp_path / "data.npz"
    np.savez(npz, **_good(batch=3, seq=7))
    code, out, err = _run(capsys, command, bert_path, "--inputs", str(npz))
    assert code == 0, err
    assert _shapes(command, out) == {k: [3, 7] for k in _good()}
    if command == "bench":
        assert "| batch 3 |" in out
    code, out, err = _run(capsys, command, bert_path, "--dim", "seq=9", "--dim", "batch=2")
    assert code == 0, err
    assert _shapes(command, out) == {k: [2, 9] for k in _good()}
    if command == "bench":  # its batch is the inputs' batch (samples/s counts it)
        assert "| batch 2 |" in out


@pytest.mark.parametrize("case", sorted(BAD_NPZ))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bad_npz_is_one_sentence_naming_the_input(capsys, tmp_path, bert_path, command, case):
    change, words = BAD_NPZ[case]
    npz = tmp_path / "data.npz"
    np.savez(npz, **change(_good()))
    code, out, err = _run(capsys, command, bert_path, "--inputs", str(npz))
    assert code == 2 and words in err, err
    assert err.startswith(f"ortfuse {command}: ") and err.count("\n") == 1


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_model_rejecting_the_sample_inputs_says_so_with_the_fix(capsys, tmp_path, command):
    """Reshape to [1, 4, 4] fails on the sample seq of 128: one sentence naming ORT's error and the way
    out; --dim seq=16 is that way out."""
    path = _save(fixed_reshape(), tmp_path / "reshape.onnx")
    code, out, err = _run(capsys, command, path)
    assert code != 0 and "Traceback" not in err and err.count("\n") == 1, err
    label = f"{path}: " if command == "bench" else ""  # bench names which of its models
    assert err.startswith(f"ortfuse {command}: {label}the model rejected the sample inputs (ORT: Reshape node: ")
    assert "Input shape:{1,128}, requested shape:{1,4,4}" in err
    assert "--inputs data.npz" in err and "--dim NAME=N" in err
    code, out, err = _run(capsys, command, path, "--dim", "seq=16")
    assert code == 0, err


def test_bench_rejection_from_the_command_line_has_no_traceback(tmp_path):
    """The installed command, with its re-executed quiet-threads child: the same one sentence."""
    path = _save(fixed_reshape(), tmp_path / "reshape.onnx")
    proc = subprocess.run([sys.executable, "-m", "ortfuse", "bench", path, "--runs", "2", "--repeats", "1",
                           "--configs", "ort_enable_all", "--memory", "off"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert f"ortfuse bench: {path}: the model rejected the sample inputs (ORT: Reshape node: " in proc.stderr


def test_load_npz_notes_arrays_no_input_takes(tmp_path, bert_path):
    npz = tmp_path / "data.npz"
    np.savez(npz, **_good(), extra=np.zeros(3))
    data, notes = feeds.load_npz(str(npz), feeds.declared_inputs(bert_path))
    assert list(data) == ["input_ids", "token_type_ids", "attention_mask"]
    assert notes == [f"{npz}: array(s) extra are not model inputs and were ignored"]
    fixed = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [2, 3])],
                   [("y", TensorProto.FLOAT, [2, 3])])
    np.savez(npz, x=np.zeros((2, 4), np.float32))
    with pytest.raises(feeds.FeedError, match=r"input 'x' is float32 \[2, 4\], the model expects float32 \[2, 3\]"):
        feeds.load_npz(str(npz), feeds.declared_inputs(fixed))


def test_profile_names_a_fused_session_failing_where_stock_ort_runs(capsys, tmp_path, bert_path, monkeypatch):
    """Inputs stock ORT takes, a profiled session that raises on them: one sentence pointing at verify."""
    from ortfuse.cli import profile as profile_cli

    def failing(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running "
                           "FusedHardSwish node. Name:'hs' Status Message: bad shape\nmore detail")

    monkeypatch.setattr(profile_cli, "profile", failing)
    code, out, err = _run(capsys, "profile", bert_path)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err == (f"ortfuse profile: a profiled session failed on inputs stock ORT runs (ORT: FusedHardSwish node "
                   f"'hs': bad shape more detail); `ortfuse verify {bert_path}` finds the fused op to blame.\n")
