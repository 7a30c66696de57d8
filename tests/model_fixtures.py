"""Tiny deterministic models for API tests, named after the case they exercise.

Each builder returns an ``onnx.ModelProto``; none is committed to git.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def fan_in_weights(seed: int):
    """``w(name, *shape)``: float32 initializers drawn in turn from one seeded generator, standard
    normal scaled by 1/sqrt(fan-in) (the product of the dims after the first), so that conv chains
    keep their outputs near unit size."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                       name)

    return w


def disable_all_outputs(model, feeds: dict) -> list:
    """The outputs stock ORT gives with graph optimizations off (ORT_DISABLE_ALL), the reference every
    fused result is checked against; ``model`` a ModelProto or what InferenceSession opens (a path)."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return onnxruntime.InferenceSession(source, so).run(None, feeds)


def stock_conv_act(x: np.ndarray, w: np.ndarray, b: np.ndarray, act: str, **conv_attrs) -> np.ndarray:
    """Conv(x, w, b; conv_attrs) then ``act`` ("" none, "relu", "quick_gelu": SiLU written as
    Sigmoid -> Mul) in stock ORT at ORT_DISABLE_ALL, plain layout."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **conv_attrs)]
    if act == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif act == "quick_gelu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    else:
        nodes[0].output[0] = "y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return disable_all_outputs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"x": x})[0]


def _model(nodes, inputs, outputs, initializers=(), opset=OPSET, name="g") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="ortfuse-tests")
    model.ir_version = 8
    model.doc_string = "fixture"
    model.model_version = 3
    model.domain = "test.ortfuse"
    onnx.checker.check_model(model, full_check=True)
    return model


def ffn_matmul_add_relu(seq: int | str = "seq", hidden: int = 16, inner: int = 24, seed: int = 0) -> onnx.ModelProto:
    """3-D MatMul+Add+Relu then MatMul+Add, plus a residual Add+Relu of two dynamic tensors.

    x[batch, seq, hidden] -> relu(x @ W1 + b1) @ W2 + b2 = y;  z = relu(y + x).
    """
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((hidden, inner)).astype(np.float32) * 0.3, "W1")
    b1 = numpy_helper.from_array(rng.standard_normal(inner).astype(np.float32) * 0.1, "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((inner, hidden)).astype(np.float32) * 0.3, "W2")
    b2 = numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32) * 0.1, "b2")
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"], name="mm1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu1"),
        helper.make_node("MatMul", ["h2", "W2"], ["y0"], name="mm2"),
        helper.make_node("Add", ["y0", "b2"], ["y"], name="bias2"),
        helper.make_node("Add", ["y", "x"], ["r"], name="residual"),
        helper.make_node("Relu", ["r"], ["z"], name="relu_out"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", seq, hidden])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", seq, hidden])
    model = _model(nodes, [x], [z], [w1, b1, w2, b2], name="ffn")
    entry = model.metadata_props.add()
    entry.key, entry.value = "owner", "tests"
    return model


def ffn_inputs(batch: int = 2, seq: int = 5, hidden: int = 16, seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((batch, seq, hidden)).astype(np.float32)}


def external_weight_not_on_disk(hidden: int = 4) -> tuple[onnx.ModelProto, str, np.ndarray]:
    """y = x @ W where W is an external initializer whose file does not exist: ORT needs it supplied
    through ``SessionOptions.add_external_initializers``. Returns (model, name of W, W's values)."""
    w = np.arange(hidden * hidden, dtype=np.float32).reshape(hidden, hidden) / 10
    tensor = numpy_helper.from_array(w, "W")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights_not_on_disk.bin"), ("offset", "0"), ("length", str(w.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, hidden])
    graph = helper.make_graph(nodes, "ext", [x], [y], initializer=[tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model, "W", w


def annotated(model: onnx.ModelProto, enabled: str = "true", patterns: str = "auto") -> onnx.ModelProto:
    """A copy of ``model`` with the fusion metadata keys written (graph untouched)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for key, value in (("fusion_enabled", enabled), ("fusion_pattern_id", patterns)):
        entry = out.metadata_props.add()
        entry.key, entry.value = key, value
    return out
