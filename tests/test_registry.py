"""Kernel registry and selection: native kernels where this CPU and process can run them, the
reference path otherwise, a stated reason when nothing fits, and the single-warning fallback."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime
import pytest

import ortfuse
from ortfuse.kernel_choice import op_registration, registry

from model_fixtures import ffn_inputs, ffn_matmul_add_relu


@pytest.fixture
def fresh_registry(monkeypatch):
    registry._native_ops.cache_clear()
    yield monkeypatch
    registry._native_ops.cache_clear()


def test_reference_kernel_exists_for_every_op():
    from ortfuse.fusion.catalogue import SPECS

    for op in SPECS:
        sel = registry.select(op, prefer="reference")
        assert sel.kernel is not None and sel.kernel.op_type == op + "Ref", op


def test_native_kernel_wins_where_one_exists(fresh_registry):
    native = registry._native_ops()
    assert "FusedAddRelu" in native, "the native path should be available on this machine"
    sel = registry.select("FusedAddRelu")
    assert sel.kernel.path == "native" and sel.kernel.op_type == "FusedAddRelu"
    assert sel.isa == registry.native_isa() and sel.label == f"native numba {sel.isa}"


def test_native_disabled_by_environment_falls_to_reference(fresh_registry):
    fresh_registry.setenv("ORTFUSE_NATIVE", "0")
    sel = registry.select("FusedAddRelu")
    assert sel.kernel.path == "reference"


def test_dtype_without_kernel_is_a_reason_not_a_crash():
    sel = registry.select("FusedAddRelu", dtype="float64")
    assert sel.kernel is None and "no FusedAddRelu kernel for dtype float64" in sel.reason
    half = registry.select("FusedAddRelu", dtype="float16")  # native only: no reference kernel takes float16
    assert (half.kernel is None) == (not registry._native_ops()), half
    assert half.kernel is None or (half.kernel.path == "native" and half.kernel.op_type == "FusedAddReluF16")


@pytest.mark.parametrize("override, expected", [("amx-tile,avx512f,avx512bw,avx512vl,avx512dq,avx2,avx,fma,sse4.2,sse2",
                                                 "amx"),
                                                ("avx2,avx,fma,sse4.2,sse2", "avx2"), ("sse2", "generic")])
def test_amx_kernel_selected_only_where_the_cpu_reports_amx(monkeypatch, override, expected):
    """Selection logic with an overridden feature set: an AMX kernel (a test-only entry of another
    dtype; the real one, FusedGemmActBf16, is tested in test_amx.py) is chosen on an AMX CPU, and on
    others the reason names what this CPU has."""
    from ortfuse.foundation import isa

    monkeypatch.setenv("ORTFUSE_ISA", override)
    monkeypatch.setattr(registry, "_amx_unavailable_reason", lambda: None)  # as on an AMX host that grants it
    isa.refresh()
    try:
        amx = registry.Kernel("FusedGemmAct", "native", ("amx",), ("bfloat16",), 20)
        sel = registry.select("FusedGemmAct", dtype="bfloat16", extra=(amx,))
        assert isa.supported_isas()[0] == expected
        if expected == "amx":
            assert sel.kernel is amx and sel.isa == "amx"
        else:
            assert sel.kernel is None and expected in sel.reason
    finally:
        monkeypatch.delenv("ORTFUSE_ISA")
        isa.refresh()


def test_unavailable_native_path_warns_once_and_uses_kernels_without_native_ops(monkeypatch):
    from ortfuse.custom_ops import registration

    monkeypatch.setattr(registration, "register_native", lambda so, names, reference_specs=(): False)
    monkeypatch.setattr(registration, "native_unavailable_reason", lambda names=(): "simulated: no symbol")
    monkeypatch.setattr(op_registration, "_warned", [False])
    # options registered by earlier tests would skip the patch
    monkeypatch.setattr(op_registration, "_default_options", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion=True)
        b = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion=True)
    relevant = [w for w in caught if "native kernels unavailable" in str(w.message)]
    assert len(relevant) == 1
    for sess in (a, b):
        kernels = {m.pattern_id: m.kernel for m in sess.fusion_report.fused}
        assert kernels["add_relu"].startswith("reference")  # its only other kernel is native
        assert kernels["gemm_act"].startswith("lowered")  # ORT's own ops need nothing registered
        assert any("simulated: no symbol" in n for n in sess.fusion_report.notes)
    feeds = ffn_inputs()
    expected = onnxruntime.InferenceSession(ffn_matmul_add_relu().SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(a.run(None, feeds)[0], expected, rtol=1e-5, atol=1e-5)


def _add_relu_then_silu():
    """relu(x + y) then SiLU: two patterns with native kernels (FusedAddRelu, FusedSiLU)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Add", ["x", "y"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("Sigmoid", ["r"], ["g"], name="sig"),
             helper.make_node("Mul", ["r", "g"], ["z"], name="mul")]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 7]) for n in ("x", "y", "z")]
    model = helper.make_model(helper.make_graph(nodes, "g", vi[:2], vi[2:]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(0)
    return model, {k: rng.standard_normal((3, 7)).astype(np.float32) for k in ("x", "y")}


def test_reused_options_leave_matches_needing_new_native_ops_to_ort():
    """The extensions library reads its op list when registered on the options: options first used for
    a model needing FusedAddRelu cannot take FusedSiLU later. The second model then gets only fusions
    lowered to ORT's own ops (none here), never the slow reference kernels, and a warning each time."""
    so = onnxruntime.SessionOptions()
    model, feeds = _add_relu_then_silu()
    first = ortfuse.InferenceSession(model, so, fusion=True, fusion_patterns=["add_relu"])
    assert first.fusion_report.counts() == {"add_relu": 1}
    assert first.fusion_report.fused[0].kernel.startswith("native")
    for _ in range(2):
        with pytest.warns(UserWarning, match="registered before without FusedSiLU"):
            second = ortfuse.InferenceSession(model, so, fusion=True)
    assert second.fusion_report.fused == [], second.fusion_report.table()
    notes = second.fusion_report.notes
    assert any("only fusions lowered to ORT's own ops" in n for n in notes), notes
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(second.run(None, feeds)[0], expected, rtol=1e-5, atol=1e-6)
    same = ortfuse.InferenceSession(model, so, fusion=True, fusion_patterns=["add_relu"])  # what it has: native
    assert same.fusion_report.fused[0].kernel.startswith("native")


def test_lowered_only_preference_picks_only_ort_ops():
    best = registry.select("FusedConvAct", variant="relu", prefer=registry.LOWERED_ONLY)
    assert best.kernel.path == registry.LOWERED and not best.kernel.uses_native
    if "FusedHardSwish" in registry._native_ops():  # Conv + native FusedHardSwish is out
        assert not registry.select("FusedConvAct", variant="hardswish", prefer=registry.LOWERED_ONLY).kernel.uses_native
    assert registry.select("FusedAddRelu", prefer=registry.LOWERED_ONLY).kernel is None  # no lowered form


def test_no_native_preference_never_picks_a_kernel_that_needs_native_ops():
    """The fallback when native ops cannot be registered: lowered rules ending in a native op are out too."""
    if "FusedHardSwish" not in registry._native_ops():
        pytest.skip("the native path is unavailable here, so every kernel already runs without it")
    offered = [k for k in registry.kernels_for("FusedConvAct") if k.serves("hardswish")]
    assert any(k.uses_native for k in offered)  # Conv + native FusedHardSwish is a candidate where it can run
    fallback = registry.select("FusedConvAct", variant="hardswish", prefer=registry.NO_NATIVE)
    assert fallback.kernel is not None and not fallback.kernel.uses_native
    assert fallback.kernel.path == registry.LOWERED  # ORT's HardSwish op or HardSigmoid+Mul, not numpy
    assert registry.select("FusedAddRelu", prefer=registry.NO_NATIVE).kernel.path == registry.REFERENCE


# ----------------------------------------------------------------- the ISA a label names is numba's target


def test_target_level_is_what_numba_compiles_for():
    from ortfuse.foundation import isa

    for level in isa.KERNEL_ISAS:
        assert isa.target_level(*isa.numba_env(level).values()) == level, level
    assert isa.target_level(*isa.numba_env("amx").values()) == "avx512"  # the native kernels' build on AMX
    host = next(level for level in isa.KERNEL_ISAS if isa.LEVEL_FEATURES[level] <= isa.host_features())
    assert isa.target_level(None, None) == host  # numba's default: the host
    assert isa.target_level("haswell", None) == host  # a name alone keeps the host's features
    assert isa.target_level("generic", "") == "generic"
    assert isa.target_level("haswell", "+avx2,+fma,+avx,+sse4.2,-avx2") == "generic"  # removed again


LABEL_PROBE = """
import json, os
from ortfuse.foundation import isa
from ortfuse.kernel_choice import registry
import ortfuse
from model_fixtures import ffn_matmul_add_relu
sel = registry.select("FusedAddRelu", prefer="native")
_, report = ortfuse.fuse(ffn_matmul_add_relu())
print(json.dumps({"native_isa": registry.native_isa(), "native": sel.label, "reason": sel.reason,
                  "labels": [m.kernel for m in report.fused], "numba": isa.numba_target()}))
"""


def _probe(env: dict) -> dict:
    import json
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    base = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "ORTFUSE_ISA")}
    proc = subprocess.run([sys.executable, "-c", LABEL_PROBE], env={**base, **env, "PYTHONPATH": tests},
                          capture_output=True, text=True, timeout=300, cwd=os.path.dirname(tests), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh process imports ortfuse and lists the native ops (about 5 s)
def test_isa_override_never_labels_host_code_generic():
    """ORTFUSE_ISA=generic without numba's variables: numba compiles for the host, so no label says
    "generic": the native kernels are the host's build, which the pretended CPU lacks, so they are
    not chosen (the reason names their ISA); what runs is labelled truthfully."""
    from ortfuse.foundation import isa

    if not registry._native_ops():
        pytest.skip("the native path is unavailable in this process")
    host = isa.target_level(None, None)
    if host == "generic":
        pytest.skip("this CPU's own level is generic: nothing to tell apart")
    got = _probe({"ORTFUSE_ISA": "generic"})
    assert got["native_isa"] == host and got["numba"] == [None, None], got
    assert got["native"] == "" and f"compiled for {host}" in got["reason"], got
    assert got["labels"] and not any("generic" in label for label in got["labels"]), got


@pytest.mark.slow  # a fresh process imports ortfuse and lists the native ops (about 5 s)
def test_numba_target_names_the_label():
    """numba_env("avx2") (an AVX2 build, on a CPU that has AVX2): the native label says avx2."""
    from ortfuse.foundation import isa

    if not registry._native_ops():
        pytest.skip("the native path is unavailable in this process")
    if "avx2" not in isa.LEVEL_FEATURES or not isa.LEVEL_FEATURES["avx2"] <= isa.host_features():
        pytest.skip("this CPU has no AVX2")
    got = _probe(isa.numba_env("avx2"))
    assert got["native_isa"] == "avx2" and got["native"] == "native numba avx2", got
    assert "native numba avx2" in got["labels"], got
