"""``ortfuse verify``: numerics against stock ORT_DISABLE_ALL, and bisection to the faulty fused op.

Faults are injected honestly: ``verify``'s ``transform`` hook receives every fused model before it
runs, and ``corrupt`` makes the fused op that replaced a chosen original node compute 1.25x its
result, whenever (and only when) that op is fused in the model being run.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import shlex

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortfuse import cli
from ortfuse.cli import verify as V

N_BRANCHES = 20  # fused ops in the bisection model (>= 16)
WIDTH = 8
ROOT = pathlib.Path(__file__).resolve().parents[1]


def hardswish_branches(n: int = N_BRANCHES, width: int = WIDTH, separate_outputs: bool = False) -> onnx.ModelProto:
    """x[batch, width] -> n branches h_k = hardswish(x * c_k), written Add(3)->Clip(0,6)->Div(6)->Mul
    (one fused HardSwish each); concatenated into y[batch, n*width], or one output h_k per branch."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), name) for name, v in
             (("three", 3.0), ("zero", 0.0), ("six", 6.0))]
    nodes, outs = [], []
    for k in range(n):
        inits.append(numpy_helper.from_array(np.array(0.5 + 0.1 * k, np.float32), f"c{k}"))
        nodes += [helper.make_node("Mul", ["x", f"c{k}"], [f"m{k}"], name=f"b{k}_scale"),
                  helper.make_node("Add", [f"m{k}", "three"], [f"a{k}"], name=f"b{k}_add"),
                  helper.make_node("Clip", [f"a{k}", "zero", "six"], [f"cl{k}"], name=f"b{k}_clip"),
                  helper.make_node("Div", [f"cl{k}", "six"], [f"d{k}"], name=f"b{k}_div"),
                  helper.make_node("Mul", [f"d{k}", f"m{k}"], [f"h{k}"], name=f"b{k}_mul")]
        outs.append(f"h{k}")
    if separate_outputs:
        outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["batch", width]) for o in outs]
    else:
        nodes.append(helper.make_node("Concat", outs, ["y"], name="concat", axis=1))
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width * n])]
    graph = helper.make_graph(nodes, "hardswish_branches",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class corrupt:
    """Transform: the fused ops replacing ``b<k>_add`` (for each k in ``branches``) compute 1.25x
    their result: the node writing the op's output (named ``fused_node``; lowered groups add
    ``<fused_node>/<k>`` helpers) gets its output renamed and a Mul by 1.25 restores the name.
    With ``when_also_fused=j`` the fault appears only while branch j's op is fused as well (a
    simulated interaction). ``hits`` counts the ops corrupted over all calls."""

    def __init__(self, *branches: int, when_also_fused: int | None = None) -> None:
        self.targets = {f"b{k}_add" for k in branches}
        self.partner = f"b{when_also_fused}_add" if when_also_fused is not None else None
        self.hits = 0

    def __call__(self, model: onnx.ModelProto) -> onnx.ModelProto:
        heads = {n.name: _first_replaced(n) for n in model.graph.node if not re.search(r"/\d+$", n.name)}
        if self.partner is not None and self.partner not in heads.values():
            return model
        for node in list(model.graph.node):
            if heads.get(node.name) in self.targets:
                out = node.output[0]
                node.output[0] = f"{out}_before_fault"
                scale = numpy_helper.from_array(np.array(1.25, np.float32), f"{out}_fault_scale")
                model.graph.initializer.append(scale)
                position = list(model.graph.node).index(node) + 1
                model.graph.node.insert(position, helper.make_node(
                    "Mul", [node.output[0], scale.name], [out], name=f"{node.name}_fault"))
                self.hits += 1
        return model


def _first_replaced(node: onnx.NodeProto) -> str:
    """The first original node a rewritten node replaces (its provenance), or ""."""
    for a in node.attribute:
        if a.name == "replaced_nodes":
            return a.s.decode().split(",")[0]
    found = re.match(r"^ortfuse \S+: replaces ([^,]*)", node.doc_string or "")
    return found.group(1) if found else ""


@pytest.fixture(scope="module")
def branches_model() -> onnx.ModelProto:
    return hardswish_branches()


@pytest.fixture(scope="module")
def feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).standard_normal((2, WIDTH)).astype(np.float32) * 2}


def _names(ops) -> list[str]:
    return [op.nodes[0] for op in ops]


# --------------------------------------------------------------------------- bisection


@pytest.mark.parametrize("culprit", [0, 13, N_BRANCHES - 1])
def test_bisection_finds_one_faulty_op_among_20_in_logarithmic_runs(branches_model, feeds, culprit):
    fault = corrupt(culprit)
    result = V.verify(branches_model, feeds, transform=fault, label="branches.onnx")
    assert len(result.fused_ops) == N_BRANCHES and {op.pattern_id for op in result.fused_ops} == {"hardswish"}
    assert not result.ok and fault.hits >= 1
    # the worst element lies in the faulty branch's columns of the concatenated output
    assert result.outputs[0].worst_index[1] // WIDTH == culprit
    b = result.bisection
    assert b.baseline_ok and _names(b.culprits) == [f"b{culprit}_add"] and not b.interactions
    assert b.confirmed is True
    bound = 2 * math.ceil(math.log2(N_BRANCHES)) + 2  # baseline + two halves per level + confirmation
    assert b.runs <= bound == V.run_bound(N_BRANCHES) == 12
    assert result.ort_runs == b.runs + 2  # + the reference run + the full fused run


def test_two_culprits_are_both_found(branches_model, feeds):
    result = V.verify(branches_model, feeds, transform=corrupt(3, 17))
    b = result.bisection
    assert sorted(_names(b.culprits)) == ["b17_add", "b3_add"] and not b.interactions and b.confirmed
    assert b.runs <= 2 * (2 * math.ceil(math.log2(N_BRANCHES))) + 2  # two search paths


def test_interaction_without_a_single_culprit_is_reported_as_such(branches_model, feeds):
    """b4 is wrong only when b5 is fused too: no single op fails, the group holding both does."""
    result = V.verify(branches_model, feeds, transform=corrupt(4, when_also_fused=5))
    b = result.bisection
    assert not result.ok and b.culprits == []
    assert len(b.interactions) == 1 and {"b4_add", "b5_add"} <= set(_names(b.interactions[0]))
    assert b.confirmed is True
    text = V.format_text(result)
    assert "interaction:" in text and "no single op is to blame" in text and "culprit:" not in text


def test_suggestion_leaves_out_the_pattern_and_says_instances_cannot_be_named(branches_model, feeds):
    result = V.verify(branches_model, feeds, transform=corrupt(7), label="m.onnx")
    s = result.suggestion
    assert s["leave_out"] == ["hardswish"]
    # hardswish is the only pattern fusing anything here, so nothing remains to enable
    assert s["fusion_pattern_id"] == "" and s["command"] == "ortfuse-annotate m.onnx --disable"
    assert "not possible with fusion_pattern_id" in s["note"] and "all 20 fused hardswish" in s["note"]


def test_suggestion_keeps_the_other_patterns_that_fuse():
    from ortfuse.cli.verify import Bisection, FusedOp, VerifyResult, suggest

    ops = [FusedOp("conv_act", ("c",), "f0"), FusedOp("silu", ("s",), "f1"), FusedOp("add_relu", ("a",), "f2")]
    r = VerifyResult("m.onnx", False, 0, 0, ["conv_act", "add_relu", "silu", "eltwise_chain"], {}, "", ops, [])
    r.bisection = Bisection(3, culprits=[ops[1]], confirmed=True)
    s = suggest(r, "m.onnx")
    assert s["fusion_pattern_id"] == "conv_act,add_relu" and s["note"] == ""
    assert s["command"] == "ortfuse-annotate m.onnx --pattern conv_act --pattern add_relu"


def test_multi_output_model_reports_each_output_and_blames_the_right_op(feeds):
    model = hardswish_branches(n=16, separate_outputs=True)
    result = V.verify(model, feeds, transform=corrupt(9))
    assert [d.name for d in result.outputs] == [f"h{k}" for k in range(16)]
    assert [d.ok for d in result.outputs] == [k != 9 for k in range(16)]
    assert result.outputs[9].max_abs > 0.01 and result.outputs[0].max_abs == 0.0
    assert _names(result.bisection.culprits) == ["b9_add"]
    assert result.bisection.runs <= V.run_bound(16) == 10


def test_a_fused_op_that_raises_is_blamed(branches_model, feeds):
    def break_node(model):
        for n in model.graph.node:
            if _first_replaced(n) == "b11_add" and not re.search(r"/\d+$", n.name):
                n.input.append("x")  # one input too many: the kernel refuses to run
        return model

    result = V.verify(branches_model, feeds, transform=break_node)
    assert result.error and not result.outputs
    assert _names(result.bisection.culprits) == ["b11_add"]


# --------------------------------------------------------------------------- comparison


def test_compare_output_rules():
    ref = np.array([[1.0, 2.0], [np.nan, 0.0]], np.float32)
    same = V.compare_output("y", ref.copy(), ref, 0, 0)
    assert same.ok and same.max_abs == 0.0
    off = V.compare_output("y", np.array([[1.0, 2.5], [np.nan, 0.0]], np.float32), ref, 0.1, 0.1)
    assert not off.ok and off.worst_index == [0, 1] and off.max_abs == pytest.approx(0.5)
    assert off.max_rel == pytest.approx(0.25) and (off.fused_value, off.reference_value) == (2.5, 2.0)
    assert V.compare_output("y", np.array([[1.0, 2.5], [np.nan, 0.0]], np.float32), ref, 0.0, 0.25).ok
    nan_one_side = V.compare_output("y", np.array([[1.0, 2.0], [1.0, 0.0]], np.float32), ref, 1, 1)
    assert not nan_one_side.ok and nan_one_side.worst_index == [1, 0]
    shape = V.compare_output("y", np.zeros((2, 3), np.float32), ref, 1, 1)
    assert not shape.ok and "reference" in shape.problem


# --------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def branches_path(tmp_path_factory, branches_model) -> str:
    path = tmp_path_factory.mktemp("verify") / "branches.onnx"
    onnx.save(branches_model, str(path))
    return str(path)


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["verify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_correct_model_exits_0(capsys, branches_path):
    code, out, _ = _cli(capsys, branches_path)
    assert code == 0
    assert "result: within tolerance (2 ORT runs)" in out
    assert re.search(r"^y\s+\[1, 160\]\s+0\s+0\s", out, re.MULTILINE)  # random batch defaults to 1


def test_json_schema_and_dims(capsys, branches_path):
    code, out, _ = _cli(capsys, branches_path, "--json", "--dim", "batch=5")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True and doc["exit_status"] == 0
    assert set(doc) >= {"model", "ok", "atol", "rtol", "patterns", "inputs", "input_source", "fused_ops", "outputs",
                        "error", "bisection", "ort_runs", "suggestion", "notes", "exit_status"}
    assert doc["inputs"] == {"x": {"shape": [5, WIDTH], "dtype": "float32"}}
    assert len(doc["fused_ops"]) == N_BRANCHES and set(doc["fused_ops"][0]) == {"pattern_id", "nodes", "fused_node"}
    out0 = doc["outputs"][0]
    assert set(out0) == {"name", "ok", "shape", "dtype", "max_abs", "max_rel", "worst_index", "fused_value",
                         "reference_value", "problem"}
    assert out0["shape"] == [5, WIDTH * N_BRANCHES] and doc["bisection"] is None and doc["ort_runs"] == 2


def test_mismatch_json_is_strict_and_complete(branches_model, feeds):
    doc = json.loads(V.verify(branches_model, feeds, transform=corrupt(2)).to_json(),
                     parse_constant=lambda c: pytest.fail(f"non-standard JSON token {c}"))
    assert doc["ok"] is False and doc["exit_status"] == 1
    b = doc["bisection"]
    assert b["culprits"] == [{"pattern_id": "hardswish", "nodes": ["b2_add", "b2_clip", "b2_div", "b2_mul"],
                              "fused_node": b["culprits"][0]["fused_node"]}]
    assert b["runs"] <= 12 and b["interactions"] == [] and b["baseline_ok"] is True
    assert doc["suggestion"]["leave_out"] == ["hardswish"]


def test_inputs_npz_are_used(capsys, tmp_path, branches_path):
    x = np.linspace(-5, 5, 3 * WIDTH, dtype=np.float32).reshape(3, WIDTH)
    npz = tmp_path / "data.npz"
    np.savez(npz, x=x, unrelated=np.zeros(2))
    code, out, _ = _cli(capsys, branches_path, "--inputs", str(npz), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["input_source"] == str(npz)
    assert doc["inputs"]["x"]["shape"] == [3, WIDTH] and "unrelated" in doc["notes"][0]
    np.savez(npz, y=x)
    code, _, err = _cli(capsys, branches_path, "--inputs", str(npz))
    assert code == 2 and err.count("\n") == 1 and "no array for model input(s) x" in err


def _mlp_max_abs(capsys) -> tuple[str, float]:
    from ortfuse import models

    path = str(models.build("mlp_gemm_relu_gelu"))
    code, out, _ = _cli(capsys, path, "--json")
    doc = json.loads(out)
    assert code == 0 and len(doc["fused_ops"]) == 7
    return path, doc["outputs"][0]["max_abs"]


def test_tolerance_options_are_respected_on_a_real_zoo_model(capsys):
    """mlp_gemm_relu_gelu fused differs from ORT_DISABLE_ALL by rounding only (a few 1e-6): the exit
    status flips exactly where --atol crosses that difference (rtol 0)."""
    path, max_abs = _mlp_max_abs(capsys)
    assert 0 < max_abs < 1e-4
    code, out, _ = _cli(capsys, path, "--atol", repr(max_abs * 1.01), "--rtol", "0", "--no-bisect")
    assert code == 0, out
    code, out, _ = _cli(capsys, path, "--atol", repr(max_abs * 0.99), "--rtol", "0", "--no-bisect")
    assert code == 1 and "MISMATCH" in out
    code, out, _ = _cli(capsys, path, "--atol", "0", "--rtol", "0", "--json")
    doc = json.loads(out)
    # ORT's own ENABLE_ALL rewrites differ from DISABLE_ALL too: nothing is blamed on a fused op then
    assert code == 1 and doc["bisection"]["baseline_ok"] is False and doc["bisection"]["culprits"] == []


@pytest.mark.parametrize("argv, words", [
    (["{missing}"], "cannot read"),
    (["{garbage}"], "cannot read"),
    (["{model}", "--patterns", "no_such_pattern"], "unknown fusion pattern"),
    (["{model}", "--dim", "batch"], "is not NAME=VALUE"),
    (["{model}", "--atol", "-1"], "must not be negative"),
])
def test_usage_errors_exit_2_with_one_sentence(capsys, tmp_path, branches_path, argv, words):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00not an onnx model")
    args = [a.format(missing=str(tmp_path / "none.onnx"), garbage=str(garbage), model=branches_path) for a in argv]
    code, out, err = _cli(capsys, *args)
    assert code == 2 and out == "" and words in err
    assert err.startswith("ortfuse verify: ") and err.count("\n") == 1 and err.rstrip().endswith(".")


def test_readme_verify_example_matches_a_real_run(capsys):
    """The README's verify section shows real output: its commands run, exit as shown, and print the
    lines shown up to the result line (numbers and paths aside: rounding differs between CPUs, and so
    may the bisection's findings below that line)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Checking numerics: `ortfuse verify`", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```text\n(.*?)```", section, re.DOTALL)
    assert len(blocks) >= 2
    for block in blocks[:2]:
        lines = block.splitlines()
        assert lines[0].startswith("$ ortfuse verify ")
        code, out, _ = _cli(capsys, *shlex.split(lines[0][len("$ ortfuse verify "):]))
        shown = [ln for ln in lines[1:] if ln.strip() and not ln.startswith("(exit")]
        real = out.splitlines()
        upto = next(i for i, ln in enumerate(shown) if ln.startswith("result:")) + 1
        strip = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?|\s+|/\S+\.onnx")
        assert [strip.sub("#", a) for a in real[:upto]] == [strip.sub("#", b) for b in shown[:upto]]
        assert f"(exit {code})" in block
        if code == 1:
            assert shown[upto].split(":")[0] in out  # the bisection line
