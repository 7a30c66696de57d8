"""The native custom-op ABI: OrtCustomOp layout, every OrtApi index used (round trips through a
probe op), attribute reading, error statuses, the kernel-state pool, registration and fallback."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortfuse.custom_ops import abi, numba_setup
from ortfuse.custom_ops.native import availability, install, op_def, slots, threads
from ortfuse.custom_ops.registration import (
    native_op_table,
    native_op_types,
    native_unavailable_reason,
    register_library,
    register_native,
)
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.catalogue import SPECS

from native_probe import PROBE_CHOICES, PROBE_OP, add_probe_op

pytestmark = pytest.mark.skipif(availability.unavailable_reason() is not None,
                                reason=f"native path unavailable: {availability.unavailable_reason()}")

NATIVE = ["FusedAddRelu", "FusedHardSwish", "FusedSiLU", "FusedGemmAct", PROBE_OP]


@pytest.fixture(scope="module")
def options_factory():
    """SessionOptions with the native ops (and the extensions library) registered."""
    add_probe_op()
    assert register_native(ort.SessionOptions(), NATIVE, SPECS.values()), native_unavailable_reason(NATIVE)

    def make(threads: int = 0):
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = threads
        assert register_native(so, NATIVE, SPECS.values())  # and the reference ops
        return so

    return make


def _model(op_type, inputs, attrs=None, out_type=TensorProto.FLOAT):
    """One node of domain ai.onnx.contrib; inputs = [(name, elem_type)], shapes left dynamic."""
    node = helper.make_node(op_type, [n for n, _ in inputs], ["Out"], domain=DOMAIN, **(attrs or {}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                              [helper.make_tensor_value_info("Out", out_type, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    return model.SerializeToString()


def _probe_session(so, **attrs):
    attrs.setdefault("f", 1.5)
    attrs.setdefault("i", -42)
    model = _model(PROBE_OP, [("X", TensorProto.FLOAT), ("Y", TensorProto.INT64)], attrs, TensorProto.DOUBLE)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------------------------------
# layout and constants
# --------------------------------------------------------------------------------------------------


def test_ortcustomop_fields_follow_header_order():
    # struct OrtCustomOp in onnxruntime_c_api.h (API 29): version, then these callbacks in this order
    expected = ["version", "CreateKernel", "GetName", "GetExecutionProviderType", "GetInputType",
                "GetInputTypeCount", "GetOutputType", "GetOutputTypeCount", "KernelCompute", "KernelDestroy",
                "GetInputCharacteristic", "GetOutputCharacteristic", "GetInputMemoryType",
                "GetVariadicInputMinArity", "GetVariadicInputHomogeneity", "GetVariadicOutputMinArity",
                "GetVariadicOutputHomogeneity", "CreateKernelV2", "KernelComputeV2", "InferOutputShapeFn",
                "GetStartVersion", "GetEndVersion", "GetMayInplace", "ReleaseMayInplace", "GetAliasMap",
                "ReleaseAliasMap"]
    assert [f[0] for f in abi.OrtCustomOp._fields_] == expected
    # uint32 version padded to 8 bytes, then one 8-byte pointer per callback
    assert abi.OrtCustomOp.KernelComputeV2.offset == 8 * expected.index("KernelComputeV2")
    assert ctypes.sizeof(abi.OrtCustomOp) == 8 + 8 * (len(expected) - 1)


def test_api_index_constants_agree_with_table():
    # every named constant used by the intrinsics equals its entry in API_INDEX
    consts = {"CreateStatus": abi.CREATE_STATUS, "GetErrorCode": abi.GET_ERROR_CODE,
              "GetErrorMessage": abi.GET_ERROR_MESSAGE, "CreateTensorAsOrtValue": abi.CREATE_TENSOR_AS_ORT_VALUE,
              "GetTensorMutableData": abi.GET_TENSOR_MUTABLE_DATA, "GetTensorElementType": abi.GET_TENSOR_ELEMENT_TYPE,
              "GetDimensionsCount": abi.GET_DIMENSIONS_COUNT, "GetDimensions": abi.GET_DIMENSIONS,
              "GetTensorShapeElementCount": abi.GET_TENSOR_SHAPE_ELEMENT_COUNT,
              "GetTensorTypeAndShape": abi.GET_TENSOR_TYPE_AND_SHAPE,
              "GetAllocatorWithDefaultOptions": abi.GET_ALLOCATOR_WITH_DEFAULT_OPTIONS,
              "KernelInfoGetAttribute_float": abi.KERNEL_INFO_GET_ATTRIBUTE_FLOAT,
              "KernelInfoGetAttribute_int64": abi.KERNEL_INFO_GET_ATTRIBUTE_INT64,
              "KernelInfoGetAttribute_string": abi.KERNEL_INFO_GET_ATTRIBUTE_STRING,
              "KernelInfoGetAttributeArray_float": abi.KERNEL_INFO_GET_ATTRIBUTE_ARRAY_FLOAT,
              "KernelInfoGetAttributeArray_int64": abi.KERNEL_INFO_GET_ATTRIBUTE_ARRAY_INT64,
              "KernelContext_GetInputCount": abi.KERNEL_CONTEXT_GET_INPUT_COUNT,
              "KernelContext_GetOutputCount": abi.KERNEL_CONTEXT_GET_OUTPUT_COUNT,
              "KernelContext_GetInput": abi.KERNEL_CONTEXT_GET_INPUT,
              "KernelContext_GetOutput": abi.KERNEL_CONTEXT_GET_OUTPUT,
              "KernelContext_ParallelFor": abi.KERNEL_CONTEXT_PARALLEL_FOR,
              "ReleaseStatus": abi.RELEASE_STATUS, "ReleaseValue": abi.RELEASE_VALUE,
              "ReleaseTensorTypeAndShapeInfo": abi.RELEASE_TENSOR_TYPE_AND_SHAPE_INFO}
    assert consts == abi.API_INDEX
    # the values the header gives (onnxruntime_c_api.h, counted from 0)
    assert abi.API_INDEX["CreateStatus"] == 0 and abi.API_INDEX["GetErrorMessage"] == 2
    assert abi.API_INDEX["KernelContext_GetOutput"] == 91 and abi.API_INDEX["ReleaseTensorTypeAndShapeInfo"] == 99
    # the array attribute getters (round trip: tests/test_native_chain.py::test_array_attributes_round_trip)
    assert abi.API_INDEX["KernelInfoGetAttributeArray_float"] == 162
    assert abi.API_INDEX["KernelInfoGetAttributeArray_int64"] == 163


def test_native_ops_match_specs():
    kinds = {float: "float", int: "int", str: "choice"}
    chains = {f"FusedEltwiseChain{k}" for k in range(5)}
    assert {"FusedAddRelu", "FusedHardSwish", "FusedSiLU", "FusedGemmAct"} | chains <= native_op_types()
    for name in sorted(native_op_types() & set(SPECS)):
        spec, op = SPECS[name], native_op_table()[name]
        assert len(op.inputs) == len(spec.inputs), name
        if op.node_attrs is not None:  # reads the attributes the rewriter adds for it (native_chain)
            assert {a.name: a.kind for a in op.attrs} == {
                "chain_ops": "ints", "chain_args": "ints", "chain_params": "floats"}, name
            continue
        assert {a.name: a.kind for a in op.attrs} == {k: kinds[t] for k, t in spec.attrs.items()}, name
        assert not name.endswith("Ref") and spec.ref_op_type != name


def test_ref_suffix_is_refused():
    with pytest.raises(ValueError, match="Python-op path"):
        op_def.NativeOpDef("FusedAddReluRef", ("A", "B"), native_op_table()["FusedAddRelu"].compute)


# --------------------------------------------------------------------------------------------------
# round trips through the probe op
# --------------------------------------------------------------------------------------------------


def test_probe_round_trips_every_api_index(options_factory):
    sess = _probe_session(options_factory(), s="beta+alpha+beta")
    x = np.arange(30, dtype=np.float32).reshape(2, 3, 5) / 7
    y = np.array([4, 5, 6, 7], dtype=np.int64)
    out = sess.run(None, {"X": x, "Y": y})[0]
    assert out.dtype == np.float64 and out.shape == (40,)
    assert out[0] == 2 and out[1] == 1                                  # KernelContext_GetInput/OutputCount
    assert out[2] == abi.ONNX_TYPE_FLOAT and out[3] == 3                 # GetTensorElementType, GetDimensionsCount
    assert list(out[4:7]) == [2, 3, 5]                                  # GetDimensions
    assert out[12] == abi.ONNX_TYPE_INT64 and out[13] == 1 and out[14] == 4
    assert out[22] == 1.5 and out[23] == -42                            # KernelInfoGetAttribute_float / _int64
    assert out[24] == 3 and list(out[25:28]) == [1, 0, 1]               # KernelInfoGetAttribute_string
    assert out[28] == 2.5 and out[29] == -7                             # defaults of absent optional attributes
    assert out[30] == abi.ORT_NOT_IMPLEMENTED                           # CreateStatus -> GetErrorCode
    assert out[31] == len("probe message") and out[32] == ord("p")      # GetErrorMessage (then ReleaseStatus)
    assert out[33] == 24 and out[34] == abi.ONNX_TYPE_FLOAT             # CreateTensorAsOrtValue + friends
    assert out[35] == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-6)  # GetTensorMutableData
    assert out[36] == 0


def test_probe_reads_given_optional_attributes_and_other_dtypes(options_factory):
    model = _model(PROBE_OP, [("X", TensorProto.DOUBLE), ("Y", TensorProto.UINT8)],
                   {"f": -0.25, "i": 2**40, "fo": 1e-3, "io": 5, "s": "",
                    "pattern_id": "x", "replaced_nodes": "a,b"}, TensorProto.DOUBLE)
    sess = ort.InferenceSession(model, options_factory(), providers=["CPUExecutionProvider"])
    out = sess.run(None, {"X": np.array(3.0), "Y": np.zeros((0, 2, 1), np.uint8)})[0]
    assert out[2] == abi.ONNX_TYPE_DOUBLE and out[3] == 0               # a scalar has rank 0
    assert out[12] == abi.ONNX_TYPE_UINT8 and out[13] == 3 and list(out[14:17]) == [0, 2, 1]
    assert out[22] == -0.25 and out[23] == 2**40
    assert out[24] == 0                                                 # "" is zero steps
    assert out[28] == np.float32(1e-3) and out[29] == 5
    assert out[35] == -1                                                # X not float32: not summed


def test_status_from_compute_reaches_python_and_session_survives(options_factory):
    sess = _probe_session(options_factory(), mode=1)
    feed = {"X": np.ones(3, np.float32), "Y": np.ones(2, np.int64)}
    for _ in range(3):
        with pytest.raises(Exception, match="OrtfuseAbiProbe: failure requested by attribute mode=1"):
            sess.run(None, feed)


@pytest.mark.parametrize(("attrs", "message"), [
    ({"i": 1}, "OrtfuseAbiProbe: attribute 'f' is required and missing"),
    ({"f": 1.0}, "OrtfuseAbiProbe: attribute 'i' is required and missing"),
    ({"f": 1.0, "i": 1, "s": "beta+delta"},
     "attribute 's' has unsupported value 'beta\\+delta'; expected '\\+'-joined tokens from: alpha, beta, gamma"),
    ({"f": 1.0, "i": 1, "s": "alpha+beta+gamma+alpha"}, "attribute 's' has more '\\+'-joined steps than 3"),
    ({"f": 1.0, "i": 1, "s": "a" * 300}, "attribute 's' is longer than 255 bytes"),
])
def test_bad_attributes_fail_session_creation_with_message(options_factory, attrs, message):
    model = _model(PROBE_OP, [("X", TensorProto.FLOAT), ("Y", TensorProto.FLOAT)], attrs, TensorProto.DOUBLE)
    gc.collect()  # sessions of earlier tests that are garbage already release their slots now
    before = slots.slot_stats()["live"]
    with pytest.raises(Exception, match=message):
        ort.InferenceSession(model, options_factory(), providers=["CPUExecutionProvider"])
    gc.collect()
    assert slots.slot_stats()["live"] == before  # the slot taken for the failed kernel went back
    assert PROBE_CHOICES == ("alpha", "beta", "gamma")


# --------------------------------------------------------------------------------------------------
# kernel-state pool
# --------------------------------------------------------------------------------------------------


def _two_node_model():
    nodes = [helper.make_node("FusedHardSwish", ["X"], ["H"], domain=DOMAIN, add=3.0, lo=0.0, hi=6.0, div=6.0,
                              pattern_id="hardswish", replaced_nodes="add,clip,div,mul"),
             helper.make_node("FusedAddRelu", ["H", "X"], ["Y"], domain=DOMAIN)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [5])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(DOMAIN, 1)]).SerializeToString()


def test_slots_are_reused_across_2000_sessions_and_rss_stays_flat(options_factory):
    psutil = pytest.importorskip("psutil")
    model = _two_node_model()
    so = options_factory(threads=1)
    x = np.linspace(-5, 5, 5, dtype=np.float32)
    expected = np.maximum(x * np.clip(x + 3, 0, 6) / 6 + x, 0)
    proc = psutil.Process()

    # many sessions alive at once: the pool grows to the peak...
    alive = [ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]) for _ in range(50)]
    stats = slots.slot_stats()
    assert stats["live"] >= 100
    del alive
    gc.collect()
    base = slots.slot_stats()
    allocated = base["allocated"]
    # ...and later churn reuses those slots instead of allocating
    rss = []
    for i in range(2000):
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, {"X": x})[0], expected, rtol=1e-6)
        del sess
        if i % 250 == 0:
            rss.append(proc.memory_info().rss)
    gc.collect()
    end = slots.slot_stats()
    assert end["live"] == base["live"]
    assert end["allocated"] == allocated                     # no new slot: all came from the free list
    assert end["creates"] - base["creates"] == 4000 and end["destroys"] - base["destroys"] == 4000
    assert end["alloc_failures"] == 0
    growth = rss[-1] - rss[1]
    assert growth < 24 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over 2000 sessions"


# --------------------------------------------------------------------------------------------------
# registration, fallback, cache
# --------------------------------------------------------------------------------------------------


def test_registered_ops_use_spec_names_only(options_factory):
    options_factory()
    names = install.registered_ops()
    assert set(NATIVE) <= set(names)
    assert not any(n.endswith("Ref") for n in names)


def test_unknown_op_name_returns_false_with_reason():
    assert register_native(ort.SessionOptions(), ["FusedConvAct"]) is False
    assert "no native kernel for FusedConvAct" in native_unavailable_reason(["FusedConvAct"])


def test_native_and_reference_ops_in_one_session(options_factory):
    nodes = [helper.make_node("FusedSiLU", ["X"], ["S"], domain=DOMAIN),
             helper.make_node("FusedSiLURef", ["S"], ["Y"], domain=DOMAIN, pattern_id="silu", replaced_nodes="s,m")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [6])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    sess = ort.InferenceSession(model.SerializeToString(), options_factory(), providers=["CPUExecutionProvider"])
    x = np.linspace(-3, 3, 6, dtype=np.float32)
    s = x / (1 + np.exp(-x))
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], s / (1 + np.exp(-s)), rtol=1e-5)


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=240, check=False)


def test_disabled_native_path_falls_back_cleanly():
    proc = _run_python("""
        import onnxruntime as ort
        from ortfuse.custom_ops.registration import register_native, register_library, native_unavailable_reason
        from ortfuse.fusion.catalogue import SPECS
        so = ort.SessionOptions()
        assert register_native(so, ["FusedAddRelu"]) is False
        print(native_unavailable_reason(["FusedAddRelu"]))
        register_library(so, SPECS.values())  # the reference path still works on the same options
        print("fallback ok")
    """, ORTFUSE_NATIVE="0")
    assert proc.returncode == 0, proc.stderr
    assert "disabled by ORTFUSE_NATIVE" in proc.stdout and "fallback ok" in proc.stdout


def test_session_with_only_native_kernels_never_imports_onnx(tmp_path):
    """With its plan cached, a fused session whose kernels are all native registers the extensions
    library by path: neither onnxruntime-extensions' Python package nor onnx (slow to import,
    through ml_dtypes) is imported, and the outputs equal stock ORT's unfused ones."""
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["S"], name="add"), helper.make_node("Relu", ["S"], ["Y"], name="relu")],
        "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 33]) for n in "AB"],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 33])]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "add_relu.onnx"
    path.write_bytes(model.SerializeToString())
    code = f"""
        import sys
        import numpy as np
        import onnxruntime
        import ortfuse
        sess = ortfuse.InferenceSession({str(path)!r}, fusion=True)
        kernels = [m.kernel for m in sess.fusion_report.fused]
        assert len(kernels) == 1 and kernels[0].startswith("native"), kernels
        rng = np.random.default_rng(0)
        feeds = {{n: rng.standard_normal((4, 33)).astype(np.float32) for n in "AB"}}
        so = onnxruntime.SessionOptions()
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        stock = onnxruntime.InferenceSession({str(path)!r}, so).run(None, feeds)[0]
        np.testing.assert_array_equal(sess.run(None, feeds)[0], stock)
        print("imported:", sorted(m for m in ("onnx", "onnxruntime_extensions") if m in sys.modules))
    """
    env = {"ORTFUSE_CACHE_DIR": str(tmp_path / "cache")}
    first = _run_python(code, **env)  # plans the fusion (parsing the model with onnx) and caches it
    assert first.returncode == 0, first.stderr
    assert "imported: ['onnx']" in first.stdout, first.stdout
    second = _run_python(code, **env)
    assert second.returncode == 0, second.stderr
    assert "imported: []" in second.stdout, second.stdout


def test_library_path_is_the_one_the_extensions_package_names():
    from onnxruntime_extensions import get_library_path

    from ortfuse.custom_ops.native.extensions import library_path

    assert os.path.samefile(library_path(), get_library_path())


def test_compiled_code_is_cached_in_user_folder():
    """Kernels compiled in-process (no ops library) land in the user cache folder; a fresh process
    loads every one of them from it."""
    code = """
        import numpy as np, onnxruntime as ort
        from onnx import helper, TensorProto
        from ortfuse.custom_ops.registration import register_native
        so = ort.SessionOptions()
        assert register_native(so, ["FusedSiLU"])
        node = helper.make_node("FusedSiLU", ["X"], ["Y"], domain="ai.onnx.contrib")
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)])
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        assert s.run(None, {"X": np.zeros(3, np.float32)})[0].tolist() == [0, 0, 0]
        from ortfuse.custom_ops import numba_setup
        from ortfuse.custom_ops.native import lifetime
        hits = sum(f._cache_hits for f in lifetime.COMPILED.values())
        print("hits", hits, "of", len(lifetime.COMPILED))
        print(numba_setup.cache_root())
    """
    first = _run_python(code, ORTFUSE_OPS_LIBRARY="off")  # compiles what the cache lacks (nothing, usually)
    assert first.returncode == 0, first.stderr
    second = _run_python(code, ORTFUSE_OPS_LIBRARY="off")
    assert second.returncode == 0, second.stderr
    if second.stdout.split()[1] != second.stdout.split()[3]:
        # a source of the package changed meanwhile (the stamp covers every numba file): once more
        second = _run_python(code, ORTFUSE_OPS_LIBRARY="off")
        assert second.returncode == 0, second.stderr
    words = second.stdout.split()
    assert int(words[1]) == int(words[3]) > 0, second.stdout
    root = second.stdout.splitlines()[1]
    assert root == numba_setup.cache_root()
    cached = [f for _, _, files in os.walk(root) for f in files if f.startswith("silu._silu_worker")]
    assert cached, f"no cached worker under {root}"
    package = os.path.dirname(abi.__file__)
    ours = ("intrinsics.", "ort_api.", "status_messages.")
    beside = [f for folder, _, files in os.walk(package) for f in files if f.endswith((".nbi", ".nbc"))
              and (f.startswith(ours) or os.path.join(package, "native") in folder)]
    assert not beside, f"cache files beside the sources: {beside}"


def test_cache_root_defaults_to_user_cache(monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert numba_setup.cache_root() == os.path.join("/somewhere", "ortfuse", "numba")
    assert numba_setup.configure_numba()  # the package's cache locator is in place


def test_threading_settings_round_trip():
    mode, par_min = threads.threading_settings()
    try:
        assert threads.set_threading("serial", 123) == ("serial", 123)
        with pytest.raises(ValueError, match="threading mode"):
            threads.set_threading("fibers")
    finally:
        threads.set_threading(mode, par_min)


def test_register_library_still_works_alone():
    so = ort.SessionOptions()
    register_library(so, SPECS.values())
    model = helper.make_model(helper.make_graph(
        [helper.make_node("FusedAddReluRef", ["A", "B"], ["Y"], domain=DOMAIN, pattern_id="add_relu",
                          replaced_nodes="add,relu")], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in "AB"],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a = np.array([-1, 0, 2], np.float32)
    assert sess.run(None, {"A": a, "B": a})[0].tolist() == [0, 0, 4]


def test_python_op_of_the_same_name_is_refused():
    """A name on both paths would make extensions loop forever: registration refuses it instead."""
    proc = _run_python("""
        import onnxruntime as ort
        from onnxruntime_extensions import PyCustomOpDef, onnx_op
        from ortfuse.custom_ops.registration import register_native, native_unavailable_reason

        @onnx_op(op_type="FusedSiLU", inputs=[PyCustomOpDef.dt_float], outputs=[PyCustomOpDef.dt_float])
        def clash(x):
            return x

        assert register_native(ort.SessionOptions(), ["FusedSiLU"]) is False
        print(native_unavailable_reason())
    """)
    assert proc.returncode == 0, proc.stderr
    assert "a Python op is already named FusedSiLU" in proc.stdout
