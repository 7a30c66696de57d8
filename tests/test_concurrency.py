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
    with pytest.raises(Exception):
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

    nodes = [helper.make_node("Add", ["x", "y"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["z"], name="relu")]
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
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Add", ["h", "b"], ["s"], name="add"),
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
