"""Shared by the native-op tests: an ORT session of one ortfuse custom op node, registered from the
native path (which every supported machine has: a process without it fails these tests), and ORT's
NCHWc blocking of a tensor (logical [N, C, H, W], memory [N, C / b, H, W, b])."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import helper

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.kernel_choice.op_registration import with_custom_ops


def native_options(ops, threads: int = 2) -> onnxruntime.SessionOptions:
    """SessionOptions with the native op types ``ops`` registered and ``threads`` intra-op threads."""
    so, why_not = with_custom_ops(onnxruntime.SessionOptions(), frozenset(ops), python_ops=False)
    assert not why_not, why_not
    so.intra_op_num_threads = threads
    return so


def one_op_session(op: str, inputs, threads: int = 2, **attrs) -> onnxruntime.InferenceSession:
    """A session of the single node ``op(inputs) -> y`` (float32 inputs of any shape)."""
    node = helper.make_node(op, list(inputs), ["y"], domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], "one_op", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                                                 for n in inputs],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    return onnxruntime.InferenceSession(model.SerializeToString(), native_options({op}, threads))


def to_blocked(x: np.ndarray, b: int) -> np.ndarray:
    """``x`` [N, C, H, W] in ORT's NCHWc memory order, viewed with its logical shape."""
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2)).reshape(n, c, h, w)


def from_blocked(y: np.ndarray, b: int) -> np.ndarray:
    """The inverse of ``to_blocked``."""
    n, c, h, w = y.shape
    return y.reshape(n, c // b, h, w, b).transpose(0, 1, 4, 2, 3).reshape(n, c, h, w)
