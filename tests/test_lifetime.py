"""Lifetime and concurrency beyond test_concurrency.py (one FFN session, 8 threads x 500 runs):
2,000 fused sessions created and destroyed through ortfuse.InferenceSession (each with its own
SessionOptions and library registration) leave RSS and the native kernel-state pool flat; many
sessions with different patterns live side by side in threads; a forced ISA (``ORTFUSE_ISA`` with
``isa.numba_env``, in a subprocess) runs the same; 1,000 runs of a fused session keep RSS flat (the
CI cut of tools/soak.py); a kernel error inside a run, for every native op and the reference path,
is an exception and the session, and other threads using it, go on."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime
import psutil
import pytest
from onnx import TensorProto, helper

import ortfuse
from ortfuse.custom_ops.native import availability, slots
from ortfuse.custom_ops.specs import DOMAIN

from model_fixtures import ffn_inputs, ffn_matmul_add_relu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import soak as soak_tool  # noqa: E402 - tools/ is not a package: on the path first

pytestmark = pytest.mark.skipif(availability.unavailable_reason() is not None,
                                reason=f"native path unavailable: {availability.unavailable_reason()}")
RTOL, ATOL = 1e-5, 1e-6
MiB = 2**20


def _two_native_ops_model():
    """x -> HardSwish (Add-Clip-Div-Mul) -> Add(., y) -> Relu: native FusedHardSwish + FusedAddRelu."""
    f = TensorProto.FLOAT
    inits = [helper.make_tensor(n, f, [], [v]) for n, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0))]
    nodes = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
             helper.make_node("Div", ["c", "six"], ["d"]), helper.make_node("Mul", ["x", "d"], ["h"]),
             helper.make_node("Add", ["h", "y"], ["s"]), helper.make_node("Relu", ["s"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, ["n", 8]),
                                           helper.make_tensor_value_info("y", f, ["n", 8])],
                              [helper.make_tensor_value_info("z", f, ["n", 8])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_2000_fused_sessions_leave_rss_and_kernel_pool_flat():
    """Create, run and drop 2,000 ortfuse sessions (2 native kernels each, default options): the pool's
    live slots return to their start, no slot is allocated beyond the first sessions', and RSS grows
    by less than 8 MiB after a 200-session warm-up: each registration of the extensions library keeps
    a few KiB for good, so sessions without options share one registered SessionOptions."""
    data = _two_native_ops_model()
    feeds = {"x": np.linspace(-5, 5, 16, dtype=np.float32).reshape(2, 8), "y": np.full((2, 8), -0.5, np.float32)}
    expected = onnxruntime.InferenceSession(data).run(None, feeds)[0]
    proc = psutil.Process()
    gc.collect()
    base = slots.slot_stats()
    rss = {}
    for i in range(2000):
        session = ortfuse.InferenceSession(data, fusion=True)
        if i == 0:
            assert {m.kernel.split()[0] for m in session.fusion_report.fused} == {"native"}, \
                session.fusion_report.table()
        np.testing.assert_allclose(session.run(None, feeds)[0], expected, rtol=RTOL, atol=ATOL)
        del session
        if i in (200, 1999):
            gc.collect()
            rss[i] = proc.memory_info().rss
    gc.collect()
    end = slots.slot_stats()
    assert end["live"] == base["live"], (base, end)
    assert end["creates"] - base["creates"] == 4000 == end["destroys"] - base["destroys"], (base, end)
    assert end["allocated"] <= max(base["allocated"], base["live"] + 2), (base, end)  # reused, never more
    assert end["alloc_failures"] == base["alloc_failures"]
    growth = rss[1999] - rss[200]
    print(f"RSS growth over sessions 200..1999: {growth / MiB:.2f} MiB")
    assert growth < 8 * MiB, f"RSS grew by {growth / MiB:.1f} MiB over 1,800 fused sessions"


def _session_zoo():
    """(name, model bytes, fusion_patterns, feeds, stock model bytes) of sessions with different fused
    op sets (the stock model differs for the one saved already fused)."""
    ffn = ffn_matmul_add_relu().SerializeToString()
    two = _two_native_ops_model()
    feeds2 = {"x": np.linspace(-4, 4, 24, dtype=np.float32).reshape(3, 8), "y": np.ones((3, 8), np.float32)}
    saved = ortfuse.fuse(onnx.load_from_string(two), ["eltwise_chain"], kernels="reference")[0].SerializeToString()
    zoo = [("ffn_all", ffn, None, ffn_inputs()), ("ffn_gemm", ffn, ["gemm_act"], ffn_inputs(seed=2)),
           ("ffn_add_relu", ffn, ["add_relu"], ffn_inputs(batch=1, seq=9)),
           ("two_all", two, None, feeds2), ("two_hardswish", two, ["hardswish"], feeds2),
           ("two_chain", two, ["eltwise_chain"], feeds2)]
    return [(*entry, entry[1]) for entry in zoo] + [("two_chain_reference", saved, None, feeds2, two)]


def test_many_sessions_with_different_patterns_in_threads():
    """Seven sessions with different fused op sets (native, lowered, reference) alive at once, each
    run 200 times from 6 threads in an interleaved order: every output equals stock ORT's."""
    zoo = _session_zoo()
    sessions, expected = {}, {}
    for name, data, patterns, feeds, stock in zoo:
        sessions[name] = ortfuse.InferenceSession(data, fusion=True, fusion_patterns=patterns)
        saved = "saved already fused" in sessions[name].fusion_report.reason
        assert sessions[name].fusion_report.applied or saved, (name, sessions[name].fusion_report.table())
        expected[name] = onnxruntime.InferenceSession(stock).run(None, feeds)[0]
    kernels = {m.kernel.split()[0] for s in sessions.values() for m in s.fusion_report.fused}
    assert {"native", "lowered"} <= kernels, kernels
    assert sessions["two_chain_reference"]._ortfuse_reference_inputs, "the reference kernels are in the mix"
    feeds_of = {name: feeds for name, _, _, feeds, _ in zoo}

    def worker(k):
        bad = 0
        for i in range(200):
            name = zoo[(k + i) % len(zoo)][0]
            out = sessions[name].run(None, feeds_of[name])[0]
            bad += not np.allclose(out, expected[name], rtol=RTOL, atol=ATOL)
        return bad

    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(worker, range(6), timeout=300)) == [0] * 6


ISA_PROBE = r"""
import json, sys, numpy as np, onnxruntime
sys.path.insert(0, sys.argv[1])
import ortfuse
from ortfuse.kernel_choice import registry
from test_lifetime import _session_zoo
out = {"native_isa": registry.native_isa(), "sessions": {}}
for name, data, patterns, feeds, stock in _session_zoo():
    s = ortfuse.InferenceSession(data, fusion=True, fusion_patterns=patterns)
    got = s.run(None, feeds)[0]
    want = onnxruntime.InferenceSession(stock).run(None, feeds)[0]
    out["sessions"][name] = {"kernels": sorted({m.kernel for m in s.fusion_report.fused}),
                             "max_diff": float(np.max(np.abs(got - want)))}
print(json.dumps(out))
"""


def test_forced_isa_in_a_subprocess():
    """numba compiles for one ISA per process (docs/ARCHITECTURE.md §5): a subprocess with ORTFUSE_ISA=avx2 and
    avx2's numba target selects and runs avx2 kernels for every session of the zoo above, equal to
    stock ORT (max |diff| <= 1e-5)."""
    from ortfuse.foundation import isa

    if "avx2" not in isa.supported_isas():
        pytest.skip("this CPU has no AVX2")  # only on CPUs without AVX2, never on the CI machines
    env = {**os.environ, **isa.numba_env("avx2"), "ORTFUSE_ISA": "avx2"}
    proc = subprocess.run([sys.executable, "-c", ISA_PROBE, os.path.join(ROOT, "tests")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["native_isa"] == "avx2", report
    natives = [k for s in report["sessions"].values() for k in s["kernels"] if k.startswith("native")]
    assert natives and all(k == "native numba avx2" for k in natives), report
    assert all(s["max_diff"] <= 1e-5 for s in report["sessions"].values()), report


def test_1000_runs_keep_rss_flat():
    """The CI cut of tools/soak.py: 1,000 runs of a fused FFN (native kernels), RSS sampled every 50
    runs after a 10% warm-up: projected growth and largest rise below 4 MiB, outputs unchanged."""
    import onnx

    fused, report = ortfuse.fuse(ffn_matmul_add_relu(), kernels="native")
    assert report.applied and {m.kernel.split()[0] for m in report.fused} == {"native"}, report.table()
    session = ortfuse.InferenceSession(fused)
    assert session.fusion_report.applied
    result = soak_tool.soak(session, ffn_inputs(batch=4, seq=32), runs=1000, every=50, threshold_mib=4.0,
                            progress=False)
    print(f"slope {result['slope_bytes_per_run']:.1f} B/run, rise {result['max_rise_bytes'] / MiB:.2f} MiB")
    assert result["verdict"] == "FLAT", result
    assert len(result["samples"]) == 21 and onnx  # the samples were really taken


def test_soak_slope_detects_a_leak():
    """The soak verdict is not vacuous: a session wrapper that leaks 64 KiB per run is GROWING."""
    import mmap

    leak = []

    class Leaky:
        def run(self, names, feeds):
            block = mmap.mmap(-1, 65536)  # fresh pages (a heap block could reuse pages freed earlier)
            block.write(b"x" * 65536)
            leak.append(block)
            return [np.zeros(1)]

    result = soak_tool.soak(Leaky(), {}, runs=1000, every=50, threshold_mib=4.0, progress=False)
    assert result["verdict"] == "GROWING" and result["slope_bytes_per_run"] > 32 * 1024, result


# --------------------------------------------------------------------------------------------------
# a kernel error inside a run, for every native op and the reference path
# --------------------------------------------------------------------------------------------------
def _saved_fused(op_type, inputs, attrs=None, init=()):
    """A model saved already fused (one node of our domain, inputs of unknown shape), which
    ortfuse.InferenceSession runs as is with its ops registered."""
    attrs = {"pattern_id": "test", "replaced_nodes": "a,b", **(attrs or {})}
    node = helper.make_node(op_type, list(inputs), ["Out"], domain=DOMAIN, name="fused", **attrs)
    dynamic = [n for n in inputs if n not in {t.name for t in init}]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in dynamic],
                              [helper.make_tensor_value_info("Out", TensorProto.FLOAT, None)], initializer=list(init))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


_W = helper.make_tensor("W", TensorProto.FLOAT, [4, 3], np.linspace(-1, 1, 12).tolist())
_B = helper.make_tensor("B", TensorProto.FLOAT, [3], [0.1, -0.2, 0.3])
_HS = {"add": 3.0, "lo": 0.0, "hi": 6.0, "div": 6.0}
RANK13 = np.ones((1,) * 13, np.float32)
KERNEL_ERRORS = {
    # op: (model, bad feeds, message, good feeds, numpy reference of the good feeds)
    "FusedAddRelu": (_saved_fused("FusedAddRelu", ["A", "B"]),
                     {"A": np.ones((2, 3), np.float32), "B": np.ones(4, np.float32)},
                     r"FusedAddRelu: input shapes \[2,3\] and \[4\] do not broadcast",
                     {"A": np.float32([[-1, 2, 3]]), "B": np.float32([1, -3, 0])}, lambda a, b: np.maximum(a + b, 0)),
    "FusedHardSwish": (_saved_fused("FusedHardSwish", ["X"], _HS), {"X": RANK13}, "FusedHardSwish: input 0 has rank 13",
                       {"X": np.float32([-4, -1, 0, 1, 4])}, lambda x: x * np.clip(x + 3, 0, 6) / 6),
    "FusedSiLU": (_saved_fused("FusedSiLU", ["X"]), {"X": RANK13}, "FusedSiLU: input 0 has rank 13",
                  {"X": np.float32([-4, -1, 0, 1, 4])}, lambda x: x / (1 + np.exp(-x))),
    "FusedGemmAct": (_saved_fused("FusedGemmAct", ["X", "W", "B"], {"activation": "relu"}, init=[_W, _B]),
                     {"X": np.ones((2, 5), np.float32)}, "FusedGemmAct",
                     {"X": np.arange(8, dtype=np.float32).reshape(2, 4) - 3},
                     lambda x: np.maximum(x @ np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
                                          + np.float32([0.1, -0.2, 0.3]), 0)),
    "FusedAddReluRef": (_saved_fused("FusedAddReluRef", ["A", "B"]),
                        {"A": np.ones((2, 3), np.float32), "B": np.ones(4, np.float32)},
                        "FusedAddReluRef node \\(ortfuse reference kernel\\).*broadcast",
                        {"A": np.float32([[-1, 2, 3]]), "B": np.float32([1, -3, 0])},
                        lambda a, b: np.maximum(a + b, 0)),
}


@pytest.mark.parametrize("op", sorted(KERNEL_ERRORS))
def test_kernel_error_is_an_exception_and_the_session_goes_on(op):
    """Bad shapes reach the kernel (ORT cannot check shapes of our ops): an exception naming the op,
    native ops with ORT's INVALID_ARGUMENT status, the reference path with ORT's FAIL (an exception
    escaping it would abort the process); then the next good input is right, ten times over."""
    model, bad, message, good, reference = KERNEL_ERRORS[op]
    session = ortfuse.InferenceSession(model)  # no fusion metadata: ortfuse registers the ops it holds
    assert "saved already fused" in session.fusion_report.reason, session.fusion_report
    errors = onnxruntime.capi.onnxruntime_pybind11_state
    # the class of each case against stock ORT is tested on fused models in test_run_inputs.py
    expected_type = errors.Fail if op.endswith("Ref") else (errors.Fail, errors.InvalidArgument)
    want = reference(*good.values())
    for _ in range(10):
        with pytest.raises(expected_type, match=message):
            session.run(None, bad)
        np.testing.assert_allclose(session.run(None, good)[0], want, rtol=1e-5, atol=1e-6)


def test_kernel_errors_in_some_threads_leave_the_others_right():
    """Four threads share one session of each native op; two feed shapes the kernel rejects, two
    feed good inputs: every bad run raises, every good run is right."""
    cases = [KERNEL_ERRORS[op] for op in ("FusedAddRelu", "FusedGemmAct", "FusedAddReluRef")]
    sessions = [ortfuse.InferenceSession(model) for model, *_ in cases]
    raised, wrong, lock = [0], [0], threading.Lock()

    def worker(k):
        for i in range(150):
            j = (k + i) % len(cases)
            _, bad, _, good, reference = cases[j]
            if k % 2:
                try:
                    sessions[j].run(None, bad)
                except Exception:
                    with lock:
                        raised[0] += 1
            else:
                ok = np.allclose(sessions[j].run(None, good)[0], reference(*good.values()), rtol=1e-5, atol=1e-6)
                with lock:
                    wrong[0] += not ok

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(worker, range(4), timeout=300))
    assert raised[0] == 300 and wrong[0] == 0, (raised, wrong)
