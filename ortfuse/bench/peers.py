"""The peers ``ortfuse bench --peer`` runs beside stock ORT and ortfuse, in the same interleaved rounds:
the alternatives a user would pick instead of ortfuse.

``openvino``: OpenVINO's CPU plugin on the same .onnx file, float32 forced
(``INFERENCE_PRECISION_HINT=f32``: on CPUs with bf16 or fp16 units the plugin would otherwise lower
the precision), latency mode with one stream, and the same intra-op thread count as the ORT sessions
(0: the plugin's default, as ORT's). Installed by the optional extra ``pip install -e '.[peers]'``.

``ort-transformers``: ORT's own Python transformer optimizer
(``onnxruntime.transformers.optimizer.optimize_model``, model_type ``bert``, CPU, its default fusions
such as Attention, SkipLayerNormalization, EmbedLayerNormalization, BiasGelu), then an ORT session at
ORT_ENABLE_ALL with the bench's options: what a user of ORT alone would do to an encoder. The
attention mask is passed raw (``use_raw_attention_mask``): the default turns it into per-row key
counts, which equals the model only for right-padded masks. Heads and
hidden size are read from the model's first attention (``encoder_dims``); without one, 0 and 0 let
the optimizer detect them. The optimizer imports sympy, which ORT's wheel does not require.

A peer session has ORT's ``run(output_names, feeds)`` shape (outputs in the model's order), so the
bench times and checks it as any other configuration.
"""

from __future__ import annotations

PEERS = {"openvino": "openvino_f32", "ort-transformers": "ort_transformers"}  # --peer name -> bench configuration
INSTALL_HINT = "pip install -e '.[peers]' (or: pip install openvino)"
SYMPY_HINT = "pip install sympy"


class PeerUnavailable(RuntimeError):
    """The peer's package is not installed; the message says how to get it."""


def openvino_config(threads: int = 0, perf_count: bool = False) -> dict[str, str]:
    """The peer's CPU plugin configuration: f32 forced, latency mode, one stream, ``threads`` inference
    threads (0: the plugin's default); ``perf_count`` turns on its per-layer counters (PERF_COUNT)."""
    config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = str(int(threads))
    if perf_count:
        config["PERF_COUNT"] = "YES"
    return config


def read_openvino_model(model: str | bytes):
    """(``openvino.Core``, the model read by its ONNX frontend); ``PeerUnavailable`` without openvino."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise PeerUnavailable(f"the OpenVINO peer needs the openvino package: {INSTALL_HINT}") from exc
    core = ov.Core()
    if isinstance(model, bytes):
        return core, core.read_model(model=model, weights=b"")  # an ONNX model is read from memory whole
    return core, core.read_model(model)


class OpenVinoSession:
    """A compiled OpenVINO CPU model with one infer request, run like an ORT session."""

    def __init__(self, model: str | bytes, threads: int = 0) -> None:
        core, read = read_openvino_model(model)
        self._compiled = core.compile_model(read, "CPU", openvino_config(threads))
        self._request = self._compiled.create_infer_request()
        self._outputs = list(self._compiled.outputs)
        self.precision = str(self._compiled.get_property("INFERENCE_PRECISION_HINT"))

    def run(self, output_names, feeds):
        results = self._request.infer(feeds)
        return [results[o].copy() for o in self._outputs]


def encoder_dims(model) -> tuple[int, int]:
    """(heads, hidden size) of the first self-attention the attention rule matches in ``model`` (an
    onnx.ModelProto), or (0, 0) when it matches none."""
    from ortfuse.fusion.rulekit.result import Match
    from ortfuse.fusion.rules import attention
    from ortfuse.ir.graph import GraphIndex

    ix = GraphIndex(model)
    for node in ix.graph.node:
        if node.op_type == "Softmax":
            found = attention.match(ix, node)
            if isinstance(found, Match):
                w = next(t for t in found.initializers if t.name == found.inputs[1])
                return int(found.attrs["num_heads"]), int(w.dims[0])
    return 0, 0


class OrtTransformersSession:
    """The model optimized by ORT's transformer optimizer (model_type bert, CPU), run by an ORT session
    at ORT_ENABLE_ALL with the bench's measuring options."""

    def __init__(self, model: str | bytes, threads: int = 0, spinning: bool | None = None) -> None:
        why_not = _transformers_optimizer_problem()
        if why_not:
            raise PeerUnavailable(why_not)
        import onnx
        import onnxruntime as ort
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        from ortfuse.foundation.session_options import DEFAULT_SPINNING, measuring_options

        proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model)
        self.num_heads, self.hidden_size = encoder_dims(proto)
        options = FusionOptions("bert")
        options.use_raw_attention_mask(True)  # the default mask_index (key counts) assumes right padding
        optimized = optimize_model(proto, model_type="bert", num_heads=self.num_heads, hidden_size=self.hidden_size,
                                   optimization_options=options, opt_level=0, use_gpu=False)
        self.fused_ops = optimized.get_fused_operator_statistics()
        so = measuring_options("ORT_ENABLE_ALL", threads=threads,
                               spinning=DEFAULT_SPINNING if spinning is None else spinning)
        self._session = ort.InferenceSession(optimized.model.SerializeToString(), so,
                                             providers=["CPUExecutionProvider"])

    def run(self, output_names, feeds):
        return self._session.run(output_names, feeds)


def _transformers_optimizer_problem() -> str:
    """"" when ORT's transformer optimizer imports, else the sentence saying how to get it."""
    try:
        import sympy  # noqa: F401
        from onnxruntime.transformers import optimizer  # noqa: F401
    except ImportError as exc:
        return (f"the ort-transformers peer (onnxruntime.transformers.optimizer) needs sympy, which "
                f"onnxruntime does not install: {SYMPY_HINT} ({exc})")
    return ""


def available(peer: str) -> str:
    """"" when ``peer`` can run here, else one sentence saying why and how to get it."""
    if peer not in PEERS:
        return f"unknown peer {peer!r}; known: {', '.join(PEERS)}"
    if peer == "ort-transformers":
        return _transformers_optimizer_problem()
    try:
        import openvino  # noqa: F401
    except ImportError:
        return f"the OpenVINO peer needs the openvino package: {INSTALL_HINT}"
    return ""
