"""Small models for the rules' examples: nodes written with ``onnx.helper``, inputs and constants
given as shapes and arrays, outputs typed by ONNX shape inference."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def model(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], outputs: list[str],
          constants: dict[str, np.ndarray] | None = None, opset: int = 17,
          elem: int = onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    """A checked model of ``nodes``: graph inputs of element type ``elem`` and the given static
    shapes, ``constants`` as initializers, ``outputs`` typed by shape inference."""
    graph = helper.make_graph(
        nodes, "example", [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
        [onnx.ValueInfoProto(name=o) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in (constants or {}).items()])
    out = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="ortfuse-rule-example")
    out.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(out, strict_mode=True)
    del out.graph.output[:]
    out.graph.output.extend(inferred.graph.output)
    onnx.checker.check_model(out, full_check=True)
    return out


def weights(shape: list[int], seed: int = 0, scale: float = 0.5) -> np.ndarray:
    """Deterministic float32 weights."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def layer_norm_nodes(x: str, y: str, opset: int) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """y = LayerNorm(x; gamma, beta, epsilon 1e-12) as an exporter writes it at ``opset``: the op
    (17+), else the decomposition; returns the nodes and the constants they add (gamma and beta are
    the caller's)."""
    if opset >= 17:
        return [helper.make_node("LayerNormalization", [x, "gamma", "beta"], [y], axis=-1, epsilon=1e-12)], {}
    nodes = [helper.make_node("ReduceMean", [x], ["mean"], axes=[-1]),
             helper.make_node("Sub", [x, "mean"], ["d"]), helper.make_node("Pow", ["d", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["std"]),
             helper.make_node("Div", ["d", "std"], ["n"]), helper.make_node("Mul", ["n", "gamma"], ["g"]),
             helper.make_node("Add", ["g", "beta"], [y])]
    return nodes, {"two": np.float32(2.0), "eps": np.float32(1e-12)}
