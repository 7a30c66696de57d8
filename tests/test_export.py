"""``ortfuse export``: a fused model, its ops library and a Triton model repository entry, loaded by a
clean process that imports only onnxruntime and numpy, exactly as the written README.txt says.

Numerics: the exported model against the original run by stock ORT at ORT_DISABLE_ALL, max error
relative to max|ref| <= 1e-4. config.pbtxt is read with the regexes below: Triton's ModelConfig proto
(tritonclient's model_config_pb2) is not a dependency here, so its text format is not parsed by protobuf.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ortfuse.cli import main as cli_main
from ortfuse.cli.export import ExportError, library_ops
from ortfuse.custom_ops.specs import DOMAIN

from model_fixtures import ffn_inputs, ffn_matmul_add_relu

RTOL = 1e-4


def _config(text: str) -> dict:
    """The fields of a config.pbtxt that export writes: name, platform, max_batch_size, the tensors, the library."""
    def tensors(kind):
        block = re.search(rf"^{kind} \[(.*?)^\]", text, re.S | re.M)
        assert block, f"no {kind} block"
        return [(n, t, [int(d) for d in dims.replace(",", " ").split()])
                for n, t, dims in re.findall(r'name: "([^"]+)"\s+data_type: (TYPE_\w+)\s+dims: \[([^\]]*)\]',
                                             block.group(1))]
    libs = re.search(r"model_operations \{ op_library_filename: \[ ((?:\"[^\"]+\"(?:, )?)+) \] \}", text)
    return {"name": re.search(r'^name: "([^"]+)"$', text, re.M).group(1),
            "platform": re.search(r'^platform: "([^"]+)"$', text, re.M).group(1),
            "max_batch_size": int(re.search(r"^max_batch_size: (\d+)$", text, re.M).group(1)),
            "input": tensors("input"), "output": tensors("output"),
            "libraries": re.findall(r'"([^"]+)"', libs.group(1)) if libs else []}


def _readme_lines(readme: str) -> str:
    """The indented code lines of README.txt: what a user copies."""
    return "\n".join(line[4:] for line in readme.splitlines() if line.startswith("    "))


def test_exported_entry_runs_in_plain_onnxruntime(tmp_path, capsys):
    original = tmp_path / "ffn.onnx"
    onnx.save(ffn_matmul_add_relu(), str(original))
    repo = tmp_path / "repo"
    assert cli_main(["export", str(original), "--out", str(repo), "--name", "ffn"]) == 0
    printed = capsys.readouterr().out
    entry = repo / "ffn"
    fused = onnx.load(str(entry / "1" / "model.onnx"))
    assert {n.op_type for n in fused.graph.node if n.domain == DOMAIN}  # fused ops the library must run

    config = _config((entry / "config.pbtxt").read_text())
    assert config["name"] == "ffn" and config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] > 0  # x and z are [batch, seq, 16]: the dynamic first dim is the batch
    assert config["input"] == [("x", "TYPE_FP32", [-1, 16])]
    assert config["output"] == [("z", "TYPE_FP32", [-1, 16])]
    [library] = config["libraries"]
    assert os.path.isfile(library) and os.path.dirname(library) == str(entry.resolve())

    readme = (entry / "README.txt").read_text()
    assert readme in printed
    code = _readme_lines(readme)
    assert "register_custom_ops_library" in code and library in code
    feeds = ffn_inputs(batch=3, seq=7)
    np.save(tmp_path / "x.npy", feeds["x"])
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import onnxruntime
        {code}
        x = np.load({x!r})
        ref_so = onnxruntime.SessionOptions()
        ref_so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        ref = onnxruntime.InferenceSession({original!r}, ref_so, providers=["CPUExecutionProvider"])
        for a, b in zip(sess.run(None, {{"x": x}}), ref.run(None, {{"x": x}})):
            print(float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12)))
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ortfuse", "numba", "llvmlite",
                                                                    "onnxruntime_extensions")))
    """).format(code=code, x=str(tmp_path / "x.npy"), original=str(original))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORTFUSE_", "PYTHON"))}
    proc = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *errors, modules = proc.stdout.strip().splitlines()
    assert errors and max(float(e) for e in errors) <= RTOL
    assert modules == "[]"  # neither ortfuse, numba, llvmlite nor onnxruntime-extensions was imported


def test_nothing_to_fuse_exports_the_model_unchanged(tmp_path, capsys):
    graph = helper.make_graph([helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0])], "t",
                              [helper.make_tensor_value_info("a", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("b", TensorProto.INT64, [3, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "transpose.onnx"
    onnx.save(model, str(path))
    assert cli_main(["export", str(path), "--out", str(tmp_path / "repo")]) == 0
    assert "nothing to fuse" in capsys.readouterr().out
    entry = tmp_path / "repo" / "transpose"
    assert onnx.load(str(entry / "1" / "model.onnx")) == onnx.load(str(path))
    config = _config((entry / "config.pbtxt").read_text())
    assert config["max_batch_size"] == 0 and config["libraries"] == []
    assert config["input"] == [("a", "TYPE_INT64", [2, 3])] and config["output"] == [("b", "TYPE_INT64", [3, 2])]
    assert not list(entry.glob("*.so"))


@pytest.mark.parametrize("args, words", [
    (["--pattern", "no_such_pattern"], "no_such_pattern"),
    (["--isa", "avx9000"], "unknown ISA level 'avx9000'"),
    (["--name", "a/b"], "model name 'a/b'"),
])
def test_bad_arguments_are_one_sentence_and_exit_2(tmp_path, capsys, args, words):
    path = tmp_path / "ffn.onnx"
    onnx.save(ffn_matmul_add_relu(), str(path))
    assert cli_main(["export", str(path), "--out", str(tmp_path / "repo"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and err.startswith("ortfuse export: ") and len(err.splitlines()) == 1
    assert not (tmp_path / "repo").exists()


def test_a_level_whose_library_lacks_a_fused_op_is_refused():
    """The AMX bf16 GEMM is built only into libraries of level avx512 and up (its NativeOpDef.min_level)."""
    node = helper.make_node("FusedGemmActBf16", ["x"], ["y"], domain=DOMAIN)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    with pytest.raises(ExportError, match="ISA level generic cannot hold FusedGemmActBf16"):
        library_ops(model, "generic")
    assert library_ops(model, "avx512") == {"FusedGemmActBf16"}


def test_a_model_that_cannot_be_fused_is_refused(tmp_path, capsys):
    """A model already fused by ortfuse is not matched again: one sentence, exit 2, nothing written."""
    original = tmp_path / "ffn.onnx"
    onnx.save(ffn_matmul_add_relu(), str(original))
    assert cli_main(["export", str(original), "--out", str(tmp_path / "repo")]) == 0
    capsys.readouterr()
    again = tmp_path / "repo" / "ffn" / "1" / "model.onnx"
    assert cli_main(["export", str(again), "--out", str(tmp_path / "repo2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot be fused: the model already holds ortfuse fused ops" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "repo2").exists()
