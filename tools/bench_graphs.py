"""The unfused subgraphs ``kernel_bench.py`` times: a checked float32 model of some nodes, and each
activation as exporters write it unfused."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = np.float32


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=F32), name)


def _model(nodes, inputs, inits, opset=17, out_shape=None, domains=()):
    """A checked model of ``nodes``; output ``Y`` has ``out_shape`` (default: the first input's)."""
    graph = helper.make_graph(
        nodes, "bench",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, out_shape or inputs[0][1])],
        initializer=inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def act_nodes(kind: str, x: str, y: str):
    """(nodes, initializers) computing activation ``kind`` of tensor ``x`` into ``y`` as exporters
    write it unfused: relu, gelu (erf form), gelu_tanh (tanh form), silu (Sigmoid, Mul); "" = Identity."""
    mk = helper.make_node
    if kind == "relu":
        return [mk("Relu", [x], [y])], []
    if kind == "silu":
        return [mk("Sigmoid", [x], [x + "_s"]), mk("Mul", [x, x + "_s"], [y])], []
    if kind == "gelu":
        return ([mk("Div", [x, "sqrt2"], ["d"]), mk("Erf", ["d"], ["e"]), mk("Add", ["e", "one"], ["p"]),
                 mk("Mul", [x, "p"], ["m"]), mk("Mul", ["m", "half"], [y])],
                [_const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)])
    if kind == "gelu_tanh":
        return ([mk("Mul", [x, x], ["x2"]), mk("Mul", ["x2", x], ["x3"]), mk("Mul", ["x3", "k"], ["kx3"]),
                 mk("Add", [x, "kx3"], ["s"]), mk("Mul", ["s", "c"], ["u"]), mk("Tanh", ["u"], ["t"]),
                 mk("Add", ["t", "one"], ["p"]), mk("Mul", [x, "p"], ["m"]), mk("Mul", ["m", "half"], [y])],
                [_const("k", 0.044715), _const("c", np.sqrt(2.0 / np.pi)), _const("one", 1.0),
                 _const("half", 0.5)])
    if kind == "":
        return [mk("Identity", [x], [y])], []
    raise KeyError(kind)
