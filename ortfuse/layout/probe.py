"""The NCHWc block size of ORT's CPU kernels on this machine (MLAS picks it per instruction set: 8
with AVX2, 16 with AVX-512), read from the graph ORT makes of a one-channel Conv: the blocked filter
is padded to one block of output channels. 0 where ORT blocks nothing (no NCHWc kernels)."""

from __future__ import annotations

import functools
import os
import tempfile


@functools.lru_cache(maxsize=1)
def block_size() -> int:
    """The channel block of ORT's NCHWc layout here (cached per process), 0 when there is none."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.ones((1, 8, 1, 1), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 4, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.optimized_model_filepath = os.path.join(tmp, "probe.onnx")
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath)
    if not any(n.domain == "com.microsoft.nchwc" for n in optimized.graph.node):
        return 0
    return max((int(t.dims[0]) for t in optimized.graph.initializer if len(t.dims) == 4), default=0)
