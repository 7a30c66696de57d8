"""A fused session shared by Python threads: outputs identical to a serial run, no crash or
deadlock, run_async too; a run the kernel rejects raises and the next good run still works."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import ortfuse

from model_fixtures import ffn_inputs, ffn_matmul_add_relu

THREADS, RUNS = 8, 500


@pytest.fixture(scope="module")
def fused_session():
    """The FFN fused with native kernels only (the registry lowers its GEMM to ORT by default)."""
    fused, _ = ortfuse.fuse(ffn_matmul_add_relu(), kernels="native")
    session = ortfuse.InferenceSession(fused)
    assert {m.kernel.split()[0] for m in session.fusion_report.fused} == {"native"}
    assert len(session.fusion_report.fused) == 2
    return session


def test_threads_share_a_fused_session(fused_session):
    feeds = [ffn_inputs(batch=1 + i % 3, seq=3 + i, seed=i) for i in range(THREADS)]
    serial = [fused_session.run(None, f)[0] for f in feeds]

    def worker(i):
        return [np.array_equal(fused_session.run(None, feeds[i])[0], serial[i]) for _ in range(RUNS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS), timeout=300))
    assert all(all(r) for r in results), [sum(not x for x in r) for r in results]


def test_run_async_many_in_flight(fused_session):
    feeds = ffn_inputs(batch=2, seq=7, seed=3)
    expected = fused_session.run(None, feeds)[0]
    done, outputs, lock = threading.Semaphore(0), [], threading.Lock()

    def callback(results, user_data, err):
        with lock:
            outputs.append((err, results[0] if not err else None))
        done.release()

    for _ in range(64):
        fused_session.run_async(None, feeds, callback, None)
    for _ in range(64):
        assert done.acquire(timeout=60), "a run_async callback never came"
    assert all(err == "" and np.array_equal(out, expected) for err, out in outputs)


def test_kernel_rejection_raises_and_the_session_keeps_working(fused_session):
    """x with a last dim the fused GEMM cannot take: ORT's own shape check or the kernel's status
    surfaces as an exception; the next good input runs and is correct."""
    bad = {"x": np.ones((1, 2, 5), np.float32)}
    with pytest.raises(Exception):  # noqa: B017 - ORT's shape check or the kernel's status: either
        fused_session.run(None, bad)
    good = ffn_inputs()
    stock = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion=False)
    np.testing.assert_allclose(fused_session.run(None, good)[0], stock.run(None, good)[0], rtol=1e-5, atol=1e-5)


def test_native_kernel_shape_error_is_an_exception_like_stock_and_recoverable():
    """Add+Relu of two dynamic tensors with symbolic shapes: shapes that do not broadcast reach the
    native kernel, whose status becomes an exception (stock ORT raises the same type); then a good
    input runs and is correct."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Add", ["x", "y"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["z"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
                                           helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["k"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    stock = onnxruntime.InferenceSession(model.SerializeToString())
    fused = ortfuse.InferenceSession(model, fusion=True)
    assert fused.fusion_report.fused[0].kernel.startswith("native")
    bad = {"x": np.ones(3, np.float32), "y": np.ones(4, np.float32)}
    with pytest.raises(Exception) as theirs:
        stock.run(None, bad)
    with pytest.raises(type(theirs.value), match="FusedAddRelu: input shapes \\[3\\] and \\[4\\] do not broadcast"):
        fused.run(None, bad)
    good = {"x": np.linspace(-2, 2, 5, dtype=np.float32), "y": np.float32([0.5])[[0] * 5]}
    np.testing.assert_array_equal(fused.run(None, good)[0], stock.run(None, good)[0])


def test_native_gemm_shape_error_has_stock_exception_type():
    """MatMul+Add+Relu with a symbolic K: a wrong K at run time reaches the fused GEMM, which raises
    the exception type stock ORT raises at its default level (where it runs a FusedGemm itself)."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    b = numpy_helper.from_array(np.zeros(3, np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["z"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "k"])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 3])], initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    stock = onnxruntime.InferenceSession(model.SerializeToString())
    fused = ortfuse.InferenceSession(ortfuse.fuse(model, kernels="native")[0])  # by default lowered to FusedGemm
    assert fused.fusion_report.fused[0].kernel.startswith("native")
    bad = {"x": np.ones((2, 5), np.float32)}
    with pytest.raises(Exception) as theirs:
        stock.run(None, bad)
    with pytest.raises(type(theirs.value), match="FusedGemmAct"):
        fused.run(None, bad)
    good = {"x": np.arange(8, dtype=np.float32).reshape(2, 4) - 3}
    np.testing.assert_allclose(fused.run(None, good)[0], stock.run(None, good)[0], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# reference (Python-op) kernel errors off the caller's thread: run_async and ORT's parallel executor
# (both aborted the process before: the error had no run to stop)
# --------------------------------------------------------------------------------------------------
def _two_reference_branches():
    """Two independent FusedAddReluRef nodes (parallel branches) saved already fused, and the same
    graph in stock ops (Add -> Relu per branch) for stock ORT's answer."""
    from onnx import TensorProto, helper

    from ortfuse.custom_ops.specs import DOMAIN

    def graph(nodes):
        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("A", "B")]
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("O1", "O2")]
        return helper.make_model(helper.make_graph(nodes, "g", io, outs),
                                 opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])

    fused = graph([helper.make_node("FusedAddReluRef", ["A", "B"], [o], domain=DOMAIN, name=o,
                                    pattern_id="add_relu", replaced_nodes="a,r") for o in ("O1", "O2")])
    stock = graph([n for o in ("O1", "O2") for n in (helper.make_node("Add", ["A", "B"], [o + "s"]),
                                                      helper.make_node("Relu", [o + "s"], [o]))])
    return fused, stock


BAD = {"A": np.ones((2, 3), np.float32), "B": np.ones(4, np.float32)}
GOOD = {"A": np.float32([[-1, 2, 3]]), "B": np.float32([1, -3, 0])}
WANT = np.maximum(GOOD["A"] + GOOD["B"], 0)


def test_run_async_reference_kernel_error_calls_back_like_stock_ort():
    """Stock ORT calls back ([], user_data, status message) for a run that fails; so does a fused
    session whose reference kernel fails, and the next good run calls back with the outputs."""
    import onnxruntime

    fused_model, stock_model = _two_reference_branches()
    fused = ortfuse.InferenceSession(fused_model.SerializeToString())
    stock = onnxruntime.InferenceSession(stock_model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = {}

    def run_async(session, feeds):
        done = threading.Event()

        def callback(results, user_data, err):
            got[id(session)] = (results, user_data, err)
            done.set()

        session.run_async(None, feeds, callback, "user")
        assert done.wait(60), "run_async never called back"
        return got[id(session)]

    for session in (stock, fused):
        results, user_data, err = run_async(session, BAD)
        assert results == [] and user_data == "user", (results, user_data)
        assert err.startswith("Non-zero status code returned while running "), err
        assert ("FusedAddReluRef node (ortfuse reference kernel)" in err) == (session is fused), err
        results, user_data, err = run_async(session, GOOD)
        assert err == "" and len(results) == 2, err
        np.testing.assert_allclose(results[0], WANT, rtol=1e-6)
        np.testing.assert_allclose(results[1], WANT, rtol=1e-6)
    with pytest.raises(ValueError, match="missing from input feed"):  # raised in the caller's thread, as ORT does
        fused.run_async(None, {"A": GOOD["A"]}, lambda *a: None, None)
    one_thread = onnxruntime.SessionOptions()
    one_thread.intra_op_num_threads = 1  # no pool thread to run on: ORT refuses run_async at once
    for session in (onnxruntime.InferenceSession(stock_model.SerializeToString(), one_thread),
                    ortfuse.InferenceSession(fused_model.SerializeToString(), one_thread)):
        with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match="at least one thread"):
            session.run_async(None, GOOD, lambda *a: None, None)


def test_parallel_executor_reference_kernel_error_raises_and_threads_go_on():
    """ORT_PARALLEL runs the two branches on inter-op threads: a failing reference kernel there raises
    ORT's Fail in the caller (stock ORT raises Fail for its failing Add), good runs stay right, from
    four threads at once."""
    import onnxruntime

    fused_model, stock_model = _two_reference_branches()
    options = onnxruntime.SessionOptions()
    options.execution_mode = onnxruntime.ExecutionMode.ORT_PARALLEL
    options.inter_op_num_threads = 2
    fused = ortfuse.InferenceSession(fused_model.SerializeToString(), options)
    stock = onnxruntime.InferenceSession(stock_model.SerializeToString(), providers=["CPUExecutionProvider"])
    Fail = onnxruntime.capi.onnxruntime_pybind11_state.Fail
    with pytest.raises(Exception) as stock_error:
        stock.run(None, BAD)
    assert stock_error.type is Fail
    raised, wrong, lock = [0], [0], threading.Lock()

    def worker(k):
        for i in range(60):
            if (k + i) % 2:
                with pytest.raises(Fail, match="FusedAddReluRef node .*broadcast"):
                    fused.run(None, BAD)
                with lock:
                    raised[0] += 1
            else:
                out = fused.run(None, GOOD)
                with lock:
                    wrong[0] += not all(np.allclose(o, WANT, rtol=1e-6) for o in out)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(worker, range(4), timeout=300))
    assert raised[0] == 120 and wrong[0] == 0, (raised, wrong)
