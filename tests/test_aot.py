"""The ahead-of-time ops library: built from the numba kernels, loaded with no numba, and run by plain
onnxruntime through its standard ``RegisterCustomOps`` entry point.

The library under test is the one tests/conftest.py builds for the run (``ORTFUSE_OPS_LIBRARY``).
Numerics: fused outputs against the original model run by stock ORT at ORT_DISABLE_ALL, max error
relative to the output's range <= 1e-4.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ortfuse.custom_ops.aot import library, toolchain
from ortfuse.custom_ops.registration import library_op_table, native_op_table, native_op_types
from ortfuse.custom_ops.specs import DOMAIN


@pytest.fixture(scope="module")
def lib_path() -> str:
    return str(library.library_path())  # the run's library (conftest), or a build's error with its reason


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600, check=False)


def _single_op_model(op_type: str, n_inputs: int = 1, **attrs) -> bytes:
    names = [f"X{i}" for i in range(n_inputs)]
    node = helper.make_node(op_type, names, ["Y"], domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    return model.SerializeToString()


def test_library_holds_every_native_op_for_this_level(lib_path):
    lib = library.OpsLibrary(library.Path(lib_path))
    assert set(lib.ops) == set(library_op_table(lib.isa))
    assert lib.omitted == set(library_op_table("amx")) - set(lib.ops)
    assert lib.omitted <= native_op_types()  # still fused where the CPU has them: compiled in-process
    assert lib.isa == library.level()
    assert all(addr != 0 for addr in lib.ops.values())
    table = native_op_table()
    for name, ref in lib.node_attrs.items():  # planning reads node_attrs from the library
        fn = table[name].node_attrs
        assert ref == ("" if fn is None else f"{fn.__module__}:{fn.__qualname__}"), name
    assert any(lib.node_attrs.values())


def test_plain_onnxruntime_runs_a_fused_model_with_only_the_library(tmp_path, lib_path, capsys):
    """ortfuse-annotate --all --rewrite, then a process that imports only onnxruntime and numpy."""
    import models

    original = models.build("db_text_detector")
    fused = tmp_path / "fused.onnx"
    from ortfuse.cli import annotate_main

    assert annotate_main([str(original), "--all", "--rewrite", "-o", str(fused)]) == 0
    assert "any ORT host runs it with the native ops library registered" in capsys.readouterr().out
    custom = {n.op_type for n in onnx.load(str(fused)).graph.node if n.domain == DOMAIN}
    assert custom and custom <= native_op_types()  # native kernels only: nothing needs Python
    proc = _python(f"""
        import sys
        import numpy as np, onnxruntime as ort
        so = ort.SessionOptions()
        so.register_custom_ops_library({lib_path!r})
        fused = ort.InferenceSession({str(fused)!r}, so, providers=["CPUExecutionProvider"])
        ref_so = ort.SessionOptions()
        ref_so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ref = ort.InferenceSession({str(original)!r}, ref_so, providers=["CPUExecutionProvider"])
        inp = fused.get_inputs()[0]
        x = np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in inp.shape])
        x = x.astype(np.float32)
        for a, b in zip(fused.run(None, {{inp.name: x}}), ref.run(None, {{inp.name: x}})):
            print(float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12)))
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("ortfuse", "numba", "llvmlite", "onnx")))
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    errors = [float(v) for v in lines[:-2]]
    assert errors and max(errors) <= 1e-4
    assert lines[-2] == "[]"  # no ortfuse, numba, llvmlite or onnx in that process


def test_library_kernels_return_ort_errors_on_bad_input(lib_path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.register_custom_ops_library(lib_path)
    sess = ort.InferenceSession(_single_op_model("FusedAddRelu", 2), so, providers=["CPUExecutionProvider"])
    a, b = np.ones((4, 5), np.float32), -np.ones((4, 5), np.float32) * 2
    np.testing.assert_array_equal(sess.run(None, {"X0": a, "X1": b})[0], np.maximum(a + b, 0))
    with pytest.raises(Exception, match="FusedAddRelu"):  # shapes that do not broadcast
        sess.run(None, {"X0": a, "X1": np.ones((3, 7), np.float32)})
    with pytest.raises(Exception, match="FusedHardSwish: attribute 'add' is required and missing"):
        ort.InferenceSession(_single_op_model("FusedHardSwish"), so, providers=["CPUExecutionProvider"])


def test_fused_sessions_import_neither_numba_nor_llvmlite(tmp_path, lib_path):
    """With the library: the first process plans the model (empty plan cache: parses it, lowers the
    chains with the library's ``node_attrs`` references), the second loads the cached plan; neither
    imports numba or llvmlite, and both run native kernels from the library."""
    import models

    path = models.build("db_text_detector")
    code = f"""
        import sys
        import numpy as np
        import ortfuse as ort
        s = ort.InferenceSession({str(path)!r}, fusion=True, providers=["CPUExecutionProvider"])
        inp = s.get_inputs()[0]
        x = np.random.default_rng(1).standard_normal([d if isinstance(d, int) else 1 for d in inp.shape])
        y = s.run(None, {{inp.name: x.astype(np.float32)}})[0]
        so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ref = ort.InferenceSession({str(path)!r}, so, providers=["CPUExecutionProvider"])
        r = ref.run(None, {{inp.name: x.astype(np.float32)}})[0]
        print(float(np.abs(y - r).max() / np.abs(r).max()))
        from ortfuse.custom_ops.native.install import registered_ops
        chains = sorted(n for n in registered_ops() if n.startswith("FusedEltwiseChain"))
        print(len(registered_ops()), len(chains), "numba" in sys.modules, "llvmlite" in sys.modules)
    """
    env = {"ORTFUSE_CACHE_DIR": str(tmp_path)}
    for step in ("plans", "loads the cached plan"):
        proc = _python(code, **env)
        assert proc.returncode == 0, (step, proc.stderr[-2000:])
        err, status = proc.stdout.strip().split("\n")[-2:]
        assert float(err) <= 1e-4, step
        count, chains, numba_loaded, llvm_loaded = status.split()
        assert int(count) > 0 and int(chains) > 0, (step, proc.stdout)
        assert numba_loaded == "False" and llvm_loaded == "False", (step, proc.stdout)


def test_without_the_library_kernels_compile_in_process(tmp_path):
    proc = _python("""
        import sys, onnxruntime as ort
        from ortfuse.custom_ops.aot.library import loaded
        from ortfuse.custom_ops.registration import register_native
        assert loaded() is None
        assert register_native(ort.SessionOptions(), ["FusedSiLU"])
        print("numba" in sys.modules)
    """, ORTFUSE_OPS_LIBRARY=str(tmp_path / "missing.so"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"


def test_library_path_names_a_missing_configured_file(tmp_path, monkeypatch):
    monkeypatch.setenv(library.ENV, str(tmp_path / "nope.so"))
    with pytest.raises(library.LibraryError, match="does not exist"):
        library.library_path()
    monkeypatch.setenv(library.ENV, "off")
    with pytest.raises(library.LibraryError, match="disabled"):
        library.library_path()


def test_library_key_follows_level_and_sources():
    assert library.key("avx2") != library.key("generic")
    assert library.default_path("generic").name.startswith("libortfuse_ops-generic-")
    assert len(library.source_digest()) == 64


def test_toolchain_is_found_or_named(monkeypatch):
    monkeypatch.setenv("CC", "my-cc --flag")
    assert toolchain.compiler() == ["my-cc", "--flag"]
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(toolchain.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(toolchain.ToolchainError, match="pip install ziglang"):
        toolchain.compiler()


def test_an_op_is_built_only_into_libraries_of_its_level_or_above():
    """The AMX GEMM's tile instructions exist only on AVX-512 CPUs: libraries below hold no copy."""
    from ortfuse.custom_ops.aot.build import units

    family = set(library_op_table("avx512"))
    assert "FusedGemmActBf16" in family and set(library_op_table("amx")) == family
    for level in ("avx2", "generic"):
        assert set(library_op_table(level)) == family - {"FusedGemmActBf16"}
        assert not [u for u in units(level) if "gemm_bf16" in u.symbol]
    assert [u for u in units("avx512") if "gemm_bf16" in u.symbol]


def test_build_orders_units_by_the_bytecode_of_their_call_graph():
    from ortfuse.custom_ops.aot.build import compile_cost, units

    costs = {u.symbol: compile_cost(u.fn) for u in units(library.level())}
    chain = next(v for k, v in costs.items() if k.endswith("walk_chain_worker"))
    destroy = next(v for k, v in costs.items() if k.endswith("cb_kernel_destroy"))
    assert chain > 5 * destroy > 0  # the chain worker calls the whole step library
    assert compile_cost(_caller) == len(_caller.__code__.co_code) + len(_leaf.__code__.co_code)
    assert compile_cost(None) == 0


def _leaf(x):
    return x + 1


def _caller(x):
    return _leaf(x) * 2 + _leaf(x)  # one callee counted once
