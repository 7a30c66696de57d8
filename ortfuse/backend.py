"""The ONNX backend API (``prepare``, ``run_model``, ``run_node``, ``supports_device``,
``is_compatible``) on top of ``ortfuse.InferenceSession(..., fusion=True)``.

It behaves as ``onnxruntime.backend`` (same session options allow-list, same opset gating, same
errors) except that sessions are fused, and ``run_node`` runs a single node by wrapping it in a model.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as _ort
from onnx import helper
from onnxruntime.backend.backend import _ALLOWED_SESSION_OPTIONS, OnnxRuntimeBackend
from onnxruntime.backend.backend_rep import OnnxRuntimeBackendRep

from ortfuse.session import InferenceSession


class OrtfuseBackend(OnnxRuntimeBackend):
    """ORT's backend with every session created by ortfuse with ``fusion=True``."""

    @classmethod
    def prepare(cls, model, device=None, **kwargs):
        if isinstance(model, (OnnxRuntimeBackendRep, _ort.InferenceSession)):
            return super().prepare(model, device, **kwargs)
        if isinstance(model, (str, bytes)):
            options = _ort.SessionOptions()
            options.add_session_config_entry(
                "session.allow_released_opsets_only", "1" if cls.allowReleasedOpsetsOnly else "0"
            )
            for key, value in kwargs.items():
                if key in _ALLOWED_SESSION_OPTIONS:
                    setattr(options, key, value)
                elif hasattr(options, key):
                    raise RuntimeError(
                        f"SessionOptions attribute '{key}' is not permitted via the backend API. "
                        f"Allowed attributes: {', '.join(sorted(_ALLOWED_SESSION_OPTIONS))}"
                    )
            excluded = os.getenv("ORT_ONNX_BACKEND_EXCLUDE_PROVIDERS", default="").split(",")
            providers = [p for p in _ort.get_available_providers() if p not in excluded]
            session = InferenceSession(model, sess_options=options, providers=providers, fusion=True)
            session.disable_fallback()
            if device is not None and not cls.supports_device(device):
                raise RuntimeError(f"Incompatible device expected '{device}', got '{_ort.get_device()}'")
            return OnnxRuntimeBackendRep(session)
        # ModelProto: ORT's path checks the model and the opsets, then comes back here with bytes.
        return super().prepare(model, device, **kwargs)

    @classmethod
    def run_node(cls, node, inputs, device=None, outputs_info=None, **kwargs):
        """Run one node: wrap it in a one-node model typed from ``inputs`` (and ``outputs_info``:
        a sequence of (numpy dtype, shape) pairs, when given), then run that model."""
        inputs = list(inputs)
        graph_inputs = []
        for name, value in zip(node.input, inputs):
            if not name:
                continue
            arr = np.asarray(value)
            elem = helper.np_dtype_to_tensor_dtype(arr.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, arr.shape))
        graph_outputs = []
        for i, name in enumerate(node.output):
            if not name:
                continue
            if outputs_info is not None and i < len(outputs_info):
                dtype, shape = outputs_info[i]
                graph_outputs.append(
                    helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)
                )
            else:
                graph_outputs.append(onnx.ValueInfoProto(name=name))
        graph = helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs)
        domain = node.domain or ""
        opset = kwargs.pop("opset_version", None)
        opsets = [helper.make_opsetid("", opset or onnx.defs.onnx_opset_version())]
        if domain not in ("", "ai.onnx"):
            opsets.append(helper.make_opsetid(domain, 1))
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = min(model.ir_version, onnx.IR_VERSION)
        feeds = [np.asarray(v) for n, v in zip(node.input, inputs) if n]
        rep = cls.prepare(model.SerializeToString(), device, **kwargs)
        return rep.run(feeds, **kwargs)


is_compatible = OrtfuseBackend.is_compatible
prepare = OrtfuseBackend.prepare
run_model = OrtfuseBackend.run_model
run = OrtfuseBackend.run_model
run_node = OrtfuseBackend.run_node
supports_device = OrtfuseBackend.supports_device
