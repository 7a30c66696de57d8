"""The peers ``ortfuse bench --peer`` runs beside stock ORT and ortfuse, in the same interleaved rounds:
the alternatives a user would pick instead of ortfuse.

``openvino``: OpenVINO's CPU plugin on the same .onnx file, float32 forced
(``INFERENCE_PRECISION_HINT=f32``: on CPUs with bf16 or fp16 units the plugin would otherwise lower
the precision), latency mode with one stream, and the same intra-op thread count as the ORT sessions
(0: the plugin's default, as ORT's). Installed by the optional extra ``pip install -e '.[peers]'``.

A peer session has ORT's ``run(output_names, feeds)`` shape (outputs in the model's order), so the
bench times and checks it as any other configuration.
"""

from __future__ import annotations

PEERS = {"openvino": "openvino_f32"}  # --peer name -> bench configuration
INSTALL_HINT = "pip install -e '.[peers]' (or: pip install openvino)"


class PeerUnavailable(RuntimeError):
    """The peer's package is not installed; the message says how to get it."""


class OpenVinoSession:
    """A compiled OpenVINO CPU model with one infer request, run like an ORT session."""

    def __init__(self, model: str | bytes, threads: int = 0) -> None:
        try:
            import openvino as ov
        except ImportError as exc:
            raise PeerUnavailable(f"the OpenVINO peer needs the openvino package: {INSTALL_HINT}") from exc
        core = ov.Core()
        config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = str(int(threads))
        if isinstance(model, bytes):
            read = core.read_model(model=model, weights=b"")  # an ONNX model is read from memory whole
        else:
            read = core.read_model(model)
        self._compiled = core.compile_model(read, "CPU", config)
        self._request = self._compiled.create_infer_request()
        self._outputs = list(self._compiled.outputs)
        self.precision = str(self._compiled.get_property("INFERENCE_PRECISION_HINT"))

    def run(self, output_names, feeds):
        results = self._request.infer(feeds)
        return [results[o].copy() for o in self._outputs]


def available(peer: str) -> str:
    """"" when ``peer`` can run here, else one sentence saying why and how to get it."""
    if peer not in PEERS:
        return f"unknown peer {peer!r}; known: {', '.join(PEERS)}"
    try:
        import openvino  # noqa: F401
    except ImportError:
        return f"the OpenVINO peer needs the openvino package: {INSTALL_HINT}"
    return ""
